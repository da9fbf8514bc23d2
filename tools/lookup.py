"""``LookupTool``: look a key up in a small table (a glossary, a price list, a phone book).

The table is either fixed when the tool is built, or per episode: the environment puts it in
``ToolContext.extra[extra_key]`` (for example a seeded price list). Keys match exactly first, then ignoring
case and surrounding whitespace; a miss answers with the closest known keys so the model can retry.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from agentrl.errors import ConfigError
from agentrl.protocols import ToolContext, ToolOutput
from agentrl.types import ToolStatus

from .function import function_schema

__all__ = ["LookupTool"]


class LookupTool:
    """A :class:`~agentrl.protocols.Tool` that returns ``table[key]``.

    Args:
        table: A fixed table; ``None`` reads ``context.extra[extra_key]`` on every call instead.
        name: Tool name shown to the model.
        description: What the table holds (shown to the model).
        key_name: Name of the single argument.
        key_description: What to pass as the key.
        extra_key: Where to find a per-episode table in ``ToolContext.extra``.
    """

    needs_sandbox = False
    """A table lookup runs no code."""

    def __init__(
        self,
        table: Mapping[str, Any] | None = None,
        *,
        name: str = "lookup",
        description: str = "Look up an entry in the reference table.",
        key_name: str = "key",
        key_description: str = "The entry to look up.",
        extra_key: str = "lookup_table",
    ):
        if table is not None and not isinstance(table, Mapping):
            raise ConfigError(f"table must be a mapping, got {type(table).__name__}")
        self.table = table
        self.extra_key = extra_key
        self.key_name = key_name
        self._name = name
        self._schema = function_schema(name, description, {key_name: (str, key_description)})

    @property
    def name(self) -> str:
        return self._name

    @property
    def schema(self) -> dict[str, Any]:
        return self._schema

    async def __call__(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
        key = arguments.get(self.key_name)
        if set(arguments) != {self.key_name} or not isinstance(key, str | int):
            return ToolOutput(
                f"Error: call {self._name} with one argument, {self.key_name!r} (a string).",
                ToolStatus.BAD_ARGUMENTS,
            )
        table = self.table if self.table is not None else context.extra.get(self.extra_key)
        if not isinstance(table, Mapping):
            return ToolOutput(
                "Error: the table is not available.",
                ToolStatus.ERROR,
                detail=f"no mapping at ToolContext.extra[{self.extra_key!r}]",
            )
        key = str(key)
        if key in table:
            return ToolOutput(str(table[key]))
        folded = {str(k).strip().casefold(): k for k in table}
        hit = folded.get(key.strip().casefold())
        if hit is not None:
            return ToolOutput(str(table[hit]))
        close = difflib.get_close_matches(key, [str(k) for k in table], n=3, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else f" Known: {', '.join(map(str, table))}."
        return ToolOutput(f"No entry for {key!r}.{hint}"[:1000], ToolStatus.ERROR)
