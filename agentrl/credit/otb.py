"""Optimal Token Baseline (OTB) for tool-integrated trajectories, and the chunked Σπ² helper.

Spec: the project's OTB specification (otb-spec.md) §3.3 (the ``tir_optimal_token_baseline``
semantics of verl) with the numerics of §2.4. For each row b and model token t (loss mask 1):

* w[b,t] = 1 − 2π(y_t) + Σπ² (logit-gradient proxy; tool/padding tokens contribute nothing), times
  ρ² when importance weights are given;
* W[b,t] = cumulative energy over the row's model tokens up to t; G[b,t] = reward-to-go;
* members of a group are aligned by their k-th model token (not by column); at compact index k the
  baseline is Σ G·W / (Σ W + eps) over the members that still have a k-th model token;
* a group with one (non-empty) member gets baseline 0 (advantage = return); with ``zero_tail`` the
  unique longest member's tokens beyond the second-longest length also get baseline 0;
* advantage = G − baseline on model tokens, 0 elsewhere.

Multi-sample episodes (``episode_ids``; docs/otb-multisample.md): an episode whose context was compacted
or split is several rows (its samples, in row order). Its model tokens are taken as one sequence, sample
after sample: W and G run across the samples, k counts model tokens from the episode's start, and the
group's members are episodes. With one row per episode this is the per-row computation above, operation
for operation.

Implementation (no Python loop over rows or groups): the model tokens are gathered once into a flat
row-major list (one ``nonzero``); row boundaries come from a binary search. W and G are segmented
cumulative sums along the rows of a compact [B, L] buffer. Each model token's cell
(group, k) indexes a flat [n_groups × L] table (L = longest row in model tokens); two ``index_add_``
build Σ G·W and Σ W, and a per-group histogram of lengths gives the number of members alive at each
k. "Exactly one member alive at k" is precisely the zero-tail region (and, for a group of one, every
k), so both rules are one ``where``. One gather brings the baseline back and one ``index_copy_``
writes the [B, T] result.
"""

from __future__ import annotations

import torch

from agentrl.credit._common import (
    GroupIds,
    episode_index,
    group_index,
    token_energy,
    working_dtype,
)
from agentrl.errors import ConfigError

__all__ = ["optimal_token_baseline", "sum_pi_squared"]


