"""The gateway over HTTP: a Starlette app served by uvicorn on the caller's event loop.

Routes (``<sid>`` is the session id)::

    POST /s/<sid>/v1/chat/completions   answer one turn (JSON, or server-sent events with "stream": true)
    POST /s/<sid>/v1/responses          the same turn in the OpenAI Responses API (wire_responses.py)
    POST /s/<sid>/v1/messages           the same turn in the Anthropic Messages API (wire_anthropic.py)
    POST /s/<sid>/v1/messages/count_tokens  the prompt tokens of a Messages body (no session state)
    GET  /s/<sid>/v1/models             the one model served (Anthropic's form with anthropic-version)
    GET  /s/<sid>/v1/responses/<id>     a stored response object of the session (Responses API)
    POST /s/<sid>/finish                {"reward": float, "info": {...}}: record the session, close it;
                                        without "reward" (--reward-deadline): end it, the reward comes later
    POST /s/<sid>/reward                {"reward": float, "info": {...}}: the reward of an ended session
    GET  /health                        {"ok": true, "open_sessions": n}
    POST /v1/chat/completions           one answer outside any session, never recorded (a judge's call)

Every error is an OpenAI-style JSON body with a 4xx/5xx status (Anthropic's shape on its routes). A client
that disconnects while its turn is being sampled cancels the sampling; the session is left as if the request
had not been made.

Authentication: with an ``api_key`` every route but ``/health`` needs ``Authorization: Bearer <key>`` (the
header the ``openai`` client sends for its ``api_key``) or ``x-api-key: <key>`` (the ``anthropic``
client's), else a 401. Without one, any key is accepted, which
is only safe on a loopback address: whoever reaches the port can open sessions and finish them with any
reward, i.e. write trajectories and rewards straight into training. :class:`Gateway` therefore refuses a
non-loopback ``host`` without a key unless ``allow_unauthenticated`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

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

from .core import CHAT_API, GatewayCore
from .session import GatewayConfig
from .wire import GatewayError, parse_finish, stream_chunks
from .wire_anthropic import MESSAGES_API, anthropic_error, message_events, models_body, parse_messages_request
from .wire_responses import RESPONSES_API, encode_events, response_events

if TYPE_CHECKING:
    from .serve_config import ServeConfig

__all__ = ["Gateway", "build_app", "check_exposure", "is_loopback"]

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


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is only reachable from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def check_exposure(host: str, api_key: str | None, *, allow_unauthenticated: bool) -> None:
    """Refuse to serve a non-loopback ``host`` without an API key (before anything binds)."""
    if api_key is None and not is_loopback(host) and not allow_unauthenticated:
        raise ConfigError(
            f"--host {host} would let anyone who reaches the port open sessions and finish them with any "
            "reward (writing trajectories and rewards into training); give the gateway a key (--api-key, or "
            "the AGENTRL_GATEWAY_API_KEY environment variable; agents send it as their api_key) or pass "
            "--allow-unauthenticated true if the network is trusted"
        )


def _api_of(request: Request) -> str:
    """The API whose error shape a request gets: Anthropic's for its routes and for clients that send the
    ``anthropic-version`` header, OpenAI's otherwise."""
    if "/v1/messages" in request.url.path or "anthropic-version" in request.headers:
        return MESSAGES_API
    return CHAT_API


def _api_error(api: str, e: GatewayError) -> JSONResponse:
    """``e`` in the error shape the API's real client parses."""
    if api == MESSAGES_API:
        return JSONResponse(anthropic_error(e), status_code=e.status)
    return _error(e)


def _unauthorized(request: Request, api_key: str | None) -> JSONResponse | None:
    """A 401 body when ``api_key`` is set and the request carries it neither as a Bearer token (the openai
    client's ``api_key``, the anthropic client's ``auth_token``) nor as ``x-api-key`` (the anthropic
    client's ``api_key``)."""
    if api_key is None:
        return None
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode()):
        return None
    x_key = request.headers.get("x-api-key")
    if x_key is not None and hmac.compare_digest(x_key.strip().encode(), api_key.encode()):
        return None
    if header:
        why = "the Authorization header does not carry the key"
    elif x_key is not None:
        why = "the x-api-key header does not carry the key"
    else:
        why = "no Authorization header (nor x-api-key)"
    return _api_error(
        _api_of(request),
        GatewayError(
            401,
            f"{why}: this gateway needs 'Authorization: Bearer <key>' (the openai client's api_key) or "
            "'x-api-key: <key>' (the anthropic client's api_key)",
            kind="authentication_error",
            code="invalid_api_key",
        ),
    )


