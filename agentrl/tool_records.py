"""How a tool call ended, and the record of one call: the tool half of a :class:`~agentrl.types.Trajectory`.

Split out of ``agentrl.types`` (which re-exports both names) to keep that module within the line budget;
the values are what ``trajectories.jsonl`` stores.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from agentrl.errors import FormatError

__all__ = ["ToolRecord", "ToolStatus"]


class ToolStatus(StrEnum):
    """How one tool call ended, and how the sandbox run behind it ended: one vocabulary for both.

    A sandbox run (:attr:`agentrl.execution.ExecResult.status`) ends in one of the *run* statuses: ``OK``,
    ``ERROR``, ``TIMEOUT``, ``OOM``, ``OUTPUT_LIMIT``, ``KILLED``, ``SANDBOX_ERROR``. A tool call can also end
    before anything runs, in a *call* status (:attr:`is_call_error`): ``PARSE_ERROR``, ``UNKNOWN_TOOL``,
    ``BAD_ARGUMENTS``. The values are what ``trajectories.jsonl`` stores.
    """

    OK = "ok"
    """The tool (or the code) ran to completion and returned output."""
    ERROR = "error"
    """The tool ran and failed (exception, code raised, non-zero exit); the model sees the error."""
    TIMEOUT = "timeout"
    """The wall-clock limit was hit; a sandbox kills the whole process tree."""
    OOM = "oom"
    """The memory limit was hit."""
    OUTPUT_LIMIT = "output_limit"
    """The code wrote more output than the hard cap and was stopped."""
    KILLED = "killed"
    """Killed by another limit (process count, file size, CPU time) or a signal."""
    PARSE_ERROR = "parse_error"
    """The call itself could not be parsed (bad JSON, missing name). Nothing ran."""
    UNKNOWN_TOOL = "unknown_tool"
    """The model named a tool the environment does not have. Nothing ran."""
    BAD_ARGUMENTS = "bad_arguments"
    """The arguments did not fit the tool's signature. Nothing ran."""
    SANDBOX_ERROR = "sandbox_error"
    """Infrastructure failure: the sandbox could not run the call (could not start, crashed, busy). Marks
    the episode as an infra failure; never the model's fault."""

    @property
    def is_infra(self) -> bool:
        """True when the failure is ours, not the model's (or the code's)."""
        return self is ToolStatus.SANDBOX_ERROR

    @property
    def is_call_error(self) -> bool:
        """True for the statuses of a call that never ran because the model wrote it wrongly."""
        return self in _CALL_ERRORS

    @classmethod
    def parse(cls, value: Any) -> ToolStatus:
        """The status named ``value`` (a member or its string); :class:`FormatError` for anything else."""
        try:
            return cls(value)
        except ValueError:
            raise FormatError(f"unknown tool status {value!r}; one of {[s.value for s in cls]}") from None


_CALL_ERRORS = frozenset({ToolStatus.PARSE_ERROR, ToolStatus.UNKNOWN_TOOL, ToolStatus.BAD_ARGUMENTS})


@dataclass(frozen=True, slots=True)
class ToolRecord:
    """One executed (or rejected) tool call with its input, output, status and timing."""

    call_id: str
    """The call's id (matches ``ToolCall.id`` and the tool message's ``tool_call_id``)."""
    name: str
    """Tool name as the model wrote it."""
    arguments: str
    """Arguments as the model wrote them (JSON string, verbatim)."""
    output: str
    """What the model was shown."""
    status: ToolStatus
    """How the call ended."""
    duration_s: float
    """Wall-clock seconds spent in the tool."""
    turn: int
    """Index of the model turn that made the call (0-based)."""
    detail: str = ""
    """Extra diagnostics not shown to the model (e.g. the sandbox's own message)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON object stored in ``trajectories.jsonl``."""
        return {
            "call_id": self.call_id,
            "name": self.name,
            "arguments": self.arguments,
            "output": self.output,
            "status": self.status.value,
            "duration_s": self.duration_s,
            "turn": self.turn,
            "detail": self.detail,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ToolRecord:
        """Parse :meth:`to_dict`'s output (as read back from JSON)."""
        return cls(
            call_id=str(d["call_id"]),
            name=str(d["name"]),
            arguments=str(d["arguments"]),
            output=str(d["output"]),
            status=ToolStatus.parse(d["status"]),
            duration_s=float(d["duration_s"]),
            turn=int(d["turn"]),
            detail=str(d.get("detail", "")),
        )
