"""What the sandbox backends share: their one ``run`` (:class:`SerialBackend`: the request's checks, then the
call under the backend's lock), and for the backends that keep one live session (local, Docker) its
lifecycle and the bookkeeping around each call (:class:`SessionBackend`)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Coroutine
from typing import Any, Generic, Protocol, Self, TypeVar

from agentrl.errors import ConfigError, SandboxError
from agentrl.execution import ExecResult, Limits
from agentrl.types import ToolStatus

from ._output import Capture
from ._protocol import Outcome, to_result

__all__ = ["SerialBackend", "SessionBackend", "check_request", "spawn_background"]

log = logging.getLogger(__name__)

_BACKGROUND: set[asyncio.Task[Any]] = set()


def spawn_background(coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    """Run ``coro`` to completion in the background (the clean-up of a session whose call was cancelled),
    keeping a reference so the task is not garbage-collected half way."""
    task = asyncio.ensure_future(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)
    return task


def check_request(
    code: object,
    timeout: float | None,
    *,
    limits: Limits,
    closed: bool,
    max_code_bytes: int,
    started: float | None = None,
) -> Limits | ExecResult:
    """The limits for one ``run`` call, or the result to answer it with at once.

    Checked in this order: ``code`` is a str, ``timeout`` is a number of seconds (it can only lower
    ``limits.wall_s``), the sandbox is open, and the UTF-8 code fits in ``max_code_bytes``. With ``started``
    (a ``time.perf_counter()`` value), the code-size rejection reports the time since then as its duration.
    """
    if not isinstance(code, str):
        return ExecResult(ToolStatus.ERROR, message=f"code must be a str, got {type(code).__name__}")
    try:
        if timeout is not None and not math.isfinite(timeout) and timeout != math.inf:
            raise ConfigError(f"timeout must be a number of seconds, got {timeout!r}")
        clamped = limits.clamp(wall_s=timeout) if timeout is not None else limits
    except (ConfigError, TypeError) as e:
        return ExecResult(ToolStatus.ERROR, message=str(e))
    if closed:
        return ExecResult(ToolStatus.SANDBOX_ERROR, message="sandbox is closed")
    size = len(code.encode("utf-8", "surrogatepass"))
    if size > max_code_bytes:
        return ExecResult(
            ToolStatus.ERROR,
            message=f"code too large: {size:,} bytes (limit {max_code_bytes:,})",
            duration_s=0.0 if started is None else time.perf_counter() - started,
        )
    return clamped


class SerialBackend:
    """The ``run`` of every backend, one call at a time: :func:`check_request` answers a bad request at once,
    then :meth:`_run_locked` makes the call under a lock made on first use (so a sandbox can be built
    outside an event loop).

    Subclasses set ``_limits``, ``_max_code_bytes``, ``_closed`` and ``_lock`` (None) and implement
    :meth:`_run_locked`.
    """

    _limits: Limits
    _max_code_bytes: int
    _closed: bool
    _lock: asyncio.Lock | None

    def _get_lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

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
            return await self._run_locked(code, limits, t0)

    async def _run_locked(self, code: str, limits: Limits, t0: float) -> ExecResult:
        """With the lock held: run ``code`` under ``limits`` (``t0``: when the call began)."""
        raise NotImplementedError


class _Killable(Protocol):
    async def kill(self) -> None: ...


class _CallOutput(Protocol):
    out: Capture
    err: Capture


S = TypeVar("S", bound=_Killable)


class SessionBackend(SerialBackend, Generic[S]):
    """``start``/``reset``/``close``, ``async with`` and ``run`` for a backend that keeps one live session
    ``S`` (a worker process, a container) and serialises its calls with a lock.

    Subclasses set ``_hard_cap`` (and :class:`SerialBackend`'s attributes but the lock), call
    ``super().__init__()`` and implement :meth:`_ensure` (start the session), :meth:`_call` (one call in
    it) and :meth:`_abandon` (what a cancelled call does to it).
    """

    _hard_cap: int

    def __init__(self) -> None:
        self._session: S | None = None
        self._lock = None
        self._closed = False
        self._calls = 0
        # The session died between calls: the next call says that earlier state was lost.
        self._died_idle = False
        # Clean-ups of sessions whose call was cancelled (an episode's deadline): close() waits for them.
        self._cleanups: set[asyncio.Task[Any]] = set()

    async def _ensure(self) -> S:
        """The live session, started (or restarted after a death) when there is none."""
        raise NotImplementedError

    async def _call(self, session: S, code: str, limits: Limits) -> tuple[Outcome, _CallOutput]:
        """Run ``code`` in ``session`` as call number ``self._calls``: how it ended, and its output."""
        raise NotImplementedError

    def _abandon(self, session: S) -> None:
        """The call in ``session`` was cancelled: kill it without waiting (the session is already retired);
        any slow clean-up goes to :meth:`_clean_up_later`."""
        raise NotImplementedError

    def _clean_up_later(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run a retired session's clean-up in the background; :meth:`close` waits for it, so a sandbox
        closed right after a cancelled call leaves no process or cgroup behind."""
        task = spawn_background(coro)
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def _run_locked(self, code: str, limits: Limits, t0: float) -> ExecResult:
        try:
            session = await self._ensure()
        except SandboxError as e:
            return ExecResult(ToolStatus.SANDBOX_ERROR, message=str(e), duration_s=time.perf_counter() - t0)
        lost_before, self._died_idle = self._died_idle, False
        self._calls += 1
        try:
            outcome, call = await self._call(session, code, limits)
        except asyncio.CancelledError:
            self._session = None
            self._abandon(session)
            raise
        except Exception as e:  # the machinery, never the code: the session cannot be trusted any more
            log.exception("sandbox call failed")
            await session.kill()
            self._session = None
            return ExecResult(
                ToolStatus.SANDBOX_ERROR,
                message=f"Sandbox failure (not the code's fault): {e!r}",
                duration_s=time.perf_counter() - t0,
                state_lost=True,
            )
        if outcome.kind != "frame" or outcome.status == "exit":  # the call ended the session
            await session.kill()
            self._session = None
        return to_result(
            outcome,
            stdout=call.out.text(),
            stderr=call.err.text(),
            truncated=call.out.truncated or call.err.truncated,
            duration_s=time.perf_counter() - t0,
            limits=limits,
            hard_cap=self._hard_cap,
            state_lost_before=lost_before,
        )

    async def start(self) -> None:
        """Start the session now rather than on the first call. Raises SandboxError on failure."""
        if self._closed:
            raise SandboxError("sandbox is closed")
        async with self._get_lock():
            await self._ensure()

    async def reset(self) -> None:
        """Discard all state: kill every process of the session and start a fresh one."""
        if self._closed:
            raise SandboxError("sandbox is closed")
        async with self._get_lock():
            if self._session is not None:
                await self._session.kill()
                self._session = None
            self._died_idle = False
            await self._ensure()

    async def close(self) -> None:
        """Kill every process of the session and release what it holds. Idempotent."""
        if self._closed:
            return
        self._closed = True
        s, self._session = self._session, None
        if s is not None:
            await s.kill()
        if self._cleanups:
            await asyncio.gather(*list(self._cleanups), return_exceptions=True)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
