"""The python tool: sandbox plumbing, status mapping, output capping, and the real sandbox."""

from __future__ import annotations

import pytest

from agentrl import ExecResult, Limits, ToolContext, ToolStatus
from agentrl.errors import ConfigError
from agentrl.testing import FakeSandbox
from agentrl.tools import PythonTool, format_exec_result, python


class CannedSandbox:
    """Returns one fixed ExecResult and remembers the timeout it was asked for."""

    def __init__(self, result: ExecResult | None = None, exc: Exception | None = None):
        self.result, self.exc, self.timeouts = result, exc, []

    async def run(self, code: str, *, timeout: float | None = None) -> ExecResult:
        self.timeouts.append(timeout)
        if self.exc:
            raise self.exc
        assert self.result is not None
        return self.result

    async def reset(self) -> None: ...
    async def close(self) -> None: ...
    async def __aenter__(self) -> CannedSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None: ...


async def run_code(tool: PythonTool, code: str, sandbox) -> tuple[str, str]:
    out = await tool({"code": code}, ToolContext(sandbox=sandbox))
    return out.content, out.status


async def test_state_persists_within_one_sandbox_session():
    sb = FakeSandbox()
    assert await run_code(python, "x = 20", sb) == ("(no output; use print() to see values)", "ok")
    assert await run_code(python, "print(x + 1)\nx * 2", sb) == ("21\n40", "ok")
    assert sb.history == ["x = 20", "print(x + 1)\nx * 2"]


async def test_code_errors_show_the_traceback_and_keep_the_session():
    sb = FakeSandbox()
    content, status = await run_code(python, "y = 1\n1 / 0", sb)
    assert status == ToolStatus.ERROR.value and "ZeroDivisionError" in content
    assert await run_code(python, "print(y)", sb) == ("1", "ok")


RUN_STATUSES = [s for s in ToolStatus if not s.is_call_error]


@pytest.mark.parametrize("status", RUN_STATUSES)
async def test_every_sandbox_status_becomes_the_call_status_unchanged(status):
    result = ExecResult(status, stdout="partial\n", message="why")
    out = await python({"code": "..."}, ToolContext(sandbox=CannedSandbox(result)))
    assert out.status is status and out.detail == "why"
    assert out.content.startswith("partial")
    if status is not ToolStatus.OK and status is not ToolStatus.ERROR:
        assert len(out.content.splitlines()) == 2  # plus a one-line note on what stopped the code
    assert out.status.is_infra == (status is ToolStatus.SANDBOX_ERROR)


@pytest.mark.parametrize("status", [s for s in ToolStatus if s.is_call_error])
def test_a_sandbox_run_cannot_end_in_a_call_status(status):
    with pytest.raises(ConfigError, match=status.value):
        ExecResult(status)


def test_schema_is_built_by_the_tool_machinery():
    fn = PythonTool(name="run_py").schema["function"]
    assert fn["name"] == "run_py" and fn["description"].startswith("Run Python code")
    assert fn["parameters"] == {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "The Python code to run."}},
        "required": ["code"],
    }
    assert python.needs_sandbox is True


def test_format_mentions_lost_state_and_caps_head_and_tail():
    lost = ExecResult(ToolStatus.TIMEOUT, state_lost=True)
    assert "earlier variables and imports are gone" in format_exec_result(lost, 500)
    big = ExecResult(ToolStatus.OK, stdout="first line\n" + "0123456789" * 1000 + "\nlast line")
    text = format_exec_result(big, 300)
    assert len(text) < 360
    assert text.startswith("first line") and text.endswith("last line") and "characters cut" in text


async def test_output_shown_to_the_model_is_capped():
    tool = PythonTool(max_output_chars=200)
    content, _ = await run_code(tool, "print('a' * 5000)\nprint('END')", FakeSandbox())
    assert len(content) < 260 and content.endswith("END")


async def test_timeout_is_passed_down_and_lowered_by_the_context_limits():
    sb = CannedSandbox(ExecResult(ToolStatus.OK))
    await PythonTool(timeout=10)({"code": "1"}, ToolContext(sandbox=sb))
    await PythonTool(timeout=10)({"code": "1"}, ToolContext(sandbox=sb, limits=Limits(wall_s=2)))
    await PythonTool(timeout=None)({"code": "1"}, ToolContext(sandbox=sb))
    assert sb.timeouts == [10, 2, None]


async def test_missing_or_raising_sandbox_is_infrastructure():
    out = await python({"code": "1"}, ToolContext())
    assert out.status == ToolStatus.SANDBOX_ERROR.value and "no sandbox" in out.detail
    out = await python({"code": "1"}, ToolContext(sandbox=CannedSandbox(exc=RuntimeError("gone"))))
    assert out.status == ToolStatus.SANDBOX_ERROR.value and "gone" in out.detail


async def test_bad_arguments():
    for args in ({}, {"code": 3}, {"code": "1", "lang": "py"}):
        out = await python(args, ToolContext(sandbox=FakeSandbox()))
        assert out.status == ToolStatus.BAD_ARGUMENTS.value and "python(code=...)" in out.content


# -- the real sandbox --------------------------------------------------------------------------------
async def test_real_sandbox_keeps_state_within_a_session_and_not_across_sessions(local_sandbox_cls):
    async with local_sandbox_cls() as first:
        assert await run_code(python, "import math\nsecret = math.factorial(20)", first) == (
            "(no output; use print() to see values)",
            "ok",
        )
        assert await run_code(python, "print(secret % 1000)", first) == ("0", "ok")
    async with local_sandbox_cls() as second:
        content, status = await run_code(python, "print(secret)", second)
    assert status == ToolStatus.ERROR.value and "NameError" in content


async def test_real_sandbox_timeout_is_reported_to_the_model(local_sandbox_cls):
    async with local_sandbox_cls() as sb:
        content, status = await run_code(PythonTool(timeout=0.5), "import time\ntime.sleep(30)", sb)
        assert status == ToolStatus.TIMEOUT.value and "ran too long" in content
        assert await run_code(python, "print('alive')", sb) == ("alive", "ok")
