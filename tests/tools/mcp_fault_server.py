"""A real MCP server (the official SDK's server side) with tools that misbehave, for tests/tools/test_mcp.py.

``python mcp_fault_server.py`` serves over stdio; ``--http PORT`` over streamable HTTP on 127.0.0.1;
``--bad-schema`` lists one tool whose input schema is malformed (through the low-level server, which sends
whatever it is given); ``--exit-at-start`` writes to stderr and exits before speaking MCP.
"""

import asyncio
import os
import socket
import sys
import time

if "--exit-at-start" in sys.argv:
    print("fault server: refusing to start (asked to)", file=sys.stderr, flush=True)
    sys.exit(7)

if "--slow-start" in sys.argv:  # a server that takes a while before it speaks MCP
    time.sleep(float(sys.argv[sys.argv.index("--slow-start") + 1]))

import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server

app = MCPServer("faults")
calls = {"n": 0}


@app.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@app.tool()
def count() -> int:
    """How many times count was called in this server process."""
    calls["n"] += 1
    return calls["n"]


@app.tool()
def boom(message: str) -> str:
    """Raise an error with the message."""
    from mcp.server.mcpserver.exceptions import ToolError

    raise ToolError(f"boom: {message}")


@app.tool()
def die(code: int) -> str:
    """Exit the server process in the middle of the call."""
    print("fault server: dying mid-call", file=sys.stderr, flush=True)
    os._exit(code)


@app.tool()
async def hang(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return "woke up"


@app.tool()
def huge(n: int) -> str:
    """Return n characters."""
    return "x" * n


@app.tool()
def probe() -> dict[str, str]:
    """Report what the server can reach: the network, the host's files, a write to /usr, its environment."""
    out = {"uid": str(os.getuid()), "cwd": os.getcwd(), "pid": str(os.getpid())}
    try:
        socket.create_connection(("1.1.1.1", 53), timeout=1).close()
        out["network"] = "reachable"
    except OSError as e:
        out["network"] = f"unreachable: {e.strerror}"
    try:
        with open("/usr/agentrl-probe", "w"):
            pass
        out["write_usr"] = "written"
    except OSError as e:
        out["write_usr"] = f"refused: {e.strerror}"
    out["etc_hostname"] = "visible" if os.path.exists("/etc/hostname") else "hidden"
    out["secret"] = os.environ.get("AGENTRL_TEST_SECRET", "unset")
    out["given"] = os.environ.get("GIVEN", "unset")
    return out


def bad_schema_server() -> Server:
    async def list_tools(ctx, params):
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name="broken",
                    description="A tool with a bad schema.",
                    input_schema={"type": "object", "properties": {"a": {"type": "banana"}}},
                )
            ]
        )

    async def call_tool(ctx, params):
        return types.CallToolResult(content=[types.TextContent(text="unreachable")])

    return Server("bad-schema", on_list_tools=list_tools, on_call_tool=call_tool)


async def run_lowlevel(server: Server) -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    if "--bad-schema" in sys.argv:
        asyncio.run(run_lowlevel(bad_schema_server()))
    elif "--http" in sys.argv:
        port = int(sys.argv[sys.argv.index("--http") + 1])
        app.run("streamable-http", host="127.0.0.1", port=port)
    else:
        app.run()
