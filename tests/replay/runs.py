"""Training runs made once per test session and shared by every xdist worker (and every module) that asks.

A run is keyed by its command: the first worker to ask trains it under a file lock in the session's shared
temp folder (the pattern in pytest-xdist's docs, "Making session-scoped fixtures execute only once"); the
others wait for the lock and read the same folder. Tests must not change a shared run: one that does works on
a copy (:func:`private_copy`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

TINY = (
    "--model",
    "tiny",
    "--group-size",
    "2",
    "--groups-per-step",
    "2",
    "--rollout.max-new-tokens",
    "24",
    "--eval.tasks",
    "2",
    "--no-progress",
)
"""The tiny model's run settings that tests/trainers/test_train.py's CLI runs share."""
TINY_TWO_STEPS = ("train", *TINY, "--steps", "2")
"""``agentrl train`` on the tiny model, 2 steps of 2 groups of 2, a held-out evaluation of 2 tasks: the run
tests/replay's ``tiny_run`` and tests/trainers/test_train.py's ``two_step_run`` both read."""


def _shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Under xdist every worker has its own basetemp (.../pytest-N/popen-gwK); their parent is the session's.
    # Without xdist the parent is shared by every past session, so the session's own folder is used.
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-runs"
    root.mkdir(exist_ok=True)
    return root


def shared_run(tmp_path_factory: pytest.TempPathFactory, cmd: Sequence[str]) -> tuple[Path, str]:
    """The run folder ``cmd`` (its last argument is the folder, given as ``{out}``) made, and its stdout.

    ``cmd`` runs once per session, the first time any worker asks for it; a failure is recorded, so that the
    other workers report it instead of training it again."""
    key = hashlib.sha256(json.dumps([str(c) for c in cmd]).encode()).hexdigest()[:12]
    root = _shared_root(tmp_path_factory)
    out, done, failed = root / key, root / f"{key}.stdout", root / f"{key}.failed"
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists() and not failed.exists():
            env = {
                **os.environ,
                "HF_HUB_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false",
                "OMP_NUM_THREADS": "1",
            }
            args = [str(out) if c == "{out}" else str(c) for c in cmd]
            proc = subprocess.run(args, capture_output=True, env=env, text=True, timeout=900)
            if proc.returncode == 0:
                done.write_text(proc.stdout)
            else:
                failed.write_text(f"exit {proc.returncode}: {' '.join(args)}\n{proc.stderr[-4000:]}")
    if failed.exists():
        pytest.fail(f"making a shared run failed ({failed.read_text()})")
    return out, done.read_text()


def cli_run(tmp_path_factory: pytest.TempPathFactory, args: Sequence[str]) -> tuple[Path, str]:
    """:func:`shared_run` of ``python -m agentrl.trainers ARGS --out {out}``."""
    return shared_run(tmp_path_factory, [sys.executable, "-m", "agentrl.trainers", *args, "--out", "{out}"])


def private_copy(run: Path, dst: Path) -> Path:
    """A copy of a shared run that a test may change (resume, plot into), recorded as written where it is."""
    shutil.copytree(run, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["output"]["out"] = str(dst)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst
