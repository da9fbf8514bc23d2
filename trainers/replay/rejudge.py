"""``agentrl replay RUN --rescore`` of a judged run: re-judge it, from its cache or with another judge.

``--rescore`` replays each episode's recorded actions through a fresh env and compares the rewards; for an env
judged through ``--reward.*`` (``judged-v0``), the fresh env asks the run's judge (whose answers are in the
run's ``judge_cache.jsonl``, so a plain ``--rescore`` sends no request and reproduces every reward). Another
judge:

* ``--judge-url URL [--judge-model NAME]``: a run rewarded by ``--reward.judge-url``, asked of that judge;
* ``--judge-rubric FILE``: any judged run, scored with this rubric file (an edited copy of the run's, or
  another) instead of the run's judge or rubric;

each with a cache of its own (``judge_cache-rescore.jsonl`` in the run), so the same prompts are judged afresh
and the comparison shows where the judges disagree.

A run trained with ``--reward.relative-judge`` also has the term ``relative`` on its members, which a group
judge added once each group was complete (:class:`agentrl.rewards.RelativeReward`). The env's replay cannot
give it (one episode at a time), so :func:`add_group_terms` re-judges every group of the rescored episodes
from the record (the whole group, from the run's file: the same prompt, so the run's cache answers it) and
adds each member's new term to its replayed step before the comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError, JudgeError
from agentrl.groups import TrajectoryGroup, group_trajectories
from agentrl.reward_records import RewardTerm
from agentrl.rewards import RewardConfig
from agentrl.types import Trajectory

from .reexec import RescoreReport

__all__ = ["add_group_terms", "add_rejudge_arguments", "rejudge_env_kwargs"]


def add_rejudge_arguments(p: argparse.ArgumentParser) -> None:
    """The ``--judge-*`` options of ``--rescore``."""
    g = p.add_argument_group("re-judging (--rescore of a run rewarded by --reward.*)")
    g.add_argument("--judge-url", help="rescore with this OpenAI-compatible judge instead of the run's")
    g.add_argument("--judge-model", help="its model name (default: the run's --reward.judge-model)")
    g.add_argument("--judge-rubric", help="rescore with this rubric file (its judge and criteria) instead")
    g.add_argument("--judge-cache", help="its cache file (default: judge_cache-rescore.jsonl in the run)")


def _reward_of(env_kwargs: dict[str, Any]) -> RewardConfig | None:
    reward = env_kwargs.get("reward")
    if isinstance(reward, dict):
        reward = RewardConfig(**reward)
    return reward if isinstance(reward, RewardConfig) else None


def rejudge_env_kwargs(env_kwargs: dict[str, Any], ns: argparse.Namespace) -> dict[str, Any]:
    """``env_kwargs`` with the run's reward settings pointed at ``--judge-url``/``--judge-model`` or
    ``--judge-rubric``.

    Raises:
        ConfigError: ``--judge-*`` without ``--rescore``, both a URL and a rubric, a URL for a run not
            rewarded by a single judge, or a run not rewarded by ``--reward.*`` at all.
    """
    rubric = getattr(ns, "judge_rubric", None)
    if ns.judge_url is None and ns.judge_model is None and rubric is None:
        return env_kwargs
    if not ns.rescore:
        raise ConfigError("--judge-url/--judge-model/--judge-rubric go with --rescore")
    if rubric is not None and (ns.judge_url is not None or ns.judge_model is not None):
        raise ConfigError("--judge-rubric names its own judge: give it without --judge-url/--judge-model")
    reward = _reward_of(env_kwargs)
    if reward is None or not reward.enabled:
        raise ConfigError(
            "--judge-url/--judge-rubric re-judge a run rewarded by --reward.* (its config.json has a "
            "'reward' block); this run's env was not given one"
        )
    if rubric is None and reward.judge_url is None:
        raise ConfigError(
            "--judge-url needs a run rewarded by --reward.judge-url; this run's rubric file names its own "
            "judge: re-judge it with --judge-rubric FILE (an edited copy of the file)"
        )
    if rubric is not None and not Path(rubric).is_file():
        raise ConfigError(f"--judge-rubric {rubric}: no such file")
    cache = ns.judge_cache
    if cache is None and reward.cache is not None:
        cache = str(Path(reward.cache).with_name("judge_cache-rescore.jsonl"))
    if rubric is not None:
        new = dataclasses.replace(reward, judge_url=None, rubric=str(rubric), cache=cache)
    else:
        new = dataclasses.replace(reward.with_judge(ns.judge_url, ns.judge_model), cache=cache)
    return {**env_kwargs, "reward": new}


def add_group_terms(
    reports: Sequence[RescoreReport],
    trajectories: Sequence[Trajectory],
    pool: Sequence[Trajectory],
    env_kwargs: dict[str, Any],
) -> list[RescoreReport]:
    """``reports`` (one per trajectory of ``trajectories``) with each member's group-judge term re-judged and
    added to its replayed step, when the reward settings in ``env_kwargs`` judge groups
    (``--reward.relative-judge``); unchanged otherwise. Groups are rebuilt from ``pool`` (the run's file).

    A group whose judge fails marks its members' reports with the error (a difference, never a 0).
    """
    reward = _reward_of(env_kwargs)
    hook = reward.group_reward() if reward is not None else None
    if hook is None:
        return list(reports)
    wanted = {t.meta.group_id for t in trajectories}
    groups = [g for g in group_trajectories(pool) if g.group_id in wanted]

    async def judge_all() -> tuple[dict[int, RewardTerm], dict[int, str]]:
        terms: dict[int, RewardTerm] = {}
        errors: dict[int, str] = {}

        async def one(g: TrajectoryGroup) -> None:
            bare = TrajectoryGroup(tuple(_without(t, hook.name) for t in g))
            try:
                got = await hook.terms(bare)
            except JudgeError as e:
                errors.update(dict.fromkeys((id(t) for t in g), f"the group judge failed: {e}"))
                return
            terms.update({id(g.trajectories[p]): term for p, term in got.items()})

        await asyncio.gather(*(one(g) for g in groups))
        return terms, errors

    terms, errors = asyncio.run(judge_all())
    out = []
    for r, t in zip(reports, trajectories, strict=True):
        if id(t) in errors and not r.error:
            r = dataclasses.replace(r, error=errors[id(t)])
        term = terms.get(id(t))
        if term is not None and not r.error and len(r.replayed_rewards) == len(t.rewards):
            *before, last = r.replayed_rewards  # the term is on the last step (RelativeReward)
            if last is not None:
                r = dataclasses.replace(r, replayed_rewards=(*before, last + term.value))
        out.append(r)
    return out


def _without(t: Trajectory, name: str) -> Trajectory:
    """``t`` without its group-judge terms (the candidates a group judge picks do not depend on them)."""
    return dataclasses.replace(t, reward_terms=tuple(x for x in t.reward_terms if x.name != name))
