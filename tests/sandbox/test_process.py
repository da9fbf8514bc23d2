"""ProcessSandbox: a long-lived program with pipes in the local bubblewrap sandbox (no network, read-only
root, memory and process limits), and nothing left behind once it is killed."""

import asyncio
import os
import sys

import pytest

from agentrl.errors import ConfigError
from agentrl.execution import Limits
from agentrl.sandbox import ProcessSandbox
from agentrl.sandbox.local import find_bwrap

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed")
MiB = 1024 * 1024

PROBE = r"""
import os, socket, sys
print("ready", os.getuid(), os.getcwd(), flush=True)
line = sys.stdin.readline().strip()
try:
    socket.create_connection(("1.1.1.1", 53), timeout=1)
    net = "reachable"
except OSError as e:
    net = e.strerror
try:
    open("/usr/x", "w")
    usr = "written"
except OSError as e:
    usr = e.strerror
print(line, "|", net, "|", usr, "|", os.path.exists("/home"), "|", os.environ.get("HOST_SECRET"), flush=True)
print("bye", file=sys.stderr, flush=True)
"""


async def test_pipes_isolation_and_exit(monkeypatch):
    monkeypatch.setenv("HOST_SECRET", "x")
    async with await ProcessSandbox().start([sys.executable, "-c", PROBE]) as proc:
        assert (await proc.stdout.readline()).decode().split() == ["ready", "1000", "/tmp"]
        proc.stdin.write(b"hello\n")
        await proc.stdin.drain()
        line = (await proc.stdout.readline()).decode().strip()
        assert line == "hello | Network is unreachable | Read-only file system | False | None"
        assert await proc.wait() == 0
        await asyncio.sleep(0.05)
        assert proc.stderr_tail() == "bye\n"


async def test_memory_limit_kills_a_hog():
    limits = Limits(memory_bytes=256 * MiB, scratch_bytes=16 * MiB)
    hog = "b = bytearray(600 * 1024 * 1024)\nprint('survived')"
    async with await ProcessSandbox(limits).start([sys.executable, "-c", hog]) as proc:
        out = await proc.stdout.read()
        rc = await proc.wait()
    assert b"survived" not in out and rc != 0
    assert "MemoryError" in proc.stderr_tail() or proc.oom_killed


async def test_process_limit_stops_a_fork_bomb_and_kill_leaves_nothing():
    bomb = (
        "import os, time\nn = 0\ntry:\n    for _ in range(200):\n        if os.fork() == 0:\n"
        "            time.sleep(60); os._exit(0)\n        n += 1\nexcept OSError as e:\n"
        "    print('stopped at', n, flush=True)\ntime.sleep(60)"
    )
    proc = await ProcessSandbox(Limits(max_processes=16)).start([sys.executable, "-c", bomb])
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    assert line.startswith(b"stopped at") and int(line.split()[-1]) < 16
    pid = proc.pid
    await proc.kill()
    assert proc.returncode is not None
    assert not os.path.exists(f"/proc/{pid}")
    await proc.kill()  # idempotent


async def test_argv_files_are_visible_read_only_and_bad_argv_is_refused(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import os\nprint(len(open(__file__).read()), os.access(__file__, os.W_OK))")
    async with await ProcessSandbox().start([sys.executable, str(script)]) as proc:
        assert (await proc.stdout.read()).split() == [b"73", b"False"]
    with pytest.raises(ConfigError, match="program not found"):
        await ProcessSandbox().start(["no-such-program-here"])
    with pytest.raises(ConfigError, match="non-empty"):
        await ProcessSandbox().start([])
    with pytest.raises(ConfigError, match="never enables network"):
        ProcessSandbox(Limits(network=True))
