"""Relative (group-wise) judging in the scheduler: a complete group is judged before any member is reported
(the shipped scripted judge, and a scripted judge behind the real gateway over HTTP), a judge outage fails the
whole group as infrastructure (never reward 0), members without an answer are left out, and a hook may not
swap members."""

from __future__ import annotations

import dataclasses
import re

import pytest

from agentrl.envs.judged import JudgedEnv
from agentrl.errors import ConfigError
from agentrl.rewards import Judge, RelativeJudge, RelativeReward, RewardConfig
from agentrl.rewards.rubric import RELATIVE_TEMPLATE
from agentrl.rollout import RolloutConfig, run_groups
from agentrl.testing import ScriptedJudgeBackend, ScriptedPolicy
from agentrl.trainers.gateway import Gateway, GatewayConfig
from agentrl.types import StopReason

from .test_judge import judge_at, scripted

ANSWERS = ["Calm blue water under a wide sky.", "Waves.", "The sea is big and wet and blue."]
VERDICT = "Answer 1: 8\nAnswer 2: 3\nAnswer 3: 5"
GROUP_ONLY = RewardConfig(judge_url="http://127.0.0.1:9/v1", relative_judge=True)  # the env asks no judge


def relative(backend, retries: int = 0) -> RelativeReward:
    return RelativeReward(RelativeJudge(Judge(backend, RELATIVE_TEMPLATE, retries=retries)))


async def run(renderer, hook, *, seeds=(0,), size=3, answers=ANSWERS, max_new_tokens=24):
    policy = scripted(renderer, answers)
    cfg = RolloutConfig(max_turns=1, max_new_tokens=max_new_tokens)
    return [
        done
        async for done in run_groups(
            lambda: JudgedEnv(GROUP_ONLY),
            policy,
            renderer,
            cfg,
            seeds=seeds,
            group_size=size,
            finish_group=hook,
        )
    ]


def scores_by_position(prompt: str, verdict: str) -> dict[str, float]:
    """answer text -> the score the verdict gave its position in the prompt."""
    given = {int(k): float(v) / 10 for k, v in re.findall(r"Answer (\d+): (\d+)", verdict)}
    blocks = re.findall(r"Answer (\d+):\n(.*?)(?=\n\nAnswer \d+:|\n\nReply)", prompt, re.S)
    return {text: given[int(k)] for k, text in blocks}


async def test_a_complete_group_is_judged_in_one_call_before_any_member_is_reported(renderer):
    backend = ScriptedJudgeBackend([VERDICT])
    events = await run(renderer, relative(backend), seeds=(0, 1))
    # members come together once their group is judged: the group rides on its last member
    assert [d.group is not None for d in events] == [False, False, True] * 2
    assert len(backend.prompts) <= 2  # one call per group (two seeds may draw the same question: cached)
    assert all(d.trajectory.reward_terms[0].name == "relative" for d in events)

    backend = ScriptedJudgeBackend([VERDICT])
    events = await run(renderer, relative(backend))  # one group: three different answers
    assert len(backend.prompts) == 1
    for done in events:
        t = done.trajectory
        (term,) = t.reward_terms
        (call,) = term.judge_calls
        want = scores_by_position(call.prompt, call.raw)[t.actions[-1]]
        assert (term.name, term.turn, term.score, t.rewards) == ("relative", 0, want, (want,))
        assert not t.infra_failure and t.stop_reason is StopReason.TERMINATED
    group = events[2].group
    assert group is not None and sorted(group.rewards) == [0.3, 0.5, 0.8]
    assert len({d.trajectory.reward_terms[0].judge_calls[0].key for d in events[:3]}) == 1


async def test_a_scripted_judge_behind_the_gateway_scores_the_group_over_http(renderer):
    serve = GatewayConfig(max_turns=100_000, max_new_tokens=64)
    async with Gateway(scripted(renderer, [VERDICT]), renderer, serve) as gw:
        hook = RelativeReward(RelativeJudge(judge_at(gw).replace(template=RELATIVE_TEMPLATE, max_tokens=64)))
        events = await run(renderer, hook)
        assert len(gw.core.policy.calls) == 1 and not gw.core.sessions
    assert sorted(d.trajectory.reward for d in events) == [0.3, 0.5, 0.8]


async def test_a_judge_outage_fails_the_whole_group_as_infrastructure_never_zero(renderer):
    events = await run(renderer, relative(ScriptedJudgeBackend(["I cannot rank these."]), retries=1))
    group = events[-1].group
    assert group is not None and group.usable() is None  # the trainer drops it (INFRA_DROP)
    for t in group:
        assert t.infra_failure and t.stop_reason is StopReason.JUDGE_ERROR
        assert t.reward_terms == () and t.errors[-1].kind == "JudgeError" and t.errors[-1].infra


async def test_an_answer_cut_by_the_token_limit_is_not_judged(renderer):
    stop = renderer.stop_token_ids[0]
    turns = [[*renderer.encode("Calm."), stop], list(renderer.encode(" long" * 40))]  # one ends, one is cut
    policy_answers = ScriptedPolicy(turns, stop_ids=renderer.stop_token_ids)
    backend = ScriptedJudgeBackend(["Answer 1: 9"])
    cfg = RolloutConfig(max_turns=1, max_new_tokens=8)
    events = [
        d
        async for d in run_groups(
            lambda: JudgedEnv(GROUP_ONLY),
            policy_answers,
            renderer,
            cfg,
            seeds=(0,),
            group_size=2,
            finish_group=relative(backend),
        )
    ]
    by_stop = {d.trajectory.stop_reason: d.trajectory for d in events}
    assert by_stop[StopReason.TERMINATED].reward == 0.9
    cut = by_stop[StopReason.TURN_TOKENS]
    assert cut.reward == 0.0 and cut.reward_terms == () and "long" not in backend.prompts[0]


async def test_a_hook_may_not_drop_or_swap_members(renderer):
    async def drops_one(group):
        return dataclasses.replace(group, trajectories=group.trajectories[:-1])

    with pytest.raises(ConfigError, match="finish_group hook must return"):
        await run(renderer, drops_one, size=2)


def test_relative_judge_settings():
    with pytest.raises(ConfigError, match="relative-judge needs a judge"):
        RewardConfig(relative_judge=True)
    assert not GROUP_ONLY.per_answer and GROUP_ONLY.group_reward() is GROUP_ONLY.group_reward()
    assert RewardConfig(judge_url="http://127.0.0.1:9/v1").group_reward() is None
    judge = GROUP_ONLY.group_reward().judge.judge
    assert judge.template == RELATIVE_TEMPLATE and judge.settings.max_tokens >= 256
    with pytest.raises(ConfigError, match="scores groups only"):
        GROUP_ONLY.rubric_for_run()
