"""Per-step stability bookkeeping of the trainers: the learning-rate schedule and the collapse detector.

A run *collapses* (docs/reproduction.md, stress setting) when every group of a step has the same reward for
all its members: with a group baseline (GRPO, RLOO, OPO, OTB) every advantage is then 0 and the update
carries no signal, and with 0/1 rewards a policy that fails everything never gets one again. Nothing crashes;
without a check the run keeps "training" on nothing. :func:`check_collapse` flags such a step when an earlier
step had signal (a run that never had any is a different problem: a task too hard for the policy).

:class:`StabilityState` is what the trainers carry between steps and store in checkpoints under
:data:`CHECKPOINT_KEY` of ``CheckpointState.extra``, so a resumed run and ``agentrl replay --step`` continue
with the same learning rate. :func:`begin_step` is the one call a trainer makes before
:func:`agentrl.update.policy_update`: it observes the step's groups, sets the optimizer's rate and returns the
metrics to log (``learn/lr``, the schedule's signal, ``stability/*``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agentrl.checkpoint import load_checkpoint
from agentrl.errors import ConfigError
from agentrl.groups import TrajectoryGroup
from agentrl.learner.config import LearnerConfig
from agentrl.learner.schedule import ScheduleState, ScheduleStep, observe_length
from agentrl.run import RunDir

__all__ = [
    "CHECKPOINT_KEY",
    "SOLVED_REWARD",
    "CollapseCheck",
    "CollapseState",
    "StabilityState",
    "StabilityStep",
    "StepInputs",
    "begin_step",
    "check_collapse",
    "observe_step",
    "stability_at",
    "stability_extra",
]

CHECKPOINT_KEY = "stability"
"""Key of :meth:`StabilityState.to_json` in a checkpoint's ``extra``."""
SOLVED_REWARD = 1.0
"""A step whose every episode scored at least this is *solved*, not collapsed (issue 47)."""


@dataclass(frozen=True, slots=True)
class CollapseState:
    """What the collapse detector remembers between steps."""

    signal_steps: int = 0
    """Steps so far in which at least one group had members with different rewards."""
    silent_steps: int = 0
    """Consecutive steps without any such group, up to and including the latest."""


@dataclass(frozen=True, slots=True)
class CollapseCheck:
    """The detector's verdict on one step."""

    state: CollapseState
    """The state after this step."""
    zero_variance_frac: float
    """Fraction of the step's groups whose members all got the same reward (NaN without groups)."""
    collapsed: bool
    """Every group has zero reward variance and an earlier step had signal: the update trains on nothing
    (not when the step is :attr:`solved`)."""
    solved: bool = False
    """Every episode got the full reward (>= ``SOLVED_REWARD``, which every shipped env gives a success):
    no signal either, but because the policy succeeds, not because it fails."""


def check_collapse(state: CollapseState, group_rewards: Sequence[Sequence[float]]) -> CollapseCheck:
    """Flag a step whose groups all have zero reward variance after steps that had signal.

    ``group_rewards`` holds each group's member rewards. A step without groups changes nothing. A group of one
    has zero variance (no group baseline learns from it).
    """
    if not group_rewards:
        return CollapseCheck(state, math.nan, False)
    flat = [max(r) - min(r) <= 0.0 if r else True for r in group_rewards]
    frac = sum(flat) / len(flat)
    if not all(flat):
        return CollapseCheck(CollapseState(state.signal_steps + 1, 0), frac, False)
    new = CollapseState(state.signal_steps, state.silent_steps + 1)
    solved = all(r and min(r) >= SOLVED_REWARD for r in group_rewards)
    return CollapseCheck(new, frac, state.signal_steps > 0 and not solved, solved)


