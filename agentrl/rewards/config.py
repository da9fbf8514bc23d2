"""``--reward.*``: the judge or rubric a run rewards with, as a frozen config (``TrainConfig.reward``).

``agentrl train --env file.py:Env --reward.judge-url URL --reward.judge-model NAME`` (or ``--reward.rubric
FILE``) hands the env ``reward=RewardConfig(...)``; an env that takes a ``reward`` argument (the built-in
``judged-v0``, or yours) calls :meth:`RewardConfig.rubric` for the :class:`~agentrl.rewards.Rubric` to score
with. The rubric is built once per process and config, so every env of the run shares its judges' limits
and cache. The API key is read from ``AGENTRL_JUDGE_API_KEY`` and never written to ``config.json``.

``--reward.relative-judge true`` judges each complete group's answers together (RULER-style): the trainer
passes :meth:`RewardConfig.group_reward` (a :class:`~agentrl.rewards.RelativeReward`) to the scheduler as its
``finish_group`` hook, which adds the term ``relative`` to every judged member before the group is stored.
With ``--reward.judge-url`` that judge scores only groups (the env asks no per-answer judge: its own
reward is 0 plus the term); with a rubric file the file's judge also scores each group, next to the
file's per-answer criteria.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import dataclass
from typing import Literal

from agentrl.errors import ConfigError

from .group import RelativeReward
from .judge import Judge, JudgeCache, OpenAIJudgeBackend
from .rubric import DEFAULT_TEMPLATE, PASS_FAIL_TEMPLATE, RELATIVE_TEMPLATE, Criterion, RelativeJudge, Rubric

RELATIVE_MAX_TOKENS = 256
"""The fewest tokens a group judge may write (one ``Answer K: N`` line per member)."""

__all__ = ["RewardConfig"]


@dataclass(frozen=True)
class RewardConfig:
    """A judge (or rubric file) to reward with; unset, the env's own reward stands."""

    judge_url: str | None = None
    """An OpenAI-compatible judge endpoint (``http://127.0.0.1:8000/v1``); its key, if any, comes from the
    environment variable AGENTRL_JUDGE_API_KEY."""
    judge_model: str = "judge"
    """The judge's model name (sent in each request)."""
    parser: Literal["score", "pass_fail"] = "score"
    """How the judge's answer is read: 'Score: N' out of 10, or PASS/FAIL."""
    criterion: str = "follows the instruction: relevant, correct and well written"
    """What the judge checks (its template's {criterion}) when no rubric file is given."""
    rubric: str | None = None
    """A rubric file (JSON: weighted criteria, each a judge or a function; docs/rewards.md) instead of one
    judge criterion."""
    cache: str | None = None
    """The judge cache file (JSONL; default: judge_cache.jsonl in the run folder): a re-run of the same
    episodes makes no judge calls."""
    concurrency: int = 8
    """Most judge requests in flight at once."""
    retries: int = 2
    """Extra attempts after a failed or unreadable judge answer."""
    deadline_s: float = 60.0
    """Seconds one judge call may take, retries included; then the episode is an infrastructure failure."""
    request_timeout_s: float = 30.0
    """Seconds one judge request may take."""
    max_tokens: int = 32
    """Most tokens the judge may write."""
    temperature: float = 0.0
    """The judge's sampling temperature (0: as deterministic as the server allows; the agentrl gateway
    needs > 0)."""
    relative_judge: bool = False
    """true: the judge scores each complete group's answers together, in one prompt (RULER-style), as the
    reward term 'relative'; with --reward.judge-url it is then the only judge (no per-answer calls)."""
    relative_weight: float = 1.0
    """The weight of the 'relative' term in the reward."""

    def __post_init__(self) -> None:
        if self.judge_url is not None and self.rubric is not None:
            raise ConfigError(
                "--reward.judge-url and --reward.rubric exclude each other (the file names its judge)"
            )
        if self.concurrency < 1 or self.retries < 0 or self.deadline_s <= 0 or self.request_timeout_s <= 0:
            raise ConfigError(
                "--reward.concurrency, retries, deadline-s and request-timeout-s must be positive"
            )
        if self.relative_judge and not self.enabled:
            raise ConfigError(
                "--reward.relative-judge needs a judge: --reward.judge-url URL or a --reward.rubric file "
                "with a 'judge' block"
            )
        if not math.isfinite(self.relative_weight):
            raise ConfigError(f"--reward.relative-weight must be a finite number, got {self.relative_weight}")

    @property
    def enabled(self) -> bool:
        """Whether a judge or rubric is set."""
        return self.judge_url is not None or self.rubric is not None

    @property
    def per_answer(self) -> bool:
        """Whether the env scores each answer with a rubric (False when the judge scores groups only:
        ``--reward.relative-judge`` with ``--reward.judge-url``)."""
        return self.enabled and not (self.relative_judge and self.rubric is None)

    def with_judge(self, url: str | None, model: str | None = None) -> RewardConfig:
        """These settings with their judge at ``url`` as ``model`` (None keeps this config's): how ``agentrl
        eval --reward.judge-url`` and ``replay --rescore --judge-url`` point a run's ``--reward.*`` at another
        judge, every other setting (the group judge, parser, criterion, limits, cache) as training used it.

        Raises:
            ConfigError: the settings name a rubric file (its judges are in the file), or no URL is given or
                set.
        """
        if self.rubric is not None:
            raise ConfigError(
                f"the reward comes from the rubric file {self.rubric}, which names its own judge; a judge "
                "URL cannot stand in for it (edit a copy of the file instead)"
            )
        url = url or self.judge_url
        if url is None:
            raise ConfigError("--reward.judge-model needs a judge: give --reward.judge-url URL too")
        return dataclasses.replace(self, judge_url=url, judge_model=model or self.judge_model)

    def rubric_for_run(self) -> Rubric:
        """The rubric these settings describe (built once per process and config).

        Raises:
            ConfigError: nothing is set, the rubric file is bad, or the judge scores groups only.
        """
        if self.enabled and not self.per_answer:
            raise ConfigError(
                "--reward.relative-judge with --reward.judge-url scores groups only: there is no per-answer "
                "rubric (check RewardConfig.per_answer)"
            )
        return _build(self)

    def group_reward(self) -> RelativeReward | None:
        """The trainer's ``finish_group`` hook for ``--reward.relative-judge`` (None when it is off), built
        once per process and config, sharing the per-answer judge's cache.

        Raises:
            ConfigError: the rubric file names no judge.
        """
        return _group(self) if self.relative_judge else None


