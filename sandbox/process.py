"""``ProcessSandbox``: a long-lived sandboxed process with pipes (an MCP server, a terminal, a shell).

:class:`~agentrl.sandbox.LocalSandbox` runs *code* in a Python REPL it controls. Some tools are a *program*
that must stay up for a whole episode and talk over its stdin/stdout: a stdio MCP server, a shell. This
module starts such a program inside the same bubblewrap boundary as the local sandbox and hands back its
pipes::

    host (asyncio) --sh (joins a fresh memory+pids cgroup)--> prlimit (rlimits) --> bwrap
        └── [new user, pid, net, ipc, uts, cgroup namespaces, seccomp deny-list]  pid 1: bwrap init
              └── pid 2: the program (argv), stdin/stdout/stderr are pipes to the host

What the program gets (the local sandbox's layout, see ``sandbox/README.md``): an empty read-only root with
read-only ``/usr``, this Python installation and its venv, the installation the program itself lives in
(its venv and base Python, its ``node_modules``: ``_program.py``), the files named on its command line and
``ro_binds``; a size-capped tmpfs ``/tmp`` (its working directory and ``$HOME``); no network (a fresh
network namespace with only ``lo``); an allow-listed environment plus ``env``; a memory cgroup
(``memory_bytes + scratch_bytes``) and a pids cgroup (``max_processes``) where the host lets us create them,
and ``RLIMIT_AS`` (``memory_bytes``), ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE`` 256, no core dumps. The wall clock
is the caller's business (a long-lived process has no per-call deadline here; the MCP client applies one per
request). :meth:`SandboxedProcess.kill` SIGKILLs bubblewrap, whose namespace init dies with it
(``--die-with-parent``), then every process left in the cgroup.

Per backend: only the local (bubblewrap) backend has this primitive. Docker and e2b could implement it with
``docker exec -i`` / e2b's process API; they do not yet, and callers that need a sandboxed process use this
one (it needs ``bwrap`` and Linux, like ``LocalSandbox``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Self

from agentrl.errors import ConfigError, SandboxError
from agentrl.execution import Limits

from . import _cgroup, _seccomp
from ._layout import SANDBOX_UID, python_layout, sandbox_env
from ._program import program_layout

__all__ = ["DEFAULT_LIMITS", "NODE_DEFAULT_LIMITS", "ProcessSandbox", "SandboxedProcess"]

log = logging.getLogger(__name__)

MiB = 1024 * 1024
DEFAULT_LIMITS = Limits(memory_bytes=1024 * MiB, max_processes=64, scratch_bytes=64 * MiB)
"""A server imports more than a REPL cell does (an MCP server in Python maps ~400 MB of address space)."""
NODE_DEFAULT_LIMITS = Limits(memory_bytes=2048 * MiB, max_processes=64, scratch_bytes=64 * MiB)
"""What a Node.js program gets when no ``limits`` were given: V8 reserves address space up front, and
``@modelcontextprotocol/server-everything`` dies with "JavaScript heap out of memory" under a 1 GiB
``RLIMIT_AS`` (it starts at 1.5 GiB; 2026-11-27, this 2-core machine)."""
_STDERR_TAIL = 8192


def _data_fd(data: bytes) -> int:
    """A readable fd holding ``data`` (bubblewrap reads it to EOF)."""
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(w, view) :]
    finally:
        os.close(w)
    return r


class ProcessSandbox:
    """Starts programs in the local bubblewrap sandbox, each with stdin/stdout/stderr pipes to the host.

    Args:
        limits: memory, process, file-size and scratch limits (``wall_s`` is not used: see the module
            docstring). Default: ``DEFAULT_LIMITS``, or ``NODE_DEFAULT_LIMITS`` for a program Node.js
            runs. ``network=True`` is refused: the program never reaches a network.
        ro_binds: extra host paths (files or directories) the program may read, at the same path.
        env: extra environment variables (the rest is an allow-list; nothing leaks from the host).
        bind_argv_files: also expose, read-only, each file named on the command line (the server's script).
    """

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        ro_binds: Sequence[str | os.PathLike[str]] = (),
        env: Mapping[str, str] | None = None,
        bind_argv_files: bool = True,
    ):
        self._default_limits = limits is None
        self.limits = limits if limits is not None else DEFAULT_LIMITS
        if not isinstance(self.limits, Limits):
            raise ConfigError(f"limits must be a Limits, got {type(limits).__name__}")
        if self.limits.network:
            raise ConfigError("ProcessSandbox never enables network access; use Limits(network=False)")
        self.ro_binds = [os.path.abspath(os.fspath(p)) for p in ro_binds]
        for p in self.ro_binds:
            if not os.path.exists(p):
                raise ConfigError(f"ro_binds path does not exist: {p}")
        self.env = dict(env or {})
        sandbox_env(self.limits, self.env)  # validates the entries now rather than at the first start
        self.bind_argv_files = bool(bind_argv_files)

    def __repr__(self) -> str:
        return f"ProcessSandbox(limits={self.limits}, ro_binds={self.ro_binds})"

    async def start(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, stream_limit: int = 64 * 1024
    ) -> SandboxedProcess:
        """Start ``argv`` in a fresh sandbox and return it running (its own namespaces, cgroup and tmpfs).

        Args:
            argv: the program and its arguments; a relative program name is looked up on the host's
                ``PATH``. Besides ``/usr``, this venv and ``ro_binds``, the sandbox binds read-only the
                installation the program and its ``#!`` interpreter live in (a venv with its base Python,
                a ``node_modules`` tree): see ``sandbox/_program.py``.
            env: more environment variables for this process.
            stream_limit: the longest line ``stdout.readline()`` returns (longer lines raise ``ValueError``).

        Raises:
            ConfigError: an empty ``argv``, a program that does not exist, or one whose interpreter lies
                outside every installation layout the sandbox binds by itself (the message names the path
                and the ``ro_binds=`` fix).
            SandboxError: bubblewrap is missing or the sandbox could not be set up.
        """
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ConfigError(f"argv must be a non-empty list of strings, got {argv!r}")
        exe = argv[0] if os.sep in argv[0] else shutil.which(argv[0])
        if exe is None or not os.path.exists(exe):
            raise ConfigError(f"program not found: {argv[0]!r}")
        args = [os.path.abspath(exe), *argv[1:]]
        binds = list(self.ro_binds)
        if self.bind_argv_files:
            for i, arg in enumerate(args[1:], 1):
                if (os.sep in arg or arg.endswith(".py")) and os.path.isfile(arg):
                    args[i] = os.path.abspath(arg)  # the sandbox's working directory is /tmp
                    binds.append(args[i])
        _, layout_binds, _ = python_layout()
        # The program's own installation (a venv of its own, an npm prefix), or a ConfigError naming it.
        program = program_layout(args, [*layout_binds, *binds])
        binds += program.binds
        bwrap = shutil.which("bwrap") or ("/usr/bin/bwrap" if os.access("/usr/bin/bwrap", os.X_OK) else None)
        if bwrap is None:
            raise SandboxError("bubblewrap (bwrap) is not installed; apt install bubblewrap")
        prlimit = shutil.which("prlimit")
        if prlimit is None:
            raise SandboxError(
                "prlimit (util-linux) is not installed; it sets the sandboxed process's rlimits"
            )
        lim = self.limits
        if self._default_limits and program.is_node:
            lim = NODE_DEFAULT_LIMITS
        try:
            cgroup = _cgroup.manager().create(lim.memory_bytes + lim.scratch_bytes, lim.max_processes)
        except OSError as e:
            raise SandboxError(f"could not create the sandbox's cgroup: {e}") from e
        fds: list[int] = []
        try:
            uid = SANDBOX_UID
            passwd = f"root:x:0:0::/:/usr/sbin/nologin\nsandbox:x:{uid}:{uid}::/tmp:/bin/sh\n".encode()
            fds.append(_data_fd(passwd))
            seccomp = _seccomp.deny_filter()
            if seccomp is not None:
                fds.append(_data_fd(seccomp))
            a = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net"]
            a += ["--unshare-cgroup-try", "--disable-userns", "--die-with-parent", "--new-session"]
            a += ["--hostname", "sandbox", "--uid", str(uid), "--gid", str(uid), "--ro-bind", "/usr", "/usr"]
            for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
                if os.path.islink(top):
                    a += ["--symlink", os.readlink(top), top]
                elif os.path.isdir(top):
                    a += ["--ro-bind", top, top]
            for etc in ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives", "/etc/nsswitch.conf"):
                a += ["--ro-bind-try", etc, etc]
            a += ["--perms", "0444", "--ro-bind-data", str(fds[0]), "/etc/passwd"]
            a += ["--proc", "/proc", "--dev", "/dev"]
            a += ["--size", str(lim.scratch_bytes), "--perms", "1777", "--tmpfs", "/tmp"]
            for b in sorted(set(layout_binds + binds)):  # after the tmpfs: a bind under /tmp stays visible
                a += ["--ro-bind", b, b]
            a += ["--remount-ro", "/", "--chdir", "/tmp", "--clearenv"]
            for k, v in sandbox_env(lim, {**self.env, **(env or {})}).items():
                a += ["--setenv", k, v]
            if seccomp is not None:
                a += ["--seccomp", str(fds[1])]
            a += ["--", *args]
            rl = [f"--as={lim.memory_bytes}", f"--fsize={lim.file_size_bytes}", "--nofile=256", "--core=0"]
            a = [prlimit, *rl, "--", *a]
            if cgroup is not None and cgroup.procs_files:
                # Join the cgroups before exec'ing, so nothing of the program ever runs outside them.
                shim = (
                    'for f in "$@"; do [ "$f" = -- ] && break; echo $$ > "$f" || exit 125; shift; done; '
                    'shift; exec "$@"'
                )
                a = ["/bin/sh", "-c", shim, "sh", *map(str, cgroup.procs_files), "--", *a]
            proc = await asyncio.create_subprocess_exec(
                *a,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=fds,
                env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8"},
                limit=stream_limit,
            )
        except BaseException:
            if cgroup is not None:
                cgroup.kill_all()
                cgroup.remove()
            raise
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        return SandboxedProcess(proc, cgroup)


class SandboxedProcess:
    """One running sandboxed program: its pipes, its exit status and the kill path. Made by
    :meth:`ProcessSandbox.start`; use as an async context manager or call :meth:`kill`."""

    def __init__(self, proc: asyncio.subprocess.Process, cgroup: _cgroup.Cgroup | None):
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self._proc = proc
        self._cgroup = cgroup
        self._oom_at_start = cgroup.oom_kills() if cgroup is not None else 0
        self.stdin: asyncio.StreamWriter = proc.stdin
        """The program's standard input."""
        self.stdout: asyncio.StreamReader = proc.stdout
        """The program's standard output."""
        self._stderr: collections.deque[bytes] = collections.deque()
        self._stderr_bytes = 0
        self._stderr_task = asyncio.ensure_future(self._drain_stderr(proc.stderr))
        self._killed = False
        self._oom = False

    @property
    def pid(self) -> int:
        """The host pid of the launcher (the cgroup shim, then bubblewrap)."""
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """The exit status once the sandbox has ended (negative: killed by that signal), else None."""
        return self._proc.returncode

    @property
    def oom_killed(self) -> bool:
        """True when the memory cgroup killed a process of this sandbox."""
        if self._cgroup is not None:
            self._oom = self._oom or self._cgroup.oom_kills() > self._oom_at_start
        return self._oom

    def stderr_tail(self) -> str:
        """The last few KB the program wrote to stderr (its crash message), decoded with replacement."""
        return b"".join(self._stderr).decode("utf-8", "replace")

    async def _drain_stderr(self, stream: asyncio.StreamReader) -> None:
        # Always read stderr so a chatty program never blocks on a full pipe; keep only the tail.
        with contextlib.suppress(Exception):
            while chunk := await stream.read(4096):
                self._stderr.append(chunk)
                self._stderr_bytes += len(chunk)
                while self._stderr_bytes - len(self._stderr[0]) >= _STDERR_TAIL:
                    self._stderr_bytes -= len(self._stderr.popleft())

    async def wait(self) -> int:
        """Wait for the sandbox to end; its exit status."""
        return await self._proc.wait()

    async def kill(self) -> None:
        """SIGKILL the sandbox (every process in it) and release its pipes and cgroup. Idempotent."""
        if not self._killed:
            self._killed = True
            if self._proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    self._proc.kill()
            if self._cgroup is not None:
                self._cgroup.kill_all()
        try:
            await asyncio.wait_for(asyncio.shield(self._proc.wait()), 5.0)
        except TimeoutError:
            log.warning("sandboxed process %s did not exit after SIGKILL", self._proc.pid)
        self._stderr_task.cancel()
        with contextlib.suppress(BaseException):
            await self._stderr_task
        self.stdin.close()
        transport = getattr(self._proc, "_transport", None)
        if transport is not None:
            transport.close()
        if self._cgroup is not None:
            _ = self.oom_killed  # read the counter while the cgroup still exists
            cg, self._cgroup = self._cgroup, None
            for _ in range(200):
                if cg.remove():
                    break
                cg.kill_all()
                await asyncio.sleep(0.005)
            else:
                log.warning("could not remove sandbox cgroup %s", cg.dirs)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.kill()
