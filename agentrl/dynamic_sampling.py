"""Dynamic sampling (DAPO): drop groups without reward signal and refill the step with fresh tasks.

A group whose members all got the same reward has a group baseline equal to every member's return, so GRPO,
RLOO and OPO give it zero advantage everywhere (OTB too, except on the unique longest member's solo tail,
whose baseline is 0 by the ``zero_tail`` rule): its generation, sandbox and learner time buys no gradient.
With ``--dynamic-sampling true`` such a group is not trained; the step draws another task instead, until it
holds ``--groups-per-step`` groups with signal or has drawn ``max_draws × groups-per-step`` groups (then it
trains on the groups with signal it has, and says so).

Infrastructure failures are not rewards (never a 0): the verdict is taken on the group's *usable* members
(:meth:`TrajectoryGroup.usable`), exactly the rows the estimator will see. So identical winners plus one
member the sandbox failed is zero-variance (the estimator would give the winners zero advantage: the
NeMo-RL bug, where the filter and the leave-one-out baseline looked at different members), and a group left
with fewer than two usable members is dropped as :attr:`GroupVerdict.TOO_FEW_USABLE`: no group baseline can
be formed from one member. Each trajectory is one whole multi-turn episode, so a group's members never fan
out into several samples (slime's crash).

Which groups a step trains is order-independent: every draw index has its own task, a step issues a new
draw each time a finished group has no signal (while under the cap), so the draws end at the smallest count
``D`` with ``groups-per-step`` groups with signal among draws ``0 .. D-1`` (or at the cap), whether the
groups finish in rounds (the synchronous loop) or one by one (the asynchronous loop). Pure, no I/O, no torch.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar

from agentrl.errors import ConfigError
from agentrl.groups import TrajectoryGroup

__all__ = [
    "DynamicSampling",
    "DynamicSamplingConfig",
    "GroupVerdict",
    "NoDynamicSampling",
    "StepDraws",
    "draw_metrics",
    "group_verdict",
    "zero_variance",
]

REWARD_SPREAD_TOL = 1e-9
"""Rewards whose spread (max − min) is at most this × max(1, |largest|) count as identical: their mean
differs from each of them only by rounding, and every estimator's advantage is rounding noise."""


class GroupVerdict(StrEnum):
    """What dynamic sampling makes of a finished group."""

    SIGNAL = "signal"
    """At least two usable members, and their rewards differ: trained."""
    ZERO_VARIANCE = "zero_variance"
    """Every usable member got the same reward (all solved, or all failed): no group-relative signal."""
    TOO_FEW_USABLE = "too_few_usable"
    """Fewer than two members survived infrastructure failures: no group baseline can be formed."""


def zero_variance(rewards: tuple[float, ...] | list[float]) -> bool:
    """True when the rewards are identical up to :data:`REWARD_SPREAD_TOL` (an empty or single one too)."""
    if len(rewards) < 2:
        return True
    lo, hi = min(rewards), max(rewards)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ConfigError(f"a group's rewards must be finite, got {list(rewards)}")
    return hi - lo <= REWARD_SPREAD_TOL * max(1.0, abs(lo), abs(hi))


def group_verdict(group: TrajectoryGroup) -> GroupVerdict:
    """The verdict on a finished group, taken on its usable members (infra failures left out). Members are
    episodes: a multi-sample episode counts once, with its return (the sum over its samples), and a filtered
    group drops every sample of every episode."""
    usable = group.usable()
    if usable is None or usable.num_episodes < 2:
        return GroupVerdict.TOO_FEW_USABLE
    return GroupVerdict.ZERO_VARIANCE if zero_variance(usable.rewards) else GroupVerdict.SIGNAL


@dataclass(frozen=True)
class DynamicSampling:
    """Drop groups whose usable members' rewards have zero variance and refill the step with fresh tasks."""

    name: ClassVar[str] = "true"

    max_draws: int = 4
    """Cap on the groups a step draws, in multiples of --groups-per-step (4: at most 4 × groups-per-step
    groups are sampled; a step that reaches it trains on the groups with signal it has)."""

    def __post_init__(self) -> None:
        k = self.max_draws
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"--dynamic-sampling.max-draws must be a positive integer, got {k!r}")

    @property
    def enabled(self) -> bool:
        """Groups without signal are dropped and refilled."""
        return True


@dataclass(frozen=True)
class NoDynamicSampling:
    """Train every group drawn, with or without signal (the default)."""

    name: ClassVar[str] = "false"

    max_draws: ClassVar[int] = 1

    @property
    def enabled(self) -> bool:
        """Groups without signal are dropped and refilled."""
        return False


DynamicSamplingConfig = DynamicSampling | NoDynamicSampling
"""``--dynamic-sampling true|false`` (``--dynamic-sampling.max-draws K`` with ``true``)."""


