"""trim_heap gives the free pages inside glibc's heaps back: RSS falls after small allocations with holes."""

import ctypes
import platform

import pytest

from agentrl.heap import trim_heap

M_TRIM_THRESHOLD = -1


def rss_mib() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS")) / 1024


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_trim_returns_the_free_pages_left_between_live_allocations():
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(M_TRIM_THRESHOLD, 2**30)  # free() alone never trims, as in a long run's heaps
    try:
        # 64 KiB blocks come from malloc (not pymalloc, not mmap); keeping every 8th one alive leaves the
        # freed pages in holes below live blocks, where free() cannot give them back.
        blocks = [bytearray(64 * 1024) for _ in range(4096)]  # 256 MiB, touched
        keep = blocks[::8]
        del blocks
        before = rss_mib()
        trim_heap()
        after = rss_mib()
    finally:
        libc.mallopt(M_TRIM_THRESHOLD, 128 * 1024)  # glibc's default
    assert len(keep) == 512
    assert before - after > 150, (before, after)  # of the ~224 MiB freed, most goes back
