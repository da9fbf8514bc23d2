"""Off-policy correction for asynchronous training: three policies, decoupled.

* μ — the sampler's recorded log-probs (``Trajectory.logprobs``, collated as ``old_logprobs_B_T``);
* π_old — the learner's own scoring pass at the start of the update (:meth:`Learner.score`, which also
  yields Σπ² for OTB);
* π_θ — the policy being optimised.

The PPO ratio is π_θ/π_old (clipped as usual); the loss of each token is weighted by the truncated
importance weight ρ̄_t = min(π_old(y_t)/μ(y_t), C). OTB scales each token's energy increment by ρ̄_t²
(otb-spec.md §3.5). Optionally whole trajectories whose geometric-mean ratio exp(mean_t log π_old/μ) leaves
a band ``[seq_mask_low, seq_mask_high]`` get ρ̄ = 0 (they are kept in the batch, contribute nothing).

Which tokens are corrected (``scope``): ``stale`` (the default) corrects only tokens sampled by an older
version than the learner's; a token sampled by the learner's current weights has μ = π_old as
distributions, so its ρ̄ is exactly 1 and the training–inference numerical mismatch is reported, not
corrected (what the synchronous trainer does). ``all`` corrects every model token (for a sampler whose
numerics differ from the learner's, e.g. vLLM in bf16). ``bypass`` skips the scoring pass: π_old := μ and
no ρ̄ (cheaper, but it has no Σπ², so OTB cannot run with it).

Because ρ̄ ≥ 0, ρ̄·max(−A·r, −A·clip(r)) = max(−(ρ̄A)·r, −(ρ̄A)·clip(r)) (and the same for REINFORCE and the
dual clip): the trainer hands :meth:`Learner.step` the advantages ρ̄·A. :func:`agentrl.learner.losses.
decoupled_policy_loss` is the loss written out, for tests and for learners that take the weights apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from agentrl.errors import ConfigError

# torch is imported inside the functions that compute: LearnerConfig (and the TrainConfig that holds it)
# needs only this module's names, and the rollout workers and inference servers that unpickle it never
# train (torch costs them ~3 CPU-s and ~300 MB per actor).
if TYPE_CHECKING:
    import torch

__all__ = ["Correction", "CorrectionMode", "ImportanceWeights", "importance_weights", "truncated_is_weights"]

CorrectionMode = Literal["tis", "bypass", "off"]


@dataclass(frozen=True)
class Correction:
    """How an update corrects for tokens sampled by other weights than the learner's (async training)."""

    mode: CorrectionMode = "tis"
    """``tis``: token-level truncated importance weights ρ̄ = min(π_old/μ, cap) on the loss (and ρ̄² on
    OTB's energy); ``bypass``: no scoring pass, PPO ratio against μ, no ρ̄ (refused with OTB, which needs
    the pass's Σπ²); ``off``: ratio against π_old, μ ignored (what the synchronous trainer does)."""
    cap: float = 2.0
    """C in ρ̄ = min(π_old/μ, C)."""
    scope: Literal["stale", "all"] = "stale"
    """``stale``: correct tokens sampled by an older version than the learner's (fresh tokens get ρ̄ = 1
    exactly); ``all``: every model token (also corrects sampler/learner numerical mismatch)."""
    seq_mask_low: float | None = None
    """Give ρ̄ = 0 to a trajectory whose geometric-mean ratio π_old/μ over its corrected tokens is below
    this (None = no lower bound)."""
    seq_mask_high: float | None = None
    """Give ρ̄ = 0 to a trajectory whose geometric-mean ratio π_old/μ over its corrected tokens is above
    this (None = no upper bound)."""

    def __post_init__(self) -> None:
        if self.mode not in ("tis", "bypass", "off"):
            raise ConfigError(f"correction mode must be 'tis', 'bypass' or 'off', got {self.mode!r}")
        if self.scope not in ("stale", "all"):
            raise ConfigError(f"correction scope must be 'stale' or 'all', got {self.scope!r}")
        if isinstance(self.cap, bool) or not isinstance(self.cap, int | float) or not self.cap >= 1:
            raise ConfigError(f"the correction cap must be a number >= 1, got {self.cap!r}")
        lo, hi = self.seq_mask_low, self.seq_mask_high
        if lo is not None and not 0 <= lo <= 1:
            raise ConfigError(f"seq_mask_low must be in [0, 1], got {lo!r}")
        if hi is not None and not hi >= 1:
            raise ConfigError(f"seq_mask_high must be >= 1, got {hi!r}")

    @property
    def weighted(self) -> bool:
        """True when the update applies importance weights (``tis``)."""
        return self.mode == "tis"


@dataclass(frozen=True)
class ImportanceWeights:
    """What :func:`importance_weights` computed for one batch."""

    rho_B_T: torch.Tensor
    """ρ̄ per token (float32): min(π_old/μ, cap) on corrected tokens, 0 on every model token of a masked
    trajectory, exactly 1 everywhere else."""
    clipped_B_T: torch.Tensor
    """True where the untruncated ratio π_old/μ exceeded the cap (corrected tokens only)."""
    corrected_B_T: torch.Tensor
    """True on the model tokens the correction applied to (by ``scope``)."""
    seq_masked_B: torch.Tensor
    """True for trajectories masked by the geometric-mean band."""
    metrics: dict[str, float]
    """``correction/*`` metrics: ρ̄ mean/min/max, clip and mask fractions, effective sample size,
    sampler/learner KL."""

    @property
    def active(self) -> bool:
        """False when ρ̄ ≡ 1 by construction (no token corrected, no trajectory masked)."""
        return bool(self.corrected_B_T.any() or self.seq_masked_B.any())


