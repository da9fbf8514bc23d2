"""Two real training runs, made once per test session (in parallel, ~30 s on two cores).

* ``tiny_run``: exactly ``agentrl train --model tiny --steps 2 --groups-per-step 2 --group-size 2
  --rollout.max-new-tokens 24`` — the random model never stops, so every episode is one cut turn with
  reward 0, but the sampler's log-probs are real (the mismatch is ~1e-6).
* ``scripted_run``: the same trainer with a scripted sampler (``make_run.py``): real python tool calls in
  the real sandbox (ok and error), rewards that differ inside each group, non-zero advantages and losses.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

TINY_ARGS = (
    "train",
    "--model",
    "tiny",
    "--steps",
    "2",
    "--groups-per-step",
    "2",
    "--group-size",
    "2",
    "--rollout.max-new-tokens",
    "24",
    "--no-progress",
)


@pytest.fixture(scope="session")
def replay_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("replay-runs")
    tiny, scripted = root / "tiny", root / "scripted"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    cli = "import sys; from agentrl.trainers.cli import main; sys.exit(main())"
    cmds = {
        "tiny": [sys.executable, "-c", cli, *TINY_ARGS, "--out", str(tiny)],
        "scripted": [sys.executable, str(HERE / "make_run.py"), str(scripted)],
    }
    procs = {
        k: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
        for k, cmd in cmds.items()
    }
    for k, p in procs.items():
        out, _ = p.communicate(timeout=900)
        if p.returncode != 0:
            pytest.fail(f"making the {k} run failed (exit {p.returncode}):\n{out[-4000:]}")
    return {"tiny": tiny, "scripted": scripted}


@pytest.fixture(scope="session")
def tiny_run(replay_runs: dict[str, Path]) -> Path:
    return replay_runs["tiny"]


@pytest.fixture(scope="session")
def scripted_run(replay_runs: dict[str, Path]) -> Path:
    return replay_runs["scripted"]
