"""Bounded capture of one output stream: keep the head and the tail, count the rest, decode defensively."""

from __future__ import annotations

__all__ = ["Capture", "decode"]


def decode(data: bytes | bytearray) -> str:
    """Bytes from the sandbox as text that is always valid UTF-8 (invalid bytes and lone surrogates become
    U+FFFD), so results are JSON-safe whatever the code wrote."""
    return bytes(data).decode("utf-8", errors="replace")


def _char_start(buf: bytes | bytearray, i: int) -> int:
    """The largest cut point <= ``i`` that does not split a UTF-8 character."""
    if i >= len(buf):
        return len(buf)
    j = i
    while j > 0 and i - j < 3 and (buf[j] & 0xC0) == 0x80:
        j -= 1
    return j


def _char_next(buf: bytes | bytearray, i: int) -> int:
    """The smallest cut point >= ``i`` that does not split a UTF-8 character."""
    j = i
    while j < len(buf) and j - i < 3 and (buf[j] & 0xC0) == 0x80:
        j += 1
    return j


class Capture:
    """Keeps at most ``limit`` bytes of a stream: the first half and the last half, with a marker between.

    Memory stays bounded whatever the code writes; ``total`` counts every byte seen so the caller can
    enforce a hard cap.
    """

    __slots__ = ("_head", "_limit", "_tail", "_tail_cut", "total")

    def __init__(self, limit: int):
        self._limit = max(16, int(limit))
        self._head = bytearray()
        self._tail = bytearray()
        self._tail_cut = False
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self._limit - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail += data
            keep = self._limit // 2
            if len(self._tail) > 2 * keep:
                del self._tail[: len(self._tail) - keep]
                self._tail_cut = True

    @property
    def truncated(self) -> bool:
        return self.total > self._limit

    def text(self) -> str:
        if not self.truncated:
            return decode(self._head)
        half = self._limit // 2
        if self._tail_cut:
            head, tail = self._head, self._tail
        else:
            whole = self._head + self._tail
            head, tail = whole[: len(whole) - half], whole[len(whole) - half :]
        head_end = _char_start(head, min(half, len(head)))
        tail = tail[-half:]
        tail_start = _char_next(tail, 0)
        kept = head_end + (len(tail) - tail_start)
        omitted = self.total - kept
        marker = f"\n[... {omitted:,} bytes of output omitted ...]\n"
        return decode(head[:head_end]) + marker + decode(tail[tail_start:])
