"""The ``python`` tool: run code in the episode's sandbox session.

State persists across calls within an episode (the sandbox is one interpreter session) and is fresh per
episode (the environment opens a new session on reset). The tool itself never runs code: it hands the code
to ``ToolContext.sandbox``, typed only against :class:`agentrl.protocols.Sandbox`, so it works the same on
the local bubblewrap sandbox, a container or a remote backend.

What the model sees: stdout, then stderr (tracebacks), capped to ``max_output_chars`` keeping head and tail,
plus a one-line note when a limit stopped the code. A sandbox run's status is already a :class:`ToolStatus`
and becomes the call's status unchanged; ``sandbox_error`` is infrastructure (the rollout marks the episode
``infra_failure``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrl.errors import ConfigError
from agentrl.execution import ExecResult
from agentrl.protocols import ToolContext, ToolOutput
from agentrl.types import ToolStatus

from ._text import cap_text
from .function import function_schema

__all__ = ["PythonTool", "format_exec_result", "python"]

_DESCRIPTION = (
    "Run Python code and return what it prints (the value of a final expression is shown too). Variables "
    "and imports persist between calls in this conversation."
)

_NOTES = {
    ToolStatus.TIMEOUT: "The code ran too long and was stopped.",
    ToolStatus.OOM: "MemoryError: the code used too much memory and was stopped.",
    ToolStatus.OUTPUT_LIMIT: "The code printed too much output and was stopped.",
    ToolStatus.KILLED: "The code was killed by a resource limit.",
    ToolStatus.SANDBOX_ERROR: "The Python sandbox failed (not a problem with your code).",
}


class PythonTool:
    """Runs Python code in the episode's sandbox session (a :class:`~agentrl.protocols.Tool`).

    Args:
        timeout: Seconds per run; ``None`` uses the sandbox's limit. The sandbox clamps it to its maximum.
        max_output_chars: Cap on what the model sees (head and tail kept).
        name: Tool name shown to the model.
    """

    needs_sandbox = True
    """Environments open a sandbox session only when some tool says it needs one."""

    def __init__(self, *, timeout: float | None = 10.0, max_output_chars: int = 2000, name: str = "python"):
        if timeout is not None and not timeout > 0:
            raise ConfigError(f"timeout must be > 0 seconds or None, got {timeout!r}")
        if not isinstance(max_output_chars, int) or max_output_chars < 50:
            raise ConfigError(f"max_output_chars must be an int >= 50, got {max_output_chars!r}")
        self.timeout = timeout
        self.max_output_chars = max_output_chars
        self._name = name
        self._schema = function_schema(name, _DESCRIPTION, {"code": (str, "The Python code to run.")})

    @property
    def name(self) -> str:
        return self._name

    @property
    def schema(self) -> dict[str, Any]:
        return self._schema

    def __repr__(self) -> str:
        return f"PythonTool(name={self._name!r}, timeout={self.timeout!r})"

    async def __call__(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
        extra = sorted(set(arguments) - {"code"})
        code = arguments.get("code")
        if not isinstance(code, str) or extra:
            why = f"unexpected argument(s) {extra}" if extra else "it needs a 'code' string"
            return ToolOutput(f"Error: {why}. Call it as {self._name}(code=...).", ToolStatus.BAD_ARGUMENTS)
        if context.sandbox is None:
            return ToolOutput(
                _NOTES[ToolStatus.SANDBOX_ERROR],
                ToolStatus.SANDBOX_ERROR,
                detail="no sandbox in the ToolContext: the environment did not provide one",
            )
        timeout = self.timeout
        if context.limits is not None:
            timeout = context.limits.wall_s if timeout is None else min(timeout, context.limits.wall_s)
        try:
            result = await context.sandbox.run(code, timeout=timeout)
        except Exception as e:  # the Protocol says run() does not raise; a backend that does is broken
            return ToolOutput(
                _NOTES[ToolStatus.SANDBOX_ERROR],
                ToolStatus.SANDBOX_ERROR,
                detail=f"sandbox.run raised {type(e).__name__}: {e}",
            )
        return ToolOutput(
            format_exec_result(result, self.max_output_chars), result.status, detail=result.message
        )


def format_exec_result(result: ExecResult, max_chars: int) -> str:
    """What the model reads for a sandbox run: stdout, stderr, a note on limits, capped head + tail."""
    parts = [p.rstrip("\n") for p in (result.stdout, result.stderr) if p.strip()]
    note = _NOTES.get(result.status)
    if note:
        parts.append(note)
    if result.state_lost:
        parts.append("The Python session was restarted: earlier variables and imports are gone.")
    text = "\n".join(parts) if parts else "(no output; use print() to see values)"
    return cap_text(text, max_chars)


python = PythonTool()
"""The default python tool (10 s per run, 2,000 characters of output shown)."""
