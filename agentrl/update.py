"""One policy update from groups of trajectories: collate → score → credit → step → metrics.

The trainer runs this once per step; replay (:func:`agentrl.trainers.replay.reproduce_step`) runs the very
same function on the recorded trajectories and checkpoint, which is why a recorded step can be reproduced
exactly.

Asynchronous training passes a :class:`~agentrl.learner.correction.Correction` and the learner's version:
the sampler's log-probs μ (recorded on the trajectories) and the scoring pass's π_old give each token's
truncated importance weight ρ̄; the loss is weighted by it and OTB's energy by ρ̄² (otb-spec.md §3.5). Without
a correction (the synchronous trainer) nothing changes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from agentrl.batch import TokenBatch, collate
from agentrl.credit import AdvantageEstimator, variance_proxy_metrics
from agentrl.errors import ConfigError
from agentrl.groups import TrajectoryGroup
from agentrl.learner import Learner, LearnerStats
from agentrl.learner.correction import Correction, ImportanceWeights, importance_weights
from agentrl.learner.distributed import all_reduce_floats, world_size
from agentrl.staleness import token_versions

__all__ = ["Credit", "Update", "nothing_to_learn", "policy_update", "score_and_credit"]


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
    weights: ImportanceWeights | None = None
    """The off-policy correction's ρ̄ (None without a ``tis`` correction). The loss uses ρ̄·advantages."""
    staleness_metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    """``staleness/*`` metrics of the batch (empty without a learner version)."""

    @property
    def loss_advantages_B_T(self) -> torch.Tensor:
        """What :meth:`Learner.step` is given: ρ̄·A under a ``tis`` correction, else A (the same tensor)."""
        return self.advantages_B_T if self.weights is None else self.advantages_B_T * self.weights.rho_B_T


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
    learner: Learner,
    groups: Sequence[TrajectoryGroup],
    *,
    estimator: AdvantageEstimator,
    pad_id: int,
    correction: Correction | None = None,
    learner_version: int | None = None,
) -> Credit:
    """Collate ``groups``, score with the learner's current weights, and assign credit with ``estimator``
    (baselines are computed within each group).

    The learner's log-probs replace the sampler's as the PPO reference, so ratios start at exactly 1 and the
    sampler/learner gap is reported instead of silently entering the loss. With a ``tis`` ``correction`` the
    sampler's log-probs μ give the truncated importance weights ρ̄ (``Credit.weights``) and OTB's energy is
    scaled by ρ̄²; ``bypass`` skips the scoring pass (π_old := μ) and is refused for OTB, which needs its Σπ².
    ``learner_version`` (the version being trained, = the step) tells which tokens are stale.
    """
    batch = collate(groups, pad_id=pad_id).to(learner.device)
    m = batch.loss_mask_B_T.bool()
    stale_B_T, smetrics = _staleness(groups, learner_version, batch.input_ids_B_T.shape, learner.device)
    if correction is not None and correction.mode == "bypass":
        if estimator.needs_policy_stats:
            raise ConfigError(
                f"the {estimator.name!r} estimator needs Σπ² from the learner's scoring pass, and correction "
                "mode 'bypass' skips that pass (π_old := the sampler's log-probs); use --correction.mode tis "
                "or an estimator without it (grpo, rloo, opo, none)"
            )
        mu = batch.old_logprobs_B_T
        adv = estimator.advantages(
            batch.token_rewards_B_T,
            batch.loss_mask_B_T,
            None,
            None,
            batch.group_ids,
            episode_ids=batch.episode_ids_or_none,
        )
        return Credit(batch, mu, torch.zeros_like(mu), adv, 0.0, None, smetrics)
    logprobs, spi2 = learner.score(batch)
    if spi2 is None and estimator.needs_policy_stats:  # a learner (group) whose scoring has no Σπ²
        raise ConfigError(f"the {estimator.name!r} estimator needs Σπ², and this learner's score() gave none")
    mismatch = float((batch.old_logprobs_B_T - logprobs)[m].abs().max()) if m.any() else 0.0
    weights = None
    if correction is not None and correction.weighted:
        if correction.scope == "stale" and stale_B_T is None:
            raise ConfigError("correction scope 'stale' needs the learner version (learner_version=)")
        weights = importance_weights(
            logprobs, batch.old_logprobs_B_T, batch.loss_mask_B_T, stale_B_T, correction
        )
    batch = dataclasses.replace(batch, old_logprobs_B_T=logprobs)
    adv = estimator.advantages(
        batch.token_rewards_B_T,
        batch.loss_mask_B_T,
        logprobs,
        spi2,
        batch.group_ids,
        episode_ids=batch.episode_ids_or_none,
        # OTB scales each energy increment by ρ̄² (spec §3.5); the others leave the weights to the loss.
        is_weights_B_T=weights.rho_B_T if weights is not None and weights.active else None,
    )
    return Credit(batch, logprobs, spi2, adv, mismatch, weights, smetrics)


