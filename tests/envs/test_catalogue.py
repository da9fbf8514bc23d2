"""Every registered environment honours agentrl's Env contract and, through the explicit Gymnasium bridge,
passes Gymnasium's own checker."""

from __future__ import annotations

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env as gymnasium_check_env

import agentrl
from agentrl._sync import run_sync
from agentrl.rewards import Criterion, Rubric

ENV_IDS = agentrl.list_envs()
GYM_IDS = agentrl.register_gymnasium()


def test_the_catalogue_holds_the_shipped_environments():
    assert {"math-tir-v0", "calculator-v0", "shop-v0", "guess-number-v0", "exact-answer-v0"} <= set(ENV_IDS)
    assert {f"agentrl/{i}" for i in ENV_IDS} <= set(GYM_IDS)


def _brevity(sample):
    return float(len(sample["answer"]) < 80)


NEEDS = {"judged-v0": {"rubric": Rubric([Criterion("brevity", fn=_brevity)])}}
"""Arguments an environment cannot run without (judged-v0 needs a rubric; a function criterion here)."""

SEED_BLIND = {"guess-number-v0"}
"""Environments whose first observation is the same for every seed (guess-number hides its number)."""


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_agentrl_check_env(env_id):
    env = agentrl.make(env_id, **NEEDS.get(env_id, {}))
    try:
        if env_id in SEED_BLIND:
            with pytest.warns(UserWarning, match="six seeds gave the same first observation"):
                agentrl.check_env(env)
        else:
            agentrl.check_env(env)
    finally:
        run_sync(env.close())


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_gymnasium_check_env(env_id):
    env = gymnasium.make(f"agentrl/{env_id}", **NEEDS.get(env_id, {}))
    try:
        gymnasium_check_env(env.unwrapped)
    finally:
        env.close()


def test_gymnasium_view_of_a_tool_turn():
    """The Gymnasium bridge returns the standard 5-tuple; the typed parts of the step (parsed message, tool
    records) travel as plain dicts under info["agentrl"], without timings; the env's own info is kept."""
    env = gymnasium.make("agentrl/calculator-v0", max_episode_steps=5)
    try:
        env.reset(seed=5)
        call = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
        obs, reward, terminated, truncated, info = env.step(call)
        assert '"content": "42"' in obs and (reward, terminated, truncated) == (0.0, False, False)
        assert info["agentrl"]["assistant_message"]["tool_calls"][0]["function"]["name"] == "calculator"
        (record,) = info["agentrl"]["tool_calls"]
        assert record["status"] == "ok" and record["output"] == "42" and "duration_s" not in record
        for _ in range(4):  # Gymnasium's own turn limit, for a standalone user
            *_, terminated, truncated, _ = env.step(call)
        assert truncated and not terminated
    finally:
        env.close()
