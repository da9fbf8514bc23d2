"""The decoding layer every replay module shares: token ids to text, and where each model turn sits.

A tokenizer here is whatever object the caller already has (duck-typed: ``decode``, and a chat template for
the stop-token rules); nothing in this module loads one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrl.chat import ChatRenderer
from agentrl.errors import AgentRLError, ConfigError
from agentrl.types import Segment, TokenSource, Trajectory

__all__ = [
    "TokenText",
    "actions_of",
    "model_segments",
    "session_label",
    "token_text",
    "turn_layout",
    "version_label",
]


class TokenText:
    """Decode token ids with a tokenizer, per token cached (a vocabulary is small, a run is not)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        """The tokenizer it decodes with."""
        backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
        # The Rust backend decodes ~10x faster than the Python wrapper and never cleans up spaces.
        self._backend = backend if hasattr(backend, "decode") else None
        self._cache: dict[int, str] = {}
        self.renderer: ChatRenderer | None = None
        """The chat renderer of the tokenizer (stop tokens, assistant text), None without a chat template."""
        try:
            self.renderer = ChatRenderer(tokenizer)
        except AgentRLError:
            self.renderer = None

    def decode(self, ids: Sequence[int]) -> str:
        """The exact text of ``ids`` (special tokens kept, no clean-up)."""
        if self._backend is not None:
            return str(self._backend.decode(list(ids), skip_special_tokens=False))
        return str(
            self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        )

    def token(self, tid: int) -> str:
        """The text of one token."""
        s = self._cache.get(tid)
        if s is None:
            s = self._cache[tid] = self.decode([tid])
        return s

    def is_stop(self, tid: int) -> bool:
        """Whether ``tid`` ends an assistant turn under the chat template."""
        return self.renderer is not None and self.renderer.is_stop(tid)

    def assistant_text(self, ids: Sequence[int]) -> str:
        """The text of a model turn as the env received it (without its stop token)."""
        if self.renderer is not None:
            return str(self.renderer.assistant_text(ids))
        return self.decode(ids)


def token_text(tokenizer: Any) -> TokenText | None:
    """A :class:`TokenText` for ``tokenizer`` (passed through if it already is one), None without one."""
    if tokenizer is None:
        return None
    return tokenizer if isinstance(tokenizer, TokenText) else TokenText(tokenizer)


def model_segments(traj: Trajectory) -> list[Segment]:
    """The segments the model sampled, one per turn, in order."""
    return [s for s in traj.segments if s.source is TokenSource.MODEL]


def turn_layout(traj: Trajectory) -> tuple[int, dict[int, int]]:
    """(number of initial messages, {turn: index of its assistant message})."""
    turn_msg = {s.turn: s.message_index for s in model_segments(traj) if s.message_index is not None}
    first = min(turn_msg.values(), default=len(traj.messages))
    return first, turn_msg


def actions_of(traj: Trajectory, tokenizer: Any = None) -> tuple[tuple[str, ...], str]:
    """The text of each model turn that was handed to ``Env.step``, and where it came from.

    ``Trajectory.actions`` when recorded (``"recorded"``). Records without it: each model segment that
    ends with a stop token (exactly the turns the rollout handed to ``step``), decoded without its stop
    token (``"decoded"``) — needs the tokenizer. ``"none"``: no turn ended with a stop token (every one was
    cut by a token limit), so no action ever reached the env; an empty ``actions`` is then what a current
    record holds too, not a sign of an older format.
    """
    if traj.actions:
        return tuple(traj.actions), "recorded"
    segs = model_segments(traj)
    if not segs:
        return (), "recorded"
    tx = token_text(tokenizer)
    if tx is None:
        raise ConfigError(
            f"trajectory {traj.meta.episode_id or '?'} has no recorded actions; a tokenizer is needed to "
            "decode them from its model tokens (--tokenizer)"
        )
    out = []
    for s in segs:
        ids = traj.token_ids[s.start : s.end]
        if ids and tx.is_stop(ids[-1]):
            out.append(tx.assistant_text(ids))
    return tuple(out), ("decoded" if out else "none")


def session_label(traj: Trajectory) -> str | None:
    """Where a gateway trajectory sits in its session (``meta.extra``: ``session_id``, ``segment``,
    ``segments``, ``segment_end``): ``"session S, segment k of n, ended by E"``, with ``k`` counted from 0 as
    recorded. A session splits into several trajectories when the agent rewrites its history or goes on
    after a turn cut by ``max_tokens`` (``segment_end`` says which). None for a native episode."""
    extra = traj.meta.extra
    sid = extra.get("session_id")
    if not isinstance(sid, str):
        return None
    k, n, end = extra.get("segment", 0), extra.get("segments", 1), extra.get("segment_end", "finish")
    return f"session {sid}, segment {k} of {n}, ended by {end}"


def version_label(traj: Trajectory) -> str:
    """The weights version(s) that sampled the episode: ``"3"``, or ``"3-5 (per turn 3, 4, 5)"`` when the
    sampler took new weights between its turns."""
    lo, hi = traj.min_policy_version, traj.max_policy_version
    if lo == hi:
        return str(lo)
    return f"{lo}-{hi} (per turn {', '.join(map(str, traj.policy_versions))})"
