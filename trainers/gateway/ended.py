"""The ids of sessions that ended, remembered for a bounded time and count.

A client may send one more request after its session ended (a retry, an agent that missed the finish, one
that was idle past ``--session-timeout``); it must be told with a 409 why (``session_finished``,
``session_expired``), not silently given a new session of the same id. Remembering every id forever would
grow a long-lived gateway's memory by one entry per session, so :class:`EndedSessions` keeps each id for
``keep_s`` seconds after it ended, and at most ``max_ids`` ids (the oldest go first). A request for an id
forgotten after that is a request for an unknown session: a 404 with ``auto_sessions`` off, a new session
with it on.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

from agentrl.errors import ConfigError

from .session import Session
from .wire import GatewayError

__all__ = ["Awaiting", "Ended", "EndedSessions", "Why"]

Why = Literal["finished", "expired", "unrewarded"]
"""How a session ended: finished by its client (recorded, or awaiting its reward), closed by the idle
timeout, or recorded as never rewarded (its reward deadline passed)."""


@dataclass(frozen=True, slots=True)
class Ended:
    """What a late request to an ended session is told."""

    why: Why
    at: float
    """``time.monotonic()`` when it was marked (the time it is kept for counts from here)."""
    timeout: float = 0.0
    """For ``expired``: the idle timeout that closed it (said in the error)."""


@dataclass(frozen=True, slots=True)
class Awaiting:
    """A session that ended without its reward (``finish`` without one), until the reward or the deadline."""

    session: Session
    info: dict[str, Any]
    """The ``info`` given when it ended (a later post's ``info`` is merged over it)."""
    deadline: float
    """``time.monotonic()`` after which it is recorded as never rewarded."""


class EndedSessions:
    """Session ids that ended, each kept ``keep_s`` seconds, at most ``max_ids`` of them (oldest first out).

    Args:
        keep_s: How long after it ended a session's id is remembered.
        max_ids: The most ids remembered at once (each costs a few hundred bytes).
    """

    def __init__(self, *, keep_s: float = 3600.0, max_ids: int = 100_000):
        if not (isinstance(keep_s, int | float) and math.isfinite(keep_s) and keep_s > 0):
            raise ConfigError(f"ended sessions must be remembered for > 0 seconds, got {keep_s!r}")
        if isinstance(max_ids, bool) or not isinstance(max_ids, int) or max_ids < 1:
            raise ConfigError(f"the number of ended sessions remembered must be an int >= 1, got {max_ids!r}")
        self.keep_s = float(keep_s)
        self.max_ids = max_ids
        self._ids: OrderedDict[str, Ended] = OrderedDict()
        """Oldest mark first (a new mark moves the id to the end)."""

    def mark(self, sid: str, why: Why, *, timeout: float = 0.0, now: float | None = None) -> list[str]:
        """Remember that ``sid`` ended (again: the newer mark replaces the older); return the ids forgotten to
        make room or because their time ran out."""
        now = time.monotonic() if now is None else now
        self._ids.pop(sid, None)
        self._ids[sid] = Ended(why, now, timeout)
        return self.prune(now)

    def prune(self, now: float | None = None) -> list[str]:
        """Forget the ids kept longer than ``keep_s``, and the oldest beyond ``max_ids``; return them."""
        now = time.monotonic() if now is None else now
        gone = []
        while self._ids:
            sid, e = next(iter(self._ids.items()))
            if len(self._ids) <= self.max_ids and now - e.at <= self.keep_s:
                break
            del self._ids[sid]
            gone.append(sid)
        return gone

    def refusal(self, sid: str, *, awaiting: bool) -> GatewayError:
        """The 409 a request to ended session ``sid`` gets (``awaiting``: it waits for its reward)."""
        ended = self.get(sid)
        if ended is not None and ended.why == "expired":
            return GatewayError(
                409,
                f"session {sid!r} expired: no request for {ended.timeout:g} s (--session-timeout); it "
                "was recorded as cancelled (never trained on)",
                code="session_expired",
            )
        if awaiting:
            return GatewayError(
                409,
                f"session {sid!r} has ended and awaits its reward (POST /s/{sid}/reward)",
                code="session_finished",
            )
        return GatewayError(409, f"session {sid!r} is already finished", code="session_finished")

    def get(self, sid: str) -> Ended | None:
        """How ``sid`` ended, or None (it did not, or it was forgotten)."""
        return self._ids.get(sid)

    def __contains__(self, sid: object) -> bool:
        return sid in self._ids

    def __len__(self) -> int:
        return len(self._ids)
