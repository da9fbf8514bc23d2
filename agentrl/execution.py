"""Value types for running code in a sandbox: the limits asked for and the result returned.

They live in the core because the :class:`agentrl.protocols.Sandbox` Protocol is typed against them; the
backends that honour them live in ``agentrl.sandbox`` (the top-level ``sandbox/`` folder). A run's status is a
:class:`~agentrl.types.ToolStatus`, the vocabulary tool calls use too, so a sandbox outcome reaches the
trajectory unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from agentrl.errors import ConfigError
from agentrl.types import ToolStatus

__all__ = ["ExecResult", "ExecStatus", "Limits"]

MiB = 1024 * 1024

ExecStatus = ToolStatus
"""The former name of :class:`~agentrl.types.ToolStatus`, kept so code written against it keeps working.

A sandbox run and the tool call it serves share one status vocabulary; a run ends in one of the run statuses
(never a call status such as ``PARSE_ERROR``)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits for one sandboxed run. Defaults are safe; callers may only lower them.

    A backend is configured with a maximum ``Limits``; a per-call request is clamped with
    :meth:`clamp` so that neither a caller nor a model-supplied tool argument can raise a limit.
    """

    wall_s: float = 10.0
    """Wall-clock seconds for one run before the process tree is killed."""
    memory_bytes: int = 512 * MiB
    """Address-space / cgroup memory limit for the sandboxed interpreter."""
    max_processes: int = 64
    """Processes and threads the sandbox may hold at once."""
    output_bytes: int = 64 * 1024
    """Bytes returned per stream (stdout, stderr); longer output keeps head and tail with a marker."""
    file_size_bytes: int = 16 * MiB
    """Largest file the code may write."""
    scratch_bytes: int = 64 * MiB
    """Size of the scratch tmpfs the code sees as its working directory."""
    network: bool = False
    """Whether the code may reach a network. Off by default; local backend never enables it."""
    cpu_threads: int = 1
    """Threads for BLAS/OpenMP libraries inside the sandbox."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "network":
                if not isinstance(value, bool):
                    raise ConfigError(f"Limits.network must be a bool, got {value!r}")
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"Limits.{f.name} must be a positive number, got {value!r}")

    def clamp(self, requested: Limits | None = None, *, wall_s: float | None = None) -> Limits:
        """Return ``requested`` (or these limits with ``wall_s``) lowered to at most these limits."""
        req = requested if requested is not None else self
        if wall_s is not None:
            if not isinstance(wall_s, int | float) or isinstance(wall_s, bool) or wall_s <= 0:
                raise ConfigError(f"timeout must be a positive number of seconds, got {wall_s!r}")
            req = dataclasses.replace(req, wall_s=float(wall_s))
        return Limits(
            wall_s=min(req.wall_s, self.wall_s),
            memory_bytes=min(req.memory_bytes, self.memory_bytes),
            max_processes=min(req.max_processes, self.max_processes),
            output_bytes=min(req.output_bytes, self.output_bytes),
            file_size_bytes=min(req.file_size_bytes, self.file_size_bytes),
            scratch_bytes=min(req.scratch_bytes, self.scratch_bytes),
            network=req.network and self.network,
            cpu_threads=min(req.cpu_threads, self.cpu_threads),
        )


@dataclass(frozen=True, slots=True)
class ExecResult:
    """What one sandboxed run produced."""

    status: ToolStatus
    """How the run ended: one of the run statuses (``ok``, ``error``, ``timeout``, ``oom``, ``output_limit``,
    ``killed``, ``sandbox_error``), never a call status."""
    stdout: str = ""
    """Captured standard output (capped: head + marker + tail), with the notebook-style value of the last
    expression appended when there is one."""
    stderr: str = ""
    """Captured standard error (capped like ``stdout``); tracebacks land here."""
    exit_code: int | None = None
    """Process exit code where one exists (None for a persistent interpreter that survived the run)."""
    duration_s: float = 0.0
    """Wall-clock seconds the run took, as seen by the caller."""
    truncated: bool = False
    """True when ``stdout`` or ``stderr`` was cut to the output cap."""
    state_lost: bool = False
    """True when a stateful session was restarted (after a timeout, OOM or crash): variables are gone."""
    message: str = ""
    """A human-readable note from the sandbox (why it was killed, why it failed to start)."""

    def __post_init__(self) -> None:
        if not isinstance(self.status, ToolStatus) or self.status.is_call_error:
            raise ConfigError(f"a sandbox run cannot end with status {self.status!r}")

    @property
    def ok(self) -> bool:
        """True when the code ran to completion without raising."""
        return self.status is ToolStatus.OK
