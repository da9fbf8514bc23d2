"""What recomputing a run's log-probs reports (computed by ``agentrl.trainers.replay``, shown by
:func:`~agentrl.replay.render` and :func:`~agentrl.replay.write_html`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RecomputeReport", "TokenDiff", "TrajectoryRecompute"]


@dataclass(frozen=True)
class TokenDiff:
    """One sampled token whose recomputed log-prob differs from the recorded one."""

    index: int | None
    """Trajectory position in the run."""
    episode_id: str
    """``meta.episode_id``."""
    token_index: int
    """Position in the trajectory's token stream."""
    token_id: int
    """The token."""
    text: str
    """Its text ('' without a tokenizer)."""
    recorded: float
    """Sampler log-prob (recorded)."""
    recomputed: float
    """Log-prob from one forward pass over the recorded tokens."""
    sum_pi_squared: float
    """Σπ² of the recomputed distribution at this position."""

    @property
    def abs_diff(self) -> float:
        """|recorded − recomputed|."""
        return abs(self.recorded - self.recomputed)


@dataclass(frozen=True)
class TrajectoryRecompute:
    """Recomputed per-token values of one trajectory (aligned with its tokens; None off the model tokens)."""

    index: int | None
    """Trajectory position in the run."""
    episode_id: str
    """``meta.episode_id``."""
    weights: str
    """Which weights scored it."""
    logprobs: tuple[float | None, ...]
    """Recomputed log π of each sampled token."""
    sum_pi_squared: tuple[float | None, ...]
    """Σπ² at each sampled token."""
    max_abs_diff: float
    """Largest |recorded − recomputed| over its sampled tokens (0 if none)."""
    mean_abs_diff: float
    """Mean |recorded − recomputed| over its sampled tokens."""
    worst_token: int | None
    """Token index of the largest difference."""


@dataclass(frozen=True)
class RecomputeReport:
    """Recorded sampler log-probs against one forward pass over the recorded tokens."""

    trajectories: tuple[TrajectoryRecompute, ...]
    """Per trajectory, in input order."""
    largest: tuple[TokenDiff, ...]
    """The sampled tokens with the largest differences, largest first."""
    tokens: int
    """Sampled tokens compared."""
    max_abs_diff: float
    """Largest difference over all of them."""
    mean_abs_diff: float
    """Mean difference."""
    mean_sum_pi_squared: float
    """Mean Σπ² over the sampled tokens."""
    temperature: float
    """Temperature of the recomputed distribution (the run's)."""

    def exceeding(self, tol: float) -> int:
        """Trajectories whose largest difference exceeds ``tol``."""
        return sum(1 for t in self.trajectories if t.max_abs_diff > tol)
