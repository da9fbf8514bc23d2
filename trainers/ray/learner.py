"""The learner group: one or more learner actors in a placement group (``learner`` resources).

Each actor is one rank of :class:`~agentrl.trainers.learner_core.LearnerCore`, the learner the single-process
runtime calls in-process, so a Ray run with one learner trains exactly like a local one. With ``N > 1`` the
ranks form a ``torch.distributed`` process group (gloo on CPU, NCCL on GPU) and shard the model with FSDP2
(:func:`agentrl.learner.wrap_fsdp`); each rank takes whole groups of the batch (the estimators' baselines stay
within a group) and the learner's normalisers are reduced over ranks. Publishing and checkpointing gather the
full state dict on every rank; rank 0 writes it. This module only adds what Ray needs around the core: the
rendezvous address, the run directory as a path string, and the weight transport.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from agentrl.groups import TrajectoryGroup
from agentrl.run import RunDir
from agentrl.trainers.ray.weights import WeightRef, WeightTransport

if TYPE_CHECKING:
    from agentrl.trainers.learner_core import LearnerCore
    from agentrl.trainers.train_config import ResolvedRun, TrainConfig

__all__ = ["LearnerActor", "free_port", "shard_groups"]


def free_port() -> int:
    """A TCP port free on this host now (for the process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def shard_groups(groups: Sequence[TrajectoryGroup], ranks: int) -> list[list[TrajectoryGroup]]:
    """Whole groups dealt round-robin to ``ranks`` shards (a group never spans ranks)."""
    shards: list[list[TrajectoryGroup]] = [[] for _ in range(ranks)]
    for i, g in enumerate(groups):
        shards[i % ranks].append(g)
    return shards


class LearnerActor:
    """One rank of the learner group: a :class:`~agentrl.trainers.learner_core.LearnerCore` on a Ray actor."""

    def __init__(self, rank: int, world: int, cfg: TrainConfig, *, resolved: ResolvedRun | None = None):
        self.rank, self.world, self.cfg = rank, world, cfg
        self.resolved = resolved
        """What the run resolved for its device (the learner's sizes; :class:`ResolvedRun`)."""
        self._core: LearnerCore | None = None

    @property
    def core(self) -> LearnerCore:
        """The learner core (built by :meth:`setup`)."""
        if self._core is None:
            raise RuntimeError("LearnerActor.setup has not run: the learner core is not built")
        return self._core

    def address(self) -> tuple[str, int]:
        """Where rank 0 listens for the process group (call on rank 0)."""
        return socket.gethostbyname(socket.gethostname()), free_port()

    def setup(self, master: tuple[str, int] | None) -> None:
        """Build this rank's learner core (load the model; join the process group when ``world > 1``)."""
        from agentrl.trainers.learner_core import LearnerCore

        self._core = LearnerCore(
            self.cfg, rank=self.rank, world=self.world, master=master, resolved=self.resolved
        )

    def load_checkpoint(self, run_path: str) -> int:
        """Load the run's newest checkpoint (weights, optimizer, stability state); return its step (0 when
        none)."""
        return self.core.load(RunDir(Path(run_path)))

    def update(self, step: int, groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
        """:meth:`LearnerCore.update` on this rank's groups, trained as step ``step``; its metrics."""
        return self.core.update(step, groups)

    def publish(self, version: int, transport: WeightTransport) -> WeightRef | None:
        """Publish the current weights as ``version`` (rank 0 returns the ref; other ranks None)."""
        from agentrl.precision import served_copy

        state = self.core.state_to_publish()  # a collective with world > 1: every rank gathers
        # The servers sample in the compute dtype: ship that copy (half the bytes of fp32 master weights for
        # bf16), so the checksum the servers report of their own weights is the one published.
        sampler = self.core.precision.sampler
        return transport.put(version, served_copy(state, sampler)) if self.rank == 0 else None

    def release_optimizer_state(self) -> None:
        """No update follows: free this rank's optimizer moments."""
        self.core.release_optimizer_state()

    def save_checkpoint(self, run_path: str, step: int, keep: int) -> None:
        """Write ``checkpoints/step-<step>`` (rank 0 writes; every rank joins the gathers)."""
        self.core.save(RunDir(Path(run_path)), step, keep=keep)

    def shutdown(self) -> None:
        """Leave the process group."""
        if self._core is not None:
            self._core.shutdown()