@torch.no_grad()
def optimal_token_baseline(
    token_rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    logprobs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    group_ids: GroupIds,
    *,
    is_weights: torch.Tensor | None = None,
    zero_tail: bool = True,
    eps: float = 1e-8,
    episode_ids: GroupIds | None = None,
) -> torch.Tensor:
    """OTB advantages for right-padded [B, T] tensors (spec §3.3, tool-integrated variant).

    Args:
        token_rewards: [B, T] rewards; the outcome reward sits on each row's last model token.
            Rewards on positions with mask 0 are dropped (as in the reference).
        loss_mask: [B, T], 1 where the policy sampled the token; 0 for prompt, tool output and
            padding.
        logprobs: [B, T] log π_old(y_t) from the trainer's forward pass (temperature-scaled). Values
            at masked positions are ignored (may be anything, even NaN).
        sum_pi_squared: [B, T] Σ_v π_old(v)² at each position, same forward pass.
        group_ids: B hashable ids (or a [B] integer tensor); rows sharing an id form a group.
        is_weights: optional [B, T] truncated importance weights ρ̄; each energy increment is scaled
            by ρ̄².
        zero_tail: give the unique longest member's solo tail baseline 0 (advantage = return).
        eps: added to the baseline's denominator.
        episode_ids: optional B ids (or a [B] integer tensor); rows sharing one are the samples of one
            episode, in row order, and must share a group id. None: every row is its own episode.

    Returns:
        [B, T] advantages (float64 if any input is float64, else float32), 0 where the mask is 0.

    Numerics: the energy uses :func:`agentrl.credit._common.token_energy` (no cancellation as π → 1,
    never negative) instead of the naive ``1 − 2π + Σπ²``. Wherever a group's ΣW at a position is ≲
    eps (a very confident shared prefix) the baseline tends to 0 and the advantage to the return;
    that is the reference behaviour (spec §3.5), kept on purpose.
    """
    if group_ids is None:
        raise ConfigError("optimal_token_baseline needs group_ids (one per row)")
    dtype = working_dtype(
        token_rewards,
        loss_mask,
        group_ids,
        ("logprobs", logprobs),
        ("sum_pi_squared", sum_pi_squared),
        ("is_weights", is_weights),
    )
    if eps < 0:
        raise ConfigError(f"eps must be >= 0, got {eps}")
    B, T = token_rewards.shape
    dev = token_rewards.device
    # Work on the model tokens only, as a flat row-major list: everything below is O(model tokens)
    # except finding them (one nonzero) and writing the result back (one index_copy over [B, T]).
    pos = loss_mask.reshape(-1).nonzero().squeeze(1)
    n = int(pos.numel())
    if n == 0:
        return torch.zeros((B, T), dtype=dtype, device=dev)
    if loss_mask.dtype != torch.bool and bool((torch.take(loss_mask, pos) != 1).any()):
        raise ConfigError("loss_mask must contain only 0 and 1")
    # Row boundaries by binary search in the sorted positions: O(B log n), no pass over [B, T].
    bounds = torch.searchsorted(pos, torch.arange(B + 1, device=dev) * T)
    starts, lengths = bounds[:-1], bounds[1:] - bounds[:-1]
    gidx, n_groups = group_index(group_ids, dev)
    R = B  # the sequences OTB runs along: rows, or episodes (their samples' model tokens end to end)
    if episode_ids is not None:
        ep, R, gidx = episode_index(episode_ids, gidx, B)
        # Reorder the flat token list so each episode's samples' tokens are contiguous, in row order.
        by_ep = torch.sort(ep, stable=True).indices
        len_p = lengths[by_ep]
        shift = starts[by_ep] - (torch.cumsum(len_p, 0) - len_p)
        pos = pos[torch.repeat_interleave(shift, len_p, output_size=n).add_(torch.arange(n, device=dev))]
        lengths = torch.zeros(R, dtype=lengths.dtype, device=dev).index_add_(0, ep, lengths)
        starts = torch.cumsum(lengths, 0) - lengths
    rows = torch.arange(R, device=dev)

    def per_token(table_B: torch.Tensor) -> torch.Tensor:
        # Expand one value per row to that row's model tokens (run-length expansion; much faster on
        # CPU than gathering with a row index).
        return torch.repeat_interleave(table_B, lengths, output_size=n)

    w = token_energy(torch.take(logprobs, pos).to(dtype), torch.take(sum_pi_squared, pos).to(dtype))
    if is_weights is not None:
        w = w * torch.square(torch.take(is_weights, pos).to(dtype))
    r_m = torch.take(token_rewards, pos).to(dtype)

    # W (and G, when needed) are cumulative sums along each row's model tokens, taken along the rows
    # of a compact [B, L] buffer (L = longest row in model tokens): each row's sum starts from an
    # exact 0, in the same order as the reference's per-row cumsum. Cells past a row's end are never
    # read, and a cumulative sum only looks backwards, so the buffer needs no zero fill.
    L = int(lengths.max())
    cell = per_token(rows * L - starts).add_(torch.arange(n, device=dev))  # (row, k) in the buffer

    def row_cumsum(x: torch.Tensor) -> torch.Tensor:
        buf = torch.empty(R * L, dtype=dtype, device=dev).index_copy_(0, cell, x)
        return torch.cumsum(buf.view(R, L), dim=1).view(R * L).index_select(0, cell)

    W = row_cumsum(w)
    # Reward-to-go. The usual case (collate's layout: one reward on each row's last model token)
    # needs no cumulative sum: G is that reward on every model token of the row.
    last = (starts + lengths - 1).clamp(min=0)
    r_last = torch.where(lengths > 0, r_m[last], torch.zeros((), dtype=dtype, device=dev))
    if int(torch.count_nonzero(r_m)) == int(torch.count_nonzero(r_last)):
        G = per_token(r_last)
    else:
        r_tot = torch.zeros(R, dtype=dtype, device=dev).index_add_(
            0, torch.repeat_interleave(rows, lengths, output_size=n), r_m
        )
        G = per_token(r_tot).sub_(row_cumsum(r_m)).add_(r_m)  # total minus what came before

    # Cell (group, k) of each model token in the group table, k = its index among its row's tokens.
    key = per_token((gidx - rows) * L).add_(cell)
    num = torch.zeros(n_groups * L, dtype=dtype, device=dev).index_add_(0, key, G * W)  # Σ G·W
    den = torch.zeros(n_groups * L, dtype=dtype, device=dev).index_add_(0, key, W)  # Σ W
    # Members alive at k (longer than k), from a per-group histogram of lengths: O(groups × L).
    hist = torch.zeros((n_groups, L + 1), dtype=torch.int32, device=dev)
    hist.index_put_((gidx, lengths), torch.ones(R, dtype=torch.int32, device=dev), accumulate=True)
    members = hist[:, 1:].sum(dim=1, keepdim=True)  # non-empty members
    if zero_tail:
        # Exactly one member alive is the zero-tail region (and every k of a group of one).
        alive = members - torch.cumsum(hist, dim=1)[:, :L] + hist[:, :1]
        solo = alive == 1
    else:
        solo = (members == 1).expand(n_groups, L)
    zero = torch.zeros((), dtype=dtype, device=dev)
    base = torch.where(solo.reshape(-1), zero, num / (den + eps))
    adv = G.sub_(base.index_select(0, key))
    return torch.zeros(B * T, dtype=dtype, device=dev).index_copy_(0, pos, adv).view(B, T)


