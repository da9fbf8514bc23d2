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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import sysconfig
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from agentrl.errors import ConfigError, SandboxError
from agentrl.execution import ExecResult, ExecStatus, Limits

from . import _cgroup, _seccomp
from ._common import SessionBackend, check_request
from ._output import Capture, decode
from ._protocol import BOOTSTRAP, Outcome, frame, parse_line, worker_code

__all__ = ["LIMIT_NAMES", "LocalSandbox"]

log = logging.getLogger(__name__)

MiB = 1024 * 1024
LIMIT_NAMES = frozenset({"wall", "memory", "processes", "file_size", "network", "env", "seccomp"})
"""Names accepted by ``disable_limits`` (used to prove that the self-test fails closed)."""

_SANDBOX_UID = 1000
_READ_CHUNK = 1 << 16
_BACKGROUND: set[asyncio.Task[Any]] = set()


def _spawn_background(coro: Any) -> None:
    task = asyncio.ensure_future(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


# ---------------------------------------------------------------------------------------------------
# Static configuration: what the sandbox sees.
def _python_layout() -> tuple[str, list[str], list[str]]:
    """(interpreter path, host dirs to bind read-only, sys.path entries) for this interpreter.

    We exec the venv's ``bin/python`` (never a pyenv shim: +100 ms per start) and bind the venv and the
    base installation read-only at their own paths, so symlinks and ``pyvenv.cfg`` resolve inside.
    """
    exe = os.path.abspath(sys.executable)
    binds: list[str] = []
    for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
        p = os.path.abspath(p)
        if not p.startswith("/usr/") and p != "/usr" and os.path.isdir(p):
            binds.append(p)
    real = os.path.realpath(exe)
    real_prefix = os.path.dirname(os.path.dirname(real))
    if not any(real.startswith(b + "/") for b in binds) and not real.startswith("/usr/"):
        binds.append(real_prefix)
    paths = sysconfig.get_paths()
    sys_path = []
    for key in ("purelib", "platlib"):
        site = paths.get(key)
        if site and os.path.isdir(site) and site not in sys_path:
            sys_path.append(site)
    # Drop nested duplicates so bwrap does not bind a directory twice.
    binds = sorted(set(binds))
    binds = [b for b in binds if not any(b != o and b.startswith(o + "/") for o in binds)]
    return exe, binds, sys_path


def _sandbox_env(limits: Limits, extra: Mapping[str, str] | None) -> dict[str, str]:
    threads = str(limits.cpu_threads)
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "PWD": "/tmp",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "MPLBACKEND": "Agg",
        "OMP_NUM_THREADS": threads,
        "OPENBLAS_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "NUMEXPR_NUM_THREADS": threads,
        "VECLIB_MAXIMUM_THREADS": threads,
        "RAYON_NUM_THREADS": threads,
    }
    if extra:
        for k, v in extra.items():
            if not isinstance(k, str) or not isinstance(v, str) or "=" in k or "\0" in k + v:
                raise ConfigError(f"sandbox env entries must be str -> str without '=' or NUL: {k!r}")
            env[k] = v
    return env


def _pipe() -> tuple[int, int]:
    return os.pipe2(os.O_CLOEXEC)


def _read_ready(fd: int) -> bytes | None:
    """Up to 4 KiB from a non-blocking pipe: None when nothing is there yet, b"" at EOF or on an error."""
    try:
        return os.read(fd, 4096)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def _data_fd(data: bytes) -> int:
    """A readable fd holding ``data`` (bubblewrap reads it to EOF)."""
    r, w = _pipe()
    try:
        view = memoryview(data)
        while view:
            n = os.write(w, view)
            view = view[n:]
    finally:
        os.close(w)
    return r


def find_bwrap() -> str | None:
    return shutil.which("bwrap") or ("/usr/bin/bwrap" if os.access("/usr/bin/bwrap", os.X_OK) else None)


# ---------------------------------------------------------------------------------------------------
class _Call:
    __slots__ = ("err", "fut", "id", "open", "out")

    def __init__(self, call_id: int, limit: int, fut: asyncio.Future[Outcome]):
        self.id = call_id
        self.open = True
        self.out = Capture(limit)
        self.err = Capture(limit)
        self.fut = fut


