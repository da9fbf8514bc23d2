"""MCP servers as tools, against real server processes (the official SDK's server side): the units example
server and a server whose tools misbehave (``mcp_fault_server.py``). Stdio servers run in the real
``ProcessSandbox`` unless a test says otherwise."""

import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from agentrl.errors import ConfigError, SandboxError
from agentrl.protocols import ToolContext
from agentrl.tools import ParsedTurn, ToolExecutor
from agentrl.tools.mcp import MCPServer, render_result
from agentrl.types import ToolCall, ToolStatus

ROOT = Path(__file__).resolve().parents[2]
UNITS = [sys.executable, str(ROOT / "examples" / "mcp_units_server.py")]
FAULTS = [sys.executable, str(Path(__file__).with_name("mcp_fault_server.py"))]
CTX = ToolContext()

pytestmark = pytest.mark.slow  # every test starts real server processes (seconds each on a busy CPU)


@pytest.fixture(scope="module")
def sandbox():
    from agentrl.sandbox import ProcessSandbox
    from agentrl.sandbox.local import find_bwrap

    if find_bwrap() is None:
        pytest.skip("bubblewrap is not installed")
    return ProcessSandbox()


def by_name(tools):
    return {t.name: t for t in tools}


async def test_lists_the_servers_tools_with_their_schemas_and_calls_them(sandbox):
    async with MCPServer(command=UNITS, launcher=sandbox, prefix="units_") as server:
        tools = by_name(await server.tools())
        assert sorted(tools) == ["units_convert", "units_recall", "units_remember"]
        fn = tools["units_convert"].schema["function"]
        assert fn["name"] == "units_convert" and "Convert a value" in fn["description"]
        assert fn["parameters"]["required"] == ["value", "from_unit", "to_unit"]
        assert fn["parameters"]["properties"]["value"]["type"] == "number"
        assert not tools["units_convert"].needs_sandbox

        out = await tools["units_convert"]({"value": 3, "from_unit": "foot", "to_unit": "inch"}, CTX)
        assert (out.status, out.content) == (ToolStatus.OK, "3 foot = 36 inch")
        out = await tools["units_convert"]({"value": 1, "from_unit": "foot", "to_unit": "kg"}, CTX)
        assert out.status == ToolStatus.ERROR and "cannot convert length (foot) to mass (kg)" in out.content
        out = await tools["units_convert"]({"value": "three", "from_unit": "foot"}, CTX)
        assert out.status == ToolStatus.BAD_ARGUMENTS
        assert (
            "'to_unit' is a required property" in out.content
            and "'three' is not of type 'number'" in out.content
        )
        # State lives in the server process for the life of the session.
        assert (await tools["units_remember"]({"key": "k", "value": "v1"}, CTX)).content == "noted 'k'"
        assert (await tools["units_recall"]({"key": "k"}, CTX)).content == "v1"


async def test_each_call_becomes_a_tool_record_through_the_executor(sandbox):
    async with MCPServer(command=UNITS, launcher=sandbox) as server:
        executor = ToolExecutor(await server.tools())
        calls = (
            ToolCall("c0", "convert", '{"value": 2, "from_unit": "km", "to_unit": "m"}'),
            ToolCall("c1", "recall", '{"key": "nothing"}'),
            ToolCall("c2", "convert", '["not", "an", "object"]'),
        )
        records = await executor.run(ParsedTurn("", calls), CTX, turn=0)
    assert [r.status for r in records] == [ToolStatus.OK, ToolStatus.ERROR, ToolStatus.BAD_ARGUMENTS]
    assert records[0].output == "2 km = 2000 m" and records[0].arguments == calls[0].arguments
    assert records[0].duration_s > 0 and "no note 'nothing'" in records[1].output


async def test_the_sandboxed_server_sees_no_network_no_host_files_and_no_host_secrets(sandbox, monkeypatch):
    monkeypatch.setenv("AGENTRL_TEST_SECRET", "hunter2")
    async with MCPServer(command=FAULTS, launcher=sandbox, env={"GIVEN": "yes"}, include=["probe"]) as server:
        (probe,) = await server.tools()
        out = await probe({}, CTX)
    import json

    seen = json.loads(out.content)
    assert seen["network"].startswith("unreachable") and "Network is unreachable" in seen["network"]
    assert seen["write_usr"] == "refused: Read-only file system"
    assert seen["etc_hostname"] == "hidden" and seen["secret"] == "unset" and seen["given"] == "yes"
    assert seen["uid"] == "1000" and seen["cwd"] == "/tmp"


async def test_an_unsandboxed_server_is_an_explicit_opt_out_and_sees_the_host(monkeypatch):
    monkeypatch.setenv("AGENTRL_TEST_SECRET", "hunter2")
    with pytest.raises(ConfigError, match="sandboxed but has no launcher"):
        async with MCPServer(command=FAULTS) as server:
            await server.tools()
    async with MCPServer(command=FAULTS, sandboxed=False, include=["probe"]) as server:
        (probe,) = await server.tools()
        import json

        seen = json.loads((await probe({}, CTX)).content)
    assert seen["secret"] == "hunter2" and seen["cwd"] != "/tmp"


