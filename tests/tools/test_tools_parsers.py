"""Tool-call parsers: Hermes <tool_call> JSON and fenced python blocks; malformed input never raises."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl import ToolCall, ToolStatus
from agentrl.errors import ConfigError
from agentrl.tools import (
    HermesParser,
    PythonBlockParser,
    ToolCallParser,
    calculator,
    get_parser,
    python,
)

HERMES = HermesParser()
PY = PythonBlockParser()


# -- Hermes ------------------------------------------------------------------------------------------
def test_hermes_well_formed_call():
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    turn = HERMES.parse(text)
    assert turn.calls == (ToolCall("call_0", "add", '{"a": 1, "b": 2}'),)
    assert turn.errors == ()
    assert turn.content == "Let me add."
    assert turn.has_calls and turn.answer is None


def test_hermes_keeps_the_arguments_verbatim():
    text = '<tool_call>{"arguments": {"b" :2,  "a":[1,  2]}, "name": "f"}</tool_call>'
    (call,) = HERMES.parse(text).calls
    assert call.arguments == '{"b" :2,  "a":[1,  2]}'
    assert json.loads(call.arguments) == {"b": 2, "a": [1, 2]}


def test_hermes_several_calls_in_one_turn_keep_text_order_and_ids():
    text = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call> and '
        '<tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>'
        '<tool_call>[{"name": "c", "arguments": {}}, {"name": "d", "parameters": {"k": "v"}}]</tool_call>'
    )
    turn = HERMES.parse(text, id_prefix="call_3")
    assert [(c.id, c.name) for c in turn.calls] == [
        ("call_3_0", "a"),
        ("call_3_1", "b"),
        ("call_3_2", "c"),
        ("call_3_3", "d"),
    ]
    assert turn.calls[3].arguments == '{"k": "v"}'
    assert turn.content == "and"


@pytest.mark.parametrize(
    ("body", "name", "words"),
    [
        ('{"name": "add", "arguments": {"a": 1,}}', "add", "invalid JSON"),
        ("not json at all", "", "invalid JSON"),
        ('{"arguments": {}}', "", '"name" string'),
        ("[42]", "", '"name" string'),
        ('{"name": "add", "arguments": [1, 2]}', "add", "must be a JSON object"),
        ('{"name": "add", "arguments": "{oops"}', "add", "not valid JSON"),
        ("", "", "Empty <tool_call> block"),
    ],
)
def test_hermes_malformed_calls_become_parse_errors_with_the_format(body, name, words):
    turn = HERMES.parse(f"thinking <tool_call>{body}</tool_call>")
    (call,) = turn.calls
    (error,) = turn.errors
    assert call.name == name and error.call_id == call.id
    assert error.status is ToolStatus.PARSE_ERROR
    assert words in error.message
    assert '{"name": <function-name>, "arguments": <args-json-object>}' in error.message


def test_hermes_lenient_forms():
    stringly = HERMES.parse('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>')
    assert stringly.calls[0].arguments == '{"x": 1}' and not stringly.errors
    fenced = HERMES.parse('<tool_call>```json\n{"name": "f", "arguments": {}}\n```</tool_call>')
    assert fenced.calls[0].name == "f" and not fenced.errors
    unclosed = HERMES.parse('ok <tool_call>{"name": "f", "arguments": {"q": 2}}')
    assert unclosed.calls == (ToolCall("call_0", "f", '{"q": 2}'),) and unclosed.content == "ok"
    no_args = HERMES.parse('<tool_call>{"name": "f"}</tool_call>')
    assert no_args.calls[0].arguments == "{}" and not no_args.errors


def test_hermes_plain_text_is_a_final_turn_with_an_answer():
    turn = HERMES.parse("The product is big.\nAnswer: 1,234")
    assert not turn.has_calls and turn.content == "The product is big.\nAnswer: 1,234"
    assert turn.answer == "1,234"


def test_hermes_instructions_list_every_schema():
    text = HERMES.format_instructions([calculator, python])
    for t in (calculator, python):
        assert json.dumps(t.schema, ensure_ascii=False) in text
    assert "<tool_call>" in text and HERMES.format_output("calculator", "42") == "42"


# -- fenced python -----------------------------------------------------------------------------------
def test_python_blocks_are_calls_to_the_python_tool_and_content_is_verbatim():
    text = "First:\n```python\nx = 2\nprint(x)\n```\nThen:\n```py\nprint(x + 1)\n```\n"
    turn = PY.parse(text, id_prefix="call_1")
    assert turn.content == text
    assert [c.id for c in turn.calls] == ["call_1_0", "call_1_1"]
    assert [json.loads(c.arguments) for c in turn.calls] == [
        {"code": "x = 2\nprint(x)"},
        {"code": "print(x + 1)"},
    ]
    assert all(c.name == "python" for c in turn.calls) and not turn.errors


def test_python_other_fences_are_not_calls_and_an_unclosed_block_is():
    text = "```output\n3\n```\n```\nplain\n```\n```bash\nls\n```"
    assert not PY.parse(text).has_calls
    turn = PY.parse("Compute:\n```python\nprint(6 * 7)")
    assert json.loads(turn.calls[0].arguments) == {"code": "print(6 * 7)"}


def test_python_empty_block_is_a_parse_error():
    turn = PY.parse("```python\n\n```")
    assert turn.errors[0].status is ToolStatus.PARSE_ERROR and "empty" in turn.errors[0].message


def test_python_answer_is_read_outside_code():
    assert PY.parse('```python\nprint("Answer: 3")\n```').answer is None
    assert PY.parse("```output\n17\n```\nAnswer: 17").answer == "17"
    assert PY.parse("so the result is \\boxed{\\frac{1}{2}}.").answer == "\\frac{1}{2}"


def test_python_parser_formats_output_and_requires_the_python_tool():
    assert PY.format_output("python", "42") == "```output\n42\n```"
    assert "```python" in PY.format_instructions([python])
    with pytest.raises(ConfigError, match="not among the tools"):
        PY.format_instructions([calculator])


# -- registry and robustness -------------------------------------------------------------------------
def test_get_parser():
    assert isinstance(get_parser("hermes"), HermesParser)
    assert isinstance(get_parser("qwen"), HermesParser)
    assert isinstance(get_parser("python"), PythonBlockParser)
    assert get_parser(PY) is PY and isinstance(PY, ToolCallParser)
    with pytest.raises(ConfigError, match="unknown tool-call parser 'xml'"):
        get_parser("xml")
    with pytest.raises(ConfigError, match="not a ToolCallParser"):
        get_parser(object())  # type: ignore[arg-type]


FRAGMENTS = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "{",
        "}",
        '"name"',
        '"arguments"',
        ":",
        ",",
        "[",
        "]",
        "```python\n",
        "```",
        "\n",
        "Answer: 4",
        "\\boxed{",
        "x",
        '"f"',
        "1",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(FRAGMENTS, st.text(max_size=5)), max_size=30))
def test_parsers_never_raise_and_every_error_names_a_call(pieces):
    text = "".join(pieces)
    for parser in (HERMES, PY):
        turn = parser.parse(text)
        ids = {c.id for c in turn.calls}
        assert len(ids) == len(turn.calls)
        assert {e.call_id for e in turn.errors} <= ids
