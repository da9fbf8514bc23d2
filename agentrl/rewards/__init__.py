"""Rewards beyond exact answers: math-verify grading, rubrics, model judges, and their composition.

* :func:`grade_math` grades a math answer with Hugging Face's math-verify (a :class:`Grade`: score and
  reason; its parse failures and timeouts are a zero score with the reason, never a crash).
* :class:`Judge` asks a model (:class:`OpenAIJudgeBackend`: any OpenAI-compatible endpoint;
  :class:`PolicyJudgeBackend`: a model in this process) to score a sample, with a concurrency limit,
  retries under a deadline and a cache by input hash; a judge that cannot answer raises
  :class:`~agentrl.errors.JudgeError`, an infrastructure failure (the episode is dropped, never scored 0).
* :class:`Rubric` is weighted :class:`Criterion` s, each a function or a judge; its result is the reward and
  one :class:`~agentrl.reward_records.RewardTerm` per criterion, which an env returns as
  ``StepResult(reward=..., reward_terms=...)`` so each term is recorded and logged as ``reward/<name>``.
* :class:`RelativeJudge` scores the answers of a group together (RULER-style); :class:`RelativeReward` is it
  as the scheduler's ``finish_group`` hook (``--reward.relative-judge``): each complete group is judged
  before it is stored and credited.

docs/rewards.md walks through them.
"""

from __future__ import annotations

from .config import RewardConfig
from .grade import Grade
from .group import RelativeReward
from .judge import (
    OUTPUT_PARSERS,
    Judge,
    JudgeBackend,
    JudgeCache,
    OpenAIJudgeBackend,
    PolicyJudgeBackend,
    parse_pass_fail,
    parse_score,
)
from .math import grade_math
from .rubric import Criterion, RelativeJudge, Rubric, RubricResult, math_criterion

__all__ = [
    "OUTPUT_PARSERS",
    "Criterion",
    "Grade",
    "Judge",
    "JudgeBackend",
    "JudgeCache",
    "OpenAIJudgeBackend",
    "PolicyJudgeBackend",
    "RelativeJudge",
    "RelativeReward",
    "RewardConfig",
    "Rubric",
    "RubricResult",
    "grade_math",
    "math_criterion",
    "parse_pass_fail",
    "parse_score",
]
