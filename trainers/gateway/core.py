"""The gateway without HTTP: sessions, the policy call, and finished trajectories.

:class:`GatewayCore` takes request bodies as parsed JSON and returns response bodies; the HTTP layer
(:mod:`agentrl.trainers.gateway.server`) only moves bytes. It needs nothing but a
:class:`~agentrl.protocols.Policy` (token in, token out) and a :class:`~agentrl.chat.ChatRenderer`, so the
policy may live in this process (``HFPolicy``), behind an inference server (``OpenAIPolicy``), or in another
actor.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from agentrl.chat import ChatRenderer
from agentrl.errors import ConfigError, PolicyError
from agentrl.protocols import FinishReason, Generation, Policy, Sampling, TrajectoryStore
from agentrl.tools import get_parser
from agentrl.types import EpisodeFailure, Message, StopReason, Trajectory, TrajectoryMeta

from .ended import Awaiting, EndedSessions, Why
from .session import FinishKind, GatewayConfig, Session, Turn
from .wire import ChatRequest, GatewayError, WireMessage, completion_body, models_list, parse_chat_request
from .wire_anthropic import MESSAGES_API, message_body, parse_messages_request
from .wire_anthropic import new_id as new_message_id
from .wire_responses import RESPONSES_API, parse_responses_request, response_body

__all__ = ["CHAT_API", "REWARD_MISSING", "GatewayCore", "Turn"]

CHAT_API = "chat.completions"
"""The API name of ``/v1/chat/completions`` requests (see :meth:`GatewayCore.turn`)."""

REWARD_MISSING = "RewardMissing"
"""The failure kind of a session that ended without a reward and got none before the deadline (infra)."""


log = logging.getLogger(__name__)

_SESSION_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class GatewayCore:
    """Sessions of an OpenAI-compatible recording gateway in front of ``policy``.

    Args:
        policy: Samples turns (its stop ids must be ``renderer.stop_token_ids``).
        renderer: The chat template renderer of the policy's tokenizer.
        config: Rendering, sampling and recording settings.
        store: Where finished sessions' trajectories are appended (None: only returned to the caller).
        auto_sessions: A request for an unknown session id opens it (standalone use). When False, only
            sessions opened with :meth:`open_session` exist (training), and others get a 404.
        reward_deadline: A session may end without its reward (:meth:`end`) and take it later
            (:meth:`reward`) within this many seconds; past that it is recorded as never rewarded (an
            infrastructure failure, never trained on). None: the reward must come with :meth:`finish`.
        on_session: Called with each recorded session's trajectories, after the store has them (live
            training: :class:`~agentrl.trainers.gateway.live.LiveGroups` forms groups from them).
        ended: Which ended sessions are remembered, and for how long, so that a late request is told why it
            is refused (:class:`~agentrl.trainers.gateway.ended.EndedSessions`: an hour, 100,000 at most).
    """

    def __init__(
        self,
        policy: Policy,
        renderer: ChatRenderer,
        config: GatewayConfig | None = None,
        *,
        store: TrajectoryStore | None = None,
        auto_sessions: bool = True,
        reward_deadline: float | None = None,
        on_session: Callable[[tuple[Trajectory, ...]], None] | None = None,
        ended: EndedSessions | None = None,
    ):
        if reward_deadline is not None and not (
            isinstance(reward_deadline, int | float)
            and math.isfinite(reward_deadline)
            and reward_deadline > 0
        ):
            raise ConfigError(f"--reward-deadline must be > 0 seconds, got {reward_deadline!r}")
        self.policy = policy
        self.renderer = renderer
        self.config = config or GatewayConfig()
        self.store = store
        self.auto_sessions = auto_sessions
        self.reward_deadline = reward_deadline
        self.on_session = on_session
        self.parser = get_parser(self.config.parser)
        self.tools_in_template = self._tools_in_template()
        self.sessions: dict[str, Session] = {}
        self.ended = ended if ended is not None else EndedSessions()
        """Sessions that ended (finished, expired, never rewarded), for a bounded time and count."""
        self._results: dict[str, tuple[Trajectory, ...]] = {}
        self._seen: dict[str, float] = {}
        """When each open session last had a request (``time.monotonic``), for idle expiry."""
        self._busy: dict[str, int] = {}
        """Open sessions with requests the HTTP layer holds (:meth:`busy`): never idle meanwhile."""
        self._apis: dict[str, str] = {}
        """The API each session speaks (its first model turn's)."""
        self.stored: dict[str, dict[str, tuple[tuple[WireMessage, ...], dict[str, Any]]]] = {}
        """Per session, the Responses API's stored responses: id -> (the conversation up to and including
        it, for ``previous_response_id``; its response object, for ``GET /v1/responses/{id}``)."""
        self._awaiting: dict[str, Awaiting] = {}
        """Sessions that ended without their reward, until it is posted or the deadline passes."""
        self.created = int(time.time())

    def _tools_in_template(self) -> bool:
        mode = self.config.tool_prompt
        if mode != "auto":
            return mode == "template"
        probe = [{"type": "function", "function": {"name": "probe_tool", "parameters": {"type": "object"}}}]
        msgs = [Message("user", "x")]
        with_tools = self.renderer.render_text(msgs, tools=probe, add_generation_prompt=False)
        return with_tools != self.renderer.render_text(msgs, add_generation_prompt=False)

    # ------------------------------------------------------------------------------------------
    def open_session(self, meta: TrajectoryMeta | None = None, session_id: str | None = None) -> str:
        """Open a session (its trajectories get ``meta``); return its id."""
        sid = session_id or uuid.uuid4().hex
        _check_id(sid)
        if sid in self.sessions or self.finished(sid):
            raise GatewayError(409, f"session {sid!r} already exists", code="session_exists")
        self.sessions[sid] = self._new(sid, meta)
        self._seen[sid] = time.monotonic()
        return sid

    def _new(self, sid: str, meta: TrajectoryMeta | None) -> Session:
        meta = meta or TrajectoryMeta(env_id="gateway", task_id=sid, group_id=sid)
        return Session(
            sid,
            self.renderer,
            self.config,
            meta=meta,
            parser=self.parser,
            tools_in_template=self.tools_in_template,
        )

    def _finished_error(self, sid: str) -> GatewayError:
        return self.ended.refusal(sid, awaiting=sid in self._awaiting)

    def _session(self, sid: str, *, create: bool) -> Session:
        _check_id(sid)
        if self.finished(sid):
            raise self._finished_error(sid)
        s = self.sessions.get(sid)
        if s is None:
            if not create:
                raise GatewayError(
                    404, f"unknown session {sid!r}", code="unknown_session", kind="not_found_error"
                )
            s = self.sessions[sid] = self._new(sid, None)
            self._seen[sid] = time.monotonic()
        return s

    def models(self) -> dict[str, Any]:
        """The ``GET /v1/models`` body."""
        return models_list(self.config.model_name, self.created)

    # ------------------------------------------------------------------------------------------
    async def chat(self, sid: str, body: Any) -> tuple[bool, bool, dict[str, Any]]:
        """Answer one chat-completions request of session ``sid``.

        Returns ``(stream, include_usage, completion body)``. Raises :class:`GatewayError` with the HTTP
        status for everything the client did wrong (and 500 when the policy failed). Cancelling the call
        (the client went away) leaves the session as if the request had not been made.
        """
        req = parse_chat_request(body)
        done = await self.turn(sid, req, api=CHAT_API)
        body_out = completion_body(
            id=f"chatcmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=self.config.model_name,
            message=done.message,
            finish_reason=done.finish_reason,
            prompt_tokens=done.prompt_tokens,
            completion_tokens=done.completion_tokens,
        )
        return req.stream, req.include_usage, body_out

    async def complete(self, body: Any) -> tuple[bool, bool, dict[str, Any]]:
        """One chat request outside any session (``POST /v1/chat/completions``, judges): sampled as a first
        turn, then forgotten: nothing recorded, no session left open. Returns and errors as :meth:`chat`."""
        sid = self.open_session(session_id=f"stateless-{uuid.uuid4().hex}")
        try:
            return await self.chat(sid, body)
        finally:
            for held in (self.sessions, self._apis, self._seen, self.stored):
                held.pop(sid, None)

    async def responses(self, sid: str, body: Any) -> tuple[bool, dict[str, Any]]:
        """Answer one Responses-API request of session ``sid``: ``(stream, response object)``.

        ``previous_response_id`` must name a stored response of the same session; its conversation comes
        before the request's input. With ``store`` (the default) the answer is kept for a later request.
        """
        req = parse_responses_request(body)
        stored = self.stored.get(sid, {})
        history: tuple[WireMessage, ...] = ()
        if req.previous_response_id is not None:
            if req.previous_response_id not in stored:
                raise GatewayError(
                    400,
                    f"previous response {req.previous_response_id!r} is not stored in session {sid!r} (a "
                    "response is stored when it was made with store true, in the same session)",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
            history = stored[req.previous_response_id][0]
        done = await self.turn(sid, req.with_history(history), api=RESPONSES_API)
        rid = f"resp_{uuid.uuid4().hex}"
        out = response_body(
            req,
            id=rid,
            created=int(time.time()),
            model=self.config.model_name,
            message=done.message,
            finish_reason=done.finish_reason,
            prompt_tokens=done.prompt_tokens,
            completion_tokens=done.completion_tokens,
        )
        if req.store:
            conversation = (*history, *req.input, WireMessage.of(done.message))
            self.stored.setdefault(sid, {})[rid] = (conversation, out)
        return req.chat.stream, out

    def retrieve_response(self, sid: str, response_id: str) -> dict[str, Any]:
        """``GET /v1/responses/{id}``: the response object of a stored response of session ``sid`` (made with
        ``store`` true, in this session, while it is open)."""
        _check_id(sid)
        found = self.stored.get(sid, {}).get(response_id)
        if found is None:
            raise GatewayError(
                404,
                f"no response with id {response_id!r} is stored in session {sid!r} (a response is stored "
                "when it was made with store true, in the same session, until the session ends)",
                code="response_not_found",
                kind="not_found_error",
            )
        return found[1]

    async def messages(self, sid: str, body: Any) -> tuple[bool, dict[str, Any]]:
        """Answer one Anthropic Messages request of session ``sid``: ``(stream, message object)``."""
        req = parse_messages_request(body)
        done = await self.turn(sid, req, api=MESSAGES_API)
        out = message_body(
            id=new_message_id(),
            model=self.config.model_name,
            message=done.message,
            finish_reason=done.finish_reason,
            prompt_tokens=done.prompt_tokens,
            completion_tokens=done.completion_tokens,
        )
        return req.stream, out

    def session_api(self, sid: str) -> str | None:
        """The API session ``sid`` speaks (set by its first model turn), or None."""
        return self._apis.get(sid)

    async def turn(self, sid: str, req: ChatRequest, *, api: str) -> Turn:
        """One model turn of session ``sid``: the one recording path of every API.

        ``req`` is the request translated to the chat-completions form (each API's wire module does that);
        it is rendered with the chat template, prefix-checked against the session's stream (or split, with a
        reason), sampled, and recorded, whatever API it came from. ``api`` names the request's API: a
        session speaks one (a 400 ``mixed_apis`` otherwise), because the APIs echo a turn back differently
        and a session's record must compare like with like.
        """
        s = self._session(sid, create=self.auto_sessions)
        spoken = self._apis.get(sid)
        if spoken is not None and spoken != api:
            raise GatewayError(
                400,
                f"session {sid!r} speaks the {spoken} API; a session may not mix APIs (this request is "
                f"{api}): use one session per conversation and one API per session",
                code="mixed_apis",
            )
        if s.lock.locked():
            raise GatewayError(
                409,
                f"session {sid!r} already has a request in flight; a session is one conversation, so its "
                "requests must come one at a time (use one session per concurrent branch)",
                code="concurrent_request",
            )
        self._seen[sid] = time.monotonic()
        async with s.lock:
            if self.finished(sid):
                raise self._finished_error(sid)
            prompt = s.prepare(req)
            self._apis[sid] = api
            cap = min(req.max_tokens or self.config.max_new_tokens, self.config.max_new_tokens)
            max_new = min(cap, self.config.max_total_tokens - len(prompt))
            fixed = self.config.temperature
            sampling = Sampling(
                max_new_tokens=max_new,
                temperature=fixed if fixed is not None else (req.temperature or 1.0),
                top_p=1.0 if fixed is not None else (req.top_p or 1.0),
                seed=req.seed,
            )
            t0 = time.perf_counter()
            try:
                gen = self._check(await self.policy.generate(prompt, sampling), max_new)
            except asyncio.CancelledError:
                s.disconnects += 1
                raise
            except Exception as e:
                s.fail(type(e).__name__, str(e), StopReason.POLICY_ERROR)
                log.warning("session %s: the policy failed: %r", sid, e)
                raise GatewayError(500, f"the policy failed to generate: {e}", kind="server_error") from e
            finally:
                s.timings["generate"] += time.perf_counter() - t0
                self._seen[sid] = time.monotonic()  # idle time counts from the answer
            cand = s.accept(gen, req, cut_by_budget=max_new < cap)
        finish: FinishKind = (
            "length"
            if not self.renderer.is_stop(gen.token_ids[-1])
            else ("tool_calls" if cand.message.tool_calls else "stop")
        )
        return Turn(cand.message, finish, len(prompt), len(gen.token_ids))

    def count_tokens(self, req: ChatRequest) -> int:
        """How many tokens the policy would see for ``req`` as a session's first request (no session)."""
        # A throwaway session renders it exactly as a first request would be (tools, instructions).
        return len(self._new("count-tokens", None)._start(req))

    def _check(self, gen: Any, max_new: int) -> Generation:
        """What a policy must never return (engine-side wrong ids, pitfall §15.5)."""
        vocab = self.renderer.vocab_size
        if not isinstance(gen, Generation) or not gen.token_ids:
            raise PolicyError(f"the policy returned {gen!r:.80}, not a non-empty Generation")
        if len(gen.token_ids) > max_new:
            raise PolicyError(f"the policy returned {len(gen.token_ids)} tokens, more than {max_new}")
        if not all(isinstance(t, int) and 0 <= t < vocab for t in gen.token_ids):
            raise PolicyError(f"the policy returned a token id outside the vocabulary [0, {vocab})")
        if not all(isinstance(x, int | float) and math.isfinite(x) and x <= 1e-6 for x in gen.logprobs):
            raise PolicyError("the policy returned a log-prob that is not a finite number <= 0")
        if gen.finish_reason is FinishReason.STOP and not self.renderer.is_stop(gen.token_ids[-1]):
            raise PolicyError(
                f"the policy stopped on token {gen.token_ids[-1]}, which is not one of the renderer's stop "
                f"tokens {self.renderer.stop_token_ids}; give both the same stop_token_ids"
            )
        return gen

    # ------------------------------------------------------------------------------------------
    async def finish(
        self,
        sid: str,
        reward: float,
        info: Mapping[str, Any] | None = None,
        *,
        wait: bool = True,
        error: tuple[str, str] | None = None,
        keep: bool = False,
    ) -> tuple[Trajectory, ...]:
        """Close session ``sid`` with ``reward``: build its trajectories, store and return them.

        ``info``'s ``task_id`` and ``group_id`` (strings) set those meta fields; the rest goes to
        ``meta.extra``. With ``wait=False`` (HTTP) a request still in flight is a 409; otherwise it is
        waited for. ``error`` (kind, message) is recorded as an episode failure that is the model's business
        (not infrastructure). With ``keep`` (a finish over HTTP) the trajectories are also kept for
        :meth:`take_result`.
        """
        if not (isinstance(reward, int | float) and not isinstance(reward, bool) and math.isfinite(reward)):
            raise GatewayError(400, f"the reward must be a finite number, got {reward!r}", param="reward")
        s = self._session(sid, create=False)
        _refuse_in_flight(s, wait)
        async with s.lock:
            if error is not None:
                s.errors.append(EpisodeFailure(error[0], error[1], s.turns, False))
            trajs = await self._close(s, float(reward), dict(info or {}))
        if keep:
            self._results[sid] = trajs
        return trajs

    async def abort(
        self, sid: str, kind: str, message: str, stop: StopReason = StopReason.ENV_ERROR
    ) -> tuple[Trajectory, ...]:
        """Close session ``sid`` as an infrastructure failure (recorded, never trained on)."""
        s = self._session(sid, create=False)
        async with s.lock:
            s.fail(kind, message, stop)
            return await self._close(s, 0.0, {})

    def limit_reached(self, sid: str) -> StopReason | None:
        """``MAX_TURNS`` or ``MAX_TOKENS`` when session ``sid``'s requests are being refused for a limit."""
        s = self.sessions.get(sid)
        seg = s.current if s is not None else None
        if seg is not None and seg.closed in (StopReason.MAX_TURNS, StopReason.MAX_TOKENS):
            return seg.closed
        return None

    def finished(self, sid: str) -> bool:
        """True once session ``sid`` is finished (by anyone), while :attr:`ended` remembers it."""
        return sid in self.ended or sid in self._awaiting

    @contextlib.contextmanager
    def busy(self, sid: str) -> Iterator[None]:
        """Hold open session ``sid`` as not idle while a request of it is handled (the HTTP layer holds it
        from the request's arrival, so time spent waiting for the event loop or the policy in a saturated
        gateway is not idle time); its idle time restarts when the request is done."""
        held = sid in self.sessions
        if held:
            self._busy[sid] = self._busy.get(sid, 0) + 1
        try:
            yield
        finally:
            if held and sid in self._busy:
                if (n := self._busy.pop(sid) - 1) > 0:
                    self._busy[sid] = n
                if sid in self._seen:
                    self._seen[sid] = time.monotonic()

    def take_result(self, sid: str) -> tuple[Trajectory, ...]:
        """The trajectories of a session the agent finished over HTTP (handed out once)."""
        return self._results.pop(sid, ())

    async def _close(self, s: Session, reward: float, info: dict[str, Any]) -> tuple[Trajectory, ...]:
        if self.finished(s.id):
            raise GatewayError(409, f"session {s.id!r} is already finished", code="session_finished")
        trajs = await self._record(s, reward, info)
        self._forget(s.id)
        return trajs

    def _forget(self, sid: str) -> None:
        """Session ``sid`` takes no more requests (it was recorded, or it awaits its reward)."""
        self._ended(sid, "finished")
        for held in (self.sessions, self._apis, self._seen, self._busy, self.stored):
            held.pop(sid, None)

    def _ended(self, sid: str, why: Why, timeout: float = 0.0) -> None:
        """Remember how ``sid`` ended; what :attr:`ended` forgets, an unclaimed result goes with."""
        for gone in self.ended.mark(sid, why, timeout=timeout):
            self._results.pop(gone, None)

    async def _record(self, s: Session, reward: float, info: dict[str, Any]) -> tuple[Trajectory, ...]:
        """Build session ``s``'s trajectories with ``reward``, store them and hand them to ``on_session``.
        Writes first: a failed write raises before anything else changes (the caller keeps the session)."""
        info = dict(info)
        task_id, group_id = info.pop("task_id", None), info.pop("group_id", None)
        if isinstance(task_id, str) and task_id:
            s.meta = dataclasses.replace(s.meta, task_id=task_id)
        if isinstance(group_id, str) and group_id:
            s.meta = dataclasses.replace(s.meta, group_id=group_id)
        trajs = tuple(s.build(reward, extra=info))
        if self.store is not None:
            for t in trajs:
                await self.store.append(t)
        if self.on_session is not None:
            self.on_session(trajs)
        return trajs

    # -- rewards posted after the session ------------------------------------------------------------
    async def end(self, sid: str, info: Mapping[str, Any] | None = None, *, wait: bool = True) -> float:
        """End session ``sid`` without its reward: it takes no more requests, and :meth:`reward` may post
        the reward within ``reward_deadline`` seconds (returned). ``wait`` as in :meth:`finish`."""
        if self.reward_deadline is None:
            raise GatewayError(
                400,
                "'reward' is required: this gateway records a session when it finishes (start it with "
                "--reward-deadline SECONDS to post rewards after the session)",
                param="reward",
            )
        s = self._session(sid, create=False)
        _refuse_in_flight(s, wait)
        async with s.lock:
            if self.finished(sid):
                raise self._finished_error(sid)
            self._forget(sid)
            deadline = time.monotonic() + self.reward_deadline
            self._awaiting[sid] = Awaiting(s, dict(info or {}), deadline)
        return self.reward_deadline

    def awaiting_reward(self, sid: str) -> bool:
        """True while session ``sid`` has ended and waits for its reward."""
        return sid in self._awaiting

    async def reward(
        self, sid: str, reward: float, info: Mapping[str, Any] | None = None, *, keep: bool = False
    ) -> tuple[Trajectory, ...]:
        """Post the reward of session ``sid`` and record it: a session that ended without its reward
        (before its deadline; ``info`` is merged over the one given when it ended), or one still open (as
        :meth:`finish` without waiting). ``keep`` as in :meth:`finish`."""
        if not (isinstance(reward, int | float) and not isinstance(reward, bool) and math.isfinite(reward)):
            raise GatewayError(400, f"the reward must be a finite number, got {reward!r}", param="reward")
        _check_id(sid)
        waiting = self._awaiting.pop(sid, None)
        if waiting is None:
            ended = self.ended.get(sid)
            if ended is not None and ended.why == "unrewarded":
                raise GatewayError(
                    409,
                    f"session {sid!r} was recorded as never rewarded: its reward deadline "
                    f"({self.reward_deadline:g} s after it ended) passed",
                    code="reward_deadline_passed",
                )
            return await self.finish(sid, reward, info, wait=False, keep=keep)
        try:
            trajs = await self._record(waiting.session, float(reward), {**waiting.info, **dict(info or {})})
        except BaseException:
            self._awaiting[sid] = waiting  # a failed write: the reward may be posted again
            raise
        self._ended(sid, "finished")  # kept from now: the session was recorded now
        if keep:
            self._results[sid] = trajs
        return trajs

    async def expire_rewards(self, *, now: float | None = None, why: str | None = None) -> list[str]:
        """Record every ended session whose reward deadline passed (all of them with ``why``: the gateway
        stops) as never rewarded: an infrastructure failure of kind :data:`REWARD_MISSING`, never trained
        on, never scored 0. Returns their ids."""
        now = time.monotonic() if now is None else now
        for gone in self.ended.prune(now):  # the reaper's tick: forget what ran out of time
            self._results.pop(gone, None)
        late = []
        for sid, w in list(self._awaiting.items()):
            if why is None and now < w.deadline:
                continue
            message = why or (
                f"no reward was posted within {self.reward_deadline:g} s after the session ended "
                "(--reward-deadline)"
            )
            s = w.session
            del self._awaiting[sid]
            s.errors.append(EpisodeFailure(REWARD_MISSING, message, -1, True))
            try:
                await self._record(s, 0.0, w.info)
            except BaseException:
                s.errors.pop()
                self._awaiting[sid] = w  # a failed write: try again later
                raise
            self._ended(sid, "unrewarded")
            late.append(sid)
        return late

    async def expire_idle(self, timeout: float, *, now: float | None = None) -> list[str]:
        """Close every open session without a request for more than ``timeout`` seconds; return their ids.

        A session that sampled something is recorded as cancelled (an infrastructure failure: never
        trained on, never scored 0); one that did not is dropped. A session with a request in flight or
        held by :meth:`busy` is not idle. Later requests to an expired session get ``session_expired``.
        """
        now = time.monotonic() if now is None else now
        expired = []
        for sid, s in list(self.sessions.items()):
            idle = now - self._seen.get(sid, now)
            if idle <= timeout or s.lock.locked() or sid in self._busy:
                continue
            if s.turns or s.candidates:
                await self.abort(
                    sid,
                    "Cancelled",
                    f"the session expired: no request for {idle:.1f} s (--session-timeout {timeout:g})",
                    StopReason.CANCELLED,
                )
            else:
                self._forget(sid)
            self._ended(sid, "expired", timeout)
            expired.append(sid)
        return expired

    async def close(self) -> int:
        """Record every open session that sampled something as cancelled (infra), and every session awaiting
        its reward as never rewarded; return how many were recorded."""
        n = len(await self.expire_rewards(why="the gateway stopped before the reward was posted"))
        for sid, s in list(self.sessions.items()):
            if s.turns or s.candidates:
                await self.abort(
                    sid, "Cancelled", "the gateway stopped before the session finished", StopReason.CANCELLED
                )
                n += 1
            else:
                self.sessions.pop(sid, None)
                self._apis.pop(sid, None)
        return n


def _refuse_in_flight(s: Session, wait: bool) -> None:
    if not wait and s.lock.locked():
        raise GatewayError(
            409, f"session {s.id!r} has a request in flight; finish it afterwards", code="concurrent_request"
        )


def _check_id(sid: str) -> None:
    if not _SESSION_ID.match(sid):
        raise GatewayError(
            400,
            f"session id {sid[:140]!r} must be 1-128 characters of A-Z a-z 0-9 . _ : -",
            code="bad_session_id",
        )
