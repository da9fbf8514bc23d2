"""The client command the MCP conformance suite runs: agentrl.tools.mcp as a tool-calling client.

``python tests/fidelity/mcp_conformance_client.py URL`` (the suite appends the URL of its scenario's server
and names the scenario in ``MCP_CONFORMANCE_SCENARIO``): connect over streamable HTTP, list the tools, call
each one with arguments made from its schema, as a model's calls would reach it, print each outcome, and
exit 0 unless the session could not be used at all.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from agentrl.protocols import ToolContext
from agentrl.tools.mcp import MCPServer

_SAMPLE = {"number": 2, "integer": 2, "boolean": True, "string": "agentrl", "array": [], "object": {}}


def sample_arguments(schema: dict[str, Any]) -> dict[str, Any]:
    """Arguments that satisfy ``schema``'s required properties (the first enum value, else a typed sample)."""
    params = schema.get("function", {}).get("parameters", {})
    props = params.get("properties", {}) or {}
    out: dict[str, Any] = {}
    for key in params.get("required", []) or []:
        spec = props.get(key, {})
        kind = spec.get("type", "string")
        out[key] = (
            spec["enum"][0] if spec.get("enum") else _SAMPLE.get(kind if isinstance(kind, str) else kind[0])
        )
    return out


async def main(url: str) -> int:
    """Run the tool-calling client against ``url``; 1 when the tools could not be listed."""
    async with MCPServer(url=url, call_timeout=10, start_timeout=10) as server:
        try:
            tools = await server.tools()
        except Exception as e:  # the conformance report says which check failed; print why for the log
            print(f"listing tools failed: {e!r}", file=sys.stderr)
            return 1
        for tool in tools:
            out = await tool(sample_arguments(tool.schema), ToolContext())
            print(f"{tool.name}: {out.status.value}: {out.content[:200]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[-1])))