@functools.cache
def _cache(cfg: RewardConfig) -> JudgeCache:
    return JudgeCache(cfg.cache) if cfg.cache else JudgeCache()


@functools.cache
def _group(cfg: RewardConfig) -> RelativeReward:
    if cfg.rubric is not None:
        judges = _build(cfg).judges
        if not judges:
            raise ConfigError(
                f"--reward.relative-judge: rubric file {cfg.rubric} has no 'judge' block to judge groups with"
            )
        judge = judges[0]
    else:
        judge = _judge(cfg, DEFAULT_TEMPLATE)
    judge = judge.replace(
        template=RELATIVE_TEMPLATE, max_tokens=max(judge.settings.max_tokens, RELATIVE_MAX_TOKENS)
    )
    return RelativeReward(RelativeJudge(judge), weight=cfg.relative_weight)


def _judge(cfg: RewardConfig, template: str) -> Judge:
    assert cfg.judge_url is not None
    backend = OpenAIJudgeBackend(
        cfg.judge_url, cfg.judge_model, api_key=os.environ.get("AGENTRL_JUDGE_API_KEY")
    )
    return Judge(
        backend,
        template,
        parser=cfg.parser,
        max_tokens=cfg.max_tokens,
        temperature=cfg.temperature,
        concurrency=cfg.concurrency,
        retries=cfg.retries,
        deadline_s=cfg.deadline_s,
        request_timeout_s=cfg.request_timeout_s,
        cache=_cache(cfg),
    )


@functools.cache
def _build(cfg: RewardConfig) -> Rubric:
    cache = _cache(cfg)
    if cfg.rubric is not None:
        return Rubric.from_file(cfg.rubric, cache=cache)
    if cfg.judge_url is None:
        raise ConfigError(
            "no judge: give --reward.judge-url URL (and --reward.judge-model) or --reward.rubric"
        )
    judge = _judge(cfg, DEFAULT_TEMPLATE if cfg.parser == "score" else PASS_FAIL_TEMPLATE)
    return Rubric([Criterion("judge", 1.0, judge=judge, description=cfg.criterion)])
