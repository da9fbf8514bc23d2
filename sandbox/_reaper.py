"""Reap the sandbox cgroups of dead agentrl processes (``python -m agentrl.sandbox --reap`` by hand).

A process that hosts sandboxes makes ``agentrl-<pid>/sb-<n>`` groups (``_cgroup``) and removes them when it
closes or exits. A host killed outright (a Ray rollout worker SIGKILLed, ``ray.kill``, the OOM killer) runs
neither, so its groups stay, and so does any sandbox process that outlived it (bubblewrap's
``--die-with-parent`` is racy at start-up). Nothing else removes them: the sweep a new host runs when it
probes covers only its own cgroup's folder, and on hosts that give every process its own memory cgroup (a
container runtime, this development machine's ``process_api/<id>``) the dead host's folder is somewhere else.

The reaper walks every hierarchy agentrl makes groups in, and for each ``agentrl-<pid>`` folder whose pid is
not alive kills the processes left inside and removes it. A folder is left alone when:

- its pid is alive (a live host, or a reused pid: the folder waits for that process to end);
- it is this process's own;
- a process inside is in a pid namespace that is neither this one nor one made for a sandbox (a namespace
  whose pid 1 is in the folder too: bubblewrap's init). Such a folder belongs to a host in another container,
  whose pid the folder's name cannot tell about, and its sandboxes are not ours to kill.

``agentrl-host-<pid>`` (the leaf a trainer moves itself into on cgroup v2) holds the trainer's own
processes, not sandboxes: it is removed when empty and never killed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from . import _cgroup

__all__ = ["ReapReport", "hierarchies", "reap_cgroups", "release"]

log = logging.getLogger(__name__)

_NAME = re.compile(r"agentrl-(host-)?(\d+)")
_KILL_WAIT_S = 2.0
"""How long a killed process may take to leave its group before the folder is reported as kept."""


@dataclass(frozen=True, slots=True)
class ReapReport:
    """What one reap did."""

    removed: tuple[str, ...] = ()
    """Folders removed (their owner was dead)."""
    killed: tuple[int, ...] = ()
    """Processes SIGKILLed because they were left in a dead owner's folder."""
    kept: tuple[tuple[str, str], ...] = ()
    """Dead owners' folders left in place, each with why."""

    @property
    def clean(self) -> bool:
        """True when no dead owner's folder was left behind."""
        return not self.kept


def hierarchies() -> list[Path]:
    """The cgroup hierarchies sandboxes may have groups in: v1 ``memory`` and ``pids``, every cgroup2
    mount, and ``$AGENTRL_CGROUP_PARENT``, from ``/proc/self/mountinfo``."""
    roots: list[Path] = []
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        fstype, options = tail[0], set(tail[2].split(","))
        if fstype == "cgroup2" or (fstype == "cgroup" and options & {"memory", "pids"}):
            roots.append(Path(fields[4]))
    extra = os.environ.get("AGENTRL_CGROUP_PARENT")
    if extra and not any(Path(extra) == r or r in Path(extra).parents for r in roots):
        roots.append(Path(extra))
    return roots


def _folders(roots: Iterable[Path]) -> Iterator[tuple[Path, bool, int]]:
    """Every ``agentrl-[host-]<pid>`` folder under ``roots``: (path, is_host_leaf, pid); not their insides."""
    for root in roots:
        # os.walk, not Path.rglob: other processes create and remove groups while we walk, and a folder that
        # vanishes under os.walk is skipped, not an error.
        for parent, dirs, _ in os.walk(root):
            keep = []
            for d in dirs:
                m = _NAME.fullmatch(d)
                if m:
                    yield Path(parent) / d, m.group(1) is not None, int(m.group(2))
                else:
                    keep.append(d)
            dirs[:] = keep


def _procs(folder: Path) -> set[int]:
    """The pids (as this pid namespace sees them) in ``folder`` and every group below it."""
    out: set[int] = set()
    for parent, _, files in os.walk(folder):
        if "cgroup.procs" in files:
            with contextlib.suppress(OSError, ValueError):
                out.update(int(x) for x in _cgroup._read(Path(parent) / "cgroup.procs").split())
    return out


