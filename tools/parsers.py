r"""Pluggable tool-call parsers: model text in, tool calls (and what went wrong with them) out.

A parser owns one text format end to end, so evaluation and training cannot drift apart (anchors §15.7):
it writes the instructions that teach the format (``format_instructions``), reads the calls back
(``parse``) and wraps tool results for the model (``format_output``).

Shipped formats:

* :class:`HermesParser` (``"hermes"``): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` JSON
  as in the Qwen2.5/Qwen3 and Hermes chat templates. Several calls per turn are allowed.
* The formats of other model families (``formats.py``): ``"llama3_json"``, ``"mistral"``,
  ``"qwen3_coder"``, ``"deepseek_v3"``, ``"harmony"`` (gpt-oss); :func:`detect_tool_format` names the one a
  chat template renders.
* :class:`PythonBlockParser` (``"python"``): tool-integrated reasoning. Every fenced ```python block is a
  call to the ``python`` tool; the model sees the output in an ```output block and ends with
  ``\boxed{}`` or an ``Answer:`` line.

Malformed calls never raise: each becomes a :class:`CallError` (``PARSE_ERROR``) that the executor answers
with a tool message explaining the expected format.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence

from agentrl.errors import ConfigError
from agentrl.protocols import Tool
from agentrl.types import ToolCall, ToolStatus

from ._calls import CallError, ParsedTurn, ToolCallParser, call_region, read_json_calls
from .answers import extract_answer
from .formats import DeepSeekV3Parser, HarmonyParser, LlamaJsonParser, MistralParser, Qwen3CoderParser

__all__ = [
    "PARSERS",
    "CallError",
    "HermesParser",
    "ParsedTurn",
    "PythonBlockParser",
    "ToolCallParser",
    "get_parser",
]


# ---------------------------------------------------------------------------------------------------
class HermesParser:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen/Hermes chat templates).

    Accepted leniently: ``"parameters"`` for ``"arguments"``, arguments given as a JSON string, a JSON list of
    calls in one block, a ```json fence inside the block, and an unclosed block at the very end of the turn.
    A block inside ``<think>`` reasoning is not a call (see :func:`~agentrl.tools._calls.call_region`).
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
        start, end = call_region(text)
        for m in self._BLOCK.finditer(text, start, end):
            body = m.group(1).strip()
            fenced = self._FENCE.match(body)
            if fenced:
                body = fenced.group(1)
            for name, args, problem in self._read(body):
                call_id = f"{id_prefix}_{len(calls)}"
                calls.append(ToolCall(call_id, name, args))
                if problem:
                    errors.append(CallError(call_id, ToolStatus.PARSE_ERROR, problem))
        content = (text[:start] + self._BLOCK.sub("", text[start:end]) + text[end:]) if calls else text
        return ParsedTurn(content.strip(), tuple(calls), tuple(errors), extract_answer(content.strip()))

    def _read(self, body: str) -> list[tuple[str, str, str]]:
        """``(name, raw arguments, problem)`` for each call in one block; ``problem`` is "" when fine."""
        return read_json_calls(body, f" Write each call as {self.FORMAT}", empty="Empty <tool_call> block.")

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


PARSERS: dict[str, Callable[[], ToolCallParser]] = {
    "hermes": HermesParser,
    "qwen": HermesParser,
    "python": PythonBlockParser,
    "llama3_json": LlamaJsonParser,
    "mistral": MistralParser,
    "qwen3_coder": Qwen3CoderParser,
    "deepseek_v3": DeepSeekV3Parser,
    "harmony": HarmonyParser,
}
"""Parsers by name, for :func:`get_parser` (the formats of the model families are in ``formats.py``)."""


def get_parser(parser: str | ToolCallParser) -> ToolCallParser:
    """A parser instance from its name (a key of :data:`PARSERS`) or the parser itself."""
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
