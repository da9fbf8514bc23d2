"""The local sandbox as root: per-sandbox host uids limit processes where no pids cgroup can be made, the
self-test still fails closed where nothing limits them, and ``agentrl check`` fails with it.

"Cgroups hidden" is the GPU-host case (cgroup v2, the process in a non-root leaf, nothing writable) made
here: a child process in a private mount namespace with an empty tmpfs over ``/sys/fs/cgroup``, so the
cgroup manager finds no hierarchy at all.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

import agentrl
from agentrl.errors import ConfigError, SandboxError, SandboxSelfTestError
from agentrl.execution import Limits
from agentrl.sandbox import LocalSandbox, _cgroup, _uids, self_test
from agentrl.types import ToolStatus

from .conftest import requires_bwrap

MiB = 1024 * 1024
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (uid switching, mount namespaces)")
has_unshare = pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare")


def _hidden_cgroups(
    script: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` with this interpreter in a private mount namespace where /sys/fs/cgroup is empty."""
    cmd = 'mount -t tmpfs none /sys/fs/cgroup && exec "$0" -c "$1"'
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", cmd, sys.executable, script],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# -- uid ranges and allocation ---------------------------------------------------------------------
def test_uid_ranges_parse_and_reject_bad_input(monkeypatch):
    assert _uids.UidRange.parse("2147000000-2147000009") == _uids.UidRange(2147000000, 2147000009)
    assert _uids.UidRange.parse("off") is None
    assert _uids.UidRange(5, 5).size == 1
    for bad in ("1000", "a-b", "10-5", "0-10", "-"):
        with pytest.raises(ConfigError, match="uid range"):
            _uids.UidRange.parse(bad)
    monkeypatch.delenv(_uids.ENV_VAR, raising=False)
    assert _uids.resolve(None) == _uids.DEFAULT_RANGE
    monkeypatch.setenv(_uids.ENV_VAR, "3000000-3000015")
    assert _uids.resolve(None) == _uids.UidRange(3000000, 3000015)
    assert _uids.resolve("off") is None
    monkeypatch.setenv(_uids.ENV_VAR, "off")
    assert LocalSandbox(self_test=False).host_uids is None
    with pytest.raises(ConfigError, match="uid range"):
        LocalSandbox(host_uids="lots")


@as_root
def test_ro_binds_closed_to_other_users_are_refused_under_host_uids(tmp_path):
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    with pytest.raises(ConfigError, match=r"not readable by other users.*chmod o\+rX"):
        LocalSandbox(ro_binds=[closed], self_test=False)
    LocalSandbox(ro_binds=[closed], self_test=False, host_uids="off")  # maps to root: the owner reads it
    closed.chmod(0o755)
    LocalSandbox(ro_binds=[closed], self_test=False)


@as_root
def test_uids_are_distinct_within_and_across_processes():
    r = _uids.UidRange(2147100000, 2147100001)  # two uids, only for this test
    a = _uids.allocator(r).acquire()
    b = _uids.allocator(r).acquire()
    assert {a.uid, b.uid} == {r.first, r.last}
    with pytest.raises(SandboxError, match="all 2 sandbox uids"):
        _uids.allocator(r).acquire()
    other = textwrap.dedent(f"""
        from agentrl.sandbox import _uids
        try:
            print(_uids.allocator(_uids.UidRange({r.first}, {r.last})).acquire().uid)
        except Exception as e:
            print(type(e).__name__)
    """)
    run = lambda: subprocess.run([sys.executable, "-c", other], capture_output=True, text=True).stdout.strip()  # noqa: E731
    assert run() == "SandboxError"  # another process on the host sees both uids held
    a.release()
    assert run() == str(a.uid)  # ... and gets the released one
    b.release()


def test_blocked_dirs_names_the_outermost_closed_directory():
    # Not under tmp_path: pytest's base directory is itself closed (0700).
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        os.chmod(d, 0o755)
        _check_blocked_dirs(Path(d))


