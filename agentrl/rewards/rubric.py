r"""Rubrics (weighted criteria, each scored by a function or a judge) and group-wise relative judging.

A :class:`Rubric` scores one sample (a mapping of fields: ``question``, ``answer``, ``reference``, ...) on
each :class:`Criterion`: a function (``sample -> Grade | float``: :func:`math_criterion` wraps
:func:`~agentrl.rewards.grade_math`) or a :class:`~agentrl.rewards.judge.Judge` (its template gets the
sample's fields and ``{criterion}``, the criterion's description). The reward is the weighted sum of the
criteria's scores; each is kept as a :class:`~agentrl.reward_records.RewardTerm` (its judge calls with it),
which the env returns as :attr:`agentrl.env.StepResult.reward_terms`. Judge criteria are asked
concurrently.

:class:`RelativeJudge` scores the members of a group together, in one prompt (as ART's RULER does): the
judge sees every answer to the same question and gives each a score, so the scores are comparable within the
group, which is all a group baseline (GRPO, OTB) uses.

A rubric file (``--reward.rubric FILE``) is JSON::

    {"judge": {"base_url": "http://127.0.0.1:8000/v1", "model": "judge", "parser": "score"},
     "template": "Question: {question}\nAnswer: {answer}\nCriterion: {criterion}\n...Score: N/10",
     "criteria": [{"name": "relevant", "weight": 0.5, "description": "answers the question"},
                  {"name": "math", "weight": 0.5, "function": "math"}]}
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError
from agentrl.reward_records import JudgeCall, RewardTerm, weighted_total

from .grade import Grade
from .judge import Judge, JudgeCache, OpenAIJudgeBackend
from .math import grade_math

__all__ = ["Criterion", "RelativeJudge", "Rubric", "RubricResult", "brief_criterion", "math_criterion"]

CriterionFn = Callable[[Mapping[str, Any]], "Grade | float"]

DEFAULT_TEMPLATE = (
    "You grade an answer on one criterion.\n\nQuestion:\n{question}\n\nAnswer:\n{answer}\n\n"
    "Criterion: {criterion}\n\nReply with one line: 'Score: N' where N is 0 (not met) to 10 (fully met)."
)
"""The judge template of a rubric file that sets none (and of ``--reward.judge-url``)."""

PASS_FAIL_TEMPLATE = (
    "You check an answer on one criterion.\n\nQuestion:\n{question}\n\nAnswer:\n{answer}\n\n"
    "Criterion: {criterion}\n\nReply with one word: PASS if the answer meets it, else FAIL."
)
"""The judge template of ``--reward.parser pass_fail``."""


def math_criterion(sample: Mapping[str, Any]) -> Grade:
    """:func:`~agentrl.rewards.grade_math` of ``sample["answer"]`` against ``sample["reference"]``."""
    return grade_math(sample.get("answer"), sample["reference"])


def brief_criterion(sample: Mapping[str, Any]) -> Grade:
    """1 for a non-empty answer of at most 30 words, else 0."""
    n = len(str(sample.get("answer") or "").split())
    return Grade(float(0 < n <= 30), f"{n} words")


FUNCTIONS: dict[str, CriterionFn] = {"math": math_criterion, "brief": brief_criterion}
"""Criterion functions a rubric file may name (``"function": "math"``)."""


@dataclass(frozen=True, slots=True)
class Criterion:
    """One weighted criterion, scored by ``fn`` or by ``judge`` (exactly one)."""

    name: str
    """Its name: the reward term (and step metric ``reward/<name>``)."""
    weight: float = 1.0
    """Its weight in the reward."""
    fn: CriterionFn | None = None
    """``sample -> Grade | float``."""
    judge: Judge | None = None
    """A judge whose template gets the sample's fields and ``criterion`` (the description)."""
    description: str = ""
    """What the judge is asked to check (``{criterion}`` in its template)."""

    def __post_init__(self) -> None:
        if not self.name or not re.fullmatch(r"[\w.-]+", self.name):
            raise ConfigError(f"criterion name must be a word (letters, digits, _ . -), got {self.name!r}")
        if (self.fn is None) == (self.judge is None):
            raise ConfigError(f"criterion {self.name!r} needs exactly one of fn and judge")


