"""The gateway over HTTP: a Starlette app served by uvicorn on the caller's event loop.

Routes (``<sid>`` is the session id; any API key is accepted)::

    POST /s/<sid>/v1/chat/completions   answer one turn (JSON, or server-sent events with "stream": true)
    GET  /s/<sid>/v1/models             the one model served
    POST /s/<sid>/finish                {"reward": float, "info": {...}}: record the session, close it
    GET  /health                        {"ok": true, "open_sessions": n}

Every error is an OpenAI-style JSON body with a 4xx/5xx status. A client that disconnects while its turn is
being sampled cancels the sampling; the session is left as if the request had not been made.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agentrl.chat import ChatRenderer
from agentrl.errors import ConfigError
from agentrl.protocols import Policy, TrajectoryStore
from agentrl.types import Trajectory, TrajectoryMeta

from .core import GatewayCore
from .session import GatewayConfig
from .wire import GatewayError, parse_finish, stream_chunks

__all__ = ["Gateway", "build_app"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 32 * 2**20
"""Largest request body accepted (a 413 beyond)."""


def _error(e: GatewayError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


async def _json_body(request: Request) -> Any:
    size, parts = 0, []
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise GatewayError(
                413, f"the request body is larger than {MAX_BODY_BYTES} bytes", code="too_large"
            )
        parts.append(chunk)
    try:
        return json.loads(b"".join(parts))
    except ValueError as e:
        raise GatewayError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None


async def _until_disconnected(receive: Callable[[], Awaitable[Any]]) -> None:
    # With the body read, the server's receive() returns only when the client goes away.
    while (await receive())["type"] != "http.disconnect":
        pass


def build_app(core: GatewayCore) -> Starlette:
    """The ASGI app of ``core`` (servable by any ASGI server)."""

    async def chat(request: Request) -> Response:
        sid = request.path_params["sid"]
        try:
            body = await _json_body(request)
        except GatewayError as e:
            return _error(e)
        work = asyncio.ensure_future(core.chat(sid, body))
        gone = asyncio.ensure_future(_until_disconnected(request.receive))
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():  # the client went away mid-generation: stop sampling for nobody
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            return Response(status_code=499)
        gone.cancel()
        try:
            stream, include_usage, out = work.result()
        except GatewayError as e:
            return _error(e)
        except Exception as e:  # a bug: answer it, keep serving
            log.exception("session %s: unexpected error", sid)
            return _error(GatewayError(500, f"internal error: {e!r}", kind="server_error"))
        if not stream:
            return JSONResponse(out)

        async def events() -> AsyncIterator[str]:
            for c in stream_chunks(out, include_usage=include_usage):
                yield f"data: {json.dumps(c)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def models(request: Request) -> Response:
        return JSONResponse(core.models())

    async def finish(request: Request) -> Response:
        sid = request.path_params["sid"]
        try:
            reward, info = parse_finish(await _json_body(request))
            trajs = await core.finish(sid, reward, info, wait=False, keep=core.store is None)
        except GatewayError as e:
            return _error(e)
        except Exception as e:
            log.exception("session %s: finishing failed", sid)
            return _error(GatewayError(500, f"could not record the session: {e!r}", kind="server_error"))
        return JSONResponse(
            {
                "session_id": sid,
                "reward": reward,
                "trajectories": [
                    {
                        "episode_id": t.meta.episode_id,
                        "tokens": len(t.token_ids),
                        "model_tokens": t.num_model_tokens,
                        "turns": t.num_turns,
                        "stop_reason": t.stop_reason.value,
                        "trainable": not t.infra_failure,
                    }
                    for t in trajs
                ],
            }
        )

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True, "open_sessions": len(core.sessions)})

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        hint = (
            "no such route; an agent's base_url is http://HOST:PORT/s/<session_id>/v1 "
            "(POST chat/completions, GET models) and POST /s/<session_id>/finish ends a session"
        )
        msg = f"{request.method} {request.url.path}: {'method not allowed' if status == 405 else hint}"
        return _error(
            GatewayError(status, msg, kind="not_found_error" if status == 404 else "invalid_request_error")
        )

    return Starlette(
        routes=[
            Route("/s/{sid}/v1/chat/completions", chat, methods=["POST"]),
            Route("/s/{sid}/v1/models", models, methods=["GET"]),
            Route("/s/{sid}/finish", finish, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ],
        exception_handlers={404: not_found, 405: not_found},
    )


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its signal handlers: the process that embeds the gateway owns SIGINT/SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


class Gateway:
    """An OpenAI-compatible recording gateway, served over HTTP from the running event loop.

    ::

        store = JsonlStore("out/trajectories.jsonl")
        async with Gateway(policy, renderer, GatewayConfig(), store=store) as gw:
            client = openai.AsyncOpenAI(base_url=gw.base_url("s1"), api_key="-")
            reply = await client.chat.completions.create(model="policy", messages=[...])
            await gw.finish("s1", reward=1.0)

    Args:
        policy: Samples turns (token in, token out); its stop ids must be ``renderer.stop_token_ids``.
        renderer: The chat template renderer of the policy's tokenizer.
        config: Rendering, sampling and recording settings.
        store: Where finished sessions are appended (None: :meth:`finish` only returns them).
        host: Interface to listen on (loopback by default).
        port: TCP port; 0 picks a free one (see :attr:`port`).
        auto_sessions: Open a session on its first request (standalone). False: only sessions opened with
            :meth:`open_session` exist; other ids get a 404 (training).
    """

    def __init__(
        self,
        policy: Policy,
        renderer: ChatRenderer,
        config: GatewayConfig | None = None,
        *,
        store: TrajectoryStore | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        auto_sessions: bool = True,
    ):
        self.core = GatewayCore(policy, renderer, config, store=store, auto_sessions=auto_sessions)
        self.host = host
        self.port = port
        self._server: _EmbeddedServer | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """``http://HOST:PORT``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def base_url(self, session_id: str) -> str:
        """The OpenAI ``base_url`` of a session: ``http://HOST:PORT/s/<session_id>/v1``."""
        return f"{self.url}/s/{session_id}/v1"

    def open_session(self, meta: TrajectoryMeta | None = None, session_id: str | None = None) -> str:
        """Open a session whose trajectories carry ``meta``; return its id."""
        return self.core.open_session(meta, session_id)

    async def finish(
        self, session_id: str, reward: float, info: dict[str, Any] | None = None
    ) -> tuple[Trajectory, ...]:
        """Close a session with its reward; return (and store) its trajectories."""
        return await self.core.finish(session_id, reward, info)

    async def abort(self, session_id: str, kind: str, message: str) -> tuple[Trajectory, ...]:
        """Close a session as an infrastructure failure (recorded, never trained on)."""
        return await self.core.abort(session_id, kind, message)

    async def __aenter__(self) -> Gateway:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # IPPROTO_TCP explicitly: asyncio turns Nagle off only on sockets that say so, and a keep-alive
        # response written as headers + body would otherwise wait ~40 ms for the client's delayed ACK.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.listen(2048)
        except OSError as e:
            sock.close()
            raise ConfigError(f"the gateway cannot listen on {self.host}:{self.port}: {e}") from e
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            build_app(self.core),
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=5,
            timeout_keep_alive=30,
        )
        self._server = _EmbeddedServer(config)
        self._task = asyncio.ensure_future(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise ConfigError(f"the gateway's HTTP server did not start on {self.url}")
            await asyncio.sleep(0.005)
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.core.close()
        finally:
            if self._server is not None and self._task is not None:
                self._server.should_exit = True
                await asyncio.gather(self._task, return_exceptions=True)
            self._server = self._task = None