def _check_blocked_dirs(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    (closed / "inner" / "venv").mkdir(parents=True)
    (tmp_path / "open" / "venv").mkdir(parents=True)
    closed.chmod(0o700)
    target = str(closed / "inner" / "venv")
    got = _uids.blocked_dirs([target, str(tmp_path / "open" / "venv")])
    assert got == {str(closed): [target]}


# -- the uid path, with cgroups visible -----------------------------------------------------------
@as_root
@requires_bwrap
async def test_each_sandbox_runs_under_its_own_unprivileged_host_uid():
    async with LocalSandbox(Limits(wall_s=10)) as a, LocalSandbox(Limits(wall_s=10)) as b:
        ra, rb = await asyncio.gather(a.run("import os; os.getuid()"), b.run("import os; os.getuid()"))
        assert ra.stdout == rb.stdout == "1000\n"  # the same user inside ...
        uids = []
        for sb in (a, b):
            w = sb._worker
            assert w is not None and w.uid_lease is not None and w.proc is not None
            with open(f"/proc/{w.proc.pid}/status") as f:
                real = [line.split()[1:] for line in f if line.startswith(("Uid:", "Gid:"))]
            assert real == [[str(w.uid_lease.uid)] * 4] * 2  # ... a different host uid each, never 0
            uids.append(w.uid_lease.uid)
        assert len(set(uids)) == 2 and 0 not in uids
        assert all(_uids.DEFAULT_RANGE.first <= u <= _uids.DEFAULT_RANGE.last for u in uids)
        # Nothing of the host is writable by that uid, and /root stays closed even though the interpreter
        # may live under it.
        r = await a.run("import os; [p for p in ('/', '/usr', '/root', '/etc') if os.access(p, os.W_OK)]")
        assert r.stdout == "[]\n"


@as_root
@requires_bwrap
async def test_a_restarted_worker_gets_a_uid_and_the_old_one_is_released():
    sb = LocalSandbox(Limits(wall_s=10))
    async with sb:
        await sb.run("1")
        first = sb._worker.uid_lease.uid  # type: ignore[union-attr]
        alloc = _uids.allocator(_uids.DEFAULT_RANGE)
        assert first in alloc._held
        r = await sb.run("import time; time.sleep(30)", timeout=0.3)
        assert r.status is ToolStatus.TIMEOUT
        await sb.run("1")
        assert first not in alloc._held  # the killed worker's namespace emptied, its uid came back
        assert sb._worker.uid_lease.uid != first  # type: ignore[union-attr]
    assert not any(_uids.DEFAULT_RANGE.first <= u <= _uids.DEFAULT_RANGE.last for u in alloc._held)


@as_root
@requires_bwrap
async def test_visible_cgroups_self_test_passes_with_host_uids():
    report = await self_test()
    assert report.passed, report.summary()
    if _cgroup.manager().available:
        assert "stopped" in report.checks["processes"][1]


# -- cgroups hidden: the GPU-host case ------------------------------------------------------------
_PROBE = """
import asyncio, json
from agentrl.execution import Limits
from agentrl.sandbox import LocalSandbox, self_test
from agentrl.sandbox import _cgroup

FORK_STEPS = '''
import os, time
n = 0
try:
    for _ in range(10000):
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
except OSError as e:
    print("stopped", n, e.errno)
'''
BOMB = "import os\\nwhile True:\\n    try: os.fork()\\n    except OSError: pass"

async def main():
    report = await self_test(host_uids=HOST_UIDS)
    out = {"cgroups": _cgroup.manager().available, "passed": report.passed, "failed": report.failed,
           "processes": report.checks.get("processes", (False, ""))[1]}
    if report.passed:
        async with LocalSandbox(Limits(wall_s=10, max_processes=32), host_uids=HOST_UIDS) as sb:
            r = await sb.run(FORK_STEPS)
            out["forks"] = r.stdout.split()
            r = await sb.run(BOMB, timeout=2)
            out["bomb"] = r.status.value
            r = await sb.run("print(6 * 7)")
            out["after"] = [r.status.value, r.stdout]
    else:
        try:
            async with LocalSandbox(host_uids=HOST_UIDS) as sb:
                await sb.run("1")
            out["refused"] = ""
        except Exception as e:
            out["refused"] = type(e).__name__ + ": " + str(e)
    print(json.dumps(out))

asyncio.run(main())
"""


def _probe(host_uids: str | None) -> dict[str, object]:
    res = _hidden_cgroups(_PROBE.replace("HOST_UIDS", repr(host_uids)))
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@as_root
@has_unshare
@requires_bwrap
def test_hidden_cgroups_host_uids_pass_the_self_test_and_contain_a_fork_bomb():
    out = _probe(None)
    assert out["cgroups"] is False  # really no cgroup: the uid path alone limits processes
    assert out["passed"] is True, out
    assert str(out["processes"]).startswith("stopped")
    words = out["forks"]
    assert isinstance(words, list) and words[0] == "stopped" and int(words[1]) < 32, out
    assert out["bomb"] == "timeout"
    assert out["after"] == ["ok", "42\n"]


@as_root
@has_unshare
@requires_bwrap
def test_hidden_cgroups_without_host_uids_fail_closed():
    out = _probe("off")
    assert out["cgroups"] is False
    assert out["passed"] is False and out["failed"] == ["processes"], out
    assert str(out["processes"]).startswith("unlimited")
    refused = str(out["refused"])
    assert refused.startswith("SandboxSelfTestError") and "processes: unlimited" in refused
    assert "AGENTRL_SANDBOX_UIDS" in refused and "DockerSandbox" in refused  # says what to do


@as_root
@has_unshare
@requires_bwrap
def test_the_self_test_command_prints_a_table_and_exits_1_when_a_limit_does_not_hold():
    res = _hidden_cgroups(
        "import runpy; runpy.run_module('agentrl.sandbox', run_name='__main__')",
        env={_uids.ENV_VAR: "off"},
    )
    assert res.returncode == 1, res.stderr[-2000:]
    assert "processes       FAIL    unlimited" in res.stdout and "FAILED (processes)" in res.stdout
    assert "cgroups: none" in res.stdout and "host uids: not used" in res.stdout
    ok = _hidden_cgroups("import runpy; runpy.run_module('agentrl.sandbox', run_name='__main__')")
    assert ok.returncode == 0, ok.stdout + ok.stderr[-2000:]
    assert "processes       PASS    stopped" in ok.stdout
    assert ok.stdout.rstrip().splitlines()[-1].startswith("PASSED")


@pytest.mark.slow  # ~7 s on 2 cores
@as_root
@has_unshare
@requires_bwrap
def test_agentrl_check_fails_when_the_envs_sandbox_cannot_start():
    script = (
        "import sys; from agentrl.trainers.cli import main; "
        "sys.exit(main(['check', '--env', 'math-tir-arith-v0', '--no-gymnasium']))"
    )
    res = _hidden_cgroups(script, env={_uids.ENV_VAR: "off"})
    assert res.returncode == 2, res.stdout + res.stderr[-2000:]
    assert "check_env passed" not in res.stdout
    assert "math-tir-arith-v0: its tools run code in a sandbox, and none can run here" in res.stderr
    assert "processes: unlimited" in res.stderr
    ok = _hidden_cgroups(script)  # the same host, with per-sandbox uids: the check passes
    assert ok.returncode == 0, ok.stdout + ok.stderr[-2000:]
    assert "the sandbox starts and runs code here" in ok.stdout and "agentrl check_env passed" in ok.stdout


@requires_bwrap
def test_check_env_fails_on_a_sandbox_error_instead_of_passing():
    # A sandbox that cannot limit processes fails its self-test on any host; the env's tool calls then end
    # in sandbox_error, which check_env must not wave through.
    env = agentrl.make(
        "math-tir-arith-v0", sandbox_factory=lambda: LocalSandbox(disable_limits={"processes"})
    )
    with pytest.raises(SandboxSelfTestError, match="processes"):
        asyncio.run(env.check_sandbox())
    with pytest.raises(SandboxError, match="sandbox_error"):
        agentrl.check_env(env)


@as_root
@requires_bwrap
async def test_closing_during_a_call_is_prompt_and_gives_the_uid_back():
    # Two cleanups of one worker (the cancelled call's and close's) wait on the same namespace exit.
    sb = LocalSandbox(Limits(wall_s=30))
    await sb.start()
    uid = sb._worker.uid_lease.uid  # type: ignore[union-attr]
    task = asyncio.ensure_future(sb.run("import time; time.sleep(60)", timeout=20))
    await asyncio.sleep(0.5)
    t = asyncio.get_running_loop().time()
    await sb.close()
    await task
    await asyncio.sleep(0)  # let the background cleanup finish
    assert asyncio.get_running_loop().time() - t < 2.0
    for _ in range(100):
        if uid not in _uids.allocator(_uids.DEFAULT_RANGE)._held:
            break
        await asyncio.sleep(0.02)
    assert uid not in _uids.allocator(_uids.DEFAULT_RANGE)._held
