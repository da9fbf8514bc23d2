"""``--curriculum difficulty`` with ``--max-staleness 1`` from the command line, on the tiny model: two steps
train, the sampler's state is saved beside the checkpoint, and a resumed third step draws what the
sampler restored from that state draws (the in-process exact-resume test is in test_dynamic_sampling.py).

The first two steps run through the CLI's ``main`` in this process; the resume runs ``python -m
agentrl.trainers`` in a fresh process, so the state it restores can only come from the run folder."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict

from agentrl import read_trajectories
from agentrl.metrics import read_metrics
from agentrl.run import RunDir
from agentrl.trainers.cli import main as cli_main
from agentrl.trainers.task_sampler import TaskSampler, sampler_state_path


def _args(*extra: str) -> list[str]:
    # The random tiny model never samples a stop token: every turn is cut at --rollout.max-new-tokens and
    # scores 0, so every task the curriculum observes is "unsolved" (a pool it draws from, less often).
    return [
        "train",
        "--model",
        "tiny",
        "--env",
        "guess-number-v0",
        "--env-kwargs",
        '{"low": 1, "high": 3, "max_guesses": 2}',
        "--group-size",
        "2",
        "--groups-per-step",
        "4",
        "--curriculum",
        "difficulty",
        "--max-staleness",
        "1",
        "--rollout.max-new-tokens",
        "2",
        "--rollout.max-turns",
        "1",
        "--eval.tasks",
        "0",
        "--no-progress",
        *extra,
    ]


def _train_in_a_fresh_process(*extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "agentrl.trainers", *_args(*extra)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def _seeds_by_step(out) -> dict[int, list[int]]:
    by_step: dict[int, list[int]] = defaultdict(list)
    for t in read_trajectories(out):
        if t.meta.seed not in by_step[t.meta.step]:
            by_step[t.meta.step].append(t.meta.seed)
    return by_step


def test_cli_curriculum_with_staleness_1_trains_two_steps_and_resumes_with_its_state(tmp_path):
    out = tmp_path / "cli"
    assert cli_main(_args("--steps", "2", "--out", str(out))) == 0
    assert [r["step"] for r in read_metrics(out)] == [0, 1]
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["batch"]["curriculum"], cfg["async_"]["max_staleness"]) == ("difficulty", 1)
    seeds = _seeds_by_step(out)
    # Lag 1: steps 0 and 1 see no observation yet, so both draw their fresh tasks (seed 0: 4k .. 4k + 3).
    assert {k: sorted(v) for k, v in seeds.items()} == {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}
    state = json.loads(sampler_state_path(RunDir(out), 2).read_text())
    assert state["curriculum"] == "difficulty"
    assert state["history"] == {str(t): [[k, 0.0]] for k in (0, 1) for t in seeds[k]}

    proc = _train_in_a_fresh_process("--steps", "3", "--resume", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["step"] for r in read_metrics(out)] == [0, 1, 2]
    # Step 2 sees step 0's observations (lag 1): what a sampler restored from the saved state draws.
    ref = TaskSampler(0, 4, 4, "difficulty", lag=1)
    ref.load_state(state)
    after = _seeds_by_step(out)
    assert sorted(after[2]) == sorted(ref.tasks(2, range(4)))
    # Not vacuous: step 2 draws a task of step 0 again (from the restored state), none of step 1's (lag 1).
    assert set(after[2]) & {0, 1, 2, 3} and not set(after[2]) & {4, 5, 6, 7}
    assert {k: sorted(v) for k, v in after.items() if k < 2} == {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}
