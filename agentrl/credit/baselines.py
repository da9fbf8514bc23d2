"""Sequence-level baselines with OTB's calling convention: GRPO, RLOO, OPO, and none.

Each trajectory's score is R_i = Σ_t r[i,t]·m[i,t] (masked rewards, as OTB's return at the first
model token). A group baseline b_i is computed from the scores of the group's *non-empty* members
(rows with at least one model token; empty rows have nothing to train and get advantage 0, as in
OTB) and broadcast over
the row:
A[i,t] = (R_i − b_i)·m[i,t] (GRPO may also divide by the group std). A group of one gets b = 0 (A =
R) for all three, matching verl. ``no_baseline`` returns the reward-to-go G[i,t] itself.

``logprobs`` and ``sum_pi_squared`` are accepted (and ignored) so every estimator can be called the
same way.
"""

from __future__ import annotations

import torch

from agentrl.credit._common import GroupIds, check_inputs, group_index, returns_to_go
from agentrl.errors import ConfigError

__all__ = ["grpo_advantages", "no_baseline", "opo_advantages", "rloo_advantages"]


def _scores(
    token_rewards: torch.Tensor, loss_mask: torch.Tensor, group_ids: GroupIds | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    if group_ids is None:
        raise ConfigError("this baseline needs group_ids (one per row)")
    r, m, _ = check_inputs(token_rewards, loss_mask, group_ids)
    R = torch.where(m, r, torch.zeros((), dtype=r.dtype, device=r.device)).sum(dim=1)
    gidx, n = group_index(group_ids, r.device)
    return R, m, gidx, m.any(dim=1), n


def _group_sum(x: torch.Tensor, gidx: torch.Tensor, n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=x.dtype, device=x.device).index_add_(0, gidx, x)


def _broadcast(adv_B: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return torch.where(m, adv_B[:, None], torch.zeros((), dtype=adv_B.dtype, device=m.device))


@torch.no_grad()
def grpo_advantages(
    token_rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    logprobs: torch.Tensor | None,
    sum_pi_squared: torch.Tensor | None,
    group_ids: GroupIds | None,
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO: A = R − mean_group(R), divided by (std_group(R) + eps) when ``norm_by_std`` (unbiased
    std, as verl's ``norm_adv_by_std_in_grpo=True`` default). Group of one: A = R."""
    R, m, gidx, live, n = _scores(token_rewards, loss_mask, group_ids)
    lf = live.to(R.dtype)
    cnt = _group_sum(lf, gidx, n)
    mean = _group_sum(R * lf, gidx, n) / cnt.clamp(min=1)
    single = cnt[gidx] <= 1
    dev = R - mean[gidx]
    adv = torch.where(single, R, dev)
    if norm_by_std:
        var = _group_sum(dev.square() * lf, gidx, n) / (cnt - 1).clamp(min=1)
        adv = torch.where(single, R, dev / (var.sqrt()[gidx] + eps))
    return _broadcast(adv, m)


@torch.no_grad()
def rloo_advantages(
    token_rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    logprobs: torch.Tensor | None,
    sum_pi_squared: torch.Tensor | None,
    group_ids: GroupIds | None,
) -> torch.Tensor:
    """RLOO: b_i = mean of the *other* members' scores; A = R_i − b_i. Group of one: A = R."""
    R, m, gidx, live, n = _scores(token_rewards, loss_mask, group_ids)
    lf = live.to(R.dtype)
    cnt = _group_sum(lf, gidx, n)[gidx]
    tot = _group_sum(R * lf, gidx, n)[gidx]
    b = (tot - R) / (cnt - 1).clamp(min=1)
    return _broadcast(torch.where(cnt <= 1, R, R - b), m)


@torch.no_grad()
def opo_advantages(
    token_rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    logprobs: torch.Tensor | None,
    sum_pi_squared: torch.Tensor | None,
    group_ids: GroupIds | None,
) -> torch.Tensor:
    """OPO: length-weighted baseline b = Σ ℓ_i R_i / Σ ℓ_i, ℓ_i = number of model tokens (the
    optimal baseline when ‖∇log π(τ)‖² ∝ length, spec §6). Group of one: A = R."""
    R, m, gidx, live, n = _scores(token_rewards, loss_mask, group_ids)
    length = m.sum(dim=1).to(R.dtype)
    cnt = _group_sum(live.to(R.dtype), gidx, n)[gidx]
    b = _group_sum(length * R, gidx, n)[gidx] / _group_sum(length, gidx, n)[gidx].clamp(min=1)
    return _broadcast(torch.where(cnt <= 1, R, R - b), m)


@torch.no_grad()
def no_baseline(
    token_rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    logprobs: torch.Tensor | None,
    sum_pi_squared: torch.Tensor | None,
    group_ids: GroupIds | None,
) -> torch.Tensor:
    """Plain REINFORCE: the advantage is the reward-to-go G[b,t] on model tokens."""
    r, m, _ = check_inputs(token_rewards, loss_mask, group_ids)
    return torch.where(m, returns_to_go(r, m), torch.zeros((), dtype=r.dtype, device=r.device))
