"""Per-sandbox host uids: how a trainer running as root still gets a process limit without cgroups.

``RLIMIT_NPROC`` never applies to uid 0, and a sandbox started by root maps its user to host uid 0. So when
this process is root, each local sandbox worker runs under its *own* unprivileged host uid, taken from a
range (:data:`DEFAULT_RANGE`, or ``AGENTRL_SANDBOX_UIDS=FIRST-LAST``, or ``LocalSandbox(host_uids=...)``;
``off`` disables it). ``RLIMIT_NPROC`` then counts exactly one sandbox's processes, and the code does not
run as host root even in the kernel's eyes. A uid is held by one worker at a time, in this process
(a set) and across processes on the host (a byte-range lock per uid on one lock file), and handed out
round-robin, so a uid comes back only after the whole range has been used once.

The launcher (:data:`LAUNCHER`, a ``python -I -S`` one-shot run as root) does, in order: join the
sandbox's cgroups (needs root), make the paths the sandbox binds reachable to the new uid, drop to that
uid (groups cleared, no capabilities left), and exec bubblewrap, which then sets the sandbox up as an
ordinary user. Reachable: bubblewrap resolves bind sources with the caller's permissions, and a typical
interpreter lives under ``/root`` (mode 0700). For each such blocked directory the launcher, in a mount
namespace of its own (private: the host's mounts are unchanged), mounts an empty read-only tmpfs over the
blocked directory and binds back only the paths the sandbox needs. Nothing on the host is chmod'ed,
chowned or made writable; the uid owns no file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from agentrl.errors import ConfigError, SandboxError

__all__ = [
    "DEFAULT_RANGE",
    "ENV_VAR",
    "LAUNCHER",
    "UidLease",
    "UidRange",
    "allocator",
    "blocked_dirs",
    "closed_to_others",
    "resolve",
    "unusable_reason",
]

ENV_VAR = "AGENTRL_SANDBOX_UIDS"


@dataclass(frozen=True, slots=True)
class UidRange:
    """Host uids (and gids, the same numbers) for sandboxes, ``first`` to ``last`` inclusive."""

    first: int
    """The lowest uid of the range."""
    last: int
    """The highest uid of the range (inclusive)."""

    def __post_init__(self) -> None:
        if not 0 < self.first <= self.last < 2**32 - 1:
            raise ConfigError(
                f"sandbox uid range {self.first}-{self.last} must satisfy 0 < first <= last < 4294967295"
            )

    @property
    def size(self) -> int:
        """How many uids the range holds (the most sandbox workers alive at once on the host)."""
        return self.last - self.first + 1

    @classmethod
    def parse(cls, text: str) -> UidRange | None:
        """``"FIRST-LAST"`` to a range; ``"off"`` (or ``"0"``, ``"none"``) to None."""
        t = text.strip().lower()
        if t in ("off", "0", "none", "no", "false"):
            return None
        first, sep, last = t.partition("-")
        if not sep or not first.strip().isdigit() or not last.strip().isdigit():
            raise ConfigError(
                f"sandbox uid range {text!r}: expected FIRST-LAST (e.g. 2147000000-2147065535) or off"
            )
        return cls(int(first), int(last))

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"


DEFAULT_RANGE = UidRange(2_147_000_000, 2_147_065_535)
"""65,536 uids just below 2**31: far above any account, container subuid range (100000+) or systemd
dynamic user (61184-65519), and still a positive 32-bit number for tools that read uids as signed."""


def resolve(value: UidRange | str | None) -> UidRange | None:
    """The range a sandbox uses: ``value`` when given (a range, ``"FIRST-LAST"`` or ``"off"``), else
    ``$AGENTRL_SANDBOX_UIDS``, else :data:`DEFAULT_RANGE`."""
    if isinstance(value, UidRange):
        return value
    if value is None:
        value = os.environ.get(ENV_VAR, "").strip() or str(DEFAULT_RANGE)
    if not isinstance(value, str):
        raise ConfigError(f"host_uids must be a UidRange, 'FIRST-LAST' or 'off', got {value!r}")
    return UidRange.parse(value)


def unusable_reason(r: UidRange | None) -> str:
    """Why switching to uids of ``r`` cannot work in this process ("" when it can)."""
    if r is None:
        return f"host uid switching is off ({ENV_VAR}=off or host_uids='off')"
    if os.geteuid() != 0:
        return "this process is not root, so it cannot switch uids (and needs not: its own uid is not 0)"
    try:
        lines = Path("/proc/self/uid_map").read_text().split()
        spans = [(int(lines[i]), int(lines[i + 2])) for i in range(0, len(lines) - 2, 3)]
    except (OSError, ValueError):
        return ""
    if not any(lo <= r.first and r.last < lo + n for lo, n in spans):
        return (
            f"the sandbox uid range {r} is not mapped in this user namespace (/proc/self/uid_map: "
            f"{spans}); set {ENV_VAR} to a range inside it"
        )
    return ""


# -- allocation ------------------------------------------------------------------------------------
def _lock_path() -> str:
    """A root-only lock file shared by every agentrl process on the host."""
    for d in ("/run", "/var/run", "/tmp"):
        if os.path.isdir(d) and os.access(d, os.W_OK):
            return os.path.join(d, "agentrl-sandbox-uids.lock")
    raise SandboxError("no writable /run or /tmp for the sandbox uid lock file")


@dataclass(eq=False)
class UidLease:
    """One uid held for one sandbox worker; :meth:`release` gives it back (idempotent)."""

    uid: int
    """The host uid (and gid) the worker runs as."""
    _owner: _Allocator

    def release(self) -> None:
        """Give the uid back; call only after every process of the worker has exited."""
        self._owner.release(self.uid)


class _Allocator:
    def __init__(self, r: UidRange):
        self.range = r
        self._lock = threading.Lock()
        self._held: set[int] = set()
        self._next = random.randrange(r.size)  # processes start at different places: fewer collisions
        self._fd = -1
        self._pid = -1

    def _file(self) -> int:
        if self._fd < 0 or self._pid != os.getpid():
            if self._pid != os.getpid():
                self._held.clear()  # a forked child holds none of its parent's locks
            path = _lock_path()
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            st = os.fstat(fd)
            if st.st_uid != 0 or not stat.S_ISREG(st.st_mode) or st.st_mode & 0o022:
                os.close(fd)
                raise SandboxError(f"{path} must be a regular file owned by root and not writable by others")
            # Record locks belong to the process and vanish on any close of the file: keep this fd
            # open for the life of the process (a forked child opens its own).
            self._fd, self._pid = fd, os.getpid()
        return self._fd

    def acquire(self) -> UidLease:
        with self._lock:
            fd = self._file()
            n = self.range.size
            for _ in range(n):
                k = self._next
                self._next = (k + 1) % n
                uid = self.range.first + k
                if uid in self._held:
                    continue
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, k)
                except OSError:
                    continue  # held by another process on this host
                self._held.add(uid)
                return UidLease(uid, self)
        raise SandboxError(
            f"all {n} sandbox uids of {self.range} are in use; widen {ENV_VAR} or run fewer sandboxes"
        )

    def release(self, uid: int) -> None:
        with self._lock:
            if uid not in self._held:
                return
            self._held.discard(uid)
            if self._fd >= 0 and self._pid == os.getpid():
                with contextlib.suppress(OSError):
                    fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, uid - self.range.first)


_allocators: dict[UidRange, _Allocator] = {}
_allocators_lock = threading.Lock()


def allocator(r: UidRange) -> _Allocator:
    """The process-wide allocator for ``r``."""
    with _allocators_lock:
        if r not in _allocators:
            _allocators[r] = _Allocator(r)
        return _allocators[r]


# -- reachability ----------------------------------------------------------------------------------
def blocked_dirs(paths: list[str]) -> dict[str, list[str]]:
    """For the paths a sandbox binds (or executes): blocked directory -> the paths under it to expose.

    A directory is blocked when a fresh uid (neither owner nor in the group) cannot search it: its
    "other" execute bit is off. The outermost blocked ancestor of each path is returned, so one tmpfs
    covers it. Paths with no blocked ancestor are left alone."""
    out: dict[str, list[str]] = {}
    for p in paths:
        parts = Path(p).parts
        for i in range(2, len(parts)):
            d = str(Path(*parts[:i]))
            try:
                mode = os.stat(d).st_mode
            except OSError:
                break
            if not mode & stat.S_IXOTH:
                out.setdefault(d, [])
                if p not in out[d]:
                    out[d].append(p)
                break
    return out


def closed_to_others(paths: list[str]) -> list[str]:
    """The paths a fresh uid could not read itself (files without o+r, directories without o+rx): what a
    sandbox binds must be readable by "other", since a worker's uid is nobody's owner or group."""
    out = []
    for p in paths:
        try:
            mode = os.stat(p).st_mode
        except OSError:
            continue
        need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
        if mode & need != need:
            out.append(f"{p} (mode {stat.S_IMODE(mode):04o})")
    return out


# Run as root by ``python -I -S -c LAUNCHER CONFIG_JSON -- ARGV...``. Fails with exit status 125 and a
# message on stderr (which the host shows as the start failure) rather than ever running ARGV half-set-up.
LAUNCHER = r"""
import json, os, sys
def die(msg):
    os.write(2, ("agentrl sandbox launcher: %s\n" % msg).encode()); os._exit(125)
