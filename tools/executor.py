"""``ToolExecutor``: runs the calls of one parsed turn and records each as a :class:`ToolRecord`.

Every attempted call gets exactly one record (and so one tool message), whatever happened: a parse error,
an unknown tool, arguments that are not a JSON object, a timeout, an exception, too many calls in one turn.
Calls run one after another in text order, because later code usually depends on earlier state (the same
sandbox session). A timed-out async tool is cancelled; a sync tool running in a worker thread cannot be
stopped, so its thread finishes in the background (keep sync tools fast). A failing sandbox is
infrastructure, not the model's fault: it is recorded as ``SANDBOX_ERROR`` (the rollout then marks the
episode ``infra_failure``) and the turn's remaining calls are not run.
"""

from __future__ import annotations

import asyncio
import json
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from agentrl.errors import ConfigError, InfraError
from agentrl.protocols import Tool, ToolContext, ToolOutput
from agentrl.types import ToolCall, ToolRecord, ToolStatus

from ._text import cap_text
from .function import tool as make_tool
from .parsers import ParsedTurn

__all__ = ["ToolExecutor", "as_tools"]


def as_tools(tools: Iterable[Tool | Callable[..., Any]]) -> tuple[Tool, ...]:
    """Tools as given, with plain functions wrapped by ``@tool``; duplicate names are an error."""
    out: list[Tool] = []
    for t in tools:
        if not isinstance(t, Tool):
            if not callable(t):
                raise ConfigError(f"a tool must be a Tool or a documented function, got {t!r}")
            t = make_tool(t)
        out.append(t)
    names = [t.name for t in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"two tools share the name(s) {dupes}; tool names must be unique")
    return tuple(out)


class ToolExecutor:
    """Runs tool calls with a per-call timeout and turns every outcome into a :class:`ToolRecord`.

    Args:
        tools: The tools the model may call (plain documented functions are wrapped with ``@tool``).
        timeout: Wall-clock seconds per call before it is cancelled (``TIMEOUT``); ``None`` for no limit.
            Tools with their own limit (the python tool's sandbox) should stay below it.
        max_calls_per_turn: Calls beyond this many in one turn are answered with an error, not run.
        max_output_chars: Backstop cap (head + tail) on what any tool shows the model.
    """

    def __init__(
        self,
        tools: Iterable[Tool | Callable[..., Any]],
        *,
        timeout: float | None = 30.0,
        max_calls_per_turn: int = 8,
        max_output_chars: int = 16_000,
    ):
        if timeout is not None and not timeout > 0:
            raise ConfigError(f"timeout must be > 0 seconds or None, got {timeout!r}")
        if not isinstance(max_calls_per_turn, int) or max_calls_per_turn < 1:
            raise ConfigError(f"max_calls_per_turn must be a positive int, got {max_calls_per_turn!r}")
        if not isinstance(max_output_chars, int) or max_output_chars < 100:
            raise ConfigError(f"max_output_chars must be an int >= 100, got {max_output_chars!r}")
        self.tools: dict[str, Tool] = {t.name: t for t in as_tools(tools)}
        self.timeout = timeout
        self.max_calls_per_turn = max_calls_per_turn
        self.max_output_chars = max_output_chars

    async def run(self, parsed: ParsedTurn, context: ToolContext, *, turn: int) -> tuple[ToolRecord, ...]:
        """Run every call of ``parsed`` in order; one record per attempted call."""
        records: list[ToolRecord] = []
        broken = False
        for k, call in enumerate(parsed.calls):
            error = parsed.error_for(call.id)
            if error is not None:
                rec = _record(call, turn, error.message, error.status)
            elif broken:
                rec = _record(
                    call, turn, "Not run: the sandbox failed on an earlier call.", ToolStatus.SANDBOX_ERROR
                )
            elif k >= self.max_calls_per_turn:
                rec = _record(
                    call,
                    turn,
                    f"Not run: at most {self.max_calls_per_turn} tool calls are allowed in one turn.",
                    ToolStatus.ERROR,
                )
            else:
                rec = await self.call(call, context, turn=turn)
            broken = broken or rec.status.is_infra
            records.append(rec)
        return tuple(records)

    async def call(self, call: ToolCall, context: ToolContext, *, turn: int) -> ToolRecord:
        """Run one call (never raises except on cancellation)."""
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return _record(
                call, turn, f"Unknown tool {call.name!r}. Available tools: {known}.", ToolStatus.UNKNOWN_TOOL
            )
        arguments = _load_arguments(call.arguments)
        if not isinstance(arguments, Mapping):
            return _record(
                call,
                turn,
                f"Error: the arguments of {call.name!r} must be a JSON object, got {call.arguments[:100]!r}.",
                ToolStatus.BAD_ARGUMENTS,
            )
        start = time.perf_counter()
        try:
            if self.timeout is None:
                out = await tool(arguments, context)
            else:
                out = await asyncio.wait_for(tool(arguments, context), self.timeout)
        except TimeoutError:
            return _record(
                call,
                turn,
                f"Error: the tool {call.name!r} timed out after {self.timeout:g} s.",
                ToolStatus.TIMEOUT,
                time.perf_counter() - start,
            )
        except InfraError as e:
            return _record(
                call,
                turn,
                "Error: the tool's sandbox failed (not your fault).",
                ToolStatus.SANDBOX_ERROR,
                time.perf_counter() - start,
                detail="".join(traceback.format_exception(e)),
            )
        except Exception as e:
            short = "".join(traceback.format_exception_only(type(e), e)).strip()
            return _record(
                call,
                turn,
                f"Error: {cap_text(short, 1000)}",
                ToolStatus.ERROR,
                time.perf_counter() - start,
                detail="".join(traceback.format_exception(e)),
            )
        duration = time.perf_counter() - start
        if not isinstance(out, ToolOutput):
            return _record(
                call,
                turn,
                "Error: the tool returned no ToolOutput.",
                ToolStatus.ERROR,
                duration,
                detail=f"{type(tool).__name__} returned {type(out).__name__}",
            )
        # ToolOutput validates its status when built, so it is a ToolStatus here.
        return _record(
            call, turn, cap_text(out.content, self.max_output_chars), out.status, duration, detail=out.detail
        )

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """OpenAI function schemas of the tools, in order."""
        return [t.schema for t in self.tools.values()]

    def tool_list(self) -> Sequence[Tool]:
        """The tools, in order."""
        return tuple(self.tools.values())


def _load_arguments(raw: str) -> Any:
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
        if isinstance(value, str):  # arguments JSON-encoded twice
            value = json.loads(value)
    except ValueError:
        return None
    return value


def _record(
    call: ToolCall,
    turn: int,
    output: str,
    status: ToolStatus,
    duration: float = 0.0,
    *,
    detail: str = "",
) -> ToolRecord:
    return ToolRecord(
        call_id=call.id,
        name=call.name,
        arguments=call.arguments,
        output=output,
        status=status,
        duration_s=duration,
        turn=turn,
        detail=detail,
    )