@torch.no_grad()
def sum_pi_squared(logits: torch.Tensor, *, temperature: float = 1.0, chunk_size: int = 1024) -> torch.Tensor:
    """Σ_v π_v² for π = softmax(logits / temperature), over the last dimension.

    Uses Σπ² = Σ e^{2(z−m)} / (Σ e^{z−m})² with m = max z — the log-sum-exp identity exp(LSE(2z) −
    2·LSE(z)) evaluated with one ``exp`` — so it is finite for any finite logits (|z| = 1e4
    included). Rows are processed ``chunk_size`` at a time, upcast to fp32 (fp64 stays fp64), so the
    extra memory is O(chunk_size × V), never O(rows × V) in fp32.

    Returns a tensor of shape ``logits.shape[:-1]`` in float32 (float64 for float64 input), values
    in (0, 1].
    """
    if temperature <= 0:
        raise ConfigError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ConfigError(f"chunk_size must be >= 1, got {chunk_size}")
    if logits.dim() < 1:
        raise ConfigError("logits need a vocabulary dimension")
    out_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    flat = logits.reshape(-1, logits.shape[-1])
    out = torch.empty(flat.shape[0], dtype=out_dtype, device=logits.device)
    for s in range(0, flat.shape[0], chunk_size):
        z = flat[s : s + chunk_size].to(out_dtype)
        if temperature != 1.0:
            z = z / temperature
        out[s : s + chunk_size] = sum_pi_squared_fp(z)
    return out.reshape(logits.shape[:-1])


def sum_pi_squared_fp(z: torch.Tensor) -> torch.Tensor:
    """Σπ² of already-scaled full-precision logits [N, V] (one chunk; no chunking, no upcast)."""
    e = torch.exp(z - z.amax(dim=-1, keepdim=True))
    s1 = e.sum(dim=-1)
    s2 = e.square_().sum(dim=-1)
    return s2 / (s1 * s1)
