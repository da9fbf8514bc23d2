"""ToolEnv plumbing: prompt, parsing, tool messages, the typed step result, sandbox lifecycle; the turn limit
is the rollout's."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest

from agentrl import (
    Action,
    ExecResult,
    ExecStatus,
    Message,
    StepResult,
    StopReason,
    ToolContext,
    ToolStatus,
)
from agentrl.envs.tool_env import Task, ToolEnv
from agentrl.errors import ConfigError, EnvContractError
from agentrl.testing import FakeSandbox
from agentrl.tools import calculator, python


def note(text: str, context: ToolContext) -> str:
    """Read the episode's note.

    Args:
        text: A prefix.
    """
    return text + context.extra["note"]


class Tiny(ToolEnv):
    """Answer a seeded number; tools: calculator, a plain function, and python."""

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("sandbox_factory", self.new_sandbox)
        super().__init__([calculator, note, python], **kwargs)
        self.sandboxes: list[FakeSandbox] = []

    def new_sandbox(self) -> FakeSandbox:
        self.sandboxes.append(FakeSandbox())
        return self.sandboxes[-1]

    def make_task(self, options: dict[str, Any]) -> Task:
        n = self.rng.randint(1, 1000)
        return Task(f"Say {n}.", answer=n, extra={"note": f"#{n}"}, info={"n": n})


def hermes(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


async def test_prompt_has_system_instructions_then_task():
    env = Tiny(system_prompt="Be brief.")
    obs, info = await env.reset(seed=3)
    assert [m.role for m in obs] == ["system", "user"]
    assert obs[0].content.startswith("Be brief.\n\n# Tools") and '"name": "note"' in obs[0].content
    assert obs[1].content == f"Say {info['n']}." and env.tools == ()
    templ = Tiny(system_prompt="Before {tools} after", tools_in_prompt=False)
    obs, _ = await templ.reset(seed=3)
    assert obs[0].content == "Before  after"
    assert [s["function"]["name"] for s in templ.tools] == ["calculator", "note", "python"]


async def test_tool_turn_returns_tool_messages_and_records():
    env = Tiny()
    _, info = await env.reset(seed=1)
    text = "Checking." + hermes("calculator", expression="6*7") + hermes("note", text="n=")
    res = await env.step(Action(text))
    assert isinstance(res, StepResult) and (res.reward, res.terminated, res.truncated) == (0.0, False, False)
    assistant = res.assistant_message
    assert assistant.role == "assistant" and assistant.content == "Checking."
    assert [c.id for c in assistant.tool_calls] == ["call_0_0", "call_0_1"]
    assert res.observation == (
        Message("tool", "42", tool_call_id="call_0_0", name="calculator"),
        Message("tool", f"n=#{info['n']}", tool_call_id="call_0_1", name="note"),
    )
    records = res.tool_calls
    assert [r.status for r in records] == [ToolStatus.OK, ToolStatus.OK] and records[0].turn == 0
    assert res.info == {} and res.infra_error is None  # info stays the env author's
    res = await env.step(Action(f"Answer: {info['n']}"))
    assert (res.observation, res.reward, res.terminated, res.truncated) == ((), 1.0, True, False)
    assert res.tool_calls == () and not res.assistant_message.tool_calls
    with pytest.raises(EnvContractError, match="after the end"):
        await env.step(Action("again"))


async def test_wrong_or_missing_answers_score_zero():
    env = Tiny()
    _, info = await env.reset(seed=1)
    assert (await env.step(Action(f"Answer: {info['n'] + 1}"))).reward == 0.0
    await env.reset(seed=1)
    res = await env.step(Action("no idea"))
    assert (res.reward, res.terminated, res.truncated) == (0.0, True, False)


async def test_malformed_calls_are_answered_and_the_episode_goes_on():
    env = Tiny()
    await env.reset(seed=1)
    res = await env.step(Action("<tool_call>{oops</tool_call>"))
    assert not (res.terminated or res.truncated) and res.reward == 0.0
    assert res.tool_calls[0].status is ToolStatus.PARSE_ERROR
    assert res.observation[0].role == "tool" and "invalid JSON" in res.observation[0].content


async def test_the_turn_limit_is_the_rollouts(renderer):
    """ToolEnv has no turn limit of its own: a model that keeps calling tools is stopped by the rollout's
    max_turns (stop reason max_turns), the one owner of that setting."""
    from agentrl.rollout import RolloutConfig, run_episode
    from agentrl.testing import ScriptedPolicy

    with pytest.raises(TypeError, match="max_turns"):
        Tiny(max_turns=2)
    call = [*renderer.encode(hermes("calculator", expression="1+1")), *renderer.stop_token_ids[:1]]
    policy = ScriptedPolicy([call], stop_ids=renderer.stop_token_ids)
    cfg = RolloutConfig(max_turns=3, max_new_tokens=64, audit=True)
    traj = await run_episode(Tiny(), policy, renderer, cfg, seed=1)
    assert traj.stop_reason is StopReason.MAX_TURNS and traj.truncated and traj.num_turns == 3
    assert [r.status for r in traj.tool_calls] == [ToolStatus.OK] * 3


async def test_sandbox_is_opened_lazily_persists_in_an_episode_and_is_closed_on_reset_and_close():
    env = Tiny()
    await env.reset(seed=1)
    await env.step(Action(hermes("calculator", expression="1")))
    assert env.sandboxes == []  # no python call, no sandbox
    await env.step(Action(hermes("python", code="x = 41")))
    obs = (await env.step(Action(hermes("python", code="print(x + 1)")))).observation
    assert obs[0].content == "42" and len(env.sandboxes) == 1
    await env.reset(seed=2)
    assert env.sandboxes[0].closed
    obs = (await env.step(Action(hermes("python", code="print(x)")))).observation
    assert "NameError" in obs[0].content and len(env.sandboxes) == 2
    await env.close()
    assert env.sandboxes[1].closed
    await env.close()  # idempotent


async def test_sandbox_pool_is_acquired_and_released():
    class Pool:
        def __init__(self):
            self.out: list[FakeSandbox] = []
            self.back: list[FakeSandbox] = []

        @contextlib.asynccontextmanager
        async def acquire(self):
            self.out.append(FakeSandbox())
            try:
                yield self.out[-1]
            finally:
                self.back.append(self.out[-1])

    pool = Pool()
    env = Tiny(sandbox_factory=None, sandbox_pool=pool)
    await env.reset(seed=1)
    await env.step(Action(hermes("python", code="1")))
    await env.reset(seed=1)
    assert pool.back == pool.out and len(pool.out) == 1
    with pytest.raises(ConfigError, match="not both"):
        Tiny(sandbox_pool=pool)


async def test_sandbox_failures_are_sandbox_error_records_and_end_the_episode():
    class Dead(FakeSandbox):
        async def run(self, code: str, *, timeout: float | None = None) -> ExecResult:
            return ExecResult(ExecStatus.SANDBOX_ERROR, message="worker crashed")

    for factory in (Dead, lambda: (_ for _ in ()).throw(OSError("no bwrap"))):
        env = Tiny(sandbox_factory=factory)
        await env.reset(seed=1)
        text = hermes("python", code="1") + hermes("calculator", expression="2")
        res = await env.step(Action(text))
        assert (res.observation, res.reward, res.terminated, res.truncated) == ((), 0.0, False, True)
        first, second = res.tool_calls
        assert first.status is ToolStatus.SANDBOX_ERROR and second.status is ToolStatus.SANDBOX_ERROR
        assert "worker crashed" in res.infra_error or "no bwrap" in res.infra_error


async def test_async_factory_and_configuration_errors():
    async def factory() -> FakeSandbox:
        return FakeSandbox()

    env = Tiny(sandbox_factory=factory)
    await env.reset(seed=1)
    assert (await env.step(Action(hermes("python", code="print(5)")))).observation[0].content == "5"
    with pytest.raises(ConfigError, match="max_calls_per_turn"):
        Tiny(max_calls_per_turn=0)


async def test_no_sandbox_without_a_tool_that_needs_one():
    class NoCode(ToolEnv):
        def make_task(self, options):
            return Task("hi", answer="hello")

    env = NoCode([calculator], sandbox_factory=lambda: pytest.fail("must not open a sandbox"))
    await env.reset(seed=0)
    assert env.context.sandbox is None
    assert (await env.step(Action("Answer: hello"))).reward == 1.0


async def test_on_final_must_return_a_step_result():
    class Old(Tiny):
        async def on_final(self, parsed):
            return (), 1.0, True, False

    env = Old()
    await env.reset(seed=1)
    with pytest.raises(EnvContractError, match="on_final must return a StepResult"):
        await env.step(Action("Answer: 1"))
