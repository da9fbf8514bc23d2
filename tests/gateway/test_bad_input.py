"""Bad input gets a clear HTTP error (OpenAI error body) or a recorded non-trainable session; the server keeps
serving and the trajectory file never gets a half-written line."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from agentrl import JsonlStore, read_trajectories
from agentrl.protocols import Sampling
from agentrl.trainers.gateway import Gateway

from .helpers import ECHO_SCHEMA, START, scripted

CHAT = "/v1/chat/completions"


def body(**over):
    b = {"model": "policy", "messages": START, "tools": [ECHO_SCHEMA]}
    b.update(over)
    return b


@pytest.fixture
async def gw(renderer, tmp_path):
    with JsonlStore(tmp_path / "trajectories.jsonl") as store:
        async with Gateway(scripted(renderer), renderer, store=store) as g:
            yield g


@pytest.fixture
async def http(gw):
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
        yield c


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    return err


async def test_malformed_json_and_non_object_bodies(http):
    err = error_of(
        await http.post(
            f"/s/a{CHAT}",
            content=b'{"model": "x", "messages": [',
            headers={"content-type": "application/json"},
        ),
        400,
    )
    assert err["code"] == "invalid_json" and "not valid JSON" in err["message"]
    assert "JSON object" in error_of(await http.post(f"/s/a{CHAT}", json=[1, 2]), 400)["message"]


@pytest.mark.parametrize(
    ("over", "param", "words"),
    [
        ({"messages": None}, "messages", "required"),
        ({"messages": []}, "messages", "non-empty"),
        ({"model": 3}, "model", "model"),
        ({"messages": [{"content": "hi"}]}, "messages[0].role", "role"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role", "wizard"),
        ({"messages": [{"role": "tool", "content": "42"}]}, "messages[0].tool_call_id", "tool_call_id"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content",
            "text parts",
        ),
        (
            {"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]}]},
            "messages[0].tool_calls[0]",
            "function",
        ),
        ({"n": 2}, "n", "n must be 1"),
        ({"stop": ["\n"]}, "stop", "stop"),
        ({"temperature": 0}, "temperature", "> 0"),
        ({"temperature": "hot"}, "temperature", "number"),
        ({"max_tokens": 0}, "max_tokens", ">= 1"),
        ({"tool_choice": "required"}, "tool_choice", "cannot force"),
        ({"logit_bias": {"1": 5}}, "logit_bias", "distribution"),
        ({"response_format": {"type": "json_object"}}, "response_format", "constrained"),
        ({"stream": "yes"}, "stream", "boolean"),
    ],
)
async def test_invalid_chat_bodies(http, over, param, words):
    err = error_of(await http.post(f"/s/a{CHAT}", json=body(**over)), 400)
    assert err["param"] == param and words in err["message"]


def fn(**function):
    return {"type": "function", "function": {"name": "echo", **function}}


@pytest.mark.parametrize(
    ("tools", "words"),
    [
        ({"name": "echo"}, "array"),
        ([{"type": "retrieval"}], "'type': 'function'"),
        ([{"type": "function", "function": {"name": "has space"}}], "must match"),
        ([fn(), fn()], "second tool named 'echo'"),
        ([fn(parameters=["text"])], "JSON Schema object"),
        ([fn(parameters={"type": "string"})], "must be 'object'"),
        ([fn(parameters={"type": "object", "properties": {"text": "string"}})], "schema object"),
        (
            [fn(parameters={"type": "object", "properties": {}, "required": ["text"]})],
            "not in its properties",
        ),
        ([fn(description=7)], "description"),
    ],
)
async def test_invalid_tool_schemas(http, tools, words):
    err = error_of(await http.post(f"/s/a{CHAT}", json=body(tools=tools)), 400)
    assert err["param"].startswith("tools") and words in err["message"]


async def test_unknown_session_finish_twice_and_bad_ids(renderer, tmp_path):
    async with (
        Gateway(scripted(renderer), renderer, auto_sessions=False) as gw,
        httpx.AsyncClient(base_url=gw.url) as http,
    ):
        err = error_of(await http.post(f"/s/nobody{CHAT}", json=body()), 404)
        assert err["code"] == "unknown_session" and "nobody" in err["message"]
        error_of(await http.post("/s/nobody/finish", json={"reward": 1.0}), 404)
        sid = gw.open_session()
        assert (await http.post(f"/s/{sid}{CHAT}", json=body())).status_code == 200
        r = await http.post(f"/s/{sid}/finish", json={"reward": 1.0, "info": {"attempt": 1}})
        assert r.status_code == 200 and r.json()["trajectories"][0]["trainable"]
        assert (
            error_of(await http.post(f"/s/{sid}/finish", json={"reward": 1.0}), 409)["code"]
            == "session_finished"
        )
        assert error_of(await http.post(f"/s/{sid}{CHAT}", json=body()), 409)["code"] == "session_finished"
        assert (
            error_of(await http.post(f"/s/{'x' * 200}{CHAT}", json=body()), 400)["code"] == "bad_session_id"
        )
        assert (
            error_of(await http.post("/s/a%20b/finish", json={"reward": 1}), 400)["code"] == "bad_session_id"
        )


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b'{"info": {}}', "'reward' is required"),
        (b'{"reward": "1"}', "finite number"),
        (b'{"reward": NaN}', "finite number"),
        (b'{"reward": true}', "finite number"),
        (b'{"reward": 1, "info": {"nested": {"a": 1}}}', "JSON scalar"),
        (b'{"reward": 1, "info": [1]}', "'info' must be an object"),
        (b"[]", "JSON object"),
    ],
)
async def test_invalid_finish_bodies(http, raw, words):
    assert (await http.post(f"/s/f{CHAT}", json=body())).status_code == 200
    err = error_of(
        await http.post("/s/f/finish", content=raw, headers={"content-type": "application/json"}), 400
    )
    assert words in err["message"]
    assert (await http.post("/s/f/finish", json={"reward": 0.5})).status_code == 200  # still finishable


async def test_unknown_routes_and_methods(http):
    err = error_of(await http.post("/v1/responses", json=body()), 404)  # /v1/chat/completions is session-less
    assert "/s/<session_id>/v1" in err["message"]
    error_of(await http.get(f"/s/a{CHAT}"), 405)
    models = (await http.get("/s/a/v1/models")).json()
    assert models["data"][0]["id"] == "agentrl-policy"


class GatedPolicy:
    """Scripted turns, released one at a time by a test; remembers cancelled generations."""

    def __init__(self, inner):
        self.inner = inner
        self.version = 0
        self.gate = asyncio.Event()
        self.started = asyncio.Event()
        self.cancelled = 0

    async def generate(self, prompt_ids, sampling: Sampling):
        self.started.set()
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return await self.inner.generate(prompt_ids, sampling)


async def test_concurrent_requests_in_one_session_get_409(renderer):
    policy = GatedPolicy(scripted(renderer))
    async with Gateway(policy, renderer) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
        first = asyncio.ensure_future(http.post(f"/s/c{CHAT}", json=body()))
        await asyncio.wait_for(policy.started.wait(), 10)
        err = error_of(await http.post(f"/s/c{CHAT}", json=body()), 409)
        assert err["code"] == "concurrent_request" and "one at a time" in err["message"]
        assert (
            error_of(await http.post("/s/c/finish", json={"reward": 1}), 409)["code"] == "concurrent_request"
        )
        other = asyncio.ensure_future(http.post(f"/s/other{CHAT}", json=body()))  # other sessions are fine
        policy.gate.set()
        assert (await first).status_code == 200 and (await other).status_code == 200
        (t,) = await gw.finish("c", 1.0)
    assert t.num_turns == 1 and not t.infra_failure


async def test_client_disconnecting_mid_generation_cancels_it_and_the_session_goes_on(renderer, tmp_path):
    policy = GatedPolicy(scripted(renderer))
    store = JsonlStore(tmp_path / "t.jsonl")
    async with Gateway(policy, renderer, store=store) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=0.5) as impatient:
            with pytest.raises(httpx.ReadTimeout):
                await impatient.post(f"/s/d{CHAT}", json=body())
        for _ in range(200):  # the server notices the closed connection and stops sampling
            if policy.cancelled:
                break
            await asyncio.sleep(0.02)
        assert policy.cancelled == 1 and gw.core.sessions["d"].disconnects == 1
        policy.gate.set()
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            r = await http.post(f"/s/d{CHAT}", json=body())  # the agent retries: served normally
            assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "tool_calls"
            assert (await http.get("/health")).json()["ok"]
        (t,) = await gw.finish("d", 1.0)
    store.close()
    assert t.num_turns == 1 and t.meta.extra["disconnects"] == 1 and not t.infra_failure
    issues: list = []
    assert len(list(read_trajectories(tmp_path / "t.jsonl", issues=issues))) == 1 and not issues


async def test_a_failing_store_is_a_500_and_the_session_stays_open(renderer, tmp_path):
    (tmp_path / "dir.jsonl").mkdir()  # a directory where the file should be: every write fails
    async with Gateway(scripted(renderer), renderer, store=JsonlStore(tmp_path / "dir.jsonl")) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            assert (await http.post(f"/s/w{CHAT}", json=body())).status_code == 200
            err = error_of(await http.post("/s/w/finish", json={"reward": 1.0}), 500)
            assert "could not record" in err["message"]
            assert "w" in gw.core.sessions and (await http.get("/health")).status_code == 200
        gw.core.store = ok = JsonlStore(tmp_path / "ok.jsonl")
        (t,) = await gw.finish("w", 1.0)
        ok.close()
    assert len(list(read_trajectories(tmp_path / "ok.jsonl"))) == 1 and t.num_turns == 1
