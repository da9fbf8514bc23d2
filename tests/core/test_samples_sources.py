"""The sources of multi-sample episodes: env compaction, policy compaction, a sub-agent, and the scheduler.

Every sample is audited (``RolloutConfig(audit=True)`` runs :func:`agentrl.audit.audit_trajectory` on each
one as it finishes) and the samples of an episode come back linked, in the order they were sampled.
"""

import asyncio
import dataclasses

import pytest

from agentrl import Env, Message, StepResult
from agentrl.audit import audit_trajectory
from agentrl.envs.long_chain import ContextMode, LongChainEnv, expert_turns
from agentrl.errors import ConfigError
from agentrl.rollout import RolloutConfig, run_episode, run_group
from agentrl.samples import link_samples, run_samples, run_subagent
from agentrl.testing import ScriptedPolicy
from agentrl.types import StopReason, TokenSource

IM_END = 2
CFG = RolloutConfig(max_turns=32, max_new_tokens=64, max_total_tokens=4096, audit=True)


def policy_for(renderer, texts):
    return ScriptedPolicy([[*renderer.encode(t), IM_END] for t in texts], stop_ids=renderer.stop_token_ids)


def chain(mode, k=6, every=2, seed=3):
    env = LongChainEnv(k=k, context=mode, compact_every=every)
    asyncio.run(env.reset(seed=seed))
    return env.numbers, expert_turns(env.numbers, mode, every)


def assert_linked(samples, renderer):
    (eid,) = {s.meta.episode_id for s in samples}
    assert eid
    assert [s.meta.sample_index for s in samples] == list(range(len(samples)))
    assert {s.meta.num_samples for s in samples} == {len(samples)}
    assert len({(s.meta.group_id, s.meta.task_id) for s in samples}) == 1
    for s in samples:
        audit_trajectory(s, renderer)


def test_env_compaction_splits_the_episode_into_linked_samples(renderer):
    nums, turns = chain(ContextMode.ENV_COMPACTION)
    env = LongChainEnv(k=6, context="env-compaction", compact_every=2)
    samples = asyncio.run(run_samples(env, policy_for(renderer, turns), renderer, CFG, seed=3))
    assert len(samples) == 3
    assert_linked(samples, renderer)
    assert [s.stop_reason for s in samples] == [StopReason.COMPACTED] * 2 + [StopReason.TERMINATED]
    assert [s.num_turns for s in samples] == [2, 2, 2]
    assert not samples[0].terminated and not samples[0].truncated
    # The env's code wrote the summary: the running sum, then the numbers still to add.
    assert samples[1].messages[0] == Message("user", " ".join(map(str, [sum(nums[:3]), *nums[3:]])))
    assert samples[2].messages[0] == Message("user", " ".join(map(str, [sum(nums[:5]), nums[5]])))
    assert sum(s.reward for s in samples) == 1.0 and samples[-1].rewards[-1] == 1.0
    # Each sample is token-faithful in its own context: it starts with its own prompt.
    assert all(s.segments[0].source is TokenSource.PROMPT for s in samples)


def test_policy_compaction_trains_the_summary_turn_and_seeds_the_next_sample(renderer):
    _, turns = chain(ContextMode.POLICY_COMPACTION)
    assert sum(t.startswith("S") for t in turns) == 2
    env = LongChainEnv(k=6, context="policy-compaction", compact_every=2)
    samples = asyncio.run(run_samples(env, policy_for(renderer, turns), renderer, CFG, seed=3))
    assert len(samples) == 3
    assert_linked(samples, renderer)
    first = samples[0]
    summary = first.messages[-1]
    assert summary.role == "assistant" and summary.content == turns[2]
    assert first.messages[-2] == Message("user", "C")  # the env asked for it
    assert first.segments[-1].source is TokenSource.MODEL  # sampled, so trained (mask 1, log-probs)
    assert first.stop_reason is StopReason.COMPACTED and first.num_turns == 3
    assert samples[1].messages[0] == Message("user", turns[2][1:])  # the policy's words, verbatim
    assert samples[-1].reward == 1.0


