"""Per-sandbox cgroups (memory incl. swap, pids) where the host lets us create them; v1 and v2.

Each sandbox gets ``<own cgroup>/agentrl-<host pid>/sb-<n>`` in every controller it can write. The sandbox's
launcher writes its own PID into ``cgroup.procs`` *before* it execs bubblewrap, so no sandboxed process ever
runs outside the group. Where nothing is writable (an unprivileged user, a v2 host without delegation), the
manager reports that and the caller falls back to rlimits; the startup self-test then decides whether the
remaining limits are good enough.

cgroup v2 forbids controllers in the subtree of a group that holds processes itself (the "no internal
processes" rule; only the hierarchy's root is exempt). A trainer usually sits in such a leaf (a session
scope, a container's or VM agent's cgroup), so on v2, in order: ``$AGENTRL_CGROUP_PARENT`` when set; else the
own cgroup, after moving this process into a leaf of its own (``agentrl-host-<pid>``) when it is the only
process there; else the nearest ancestor that already delegates the memory and pids controllers (the root,
or a systemd slice), where this process may create a child (root, or a delegated subtree). Nothing is
enabled on a group that did not have it already except in our own cgroup.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import itertools
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Cgroup", "CgroupManager", "manager"]

log = logging.getLogger(__name__)

_CGROUP_ROOT = Path("/sys/fs/cgroup")


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: Path) -> str:
    with open(path) as f:
        return f.read()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_tree(path: Path) -> bool:
    """Remove (rmdir) a cgroup and its (empty) children, deepest first; True if it is gone."""
    try:
        children = [p for p in path.iterdir() if p.is_dir()]
    except OSError:
        return not path.exists()
    for child in children:
        _remove_tree(child)
    try:
        path.rmdir()
    except OSError:
        return not path.exists()
    return True


@dataclass
class Cgroup:
    """One sandbox's cgroup directories, one per writable controller hierarchy."""

    version: int
    dirs: dict[str, Path]
    """Controller name ("memory", "pids"; v2: "unified") to its directory."""
    procs_files: list[Path] = field(default_factory=list)
    """The ``cgroup.procs`` files the launcher must join (one per distinct directory)."""

    @property
    def controls_memory(self) -> bool:
        return "memory" in self.dirs or (self.version == 2 and "unified" in self.dirs)

    def oom_kills(self) -> int:
        """OOM kills recorded so far in this group (0 if unknown)."""
        try:
            if self.version == 2:
                text = _read(self.dirs["unified"] / "memory.events")
            else:
                text = _read(self.dirs["memory"] / "memory.oom_control")
        except (OSError, KeyError):
            return 0
        m = re.search(r"^oom_kill (\d+)", text, re.M)
        return int(m.group(1)) if m else 0

    def pids(self) -> list[int]:
        out: set[int] = set()
        for f in self.procs_files:
            try:
                out.update(int(x) for x in _read(f).split())
            except OSError:
                pass
        return sorted(out)

    def kill_all(self) -> None:
        """SIGKILL every process still in the group (v2 has an atomic ``cgroup.kill``)."""
        if self.version == 2:
            with contextlib.suppress(OSError):
                _write(self.dirs["unified"] / "cgroup.kill", "1")
                return
        for pid in self.pids():
            with contextlib.suppress(OSError):
                os.kill(pid, 9)

    def remove(self) -> bool:
        """Delete the directories; False if a process is still inside one."""
        ok = True
        for d in set(self.dirs.values()):
            ok = _remove_tree(d) and ok
        return ok


