"""Rewards posted after the session, by session id, until a deadline: ``finish`` without a reward ends a
session, ``POST /s/<sid>/reward`` records it later, and a session whose reward never comes is recorded as
never rewarded (an infrastructure failure: never trained on, never scored 0). Also ``GET
/v1/responses/{id}``. Real HTTP on loopback, the real openai and anthropic clients."""

from __future__ import annotations

import asyncio

import anthropic
import httpx
import openai
import pytest

from agentrl.errors import ConfigError
from agentrl.trainers.gateway import Gateway, GatewayCore, GatewayError
from agentrl.trainers.gateway.core import REWARD_MISSING
from agentrl.types import StopReason

from .api_agents import RESPONSES_TOOLS, anthropic_echo_agent
from .helpers import QUESTION, SCRIPT, START, SYSTEM, ask, client_for, echo_agent, scripted


class Store:
    def __init__(self) -> None:
        self.trajectories: list = []

    async def append(self, t) -> None:
        self.trajectories.append(t)


async def test_a_reward_posted_after_the_session_is_recorded_with_it(renderer):
    store = Store()
    core = GatewayCore(scripted(renderer), renderer, store=store, reward_deadline=60.0)  # type: ignore[arg-type]
    await core.chat("s", {"model": "m", "messages": START})
    assert await core.end("s", {"task_id": "q1", "note": "a"}) == 60.0
    assert core.awaiting_reward("s") and store.trajectories == []  # nothing recorded before the reward
    with pytest.raises(GatewayError, match="awaits its reward") as e:
        await core.chat("s", {"model": "m", "messages": START})
    assert e.value.status == 409
    (traj,) = await core.reward("s", 0.5, {"judge": "j"})
    assert store.trajectories == [traj] and traj.reward == 0.5 and not traj.infra_failure
    assert traj.meta.task_id == "q1" and traj.meta.extra["note"] == "a" and traj.meta.extra["judge"] == "j"
    with pytest.raises(GatewayError, match="already finished"):
        await core.reward("s", 1.0)


async def test_a_session_never_rewarded_is_recorded_as_such_never_as_reward_zero(renderer):
    store = Store()
    core = GatewayCore(scripted(renderer), renderer, store=store, reward_deadline=30.0)  # type: ignore[arg-type]
    await core.chat("late", {"model": "m", "messages": START})
    await core.end("late")
    await core.chat("open", {"model": "m", "messages": START})
    await core.end("open")
    assert await core.expire_rewards() == []  # not due yet
    later = asyncio.get_running_loop().time() + 31  # the loop clock is time.monotonic() on Linux
    assert await core.expire_rewards(now=later) == ["late", "open"]
    for traj in store.trajectories:
        assert traj.infra_failure and traj.errors[-1].kind == REWARD_MISSING
        assert "within 30 s" in traj.errors[-1].message
        assert traj.stop_reason is StopReason.TERMINATED  # the session itself ended well
    with pytest.raises(GatewayError, match="never rewarded") as e:
        await core.reward("late", 1.0)
    assert (e.value.status, e.value.code) == (409, "reward_deadline_passed")
    # a gateway that stops records the sessions still waiting as never rewarded, with that reason
    await core.chat("pending", {"model": "m", "messages": START})
    await core.end("pending")
    assert await core.close() == 1
    assert "gateway stopped" in store.trajectories[-1].errors[-1].message


async def test_without_a_deadline_the_reward_comes_with_finish(renderer):
    with pytest.raises(ConfigError, match="--reward-deadline must be > 0"):
        GatewayCore(scripted(renderer), renderer, reward_deadline=0)
    async with Gateway(scripted(renderer), renderer) as gw:
        await ask(client_for(gw.base_url("s")), START)
        async with httpx.AsyncClient() as http:
            r = await http.post(f"{gw.url}/s/s/finish", json={"info": {}})
        assert r.status_code == 400 and "--reward-deadline" in r.json()["error"]["message"]
        assert r.json()["error"]["param"] == "reward"


