"""Variance-proxy diagnostics (spec §4): signal strength, total power and pure noise of the policy
gradient.

For a batch of N trajectories with per-trajectory gradient ĝ(τ) = ∇log π(τ)·A(τ), the proxy ‖ĝ(τ)‖²
≈ Ŵ(τ)·Ā(τ)² (Ŵ = Σ_t w_t, the logit-gradient energy; Ā = the trajectory's mean advantage) gives

* signal strength S = ‖mean ĝ‖² ≈ grad_norm² (the measured gradient norm of the step),
* total power P = mean_i Ŵ_i·Ā_i²,
* pure noise V = max(0, (P − S)/(N − 1)), the variance of the batch mean.

Caveats (spec §4): grad_norm is in parameter units of the real loss while P is in logit-proxy units,
so V mixes scales; Ā is exact only for sequence-constant advantages (GRPO/RLOO). Log the numbers for
trends, not as absolute variances. Works for any estimator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from agentrl.credit._common import check_inputs, token_energy

__all__ = ["VarianceProxy", "variance_proxy_metrics"]


@dataclass(frozen=True, slots=True)
class VarianceProxy:
    """One step's variance-proxy metrics (spec §4). ``None`` where an input was missing."""

    signal_strength: float | None
    """grad_norm² (proxy1); None when no gradient norm was given."""
    total_power: float
    """mean_i Ŵ_i·Ā_i² (proxy2); with importance weights mean_i ρ̄_i²·Ā_i²·Ŵ_i (unscaled Ŵ)."""
    pure_noise: float | None
    """max(0, (total_power − signal_strength)/(N − 1)) (proxy3); None without grad_norm or with N <
    2."""
    expected_a_squared: float
    """mean_i Ā_i²."""
    expected_w: float
    """mean_i Ŵ_i (importance-scaled when weights are given)."""
    num_trajectories: int
    """N, the number of rows."""

    def to_dict(self, prefix: str = "variance_proxy/") -> dict[str, float]:
        """Flat metrics for a logger; missing values are left out."""
        names = {
            "proxy1_signal_strength": self.signal_strength,
            "proxy2_total_power": self.total_power,
            "proxy3_pure_noise": self.pure_noise,
            "expected_a_squared": self.expected_a_squared,
            "expected_w": self.expected_w,
            "num_trajectories": float(self.num_trajectories),
        }
        return {prefix + k: float(v) for k, v in names.items() if v is not None}


@torch.no_grad()
def variance_proxy_metrics(
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    logprobs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    *,
    is_weights: torch.Tensor | None = None,
    grad_norm: float | None = None,
) -> VarianceProxy:
    """Compute spec §4's proxies from [B, T] tensors (the trainer calls this after each update,
    passing the step's pre-clip gradient norm). Energy uses the same stable proxy as OTB, clamped ≥
    0."""
    adv, m, dtype = check_inputs(
        advantages,
        loss_mask,
        None,
        ("logprobs", logprobs),
        ("sum_pi_squared", sum_pi_squared),
        ("is_weights", is_weights),
    )
    B = adv.shape[0]
    if B == 0:
        return VarianceProxy(None, 0.0, None, 0.0, 0.0, 0)
    zero = torch.zeros((), dtype=dtype, device=adv.device)
    mf = m.to(dtype)
    cnt = mf.sum(dim=1)
    a_bar = torch.where(m, adv, zero).sum(dim=1) / cnt.clamp(min=1)
    w = torch.where(m, token_energy(logprobs.to(dtype), sum_pi_squared.to(dtype)), zero)
    if is_weights is None:
        w_hat = w.sum(dim=1)
        power = (a_bar.square() * w_hat.clamp(min=0)).mean()
    else:
        rho2 = torch.square(is_weights.to(dtype))
        w_hat = torch.where(m, w * rho2, zero).sum(dim=1)
        rho_bar = torch.where(m, is_weights.to(dtype), zero).sum(dim=1) / cnt.clamp(min=1)
        power = (rho_bar.square() * a_bar.square() * w.sum(dim=1).clamp(min=0)).mean()
    signal = None
    noise = None
    if grad_norm is not None and math.isfinite(grad_norm):
        signal = float(grad_norm) ** 2
        if B > 1:
            noise = max(0.0, (float(power) - signal) / (B - 1))
    return VarianceProxy(
        signal_strength=signal,
        total_power=float(power),
        pure_noise=noise,
        expected_a_squared=float(a_bar.square().mean()),
        expected_w=float(w_hat.mean()),
        num_trajectories=B,
    )
