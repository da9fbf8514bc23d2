"""Model outputs for the differential parser tests: writers of each format, and adversarial cases.

Every adversarial case names the outcome expected of the comparison with the reference: ``agree``, or the
deliberate difference (a key of :data:`DELIBERATE`) that docs/fidelity.md records.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

Call = tuple[str, dict[str, Any]]

DELIBERATE = {
    "records_malformed": "the reference raises on a malformed call; agentrl records it as a call with a "
    "parse error whose message tells the model what was wrong (a malformed call is never dropped or fatal)",
    "lenient_alias": 'agentrl also accepts "parameters" for "arguments" and arguments as a JSON string; '
    "the reference keeps the object as written",
    "bare_function": "agentrl reads <function=...> without the <tool_call> wrapper; the reference does not",
    "string_param": "agentrl keeps a string-typed Qwen3-Coder parameter as written even when it reads as "
    "JSON ('[1, 2]' stays a string), as the schema says; transformers' template decodes it first",
    "whitespace_kept": "agentrl strips only the one newline the Qwen3-Coder format puts around a value; "
    "transformers' template strips all surrounding whitespace",
    "template_gap": "transformers' gpt-oss response template reads a call only as `<|channel|>commentary "
    "to=functions.NAME`; harmony also lets the recipient come first, as openai-harmony and agentrl read it",
    "plain_text": "openai-harmony raises on a completion without harmony tokens; agentrl reads it as content "
    "(a model that does not speak harmony yet)",
}
"""Differences kept on purpose, by name."""


def hermes(calls: Sequence[Call], *, content: str = "", reasoning: str | None = None) -> str:
    """A Qwen2.5/Qwen3 (hermes) turn: optional ``<think>``, content, one ``<tool_call>`` block per call."""
    head = f"<think>\n{reasoning}\n</think>\n\n" if reasoning is not None else ""
    blocks = "\n".join(
        f"<tool_call>\n{json.dumps({'name': n, 'arguments': a}, ensure_ascii=False)}\n</tool_call>"
        for n, a in calls
    )
    return head + "\n".join(p for p in (content, blocks) if p)


def _xml_value(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


def qwen3_coder(calls: Sequence[Call], *, content: str = "", reasoning: str | None = None) -> str:
    """A Qwen3-Coder turn: ``<tool_call><function=NAME><parameter=K>V</parameter>...``."""
    head = f"<think>\n{reasoning}\n</think>\n\n" if reasoning is not None else ""
    blocks = []
    for n, a in calls:
        params = "".join(f"<parameter={k}>\n{_xml_value(v)}\n</parameter>\n" for k, v in a.items())
        blocks.append(f"<tool_call>\n<function={n}>\n{params}</function>\n</tool_call>")
    return head + "\n".join(p for p in (content, *blocks) if p)


def harmony(calls: Sequence[Call], *, content: str = "", reasoning: str | None = None) -> str:
    """A gpt-oss completion (after ``<|start|>assistant``): analysis, calls, or a final message."""
    parts = []
    if reasoning is not None:
        parts.append(f"<|channel|>analysis<|message|>{reasoning}<|end|>")
    for n, a in calls:
        body = json.dumps(a, ensure_ascii=False)
        parts.append(f"<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>{body}<|call|>")
    if content and not calls:
        parts.append(f"<|channel|>final<|message|>{content}")
    return "<|start|>assistant".join(parts)


WRITERS = {"hermes": hermes, "qwen3_coder": qwen3_coder, "harmony": harmony}

W = {"city": 'Zürich "old town" \\ 東京', "days": 3}
ADVERSARIAL: dict[str, list[tuple[str, str, str | dict[str, str]]]] = {
    "hermes": [
        ("parallel", hermes([("get_weather", W), ("get_time", {"tz": "Europe/Zurich"})]), "agree"),
        ("nested quotes", hermes([("say", {"text": 'He said "hi \\"there\\""'})]), "agree"),
        ("unicode and emoji", hermes([("say", {"text": "naïve — 🚀 ∑ 日本"})]), "agree"),
        ("content before the call", hermes([("f", {"a": 1})], content="Let me look."), "agree"),
        ("with reasoning", hermes([("f", {"a": [1, {"b": None}]})], reasoning="think"), "agree"),
        (
            "call inside reasoning",
            "<think>\nI could call <tool_call>\n"
            + json.dumps({"name": "f", "arguments": {}})
            + "\n</tool_call> but no.\n</think>\n\nThe answer is 4.",
            "agree",
        ),
        (
            "truncated JSON",
            '<tool_call>\n{"name": "f", "arguments": {"a": 1\n</tool_call>',
            "records_malformed",
        ),
        ("cut off after the JSON", '<tool_call>\n{"name": "f", "arguments": {"a": 1}}', "agree"),
        ("cut off inside the JSON", '<tool_call>\n{"name": "f", "arguments": {"a": ', "records_malformed"),
        ("not JSON at all", "<tool_call>\nget_weather(city='Paris')\n</tool_call>", "records_malformed"),
        ("parameters alias", '<tool_call>{"name": "f", "parameters": {"a": 1}}</tool_call>', "lenient_alias"),
        (
            "string arguments",
            '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>',
            "lenient_alias",
        ),
        ("empty block", "<tool_call></tool_call>", "records_malformed"),
        ("no call", "Just text with a { brace and </tool_call> tag.", "agree"),
    ],
    "qwen3_coder": [
        ("parallel", qwen3_coder([("get_weather", W), ("get_time", {"tz": "UTC"})]), "agree"),
        ("unicode", qwen3_coder([("say", {"text": "naïve — 🚀 東京"})]), "agree"),
        ("multi-line value", qwen3_coder([("write", {"text": "line 1\nline 2\n  indented"})]), "agree"),
        ("JSON-looking string", qwen3_coder([("say", {"text": "[1, 2]"})]), "string_param"),
        ("with reasoning", qwen3_coder([("f", {"days": 2})], reasoning="think"), "agree"),
        (
            "call inside reasoning",
            "<think>\nMaybe <tool_call>\n<function=f>\n</function>\n</tool_call>\n</think>\n\nNo call.",
            "agree",
        ),
        ("bare function", "<function=f>\n<parameter=days>\n2\n</parameter>\n</function>", "bare_function"),
        ("cut off", "<tool_call>\n<function=f>\n<parameter=days>\n2\n</parameter>\n", "agree"),
        ("value with surrounding spaces", qwen3_coder([("say", {"text": "  padded  "})]), "whitespace_kept"),
        ("no call", "Plain text about <function> tags.", "agree"),
    ],
    "harmony": [
        ("parallel", harmony([("get_weather", W), ("get_time", {"tz": "UTC"})]), "agree"),
        ("reasoning then call", harmony([("f", {"q": 'a "b" c'})], reasoning="Think 🤔."), "agree"),
        ("final answer", harmony([], content="It is 4 °C in Zürich.", reasoning="ok"), "agree"),
        (
            "recipient before the channel",
            ' to=functions.f<|channel|>commentary <|constrain|>json<|message|>{"a": 1}<|call|>',
            {"transformers": "template_gap", "openai-harmony": "agree"},
        ),
        (
            "truncated JSON (openai-harmony)",
            '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": <|call|>',
            {"transformers": "records_malformed", "openai-harmony": "agree"},
        ),
        (
            "plain text",
            "Just text, no harmony tokens.",
            {"transformers": "agree", "openai-harmony": "plain_text"},
        ),
    ],
}
"""Hand-written hard cases per format: (label, model text, expected outcome, or one per reference)."""


def _fn(name: str, **props: str) -> dict[str, Any]:
    properties = {k: {"type": t} for k, t in props.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": name,
            "parameters": {"type": "object", "properties": properties},
        },
    }


TOOLS = [
    _fn("get_weather", city="string", days="integer"),
    _fn("get_time", tz="string"),
    _fn("say", text="string"),
    _fn("write", text="string"),
    _fn("f", days="integer", a="integer", q="string"),
]
"""The schemas of the tools the cases call, handed to both sides (Qwen3-Coder values are typed by them)."""
