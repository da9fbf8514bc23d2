"""The one place where a trajectory's token columns are built, and the one function that builds trajectories.

Everything the rollout produces is a list of :class:`Piece` objects in conversation order: the rendered
prompt, each sampled turn (ids + the sampler's log-probs), template-inserted separators, and the rendered
observations. :func:`build_columns` concatenates them into ``token_ids``, ``loss_mask``, ``logprobs`` and
provenance ``segments``. The rule is simple and lives only here: a token is trained on (mask 1, log-prob
recorded) if and only if the policy sampled it (``TokenSource.MODEL``); every other token has mask 0 and
no log-prob. Keeping this in one function is what makes pitfall §15.8 (mask/log-prob drift after inserting
or removing boundary tokens) testable: there is no second code path that could disagree.

:func:`build_trajectory` turns the pieces and what else an episode recorded into the frozen
:class:`~agentrl.types.Trajectory`. The native episode (``agentrl.episode``), the gateway session and the
experiments' lockstep sampler all call it, so the per-turn policy versions and ``meta.policy_version`` are
set in one place.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from agentrl.errors import AuditError, ConfigError
from agentrl.tokenizer_id import TokenizerInfo
from agentrl.types import (
    EpisodeFailure,
    Message,
    Segment,
    StopReason,
    TokenSource,
    ToolRecord,
    Trajectory,
    TrajectoryMeta,
)

__all__ = ["Piece", "TokenColumns", "build_columns", "build_trajectory"]


@dataclass(frozen=True, slots=True)
class Piece:
    """A contiguous run of tokens from one source, in conversation order."""

    source: TokenSource
    """Where the tokens came from; only ``MODEL`` pieces are trained on."""
    token_ids: tuple[int, ...]
    """The ids, exactly as produced (sampled ids are never re-tokenized)."""
    turn: int
    """-1 for the initial prompt; k for model turn k and the tokens that follow it."""
    message_index: int | None = None
    """Index into the trajectory's messages of the message these tokens render, if any."""
    logprobs: tuple[float, ...] | None = None
    """The sampler's log-prob of each id: required for ``MODEL`` pieces, forbidden otherwise."""

    @classmethod
    def sampled(
        cls,
        token_ids: Sequence[int],
        logprobs: Sequence[float],
        turn: int,
        message_index: int | None = None,
    ) -> Piece:
        """A ``MODEL`` piece: what the policy sampled, with its log-probs."""
        return cls(TokenSource.MODEL, tuple(token_ids), turn, message_index, tuple(logprobs))


@dataclass(frozen=True, slots=True)
class TokenColumns:
    """The aligned per-token columns of a trajectory."""

    token_ids: tuple[int, ...]
    """Every token in order."""
    loss_mask: tuple[int, ...]
    """1 exactly for sampled tokens."""
    logprobs: tuple[float | None, ...]
    """Sampler log-prob for sampled tokens, ``None`` elsewhere."""
    segments: tuple[Segment, ...]
    """Provenance runs tiling ``[0, len(token_ids))``."""


