r"""Tool-call formats of the major model families, each a :class:`~agentrl.tools.ToolCallParser`.

Each parser reads the calls a model family was trained to write, and writes instructions in that family's
style. Tool *results* go back unchanged in ``tool`` messages: every one of these families' chat templates
wraps a tool message in its own markers (Llama's ``ipython`` turn, Mistral's ``[TOOL_RESULTS]``, Qwen's
``<tool_response>``, DeepSeek's ``<｜tool▁output▁begin｜>``, harmony's ``functions.NAME to=assistant``
message), so ``format_output`` returns the content as it is and the template does the rest.

========================  ===================================================================================
name                      what the model writes
========================  ===================================================================================
``llama3_json``           ``{"name": "f", "parameters": {...}}`` as the whole message (Llama 3.1-3.3; an
                          optional ``<|python_tag|>`` first; several calls separated by ``;``)
``mistral``               ``[TOOL_CALLS][{"name": "f", "arguments": {...}}]`` (v3-v7 tokenizers) or
                          ``[TOOL_CALLS]f[ARGS]{...}`` (v11+); call ids are 9 letters/digits, as Mistral's
                          templates require
``qwen3_coder``           ``<tool_call><function=f><parameter=x>value</parameter></function></tool_call>``
                          (Qwen3-Coder; values are raw text, typed with the tool's schema)
``deepseek_v3``           ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f`` + a ```json
                          block (V3, R1) or ``...<｜tool▁call▁begin｜>f<｜tool▁sep｜>{...}`` (V3.1+)
``harmony``               ``<|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}<|call|>``
                          (gpt-oss); the ``final`` channel is the content, ``analysis`` is dropped
========================  ===================================================================================

A malformed call is never dropped: it becomes a call with a :class:`~agentrl.tools.CallError`
(``parse_error``) whose message tells the model what was wrong, and the executor records it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from agentrl.protocols import Tool
from agentrl.types import ToolCall, ToolStatus

from ._calls import CallError, ParsedTurn, call_region, read_json_calls
from .answers import extract_answer

__all__ = [
    "DeepSeekV3Parser",
    "HarmonyParser",
    "LlamaJsonParser",
    "MistralParser",
    "Qwen3CoderParser",
    "detect_tool_format",
]


class _Calls:
    """Collects a turn's calls and their problems with ids ``{prefix}_{k}`` (or the format's own ids)."""

    def __init__(self, id_prefix: str, make_id: Any = None):
        self.prefix = id_prefix
        self.make_id = make_id
        self.calls: list[ToolCall] = []
        self.errors: list[CallError] = []

    def add(self, name: str, arguments: str, problem: str = "") -> None:
        k = len(self.calls)
        call_id = self.make_id(self.prefix, k) if self.make_id else f"{self.prefix}_{k}"
        self.calls.append(ToolCall(call_id, name, arguments))
        if problem:
            self.errors.append(CallError(call_id, ToolStatus.PARSE_ERROR, problem))

    def turn(self, content: str) -> ParsedTurn:
        content = content.strip()
        return ParsedTurn(content, tuple(self.calls), tuple(self.errors), extract_answer(content))


def _schemas(tools: Sequence[Tool]) -> str:
    return "\n".join(json.dumps(t.schema, ensure_ascii=False) for t in tools)


# ---------------------------------------------------------------------------------------------------
class LlamaJsonParser:
    """Llama 3.x JSON tool calls: the whole assistant message is ``{"name": ..., "parameters": {...}}``.

    A message is a call when, after an optional ``<|python_tag|>``, it starts with ``{`` and names a
    function (``"name"``); a message that starts with ``<|python_tag|>`` is always a call. Several calls
    may follow each other, separated by ``;``. ``"arguments"`` is accepted for ``"parameters"``.
    """

    name = "llama3_json"
    FORMAT = '{"name": <function-name>, "parameters": <arguments-json-object>}'
    _TAG = "<|python_tag|>"

    def parse(self, text: str, *, id_prefix: str = "call") -> ParsedTurn:
        """Read the message as one or more JSON calls, or as plain content."""
        calls = _Calls(id_prefix)
        body = text.strip()
        tagged = body.startswith(self._TAG)
        body = body.removeprefix(self._TAG).strip()
        if not (tagged or (body.startswith("{") and '"name"' in body)):
            return calls.turn(text)
        hint = f" Reply with only {self.FORMAT}; separate several calls with ';'."
        decoder = json.JSONDecoder()
        pos = 0
        while pos < len(body):
            try:
                _, end = decoder.raw_decode(body, pos)
            except ValueError:
                for name, args, problem in read_json_calls(body[pos:], hint):
                    calls.add(name, args, problem)
                break
            for name, args, problem in read_json_calls(body[pos:end], hint):
                calls.add(name, args, problem)
            pos = end
            while pos < len(body) and body[pos] in " \t\r\n;":
                pos += 1
        if not calls.calls:
            calls.add("", "", "Empty tool call." + hint)
        return calls.turn("")

    def format_instructions(self, tools: Sequence[Tool]) -> str:
        """Llama's JSON tool prompt: the function schemas and the one-object reply format."""
        return (
            "You have access to the following functions. To call one, reply with only a JSON object of the "
            f"form {self.FORMAT}, and nothing else; do not use variables.\n\n{_schemas(tools)}"
        )

    def format_output(self, name: str, content: str) -> str:
        """Unchanged: Llama's template puts a tool message in an ``ipython`` turn."""
        return content


# ---------------------------------------------------------------------------------------------------
def _mistral_id(prefix: str, k: int) -> str:
    """A 9-character [a-zA-Z0-9] id (Mistral's templates reject others), derived from the usual id."""
    return hashlib.sha1(f"{prefix}_{k}".encode()).hexdigest()[:9]


class MistralParser:
    """Mistral's ``[TOOL_CALLS]``: a JSON list of calls (v3-v7 tokenizers) or ``name[ARGS]{...}`` (v11+).

    ``content`` is the text before the first ``[TOOL_CALLS]``. Call ids are 9 hex digits derived from the
    usual ``{id_prefix}_{k}``, because Mistral's chat templates refuse any other id shape.
    """

    name = "mistral"
    FORMAT = '[TOOL_CALLS][{"name": <function-name>, "arguments": <arguments-json-object>}]'
    _MARK = "[TOOL_CALLS]"
    _ARGS = "[ARGS]"

    def parse(self, text: str, *, id_prefix: str = "call") -> ParsedTurn:
        """Split the turn at ``[TOOL_CALLS]`` and read each segment's calls."""
        calls = _Calls(id_prefix, _mistral_id)
        if self._MARK not in text:
            return calls.turn(text)
        content, *segments = text.split(self._MARK)
        hint = f" Write the calls as {self.FORMAT}"
        for seg in segments:
            seg = seg.strip().removesuffix("</s>").strip()
            name, args_mark, raw = seg.partition(self._ARGS)
            if args_mark and re.fullmatch(r"[\w.\-]*", name.strip()):  # v11+: name[ARGS]{...}
                name, raw = name.strip(), raw.strip()
                problem = "" if name else "The call needs a function name before [ARGS]." + hint
                try:
                    args = json.loads(raw) if raw else {}
                    if not isinstance(args, dict):
                        problem = problem or "The arguments after [ARGS] must be a JSON object." + hint
                except ValueError as e:
                    problem = problem or f"The arguments after [ARGS] are not valid JSON ({e})." + hint
                calls.add(name, raw or "{}", problem)
                continue
            for name, args_text, problem in read_json_calls(seg, hint, empty="Empty [TOOL_CALLS]."):
                calls.add(name, args_text, problem)
        return calls.turn(content)

    def format_instructions(self, tools: Sequence[Tool]) -> str:
        """The tool schemas and the ``[TOOL_CALLS]`` format."""
        return (
            f"[AVAILABLE_TOOLS]\n{_schemas(tools)}\n[/AVAILABLE_TOOLS]\n"
            f"To call tools, write {self.FORMAT} (several calls go in the same list)."
        )

    def format_output(self, name: str, content: str) -> str:
        """Unchanged: Mistral's template wraps a tool message in ``[TOOL_RESULTS]``."""
        return content


# ---------------------------------------------------------------------------------------------------
class Qwen3CoderParser:
    """Qwen3-Coder's XML-style calls.

    A call looks like this::

        <tool_call>
        <function=get_weather>
        <parameter=city>
        Paris
        </parameter>
        </function>
        </tool_call>

    Parameter values are raw text, converted with the tool's JSON schema (from :meth:`format_instructions`
    or ``tools=``): integers, numbers, booleans, null, objects and arrays are decoded, strings kept as
    written; a parameter without a known schema stays a string. ``<function=...>`` without the
    ``<tool_call>`` wrapper is accepted, and so is a block cut off at the end of the turn. A block inside
    ``<think>`` reasoning is not a call.
    """

    name = "qwen3_coder"
    FORMAT = "<tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n</function>\n</tool_call>"
    _FUNC = re.compile(r"<function=([^>\n]*)>(.*?)(?:</function>|(?=<function=)|\Z)", re.DOTALL)
    _PARAM = re.compile(r"<parameter=([^>\n]*)>\n?(.*?)\n?(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)
    _BLOCK = re.compile(r"<tool_call>.*?(?:</tool_call>|\Z)|<function=.*?(?:</function>|\Z)", re.DOTALL)

    def __init__(self, tools: Sequence[Tool] = ()):
        self._types: dict[str, dict[str, Any]] = {}
        self._remember(tools)

    def _remember(self, tools: Sequence[Tool]) -> None:
        for t in tools:
            props = t.schema.get("function", {}).get("parameters", {}).get("properties", {})
            self._types[t.name] = props if isinstance(props, dict) else {}

    def parse(self, text: str, *, id_prefix: str = "call") -> ParsedTurn:
        """Read every ``<function=...>`` block; its parameters become a JSON object."""
        calls = _Calls(id_prefix)
        hint = f" Write each call as:\n{self.FORMAT}"
        start, end = call_region(text)
        for m in self._FUNC.finditer(text[:end], start):
            name, body = m.group(1).strip(), m.group(2)
            args: dict[str, Any] = {}
            problems = [] if name else ["The call needs a function name: <function=NAME>."]
            for p in self._PARAM.finditer(body):
                key = p.group(1).strip()
                if not key:
                    problems.append("A parameter needs a name: <parameter=ARG>.")
                    continue
                value, problem = self._convert(name, key, p.group(2))
                args[key] = value
                if problem:
                    problems.append(problem)
            if not args and body.strip() and "<parameter=" not in body:
                problems.append("Put each argument in a <parameter=ARG>...</parameter> block.")
            problem = " ".join(problems) + hint if problems else ""
            calls.add(name, json.dumps(args, ensure_ascii=False), problem)
        content = text[:start] + self._BLOCK.sub("", text[start:end]) + text[end:] if calls.calls else text
        return calls.turn(content)

    def _convert(self, tool: str, key: str, raw: str) -> tuple[Any, str]:
        spec = self._types.get(tool, {}).get(key, {})
        kind = spec.get("type") if isinstance(spec, dict) else None
        kinds = set(kind) if isinstance(kind, list) else {kind} if kind else set()
        if not kinds or kinds == {"string"}:
            return raw, ""
        text = raw.strip()
        try:
            return json.loads(text), ""
        except ValueError:
            if "boolean" in kinds and text.lower() in ("true", "false"):
                return text.lower() == "true", ""
            if "string" in kinds:
                return raw, ""
            return raw, f"Parameter {key!r} must be {'/'.join(sorted(kinds))}, got {text[:80]!r}."

    def format_instructions(self, tools: Sequence[Tool]) -> str:
        """The functions (their schemas) and the XML call format; remembers the schemas for :meth:`parse`."""
        self._remember(tools)
        return (
            "# Tools\n\nYou can call these functions:\n\n"
            f"<tools>\n{_schemas(tools)}\n</tools>\n\n"
            f"To call a function, reply with a block like this and nothing after it:\n{self.FORMAT}"
        )

    def format_output(self, name: str, content: str) -> str:
        """Unchanged: the Qwen template wraps a tool message in ``<tool_response>``."""
        return content


# ---------------------------------------------------------------------------------------------------
class DeepSeekV3Parser:
    """DeepSeek V3's tool-call tokens, in both the V3/R1 and the V3.1+ layout (see the module table)."""

    name = "deepseek_v3"
    CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
    CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
    FORMAT = f"{CALLS_BEGIN}{CALL_BEGIN}NAME{SEP}{{arguments-json-object}}{CALL_END}{CALLS_END}"
    _FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*(?:```\s*)?$", re.DOTALL)

    def parse(self, text: str, *, id_prefix: str = "call") -> ParsedTurn:
        """Read each call between the call tokens; ``content`` is what precedes them."""
        calls = _Calls(id_prefix)
        start = min(
            (i for i in (text.find(self.CALLS_BEGIN), text.find(self.CALL_BEGIN)) if i >= 0), default=-1
        )
        if start < 0:
            return calls.turn(text)
        hint = f" Write each call as {self.FORMAT}"
        rest = text[start:].replace(self.CALLS_BEGIN, "").replace(self.CALLS_END, "")
        for block in rest.split(self.CALL_BEGIN):
            block = block.split(self.CALL_END)[0].strip()
            if not block:
                continue
            if self.SEP not in block:
                calls.add("", block, f"The call has no {self.SEP} between the name and the arguments." + hint)
                continue
            left, _, right = block.partition(self.SEP)
            left = left.strip()
            if left == "function" and "\n" in right.strip():  # V3/R1: type, then name, then a ```json block
                name, _, raw = right.strip().partition("\n")
                fenced = self._FENCE.match(raw)
                raw = fenced.group(1) if fenced else raw
            else:
                name, raw = left, right
            name, raw = name.strip(), raw.strip()
            problem = "" if name else "The call needs a function name." + hint
            try:
                args = json.loads(raw) if raw else {}
                if not isinstance(args, dict):
                    problem = problem or "The arguments must be a JSON object." + hint
            except ValueError as e:
                problem = problem or f"The arguments are not valid JSON ({e})." + hint
            calls.add(name, raw or "{}", problem)
        return calls.turn(text[:start])

    def format_instructions(self, tools: Sequence[Tool]) -> str:
        """The function schemas and DeepSeek's call tokens."""
        return (
            f"## Tools\n\nYou can call these functions:\n{_schemas(tools)}\n\n"
            f"To call functions, write them like this (one call block per call):\n{self.FORMAT}"
        )

    def format_output(self, name: str, content: str) -> str:
        """Unchanged: DeepSeek's template wraps a tool message in its output tokens."""
        return content


# ---------------------------------------------------------------------------------------------------
class HarmonyParser:
    """OpenAI's harmony format (gpt-oss): a turn is one or more messages on channels.

    A message addressed ``to=functions.NAME`` (in its header, before or after ``<|channel|>``) is a call
    whose body is the JSON arguments, ended by ``<|call|>``. ``content`` is the ``final`` channel's message
    (or, without one, any other message that is neither a call nor ``analysis``); the ``analysis`` channel
    (the reasoning) is left out, as gpt-oss's template drops it from earlier turns.
    """

    name = "harmony"
    FORMAT = (
        "<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>"
    )
    _END = re.compile(r"<\|end\|>|<\|call\|>|<\|return\|>")
    _TO = re.compile(r"to=([^\s<]+)")
    _CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")

    def parse(self, text: str, *, id_prefix: str = "call") -> ParsedTurn:
        """Read each message of the turn; calls from ``to=functions.*`` messages, content from ``final``."""
        calls = _Calls(id_prefix)
        hint = f" Write a call as {self.FORMAT}"
        final: list[str] = []
        other: list[str] = []
        for chunk in text.split("<|start|>"):
            if "<|message|>" not in chunk:
                continue
            header, _, body = chunk.partition("<|message|>")
            body = self._END.split(body)[0]
            to = self._TO.search(header)
            channel = self._CHANNEL.search(header)
            if to is not None:
                recipient = to.group(1)
                name = recipient.removeprefix("functions.")
                problem = "" if name else "The recipient needs a function name: to=functions.NAME." + hint
                raw = body.strip()
                try:
                    args = json.loads(raw) if raw else {}
                    if not isinstance(args, dict):
                        problem = problem or "The message to a function must be a JSON object." + hint
                except ValueError as e:
                    problem = problem or f"The arguments are not valid JSON ({e})." + hint
                calls.add(name, raw or "{}", problem)
            elif channel is not None and channel.group(1) == "final":
                final.append(body)
            elif channel is None or channel.group(1) != "analysis":
                other.append(body)
        if not final and not other and not calls.calls and "<|message|>" not in text:
            return calls.turn(text)  # plain text: a model that does not speak harmony
        return calls.turn("\n".join(final or other))

    def format_instructions(self, tools: Sequence[Tool]) -> str:
        """The functions as harmony's TypeScript-like ``namespace functions`` block."""
        lines = ["# Tools", "", "## functions", "", "namespace functions {", ""]
        for t in tools:
            fn = t.schema.get("function", {})
            lines.append(f"// {' '.join(str(fn.get('description', '')).split())}")
            lines.append(f"type {t.name} = (_: {_ts_type(fn.get('parameters', {}))}) => any;")
            lines.append("")
        lines += ["} // namespace functions", "", f"Call a function with a message like: {self.FORMAT}"]
        return "\n".join(lines)

    def format_output(self, name: str, content: str) -> str:
        """Unchanged: gpt-oss's template sends a tool message as ``functions.NAME to=assistant``."""
        return content


def _ts_type(schema: Any) -> str:
    """A JSON schema as the TypeScript type harmony shows the model (objects, arrays, enums, primitives)."""
    if not isinstance(schema, dict):
        return "any"
    if "enum" in schema and isinstance(schema["enum"], list):
        return " | ".join(json.dumps(v) for v in schema["enum"]) or "any"
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        fields = [f"{k}{'' if k in required else '?'}: {_ts_type(v)}" for k, v in props.items()]
        return "{ " + ", ".join(fields) + " }" if fields else "object"
    if kind == "array":
        return f"{_ts_type(schema.get('items', {}))}[]"
    return {"string": "string", "integer": "number", "number": "number", "boolean": "boolean"}.get(
        str(kind), "any"
    )


# ---------------------------------------------------------------------------------------------------
_TEMPLATE_MARKERS = (
    ("<|channel|>", "harmony"),
    ("tool▁calls▁begin", "deepseek_v3"),
    ("<function=", "qwen3_coder"),
    ("[TOOL_CALLS]", "mistral"),
    ("<tool_call>", "hermes"),
    ("<|python_tag|>", "llama3_json"),
    ("ipython", "llama3_json"),
)


def detect_tool_format(chat_template: str | None) -> str | None:
    """The tool-call format a chat template renders, by the markers it contains (most specific first), or
    None when it renders no tool calls we know. Qwen3-Coder's template also contains ``<tool_call>``,
    so ``<function=`` is checked first."""
    if not chat_template:
        return None
    return next((fmt for marker, fmt in _TEMPLATE_MARKERS if marker in chat_template), None)
