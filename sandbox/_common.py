"""What the sandbox backends share: the checks at the top of ``run``, and for the backends that keep one live
session (local, Docker) its lifecycle and the bookkeeping around each call."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Coroutine
from typing import Any, Generic, Protocol, Self, TypeVar

from agentrl.errors import ConfigError, SandboxError
from agentrl.execution import ExecResult, Limits
from agentrl.types import ToolStatus

from ._output import Capture
from ._protocol import Outcome, to_result

__all__ = ["SessionBackend", "check_request", "spawn_background"]

_BACKGROUND: set[asyncio.Task[Any]] = set()


def spawn_background(coro: Coroutine[Any, Any, Any]) -> None:
    """Run ``coro`` to completion in the background (the clean-up of a session whose call was cancelled),
    keeping a reference so the task is not garbage-collected half way."""
    task = asyncio.ensure_future(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


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


class _Killable(Protocol):
    async def kill(self) -> None: ...


class _CallOutput(Protocol):
    out: Capture
    err: Capture


S = TypeVar("S", bound=_Killable)


class SessionBackend(Generic[S]):
    """``start``/``reset``/``close`` and ``async with`` for a backend that keeps one live session ``S`` (a
    worker process, a container) and serialises its calls with a lock made on first use; plus the steps
    every call takes under that lock (:meth:`_begin_call`, :meth:`_end_call`).

    Subclasses set ``_hard_cap``, call ``super().__init__()`` and implement :meth:`_ensure`.
    """

    _hard_cap: int

    def __init__(self) -> None:
        self._session: S | None = None
        self._lock: asyncio.Lock | None = None
        self._closed = False
        self._calls = 0
        # The session died between calls: the next call says that earlier state was lost.
        self._died_idle = False

    async def _ensure(self) -> S:
        """The live session, started (or restarted after a death) when there is none."""
        raise NotImplementedError

    def _get_lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def _begin_call(self, t0: float) -> tuple[S, bool] | ExecResult:
        """With the lock held: the live session and whether earlier state was lost, or the
        ``sandbox_error`` result when no session starts."""
        try:
            session = await self._ensure()
        except SandboxError as e:
            return ExecResult(ToolStatus.SANDBOX_ERROR, message=str(e), duration_s=time.perf_counter() - t0)
        lost_before, self._died_idle = self._died_idle, False
        self._calls += 1
        return session, lost_before

    async def _end_call(
        self, session: S, outcome: Outcome, call: _CallOutput, *, limits: Limits, t0: float, lost_before: bool
    ) -> ExecResult:
        """With the lock held: retire the session when the call ended it, and make the call's result."""
        if outcome.kind != "frame" or outcome.status == "exit":
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

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
