"""One policy update from groups of trajectories: collate → score → credit → step → metrics.

The trainer runs this once per step; replay (:func:`agentrl.trainers.replay.reproduce_step`) runs the very
same function on the recorded trajectories and checkpoint, which is why a recorded step can be reproduced
exactly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agentrl.batch import TokenBatch, collate
from agentrl.credit import AdvantageEstimator, variance_proxy_metrics
from agentrl.groups import TrajectoryGroup
from agentrl.learner import Learner, LearnerStats

__all__ = ["Credit", "Update", "policy_update", "score_and_credit"]


@dataclass(frozen=True)
class Credit:
    """The scored batch and its advantages."""

    batch: TokenBatch
    """The collated groups (one row per member, group after group), with the learner's log-probs as
    ``old_logprobs_B_T``."""
    logprobs_B_T: torch.Tensor
    """Log-probs of the current weights on the model tokens (0 elsewhere)."""
    sum_pi_squared_B_T: torch.Tensor
    """Σπ² of the current weights at each model token (0 elsewhere)."""
    advantages_B_T: torch.Tensor
    """The estimator's per-token advantages (0 where the loss mask is 0)."""
    sampler_mismatch_max: float
    """Largest |log π_sampler − log π_learner| over model tokens: the training–inference mismatch."""


@dataclass(frozen=True)
class Update:
    """What one :func:`policy_update` did."""

    credit: Credit
    """The scored batch and advantages the update used."""
    stats: LearnerStats
    """The learner's report (loss before the update, gradient norm, clip fraction, ...)."""
    metrics: dict[str, float]
    """Flat metrics for ``metrics.jsonl``: ``learn/*`` and ``variance/*``."""


def score_and_credit(
    learner: Learner, groups: Sequence[TrajectoryGroup], *, estimator: AdvantageEstimator, pad_id: int
) -> Credit:
    """Collate ``groups``, score with the learner's current weights, and assign credit with ``estimator``
    (baselines are computed within each group).

    The learner's log-probs replace the sampler's as the PPO reference, so ratios start at exactly 1 and the
    sampler/learner gap is reported instead of silently entering the loss.
    """
    batch = collate(groups, pad_id=pad_id).to(learner.device)
    logprobs, spi2 = learner.score(batch)
    m = batch.loss_mask_B_T.bool()
    mismatch = float((batch.old_logprobs_B_T - logprobs)[m].abs().max()) if m.any() else 0.0
    batch = dataclasses.replace(batch, old_logprobs_B_T=logprobs)
    adv = estimator.advantages(batch.token_rewards_B_T, batch.loss_mask_B_T, logprobs, spi2, batch.group_ids)
    return Credit(batch, logprobs, spi2, adv, mismatch)


def policy_update(
    learner: Learner, groups: Sequence[TrajectoryGroup], *, estimator: AdvantageEstimator, pad_id: int
) -> Update:
    """Score, assign credit and take one learner step on ``groups`` (infra failures already dropped, see
    :meth:`TrajectoryGroup.usable`); return everything a step logs."""
    credit = score_and_credit(learner, groups, estimator=estimator, pad_id=pad_id)
    batch, adv = credit.batch, credit.advantages_B_T
    stats = learner.step(batch, adv)
    proxy = variance_proxy_metrics(
        adv, batch.loss_mask_B_T, credit.logprobs_B_T, credit.sum_pi_squared_B_T, grad_norm=stats.grad_norm
    )
    m = batch.loss_mask_B_T.bool()
    metrics = {"learn/sampler_mismatch_max": credit.sampler_mismatch_max}
    metrics.update(stats.to_dict(prefix="learn/"))
    metrics.update(proxy.to_dict(prefix="variance/"))
    metrics["learn/adv_mean"] = float(adv[m].mean()) if m.any() else 0.0
    metrics["learn/adv_abs_mean"] = float(adv[m].abs().mean()) if m.any() else 0.0
    return Update(credit, stats, metrics)