@dataclass
class StepDraws:
    """The draws of one training step: how many were issued, what became of the finished ones, and how many
    more the step needs (one instance per step, owned by the training loop)."""

    groups_per_step: int
    """Groups with signal the step wants."""
    max_draws: int
    """Most groups the step may draw (``max_draws × groups_per_step``; ``groups_per_step`` when off)."""
    enabled: bool
    """Dynamic sampling is on (off: every usable group is trained, nothing is refilled)."""
    drawn: int = 0
    """Draws issued so far (draw indices ``0 .. drawn − 1``)."""
    verdicts: Counter[GroupVerdict] = field(default_factory=Counter)
    """Finished draws by verdict."""

    def __post_init__(self) -> None:
        if self.groups_per_step < 1 or self.max_draws < self.groups_per_step:
            raise ConfigError(
                f"a step needs groups_per_step >= 1 and max_draws >= groups_per_step, got "
                f"{self.groups_per_step} and {self.max_draws}"
            )

    @classmethod
    def of(cls, groups_per_step: int, config: DynamicSamplingConfig) -> StepDraws:
        """The bookkeeping of a new step under ``config``."""
        if config.enabled:
            return cls(groups_per_step, config.max_draws * groups_per_step, True)
        return cls(groups_per_step, groups_per_step, False)

    @property
    def finished(self) -> int:
        """Draws whose group finished (and was recorded)."""
        return sum(self.verdicts.values())

    @property
    def with_signal(self) -> int:
        """Finished groups with signal."""
        return self.verdicts[GroupVerdict.SIGNAL]

    @property
    def filtered(self) -> int:
        """Finished groups dropped for lack of signal (0 when dynamic sampling is off)."""
        return self.finished - self.with_signal if self.enabled else 0

    def keep(self, verdict: GroupVerdict) -> bool:
        """Whether a group with ``verdict`` is trained (off: always; its unusable members are dropped
        anyway, and a group with none at all is skipped by the loop)."""
        return verdict is GroupVerdict.SIGNAL or not self.enabled

    def issue(self, n: int = 1) -> range:
        """Issue ``n`` more draws; returns their indices."""
        if n < 0 or self.drawn + n > self.max_draws:
            raise ConfigError(f"cannot issue {n} draws: {self.drawn} of at most {self.max_draws} issued")
        first = self.drawn
        self.drawn += n
        return range(first, self.drawn)

    def record(self, verdict: GroupVerdict) -> bool:
        """A drawn group finished with ``verdict``; returns whether it is trained."""
        if self.finished >= self.drawn:
            raise ConfigError(f"more groups finished ({self.finished + 1}) than were drawn ({self.drawn})")
        self.verdicts[verdict] += 1
        return self.keep(verdict)

    def need(self) -> int:
        """Draws to issue now: enough that the groups with signal plus those still running make
        ``groups_per_step``, within the cap (the first call issues the step's ``groups_per_step``)."""
        unfinished = self.drawn - self.finished
        want = self.groups_per_step - self.with_signal - unfinished
        if not self.enabled:
            want = self.groups_per_step - self.drawn
        return max(0, min(want, self.max_draws - self.drawn))

    @property
    def capped(self) -> bool:
        """All draws finished, the cap reached, and fewer than ``groups_per_step`` groups with signal."""
        return (
            self.enabled
            and self.drawn >= self.max_draws
            and self.finished == self.drawn
            and self.with_signal < self.groups_per_step
        )

    def report(self, step: int) -> str | None:
        """The console line of a step whose draws dynamic sampling changed (groups filtered, refills drawn):
        what was drawn, kept and filtered, and what the step trains on; None when it changed nothing (or is
        off). A step left with no group with signal says plainly that it makes no update."""
        if not self.enabled or (self.filtered == 0 and self.drawn <= self.groups_per_step):
            return None
        refills = self.drawn - self.groups_per_step
        zero, few = self.verdicts[GroupVerdict.ZERO_VARIANCE], self.verdicts[GroupVerdict.TOO_FEW_USABLE]
        filtered = f"filtered {zero} whose members all got the same reward"
        if few:
            filtered += f" and {few} with fewer than 2 usable members (infrastructure failures)"
        line = (
            f"step {step}: dynamic sampling drew {self.drawn} groups ({self.groups_per_step} + {refills} "
            f"refill(s)), kept {self.with_signal} with reward signal, {filtered}; "
        )
        cap = f"the --dynamic-sampling.max-draws cap ({self.max_draws} draws) was reached"
        if self.with_signal == 0:
            return line + f"{cap} with none, so no update this step"
        if self.with_signal < self.groups_per_step:
            return (
                line + f"{cap} first: training on those {self.with_signal} (of {self.groups_per_step} wanted)"
            )
        return line + f"training on those {self.with_signal}"

    @property
    def complete(self) -> bool:
        """Nothing is running and nothing more will be drawn: the step can train."""
        return self.finished == self.drawn and self.need() == 0


def draw_metrics(
    draws: StepDraws, groups: list[TrajectoryGroup], trained: list[TrajectoryGroup]
) -> dict[str, float]:
    """A step's ``groups/*`` metrics and the fraction of its generated model tokens that reached the
    learner (``tokens/trained_frac``). ``groups`` are all the groups the step drew and finished (filtered
    ones and infra failures included: their tokens were generated too); ``trained`` what it trained on."""
    generated = sum(t.num_model_tokens for g in groups for t in g)
    used = sum(t.num_model_tokens for g in trained for t in g)
    return {
        "groups/drawn": float(draws.drawn),
        "groups/zero_variance": float(draws.verdicts[GroupVerdict.ZERO_VARIANCE]),
        "groups/filtered_zero_variance": float(
            draws.verdicts[GroupVerdict.ZERO_VARIANCE] if draws.enabled else 0
        ),
        "groups/filtered_too_few_usable": float(
            draws.verdicts[GroupVerdict.TOO_FEW_USABLE] if draws.enabled else 0
        ),
        "groups/trained": float(len(trained)),
        "groups/capped": float(draws.capped),
        "tokens/generated": float(generated),
        "tokens/trained_frac": used / generated if generated else float("nan"),
    }