class CgroupManager:
    """Finds the writable cgroup hierarchies once per process and creates per-sandbox groups in them."""

    def __init__(self, parent: str | os.PathLike[str] | None = None):
        self._explicit_parent = Path(parent) if parent else None
        self._counter = itertools.count()
        self._probed = False
        self.version = 0
        """1 or 2 when per-sandbox groups can be made, 0 when not."""
        self.parents: dict[str, Path] = {}
        self.reason = ""
        """Why cgroups are unavailable (empty when they work)."""

    # -- discovery ---------------------------------------------------------------------------------
    @staticmethod
    def _own_paths() -> dict[str, str]:
        """Controller -> this process's cgroup path, from /proc/self/cgroup."""
        paths: dict[str, str] = {}
        try:
            text = _read(Path("/proc/self/cgroup"))
        except OSError:
            return paths
        for line in text.splitlines():
            _, ctrls, path = line.split(":", 2)
            if ctrls == "":
                paths["unified"] = path
            for c in ctrls.split(","):
                if c:
                    paths[c] = path
        return paths

    def _probe(self) -> None:
        if self._probed:
            return
        self._probed = True
        name = f"agentrl-{os.getpid()}"
        if self._explicit_parent is not None:
            self._setup_v2(self._explicit_parent / name, delegated_root=self._explicit_parent)
            return
        own = self._own_paths()
        v1 = {}
        for ctrl in ("memory", "pids"):
            mount = _CGROUP_ROOT / ctrl
            if ctrl in own and (mount / "cgroup.procs").exists() and own.get(ctrl) is not None:
                v1[ctrl] = mount / own[ctrl].lstrip("/")
        if len(v1) == 2:
            made: dict[str, Path] = {}
            for ctrl, base in v1.items():
                self._sweep(base)
                d = base / name
                try:
                    d.mkdir(exist_ok=True)
                    made[ctrl] = d
                except OSError as e:
                    self.reason = f"cannot create a {ctrl} cgroup under {base}: {e.strerror}"
                    break
            if len(made) == 2:
                self.version, self.parents = 1, made
                atexit.register(self.cleanup)
                return
            for d in made.values():
                _remove_tree(d)
            return
        if "unified" in own and (_CGROUP_ROOT / "cgroup.controllers").exists():
            self._setup_v2_auto(_CGROUP_ROOT / own["unified"].lstrip("/"), name)
            return
        self.reason = self.reason or "no writable memory+pids cgroup hierarchy found"

    def _setup_v2_auto(self, base: Path, name: str) -> None:
        """Own cgroup, own cgroup after moving into a leaf, or an ancestor that delegates (see the module
        docstring); ``self.reason`` lists why each failed."""
        first = self._setup_v2(base / name, delegated_root=base)
        if self.version:
            return
        if first == errno.EBUSY and self._move_into_leaf(base):
            self._setup_v2(base / name, delegated_root=base)
            if self.version:
                return
        reasons = [self.reason]
        anc = base.parent
        while self._is_under_root(anc):
            try:
                enabled = set(_read(anc / "cgroup.subtree_control").split())
            except OSError:
                enabled = set()
            if {"memory", "pids"} <= enabled:
                self._setup_v2(anc / name, delegated_root=anc, enable_root=False)
                if self.version:
                    log.info("sandbox cgroups live under %s, outside this process's own %s", anc, base)
                    return
                reasons.append(self.reason)
                break
            if anc == _CGROUP_ROOT:
                break
            anc = anc.parent
        self.reason = "; ".join(r for r in reasons if r)

    @staticmethod
    def _is_under_root(p: Path) -> bool:
        return p == _CGROUP_ROOT or _CGROUP_ROOT in p.parents

    def _move_into_leaf(self, base: Path) -> bool:
        """Move this process into ``base/agentrl-host-<pid>`` when it is alone in ``base``, so that ``base``
        may delegate controllers; True when moved."""
        me = os.getpid()
        try:
            procs = {int(x) for x in _read(base / "cgroup.procs").split()}
        except (OSError, ValueError):
            return False
        if procs != {me}:
            others = sorted(procs - {me})[:5]
            self.reason += f" (other processes share {base}: {others}; not moving them)"
            return False
        leaf = base / f"agentrl-host-{me}"
        try:
            leaf.mkdir(exist_ok=True)
            _write(leaf / "cgroup.procs", str(me))
        except OSError as e:
            self.reason += f" (cannot move this process into {leaf}: {e.strerror})"
            _remove_tree(leaf)
            return False
        log.info("moved this process into %s so that %s can hold per-sandbox cgroups", leaf, base)
        return True

    def _setup_v2(self, parent: Path, delegated_root: Path, enable_root: bool = True) -> int:
        """Make ``parent`` (a child of ``delegated_root``) with memory and pids delegated to its children;
        0 on success, else the errno (and ``self.reason``)."""
        self._sweep(delegated_root)
        try:
            ctrls = _read(delegated_root / "cgroup.controllers").split()
            if not {"memory", "pids"} <= set(ctrls):
                self.reason = f"cgroup v2 at {delegated_root} lacks the memory/pids controllers"
                return errno.ENOENT
            if enable_root:
                # Fails with EBUSY when the group holds processes itself (the "no internal process" rule).
                _write(delegated_root / "cgroup.subtree_control", "+memory +pids")
            parent.mkdir(exist_ok=True)
            _write(parent / "cgroup.subtree_control", "+memory +pids")
        except OSError as e:
            self.reason = f"cannot delegate cgroup v2 controllers under {delegated_root}: {e.strerror}"
            _remove_tree(parent)
            return e.errno or errno.EIO
        self.version, self.parents = 2, {"unified": parent}
        atexit.register(self.cleanup)
        return 0

    @staticmethod
    def _sweep(base: Path) -> None:
        """Remove empty groups left by agentrl processes that died without cleaning up."""
        try:
            entries = list(base.iterdir())
        except OSError:
            return
        for d in entries:
            m = re.fullmatch(r"agentrl-(?:host-)?(\d+)", d.name)
            if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
                _remove_tree(d)

    # -- public ------------------------------------------------------------------------------------
    @property
    def available(self) -> bool:
        self._probe()
        return self.version != 0

    def create(self, memory_bytes: int | None, max_pids: int | None) -> Cgroup | None:
        """A fresh group with the given limits (None = leave that controller unlimited); None if cgroups
        are unavailable. Raises OSError if writing a limit fails (the caller must not run unlimited)."""
        if not self.available:
            return None
        name = f"sb-{next(self._counter)}"
        dirs: dict[str, Path] = {}
        try:
            if self.version == 1:
                for ctrl, parent in self.parents.items():
                    d = parent / name
                    d.mkdir()
                    dirs[ctrl] = d
                if memory_bytes is not None:
                    _write(dirs["memory"] / "memory.limit_in_bytes", str(memory_bytes))
                    memsw = dirs["memory"] / "memory.memsw.limit_in_bytes"
                    if memsw.exists():  # swap accounting on: cap memory+swap at the same value
                        _write(memsw, str(memory_bytes))
                if max_pids is not None:
                    _write(dirs["pids"] / "pids.max", str(max_pids))
                procs = [dirs["memory"] / "cgroup.procs", dirs["pids"] / "cgroup.procs"]
            else:
                d = self.parents["unified"] / name
                d.mkdir()
                dirs["unified"] = d
                if memory_bytes is not None:
                    _write(d / "memory.max", str(memory_bytes))
                    if (d / "memory.swap.max").exists():
                        _write(d / "memory.swap.max", "0")
                if max_pids is not None:
                    _write(d / "pids.max", str(max_pids))
                procs = [d / "cgroup.procs"]
        except OSError:
            for d in dirs.values():
                _remove_tree(d)
            raise
        return Cgroup(self.version, dirs, procs)

    def cleanup(self) -> None:
        for d in self.parents.values():
            _remove_tree(d)

    def release(self) -> None:
        """Remove this process's groups (its sandboxes are closed by now) and the empty ones that dead
        agentrl processes left beside them; a later sandbox probes afresh."""
        bases = {d.parent for d in self.parents.values()}
        self.cleanup()
        for base in bases:
            self._sweep(base)
        self._probed, self.version, self.parents = False, 0, {}


_manager: CgroupManager | None = None


def manager() -> CgroupManager:
    """The process-wide manager (created on first use)."""
    global _manager
    if _manager is None:
        _manager = CgroupManager(os.environ.get("AGENTRL_CGROUP_PARENT") or None)
    return _manager