@dataclass(frozen=True, slots=True)
class RubricResult:
    """A rubric's score of one sample."""

    terms: tuple[RewardTerm, ...]
    """One term per criterion, in order."""
    reward: float = field(init=False)
    """The weighted sum of the terms."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "reward", weighted_total(self.terms))


class Rubric:
    """Weighted criteria scored together.

    Args:
        criteria: The criteria (names unique).
    """

    def __init__(self, criteria: Sequence[Criterion]):
        names = [c.name for c in criteria]
        if not criteria or len(set(names)) != len(names):
            raise ConfigError(f"a rubric needs criteria with distinct names, got {names}")
        self.criteria = tuple(criteria)

    @property
    def judges(self) -> tuple[Judge, ...]:
        """The distinct judges of the criteria."""
        return tuple({id(c.judge): c.judge for c in self.criteria if c.judge is not None}.values())

    async def score(self, sample: Mapping[str, Any]) -> RubricResult:
        """Score one sample on every criterion (judge criteria concurrently).

        Raises:
            JudgeError: a judge failed (the caller's episode is an infrastructure failure).
        """
        return RubricResult(tuple(await asyncio.gather(*(self._term(c, sample) for c in self.criteria))))

    async def score_many(self, samples: Sequence[Mapping[str, Any]]) -> list[RubricResult]:
        """Score a batch of samples concurrently (each judge keeps its own concurrency limit)."""
        return list(await asyncio.gather(*(self.score(s) for s in samples)))

    async def _term(self, c: Criterion, sample: Mapping[str, Any]) -> RewardTerm:
        if c.judge is not None:
            call = await c.judge.judge({**sample, "criterion": c.description or c.name})
            return RewardTerm(c.name, call.score, c.weight, f"judge: {call.score:.3g}", judge_calls=(call,))
        assert c.fn is not None
        out = c.fn(sample)
        grade = out if isinstance(out, Grade) else Grade(float(out))
        return grade.term(c.name, c.weight)

    @classmethod
    def from_file(cls, path: str | Path, *, cache: JudgeCache | None = None) -> Rubric:
        """Read a rubric file (module docstring).

        Raises:
            ConfigError: the file is missing, not JSON, or does not describe a rubric.
        """
        try:
            spec = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read rubric file {path}: {e}") from e
        if not isinstance(spec, dict) or not isinstance(spec.get("criteria"), list):
            raise ConfigError(f"rubric file {path} must be a JSON object with a 'criteria' list")
        judge: Judge | None = None
        if spec.get("judge"):
            j = dict(spec["judge"])
            try:
                backend = OpenAIJudgeBackend(
                    str(j.pop("base_url")), str(j.pop("model")), api_key=j.pop("api_key", None)
                )
                judge = Judge(backend, str(spec.get("template", DEFAULT_TEMPLATE)), cache=cache, **j)
            except (KeyError, TypeError) as e:
                raise ConfigError(f"rubric file {path}: bad 'judge' entry: {e}") from e
        criteria = []
        for c in spec["criteria"]:
            fn_name = c.get("function")
            if fn_name is not None and fn_name not in FUNCTIONS:
                raise ConfigError(
                    f"rubric file {path}: unknown function {fn_name!r}; choose from {sorted(FUNCTIONS)}"
                )
            if fn_name is None and judge is None:
                raise ConfigError(f"rubric file {path}: criterion {c.get('name')!r} needs a 'judge' entry")
            criteria.append(
                Criterion(
                    str(c.get("name", "")),
                    float(c.get("weight", 1.0)),
                    fn=FUNCTIONS[fn_name] if fn_name is not None else None,
                    judge=judge if fn_name is None else None,
                    description=str(c.get("description", "")),
                )
            )
        return cls(criteria)


RELATIVE_TEMPLATE = (
    "Several answers were given to the same question. Score each from 0 (useless) to 10 (excellent), "
    "comparing them with each other.\n\nQuestion:\n{question}\n\n{candidates}\n\n"
    "Reply with one line per answer, 'Answer K: N', and nothing else."
)
"""The default prompt of a :class:`RelativeJudge`."""

_RELATIVE_LINE = re.compile(r"answer\s*#?\s*(\d+)\s*[:=-]\s*\**\s*(\d+(?:\.\d+)?)", re.IGNORECASE)


class RelativeJudge:
    """Scores a group's answers together, in one judge prompt (RULER-style relative judging).

    Args:
        judge: Its backend, limits and cache are used; its template must have ``{question}`` and
            ``{candidates}`` (default: :data:`RELATIVE_TEMPLATE` when the judge's own lacks ``{candidates}``).
        max_score: The top of the scale the judge writes (scores are divided by it).
    """

    def __init__(self, judge: Judge, *, max_score: float = 10.0):
        self.judge, self.max_score = judge, max_score
        self.template = judge.template if "{candidates}" in judge.template else RELATIVE_TEMPLATE

    async def score_group(self, question: str, answers: Sequence[str]) -> list[Grade]:
        """One grade per answer, in order; every grade carries the one shared judge call.

        Raises:
            JudgeError: no answer with a score for every member within the retries and deadline.
        """
        if not answers:
            return []
        candidates = "\n\n".join(f"Answer {k}:\n{a}" for k, a in enumerate(answers, 1))
        prompt = self.template.format(question=question, candidates=candidates)
        got = await self.judge.answer(prompt, lambda raw: self._parse(raw, len(answers)))
        grades = []
        for k, score in enumerate(got.parsed):
            call = JudgeCall(
                self.judge.name, prompt, got.raw, score, got.latency_s, got.key, got.cached, got.attempts
            )
            grades.append(Grade(score, f"relative judge: answer {k + 1} of {len(answers)}", (call,)))
        return grades

    def _parse(self, raw: str, n: int) -> list[float]:
        scores: dict[int, float] = {}
        for k, v in _RELATIVE_LINE.findall(raw):
            if 1 <= int(k) <= n and 0 <= float(v) <= self.max_score:
                scores[int(k)] = float(v) / self.max_score
        if len(scores) != n:
            raise ValueError(f"the judge scored {len(scores)} of {n} answers: {raw[:160]!r}")
        return [scores[k] for k in range(1, n + 1)]