def truncated_is_weights(
    old_logprobs_B_T: torch.Tensor,
    sampler_logprobs_B_T: torch.Tensor,
    correct_B_T: torch.Tensor,
    *,
    cap: float = 2.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ρ̄, clipped): ρ̄ = min(exp(log π_old − log μ), cap) where ``correct_B_T``, exactly 1 elsewhere.

    With μ = π_old bitwise the log-ratio is 0 and ρ̄ is exactly 1. Log-ratios are clamped at 20 before
    ``exp`` (the cap truncates them anyway), so values at uncorrected positions may be anything.
    """
    import torch

    if old_logprobs_B_T.shape != sampler_logprobs_B_T.shape or correct_B_T.shape != old_logprobs_B_T.shape:
        raise ConfigError(
            f"importance weights need [B, T] tensors of one shape, got {tuple(old_logprobs_B_T.shape)}, "
            f"{tuple(sampler_logprobs_B_T.shape)} and {tuple(correct_B_T.shape)}"
        )
    if not cap >= 1:
        raise ConfigError(f"cap must be >= 1, got {cap}")
    sel = correct_B_T.bool()
    log_ratio = torch.where(sel, old_logprobs_B_T.float() - sampler_logprobs_B_T.float(), 0.0)
    ratio = torch.exp(log_ratio.clamp(max=20.0))
    clipped = sel & (ratio > cap)
    rho = torch.where(sel, ratio.clamp(max=cap), torch.ones_like(ratio))
    return rho, clipped


def importance_weights(
    old_logprobs_B_T: torch.Tensor,
    sampler_logprobs_B_T: torch.Tensor,
    loss_mask_B_T: torch.Tensor,
    stale_B_T: torch.Tensor | None,
    correction: Correction,
) -> ImportanceWeights:
    """ρ̄ for a batch, with the sequence mask and the metrics.

    Args:
        old_logprobs_B_T: log π_old from the learner's scoring pass.
        sampler_logprobs_B_T: log μ, the sampler's recorded log-probs.
        loss_mask_B_T: 1 on model tokens.
        stale_B_T: True on tokens sampled by an older version than the learner's; needed for
            ``scope="stale"``.
        correction: the settings (mode ``tis``).
    """
    import torch

    if correction.mode != "tis":
        raise ConfigError(f"importance weights are only computed in mode 'tis', not {correction.mode!r}")
    mask = loss_mask_B_T.bool()
    if correction.scope == "stale":
        if stale_B_T is None:
            raise ConfigError("scope 'stale' needs each token's staleness (stale_B_T)")
        corrected = mask & stale_B_T.bool()
    else:
        corrected = mask
    rho, clipped = truncated_is_weights(old_logprobs_B_T, sampler_logprobs_B_T, corrected, cap=correction.cap)
    log_ratio = torch.where(mask, old_logprobs_B_T.float() - sampler_logprobs_B_T.float(), 0.0)
    n_corr_B = corrected.sum(dim=1)
    geo_B = torch.exp(torch.where(corrected, log_ratio, 0.0).sum(dim=1) / n_corr_B.clamp(min=1))
    masked_B = torch.zeros_like(n_corr_B, dtype=torch.bool)
    if correction.seq_mask_low is not None:
        masked_B |= geo_B < correction.seq_mask_low
    if correction.seq_mask_high is not None:
        masked_B |= geo_B > correction.seq_mask_high
    masked_B &= n_corr_B > 0
    if bool(masked_B.any()):
        rho = torch.where(masked_B[:, None] & mask, torch.zeros_like(rho), rho)
    return ImportanceWeights(
        rho, clipped, corrected, masked_B, _metrics(rho, clipped, corrected, mask, masked_B, log_ratio)
    )


def _metrics(
    rho: torch.Tensor,
    clipped: torch.Tensor,
    corrected: torch.Tensor,
    mask: torch.Tensor,
    masked_B: torch.Tensor,
    log_ratio: torch.Tensor,
) -> dict[str, float]:
    n_tok = int(mask.sum())
    n_corr = int(corrected.sum())
    r_all = rho[mask].double()
    r_corr = rho[corrected].double()
    # k1 and k3 estimates of KL(μ ‖ π_old) from tokens sampled by μ (k3 = r − 1 − log r ≥ 0, r = π_old/μ).
    lr = log_ratio[mask].double().clamp(-20.0, 20.0)
    ess = float(r_all.sum() ** 2 / (n_tok * (r_all**2).sum())) if n_tok and float(r_all.sum()) > 0 else 0.0
    has_rows = int((mask.sum(dim=1) > 0).sum())
    return {
        "correction/rho_mean": float(r_corr.mean()) if n_corr else 1.0,
        "correction/rho_min": float(r_corr.min()) if n_corr else 1.0,
        "correction/rho_max": float(r_corr.max()) if n_corr else 1.0,
        "correction/clip_frac": float(clipped.sum()) / n_corr if n_corr else 0.0,
        "correction/corrected_token_frac": n_corr / n_tok if n_tok else 0.0,
        "correction/seq_masked_frac": float(masked_B.sum()) / has_rows if has_rows else 0.0,
        "correction/ess": ess if n_tok else 1.0,
        "correction/kl_sampler_learner": float((-lr).mean()) if n_tok else 0.0,
        "correction/kl_k3_sampler_learner": float((lr.exp() - 1 - lr).mean()) if n_tok else 0.0,
        "correction/log_ratio_abs_max": float(lr.abs().max()) if n_tok else 0.0,
    }