def test_policy_compaction_without_a_summary_ends_the_episode(renderer):
    _, turns = chain(ContextMode.POLICY_COMPACTION)
    bad = [*turns[:2], "R1"]  # asked for a summary, answers instead
    env = LongChainEnv(k=6, context="policy-compaction", compact_every=2)
    samples = asyncio.run(run_samples(env, policy_for(renderer, bad), renderer, CFG, seed=3))
    assert len(samples) == 1 and samples[0].terminated and samples[0].reward == 0.0


def test_wrong_policy_summary_carries_a_wrong_sum_forward(renderer):
    _, turns = chain(ContextMode.POLICY_COMPACTION, k=4, every=2)
    acc, *rest = turns[2][1:].split()
    turns = [*turns[:2], f"S{int(acc) + 1} {' '.join(rest)}", *turns[3:]]
    turns[-1] = f"R{int(turns[-1][1:]) + 1}"  # the policy adds right from its (wrong) summary
    env = LongChainEnv(k=4, context="policy-compaction", compact_every=2)
    samples = asyncio.run(run_samples(env, policy_for(renderer, turns), renderer, CFG, seed=3))
    assert len(samples) == 2 and sum(s.reward for s in samples) == 0.0


def test_truncate_mode_is_cut_by_the_context_budget(renderer):
    _, turns = chain(ContextMode.TRUNCATE, k=16, every=4)
    small = dataclasses.replace(CFG, max_total_tokens=400)
    for mode, budget, reward, stop in (
        ("truncate", small, 0.0, StopReason.MAX_TOKENS),
        ("truncate", CFG, 1.0, StopReason.TERMINATED),
    ):
        env = LongChainEnv(k=16, context=mode, compact_every=4)
        samples = asyncio.run(run_samples(env, policy_for(renderer, turns), renderer, budget, seed=3))
        assert len(samples) == 1 and samples[0].stop_reason is stop and samples[0].reward == reward
    # The same budget holds every sample of the compacting modes: they finish the chain.
    _, turns = chain(ContextMode.ENV_COMPACTION, k=16, every=4)
    env = LongChainEnv(k=16, context="env-compaction", compact_every=4)
    samples = asyncio.run(run_samples(env, policy_for(renderer, turns), renderer, small, seed=3))
    assert len(samples) == 4 and sum(s.reward for s in samples) == 1.0
    assert max(len(s.token_ids) for s in samples) < 400


def test_compaction_without_a_sample_sink_is_an_env_error(renderer):
    _, turns = chain(ContextMode.ENV_COMPACTION)
    env = LongChainEnv(k=6, context="env-compaction", compact_every=2)
    traj = asyncio.run(run_episode(env, policy_for(renderer, turns), renderer, CFG, seed=3))
    assert traj.stop_reason is StopReason.ENV_ERROR and traj.infra_failure
    assert "run_samples" in traj.errors[0].message


class _Child(Env):
    """The sub-agent's task: its own prompt, one answer, no reward of its own."""

    async def reset(self, *, seed=None, options=None):
        self.seed(seed)
        return (Message("user", "Name a colour."),), {}

    async def step(self, action):
        return StepResult(terminated=True)


class _Parent(Env):
    """Turn 1 calls the ``delegate`` tool (a sub-agent); turn 2 must repeat the sub-agent's answer."""

    async def reset(self, *, seed=None, options=None):
        self.seed(seed)
        self.answer = None
        return (Message("user", "Ask a helper for a colour, then say it."),), {}

    async def step(self, action):
        if self.answer is None:
            result = await run_subagent(_Child(), seed=1)
            self.answer = result.answer
            return StepResult((Message("user", f"helper says: {result.answer}"),))
        return StepResult(reward=float(action.text.strip() == self.answer), terminated=True)


def test_a_tool_runs_a_sub_agent_whose_samples_join_the_episode(renderer):
    policy = policy_for(renderer, ["delegate", "blue", "blue"])
    samples = asyncio.run(run_samples(_Parent(), policy, renderer, CFG, seed=0))
    assert len(samples) == 2
    assert_linked(samples, renderer)
    parent, child = samples
    assert parent.messages[0].content.startswith("Ask") and child.messages[0].content == "Name a colour."
    assert child.meta.extra["subagent_env"] == "_Child" and "subagent_env" not in parent.meta.extra
    assert parent.messages[2] == Message("user", "helper says: blue")
    assert parent.reward == 1.0 and child.reward == 0.0
    # The sub-agent's turn was sampled in between the parent's two turns (its own context).
    assert policy.calls[1][: len(child.token_ids) - 2] == child.token_ids[: len(child.token_ids) - 2]


