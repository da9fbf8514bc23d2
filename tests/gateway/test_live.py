"""Live sessions: idle sessions expire after ``session_timeout`` and are recorded as cancelled (an
infrastructure failure: never trained on, never scored 0); later requests say the session expired."""

from __future__ import annotations

import asyncio
import threading
import time

import openai
import pytest

from agentrl.errors import ConfigError
from agentrl.testing import ScriptedPolicy
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


async def test_a_request_being_handled_is_not_idle_time(renderer):
    core = GatewayCore(scripted(renderer), renderer)  # type: ignore[arg-type]
    await core.chat("s", {"model": "m", "messages": START})
    later = asyncio.get_running_loop().time() + 120
    with core.busy("s"):  # what the HTTP layer holds from the request's arrival (body, queue, policy)
        assert await core.expire_idle(60.0, now=later) == []
        with core.busy("s"):  # two requests of one session (the second gets its 409 from the core)
            pass
        assert await core.expire_idle(60.0, now=later) == []
    done = time.monotonic()  # idle time restarts when the request is done
    assert await core.expire_idle(60.0, now=done + 59) == []
    assert await core.expire_idle(60.0, now=done + 61) == ["s"]
    with core.busy("never-opened"):  # nothing to hold: no entry is made
        assert not core._busy


async def test_a_request_queued_behind_a_stalled_gateway_is_answered_not_expired(renderer):
    """A saturated gateway: one session's policy call holds the event loop (CPU-bound, 2.5 s, well past the
    1 s idle timeout) while another session's next request waits unread in its socket. The waiting session
    was not idle: it is answered, and only the truly silent session expires."""
    stalling = threading.Event()
    stop = renderer.stop_token_ids[0]

    def turn(prompt_ids):
        if b"STALL" in renderer.tokenizer.decode(list(prompt_ids)).encode():
            stalling.set()
            time.sleep(2.5)  # blocks the event loop, as a saturated in-process sampler does
        return [*renderer.encode("Answer: ok"), stop]

    policy = ScriptedPolicy(turn, stop_ids=renderer.stop_token_ids)
    store = Store()
    async with Gateway(policy, renderer, store=store, session_timeout=1.0) as gw:  # type: ignore[arg-type]
        waiting = openai.OpenAI(base_url=gw.base_url("waiting"), api_key="-", max_retries=0)
        stalled = client_for(gw.base_url("stalled"))
        silent = client_for(gw.base_url("silent"))
        ask_sync = lambda msgs: waiting.chat.completions.create(model="p", messages=msgs)  # noqa: E731
        await ask(silent, START)
        first = await asyncio.to_thread(ask_sync, START)
        history = [
            *START,
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "more"},
        ]

        def second():  # sent on the kept-alive connection while the loop is stalled
            assert stalling.wait(10)
            return ask_sync(history)

        queued = asyncio.ensure_future(asyncio.to_thread(second))
        await ask(stalled, [{"role": "user", "content": "STALL please"}])
        reply = await queued
        assert reply.choices[0].message.content == "Answer: ok"
        for _ in range(100):
            if store.trajectories:
                break
            await asyncio.sleep(0.05)
        waiting.close()
        assert [t.meta.extra["session_id"] for t in store.trajectories] == ["silent"]
        assert {"waiting", "stalled"} <= set(gw.core.sessions)
