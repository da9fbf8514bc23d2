"""Staleness of trajectories and admission control for asynchronous training (pure, no I/O, no torch).

Staleness of a trajectory = the learner's version when it trains on it − the oldest policy version among
its tokens. A model turn is sampled by one version (the sampler takes new weights between turns), so a
trajectory's tokens carry their turn's version: :func:`token_versions`.

:class:`Admission` decides when a new group may start and which finished groups a training step takes.
Every group is leased for the step that trains it, in the order of the data (group ``i`` of the run
belongs to step ``start + i // batch_groups``), and only

* while in-flight + buffered groups < (S + 1) × batch_groups (the issue's capacity rule), and
* once the served version is ≥ its step − S (so every token it gets is at most S versions old when
  that step trains it).

The second rule alone guarantees the bound; the first keeps at most S + 1 steps of data around (with
full batches the two coincide). Step k trains on the finished groups of step k: with ``on_stale="wait"``
(the default) the learner waits for all of them, so training is the synchronous trainer's exactly when
S = 0; with ``"drop"`` it does not wait for stragglers (groups of step k still running when the learner is
ready are dropped and counted; the step waits only for its first group). A finished group whose oldest
token is more than S versions old (possible only when its tokens are older than its lease, e.g. a group
read back from an earlier process) is dropped too. The largest staleness trained on is reported and
never exceeds S.

Multi-sample episodes (compaction, sub-agents): staleness is per sample (each sample's turns carry the
version that sampled them, and later samples are usually newer), and the bound holds per episode because it is
checked on a group's oldest token over every sample of every episode (:func:`oldest_version`); an episode is
admitted, trained or dropped whole, with its group. :func:`episode_staleness` gives an episode's.

Refills (dynamic sampling: a finished group without reward signal is replaced by a fresh task of the same
step) are leased with :meth:`Admission.refill`. They count as in flight like any group, so they hold back
the leases of later steps, and they obey the same version rule (a step's refill starts only once its step
may start, so its tokens are at most S versions old when the step trains). The capacity rule lets a refill
of the step the learner is waiting for through even when full, since otherwise the learner would wait for
groups that can only start after it trains.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from agentrl.errors import ConfigError
from agentrl.groups import TrajectoryGroup
from agentrl.types import TokenSource, Trajectory

__all__ = [
    "Admission",
    "DroppedGroup",
    "Lease",
    "OnStale",
    "RuntimeVersions",
    "StepOutcome",
    "StepPlan",
    "episode_staleness",
    "oldest_version",
    "token_versions",
    "trajectory_staleness",
    "turn_versions",
]

OnStale = Literal["wait", "drop"]


def turn_versions(traj: Trajectory) -> tuple[int, ...]:
    """The policy version of each model turn, in order: :attr:`Trajectory.policy_versions` (older records
    without it: ``meta.policy_version`` for every turn)."""
    if traj.policy_versions:
        return traj.policy_versions
    n = max((s.turn for s in traj.segments if s.source is TokenSource.MODEL), default=-1) + 1
    return (traj.meta.policy_version,) * n


def token_versions(traj: Trajectory) -> tuple[int, ...]:
    """The policy version that sampled each token (same length as ``token_ids``); tokens the policy did
    not sample (prompt, observations, template) get the trajectory's oldest version."""
    per_turn = turn_versions(traj)
    out = [traj.min_policy_version] * len(traj.token_ids)
    for s in traj.segments:
        if s.source is TokenSource.MODEL:
            if s.turn >= len(per_turn):
                raise ConfigError(
                    f"trajectory {traj.meta.episode_id}: model turn {s.turn} has no recorded version "
                    f"(policy_versions={per_turn})"
                )
            out[s.start : s.end] = [per_turn[s.turn]] * (s.end - s.start)
    return tuple(out)


def trajectory_staleness(traj: Trajectory, learner_version: int) -> int:
    """Learner version − the oldest version among the trajectory's tokens."""
    return learner_version - traj.min_policy_version


def episode_staleness(samples: Sequence[Trajectory], learner_version: int) -> int:
    """Staleness of an episode: learner version − the oldest version among all its samples' tokens (the bound
    applies to this; each sample's own is :func:`trajectory_staleness`)."""
    if not samples:
        raise ConfigError("an episode has at least one sample")
    return max(trajectory_staleness(t, learner_version) for t in samples)


