"""Every registered environment honours agentrl's Env contract and passes Gymnasium's own checker."""

from __future__ import annotations

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env as gymnasium_check_env

import agentrl
from agentrl._sync import run_sync

ENV_IDS = agentrl.list_envs()


def test_the_catalogue_holds_the_shipped_environments():
    assert {"math-tir-v0", "calculator-v0", "shop-v0", "guess-number-v0", "exact-answer-v0"} <= set(ENV_IDS)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_agentrl_check_env(env_id):
    env = agentrl.make(env_id)
    try:
        agentrl.check_env(env)
    finally:
        run_sync(env.close())


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_gymnasium_check_env(env_id):
    env = gymnasium.make(f"agentrl/{env_id}")
    try:
        gymnasium_check_env(env.unwrapped)
    finally:
        env.close()
