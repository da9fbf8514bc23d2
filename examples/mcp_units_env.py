"""An environment whose tools come from a stdio MCP server (``examples/mcp_units_server.py``), sandboxed.

The model converts a quantity between units with the server's ``convert`` tool and answers with the number::

    agentrl check --env examples/mcp_units_env.py:UnitsEnv
    agentrl train --env examples/mcp_units_env.py:UnitsEnv --model tiny --steps 1 --out runs/units
    agentrl replay runs/units --reexec --rescore

Every episode gets its own server process, started in ``agentrl.sandbox.ProcessSandbox`` on the episode's
first tool call (no network, read-only root, memory and process limits). The server's notebook tools
(``remember``/``recall``) therefore start empty in every episode.
"""

import json
import sys
from pathlib import Path

from agentrl.envs import Task, ToolEnv
from agentrl.tools.mcp import MCPServer

# One object for every env instance, so the server's tools are listed once per process, not per env.
SERVER = MCPServer(command=[sys.executable, str(Path(__file__).with_name("mcp_units_server.py"))])

# (from unit, to unit, factor): every task has an integer answer.
CONVERSIONS = [
    ("foot", "inch", 12),
    ("yard", "foot", 3),
    ("km", "m", 1000),
    ("m", "cm", 100),
    ("hour", "minute", 60),
    ("day", "hour", 24),
    ("kg", "g", 1000),
    ("minute", "s", 60),
]


class UnitsEnv(ToolEnv):
    """Convert a quantity exactly with the MCP server's ``convert`` tool; reward 1 for the exact number."""

    system_prompt = "You convert units exactly.\n{tools}\nEnd with 'Answer: <number>'."

    def __init__(self, **kwargs):
        super().__init__([SERVER], parser="hermes", **kwargs)

    def make_task(self, options):
        src, dst, factor = self.rng.choice(CONVERSIONS)
        value = self.rng.randint(2, 999)
        self.question = (value, src, dst)
        prompt = f"How many {dst} are in {value} {src}? Use the convert tool."
        return Task(prompt, answer=value * factor, info={"from": src, "to": dst})

    def sample_actions(self):
        value, src, dst = self.question
        call = {"name": "convert", "arguments": {"value": value, "from_unit": src, "to_unit": dst}}
        return (f"<tool_call>\n{json.dumps(call)}\n</tool_call>", f"Answer: {self.task.answer}")
