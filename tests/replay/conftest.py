"""Two real training runs, each made once per test session and shared by every xdist worker.

* ``tiny_run``: exactly ``agentrl train --model tiny --steps 2 --groups-per-step 2 --group-size 2
  --rollout.max-new-tokens 24 --eval.tasks 0`` — the random model never stops, so every episode is one cut
  turn with reward 0, but the sampler's log-probs are real (the mismatch is ~1e-6).
* ``scripted_run``: the same trainer with a scripted sampler (``make_run.py``): real python tool calls in
  the real sandbox (ok and error), rewards that differ inside each group, non-zero advantages and losses.

Neither run evaluates on held-out tasks (no replay test reads ``eval.json``; the evaluation was most of
their cost). Each run is made only when a test asks for it, under a file lock in the session's shared
temp folder, so the first worker to need it trains it and the others read the same folder (the pattern in
pytest-xdist's docs, "Making session-scoped fixtures execute only once").
"""

from __future__ import annotations

import fcntl
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
    "--eval.tasks",
    "0",
    "--no-progress",
)
CLI = "import sys; from agentrl.trainers.cli import main; sys.exit(main())"


def _commands(out: Path) -> dict[str, list[str]]:
    return {
        "tiny": [sys.executable, "-c", CLI, *TINY_ARGS, "--out", str(out)],
        "scripted": [sys.executable, str(HERE / "make_run.py"), str(out)],
    }


def _shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Under xdist every worker has its own basetemp (.../pytest-N/popen-gwK); their parent is the session's.
    # Without xdist the parent is shared by every past session, so the session's own folder is used.
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "replay-runs"
    root.mkdir(exist_ok=True)
    return root


def _made_run(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    root = _shared_root(tmp_path_factory)
    out, done, failed = root / name, root / f"{name}.done", root / f"{name}.failed"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists() and not failed.exists():
            env = {
                **os.environ,
                "HF_HUB_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false",
                "OMP_NUM_THREADS": "1",
            }
            proc = subprocess.run(
                _commands(out)[name],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                text=True,
                timeout=900,
            )
            # A failed run is recorded, so that the other workers report it instead of training it again.
            marker = done if proc.returncode == 0 else failed
            marker.write_text(f"exit {proc.returncode}\n{proc.stdout[-4000:]}")
    if failed.exists():
        pytest.fail(f"making the {name} run failed ({failed.read_text()})")
    return out


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _made_run(tmp_path_factory, "tiny")


@pytest.fixture(scope="session")
def scripted_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _made_run(tmp_path_factory, "scripted")


@pytest.fixture(scope="session")
def replay_runs(tiny_run: Path, scripted_run: Path) -> dict[str, Path]:
    return {"tiny": tiny_run, "scripted": scripted_run}