class _Worker:
    """One running worker: the process, its pipes, and the kill path. Owned by one LocalSandbox."""

    def __init__(self, sandbox: LocalSandbox):
        self.sb = sandbox
        self.loop = asyncio.get_running_loop()
        self.proc: asyncio.subprocess.Process | None = None
        self.cgroup: _cgroup.Cgroup | None = None
        self.ctl_w = self.res_r = self.out_r = self.err_r = self.info_r = -1
        self.pidfd = -1
        self.outer_pidfd = -1
        self.res_buf = bytearray()
        self.info_buf = bytearray()
        self.startup_err = bytearray()
        self.ready: asyncio.Future[dict[str, Any]] = self.loop.create_future()
        self.info_done: asyncio.Future[None] = self.loop.create_future()
        self.call: _Call | None = None
        self.dead = False
        self.killed_by_us = False
        self.oom_at_start = 0
        self.waiter: asyncio.Task[int] | None = None
        self.failed_limits: list[str] = []

    # -- spawning ----------------------------------------------------------------------------------
    async def start(self, timeout: float) -> None:
        sb = self.sb
        lim = sb._limits
        child_fds: list[int] = []
        try:
            if sb._use_cgroups:
                mem = None if "memory" in sb._disabled else lim.memory_bytes + lim.scratch_bytes
                pids = None if "processes" in sb._disabled else lim.max_processes
                self.cgroup = _cgroup.manager().create(mem, pids)
                self.oom_at_start = self.cgroup.oom_kills() if self.cgroup else 0
            ctl_r, self.ctl_w = _pipe()
            self.res_r, res_w = _pipe()
            self.out_r, out_w = _pipe()
            self.err_r, err_w = _pipe()
            self.info_r, info_w = _pipe()
            child_fds += [ctl_r, res_w, out_w, err_w, info_w]
            data_fds = {
                "passwd": _data_fd(
                    f"root:x:0:0::/:/usr/sbin/nologin\nsandbox:x:{_SANDBOX_UID}:{_SANDBOX_UID}::/tmp:/bin/sh\n"
                    "nobody:x:65534:65534::/:/usr/sbin/nologin\n".encode()
                ),
                "group": _data_fd(f"root:x:0:\nsandbox:x:{_SANDBOX_UID}:\nnogroup:x:65534:\n".encode()),
            }
            child_fds += list(data_fds.values())
            seccomp_fd = -1
            if sb._seccomp is not None:
                seccomp_fd = _data_fd(sb._seccomp)
                child_fds.append(seccomp_fd)
            argv = sb._argv(ctl_r, res_w, info_w, data_fds, seccomp_fd, self.cgroup)
            self.proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                pass_fds=child_fds,
                env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8"},
                close_fds=True,
            )
        except BaseException:
            for fd in child_fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            await self._cleanup()
            raise
        for fd in child_fds:
            os.close(fd)
        # Signal our child through a pidfd: Popen.kill() would poll() and reap it behind asyncio's back,
        # and a bare os.kill() after the child watcher reaped it could hit a recycled PID.
        with contextlib.suppress(OSError):
            self.outer_pidfd = os.pidfd_open(self.proc.pid)
        for fd in (self.res_r, self.out_r, self.err_r, self.info_r, self.ctl_w):
            os.set_blocking(fd, False)
        self.loop.add_reader(self.res_r, self._on_res)
        self.loop.add_reader(self.out_r, self._on_stream, self.out_r, False)
        self.loop.add_reader(self.err_r, self._on_stream, self.err_r, True)
        self.loop.add_reader(self.info_r, self._on_info)
        self.waiter = asyncio.ensure_future(self.proc.wait())
        self.waiter.add_done_callback(self._on_exit)
        try:
            # The bootstrap reads the marshalled worker first; the worker then reads its configuration.
            await self._write(worker_code(), timeout)
            await self._write(frame({**sb._worker_config(), "res_fd": res_w}), timeout)
            ready = await asyncio.wait_for(asyncio.shield(self.ready), timeout)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.info_done), 1.0)
        except BaseException as e:
            text = decode(self.startup_err).strip()
            await self.kill()
            if isinstance(e, asyncio.CancelledError):
                raise
            if isinstance(e, TimeoutError):
                raise SandboxError(
                    f"the sandbox did not start within {timeout:g} s" + (f": {text}" if text else "")
                ) from None
            raise SandboxError(f"the sandbox failed to start: {text or e}") from None
        self.failed_limits = list(ready.get("failed", []))

    async def _write(self, data: bytes, timeout: float) -> None:
        """Write everything to the control pipe without blocking the loop."""
        view = memoryview(data)
        deadline = self.loop.time() + timeout
        while view:
            if self.dead:
                raise SandboxError("the worker exited while receiving input")
            try:
                n = os.write(self.ctl_w, view)
                view = view[n:]
                continue
            except BlockingIOError:
                pass
            except BrokenPipeError:
                raise SandboxError("the worker closed its input") from None
            fut: asyncio.Future[None] = self.loop.create_future()

            def writable(f: asyncio.Future[None] = fut) -> None:
                if not f.done():
                    f.set_result(None)

            self.loop.add_writer(self.ctl_w, writable)
            try:
                remaining = deadline - self.loop.time()
                if remaining <= 0:
                    raise TimeoutError
                await asyncio.wait_for(fut, remaining)
            finally:
                self.loop.remove_writer(self.ctl_w)

    # -- readers -------------------------------------------------------------------------------------
    def _drain(self, fd: int, is_err: bool) -> bool:
        """Read what is available; False on EOF."""
        for _ in range(64):  # at most 4 MiB per callback, so one chatty sandbox cannot starve the loop
            try:
                data = os.read(fd, _READ_CHUNK)
            except BlockingIOError:
                return True
            except OSError:
                data = b""
            if not data:
                self.loop.remove_reader(fd)
                return False
            call = self.call
            if call is not None and call.open:
                (call.err if is_err else call.out).feed(data)
                if call.out.total + call.err.total > self.sb._hard_cap:
                    call.open = False
                    if not call.fut.done():
                        call.fut.set_result(Outcome("output_limit"))
            elif self.call is None and is_err and not self.ready.done() and len(self.startup_err) < 8192:
                # bubblewrap's own complaints before the worker runs explain a failed start.
                self.startup_err += data[:8192]
        return True

    def _on_stream(self, fd: int, is_err: bool) -> None:
        self._drain(fd, is_err)

    def _on_info(self) -> None:
        data = _read_ready(self.info_r)
        if data is None:
            return
        if data:
            self.info_buf += data
            if len(self.info_buf) < 65536:
                return
        self.loop.remove_reader(self.info_r)
        try:
            info = json.loads(bytes(self.info_buf) or b"{}")
            child = int(info.get("child-pid", 0))
        except (ValueError, TypeError, AttributeError):
            child = 0
        if child > 0 and self.proc is not None:
            self._open_pidfd(child, self.proc.pid)
        if not self.info_done.done():
            self.info_done.set_result(None)

    def _open_pidfd(self, child: int, parent: int) -> None:
        """A pidfd for the namespace's init, checked to be our bwrap's child (no PID-reuse accidents)."""
        try:
            fd = os.pidfd_open(child)
        except (OSError, AttributeError):
            return
        try:
            with open(f"/proc/{child}/stat", "rb") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            ppid = -1
        if ppid == parent:
            self.pidfd = fd
        else:
            os.close(fd)

    def _on_res(self) -> None:
        data = _read_ready(self.res_r)
        if data is None:
            return
        if not data:
            self.loop.remove_reader(self.res_r)
            self._mark_dead()
            return
        self.res_buf += data
        while b"\n" in self.res_buf:
            line, _, rest = bytes(self.res_buf).partition(b"\n")
            self.res_buf = bytearray(rest)
            self._on_line(line)
        if len(self.res_buf) > 4096:
            self._protocol_violation()

    def _on_line(self, line: bytes) -> None:
        msg = parse_line(line)
        if msg is None:
            self._protocol_violation()
            return
        if not self.ready.done():
            if msg.get("ready") == 1:
                self.ready.set_result(msg)
            else:
                self._protocol_violation()
            return
        call = self.call
        if call is None or call.fut.done() or msg.get("id") != call.id:
            self._protocol_violation()
            return
        status = msg.get("status")
        if status not in ("ok", "error", "oom", "exit"):
            self._protocol_violation()
            return
        exit_code = msg.get("exit_code")
        # Everything the worker wrote before this line is already in the pipes: take it now, exactly.
        self._drain(self.out_r, False)
        self._drain(self.err_r, True)
        if not call.fut.done():
            call.fut.set_result(Outcome("frame", status, exit_code if isinstance(exit_code, int) else None))

    def _protocol_violation(self) -> None:
        call = self.call
        if call is not None and not call.fut.done():
            call.fut.set_result(Outcome("protocol"))
        elif not self.ready.done():
            self.ready.set_exception(SandboxError("the worker sent a malformed greeting"))

    def _mark_dead(self) -> None:
        if self.dead:
            return
        self.dead = True
        self._settle_on_death()

    def _on_exit(self, _task: asyncio.Task[int]) -> None:
        self.dead = True
        self._settle_on_death()

    def _settle_on_death(self) -> None:
        if not self.ready.done():
            self.ready.set_exception(SandboxError("the worker exited during start-up"))
        call = self.call
        if call is None or call.fut.done():
            return
        # The exit status may lag the EOF on the result pipe; resolve once the process is reaped.
        if self.proc is None or self.proc.returncode is None:
            return
        self._drain(self.out_r, False)
        self._drain(self.err_r, True)
        call.fut.set_result(self._death_outcome())

    def _death_outcome(self) -> Outcome:
        rc = self.proc.returncode if self.proc is not None else None
        oom = self.cgroup is not None and self.cgroup.oom_kills() > self.oom_at_start
        if rc is None:
            return Outcome("infra", detail="the worker vanished")
        if rc < 0 and not self.killed_by_us:
            return Outcome(
                "infra",
                detail=f"the sandbox was killed from outside (signal {-rc}) while the code ran",
            )
        if oom:
            return Outcome("died", oom_killed=True, exit_code=rc)
        if 128 < rc <= 128 + 64:
            return Outcome("died", signal=rc - 128, exit_code=rc)
        return Outcome("died", exit_code=rc)

    # -- calls -------------------------------------------------------------------------------------
    async def run(self, code: str, wall: float, call_id: int, output_bytes: int) -> tuple[Outcome, _Call]:
        fut: asyncio.Future[Outcome] = self.loop.create_future()
        call = _Call(call_id, output_bytes, fut)
        self.call = call
        deadline = self.loop.time() + wall
        try:
            try:
                await self._write(frame({"op": "run", "id": call_id, "code": code, "wall": wall}), wall)
            except SandboxError:
                pass  # the worker is dead; the death callback settles ``fut``
            except TimeoutError:
                if not fut.done():
                    fut.set_result(Outcome("timeout"))
            if self.dead:
                self._settle_on_death()
            remaining = max(0.0, deadline - self.loop.time())
            try:
                outcome = await asyncio.wait_for(asyncio.shield(fut), remaining)
            except TimeoutError:
                if fut.done():
                    outcome = fut.result()
                else:
                    fut.set_result(Outcome("timeout"))
                    outcome = fut.result()
            if outcome.kind in ("timeout", "protocol"):
                # Keep what the code printed before it was stopped (partial output of a timeout).
                self._drain(self.out_r, False)
                self._drain(self.err_r, True)
            if outcome.kind == "died" or (outcome.kind == "frame" and outcome.status == "exit"):
                # Let the process finish so the exit status and cgroup OOM counter are final.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self.waiter), 2.0)  # type: ignore[arg-type]
                if outcome.kind == "died":
                    outcome = self._death_outcome()
            return outcome, call
        finally:
            call.open = False
            self.call = None

    # -- teardown ----------------------------------------------------------------------------------
    def signal_kill(self) -> None:
        """Send every SIGKILL now (synchronous, so it also works from a cancelled task)."""
        self.killed_by_us = True
        if self.pidfd >= 0:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        if self.outer_pidfd >= 0:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.outer_pidfd, signal.SIGKILL)
        elif self.proc is not None and self.proc.returncode is None:  # kernel without pidfds
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        if self.cgroup is not None:
            self.cgroup.kill_all()

    async def kill(self) -> None:
        self.signal_kill()
        await self._cleanup()

    async def _cleanup(self) -> None:
        if self.waiter is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self.waiter), 5.0)
            except TimeoutError:
                log.warning("sandbox process %s did not exit after SIGKILL", self.proc and self.proc.pid)
        for fd in (self.res_r, self.out_r, self.err_r, self.info_r):
            if fd >= 0:
                self.loop.remove_reader(fd)
        if self.ctl_w >= 0:
            self.loop.remove_writer(self.ctl_w)
        for name in ("ctl_w", "res_r", "out_r", "err_r", "info_r", "pidfd", "outer_pidfd"):
            fd = getattr(self, name)
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, -1)
        if self.cgroup is not None:
            cg, self.cgroup = self.cgroup, None
            for _ in range(200):
                if cg.remove():
                    break
                cg.kill_all()
                await asyncio.sleep(0.005)
            else:
                log.warning("could not remove sandbox cgroup %s", cg.dirs)