@dataclass(frozen=True)
class Lease:
    """One group handed out by :class:`Admission`."""

    index: int
    """Position in the run's data order, counted from the start step (0, 1, ...); refills get −1, −2, ..."""
    step: int
    """The training step that will train this group."""
    slot: int
    """Position of the group within its step (0 .. batch_groups − 1): which task of the step it runs; a
    refill's slot is its draw index in the step (≥ batch_groups)."""
    version: int
    """The policy version served when the group was leased (its tokens are this version or newer)."""


@dataclass(frozen=True)
class StepPlan:
    """What a training step takes: the outcome of :meth:`Admission.take`."""

    step: int
    """The step (= the learner's version when it trains)."""
    trained: tuple[Lease, ...]
    """Finished groups the step trains on, in the order they finished."""
    dropped: tuple[Lease, ...]
    """Groups of the step dropped: stragglers (``drop``) or finished over the bound."""
    staleness: tuple[int, ...]
    """Staleness of each trained group (learner version − its oldest token version)."""


@dataclass(frozen=True)
class DroppedGroup:
    """A group of a step that was not trained, and why."""

    seed: int
    """Its task seed."""
    reason: str
    """Why, in words (the Ray ledger records it)."""


@dataclass(frozen=True)
class StepOutcome:
    """What the loop decided for a step, handed to the runtime's ``publish`` with the step's weights: the
    groups trained and those dropped, each with the reason. The runtime records it (the Ray ledger) and never
    judges a group again."""

    step: int
    """The step (its weights are published as version ``step + 1``)."""
    trained: tuple[int, ...]
    """Task seeds of the groups the update trained on."""
    dropped: tuple[DroppedGroup, ...]
    """Every other group of the step the loop leased (or reused, or skipped), with its reason."""


class RuntimeVersions:
    """The two versions a training runtime reports (``agentrl.trainers.runtime.TrainRuntime``), for a runtime
    that keeps them itself as ``_start`` and ``_version`` (the Ray runtime, :class:`agentrl.testing.
    ScriptedRuntime`): one definition of both properties."""

    _start: int
    _version: int

    @property
    def start_step(self) -> int:
        """The step this run starts at (0, or the step of the checkpoint a resume loaded)."""
        return self._start

    @property
    def version(self) -> int:
        """The version of the weights the samplers hold now (the last published)."""
        return self._version


