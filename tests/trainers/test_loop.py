"""The one training loop (trainers/loop.py): the episode limit holds per step with steps in flight, an
``--agent`` trains asynchronously through the real gateway, and the stop helper cancels what it races."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
from pathlib import Path

from agentrl import read_trajectories
from agentrl.learner import LearnerConfig
from agentrl.metrics import read_metrics
from agentrl.rollout import RolloutConfig
from agentrl.testing import RecordingWeightSink, ScriptedPolicy
from agentrl.trainers.evaluate import EvalConfig
from agentrl.trainers.local import local_runtime
from agentrl.trainers.loop import until_stopped
from agentrl.trainers.train import TrainConfig, train

ROOT = Path(__file__).resolve().parents[2]


class CountingSampler:
    """A sampler that counts the turns it samples at once (an episode has at most one in flight)."""

    def __init__(self, inner):
        self.inner = inner
        self.now = 0
        self.most = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def generate(self, prompt_ids, sampling):
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            return await self.inner.generate(prompt_ids, sampling)
        finally:
            self.now -= 1


def test_the_episode_limit_is_shared_by_every_group_in_flight(tmp_path, tok):
    # S = 1: two steps' groups (4 groups of 3 episodes) run at once; --rollout.concurrency 2 must bound the
    # episodes in flight in all of them together (before: each group had its own limit of 2, so up to 8).
    stop = tok.convert_tokens_to_ids("<|im_end|>")

    def turn(prompt_ids, sampling):
        guess = 1 + int(hashlib.sha256(str(sampling.seed).encode()).hexdigest(), 16) % 3
        return [*tok.encode(str(guess), add_special_tokens=False), stop]

    sampler = CountingSampler(
        RecordingWeightSink(ScriptedPolicy(turn, with_sampling=True, stop_ids=[stop], delay_s=0.05))
    )
    cfg = TrainConfig(
        model="tiny",
        env="guess-number-v0",
        env_kwargs={"low": 1, "high": 3, "max_guesses": 3},
        group_size=3,
        groups_per_step=2,
        steps=3,
        max_staleness=1,
        out=str(tmp_path / "run"),
        progress=False,
        eval=EvalConfig(tasks=0),
        rollout=RolloutConfig(max_turns=3, max_new_tokens=8, max_total_tokens=512, seed=5, concurrency=2),
        learner=LearnerConfig(lr=5e-3),
    )
    run = asyncio.run(train(cfg, runtime=functools.partial(local_runtime, sampler=sampler)))
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2]
    assert len(list(read_trajectories(run))) == 3 * 2 * 3
    assert sampler.most == 2  # the limit was reached, never passed


def test_an_agent_trains_asynchronously_through_the_gateway(tmp_path):
    # The real tiny model (HF sampler, its own copy of the weights at S = 1) behind the real gateway, the
    # README's openai-client agent: two steps, the second's groups sampled while the first one learned.
    cfg = TrainConfig(
        model="tiny",
        agent=f"{ROOT / 'examples' / 'gateway_agent.py'}:solve",
        env="calculator-v0",
        steps=2,
        group_size=2,
        groups_per_step=2,
        max_staleness=1,
        out=str(tmp_path / "run"),
        progress=False,
    )
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, max_new_tokens=24))
    run = asyncio.run(train(cfg))
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1]
    assert all(r["staleness/max"] <= 1 and r["async/max_staleness_seen"] <= 1 for r in rows)
    trajs = list(read_trajectories(run))
    assert len(trajs) == 8 and len({t.meta.group_id for t in trajs}) == 4
    assert all(t.meta.task_id.startswith("calculator-v0:") for t in trajs)
    assert all(t.meta.extra["source"] == "gateway" and not t.infra_failure for t in trajs)
    assert sorted({t.meta.step for t in trajs}) == [0, 1]


async def test_until_stopped_returns_the_result_or_cancels_on_stop():
    stop = asyncio.Event()
    assert await until_stopped(asyncio.sleep(0, "done"), stop) == (True, "done")
    cancelled = asyncio.Event()

    async def forever():
        try:
            await asyncio.sleep(60)
        finally:
            cancelled.set()

    asyncio.get_running_loop().call_later(0.05, stop.set)
    assert await until_stopped(forever(), stop) == (False, None)
    assert cancelled.is_set()
