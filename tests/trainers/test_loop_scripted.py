"""The training loop on the shipped scripted runtime (agentrl.testing.ScriptedRuntime): no model, no sampler,
so admission, refills, drops and the step outcome each runtime is handed are checked in milliseconds."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from pathlib import Path

from agentrl import read_trajectories
from agentrl.dynamic_sampling import DynamicSampling
from agentrl.metrics import read_metrics
from agentrl.testing import ScriptedRuntime
from agentrl.trainers.loop import INFRA_DROP, STRAGGLER_DROP
from agentrl.trainers.runtime import TrainRuntime
from agentrl.trainers.train import train
from agentrl.trainers.train_setup import TrainConfig


def run(tmp_path: Path, rt: ScriptedRuntime, **kw: object) -> Path:
    base: dict[str, object] = dict(
        model="tiny", group_size=2, groups_per_step=2, steps=3, out=str(tmp_path / "run"), progress=False
    )
    base.update(kw)
    cfg = TrainConfig(**base)  # type: ignore[arg-type]
    return asyncio.run(train(cfg, runtime=lambda c, r: contextlib.nullcontext(rt)))


def test_the_scripted_runtime_is_a_train_runtime() -> None:
    assert isinstance(ScriptedRuntime(), TrainRuntime)


def test_every_call_gets_its_step_and_publish_gets_the_steps_outcome(tmp_path: Path) -> None:
    rt = ScriptedRuntime()
    out = run(tmp_path, rt)
    assert [step for step, _ in rt.updates] == [0, 1, 2] == [o.step for o in rt.outcomes]
    assert Counter(step for step, _ in rt.runs) == {0: 2, 1: 2, 2: 2}
    for (step, groups), outcome in zip(rt.updates, rt.outcomes, strict=True):
        assert sorted(g[0].meta.seed for g in groups) == sorted(outcome.trained) and not outcome.dropped
        assert {t.meta.step for g in groups for t in g} == {step}  # still recorded, never read back
    assert rt.version == 3 and rt.checkpoints == [1, 2, 3]  # --checkpoint-every 1
    assert [r["step"] for r in read_metrics(out)] == [0, 1, 2]
    assert len(list(read_trajectories(out / "trajectories.jsonl"))) == 12


def test_filtered_and_failed_groups_are_dropped_with_the_loops_reason(tmp_path: Path) -> None:
    seeds: list[int] = []

    def reward(seed: int, member: int) -> float | None:
        if seed not in seeds:
            seeds.append(seed)
        first = seeds.index(seed)
        if first == 0:
            return None  # the run's first task: every episode an infrastructure failure
        return 1.0 if first == 1 else float(member)  # the second: no signal; the rest: signal

    rt = ScriptedRuntime(reward)
    run(tmp_path, rt, steps=1, dynamic_sampling=DynamicSampling(max_draws=4))
    (outcome,) = rt.outcomes
    reasons = {d.seed: d.reason for d in outcome.dropped}
    assert reasons == {seeds[0]: INFRA_DROP, seeds[1]: "filtered by dynamic sampling: zero_variance"}
    assert len(outcome.trained) == 2 and set(outcome.trained).isdisjoint(reasons)  # two refills trained
    assert len(rt.runs) == 4


def test_a_straggler_is_dropped_as_one_when_its_step_trains(tmp_path: Path) -> None:
    slow: list[int] = []

    def delay(seed: int) -> float:
        if not slow:
            slow.append(seed)  # the run's first group runs for a minute; the loop must not wait for it
        return 60.0 if seed == slow[0] else 0.0

    rt = ScriptedRuntime(delay_s=delay)
    run(tmp_path, rt, steps=2, max_staleness=1, on_stale="drop")
    first = rt.outcomes[0]
    assert [(d.seed, d.reason) for d in first.dropped] == [(slow[0], STRAGGLER_DROP)]
    assert len(first.trained) == 1 and [o.step for o in rt.outcomes] == [0, 1]
