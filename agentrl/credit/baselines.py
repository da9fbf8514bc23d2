"""Sequence-level baselines with OTB's calling convention: GRPO, RLOO, OPO, and none.

Each trajectory's score is R_i = Σ_t r[i,t]·m[i,t] (masked rewards, as OTB's return at the first
model token). A group baseline b_i is computed from the scores of the group's *non-empty* members
(rows with at least one model token; empty rows have nothing to train and get advantage 0, as in
OTB) and broadcast over
the row:
A[i,t] = (R_i − b_i)·m[i,t] (GRPO may also divide by the group std). A group of one gets b = 0 (A =
R) for all three, matching verl. ``no_baseline`` returns the reward-to-go G[i,t] itself.

Multi-sample episodes (``episode_ids``: rows sharing an id are one episode's samples): the group's
members are episodes; an episode's score is the sum of its samples' scores, its length their model
tokens, and its advantage goes to every model token of all its samples (docs/otb-multisample.md).

``logprobs`` and ``sum_pi_squared`` are accepted (and ignored) so every estimator can be called the
same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentrl.credit._common import GroupIds, check_inputs, episode_index, group_index, returns_to_go
from agentrl.errors import ConfigError

__all__ = ["grpo_advantages", "no_baseline", "opo_advantages", "rloo_advantages"]


@dataclass(frozen=True, slots=True)
class _Scores:
    """The members' scores: one per episode (a row, or the rows sharing an episode id)."""

    R: torch.Tensor
    """[E] score of each member: its rows' masked rewards, summed."""
    length: torch.Tensor
    """[E] model tokens of each member (all its rows)."""
    gidx: torch.Tensor
    """[E] dense group index of each member."""
    n: int
    """Number of groups."""
    mask: torch.Tensor
    """[B, T] bool loss mask."""
    ep: torch.Tensor | None
    """[B] member index of each row (None: row b is member b)."""

    @property
    def live(self) -> torch.Tensor:
        """[E] True for members with at least one model token."""
        return self.length > 0


def _scores(
    token_rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    group_ids: GroupIds | None,
    episode_ids: GroupIds | None,
) -> _Scores:
    if group_ids is None:
        raise ConfigError("this baseline needs group_ids (one per row)")
    r, m, _ = check_inputs(token_rewards, loss_mask, group_ids)
    R = torch.where(m, r, torch.zeros((), dtype=r.dtype, device=r.device)).sum(dim=1)
    length = m.sum(dim=1).to(R.dtype)
    gidx, n = group_index(group_ids, r.device)
    if episode_ids is None:
        return _Scores(R, length, gidx, n, m, None)
    ep, n_ep, gidx_E = episode_index(episode_ids, gidx, R.numel())
    return _Scores(_group_sum(R, ep, n_ep), _group_sum(length, ep, n_ep), gidx_E, n, m, ep)


def _group_sum(x: torch.Tensor, gidx: torch.Tensor, n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=x.dtype, device=x.device).index_add_(0, gidx, x)


def _broadcast(adv_E: torch.Tensor, s: _Scores) -> torch.Tensor:
    adv_B = adv_E if s.ep is None else adv_E[s.ep]
    return torch.where(s.mask, adv_B[:, None], torch.zeros((), dtype=adv_B.dtype, device=s.mask.device))


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
    episode_ids: GroupIds | None = None,
) -> torch.Tensor:
    """GRPO: A = R − mean_group(R), divided by (std_group(R) + eps) when ``norm_by_std`` (unbiased
    std, as verl's ``norm_adv_by_std_in_grpo=True`` default). Group of one: A = R."""
    s = _scores(token_rewards, loss_mask, group_ids, episode_ids)
    R, gidx, n = s.R, s.gidx, s.n
    lf = s.live.to(R.dtype)
    cnt = _group_sum(lf, gidx, n)
    mean = _group_sum(R * lf, gidx, n) / cnt.clamp(min=1)
    single = cnt[gidx] <= 1
    dev = R - mean[gidx]
    adv = torch.where(single, R, dev)
    if norm_by_std:
        var = _group_sum(dev.square() * lf, gidx, n) / (cnt - 1).clamp(min=1)
        adv = torch.where(single, R, dev / (var.sqrt()[gidx] + eps))
    return _broadcast(adv, s)