def _staleness(
    groups: Sequence[TrajectoryGroup], learner_version: int | None, shape: torch.Size, device: torch.device
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """[B, T] True on tokens sampled by an older version than ``learner_version``, and batch metrics."""
    if learner_version is None:
        return None, {}
    trajs = [t for g in groups for t in g]
    stale = torch.zeros(shape, dtype=torch.bool)
    for b, t in enumerate(trajs):
        v = torch.tensor(token_versions(t), dtype=torch.long)
        stale[b, : len(v)] = (v < learner_version) & torch.tensor(t.loss_mask, dtype=torch.bool)
    per_traj = [learner_version - t.min_policy_version for t in trajs]
    n_model = sum(sum(t.loss_mask) for t in trajs)
    metrics = {
        "staleness/max": float(max(per_traj, default=0)),
        "staleness/mean": float(sum(per_traj) / len(per_traj)) if per_traj else 0.0,
        "staleness/stale_token_frac": float(stale.sum()) / n_model if n_model else 0.0,
    }
    return stale.to(device), metrics


def policy_update(
    learner: Learner,
    groups: Sequence[TrajectoryGroup],
    *,
    estimator: AdvantageEstimator,
    pad_id: int,
    correction: Correction | None = None,
    learner_version: int | None = None,
    skip_zero: bool = True,
) -> Update:
    """Score, assign credit and take one learner step on ``groups`` (infra failures already dropped, see
    :meth:`TrajectoryGroup.usable`); return everything a step logs. ``correction`` and ``learner_version``
    as in :func:`score_and_credit` (asynchronous training). ``skip_zero``: no optimizer step when
    :func:`nothing_to_learn` (``learn/zero_advantage_skip`` 1); replay of a run recorded before the skip
    existed passes False, as that run stepped."""
    credit = score_and_credit(
        learner,
        groups,
        estimator=estimator,
        pad_id=pad_id,
        correction=correction,
        learner_version=learner_version,
    )
    batch, adv = credit.batch, credit.advantages_B_T
    m = batch.loss_mask_B_T.bool()
    skip = skip_zero and nothing_to_learn(learner, credit)
    if skip:
        stats = _no_step(batch)  # a zero gradient: AdamW would still move the weights (momentum, decay)
    else:
        stats = learner.step(batch, credit.loss_advantages_B_T)
    metrics = {"learn/sampler_mismatch_max": credit.sampler_mismatch_max}
    metrics["learn/zero_advantage_skip"] = float(skip)
    metrics.update(stats.to_dict(prefix="learn/"))
    if not (correction is not None and correction.mode == "bypass"):  # bypass has no Σπ² for the proxies
        rho = credit.weights.rho_B_T if credit.weights is not None and credit.weights.active else None
        proxy = variance_proxy_metrics(
            adv,
            batch.loss_mask_B_T,
            credit.logprobs_B_T,
            credit.sum_pi_squared_B_T,
            grad_norm=stats.grad_norm,
            **({} if rho is None else {"is_weights": rho}),
        )
        metrics.update(proxy.to_dict(prefix="variance/"))
    metrics["learn/adv_mean"] = float(adv[m].mean()) if m.any() else 0.0
    metrics["learn/adv_abs_mean"] = float(adv[m].abs().mean()) if m.any() else 0.0
    if credit.weights is not None:
        metrics.update(credit.weights.metrics)
    metrics.update(credit.staleness_metrics)
    return Update(credit, stats, metrics)


def nothing_to_learn(learner: Learner, credit: Credit) -> bool:
    """True when every advantage on every model token of the step is zero (on every rank) and the loss has
    no other term (no KL to a reference, no entropy bonus): the gradient is zero, so the step is skipped."""
    cfg = learner.config
    if cfg.kl_coef > 0 or cfg.entropy_coef > 0:
        return False
    adv = credit.loss_advantages_B_T
    nonzero = float(((adv != 0) & (credit.batch.loss_mask_B_T != 0)).sum())
    if world_size() > 1:  # every rank must agree: the step is a collective
        nonzero = all_reduce_floats([nonzero], dist.ReduceOp.SUM, learner.device)[0]
    return nonzero == 0


def _no_step(batch: TokenBatch) -> LearnerStats:
    """The learner's report of a step not taken (no micro-batch ran, nothing measured)."""
    seq_tokens = batch.loss_mask_B_T.sum(dim=1)
    nan = math.nan
    return LearnerStats(
        loss=0.0,
        pg_loss=0.0,
        kl=0.0,
        entropy=nan,
        grad_norm=0.0,
        clip_frac=0.0,
        approx_kl=nan,
        ratio_max=nan,
        tokens=int(seq_tokens.sum()),
        sequences=int((seq_tokens > 0).sum()),
        micro_batches=0,
        skipped=True,
    )