def _pid_ns(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _ns_pid(pid: int) -> int:
    """The pid ``pid`` has inside its own (innermost) pid namespace; 0 when unknown."""
    try:
        text = _cgroup._read(Path(f"/proc/{pid}/status"))
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    return 0


def _foreign(procs: set[int], own_ns: str | None) -> list[int]:
    """The processes of ``procs`` in a pid namespace that is neither ``own_ns`` nor a sandbox's: one whose
    pid 1 is not among ``procs``."""
    by_ns: dict[str, list[int]] = {}
    sandbox_made: set[str] = set()
    for p in procs:
        ns = _pid_ns(p)
        if ns is None:  # gone meanwhile
            continue
        by_ns.setdefault(ns, []).append(p)
        if _ns_pid(p) == 1:
            sandbox_made.add(ns)
    return sorted(p for ns, ps in by_ns.items() if ns != own_ns and ns not in sandbox_made for p in ps)


def _reap_one(folder: Path, host_leaf: bool, pid: int, own_ns: str | None) -> tuple[bool, list[int], str]:
    """Empty and remove one dead owner's folder; (removed, killed pids, why kept).

    Processes seen in it may be on their way out (a sandbox whose host was just killed tears its namespace
    down for a moment, its init gone before its worker), so what blocks the removal is looked at again until
    ``_KILL_WAIT_S`` has passed."""
    killed: list[int] = []
    deadline = time.monotonic() + _KILL_WAIT_S
    while procs := _procs(folder):
        if host_leaf:
            why = f"holds processes {sorted(procs)[:8]} of the dead trainer (not sandboxes)"
        elif foreign := _foreign(procs, own_ns):
            why = f"its processes {foreign[:8]} are in another container's pid namespace"
        else:
            why = f"processes {sorted(procs)[:8]} did not leave it within {_KILL_WAIT_S} s"
            for p in sorted(procs):
                try:
                    os.kill(p, signal.SIGKILL)
                    if p not in killed:
                        killed.append(p)
                except ProcessLookupError:
                    pass
                except OSError as e:
                    return False, killed, f"cannot kill process {p} in it: {e.strerror}"
        if time.monotonic() > deadline:
            return False, killed, why
        time.sleep(0.02)
    if _cgroup._pid_alive(pid):  # the pid was taken again meanwhile: the folder may be a new host's now
        return False, killed, f"pid {pid} is alive again"
    if _cgroup._remove_tree(folder):
        return True, killed, ""
    return False, killed, "rmdir failed (a process this namespace cannot see may be inside)"


def reap_cgroups(roots: Iterable[Path] | None = None, *, dry_run: bool = False) -> ReapReport:
    """Remove the sandbox cgroups of agentrl processes that are dead, killing what is left in them first.

    A live process's folder (this process's included) is never touched. Safe to run at any time, from any
    number of processes at once: each removal is an ``rmdir`` that the kernel refuses while a process is
    inside. A pool runs it when it starts; ``python -m agentrl.sandbox --reap`` runs it by hand.

    Args:
        roots: hierarchies to walk (default :func:`hierarchies`).
        dry_run: only report what would be removed (as ``removed``); kill and remove nothing.

    Returns:
        What was removed, killed and kept (with why).
    """
    me, own_ns = os.getpid(), _pid_ns("self")
    removed: list[str] = []
    killed: list[int] = []
    kept: list[tuple[str, str]] = []
    for folder, host_leaf, pid in _folders(hierarchies() if roots is None else roots):
        if pid == me or _cgroup._pid_alive(pid):
            continue
        if dry_run:
            removed.append(str(folder))
            continue
        ok, k, why = _reap_one(folder, host_leaf, pid, own_ns)
        killed += k
        if ok:
            removed.append(str(folder))
        elif folder.exists():
            kept.append((str(folder), why))
    report = ReapReport(tuple(removed), tuple(killed), tuple(kept))
    if removed or killed or kept:
        log.info(
            "reaped the sandbox cgroups of dead agentrl processes: %d removed, %d killed, %d kept%s",
            len(removed),
            len(killed),
            len(kept),
            "".join(f"; kept {f}: {why}" for f, why in kept),
        )
    return report


def release() -> None:
    """Remove this process's sandbox cgroups now, and reap those of dead agentrl processes anywhere.

    The groups are otherwise removed at exit (``atexit``), which a process killed outright never runs: a Ray
    actor stopped with ``ray.kill`` (a rollout worker at the end of a run) calls this first, after closing
    its sandboxes. A group of this process that still holds a process stays. The reap (:func:`reap_cgroups`)
    removes the groups of workers killed since the last pool started on this machine, whatever cgroup they
    lived in. (It lives here, not in ``_cgroup``, because the reaper builds on that module.)"""
    if _cgroup._manager is not None and _cgroup._manager.version:
        _cgroup._manager.release()
    reap_cgroups()
