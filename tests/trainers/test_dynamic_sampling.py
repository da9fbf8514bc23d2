"""Dynamic sampling and the difficulty curriculum in the trainer, on the tiny model with the scripted policy
(guess-number episodes whose rewards vary within a group): filtered groups are never trained, refills are
drawn until the step has its groups with signal, replay reproduces a step with refills, the asynchronous loop
keeps the staleness bound with refills, a curriculum run resumes exactly, and the CLI runs it."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from collections import defaultdict

import pytest

from agentrl import read_trajectories
from agentrl.dynamic_sampling import DynamicSampling, GroupVerdict, group_verdict
from agentrl.groups import group_trajectories
from agentrl.metrics import read_metrics
from agentrl.replay import load as load_run
from agentrl.trainers.replay.reproduce import reproduce_step, step_batch
from agentrl.trainers.task_sampler import refill_seed, sampler_state_path

from .test_async import _cfg, _run, _sampler


def _groups_by_step(run):
    out = defaultdict(list)
    for g in group_trajectories(read_trajectories(run)):
        out[g[0].meta.step].append(g)
    return out


def _ds(tmp_path, name, **kw):
    kw.setdefault("dynamic_sampling", DynamicSampling(max_draws=4))
    return _cfg(tmp_path, name, **kw)


def test_sync_run_filters_and_refills_and_replay_reproduces_it(tmp_path, tok):
    run = _run(_ds(tmp_path, "ds"), _sampler(tok))
    rows = read_metrics(run)
    by_step = _groups_by_step(run)
    refilled = 0
    for r in rows:
        k = r["step"]
        groups = by_step[k]
        verdicts = [group_verdict(g) for g in groups]
        signal = sum(v is GroupVerdict.SIGNAL for v in verdicts)
        assert r["groups/drawn"] == len(groups)
        assert r["groups/filtered_zero_variance"] == sum(v is GroupVerdict.ZERO_VARIANCE for v in verdicts)
        assert r["groups/trained"] == signal <= 2
        # Draws stop once the step has 2 groups with signal, or at the cap (4 × 2), which it says.
        assert signal == 2 or (len(groups) == 8 and r["groups/capped"] == 1.0)
        refilled += len(groups) > 2
        seeds = [g[0].meta.seed for g in groups]
        assert len(set(seeds)) == len(seeds)
        refills = sorted(s for s in seeds if s not in (2 * k, 2 * k + 1))
        assert refills == [refill_seed(0, k, d, 2, 8) for d in range(2, 2 + len(refills))]
        gen = sum(t.num_model_tokens for g in groups for t in g)
        used = sum(
            t.num_model_tokens
            for g, v in zip(groups, verdicts, strict=True)
            if v is GroupVerdict.SIGNAL
            for t in g
        )
        assert r["tokens/trained_frac"] == used / gen
    assert refilled, "the scripted run never refilled: the test would be vacuous"
    loaded = load_run(run)
    for r in rows:
        _all, trained = step_batch(loaded, r["step"])
        assert len({loaded.trajectories[i].meta.group_id for i in trained}) == r["groups/trained"]
        _assert_replays(loaded, r["step"])


def test_without_dynamic_sampling_zero_variance_groups_are_counted_and_trained(tmp_path, tok):
    run = _run(_cfg(tmp_path, "plain"), _sampler(tok))
    by_step = _groups_by_step(run)
    for r in read_metrics(run):
        groups = by_step[r["step"]]
        assert r["groups/drawn"] == r["groups/trained"] == 2 == len(groups)
        zv = sum(group_verdict(g) is GroupVerdict.ZERO_VARIANCE for g in groups)
        assert r["groups/zero_variance"] == zv and r["groups/filtered_zero_variance"] == 0


def test_async_with_refills_keeps_the_bound_and_trains_the_same_groups(tmp_path, tok):
    sync = _run(_ds(tmp_path, "sync", steps=1), _sampler(tok))  # only its step 0 is compared
    asyn = _run(_ds(tmp_path, "async", max_staleness=1), _sampler(tok, delay_s=0.002))
    ra = read_metrics(asyn)
    assert all(r["async/max_staleness_seen"] <= 1 and r["staleness/max"] <= 1 for r in ra)
    # Step 0 is sampled by version 0 in both runs: the same draws, the same verdicts, the same groups.
    s0 = {g.task_id: sorted(g.rewards) for g in _groups_by_step(sync)[0]}  # members finish in any order
    a0 = {g.task_id: sorted(g.rewards) for g in _groups_by_step(asyn)[0]}
    assert s0 == a0
    for r in ra:
        assert r["groups/trained"] <= 2 and r["groups/drawn"] <= 8
    loaded = load_run(asyn)
    for r in ra:
        _assert_replays(loaded, r["step"])


def test_curriculum_resume_is_exact(tmp_path, tok):
    cfg = _ds(tmp_path, "full", curriculum="difficulty", steps=5, older_checkpoints="whole")
    full = _run(cfg, _sampler(tok))
    state = json.loads(sampler_state_path(_run_dir(full), 3).read_text())
    assert state["history"], "the curriculum observed nothing"
    # Cut a copy of the run back to its checkpoint after 3 steps, then resume it.
    cut = tmp_path / "cut"
    shutil.copytree(full, cut)
    for name in ("step-000004", "step-000005"):
        shutil.rmtree(cut / "checkpoints" / name, ignore_errors=True)
    lines = (cut / "trajectories.jsonl").read_text().splitlines(keepends=True)
    keep = [ln for ln in lines if json.loads(ln)["meta"]["step"] < 3]
    (cut / "trajectories.jsonl").write_text("".join(keep))
    resumed = _run(dataclasses.replace(cfg, out=None, resume=str(cut)), _sampler(tok))
    tasks = lambda run: [(t.meta.step, t.meta.task_id, t.rewards) for t in read_trajectories(run)]  # noqa: E731
    assert sorted(tasks(resumed)) == sorted(tasks(full))
    revisits = [t for t in read_trajectories(full) if t.meta.seed not in _fresh_seeds(t.meta.step)]
    assert revisits, "the curriculum never drew a known task: the test would be vacuous"
    for a, b in zip(read_metrics(full)[3:], read_metrics(resumed)[3:], strict=True):
        assert a["learn/loss"] == b["learn/loss"] and a["groups/drawn"] == b["groups/drawn"]


def _assert_replays(loaded, step):
    report = reproduce_step(loaded, step, device="cpu")
    assert report.matches, (step, [c for c in report.checks if not c.match])
    assert {"learn/loss", "learn/grad_norm", "reward/mean"} <= {c.name for c in report.checks}


def _run_dir(path):
    from pathlib import Path

    from agentrl.run import RunDir

    return RunDir(Path(path))


def _fresh_seeds(k):
    """The tasks step k draws fresh (not known from an earlier step)."""
    return {k * 2, k * 2 + 1} | {refill_seed(0, k, d, 2, 8) for d in range(2, 8)}


@pytest.mark.slow  # ~6 s per case on 2 cores (CLI subprocesses)
@pytest.mark.parametrize("staleness", [0, 1])
def test_cli_two_steps_with_dynamic_sampling_hits_the_cap_and_says_so(tmp_path, staleness):
    # The random tiny model never samples a stop token, so every turn is cut at --rollout.max-new-tokens
    # and scores 0 (the env never sees a cut turn): every group is zero-variance, each step draws up to the
    # cap, trains on nothing and says so. (The scripted-policy tests above cover groups with signal.)
    out = tmp_path / "cli"
    cmd = [
        sys.executable,
        "-m",
        "agentrl.trainers",
        "train",
        "--model",
        "tiny",
        "--env",
        "guess-number-v0",
        "--env-kwargs",
        '{"low": 1, "high": 3, "max_guesses": 2}',
        "--steps",
        "2",
        "--group-size",
        "2",
        "--groups-per-step",
        "2",
        "--dynamic-sampling",
        "true",
        "--dynamic-sampling.max-draws",
        "2",
        "--rollout.max-new-tokens",
        "2",
        "--rollout.max-turns",
        "1",
        "--eval.tasks",
        "0",
        "--no-progress",
        "--max-staleness",
        str(staleness),
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        assert (r["groups/drawn"], r["groups/trained"], r["groups/capped"]) == (4.0, 0.0, 1.0)
        assert r["groups/filtered_zero_variance"] == 4.0 and r["tokens/trained_frac"] == 0.0
    # One loop, one message at every S.
    said = (
        "dynamic sampling drew 4 groups (2 + 2 refill(s)), kept 0 with reward signal, filtered 4 whose "
        "members all got the same reward; the --dynamic-sampling.max-draws cap (4 draws) was reached with "
        "none, so no update this step"
    )
    assert proc.stdout.count(said) == 2, proc.stdout
    assert "training on those" not in proc.stdout and "no group to train on" not in proc.stdout
    assert json.loads((out / "config.json").read_text())["batch"]["dynamic_sampling"] == {
        "name": "true",
        "max_draws": 2,
    }
    assert len(list(read_trajectories(out))) == 2 * 4 * 2
