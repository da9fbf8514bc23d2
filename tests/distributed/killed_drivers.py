"""Drivers killed with SIGKILL mid-run and resumed, for the two driver-kill tests (test_killed_drivers.py: a
synchronous run and one at --max-staleness 1).

Both runs go side by side on the session cluster (``killed_drivers`` in conftest.py): most of a driver's
time is process starts (the driver, then its learner, server and worker actors, twice) and the scripted
sampler's sleeps, so two overlap well; one after the other they took 96 s and 95 s on 2 idle cores. Each
driver is killed at its own moment and resumed at once; the tests then check what the resume did.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.metrics import read_metrics
from agentrl.run import RunDir
from agentrl.trainers.ray import GroupLedger

DRIVE = Path(__file__).parent / "drive.py"


def lines_of(run: Path, step: int) -> list[str]:
    """The trajectory lines of ``step`` written so far."""
    traj = run / "trajectories.jsonl"
    return [x for x in (traj.read_text().splitlines() if traj.exists() else []) if f'"step":{step}' in x]


@dataclass(frozen=True)
class Scenario:
    """One driver run: ``steps`` steps at ``staleness``, killed once ``ready(run)`` holds; with
    ``read_ledger`` the ledger is read between the kill and the resume (reading it truncates a line the kill
    cut, which the resume would otherwise do itself)."""

    name: str
    steps: int
    staleness: int
    ready: Callable[[Path], bool]
    read_ledger: bool = False


@dataclass
class KilledRun:
    """What a killed driver left (read between the kill and the resume) and what its resume printed."""

    run: Path
    before: list[str] = field(default_factory=list)
    """trajectories.jsonl's lines when the driver was killed."""
    steps_before: list[int] = field(default_factory=list)
    """The steps of metrics.jsonl's rows then."""
    done_before: dict[int, int] = field(default_factory=dict)
    """The ledger's done groups of each step then (a scenario with ``read_ledger``)."""
    start: int | None = None
    """The newest complete checkpoint's step then (None: there was none)."""
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    """Why there is nothing to check (the driver ended or stalled before its kill, the resume hung)."""


SCENARIOS = (
    # Kill mid step 1 (two of its episodes written, step 0 trained).
    Scenario("sync", steps=3, staleness=0, ready=lambda run: len(lines_of(run, 1)) >= 2, read_ledger=True),
    # Kill once step 1 is trained (its checkpoint written) and step 2's episodes are under way.
    Scenario(
        "async",
        steps=4,
        staleness=1,
        ready=lambda run: (run / "checkpoints" / "step-000002").exists() and len(lines_of(run, 2)) >= 2,
    ),
)


def kill_and_resume(
    address: str,
    root: Path,
    scenarios: tuple[Scenario, ...] = SCENARIOS,
    *,
    kill_within_s: float = 400.0,
    resume_within_s: float = 600.0,
) -> dict[str, KilledRun]:
    """Start a driver per scenario, SIGKILL each once it is ready, resume it with ``--resume`` and wait for
    every resume; one scenario's failure is recorded in its ``error`` and does not stop the others."""
    env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}

    def cmd(sc: Scenario) -> list[str]:
        args = [str(DRIVE), address, str(root / sc.name), str(sc.steps), "--max-staleness", str(sc.staleness)]
        return [sys.executable, *args]

    def start(sc: Scenario, what: str, *extra: str) -> subprocess.Popen[bytes]:
        # Files, not pipes: nobody reads while it runs, and a full pipe blocks the driver.
        with (
            (root / f"{sc.name}-{what}.out").open("wb") as out,
            (root / f"{sc.name}-{what}.err").open("wb") as err,
        ):
            return subprocess.Popen([*cmd(sc), *extra], stdout=out, stderr=err, env=env)

    def printed(sc: Scenario, what: str, stream: str) -> str:
        path = root / f"{sc.name}-{what}.{stream}"
        return path.read_text(errors="replace") if path.exists() else ""

    out = {sc.name: KilledRun(root / sc.name) for sc in scenarios}
    drivers = {sc.name: start(sc, "driver") for sc in scenarios}
    resumes: dict[str, subprocess.Popen[bytes]] = {}
    waiting = list(scenarios)
    deadline = time.monotonic() + kill_within_s
    while waiting:
        for sc in list(waiting):
            proc, k = drivers[sc.name], out[sc.name]
            if proc.poll() is not None or time.monotonic() > deadline:
                why = "ended" if proc.poll() is not None else f"was not ready within {kill_within_s:.0f} s"
                proc.kill()
                proc.wait()
                log = (printed(sc, "driver", "out") + printed(sc, "driver", "err"))[-3000:]
                k.error = f"the {sc.name} driver {why} before its kill:\n{log}"
                waiting.remove(sc)
            elif sc.ready(k.run):
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                k.before = (k.run / "trajectories.jsonl").read_text().splitlines()
                k.steps_before = [r["step"] for r in read_metrics(k.run)]
                if sc.read_ledger:
                    with GroupLedger(k.run / "ledger.jsonl") as ledger:
                        k.done_before = {s: ledger.counts(s)["done"] for s in range(sc.steps)}
                ckpt = RunDir(k.run).latest_checkpoint()
                k.start = None if ckpt is None else ckpt.step
                resumes[sc.name] = start(sc, "resume", "--resume")
                waiting.remove(sc)
        time.sleep(0.05)
    deadline = time.monotonic() + resume_within_s
    for sc in scenarios:
        if (proc := resumes.get(sc.name)) is None:
            continue
        k = out[sc.name]
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            k.error = f"the {sc.name} resume did not finish within {resume_within_s:.0f} s"
        k.returncode = proc.returncode
        k.stdout, k.stderr = printed(sc, "resume", "out"), printed(sc, "resume", "err")
    return out
