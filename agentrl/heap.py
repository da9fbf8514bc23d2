"""glibc's malloc, in one place: returning freed heap memory to the OS, and reading what the heaps hold.

Allocations under glibc's mmap threshold (Python objects, autograd's bookkeeping, small tensors, tokenizer
and sandbox buffers) come from the malloc heaps, and the pages they free stay resident until trimmed. In the
default SmolLM2 run that is 0.3–0.9 GiB at any moment, on top of which the learner's backward peaks.

Every call here is a no-op (or answers None) on other C libraries, so callers need no platform checks.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

__all__ = [
    "M_ARENA_MAX",
    "M_MMAP_THRESHOLD",
    "M_TRIM_THRESHOLD",
    "heap_info",
    "mallopt",
    "return_freed_memory",
    "trim_heap",
]

M_TRIM_THRESHOLD = -1
"""``mallopt`` parameter: free space at the top of a heap above which ``free`` trims it (glibc: 128 KiB)."""
M_MMAP_THRESHOLD = -3
"""``mallopt`` parameter: allocations of at least this many bytes get their own mapping."""
M_ARENA_MAX = -8
"""``mallopt`` parameter: the most malloc arenas (heaps) the threads of the process may create."""


@functools.cache
def _libc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


def trim_heap() -> None:
    """Give the free pages inside glibc's heaps back to the OS (``malloc_trim(0)``, a few ms); no-op on
    other C libraries."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def mallopt(param: int, value: int) -> bool:
    """Set a malloc parameter (``M_TRIM_THRESHOLD``, ``M_MMAP_THRESHOLD``, ``M_ARENA_MAX``); False when
    glibc refused it or the C library is not glibc."""
    libc = _libc()
    return libc is not None and bool(libc.mallopt(param, value))


def return_freed_memory() -> None:
    """Let freed tensors go back to the OS (called once, before a run's first step).

    glibc raises its mmap threshold each time a large block is freed, after which tensors of up to 32 MiB
    come from the heaps of several threads' arenas, where freed space stays resident (fragmentation: RSS
    grows by GiBs over a run though the live tensors do not). A fixed 1 MiB threshold gives every larger
    tensor its own mapping, returned to the OS when freed. No-op on other C libraries."""
    mallopt(M_MMAP_THRESHOLD, 1 << 20)  # fixing it also stops the dynamic adjustment
    mallopt(M_ARENA_MAX, 2)  # the event loop, the engine's thread and torch's workers


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap_info() -> dict[str, int] | None:
    """Bytes in use on the malloc heaps (``heap_used``), held free in them (``heap_free``) and in mmapped
    chunks (``mmapped``), from glibc's ``mallinfo2`` (glibc ≥ 2.33); None elsewhere."""
    libc = _libc()
    fn = getattr(libc, "mallinfo2", None)
    if fn is None:
        return None
    fn.restype = _MallInfo2
    mi = fn()
    return {"heap_used": int(mi.uordblks), "heap_free": int(mi.fordblks), "mmapped": int(mi.hblkhd)}
