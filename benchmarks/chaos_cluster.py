"""The real local Ray cluster of the chaos soak (``benchmarks/chaos.py``), and the process-table helpers that
find its processes: by each node's own temp folder and their descendants (actors, sandboxes), never by name,
so other Ray instances on the machine are left alone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MB = 2**20


def proc_table() -> dict[int, tuple[int, bytes]]:
    """Pid -> (ppid, cmdline) of every process we can read."""
    out: dict[int, tuple[int, bytes]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_bytes()
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        out[int(d)] = (int(stat[stat.rindex(b")") + 2 :].split()[1]), cmd)
    return out


def descendants(table: dict[int, tuple[int, bytes]], roots: set[int]) -> set[int]:
    """``roots`` and every process below them."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = set(), list(roots)
    while todo:
        p = todo.pop()
        if p not in out:
            out.add(p)
            todo += children.get(p, [])
    return out


def rss_bytes(pids: set[int]) -> int:
    total = 0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except (OSError, ValueError):
            pass
    return total


def kill(pids: set[int] | list[int], sig: int = signal.SIGKILL) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """A real 2-node Ray cluster on this machine, started with the ``ray`` CLI; each node has its own temp
    folder, by which its processes are found (with their descendants: actors, sandboxes)."""

    def __init__(self) -> None:
        self.head_dir = tempfile.mkdtemp(prefix="agentrl-chaos-head-", dir="/tmp")
        self.node_dir = tempfile.mkdtemp(prefix="agentrl-chaos-node-", dir="/tmp")
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
        # The CLI's module under this interpreter (the `ray` script's shebang may name another venv's).
        self.ray = [sys.executable, "-m", "ray.scripts.scripts"]

    def _start(self, args: list[str]) -> None:
        common = [
            "--num-cpus=1",
            "--disable-usage-stats",
            f"--object-store-memory={100 * MB}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            f"--node-manager-port={free_port()}",
            f"--object-manager-port={free_port()}",
        ]
        out = subprocess.run(
            [*self.ray, "start", *args, *common], capture_output=True, text=True, env=self.env, timeout=300
        )
        if out.returncode != 0:
            raise RuntimeError(f"ray start {args[0]} failed: {out.stdout[-1500:]}{out.stderr[-1500:]}")

    def start_head(self) -> None:
        self._start(
            [
                "--head",
                f"--port={self.port}",
                f"--temp-dir={self.head_dir}",
                "--include-dashboard=false",
                "--resources",
                json.dumps({"learner": 1, "inference": 2}),
                # Notice a dead node within seconds (not a slow one: 6 missed checks a second apart).
                "--system-config",
                json.dumps({"health_check_period_ms": 1000, "health_check_failure_threshold": 6}),
            ]
        )

    def start_node(self) -> None:
        self._start(
            [
                f"--address={self.address}",
                f"--temp-dir={self.node_dir}",
                "--resources",
                json.dumps({"rollout": 3, "sandbox": 3}),  # 2 workers + room for a replacement
            ]
        )

    def processes(self, table: dict[int, tuple[int, bytes]], which: str = "both") -> set[int]:
        """The processes of a node (``head``, ``node``) or both, with their descendants."""
        dirs = {"head": (self.head_dir,), "node": (self.node_dir,)}.get(which, (self.head_dir, self.node_dir))
        roots = {p for p, (_, cmd) in table.items() if any(d.encode() in cmd for d in dirs)}
        roots.discard(os.getpid())
        return descendants(table, roots)

    def actors(self, table: dict[int, tuple[int, bytes]], cls: str) -> list[int]:
        mark = f"ray::{cls}".encode()
        return sorted(p for p in self.processes(table) if table[p][1].startswith(mark))

    def kill_node(self) -> int:
        """SIGKILL every process of the rollout node at once (a power cut); how many."""
        pids = self.processes(proc_table(), "node")
        kill(pids)
        return len(pids)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL, this cluster's processes (never another Ray on the machine)."""
        pids = self.processes(proc_table())
        kill(pids, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (pids := self.processes(proc_table())):
            time.sleep(0.2)
        kill(pids)
        for d in (self.head_dir, self.node_dir):
            shutil.rmtree(d, ignore_errors=True)
