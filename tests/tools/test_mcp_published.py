"""Published MCP servers, installed the usual way, in the default process sandbox (issue 47, point 1).

``mcp-server-time`` from PyPI goes into a venv of its own, outside agentrl's (created here once per session:
the sandbox must find that venv from the console script's ``#!`` line, not because agentrl's venv happens to
hold it). ``@modelcontextprotocol/server-everything`` from npm is what ``.ci/setup --dev`` installs under
``.venv/node``; it is copied outside agentrl's venv too, so the ``node_modules`` binding is what serves it.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from agentrl.errors import ConfigError
from agentrl.protocols import ToolContext
from agentrl.sandbox import ProcessSandbox
from agentrl.sandbox._program import program_layout
from agentrl.tools.mcp import MCPServer

ROOT = Path(__file__).resolve().parents[2]
NODE_PREFIX = ROOT / ".venv" / "node"  # where `.ci/setup --dev` installs the npm server
CTX = ToolContext()


def _need_bwrap() -> None:
    from agentrl.sandbox.local import find_bwrap

    if find_bwrap() is None:
        pytest.skip("bubblewrap is not installed")


@pytest.fixture(scope="session")
def time_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with ``mcp-server-time`` from PyPI (about 45 s once per session)."""
    venv = tmp_path_factory.mktemp("published") / "time-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    pip = [
        sys.executable,
        "-m",
        "pip",
        "--disable-pip-version-check",
        "-q",
        "--python",
        str(venv / "bin/python"),
    ]
    subprocess.run([*pip, "install", "mcp-server-time"], check=True)
    assert not str(venv).startswith(sys.prefix)  # outside agentrl's own venv, which the sandbox always binds
    return venv


async def _time_now(command: list[str]) -> str:
    async with MCPServer(command=command, launcher=ProcessSandbox()) as server:
        tools = {t.name: t for t in await server.tools()}
        assert "get_current_time" in tools and "convert_time" in tools
        out = await tools["get_current_time"]({"timezone": "UTC"}, CTX)
        assert out.status == "ok", out.content
        return out.content


@pytest.mark.slow
async def test_a_pypi_server_in_its_own_venv_starts_in_the_default_sandbox(time_venv: Path) -> None:
    _need_bwrap()
    # The console script pip wrote: its first line names the venv's python, which the sandbox must see.
    assert (time_venv / "bin/mcp-server-time").read_text().startswith(f"#!{time_venv}/bin/python")
    text = await _time_now([str(time_venv / "bin/mcp-server-time"), "--local-timezone", "UTC"])
    assert '"timezone": "UTC"' in text
    # The same server as a module of that venv's python.
    text = await _time_now(
        [str(time_venv / "bin/python"), "-m", "mcp_server_time", "--local-timezone", "UTC"]
    )
    assert '"timezone": "UTC"' in text


@pytest.fixture(scope="session")
def node_prefix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("node") is None or not (NODE_PREFIX / "node_modules/.bin/mcp-server-everything").exists():
        pytest.skip(
            f"run `bash .ci/setup --dev` (installs @modelcontextprotocol/server-everything in {NODE_PREFIX})"
        )
    copy = tmp_path_factory.mktemp("npm") / "prefix"
    shutil.copytree(NODE_PREFIX, copy, symlinks=True)
    return copy


@pytest.mark.slow
@pytest.mark.parametrize("how", ["node", "bin", "npx"])
async def test_an_npm_server_starts_in_the_default_sandbox(node_prefix: Path, how: str) -> None:
    _need_bwrap()
    script = node_prefix / "node_modules/.bin/mcp-server-everything"
    command = {
        "node": [
            "node",
            str(node_prefix / "node_modules/@modelcontextprotocol/server-everything/dist/index.js"),
        ],
        "bin": [str(script)],  # a symlink into the package, '#!/usr/bin/env node'
        "npx": ["npx", "--offline", "--prefix", str(node_prefix), "mcp-server-everything"],
    }[how]
    async with MCPServer(command=[*command, "stdio"], launcher=ProcessSandbox()) as server:
        tools = {t.name: t for t in await server.tools()}
        out = await tools["echo"]({"message": "from the sandbox"}, CTX)
        assert out.content == "Echo: from the sandbox"


