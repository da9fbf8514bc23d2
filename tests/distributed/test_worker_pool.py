"""A rollout worker builds one sandbox pool, however many of its first groups arrive at once (no Ray: the
worker's class is plain Python, and building its env needs none of its Ray handles)."""

import asyncio

from agentrl.trainers import factories
from agentrl.trainers.distributed import actors
from agentrl.trainers.train_config import TrainConfig


def test_concurrent_first_groups_share_one_sandbox_pool(monkeypatch):
    monkeypatch.setattr(actors, "_node", lambda: "here")  # the worker would ask Ray for its node id
    built = []
    real = factories.sandbox_pool

    def counted(cfg, size):
        pool = real(cfg, size)
        built.append(pool)
        return pool

    monkeypatch.setattr(factories, "sandbox_pool", counted)
    cfg = TrainConfig(model="tiny", env="math-tir-arith-v0")
    worker = actors.RolloutWorker("worker-0", cfg, servers=[], balancer=None)

    async def main():
        try:
            made = await asyncio.gather(*(worker._env_factory() for _ in range(3)))
            assert made[0] is made[1] is made[2]
        finally:
            await worker.close()

    asyncio.run(main())
    assert len(built) == 1  # before, each of the 3 built (and started) a pool; 2 were never closed
