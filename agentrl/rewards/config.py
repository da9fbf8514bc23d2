"""``--reward.*``: the judge or rubric a run rewards with, as a frozen config (``TrainConfig.reward``).

``agentrl train --env file.py:Env --reward.judge-url URL --reward.judge-model NAME`` (or ``--reward.rubric
FILE``) hands the env ``reward=RewardConfig(...)``; an env that takes a ``reward`` argument (the built-in
``judged-v0``, or yours) calls :meth:`RewardConfig.rubric` for the :class:`~agentrl.rewards.Rubric` to score
with. The rubric is built once per process and config, so every env of the run shares its judges' limits
and cache. The API key is read from ``AGENTRL_JUDGE_API_KEY`` and never written to ``config.json``.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Literal

from agentrl.errors import ConfigError

from .judge import Judge, JudgeCache, OpenAIJudgeBackend
from .rubric import DEFAULT_TEMPLATE, PASS_FAIL_TEMPLATE, Criterion, Rubric

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

    def __post_init__(self) -> None:
        if self.judge_url is not None and self.rubric is not None:
            raise ConfigError(
                "--reward.judge-url and --reward.rubric exclude each other (the file names its judge)"
            )
        if self.concurrency < 1 or self.retries < 0 or self.deadline_s <= 0 or self.request_timeout_s <= 0:
            raise ConfigError(
                "--reward.concurrency, retries, deadline-s and request-timeout-s must be positive"
            )

    @property
    def enabled(self) -> bool:
        """Whether a judge or rubric is set."""
        return self.judge_url is not None or self.rubric is not None

    def rubric_for_run(self) -> Rubric:
        """The rubric these settings describe (built once per process and config).

        Raises:
            ConfigError: nothing is set, or the rubric file is bad.
        """
        return _build(self)


@functools.cache
def _build(cfg: RewardConfig) -> Rubric:
    cache = JudgeCache(cfg.cache) if cfg.cache else JudgeCache()
    if cfg.rubric is not None:
        return Rubric.from_file(cfg.rubric, cache=cache)
    if cfg.judge_url is None:
        raise ConfigError(
            "no judge: give --reward.judge-url URL (and --reward.judge-model) or --reward.rubric"
        )
    backend = OpenAIJudgeBackend(
        cfg.judge_url, cfg.judge_model, api_key=os.environ.get("AGENTRL_JUDGE_API_KEY")
    )
    judge = Judge(
        backend,
        DEFAULT_TEMPLATE if cfg.parser == "score" else PASS_FAIL_TEMPLATE,
        parser=cfg.parser,
        max_tokens=cfg.max_tokens,
        temperature=cfg.temperature,
        concurrency=cfg.concurrency,
        retries=cfg.retries,
        deadline_s=cfg.deadline_s,
        request_timeout_s=cfg.request_timeout_s,
        cache=cache,
    )
    return Rubric([Criterion("judge", 1.0, judge=judge, description=cfg.criterion)])
