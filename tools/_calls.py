"""What every tool-call parser shares: the parse result (:class:`ParsedTurn`, :class:`CallError`), the
:class:`ToolCallParser` protocol, and the reading of JSON ``{"name": ..., "arguments": {...}}`` calls that
most formats wrap in their own markers."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from agentrl.protocols import Tool
from agentrl.types import ToolCall, ToolStatus

__all__ = ["CallError", "ParsedTurn", "ToolCallParser", "call_region", "read_json_calls"]

_NAME = re.compile(r'"name"\s*:\s*"([^"\\]{1,100})"')


@dataclass(frozen=True, slots=True)
class CallError:
    """A tool call the model attempted but wrote wrongly."""

    call_id: str
    """Id of the attempted call in :attr:`ParsedTurn.calls`."""
    status: ToolStatus
    """Usually ``PARSE_ERROR``."""
    message: str
    """What to tell the model (what was wrong and the expected format)."""


@dataclass(frozen=True, slots=True)
class ParsedTurn:
    """One model turn as a parser read it."""

    content: str
    """The message content to record next to ``calls`` (what a chat template shows as the content)."""
    calls: tuple[ToolCall, ...] = ()
    """Every attempted call in text order, malformed ones included (their ``arguments`` hold the raw text),
    so that each tool reply has a call to answer."""
    errors: tuple[CallError, ...] = ()
    """The attempted calls that are malformed, by ``call_id``."""
    answer: str | None = None
    """The final answer the turn states (``\\boxed{}`` or ``Answer:``), outside code and calls."""

    @property
    def has_calls(self) -> bool:
        """True when the model tried to call a tool (well-formed or not)."""
        return bool(self.calls)

    def error_for(self, call_id: str) -> CallError | None:
        """The parse error of call ``call_id``, if it has one."""
        return next((e for e in self.errors if e.call_id == call_id), None)


@runtime_checkable
class ToolCallParser(Protocol):
    """Reads tool calls from model text and writes the matching instructions and result messages."""

    name: str
    """Short name (``"hermes"``, ``"python"``)."""

    def parse(self, text: str, *, id_prefix: str = "call") -> ParsedTurn:
        """Split a model turn into content, calls (ids ``{id_prefix}_{k}``) and parse errors. Never raises."""
        ...

    def format_instructions(self, tools: Sequence[Tool]) -> str:
        """System-prompt text that teaches the model the tools and this call format."""
        ...

    def format_output(self, name: str, content: str) -> str:
        """The text of the tool message that answers a call to ``name`` with ``content``."""
        ...


def call_region(text: str) -> tuple[int, int]:
    """The ``(start, end)`` of ``text`` where calls count: outside its ``<think>`` reasoning. A call a model
    writes while reasoning is a thought, not a call; transformers' response templates and vLLM's reasoning
    parsers read it so too. After the last ``</think>`` when there is one (templates that pre-write
    ``<think>`` leave only the closing tag in the sample); else before an unclosed ``<think>``."""
    close = text.rfind("</think>")
    if close >= 0:
        return close + len("</think>"), len(text)
    opened = text.find("<think>")
    return 0, opened if opened >= 0 else len(text)


def read_json_calls(body: str, hint: str, *, empty: str = "Empty tool call.") -> list[tuple[str, str, str]]:
    """``(name, raw arguments, problem)`` for each call in a JSON object or list of objects with ``"name"``
    and ``"arguments"`` (or ``"parameters"``); ``problem`` is "" when fine and ends with ``hint`` if not."""
    if not body:
        return [("", "", empty + hint)]
    try:
        obj = json.loads(body)
    except ValueError as e:
        guess = _NAME.search(body)
        return [
            (
                guess.group(1) if guess else "",
                body,
                f"Could not parse the tool call: invalid JSON ({e}).{hint}",
            )
        ]
    items = obj if isinstance(obj, list) and obj else [obj]
    out = []
    for item in items:
        raw = body if len(items) == 1 else json.dumps(item, ensure_ascii=False)
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            out.append(("", raw, 'The tool call needs a "name" string.' + hint))
            continue
        key = "arguments" if "arguments" in item else "parameters" if "parameters" in item else None
        args: Any = item.get(key, {}) if key else {}
        if isinstance(args, str):  # arguments JSON-encoded as a string: that string is the verbatim form
            raw_args = args if args.strip() else "{}"
            try:
                args = json.loads(raw_args)
            except ValueError:
                out.append((item["name"], args, '"arguments" is not valid JSON.' + hint))
                continue
        else:
            raw_args = _raw_value(body, key, args) if key else "{}"
        if not isinstance(args, dict):
            out.append((item["name"], raw_args, '"arguments" must be a JSON object.' + hint))
            continue
        out.append((item["name"], raw_args, ""))
    return out


def _raw_value(body: str, key: str, value: Any) -> str:
    """The substring of ``body`` that spells ``value`` after ``"key":`` (arguments kept verbatim)."""
    decoder = json.JSONDecoder()
    for m in re.finditer(rf'"{re.escape(key)}"\s*:\s*', body):
        try:
            decoded, end = decoder.raw_decode(body, m.end())
        except ValueError:
            continue
        if decoded == value:
            return body[m.end() : end]
    return json.dumps(value, ensure_ascii=False)
