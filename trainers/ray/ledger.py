"""The controller's group ledger: every prompt group a run issues, and what became of it.

A group (one task, ``group_size`` episodes) moves through::

    pending ──lease──▶ leased (worker, deadline, attempt) ──complete──▶ done ──trained──▶ trained
       ▲                  │ worker died / lease expired                   (in a batch)
       └──────release─────┘ (attempt + 1; after max_attempts: dropped with the reason)
    pending / leased ──abandon──▶ dropped   (the trainer trained the step without it)

Identity. A group is keyed by ``(step, seed)``; each lease is one *attempt* and gets its own ``group_id``
(``s<step>-t<seed>-a<attempt>``) and episode ids (``<group_id>-m<member>``). A result is accepted only from
the attempt that holds the lease; a late result of an earlier attempt (a worker presumed dead that was only
slow) is discarded, so nothing is trained on twice, and trajectories of two attempts never mix in one group
on disk.

Accounting. ``issued = trained + dropped + in flight`` (pending, leased, or done but not yet trained) holds at
every moment; :meth:`GroupLedger.check` verifies it and the trainer calls it at the end of every step. The
unit is the group, so the same holds for episodes (``group_size`` per group): an episode that compacted its
context is several trajectories (samples) but one member, completed, trained or dropped with its group,
never in part (docs/otb-multisample.md).

Persistence. Every transition is one JSON line appended (and flushed) to ``<run>/ledger.jsonl``; reopening
the file replays it. Leases do not survive the driver: on reload a leased group is pending again.

Asynchronous training (``--max-staleness S``) keeps several steps' groups in flight at once: the trainer's
:class:`agentrl.staleness.Admission` decides which group may start, and each group's rollout leases only its
own keys (:meth:`GroupLedger.lease` with ``keys``). A group the trainer gives up (a straggler under
``--on-stale drop``) is abandoned: dropped, with its reason, and any late result of it discarded.
:meth:`GroupLedger.lease` also takes a ``limit`` on groups in flight (leased + done-but-untrained) for a
controller that admits by count alone.

Restart budgets. :class:`RestartBudget` counts the controller's restarts of one kind (rollout workers it
replaced, inference servers Ray restarted) over a sliding time window: a long run goes on through faults that
come now and then, and gives up on a crash loop.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

from agentrl.errors import AgentRLError, ConfigError, InfraError, StoreError
from agentrl.run import LEDGER_FILE

__all__ = [
    "LEDGER_FILE",
    "GroupKey",
    "GroupLedger",
    "GroupState",
    "LedgerEntry",
    "LedgerError",
    "RestartBudget",
]

GroupKey = tuple[int, int]
"""``(step, task seed)``: what a group is, independent of which attempt ran it."""


class LedgerError(AgentRLError):
    """The ledger's accounting broke (a bug in the controller, never a worker's fault)."""


class GroupState(StrEnum):
    """Where a group is."""

    PENDING = "pending"
    """Waiting for a worker."""
    LEASED = "leased"
    """A worker runs it until the lease's deadline."""
    DONE = "done"
    """Its trajectories came back and were handed to the trainer."""
    TRAINED = "trained"
    """A learner update consumed it."""
    DROPPED = "dropped"
    """Given up (too many failed attempts); ``reason`` says why."""


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One group's record."""

    step: int
    """Training step it belongs to."""
    seed: int
    """Task seed (every member resets its env with it)."""
    state: GroupState = GroupState.PENDING
    """Where it is now."""
    attempt: int = 0
    """Attempts started so far (the current lease is attempt ``attempt - 1``... see :attr:`group_id`)."""
    worker: str = ""
    """The worker holding the lease (empty unless leased)."""
    deadline: float = 0.0
    """``time.time()`` after which the lease is taken back."""
    reason: str = ""
    """Why it was last released or dropped."""

    @property
    def key(self) -> GroupKey:
        """``(step, seed)``."""
        return (self.step, self.seed)

    @property
    def group_id(self) -> str:
        """The group id of the current (or last) attempt: ``s<step>-t<seed>-a<attempt>``."""
        return group_id(self.step, self.seed, max(self.attempt - 1, 0))


