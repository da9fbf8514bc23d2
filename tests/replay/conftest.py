"""Two real training runs, each made once per test session and shared by every xdist worker (``runs.py``).

* ``tiny_run``: exactly ``agentrl train --model tiny --steps 2 --groups-per-step 2 --group-size 2
  --rollout.max-new-tokens 24 --eval.tasks 2`` (``runs.TINY_TWO_STEPS``, the same run as test_train.py's
  ``two_step_run``) — the random model never stops, so every episode is one cut turn with reward 0, but the
  sampler's log-probs are real (the mismatch is ~1e-6).
* ``scripted_run``: the same trainer with a scripted sampler (``make_run.py``): real python tool calls in
  the real sandbox (ok and error), rewards that differ inside each group, non-zero advantages and losses;
  no held-out evaluation (no replay test reads ``eval.json``, and its 32 default tasks were most of the
  run's cost).

Each run is made only when a test asks for it. Tests here only read them (``copy_run`` for a changed copy).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .runs import TINY_TWO_STEPS, cli_run, shared_run

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cli_run(tmp_path_factory, TINY_TWO_STEPS)[0]


@pytest.fixture(scope="session")
def scripted_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_run(tmp_path_factory, [sys.executable, str(HERE / "make_run.py"), "{out}"])[0]


@pytest.fixture(scope="session")
def replay_runs(tiny_run: Path, scripted_run: Path) -> dict[str, Path]:
    return {"tiny": tiny_run, "scripted": scripted_run}
