"""Run coroutines from synchronous code (the sync edges: Gymnasium bridge, CLI, check_env).

One daemon thread owns one event loop for the whole process. Synchronous callers submit coroutines to it,
which works whether or not the caller itself is inside a running loop (``asyncio.run`` would not).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="agentrl-sync", daemon=True)
            thread.start()
            _loop = loop
        return _loop


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion and return its result, from any thread, loop or no loop."""
    loop = _background_loop()
    if threading.current_thread().name == "agentrl-sync":
        raise RuntimeError("run_sync called from the agentrl-sync loop itself; await the coroutine")
    return asyncio.run_coroutine_threadsafe(coro, loop).result()