@torch.no_grad()
def rloo_advantages(
    token_rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    logprobs: torch.Tensor | None,
    sum_pi_squared: torch.Tensor | None,
    group_ids: GroupIds | None,
    *,
    episode_ids: GroupIds | None = None,
) -> torch.Tensor:
    """RLOO: b_i = mean of the *other* members' scores; A = R_i − b_i. Group of one: A = R."""
    s = _scores(token_rewards, loss_mask, group_ids, episode_ids)
    R, gidx, n = s.R, s.gidx, s.n
    lf = s.live.to(R.dtype)
    cnt = _group_sum(lf, gidx, n)[gidx]
    tot = _group_sum(R * lf, gidx, n)[gidx]
    b = (tot - R) / (cnt - 1).clamp(min=1)
    return _broadcast(torch.where(cnt <= 1, R, R - b), s)


@torch.no_grad()
def opo_advantages(
    token_rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    logprobs: torch.Tensor | None,
    sum_pi_squared: torch.Tensor | None,
    group_ids: GroupIds | None,
    *,
    episode_ids: GroupIds | None = None,
) -> torch.Tensor:
    """OPO: length-weighted baseline b = Σ ℓ_i R_i / Σ ℓ_i, ℓ_i = number of model tokens (the
    optimal baseline when ‖∇log π(τ)‖² ∝ length, spec §6). Group of one: A = R."""
    s = _scores(token_rewards, loss_mask, group_ids, episode_ids)
    R, gidx, n, length = s.R, s.gidx, s.n, s.length
    cnt = _group_sum(s.live.to(R.dtype), gidx, n)[gidx]
    b = _group_sum(length * R, gidx, n)[gidx] / _group_sum(length, gidx, n)[gidx].clamp(min=1)
    return _broadcast(torch.where(cnt <= 1, R, R - b), s)


@torch.no_grad()
def no_baseline(
    token_rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    logprobs: torch.Tensor | None,
    sum_pi_squared: torch.Tensor | None,
    group_ids: GroupIds | None,
    *,
    episode_ids: GroupIds | None = None,
) -> torch.Tensor:
    """Plain REINFORCE: the advantage is the reward-to-go G[b,t] on model tokens. With ``episode_ids`` the
    reward-to-go runs across an episode's samples (rows sharing an id, in row order): a sample's tokens
    also get the rewards of the samples after it."""
    r, m, _ = check_inputs(token_rewards, loss_mask, group_ids)
    G = returns_to_go(r, m)
    if episode_ids is not None:
        if group_ids is None:
            raise ConfigError("episode_ids need group_ids (an episode's samples share its group)")
        ep, _, _ = episode_index(episode_ids, group_index(group_ids, r.device)[0], r.shape[0])
        G = G + _later_samples(G[:, 0] if G.shape[1] else torch.zeros_like(ep, dtype=r.dtype), ep)[:, None]
    return torch.where(m, G, torch.zeros((), dtype=r.dtype, device=r.device))


def _later_samples(R_B: torch.Tensor, ep: torch.Tensor) -> torch.Tensor:
    """[B] sum of ``R_B`` over the rows after each row in the same episode (row order)."""
    out = torch.zeros_like(R_B)
    # An episode has a handful of samples; a loop over rows keeps this obviously right.
    seen: dict[int, float] = {}
    for b in range(R_B.numel() - 1, -1, -1):
        e = int(ep[b])
        out[b] = seen.get(e, 0.0)
        seen[e] = seen.get(e, 0.0) + float(R_B[b])
    return out
