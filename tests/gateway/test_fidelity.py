"""Token fidelity: the same conversation through the gateway (real HTTP, real openai client) and through a
native Env rollout gives identical token ids, masks, log-probs and provenance; the audit passes."""

from __future__ import annotations

import pytest

from agentrl import JsonlStore, read_trajectories
from agentrl.audit import audit_trajectory
from agentrl.replay import check
from agentrl.rollout import RolloutConfig, run_episode
from agentrl.trainers.gateway import Gateway
from agentrl.types import StopReason

from .helpers import EchoToolEnv, echo_agent, scripted


async def native(renderer):
    env = EchoToolEnv()
    try:
        return await run_episode(
            env, scripted(renderer), renderer, RolloutConfig(max_turns=8, audit=True), seed=0
        )
    finally:
        await env.close()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_gateway_equals_native_rollout(renderer, tmp_path, stream):
    ref = await native(renderer)
    assert ref.num_turns == 3 and ref.reward == 1.0 and not ref.errors
    store = JsonlStore(tmp_path / "trajectories.jsonl")
    async with Gateway(scripted(renderer), renderer, store=store) as gw:
        reward = await echo_agent(gw.base_url("s1"), stream=stream)
        (traj,) = await gw.finish("s1", reward)
    assert reward == 1.0
    assert traj.token_ids == ref.token_ids
    assert traj.loss_mask == ref.loss_mask
    assert traj.logprobs == ref.logprobs
    assert traj.segments == ref.segments
    assert traj.messages == ref.messages
    assert traj.actions == ref.actions and traj.rewards == ref.rewards
    assert (traj.terminated, traj.truncated, traj.stop_reason) == (True, False, StopReason.TERMINATED)
    assert [(r.call_id, r.name, r.arguments, r.output) for r in traj.tool_calls] == [
        (r.call_id, r.name, r.arguments, r.output) for r in ref.tool_calls
    ]
    audit_trajectory(traj, renderer)
    (stored,) = read_trajectories(tmp_path / "trajectories.jsonl")
    assert stored.token_ids == traj.token_ids and stored.meta.extra["session_id"] == "s1"
    assert check(stored, renderer.tokenizer).ok