async def test_a_tool_that_raises_an_oversized_output_and_a_hang(sandbox):
    server = MCPServer(
        command=FAULTS, launcher=sandbox, call_timeout=3, max_output_chars=1000, max_message_bytes=1 << 20
    )
    async with server:
        t = by_name(await server.tools())
        out = await t["boom"]({"message": "kaput"}, CTX)
        assert out.status == ToolStatus.ERROR and "boom: kaput" in out.content

        assert (await t["count"]({}, CTX)).content == "1"
        out = await t["huge"]({"n": 100_000}, CTX)  # fits a message; capped for the model
        assert out.status == ToolStatus.OK and len(out.content) < 1200 and out.content.startswith("xxx")
        assert (await t["count"]({}, CTX)).content == "2"  # same session

        out = await t["huge"]({"n": 3 << 20}, CTX)  # one message over the cap: the session is stopped
        assert out.status == ToolStatus.OUTPUT_LIMIT and "restarted" in out.content
        assert (await t["count"]({}, CTX)).content == "1"  # a fresh server

        started = time.perf_counter()
        out = await t["hang"]({"seconds": 3600}, CTX)
        assert out.status == ToolStatus.TIMEOUT and "did not answer within 3 s" in out.content
        assert time.perf_counter() - started < 10
        assert (await t["count"]({}, CTX)).content == "1"  # restarted after the hang


async def test_a_server_that_dies_mid_call_is_an_infrastructure_failure(sandbox):
    async with MCPServer(command=FAULTS, launcher=sandbox) as server:
        tools = await server.tools()
        t = by_name(tools)
        with pytest.raises(SandboxError) as caught:
            await t["die"]({"code": 3}, CTX)
        message = str(caught.value)
        assert "closed its output" in message and "dying mid-call" in message
        # Through the executor it is a sandbox_error record (the rollout drops the episode, never reward 0).
        (record,) = await ToolExecutor(tools).run(
            ParsedTurn("", (ToolCall("c", "die", '{"code": 4}'),)), CTX, turn=0
        )
        assert record.status == ToolStatus.SANDBOX_ERROR and record.status.is_infra
        assert (await t["count"]({}, CTX)).content == "1"  # the next call starts a fresh server


async def test_bad_servers_are_clear_errors(sandbox):
    with pytest.raises(ConfigError, match=r"tool 'broken' .*not valid JSON Schema: 'banana' is not valid"):
        async with MCPServer(command=[*FAULTS, "--bad-schema"], launcher=sandbox) as server:
            await server.tools()
    with pytest.raises(SandboxError, match=r"(?s)refusing to start.*|exit status 7"):
        async with MCPServer(command=[*FAULTS, "--exit-at-start"], launcher=sandbox) as server:
            await server.tools()
    with pytest.raises(ConfigError, match=r"has no tool\(s\) \['nope'\]"):
        async with MCPServer(command=FAULTS, launcher=sandbox, include=["echo", "nope"]) as server:
            await server.tools()


def test_configuration_errors():
    with pytest.raises(ConfigError, match="exactly one of"):
        MCPServer(command=UNITS, url="http://x/mcp")
    with pytest.raises(ConfigError, match="exactly one of"):
        MCPServer()
    with pytest.raises(ConfigError, match="non-empty list of strings"):
        MCPServer(command="python server.py")
    with pytest.raises(ConfigError, match="http"):
        MCPServer(url="ftp://x")
    with pytest.raises(ConfigError, match="session must be one of"):
        MCPServer(command=UNITS, session="forever")
    with pytest.raises(ConfigError, match="takes no launcher"):
        MCPServer(command=UNITS, sandboxed=False, launcher=object())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_streamable_http_server():
    port = _free_port()
    proc = subprocess.Popen(
        [*FAULTS, "--http", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                await asyncio.sleep(0.1)
        async with MCPServer(url=f"http://127.0.0.1:{port}/mcp", prefix="f_") as server:
            t = by_name(await server.tools())
            assert (await t["f_echo"]({"text": "over http"}, CTX)).content == "over http"
            out = await t["f_boom"]({"message": "remote"}, CTX)
            assert out.status == ToolStatus.ERROR and "boom: remote" in out.content
            with pytest.raises(SandboxError, match="the connection to http"):  # the server dies mid-call
                await t["f_die"]({"code": 3}, CTX)
    finally:
        proc.kill()
        proc.wait()


def test_render_result_shows_text_and_notes_other_blocks():
    import mcp.types as types

    result = types.CallToolResult(
        content=[types.TextContent(text="a"), types.ImageContent(data="AAAA", mime_type="image/png")]
    )
    assert render_result(result) == "a\n[image image/png, 3 bytes]"
    assert render_result(types.CallToolResult(content=[], structured_content={"x": 1})) == '{"x": 1}'
