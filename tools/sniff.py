"""Which tool-call format a piece of model text looks like: the evidence for the tool-use alarm.

A run whose parser never finds a call can still look healthy: rewards rise on questions the model answers
without tools, and nothing raises (a Qwen3 run reached 0.93 validation reward with zero parsed calls
because its calls were written in a format the run did not read). :func:`foreign_call_format` reads a
turn with every *other* shipped parser and names the first that finds a well-formed call, so the trainer
can say which ``--rollout.tool-format`` would have read it.
"""

from __future__ import annotations

import json
import re

from .parsers import PARSERS

__all__ = ["BARE_JSON", "SNIFF_ORDER", "foreign_call_format"]

SNIFF_ORDER = ("harmony", "deepseek_v3", "qwen3_coder", "mistral", "hermes", "llama3_json", "python")
"""Formats tried, most specific markers first: a Qwen3-Coder block also contains ``<tool_call>`` (hermes'
marker), and a harmony or hermes turn may contain a ```python block inside its arguments."""

BARE_JSON = "json"
"""What :func:`foreign_call_format` returns for a ``{"name": ..., "arguments": {...}}`` object inside other
text: no shipped format reads that (``llama3_json`` reads it only as the whole message)."""

_ALIASES = {"qwen": "hermes"}
_JSON_CALL = re.compile(r'\{\s*"name"\s*:\s*"[^"\\]{1,100}"\s*,\s*"(?:arguments|parameters)"\s*:')


def foreign_call_format(text: str, own: str | None) -> str | None:
    """The name of a shipped format (a key of :data:`~agentrl.tools.PARSERS`) other than ``own`` that reads
    at least one well-formed call in ``text``; :data:`BARE_JSON` for a JSON call no format reads; else None.

    Args:
        text: One model turn, as sampled.
        own: The format the run parses with (``"hermes"``...): a turn it reads calls in gives None.
    """
    own = _ALIASES.get(own or "", own)
    if own in PARSERS and PARSERS[own]().parse(text).calls:
        return None  # the run reads this turn's calls: nothing foreign to report
    for name in SNIFF_ORDER:
        if name == own:
            continue
        parsed = PARSERS[name]().parse(text)
        bad = {e.call_id for e in parsed.errors}
        if any(c.name and c.id not in bad for c in parsed.calls):
            return name
    decoder = json.JSONDecoder()
    for m in _JSON_CALL.finditer(text):
        try:
            obj, _ = decoder.raw_decode(text, m.start())
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("arguments", obj.get("parameters")), dict):
            return BARE_JSON
    return None