cfg = json.loads(sys.argv[1]); argv = sys.argv[3:]
pid = str(os.getpid())
for f in cfg["cgroups"]:
    try:
        with open(f, "w") as fh: fh.write(pid)
    except OSError as e: die("cannot join cgroup %s: %s" % (f, e))
if cfg["expose"]:
    import ctypes  # only here: importing it costs more than the rest of the launcher
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    libc.unshare.argtypes = [ctypes.c_int]
    def call(rc, what):
        if rc != 0: die("%s: %s" % (what, os.strerror(ctypes.get_errno())))
    RDONLY, NOSUID, NODEV, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
    call(libc.unshare(0x00020000), "unshare(CLONE_NEWNS)")
    call(libc.mount(None, b"/", None, REC | PRIVATE, None), "make / private")
    # Opened in the new namespace (a bind source must be a mount of the caller's namespace), before the
    # tmpfs hides them.
    keep = {p: os.open(p, os.O_PATH | os.O_CLOEXEC) for paths in cfg["expose"].values() for p in paths}
    for d, paths in cfg["expose"].items():
        opts = b"mode=0755,size=64k"
        call(libc.mount(b"none", d.encode(), b"tmpfs", NOSUID | NODEV, opts), "tmpfs on " + d)
        for p in paths:
            if os.path.isdir("/proc/self/fd/%d" % keep[p]): os.makedirs(p, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(p), exist_ok=True); open(p, "w").close()
            src = ("/proc/self/fd/%d" % keep[p]).encode()
            call(libc.mount(src, p.encode(), None, BIND | REC, None), "bind " + p)
        flags = REMOUNT | BIND | RDONLY | NOSUID | NODEV
        call(libc.mount(None, d.encode(), None, flags, None), "read-only " + d)
    for fd in keep.values(): os.close(fd)
uid = cfg["uid"]
try:
    os.setgroups([]); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid)
except OSError as e: die("cannot switch to uid %d: %s" % (uid, e))
if os.getuid() != uid or os.geteuid() != uid or os.getgroups(): die("uid switch did not stick")
with open("/proc/self/status") as fh:
    caps = [l.split()[1] for l in fh if l.startswith(("CapPrm:", "CapEff:", "CapAmb:"))]
if any(int(c, 16) for c in caps): die("capabilities survived the uid switch: %s" % caps)
try: os.execv(argv[0], argv)
except OSError as e: die("cannot run %s as uid %d: %s" % (argv[0], uid, e))
"""
