"""One gateway session: the agent's requests turned into an exact, append-only token stream.

A native rollout owns the conversation; behind the gateway the *agent* owns it and resends all of it with
every request. The session keeps the token stream the policy actually saw and extends it only when the new
request extends the previous one:

1. The first request is rendered with the chat template (:meth:`ChatRenderer.render_prompt`): ``PROMPT``.
2. The policy samples a turn from those ids. The ids and log-probs are kept as sampled (a *candidate*);
   the agent gets the parsed message (``content`` + ``tool_calls``).
3. The next request must repeat the previous messages, then the assistant message the agent received (its
   tool-call arguments may be re-serialized: they compare as JSON), then new ``tool``/``user``/``system``
   messages. The candidate becomes a ``MODEL`` piece, and only the new messages are rendered, as a delta
   (:meth:`ChatRenderer.render_delta`: the template's separator and generation prompt are ``TEMPLATE``, the
   messages ``OBSERVATION``). The template renders the model's turn with its *sampled* text, never with the
   parsed message (pitfall §15.2).
4. The same request sent again (a client retry, or another sample) samples a new candidate from the same
   ids; the agent's next request says which one it kept (the latest, when it does not say).

Anything else is a history rewrite: earlier messages dropped, edited or reordered, the tools changed, an
assistant message the model did not sample, a conversation that goes on after a turn cut by ``max_tokens``,
or a template that is not append-only for this conversation. The stream so far ends there (its last turn is
the latest candidate) and, with ``on_rewrite="split"``, the request starts a new segment, rendered afresh
as a prompt (never re-tokenized into the old one); with ``"non_trainable"`` the same happens but every
trajectory of the session is marked unusable for training. :meth:`Session.build` turns each segment with at
least one model turn into a :class:`~agentrl.types.Trajectory` built by
:func:`agentrl.masking.build_trajectory`, exactly as a native episode is; the segments are the samples of one
episode (one ``episode_id``, ``sample_index`` in order, the session's reward on the last), as in
:mod:`agentrl.samples`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl.chat import ChatRenderer
from agentrl.errors import AuditError, ConfigError, TemplateError
from agentrl.masking import Piece, build_trajectory
from agentrl.protocols import Generation
from agentrl.samples import link_samples
from agentrl.tools import ToolCallParser, get_parser
from agentrl.types import (
    EpisodeFailure,
    Message,
    StopReason,
    ToolRecord,
    ToolStatus,
    Trajectory,
    TrajectoryMeta,
)

from .wire import ChatRequest, GatewayError, WireMessage

__all__ = ["SEGMENT_ENDS", "FinishKind", "GatewayConfig", "Session", "Turn"]

FinishKind = Literal["stop", "tool_calls", "length"]

SEGMENT_ENDS = {
    "finish": "the session's last segment: the agent finished (or the gateway closed) the session",
    "after_length_cut": "the agent went on after a turn cut by max_tokens (nothing was rewritten: a cut turn "
    "has no end-of-turn token, so the next messages cannot extend the stream)",
    "after_failed_request": "the agent went on without the model's turn, after a request that failed",
    "rewrite": "the agent rewrote its history (messages dropped, edited or reordered, the tools changed, an "
    "assistant message the model did not sample) or the template is not append-only here",
}
"""Values of a gateway trajectory's ``meta.extra["segment_end"]``: why its segment ended."""

_MAX_CANDIDATES = 8
"""Samples of one prompt kept while the agent has not said which it used (retries beyond this drop the
oldest)."""


