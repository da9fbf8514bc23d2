"""One live MCP client session (a server process for stdio, a connection for streamable HTTP), for
:mod:`agentrl.tools.mcp`.

The SDK's ``ClientSession`` runs anyio task groups, which must be entered and left by the same task; an
episode opens its session inside one tool call and closes it at the next ``reset``, in another task. So
each session runs in a task of its own (:meth:`Session._run`) that enters the transport and the session,
signals ready, and waits to be told to stop; calls are plain requests from the callers' tasks.

The stdio transport is ours, not the SDK's ``stdio_client``: it runs over a :class:`ServerProcess` that a
:class:`ProcessLauncher` started (the sandbox's long-lived process, or a plain subprocess for a trusted
server), caps the length of one message (a server that writes a 1 GB line is stopped, not buffered), and
tells a pending call at once when the server has exited.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol, runtime_checkable

from agentrl.errors import ConfigError, SandboxError

__all__ = ["PlainLauncher", "ProcessLauncher", "ServerGone", "ServerProcess", "Session"]


@runtime_checkable
class ServerProcess(Protocol):
    """A running server program with pipes: what :class:`ProcessLauncher.start` returns
    (``agentrl.sandbox.SandboxedProcess`` is one)."""

    @property
    def stdin(self) -> asyncio.StreamWriter:
        """The program's standard input."""
        ...

    @property
    def stdout(self) -> asyncio.StreamReader:
        """The program's standard output."""
        ...

    @property
    def returncode(self) -> int | None:
        """The exit status once it ended, else None."""
        ...

    def stderr_tail(self) -> str:
        """The last few KB it wrote to stderr."""
        ...

    async def kill(self) -> None:
        """Kill it (and everything it started) and release its pipes. Idempotent."""
        ...


@runtime_checkable
class ProcessLauncher(Protocol):
    """Starts a server program (``agentrl.sandbox.ProcessSandbox`` is the sandboxed one)."""

    async def start(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, stream_limit: int = 64 * 1024
    ) -> ServerProcess:
        """Start ``argv`` with extra environment ``env``; ``stream_limit`` bounds one stdout line."""
        ...


class _PlainProcess:
    """A trusted server as a plain subprocess in its own process group (killed as a group)."""

    def __init__(self, proc: asyncio.subprocess.Process):
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self._proc = proc
        self.stdin: asyncio.StreamWriter = proc.stdin
        self.stdout: asyncio.StreamReader = proc.stdout
        self._tail = bytearray()
        self._stderr_task = asyncio.ensure_future(self._drain(proc.stderr))

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def stderr_tail(self) -> str:
        return self._tail.decode("utf-8", "replace")

    async def _drain(self, stream: asyncio.StreamReader) -> None:
        with contextlib.suppress(Exception):
            while chunk := await stream.read(4096):
                self._tail += chunk
                del self._tail[:-8192]

    async def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)  # start_new_session: its pid is the group id
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._proc.wait()), 5.0)
        self._stderr_task.cancel()
        with contextlib.suppress(BaseException):
            await self._stderr_task
        self.stdin.close()
        transport = getattr(self._proc, "_transport", None)
        if transport is not None:
            transport.close()


class PlainLauncher:
    """Starts a trusted server as an ordinary subprocess (``MCPServer(..., sandboxed=False)``): the host's
    file system, network and environment minus nothing but what ``env`` overrides."""

    async def start(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, stream_limit: int = 64 * 1024
    ) -> ServerProcess:
        """Start ``argv`` in a new session (so its whole process group can be killed)."""
        if not argv:
            raise ConfigError("the server command is empty")
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, **(env or {})},
            start_new_session=True,
            limit=stream_limit,
        )
        return _PlainProcess(proc)


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _leaves(e: BaseException) -> str:
    """What went wrong, without the task groups' wrapping: ``ConnectError('All connection attempts
    failed')``, not ``ExceptionGroup('unhandled errors in a TaskGroup', [ExceptionGroup(...)])``."""
    if isinstance(e, BaseExceptionGroup):
        return "; ".join(_leaves(x) for x in e.exceptions)
    return repr(e)


