"""Groups of episodes: the unit the scheduler yields, the store streams back, credit assignment consumes and a
resumed run restores.

A trajectory file holds one trajectory per line (a crash must lose no finished episode), each naming its group
in ``meta.group_id``. :func:`group_trajectories` is the one place that turns such a stream back into groups;
every other stage passes :class:`TrajectoryGroup` objects along.

An episode may be several trajectories (samples): when its context was compacted or it ran sub-agents, each
context is a token sequence of its own. Its samples share ``meta.episode_id`` (and group and task), carry
``meta.sample_index`` 0..n-1 and ``meta.num_samples`` n, and its return is the sum over them. A group's
*members* are episodes: credit baselines, dynamic sampling and group sizes count episodes, never samples, and
a group never holds part of an episode.

This module is the one home of that rule: :func:`split_episodes` cuts a group's consecutive samples into
episodes (checking each is complete), :func:`episodes_of` gathers a step's or a file's trajectories in any
order, :func:`group_trajectories` rebuilds groups from a stream, and :func:`episode_return` sums an episode's
rewards. The step's metrics, ``agentrl eval`` and the scheduler all count episodes through them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from agentrl.errors import SHIMS_REMOVED_IN, ConfigError, SchemaError
from agentrl.types import Trajectory

__all__ = [
    "Episode",
    "TrajectoryGroup",
    "episode_return",
    "episode_returns",
    "episodes_of",
    "group_trajectories",
    "split_episodes",
]


Episode = tuple[Trajectory, ...]
"""One episode: its samples in sampling order (one trajectory for most episodes)."""


@dataclass(frozen=True, slots=True)
class TrajectoryGroup:
    """Episodes of one task sampled together (same env, same reset seed, one ``meta.group_id``): the unit of
    group-relative credit assignment. Validated on construction.

    Members are episodes, in the order they finished, the order their lines have in a trajectory file, so a
    group read back from the file is exactly the group that was trained on (rows in the same order). The
    samples of a multi-sample episode are consecutive in ``trajectories``, in sampling order, and all present.
    ``len``, iteration and indexing go over ``trajectories`` (one per row of the collated batch);
    :attr:`episodes` and :attr:`num_episodes` over the members.
    """

    trajectories: tuple[Trajectory, ...]
    """The samples of the members, member after member."""
    episodes: tuple[Episode, ...] = field(init=False, repr=False, compare=False)
    """The members: each episode's samples (derived from ``trajectories``)."""

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
        object.__setattr__(self, "episodes", split_episodes(members))

    @property
    def group_id(self) -> str:
        """The members' ``meta.group_id``."""
        return self.trajectories[0].meta.group_id

    @property
    def task_id(self) -> str:
        """The members' ``meta.task_id`` (``"<env id>:<seed>"`` for groups the rollout ran)."""
        return self.trajectories[0].meta.task_id

    @property
    def num_episodes(self) -> int:
        """Members (episodes; a multi-sample episode counts once)."""
        return len(self.episodes)

    @property
    def rewards(self) -> tuple[float, ...]:
        """Each member's return: the sum of its samples' rewards."""
        return tuple(episode_return(e) for e in self.episodes)

    @property
    def infra_failures(self) -> int:
        """Members the machinery failed in any sample (never trained on)."""
        return sum(any(t.infra_failure for t in e) for e in self.episodes)

    def usable(self) -> TrajectoryGroup | None:
        """The members fit for training (an episode with an infra failure in any sample is dropped with all
        its samples); ``None`` when there are none."""
        ok = tuple(t for e in self.episodes if not any(s.infra_failure for s in e) for t in e)
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
                    "2026-11-26; iterate a group for its trajectories, [t for g in groups for t in g]; this "
                    f"hint goes in agentrl {SHIMS_REMOVED_IN})"
                )
            message = f"'TrajectoryGroup' object has no attribute {name!r}{hint}"
            raise AttributeError(message, name=name, obj=self)


def episode_return(episode: Episode) -> float:
    """An episode's return: the sum of its samples' rewards."""
    return float(math.fsum(r for t in episode for r in t.rewards))


