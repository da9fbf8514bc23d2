"""The Sandbox contract (agentrl.protocols.Sandbox), run against every backend that is reachable here."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentrl.execution import Limits
from agentrl.protocols import Sandbox
from agentrl.types import ToolStatus

from .conftest import MiB

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.fixture(params=["local", "docker", "e2b"])
def backend(request) -> str:
    """The contract also holds for e2b (against the local protocol server)."""
    if request.param == "docker":
        request.getfixturevalue("docker_engine")
    return request.param


async def test_is_a_sandbox(sb):
    assert isinstance(sb, Sandbox)


@pytest.mark.parametrize(
    "code,stdout",
    [
        ("1 + 1", "2\n"),
        ("x = 5", ""),
        ("None", ""),
        ("print('a'); 3", "a\n3\n"),
        ("'s'", "'s'\n"),
        ("for i in range(2): print(i)", "0\n1\n"),
        ("", ""),
    ],
)
async def test_last_expression_is_shown_like_a_notebook(sb, code, stdout):
    r = await sb.run(code)
    assert r.status is ToolStatus.OK, r
    assert r.stdout == stdout
    assert r.stderr == "" and not r.truncated and not r.state_lost
    assert r.duration_s > 0


async def test_state_files_and_imports_persist_until_reset(sb):
    await sb.run("import math\nx = 41\nopen('notes.txt', 'w').write('hi')")
    r = await sb.run("x + 1, math.pi > 3, open('notes.txt').read()")
    assert r.stdout == "(42, True, 'hi')\n"
    await sb.reset()
    r = await sb.run("'x' in globals()")
    assert r.stdout == "False\n"


async def test_errors_are_the_codes_with_a_traceback(sb):
    r = await sb.run("def f():\n    return 1 / 0\nf()")
    assert r.status is ToolStatus.ERROR and not r.status.is_infra
    assert "ZeroDivisionError" in r.stderr and "return 1 / 0" in r.stderr
    assert not r.state_lost
    r = await sb.run("x = (")
    assert r.status is ToolStatus.ERROR and "SyntaxError" in r.stderr


async def test_stderr_and_subprocess_output_are_captured(sb):
    r = await sb.run(
        "import sys, subprocess\nprint('to err', file=sys.stderr)\nsubprocess.run(['echo', 'from child'])"
    )
    assert r.status is ToolStatus.OK, r
    assert "to err" in r.stderr
    assert "from child" in r.stdout


async def test_timeout_argument_only_lowers_the_limit(sb):
    t = time.monotonic()
    r = await sb.run("import time; time.sleep(5)", timeout=0.5)
    assert r.status is ToolStatus.TIMEOUT and r.state_lost
    assert time.monotonic() - t < 2.0
    r = await sb.run("1")
    assert r.status is ToolStatus.OK


async def test_calls_on_one_session_are_serialised(sb):
    await sb.run("n = 0")
    results = await asyncio.gather(*(sb.run("n += 1; n") for _ in range(10)))
    assert sorted(int(r.stdout) for r in results) == list(range(1, 11))


async def test_cancelling_a_call_kills_it_and_the_session_recovers(sb):
    await sb.run("kept = 1")
    task = asyncio.ensure_future(sb.run("import time; time.sleep(60)", timeout=30))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    r = await sb.run("'kept' in globals()")
    assert r.status is ToolStatus.OK and r.stdout == "False\n"


async def test_hostile_exception_str_does_not_break_the_worker(sb):
    code = "class E(Exception):\n    def __str__(self): raise RuntimeError('no')\nraise E()"
    r = await sb.run(code)
    assert r.status is ToolStatus.ERROR
    assert (await sb.run("2")).stdout == "2\n"


async def test_bad_arguments_are_errors_not_crashes(sb):
    r = await sb.run(b"print(1)")  # type: ignore[arg-type]
    assert r.status is ToolStatus.ERROR
    r = await sb.run("1", timeout=0)
    assert r.status is ToolStatus.ERROR


async def test_close_is_idempotent_and_final(make):
    s = make()
    async with s:
        assert (await s.run("1")).ok
    await s.close()
    r = await s.run("1")
    assert r.status is ToolStatus.SANDBOX_ERROR


async def test_limits_are_clamped_not_raised(make):
    async with make(Limits(wall_s=1.0, memory_bytes=256 * MiB)) as s:
        t = time.monotonic()
        r = await s.run("import time; time.sleep(10)", timeout=100)
        assert r.status is ToolStatus.TIMEOUT
        assert time.monotonic() - t < 2.5
