"""Ended sessions are remembered for a bounded time and count (a long-lived gateway must not grow by one entry
per session forever), and within those bounds a late request gets the same 409 as before: finished, expired,
awaiting its reward, never rewarded."""

from __future__ import annotations

import asyncio
import gc
import time
import tracemalloc

import anthropic
import openai
import pytest

from agentrl.errors import ConfigError
from agentrl.trainers.gateway import Gateway, GatewayCore
from agentrl.trainers.gateway.ended import EndedSessions

from .helpers import START, ask, client_for, scripted

N = 300


def _held(core: GatewayCore) -> dict[str, int]:
    """The size of every per-session structure of ``core``."""
    return {
        "sessions": len(core.sessions),
        "ended": len(core.ended),
        "results": len(core._results),
        "seen": len(core._seen),
        "busy": len(core._busy),
        "apis": len(core._apis),
        "stored": len(core.stored),
        "awaiting": len(core._awaiting),
    }


async def test_after_many_sessions_only_the_latest_ended_ids_are_kept_and_late_requests_are_refused(renderer):
    core = GatewayCore(scripted(renderer), renderer, ended=EndedSessions(max_ids=50), reward_deadline=600)
    for i in range(N):
        sid = f"s{i}"
        await core.chat(sid, {"model": "m", "messages": START})
        if i % 3 == 0:
            await core.finish(sid, 1.0, keep=True)  # a finish over HTTP without a store keeps the result
        elif i % 3 == 1:
            await core.end(sid)  # the reward comes later
            await core.reward(sid, 0.5)
        else:
            await core.expire_idle(1.0, now=time.monotonic() + 10)
    assert _held(core) == {
        "sessions": 0,
        "ended": 50,
        "results": sum(i % 3 == 0 for i in range(N - 50, N)),  # unclaimed results of remembered ids only
        "seen": 0,
        "busy": 0,
        "apis": 0,
        "stored": 0,
        "awaiting": 0,
    }
    # within the bound: the same answers as ever
    for sid, code in (
        ("s297", "session_finished"),
        ("s298", "session_finished"),
        ("s299", "session_expired"),
    ):
        with pytest.raises(Exception) as e:
            await core.chat(sid, {"model": "m", "messages": START})
        assert (e.value.status, e.value.code) == (409, code)
    with pytest.raises(Exception, match="already exists"):
        core.open_session(session_id="s299")
    # a forgotten id is an unknown session: a new one (auto_sessions), recorded apart from the old one
    await core.chat("s0", {"model": "m", "messages": START})
    assert "s0" in core.sessions


async def test_ended_ids_are_forgotten_after_their_time_and_a_session_awaiting_its_reward_never_is(renderer):
    core = GatewayCore(
        scripted(renderer),
        renderer,
        auto_sessions=False,
        reward_deadline=600,
        ended=EndedSessions(keep_s=60, max_ids=2),
    )
    for sid in ("waits", "done", "a", "b", "c"):
        core.open_session(session_id=sid)
        await core.chat(sid, {"model": "m", "messages": START})
    await core.end("waits")
    for sid in ("done", "a", "b", "c"):
        await core.finish(sid, 1.0)
    assert "waits" not in core.ended and core.finished("waits")  # pushed out by count, still awaiting
    with pytest.raises(Exception, match="awaits its reward") as e:
        await core.chat("waits", {"model": "m", "messages": START})
    assert e.value.code == "session_finished"
    with pytest.raises(Exception, match="already exists"):
        core.open_session(session_id="waits")
    await core.expire_rewards(now=time.monotonic() + 30)  # the reaper's tick prunes by time
    assert len(core.ended) == 2
    await core.expire_rewards(now=time.monotonic() + 61)
    assert len(core.ended) == 0
    with pytest.raises(Exception) as e:  # forgotten: without auto_sessions, an unknown session
        await core.chat("c", {"model": "m", "messages": START})
    assert (e.value.status, e.value.code) == (404, "unknown_session")
    await core.expire_rewards(now=time.monotonic() + 601)  # the deadline: recorded as never rewarded
    with pytest.raises(Exception, match="never rewarded") as e:
        await core.reward("waits", 1.0)
    assert e.value.code == "reward_deadline_passed"


def test_the_bounds_are_checked():
    with pytest.raises(ConfigError, match="> 0 seconds"):
        EndedSessions(keep_s=0)
    with pytest.raises(ConfigError, match="int >= 1"):
        EndedSessions(max_ids=0)


async def test_late_requests_over_http_get_the_409_their_client_reads(renderer):
    """The real openai and anthropic clients, after many sessions through a bounded gateway."""
    policy = scripted(renderer, ("Answer: 1",))
    async with Gateway(policy, renderer, session_timeout=0.2) as gw:
        gw.core.ended = EndedSessions(max_ids=4)
        for i in range(12):
            await ask(client_for(gw.base_url(f"s{i}")), START)
            await gw.finish(f"s{i}", 1.0)
        await ask(client_for(gw.base_url("idle")), START)
        while "idle" in gw.core.sessions:
            await asyncio.sleep(0.05)
        assert len(gw.core.ended) == 4 and not gw.core.sessions
        with pytest.raises(openai.ConflictError, match="already finished"):
            await ask(client_for(gw.base_url("s11")), START)
        with pytest.raises(openai.ConflictError, match="expired"):
            await ask(client_for(gw.base_url("idle")), START)
        claude = anthropic.AsyncAnthropic(base_url=gw.anthropic_base_url("s10"), api_key="-", max_retries=0)
        with pytest.raises(anthropic.ConflictError, match="already finished"):
            await claude.messages.create(
                model="p", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
            )
        await claude.close()


async def test_memory_stays_flat_once_the_bound_is_reached(renderer):
    """The Python heap traced over sessions 300 to 500 of a gateway that remembers 100 ended ids stays flat
    (unbounded, each ended session kept about 250 bytes: 50 kB over these 200)."""
    core = GatewayCore(scripted(renderer), renderer, ended=EndedSessions(max_ids=100))
    core.policy.calls = _Nothing()  # the scripted policy keeps every prompt otherwise
    sizes = []
    try:
        for i in range(500):
            if i == 200:  # past the bound and warm: trace from here
                tracemalloc.start()
            if i == 300:  # the ids remembered now were all made while tracing
                gc.collect()
                sizes.append(tracemalloc.get_traced_memory()[0])
            sid = f"{i:08d}{'x' * 24}"  # as long as a uuid4().hex
            await core.chat(sid, {"model": "m", "messages": START})
            await core.finish(sid, 1.0)
        gc.collect()
        sizes.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    assert len(core.ended) == 100 and sizes[1] - sizes[0] < 16_000, sizes


class _Nothing(list):  # type: ignore[type-arg]
    def append(self, item: object) -> None:
        pass
