"""Per-episode random streams on the real rollout path: with the trainer's seeding, an episode's tokens are
the same whether it runs alone or in a batch with other episodes (tiny random model, SmolLM2's tokenizer)."""

from __future__ import annotations

import dataclasses

from agentrl.models import tiny_model
from agentrl.policies import HFPolicy
from agentrl.rollout import run_episode, run_groups
from agentrl.testing import EchoEnv
from agentrl.trainers.train_setup import TrainConfig, rollout_config


def _cfg(step: int):  # type: ignore[no-untyped-def]
    cfg = rollout_config(TrainConfig(model="tiny", seed=3), step)
    # Short turns of different lengths: every batch has rows finishing and joining at different steps.
    return dataclasses.replace(cfg, max_new_tokens=12, max_turns=1, audit=True)


def test_the_trainer_derives_a_sampling_seed_per_run_and_step():
    seeds = {rollout_config(TrainConfig(model="tiny", seed=s), step).seed for s in (0, 1) for step in (0, 1)}
    assert None not in seeds and len(seeds) == 4
    fixed = TrainConfig(model="tiny", seed=0)
    fixed = dataclasses.replace(fixed, rollout=dataclasses.replace(fixed.rollout, seed=42))
    assert rollout_config(fixed, 5).seed == 42  # an explicit --rollout.seed is kept


async def test_an_episode_samples_the_same_tokens_alone_and_in_a_batch(tok, renderer):
    model = tiny_model(tok, seed=0)
    cfg = _cfg(step=1)
    task_seeds, group_size = [11, 12, 13], 3

    batched = HFPolicy(model, tok, stop_token_ids=renderer.stop_token_ids, max_batch_size=16)
    together: dict[int | None, list[tuple[int, ...]]] = {}
    async for done in run_groups(EchoEnv, batched, renderer, cfg, seeds=task_seeds, group_size=group_size):
        together.setdefault(done.trajectory.meta.seed, []).append(done.trajectory.token_ids)
    assert max(batched.batch_sizes) >= 6, batched.batch_sizes  # the episodes really shared batches

    alone_policy = HFPolicy(model, tok, stop_token_ids=renderer.stop_token_ids, max_batch_size=16)
    for seed in task_seeds:
        alone = []
        for member in range(group_size):
            traj = await run_episode(EchoEnv(), alone_policy, renderer, cfg, seed=seed, member=member)
            alone.append(traj.token_ids)
        assert max(alone_policy.batch_sizes) == 1
        # Members finish in any order in the batch: compare the group's streams as a multiset.
        assert sorted(together[seed]) == sorted(alone), f"task {seed}"
        assert len(set(alone)) == group_size  # each member draws from its own stream

    other_step = HFPolicy(model, tok, stop_token_ids=renderer.stop_token_ids)
    traj = await run_episode(EchoEnv(), other_step, renderer, _cfg(step=2), seed=11, member=0)
    assert traj.token_ids not in together[11]  # the stream moves on with the step