def episodes_of(trajectories: Iterable[Trajectory]) -> list[Episode]:
    """Trajectories in any order (a step's, or a file's lines) gathered into episodes, in the order each
    episode first appears: a multi-sample episode's samples by ``(meta.group_id, meta.episode_id)``, sorted
    by ``meta.sample_index``; a single-sample trajectory is an episode of its own. Unlike
    :func:`split_episodes` it neither needs the samples consecutive nor checks that an episode is complete
    (a step's metrics count what there is)."""
    out: list[list[Trajectory]] = []
    at: dict[tuple[str, str], list[Trajectory]] = {}
    for t in trajectories:
        if t.meta.num_samples == 1:
            out.append([t])
            continue
        key = (t.meta.group_id, t.meta.episode_id)
        if key not in at:
            at[key] = []
            out.append(at[key])
        at[key].append(t)
    return [tuple(sorted(e, key=lambda t: t.meta.sample_index)) for e in out]


def episode_returns(trajectories: Iterable[Trajectory]) -> list[float]:
    """Each usable episode's return (:func:`episode_return`; an episode with an infra failure in any sample
    is left out), in the order of :func:`episodes_of`."""
    return [episode_return(e) for e in episodes_of(trajectories) if not any(t.infra_failure for t in e)]


def split_episodes(trajectories: tuple[Trajectory, ...]) -> tuple[Episode, ...]:
    """Cut a group's trajectories into its episodes, checking that each multi-sample episode is complete:
    samples 0..n-1 consecutive, in order, with one episode id and one ``num_samples``."""
    out: list[Episode] = []
    seen: set[str] = set()
    i = 0
    while i < len(trajectories):
        m = trajectories[i].meta
        n = m.num_samples
        if n > 1:
            if not m.episode_id:
                raise ConfigError("a multi-sample episode needs a meta.episode_id shared by its samples")
            if m.episode_id in seen:
                raise ConfigError(f"episode {m.episode_id!r} appears twice in group {m.group_id!r}")
            seen.add(m.episode_id)
        samples = trajectories[i : i + n]
        got = [(t.meta.episode_id, t.meta.num_samples, t.meta.sample_index) for t in samples]
        want = [(m.episode_id, n, k) for k in range(n)]
        if got != want:
            raise ConfigError(
                f"episode {m.episode_id!r} of group {m.group_id!r} needs its {n} samples consecutive and in "
                f"order (sample_index 0..{n - 1}); got (episode_id, num_samples, sample_index) = {got}"
            )
        out.append(samples)
        i += n
    return tuple(out)


def group_trajectories(
    trajectories: Iterable[Trajectory], *, size: int | None = None
) -> Iterator[TrajectoryGroup]:
    """Rebuild groups from a stream of trajectories (a trajectory file, in write order), by ``meta.group_id``.

    Groups come in the order they completed (the position of their last member) with members in the order
    they completed, so a trainer's batch is rebuilt row for row. A member is an episode: a multi-sample
    episode is complete when all its samples have been read (in any order; they are put in sampling order),
    and an episode still missing samples at the end of the stream (a crash between its lines) is never
    kept. With ``size``, a group is yielded as soon as it has ``size`` complete episodes and groups that never
    get there (an interrupted step's leftovers) are dropped; a group with more members than ``size`` is a
    :class:`SchemaError`. Without ``size``, every group with a complete episode is yielded at the end of the
    stream with the complete episodes it has.
    """
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
        raise ConfigError(f"group size must be a positive int, got {size!r}")
    complete: dict[str, list[Episode]] = {}
    partial: dict[str, dict[str, dict[int, Trajectory]]] = {}
    last_seen: dict[str, int] = {}
    done: set[str] = set()
    for k, t in enumerate(trajectories):
        gid, m = t.meta.group_id, t.meta
        if gid in done:
            raise SchemaError(f"group {gid!r} has more than {size} members")
        last_seen[gid] = k
        members = complete.setdefault(gid, [])
        if m.num_samples == 1:
            members.append((t,))
        else:
            samples = partial.setdefault(gid, {}).setdefault(m.episode_id, {})
            if m.sample_index in samples or any(
                o.meta.num_samples != m.num_samples for o in samples.values()
            ):
                raise SchemaError(
                    f"episode {m.episode_id!r} has sample {m.sample_index} twice, or samples that disagree "
                    "on num_samples"
                )
            samples[m.sample_index] = t
            if len(samples) < m.num_samples:
                continue
            members.append(tuple(samples[i] for i in range(m.num_samples)))
            del partial[gid][m.episode_id]
        if size is not None and len(members) == size:
            done.add(gid)
            yield TrajectoryGroup(tuple(s for e in complete.pop(gid) for s in e))
    if size is None:
        for gid in sorted(complete, key=last_seen.__getitem__):
            if complete[gid]:
                yield TrajectoryGroup(tuple(s for e in complete[gid] for s in e))
