r"""Pluggable tool-call parsers: model text in, tool calls (and what went wrong with them) out.

A parser owns one text format end to end, so evaluation and training cannot drift apart (anchors §15.7):
it writes the instructions that teach the format (``format_instructions``), reads the calls back
(``parse``) and wraps tool results for the model (``format_output``).

Shipped formats:

* :class:`HermesParser` (``"hermes"``): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` JSON
  as in the Qwen2.5/Qwen3 and Hermes chat templates. Several calls per turn are allowed.
* :class:`PythonBlockParser` (``"python"``): tool-integrated reasoning. Every fenced ```python block is a
  call to the ``python`` tool; the model sees the output in an ```output block and ends with
  ``\boxed{}`` or an ``Answer:`` line.

Malformed calls never raise: each becomes a :class:`CallError` (``PARSE_ERROR``) that the executor answers
with a tool message explaining the expected format.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from agentrl.errors import ConfigError
from agentrl.protocols import Tool
from agentrl.types import ToolCall, ToolStatus

from .answers import extract_answer

__all__ = [
    "PARSERS",
    "CallError",
    "HermesParser",
    "ParsedTurn",
    "PythonBlockParser",
    "ToolCallParser",
    "get_parser",
]


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


# ---------------------------------------------------------------------------------------------------
class HermesParser:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen/Hermes chat templates).

    Accepted leniently: ``"parameters"`` for ``"arguments"``, arguments given as a JSON string, a JSON list of
    calls in one block, a ```json fence inside the block, and an unclosed block at the very end of the turn.
    ``content`` is the text outside the blocks, which is what these templates put before their own
    ``<tool_call>`` rendering.
    """

    name = "hermes"
    _BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
    _FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
    _NAME = re.compile(r'"name"\s*:\s*"([^"\\]{1,100})"')
    FORMAT = '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'

    def parse(self, text: str, *, id_prefix: str = "call") -> ParsedTurn:
        """Split ``text`` into content, ``<tool_call>`` calls, per-call parse errors and the final answer."""
        calls: list[ToolCall] = []
        errors: list[CallError] = []
        for m in self._BLOCK.finditer(text):
            body = m.group(1).strip()
            fenced = self._FENCE.match(body)
            if fenced:
                body = fenced.group(1)
            for name, args, problem in self._read(body):
                call_id = f"{id_prefix}_{len(calls)}"
                calls.append(ToolCall(call_id, name, args))
                if problem:
                    errors.append(CallError(call_id, ToolStatus.PARSE_ERROR, problem))
        content = self._BLOCK.sub("", text).strip() if calls else text.strip()
        return ParsedTurn(content, tuple(calls), tuple(errors), extract_answer(content))

    def _read(self, body: str) -> list[tuple[str, str, str]]:
        """``(name, raw arguments, problem)`` for each call in one block; ``problem`` is "" when fine."""
        hint = f" Write each call as {self.FORMAT}"
        if not body:
            return [("", "", "Empty <tool_call> block." + hint)]
        try:
            obj = json.loads(body)
        except ValueError as e:
            guess = self._NAME.search(body)
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

    def format_instructions(self, tools: Sequence[Tool]) -> str:
        """The system-prompt text that lists ``tools`` and the ``<tool_call>`` format."""
        lines = "\n".join(json.dumps(t.schema, ensure_ascii=False) for t in tools)
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{lines}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            f"<tool_call></tool_call> XML tags:\n{self.FORMAT}"
        )

    def format_output(self, name: str, content: str) -> str:
        """Tool output as the model sees it: unchanged (the template wraps tool messages itself)."""
        return content


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


# ---------------------------------------------------------------------------------------------------
class PythonBlockParser:
    """Tool-integrated reasoning: each fenced ```python block is a call to the python tool.

    The arguments are ``{"code": <block>}`` as JSON. ``content`` is the whole turn verbatim: the code is part
    of the model's reasoning, and templates without tool support must still show it. An unclosed block at
    the end (generation stopped at the closing fence) still counts. The answer is read outside code blocks.
    """

    name = "python"
    _BLOCK = re.compile(r"```(?:python3?|py)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)

    def __init__(self, tool_name: str = "python"):
        self.tool_name = tool_name

    def parse(self, text: str, *, id_prefix: str = "call") -> ParsedTurn:
        """Turn each ```python block of ``text`` into a call of the python tool; read the final answer."""
        calls: list[ToolCall] = []
        errors: list[CallError] = []
        for m in self._BLOCK.finditer(text):
            code = m.group(1).strip("\n")
            call_id = f"{id_prefix}_{len(calls)}"
            calls.append(ToolCall(call_id, self.tool_name, json.dumps({"code": code}, ensure_ascii=False)))
            if not code.strip():
                errors.append(
                    CallError(
                        call_id,
                        ToolStatus.PARSE_ERROR,
                        "The ```python block is empty; put the code between the fences.",
                    )
                )
        return ParsedTurn(text, tuple(calls), tuple(errors), extract_answer(text))

    def format_instructions(self, tools: Sequence[Tool]) -> str:
        """The system-prompt text that explains python blocks; the python tool must be among ``tools``."""
        if not any(t.name == self.tool_name for t in tools):
            raise ConfigError(
                f"PythonBlockParser calls the tool {self.tool_name!r}, which is not among the tools "
                f"{[t.name for t in tools]}"
            )
        return (
            "To run Python, write the code in a ```python block and end your message. You will see what "
            "it prints in an ```output block. Variables persist between blocks."
        )

    def format_output(self, name: str, content: str) -> str:
        """Tool output in an ```output block."""
        return f"```output\n{content}\n```"


PARSERS: dict[str, type[HermesParser] | type[PythonBlockParser]] = {
    "hermes": HermesParser,
    "qwen": HermesParser,
    "python": PythonBlockParser,
}
"""Parsers by name, for :func:`get_parser`."""


def get_parser(parser: str | ToolCallParser) -> ToolCallParser:
    """A parser instance from its name (``"hermes"``, ``"qwen"``, ``"python"``) or the parser itself."""
    if isinstance(parser, str):
        try:
            return PARSERS[parser]()
        except KeyError:
            raise ConfigError(f"unknown tool-call parser {parser!r}; known: {sorted(PARSERS)}") from None
    if not isinstance(parser, ToolCallParser):
        raise ConfigError(
            f"{parser!r} is not a ToolCallParser (needs parse, format_instructions, format_output and name)"
        )
    return parser