# ---------------------------------------------------------------------------------------------------
class LocalSandbox(SessionBackend[_Worker]):
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
        self._env = _sandbox_env(self._limits, env)
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
        self._use_cgroups = True
        self._started_once = False
        super().__init__()

    # -- configuration -----------------------------------------------------------------------------
    @property
    def limits(self) -> Limits:
        """The maximum limits of this sandbox."""
        return self._limits

    @property
    def _worker(self) -> _Worker | None:
        """The running worker, if any (tests reach in to kill it)."""
        return self._session

    def config_key(self) -> tuple[Any, ...]:
        """What the self-test result depends on (limits differ only in size, so they are not part of it)."""
        return ("local", self._disabled, tuple(self._ro_binds))

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
        _, _, sys_path = _python_layout()
        return {
            "mode": "fd",
            "rlimits": rlimits,
            "sys_path": sys_path,
            "kill_strays": True,
        }

    def _argv(
        self,
        ctl_r: int,
        res_w: int,
        info_w: int,
        data_fds: Mapping[str, int],
        seccomp_fd: int,
        cgroup: _cgroup.Cgroup | None,
    ) -> list[str]:
        bwrap = find_bwrap()
        if bwrap is None:
            raise SandboxError(
                "bubblewrap (bwrap) is not installed; run `bash .ci/setup` or apt install bubblewrap"
            )
        exe, binds, _ = _python_layout()
        lim = self._limits
        a: list[str] = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
        a += ["--unshare-cgroup-try", "--disable-userns"]
        if "network" not in self._disabled:
            a.append("--unshare-net")
        a += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
        a += ["--uid", str(_SANDBOX_UID), "--gid", str(_SANDBOX_UID)]
        a += ["--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
            if os.path.islink(top):
                a += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                a += ["--ro-bind", top, top]
        for etc in ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives", "/etc/nsswitch.conf"):
            a += ["--ro-bind-try", etc, etc]
        a += ["--perms", "0444", "--ro-bind-data", str(data_fds["passwd"]), "/etc/passwd"]
        a += ["--perms", "0444", "--ro-bind-data", str(data_fds["group"]), "/etc/group"]
        a += ["--proc", "/proc", "--dev", "/dev"]
        a += ["--size", str(lim.scratch_bytes), "--perms", "1777", "--tmpfs", "/tmp"]
        a += ["--size", str(min(lim.scratch_bytes, 16 * MiB)), "--perms", "1777", "--tmpfs", "/dev/shm"]
        # Binds come after the scratch tmpfs so a venv or data set under /tmp stays visible.
        for b in [*binds, *self._ro_binds]:
            a += ["--ro-bind", b, b]
        a += ["--remount-ro", "/", "--chdir", "/tmp", "--clearenv"]
        for k, v in self._env.items():
            a += ["--setenv", k, v]
        a += ["--info-fd", str(info_w)]
        if seccomp_fd >= 0:
            a += ["--seccomp", str(seccomp_fd)]
        a += ["--", exe, "-I", "-S", "-c", BOOTSTRAP, str(len(worker_code())), str(ctl_r)]
        if cgroup is not None and cgroup.procs_files:
            # Join the cgroups *before* exec'ing bwrap so nothing in the sandbox ever runs outside them.
            shim = (
                'for f in "$@"; do [ "$f" = -- ] && break; echo $$ > "$f" || exit 125; shift; done; '
                'shift; exec "$@"'
            )
            a = ["/bin/sh", "-c", shim, "sh", *map(str, cgroup.procs_files), "--", *a]
        return a

    # -- lifecycle (start, reset, close: SessionBackend) ------------------------------------------
    async def _ensure(self) -> _Worker:
        """The running worker, started (after the process-wide self-test) when there is none."""
        if self._session is not None and not self._session.dead:
            return self._session
        if self._session is not None:
            await self._session.kill()
            self._session = None
            self._died_idle = True
        if self._run_self_test:
            from .selftest import ensure_self_test

            await ensure_self_test(self)
        w = _Worker(self)
        await w.start(self._start_timeout)
        if w.failed_limits and not self._unsafe:
            await w.kill()
            raise SandboxError(f"the sandbox could not apply rlimits {w.failed_limits}")
        self._session = w
        self._started_once = True
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
                _spawn_background(worker._cleanup())
                raise
            except Exception as e:  # the machinery, never the code
                log.exception("sandbox call failed")
                await worker.kill()
                self._session = None
                return ExecResult(
                    ExecStatus.SANDBOX_ERROR,
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
