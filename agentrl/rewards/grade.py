"""A grader's verdict: a score and why, the unit every reward function in :mod:`agentrl.rewards` returns."""

from __future__ import annotations

import math
from dataclasses import dataclass

from agentrl.errors import ConfigError
from agentrl.reward_records import JudgeCall, RewardTerm

__all__ = ["Grade"]


@dataclass(frozen=True, slots=True)
class Grade:
    """One grader's verdict on one answer."""

    score: float
    """The score, usually in [0, 1]."""
    reason: str = ""
    """Why: ``equal``, ``not equal``, ``no parsable answer``, ``timed out``, a judge's parsed verdict."""
    judge_calls: tuple[JudgeCall, ...] = ()
    """The judge calls behind the score, if a judge gave it."""

    def __post_init__(self) -> None:
        s = self.score
        if isinstance(s, bool) or not isinstance(s, int | float) or not math.isfinite(s):
            raise ConfigError(f"a grade's score must be a finite number, got {s!r}")
        object.__setattr__(self, "score", float(s))

    def term(self, name: str, weight: float = 1.0) -> RewardTerm:
        """This grade as a named, weighted term of a step's reward."""
        return RewardTerm(name, self.score, weight, self.reason, judge_calls=self.judge_calls)
