"""The whole-episode deadline (``RolloutConfig.episode_timeout``, stop reason ``deadline``): whichever step
the episode is in when it passes (generation, an env step, a reset, or between steps that never wait) ends
it there, with the right stop reason and the trajectory intact. Sandboxed tool calls cut by it are tested
in ``tests/sandbox/test_fleet.py``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from agentrl import Env, Message, StepResult
from agentrl.audit import audit_trajectory
from agentrl.errors import ConfigError
from agentrl.rollout import RolloutConfig, run_episode
from agentrl.testing import ScriptedPolicy
from agentrl.types import Action, StopReason

IM_END = 2


def policy(renderer: Any, text: str = "again", delay_s: float = 0.0) -> ScriptedPolicy:
    ids = [*renderer.encode(text), IM_END]
    return ScriptedPolicy([ids], stop_ids=renderer.stop_token_ids, delay_s=delay_s)


class Endless(Env):
    """Never ends the task; ``step_s`` seconds per step (0: a step that returns without ever waiting),
    ``reset_s`` per reset."""

    def __init__(self, step_s: float = 0.0, reset_s: float = 0.0):
        self.step_s, self.reset_s, self.steps = step_s, reset_s, 0

    async def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        if self.reset_s:
            await asyncio.sleep(self.reset_s)
        return (Message("user", "Say again."),), {}

    async def step(self, action: Action) -> StepResult:
        self.steps += 1
        if self.step_s:
            await asyncio.sleep(self.step_s)
        return StepResult(observation=(Message("user", "Again."),), reward=0.0)


MANY = dict(max_turns=100_000, max_new_tokens=16, max_total_tokens=1_000_000, audit=False)


async def test_an_episode_of_instant_steps_ends_at_its_deadline(renderer):
    env = Endless()  # no await ever suspends: only the check between turns can end it
    t = time.monotonic()
    traj = await run_episode(env, policy(renderer), renderer, RolloutConfig(episode_timeout=0.5, **MANY))
    took = time.monotonic() - t
    assert traj.stop_reason is StopReason.DEADLINE and traj.truncated and not traj.terminated
    assert not traj.infra_failure and env.steps > 1
    (err,) = traj.errors
    assert err.kind == "EpisodeDeadline" and "episode_timeout=0.5 s" in err.message and not err.infra
    assert 0.5 <= took < 2.5, took
    audit_trajectory(traj, renderer)


async def test_a_deadline_during_an_env_step_cancels_it_and_keeps_the_sampled_turn(renderer):
    env = Endless(step_s=0.3)
    cfg = RolloutConfig(episode_timeout=1.0, **MANY)
    t = time.monotonic()
    traj = await run_episode(env, policy(renderer), renderer, cfg)
    took = time.monotonic() - t
    assert traj.stop_reason is StopReason.DEADLINE and traj.truncated and not traj.infra_failure
    assert "while the env stepped" in traj.errors[0].message
    assert traj.num_turns == env.steps and len(traj.rewards) == env.steps - 1  # the cut step has no result
    assert traj.messages[-1] == Message("assistant", "again")
    assert 1.0 <= took < 1.6, took
    audit_trajectory(traj, renderer)


async def test_a_deadline_during_generation_ends_without_the_unfinished_turn(renderer):
    env = Endless()
    cfg = RolloutConfig(episode_timeout=0.5, **MANY)
    t = time.monotonic()
    traj = await run_episode(env, policy(renderer, delay_s=30.0), renderer, cfg)
    assert time.monotonic() - t < 1.5
    assert traj.stop_reason is StopReason.DEADLINE and traj.truncated and not traj.infra_failure
    assert "while the policy generated turn 0" in traj.errors[0].message
    assert traj.num_turns == 0 and env.steps == 0


async def test_a_reset_past_the_deadline_is_an_infrastructure_failure(renderer):
    traj = await run_episode(
        Endless(reset_s=30.0), policy(renderer), renderer, RolloutConfig(episode_timeout=0.3)
    )
    assert traj.stop_reason is StopReason.DEADLINE and traj.infra_failure  # no prompt: nothing to train on
    assert "during reset" in traj.errors[0].message


async def test_a_timeout_error_of_the_env_itself_is_not_the_deadline(renderer):
    class Raises(Endless):
        async def step(self, action: Action) -> StepResult:
            raise TimeoutError("the env's own backend timed out")

    traj = await run_episode(Raises(), policy(renderer), renderer, RolloutConfig(episode_timeout=60.0))
    assert traj.stop_reason is StopReason.ENV_ERROR and traj.infra_failure
    assert traj.errors[0].kind == "TimeoutError"


def test_the_deadline_is_on_by_default_and_validated():
    assert RolloutConfig().episode_timeout == 1800.0
    assert RolloutConfig(episode_timeout=None).episode_timeout is None
    for bad in (0, -1.0, float("inf"), float("nan"), True, "60"):
        with pytest.raises(ConfigError, match="episode_timeout must be a positive number of seconds"):
            RolloutConfig(episode_timeout=bad)  # type: ignore[arg-type]