def group_id(step: int, seed: int, attempt: int) -> str:
    """The group id of one attempt at ``(step, seed)``."""
    return f"s{step}-t{seed}-a{attempt}"


_IN_FLIGHT = frozenset({GroupState.PENDING, GroupState.LEASED, GroupState.DONE})


class GroupLedger:
    """The controller's record of groups (see the module doc). Not thread-safe: the controller's event loop
    owns it."""

    def __init__(self, path: Path | None = None, *, lease_s: float = 600.0, max_attempts: int = 3):
        if not lease_s > 0:
            raise ConfigError(f"lease_s must be > 0, got {lease_s!r}")
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise ConfigError(f"max_attempts must be a positive int, got {max_attempts!r}")
        self.lease_s = float(lease_s)
        self.max_attempts = max_attempts
        self.entries: dict[GroupKey, LedgerEntry] = {}
        self.discarded = 0
        """Late results of an attempt that no longer held the lease (never trained on)."""
        self.released = 0
        """Leases taken back (worker death, expiry) so far."""
        self._log: IO[str] | None = None
        if path is not None:
            if path.exists():
                self._replay(path)
            self._log = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the run

    # --- persistence -----------------------------------------------------------------------------
    def _write(self, event: str, e: LedgerEntry) -> None:
        if self._log is None:
            return
        rec: dict[str, Any] = {"ev": event, "step": e.step, "seed": e.seed, "attempt": e.attempt}
        if e.worker:
            rec["worker"] = e.worker
        if e.reason:
            rec["reason"] = e.reason
        self._log.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self._log.flush()

    def _replay(self, path: Path) -> None:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise StoreError(f"{path}: cannot read the ledger: {e}") from e
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                key = (int(rec["step"]), int(rec["seed"]))
                state = {
                    "issue": GroupState.PENDING,
                    "lease": GroupState.LEASED,
                    "done": GroupState.DONE,
                }.get(rec["ev"]) or GroupState(rec["ev"] if rec["ev"] != "release" else "pending")
            except (ValueError, KeyError, TypeError) as e:
                if n == len(lines):  # a line cut by a kill mid-write: the transition did not happen
                    with open(path, "r+b") as f:
                        f.truncate(len("".join(x + "\n" for x in lines[:-1]).encode()))
                    break
                raise StoreError(f"{path}:{n}: not a ledger record: {line[:80]!r}") from e
            self.entries[key] = LedgerEntry(
                key[0], key[1], state, int(rec.get("attempt", 0)), reason=str(rec.get("reason", ""))
            )
        for key, entry in self.entries.items():
            if entry.state is GroupState.LEASED:  # its worker belonged to the driver that died
                self.entries[key] = replace(entry, state=GroupState.PENDING, reason="driver restarted")

    def close(self) -> None:
        """Close the ledger file."""
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> GroupLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- transitions ------------------------------------------------------------------------------
    def issue(self, step: int, seeds: Iterable[int]) -> list[GroupKey]:
        """Make a group of ``step`` for each seed pending (again), and return their keys.

        A group already known and not trained (a resumed step whose results never reached the trainer's
        disk whole) is issued again as a new attempt; a trained or dropped group is an error: the trainer
        never asks for it twice."""
        keys = []
        for seed in seeds:
            key = (step, seed)
            old = self.entries.get(key)
            if old is not None and old.state in (GroupState.TRAINED, GroupState.DROPPED):
                raise LedgerError(f"group {key} is already {old.state.value}; it cannot be issued again")
            e = LedgerEntry(step, seed, GroupState.PENDING, old.attempt if old else 0)
            self.entries[key] = e
            self._write("issue", e)
            keys.append(key)
        return keys

    def in_flight(self) -> int:
        """Groups leased, or done and waiting for the learner (what an admission bound counts)."""
        return sum(e.state in (GroupState.LEASED, GroupState.DONE) for e in self.entries.values())

    def lease(
        self,
        worker: str,
        *,
        keys: Collection[GroupKey] | None = None,
        limit: int | None = None,
        now: float | None = None,
    ) -> LedgerEntry | None:
        """Lease the oldest pending group (of ``keys``, when given) to ``worker``; None when nothing is
        pending (or ``limit`` groups are already in flight). Several callers leasing at once (asynchronous
        training runs a rollout per group) each lease only their own keys."""
        if limit is not None and self.in_flight() >= limit:
            return None
        for key, e in self.entries.items():
            if e.state is GroupState.PENDING and (keys is None or key in keys):
                t = time.time() if now is None else now
                leased = replace(
                    e,
                    state=GroupState.LEASED,
                    attempt=e.attempt + 1,
                    worker=worker,
                    deadline=t + self.lease_s,
                )
                self.entries[key] = leased
                self._write("lease", leased)
                return leased
        return None

    def complete(self, key: GroupKey, gid: str) -> bool:
        """The worker's result for attempt ``gid`` came back: True when it is accepted (the group is now
        done), False for a late duplicate (counted in :attr:`discarded`, never trained on)."""
        e = self.entries.get(key)
        if e is None or e.state is not GroupState.LEASED or e.group_id != gid:
            self.discarded += 1
            return False
        done = replace(e, state=GroupState.DONE, worker="", deadline=0.0)
        self.entries[key] = done
        self._write("done", done)
        return True

    def release(self, key: GroupKey, gid: str, reason: str) -> None:
        """Take back the lease of attempt ``gid`` (its worker died or failed): pending again, or dropped
        with ``reason`` once ``max_attempts`` attempts failed. A release of an attempt that no longer holds
        the lease does nothing."""
        e = self.entries.get(key)
        if e is None or e.state is not GroupState.LEASED or e.group_id != gid:
            return
        self.released += 1
        if e.attempt >= self.max_attempts:
            out = replace(e, state=GroupState.DROPPED, worker="", reason=f"{reason} ({e.attempt} attempts)")
            self._write("dropped", out)
        else:
            out = replace(e, state=GroupState.PENDING, worker="", deadline=0.0, reason=reason)
            self._write("release", out)
        self.entries[key] = out

    def expired(self, now: float | None = None) -> list[LedgerEntry]:
        """Leases past their deadline (the caller releases them)."""
        t = time.time() if now is None else now
        return [e for e in self.entries.values() if e.state is GroupState.LEASED and e.deadline < t]

    def mark_trained(self, keys: Iterable[GroupKey]) -> None:
        """A learner update consumed these done groups."""
        for key in keys:
            e = self.entries.get(key)
            if e is None or e.state is not GroupState.DONE:
                raise LedgerError(f"group {key} was trained on but is {e.state.value if e else 'unknown'}")
            out = replace(e, state=GroupState.TRAINED)
            self.entries[key] = out
            self._write("trained", out)

    def drop(self, key: GroupKey, reason: str) -> None:
        """Give up a done group the trainer cannot use (every episode an infrastructure failure)."""
        e = self.entries.get(key)
        if e is None or e.state is not GroupState.DONE:
            raise LedgerError(f"group {key} cannot be dropped: it is {e.state.value if e else 'unknown'}")
        out = replace(e, state=GroupState.DROPPED, reason=reason)
        self.entries[key] = out
        self._write("dropped", out)

    def abandon(self, key: GroupKey, reason: str) -> None:
        """Give up a group that is still pending or leased because the trainer no longer wants it (a
        straggler of a step that trained without it); a late result of its attempt is then discarded."""
        e = self.entries.get(key)
        if e is None or e.state not in (GroupState.PENDING, GroupState.LEASED):
            raise LedgerError(f"group {key} cannot be abandoned: it is {e.state.value if e else 'unknown'}")
        out = replace(e, state=GroupState.DROPPED, worker="", deadline=0.0, reason=reason)
        self.entries[key] = out
        self._write("dropped", out)

    def rewind(self, step: int) -> None:
        """A resume from the checkpoint of ``step``: the updates of that step and later were lost with the
        driver, so their trained groups are only done again (the trainer may reuse or re-issue them) and
        their dropped groups pending again (the redone step decides afresh)."""
        for key, e in list(self.entries.items()):
            if e.step >= step and e.state is GroupState.TRAINED:
                out = replace(e, state=GroupState.DONE)
                self.entries[key] = out
                self._write("done", out)
            elif e.step >= step and e.state is GroupState.DROPPED:
                out = replace(e, state=GroupState.PENDING, reason="resumed")
                self.entries[key] = out
                self._write("release", out)

    # --- accounting -------------------------------------------------------------------------------
    def counts(self, step: int | None = None) -> dict[str, int]:
        """How many groups (of ``step``, or of the whole run) are in each state, plus ``issued``."""
        out = {s.value: 0 for s in GroupState}
        for e in self.entries.values():
            if step is None or e.step == step:
                out[e.state.value] += 1
        out["issued"] = sum(out[s.value] for s in GroupState)
        return out

    def check(self, step: int | None = None, *, settled: bool = False) -> dict[str, int]:
        """Verify ``issued = trained + dropped + in flight`` (with ``settled``: nothing in flight any more,
        i.e. the step is over); return the counts. Raises :class:`LedgerError` when it does not hold."""
        c = self.counts(step)
        in_flight = sum(c[s.value] for s in _IN_FLIGHT)
        if c["issued"] != c["trained"] + c["dropped"] + in_flight:
            raise LedgerError(f"ledger accounting broken: {c}")
        if settled and in_flight:
            raise LedgerError(f"step {step} ended with {in_flight} groups still in flight: {c}")
        return c

    def dropped(self, step: int) -> list[LedgerEntry]:
        """Groups of ``step`` given up, with their reasons."""
        return [e for e in self.entries.values() if e.step == step and e.state is GroupState.DROPPED]


