"""SandboxPool: one fresh sandbox per episode, a hard cap, a bounded queue, a clear 'busy' error."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.errors import SandboxError
from agentrl.sandbox import LocalSandbox, SandboxPool
from agentrl.types import ToolStatus

from .conftest import SMALL, requires_bwrap

pytestmark = [requires_bwrap, pytest.mark.usefixtures("no_leaks")]


def factory() -> LocalSandbox:
    return LocalSandbox(SMALL)


async def test_episodes_get_a_fresh_sandbox():
    async with SandboxPool(factory, size=1, warm=1) as pool:
        async with pool.acquire() as sb:
            await sb.run("secret = 42\nopen('f', 'w').write('x')")
        async with pool.acquire() as sb:
            r = await sb.run("import os; 'secret' in globals(), os.path.exists('f')")
            assert r.stdout == "(False, False)\n"
        assert pool.stats.resets == 2 or pool.stats.resets == 1  # the second reset may still be running
    assert pool.stats.live == 0


async def test_cap_queue_and_busy_error():
    async with SandboxPool(factory, size=2, max_waiting=1, acquire_timeout=10, warm=0) as pool:
        held = [pool.acquire() for _ in range(2)]
        sbs = [await cm.__aenter__() for cm in held]
        assert pool.stats.live == 2 and pool.stats.in_use == 2

        async def third() -> str:
            async with pool.acquire() as sb:
                return (await sb.run("'third'")).stdout

        waiter = asyncio.ensure_future(third())
        await asyncio.sleep(0.05)
        assert pool.stats.waiting == 1
        with pytest.raises(SandboxError, match="busy"):
            async with pool.acquire():
                pass
        r = await pool.run_once("1")
        assert r.status is ToolStatus.SANDBOX_ERROR and "busy" in r.message
        assert pool.stats.busy_rejections == 2
        await held[0].__aexit__(None, None, None)
        assert await waiter == "'third'\n"
        await held[1].__aexit__(None, None, None)
        assert pool.stats.live <= 2
        del sbs


async def test_a_waiter_times_out_with_busy():
    pool = SandboxPool(factory, size=1, max_waiting=4, acquire_timeout=0.3, warm=1)
    async with pool, pool.acquire():
        with pytest.raises(SandboxError, match="busy"):
            async with pool.acquire():
                pass


async def test_failing_factory_is_an_infra_error():
    def bad() -> LocalSandbox:
        return LocalSandbox(SMALL, disable_limits=["network"])  # refuses to start: self-test fails

    pool = SandboxPool(bad, size=2, warm=0)
    with pytest.raises(SandboxError):
        async with pool.acquire():
            pass
    assert pool.stats.live == 0
    await pool.close()


async def test_a_failed_warm_start_closes_the_sandboxes_that_did_start():
    # One of three warm sandboxes refuses to start: start() raises, and the two that started are closed (the
    # caller has no pool to close; ``no_leaks`` checks that no sandbox process or cgroup is left).
    made = iter([factory, lambda: LocalSandbox(SMALL, disable_limits=["network"]), factory])
    pool = SandboxPool(lambda: next(made)(), size=3, warm=3, max_starting=3)
    with pytest.raises(SandboxError, match="could not start 1 of 3 warm sandboxes"):
        await pool.start()
    assert pool.stats.live == 0 and pool.stats.idle == 0
    with pytest.raises(SandboxError, match="closed"):
        async with pool.acquire():
            pass


async def test_many_episodes_through_a_small_pool():
    async with SandboxPool(factory, size=4, max_waiting=64) as pool:

        async def episode(i: int) -> bool:
            async with pool.acquire() as sb:
                a = await sb.run(f"v = {i}")
                b = await sb.run("v * 2")
                return a.ok and b.stdout == f"{2 * i}\n"

        results = await asyncio.gather(*(episode(i) for i in range(40)))
        assert all(results)
        assert pool.stats.live <= 4


@pytest.mark.slow
async def test_64_concurrent_sessions_without_errors():
    async with SandboxPool(factory, size=64, max_waiting=0, warm=0) as pool:

        async def episode(i: int) -> list[str]:
            async with pool.acquire() as sb:
                out = []
                for step in range(3):
                    r = await sb.run(f"s = {i} if {step} == 0 else s + 1; s")
                    out.append(r.status.value + ":" + r.stdout.strip())
                return out

        results = await asyncio.gather(*(episode(i) for i in range(64)))
    for i, out in enumerate(results):
        assert out == [f"ok:{i}", f"ok:{i + 1}", f"ok:{i + 2}"], out


async def test_the_pool_and_the_shipped_fake_are_sandbox_sources():
    from agentrl.protocols import SandboxSource
    from agentrl.testing import FakeSandboxSource

    assert isinstance(SandboxPool(factory, size=1), SandboxSource)
    source = FakeSandboxSource(size=1)
    assert isinstance(source, SandboxSource)
    second = source.acquire()
    async with source.acquire() as sb:
        await sb.run("secret = 1")
        blocked = asyncio.ensure_future(second.__aenter__())
        await asyncio.sleep(0.01)
        assert not blocked.done()  # at most `size` sessions are out at once
    lent = await blocked
    r = await lent.run("'secret' in globals()")
    await second.__aexit__(None, None, None)
    assert r.stdout == "False\n" and source.lent == 2  # reset on its way back