def build_columns(pieces: Iterable[Piece]) -> TokenColumns:
    """Concatenate ``pieces`` into token ids, loss mask, log-probs and segments.

    Empty pieces are skipped (no zero-length segments). Adjacent pieces with the same source, turn and
    message index are merged into one segment. Raises :class:`ConfigError` for a ``MODEL`` piece without
    matching log-probs (or with a log-prob that is not a finite number <= 0), and for a non-``MODEL``
    piece that carries log-probs.
    """
    ids: list[int] = []
    mask: list[int] = []
    lps: list[float | None] = []
    segments: list[Segment] = []
    for k, p in enumerate(pieces):
        if not isinstance(p.source, TokenSource):
            raise ConfigError(f"piece {k}: source must be a TokenSource, got {p.source!r}")
        n = len(p.token_ids)
        if p.source is TokenSource.MODEL:
            if p.logprobs is None or len(p.logprobs) != n:
                got = None if p.logprobs is None else len(p.logprobs)
                raise ConfigError(f"piece {k}: {n} sampled ids need {n} log-probs, got {got}")
            for lp in p.logprobs:
                # A tiny positive value is float noise from log_softmax; anything larger is a bug.
                if not (isinstance(lp, (int, float)) and math.isfinite(lp) and lp <= 1e-6):
                    raise ConfigError(f"piece {k}: log-prob {lp!r} is not a finite number <= 0")
        elif p.logprobs is not None:
            raise ConfigError(f"piece {k}: {p.source.value} tokens were not sampled and carry no log-probs")
        if n == 0:
            continue
        start = len(ids)
        ids.extend(int(t) for t in p.token_ids)
        if p.source is TokenSource.MODEL:
            assert p.logprobs is not None
            mask.extend([1] * n)
            lps.extend(float(x) for x in p.logprobs)
        else:
            mask.extend([0] * n)
            lps.extend([None] * n)
        last = segments[-1] if segments else None
        if (
            last is not None
            and last.source is p.source
            and last.turn == p.turn
            and last.message_index == p.message_index
        ):
            segments[-1] = Segment(p.source, last.start, len(ids), p.turn, p.message_index)
        else:
            segments.append(Segment(p.source, start, len(ids), p.turn, p.message_index))
    cols = TokenColumns(tuple(ids), tuple(mask), tuple(lps), tuple(segments))
    _check(cols)
    return cols


def _check(cols: TokenColumns) -> None:
    # Cheap self-check of the invariants this function promises; a failure here is a bug in this module.
    n = len(cols.token_ids)
    if not (len(cols.loss_mask) == len(cols.logprobs) == n):
        raise AuditError("build_columns produced columns of different lengths")
    if cols.segments and (cols.segments[0].start != 0 or cols.segments[-1].end != n):
        raise AuditError("build_columns produced segments that do not tile the tokens")


def build_trajectory(
    pieces: Iterable[Piece],
    *,
    messages: Sequence[Message],
    meta: TrajectoryMeta,
    rewards: Sequence[float],
    stop_reason: StopReason,
    terminated: bool,
    truncated: bool,
    versions: Sequence[int] | None = None,
    tool_calls: Sequence[ToolRecord] = (),
    actions: Sequence[str] = (),
    errors: Sequence[EpisodeFailure] = (),
    timings: Mapping[str, float] | None = None,
    tokenizer: TokenizerInfo | None = None,
) -> Trajectory:
    """The trajectory of one episode (or one gateway segment): columns from :func:`build_columns`.

    ``versions`` is the weights version that sampled each model turn, in order (one per ``MODEL`` segment);
    None means every turn was sampled by ``meta.policy_version`` (a sampler without weight updates). The
    result records them once, in :attr:`Trajectory.policy_versions`, and ``meta.policy_version`` becomes
    the oldest of them (with no model turn it stays as given: the version served when the episode began).
    Raises :class:`AuditError` when ``versions`` does not have one entry per model turn.
    """
    cols = build_columns(pieces)
    turns = sum(1 for s in cols.segments if s.source is TokenSource.MODEL)
    per_turn = tuple(int(v) for v in versions) if versions is not None else (meta.policy_version,) * turns
    if len(per_turn) != turns:
        raise AuditError(f"{len(per_turn)} policy versions given for {turns} model turns")
    if per_turn:
        meta = dataclasses.replace(meta, policy_version=min(per_turn))
    return Trajectory(
        token_ids=cols.token_ids,
        loss_mask=cols.loss_mask,
        logprobs=cols.logprobs,
        segments=cols.segments,
        messages=tuple(messages),
        tool_calls=tuple(tool_calls),
        actions=tuple(actions),
        rewards=tuple(float(r) for r in rewards),
        terminated=terminated,
        truncated=truncated,
        stop_reason=stop_reason,
        errors=tuple(errors),
        meta=meta,
        timings=dict(timings or {}),
        tokenizer=tokenizer,
        policy_versions=per_turn,
    )