@dataclass(frozen=True, slots=True)
class StabilityState:
    """The schedule's and the detector's state (checkpointed)."""

    schedule: ScheduleState = field(default_factory=ScheduleState)
    """The learning-rate schedule's state."""
    collapse: CollapseState = field(default_factory=CollapseState)
    """The collapse detector's state."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict for ``CheckpointState.extra[CHECKPOINT_KEY]``."""
        return {
            "schedule": self.schedule.to_json(),
            "collapse": {
                "signal_steps": self.collapse.signal_steps,
                "silent_steps": self.collapse.silent_steps,
            },
        }

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> StabilityState:
        """The state in a checkpoint's ``extra``; the initial state when it has none (checkpoints written
        before schedules existed, or a run's first step)."""
        d = (extra or {}).get(CHECKPOINT_KEY)
        if d is None:
            return cls()
        try:
            c = d["collapse"]
            collapse = CollapseState(int(c["signal_steps"]), int(c["silent_steps"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"not a stability state: {d!r} ({e})") from e
        return cls(ScheduleState.from_json(d.get("schedule")), collapse)


@dataclass(frozen=True, slots=True)
class StabilityStep:
    """What :func:`observe_step` decided for one step."""

    state: StabilityState
    """The state after this step (what the next step and the step's checkpoint hold)."""
    schedule: ScheduleStep
    """The schedule's decision (its ``lr`` is the rate this step's update uses)."""
    collapse: CollapseCheck
    """The detector's verdict."""
    mean_length: float
    """Mean model tokens per episode of the step's groups (the schedule's input)."""
    previous_lr: float = math.nan
    """The rate the previous step used (what a decay at this step lowered)."""

    @property
    def metrics(self) -> dict[str, float]:
        """The step's metrics: ``learn/lr``, the trigger's signal, ``stability/*``."""
        s, c = self.schedule, self.collapse
        return {
            "learn/lr": s.lr,
            "learn/lr_length_ratio": s.signal,
            "learn/lr_decays": float(s.state.decays),
            "learn/response_length": self.mean_length,
            "stability/zero_variance_frac": c.zero_variance_frac,
            "stability/collapsed": float(c.collapsed),
            "stability/solved": float(c.solved),
            "stability/silent_steps": float(c.state.silent_steps),
        }

    def warning(self, step: int) -> str | None:
        """The lines to print for this step: a learning-rate decay the schedule took, a solved step, a
        collapsed one (None when there is nothing to say)."""
        c, s = self.collapse, self.schedule
        lines = []
        if s.triggered:
            lines.append(
                f"step {step}: learning rate {self.previous_lr:.3g} -> {s.lr:.3g}: the mean response length "
                f"grew {s.signal:.2f}x over the schedule's window (--learner.lr-schedule length-triggered; "
                f"decay {s.state.decays})"
            )
        if c.solved:
            lines.append(
                f"step {step}: solved — every episode got the full reward: no group has signal, so this "
                "update changes nothing. The tasks are easy for the policy now; harder ones give it more "
                "to learn (--curriculum difficulty, a harder env or split)"
            )
        elif c.collapsed:
            # One silent step happens in healthy runs too (easy and hard prompts at once); a run of them is
            # the absorbing all-fail state of docs/reproduction.md §3.4.
            lines.append(
                f"step {step}: no learning signal — every group's members got the same reward "
                f"({c.state.silent_steps} step(s) in a row, after {c.state.signal_steps} step(s) with "
                "signal): every group-baseline advantage is 0, so the run is training on nothing; if this "
                "persists, the run has collapsed"
            )
        return "\n".join(lines) or None


@dataclass(frozen=True, slots=True)
class StepInputs:
    """What the schedule and the detector read from a step's (usable) groups."""

    lengths: tuple[int, ...]
    """Model tokens of each episode."""
    group_rewards: tuple[tuple[float, ...], ...]
    """Each group's member rewards."""

    @classmethod
    def of(cls, groups: Sequence[TrajectoryGroup]) -> StepInputs:
        """The inputs of ``groups``."""
        return cls(
            tuple(t.num_model_tokens for g in groups for t in g), tuple(tuple(g.rewards) for g in groups)
        )

    @classmethod
    def merge(cls, parts: Sequence[StepInputs]) -> StepInputs:
        """One step's inputs from its ranks' parts (a distributed learner: every rank decides alike)."""
        return cls(
            tuple(x for p in parts for x in p.lengths), tuple(r for p in parts for r in p.group_rewards)
        )


def observe_step(
    cfg: LearnerConfig, state: StabilityState, inputs: StepInputs, *, step: int
) -> StabilityStep:
    """Pure: the schedule's and the detector's decision for step ``step``."""
    lengths = inputs.lengths
    mean_length = sum(lengths) / len(lengths) if lengths else math.nan
    sched = observe_length(
        state.schedule,
        mean_length,
        base_lr=cfg.lr,
        step=step,
        schedule=cfg.lr_schedule,
        window=cfg.lr_window,
        trigger=cfg.lr_trigger,
        decay=cfg.lr_decay,
        floor=cfg.lr_floor,
    )
    coll = check_collapse(state.collapse, inputs.group_rewards)
    previous = cfg.lr * state.schedule.scale
    return StabilityStep(StabilityState(sched.state, coll.state), sched, coll, mean_length, previous)


def begin_step(
    cfg: LearnerConfig,
    optimizer: torch.optim.Optimizer,
    state: StabilityState,
    inputs: StepInputs | Sequence[TrajectoryGroup],
    *,
    step: int,
) -> StabilityStep:
    """:func:`observe_step` on the step's groups (or their :class:`StepInputs`), then set every parameter
    group's rate to the step's (a ``constant`` schedule leaves the optimizer untouched: its rate is whatever
    the optimizer was built with)."""
    if not isinstance(inputs, StepInputs):
        inputs = StepInputs.of(inputs)
    out = observe_step(cfg, state, inputs, step=step)
    if cfg.lr_schedule != "constant":
        for g in optimizer.param_groups:
            g["lr"] = out.schedule.lr
    return out


def stability_at(run: RunDir, step: int) -> StabilityState:
    """The state stored in ``run``'s checkpoint of ``step`` (what a run resumed there, or a replay of that
    step, starts from); the initial state when there is no such checkpoint (step 0) or it predates
    schedules."""
    ckpt = run.find_checkpoint(step)
    if ckpt is None:
        return StabilityState()
    return StabilityState.from_extra(load_checkpoint(ckpt, restore_rng=False).extra)


def stability_extra(state: StabilityState) -> dict[str, Any]:
    """``{CHECKPOINT_KEY: state}`` for a checkpoint's ``extra``."""
    return {CHECKPOINT_KEY: state.to_json()}
