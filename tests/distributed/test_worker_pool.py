"""The rollout worker's own logic without a Ray cluster: one sandbox pool however many of its first
groups arrive at once, and failing over from a server killed for memory."""

import asyncio

from agentrl.trainers import factories
from agentrl.trainers.ray import actors
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


class _Call:
    """``handle.method`` of an actor: ``.remote(...)`` gives an awaitable, as Ray's does."""

    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args, **kwargs):
        done = asyncio.get_running_loop().create_future()  # run now: a fire-and-forget call needs no await
        try:
            done.set_result(self.fn(*args, **kwargs))
        except Exception as e:
            done.set_exception(e)
        return done


class _Actor:
    def __init__(self, **methods):
        for name, fn in methods.items():
            setattr(self, name, _Call(fn))


def test_a_server_killed_by_rays_memory_monitor_fails_over_like_a_dead_one():
    """Ray answers a call to an actor its memory monitor killed with ``OutOfMemoryError``, which is not a
    ``RayActorError``: the episode failed (``policy_error``) instead of moving to the other server. A real
    out-of-memory kill cannot be staged in a test, so the two servers here are stand-ins for Ray handles."""
    from ray.exceptions import OutOfMemoryError

    from agentrl.protocols import FinishReason, Generation, Sampling

    def killed(ids, sampling):
        raise OutOfMemoryError("1 worker(s) were killed due to the node running low on memory")

    answer = Generation((5,), (-0.5,), FinishReason.STOP, policy_version=3)
    servers = [_Actor(generate=killed), _Actor(generate=lambda ids, sampling: answer)]
    released = []
    balancer = _Actor(acquire=lambda exclude=None: 1, release=released.append)
    policy = actors.ServerPolicy(servers, balancer, index=0)

    async def main():
        return await policy.generate((1, 2), Sampling(max_new_tokens=4))

    assert asyncio.run(main()) == answer
    assert (policy.name, policy.failovers, policy.lost) == ("server-1", 1, False)
