"""The task of each draw (trainers/task_sampler.py): fresh tasks as a pure function of (seed, step, draw), the
difficulty curriculum's pools (always/never solved tasks drawn less often, never never), its lagged view for
the asynchronous loop, and its state saved and loaded with checkpoints."""

from __future__ import annotations

from collections import Counter

import pytest

from agentrl.errors import ConfigError, StoreError
from agentrl.groups import TrajectoryGroup
from agentrl.run import RunDir
from agentrl.trainers.task_sampler import (
    TaskSampler,
    load_sampler_state,
    refill_seed,
    sampler_state_path,
    save_sampler_state,
)
from agentrl.trainers.train_setup import task_seeds
from agentrl.types import Message, Segment, StopReason, TokenSource, Trajectory, TrajectoryMeta


def _group(seed: int, rewards: list[float]) -> TrajectoryGroup:
    def traj(i: int, r: float) -> Trajectory:
        return Trajectory(
            token_ids=(1, 2),
            loss_mask=(0, 1),
            logprobs=(None, -0.5),
            segments=(Segment(TokenSource.PROMPT, 0, 1, -1, 0), Segment(TokenSource.MODEL, 1, 2, 0, 1)),
            messages=(Message("user", "q"), Message("assistant", "a")),
            tool_calls=(),
            actions=("a",),
            rewards=(r,),
            terminated=True,
            truncated=False,
            stop_reason=StopReason.TERMINATED,
            errors=(),
            meta=TrajectoryMeta(
                env_id="e", seed=seed, task_id=f"e:{seed}", group_id=f"g{seed}", episode_id=f"{i}"
            ),
        )

    return TrajectoryGroup(tuple(traj(i, r) for i, r in enumerate(rewards)))


def test_without_curriculum_the_first_draws_are_task_seeds_and_refills_never_meet_them():
    s = TaskSampler(seed=3, groups_per_step=4, max_draws=12)
    firsts = set()
    refills = set()
    for k in range(200):
        assert s.tasks(k, range(4)) == task_seeds(3, k, 4)
        firsts |= set(task_seeds(3, k, 4))
        refills |= set(s.tasks(k, range(4, 12)))
        assert s.task(k, 5) == refill_seed(3, k, 5, 4, 12)  # asking again: the same task
    assert len(refills) == 200 * 8 and not refills & firsts
    with pytest.raises(ConfigError, match="asked before"):
        s.task(500, 1)
    with pytest.raises(ConfigError, match="outside"):
        TaskSampler(seed=0, groups_per_step=1, max_draws=2).tasks(0, range(3))


def _trained(sampler: TaskSampler, step: int, rewards_of: dict[int, list[float]]) -> list[int]:
    """Draw a step of 4 first draws, 'train' it with the given reward per task kind, return its tasks."""
    tasks = sampler.tasks(step, range(4))
    sampler.observe(step, [_group(t, rewards_of.get(t, [0.0, 1.0])) for t in tasks])
    return tasks


def test_difficulty_pools_draw_solved_and_unsolved_less_often_but_never_never():
    s = TaskSampler(seed=0, groups_per_step=4, max_draws=4, curriculum="difficulty")
    assert s.tasks(0, range(4)) == task_seeds(0, 0, 4)  # nothing known yet: all fresh
    s.observe(0, [_group(0, [1, 1]), _group(1, [0, 0]), _group(2, [0, 1]), _group(3, [1, 1, 0])])
    assert s.pools(1) == {"medium": [2, 3], "solved": [0], "unsolved": [1]}
    counts: Counter[str] = Counter()
    for k in range(1, 400):
        for t in s.tasks(k, range(4)):
            counts["solved" if t == 0 else "unsolved" if t == 1 else "medium" if t in (2, 3) else "new"] += 1
        assert len(set(s._drawn[k])) == 4  # a task at most once per step
    assert counts["medium"] > counts["solved"] > 0 and counts["medium"] > counts["unsolved"] > 0
    assert counts["new"] > counts["solved"]


def test_a_task_moves_between_pools_with_its_recent_groups():
    s = TaskSampler(seed=0, groups_per_step=1, max_draws=1, curriculum="difficulty")
    s.task(0, 0)
    s.observe(0, [_group(0, [0, 0])])
    assert s.pools(1)["unsolved"] == [0]
    for k in range(1, 5):
        s.observe(k, [_group(0, [1, 1])])
    assert s.pools(5)["solved"] == [0]  # the last WINDOW = 4 groups all solved
    assert len(s.history[0]) <= 5


def test_step_draws_see_only_steps_certainly_trained_when_they_start():
    # Lag 1 (--max-staleness 1): step 2's draws see step 0's observations, not step 1's, whenever they are
    # made: so step 2 draws the same tasks before and after step 1 trains.
    def sampler() -> TaskSampler:
        s = TaskSampler(seed=1, groups_per_step=4, max_draws=4, curriculum="difficulty", lag=1)
        s.observe(0, [_group(t, [0, 1]) for t in s.tasks(0, range(4))])
        s.tasks(1, range(4))
        return s

    early, late = sampler(), sampler()
    late.observe(1, [_group(t, [1, 1]) for t in late.tasks(1, range(4))])
    assert early.tasks(2, range(4)) == late.tasks(2, range(4))
    assert early.pools(2) == late.pools(2) and late.pools(3) != late.pools(2)


def test_state_round_trip_gives_the_same_draws(tmp_path):
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    a = TaskSampler(seed=2, groups_per_step=4, max_draws=8, curriculum="difficulty")
    for k in range(6):
        _trained(a, k, {t: [1.0, 1.0] for t in range(0, 100, 3)})
    save_sampler_state(run, 6, a)
    b = TaskSampler(seed=2, groups_per_step=4, max_draws=8, curriculum="difficulty")
    load_sampler_state(run, 6, b)
    assert b.history == a.history
    assert [a.tasks(k, range(8)) for k in range(6, 20)] == [b.tasks(k, range(8)) for k in range(6, 20)]
    sampler_state_path(run, 6).unlink()
    with pytest.raises(StoreError, match="missing"):
        load_sampler_state(run, 6, b)
    load_sampler_state(run, 0, b)  # step 0: the empty state, nothing to read
    plain = TaskSampler(seed=2, groups_per_step=4, max_draws=8)
    save_sampler_state(run, 7, plain)
    assert not sampler_state_path(run, 7).exists()  # without a curriculum draws depend on no state
    load_sampler_state(run, 7, plain)
    sampler_state_path(run, 6).write_text('{"version": 9}')
    with pytest.raises(StoreError, match="not a task sampler state"):
        load_sampler_state(run, 6, b)
