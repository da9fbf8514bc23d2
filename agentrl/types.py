"""Frozen records that move between pipeline stages: messages, tool calls, and the Trajectory.

Shape suffixes used across agentrl: ``_B`` batch rows, ``_G`` group members, ``_T`` token positions,
``_V`` vocabulary. A name like ``logprobs_B_T`` is a [B, T] tensor.

A :class:`Trajectory` is the single source of truth for training, replay and viewing. Its token view is
exact: ``token_ids`` are what the tokenizer produced for prompts and observations and what the policy
*sampled* for its turns (never re-tokenized). Three aligned per-token columns go with them:

* ``loss_mask``: 1 only for tokens the policy sampled; 0 for prompt, tool output and template-inserted tokens;
* ``logprobs``: the sampler's log-probability for every sampled token, ``None`` elsewhere;
* provenance, as contiguous :class:`Segment` runs saying where each token came from.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from agentrl.errors import ConfigError, FormatError
from agentrl.provenance import Provenance
from agentrl.reward_records import RewardTerm
from agentrl.tokenizer_id import TokenizerInfo
from agentrl.tool_records import ToolRecord, ToolStatus

__all__ = [
    "TOKEN_LIMIT_STOPS",
    "Action",
    "EpisodeFailure",
    "Message",
    "Provenance",
    "Segment",
    "StopReason",
    "TokenSource",
    "ToolCall",
    "ToolRecord",
    "ToolStatus",
    "Trajectory",
    "TrajectoryMeta",
]

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call in the OpenAI chat format (``type`` is always ``"function"``)."""

    id: str
    """Call id; the tool's reply carries it as ``tool_call_id``."""
    name: str
    """The function name the model asked for."""
    arguments: str
    """The arguments as the JSON string the model wrote (kept verbatim, even when it is not valid JSON)."""

    def to_dict(self) -> dict[str, Any]:
        """OpenAI wire format."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ToolCall:
        """Parse the OpenAI wire format."""
        try:
            fn = d["function"]
            return cls(id=str(d["id"]), name=str(fn["name"]), arguments=str(fn["arguments"]))
        except (KeyError, TypeError) as e:
            raise FormatError(f"a tool call needs id and function.name/arguments, got {d!r}") from e


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message in the OpenAI format."""

    role: str
    """One of ``system``, ``user``, ``assistant``, ``tool``."""
    content: str
    """The text content."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Tool calls made by an assistant message."""
    tool_call_id: str | None = None
    """For ``tool`` messages: the id of the call this answers."""
    name: str | None = None
    """For ``tool`` messages: the tool's name."""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ConfigError(f"message role must be one of {ROLES}, got {self.role!r}")
        if not isinstance(self.content, str):
            raise ConfigError(f"message content must be a str, got {type(self.content).__name__}")
        if self.tool_calls and self.role != "assistant":
            raise ConfigError(f"only assistant messages carry tool_calls (role={self.role!r})")

    def to_dict(self) -> dict[str, Any]:
        """OpenAI wire format (keys with no value are left out)."""
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            d["name"] = self.name
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Message:
        """Parse the OpenAI wire format."""
        if not isinstance(d, Mapping) or "role" not in d:
            raise FormatError(f"a message needs at least a role, got {d!r}")
        content = d.get("content")
        calls = d.get("tool_calls") or ()
        if not isinstance(calls, Sequence) or isinstance(calls, str):
            raise FormatError(f"a message's tool_calls must be a list, got {calls!r}")
        try:
            return cls(
                role=str(d["role"]),
                content="" if content is None else content,
                tool_calls=tuple(ToolCall.from_dict(c) for c in calls),
                tool_call_id=d.get("tool_call_id"),
                name=d.get("name"),
            )
        except ConfigError as e:  # the constructor's checks, reported as what they are here: bad data
            raise FormatError(str(e)) from e


@dataclass(frozen=True, slots=True)
class Action:
    """The model's turn, as handed to :meth:`agentrl.Env.step`."""

    text: str
    """The decoded text of the sampled tokens (without the end-of-turn token)."""
    token_ids: tuple[int, ...] = ()
    """The sampled token ids, for environments that want them (most only read ``text``)."""


class TokenSource(StrEnum):
    """Where a token came from. Only ``MODEL`` tokens are trained on."""

    PROMPT = "prompt"
    """The initial prompt (system, user, few-shot turns) as rendered by the chat template."""
    MODEL = "model"
    """Sampled by the policy."""
    OBSERVATION = "observation"
    """Rendered from environment/tool messages after a model turn."""
    TEMPLATE = "template"
    """Inserted by the chat template around turns but never sampled (e.g. a newline after end-of-turn)."""


