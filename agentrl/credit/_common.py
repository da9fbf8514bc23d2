"""Input checks and small vectorised helpers shared by the advantage estimators."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from agentrl.errors import ConfigError

__all__ = [
    "GroupIds",
    "check_inputs",
    "episode_index",
    "group_index",
    "returns_to_go",
    "token_energy",
    "working_dtype",
]

GroupIds = Sequence[Hashable] | torch.Tensor
"""One group id per row: any hashables (strings, ints) or an integer tensor of shape [B]."""


def working_dtype(
    token_rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    group_ids: GroupIds | None,
    *others: tuple[str, torch.Tensor | None],
) -> torch.dtype:
    """Check that all inputs are [B, T] on one device (and one group id per row); return the working
    dtype: float64 when any floating input is float64, else float32 (bf16/fp16 inputs are upcast: the
    estimators sum thousands of terms)."""
    if token_rewards.dim() != 2:
        raise ConfigError(f"token_rewards must be [B, T], got shape {tuple(token_rewards.shape)}")
    shape = token_rewards.shape
    dev = token_rewards.device
    tensors = [("token_rewards", token_rewards), ("loss_mask", loss_mask)]
    tensors += [(n, t) for n, t in others if t is not None]
    for name, t in tensors:
        if t.shape != shape:
            raise ConfigError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
        if t.device != dev:
            raise ConfigError(f"{name} is on {t.device}, token_rewards on {dev}")
    if group_ids is not None:
        n_ids = group_ids.numel() if isinstance(group_ids, torch.Tensor) else len(group_ids)
        if n_ids != shape[0]:
            raise ConfigError(f"got {n_ids} group ids for {shape[0]} rows")
    floating = [t.dtype for _, t in tensors if t.is_floating_point()]
    return torch.float64 if torch.float64 in floating else torch.float32


def check_inputs(
    token_rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    group_ids: GroupIds | None,
    *others: tuple[str, torch.Tensor | None],
) -> tuple[torch.Tensor, torch.Tensor, torch.dtype]:
    """:func:`working_dtype` plus a 0/1 check of the mask; return (rewards in the working dtype, bool
    mask, working dtype)."""
    dtype = working_dtype(token_rewards, loss_mask, group_ids, *others)
    if loss_mask.dtype != torch.bool and bool(((loss_mask != 0) & (loss_mask != 1)).any()):
        raise ConfigError("loss_mask must contain only 0 and 1")
    return token_rewards.to(dtype), loss_mask != 0, dtype


def group_index(group_ids: GroupIds, device: torch.device) -> tuple[torch.Tensor, int]:
    """Map group ids to dense indices 0..n_groups-1 (first-appearance order). Returns ([B] long,
    n)."""
    if isinstance(group_ids, torch.Tensor):
        if group_ids.dim() != 1 or group_ids.is_floating_point():
            raise ConfigError("a group_ids tensor must be a 1-D integer tensor")
        uniq, inv = torch.unique(group_ids.to(device), return_inverse=True)
        return inv.long(), int(uniq.numel())
    # Factorising B hashables is O(B) dictionary work, negligible next to the [B, T] tensor passes.
    table: dict[Hashable, int] = {}
    idx = [table.setdefault(g, len(table)) for g in group_ids]
    return torch.tensor(idx, dtype=torch.long, device=device), len(table)


def episode_index(
    episode_ids: GroupIds, gidx_B: torch.Tensor, n_rows: int
) -> tuple[torch.Tensor, int, torch.Tensor]:
    """Dense episode indices of the rows: ([B] long episode index, E, [E] group index of each episode).

    Rows sharing an episode id are the samples of one episode (in row order); they must share a group,
    so episode ids must be unique across the batch's groups. ``gidx_B`` is :func:`group_index`'s output.
    """
    n_ids = episode_ids.numel() if isinstance(episode_ids, torch.Tensor) else len(episode_ids)
    if n_ids != n_rows:
        raise ConfigError(f"got {n_ids} episode ids for {n_rows} rows")
    dev = gidx_B.device
    ep, n_ep = group_index(episode_ids, dev)
    rows = torch.arange(n_rows, device=dev)
    first = torch.full((n_ep,), n_rows, dtype=torch.long, device=dev).scatter_reduce_(0, ep, rows, "amin")
    gidx_E = gidx_B[first]
    if bool((gidx_E[ep] != gidx_B).any()):
        raise ConfigError("the samples of one episode (rows sharing an episode id) must share a group id")
    return ep, n_ep, gidx_E


def returns_to_go(token_rewards: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """G[b, t] = Σ_{u ≥ t} r[b, u]·m[b, u] (rewards on masked positions are dropped, as in verl).

    Flip-cumsum rather than ``total − cumsum``: with one outcome reward per row it is exact.
    """
    m = loss_mask != 0
    r = torch.where(m, token_rewards, torch.zeros((), dtype=token_rewards.dtype, device=m.device))
    return torch.flip(torch.cumsum(torch.flip(r, (1,)), dim=1), (1,))


def token_energy(logprobs: torch.Tensor, sum_pi_squared: torch.Tensor) -> torch.Tensor:
    """Logit-gradient proxy w = ‖e_y − π‖² = 1 − 2π(y) + Σπ², in a form that does not cancel.

    Computed as ``(1 − π_y)² + clamp(Σπ² − π_y², 0, (1 − π_y)²)``:

    * ``1 − π_y`` comes from ``−expm1(log π_y)``, exact to a relative ulp even when π_y → 1, where
      the naive ``1 − 2π + Σπ²`` rounds to exactly 0 in fp32 (spec §2.4);
    * ``Σ_{v≠y} π_v² = Σπ² − π_y²`` lies in ``[0, (1 − π_y)²]`` mathematically (a sum of squares is
      at most the square of the sum), so clamping to that interval only removes rounding noise. It
      also guarantees w ≥ 0 and w ∈ [(1 − π_y)², 2(1 − π_y)²], i.e. the result is within a factor 2
      of the truth however inconsistent the rounded inputs are.

    Difference from the naive formula: where the naive value is accurate (w ≫ ulp) the two agree to
    a few ulp; where it cancels (π_y ≥ ~0.9999 in fp32) the naive form returns 0 or a tiny negative
    number while this one returns the true ~(1 − π_y)² scale. See docs/benchmarks/credit.md for
    measured magnitudes.
    """
    a = torch.square(torch.expm1(logprobs))
    p = torch.exp(logprobs)
    rest = torch.addcmul(sum_pi_squared.to(a.dtype), p, p, value=-1.0).clamp_min_(0.0)
    rest = torch.minimum(rest, a)
    return a + rest
