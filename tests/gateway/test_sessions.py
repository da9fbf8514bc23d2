"""Session semantics through the real server and openai client: history rewrites split or mark the session,
retries keep the sample the agent used, limits truncate like a native episode, and every recorded
trajectory passes the token audit."""

from __future__ import annotations

import json

import openai
import pytest

from agentrl import JsonlStore, read_trajectories
from agentrl.audit import audit_trajectory
from agentrl.chat import ChatRenderer
from agentrl.protocols import WeightUpdate
from agentrl.rollout import RolloutConfig, run_episode
from agentrl.staleness import token_versions, trajectory_staleness
from agentrl.testing import RecordingWeightSink
from agentrl.trainers.gateway import Gateway, GatewayConfig
from agentrl.types import StopReason, TokenSource

from .helpers import START, EchoToolEnv, ask, call, client_for, echo_agent, scripted, tool_result

TURNS = (call("echo", text="hello"), "Answer: hello", "Answer: again")


async def test_dropped_message_splits_into_a_new_segment(renderer):
    async with Gateway(scripted(renderer, TURNS), renderer) as gw:
        c = client_for(gw.base_url("s"))
        a, _ = await ask(c, START)
        b, _ = await ask(c, [*START, a, tool_result(a)])
        # The agent drops its last answer (b) and asks again: a rewrite of its history.
        again = [*START, a, tool_result(a), {"role": "user", "content": "Say it once more."}]
        await ask(c, again)
        first, second = await gw.finish("s", 1.0)
    assert [t.num_turns for t in (first, second)] == [2, 1]
    assert first.messages[-1].content == b["content"] and first.meta.extra["segment_end"] == "rewrite"
    assert second.meta.extra["segment_end"] == "finish" and second.meta.group_id == first.meta.group_id
    for t in (first, second):
        audit_trajectory(t, renderer)
        assert not t.infra_failure and t.meta.extra["segments"] == 2
    # The segments are the samples of one episode, in order; its return (the sum) is the session's reward.
    assert first.meta.episode_id == second.meta.episode_id
    assert [(t.meta.sample_index, t.meta.num_samples) for t in (first, second)] == [(0, 2), (1, 2)]
    assert (first.reward, second.reward) == (0.0, 1.0)
    # The new segment's prompt shows the model its earlier call as it sampled it (not the parsed message),
    # and it is prompt (mask 0), never re-tokenized into the old stream.
    prompt = [s for s in second.segments if s.source is TokenSource.PROMPT]
    text = renderer.decode(second.token_ids[prompt[0].start : prompt[-1].end])
    assert '<tool_call>\n{"name": "echo"' in text
    assert [s.source for s in second.segments].count(TokenSource.MODEL) == 1


@pytest.mark.parametrize(
    "edit",
    ["edited system", "reordered", "tools changed", "fake assistant"],
)
async def test_rewrites_are_split(renderer, edit):
    async with Gateway(scripted(renderer, TURNS), renderer) as gw:
        c = client_for(gw.base_url("s"))
        a, _ = await ask(c, START)
        nxt = [*START, a, tool_result(a)]
        kw = {}
        if edit == "edited system":
            nxt[0] = {"role": "system", "content": "Something else."}
        elif edit == "reordered":
            nxt[0], nxt[1] = nxt[1], nxt[0]
        elif edit == "tools changed":
            kw["tools"] = [
                {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}}
            ]
        else:
            nxt.append({"role": "assistant", "content": "I (not the model) wrote this."})
        await ask(c, nxt, **kw)
        trajs = await gw.finish("s", 0.5)
    assert len(trajs) == 2 and all(not t.infra_failure for t in trajs)
    for t in trajs:
        audit_trajectory(t, renderer)


async def test_non_trainable_mode_records_every_segment_unusable(renderer):
    async with Gateway(scripted(renderer, TURNS), renderer, GatewayConfig(on_rewrite="non_trainable")) as gw:
        c = client_for(gw.base_url("s"))
        a, _ = await ask(c, START)
        await ask(c, [START[1], a, tool_result(a)])  # dropped the system message
        trajs = await gw.finish("s", 1.0)
    assert len(trajs) == 2
    for t in trajs:
        assert (
            t.infra_failure and t.errors[-1].kind == "HistoryRewrite" and "message 0" in t.errors[-1].message
        )
        audit_trajectory(t, renderer)


