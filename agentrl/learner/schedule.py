"""Learning-rate schedules decided from what the run observes: ``constant`` and ``length-triggered``.

The length-triggered rule follows "Beyond Precision: Training-Inference Mismatch is an Optimization Problem
and Simple LR Scheduling Fixes It" (Zhang, Li et al., arXiv 2602.01826): gradient noise and the
sampler/learner mismatch grow together during RL, shrinking the update suppresses both, and a *surge in
response length* is the early warning of an impending collapse, so the rate is decayed when the length
surges instead of on a fixed timetable. Only the paper's abstract and summary could be found (its pseudo-code
is a figure), so the exact rule below is ours, built to match that description:

* signal: the mean response length (model tokens per episode) of the step's batch, ``L_k``;
* each step, with ``w = window``, the ratio of the mean of the last ``w`` lengths to the mean of the ``w``
  before them (NaN until ``2w`` lengths have been seen since the start or the last decay);
* when the ratio reaches ``trigger`` (the length grew by that factor within ``w`` steps: a surge), the rate
  is multiplied by ``decay``, never going below ``floor`` × the configured rate, and the length history is
  cleared, so the next decay needs a new surge measured from the new regime (a cool-down of ``2w`` steps).

The decision for step ``k`` uses the lengths of steps ``≤ k`` (the step's episodes are sampled before its
update), so the step that surges is already trained at the lower rate. Everything here is a pure function of
the previous :class:`ScheduleState` and the new length; the state is a small frozen record that checkpoints
store (:meth:`ScheduleState.to_json`), so resuming and ``agentrl replay --step`` see the same rates.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agentrl.errors import ConfigError

__all__ = [
    "LRScheduleName",
    "ScheduleState",
    "ScheduleStep",
    "length_ratio",
    "observe_length",
]

LRScheduleName = Literal["constant", "length-triggered"]
"""``constant``: the configured rate every step. ``length-triggered``: decayed when response length surges."""
LR_SCHEDULES = ("constant", "length-triggered")


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """What the schedule remembers between steps (stored in checkpoints)."""

    scale: float = 1.0
    """The current rate over the configured rate (1 until the first decay)."""
    lengths: tuple[float, ...] = ()
    """Mean response lengths of the last steps since the start or the last decay (at most ``2·window``)."""
    decays: int = 0
    """Decays taken so far."""
    last_decay_step: int | None = None
    """The step whose update first used the current (decayed) rate; None before any decay."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (checkpoint ``state.json``)."""
        return {
            "scale": self.scale,
            "lengths": list(self.lengths),
            "decays": self.decays,
            "last_decay_step": self.last_decay_step,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> ScheduleState:
        """Inverse of :meth:`to_json`; ``None`` (a checkpoint from before schedules) is the initial state."""
        if d is None:
            return cls()
        try:
            last = d.get("last_decay_step")
            return cls(
                scale=float(d["scale"]),
                lengths=tuple(float(x) for x in d["lengths"]),
                decays=int(d["decays"]),
                last_decay_step=None if last is None else int(last),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"not a learning-rate schedule state: {dict(d)!r} ({e})") from e


@dataclass(frozen=True, slots=True)
class ScheduleStep:
    """The schedule's decision for one step."""

    state: ScheduleState
    """The state after observing this step (what the next step starts from)."""
    lr: float
    """The learning rate this step's update uses."""
    signal: float
    """The trigger's signal: recent/previous window mean length (NaN while the history is too short)."""
    triggered: bool
    """True when this step decayed the rate."""


def length_ratio(lengths: Sequence[float], window: int) -> float:
    """Mean of the last ``window`` lengths over the mean of the ``window`` before them (NaN when fewer than
    ``2·window`` lengths are given, or the earlier mean is 0)."""
    if window < 1:
        raise ConfigError(f"window must be >= 1, got {window}")
    if len(lengths) < 2 * window:
        return math.nan
    recent = sum(lengths[-window:]) / window
    before = sum(lengths[-2 * window : -window]) / window
    return recent / before if before > 0 else math.nan


def validate_options(name: str, window: int, trigger: float, decay: float, floor: float) -> None:
    """Raise :class:`ConfigError` on options no schedule can use."""
    if name not in LR_SCHEDULES:
        raise ConfigError(f"lr_schedule must be one of {LR_SCHEDULES}, got {name!r}")
    if window < 1:
        raise ConfigError(f"lr_window must be >= 1 (steps), got {window}")
    if not (math.isfinite(trigger) and trigger > 1):
        raise ConfigError(f"lr_trigger must be a length ratio > 1 (1.3 = 30 % longer), got {trigger}")
    if not (0 < decay < 1):
        raise ConfigError(f"lr_decay must be in (0, 1) (the factor each trigger multiplies by), got {decay}")
    if not (0 < floor <= 1):
        raise ConfigError(f"lr_floor must be in (0, 1] (a fraction of --learner.lr), got {floor}")


def observe_length(
    state: ScheduleState,
    mean_length: float,
    *,
    base_lr: float,
    step: int,
    schedule: LRScheduleName = "length-triggered",
    window: int = 10,
    trigger: float = 1.3,
    decay: float = 0.5,
    floor: float = 0.1,
) -> ScheduleStep:
    """Observe step ``step``'s mean response length and decide its learning rate.

    ``constant`` only records the length (the signal is still reported); ``length-triggered`` decays the
    rate by ``decay`` (not below ``floor·base_lr``) when :func:`length_ratio` reaches ``trigger``, then
    starts its history afresh. A non-finite length (no model tokens) is not recorded.
    """
    validate_options(schedule, window, trigger, decay, floor)
    lengths = state.lengths
    if math.isfinite(mean_length):
        lengths = (*lengths, float(mean_length))[-2 * window :]
    signal = length_ratio(lengths, window)
    if schedule == "constant":
        new = ScheduleState(state.scale, lengths, state.decays, state.last_decay_step)
        return ScheduleStep(new, base_lr * state.scale, signal, False)
    if math.isfinite(signal) and signal >= trigger and state.scale > floor:
        scale = max(state.scale * decay, floor)
        new = ScheduleState(scale, (), state.decays + 1, step)
        return ScheduleStep(new, base_lr * scale, signal, True)
    new = ScheduleState(state.scale, lengths, state.decays, state.last_decay_step)
    return ScheduleStep(new, base_lr * state.scale, signal, False)
