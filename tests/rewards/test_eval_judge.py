"""``agentrl eval --reward.judge-url`` points the run's ``--reward.*`` at another judge the way training
built it (RewardConfig.with_judge, shared with ``replay --rescore --judge-url``): the group judge, parser,
criterion, limits and cache stay; only the judge's address (and model, when given) change."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from agentrl.errors import ConfigError
from agentrl.rewards import RewardConfig
from agentrl.trainers.cli import _eval_env_kwargs, build_parser

RUN = RewardConfig(
    judge_url="http://127.0.0.1:9/v1",
    judge_model="old",
    relative_judge=True,
    temperature=0.5,
    criterion="is vivid",
    cache="/run/judge_cache.jsonl",
)


def _ns(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["eval", "--model", "smollm2", "--env", "judged-v0", *argv])


def vars_of(cfg: RewardConfig) -> dict:
    return dataclasses.asdict(cfg)


def test_eval_keeps_the_runs_reward_settings_and_swaps_the_judge():
    kwargs = {"prompt_set": "x", "reward": RUN}
    out = _eval_env_kwargs(_ns("--reward.judge-url", "http://127.0.0.1:7/v1"), kwargs)
    assert out == {
        "prompt_set": "x",
        "reward": RewardConfig(**{**vars_of(RUN), "judge_url": "http://127.0.0.1:7/v1"}),
    }
    assert out["reward"].group_reward() is not None  # still a group judge, as training had it
    out = _eval_env_kwargs(_ns("--reward.judge-model", "new"), {"reward": vars_of(RUN)})  # a saved dict too
    assert out["reward"] == RewardConfig(**{**vars_of(RUN), "judge_model": "new"})
    assert _eval_env_kwargs(_ns(), kwargs) is kwargs  # no flag: the run's settings as they are


def test_eval_without_run_settings_gets_a_default_judge_and_bad_combinations_say_why():
    out = _eval_env_kwargs(_ns("--reward.judge-url", "http://127.0.0.1:7/v1"), None)
    assert out == {"reward": RewardConfig(judge_url="http://127.0.0.1:7/v1")}
    with pytest.raises(ConfigError, match=r"needs a judge: give --reward\.judge-url"):
        _eval_env_kwargs(_ns("--reward.judge-model", "new"), None)
    rubric = {"reward": RewardConfig(rubric="rubric.json")}
    with pytest.raises(ConfigError, match=r"rubric file rubric\.json, which names its own judge"):
        _eval_env_kwargs(_ns("--reward.judge-url", "http://127.0.0.1:7/v1"), rubric)
