"""Versioned, append-only JSONL trajectory store.

One trajectory per line; each line is flushed (and optionally fsynced) before ``append`` returns, so a
reader may follow the file while it is being written and a crash loses at most the line being written.
Every line carries ``schema_version`` plus, at least: ``token_ids``, ``loss_mask``, ``logprobs`` (null
where the mask is 0), ``messages`` (OpenAI format), ``reward``, ``group_id``, ``terminated``,
``truncated``.

Groups are written member by member (each trajectory the moment its episode finishes) and read back as
:class:`~agentrl.groups.TrajectoryGroup` objects by :func:`read_groups`, which rebuilds them from each line's
``meta.group_id``; files written by any earlier release read back the same way.

A store never mixes two writers' records by accident: by default it refuses to append to a file that already
holds lines it did not write itself (a re-run script would otherwise double the records); ``mode="append"``
continues such a file (a resumed run does), ``mode="overwrite"`` starts it afresh.

A torn last line (a crash mid-write, or a writer still writing it) is reported and skipped when reading.
When a writer reopens a file whose last line is torn, the fragment is moved to ``<file>.torn`` first, so
nothing is lost and later lines start cleanly.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Awaitable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

from agentrl.errors import SchemaError, StoreError
from agentrl.groups import TrajectoryGroup, group_trajectories
from agentrl.run import RunDir
from agentrl.types import Trajectory

__all__ = ["SCHEMA_VERSION", "JsonlStore", "StoreIssue", "StoreMode", "read_groups", "read_trajectories"]

StoreMode = Literal["new", "append", "overwrite"]
"""How a :class:`JsonlStore` treats a file that already holds records when it first writes: ``new`` refuses
(the default), ``append`` adds after them, ``overwrite`` replaces them."""
_MODES = ("new", "append", "overwrite")

SCHEMA_VERSION = 1
"""Version of the line format written by this release. Readers accept this version and older."""

REQUIRED_KEYS = (
    "schema_version",
    "token_ids",
    "loss_mask",
    "logprobs",
    "messages",
    "reward",
    "group_id",
    "terminated",
    "truncated",
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StoreIssue:
    """A line that could not be read."""

    path: str
    """File the line is in."""
    line: int
    """1-based line number."""
    reason: str
    """What was wrong with it."""


class _Written:
    """An awaitable that is already done: what :meth:`JsonlStore.append` returns after writing."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # a generator that finishes at once: ``await`` gets None without suspending


_WRITTEN = _Written()


class JsonlStore:
    """Append trajectories to one JSONL file; read them back (also while another process writes).

    ``mode`` says what the first write does when the file already holds records from another writer (an
    earlier run of the script, another ``collect()``): ``"new"`` (default) raises :class:`StoreError`,
    ``"append"`` continues the file, ``"overwrite"`` empties it first. The store's own lines never count: one
    store object may be closed and written again, or passed to several ``collect()`` calls.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False, mode: StoreMode = "new"):
        if mode not in _MODES:
            raise StoreError(f"JsonlStore mode must be one of {list(_MODES)}, got {mode!r}")
        self.path = Path(path)
        self.fsync = fsync
        self.mode: StoreMode = mode
        self._lock = threading.Lock()
        self._fh: TextIO | None = None  # opened lazily so a read-only user never creates the file
        self._claimed = False  # this store has opened the file for writing once: later opens append

    def _open(self) -> TextIO:
        if self._fh is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                if not self._claimed:
                    self._claim()
                _quarantine_torn_tail(self.path)
                self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
            except OSError as e:
                raise StoreError(f"cannot open trajectory store {self.path}: {e}") from e
            self._claimed = True
        return self._fh

    def _claim(self) -> None:
        """Apply :attr:`mode` to a file that already holds records (first open of this store only)."""
        held = self.path.is_file() and self.path.stat().st_size > 0
        if not held or self.mode == "append":
            return
        if self.mode == "overwrite":
            self.path.write_bytes(b"")
            return
        raise StoreError(
            f"{self.path} already holds trajectories from another run or collect() call; "
            'pass JsonlStore(..., mode="append") to add to them or mode="overwrite" to replace them '
            "(or write to a new file)"
        )

    def write(self, trajectory: Trajectory) -> None:
        """Append one trajectory and flush it (synchronous form of :meth:`append`)."""
        if not isinstance(trajectory, Trajectory):
            raise StoreError(f"can only store a Trajectory, got {type(trajectory).__name__}")
        record = {"schema_version": SCHEMA_VERSION, **trajectory.to_dict()}
        try:
            line = json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"
        except ValueError as e:
            raise StoreError(f"trajectory is not JSON-serialisable (NaN or inf?): {e}") from e
        with self._lock:
            fh = self._open()
            fh.write(line)
            fh.flush()
            if self.fsync:
                os.fsync(fh.fileno())

    def append(self, trajectory: Trajectory) -> Awaitable[None]:
        """Append one trajectory, flushed to the OS before this returns; ``await store.append(t)`` as the
        :class:`~agentrl.protocols.TrajectoryStore` contract reads. The write happens at the call, not at
        the ``await``: an ``append`` someone forgot to await still writes (an ``async def`` would silently
        write nothing)."""
        self.write(trajectory)
        return _WRITTEN

    def read(self, *, issues: list[StoreIssue] | None = None) -> Iterator[Trajectory]:
        """Iterate over the stored trajectories (see :func:`read_trajectories`)."""
        return read_trajectories(self.path, issues=issues)

    def read_groups(
        self, *, size: int | None = None, issues: list[StoreIssue] | None = None
    ) -> Iterator[TrajectoryGroup]:
        """Iterate over the stored groups (see :func:`read_groups`)."""
        return read_groups(self.path, size=size, issues=issues)

    def close(self) -> None:
        """Close the file. Further appends reopen it."""
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None

    def __enter__(self) -> JsonlStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _quarantine_torn_tail(path: Path) -> None:
    """If the file does not end with a newline, move the partial last line to ``<file>.torn``."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as fh:
        size = fh.seek(0, os.SEEK_END)
        # Walk back in blocks to the last newline; the tail after it is the torn fragment.
        pos, tail = size, b""
        while pos > 0:
            step = min(65536, pos)
            pos -= step
            fh.seek(pos)
            block = fh.read(step)
            tail = block + tail
            nl = tail.rfind(b"\n")
            if nl >= 0:
                cut = pos + nl + 1
                break
        else:
            cut = 0
        if cut == size:
            return
        fh.seek(cut)
        fragment = fh.read()
        with open(path.with_name(path.name + ".torn"), "ab") as torn:
            torn.write(fragment + b"\n")
        fh.truncate(cut)
    log.warning("%s: moved a torn last line (%d bytes) to %s.torn", path, len(fragment), path.name)