@dataclass
class Admission:
    """Admission control and the staleness bound (see the module docstring); one instance per run."""

    max_staleness: int
    """S: the largest staleness a trained group may have (0 = synchronous)."""
    batch_groups: int
    """Groups per training step."""
    on_stale: OnStale = "wait"
    """``wait``: a step waits for all its groups; ``drop``: it drops those still running when it is ready."""
    start_step: int = 0
    """The first step of this process (a resumed run starts at its checkpoint's step)."""
    end_step: int | None = None
    """No group is leased for this step or later (None = endless)."""
    _next: int = 0
    _in_flight: dict[int, Lease] = field(default_factory=dict)
    _done: dict[int, tuple[Lease, int]] = field(default_factory=dict)
    _order: list[int] = field(default_factory=list)
    _refills: int = 0
    dropped_total: int = 0
    """Groups dropped so far."""
    max_seen: int = 0
    """Largest staleness trained on so far."""

    def __post_init__(self) -> None:
        s, b = self.max_staleness, self.batch_groups
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ConfigError(f"max_staleness must be an int >= 0, got {s!r}")
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ConfigError(f"batch_groups must be a positive int, got {b!r}")
        if self.on_stale not in ("wait", "drop"):
            raise ConfigError(f"on_stale must be 'wait' or 'drop', got {self.on_stale!r}")
        if self.on_stale == "drop" and s == 0:
            raise ConfigError(
                "on_stale 'drop' needs max_staleness >= 1: at 0 a step's groups start when the step is "
                "already waiting for them, so every straggler would be dropped"
            )

    # -- leasing ------------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """(S + 1) × batch_groups: most groups in flight or finished and not yet trained."""
        return (self.max_staleness + 1) * self.batch_groups

    @property
    def outstanding(self) -> int:
        """Groups in flight plus groups finished and waiting for their step."""
        return len(self._in_flight) + len(self._done)

    @property
    def next_step(self) -> int:
        """The step the next lease would be for."""
        return self.start_step + self._next // self.batch_groups

    def can_lease(self, policy_version: int) -> bool:
        """True when a new group may start now, with ``policy_version`` the version being served."""
        if self.end_step is not None and self.next_step >= self.end_step:
            return False
        return self.outstanding < self.capacity and self.next_step <= policy_version + self.max_staleness

    def lease(self, policy_version: int) -> Lease:
        """Hand out the next group (call only when :meth:`can_lease`)."""
        if not self.can_lease(policy_version):
            raise ConfigError(
                f"no lease allowed now: {self.outstanding} outstanding of {self.capacity}, next step "
                f"{self.next_step}, served version {policy_version}, max staleness {self.max_staleness}"
            )
        lease = Lease(self._next, self.next_step, self._next % self.batch_groups, policy_version)
        self._next += 1
        self._in_flight[lease.index] = lease
        return lease

    def can_refill(self, step: int, policy_version: int) -> bool:
        """True when a refill of ``step`` (a step already leased from) may start now."""
        if step >= self.next_step or step < policy_version:
            return False  # not started yet (its own leases come first), or already trained
        return self.outstanding < self.capacity or step == policy_version

    def refill(self, step: int, slot: int, policy_version: int) -> Lease:
        """Hand out one more group of ``step`` (its draw ``slot``), counted in flight like any other (call
        only when :meth:`can_refill`)."""
        if not self.can_refill(step, policy_version):
            raise ConfigError(
                f"no refill of step {step} allowed now: {self.outstanding} outstanding of {self.capacity}, "
                f"next step {self.next_step}, served version {policy_version}"
            )
        if step > policy_version + self.max_staleness:  # unreachable: its step's first lease checked it
            raise ConfigError(f"a refill of step {step} at version {policy_version} would break the bound")
        self._refills += 1
        lease = Lease(-self._refills, step, slot, policy_version)
        self._in_flight[lease.index] = lease
        return lease

    def complete(self, lease: Lease, oldest_version: int) -> None:
        """A leased group finished; ``oldest_version`` is the oldest policy version among its tokens."""
        if self._in_flight.pop(lease.index, None) is None:
            raise ConfigError(f"group {lease.index} is not in flight (finished twice, or never leased)")
        self._done[lease.index] = (lease, oldest_version)
        self._order.append(lease.index)

    def skip(self) -> Lease:
        """Account for the next group without running it (its step will train without it)."""
        lease = Lease(self._next, self.next_step, self._next % self.batch_groups, -1)
        self._next += 1
        self.dropped_total += 1
        return lease

    def release(self, lease: Lease) -> None:
        """Forget an in-flight group that will never finish (cancelled); it counts as dropped."""
        if self._in_flight.pop(lease.index, None) is not None:
            self.dropped_total += 1

    # -- training -----------------------------------------------------------------------------------
    def in_flight_of(self, step: int) -> list[Lease]:
        """Groups of ``step`` still running."""
        return [lease for lease in self._in_flight.values() if lease.step == step]

    def done_of(self, step: int) -> list[Lease]:
        """Finished groups of ``step``, in the order they finished."""
        return [self._done[i][0] for i in self._order if i in self._done and self._done[i][0].step == step]

    def ready(self, step: int) -> bool:
        """True when step ``step`` can train now (the learner's version is ``step``)."""
        all_leased = self.next_step > step
        if self.on_stale == "wait":
            return all_leased and not self.in_flight_of(step)
        return bool(self.done_of(step)) or (all_leased and not self.in_flight_of(step))

    def take(self, step: int) -> StepPlan:
        """Take step ``step``'s batch (call when :meth:`ready`): its finished groups within the bound.
        Stragglers still in flight (``drop``) are returned in ``dropped``; the caller cancels them."""
        trained: list[Lease] = []
        staleness: list[int] = []
        dropped: list[Lease] = []
        for lease in self.done_of(step):
            _, oldest = self._done.pop(lease.index)
            s = step - oldest
            if s > self.max_staleness:
                dropped.append(lease)
                continue
            trained.append(lease)
            staleness.append(s)
        for lease in self.in_flight_of(step):
            del self._in_flight[lease.index]
            dropped.append(lease)
        while self.next_step <= step:  # drop mode: slots of the step never leased
            dropped.append(self.skip())
            self.dropped_total -= 1  # counted once, below
        self._order = [i for i in self._order if i in self._done]
        self.dropped_total += len(dropped)
        self.max_seen = max([self.max_seen, *staleness])
        return StepPlan(step, tuple(trained), tuple(dropped), tuple(staleness))


def oldest_version(trajectories: Sequence[Trajectory] | TrajectoryGroup) -> int:
    """The oldest policy version among the tokens of ``trajectories`` (a group)."""
    if not trajectories:
        raise ConfigError("a group needs at least one trajectory")
    return min(t.min_policy_version for t in trajectories)
