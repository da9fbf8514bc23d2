"""The tool-use alarm: a run whose parser reads none of the model's calls must say so, with the flag that
would read them (agentcore-rl-toolkit #97: a run reached 0.93 validation reward with zero tool calls)."""

from __future__ import annotations

import json
import re

import pytest

import agentrl
from agentrl.rollout import RolloutConfig, run_episode
from agentrl.testing import ScriptedPolicy
from agentrl.tools.sniff import BARE_JSON, foreign_call_format
from agentrl.trainers.step_metrics import tool_use_alarm

CFG = RolloutConfig(max_turns=3, max_new_tokens=128)


def _policy(renderer, answer_of) -> ScriptedPolicy:
    """A model that writes a Qwen-style ``<tool_call>`` and the answer it knows, then the answer again."""

    def turns(prompt_ids):
        text = renderer.decode(prompt_ids)
        if text.count("<|im_start|>assistant") == 1:
            out = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1 + 1"}}\n</tool_call>'
            out += f"\nAnswer: {answer_of(text)}"  # read as a final turn when the call goes unparsed
        else:
            out = f"Answer: {answer_of(text)}"
        return [*renderer.encode(out), *renderer.stop_token_ids[:1]]

    return ScriptedPolicy(turns, stop_ids=renderer.stop_token_ids)


async def _episodes(renderer, tool_format: str | None, n: int = 3):
    out = []
    for seed in range(n):
        env = agentrl.make("calculator-v0", **({"tool_format": tool_format} if tool_format else {}))
        _, info = await env.reset(seed=seed)
        answer = info["answer"]
        policy = _policy(renderer, lambda _text, a=answer: a)
        out.append(await run_episode(env, policy, renderer, CFG, seed=seed))
    return out


async def test_zero_parsed_calls_with_calls_in_another_format_fire_the_alarm(renderer, capsys):
    # The run reads Llama's JSON format; the model writes Qwen's <tool_call> blocks. Nothing raises, the
    # episodes even score (the scripted model knows the answer): exactly the silent failure.
    trajs = await _episodes(renderer, "llama3_json")
    assert all(t.meta.extra["tool_format"] == "llama3_json" for t in trajs)
    assert sum(len(t.tool_calls) for t in trajs) == 0 and all(t.reward == 1.0 for t in trajs)
    alarm = tool_use_alarm(trajs)
    assert alarm.warning is not None
    assert "no tool call was parsed (llama3_json format) in 3 episodes" in alarm.warning
    assert "--rollout.tool-format hermes would parse them" in alarm.warning
    assert alarm.metrics == {
        "tools/parse_error_frac": 0.0,
        "tools/foreign_format_frac": 1.0,
        "tools/alarm": 1.0,
    }


async def test_the_same_model_read_in_its_own_format_raises_no_alarm(renderer):
    trajs = await _episodes(renderer, None)  # calculator-v0 reads hermes by default
    assert all(len(t.tool_calls) == 1 for t in trajs)
    alarm = tool_use_alarm(trajs)
    assert alarm.warning is None and alarm.metrics["tools/alarm"] == 0.0


async def test_envs_without_tools_report_nothing(renderer):
    env = agentrl.make("guess-number-v0")
    policy = ScriptedPolicy(
        [[*renderer.encode("50"), renderer.stop_token_ids[0]]], stop_ids=renderer.stop_token_ids
    )
    traj = await run_episode(env, policy, renderer, CFG, seed=0)
    assert "tool_format" not in traj.meta.extra
    assert tool_use_alarm([traj]).metrics == {} and tool_use_alarm([traj]).warning is None


async def test_mostly_malformed_calls_fire_the_parse_failure_alarm(renderer):
    def turns(prompt_ids):
        text = renderer.decode(prompt_ids)
        if text.count("<|im_start|>assistant") == 1:
            out = '<tool_call>{"name": "calculator", "arguments": {"expression": "1 +</tool_call>'
        else:
            out = "Answer: 0"
        return [*renderer.encode(out), renderer.stop_token_ids[0]]

    env = agentrl.make("calculator-v0")
    traj = await run_episode(
        env, ScriptedPolicy(turns, stop_ids=renderer.stop_token_ids), renderer, CFG, seed=1
    )
    alarm = tool_use_alarm([traj])
    assert (
        alarm.warning is not None
        and "1 of 1 tool calls (100 %) failed to parse as the hermes format" in alarm.warning
    )
    assert alarm.metrics["tools/parse_error_frac"] == 1.0
    assert tool_use_alarm([traj], max_parse_fail=1.0).warning is None  # the threshold is the caller's


CALL = {"name": "calculator", "arguments": {"expression": "2 * 21"}}


@pytest.mark.parametrize(
    ("text", "own", "expected"),
    [
        (f"<tool_call>\n{json.dumps(CALL)}\n</tool_call>", "llama3_json", "hermes"),
        (json.dumps(CALL), "hermes", "llama3_json"),
        ('[TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "2"}}]', "hermes", "mistral"),
        (
            "<function=calculator>\n<parameter=expression>\n2\n</parameter>\n</function>",
            "hermes",
            "qwen3_coder",
        ),
        (
            "<|channel|>commentary to=functions.calculator <|constrain|>json<|message|>"
            '{"expression": "2"}<|call|>',
            "hermes",
            "harmony",
        ),
        (
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>calculator<｜tool▁sep｜>"
            '{"expression": "2"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
            "hermes",
            "deepseek_v3",
        ),
        ("Let me compute:\n```python\nprint(2 * 21)\n```", "hermes", "python"),
        (f"I would call {json.dumps(CALL)} here.", "hermes", BARE_JSON),
        ("The answer is 42.", "hermes", None),
        ('{"name": "calculator"', "hermes", None),  # a broken call is not evidence of a format
        (f"<tool_call>\n{json.dumps(CALL)}\n</tool_call>", "qwen", None),  # an alias of the run's own format
    ],
)
def test_foreign_call_format_names_the_format(text, own, expected):
    assert foreign_call_format(text, own) == expected
    if expected not in (None, BARE_JSON):  # the named format really reads the call
        parsed = agentrl.tools.get_parser(expected).parse(text)
        assert parsed.calls and not parsed.errors and re.fullmatch(r"calculator|python", parsed.calls[0].name)
