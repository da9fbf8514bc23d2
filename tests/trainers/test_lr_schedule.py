"""`agentrl train --learner.lr-schedule length-triggered` end to end on CPU: exact resume and replay --step.

The schedule's state (the length history and the current rate) lives in the checkpoint, so a run interrupted
after step 0 and resumed computes step 1's signal and rate from the same history, and ends with the same
weights, as a run that never stopped; ``reproduce_step`` recomputes the logged rate from the checkpoint.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from agentrl import replay
from agentrl.metrics import read_metrics
from agentrl.trainers import replay as rerun
from agentrl.trainers.cli import main as cli_main

pytestmark = pytest.mark.slow  # the module's two training runs take ~24 s on 2 cores

AGENTRL = [sys.executable, "-m", "agentrl.trainers"]
SCHEDULE = [
    "--model",
    "tiny",
    "--group-size",
    "2",
    "--groups-per-step",
    "2",
    "--rollout.max-new-tokens",
    "24",
    "--eval.tasks",
    "0",
    "--no-progress",
    "--learner.lr-schedule",
    "length-triggered",
    # window 1: step 1's signal is L1 / L0, so it exists only if step 0's length survived the restart
    "--learner.lr-window",
    "1",
    "--learner.lr-trigger",
    "1.01",
    "--learner.lr",
    "1e-3",
    "--older-checkpoints",
    "whole",  # step 1's checkpoint stays resumable for the distributed learner's test
]


def train(args: list[str]) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([*AGENTRL, "train", *args], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def weights(run: Path, step: int) -> dict:
    [f] = sorted((run / "checkpoints" / f"step-{step:06d}" / "model").glob("*.safetensors"))
    return load_file(str(f))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The uninterrupted run and the cut one train through the CLI's ``main`` in this process; the resume
    runs ``python -m agentrl.trainers`` in a fresh process, so the schedule's state it continues from can
    only come from the checkpoint (a fresh interpreter's imports are most of a tiny run's CPU time)."""
    root = tmp_path_factory.mktemp("sched")
    whole, cut = root / "whole", root / "cut"
    assert cli_main(["train", *SCHEDULE, "--steps", "2", "--out", str(whole)]) == 0
    assert cli_main(["train", *SCHEDULE, "--steps", "1", "--out", str(cut)]) == 0
    out = train(["--resume", str(cut), "--steps", "2", "--no-progress"])
    assert "resumed" in out.stdout
    return whole, cut


def test_resumed_run_has_the_uninterrupted_rates_signals_and_weights(runs: tuple[Path, Path]) -> None:
    whole, cut = runs
    a, b = read_metrics(whole), read_metrics(cut)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [0, 1]
    for ra, rb in zip(a, b, strict=True):
        for key in ("learn/lr", "learn/lr_length_ratio", "learn/lr_decays", "learn/response_length"):
            assert ra[key] == rb[key], (key, ra[key], rb[key])
    assert a[0]["learn/lr"] == 1e-3 and a[0]["learn/lr_length_ratio"] is None  # no history yet
    ratio = a[1]["learn/lr_length_ratio"]
    assert ratio is not None and math.isclose(
        ratio, a[1]["learn/response_length"] / a[0]["learn/response_length"]
    )
    assert a[1]["learn/lr"] == (5e-4 if ratio >= 1.01 else 1e-3)
    wa, wb = weights(whole, 2), weights(cut, 2)
    assert wa.keys() == wb.keys() and all(bool((wa[k] == wb[k]).all()) for k in wa)
    state = json.loads((whole / "checkpoints" / "step-000002" / "state.json").read_text())
    sched = state["extra"]["stability"]["schedule"]
    assert sched["decays"] == a[1]["learn/lr_decays"]
    assert sched["lengths"] == ([] if sched["decays"] else [r["learn/response_length"] for r in a])


def test_every_step_logs_the_rate_the_signal_and_the_collapse_check(runs: tuple[Path, Path]) -> None:
    for r in read_metrics(runs[0]):
        assert r["learn/lr"] > 0 and r["learn/response_length"] > 0
        assert r["stability/collapsed"] in (0.0, 1.0) and 0 <= r["stability/zero_variance_frac"] <= 1


@pytest.mark.parametrize("step", [0, 1])
def test_replay_step_recomputes_the_scheduled_rate(runs: tuple[Path, Path], step: int) -> None:
    run = replay.load(runs[1])  # the resumed one: step 1's state comes from the checkpoint it resumed from
    rep = rerun.reproduce_step(run, step)
    assert rep.matches, [c for c in rep.checks if not c.match]
    by = {c.name: c for c in rep.checks}
    for key in ("learn/lr", "learn/lr_length_ratio", "learn/lr_decays", "stability/silent_steps"):
        assert key in by
    assert by["learn/lr"].recomputed == by["learn/lr"].recorded


def test_replay_notices_a_wrong_rate(runs: tuple[Path, Path], tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(runs[0], copy)
    rows = [json.loads(x) for x in (copy / "metrics.jsonl").read_text().splitlines() if x.strip()]
    for r in rows:
        if r.get("step") == 1:
            r["learn/lr"] *= 3
    (copy / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rep = rerun.reproduce_step(replay.load(copy), 1)
    assert not rep.matches and [c.name for c in rep.checks if not c.match] == ["learn/lr"]


def test_the_distributed_learner_resumes_the_schedule_like_the_local_one(
    runs: tuple[Path, Path], tmp_path: Path
) -> None:
    """One LearnerActor (world 1, no Ray needed) resumed from the run's step-1 checkpoint trains step 1 with
    the logged rate and signal, and writes the step-2 checkpoint's schedule state as the local trainer did."""
    import shutil

    from agentrl.groups import group_trajectories
    from agentrl.trainers.ray.learner import LearnerActor

    whole = runs[0]
    copy = tmp_path / "run"
    shutil.copytree(whole, copy)
    shutil.rmtree(copy / "checkpoints" / "step-000002")
    run = replay.load(copy)
    cfg = rerun.train_config(run)
    actor = LearnerActor(0, 1, cfg)
    actor.setup(None)
    assert actor.load_checkpoint(str(copy)) == 1
    _, trained = rerun.step_batch(run, 1)
    groups = list(group_trajectories(run.trajectories[i] for i in trained))
    metrics = actor.update(1, groups)
    row = read_metrics(whole)[1]
    for key in ("learn/lr", "learn/lr_length_ratio", "learn/lr_decays", "stability/zero_variance_frac"):
        assert metrics[key] == row[key], key
    actor.save_checkpoint(str(copy), 2, keep=3)
    got = json.loads((copy / "checkpoints" / "step-000002" / "state.json").read_text())["extra"]
    want = json.loads((whole / "checkpoints" / "step-000002" / "state.json").read_text())["extra"]
    assert got["stability"] == want["stability"]
