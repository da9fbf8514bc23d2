"""A local stand-in for e2b's code-interpreter service: a test helper (and the benchmark's), not shipped.

It speaks the HTTP protocol that ``e2b-code-interpreter`` uses against port 49999 of a sandbox (read from
the SDK: ``POST /execute`` answered by an NDJSON stream of ``stdout``/``stderr``/``result``/``error``/
``number_of_executions``/``end_of_execution`` lines; ``/contexts`` to create, list, restart and delete
kernels; ``GET /health``), and runs the code in real :class:`~agentrl.sandbox.LocalSandbox` sessions, one
per context, so the semantics (state, limits, timeouts) are the real ones. Point the SDK at it with
``AsyncSandbox.create(debug=True, sandbox_url=server.url)`` (``debug`` skips the control-plane API).

Like the real service, a client that disconnects mid-execution interrupts it (here: the context's session
is killed and restarted).

Not a security boundary of its own: it listens on loopback only and trusts its clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from agentrl.execution import ExecResult, Limits
from agentrl.sandbox import LocalSandbox
from agentrl.types import ToolStatus

__all__ = ["LocalE2BServer"]

log = logging.getLogger(__name__)

# Error names for outcomes a Jupyter kernel has no exception for; E2BSandbox maps them back to statuses.
# Written out here rather than derived from the client's table, so a test catches the two disagreeing.
ERROR_NAMES = {
    ToolStatus.TIMEOUT: "SandboxTimeout",
    ToolStatus.OUTPUT_LIMIT: "SandboxOutputLimit",
    ToolStatus.KILLED: "SandboxKilled",
    ToolStatus.OOM: "MemoryError",
}


class _Context:
    def __init__(self, cid: str, sandbox: LocalSandbox, cwd: str):
        self.id = cid
        self.sandbox = sandbox
        self.cwd = cwd
        self.executions = 0
        self.lock = asyncio.Lock()

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "language": "python", "cwd": self.cwd}


class LocalE2BServer:
    """The e2b code-interpreter protocol on ``http://127.0.0.1:<port>``, backed by LocalSandbox."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: Limits | None = None,
        sandbox_factory: Callable[[], LocalSandbox] | None = None,
    ):
        self._host, self._port = host, port
        self._factory = sandbox_factory or (lambda: LocalSandbox(limits or Limits(wall_s=120.0)))
        self._contexts: dict[str, _Context] = {}
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.requests = 0

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> LocalE2BServer:
        self._server = await asyncio.start_server(self._on_conn, self._host, self._port)
        self._port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for t in list(self._conns):
            t.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)
        ctxs, self._contexts = list(self._contexts.values()), {}
        await asyncio.gather(*(c.sandbox.close() for c in ctxs), return_exceptions=True)

    async def __aenter__(self) -> LocalE2BServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def kill_all(self) -> None:
        """Drop every connection (reset, not a clean close) and context at once, like a deleted VM."""
        for w in list(self._writers):
            with contextlib.suppress(Exception):
                w.transport.abort()
        for t in list(self._conns):
            t.cancel()
        ctxs, self._contexts = list(self._contexts.values()), {}
        await asyncio.gather(*(c.sandbox.close() for c in ctxs), return_exceptions=True)

    # -- HTTP plumbing -----------------------------------------------------------------------------
    async def _on_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        self._writers.add(writer)
        try:
            while True:
                req = await self._read_request(reader)
                if req is None:
                    break
                method, path, body = req
                self.requests += 1
                keep = await self._route(method, path, body, reader, writer)
                if not keep:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        except Exception:
            log.exception("local e2b server failed")
        finally:
            self._conns.discard(task)
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()

    @staticmethod
    async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, bytes] | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                chunk = await reader.readexactly(size + 2)
                if size == 0:
                    break
                body += chunk[:-2]
        else:
            body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
        return method, path.split("?", 1)[0], body

    @staticmethod
    async def _respond(writer: asyncio.StreamWriter, code: int, obj: Any = None) -> None:
        data = b"" if obj is None else json.dumps(obj).encode()
        reason = {
            200: "OK",
            204: "No Content",
            400: "Bad Request",
            404: "Not Found",
            500: "Internal Server Error",
        }
        writer.write(
            f"HTTP/1.1 {code} {reason.get(code, 'OK')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        await writer.drain()

    async def _route(
        self, method: str, path: str, body: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        parts = [p for p in path.split("/") if p]
        try:
            data = json.loads(body) if body else {}
        except ValueError:
            await self._respond(writer, 400, {"error": "invalid JSON"})
            return True
        if method == "GET" and parts == ["health"]:
            await self._respond(writer, 200, {"status": "ok"})
        elif method == "POST" and parts == ["execute"]:
            return await self._execute(data, reader, writer)
        elif method == "POST" and parts == ["contexts"]:
            ctx = await self._new_context(cwd=data.get("cwd") or "/tmp")
            await self._respond(writer, 200, ctx.as_json())
        elif method == "GET" and parts == ["contexts"]:
            await self._respond(writer, 200, [c.as_json() for c in self._contexts.values()])
        elif len(parts) == 3 and parts[0] == "contexts" and parts[2] == "restart" and method == "POST":
            found = self._contexts.get(parts[1])
            if found is None:
                await self._respond(writer, 404, {"error": f"context {parts[1]} not found"})
            else:
                async with found.lock:
                    await found.sandbox.reset()
                await self._respond(writer, 200, None)
        elif len(parts) == 2 and parts[0] == "contexts" and method == "DELETE":
            gone = self._contexts.pop(parts[1], None)
            if gone is None:
                await self._respond(writer, 404, {"error": f"context {parts[1]} not found"})
            else:
                await gone.sandbox.close()
                await self._respond(writer, 200, None)
        else:
            await self._respond(writer, 404, {"error": f"no route {method} {path}"})
        return True

    async def _new_context(self, cwd: str, cid: str | None = None) -> _Context:
        sb = self._factory()
        await sb.start()
        ctx = _Context(cid or uuid.uuid4().hex[:12], sb, cwd)
        self._contexts[ctx.id] = ctx
        return ctx

    # -- execution ---------------------------------------------------------------------------------
    async def _execute(
        self, data: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        cid = data.get("context_id") or "default"
        language = data.get("language")
        if language not in (None, "python"):
            await self._respond(writer, 400, {"error": f"only python is supported here, not {language}"})
            return True
        ctx = self._contexts.get(cid)
        if ctx is None:
            if cid != "default":
                await self._respond(writer, 404, {"error": f"context {cid} not found"})
                return True
            ctx = await self._new_context("/tmp", cid="default")
        code = data.get("code")
        if not isinstance(code, str):
            await self._respond(writer, 400, {"error": "code must be a string"})
            return True
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nConnection: close\r\n\r\n")
        await writer.drain()
        async with ctx.lock:
            run = asyncio.ensure_future(ctx.sandbox.run(code))
            gone = asyncio.ensure_future(reader.read(1))  # b"" when the client hangs up
            done, _ = await asyncio.wait({run, gone}, return_when=asyncio.FIRST_COMPLETED)
            if run not in done:
                # The client went away (its timeout fired): interrupt, as e2b does, by killing the run.
                run.cancel()
                with contextlib.suppress(BaseException):
                    await run
                return False
            gone.cancel()
            ctx.executions += 1
            result = run.result()
        for line in self._ndjson(result, ctx.executions):
            writer.write(line)
        await writer.drain()
        return False  # Connection: close ends the stream

    @staticmethod
    def _ndjson(r: ExecResult, count: int) -> list[bytes]:
        ts = time.time_ns()

        def line(obj: dict[str, Any]) -> bytes:
            return json.dumps(obj).encode() + b"\n"

        out = []
        if r.stdout:
            out.append(line({"type": "stdout", "text": r.stdout, "timestamp": ts}))
        if r.status is ToolStatus.OK:
            if r.stderr:
                out.append(line({"type": "stderr", "text": r.stderr, "timestamp": ts}))
        elif r.status is ToolStatus.SANDBOX_ERROR:
            out.append(line({"type": "error", "name": "SandboxError", "value": r.message, "traceback": ""}))
        else:
            name, value = ERROR_NAMES.get(r.status, "Error"), r.message
            if r.status is ToolStatus.ERROR and r.exit_code is not None:
                name = "SystemExit"
            elif r.status is ToolStatus.ERROR:
                # The last traceback line is "Name: value", as a kernel reports it.
                last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "Error"
                name, _, value = last.partition(":")
                value = value.strip()
            out.append(line({"type": "error", "name": name.strip(), "value": value, "traceback": r.stderr}))
        # As in e2b's server, the execution count comes with the kernel's execute_reply, at the end.
        out.append(line({"type": "number_of_executions", "execution_count": count}))
        out.append(line({"type": "end_of_execution"}))
        return out