def _hint(stderr: str) -> str:
    """What to change, for the two start-up failures a sandboxed server's stderr names plainly."""
    if "execvp" in stderr or "No such file or directory" in stderr:
        return (
            "\n(a path above is not visible in the sandbox: bind it with "
            "launcher=agentrl.sandbox.ProcessSandbox(Limits(), ro_binds=[...]), or sandboxed=False for a "
            "server you trust)"
        )
    if "heap out of memory" in stderr or "Fatal process out of memory" in stderr:
        return (
            "\n(the server ran out of its address-space limit: raise it with "
            "launcher=agentrl.sandbox.ProcessSandbox(Limits(memory_bytes=...)); Node.js needs about 1.5 GiB)"
        )
    return ""


class ServerGone(Exception):
    """The server ended (exited, was killed, broke the protocol) while a call waited for it."""

    def __init__(self, message: str, *, overflow: bool = False):
        super().__init__(message)
        self.overflow = overflow
        """The server wrote one message longer than the cap (a tool's oversized output)."""


Transport = Callable[["Session"], AbstractAsyncContextManager[tuple[Any, Any]]]


class Session:
    """One MCP client session, run by its own task; see the module docstring.

    Args:
        label: how errors name the server (its command or URL).
        transport: yields the SDK's (read stream, write stream) pair for this session.
        start_timeout: seconds for the server to start and answer ``initialize``.
    """

    def __init__(self, label: str, transport: Transport, *, start_timeout: float):
        self.label = label
        self._transport = transport
        self._start_timeout = start_timeout
        self._client: Any = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self.ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        """Set (to the reason) when the server or the connection ended."""
        self.overflow = False
        self.process: ServerProcess | None = None

    def end(self, reason: str) -> None:
        """Record that the server is gone (idempotent; the first reason wins)."""
        if not self.ended.done():
            self.ended.set_result(reason)

    @property
    def alive(self) -> bool:
        """True while the session can take calls."""
        return self._client is not None and not self.ended.done()

    async def open(self) -> None:
        """Start the server (or connect) and initialize the MCP session.

        Raises:
            SandboxError: the server did not start, exited during start-up, or did not initialize in time.
        """
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.ensure_future(self._run(ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), self._start_timeout)
        except TimeoutError:
            await self.close()
            raise SandboxError(
                f"the MCP server {self.label} did not initialize within {self._start_timeout:g} s"
                + self._stderr_note()
            ) from None
        except SandboxError:
            await self.close()
            raise
        except BaseException as e:
            await self.close()
            if isinstance(e, asyncio.CancelledError):
                raise
            raise SandboxError(
                f"the MCP server {self.label} failed to start: {_leaves(e)}{self._stderr_note()}"
            ) from e

    async def _run(self, ready: asyncio.Future[None]) -> None:
        from mcp import ClientSession

        init: asyncio.Future[Any] | None = None
        try:
            async with self._transport(self) as (read, write), ClientSession(read, write) as client:
                init = asyncio.ensure_future(client.initialize())
                # A transport that fails (nothing listening) ends it with an error this task never reads:
                # read it here, or asyncio prints "Task exception was never retrieved" and its traceback.
                init.add_done_callback(_retrieve)
                pending: set[asyncio.Future[Any]] = {init, self.ended}
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if not init.done():
                    init.cancel()
                    with contextlib.suppress(BaseException):
                        await init
                    raise ServerGone(self.ended.result())
                init.result()
                self._client = client
                ready.set_result(None)
                await self._stop.wait()
        except BaseException as e:
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else SandboxError(repr(e)))
            if not isinstance(e, Exception):
                raise
        finally:
            self._client = None
            self.end("the session was closed")
            if init is not None and not init.done():
                init.cancel()

    def _stderr_note(self) -> str:
        tail = self.process.stderr_tail().strip() if self.process is not None else ""
        return f"; its stderr ends with:\n{tail[-1500:]}{_hint(tail)}" if tail else ""

    def describe_end(self) -> str:
        """Why the server is gone, with its exit status and the end of its stderr."""
        reason = self.ended.result() if self.ended.done() else "unknown"
        rc = self.process.returncode if self.process is not None else None
        status = f" (exit status {rc})" if rc is not None else ""
        return f"the MCP server {self.label} ended: {reason}{status}{self._stderr_note()}"

    async def list_tools(self, timeout: float) -> list[Any]:
        """Every tool the server lists (all pages)."""
        import mcp.types as types

        tools: list[Any] = []
        cursor: str | None = None
        for _ in range(1000):
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None

            def send(client: Any, params: Any = params) -> Any:
                return client.list_tools(params=params)

            page = await self.request(send, timeout)
            tools += page.tools
            cursor = page.next_cursor
            if not cursor:
                return tools
        raise SandboxError(f"the MCP server {self.label} lists more than 1000 pages of tools")

    async def request(self, send: Callable[[Any], Any], timeout: float | None) -> Any:
        """``await send(client)``, bounded by ``timeout``; :class:`ServerGone` when the server ends first."""
        if not self.alive:
            raise ServerGone(self.describe_end(), overflow=self.overflow)
        task = asyncio.ensure_future(send(self._client))
        try:
            await asyncio.wait({task, self.ended}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        if self.ended.done():
            raise ServerGone(self.describe_end(), overflow=self.overflow)
        raise TimeoutError

    async def close(self) -> None:
        """End the session and kill the server process. Idempotent."""
        self._stop.set()
        task, self._task = self._task, None
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), 5.0)
            except TimeoutError:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            except BaseException:
                pass
        if self.process is not None:
            await self.process.kill()