def _log_request(sid: str, status: int, out: dict[str, Any] | None, t0: float, in_flight: int) -> None:
    out = out or {}
    usage = out.get("usage") or {}
    # chat completions: choices[0].finish_reason; responses: status; messages: stop_reason
    finish = (out.get("choices") or [{}])[0].get("finish_reason") or out.get("stop_reason")
    if finish is None and out.get("object") == "response":
        finish = out.get("status")
    prompt = usage.get("prompt_tokens", usage.get("input_tokens", "-"))
    completion = usage.get("completion_tokens", usage.get("output_tokens", "-"))
    print(
        f"gateway: session {sid} {status} prompt_tokens={prompt} completion_tokens={completion} "
        f"finish={finish or '-'} latency={time.perf_counter() - t0:.2f}s in_flight={in_flight}",
        file=sys.stderr,
        flush=True,
    )


Handler = Callable[[Request], Awaitable[Response]]
"""A route's handler."""
Answer = tuple[bool, dict[str, Any], Callable[[], Iterable[str]]]
"""What a turn route's core call returns: stream or not, the response body, its server-sent events."""


def build_app(core: GatewayCore, *, api_key: str | None = None, log_requests: bool = False) -> Starlette:
    """The ASGI app of ``core`` (servable by any ASGI server).

    Args:
        core: The sessions.
        api_key: When set, requests must carry ``Authorization: Bearer <api_key>`` (401 otherwise).
        log_requests: Print one line per chat request to stderr: session, status, prompt and completion
            tokens, finish reason, latency, and how many requests were in flight when it started (the
            policy batches concurrent turns, so a turn's latency grows with the others being sampled).
    """
    in_flight = 0

    def chat_answer(stream: bool, include_usage: bool, out: dict[str, Any]) -> Answer:
        chunks = lambda: [  # noqa: E731
            *(f"data: {json.dumps(c)}\n\n" for c in stream_chunks(out, include_usage=include_usage)),
            "data: [DONE]\n\n",
        ]
        return stream, out, chunks

    async def answer_chat(sid: str, body: Any) -> Answer:
        return chat_answer(*await core.chat(sid, body))

    async def answer_stateless(sid: str, body: Any) -> Answer:
        return chat_answer(*await core.complete(body))  # no session: a judge's one-off call

    async def answer_responses(sid: str, body: Any) -> Answer:
        stream, out = await core.responses(sid, body)
        return stream, out, lambda: encode_events(response_events(out))

    async def answer_messages(sid: str, body: Any) -> Answer:
        stream, out = await core.messages(sid, body)
        return stream, out, lambda: encode_events(message_events(out))

    def turn_route(api: str, call: Callable[[str, Any], Awaitable[Answer]]) -> Handler:
        async def route(request: Request) -> Response:
            nonlocal in_flight
            sid = request.path_params.get("sid", "-")  # "-": the session-less route
            t0, others = time.perf_counter(), in_flight
            in_flight += 1
            try:
                response, out = await _turn(request, sid, api, call)
            finally:
                in_flight -= 1
            if log_requests:
                _log_request(sid, response.status_code, out, t0, others + 1)
            return response

        return guarded(route)

    async def _turn(
        request: Request, sid: str, api: str, call: Callable[[str, Any], Awaitable[Answer]]
    ) -> tuple[Response, dict[str, Any] | None]:
        try:
            body = await _json_body(request)
        except GatewayError as e:
            return _api_error(api, e), None
        work = asyncio.ensure_future(call(sid, body))
        gone = asyncio.ensure_future(_until_disconnected(request.receive))
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():  # the client went away mid-generation: stop sampling for nobody
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            return Response(status_code=499), None
        gone.cancel()
        try:
            stream, out, events = work.result()
        except GatewayError as e:
            return _api_error(api, e), None
        except Exception as e:  # a bug: answer it, keep serving
            log.exception("session %s: unexpected error", sid)
            return _api_error(api, GatewayError(500, f"internal error: {e!r}", kind="server_error")), None
        if not stream:
            return JSONResponse(out), out

        async def sse() -> AsyncIterator[str]:
            for e in events():
                yield e

        return StreamingResponse(sse(), media_type="text/event-stream"), out

    async def count_tokens(request: Request) -> Response:
        try:
            req = parse_messages_request(await _json_body(request), count_only=True)
            return JSONResponse({"input_tokens": core.count_tokens(req)})
        except GatewayError as e:
            return _api_error(MESSAGES_API, e)

    async def models(request: Request) -> Response:
        if _api_of(request) == MESSAGES_API:  # the anthropic client lists models in its own form
            return JSONResponse(models_body(core.config.model_name, core.created))
        return JSONResponse(core.models())

    async def retrieve(request: Request) -> Response:
        sid, rid = request.path_params["sid"], request.path_params["rid"]
        for param in ("stream", "include", "starting_after"):
            if param in request.query_params and not (
                param == "stream" and request.query_params[param] == "false"
            ):
                why = "streaming a stored response" if param == "stream" else f"'{param}'"
                return _error(GatewayError(400, f"{why} is not supported on retrieve", param=param))
        try:
            return JSONResponse(core.retrieve_response(sid, rid))
        except GatewayError as e:
            return _error(e)

    async def finish(request: Request) -> Response:
        return await record(request, reward_optional=True)

    async def post_reward(request: Request) -> Response:
        return await record(request, reward_optional=False)

    async def record(request: Request, *, reward_optional: bool) -> Response:
        sid = request.path_params["sid"]
        try:
            reward, info = parse_finish(await _json_body(request), reward_optional=reward_optional)
            if reward is None:  # the session ends; its reward is posted later (POST /s/<sid>/reward)
                deadline = await core.end(sid, info, wait=False)
                return JSONResponse(
                    {"session_id": sid, "awaiting_reward": True, "reward_deadline_s": deadline}
                )
            trajs = await core.reward(sid, reward, info, keep=core.store is None)
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
                        # why the session became several trajectories (SEGMENT_ENDS in session.py)
                        "segment": t.meta.extra.get("segment", 0),
                        "segment_end": t.meta.extra.get("segment_end", "finish"),
                    }
                    for t in trajs
                ],
            }
        )

    def guarded(handler: Handler) -> Handler:
        """``handler`` behind the key check, holding its session busy from the request's arrival to its
        answer: a request waiting in a saturated gateway (for the event loop, for the policy) is not idle
        time for ``--session-timeout``."""

        async def route(request: Request) -> Response:
            if (denied := _unauthorized(request, api_key)) is not None:
                return denied
            with core.busy(request.path_params.get("sid", "-")):
                return await handler(request)

        return route

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True, "open_sessions": len(core.sessions)})

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        hint = (
            "no such route; an agent's base_url is http://HOST:PORT/s/<session_id>/v1 "
            "(POST chat/completions, responses; GET models), an anthropic client's http://HOST:PORT/s/"
            "<session_id> (POST v1/messages), and POST /s/<session_id>/finish ends a session"
        )
        msg = f"{request.method} {request.url.path}: {'method not allowed' if status == 405 else hint}"
        kind = "not_found_error" if status == 404 else "invalid_request_error"
        return _api_error(_api_of(request), GatewayError(status, msg, kind=kind))

    return Starlette(
        routes=[
            Route("/s/{sid}/v1/chat/completions", turn_route(CHAT_API, answer_chat), methods=["POST"]),
            Route("/s/{sid}/v1/responses", turn_route(RESPONSES_API, answer_responses), methods=["POST"]),
            Route("/s/{sid}/v1/messages", turn_route(MESSAGES_API, answer_messages), methods=["POST"]),
            Route("/s/{sid}/v1/messages/count_tokens", guarded(count_tokens), methods=["POST"]),
            Route("/s/{sid}/v1/models", guarded(models), methods=["GET"]),
            Route("/s/{sid}/v1/responses/{rid}", guarded(retrieve), methods=["GET"]),
            Route("/s/{sid}/finish", guarded(finish), methods=["POST"]),
            Route("/s/{sid}/reward", guarded(post_reward), methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/v1/chat/completions", turn_route(CHAT_API, answer_stateless), methods=["POST"]),
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
        api_key: Requests must carry ``Authorization: Bearer <api_key>`` (401 otherwise); None accepts any.
        allow_unauthenticated: Serve a non-loopback ``host`` without ``api_key`` (refused otherwise, before
            binding).
        log_requests: Print one line per chat request to stderr (see :func:`build_app`).
        session_timeout: Close sessions without a request for this many seconds, recording them as
            cancelled (never trained on); None keeps them until :meth:`finish` or the gateway stops.
        reward_deadline: A session may end without its reward (``finish`` without one) and take it later
            (``POST /s/<sid>/reward``, :meth:`reward`) within this many seconds, else it is recorded as never
            rewarded (never trained on); None: the reward comes with ``finish``.
        on_session: Called with each recorded session's trajectories (see :class:`GatewayCore`).
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
        api_key: str | None = None,
        allow_unauthenticated: bool = False,
        log_requests: bool = False,
        session_timeout: float | None = None,
        reward_deadline: float | None = None,
        on_session: Callable[[tuple[Trajectory, ...]], None] | None = None,
    ):
        if session_timeout is not None and not session_timeout > 0:
            raise ConfigError(f"--session-timeout must be > 0 seconds, got {session_timeout!r}")
        self.session_timeout = session_timeout
        self._reaper: asyncio.Task[None] | None = None
        if api_key is not None and not api_key:
            raise ConfigError("the gateway's API key is empty; give a non-empty key or none")
        check_exposure(host, api_key, allow_unauthenticated=allow_unauthenticated)
        self.core = GatewayCore(
            policy,
            renderer,
            config,
            store=store,
            auto_sessions=auto_sessions,
            reward_deadline=reward_deadline,
            on_session=on_session,
        )
        self.api_key = api_key
        self.log_requests = log_requests
        self.host = host
        self.port = port
        self._server: _EmbeddedServer | None = None
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def from_serve_config(
        cls,
        serve: ServeConfig,
        policy: Policy,
        renderer: ChatRenderer,
        config: GatewayConfig,
        *,
        store: TrajectoryStore,
        api_key: str | None,
        on_session: Callable[[tuple[Trajectory, ...]], None] | None = None,
    ) -> Gateway:
        """The gateway ``agentrl gateway`` serves, with or without ``--train``: ``serve``'s address, exposure,
        request log, session timeout and reward deadline, in front of ``policy`` with ``config`` (the
        command's settings, or live training's with the trainer's limits). ``api_key`` is the resolved key
        (``--api-key`` or the environment's)."""
        return cls(
            policy,
            renderer,
            config,
            store=store,
            host=serve.host,
            port=serve.port,
            api_key=api_key,
            allow_unauthenticated=serve.allow_unauthenticated,
            log_requests=serve.log_requests,
            session_timeout=serve.session_timeout,
            reward_deadline=serve.reward_deadline,
            on_session=on_session,
        )

    @property
    def url(self) -> str:
        """``http://HOST:PORT``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def base_url(self, session_id: str) -> str:
        """The OpenAI ``base_url`` of a session: ``http://HOST:PORT/s/<session_id>/v1``."""
        return f"{self.url}/s/{session_id}/v1"

    def anthropic_base_url(self, session_id: str) -> str:
        """The Anthropic ``base_url`` of a session (the client adds ``/v1/messages``):
        ``http://HOST:PORT/s/<session_id>``."""
        return f"{self.url}/s/{session_id}"

    def open_session(self, meta: TrajectoryMeta | None = None, session_id: str | None = None) -> str:
        """Open a session whose trajectories carry ``meta``; return its id."""
        return self.core.open_session(meta, session_id)

    async def finish(
        self, session_id: str, reward: float, info: dict[str, Any] | None = None
    ) -> tuple[Trajectory, ...]:
        """Close a session with its reward; return (and store) its trajectories."""
        return await self.core.finish(session_id, reward, info)

    async def end(self, session_id: str, info: dict[str, Any] | None = None) -> float:
        """End a session without its reward (posted later with :meth:`reward`); return the deadline (s)."""
        return await self.core.end(session_id, info)

    async def reward(
        self, session_id: str, reward: float, info: dict[str, Any] | None = None
    ) -> tuple[Trajectory, ...]:
        """Post the reward of a session that ended without one (or finish an open one with it)."""
        return await self.core.reward(session_id, reward, info)

    async def abort(self, session_id: str, kind: str, message: str) -> tuple[Trajectory, ...]:
        """Close a session as an infrastructure failure (recorded, never trained on)."""
        return await self.core.abort(session_id, kind, message)

    async def _expire(self) -> None:
        """Close idle sessions and record those whose reward deadline passed, every few seconds (a quarter of
        the shorter limit, at most 5 s apart).

        A tick that wakes late saw the event loop stalled (a saturated gateway): requests sent meanwhile may
        still sit unread in their sockets, so the stall is not counted as idle time."""
        timeout, deadline = self.session_timeout, self.core.reward_deadline
        tick = min(t / 4 for t in (timeout, deadline, 20.0) if t is not None)
        while True:
            due = time.monotonic() + tick
            await asyncio.sleep(tick)
            try:
                if timeout is not None:  # idleness as of when the tick was due: a stall is not idle time
                    for sid in await self.core.expire_idle(timeout, now=min(time.monotonic(), due)):
                        log.info("session %s expired after %g s without a request", sid, timeout)
                for sid in await self.core.expire_rewards():
                    log.info(
                        "session %s: no reward posted within %g s; recorded as never rewarded", sid, deadline
                    )
            except Exception:  # a failed store write: the session stays, try again next time
                log.exception("expiring idle sessions failed")

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
            build_app(self.core, api_key=self.api_key, log_requests=self.log_requests),
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
        if self.session_timeout is not None or self.core.reward_deadline is not None:
            self._reaper = asyncio.ensure_future(self._expire())
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.core.close()
        finally:
            if self._reaper is not None:
                self._reaper.cancel()
                await asyncio.gather(self._reaper, return_exceptions=True)
                self._reaper = None
            if self._server is not None and self._task is not None:
                self._server.should_exit = True
                await asyncio.gather(self._task, return_exceptions=True)
            self._server = self._task = None