def _script(path: Path, first_line: str, body: str = "exit 0") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{first_line}\n{body}\n")
    path.chmod(0o755)
    return path


def test_the_layouts_it_binds_and_the_paths_it_refuses(tmp_path: Path) -> None:
    # A venv whose base Python lives in a prefix of its own: both are bound, nothing wider.
    base = tmp_path / "opt/python3.11"
    (base / "lib/python3.11").mkdir(parents=True)
    (base / "bin").mkdir()
    (base / "bin/python3").symlink_to("/usr/bin/env")  # any real executable stands in for the binary
    venv = tmp_path / "venvs/tool"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {base}/bin\nversion = 3.11.7\n")
    (venv / "bin/python").symlink_to(base / "bin/python3")
    tool = _script(venv / "bin/tool", f"#!{venv}/bin/python")
    layout = program_layout([str(tool)], visible=[])
    assert sorted(layout.binds) == sorted([str(venv), str(base)])
    assert not layout.is_node

    # A node_modules tree: its outermost node_modules folder, so the package's imports resolve.
    pkg = tmp_path / "proj/node_modules/@s/pkg/dist/index.js"
    _script(pkg, "#!/usr/bin/env node")
    layout = program_layout(["/usr/bin/node", str(pkg)], visible=[str(pkg)])
    assert layout.binds == (str(tmp_path / "proj/node_modules"),)
    # The npm prefix `npx --prefix DIR` reads: the whole folder.
    layout = program_layout(["/usr/bin/env", "npx", "--prefix", str(tmp_path / "proj")], visible=[])
    assert layout.binds == (str(tmp_path / "proj"),)

    # An interpreter in no layout it knows: refused, naming the path and the fix.
    odd = _script(tmp_path / "home/me/bin/interp", "#!/bin/sh")
    prog = _script(tmp_path / "elsewhere/server", f"#!{odd}")
    with pytest.raises(ConfigError, match=rf"cannot see {odd} .*ro_binds=\['{odd.parent}'\]"):
        program_layout([str(prog)], visible=[str(prog)])
    gone = _script(tmp_path / "v/bin/server", f"#!{tmp_path}/deleted-venv/bin/python")
    with pytest.raises(ConfigError, match=rf"cannot see {tmp_path}/deleted-venv/bin/python .*does not exist"):
        program_layout([str(gone)], visible=[str(gone)])
    nowhere = _script(tmp_path / "w/server", "#!/usr/bin/env no-such-interpreter-47")
    with pytest.raises(ConfigError, match="'no-such-interpreter-47' is not on the sandbox's PATH"):
        program_layout([str(nowhere)], visible=[str(nowhere)])


async def test_a_refused_program_is_a_config_error_before_anything_starts(tmp_path: Path) -> None:
    _need_bwrap()
    odd = _script(tmp_path / "home/me/bin/interp", "#!/bin/sh")
    prog = _script(tmp_path / "srv/server", f"#!{odd}")
    with pytest.raises(ConfigError, match=r"ro_binds=\["):
        await ProcessSandbox().start([str(prog)])
    # With the folder bound, the same program runs.
    proc = await ProcessSandbox(ro_binds=[odd.parent, prog.parent]).start([str(prog)])
    try:
        assert await proc.wait() == 0
    finally:
        await proc.kill()


@pytest.mark.slow  # a fresh interpreter imports the SDK: seconds
def test_a_url_with_nothing_listening_is_one_clear_error(tmp_path: Path) -> None:
    # Issue 47: the SandboxError came wrapped in task groups, and asyncio printed a second traceback.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    script = tmp_path / "connect.py"
    script.write_text(
        "import asyncio\n"
        "from agentrl.tools.mcp import MCPServer\n"
        "async def main():\n"
        f"    async with MCPServer(url='http://127.0.0.1:{port}/mcp', start_timeout=20) as s:\n"
        "        await s.tools()\n"
        "asyncio.run(main())\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last == (
        f"agentrl.errors.SandboxError: the MCP server http://127.0.0.1:{port}/mcp failed to start: "
        "ConnectError('All connection attempts failed')"
    ), out.stderr
    assert "never retrieved" not in out.stderr and "ExceptionGroup" not in last
