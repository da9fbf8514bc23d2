"""The tool-call formats of the model families (tools/formats.py), on text written in each family's
documented shape: one call, several calls, content around them, and malformed calls, which must become a
recorded parse error the model reads (never an exception, never a silent drop)."""

import json

import pytest

from agentrl.envs import Task, ToolEnv
from agentrl.tools import (
    PARSERS,
    DeepSeekV3Parser,
    HarmonyParser,
    LlamaJsonParser,
    MistralParser,
    Qwen3CoderParser,
    ToolExecutor,
    detect_tool_format,
    get_parser,
    tool,
)
from agentrl.types import Action, ToolStatus


@tool
def get_weather(city: str, days: int = 1) -> str:
    """Forecast for a city.

    Args:
        city: The city.
        days: How many days ahead.
    """
    return f"{city}: sunny for {days} day(s)"


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: First.
        b: Second.
    """
    return a + b


def calls(parsed):
    return [
        (c.name, json.loads(c.arguments) if not parsed.error_for(c.id) else c.arguments) for c in parsed.calls
    ]


# -- Llama 3.x ------------------------------------------------------------------------------------------
def test_llama3_json_calls():
    p = LlamaJsonParser()
    one = p.parse('{"name": "get_weather", "parameters": {"city": "Oslo", "days": 2}}', id_prefix="call_0")
    assert calls(one) == [("get_weather", {"city": "Oslo", "days": 2})] and one.calls[0].id == "call_0_0"
    assert one.content == "" and not one.errors
    tagged = p.parse(
        '<|python_tag|>{"name": "add", "arguments": {"a": 1, "b": 2}}; '
        '{"name": "add", "parameters": {"a": 3, "b": 4}}'
    )
    assert calls(tagged) == [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})]
    plain = p.parse("The answer is 4.\nAnswer: 4")
    assert not plain.has_calls and plain.answer == "4"
    assert not p.parse('{"result": 4}').has_calls  # JSON without a function name is an answer, not a call


def test_llama3_json_malformed():
    p = LlamaJsonParser()
    bad = p.parse('{"name": "add", "parameters": {"a": 1, "b": }')
    (err,) = bad.errors
    assert (
        bad.calls[0].name == "add" and err.status == ToolStatus.PARSE_ERROR and "invalid JSON" in err.message
    )
    assert '{"name": <function-name>, "parameters"' in err.message
    nameless = p.parse('<|python_tag|>{"parameters": {"a": 1}}')
    assert 'needs a "name"' in nameless.errors[0].message
    assert "must be a JSON object" in p.parse('{"name": "add", "parameters": [1, 2]}').errors[0].message


# -- Mistral ----------------------------------------------------------------------------------------------
def test_mistral_list_and_args_layouts():
    p = MistralParser()
    v3 = p.parse(
        'Let me check.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Lyon"}}, '
        '{"name": "add", "arguments": {"a": 2, "b": 5}}]</s>',
        id_prefix="call_1",
    )
    assert v3.content == "Let me check."
    assert calls(v3) == [("get_weather", {"city": "Lyon"}), ("add", {"a": 2, "b": 5})]
    assert all(len(c.id) == 9 and c.id.isalnum() for c in v3.calls) and v3.calls[0].id != v3.calls[1].id
    v11 = p.parse(
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Nice", "days": 3}[TOOL_CALLS]add[ARGS]{"a": 1, "b": 1}'
    )
    assert calls(v11) == [("get_weather", {"city": "Nice", "days": 3}), ("add", {"a": 1, "b": 1})]
    assert not p.parse("No tools needed. Answer: 7").has_calls


def test_mistral_malformed():
    p = MistralParser()
    assert "not valid JSON" in p.parse('[TOOL_CALLS]add[ARGS]{"a": 1,').errors[0].message
    assert "function name before [ARGS]" in p.parse('[TOOL_CALLS][ARGS]{"a": 1}').errors[0].message
    assert "invalid JSON" in p.parse('[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}').errors[0].message
    assert "Empty [TOOL_CALLS]" in p.parse("[TOOL_CALLS]").errors[0].message


# -- Qwen3-Coder ------------------------------------------------------------------------------------------
def test_qwen3_coder_xml_calls_typed_by_schema():
    p = Qwen3CoderParser()
    p.format_instructions([get_weather, add])  # remembers the schemas, as a ToolEnv does
    text = (
        "I will look it up.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=add>\n"
        "<parameter=a>\n40\n</parameter>\n<parameter=b>\n2\n</parameter>\n</function>\n</tool_call>"
    )
    parsed = p.parse(text)
    assert calls(parsed) == [("get_weather", {"city": "São Paulo", "days": 3}), ("add", {"a": 40, "b": 2})]
    assert parsed.content == "I will look it up."
    # A string parameter keeps its text even when it looks like a number; unknown tools keep strings.
    odd = p.parse("<function=get_weather>\n<parameter=city>\n1984\n</parameter>\n</function>")
    assert calls(odd) == [("get_weather", {"city": "1984"})]
    assert calls(Qwen3CoderParser().parse("<function=x>\n<parameter=n>\n5\n</parameter>\n</function>")) == [
        ("x", {"n": "5"})
    ]
    # Cut off at the end of the turn: still a call.
    assert calls(
        p.parse("<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2")
    ) == [("add", {"a": 1, "b": 2})]


def test_qwen3_coder_malformed():
    p = Qwen3CoderParser([add])
    bad = p.parse(
        "<tool_call>\n<function=add>\n<parameter=a>\nforty\n</parameter>\n</function>\n</tool_call>"
    )
    assert "Parameter 'a' must be integer, got 'forty'" in bad.errors[0].message
    assert "<function=NAME>" in bad.errors[0].message
    assert (
        "needs a function name"
        in p.parse("<tool_call>\n<function=>\n</function>\n</tool_call>").errors[0].message
    )
    loose = p.parse('<tool_call>\n<function=add>\n{"a": 1}\n</function>\n</tool_call>')
    assert "<parameter=ARG>" in loose.errors[0].message


# -- DeepSeek V3 --------------------------------------------------------------------------------------------
B, E, CB, CE, SEP = (
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
)


def test_deepseek_v3_both_layouts():
    p = DeepSeekV3Parser()
    v3 = p.parse(
        f'Checking.{B}{CB}function{SEP}get_weather\n```json\n{{"city": "Kyoto"}}\n```{CE}'
        f'{CB}function{SEP}add\n```json\n{{"a": 1, "b": 2}}\n```{CE}{E}'
    )
    assert v3.content == "Checking."
    assert calls(v3) == [("get_weather", {"city": "Kyoto"}), ("add", {"a": 1, "b": 2})]
    v31 = p.parse(f'{B}{CB}add{SEP}{{"a": 5, "b": 6}}{CE}{E}')
    assert calls(v31) == [("add", {"a": 5, "b": 6})]
    assert not p.parse("Answer: 11").has_calls


def test_deepseek_v3_malformed():
    p = DeepSeekV3Parser()
    assert "not valid JSON" in p.parse(f'{B}{CB}add{SEP}{{"a": 5,{CE}{E}').errors[0].message
    assert "no <｜tool▁sep｜>" in p.parse(f"{B}{CB}add{CE}{E}").errors[0].message
    assert "must be a JSON object" in p.parse(f"{B}{CB}add{SEP}[1, 2]{CE}{E}").errors[0].message


# -- harmony (gpt-oss) --------------------------------------------------------------------------------
def test_harmony_calls_and_channels():
    p = HarmonyParser()
    turn = (
        "<|channel|>analysis<|message|>The user wants the weather; call the tool.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city": "Lima"}<|call|>'
    )
    parsed = p.parse(turn)
    assert calls(parsed) == [("get_weather", {"city": "Lima"})] and parsed.content == ""
    # The recipient may also come before the channel.
    alt = p.parse(
        '<|start|>assistant to=functions.add<|channel|>commentary json<|message|>{"a": 1, "b": 2}<|call|>'
    )
    assert calls(alt) == [("add", {"a": 1, "b": 2})]
    final = p.parse(
        "<|channel|>analysis<|message|>2+2=4<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Answer: 4<|return|>"
    )
    assert not final.has_calls and final.content == "Answer: 4" and final.answer == "4"
    assert p.parse("plain text\nAnswer: 3").answer == "3"


def test_harmony_malformed():
    p = HarmonyParser()
    bad = p.parse("<|channel|>commentary to=functions.add <|constrain|>json<|message|>{a: 1}<|call|>")
    assert bad.calls[0].name == "add" and "not valid JSON" in bad.errors[0].message
    assert (
        "needs a function name"
        in p.parse("<|channel|>commentary to=functions. json<|message|>{}<|call|>").errors[0].message
    )


def test_harmony_instructions_render_typescript():
    text = HarmonyParser().format_instructions([get_weather])
    assert "type get_weather = (_: { city: string, days?: number }) => any;" in text
    assert "namespace functions {" in text


# -- all of them --------------------------------------------------------------------------------
WRITE = {
    "hermes": lambda: '<tool_call>\n{"name": "add", "arguments": {"a": 20, "b": 22}}\n</tool_call>',
    "llama3_json": lambda: '{"name": "add", "parameters": {"a": 20, "b": 22}}',
    "mistral": lambda: '[TOOL_CALLS][{"name": "add", "arguments": {"a": 20, "b": 22}}]',
    "qwen3_coder": lambda: (
        "<tool_call>\n<function=add>\n<parameter=a>\n20\n</parameter>\n<parameter=b>\n22\n</parameter>\n</function>\n</tool_call>"
    ),
    "deepseek_v3": lambda: f'{B}{CB}add{SEP}{{"a": 20, "b": 22}}{CE}{E}',
    "harmony": lambda: (
        '<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 20, "b": 22}<|call|>'
    ),
}
BROKEN = {
    "hermes": '<tool_call>\n{"name": "add", "arguments": {"a": 20,}\n</tool_call>',
    "llama3_json": '{"name": "add", "parameters": {"a": 20,}',
    "mistral": '[TOOL_CALLS]add[ARGS]{"a": 20,',
    "qwen3_coder": (
        "<tool_call>\n<function=add>\n<parameter=a>\ntwenty\n</parameter>\n</function>\n</tool_call>"
    ),
    "deepseek_v3": f'{B}{CB}add{SEP}{{"a": 20,{CE}{E}',
    "harmony": '<|channel|>commentary to=functions.add json<|message|>{"a": 20,<|call|>',
}


class Adder(ToolEnv):
    def __init__(self, **kwargs):
        super().__init__([add], **kwargs)

    def make_task(self, options):
        return Task("What is 20 + 22? End with 'Answer: <n>'.", answer=42)


@pytest.mark.parametrize("fmt", sorted(WRITE))
async def test_every_format_runs_a_call_and_records_a_malformed_one_in_a_tool_env(fmt):
    env = Adder(parser=fmt)
    (system, _), _ = await env.reset(seed=0)
    assert "add" in system.content
    ok = await env.step(Action(WRITE[fmt]()))
    assert [(r.name, r.status, r.output) for r in ok.tool_calls] == [("add", ToolStatus.OK, "42")]
    assert ok.observation[0].role == "tool" and ok.observation[0].content == "42"
    bad = await env.step(Action(BROKEN[fmt]))
    (record,) = bad.tool_calls
    assert record.status == ToolStatus.PARSE_ERROR and not bad.terminated
    assert bad.observation[0].content == record.output and len(record.output) > 20  # the model reads why
    final = await env.step(Action("Answer: 42"))
    assert final.terminated and final.reward == 1.0


def test_registry_and_template_detection():
    assert {"llama3_json", "mistral", "qwen3_coder", "deepseek_v3", "harmony", "hermes"} <= set(PARSERS)
    assert isinstance(get_parser("harmony"), HarmonyParser)
    assert detect_tool_format("{{- '<|start|>assistant<|channel|>commentary to=functions.' }}") == "harmony"
    assert detect_tool_format("{{ '<tool_call>\\n<function=' + name + '>' }}") == "qwen3_coder"
    assert detect_tool_format("{{ '<tool_call>\\n' + json }}") == "hermes"
    assert detect_tool_format("{{ '[TOOL_CALLS][' }}") == "mistral"
    assert detect_tool_format("'<｜tool▁calls▁begin｜>'") == "deepseek_v3"
    assert detect_tool_format("<|start_header_id|>ipython<|end_header_id|>") == "llama3_json"
    assert detect_tool_format("{{ message.content }}") is None and detect_tool_format(None) is None
    assert ToolExecutor([add]).tools["add"] is not None


def test_tool_format_overrides_the_envs_own_parser():
    from agentrl.errors import ConfigError

    env = Adder(parser="hermes", tool_format="mistral")
    assert env.parser.name == "mistral" and "[TOOL_CALLS]" in env._system
    with pytest.raises(ConfigError, match="unknown tool-call parser 'klingon'"):
        Adder(tool_format="klingon")
