"""Replay renders every step it can once checkpoints are rotated away: advantages from the recorded scores or
rewards, clearly marked, and a clear message for a step that allows neither."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl import replay
from agentrl.run import RunDir
from agentrl.scores import load_step_scores
from agentrl.trainers import replay as rerun
from agentrl.trainers.cli import main

from .helpers import copy_run


def test_the_trainer_records_the_learners_scores(scripted_run: Path, tok: Any) -> None:
    run = replay.load(scripted_run)
    scores = load_step_scores(RunDir(scripted_run), 0)
    assert scores is not None and len(scores.episodes) == 8
    # They are what the rebuilt initial weights (which sampled step 0) give for the same tokens.
    rec = rerun.recompute_run(run, indices=[i for i, t in enumerate(run.trajectories) if t.meta.step == 0])
    by_id = scores.by_episode()
    for r in rec.trajectories:
        t = run.trajectories[r.index]
        at = [i for i, m in enumerate(t.loss_mask) if m]
        got = by_id[(t.meta.episode_id, t.meta.sample_index)]
        lp = torch.tensor([r.logprobs[i] for i in at])
        assert torch.allclose(torch.tensor(got.logprobs), lp, atol=1e-5)
        sp = torch.tensor([r.sum_pi_squared[i] for i in at])
        assert torch.allclose(torch.tensor(got.sum_pi_squared), sp, atol=1e-6)


def test_advantages_of_a_rotated_step_come_from_the_record(scripted_run: Path, tmp_path: Path) -> None:
    full = replay.load(scripted_run)
    with_ckpt = rerun.advantages_of_step(full, 1)
    assert not with_ckpt.from_record and with_ckpt.source == "recomputed with the weights that sampled it"
    rotated = replay.load(copy_run(scripted_run, tmp_path / "rotated", checkpoints={2}))
    got = rerun.advantages_of_step(rotated, 1)
    assert got.from_record and got.error is None and "recorded log π and Σπ²" in got.source
    assert got.values.keys() == with_ckpt.values.keys() and len(got.values) == 8
    for i, adv in got.values.items():
        ref = with_ckpt.values[i]  # recomputed from the (exact) step-1 checkpoint
        assert [a is None for a in adv] == [a is None for a in ref]
        diffs = [abs(a - b) for a, b in zip(adv, ref, strict=True) if a is not None and b is not None]
        assert max(diffs) < 1e-6
    # Exactly the trainer's advantages: their mean is what metrics.jsonl recorded for the step.
    vals = [a for adv in got.values.values() for a in adv if a is not None]
    recorded = full.metrics_row(1)
    assert recorded is not None
    assert sum(abs(a) for a in vals) / len(vals) == pytest.approx(recorded["learn/adv_abs_mean"], rel=1e-5)
    # A run from before scores were recorded: an OTB step without its checkpoint cannot be done; it says why.
    old = replay.load(copy_run(scripted_run, tmp_path / "old", checkpoints={2}, scores=False))
    none = rerun.advantages_of_step(old, 1)
    assert none.values == {} and none.error is not None
    assert "otb estimator needs log π and Σπ²" in none.error and "rotated away" in none.error
    # An estimator that needs no weights (GRPO here) is computed from the recorded rewards alone.
    grpo = copy_run(scripted_run, tmp_path / "grpo", checkpoints={2}, scores=False)
    cfg = json.loads((grpo / "config.json").read_text())
    cfg["estimator"] = {"name": "grpo"}
    (grpo / "config.json").write_text(json.dumps(cfg))
    g = rerun.advantages_of_step(replay.load(grpo), 1)
    assert g.from_record and g.error is None and "recorded rewards" in g.source and len(g.values) == 8


def test_replay_html_advantages_renders_every_step_it_can(
    scripted_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rotated = copy_run(scripted_run, tmp_path / "rotated", checkpoints={2})
    page = tmp_path / "rotated.html"
    assert main(["replay", str(rotated), "--html", str(page), "--advantages"]) == 0
    out = capsys.readouterr().out
    assert "note: step 1: advantages computed from the trainer's recorded log π and Σπ²" in out
    assert f"wrote {page} (16 trajectories)" in out
    text = page.read_text()
    assert "checkpoint rotated away" in text and "recomputed with the weights that sampled it" in text
    # Without the record (an older run), step 0 still renders and step 1 is marked, not a failed command.
    old = copy_run(scripted_run, tmp_path / "old", checkpoints={2}, scores=False)
    page = tmp_path / "old.html"
    assert main(["replay", str(old), "--html", str(page), "--advantages"]) == 0
    out = capsys.readouterr().out
    assert "note: step 1: NO ADVANTAGES: the otb estimator needs" in out and "wrote" in out
    assert "NO ADVANTAGES" in page.read_text()
    k = next(i for i, t in enumerate(replay.load(old).trajectories) if t.meta.step == 1)
    assert main(["replay", str(old), "--show", str(k), "--advantages", "--color", "never"]) == 0
    assert f"note: trajectory {k}: no advantages: the otb estimator" in capsys.readouterr().out


def test_replay_from_a_float16_copy_says_so(scripted_run: Path, tmp_path: Path) -> None:
    """``--older-checkpoints half``: replay works from the float16 copy, names it and widens its tolerance."""
    import shutil

    from agentrl.checkpoint import compact_checkpoint

    run_dir = copy_run(scripted_run, tmp_path / "half", checkpoints=False)
    shutil.copytree(scripted_run / "checkpoints", run_dir / "checkpoints")
    contents = compact_checkpoint(RunDir(run_dir).checkpoint(1), half=True)
    assert contents.describe() == "float16 copy of float32 weights, no optimizer state"
    run = replay.load(run_dir)
    rep = rerun.reproduce_step(run, 1)
    assert rep.weights.endswith("step-000001/model (float16 copy of float32)")
    assert rep.tolerance == (rerun.HALF_RTOL, rerun.HALF_ATOL) and rep.matches
    exact = rerun.reproduce_step(replay.load(scripted_run), 1)
    assert exact.tolerance == (1e-4, 1e-6) and exact.matches
    moved = max(abs(a.recomputed - b.recomputed) for a, b in zip(rep.checks, exact.checks, strict=True))
    assert 0 < moved < 1e-2  # the rounding shows, on this tiny model within the stated tolerance
    adv = rerun.advantages_of_step(run, 1)
    assert adv.source == "recomputed with the weights that sampled it (a float16 copy of them)"
