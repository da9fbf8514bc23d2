"""SandboxPool: warm sandboxes handed out one per episode, reset on release, with back-pressure.

At most ``size`` sandboxes are alive at once (an atomic cap: the count is taken before a sandbox is
created). When all are in use, up to ``max_waiting`` callers wait in a FIFO queue; the next one gets a
clear ``busy`` :class:`~agentrl.errors.SandboxError` at once, and a waiter that has waited ``acquire_timeout``
seconds gets one too. Nothing ever spawns beyond the cap.

Starting is capped apart from living: at most ``max_starting`` sandboxes start (or reset, which starts a
fresh session) at once, and the rest queue for a start in arrival order: hundreds of sandboxes starting
together fail where a few at a time succeed. Each start has its own deadline (``start_timeout``): a sandbox
that does not come up in time is closed, its slot freed, and the caller gets a
:class:`~agentrl.errors.SandboxError` (an infrastructure failure).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from agentrl.errors import ConfigError, SandboxError
from agentrl.execution import ExecResult
from agentrl.protocols import Sandbox
from agentrl.types import ToolStatus

__all__ = ["EPISODE_WAITING_FACTOR", "MAX_STARTING_ENV", "PoolStats", "SandboxPool", "rollout_pool"]

log = logging.getLogger(__name__)

MAX_STARTING_ENV = "AGENTRL_SANDBOX_MAX_STARTING"
"""Environment variable with the default ``max_starting`` of every pool (the trainers' pools included)."""
_DEFAULT_MAX_STARTING = 4


def default_max_starting() -> int:
    """``$AGENTRL_SANDBOX_MAX_STARTING``, else 4. A value that is not a positive integer is an error."""
    raw = os.environ.get(MAX_STARTING_ENV, "").strip()
    if not raw:
        return _DEFAULT_MAX_STARTING
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(
            f"{MAX_STARTING_ENV}={raw!r} must be a positive integer (sandboxes starting at once)"
        )
    return value


@dataclass(frozen=True, slots=True)
class PoolStats:
    """A snapshot of the pool."""

    live: int
    """Sandboxes alive (idle, in use or resetting)."""
    idle: int
    """Warm sandboxes ready to hand out."""
    in_use: int
    """Sandboxes held by callers."""
    waiting: int
    """Callers queued for a sandbox."""
    busy_rejections: int
    """Acquisitions refused because the pool was saturated."""
    resets: int
    """Sandboxes reset on release so far."""
    starting: int
    """Sandboxes starting or resetting now (at most ``max_starting``)."""
    start_waiting: int
    """Starts and resets queued behind ``max_starting``."""
    most_starting: int
    """The most sandboxes ever starting or resetting at once."""


class SandboxPool:
    """A bounded pool of sandboxes made by ``factory``; a :class:`~agentrl.protocols.SandboxSource`.

    Args:
        factory: makes a new, not yet started sandbox (e.g. ``lambda: LocalSandbox(limits)``).
        size: most sandboxes alive at once.
        max_waiting: most callers queued when all ``size`` are in use; beyond that ``acquire`` fails fast.
        acquire_timeout: most seconds a queued caller waits.
        warm: sandboxes to start ahead of demand in :meth:`start` (default: ``min(size, 2)``).
        max_starting: most sandboxes starting at once; later starts queue in arrival order (default:
            ``$AGENTRL_SANDBOX_MAX_STARTING``, else 4).
        start_timeout: most seconds one sandbox may take to start (after its turn in the start queue);
            one that takes longer is closed and the caller gets a :class:`~agentrl.errors.SandboxError`.
    """

    def __init__(
        self,
        factory: Callable[[], Sandbox],
        *,
        size: int = 8,
        max_waiting: int = 64,
        acquire_timeout: float = 30.0,
        warm: int | None = None,
        max_starting: int | None = None,
        start_timeout: float = 60.0,
    ):
        if size < 1 or max_waiting < 0 or acquire_timeout <= 0:
            raise ConfigError("size must be >= 1, max_waiting >= 0 and acquire_timeout > 0")
        max_starting = default_max_starting() if max_starting is None else max_starting
        if isinstance(max_starting, bool) or not isinstance(max_starting, int) or max_starting < 1:
            raise ConfigError(f"max_starting must be a positive int, got {max_starting!r}")
        if not 0 < start_timeout < float("inf"):
            raise ConfigError(
                f"start_timeout must be a positive finite number of seconds, got {start_timeout!r}"
            )
        self._factory = factory
        self.size = size
        self.max_waiting = max_waiting
        self.acquire_timeout = acquire_timeout
        self._warm = min(size, 2) if warm is None else max(0, min(size, warm))
        self.max_starting = max_starting
        self.start_timeout = float(start_timeout)
        # asyncio.Semaphore wakes its waiters in arrival order: the start queue is FIFO.
        self._start_gate = asyncio.Semaphore(max_starting)
        self._starting = 0
        self._start_waiting = 0
        self._most_starting = 0
        self._idle: deque[Sandbox] = deque()
        self._waiters: deque[asyncio.Future[Sandbox | None]] = deque()
        self._live = 0
        self._in_use = 0
        self._busy = 0
        self._resets = 0
        self._closed = False
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> SandboxPool:
        """Reap the cgroups dead agentrl processes left (:func:`~agentrl.sandbox._reaper.reap_cgroups`), then
        start ``warm`` sandboxes now so the first episodes do not pay for start-up."""
        from ._reaper import reap_cgroups  # here: a pool of docker or e2b sandboxes never needs it

        # A rollout worker SIGKILLed while it held sandboxes ran no clean-up; its replacement starts a pool.
        await asyncio.to_thread(reap_cgroups)
        need = max(0, self._warm - self._live)
        self._live += need
        made = await asyncio.gather(*(self._new() for _ in range(need)), return_exceptions=True)
        failed = [e for e in made if isinstance(e, BaseException)]
        self._live -= len(failed)
        for sb in made:
            if not isinstance(sb, BaseException):
                self._give(sb)
        if failed:
            # The caller gets no pool to close (``async with`` never reaches __aexit__), so the sandboxes
            # that did start are closed here rather than left running.
            await self.close()
            raise SandboxError(
                f"sandbox pool could not start {len(failed)} of {need} warm sandboxes: {failed[0]}"
            ) from failed[0]
        return self

    async def close(self) -> None:
        """Close every idle sandbox now and every in-use one when it is released. Idempotent."""
        self._closed = True
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_exception(SandboxError("sandbox pool is closed"))
        idle, self._idle = list(self._idle), deque()
        for sb in idle:
            self._spawn(self._discard(sb))
        # Recycling tasks may spawn discards of their own; wait until nothing is left in flight.
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def __aenter__(self) -> SandboxPool:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def stats(self) -> PoolStats:
        """A snapshot of the pool's counters."""
        return PoolStats(
            live=self._live,
            idle=len(self._idle),
            in_use=self._in_use,
            waiting=sum(1 for w in self._waiters if not w.done()),
            busy_rejections=self._busy,
            resets=self._resets,
            starting=self._starting,
            start_waiting=self._start_waiting,
            most_starting=self._most_starting,
        )

    # -- acquire / release -------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[Sandbox]:
        """Borrow a fresh sandbox for one episode; it is reset (all state gone) when the block exits.

        Raises:
            SandboxError: the pool is saturated ("busy"), closed, or a sandbox could not be started.
        """
        sb = await self._acquire()
        self._in_use += 1
        try:
            yield sb
        finally:
            self._in_use -= 1
            self._spawn(self._recycle(sb))

    async def run_once(self, code: str, *, timeout: float | None = None) -> ExecResult:
        """Run ``code`` on a pooled sandbox; a saturated pool answers with a ``sandbox_error`` result."""
        try:
            async with self.acquire() as sb:
                return await sb.run(code, timeout=timeout)
        except SandboxError as e:
            return ExecResult(ToolStatus.SANDBOX_ERROR, message=str(e))

    async def _acquire(self) -> Sandbox:
        if self._closed:
            raise SandboxError("sandbox pool is closed")
        if self._idle:
            return self._idle.popleft()
        if self._live < self.size:
            return await self._new_in_slot()
        waiting = sum(1 for w in self._waiters if not w.done())
        if waiting >= self.max_waiting:
            self._busy += 1
            raise SandboxError(
                f"sandbox pool busy: all {self.size} sandboxes in use and {waiting} callers already "
                "waiting; retry later or raise the pool size"
            )
        fut: asyncio.Future[Sandbox | None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            got = await asyncio.wait_for(asyncio.shield(fut), self.acquire_timeout)
        except TimeoutError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                got = fut.result()  # handed over at the last moment
            else:
                fut.cancel()
                self._busy += 1
                raise SandboxError(
                    f"sandbox pool busy: no sandbox became free within {self.acquire_timeout:g} s"
                ) from None
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._hand_back(fut.result())
            fut.cancel()
            raise
        if got is None:  # a slot (not a sandbox) was freed: make one
            return await self._new_in_slot()
        return got

    def _hand_back(self, sb: Sandbox | None) -> None:
        if sb is None:
            self._wake_slot()
        else:
            self._give(sb)

    async def _new_in_slot(self) -> Sandbox:
        """A new sandbox in a slot taken now; a failed start frees the slot for the first waiter."""
        # The count goes up before the first await, so concurrent callers never pass the cap.
        self._live += 1
        try:
            return await self._new()
        except BaseException:
            self._live -= 1
            self._wake_slot()
            raise

    @contextlib.asynccontextmanager
    async def _start_permit(self) -> AsyncIterator[None]:
        """One of the ``max_starting`` permits, waited for in arrival order (a start or a reset holds one)."""
        self._start_waiting += 1
        try:
            await self._start_gate.acquire()
        finally:
            self._start_waiting -= 1
        self._starting += 1
        self._most_starting = max(self._most_starting, self._starting)
        try:
            yield
        finally:
            self._starting -= 1
            self._start_gate.release()

    async def _new(self) -> Sandbox:
        """A started sandbox: wait for a start permit (FIFO), then start one within ``start_timeout``."""
        async with self._start_permit():
            sb = self._factory()
            try:
                async with asyncio.timeout(self.start_timeout):
                    await sb.__aenter__()
            except BaseException as e:
                with contextlib.suppress(BaseException):
                    await sb.close()
                if isinstance(e, SandboxError | asyncio.CancelledError):
                    raise
                if isinstance(e, TimeoutError):
                    raise SandboxError(
                        f"sandbox did not start within {self.start_timeout:g} s (start_timeout); closed it"
                    ) from None
                raise SandboxError(f"sandbox failed to start: {e}") from e
            return sb

    def _give(self, sb: Sandbox) -> None:
        """Hand a ready sandbox to the first live waiter, or park it as idle."""
        if self._closed:
            self._spawn(self._discard(sb))
            return
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(sb)
                return
        self._idle.append(sb)

    def _wake_slot(self) -> None:
        """A sandbox died: let the first waiter create a new one in its place."""
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(None)
                return

    async def _recycle(self, sb: Sandbox) -> None:
        if self._closed:
            await self._discard(sb)
            return
        try:
            # A reset starts a fresh session: it takes a start permit and has the start's deadline.
            async with self._start_permit(), asyncio.timeout(self.start_timeout):
                await sb.reset()
            self._resets += 1
        except BaseException as e:
            log.warning("sandbox reset failed, replacing it: %s", e)
            await self._discard(sb)
            self._wake_slot()
            return
        self._give(sb)

    async def _discard(self, sb: Sandbox) -> None:
        try:
            await sb.close()
        except Exception as e:  # closing must not take the pool down
            log.warning("closing a sandbox failed: %s", e)
        finally:
            self._live -= 1

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


EPISODE_WAITING_FACTOR = 4
"""A rollout's pool queues up to this many episodes per sandbox before it answers ``busy``."""


def rollout_pool(
    concurrency: int,
    *,
    max_starting: int | None = None,
    factory: Callable[[], Sandbox] | None = None,
) -> SandboxPool:
    """The pool a run's episodes share, the one factory of it (the trainer, its rollout workers and its
    held-out evaluation all build theirs here): one sandbox per episode in flight (``concurrency``,
    ``--rollout.concurrency``), :data:`EPISODE_WAITING_FACTOR` times as many episodes waiting, and at most
    ``max_starting`` sandboxes starting at once (None: ``$AGENTRL_SANDBOX_MAX_STARTING``, else 4).

    Args:
        concurrency: Episodes in flight at once; a positive int.
        max_starting: Sandboxes that may start (or reset) at once.
        factory: Makes one sandbox session (default: :class:`agentrl.sandbox.LocalSandbox`).

    Raises:
        ConfigError: ``concurrency`` or ``max_starting`` is not a positive int.
    """
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(f"a rollout pool needs a positive int concurrency, got {concurrency!r}")
    if factory is None:
        from .local import LocalSandbox  # here, not at the top: pool.py serves every backend

        factory = LocalSandbox
    return SandboxPool(
        factory,
        size=concurrency,
        max_waiting=EPISODE_WAITING_FACTOR * concurrency,
        max_starting=max_starting,
    )
