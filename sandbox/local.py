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

import asyncio
import contextlib
import logging
import os
import shutil
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from agentrl.errors import ConfigError, SandboxError
from agentrl.execution import ExecResult, Limits
from agentrl.types import ToolStatus

from . import _cgroup, _seccomp
from ._common import SessionBackend, check_request, spawn_background
from ._layout import SANDBOX_UID, python_layout, sandbox_env
from ._protocol import BOOTSTRAP, worker_code
from ._worker_client import LaunchFds, WorkerClient, WorkerLaunch
from .selftest import SelfTestReport, SelfTestTarget, ensure_self_test, run_self_test

__all__ = ["LIMIT_NAMES", "LocalSandbox", "find_bwrap", "self_test"]

log = logging.getLogger(__name__)

MiB = 1024 * 1024
LIMIT_NAMES = frozenset({"wall", "memory", "processes", "file_size", "network", "env", "seccomp"})
"""Names accepted by ``disable_limits`` (used to prove that the self-test fails closed)."""


def find_bwrap() -> str | None:
    """Path of the bubblewrap binary, or None when it is not installed."""
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

    def config_key(self) -> tuple[Any, ...]:
        """What the self-test result depends on (limits differ only in size, so they are not part of it)."""
        return ("local", self._disabled, tuple(self._ro_binds))

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
            )

        return SelfTestTarget(self.config_key(), probe, extra_env=self._extra_env, unsafe=self._unsafe)

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
        )

    def _worker_config(self) -> dict[str, Any]:
        lim = self._limits
        rlimits: dict[str, int] = {"CORE": 0, "NOFILE": 256}
        if "memory" not in self._disabled:
            rlimits["AS"] = lim.memory_bytes
        if "file_size" not in self._disabled:
            rlimits["FSIZE"] = lim.file_size_bytes
        if "processes" not in self._disabled:
            # Counted per user namespace here; ignored when the sandbox maps to host root (the pids
            # cgroup covers that case).
            rlimits["NPROC"] = lim.max_processes
        _, _, sys_path = python_layout()
        return {
            "mode": "fd",
            "rlimits": rlimits,
            "sys_path": sys_path,
            "kill_strays": True,
        }

    def _argv(self, fds: LaunchFds, cgroup: _cgroup.Cgroup | None) -> list[str]:
        """The command line: the cgroup shim, then bubblewrap with the sandbox's layout, then the worker."""
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

    async def run(self, code: str, *, timeout: float | None = None) -> ExecResult:
        """Run ``code`` in the session; see :class:`agentrl.protocols.Sandbox`."""
        t0 = time.perf_counter()
        limits = check_request(
            code,
            timeout,
            limits=self._limits,
            closed=self._closed,
            max_code_bytes=self._max_code_bytes,
            started=t0,
        )
        if isinstance(limits, ExecResult):
            return limits
        async with self._get_lock():
            begun = await self._begin_call(t0)
            if isinstance(begun, ExecResult):
                return begun
            worker, lost_before = begun
            try:
                wall = 86400.0 if "wall" in self._disabled else limits.wall_s
                outcome, call = await worker.run(code, wall, self._calls, limits.output_bytes)
            except asyncio.CancelledError:
                worker.signal_kill()
                self._session = None
                spawn_background(worker.cleanup())
                raise
            except Exception as e:  # the machinery, never the code
                log.exception("sandbox call failed")
                await worker.kill()
                self._session = None
                return ExecResult(
                    ToolStatus.SANDBOX_ERROR,
                    message=f"Sandbox failure (not the code's fault): {e!r}",
                    duration_s=time.perf_counter() - t0,
                    state_lost=True,
                )
            return await self._end_call(worker, outcome, call, limits=limits, t0=t0, lost_before=lost_before)

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