@dataclass(frozen=True, slots=True)
class Segment:
    """A contiguous run ``[start, end)`` of tokens sharing one source, turn and message."""

    source: TokenSource
    """Where these tokens came from."""
    start: int
    """First token index (inclusive)."""
    end: int
    """Last token index (exclusive)."""
    turn: int
    """Model turn this run belongs to: -1 for the initial prompt, k for model turn k and what follows it."""
    message_index: int | None = None
    """Index into ``Trajectory.messages`` of the message these tokens render, if any."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON object stored in ``trajectories.jsonl``."""
        return {
            "source": self.source.value,
            "start": self.start,
            "end": self.end,
            "turn": self.turn,
            "message_index": self.message_index,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Segment:
        """Parse :meth:`to_dict`'s output (as read back from JSON)."""
        mi = d.get("message_index")
        return cls(
            source=TokenSource(d["source"]),
            start=int(d["start"]),
            end=int(d["end"]),
            turn=int(d["turn"]),
            message_index=None if mi is None else int(mi),
        )


class StopReason(StrEnum):
    """Why an episode ended. ``terminated``/``truncated`` say *how*; this says *why*."""

    TERMINATED = "terminated"
    """The environment ended the task (answered, solved, failed for good). ``terminated=True``."""
    MAX_TURNS = "max_turns"
    """The turn limit was hit. ``truncated=True``."""
    MAX_TOKENS = "max_tokens"
    """The total token budget (context) was hit. ``truncated=True``."""
    TURN_TOKENS = "turn_tokens"
    """A single model turn hit its token limit without ending. ``truncated=True``."""
    ENV_TRUNCATED = "env_truncated"
    """The environment itself reported a truncation (its own limit). ``truncated=True``."""
    TEMPLATE_MISMATCH = "template_mismatch"
    """The chat template was not append-only and the rollout was configured to stop. ``truncated=True``."""
    ENV_ERROR = "env_error"
    """The environment raised. Recorded; ``infra_failure`` is set."""
    POLICY_ERROR = "policy_error"
    """Generation failed. Recorded; ``infra_failure`` is set."""
    SANDBOX_ERROR = "sandbox_error"
    """The sandbox failed under a tool call. Recorded; ``infra_failure`` is set."""
    CANCELLED = "cancelled"
    """The rollout was cancelled (shutdown). ``infra_failure`` is set."""
    JUDGE_ERROR = "judge_error"
    """A reward judge failed (:class:`~agentrl.errors.JudgeError`). Recorded; ``infra_failure`` is set."""
    DEADLINE = "deadline"
    """The episode's wall-clock deadline (``RolloutConfig.episode_timeout``) passed: the generation or env
    step in progress was cancelled. ``truncated=True``; during ``reset`` (no prompt yet) ``infra_failure`` is
    set instead."""
    COMPACTED = "compacted"
    """The context was replaced (the env compacted it, or the policy wrote the summary the env asked for):
    this sample ends here and the episode goes on in the next sample (``meta.sample_index + 1``). Neither
    ``terminated`` nor ``truncated``."""

    @property
    def is_infra(self) -> bool:
        """True for stop reasons that make the episode unusable for training."""
        return self in _INFRA_STOPS

    @property
    def is_token_limit(self) -> bool:
        """True when a token limit, not the model or the env, ended the episode (``TOKEN_LIMIT_STOPS``)."""
        return self in TOKEN_LIMIT_STOPS


_INFRA_STOPS = frozenset(
    {
        StopReason.ENV_ERROR,
        StopReason.POLICY_ERROR,
        StopReason.SANDBOX_ERROR,
        StopReason.CANCELLED,
        StopReason.JUDGE_ERROR,
    }
)

TOKEN_LIMIT_STOPS = frozenset({StopReason.TURN_TOKENS, StopReason.MAX_TOKENS})
"""Stop reasons that mean a token limit ended the episode: a turn cut mid-way (``--rollout.max-new-tokens``)
or the whole budget spent (``--rollout.max-total-tokens``). The one home of this set: the audit, the step's
metrics and warning, and ``agentrl eval`` all read it."""


@dataclass(frozen=True, slots=True)
class EpisodeFailure:
    """An error that happened during an episode, kept as data on the trajectory."""

    kind: str
    """Exception class name (or a short tag such as ``template_mismatch``)."""
    message: str
    """What went wrong."""
    turn: int
    """Model turn during which it happened (-1: during reset)."""
    infra: bool
    """True when the machinery failed (the episode must not be trained on)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON object stored in ``trajectories.jsonl``."""
        return {"kind": self.kind, "message": self.message, "turn": self.turn, "infra": self.infra}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EpisodeFailure:
        """Parse :meth:`to_dict`'s output (as read back from JSON)."""
        return cls(str(d["kind"]), str(d["message"]), int(d["turn"]), bool(d["infra"]))


JSONScalar = str | int | float | bool | None

_LEGACY_VERSION_KEYS = ("turn_versions", "policy_version_max")
"""``meta.extra`` keys of files written before :attr:`Trajectory.policy_versions` was the one record."""


@dataclass(frozen=True, slots=True)
class TrajectoryMeta:
    """Identity of an episode: what produced it and how to reproduce it."""

    env_id: str = ""
    """Registered id of the environment."""
    seed: int | None = None
    """Seed passed to ``reset``."""
    task_id: str = ""
    """Identifier of the task/problem (shared by the members of a group)."""
    group_id: str = ""
    """Group this episode belongs to for credit assignment (same task, same policy version)."""
    policy_version: int = 0
    """The oldest weights version that sampled a turn of this episode (= ``min(policy_versions)`` of the
    trajectory; the version served when it started if it has no model turn)."""
    step: int | None = None
    """Training step during which the episode was collected (None outside training)."""
    episode_id: str = ""
    """Unique id of this episode (shared by all its samples)."""
    sample_index: int = 0
    """Position of this trajectory among its episode's samples, in sampling order (0-based)."""
    num_samples: int = 1
    """How many samples (token sequences, each in its own context) the episode produced: more than one
    when it compacted its context or ran sub-agents. Its return is the sum over its samples."""
    extra: Mapping[str, JSONScalar] = field(default_factory=dict)
    """Small scalar annotations (difficulty, split, answer) — JSON scalars only."""
    provenance: Provenance | None = None
    """Where a distributed (Ray) episode ran: worker, server, node, sandbox pool. None in one process."""

    def __post_init__(self) -> None:
        if not 0 <= self.sample_index < self.num_samples:
            raise ConfigError(
                f"sample_index {self.sample_index} is outside 0..num_samples-1 ({self.num_samples})"
            )

    @property
    def is_last_sample(self) -> bool:
        """Whether this is the episode's last sample (the only one for a one-context episode)."""
        return self.sample_index == self.num_samples - 1

    def to_dict(self) -> dict[str, Any]:
        """The JSON object stored in ``trajectories.jsonl``."""
        return (
            {
                "env_id": self.env_id,
                "seed": self.seed,
                "task_id": self.task_id,
                "group_id": self.group_id,
                "policy_version": self.policy_version,
                "step": self.step,
                "episode_id": self.episode_id,
                "extra": dict(self.extra),
            }
            | ({"provenance": self.provenance.to_dict()} if self.provenance is not None else {})
            | (
                {"sample_index": self.sample_index, "num_samples": self.num_samples}
                if self.num_samples != 1
                else {}
            )
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrajectoryMeta:
        """Parse :meth:`to_dict`'s output (as read back from JSON). Older Ray files kept the provenance as
        strings in ``extra``: they are lifted into :attr:`provenance`."""
        extra = dict(d.get("extra") or {})
        prov = d.get("provenance")
        return cls(
            env_id=str(d.get("env_id", "")),
            seed=d.get("seed"),
            task_id=str(d.get("task_id", "")),
            group_id=str(d.get("group_id", "")),
            policy_version=int(d.get("policy_version", 0)),
            step=d.get("step"),
            episode_id=str(d.get("episode_id", "")),
            sample_index=int(d.get("sample_index", 0)),
            num_samples=int(d.get("num_samples", 1)),
            provenance=Provenance.from_dict(prov) if prov else Provenance.pop_legacy(extra),
            extra=extra,
        )


@dataclass(frozen=True, slots=True)
class Trajectory:
    """One whole episode: exact tokens, loss mask, sampler log-probs, provenance, messages and tool calls.

    Invariants (checked by :meth:`validate`, and in depth by the token audit in ``agentrl.audit``):
    ``token_ids``, ``loss_mask`` and ``logprobs`` have the same length; ``logprobs[i]`` is a finite float
    exactly where ``loss_mask[i] == 1`` and ``None`` elsewhere; segments tile ``[0, len)`` in order and
    ``loss_mask`` is 1 exactly on ``MODEL`` segments.
    """

    token_ids: tuple[int, ...]
    """Every token of the episode in order: prompt, model turns, observations, template separators."""
    loss_mask: tuple[int, ...]
    """1 for tokens the policy sampled, 0 for everything else."""
    logprobs: tuple[float | None, ...]
    """Sampler log-prob of each sampled token; ``None`` where ``loss_mask`` is 0."""
    segments: tuple[Segment, ...]
    """Provenance: contiguous runs tiling the token sequence."""
    messages: tuple[Message, ...]
    """The conversation in OpenAI format: prompt messages, assistant turns (with parsed tool calls), tool
    and environment replies."""
    tool_calls: tuple[ToolRecord, ...] = ()
    """Every tool call of the episode with input, output, status and duration."""
    actions: tuple[str, ...] = ()
    """The exact text of each model turn as handed to ``Env.step`` (replay feeds these back)."""
    rewards: tuple[float, ...] = ()
    """Reward returned by each ``step`` (one per model turn)."""
    terminated: bool = False
    """The environment ended the task (Gymnasium semantics)."""
    truncated: bool = False
    """A limit cut the episode short (Gymnasium semantics)."""
    stop_reason: StopReason = StopReason.TERMINATED
    """Why the episode ended."""
    errors: tuple[EpisodeFailure, ...] = ()
    """Failures recorded during the episode."""
    meta: TrajectoryMeta = field(default_factory=TrajectoryMeta)
    """Identity and provenance of the episode."""
    timings: Mapping[str, float] = field(default_factory=dict)
    """Seconds spent per phase (``generate``, ``env``, ``tools``, ``total``)."""
    tokenizer: TokenizerInfo | None = None
    """The tokenizer the token ids belong to (None in records from before it was recorded)."""
    policy_versions: tuple[int, ...] = ()
    """The weights version that sampled each model turn (one per ``MODEL`` segment, in order): every sampled
    token carries the version of its turn. The one record of it (older files kept a spanning episode's list
    in ``meta.extra["turn_versions"]``, read back into this field); empty only in old records whose turns
    all have ``meta.policy_version``."""
    reward_terms: tuple[RewardTerm, ...] = ()
    """The graded terms behind ``rewards`` (each with its turn and judge calls), when the env reported
    them (:attr:`agentrl.env.StepResult.reward_terms`); stored only when there are any."""

    # ----------------------------------------------------------------------------------------------
    @property
    def reward(self) -> float:
        """Total episode reward (sum of per-step rewards)."""
        return float(math.fsum(self.rewards))

    @property
    def min_policy_version(self) -> int:
        """The oldest weights version among the model turns (``meta.policy_version`` if none recorded)."""
        return min(self.policy_versions, default=self.meta.policy_version)

    @property
    def max_policy_version(self) -> int:
        """The newest weights version among the model turns (``meta.policy_version`` if none recorded)."""
        return max(self.policy_versions, default=self.meta.policy_version)

    @property
    def infra_failure(self) -> bool:
        """True when the machinery failed during the episode; such episodes must not be trained on."""
        return self.stop_reason.is_infra or any(e.infra for e in self.errors)

    @property
    def num_model_tokens(self) -> int:
        """Tokens the policy sampled (the response length; tool tokens are not counted)."""
        return sum(self.loss_mask)

    @property
    def num_turns(self) -> int:
        """Number of model turns."""
        return sum(1 for s in self.segments if s.source is TokenSource.MODEL)

    def sources(self) -> list[TokenSource]:
        """Per-token provenance, expanded from the segments."""
        out: list[TokenSource] = []
        for s in self.segments:
            out.extend([s.source] * (s.end - s.start))
        return out

    def validate(self) -> None:
        """Check the cheap structural invariants; raise :class:`agentrl.errors.AuditError` if broken."""
        from agentrl.errors import AuditError

        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise AuditError(
                f"length mismatch: {n} token ids, {len(self.loss_mask)} mask entries, "
                f"{len(self.logprobs)} log-probs"
            )
        pos = 0
        for k, s in enumerate(self.segments):
            if s.start != pos or s.end < s.start:
                raise AuditError(f"segment {k} covers [{s.start}, {s.end}) but the next token is {pos}")
            want = 1 if s.source is TokenSource.MODEL else 0
            for i in range(s.start, s.end):
                if self.loss_mask[i] != want:
                    raise AuditError(
                        f"token {i} ({s.source.value} segment {k}) has loss_mask {self.loss_mask[i]}"
                    )
                lp = self.logprobs[i]
                if want and (lp is None or not math.isfinite(lp) or lp > 1e-6):
                    raise AuditError(f"token {i} is sampled but its log-prob is {lp!r}")
                if not want and lp is not None:
                    raise AuditError(f"token {i} ({s.source.value}) is not sampled but has a log-prob")
            pos = s.end
        if pos != n:
            raise AuditError(f"segments cover {pos} of {n} tokens")
        if self.policy_versions and len(self.policy_versions) != self.num_turns:
            raise AuditError(
                f"{len(self.policy_versions)} policy versions recorded for {self.num_turns} model turns"
            )
        if self.policy_versions and self.meta.policy_version != min(self.policy_versions):
            raise AuditError(
                f"meta.policy_version is {self.meta.policy_version}, but the oldest turn's version is "
                f"{min(self.policy_versions)}"
            )

    # ----------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the store adds ``schema_version``)."""
        return {
            "token_ids": list(self.token_ids),
            "loss_mask": list(self.loss_mask),
            "logprobs": list(self.logprobs),
            "segments": [s.to_dict() for s in self.segments],
            "messages": [m.to_dict() for m in self.messages],
            "tool_calls": [t.to_dict() for t in self.tool_calls],
            "actions": list(self.actions),
            "reward": self.reward,
            "rewards": list(self.rewards),
            "group_id": self.meta.group_id,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "stop_reason": self.stop_reason.value,
            "infra_failure": self.infra_failure,
            "errors": [e.to_dict() for e in self.errors],
            "meta": self.meta.to_dict(),
            "timings": dict(self.timings),
            "policy_versions": list(self.policy_versions),
        } | (
            ({"tokenizer": self.tokenizer.to_dict()} if self.tokenizer is not None else {})
            | ({"reward_terms": [t.to_dict() for t in self.reward_terms]} if self.reward_terms else {})
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Trajectory:
        """Inverse of :meth:`to_dict`; reads older files' ``meta.extra`` version keys too."""
        meta = TrajectoryMeta.from_dict(d.get("meta") or {"group_id": d.get("group_id", "")})
        versions = tuple(int(v) for v in d.get("policy_versions") or ())
        legacy = meta.extra.get("turn_versions")
        if not versions and isinstance(legacy, str) and legacy:  # before the typed field: "3,3,4"
            versions = tuple(int(v) for v in legacy.split(","))
        if isinstance(legacy, str):  # the typed field holds it now (and policy_version_max with it)
            extra = {k: v for k, v in meta.extra.items() if k not in _LEGACY_VERSION_KEYS}
            meta = dataclasses.replace(meta, extra=extra)
        return cls(
            token_ids=tuple(int(t) for t in d["token_ids"]),
            loss_mask=tuple(int(m) for m in d["loss_mask"]),
            logprobs=tuple(None if lp is None else float(lp) for lp in d["logprobs"]),
            segments=tuple(Segment.from_dict(s) for s in d["segments"]),
            messages=tuple(Message.from_dict(m) for m in d["messages"]),
            tool_calls=tuple(ToolRecord.from_dict(t) for t in d.get("tool_calls", ())),
            actions=tuple(str(a) for a in d.get("actions", ())),
            rewards=tuple(float(r) for r in d.get("rewards", (d.get("reward", 0.0),))),
            terminated=bool(d["terminated"]),
            truncated=bool(d["truncated"]),
            stop_reason=StopReason(d.get("stop_reason", StopReason.TERMINATED.value)),
            errors=tuple(EpisodeFailure.from_dict(e) for e in d.get("errors", ())),
            meta=meta,
            timings={str(k): float(v) for k, v in (d.get("timings") or {}).items()},
            tokenizer=TokenizerInfo.from_dict(d["tokenizer"]) if d.get("tokenizer") else None,
            policy_versions=versions,
            reward_terms=tuple(RewardTerm.from_dict(t) for t in d.get("reward_terms") or ()),
        )

    def to_json(self) -> str:
        """One compact JSON line."""
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)


def messages_from(seq: Sequence[Message | Mapping[str, Any]]) -> tuple[Message, ...]:
    """Accept messages as :class:`Message` or OpenAI dicts."""
    return tuple(m if isinstance(m, Message) else Message.from_dict(m) for m in seq)
