"""MCP servers as agentrl tools: ``MCPServer`` (stdio or streamable HTTP) and the tools it lists.

::

    server = MCPServer(command=[sys.executable, "examples/mcp_units_server.py"])  # sandboxed by default
    env = MyEnv(tools=[server, calculator])  # in a ToolEnv, the server expands into its tools

    async with MCPServer(url="http://127.0.0.1:8000/mcp") as server:  # or on its own
        tools = await server.tools()  # agentrl Tools with the server's JSON schemas

Guarantees (the same as every agentrl tool):

* Each call becomes a :class:`~agentrl.types.ToolRecord` (the executor records arguments, output, status and
  duration). Arguments are checked against the tool's JSON schema first (``bad_arguments``); a tool that
  reports an error (``isError``) or a JSON-RPC error is ``error``; no answer within ``call_timeout`` is
  ``timeout`` and restarts the session (the model is told its state is gone); one message longer than
  ``max_message_bytes`` is ``output_limit`` (also a restart); what the model reads is capped to
  ``max_output_chars``, head and tail.
* A server that cannot start, or exits during a call, raises :class:`~agentrl.errors.SandboxError`: the
  call is recorded as ``sandbox_error`` and the episode is an infrastructure failure, never reward 0.
* Sessions: by default (``session="episode"``) every episode gets its own session, opened on its first
  call: a fresh server process for stdio (episodes cannot see each other's state), a fresh MCP session for
  HTTP. ``session="shared"`` keeps one session for every episode of the process, for stateless servers.
* Isolation: a stdio server runs in ``agentrl.sandbox.ProcessSandbox`` (no network, read-only root,
  memory and process limits), which a :class:`~agentrl.envs.ToolEnv` supplies; on its own, pass
  ``launcher=ProcessSandbox(...)``. ``sandboxed=False`` is the explicit opt-out for a trusted server. This
  package never imports the sandbox backends: a launcher is anything with ``start(argv, env=...)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any, Self

from agentrl.errors import ConfigError, SandboxError
from agentrl.protocols import ToolContext, ToolOutput
from agentrl.types import ToolStatus

from ._mcp_session import (
    PlainLauncher,
    ProcessLauncher,
    ServerGone,
    ServerProcess,
    Session,
    http_transport,
    stdio_transport,
)
from ._text import cap_text

__all__ = [
    "MCPServer",
    "MCPSessions",
    "MCPTool",
    "ProcessLauncher",
    "ServerProcess",
    "SessionMode",
    "expand",
    "start_sessions",
]

MiB = 1024 * 1024
_INVALID_PARAMS = -32602
_CONNECTION_CLOSED = -32000  # JSON-RPC's "server error" code the SDK uses when the transport ended


class SessionMode(StrEnum):
    """How episodes share a server's session."""

    EPISODE = "episode"
    """Each episode gets its own session (a fresh process for stdio), opened on its first call."""
    SHARED = "shared"
    """One session for every episode (per event loop): for stateless servers that are slow to start."""


