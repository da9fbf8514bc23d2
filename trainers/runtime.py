"""The trainer's runtime seam: where a step's episodes come from, where learning happens, where weights go.

``agentrl.trainers.train`` runs one training loop (:mod:`agentrl.trainers.loop`) over a
:class:`TrainRuntime`::

    held_out("untrained") → [run_groups(k, seeds) → EpisodeDone stream → store → update(k, groups)
      → publish(k + 1, outcome) → save_checkpoint] per step k → finish_updates → held_out("trained")

The step travels explicitly: the loop gives every call its step ``k`` and hands ``publish`` the step's
:class:`~agentrl.staleness.StepOutcome` (groups trained, dropped and why). ``TrajectoryMeta.step`` is still
written into every trajectory (the run's record), but a runtime never reads it back to decide anything.

Two runtimes implement it:

* :class:`agentrl.trainers.local.LocalRuntime` (the default): the learner, the sampler and the environments
  all in this process, exactly the single-process trainer.
* :class:`agentrl.trainers.ray.RayRuntime` (``--ray ADDRESS``): rollout workers, inference servers
  and a learner group as Ray actors, behind a controller with a persisted group ledger.

The loop itself (:mod:`agentrl.trainers.loop`: tasks per step, admission under the staleness bound,
storing every trajectory as it finishes, reusing complete groups on resume, metrics, signals) is the same for
both, so a config runs either way and writes the same run
directory.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from agentrl.errors import ConfigError
from agentrl.groups import TrajectoryGroup
from agentrl.rollout import EpisodeDone, GroupHook
from agentrl.run import RunDir
from agentrl.staleness import StepOutcome
from agentrl.trainers.evaluate import EvalReport
from agentrl.types import TrajectoryMeta

if TYPE_CHECKING:
    from agentrl.trainers.train_setup import TrainConfig

__all__ = ["TrainRuntime", "group_hook"]


def group_hook(cfg: TrainConfig) -> GroupHook | None:
    """The ``finish_group`` hook both runtimes give the scheduler: ``--reward.relative-judge``'s group judge
    (:meth:`agentrl.rewards.RewardConfig.group_reward`, on the reward settings and judge cache the env
    gets), else None.

    Raises:
        ConfigError: a group judge with ``--agent`` (the agent computes its own reward, outside any env).
    """
    if not cfg.reward.relative_judge:
        return None
    if cfg.agent is not None:
        raise ConfigError(
            "--reward.relative-judge judges an env's answers as a group; with --agent the agent computes its "
            "own reward (drop one of them)"
        )
    import agentrl
    from agentrl.trainers.train_setup import reward_config

    return reward_config(cfg, agentrl.registry.entry_point(cfg.env)).group_reward()


@runtime_checkable
class TrainRuntime(Protocol):
    """What the training loop needs from the machinery under it (one object per run)."""

    @property
    def start_step(self) -> int:
        """The step this run starts at (0, or the step of the checkpoint a resume loaded)."""
        ...

    @property
    def version(self) -> int:
        """Version of the weights the samplers hold now (the learner step that produced them)."""
        ...

    def run_groups(
        self, step: int, *, seeds: Iterable[int], group_size: int, meta: TrajectoryMeta
    ) -> AsyncIterator[EpisodeDone]:
        """One group per seed for training step ``step``, every episode reported as it finishes (the last of a
        group carries the group), as :func:`agentrl.rollout.run_groups` does. Closing the iterator early
        cancels what is running."""
        ...

    async def update(self, step: int, groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
        """Train step ``step`` on ``groups`` (the loop already dropped what it does not train); return the
        step's ``learn/*`` and ``variance/*`` metrics and whatever the runtime itself reports."""
        ...

    async def publish(self, version: int, outcome: StepOutcome) -> None:
        """Hand the learner's current weights to every sampler as ``version`` (= ``outcome.step + 1``) and
        record the step's outcome; returns once every sampler samples with them."""
        ...

    async def held_out(self, label: str) -> EvalReport | None:
        """The held-out evaluation of the samplers' current weights (``--eval``), labelled ``untrained`` or
        ``trained``, written to the run; None when ``--eval.tasks`` is 0 or the runtime cannot run it here
        (it then prints why)."""
        ...

    async def finish_updates(self) -> None:
        """No update follows and the last checkpoint is written: free what only updates use (the
        optimizer's state) before the trained evaluation. :meth:`update` is refused afterwards."""
        ...

    async def save_checkpoint(self, run: RunDir, step: int, *, keep: int) -> None:
        """Write ``checkpoints/step-<step>`` (weights after ``step`` steps, optimizer, RNG, data position)."""
        ...
