"""A small stdio MCP server for the MCP example env (``examples/mcp_units_env.py``) and the tests.

Run by an ``agentrl.tools.mcp.MCPServer``:
``MCPServer(command=[sys.executable, "examples/mcp_units_server.py"])``.
It has two kinds of tools: ``convert`` (exact unit conversion, stateless) and ``remember``/``recall`` (a
notebook kept in the server process, so it shows that each episode gets its own server). Only the official
SDK's server side (``mcp.server.mcpserver.MCPServer``) is used.
"""

from fractions import Fraction

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

# Each unit's size in its dimension's base unit (metre, gram, second), exact.
UNITS: dict[str, tuple[str, Fraction]] = {
    "mm": ("length", Fraction(1, 1000)),
    "cm": ("length", Fraction(1, 100)),
    "m": ("length", Fraction(1)),
    "km": ("length", Fraction(1000)),
    "inch": ("length", Fraction(254, 10000)),
    "foot": ("length", Fraction(3048, 10000)),
    "yard": ("length", Fraction(9144, 10000)),
    "mile": ("length", Fraction(1609344, 1000)),
    "g": ("mass", Fraction(1)),
    "kg": ("mass", Fraction(1000)),
    "ounce": ("mass", Fraction(28349523125, 10**9)),
    "pound": ("mass", Fraction(45359237, 10**5)),
    "s": ("time", Fraction(1)),
    "minute": ("time", Fraction(60)),
    "hour": ("time", Fraction(3600)),
    "day": ("time", Fraction(86400)),
}

app = MCPServer("units")
notes: dict[str, str] = {}


@app.tool()
def convert(value: float, from_unit: str, to_unit: str) -> str:
    """Convert a value between units exactly (length: mm cm m km inch foot yard mile; mass: g kg ounce
    pound; time: s minute hour day)."""
    for unit in (from_unit, to_unit):
        if unit not in UNITS:
            raise ToolError(f"unknown unit {unit!r}; known units: {', '.join(UNITS)}")
    (dim_a, size_a), (dim_b, size_b) = UNITS[from_unit], UNITS[to_unit]
    if dim_a != dim_b:
        raise ToolError(f"cannot convert {dim_a} ({from_unit}) to {dim_b} ({to_unit})")
    result = Fraction(str(value)) * size_a / size_b
    shown = str(result.numerator) if result.denominator == 1 else f"{float(result):.10g}"
    return f"{value:g} {from_unit} = {shown} {to_unit}"


@app.tool()
def remember(key: str, value: str) -> str:
    """Write a note under a key (kept for the rest of this session)."""
    notes[key] = value
    return f"noted {key!r}"


@app.tool()
def recall(key: str) -> str:
    """Read the note written under a key in this session."""
    if key not in notes:
        raise ToolError(f"no note {key!r}; notes: {sorted(notes)}")
    return notes[key]


if __name__ == "__main__":
    app.run()