def read_trajectories(
    path: str | os.PathLike[str], *, issues: list[StoreIssue] | None = None
) -> Iterator[Trajectory]:
    """Yield the trajectories stored in a JSONL file, in write order.

    A torn or corrupt **last** line is logged, appended to ``issues`` (if given) and skipped. A corrupt line
    anywhere else means the file was damaged after the fact and raises :class:`SchemaError` naming the line.
    A line written by a newer schema raises :class:`SchemaError` too.
    """
    p = Path(path)
    if p.is_dir():
        p = RunDir(p).trajectories_path
    try:
        fh = open(p, encoding="utf-8")  # noqa: SIM115 - closed in the finally below
    except OSError as e:
        raise StoreError(f"cannot read trajectories from {p}: {e}") from e
    try:
        pending: tuple[int, str] | None = None
        for lineno, raw in enumerate(fh, start=1):
            if pending is not None:
                yield _parse_line(p, *pending, last=False, issues=issues)  # type: ignore[misc]
            pending = (lineno, raw)
        if pending is not None:
            traj = _parse_line(p, *pending, last=True, issues=issues)
            if traj is not None:
                yield traj
    finally:
        fh.close()


def read_groups(
    path: str | os.PathLike[str], *, size: int | None = None, issues: list[StoreIssue] | None = None
) -> Iterator[TrajectoryGroup]:
    """Yield the groups stored in a JSONL file, in the order they completed, members in write order.

    With ``size``, each group is yielded as soon as its ``size``-th member is read and groups that never
    got there (the leftovers of an interrupted step) are skipped; without, every group is yielded at the end
    with the members it has. See :func:`agentrl.groups.group_trajectories`; torn lines as in
    :func:`read_trajectories`.
    """
    return group_trajectories(read_trajectories(path, issues=issues), size=size)


def _parse_line(
    path: Path, lineno: int, raw: str, *, last: bool, issues: list[StoreIssue] | None
) -> Trajectory | None:
    try:
        if not raw.endswith("\n"):
            raise ValueError("line has no newline (torn write)")
        record = json.loads(raw)
        if not isinstance(record, dict):
            raise ValueError(f"line is a JSON {type(record).__name__}, not an object")
        missing = [k for k in REQUIRED_KEYS if k not in record]
        if missing:
            raise ValueError(f"missing keys {missing}")
        version = record["schema_version"]
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise SchemaError(
                f"{path}:{lineno}: schema_version {version!r} is newer than this agentrl reads "
                f"({SCHEMA_VERSION}); upgrade agentrl"
            )
        return Trajectory.from_dict(record)
    except SchemaError:
        raise
    except (ValueError, KeyError, TypeError) as e:
        if last:
            issue = StoreIssue(str(path), lineno, f"skipped torn or corrupt last line: {e}")
            log.warning("%s:%d: %s", path, lineno, issue.reason)
            if issues is not None:
                issues.append(issue)
            return None
        raise SchemaError(f"{path}:{lineno}: corrupt trajectory line: {e}") from e