class RestartBudget:
    """At most ``limit`` restarts of one kind within any ``window_s`` seconds.

    A budget per window rather than per run: a budget over a run's (or a driver's) whole life ends a day-long
    run at its Nth fault however far apart the faults came, while this one is spent only by a burst (a crash
    loop, a node that keeps dying) and refills as its restarts age out of the window.

    Args:
        what: The restarts counted, plural, for the error (``"rollout worker replacements"``).
        limit: Restarts allowed within any window; a non-negative int.
        window_s: The window's length in seconds; > 0.
        clock: Seconds, monotonic (a test passes a fake one).

    Raises:
        ConfigError: ``limit`` or ``window_s`` is out of range.
    """

    def __init__(
        self, what: str, limit: int, window_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ConfigError(f"a restart budget ({what}) must be an int >= 0, got {limit!r}")
        if not window_s > 0:
            raise ConfigError(f"a restart budget's window ({what}) must be > 0 seconds, got {window_s!r}")
        self.what, self.limit, self.window_s, self.clock = what, limit, float(window_s), clock
        self.total = 0
        """Restarts spent over the budget's whole life."""
        self._times: deque[float] = deque()

    def used(self) -> int:
        """Restarts within the last ``window_s`` seconds."""
        now = self.clock()
        while self._times and self._times[0] <= now - self.window_s:
            self._times.popleft()
        return len(self._times)

    def spend(self) -> None:
        """Count one restart now.

        Raises:
            InfraError: ``limit`` restarts were already spent within the window (the run gives up).
        """
        if self.used() >= self.limit:
            raise InfraError(
                f"{self.used()} {self.what} within {self.window_s:g} s, the budget is {self.limit} per "
                f"{self.window_s:g} s; giving up (a crash loop?)"
            )
        self._times.append(self.clock())
        self.total += 1