def test_run_subagent_outside_an_episode_is_refused():
    with pytest.raises(ConfigError, match="run_samples"):
        asyncio.run(run_subagent(_Child()))


def test_link_samples_spreads_an_infra_failure_over_the_episode(renderer):
    _, turns = chain(ContextMode.ENV_COMPACTION)
    env = LongChainEnv(k=6, context="env-compaction", compact_every=2)
    samples = asyncio.run(run_samples(env, policy_for(renderer, turns), renderer, CFG, seed=3))
    broken = dataclasses.replace(samples[1], stop_reason=StopReason.SANDBOX_ERROR)
    from agentrl.types import EpisodeFailure

    broken = dataclasses.replace(broken, errors=(EpisodeFailure("SandboxError", "x", 0, True),))
    linked = link_samples([samples[0], broken, samples[2]])
    assert all(t.infra_failure for t in linked)


def test_the_scheduler_groups_every_sample_of_every_member(renderer):
    _, turns = chain(ContextMode.ENV_COMPACTION)
    group = asyncio.run(
        run_group(
            lambda: LongChainEnv(k=6, context="env-compaction", compact_every=2),
            policy_for(renderer, turns),
            renderer,
            dataclasses.replace(CFG, concurrency=1),
            group_size=2,
            seed=3,
        )
    )
    assert len(group) == 6
    episodes = {}
    for t in group.trajectories:
        episodes.setdefault(t.meta.episode_id, []).append(t)
    assert len(episodes) == 2
    for samples in episodes.values():
        assert [s.meta.sample_index for s in samples] == [0, 1, 2]
        assert_linked(samples, renderer)


def test_episode_returns_sum_over_samples_and_drop_broken_episodes(renderer):
    from agentrl.samples import episode_returns, episodes_of
    from agentrl.types import EpisodeFailure

    _, turns = chain(ContextMode.ENV_COMPACTION)
    env = LongChainEnv(k=6, context="env-compaction", compact_every=2)
    ok = asyncio.run(run_samples(env, policy_for(renderer, turns), renderer, CFG, seed=3))
    env = LongChainEnv(k=6, context="env-compaction", compact_every=2)
    other = asyncio.run(run_samples(env, policy_for(renderer, turns), renderer, CFG, seed=3))
    broken = link_samples(
        [other[0], dataclasses.replace(other[1], errors=(EpisodeFailure("SandboxError", "x", 0, True),))]
    )
    mixed = [ok[2], broken[1], ok[0], broken[0], ok[1]]  # any order, as a file may hold them
    assert [[t.meta.sample_index for t in ep] for ep in episodes_of(mixed)] == [[0, 1, 2], [0, 1]]
    assert episode_returns(mixed) == [1.0]


def test_a_tool_env_tool_runs_the_sub_agent(renderer):
    """The same through a ToolEnv: an async ``@tool`` awaits run_subagent (the tool runs in the episode's
    context, so it finds the running episode) and the model reads the sub-agent's answer as tool output."""
    import json

    from agentrl.envs import Task, ToolEnv
    from agentrl.tools import tool

    @tool
    async def delegate(question: str) -> str:
        """Ask a helper agent.

        Args:
            question: What to ask.
        """
        return (await run_subagent(_Child(), seed=2)).answer

    class Boss(ToolEnv):
        def __init__(self):
            super().__init__([delegate], parser="hermes", tool_timeout=60.0)

        def make_task(self, options):
            return Task(prompt="Ask the helper for a colour, then answer with it.", answer="blue")

    args = json.dumps({"name": "delegate", "arguments": {"question": "colour?"}})
    call = f"<tool_call>\n{args}\n</tool_call>"
    policy = policy_for(renderer, [call, "blue", "Answer: blue"])
    samples = asyncio.run(run_samples(Boss(), policy, renderer, CFG, seed=0))
    assert len(samples) == 2
    assert_linked(samples, renderer)
    boss, helper = samples
    assert helper.meta.extra["subagent_env"] == "_Child" and helper.messages[-1].content == "blue"
    assert boss.tool_calls[0].name == "delegate" and boss.tool_calls[0].output == "blue"
    assert boss.reward == 1.0
