"""ToolExecutor: one record per attempted call, whatever happens; the turn always completes."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from agentrl import ToolCall, ToolContext, ToolOutput, ToolRecord, ToolStatus
from agentrl.errors import ConfigError, SandboxError
from agentrl.testing import EchoTool
from agentrl.tools import HermesParser, ToolExecutor, as_tools, calculator, tool

CTX = ToolContext()
HERMES = HermesParser()


def call(name: str, args: str = "{}") -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {args}}}</tool_call>'


@tool
async def nap(seconds: float) -> str:
    """Sleep, then say so.

    Args:
        seconds: How long.
    """
    await asyncio.sleep(seconds)
    return "rested"


class Raw:
    """A hand-written Tool that raises what it is told to."""

    needs_sandbox = False

    def __init__(self, name: str, exc: BaseException | None = None, output: Any = None):
        self.name, self.exc, self.output = name, exc, output
        self.schema = {"type": "function", "function": {"name": name, "description": "x", "parameters": {}}}
        self.calls = 0

    async def __call__(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
        self.calls += 1
        if self.exc is not None:
            raise self.exc
        return self.output if self.output is not None else ToolOutput("fine")


async def run(executor: ToolExecutor, text: str, turn: int = 0) -> tuple[ToolRecord, ...]:
    return await executor.run(HERMES.parse(text, id_prefix=f"call_{turn}"), CTX, turn=turn)


async def test_records_carry_id_name_verbatim_arguments_output_status_duration_and_turn():
    ex = ToolExecutor([calculator, EchoTool()])
    args = '{"expression":  "2**10"}'
    (rec,) = await run(ex, call("calculator", args), turn=3)
    assert rec == ToolRecord("call_3_0", "calculator", args, "1024", ToolStatus.OK, rec.duration_s, 3)
    assert rec.duration_s >= 0


async def test_every_kind_of_failure_gets_its_own_record_and_later_calls_still_run():
    ex = ToolExecutor([calculator, EchoTool()])
    text = (
        call("nope")
        + "<tool_call>{broken</tool_call>"
        + call("echo", '"[1, 2]"')
        + call("calculator", '{"expr": "1"}')
        + call("calculator", '{"expression": "1/0"}')
        + call("echo", '{"text": "still here"}')
    )
    records = await run(ex, text)
    assert [r.status for r in records] == [
        ToolStatus.UNKNOWN_TOOL,
        ToolStatus.PARSE_ERROR,
        ToolStatus.PARSE_ERROR,
        ToolStatus.BAD_ARGUMENTS,
        ToolStatus.ERROR,
        ToolStatus.OK,
    ]
    assert records[0].output == "Unknown tool 'nope'. Available tools: calculator, echo."
    assert "invalid JSON" in records[1].output and records[1].arguments == "{broken"
    assert "must be a JSON object" in records[2].output
    assert "unexpected argument 'expr'" in records[3].output
    assert records[4].output == "Error: division by zero"
    assert records[5].output == "still here"
    assert [r.call_id for r in records] == [f"call_0_{k}" for k in range(6)]


async def test_arguments_that_are_not_a_json_object_are_bad_arguments():
    ex = ToolExecutor([EchoTool()])
    for raw in ("[1, 2]", "{oops", '"\\"text\\""'):
        rec = await ex.call(ToolCall("c", "echo", raw), CTX, turn=0)
        assert rec.status is ToolStatus.BAD_ARGUMENTS and rec.arguments == raw
    rec = await ex.call(ToolCall("c", "echo", '"{\\"text\\": \\"twice\\"}"'), CTX, turn=0)
    assert rec.status is ToolStatus.OK and rec.output == "twice"  # JSON-encoded twice is accepted


async def test_a_slow_call_times_out_and_the_turn_goes_on():
    ex = ToolExecutor([nap, EchoTool()], timeout=0.05)
    slow, fast = await run(ex, call("nap", '{"seconds": 5}') + call("echo", '{"text": "hi"}'))
    assert slow.status is ToolStatus.TIMEOUT and "timed out after 0.05 s" in slow.output
    assert fast.status is ToolStatus.OK


async def test_exceptions_from_hand_written_tools_are_errors_for_the_model():
    ex = ToolExecutor([Raw("boom", ValueError("bad input"))])
    (rec,) = await run(ex, call("boom"))
    assert rec.status is ToolStatus.ERROR and rec.output == "Error: ValueError: bad input"
    assert "Traceback" in rec.detail


async def test_infra_failure_is_sandbox_error_and_stops_the_turn():
    broken, after = Raw("run", SandboxError("worker died")), Raw("after")
    ex = ToolExecutor([broken, after])
    first, second = await run(ex, call("run") + call("after"))
    assert first.status is ToolStatus.SANDBOX_ERROR and first.status.is_infra
    assert "worker died" in first.detail
    assert second.status is ToolStatus.SANDBOX_ERROR and after.calls == 0


async def test_infra_errors_raised_inside_a_decorated_tool_are_sandbox_errors():
    @tool
    async def fetch(url: str) -> str:
        """Fetch through the sandbox.

        Args:
            url: Where.
        """
        raise SandboxError("sandbox pool busy")

    (rec,) = await run(ToolExecutor([fetch]), call("fetch", '{"url": "x"}'))
    assert rec.status is ToolStatus.SANDBOX_ERROR and "pool busy" in rec.detail


async def test_wrong_return_types_and_unknown_statuses_are_errors():
    (plain,) = await run(ToolExecutor([Raw("plain", output="just text")]), call("plain"))
    assert plain.status is ToolStatus.ERROR and "no ToolOutput" in plain.output
    # ToolOutput.status is typed: a status string is converted, an unknown one is refused where it is made.
    assert ToolOutput("x", status="timeout").status is ToolStatus.TIMEOUT  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown tool status 'great'"):
        ToolOutput("x", status="great")  # type: ignore[arg-type]


def test_a_hand_written_tool_must_say_whether_it_needs_a_sandbox():
    class Undeclared:
        name = "undeclared"
        schema = Raw("undeclared").schema

        async def __call__(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
            return ToolOutput("x")

    with pytest.raises(ConfigError, match=r"looks like a Tool but lacks \['needs_sandbox'\]"):
        ToolExecutor([Undeclared()])


async def test_too_many_calls_in_one_turn_are_answered_not_run():
    echo = Raw("echo")
    ex = ToolExecutor([echo], max_calls_per_turn=2)
    records = await run(ex, call("echo") * 4)
    assert [r.status for r in records] == [ToolStatus.OK] * 2 + [ToolStatus.ERROR] * 2
    assert "at most 2 tool calls" in records[3].output and echo.calls == 2


async def test_output_is_capped_head_and_tail():
    long = "HEAD" + "x" * 50_000 + "TAIL"
    ex = ToolExecutor([Raw("big", output=ToolOutput(long))], max_output_chars=1000)
    (rec,) = await run(ex, call("big"))
    assert len(rec.output) < 1100
    assert rec.output.startswith("HEAD") and rec.output.endswith("TAIL") and "characters cut" in rec.output


async def test_cancellation_propagates():
    ex = ToolExecutor([nap], timeout=None)
    task = asyncio.ensure_future(run(ex, call("nap", '{"seconds": 10}')))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_configuration_errors():
    def add(a: int) -> int:
        """Add.

        Args:
            a: A.
        """
        return a

    assert as_tools([add])[0].name == "add"  # plain functions are wrapped
    with pytest.raises(ConfigError, match="share the name"):
        ToolExecutor([calculator, calculator])
    with pytest.raises(ConfigError, match="must be a Tool"):
        as_tools([42])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="timeout"):
        ToolExecutor([], timeout=0)
    with pytest.raises(ConfigError, match="max_calls_per_turn"):
        ToolExecutor([], max_calls_per_turn=0)