async def test_reserialized_arguments_and_null_content_are_not_a_rewrite(renderer):
    async with Gateway(scripted(renderer, TURNS), renderer) as gw:
        c = client_for(gw.base_url("s"))
        a, finish = await ask(c, START)
        assert finish == "tool_calls" and json.loads(a["tool_calls"][0]["function"]["arguments"]) == {
            "text": "hello"
        }
        echoed = {"role": "assistant", "content": None, "tool_calls": [dict(a["tool_calls"][0])]}
        echoed["tool_calls"][0]["function"] = {"name": "echo", "arguments": '{ "text" :  "hello" }'}
        await ask(c, [*START, echoed, tool_result(a)])
        (t,) = await gw.finish("s", 1.0)
    assert t.num_turns == 2 and t.meta.extra["segments"] == 1


async def test_retry_keeps_the_sample_the_agent_used(renderer):
    async with Gateway(scripted(renderer, ("Answer: one", "Answer: two", "Answer: three")), renderer) as gw:
        c = client_for(gw.base_url("s"))
        one, _ = await ask(c, START)
        two, _ = await ask(c, START)  # the same request again (a client retry)
        assert (one["content"], two["content"]) == ("Answer: one", "Answer: two")
        await ask(c, [*START, one, {"role": "user", "content": "Sure?"}])  # built on the first sample
        (t,) = await gw.finish("s", 1.0)
    assert t.actions == ("Answer: one", "Answer: three") and t.meta.extra["retries"] == 1
    audit_trajectory(t, renderer)


async def test_turn_cut_by_max_tokens_is_truncated_and_continuing_splits(renderer):
    async with Gateway(scripted(renderer, ("Answer: hello world and more",)), renderer) as gw:
        c = client_for(gw.base_url("cut"))
        a, finish = await ask(c, START, max_tokens=3)
        assert finish == "length"
        (t,) = await gw.finish("cut", 0.0)
        assert (t.truncated, t.stop_reason, t.num_model_tokens) == (True, StopReason.TURN_TOKENS, 3)
        audit_trajectory(t, renderer)
        c = client_for(gw.base_url("go-on"))
        a, _ = await ask(c, START, max_tokens=3)
        await ask(c, [*START, a, {"role": "user", "content": "Go on."}])
        first, second = await gw.finish("go-on", 0.0)
    assert first.stop_reason is StopReason.TURN_TOKENS
    assert first.meta.extra["segment_end"] == "after_length_cut"  # nothing was rewritten
    assert second.num_turns == 1 and renderer.decode(first.token_ids[-3:]) in renderer.decode(
        second.token_ids
    )
    for t in (first, second):
        audit_trajectory(t, renderer)


async def test_context_budget_and_turn_limit_truncate_like_a_native_episode(renderer):
    env = EchoToolEnv()
    obs, _ = await env.reset(seed=0)
    n_prompt = len(renderer.render_prompt(obs).token_ids)
    n_turn = len(renderer.encode(TURNS[0])) + 1
    cfg = GatewayConfig(max_total_tokens=n_prompt + n_turn + 4)
    async with Gateway(scripted(renderer, TURNS), renderer, cfg) as gw:
        c = client_for(gw.base_url("s"))
        a, _ = await ask(c, START)
        with pytest.raises(openai.BadRequestError) as e:
            await ask(c, [*START, a, tool_result(a)])
        assert e.value.code == "context_length_exceeded"
        assert gw.core.limit_reached("s") is StopReason.MAX_TOKENS
        with pytest.raises(openai.BadRequestError):  # still refused: the stream cannot grow
            await ask(c, [*START, a, tool_result(a)])
        (t,) = await gw.finish("s", 0.0)
    assert (t.truncated, t.stop_reason, t.num_turns) == (True, StopReason.MAX_TOKENS, 1)
    assert t.segments[-1].source is TokenSource.MODEL  # ends with the model's turn, as a native episode does
    audit_trajectory(t, renderer)

    async with Gateway(scripted(renderer, TURNS), renderer, GatewayConfig(max_turns=1)) as gw:
        c = client_for(gw.base_url("s"))
        a, _ = await ask(c, START)
        with pytest.raises(openai.BadRequestError) as e:
            await ask(c, [*START, a, tool_result(a)])
        assert e.value.code == "max_turns_exceeded"
        (t,) = await gw.finish("s", 0.0)
    native = await run_episode(EchoToolEnv(), scripted(renderer, TURNS), renderer, RolloutConfig(max_turns=1))
    assert (t.stop_reason, t.token_ids, t.loss_mask) == (
        StopReason.MAX_TURNS,
        native.token_ids,
        native.loss_mask,
    )


TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


async def test_template_that_renders_tools_equals_native_rollout(tok):
    renderer = ChatRenderer(tok, chat_template=TOOLS_TEMPLATE)
    env = EchoToolEnv(tools_in_prompt=False)  # the env exposes its schemas; the template renders them
    ref = await run_episode(env, scripted(renderer), renderer, RolloutConfig(audit=True))
    async with Gateway(scripted(renderer), renderer) as gw:
        assert gw.core.tools_in_template
        reward = await echo_agent(gw.base_url("s"))
        (t,) = await gw.finish("s", reward)
    assert "Tools: [" in renderer.decode(t.token_ids[:40])
    assert (t.token_ids, t.loss_mask, t.logprobs, t.segments) == (
        ref.token_ids,
        ref.loss_mask,
        ref.logprobs,
        ref.segments,
    )


class BrokenPolicy:
    version = 3

    async def generate(self, prompt_ids, sampling):
        raise RuntimeError("the inference server is down")


async def test_policy_failure_is_a_500_and_an_infra_failure(renderer):
    async with Gateway(BrokenPolicy(), renderer) as gw:
        c = client_for(gw.base_url("s"))
        with pytest.raises(openai.InternalServerError, match="inference server is down"):
            await ask(c, START)
        (t,) = await gw.finish("s", 1.0)
    assert t.infra_failure and t.num_turns == 0 and t.errors[0].kind == "RuntimeError"


# Counts the messages in its first line: every new message rewrites the start of the prompt (pitfall §15.4).
COUNTING_TEMPLATE = (
    "<|im_start|>system\n{{ messages | length }} messages<|im_end|>\n"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


async def test_template_that_is_not_append_only_splits_and_records_why(tok):
    renderer = ChatRenderer(tok, chat_template=COUNTING_TEMPLATE)
    async with Gateway(scripted(renderer, TURNS), renderer) as gw:
        c = client_for(gw.base_url("s"))
        a, _ = await ask(c, START)
        b, _ = await ask(c, [*START, a, tool_result(a)])
        first, second = await gw.finish("s", 1.0)
    assert (first.stop_reason, first.truncated, first.num_turns) == (StopReason.TEMPLATE_MISMATCH, True, 1)
    assert first.errors[0].kind == "TemplateError" and not first.infra_failure
    assert second.num_turns == 1 and second.actions == (b["content"],)
    assert renderer.decode(second.token_ids).startswith("<|im_start|>system\n4 messages")
    for t in (first, second):
        audit_trajectory(t, renderer)


async def test_a_session_spanning_a_weight_update_records_each_turns_version(renderer, tmp_path):
    """The learner publishes new weights between the agent's turns (through the sampler's WeightSink): the
    session's trajectory records each turn's own version, not the oldest for all; the file keeps them, and
    staleness and the update read them per token."""
    sink = RecordingWeightSink(scripted(renderer))  # SCRIPT: a call, text plus a call, the answer
    with JsonlStore(tmp_path / "trajectories.jsonl") as store:
        async with Gateway(sink, renderer, store=store) as gw:
            c = client_for(gw.base_url("s"))
            a, _ = await ask(c, START)
            await sink.load_weights(WeightUpdate(1, {"w": 0.0}))
            b, _ = await ask(c, [*START, a, tool_result(a)])
            await sink.load_weights(WeightUpdate(3, {"w": 0.0}))
            await ask(c, [*START, a, tool_result(a), b, tool_result(b, "again")])
            await c.close()
            (t,) = await gw.finish("s", 1.0)
    audit_trajectory(t, renderer)
    assert t.num_turns == 3 and t.policy_versions == (0, 1, 3)
    assert (t.meta.policy_version, t.min_policy_version, t.max_policy_version) == (0, 0, 3)
    assert not {"turn_versions", "policy_version_max"} & set(t.meta.extra)  # one record: the typed field
    (stored,) = list(read_trajectories(tmp_path / "trajectories.jsonl"))
    assert stored.policy_versions == (0, 1, 3)
    model = [s for s in stored.segments if s.source is TokenSource.MODEL]
    versions = token_versions(stored)
    assert [set(versions[s.start : s.end]) for s in model] == [{0}, {1}, {3}]
    assert trajectory_staleness(stored, 3) == 3
