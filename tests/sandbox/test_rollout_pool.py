"""rollout_pool: the one factory of a run's sandbox pool (the trainer, its Ray workers and its evaluation)."""

from __future__ import annotations

import pytest

from agentrl.errors import ConfigError
from agentrl.sandbox import LocalSandbox, SandboxPool, rollout_pool
from agentrl.sandbox.pool import EPISODE_WAITING_FACTOR, MAX_STARTING_ENV
from agentrl.testing import FakeSandbox


def test_a_run_pool_has_a_sandbox_per_episode_in_flight_and_a_bounded_line(monkeypatch):
    monkeypatch.delenv(MAX_STARTING_ENV, raising=False)
    pool = rollout_pool(6)
    assert isinstance(pool, SandboxPool)
    assert (pool.size, pool.max_waiting, pool.max_starting) == (6, EPISODE_WAITING_FACTOR * 6, 4)
    assert pool._factory is LocalSandbox  # nothing starts before the pool is entered
    monkeypatch.setenv(MAX_STARTING_ENV, "2")
    assert rollout_pool(6).max_starting == 2
    assert rollout_pool(6, max_starting=9).max_starting == 9  # an explicit value wins over the variable
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="positive int concurrency"):
            rollout_pool(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_starting"):
        rollout_pool(2, max_starting=0)


async def test_a_run_pool_lends_the_factory_s_sandboxes():
    async with rollout_pool(2, factory=FakeSandbox) as pool, pool.acquire() as sb:
        assert isinstance(sb, FakeSandbox)
        assert (await sb.run("1 + 1")).stdout == "2\n"
