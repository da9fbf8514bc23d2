"""Per-token losses of the policy-gradient learner: REINFORCE, PPO-clip (with dual clip), k3 KL, and the
decoupled off-policy loss (importance-weighted PPO)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from agentrl.errors import ConfigError

# torch is imported inside the functions that compute: LearnerConfig (and the TrainConfig that holds it)
# needs only this module's names, and the rollout workers and inference servers that unpickle it never
# train (torch costs them ~3 CPU-s and ~300 MB per actor).
if TYPE_CHECKING:
    import torch

__all__ = ["PolicyLossName", "decoupled_policy_loss", "kl_k3", "policy_loss"]

PolicyLossName = Literal["ppo", "reinforce"]


def policy_loss(
    logprobs_B_T: torch.Tensor,
    old_logprobs_B_T: torch.Tensor,
    advantages_B_T: torch.Tensor,
    *,
    kind: PolicyLossName = "ppo",
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    dual_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token policy-gradient loss and a per-token "was clipped" indicator (both [B, T],
    unmasked).

    * ``reinforce``: −A·log π (the gradient of the REINFORCE objective; old log-probs unused).
    * ``ppo``: max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high)), r = π/π_old; with ``dual_clip_c`` = c >
      1, tokens with A < 0 are additionally bounded by −A·c (dual-clip PPO).
    """
    import torch

    if kind == "reinforce":
        return -advantages_B_T * logprobs_B_T, torch.zeros_like(logprobs_B_T)
    if kind != "ppo":
        raise ConfigError(f"unknown policy loss {kind!r}; choose 'ppo' or 'reinforce'")
    # Clamp the log-ratio so one stale token cannot overflow exp (the clip makes its gradient 0
    # anyway).
    ratio = torch.exp((logprobs_B_T - old_logprobs_B_T).clamp(-20.0, 20.0))
    pg1 = -advantages_B_T * ratio
    pg2 = -advantages_B_T * ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high)
    pg = torch.maximum(pg1, pg2)
    clipped = (pg2 > pg1).to(pg.dtype)
    if dual_clip_c is not None:
        pg3 = -advantages_B_T * dual_clip_c
        neg = advantages_B_T < 0
        clipped = torch.where(neg & (pg > pg3), torch.ones_like(clipped), clipped)
        pg = torch.where(neg, torch.minimum(pg, pg3), pg)
    return pg, clipped


def kl_k3(logprobs_B_T: torch.Tensor, ref_logprobs_B_T: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(π ‖ π_ref) per token: e^{Δ} − Δ − 1 with Δ = log π_ref − log π (≥ 0)."""
    import torch

    d = (ref_logprobs_B_T - logprobs_B_T).clamp(-20.0, 20.0)
    return torch.exp(d) - d - 1.0


def decoupled_policy_loss(
    logprobs_B_T: torch.Tensor,
    old_logprobs_B_T: torch.Tensor,
    advantages_B_T: torch.Tensor,
    is_weights_B_T: torch.Tensor,
    *,
    kind: PolicyLossName = "ppo",
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    dual_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoupled off-policy loss: ρ̄_t · :func:`policy_loss` (ratio π_θ/π_old, truncated importance
    weights ρ̄ = min(π_old/μ, C) from :mod:`agentrl.learner.correction`, detached).

    Since ρ̄ ≥ 0 this equals ``policy_loss`` with advantages ρ̄·A, which is how the trainer feeds the
    learner; the "was clipped" indicator is the PPO clip's, unweighted.
    """
    if bool((is_weights_B_T < 0).any()):
        raise ConfigError("importance weights must be >= 0")
    pg, clipped = policy_loss(
        logprobs_B_T,
        old_logprobs_B_T,
        advantages_B_T,
        kind=kind,
        clip_eps_low=clip_eps_low,
        clip_eps_high=clip_eps_high,
        dual_clip_c=dual_clip_c,
    )
    return is_weights_B_T.detach() * pg, clipped
