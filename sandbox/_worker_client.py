"""The host side of one local sandbox worker: spawn it, talk to it over pipes, kill it through pidfds.

``LocalSandbox`` decides *what* runs (the bubblewrap command line, the worker's configuration, the limits);
this module runs it, given a :class:`WorkerLaunch`:

* five private pipes: control (requests in), result lines out, the code's stdout and stderr, and
  bubblewrap's ``--info-fd`` (which reports the PID of the sandbox's init);
* small data files (``/etc/passwd``, the seccomp filter) handed over as readable fds;
* the process joins a fresh cgroup (memory, pids) before it execs, when cgroups are writable;
* every read is non-blocking and driven by the event loop; stdout/stderr are capped while they stream;
* kills go through pidfds (never a bare PID that could have been recycled), then the cgroup.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrl.errors import SandboxError

from . import _cgroup, _uids
from ._output import Capture, decode
from ._protocol import Outcome, frame, parse_line, worker_code

__all__ = ["Call", "LaunchFds", "WorkerClient", "WorkerLaunch"]

log = logging.getLogger(__name__)

_READ_CHUNK = 1 << 16


@dataclass(frozen=True, slots=True)
class LaunchFds:
    """The child's ends of the pipes and data fds, as the launcher's command line must name them."""

    ctl_r: int
    """The worker reads requests (and, first, its own code and configuration) here."""
    res_w: int
    """The worker writes one result line per call here."""
    info_w: int
    """Bubblewrap writes its ``--info-fd`` JSON (the sandbox init's PID) here."""
    data: Mapping[str, int]
    """Readable fds holding :attr:`WorkerLaunch.data_files`, by name."""
    seccomp: int = -1
    """A readable fd holding the compiled seccomp filter, or -1 for none."""


@dataclass(frozen=True)
class WorkerLaunch:
    """Everything :class:`WorkerClient` needs to start one worker; built by the sandbox that owns it."""

    argv: Callable[[LaunchFds, _cgroup.Cgroup | None, int | None], list[str]]
    """The command line, given the child's fds, the cgroup it must join (None: no cgroup) and the host uid
    it must switch to (None: keep this process's)."""
    config: Mapping[str, Any]
    """The worker's configuration frame (the client adds the result fd)."""
    hard_cap: int
    """Total stdout + stderr bytes of one call after which it is stopped (``output_limit``)."""
    data_files: Mapping[str, bytes] = field(default_factory=dict)
    """Small files handed to the launcher as readable fds (bubblewrap's ``--ro-bind-data``)."""
    seccomp: bytes | None = None
    """A compiled seccomp filter for the launcher, or None."""
    cgroup: tuple[int | None, int | None] | None = None
    """(memory bytes, pids) for a fresh cgroup; None entries leave that controller unlimited; None: no
    cgroup at all."""
    host_uids: _uids.UidRange | None = None
    """Run the worker under its own host uid from this range (root only; None: this process's uid)."""


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


class Call:
    """One call in flight: its id, its capped output and the future its outcome settles."""

    __slots__ = ("err", "fut", "id", "open", "out")

    def __init__(self, call_id: int, limit: int, fut: asyncio.Future[Outcome]):
        self.id = call_id
        self.open = True
        self.out = Capture(limit)
        self.err = Capture(limit)
        self.fut = fut


class WorkerClient:
    """One running worker: the process, its pipes, and the kill path. Owned by one sandbox."""

    def __init__(self, launch: WorkerLaunch):
        self.launch = launch
        self.loop = asyncio.get_running_loop()
        self.proc: asyncio.subprocess.Process | None = None
        self.cgroup: _cgroup.Cgroup | None = None
        self.uid_lease: _uids.UidLease | None = None
        self._init_exit: asyncio.Future[None] | None = None
        self.ctl_w = self.res_r = self.out_r = self.err_r = self.info_r = -1
        self.pidfd = -1
        self.outer_pidfd = -1
        self.res_buf = bytearray()
        self.info_buf = bytearray()
        self.startup_err = bytearray()
        self.ready: asyncio.Future[dict[str, Any]] = self.loop.create_future()
        self.info_done: asyncio.Future[None] = self.loop.create_future()
        self.call: Call | None = None
        self.dead = False
        self.killed_by_us = False
        self.oom_at_start = 0
        self.waiter: asyncio.Task[int] | None = None
        self.failed_limits: list[str] = []

    # -- spawning ----------------------------------------------------------------------------------
    async def start(self, timeout: float) -> None:
        """Spawn the worker and wait for its greeting; :class:`SandboxError` when it does not start."""
        launch = self.launch
        child_fds: list[int] = []
        try:
            if launch.cgroup is not None:
                self.cgroup = _cgroup.manager().create(*launch.cgroup)
                self.oom_at_start = self.cgroup.oom_kills() if self.cgroup else 0
            ctl_r, self.ctl_w = _pipe()
            self.res_r, res_w = _pipe()
            self.out_r, out_w = _pipe()
            self.err_r, err_w = _pipe()
            self.info_r, info_w = _pipe()
            child_fds += [ctl_r, res_w, out_w, err_w, info_w]
            data_fds = {name: _data_fd(data) for name, data in launch.data_files.items()}
            child_fds += list(data_fds.values())
            seccomp_fd = -1
            if launch.seccomp is not None:
                seccomp_fd = _data_fd(launch.seccomp)
                child_fds.append(seccomp_fd)
            if launch.host_uids is not None:
                self.uid_lease = _uids.allocator(launch.host_uids).acquire()
            uid = self.uid_lease.uid if self.uid_lease is not None else None
            argv = launch.argv(LaunchFds(ctl_r, res_w, info_w, data_fds, seccomp_fd), self.cgroup, uid)
            self.proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                pass_fds=child_fds,
                env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8"},
                close_fds=True,
                cwd="/",  # the sandbox's uid may not be allowed into this process's working directory
            )
        except BaseException:
            for fd in child_fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            await self.cleanup()
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
            await self._write(frame({**launch.config, "res_fd": res_w}), timeout)
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
                if call.out.total + call.err.total > self.launch.hard_cap:
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
    async def run(self, code: str, wall: float, call_id: int, output_bytes: int) -> tuple[Outcome, Call]:
        """Run one call within ``wall`` seconds; the outcome and the call's captured output."""
        fut: asyncio.Future[Outcome] = self.loop.create_future()
        call = Call(call_id, output_bytes, fut)
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

    async def _namespace_gone(self, timeout: float) -> bool:
        """Wait until the namespace's init has exited (its pidfd polls readable); False on timeout. Shared
        by concurrent cleanups: the loop keeps one reader per fd, so a second one would replace the first."""
        if self._init_exit is None:
            fd = self.pidfd
            fut: asyncio.Future[None] = self.loop.create_future()

            def ready() -> None:
                self.loop.remove_reader(fd)
                if not fut.done():
                    fut.set_result(None)

            try:
                self.loop.add_reader(fd, ready)
            except OSError:
                fut.set_result(None)  # not pollable (an old kernel): the outer process's exit must do
            self._init_exit = fut
        try:
            await asyncio.wait_for(asyncio.shield(self._init_exit), timeout)
            return True
        except TimeoutError:
            log.warning("the sandbox's PID namespace did not empty within %g s after SIGKILL", timeout)
            return False

    async def kill(self) -> None:
        """Kill every process of the worker and release its fds and cgroup."""
        self.signal_kill()
        await self.cleanup()

    async def cleanup(self) -> None:
        """Wait for the (killed) process, then release its fds and cgroup."""
        exited = True
        if self.waiter is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self.waiter), 5.0)
            except TimeoutError:
                exited = False
                log.warning("sandbox process %s did not exit after SIGKILL", self.proc and self.proc.pid)
        if self.uid_lease is not None and self.pidfd >= 0 and exited:
            # A PID namespace's init exits only after every other process in it is gone: once its pidfd
            # is readable, nothing of this sandbox runs under its uid any more.
            exited = await self._namespace_gone(5.0)
        for fd in (self.res_r, self.out_r, self.err_r, self.info_r, self.pidfd):
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
        if self.uid_lease is not None and exited:
            # A worker that did not exit keeps its uid: a leaked uid is better than two sandboxes sharing one.
            lease, self.uid_lease = self.uid_lease, None
            lease.release()
