"""Live sessions: idle sessions expire after ``session_timeout`` and are recorded as cancelled (an
infrastructure failure: never trained on, never scored 0); later requests say the session expired."""

from __future__ import annotations

import asyncio

import openai
import pytest

from agentrl.errors import ConfigError
from agentrl.trainers.gateway import Gateway, GatewayCore
from agentrl.types import StopReason

from .helpers import START, ask, client_for, scripted


class Store:
    def __init__(self) -> None:
        self.trajectories: list = []

    async def append(self, t) -> None:
        self.trajectories.append(t)


async def test_idle_sessions_expire_as_cancelled_never_as_reward_zero(renderer):
    store = Store()
    core = GatewayCore(scripted(renderer), renderer, store=store)  # type: ignore[arg-type]
    await core.chat("talked", {"model": "m", "messages": START})
    core.open_session(session_id="silent")
    assert await core.expire_idle(60.0) == []  # not idle yet
    later = asyncio.get_running_loop().time() + 120  # time.monotonic() and the loop clock agree on Linux
    assert sorted(await core.expire_idle(60.0, now=later)) == ["silent", "talked"]
    (traj,) = store.trajectories  # the silent session sampled nothing: dropped, not recorded
    assert traj.stop_reason is StopReason.CANCELLED and traj.infra_failure
    assert "no request for" in traj.errors[-1].message and traj.meta.extra["session_id"] == "talked"
    with pytest.raises(Exception, match="expired: no request for 60 s") as e:
        await core.chat("talked", {"model": "m", "messages": START})
    assert e.value.code == "session_expired" and e.value.status == 409


async def test_the_gateway_expires_idle_sessions_by_itself(renderer):
    with pytest.raises(ConfigError, match="--session-timeout must be > 0"):
        Gateway(scripted(renderer), renderer, session_timeout=0)
    store = Store()
    async with Gateway(scripted(renderer), renderer, store=store, session_timeout=0.2) as gw:  # type: ignore[arg-type]
        client = client_for(gw.base_url("s"))
        await ask(client, START)
        for _ in range(100):
            if store.trajectories:
                break
            await asyncio.sleep(0.05)
        with pytest.raises(openai.ConflictError, match="expired"):
            await ask(client, START)
    (traj,) = store.trajectories
    assert traj.stop_reason is StopReason.CANCELLED and traj.infra_failure
