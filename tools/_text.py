"""Small text helpers shared by the tools."""

from __future__ import annotations

__all__ = ["cap_text"]


def cap_text(text: str, max_chars: int) -> str:
    """Keep the head and the tail of ``text`` within about ``max_chars``, with a marker saying what was cut.

    The tail matters as much as the head: the end of a traceback or the last printed value is usually the
    part the model needs.
    """
    if len(text) <= max_chars:
        return text
    head = max_chars * 2 // 3
    tail = max_chars - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters cut ...]\n{text[-tail:]}"
