"""DockerSandbox: the same persistent REPL worker, in a Docker container (the ``docker`` SDK).

No image is pulled. By default the sandbox imports a tiny root filesystem (empty directories, ``/etc/passwd``,
symlinks for ``/bin`` and ``/lib``) as ``agentrl-sandbox-rootfs:1`` and bind-mounts the host's ``/usr`` and
this Python installation read-only, so the container runs exactly the host interpreter. Any image that has
the same Python at the same path works too (``image=``).

Each session is one container: ``network_mode=none``, read-only root, a size-capped tmpfs on ``/tmp``
(the working directory) and ``/dev/shm``, ``mem_limit`` = ``memswap_limit`` (no swap), ``pids_limit``, all
capabilities dropped, ``no-new-privileges``, a non-root user, and the same rlimits as the local backend.
The worker is PID 1 of the container's PID namespace, so ``kill(-1)`` after each call reaps everything the
code started, and killing the container takes every process with it.

Docker's attach stream has only stdin/stdout/stderr, so the worker runs in *sentinel* mode: at the end of a
call it writes a marker with a per-call random nonce to stdout and to stderr, followed on stderr by its
result line (see ``_worker.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import secrets
import socket
import tarfile
from collections.abc import Mapping
from typing import Any

from agentrl.errors import ConfigError, SandboxError
from agentrl.execution import Limits

from ._common import SessionBackend
from ._layout import SANDBOX_UID, python_layout, sandbox_env
from ._output import Capture, decode
from ._protocol import BOOTSTRAP, MARKER, Outcome, frame, parse_line, worker_code

__all__ = ["DEFAULT_IMAGE", "DockerSandbox", "ensure_rootfs_image"]

MiB = 1024 * 1024
DEFAULT_IMAGE = "agentrl-sandbox-rootfs:1"
_LABEL = "agentrl.sandbox"


def _rootfs_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:

        def add(name: str, kind: bytes, mode: int = 0o755, target: str = "", data: bytes = b"") -> None:
            ti = tarfile.TarInfo(name)
            ti.type, ti.mode, ti.linkname, ti.size = kind, mode, target, len(data)
            tf.addfile(ti, io.BytesIO(data) if data else None)

        for d in ("usr", "proc", "dev", "sys", "etc", "root", "home", "opt", "work", "var", "run"):
            add(d, tarfile.DIRTYPE)
        add("tmp", tarfile.DIRTYPE, 0o1777)
        for name in ("bin", "lib", "lib64", "sbin", "lib32", "libx32"):
            if os.path.islink(f"/{name}"):
                add(name, tarfile.SYMTYPE, target=os.readlink(f"/{name}"))
            elif os.path.isdir(f"/{name}"):
                add(name, tarfile.DIRTYPE)
        add(
            "etc/passwd",
            tarfile.REGTYPE,
            0o644,
            data=f"root:x:0:0::/:/usr/sbin/nologin\nsandbox:x:{SANDBOX_UID}:{SANDBOX_UID}::/tmp:/bin/sh\n".encode(),
        )
        add("etc/group", tarfile.REGTYPE, 0o644, data=f"root:x:0:\nsandbox:x:{SANDBOX_UID}:\n".encode())
    return buf.getvalue()


def ensure_rootfs_image(client: Any, name: str = DEFAULT_IMAGE) -> str:
    """Import the minimal root filesystem as ``name`` unless it exists (blocking; no registry access)."""
    import docker.errors

    try:
        client.images.get(name)
        return name
    except docker.errors.ImageNotFound:
        pass
    repo, _, tag = name.partition(":")
    client.api.import_image_from_data(_rootfs_tar(), repository=repo, tag=tag or "latest")
    return name


class _Scanner:
    """Finds the end-of-cell marker in one stream; bytes before it go to the capture."""

    __slots__ = ("after", "found", "held", "marker")

    def __init__(self, marker: bytes):
        self.marker = marker
        self.held = b""
        self.found = False
        self.after = bytearray()

    def feed(self, data: bytes, sink: Capture | None) -> None:
        if self.found:
            self.after += data[:4096]
            return
        buf = self.held + data
        i = buf.find(self.marker)
        if i >= 0:
            if sink is not None:
                sink.feed(buf[:i])
            self.found = True
            self.after += buf[i + len(self.marker) :][:4096]
            self.held = b""
            return
        keep = len(self.marker) - 1
        if sink is not None and len(buf) > keep:
            sink.feed(buf[: len(buf) - keep])
        self.held = buf[-keep:] if keep else b""

    def flush(self, sink: Capture) -> None:
        """The call ended without a marker: what was held back is output after all."""
        if not self.found and self.held:
            sink.feed(self.held)
            self.held = b""


class _DCall:
    def __init__(self, call_id: int, limit: int, nonce: str, fut: asyncio.Future[Outcome]):
        self.id = call_id
        self.nonce = nonce
        self.out = Capture(limit)
        self.err = Capture(limit)
        marker = (MARKER + nonce).encode()
        self.out_scan = _Scanner(marker)
        self.err_scan = _Scanner(marker)
        self.fut = fut
        self.open = True


class _Container:
    """One running container and its attach socket."""

    def __init__(self, sb: DockerSandbox):
        self.sb = sb
        self.loop = asyncio.get_running_loop()
        self.container: Any = None
        self.sock: socket.socket | None = None
        self._sockio: Any = None
        self.reader: asyncio.Task[None] | None = None
        self.call: _DCall | None = None
        self.boot = _DCall(0, 8192, "", self.loop.create_future())
        self.dead = False
        self.killed_by_us = False

    async def start(self, timeout: float) -> None:
        sb = self.sb
        try:
            await asyncio.wait_for(asyncio.to_thread(self._create), timeout)
        except Exception as e:
            await self.kill()
            raise SandboxError(f"could not start a Docker sandbox: {type(e).__name__}: {e}") from e
        self.reader = asyncio.ensure_future(self._read_loop())
        try:
            await self._send(worker_code())
            await self._send(frame(sb._worker_config()))
            await asyncio.wait_for(asyncio.shield(self.boot.fut), timeout)
        except Exception as e:
            text = decode(bytes(self.boot.err_scan.held)) + self.boot.err.text()
            await self.kill()
            raise SandboxError(f"the Docker sandbox failed to start: {e!r} {text.strip()}") from None
        outcome = self.boot.fut.result()
        if outcome.kind != "frame" or outcome.status != "ready":
            await self.kill()
            raise SandboxError(f"the Docker sandbox failed to start: {outcome}")

    def _create(self) -> None:
        sb = self.sb
        lim = sb._limits
        exe, binds, _ = python_layout()
        volumes = {"/usr": {"bind": "/usr", "mode": "ro"}}
        for b in [*binds, *sb._ro_binds]:
            volumes[b] = {"bind": b, "mode": "ro"}
        self.container = sb._client.containers.create(
            sb._image,
            command=[exe, "-I", "-S", "-c", BOOTSTRAP, str(len(worker_code())), "0"],
            stdin_open=True,
            tty=False,
            detach=True,
            network_mode="none",
            read_only=True,
            tmpfs={
                "/tmp": f"size={lim.scratch_bytes},mode=1777",
                "/dev/shm": f"size={min(lim.scratch_bytes, 16 * MiB)},mode=1777",
            },
            volumes=volumes,
            working_dir="/tmp",
            user=f"{SANDBOX_UID}:{SANDBOX_UID}",
            environment=sb._env,
            mem_limit=lim.memory_bytes + lim.scratch_bytes,
            memswap_limit=lim.memory_bytes + lim.scratch_bytes,
            pids_limit=lim.max_processes,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            hostname="sandbox",
            labels={_LABEL: "1", f"{_LABEL}.owner": str(os.getpid())},
            **({"runtime": sb._runtime} if sb._runtime else {}),
        )
        self._sockio = sb._client.api.attach_socket(
            self.container.id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
        )
        raw = getattr(self._sockio, "_sock", self._sockio)
        raw.setblocking(False)
        self.sock = raw
        self.container.start()

    async def _send(self, data: bytes) -> None:
        if self.sock is None or self.dead:
            raise SandboxError("the container is gone")
        await self.loop.sock_sendall(self.sock, data)

    async def _read_loop(self) -> None:
        assert self.sock is not None
        buf = bytearray()
        try:
            while True:
                data = await self.loop.sock_recv(self.sock, 1 << 16)
                if not data:
                    break
                buf += data
                while len(buf) >= 8:
                    size = int.from_bytes(buf[4:8], "big")
                    if len(buf) < 8 + size:
                        break
                    kind, payload = buf[0], bytes(buf[8 : 8 + size])
                    del buf[: 8 + size]
                    self._on_data(kind == 2, payload)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self.dead = True
            await self._settle_death()

    def _on_data(self, is_err: bool, data: bytes) -> None:
        call = self.call if self.call is not None else (self.boot if not self.boot.fut.done() else None)
        if call is None or not call.open:
            return
        scan, cap = (call.err_scan, call.err) if is_err else (call.out_scan, call.out)
        scan.feed(data, cap)
        if call.out.total + call.err.total > self.sb._hard_cap:
            call.open = False
            if not call.fut.done():
                call.fut.set_result(Outcome("output_limit"))
            return
        if call.out_scan.found and call.err_scan.found and b"\n" in call.err_scan.after:
            line = bytes(call.err_scan.after).split(b"\n", 1)[0]
            msg = parse_line(line)
            if call.fut.done():
                return
            if msg is None:
                call.fut.set_result(Outcome("protocol"))
            elif call is self.boot:
                call.fut.set_result(
                    Outcome("frame", "ready") if msg.get("ready") == 1 else Outcome("protocol")
                )
            elif msg.get("id") != call.id or msg.get("status") not in ("ok", "error", "oom", "exit"):
                call.fut.set_result(Outcome("protocol"))
            else:
                code = msg.get("exit_code")
                call.fut.set_result(Outcome("frame", msg["status"], code if isinstance(code, int) else None))

    async def _settle_death(self) -> None:
        call = self.call if self.call is not None else self.boot
        if call.fut.done():
            return
        outcome = await self._death_outcome()
        if not call.fut.done():
            call.fut.set_result(outcome)

    async def _death_outcome(self) -> Outcome:
        try:
            await asyncio.to_thread(self.container.reload)
            state = self.container.attrs.get("State", {})
        except Exception as e:
            return Outcome("infra", detail=f"the container vanished: {e}")
        rc = int(state.get("ExitCode", -1))
        if state.get("OOMKilled"):
            return Outcome("died", oom_killed=True, exit_code=rc)
        if rc == 137 and not self.killed_by_us:
            return Outcome("infra", detail="the container was killed from outside while the code ran")
        if 128 < rc <= 128 + 64:
            return Outcome("died", signal=rc - 128, exit_code=rc)
        return Outcome("died", exit_code=rc)

    async def run(self, code: str, wall: float, call_id: int, output_bytes: int) -> tuple[Outcome, _DCall]:
        fut: asyncio.Future[Outcome] = self.loop.create_future()
        call = _DCall(call_id, output_bytes, secrets.token_hex(8), fut)
        self.call = call
        deadline = self.loop.time() + wall
        try:
            try:
                req = {"op": "run", "id": call_id, "code": code, "wall": wall, "nonce": call.nonce}
                await asyncio.wait_for(self._send(frame(req)), wall)
            except (SandboxError, OSError):
                pass  # dead: the reader settles ``fut``
            except TimeoutError:
                if not fut.done():
                    fut.set_result(Outcome("timeout"))
            try:
                outcome = await asyncio.wait_for(asyncio.shield(fut), max(0.0, deadline - self.loop.time()))
            except TimeoutError:
                if not fut.done():
                    fut.set_result(Outcome("timeout"))
                outcome = fut.result()
            if outcome.kind == "died" or (outcome.kind == "frame" and outcome.status == "exit"):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self.reader), 5.0)  # type: ignore[arg-type]
            if outcome.kind != "frame":
                call.out_scan.flush(call.out)
                call.err_scan.flush(call.err)
            return outcome, call
        finally:
            call.open = False
            self.call = None

    def _close_sock(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(Exception):
                self.sock.close()
        if self._sockio is not None:
            with contextlib.suppress(Exception):
                self._sockio.close()
        self.sock = None

    async def kill(self) -> None:
        self.killed_by_us = True
        c = self.container
        if c is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(c.remove, force=True)
        self._close_sock()
        if self.reader is not None:
            self.reader.cancel()
            with contextlib.suppress(BaseException):
                await self.reader


class DockerSandbox(SessionBackend[_Container]):
    """A stateful Python session in a Docker container (see the module docstring).

    Args:
        limits: maximum limits; per-call ``timeout`` can only lower ``wall_s``.
        client: a ``docker.DockerClient`` (default: ``docker.from_env()``, honouring ``DOCKER_HOST``).
        image: image to run; default: import the minimal root filesystem (no registry access needed).
        env: extra environment variables (the default environment is an allow-list).
        ro_binds: host directories to bind read-only at the same path.
        runtime: an OCI runtime name (e.g. ``runsc`` for gVisor) when the engine has one.
    """

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        client: Any = None,
        image: str | None = None,
        env: Mapping[str, str] | None = None,
        ro_binds: tuple[str, ...] | list[str] = (),
        runtime: str | None = None,
        max_code_bytes: int = 1 * MiB,
        output_hard_cap: int = 16 * MiB,
        start_timeout: float = 60.0,
    ):
        self._limits = limits if limits is not None else Limits()
        if not isinstance(self._limits, Limits):
            raise ConfigError(f"limits must be a Limits, got {type(limits).__name__}")
        if self._limits.network:
            raise ConfigError("DockerSandbox runs with network_mode=none; Limits.network must be False")
        self._client = client
        self._image = image
        self._env = sandbox_env(self._limits, env)
        self._ro_binds = [os.path.abspath(p) for p in ro_binds]
        self._runtime = runtime
        self._max_code_bytes = int(max_code_bytes)
        self._hard_cap = int(output_hard_cap)
        self._start_timeout = float(start_timeout)
        super().__init__()

    @property
    def limits(self) -> Limits:
        """The most this sandbox grants (per-call limits are clamped to these)."""
        return self._limits

    @property
    def _container(self) -> Any:
        """The docker-py Container of the current session (tests kill it from outside)."""
        return self._session.container if self._session is not None else None

    def _worker_config(self) -> dict[str, Any]:
        lim = self._limits
        _, _, sys_path = python_layout()
        # No RLIMIT_NPROC: it counts per host uid across every container; pids_limit is per container.
        rlimits = {"CORE": 0, "NOFILE": 256, "AS": lim.memory_bytes, "FSIZE": lim.file_size_bytes}
        return {
            "mode": "sentinel",
            "marker": MARKER,
            "rlimits": rlimits,
            "sys_path": sys_path,
            "kill_strays": True,
        }

    async def _ensure_client(self) -> None:
        if self._client is None:
            try:
                import docker
            except ImportError as e:  # pragma: no cover - the [docker] extra is not installed
                raise SandboxError("DockerSandbox needs `pip install agentrl[docker]`") from e
            try:
                self._client = await asyncio.to_thread(docker.from_env)
            except Exception as e:
                raise SandboxError(f"no Docker engine reachable: {e}") from e
        if self._image is None:
            try:
                self._image = await asyncio.to_thread(ensure_rootfs_image, self._client)
            except Exception as e:
                raise SandboxError(f"could not import the sandbox root filesystem: {e}") from e

    # -- lifecycle (start, reset, close: SessionBackend) ------------------------------------------
    async def _ensure(self) -> _Container:
        if self._session is not None and not self._session.dead:
            return self._session
        if self._session is not None:
            await self._session.kill()
            self._session = None
            self._died_idle = True
        await self._ensure_client()
        c = _Container(self)
        await c.start(self._start_timeout)
        self._session = c
        return c

    # -- one call (run: SessionBackend) ------------------------------------------------------------
    async def _call(self, session: _Container, code: str, limits: Limits) -> tuple[Outcome, _DCall]:
        return await session.run(code, limits.wall_s, self._calls, limits.output_bytes)

    def _abandon(self, session: _Container) -> None:
        session.killed_by_us = True  # the exit that follows is ours, not an outside kill
        self._clean_up_later(session.kill())


def remove_orphans(client: Any) -> int:
    """Remove sandbox containers left by agentrl processes that no longer exist; returns how many."""
    n = 0
    for c in client.containers.list(all=True, filters={"label": _LABEL}):
        owner = c.labels.get(f"{_LABEL}.owner", "")
        alive = owner.isdigit() and os.path.exists(f"/proc/{owner}")
        if not alive:
            with contextlib.suppress(Exception):
                c.remove(force=True)
                n += 1
    return n