@dataclass(frozen=True)
class GatewayConfig:
    """How the gateway renders, samples and records."""

    model_name: str = "agentrl-policy"
    """The model id that ``/v1/models`` lists and responses carry (any name is accepted in requests)."""
    parser: str = "hermes"
    """Tool-call parser that reads calls out of the model's text: hermes (``<tool_call>{json}</tool_call>``),
    python (each ```python block is a call to the tool named python), or a model family's format
    (llama3_json, mistral, qwen3_coder, deepseek_v3, harmony): any key of ``agentrl.tools.PARSERS``."""
    tool_prompt: Literal["auto", "template", "system"] = "auto"
    """How request tools reach the model: template (the chat template renders them), system (the parser's
    instructions are appended to the system message, as ToolEnv does), auto (template when it renders
    tools, else system)."""
    on_rewrite: Literal["split", "non_trainable"] = "split"
    """When an agent rewrites its history: split (the session goes on in a new trajectory segment; the
    segments are linked as the samples of one episode whose return is the session's reward) or
    non_trainable (recorded, never trained on)."""
    max_new_tokens: int = 512
    """Most tokens per model turn (a request's max_tokens may lower it)."""
    max_total_tokens: int = 4096
    """Most tokens in one segment's stream (prompt, turns, tool output); past it requests get a 400."""
    max_turns: int = 32
    """Most model turns per session; past it requests get a 400."""
    temperature: float | None = None
    """Fixed sampling temperature (training: the learner's). None: each request's own (default 1.0)."""
    audit: bool = True
    """Run the token audit on every trajectory; one that fails is recorded as unusable for training."""

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "max_total_tokens", "max_turns"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {v!r}")
        if self.tool_prompt not in ("auto", "template", "system"):
            raise ConfigError(f"--tool-prompt must be auto, template or system, got {self.tool_prompt!r}")
        if self.on_rewrite not in ("split", "non_trainable"):
            raise ConfigError(f"--on-rewrite must be split or non_trainable, got {self.on_rewrite!r}")
        if self.temperature is not None and not (0 < self.temperature <= 100):
            raise ConfigError(f"--temperature must be > 0, got {self.temperature!r}")
        get_parser(self.parser)  # fail early on an unknown name


@dataclass(frozen=True)
class _SchemaTool:
    """A request tool seen through the Tool protocol, for a parser's ``format_instructions``."""

    name: str
    schema: dict[str, Any]
    needs_sandbox = False

    async def __call__(self, arguments: Mapping[str, Any], context: Any) -> Any:
        raise ConfigError("tools behind the gateway are run by the agent, not by agentrl")


@dataclass(frozen=True, slots=True)
class Candidate:
    """A sampled turn the agent received but has not yet built on."""

    gen: Generation
    """The sampled ids and log-probs, as sampled."""
    text: str
    """The sampled text without its stop token."""
    message: Message
    """The assistant message returned (parsed content and tool calls)."""
    wire: WireMessage
    """Its normalized form, which the agent's next request must repeat."""
    turn: int
    """Model turn index in the session (tool-call ids are ``call_<turn>_<k>``)."""
    cut_by_budget: bool
    """Cut by the segment's token budget rather than the per-turn limit."""
    sent_at: float
    """When it was answered (``time.perf_counter``)."""


@dataclass
class _Segment:
    """One append-only token stream (mutable while the session runs)."""

    tools: tuple[Mapping[str, Any], ...]
    tools_key: str
    wire: list[WireMessage]
    history: list[Message]
    messages: list[Message]
    pieces: list[Piece]
    ids: list[int]
    prefix_text: str
    turns: int = 0
    actions: list[str] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    tool_records: list[ToolRecord] = field(default_factory=list)
    open_calls: dict[str, tuple[str, str, int, float]] = field(default_factory=dict)
    """Calls of this segment's turns awaiting a result: id -> (name, arguments, turn, answered at)."""
    errors: list[EpisodeFailure] = field(default_factory=list)
    closed: StopReason | None = None
    last: Candidate | None = None
    ended_by: str = "finish"
    """Why the segment ended: one of :data:`SEGMENT_ENDS`."""