async def test_rewards_posted_later_over_http_with_the_real_clients(renderer):
    store = Store()
    policy = scripted(renderer, SCRIPT * 2)
    async with Gateway(policy, renderer, store=store, reward_deadline=60.0) as gw:  # type: ignore[arg-type]
        openai_reward = await echo_agent(gw.base_url("oa"))
        anthropic_reward = await anthropic_echo_agent(gw.anthropic_base_url("an"))
        async with httpx.AsyncClient(base_url=gw.url) as http:
            ended = await http.post("/s/oa/finish", json={"info": {"task_id": "echo"}})
            assert ended.json() == {"session_id": "oa", "awaiting_reward": True, "reward_deadline_s": 60.0}
            assert (await http.post("/s/an/finish", json={"reward": None})).status_code == 200
            assert store.trajectories == [] and (await http.get("/health")).json()["open_sessions"] == 0
            with pytest.raises(openai.ConflictError, match="awaits its reward"):
                await ask(client_for(gw.base_url("oa")), START)
            r = await http.post("/s/oa/reward", json={"reward": openai_reward, "info": {"judge": "exact"}})
            assert r.status_code == 200 and r.json()["trajectories"][0]["trainable"]
            r = await http.post("/s/an/finish", json={"reward": anthropic_reward})  # finish with it works too
            assert r.status_code == 200
            again = await http.post("/s/an/reward", json={"reward": 1.0})
            assert again.status_code == 409 and again.json()["error"]["code"] == "session_finished"
            missing = await http.post("/s/oa/reward", json={})
            assert missing.status_code == 400 and missing.json()["error"]["param"] == "reward"
            unknown = await http.post("/s/nobody/reward", json={"reward": 1.0})
            assert unknown.status_code == 404
    oa, an = store.trajectories
    assert (oa.reward, an.reward) == (1.0, 1.0) and oa.meta.task_id == "echo"
    assert oa.meta.extra["judge"] == "exact" and not (oa.infra_failure or an.infra_failure)


async def test_the_gateway_records_never_rewarded_sessions_by_itself(renderer):
    store = Store()
    async with Gateway(scripted(renderer), renderer, store=store, reward_deadline=0.2) as gw:  # type: ignore[arg-type]
        await ask(client_for(gw.base_url("s")), START)
        async with httpx.AsyncClient(base_url=gw.url) as http:
            assert (await http.post("/s/s/finish", json={})).status_code == 200
            for _ in range(100):
                if store.trajectories:
                    break
                await asyncio.sleep(0.05)
            late = await http.post("/s/s/reward", json={"reward": 1.0})
    assert late.status_code == 409 and late.json()["error"]["code"] == "reward_deadline_passed"
    (traj,) = store.trajectories
    assert traj.infra_failure and traj.errors[-1].kind == REWARD_MISSING


async def test_retrieve_a_stored_response(renderer):
    async with Gateway(scripted(renderer), renderer) as gw:
        client = client_for(gw.base_url("s"))
        made = await client.responses.create(
            model="m", instructions=SYSTEM, input=QUESTION, tools=RESPONSES_TOOLS, metadata={"k": "v"}
        )
        got = await client.responses.retrieve(made.id)
        assert got.model_dump() == made.model_dump()
        assert got.output[0].type == "function_call" and got.metadata == {"k": "v"}
        with pytest.raises(openai.NotFoundError, match="no response with id 'resp_nope'") as e:
            await client.responses.retrieve("resp_nope")
        assert e.value.code == "response_not_found"
        with pytest.raises(openai.NotFoundError):  # stored per session: another session cannot read it
            await client_for(gw.base_url("t")).responses.retrieve(made.id)
        with pytest.raises(openai.BadRequestError, match="streaming a stored response") as e2:
            await client.responses.retrieve(made.id, stream=True)
        assert e2.value.param == "stream"
        unstored = await client.responses.create(
            model="m",
            input=[{"type": "function_call_output", "call_id": made.output[0].call_id, "output": "hello"}],  # type: ignore[list-item]
            previous_response_id=made.id,
            store=False,
        )
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(unstored.id)
        await gw.finish("s", 0.0)
        with pytest.raises(openai.NotFoundError):  # a finished session keeps no responses
            await client.responses.retrieve(made.id)


async def test_anthropic_client_posts_through_a_session_ended_without_reward(renderer):
    """The anthropic client's errors on a session that awaits its reward are its own ConflictError."""
    async with Gateway(scripted(renderer), renderer, reward_deadline=60.0) as gw:
        await anthropic_echo_agent(gw.anthropic_base_url("a"))
        await gw.end("a", {"task_id": "t"})
        async with anthropic.AsyncAnthropic(
            base_url=gw.anthropic_base_url("a"), api_key="k", max_retries=0
        ) as client:
            with pytest.raises(anthropic.ConflictError, match="awaits its reward"):
                await client.messages.create(
                    model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}]
                )
        (traj,) = await gw.reward("a", 1.0)
        assert traj.meta.task_id == "t" and traj.reward == 1.0
