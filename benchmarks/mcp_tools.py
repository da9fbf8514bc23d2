"""What an MCP tool costs: starting a stdio server session (sandboxed and not) and one call.

    python benchmarks/mcp_tools.py [--starts 5] [--calls 100]

Starts ``examples/mcp_units_server.py`` (the official SDK's server side) ``--starts`` times in
``agentrl.sandbox.ProcessSandbox`` and as a plain subprocess, timing process start + MCP ``initialize``; then
times ``--calls`` calls of its ``convert`` tool through ``MCPTool`` (schema check, JSON-RPC round trip,
rendering). Prints medians and ranges in seconds / milliseconds.
"""

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

from agentrl.protocols import ToolContext
from agentrl.sandbox import ProcessSandbox
from agentrl.tools.mcp import MCPServer

SERVER = [sys.executable, str(Path(__file__).resolve().parents[1] / "examples" / "mcp_units_server.py")]


async def main(starts: int, calls: int) -> None:
    for label, server in (
        ("sandboxed", MCPServer(command=SERVER, launcher=ProcessSandbox())),
        ("plain", MCPServer(command=SERVER, sandboxed=False)),
    ):
        times = []
        for _ in range(starts):
            t0 = time.perf_counter()
            session = await server.open_session()
            times.append(time.perf_counter() - t0)
            await session.close()
        print(
            f"{label} start + initialize: median {statistics.median(times):.2f} s "
            f"(min {min(times):.2f}, max {max(times):.2f}, n={starts})"
        )
    async with MCPServer(command=SERVER, launcher=ProcessSandbox()) as server:
        convert = {t.name: t for t in await server.tools()}["convert"]
        args = {"value": 3, "from_unit": "foot", "to_unit": "inch"}
        await convert(args, ToolContext())  # opens the session
        lat = []
        for _ in range(calls):
            t0 = time.perf_counter()
            out = await convert(args, ToolContext())
            lat.append((time.perf_counter() - t0) * 1000)
            assert out.content == "3 foot = 36 inch"
    print(
        f"sandboxed call: median {statistics.median(lat):.2f} ms "
        f"(p90 {sorted(lat)[int(0.9 * len(lat))]:.2f}, n={calls})"
    )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--starts", type=int, default=5)
    p.add_argument("--calls", type=int, default=100)
    a = p.parse_args()
    asyncio.run(main(a.starts, a.calls))
