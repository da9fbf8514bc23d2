"""trim_heap gives the free pages inside glibc's heaps back: RSS falls after small allocations with holes."""

import platform

import pytest

from agentrl.heap import M_TRIM_THRESHOLD, heap_info, mallopt, trim_heap


def rss_mib() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS")) / 1024


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_trim_returns_the_free_pages_left_between_live_allocations():
    assert mallopt(M_TRIM_THRESHOLD, 2**30)  # free() alone never trims, as in a long run's heaps
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
        mallopt(M_TRIM_THRESHOLD, 128 * 1024)  # glibc's default
    assert len(keep) == 512
    assert before - after > 150, (before, after)  # of the ~224 MiB freed, most goes back


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallinfo2 is glibc's")
def test_heap_info_sees_a_live_heap_allocation():
    before = heap_info()
    assert before is not None and set(before) == {"heap_used", "heap_free", "mmapped"}
    blocks = [bytearray(64 * 1024) for _ in range(256)]  # 16 MiB from the heap (under the mmap threshold)
    after = heap_info()
    assert after is not None and after["heap_used"] - before["heap_used"] > 12 * 2**20
    assert len(blocks) == 256
