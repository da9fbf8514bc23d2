"""The cgroup reaper (``agentrl.sandbox._reaper``): a host SIGKILLed while it holds sandboxes leaves its
``agentrl-<pid>`` groups (and maybe a process in them); the reaper kills what is left and removes them, and
never touches a live host's groups. Real child processes hosting real LocalSandboxes, real cgroups."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.sandbox import LocalSandbox, SandboxPool, _cgroup
from agentrl.sandbox.__main__ import main as sandbox_main
from agentrl.sandbox._reaper import reap_cgroups

from .conftest import requires_bwrap

pytestmark = requires_bwrap

# A host of two sandboxes: it starts them, prints its cgroup folders, then runs "print(n)" in both for every
# line it reads, and closes them at end of input.
_HOST = r"""
import asyncio, json, sys
from agentrl.sandbox import LocalSandbox, _cgroup

async def main():
    async with LocalSandbox() as a, LocalSandbox() as b:
        for sb in (a, b):
            assert (await sb.run("print(0)")).stdout.strip() == "0"
        print(json.dumps([str(p) for p in _cgroup.manager().parents.values()]), flush=True)
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            outs = [(await sb.run(f"print({line.strip()})")).stdout.strip() for sb in (a, b)]
            print(json.dumps(outs), flush=True)

asyncio.run(main())
"""


def _need_cgroups() -> None:
    m = _cgroup.manager()
    if not m.available:
        pytest.skip(f"no per-sandbox cgroups here: {m.reason}")


class _Host:
    """A child process hosting two LocalSandboxes; ``folders`` are its ``agentrl-<pid>`` groups."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOST], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the host exited before its sandboxes started (rc {self.proc.wait()})"
        self.folders = [Path(p) for p in json.loads(line)]
        assert self.folders and all(f.name == f"agentrl-{self.proc.pid}" for f in self.folders)

    def ask(self, n: int) -> list[str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        return list(json.loads(self.proc.stdout.readline()))

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


@pytest.fixture
def hosts() -> Iterator[list[_Host]]:
    made: list[_Host] = []
    yield made
    for h in made:
        h.stop()
        for f in h.folders:  # a failed test must not leave the killed host's groups behind
            _cgroup._remove_tree(f)


def _sb_dirs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith("sb-"))


async def test_a_sigkilled_hosts_groups_and_leftover_process_are_reaped_and_live_ones_kept(hosts):
    _need_cgroups()
    killed, live = _Host(), _Host()
    hosts += [killed, live]
    # A sandbox process that outlives its host (bubblewrap's --die-with-parent is racy at start-up): a process
    # moved into one of the doomed host's sandbox groups in every hierarchy.
    survivor = subprocess.Popen(["sleep", "120"])
    try:
        for folder in killed.folders:
            (_sb_dirs(folder)[0] / "cgroup.procs").write_text(str(survivor.pid))
        killed.kill()
        assert all(f.is_dir() for f in killed.folders), "SIGKILL skips clean-up: the groups stay"
        assert survivor.poll() is None
        async with LocalSandbox() as mine:  # this process hosts a sandbox too while the reaper runs
            own = list(_cgroup.manager().parents.values())
            report = reap_cgroups()
            assert {str(f) for f in killed.folders} <= set(report.removed)
            assert survivor.pid in report.killed
            assert survivor.wait(5) == -signal.SIGKILL
            assert not any(f.exists() for f in killed.folders)
            # Live hosts are untouched: theirs and ours still exist and still run code.
            assert all(f.is_dir() for f in [*live.folders, *own])
            assert not set(report.removed) & {str(f) for f in [*live.folders, *own]}
            assert live.ask(7) == ["7", "7"]
            assert (await mine.run("print(8)")).stdout.strip() == "8"
    finally:
        if survivor.poll() is None:
            survivor.kill()
            survivor.wait(5)
    live.stop()
    assert not any(f.exists() for f in live.folders), "a host that exits normally removes its own groups"


async def test_a_pool_start_reaps_and_the_command_lists_and_reaps(hosts, capsys):
    _need_cgroups()
    host = _Host()
    hosts.append(host)
    host.kill()
    assert sandbox_main(["--reap", "--dry-run", "--json"]) in (0, 1)
    listed = json.loads(capsys.readouterr().out)
    assert listed["dry_run"] and {str(f) for f in host.folders} <= set(listed["removed"])
    assert all(f.is_dir() for f in host.folders), "a dry run removes nothing"
    async with SandboxPool(LocalSandbox, size=1, warm=0):
        assert not any(f.exists() for f in host.folders)
    again = _Host()
    hosts.append(again)
    again.kill()
    sandbox_main(["--reap"])
    out = capsys.readouterr().out
    assert all(f"removed {f}" in out for f in again.folders), out
    assert not any(f.exists() for f in again.folders)


def _grandchild(pid: int) -> int:
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        grand = Path(f"/proc/{child}/task/{child}/children").read_text().split()
        if grand:
            return int(grand[0])
    return 0


def test_a_group_whose_processes_are_in_another_pid_namespace_is_left_alone():
    """A host in another container (its own pid namespace) names its groups by a pid this namespace cannot
    check; its sandboxes must not be killed."""
    _need_cgroups()
    if os.geteuid() != 0:
        pytest.skip("unshare --pid needs root")
    parent = next(iter(_cgroup.manager().parents.values())).parent
    folder = parent / "agentrl-999999999"  # above pid_max: reads as a dead host
    folder.mkdir()
    # The namespace's pid 1 (sh) stays outside the folder, as a container's init would; its child moves in.
    outer = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "sh", "-c", "sleep 120 & wait"])
    try:
        deadline, inner = time.monotonic() + 5, 0
        while not inner and time.monotonic() < deadline:
            inner = _grandchild(outer.pid)
            time.sleep(0.02)
        assert inner, "unshare did not start its child"
        (folder / "cgroup.procs").write_text(str(inner))
        report = reap_cgroups([parent])
        assert str(folder) not in report.removed and inner not in report.killed
        assert dict(report.kept)[str(folder)].endswith("are in another container's pid namespace")
        assert folder.is_dir() and Path(f"/proc/{inner}").exists()
    finally:
        outer.kill()
        outer.wait(5)
        deadline = time.monotonic() + 5
        while not _cgroup._remove_tree(folder) and time.monotonic() < deadline:
            time.sleep(0.02)
