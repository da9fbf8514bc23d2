"""Groups of episodes: the unit the scheduler yields, the store streams back, credit assignment consumes and a
resumed run restores.

A trajectory file holds one trajectory per line (a crash must lose no finished episode), each naming its group
in ``meta.group_id``. :func:`group_trajectories` is the one place that turns such a stream back into groups;
every other stage passes :class:`TrajectoryGroup` objects along.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from agentrl.errors import ConfigError, SchemaError
from agentrl.types import Trajectory

__all__ = ["TrajectoryGroup", "group_trajectories"]


@dataclass(frozen=True, slots=True)
class TrajectoryGroup:
    """Episodes of one task sampled together (same env, same reset seed, one ``meta.group_id``): the unit of
    group-relative credit assignment. Validated on construction.

    Members are in the order they finished, the order their lines have in a trajectory file, so a group read
    back from the file is exactly the group that was trained on (rows in the same order).
    """

    trajectories: tuple[Trajectory, ...]
    """The members, in the order they finished."""

    def __post_init__(self) -> None:
        members = self.trajectories
        if isinstance(members, list):
            members = tuple(members)
            object.__setattr__(self, "trajectories", members)
        if not isinstance(members, tuple) or not members:
            raise ConfigError(
                f"a TrajectoryGroup needs a non-empty tuple of Trajectory, got {members!r:.100}"
            )
        if not all(isinstance(t, Trajectory) for t in members):
            raise ConfigError("a TrajectoryGroup holds Trajectory objects only")
        first = members[0].meta
        for t in members[1:]:
            if (t.meta.group_id, t.meta.task_id) != (first.group_id, first.task_id):
                raise ConfigError(
                    f"members of one group must share group_id and task_id: {first.group_id!r}/"
                    f"{first.task_id!r} vs {t.meta.group_id!r}/{t.meta.task_id!r}"
                )

    @property
    def group_id(self) -> str:
        """The members' ``meta.group_id``."""
        return self.trajectories[0].meta.group_id

    @property
    def task_id(self) -> str:
        """The members' ``meta.task_id`` (``"<env id>:<seed>"`` for groups the rollout ran)."""
        return self.trajectories[0].meta.task_id

    @property
    def rewards(self) -> tuple[float, ...]:
        """Each member's episode reward."""
        return tuple(t.reward for t in self.trajectories)

    @property
    def infra_failures(self) -> int:
        """Members the machinery failed (never trained on)."""
        return sum(t.infra_failure for t in self.trajectories)

    def usable(self) -> TrajectoryGroup | None:
        """The members fit for training (infra failures dropped); ``None`` when there are none."""
        ok = tuple(t for t in self.trajectories if not t.infra_failure)
        if len(ok) == len(self.trajectories):
            return self
        return TrajectoryGroup(ok) if ok else None

    def __len__(self) -> int:
        return len(self.trajectories)

    def __iter__(self) -> Iterator[Trajectory]:
        return iter(self.trajectories)

    def __getitem__(self, index: int) -> Trajectory:
        return self.trajectories[index]

    if not TYPE_CHECKING:  # at run time only, so type checkers still flag every unknown attribute

        def __getattr__(self, name: str) -> None:
            # Code written when collect() returned a flat list of trajectories reads a Trajectory's
            # attributes off what are now groups: say so, instead of a bare AttributeError.
            hint = ""
            if not name.startswith("_") and (
                hasattr(Trajectory, name) or name in {f.name for f in fields(Trajectory)}
            ):
                hint = (
                    f" ({name} is a Trajectory's: collect() and run_groups() return TrajectoryGroups since "
                    "2026-11-26; iterate a group for its trajectories, [t for g in groups for t in g])"
                )
            message = f"'TrajectoryGroup' object has no attribute {name!r}{hint}"
            raise AttributeError(message, name=name, obj=self)


def group_trajectories(
    trajectories: Iterable[Trajectory], *, size: int | None = None
) -> Iterator[TrajectoryGroup]:
    """Rebuild groups from a stream of trajectories (a trajectory file, in write order), by ``meta.group_id``.

    Groups come in the order they completed (the position of their last member) with members in stream
    order, so a trainer's batch is rebuilt row for row. With ``size``, a group is yielded as soon as it has
    ``size`` members and groups that never get there (an interrupted step's leftovers) are dropped; a group
    with more members than ``size`` is a :class:`SchemaError`. Without ``size``, every group is yielded at
    the end of the stream with the members it has.
    """
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
        raise ConfigError(f"group size must be a positive int, got {size!r}")
    open_groups: dict[str, list[Trajectory]] = {}
    last_seen: dict[str, int] = {}
    done: set[str] = set()
    for k, t in enumerate(trajectories):
        gid = t.meta.group_id
        if gid in done:
            raise SchemaError(f"group {gid!r} has more than {size} members")
        members = open_groups.setdefault(gid, [])
        members.append(t)
        last_seen[gid] = k
        if size is not None and len(members) == size:
            done.add(gid)
            yield TrajectoryGroup(tuple(open_groups.pop(gid)))
    if size is None:
        for gid in sorted(open_groups, key=last_seen.__getitem__):
            yield TrajectoryGroup(tuple(open_groups[gid]))
