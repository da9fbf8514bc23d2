"""Host side of the worker protocol shared by the local and Docker backends (see ``_worker.py``)."""

from __future__ import annotations

import functools
import json
import marshal
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.execution import ExecResult, Limits
from agentrl.types import ToolStatus

__all__ = [
    "BOOTSTRAP",
    "MARKER",
    "Outcome",
    "frame",
    "parse_line",
    "to_result",
    "worker_code",
]

MiB = 1024 * 1024

# Reads the marshalled worker from the control fd (argv[2]) and runs it. Kept tiny: it is compiled by
# ``python -c`` on every start.
BOOTSTRAP = (
    "import os,sys,marshal\n"
    "f=int(sys.argv[2]);n=int(sys.argv[1]);b=b''\n"
    "while len(b)<n:\n"
    " c=os.read(f,n-len(b))\n"
    " if not c:os._exit(70)\n"
    " b+=c\n"
    "del f,n,c\n"
    "exec(marshal.loads(b))"
)

MARKER = "\x00\x1eAGENTRL-END:"
"""Prefix of the end-of-cell marker in sentinel mode (followed by a per-call nonce)."""


@functools.cache
def worker_code() -> bytes:
    """The worker, compiled and marshalled for this interpreter (sent to every new sandbox)."""
    src = (Path(__file__).with_name("_worker.py")).read_text()
    return marshal.dumps(compile(src, "<agentrl-sandbox-worker>", "exec"))


def frame(obj: dict[str, Any]) -> bytes:
    """One host -> worker frame."""
    data = marshal.dumps(obj)
    return len(data).to_bytes(4, "big") + data


def parse_line(line: bytes) -> dict[str, Any] | None:
    """A worker -> host line as a dict, or None when it is not a well-formed frame (the code wrote junk
    into the control channel)."""
    if len(line) > 512:
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a call ended, as seen by the host, before it becomes an :class:`ExecResult`."""

    kind: str
    """"frame" (the worker answered), "timeout", "died", "output_limit", "protocol" (junk on the control
    channel), "infra" (the backend failed)."""
    status: str = ""
    """The worker's status for ``frame``: ok, error, oom, exit."""
    exit_code: int | None = None
    """Exit code for ``exit`` frames and deaths."""
    signal: int | None = None
    """Signal that ended the worker, when known."""
    oom_killed: bool = False
    """The backend saw a kernel OOM kill in the sandbox's cgroup."""
    detail: str = ""
    """Extra text for the message (infra failures)."""


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def to_result(
    outcome: Outcome,
    *,
    stdout: str,
    stderr: str,
    truncated: bool,
    duration_s: float,
    limits: Limits,
    hard_cap: int,
    state_lost_before: bool = False,
) -> ExecResult:
    """Map an outcome to the contract's :class:`ExecResult` (status, message, state_lost)."""
    lost_note = " The session was restarted and its state (variables, imports, files) was lost."
    status: ToolStatus
    state_lost = False
    exit_code: int | None = None
    message = ""
    k = outcome.kind
    if k == "frame" and outcome.status in ("ok", "error"):
        status = ToolStatus.OK if outcome.status == "ok" else ToolStatus.ERROR
    elif k == "frame" and outcome.status == "oom":
        status = ToolStatus.OOM
        message = (
            f"MemoryError: the memory limit ({limits.memory_bytes // MiB} MiB) was reached. "
            "The session is still running with its state."
        )
    elif k == "frame" and outcome.status == "exit":
        status, state_lost, exit_code = ToolStatus.ERROR, True, outcome.exit_code
        message = f"The code exited (exit code {outcome.exit_code})." + lost_note
    elif k == "timeout":
        status, state_lost = ToolStatus.TIMEOUT, True
        message = f"Timed out after {limits.wall_s:g} s; every process was killed." + lost_note
    elif k == "output_limit":
        status, state_lost = ToolStatus.OUTPUT_LIMIT, True
        message = f"The code wrote more than {hard_cap // MiB} MiB of output and was stopped." + lost_note
    elif k == "protocol":
        status, state_lost = ToolStatus.KILLED, True
        message = "The code wrote into the sandbox's control channel and was stopped." + lost_note
    elif k == "died" and outcome.oom_killed:
        status, state_lost = ToolStatus.OOM, True
        message = (
            f"Out of memory: the sandbox exceeded its memory limit "
            f"({limits.memory_bytes // MiB} MiB) and was killed." + lost_note
        )
    elif k == "died" and outcome.signal is not None:
        status, state_lost = ToolStatus.KILLED, True
        exit_code = 128 + outcome.signal
        why = {
            int(signal.SIGXCPU): " (CPU time limit)",
            int(signal.SIGXFSZ): " (file size limit)",
            int(signal.SIGSEGV): " (segmentation fault)",
        }.get(outcome.signal, "")
        message = f"The Python process was killed by {_signame(outcome.signal)}{why}." + lost_note
    elif k == "died":
        status, state_lost, exit_code = ToolStatus.ERROR, True, outcome.exit_code
        message = f"The Python process exited (exit code {outcome.exit_code})." + lost_note
    else:  # "infra" or anything unexpected
        status = ToolStatus.SANDBOX_ERROR
        state_lost = True
        message = "Sandbox failure (not the code's fault): " + (outcome.detail or "unknown error")
    if state_lost_before and not state_lost:
        state_lost = True
        message = (
            "The previous session had died between calls; this call ran in a fresh session and "
            "earlier state was lost. " + message
        ).strip()
    return ExecResult(
        status=status,
        stdout=stdout,
        stderr=stderr,
        exit_code=exit_code,
        duration_s=duration_s,
        truncated=truncated,
        state_lost=state_lost,
        message=message,
    )
