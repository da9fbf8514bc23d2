"""E2BSandbox against the local e2b protocol server, the server's wire format, and real e2b with a key."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time

import pytest

from agentrl.errors import SandboxError
from agentrl.execution import Limits
from agentrl.types import ToolStatus

from .conftest import SMALL
from .e2b_server import LocalE2BServer

pytest.importorskip("e2b_code_interpreter")
pytestmark = pytest.mark.usefixtures("no_leaks")

from agentrl.sandbox import E2BSandbox  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_unreachable_e2b_is_an_infra_error():
    url = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(SandboxError):
        async with E2BSandbox(SMALL, debug=True, sandbox_url=url, request_timeout=2):
            pass
    sb = E2BSandbox(SMALL, debug=True, sandbox_url=url, request_timeout=2)
    r = await sb.run("1")
    assert r.status is ToolStatus.SANDBOX_ERROR and r.status.is_infra
    await sb.close()


async def test_sandbox_deleted_mid_call_is_an_infra_error(e2b_server):
    async with E2BSandbox(SMALL, debug=True, sandbox_url=e2b_server.url) as sb:
        task = asyncio.ensure_future(sb.run("import time; time.sleep(60)", timeout=20))
        await asyncio.sleep(0.5)
        t = time.monotonic()
        await e2b_server.kill_all()
        r = await task
        assert r.status is ToolStatus.SANDBOX_ERROR, r
        assert time.monotonic() - t < 5


async def test_output_flood_is_stopped_by_the_server_sandbox(e2b_server):
    async with E2BSandbox(SMALL, debug=True, sandbox_url=e2b_server.url) as sb:
        r = await sb.run("while True: print('A' * 1000)")
        assert r.status is ToolStatus.OUTPUT_LIMIT and r.truncated and r.state_lost
        assert len(r.stdout) <= SMALL.output_bytes + 200
        assert (await sb.run("1 + 1")).stdout == "2\n"


async def test_uncapped_e2b_output_is_capped_client_side():
    # A server that returns 4 MiB in one message, as real e2b (which has no output cap) would.
    async with (
        LocalE2BServer(limits=Limits(output_bytes=8 << 20)) as server,
        E2BSandbox(SMALL, debug=True, sandbox_url=server.url, output_hard_cap=1 << 20) as sb,
    ):
        r = await sb.run("print('A' * (4 << 20))")
        assert r.status is ToolStatus.OUTPUT_LIMIT and r.truncated and r.state_lost
        assert len(r.stdout) <= SMALL.output_bytes + 200
        assert (await sb.run("1 + 1")).stdout == "2\n"


async def test_server_speaks_the_sdk_wire_format(e2b_server):
    import httpx

    async with httpx.AsyncClient(base_url=e2b_server.url, timeout=30) as client:
        assert (await client.get("/health")).status_code == 200
        ctx = (await client.post("/contexts", json={})).json()
        assert set(ctx) == {"id", "language", "cwd"}
        resp = await client.post(
            "/execute", json={"code": "print('hi')\n1/0", "context_id": ctx["id"], "language": None}
        )
        lines = [json.loads(x) for x in resp.text.splitlines()]
        types = [x["type"] for x in lines]
        assert types[-2:] == ["number_of_executions", "end_of_execution"]
        assert {"type": "stdout", "text": "hi\n"}.items() <= next(
            x for x in lines if x["type"] == "stdout"
        ).items()
        err = next(x for x in lines if x["type"] == "error")
        assert err["name"] == "ZeroDivisionError" and "division by zero" in err["value"]
        assert (await client.post(f"/contexts/{ctx['id']}/restart")).status_code == 200
        assert (await client.delete(f"/contexts/{ctx['id']}")).status_code == 200
        assert (await client.delete(f"/contexts/{ctx['id']}")).status_code == 404


async def test_contexts_are_isolated(e2b_server):
    async with (
        E2BSandbox(SMALL, debug=True, sandbox_url=e2b_server.url) as a,
        E2BSandbox(SMALL, debug=True, sandbox_url=e2b_server.url) as b,
    ):
        await a.run("mine = 1")
        assert (await b.run("'mine' in globals()")).stdout == "False\n"


@pytest.mark.skipif(
    not os.environ.get("E2B_API_KEY") or os.environ.get("E2B_DEBUG"),
    reason="real e2b needs E2B_API_KEY and network access to e2b (never available in CI here)",
)
async def test_real_e2b_smoke():
    async with E2BSandbox(Limits(wall_s=30)) as sb:
        assert (await sb.run("x = 20")).ok
        r = await sb.run("x * 2 + 2")
        assert r.status is ToolStatus.OK and "42" in r.stdout
        r = await sb.run("import time; time.sleep(60)", timeout=2)
        assert r.status is ToolStatus.TIMEOUT
