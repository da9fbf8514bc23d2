"""``agentrl replay RUN --rescore --judge-url URL --judge-model NAME``: re-judge a run with another judge.

``--rescore`` replays each episode's recorded actions through a fresh env and compares the rewards; for an env
judged through ``--reward.*`` (``judged-v0``), the fresh env asks the run's judge (whose answers are in the
run's ``judge_cache.jsonl``, so a plain ``--rescore`` sends no request and reproduces every reward). With
``--judge-url`` the env is given the same settings pointed at another judge, with a cache of its own, so the
same prompts are judged afresh by it and the comparison shows where the two judges disagree.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError
from agentrl.rewards import RewardConfig

__all__ = ["add_rejudge_arguments", "rejudge_env_kwargs"]


def add_rejudge_arguments(p: argparse.ArgumentParser) -> None:
    """The ``--judge-*`` options of ``--rescore``."""
    g = p.add_argument_group("re-judging (--rescore of a run rewarded by --reward.*)")
    g.add_argument("--judge-url", help="rescore with this OpenAI-compatible judge instead of the run's")
    g.add_argument("--judge-model", help="its model name (default: the run's --reward.judge-model)")
    g.add_argument("--judge-cache", help="its cache file (default: judge_cache-rescore.jsonl in the run)")


def rejudge_env_kwargs(env_kwargs: dict[str, Any], ns: argparse.Namespace) -> dict[str, Any]:
    """``env_kwargs`` with the run's reward settings pointed at ``--judge-url``/``--judge-model``.

    Raises:
        ConfigError: ``--judge-*`` without ``--rescore``, or the run was not rewarded by a single judge.
    """
    if ns.judge_url is None and ns.judge_model is None:
        return env_kwargs
    if not ns.rescore:
        raise ConfigError("--judge-url/--judge-model go with --rescore")
    reward = env_kwargs.get("reward")
    if isinstance(reward, dict):
        reward = RewardConfig(**reward)
    if not isinstance(reward, RewardConfig) or reward.judge_url is None:
        raise ConfigError(
            "--judge-url needs a run rewarded by --reward.judge-url (a rubric file names its own judges: "
            'edit a copy and pass it with --env-kwargs \'{"reward": {"rubric": "FILE"}}\')'
        )
    cache = ns.judge_cache
    if cache is None and reward.cache is not None:
        cache = str(Path(reward.cache).with_name("judge_cache-rescore.jsonl"))
    new = dataclasses.replace(
        reward,
        judge_url=ns.judge_url or reward.judge_url,
        judge_model=ns.judge_model or reward.judge_model,
        cache=cache,
    )
    return {**env_kwargs, "reward": new}
