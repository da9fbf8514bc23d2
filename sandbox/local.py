"""LocalSandbox: a persistent Python worker inside bubblewrap, with rlimits, cgroups and a seccomp deny-list.

Layout of one session (host side -> sandbox)::

    host (asyncio) --sh shim (joins the sandbox's cgroups, then execs)--> bwrap (outer monitor)
        └── [new user, pid, net, ipc, uts, cgroup namespaces]  pid 1: bwrap init (reaps)
              └── pid 2: python -I -S -c BOOTSTRAP   (the REPL worker, rlimits set before any user code)
                    └── anything the code spawns (killed with kill(-1) at the end of every call)

The host talks to the worker over two private pipes (requests in, result lines out); the code's stdout and
stderr are separate pipes the host reads, caps and decodes. The wall-clock deadline lives in the host. On a
timeout, a hard output overflow, a crash or a cancelled call, the host kills the namespace's init (and the
cgroup), which takes every process in the sandbox with it, and the next call starts a fresh worker.

This module decides what runs (the bubblewrap command line, the worker's configuration, the self-test);
``_worker_client.py`` runs it (pipes, pidfds, the kill path).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from agentrl.errors import ConfigError, SandboxError
from agentrl.execution import Limits

from . import _cgroup, _seccomp, _uids
from ._common import SessionBackend
from ._layout import SANDBOX_UID, python_layout, sandbox_env
from ._protocol import BOOTSTRAP, Outcome, worker_code
from ._worker_client import Call, LaunchFds, WorkerClient, WorkerLaunch
from .selftest import SelfTestReport, SelfTestTarget, ensure_self_test, run_self_test

__all__ = ["BWRAP_ENV", "LIMIT_NAMES", "LocalSandbox", "find_bwrap", "self_test"]


MiB = 1024 * 1024
LIMIT_NAMES = frozenset({"wall", "memory", "processes", "file_size", "network", "env", "seccomp"})
"""Names accepted by ``disable_limits`` (used to prove that the self-test fails closed)."""


BWRAP_ENV = "AGENTRL_BWRAP"
"""Environment variable naming the bubblewrap binary (e.g. one unpacked from its .deb with ``dpkg -x``)."""


def find_bwrap() -> str | None:
    """Path of the bubblewrap binary: ``$AGENTRL_BWRAP``, else ``bwrap`` on ``PATH``, else ``/usr/bin/bwrap``;
    None when none is there. A set but unusable ``$AGENTRL_BWRAP`` is an error, not a silent fallback."""
    given = os.environ.get(BWRAP_ENV, "").strip()
    if given:
        path = os.path.abspath(given)
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise ConfigError(f"{BWRAP_ENV}={given!r} is not an executable file")
        return path
    return shutil.which("bwrap") or ("/usr/bin/bwrap" if os.access("/usr/bin/bwrap", os.X_OK) else None)


# ---------------------------------------------------------------------------------------------------
class LocalSandbox(SessionBackend[WorkerClient]):
    """A stateful Python session in a bubblewrap sandbox on this machine (see the module docstring).

    Args:
        limits: the maximum limits; per-call requests (``run(timeout=...)``) can only lower them.
        unsafe: start even if the startup self-test finds a limit that does not trip. Never in training.
        env: extra environment variables for the sandbox (the default environment is an allow-list).
        ro_binds: host directories to expose read-only at the same path (e.g. a data set).
        max_code_bytes: larger code is rejected with status ``error`` before it reaches the sandbox.
        output_hard_cap: total stdout+stderr bytes after which a call is killed (``output_limit``).
        start_timeout: seconds allowed for a worker to start.
        disable_limits: names from :data:`LIMIT_NAMES` to switch off. Exists to prove that the self-test
            fails closed; a sandbox built with it refuses to start unless ``unsafe=True``.
        self_test: run (or reuse) the process-wide startup self-test before the first start.
        host_uids: when this process is root, each worker runs under its own unprivileged host uid from
            this range, so that ``RLIMIT_NPROC`` limits one sandbox's processes (it never applies to uid 0)
            even where no pids cgroup can be made. A :class:`~agentrl.sandbox._uids.UidRange`,
            ``"FIRST-LAST"`` or ``"off"``; default ``$AGENTRL_SANDBOX_UIDS``, else 2147000000-2147065535.
            Ignored when not root (the process's own uid is then not 0).
    """

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        unsafe: bool = False,
        env: Mapping[str, str] | None = None,
        ro_binds: Sequence[str | os.PathLike[str]] = (),
        max_code_bytes: int = 1 * MiB,
        output_hard_cap: int = 16 * MiB,
        start_timeout: float = 10.0,
        disable_limits: Collection[str] = (),
        self_test: bool = True,
        host_uids: _uids.UidRange | str | None = None,
    ):
        self._limits = limits if limits is not None else Limits()
        if not isinstance(self._limits, Limits):
            raise ConfigError(f"limits must be a Limits, got {type(limits).__name__}")
        if self._limits.network:
            raise ConfigError("LocalSandbox never enables network access; use Limits(network=False)")
        unknown = set(disable_limits) - LIMIT_NAMES
        if unknown:
            raise ConfigError(f"unknown limit names {sorted(unknown)}; known: {sorted(LIMIT_NAMES)}")
        if max_code_bytes <= 0 or output_hard_cap <= 0 or start_timeout <= 0:
            raise ConfigError("max_code_bytes, output_hard_cap and start_timeout must be positive")
        self._unsafe = bool(unsafe)
        self._disabled = frozenset(disable_limits)
        self._extra_env = dict(env or {})
        self._env = sandbox_env(self._limits, env)
        if "env" in self._disabled:
            self._env.update({k: v for k, v in os.environ.items() if "=" not in k})
        self._ro_binds = [os.path.abspath(os.fspath(p)) for p in ro_binds]
        for p in self._ro_binds:
            if not os.path.exists(p):
                raise ConfigError(f"ro_binds path does not exist: {p}")
        self._max_code_bytes = int(max_code_bytes)
        self._hard_cap = int(output_hard_cap)
        self._start_timeout = float(start_timeout)
        self._run_self_test = bool(self_test)
        self._seccomp = None if "seccomp" in self._disabled else _seccomp.deny_filter()
        self._uid_range = _uids.resolve(host_uids)
        self._uid_problem = _uids.unusable_reason(self._uid_range)
        closed = _uids.closed_to_others(self._ro_binds) if self.host_uids is not None else []
        if closed:
            raise ConfigError(
                f"ro_binds {closed} are not readable by other users: as root each sandbox runs under its own "
                f"unprivileged host uid ({_uids.ENV_VAR}), which reads them as 'other'. Make them readable "
                f"(chmod o+rX; closed parent directories such as /root are fine) or set {_uids.ENV_VAR}=off "
                "where a pids cgroup is writable"
            )
        super().__init__()

    # -- configuration -----------------------------------------------------------------------------
    @property
    def limits(self) -> Limits:
        """The maximum limits of this sandbox."""
        return self._limits

    @property
    def _worker(self) -> WorkerClient | None:
        """The running worker, if any (tests reach in to kill it)."""
        return self._session

    @property
    def host_uids(self) -> _uids.UidRange | None:
        """The host uid range workers run under, or None when they keep this process's uid."""
        return None if self._uid_problem else self._uid_range

    def config_key(self) -> tuple[Any, ...]:
        """What the self-test result depends on (limits differ only in size, so they are not part of it)."""
        return ("local", self._disabled, tuple(self._ro_binds), self.host_uids is not None)

    def self_test_target(self) -> SelfTestTarget:
        """This configuration as the self-test sees it: throw-away probes with the same options."""

        def probe(limits: Limits) -> LocalSandbox:
            return LocalSandbox(
                limits,
                unsafe=True,
                disable_limits=self._disabled,
                ro_binds=self._ro_binds,
                env=self._extra_env,
                self_test=False,
                host_uids=self._uid_range if self._uid_range is not None else "off",
            )

        return SelfTestTarget(
            self.config_key(), probe, extra_env=self._extra_env, unsafe=self._unsafe, advice=self._advice
        )

    def _advice(self, failed: Sequence[str]) -> str:
        """What the host lacks, and what to do, for the self-test checks that failed."""
        cg = _cgroup.manager()
        no_cgroup = "" if cg.available else f"no per-sandbox cgroup ({cg.reason})"
        uids = self.host_uids
        tips: list[str] = []
        if "processes" in failed:
            why = (
                "; ".join(x for x in (no_cgroup, self._uid_problem if os.geteuid() == 0 else "") if x)
                or "the pids cgroup or RLIMIT_NPROC did not stop a fork loop"
            )
            tips.append(
                f"nothing limits the number of processes here: {why}. Fix one of: run as root with "
                f"per-sandbox host uids ({_uids.ENV_VAR}=FIRST-LAST, on unless 'off'), run as an "
                "unprivileged user, point AGENTRL_CGROUP_PARENT at a writable cgroup v2 directory with "
                "the memory and pids controllers, or use DockerSandbox / E2BSandbox (sandbox/README.md, "
                "'Which host can run which backend')"
            )
        if "memory" in failed:
            tips.append(f"the memory limit did not trip: {no_cgroup or 'check RLIMIT_AS and the cgroup'}")
        if "start" in failed and uids is not None:
            closed = _uids.closed_to_others(python_layout()[1])
            if closed:
                tips.append(f"the interpreter's directories {closed} are not readable by other users")
            tips.append(
                f"as root the sandbox runs bubblewrap as an unprivileged uid from {uids}: that needs "
                "unprivileged user namespaces (sysctl user.max_user_namespaces > 0; on Ubuntu 24.04 an "
                "AppArmor profile for bwrap or kernel.apparmor_restrict_unprivileged_userns=0) and a "
                f"bwrap binary outside directories closed to other users ({BWRAP_ENV}); "
                f"{_uids.ENV_VAR}=off runs it as root instead (then a pids cgroup is required)"
            )
        return " | ".join(tips)

    def _launch(self) -> WorkerLaunch:
        lim = self._limits
        mem = None if "memory" in self._disabled else lim.memory_bytes + lim.scratch_bytes
        pids = None if "processes" in self._disabled else lim.max_processes
        uid = SANDBOX_UID
        passwd = (
            f"root:x:0:0::/:/usr/sbin/nologin\nsandbox:x:{uid}:{uid}::/tmp:/bin/sh\n"
            "nobody:x:65534:65534::/:/usr/sbin/nologin\n"
        )
        group = f"root:x:0:\nsandbox:x:{uid}:\nnogroup:x:65534:\n"
        return WorkerLaunch(
            argv=self._argv,
            config=self._worker_config(),
            hard_cap=self._hard_cap,
            data_files={"passwd": passwd.encode(), "group": group.encode()},
            seccomp=self._seccomp,
            cgroup=(mem, pids),
            host_uids=self.host_uids,
        )

    def _worker_config(self) -> dict[str, Any]:
        lim = self._limits
        rlimits: dict[str, int] = {"CORE": 0, "NOFILE": 256}
        if "memory" not in self._disabled:
            rlimits["AS"] = lim.memory_bytes
        if "file_size" not in self._disabled:
            rlimits["FSIZE"] = lim.file_size_bytes
        if "processes" not in self._disabled:
            # Counted per host uid: each worker's own when root switches uids (host_uids), this
            # process's when not root; ignored when the sandbox maps to host root (then only the pids
            # cgroup limits processes, and the self-test fails closed without one).
            rlimits["NPROC"] = lim.max_processes
        _, _, sys_path = python_layout()
        return {
            "mode": "fd",
            "rlimits": rlimits,
            "sys_path": sys_path,
            "kill_strays": True,
        }

    def _argv(self, fds: LaunchFds, cgroup: _cgroup.Cgroup | None, host_uid: int | None) -> list[str]:
        """The command line: the launcher (cgroups, host uid), then bubblewrap with the sandbox's layout,
        then the worker."""
        bwrap = find_bwrap()
        if bwrap is None:
            raise SandboxError(
                "bubblewrap (bwrap) is not installed; run `bash .ci/setup` or apt install bubblewrap"
            )
        exe, binds, _ = python_layout()
        lim = self._limits
        a: list[str] = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
        a += ["--unshare-cgroup-try", "--disable-userns"]
        if "network" not in self._disabled:
            a.append("--unshare-net")
        a += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
        a += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
        a += ["--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
            if os.path.islink(top):
                a += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                a += ["--ro-bind", top, top]
        for etc in ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives", "/etc/nsswitch.conf"):
            a += ["--ro-bind-try", etc, etc]
        a += ["--perms", "0444", "--ro-bind-data", str(fds.data["passwd"]), "/etc/passwd"]
        a += ["--perms", "0444", "--ro-bind-data", str(fds.data["group"]), "/etc/group"]
        a += ["--proc", "/proc", "--dev", "/dev"]
        a += ["--size", str(lim.scratch_bytes), "--perms", "1777", "--tmpfs", "/tmp"]
        a += ["--size", str(min(lim.scratch_bytes, 16 * MiB)), "--perms", "1777", "--tmpfs", "/dev/shm"]
        # Binds come after the scratch tmpfs so a venv or data set under /tmp stays visible.
        for b in [*binds, *self._ro_binds]:
            a += ["--ro-bind", b, b]
        a += ["--remount-ro", "/", "--chdir", "/tmp", "--clearenv"]
        for k, v in self._env.items():
            a += ["--setenv", k, v]
        a += ["--info-fd", str(fds.info_w)]
        if fds.seccomp >= 0:
            a += ["--seccomp", str(fds.seccomp)]
        a += ["--", exe, "-I", "-S", "-c", BOOTSTRAP, str(len(worker_code())), str(fds.ctl_r)]
        if host_uid is not None:
            # Root: join the cgroups, make the binds reachable, drop to the worker's own uid, exec bwrap.
            cfg = {
                "uid": host_uid,
                "cgroups": [str(f) for f in cgroup.procs_files] if cgroup is not None else [],
                "expose": _uids.blocked_dirs([*binds, *self._ro_binds, bwrap]),
            }
            return [exe, "-I", "-S", "-c", _uids.LAUNCHER, json.dumps(cfg), "--", *a]
        if cgroup is not None and cgroup.procs_files:
            # Join the cgroups *before* exec'ing bwrap so nothing in the sandbox ever runs outside them.
            shim = (
                'for f in "$@"; do [ "$f" = -- ] && break; echo $$ > "$f" || exit 125; shift; done; '
                'shift; exec "$@"'
            )
            a = ["/bin/sh", "-c", shim, "sh", *map(str, cgroup.procs_files), "--", *a]
        return a

    # -- lifecycle (start, reset, close: SessionBackend) ------------------------------------------
    async def _ensure(self) -> WorkerClient:
        """The running worker, started (after the process-wide self-test) when there is none."""
        if self._session is not None and not self._session.dead:
            return self._session
        if self._session is not None:
            await self._session.kill()
            self._session = None
            self._died_idle = True
        if self._run_self_test:
            await ensure_self_test(self.self_test_target())
        w = WorkerClient(self._launch())
        await w.start(self._start_timeout)
        if w.failed_limits and not self._unsafe:
            await w.kill()
            raise SandboxError(f"the sandbox could not apply rlimits {w.failed_limits}")
        self._session = w
        return w

    # -- one call (run: SessionBackend) ------------------------------------------------------------
    async def _call(self, session: WorkerClient, code: str, limits: Limits) -> tuple[Outcome, Call]:
        wall = 86400.0 if "wall" in self._disabled else limits.wall_s
        return await session.run(code, wall, self._calls, limits.output_bytes)

    def _abandon(self, session: WorkerClient) -> None:
        session.signal_kill()
        self._clean_up_later(session.cleanup())

    def __del__(self) -> None:
        w = getattr(self, "_session", None)
        if w is not None and not w.dead:
            with contextlib.suppress(Exception):
                w.signal_kill()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("running" if self._session else "idle")
        return f"LocalSandbox({state}, limits={self._limits})"


async def self_test(**sandbox_kwargs: Any) -> SelfTestReport:
    """Run the local backend's self-test now (uncached) and return the report; never raises for a failed
    limit. ``sandbox_kwargs`` are :class:`LocalSandbox` options such as ``disable_limits``."""
    return await run_self_test(LocalSandbox(self_test=False, **sandbox_kwargs).self_test_target())
