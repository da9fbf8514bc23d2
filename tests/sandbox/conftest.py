"""Fixtures for the sandbox tests: backends, and a leak check that every test runs under."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentrl.execution import Limits
from agentrl.sandbox import LocalSandbox
from agentrl.sandbox.local import find_bwrap

from .e2b_server import LocalE2BServer

MiB = 1024 * 1024

requires_bwrap = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap (bwrap) is not installed")

_BOOT_MARK = b"import os,sys,marshal"


def _proc_table() -> dict[int, tuple[int, bytes, str]]:
    """pid -> (ppid, cmdline, cgroup text) for every process we can read."""
    out: dict[int, tuple[int, bytes, str]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{d}/cgroup") as f:
                cg = f.read()
        except (OSError, ValueError):
            continue
        out[int(d)] = (ppid, cmd, cg)
    return out


def sandbox_processes() -> list[tuple[int, bytes]]:
    """Processes that belong to sandboxes of *this* test process: in one of our cgroups, or descendants of
    this process that run bwrap or the worker bootstrap."""
    me = os.getpid()
    table = _proc_table()
    mark = f"agentrl-{me}/"
    found = []
    for pid, (_ppid, cmd, cg) in table.items():
        if pid == me:
            continue
        if mark in cg:
            found.append((pid, cmd))
            continue
        p, hops = pid, 0
        while p > 1 and hops < 64:
            p = table.get(p, (0, b"", ""))[0]
            hops += 1
            if p == me:
                if b"bwrap" in cmd or _BOOT_MARK in cmd:
                    found.append((pid, cmd))
                break
    return found


def cgroup_leftovers() -> list[str]:
    """Per-sandbox cgroup directories of this process that still exist."""
    # os.walk, not Path.glob: other processes' sandboxes (another test run, a training run) create and
    # remove their cgroups while we walk, and glob raises on a directory that vanished under it.
    mine = f"agentrl-{os.getpid()}"
    left = []
    for parent, dirs, _ in os.walk("/sys/fs/cgroup"):
        if os.path.basename(parent) == mine:
            left += [os.path.join(parent, d) for d in dirs if d.startswith("sb-")]
            dirs.clear()
    return left


def _mount_count() -> int:
    with open("/proc/self/mountinfo") as f:
        return sum(1 for _ in f)


def _tmp_entries() -> set[str]:
    return {e for e in os.listdir("/tmp") if re.match(r"(agentrl-sandbox|agentrl-sb|bwrap)", e)}


def wait_no_leaks(timeout: float = 5.0) -> tuple[list[tuple[int, bytes]], list[str]]:
    deadline = time.monotonic() + timeout
    while True:
        procs, cgs = sandbox_processes(), cgroup_leftovers()
        if (not procs and not cgs) or time.monotonic() > deadline:
            return procs, cgs
        time.sleep(0.02)


@pytest.fixture(autouse=True)
def no_leaks(request):
    """Every sandbox test must leave no process, container, cgroup, mount or temp dir behind."""
    engine = None
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("backend") == "docker":
        engine = request.getfixturevalue("docker_engine")  # started before the mount snapshot
    mounts, tmp = _mount_count(), _tmp_entries()
    yield
    procs, cgs = wait_no_leaks()
    assert not procs, f"leaked sandbox processes: {procs}"
    assert not cgs, f"leaked cgroups: {cgs}"
    if engine is not None:
        deadline = time.monotonic() + 10
        while (left := engine.client.containers.list(all=True)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, f"leaked containers: {left}"
    deadline = time.monotonic() + 5
    while _mount_count() != mounts and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _mount_count() == mounts, "the host mount table changed"
    assert _tmp_entries() <= tmp, f"temp dirs left: {_tmp_entries() - tmp}"


SMALL = Limits(
    wall_s=3.0, memory_bytes=256 * MiB, max_processes=32, file_size_bytes=4 * MiB, scratch_bytes=16 * MiB
)


@pytest.fixture
def make_local() -> Callable[..., LocalSandbox]:
    if find_bwrap() is None:
        pytest.skip("bubblewrap (bwrap) is not installed")

    def make(limits: Limits | None = None, **kw: Any) -> LocalSandbox:
        return LocalSandbox(limits or SMALL, **kw)

    return make


@pytest.fixture
async def local_sb(make_local) -> AsyncIterator[LocalSandbox]:
    async with make_local() as sb:
        yield sb


# ---- backends ------------------------------------------------------------------------------------
BACKENDS = ["local", "docker"]


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    if request.param == "local" and find_bwrap() is None:
        pytest.skip("bubblewrap (bwrap) is not installed")
    if request.param == "docker":
        request.getfixturevalue("docker_engine")
    return request.param


@pytest.fixture
async def e2b_server() -> AsyncIterator[Any]:
    """The local e2b protocol server (real LocalSandbox sessions behind e2b's HTTP protocol)."""
    if find_bwrap() is None:
        pytest.skip("the local e2b server runs code in LocalSandbox, which needs bubblewrap")
    pytest.importorskip("e2b_code_interpreter")
    async with LocalE2BServer(limits=Limits(wall_s=30.0, memory_bytes=256 * MiB)) as server:
        yield server


@pytest.fixture
def make(backend, request) -> Callable[..., Any]:
    """A factory for sandboxes of the parametrised backend: ``make(limits=None, **kw)``."""
    if backend == "e2b":
        from agentrl.sandbox import E2BSandbox

        server = request.getfixturevalue("e2b_server")

        def make_e2b(limits: Limits | None = None, **kw: Any) -> Any:
            return E2BSandbox(limits or SMALL, debug=True, sandbox_url=server.url, **kw)

        return make_e2b
    if backend == "docker":
        from agentrl.sandbox import DockerSandbox

        engine = request.getfixturevalue("docker_engine")

        def make_docker(limits: Limits | None = None, **kw: Any) -> Any:
            return DockerSandbox(limits or SMALL, client=engine.client, image=engine.image, **kw)

        return make_docker

    def make_local(limits: Limits | None = None, **kw: Any) -> LocalSandbox:
        return LocalSandbox(limits or SMALL, **kw)

    return make_local


@pytest.fixture
def sb_factory(make) -> Callable[..., Any]:
    return make


@pytest.fixture
async def sb(make) -> AsyncIterator[Any]:
    async with make() as s:
        yield s


@pytest.fixture
def kill_backend(backend) -> Callable[[Any], Any]:
    """Kill a sandbox from outside, the way a crashed VM or a lost container would die."""

    async def kill_local(s: LocalSandbox) -> None:
        os.kill(s._worker.proc.pid, 9)

    async def kill_docker(s: Any) -> None:
        await asyncio.to_thread(s._container.kill)

    return kill_local if backend == "local" else kill_docker


@dataclass
class DockerEngine:
    client: Any
    image: str
    root: Path


def _popen_dockerd(dockerd: str, root: Path, sock: Path, log: Any) -> subprocess.Popen[bytes]:
    args = ["--iptables=false", "--ip6tables=false", "--bridge=none"]
    args += ["--data-root", str(root / "data"), "--exec-root", str(root / "exec")]
    args += ["--pidfile", str(root / "docker.pid"), "-H", f"unix://{sock}"]
    return subprocess.Popen([dockerd, *args], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _start_dockerd(root: Path) -> tuple[subprocess.Popen[bytes] | None, str]:
    """Start a private dockerd (own data root, socket, no iptables/bridge); (process, why-not)."""
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        return None, "dockerd is not installed (bash .ci/setup --dev installs docker.io)"
    if os.geteuid() != 0:
        return None, "starting dockerd by hand needs root"
    sock = root / "docker.sock"
    with open(root / "dockerd.log", "wb") as log:
        proc = _popen_dockerd(dockerd, root, sock, log)
    import docker

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if sock.exists():
            try:
                docker.DockerClient(base_url=f"unix://{sock}", timeout=5).ping()
                return proc, ""
            except Exception:
                pass
        time.sleep(0.25)
    tail = (root / "dockerd.log").read_text(errors="replace")[-600:]
    _stop_dockerd(proc)
    return None, f"dockerd did not come up: {tail}"


def _stop_dockerd(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[DockerEngine]:
    """A Docker engine this test session starts and stops itself, with the sandbox's local rootfs image."""
    pytest.importorskip("docker")
    root = Path(tempfile.mkdtemp(prefix="dockerd-test-"))
    proc, why = _start_dockerd(root)
    if proc is None:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"no Docker engine: {why}")
    import docker

    from agentrl.sandbox.docker import ensure_rootfs_image

    client = docker.DockerClient(base_url=f"unix://{root / 'docker.sock'}", timeout=60)
    try:
        image = ensure_rootfs_image(client)
        yield DockerEngine(client, image, root)
    finally:
        for c in client.containers.list(all=True):
            with contextlib.suppress(Exception):
                c.remove(force=True)
        client.close()
        _stop_dockerd(proc)
        # dockerd unmounts its overlays on a clean stop; sweep anything left before deleting the tree.
        with open("/proc/self/mountinfo") as f:
            left = [line.split()[4] for line in f if str(root) in line.split()[4]]
        for m in sorted(left, key=len, reverse=True):
            subprocess.run(["umount", "-l", m], check=False)
        shutil.rmtree(root, ignore_errors=True)
