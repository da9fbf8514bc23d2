"""What a reward was made of: the grader terms of a step and every judge call behind them.

A step's reward may be a weighted sum of terms (a math check, a rubric criterion, a judge's verdict). Each
term is kept as a :class:`RewardTerm`, with the :class:`JudgeCall` records of any model judge that scored it
(prompt, raw answer, parsed score, latency), on the :class:`~agentrl.types.Trajectory`, so a replay shows
why a reward was given and ``agentrl replay --rescore`` can re-judge the same prompts with another judge.
The values are what ``trajectories.jsonl`` stores (under ``reward_terms``, present only when an env
reported terms, so records of envs that do not are unchanged).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.errors import FormatError

__all__ = ["JudgeCall", "RewardTerm", "weighted_total"]


@dataclass(frozen=True, slots=True)
class JudgeCall:
    """One question put to a judge model and what came back."""

    judge: str
    """Which judge: ``model@base_url`` (or ``model@local`` for an in-process one)."""
    prompt: str
    """The whole prompt the judge was sent (its user message)."""
    raw: str
    """The judge's answer, verbatim."""
    score: float
    """What the output parser read from ``raw`` (a score in [0, 1]; pass/fail reads as 1/0)."""
    latency_s: float
    """Seconds the call took (all attempts); 0 when the answer came from the cache."""
    key: str
    """Hash of the judge's input (judge, prompt, sampling): the cache key."""
    cached: bool = False
    """The answer came from the cache: no call was made."""
    attempts: int = 1
    """How many requests it took (retries after errors); 0 for a cached answer."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON object stored in ``trajectories.jsonl``."""
        return {
            "judge": self.judge,
            "prompt": self.prompt,
            "raw": self.raw,
            "score": self.score,
            "latency_s": self.latency_s,
            "key": self.key,
            "cached": self.cached,
            "attempts": self.attempts,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JudgeCall:
        """Parse :meth:`to_dict`'s output."""
        try:
            return cls(
                judge=str(d["judge"]),
                prompt=str(d["prompt"]),
                raw=str(d["raw"]),
                score=float(d["score"]),
                latency_s=float(d["latency_s"]),
                key=str(d["key"]),
                cached=bool(d.get("cached", False)),
                attempts=int(d.get("attempts", 1)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise FormatError(f"bad judge call record {dict(d)!r:.200}: {e}") from e


@dataclass(frozen=True, slots=True)
class RewardTerm:
    """One weighted term of a step's reward: ``weight * score`` is its share."""

    name: str
    """The term's name (a rubric criterion, ``math``, ``judge``); its step metric is ``reward/<name>``."""
    score: float
    """The term's own score (usually in [0, 1]), before the weight."""
    weight: float = 1.0
    """Its weight in the step's reward."""
    reason: str = ""
    """Why it scored so (a grader's note: ``no parsable answer``, ``timeout``; a judge's parsed verdict)."""
    turn: int = -1
    """The model turn whose step produced it (set by the rollout; -1 before)."""
    judge_calls: tuple[JudgeCall, ...] = ()
    """The judge calls behind the score (empty for a function-scored term)."""

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise FormatError(f"a reward term needs a name, got {self.name!r}")
        for what in ("score", "weight"):
            v = getattr(self, what)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise FormatError(f"reward term {self.name!r}: {what} must be a finite number, got {v!r}")

    @property
    def value(self) -> float:
        """``weight * score``: what the term adds to the reward."""
        return self.weight * self.score

    def to_dict(self) -> dict[str, Any]:
        """The JSON object stored in ``trajectories.jsonl``."""
        return {
            "name": self.name,
            "score": self.score,
            "weight": self.weight,
            "reason": self.reason,
            "turn": self.turn,
            "judge_calls": [c.to_dict() for c in self.judge_calls],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RewardTerm:
        """Parse :meth:`to_dict`'s output."""
        try:
            return cls(
                name=str(d["name"]),
                score=float(d["score"]),
                weight=float(d.get("weight", 1.0)),
                reason=str(d.get("reason", "")),
                turn=int(d.get("turn", -1)),
                judge_calls=tuple(JudgeCall.from_dict(c) for c in d.get("judge_calls") or ()),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise FormatError(f"bad reward term record {dict(d)!r:.200}: {e}") from e


def weighted_total(terms: Sequence[RewardTerm]) -> float:
    """The reward the terms make: the sum of ``weight * score``."""
    return float(math.fsum(t.value for t in terms))