class Session:
    """The recorder of one session (no I/O; :class:`~agentrl.trainers.gateway.GatewayCore` drives it)."""

    def __init__(
        self,
        session_id: str,
        renderer: ChatRenderer,
        config: GatewayConfig,
        *,
        meta: TrajectoryMeta | None = None,
        parser: ToolCallParser | None = None,
        tools_in_template: bool = False,
    ):
        self.id = session_id
        self.renderer = renderer
        self.config = config
        self.meta = meta or TrajectoryMeta()
        self.parser = parser or get_parser(config.parser)
        self.tools_in_template = tools_in_template
        self.segments: list[_Segment] = []
        self.candidates: list[Candidate] = []
        self.turns = 0
        """Model turns committed so far (all segments)."""
        self.sampled = 0
        """Turns sampled so far, retries included (numbers tool-call ids)."""
        self.retries = 0
        self.disconnects = 0
        self.rewrites: list[str] = []
        """Why each split happened."""
        self.errors: list[EpisodeFailure] = []
        """Failures of the whole session (policy errors, the agent's own failure)."""
        self.failure_stop: StopReason | None = None
        """The stop reason an infrastructure failure gives every trajectory of the session."""
        self._sampled: dict[WireMessage, Candidate] = {}
        self._known_calls: dict[str, str] = {}
        self.timings = {"generate": 0.0, "render": 0.0}
        self.lock = asyncio.Lock()
        """Held while a request or the finish of this session is being served (one at a time)."""
        self.t_start = time.perf_counter()

    @property
    def current(self) -> _Segment | None:
        """The segment being recorded (the last one), if any."""
        return self.segments[-1] if self.segments else None

    # ------------------------------------------------------------------------------------------
    def prepare(self, req: ChatRequest) -> tuple[int, ...]:
        """Bring the token stream up to the prompt of ``req`` and return the ids to sample from.

        Raises:
            GatewayError: a limit is reached (400, ``context_length_exceeded`` / ``max_turns_exceeded``) or
                the request cannot be rendered with the chat template (400).
        """
        t0 = time.perf_counter()
        try:
            ids = self._prepare(req)
        finally:
            self.timings["render"] += time.perf_counter() - t0
        seg = self.current
        assert seg is not None
        if self.turns >= self.config.max_turns:  # a new segment after a rewrite may start past the limit
            seg.closed = seg.closed or StopReason.MAX_TURNS
            raise self._closed_error(seg)
        if len(ids) >= self.config.max_total_tokens:
            seg.closed = seg.closed or StopReason.MAX_TOKENS
            raise self._context_error(len(ids))
        return ids

    def _prepare(self, req: ChatRequest) -> tuple[int, ...]:
        seg = self.current
        if seg is None:
            return self._start(req)
        if req.tools_key != seg.tools_key:
            return self._rewrite(req, "the request's tools differ from the session's earlier requests")
        n = len(seg.wire)
        if req.messages[:n] != tuple(seg.wire):
            if len(req.messages) < n:
                why = f"the request has {len(req.messages)} messages, fewer than the {n} sent before"
            else:
                i = next(k for k in range(n) if req.messages[k] != seg.wire[k])
                why = f"message {i} differs from the one sent before"
            return self._rewrite(req, why)
        if seg.closed is StopReason.TEMPLATE_MISMATCH:  # the template could not extend it: render afresh
            return self._rewrite(req, "the chat template could not extend the previous request")
        if seg.closed is not None:
            raise self._closed_error(seg)
        rest = req.messages[n:]
        if not rest:  # the same request again: a retry, or one more sample of the same prompt
            self.retries += bool(self.candidates)
            return tuple(seg.ids)
        if not self.candidates:
            return self._rewrite(
                req,
                "the conversation goes on without the model's turn (its request failed)",
                end="after_failed_request",
            )
        cand = next((c for c in reversed(self.candidates) if c.wire == rest[0]), None)
        if cand is None:
            return self._rewrite(req, f"message {n} is not the assistant message the model sampled")
        self._commit(seg, cand, rest[0])
        new = rest[1:]
        if any(m.role == "assistant" for m in new):
            return self._rewrite(req, "the request adds an assistant message the model did not sample")
        if not self.renderer.is_stop(cand.gen.token_ids[-1]):
            return self._rewrite(
                req, "the conversation goes on after a turn cut by max_tokens", end="after_length_cut"
            )
        if self.turns >= self.config.max_turns:  # like a native episode, the stream ends with the turn
            seg.closed = StopReason.MAX_TURNS
            raise self._closed_error(seg)
        render_new = [self._render_message(m) for m in new]
        try:
            delta = self.renderer.render_delta(
                seg.history,
                seg.ids[: len(seg.ids) - len(cand.gen.token_ids)],
                seg.prefix_text,
                cand.gen.token_ids,
                render_new,
                turn=seg.turns - 1,
                first_message_index=len(seg.messages),
                tools=seg.tools or None,
            )
        except TemplateError as e:
            seg.errors.append(EpisodeFailure("TemplateError", str(e), seg.turns - 1, False))
            seg.closed = StopReason.TEMPLATE_MISMATCH
            return self._rewrite(req, f"the chat template is not append-only here: {e}")
        if len(seg.ids) + len(delta.token_ids) >= self.config.max_total_tokens:
            seg.closed = StopReason.MAX_TOKENS
            raise self._context_error(len(seg.ids) + len(delta.token_ids))
        now = time.perf_counter()
        for m in new:
            opened = seg.open_calls.pop(m.tool_call_id or "", None) if m.role == "tool" else None
            if opened is not None:
                name, arguments, turn, sent = opened
                seg.tool_records.append(
                    ToolRecord(
                        m.tool_call_id or "",
                        name,
                        arguments,
                        m.content,
                        ToolStatus.OK,
                        now - sent,
                        turn,
                        detail="run by the agent; duration_s is the time from the model's answer to the "
                        "request that carried the result",
                    )
                )
        seg.history.append(Message("assistant", delta.assistant_text))
        seg.history.extend(render_new)
        seg.messages.extend(render_new)
        seg.wire.extend(new)
        seg.pieces.extend(delta.pieces)
        seg.ids.extend(delta.token_ids)
        seg.prefix_text = delta.text
        return tuple(seg.ids)

    def _render_message(self, m: WireMessage) -> Message:
        """A new message as the template renders it: a tool result answering one of the model's calls is
        wrapped by the parser (as ToolEnv wraps it) and named after the tool."""
        if m.role == "tool" and m.tool_call_id in self._known_calls:
            name = self._known_calls[m.tool_call_id]
            return Message(
                "tool",
                self.parser.format_output(name, m.content),
                tool_call_id=m.tool_call_id,
                name=m.name or name,
            )
        return m.to_message()

    def _start(self, req: ChatRequest) -> tuple[int, ...]:
        """A new segment: the whole request rendered as a prompt."""
        history: list[Message] = []
        messages: list[Message] = []
        for m in req.messages:
            known = self._sampled.get(m) if m.role == "assistant" else None
            if known is not None:  # a turn this session sampled: the template sees the sampled text
                history.append(Message("assistant", known.text))
                messages.append(known.message)
            else:
                r = self._render_message(m)
                history.append(r)
                messages.append(r)
        tools: tuple[Mapping[str, Any], ...] = ()
        if req.tools and self.tools_in_template:
            tools = req.tools
        elif req.tools:
            history, messages = (
                _with_instructions(history, self.parser, req.tools),
                _with_instructions(messages, self.parser, req.tools),
            )
        try:
            prompt = self.renderer.render_prompt(history, tools=tools or None)
        except TemplateError as e:
            raise GatewayError(
                400, f"the chat template cannot render this conversation: {e}", param="messages"
            ) from None
        self.segments.append(
            _Segment(
                tools=tools,
                tools_key=req.tools_key,
                wire=list(req.messages),
                history=history,
                messages=messages,
                pieces=list(prompt.pieces),
                ids=list(prompt.token_ids),
                prefix_text=prompt.text,
            )
        )
        self.candidates = []
        return prompt.token_ids

    def _rewrite(self, req: ChatRequest, why: str, *, end: str = "rewrite") -> tuple[int, ...]:
        """End the current segment (``segment_end`` = ``end``, see :data:`SEGMENT_ENDS`) and start a new one
        rendered afresh from ``req``."""
        seg = self.current
        assert seg is not None
        if self.candidates:  # the answer the agent got last ends the old stream
            self._commit(seg, self.candidates[-1], self.candidates[-1].wire)
        seg.ended_by = end
        self.rewrites.append(why)
        return self._start(req)

    def _commit(self, seg: _Segment, cand: Candidate, echo: WireMessage) -> None:
        """The candidate becomes the segment's next model turn."""
        seg.pieces.append(Piece.sampled(cand.gen.token_ids, cand.gen.logprobs, seg.turns, len(seg.messages)))
        seg.ids.extend(cand.gen.token_ids)
        seg.messages.append(cand.message)
        seg.wire.append(echo)
        seg.actions.append(cand.text)
        seg.versions.append(cand.gen.policy_version)
        for call in cand.message.tool_calls:
            seg.open_calls[call.id] = (call.name, call.arguments, seg.turns, cand.sent_at)
        seg.last = cand
        seg.turns += 1
        self.turns += 1
        self.candidates = []

    def _context_error(self, n: int) -> GatewayError:
        return GatewayError(
            400,
            f"this conversation needs {n} tokens; the gateway's context budget (max_total_tokens) is "
            f"{self.config.max_total_tokens}",
            param="messages",
            code="context_length_exceeded",
        )

    def _closed_error(self, seg: _Segment) -> GatewayError:
        if seg.closed is StopReason.MAX_TURNS:
            return GatewayError(
                400,
                f"this session reached the gateway's limit of {self.config.max_turns} model turns",
                code="max_turns_exceeded",
            )
        return self._context_error(len(seg.ids))

    # ------------------------------------------------------------------------------------------
    def accept(self, gen: Generation, req: ChatRequest, *, cut_by_budget: bool) -> Candidate:
        """Record a sampled turn as a candidate and return it (its message is the answer to send)."""
        text = self.renderer.assistant_text(gen.token_ids)
        turn = self.sampled
        self.sampled += 1
        calls: tuple[Any, ...] = ()
        content = text
        if req.tools and req.tool_choice == "auto":
            parsed = self.parser.parse(text, id_prefix=f"call_{turn}")
            calls = tuple(c for c in parsed.calls if parsed.error_for(c.id) is None)
            if calls:  # a turn whose calls are all malformed goes back as plain text
                content = parsed.content
        message = Message("assistant", content, tool_calls=calls)
        for c in calls:
            self._known_calls[c.id] = c.name
        wire = WireMessage.of(message)
        cand = Candidate(gen, text, message, wire, turn, cut_by_budget, time.perf_counter())
        self._sampled[wire] = cand
        self.candidates = [*self.candidates[-(_MAX_CANDIDATES - 1) :], cand]
        return cand

    def fail(self, kind: str, message: str, stop: StopReason) -> None:
        """Record an infrastructure failure: every trajectory of the session is marked unusable."""
        self.errors.append(EpisodeFailure(kind, message, self.turns, True))
        self.failure_stop = self.failure_stop or stop

    # ------------------------------------------------------------------------------------------
    def build(self, reward: float, *, extra: Mapping[str, Any] | None = None) -> list[Trajectory]:
        """The session's trajectories: one per segment with a model turn, linked as the samples of one
        episode (:func:`agentrl.samples.link_samples`); the last one ends with ``reward``, the earlier ones
        with 0 (the episode's return is the sum over its samples)."""
        seg = self.current
        if seg is not None and self.candidates:  # the final answer the agent received
            self._commit(seg, self.candidates[-1], self.candidates[-1].wire)
        segs = [s for s in self.segments if s.turns > 0]
        total = time.perf_counter() - self.t_start
        session_errors = list(self.errors)
        if self.rewrites and self.config.on_rewrite == "non_trainable":
            session_errors.append(
                EpisodeFailure(
                    "HistoryRewrite", f"the agent rewrote its history: {self.rewrites[0]}", -1, True
                )
            )
        base_extra: dict[str, Any] = {
            "source": "gateway",
            "session_id": self.id,
            "segments": len(segs),
            "retries": self.retries,
            "disconnects": self.disconnects,
            **dict(self.meta.extra),
            **dict(extra or {}),
        }
        if not segs:
            meta = dataclasses.replace(
                self.meta, episode_id=uuid.uuid4().hex, extra={**base_extra, "segment": 0}
            )
            empty = build_trajectory(
                (),
                messages=(),
                meta=meta,
                rewards=(reward,),
                stop_reason=StopReason.TERMINATED,
                terminated=True,
                truncated=False,
                errors=(
                    *session_errors,
                    EpisodeFailure("EmptySession", "the session made no model turn", -1, True),
                ),
                timings={**self.timings, "total": total},
            )
            return [empty]
        out = []
        for k, s in enumerate(segs):
            out.append(
                self._trajectory(
                    s,
                    k,
                    reward if k == len(segs) - 1 else 0.0,  # the return is the sum over the samples
                    session_errors,
                    {**base_extra, "segment": k, "segment_end": s.ended_by},
                    total,
                )
            )
        return list(link_samples(out))  # the segments are the samples of one episode, in order

    def _trajectory(
        self,
        seg: _Segment,
        k: int,
        reward: float,
        session_errors: Sequence[EpisodeFailure],
        extra: dict[str, Any],
        total: float,
    ) -> Trajectory:
        last = seg.last
        assert last is not None
        stop, terminated, truncated = StopReason.TERMINATED, True, False
        if seg.closed is not None:
            stop, terminated, truncated = seg.closed, False, True
        elif not self.renderer.is_stop(last.gen.token_ids[-1]):
            stop = StopReason.MAX_TOKENS if last.cut_by_budget else StopReason.TURN_TOKENS
            terminated, truncated = False, True
        errors = [*seg.errors, *session_errors]
        if self.failure_stop is not None:
            stop = self.failure_stop
        traj = build_trajectory(
            seg.pieces,
            messages=seg.messages,
            meta=dataclasses.replace(self.meta, episode_id=uuid.uuid4().hex, extra=extra),
            rewards=(0.0,) * (seg.turns - 1) + (reward,),
            stop_reason=stop,
            terminated=terminated,
            truncated=truncated,
            versions=seg.versions,  # each turn's own version: the weights may change mid-session
            tool_calls=seg.tool_records,
            actions=seg.actions,
            errors=errors,
            timings={**self.timings, "total": total},
            tokenizer=self.renderer.tokenizer_info,
        )
        if self.config.audit:
            from agentrl.audit import audit_trajectory

            try:
                audit_trajectory(traj, self.renderer)
            except AuditError as e:
                traj = dataclasses.replace(
                    traj, errors=(*traj.errors, EpisodeFailure("AuditError", str(e), -1, True))
                )
        return traj


def _with_instructions(
    messages: list[Message], parser: ToolCallParser, tools: Sequence[Mapping[str, Any]]
) -> list[Message]:
    """The parser's tool instructions after the system message's text (a system message is added when
    there is none), joined exactly as :class:`~agentrl.envs.ToolEnv` joins them."""
    schema_tools = [_SchemaTool(str(t["function"]["name"]), dict(t)) for t in tools]
    instructions = parser.format_instructions(schema_tools)
    if messages and messages[0].role == "system":
        first = messages[0]
        text = "\n\n".join(p for p in (first.content.strip(), instructions) if p)
        return [dataclasses.replace(first, content=text), *messages[1:]]
    return [Message("system", instructions), *messages]


@dataclass(frozen=True, slots=True)
class Turn:
    """One answered model turn, before any API shapes it into a response body."""

    message: Message
    """The assistant message (parsed content and tool calls)."""
    finish_reason: FinishKind
    """``stop`` (end of turn), ``tool_calls`` (end of turn with calls) or ``length`` (cut)."""
    prompt_tokens: int
    """The whole context the policy saw."""
    completion_tokens: int
    """Tokens sampled."""
