"""A sandbox fleet that never hangs (issue #43, part 3): real bubblewrap sandboxes, whole episodes.

Each case runs :func:`agentrl.rollout.run_episode` over a :class:`ToolEnv` with the python tool and a grader
that runs code in a fresh sandbox, and asserts that the episode ends within its deadline with the right
stop reason and tool status. The ``no_leaks`` fixture of this folder's conftest checks afterwards that no
sandbox process or cgroup is left.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import pytest

from agentrl import ExecResult, ScoreContext, StopReason, ToolStatus
from agentrl.envs.tool_env import Task, ToolEnv
from agentrl.errors import ConfigError, SandboxError
from agentrl.execution import Limits
from agentrl.rollout import RolloutConfig, run_episode
from agentrl.sandbox import LocalSandbox, SandboxPool
from agentrl.sandbox.pool import MAX_STARTING_ENV
from agentrl.testing import ScriptedPolicy
from agentrl.tools import ParsedTurn, python

from .conftest import SMALL, requires_bwrap

pytestmark = [requires_bwrap, pytest.mark.usefixtures("no_leaks")]

LONG = Limits(wall_s=20.0, memory_bytes=SMALL.memory_bytes, max_processes=32, scratch_bytes=16 * 1024 * 1024)
SLEEP = "import time; time.sleep(30)"


class Graded(ToolEnv):
    """The python tool; the final answer is graded by running ``grade_code`` in a fresh sandbox."""

    def __init__(self, grade_code: str = "print('ok')", **kwargs: Any):
        super().__init__([python], parser="hermes", **kwargs)
        self.grade_code = grade_code

    def make_task(self, options: dict[str, Any]) -> Task:
        return Task("Compute something with python, then answer.")

    async def grade(self, final: ParsedTurn, ctx: ScoreContext) -> float:
        result = await ctx.run_fresh(self.grade_code, timeout=20.0)
        return float(result.stdout == "ok\n")


class Recorder:
    """A sandbox factory that keeps every sandbox it made (so a test can kill one from outside)."""

    def __init__(self, make: Callable[[], Any] = lambda: LocalSandbox(LONG)):
        self.make = make
        self.made: list[Any] = []

    def __call__(self) -> Any:
        sb = self.make()
        self.made.append(sb)
        return sb


class HangingStart:
    """A sandbox whose start never finishes: it starts a real LocalSandbox (processes, a cgroup), then waits
    forever, like a start handshake that never answers. Closing it closes the real one."""

    def __init__(self) -> None:
        self.inner = LocalSandbox(SMALL)

    async def __aenter__(self) -> HangingStart:
        await self.inner.start()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run(self, code: str, *, timeout: float | None = None) -> ExecResult:
        return await self.inner.run(code, timeout=timeout)

    async def reset(self) -> None:
        await self.inner.reset()

    async def close(self) -> None:
        await self.inner.close()


def turns(renderer: Any, *texts: str) -> ScriptedPolicy:
    stop = renderer.stop_token_ids[:1]
    return ScriptedPolicy([[*renderer.encode(t), *stop] for t in texts], stop_ids=renderer.stop_token_ids)


def python_call(code: str) -> str:
    import json

    return "<tool_call>\n" + json.dumps({"name": "python", "arguments": {"code": code}}) + "\n</tool_call>"


CFG = RolloutConfig(max_turns=4, max_new_tokens=128, max_total_tokens=4096)


async def kill_when_busy(made: list[Any], index: int = 0) -> None:
    """SIGKILL the worker of ``made[index]`` once it is running a call (as a crashed host would)."""
    while len(made) <= index or made[index]._worker is None:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.5)  # the call is in flight: its code sleeps 30 s
    os.kill(made[index]._worker.proc.pid, 9)


async def test_sandbox_killed_mid_call_is_a_sandbox_error_within_the_call_deadline(renderer):
    factory = Recorder()
    env = Graded(sandbox_factory=factory, tool_timeout=25.0)
    policy = turns(renderer, python_call(SLEEP), "done")
    t = time.monotonic()
    killer = asyncio.ensure_future(kill_when_busy(factory.made))
    try:
        traj = await run_episode(env, policy, renderer, CFG, seed=1)
    finally:
        killer.cancel()
        await env.close()
    took = time.monotonic() - t
    assert traj.stop_reason is StopReason.SANDBOX_ERROR and traj.infra_failure, traj.errors
    assert [r.status for r in traj.tool_calls] == [ToolStatus.SANDBOX_ERROR]
    assert took < 5.0, f"a dead sandbox took {took:.1f} s to notice (tool deadline 25 s)"


async def test_sandbox_killed_mid_grade_is_a_sandbox_error_not_reward_0(renderer):
    factory = Recorder()
    env = Graded(grade_code=SLEEP, sandbox_factory=factory, grade_timeout=25.0)
    policy = turns(renderer, "The answer is 4.")
    t = time.monotonic()
    killer = asyncio.ensure_future(kill_when_busy(factory.made))
    try:
        traj = await run_episode(env, policy, renderer, CFG, seed=1)
    finally:
        killer.cancel()
        await env.close()
    took = time.monotonic() - t
    assert traj.stop_reason is StopReason.SANDBOX_ERROR and traj.infra_failure, traj.errors
    assert "grading sandbox failed" in traj.errors[0].message
    assert took < 5.0, f"a dead grading sandbox took {took:.1f} s to notice (grade deadline 25 s)"


async def test_a_sandbox_that_never_starts_fails_the_episode_within_the_start_deadline(renderer):
    env = Graded(sandbox_factory=HangingStart, sandbox_start_timeout=1.0, tool_timeout=30.0)
    policy = turns(renderer, python_call("print(1)"), "done")
    t = time.monotonic()
    try:
        traj = await run_episode(env, policy, renderer, CFG, seed=1)
    finally:
        await env.close()
    took = time.monotonic() - t
    assert traj.stop_reason is StopReason.SANDBOX_ERROR and traj.infra_failure
    (record,) = traj.tool_calls
    assert record.status is ToolStatus.SANDBOX_ERROR  # not TIMEOUT: a slow start is not the model's
    assert took < 3.0, took


async def test_a_sandbox_whose_start_fails_is_a_sandbox_error(renderer):
    env = Graded(sandbox_factory=lambda: LocalSandbox(SMALL, start_timeout=0.001))
    try:
        traj = await run_episode(env, turns(renderer, python_call("print(1)"), "done"), renderer, CFG, seed=1)
    finally:
        await env.close()
    assert traj.stop_reason is StopReason.SANDBOX_ERROR and traj.infra_failure
    assert traj.tool_calls[0].status is ToolStatus.SANDBOX_ERROR


async def test_a_grade_that_never_gets_a_sandbox_ends_at_the_grade_deadline(renderer):
    env = Graded(sandbox_factory=HangingStart, grade_timeout=1.0)
    t = time.monotonic()
    try:
        traj = await run_episode(env, turns(renderer, "The answer is 4."), renderer, CFG, seed=1)
    finally:
        await env.close()
    assert traj.stop_reason is StopReason.SANDBOX_ERROR and traj.infra_failure
    assert "grade_timeout" in traj.errors[0].message
    assert time.monotonic() - t < 3.0


async def test_a_pool_whose_sandboxes_never_start_frees_the_slot_and_says_why():
    pool = SandboxPool(HangingStart, size=1, warm=0, start_timeout=1.0, max_starting=1)
    for _ in range(2):  # the slot of the first failed start is free again
        t = time.monotonic()
        with pytest.raises(SandboxError, match="did not start within 1 s"):
            async with pool.acquire():
                pass
        assert time.monotonic() - t < 2.5
    assert pool.stats.live == 0 and pool.stats.starting == 0
    await pool.close()


async def test_a_pool_at_its_cap_runs_twice_as_many_episodes_starting_one_at_a_time(renderer):
    async with SandboxPool(lambda: LocalSandbox(SMALL), size=2, warm=0, max_starting=1) as pool:
        script = (python_call("print(6 * 7)"), "The answer is 42.")

        async def episode(seed: int) -> Any:  # as agentrl.rollout runs them: a fresh env, closed after
            env = Graded(sandbox_pool=pool, sandbox_start_timeout=20.0)
            try:
                return await run_episode(env, turns(renderer, *script), renderer, CFG, seed=seed)
            finally:
                await env.close()

        t = time.monotonic()
        trajs = await asyncio.gather(*(episode(i) for i in range(4)))
        took = time.monotonic() - t
        stats = pool.stats
    for traj in trajs:
        assert traj.stop_reason is StopReason.TERMINATED, traj.errors
        assert [r.status for r in traj.tool_calls] == [ToolStatus.OK]
        assert sum(traj.rewards) == 1.0
    assert stats.most_starting == 1 and stats.live <= 2 and stats.busy_rejections == 0
    assert took < 30.0


def test_max_starting_default_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(MAX_STARTING_ENV, "3")
    assert SandboxPool(lambda: LocalSandbox(SMALL)).max_starting == 3
    monkeypatch.setenv(MAX_STARTING_ENV, "many")
    with pytest.raises(ConfigError, match=f"{MAX_STARTING_ENV}='many' must be a positive integer"):
        SandboxPool(lambda: LocalSandbox(SMALL))
    with pytest.raises(ConfigError, match="max_starting must be a positive int"):
        SandboxPool(lambda: LocalSandbox(SMALL), max_starting=0)


# -- the whole-episode deadline (RolloutConfig.episode_timeout) over real sandboxed calls --------------------
ENDLESS = RolloutConfig(
    max_turns=100_000, max_new_tokens=128, max_total_tokens=1_000_000, episode_timeout=3.0
)


async def test_an_episode_that_keeps_making_short_tool_calls_ends_at_its_deadline(renderer):
    env = Graded(tool_timeout=25.0, grade_timeout=25.0)
    t = time.monotonic()
    try:
        traj = await run_episode(env, turns(renderer, python_call("print(1)")), renderer, ENDLESS, seed=1)
    finally:
        await env.close()
    took = time.monotonic() - t
    assert traj.stop_reason is StopReason.DEADLINE and traj.truncated and not traj.infra_failure, traj.errors
    assert len(traj.tool_calls) >= 2 and all(r.status is ToolStatus.OK for r in traj.tool_calls)
    assert 3.0 <= took < 5.0, f"the episode ran {took:.1f} s past a 3 s deadline"


@pytest.mark.parametrize("where", ["call", "grade"])
async def test_a_deadline_mid_call_or_mid_grade_cancels_it_and_leaves_no_sandbox(renderer, where):
    if where == "call":  # each step's own deadline (25 s) is longer than what is left of the episode's
        env = Graded(tool_timeout=25.0)
        script = turns(renderer, python_call(SLEEP), "done")
    else:
        env = Graded(grade_code=SLEEP, grade_timeout=25.0)
        script = turns(renderer, "The answer is 4.")
    cfg = dataclasses.replace(ENDLESS, episode_timeout=2.0)
    t = time.monotonic()
    try:
        traj = await run_episode(env, script, renderer, cfg, seed=1)
    finally:
        await env.close()
    took = time.monotonic() - t
    assert traj.stop_reason is StopReason.DEADLINE and traj.truncated and not traj.infra_failure, traj.errors
    assert "while the env stepped turn 0" in traj.errors[0].message
    assert not traj.tool_calls and not traj.rewards  # the cut step recorded nothing, and no reward 0
    assert took < 4.0, took


class GatedReset(LocalSandbox):
    """A real LocalSandbox whose reset waits for ``gate`` first, so a test can hold a reset in progress."""

    gate: asyncio.Event

    async def reset(self) -> None:
        await self.gate.wait()
        await super().reset()


async def test_a_reset_holds_a_start_permit_so_a_new_start_waits_behind_it():
    GatedReset.gate = asyncio.Event()
    got: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    done = asyncio.Event()

    async with SandboxPool(lambda: GatedReset(SMALL), size=2, warm=0, max_starting=1) as pool:

        async def borrow() -> None:
            async with pool.acquire() as sb:
                got.set_result(sb)
                await done.wait()

        async with pool.acquire():
            pass  # released: its reset (a fresh session) takes the only start permit and waits on the gate
        second = asyncio.ensure_future(borrow())
        deadline = time.monotonic() + 10
        while pool.stats.start_waiting == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        stats = pool.stats
        assert (stats.starting, stats.start_waiting, stats.live) == (1, 1, 2), stats
        assert not got.done()
        GatedReset.gate.set()
        sb = await asyncio.wait_for(got, 20)
        assert (await sb.run("print(5)")).stdout == "5\n"
        assert pool.stats.most_starting == 1 and pool.stats.resets == 1
        done.set()
        await second