class MCPServer:
    """An MCP server whose tools the model may call. Give ``command`` (stdio) or ``url`` (streamable HTTP).

    Args:
        command: The stdio server's program and arguments.
        url: A streamable-HTTP server's endpoint (``http://host:port/mcp``).
        env: Extra environment variables for a stdio server (a sandboxed one gets nothing else from the host
            but an allow-list).
        sandboxed: Run a stdio server in the sandbox (default). ``False`` runs it as a plain subprocess with
            the host's files, network and environment: only for a server you trust.
        launcher: What starts a sandboxed stdio server
            (``agentrl.sandbox.ProcessSandbox(limits, ro_binds=...)``); a ``ToolEnv`` supplies the default.
        prefix: Prepended to every tool name the model sees (``"units_"``), to keep servers apart.
        include: Only these tools of the server (by its names); default all.
        session: ``"episode"`` (default) or ``"shared"``; see :class:`SessionMode`.
        call_timeout: Seconds per call (keep below the env's ``tool_timeout``, default 30 s).
        start_timeout: Seconds for the server to start and initialize.
        max_output_chars: What the model reads of one result (head and tail kept).
        max_message_bytes: The longest single message a stdio server may write; longer stops the session.
    """

    def __init__(
        self,
        command: Sequence[str] | None = None,
        *,
        url: str | None = None,
        env: Mapping[str, str] | None = None,
        sandboxed: bool = True,
        launcher: ProcessLauncher | None = None,
        prefix: str = "",
        include: Collection[str] | None = None,
        session: SessionMode | str = SessionMode.EPISODE,
        call_timeout: float = 20.0,
        start_timeout: float = 60.0,
        max_output_chars: int = 16_000,
        max_message_bytes: int = 4 * MiB,
    ):
        if (command is None) == (url is None):
            raise ConfigError("MCPServer needs exactly one of command=[...] (stdio) or url=... (HTTP)")
        if command is not None and (
            isinstance(command, str) or not command or not all(isinstance(c, str) for c in command)
        ):
            raise ConfigError(f"command must be a non-empty list of strings, got {command!r}")
        if url is not None and not (isinstance(url, str) and url.startswith(("http://", "https://"))):
            raise ConfigError(f"url must be an http(s) URL, got {url!r}")
        if url is not None and (env or launcher is not None):
            raise ConfigError("env and launcher apply to a stdio server (command=...), not to url=...")
        if launcher is not None and not sandboxed:
            raise ConfigError("sandboxed=False runs a plain subprocess; it takes no launcher")
        for name, value in (("call_timeout", call_timeout), ("start_timeout", start_timeout)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        if not isinstance(max_output_chars, int) or max_output_chars < 100:
            raise ConfigError(f"max_output_chars must be an int >= 100, got {max_output_chars!r}")
        if not isinstance(max_message_bytes, int) or max_message_bytes < 64 * 1024:
            raise ConfigError(f"max_message_bytes must be an int >= 65536, got {max_message_bytes!r}")
        self.command = tuple(command) if command is not None else None
        self.url = url
        self.env = dict(env or {})
        self.sandboxed = bool(sandboxed)
        self.launcher = launcher
        self.prefix = prefix
        self.include = frozenset(include) if include is not None else None
        try:
            self.session_mode = SessionMode(session)
        except ValueError:
            raise ConfigError(
                f"session must be one of {[m.value for m in SessionMode]}, got {session!r}"
            ) from None
        self.call_timeout = float(call_timeout)
        self.start_timeout = float(start_timeout)
        self.max_output_chars = max_output_chars
        self.max_message_bytes = max_message_bytes
        self._specs: list[Any] | None = None  # the listing, shared with copies (with_launcher)
        self._lock = threading.Lock()
        self._shared: dict[asyncio.AbstractEventLoop, Session] = {}
        self._own: MCPSessions | None = None

    @property
    def label(self) -> str:
        """How messages name this server: its command or URL."""
        return " ".join(self.command) if self.command is not None else str(self.url)

    @property
    def needs_launcher(self) -> bool:
        """True for a sandboxed stdio server that has no launcher yet (a ToolEnv gives it the default)."""
        return self.command is not None and self.sandboxed and self.launcher is None

    def __repr__(self) -> str:
        where = f"command={list(self.command)!r}" if self.command is not None else f"url={self.url!r}"
        return f"MCPServer({where}, sandboxed={self.sandboxed}, session={self.session_mode.value!r})"

    def with_launcher(self, launcher: ProcessLauncher) -> MCPServer:
        """A copy of this server that starts its sandboxed stdio process with ``launcher``."""
        copy = object.__new__(MCPServer)
        copy.__dict__.update(self.__dict__)
        copy.launcher = launcher
        copy._own = None  # its own tools() session; the shared sessions (one dict) stay common to all copies
        return copy

    # -- sessions --------------------------------------------------------------------------------------
    async def open_session(self) -> Session:
        """A new, initialized session (a new server process for stdio). The caller closes it.

        Raises:
            ConfigError: a sandboxed stdio server without a launcher.
            SandboxError: the server did not start or initialize.
        """
        if self.command is not None:
            if self.sandboxed and self.launcher is None:
                raise ConfigError(
                    f"{self!r} is sandboxed but has no launcher: put it in a ToolEnv (which supplies "
                    "agentrl.sandbox.ProcessSandbox), pass launcher=agentrl.sandbox.ProcessSandbox(), or "
                    "sandboxed=False for a server you trust"
                )
            launcher = self.launcher if self.launcher is not None else PlainLauncher()
            transport = stdio_transport(launcher, self.command, self.env, self.max_message_bytes)
        else:
            assert self.url is not None
            transport = http_transport(self.url)
        session = Session(self.label, transport, start_timeout=self.start_timeout)
        await session.open()
        return session

    async def shared_session(self) -> Session:
        """The session every episode of this event loop shares (``session="shared"``), opened on demand."""
        loop = asyncio.get_running_loop()
        current = self._shared.get(loop)
        if current is None or not current.alive:
            if current is not None:
                await current.close()
            current = self._shared[loop] = await self.open_session()
        return current

    def sessions(self) -> MCPSessions:
        """A new holder of one episode's session, with its own :class:`MCPTool` objects (what a ToolEnv
        makes per env instance); :meth:`MCPSessions.reset` at every episode start."""
        return MCPSessions(self)

    # -- listing -----------------------------------------------------------------------------------------
    async def list_specs(self) -> list[Any]:
        """The server's tools as the SDK describes them, checked (cached after the first listing).

        Raises:
            ConfigError: a tool has a malformed name or input schema, or ``include`` names a missing tool.
            SandboxError: the server did not start or list its tools.
        """
        if self._specs is None:
            session = await self.open_session()
            try:
                specs = await session.list_tools(self.start_timeout)
            except TimeoutError:
                raise SandboxError(
                    f"{self.label} did not list its tools in {self.start_timeout:g} s"
                ) from None
            except Exception as e:  # the server ended, or answered tools/list with an error
                raise SandboxError(f"could not list the tools of {self.label}: {e}") from None
            finally:
                await session.close()
            self._specs = _check_specs(self, specs)
        return self._specs

    def list_specs_sync(self) -> list[Any]:
        """:meth:`list_specs` from synchronous code, also inside a running event loop (a worker thread runs
        its own loop), as an env's constructor needs it."""
        with self._lock:
            if self._specs is not None:
                return self._specs
            result: list[Any] = []
            error: list[BaseException] = []

            def work() -> None:
                try:
                    result.extend(asyncio.run(self.list_specs()))
                except BaseException as e:
                    error.append(e)

            thread = threading.Thread(target=work, name="mcp-list-tools", daemon=True)
            thread.start()
            thread.join()
            if error:
                raise error[0]
            return result

    async def tools(self) -> tuple[MCPTool, ...]:
        """The server's tools as agentrl :class:`~agentrl.protocols.Tool` objects, bound to this object's own
        session (closed by :meth:`aclose`)."""
        await self.list_specs()
        if self._own is None:
            self._own = self.sessions()
        return self._own.tools

    async def aclose(self) -> None:
        """Close the sessions this object opened itself (:meth:`tools`, shared sessions)."""
        own, self._own = self._own, None
        if own is not None:
            await own.close()
        shared, self._shared = list(self._shared.values()), {}
        for s in shared:
            await s.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class MCPSessions:
    """One env's view of a server: its tools, and the session of the running episode."""

    def __init__(self, server: MCPServer):
        self.server = server
        specs = server.list_specs_sync() if server._specs is None else server._specs
        self.tools = tuple(MCPTool(server, spec, self) for spec in specs)
        self._session: Session | None = None
        self._start_error: SandboxError | None = None

    async def session(self) -> Session:
        """The episode's session, opened now if needed (a shared one in ``session="shared"`` mode)."""
        if self.server.session_mode is SessionMode.SHARED:
            return await self.server.shared_session()
        if self._start_error is not None:  # this episode's server failed to start: do not wait again
            raise SandboxError(str(self._start_error))
        if self._session is None or not self._session.alive:
            old, self._session = self._session, None
            if old is not None:
                await old.close()
            try:
                self._session = await self.server.open_session()
            except SandboxError as e:
                self._start_error = e
                raise
        return self._session

    async def restart(self) -> None:
        """Drop the session after a timeout or overflow; the next call starts a fresh one."""
        if self.server.session_mode is SessionMode.SHARED:
            loop = asyncio.get_running_loop()
            shared = self.server._shared.pop(loop, None)
            if shared is not None:
                await shared.close()
            return
        await self.reset()

    async def reset(self) -> None:
        """End the episode's session (a new episode starts with a fresh one)."""
        self._start_error = None
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def close(self) -> None:
        """End the episode's session."""
        await self.reset()


class MCPTool:
    """One tool of an MCP server, as an agentrl :class:`~agentrl.protocols.Tool` (built by the server)."""

    needs_sandbox = False
    """The server has its own sandbox; the episode's Python sandbox is not needed."""

    def __init__(self, server: MCPServer, spec: Any, sessions: MCPSessions):
        self.server = server
        self.remote_name: str = spec.name
        """The name the server knows the tool by (without the prefix)."""
        self._name: str = server.prefix + spec.name
        self.input_schema: dict[str, Any] = dict(spec.input_schema)
        description = spec.description or spec.title or f"The {spec.name} tool of an MCP server."
        self._schema = {
            "type": "function",
            "function": {"name": self._name, "description": description, "parameters": self.input_schema},
        }
        self._sessions = sessions
        from jsonschema.validators import validator_for

        self._validator = validator_for(self.input_schema)(self.input_schema)

    @property
    def name(self) -> str:
        """The name the model calls (prefix + the server's name)."""
        return self._name

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema, its parameters the server's input schema."""
        return self._schema

    def __repr__(self) -> str:
        return f"MCPTool({self._name!r}, server={self.server.label!r})"

    async def __call__(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
        """Call the tool in the episode's session; see the module docstring for what each outcome becomes."""
        problems: list[Any] = sorted(self._validator.iter_errors(dict(arguments)), key=lambda e: list(e.path))
        if problems:
            text = "; ".join(
                f"{'/'.join(map(str, e.path)) or '(arguments)'}: {e.message}" for e in problems[:5]
            )
            return ToolOutput(f"Error: bad arguments for {self._name!r}: {text}", ToolStatus.BAD_ARGUMENTS)
        session = await self._sessions.session()  # SandboxError when it cannot start: infrastructure
        timeout = self.server.call_timeout
        try:
            result = await session.request(lambda c: c.call_tool(self.remote_name, dict(arguments)), timeout)
        except TimeoutError:
            await self._sessions.restart()
            return ToolOutput(
                f"Error: {self._name!r} did not answer within {timeout:g} s; its server was restarted and "
                "any state it held is gone.",
                ToolStatus.TIMEOUT,
            )
        except ServerGone as e:
            await self._sessions.restart()
            if e.overflow:
                return ToolOutput(
                    f"Error: {self._name!r} returned more than {self.server.max_message_bytes:,} bytes; its "
                    "server was restarted and any state it held is gone.",
                    ToolStatus.OUTPUT_LIMIT,
                    detail=str(e),
                )
            raise SandboxError(f"{self._name!r}: {e}") from None
        except Exception as e:  # a JSON-RPC error answer, a result the SDK refused, or a lost connection
            code = getattr(e, "code", None)
            if code == _CONNECTION_CLOSED or isinstance(e, OSError) or type(e).__module__.startswith("httpx"):
                await self._sessions.restart()  # the server went away mid-call (an HTTP server died)
                raise SandboxError(
                    f"{self._name!r}: the connection to {self.server.label} failed: {e}"
                ) from None
            status = ToolStatus.BAD_ARGUMENTS if code == _INVALID_PARAMS else ToolStatus.ERROR
            return ToolOutput(f"Error: {cap_text(str(e), 1000)}", status, detail=repr(e))
        text = render_result(result)
        status = ToolStatus.ERROR if result.is_error else ToolStatus.OK
        return ToolOutput(cap_text(text, self.server.max_output_chars), status)


def render_result(result: Any) -> str:
    """What the model reads of a ``CallToolResult``: text blocks as they are, other blocks as a short note,
    the structured content as JSON when there is no content block."""
    parts: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} {block.mime_type}, {len(block.data) * 3 // 4:,} bytes]")
        elif kind == "resource":
            res = block.resource
            parts.append(res.text if hasattr(res, "text") else f"[binary resource {res.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource {block.uri}]")
        else:
            parts.append(f"[{kind} content]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


def _check_specs(server: MCPServer, specs: Sequence[Any]) -> list[Any]:
    """The listed tools ``include`` keeps, each with a usable name and input schema (else ConfigError)."""
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    kept = [s for s in specs if server.include is None or s.name in server.include]
    if server.include is not None:
        missing = sorted(server.include - {s.name for s in specs})
        if missing:
            raise ConfigError(f"{server.label} has no tool(s) {missing}; it lists {[s.name for s in specs]}")
    for spec in kept:
        where = f"tool {spec.name!r} of the MCP server {server.label}"
        if not spec.name or not all(c.isalnum() or c in "_-." for c in spec.name) or len(spec.name) > 64:
            raise ConfigError(f"{where}: a name must be 1-64 letters, digits, '_', '-' or '.'")
        schema = spec.input_schema
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise ConfigError(f"{where}: its input schema must be a JSON object schema, got {schema!r:.200}")
        if not isinstance(schema.get("properties", {}), dict) or not isinstance(
            schema.get("required", []), list
        ):
            raise ConfigError(
                f"{where}: 'properties' must be an object and 'required' a list: {schema!r:.200}"
            )
        try:
            validator_for(schema).check_schema(schema)
        except SchemaError as e:
            raise ConfigError(f"{where}: its input schema is not valid JSON Schema: {e.message}") from None
    names = [server.prefix + s.name for s in kept]
    if len(set(names)) != len(names):
        raise ConfigError(f"{server.label} lists a tool name twice: {names}")
    return kept


async def start_sessions(holders: Iterable[MCPSessions], names: Collection[str]) -> None:
    """Open the sessions of the servers whose tools are in ``names`` (a turn's calls) before the calls run,
    outside their time limit: a server that is slow to start must not be recorded as the model's timeout. A
    start that fails is remembered; the calls to that server then report it as ``sandbox_error``."""
    for holder in holders:
        if any(t.name in names for t in holder.tools):
            with contextlib.suppress(SandboxError):
                await holder.session()


def expand(
    tools: Iterable[Any], default_launcher: Callable[[], ProcessLauncher]
) -> tuple[list[Any], list[MCPSessions]]:
    """``tools`` with every :class:`MCPServer` replaced by its tools, and the session holders the caller
    resets per episode. A sandboxed stdio server without a launcher gets ``default_launcher()``."""
    out: list[Any] = []
    holders: list[MCPSessions] = []
    for t in tools:
        if isinstance(t, MCPServer):
            server = t.with_launcher(default_launcher()) if t.needs_launcher else t
            holder = server.sessions()
            if t is not server:
                t._specs = server._specs  # the next env built from the same object lists nothing again
            holders.append(holder)
            out.extend(holder.tools)
        else:
            out.append(t)
    return out, holders