def stdio_transport(
    launcher: ProcessLauncher, argv: Sequence[str], env: Mapping[str, str] | None, max_message_bytes: int
) -> Transport:
    """A transport that starts ``argv`` with ``launcher`` and speaks newline-delimited JSON-RPC to it."""

    @asynccontextmanager
    async def transport(session: Session) -> AsyncIterator[tuple[Any, Any]]:
        import anyio
        import mcp.types as types
        from mcp.shared.message import SessionMessage

        proc = await launcher.start(argv, env=env, stream_limit=max_message_bytes)
        session.process = proc
        read_in, read_out = anyio.create_memory_object_stream[Any](0)
        write_in, write_out = anyio.create_memory_object_stream[Any](0)

        async def reader() -> None:
            async with read_in:
                while True:
                    try:
                        line = await proc.stdout.readline()
                    except (ValueError, asyncio.LimitOverrunError):
                        session.overflow = True
                        session.end(f"it wrote a message longer than {max_message_bytes:,} bytes")
                        return
                    except Exception as e:
                        session.end(f"reading its output failed: {e!r}")
                        return
                    if not line:
                        session.end("it closed its output (exited or crashed)")
                        return
                    if not line.strip():
                        continue
                    try:
                        item: Any = SessionMessage(
                            types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                        )
                    except ValueError as e:  # a stray print: the session reports it, the server lives on
                        item = e
                    await read_in.send(item)

        async def writer() -> None:
            async with write_out:
                async for message in write_out:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    try:
                        proc.stdin.write(data.encode())
                        await proc.stdin.drain()
                    except (ConnectionError, OSError) as e:
                        session.end(f"it closed its input ({e!r})")
                        return

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(reader)
                tg.start_soon(writer)
                try:
                    yield read_out, write_in
                finally:
                    tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await proc.kill()

    return transport


def http_transport(url: str) -> Transport:
    """A transport to a streamable-HTTP MCP server at ``url`` (one MCP session per :class:`Session`)."""

    @asynccontextmanager
    async def transport(session: Session) -> AsyncIterator[tuple[Any, Any]]:
        from mcp.client.streamable_http import streamable_http_client

        async with streamable_http_client(url) as (read, write):
            yield read, write

    return transport
