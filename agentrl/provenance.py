"""Where a distributed episode ran: the typed record a Ray rollout worker puts on each trajectory.

One record per fact: before this record the worker wrote these facts as strings into ``meta.extra``
(``worker``, ``server``, ``node``, ``sandbox_pool``, ``episode_attempts``, ``server_failovers``). Files
written then still load: :meth:`Provenance.pop_legacy` lifts those keys into this record when a trajectory
file is read, so readers only ever look at :attr:`agentrl.types.TrajectoryMeta.provenance`.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from agentrl.errors import FormatError

__all__ = ["Provenance"]

_LEGACY_KEYS = ("worker", "server", "node", "sandbox_pool")
"""The ``meta.extra`` keys the Ray worker always wrote together (before :class:`Provenance`); all four must
be there for a record to count as written by it, so a user's own ``extra["node"]`` is left alone."""


@dataclass(frozen=True, slots=True)
class Provenance:
    """The machines behind one episode of a distributed (Ray) run; single-process runs record none."""

    worker: str
    """The rollout worker actor that ran the episode (``worker-0``, ...)."""
    server: str
    """The inference server that sampled its last turn (``server-0``, ...)."""
    node: str
    """The Ray node the worker ran on."""
    sandbox_pool: str
    """The sandbox pool whose sessions the episode's tools ran in."""
    episode_attempts: int = 1
    """Times the episode was started (> 1 when a lost server's episode started over elsewhere)."""
    server_failovers: int = 0
    """Turns re-sent to another server after the one sampling them died."""

    def __post_init__(self) -> None:
        if self.episode_attempts < 1 or self.server_failovers < 0:
            raise FormatError(
                f"provenance needs episode_attempts >= 1 and server_failovers >= 0, got "
                f"{self.episode_attempts} and {self.server_failovers}"
            )

    def to_dict(self) -> dict[str, Any]:
        """The JSON object stored under ``meta.provenance`` in ``trajectories.jsonl``."""
        return {
            "worker": self.worker,
            "server": self.server,
            "node": self.node,
            "sandbox_pool": self.sandbox_pool,
            "episode_attempts": self.episode_attempts,
            "server_failovers": self.server_failovers,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Provenance:
        """Parse :meth:`to_dict`'s output (and the old ``meta.extra`` strings: the counts as ``"2"``)."""
        try:
            return cls(
                worker=str(d["worker"]),
                server=str(d["server"]),
                node=str(d["node"]),
                sandbox_pool=str(d["sandbox_pool"]),
                episode_attempts=int(d.get("episode_attempts", 1)),
                server_failovers=int(d.get("server_failovers", 0)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise FormatError(
                f"provenance needs worker, server, node, sandbox_pool (and integer counts), got {d!r}"
            ) from e

    @classmethod
    def pop_legacy(cls, extra: MutableMapping[str, Any]) -> Provenance | None:
        """The provenance an older Ray worker wrote into ``extra`` (as strings), removed from ``extra``; None
        (and ``extra`` untouched) when ``extra`` does not hold it."""
        if not all(k in extra for k in _LEGACY_KEYS):
            return None
        prov = cls.from_dict(extra)
        for k in (*_LEGACY_KEYS, "episode_attempts", "server_failovers"):
            extra.pop(k, None)
        return prov

    def label(self) -> str:
        """One line for viewers: ``"worker-0 on node N, server-0, sandbox pool P (2 attempts)"``."""
        out = f"{self.worker} on node {self.node}, {self.server}, sandbox pool {self.sandbox_pool}"
        notes = [f"{self.episode_attempts} attempts"] if self.episode_attempts > 1 else []
        if self.server_failovers:
            notes.append(f"{self.server_failovers} server failovers")
        return out + (f" ({', '.join(notes)})" if notes else "")
