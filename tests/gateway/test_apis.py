"""The Responses API and Anthropic Messages on the one recording path: the echo conversation through each
API's real client records the same tokens as a native rollout (and as chat completions); chaining, store,
refusals, error shapes, x-api-key, and the auxiliary routes the clients call."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from agentrl.audit import audit_trajectory
from agentrl.trainers.gateway import Gateway
from agentrl.types import StopReason

from .api_agents import ANTHROPIC_TOOLS, RESPONSES_TOOLS, anthropic_echo_agent, responses_echo_agent
from .helpers import QUESTION, START, SYSTEM, client_for, scripted
from .test_fidelity import native


def same_record(traj, ref) -> None:
    assert traj.token_ids == ref.token_ids and traj.loss_mask == ref.loss_mask
    assert traj.logprobs == ref.logprobs and traj.segments == ref.segments
    assert traj.messages == ref.messages and traj.actions == ref.actions and traj.rewards == ref.rewards
    assert (traj.stop_reason, traj.meta.extra["segments"], traj.errors) == (StopReason.TERMINATED, 1, ())
    assert [(r.call_id, r.name, r.output) for r in traj.tool_calls] == [
        (r.call_id, r.name, r.output) for r in ref.tool_calls
    ]


@pytest.mark.parametrize(
    ("api", "stream", "chain"),
    [
        ("responses", False, False),
        ("responses", True, False),
        ("responses", False, True),
        ("responses", True, True),
        ("anthropic", False, False),
        ("anthropic", True, False),
    ],
)
async def test_each_api_records_the_native_rollout(renderer, api, stream, chain):
    ref = await native(renderer)
    async with Gateway(scripted(renderer), renderer) as gw:
        if api == "responses":
            reward = await responses_echo_agent(gw.base_url("s"), stream=stream, chain=chain)
        else:
            reward = await anthropic_echo_agent(gw.anthropic_base_url("s"), stream=stream)
        (traj,) = await gw.finish("s", reward)
    assert reward == 1.0
    same_record(traj, ref)
    audit_trajectory(traj, renderer)


async def test_previous_response_id_needs_a_stored_response_of_the_same_session(renderer):
    async with Gateway(scripted(renderer), renderer) as gw:
        with pytest.raises(openai.BadRequestError) as e:
            await responses_echo_agent(gw.base_url("s"), chain=True, store=False)
        assert e.value.code == "previous_response_not_found" and e.value.param == "previous_response_id"
        first = await client_for(gw.base_url("t")).responses.create(model="m", input=QUESTION)
        with pytest.raises(openai.BadRequestError, match="not stored in session 'u'"):
            await client_for(gw.base_url("u")).responses.create(
                model="m", input="more", previous_response_id=first.id
            )


async def test_a_session_speaks_one_api(renderer):
    async with Gateway(scripted(renderer), renderer) as gw:
        client = client_for(gw.base_url("s"))
        await client.responses.create(model="m", instructions=SYSTEM, input=QUESTION, tools=RESPONSES_TOOLS)
        with pytest.raises(openai.BadRequestError, match="speaks the responses API") as e:
            await client.chat.completions.create(model="m", messages=START)
        assert e.value.code == "mixed_apis"
        async with anthropic.AsyncAnthropic(
            base_url=gw.anthropic_base_url("s"), api_key="k", max_retries=0
        ) as a:
            with pytest.raises(anthropic.BadRequestError, match="may not mix APIs"):
                await a.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}])
        (traj,) = await gw.finish("s", 0.0)
        assert traj.num_turns == 1 and not traj.infra_failure


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].type",
        ),
        ({"n": 2}, "n"),
        ({"include": ["reasoning.encrypted_content", "message.output_text.logprobs"]}, "include"),
        ({"reasoning": {"summary": "auto"}}, "reasoning"),
        ({"parallel_tool_calls": False}, "parallel_tool_calls"),
        ({"text": {"format": {"type": "json_object"}}}, "text.format"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
        ({"background": True}, "background"),
    ],
)
async def test_responses_refusals_name_the_field(renderer, extra, param):
    async with Gateway(scripted(renderer), renderer) as gw:
        with pytest.raises(openai.BadRequestError) as e:  # extra_body: sent as is, whatever the types say
            await client_for(gw.base_url("s")).responses.create(model="m", input=QUESTION, extra_body=extra)
        assert e.value.param == param and e.value.type == "invalid_request_error"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        (
            {"tool_choice": {"type": "auto", "disable_parallel_tool_use": True}},
            "tool_choice.disable_parallel_tool_use",
        ),
        ({"top_k": 5}, "top_k"),
        ({"stop_sequences": ["x"]}, "stop_sequences"),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0].type"),
        ({"output_config": {"format": {"type": "json_schema"}}}, "output_config"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}
                ]
            },
            "messages[0].content[0].type",
        ),
    ],
)
async def test_anthropic_refusals_name_the_field(renderer, extra, param):
    async with Gateway(scripted(renderer), renderer) as gw:
        msgs = [{"role": "user", "content": "x"}]
        async with anthropic.AsyncAnthropic(
            base_url=gw.anthropic_base_url("s"), api_key="k", max_retries=0
        ) as a:
            with pytest.raises(anthropic.BadRequestError) as e:
                await a.messages.create(model="m", max_tokens=8, messages=msgs, extra_body=extra)
        err = e.value.body
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
        assert f"(field: {param})" in err["error"]["message"]


async def test_anthropic_auxiliary_routes_and_x_api_key(renderer):
    async with Gateway(scripted(renderer), renderer, api_key="s3cret") as gw:
        url = gw.anthropic_base_url("s")
        async with anthropic.AsyncAnthropic(base_url=url, api_key="wrong", max_retries=0) as a:
            with pytest.raises(anthropic.AuthenticationError) as e:
                await a.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}])
            assert e.value.body["error"]["type"] == "authentication_error"
        async with anthropic.AsyncAnthropic(base_url=url, api_key="s3cret", max_retries=0) as a:
            models = await a.models.list()
            assert [m.id for m in models.data] == ["agentrl-policy"]
            msgs = [{"role": "user", "content": QUESTION}]
            n = await a.messages.count_tokens(model="m", system=SYSTEM, messages=msgs, tools=ANTHROPIC_TOOLS)
            reply = await a.messages.create(
                model="m", max_tokens=64, system=SYSTEM, messages=msgs, tools=ANTHROPIC_TOOLS
            )
            assert n.input_tokens == reply.usage.input_tokens  # the prompt the policy saw
            assert reply.stop_reason == "tool_use" and reply.content[0].type == "tool_use"
        async with anthropic.AsyncAnthropic(base_url=url, auth_token="s3cret", max_retries=0) as a:  # Bearer
            assert (await a.models.list()).data[0].type == "model"
        async with httpx.AsyncClient() as h:
            r = await h.post(f"{url}/v1/messages/nope", headers={"x-api-key": "s3cret"}, json={})
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
        assert r.json()["type"] == "error"
        async with openai.AsyncOpenAI(base_url=gw.base_url("s"), api_key="s3cret") as o:
            openai_models = await o.models.list()
        assert openai_models.data[0].id == "agentrl-policy"


async def test_a_cut_turn_reads_as_each_apis_length_stop(renderer):
    async with Gateway(scripted(renderer, stop=False), renderer) as gw:
        resp = await client_for(gw.base_url("r")).responses.create(
            model="m", input=QUESTION, max_output_tokens=64
        )
        assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
        async with anthropic.AsyncAnthropic(
            base_url=gw.anthropic_base_url("a"), api_key="k", max_retries=0
        ) as a:
            msg = await a.messages.create(
                model="m", max_tokens=64, messages=[{"role": "user", "content": "x"}]
            )
        assert msg.stop_reason == "max_tokens"
