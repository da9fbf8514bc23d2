"""Plain-loop reference versions of OTB, kept deliberately close to verl's code (spec §3.2, §3.3).

They loop over groups and rows with masked indexing, use the *naive* energy 1 − 2π + Σπ² (as verl does) and
are the ground truth for tests/credit and the speed baseline in benchmarks/credit.py.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence

import torch


def _energy_and_returns(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    logprobs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    is_weights: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    m = mask.to(token_rewards.dtype)
    G = torch.flip(torch.cumsum(torch.flip(token_rewards * m, (1,)), dim=1), (1,))
    w = 1 - 2 * torch.exp(logprobs) + sum_pi_squared
    if is_weights is not None:
        w = w * is_weights**2
    W = torch.cumsum(w * m, dim=1)
    return G, W


def tir_otb_loop(
    token_rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    logprobs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    group_ids: Sequence[Hashable],
    *,
    is_weights: torch.Tensor | None = None,
    zero_tail: bool = True,
    eps: float = 1e-8,
) -> torch.Tensor:
    """Multi-turn / TIR variant, spec §3.3 (verl compute_multi_turn_optimal_token_baseline_advantage)."""
    with torch.no_grad():
        B, T = token_rewards.shape
        G, W = _energy_and_returns(token_rewards, loss_mask, logprobs, sum_pi_squared, is_weights)
        mb = loss_mask.bool()
        lens = mb.sum(dim=1)
        lmax = int(lens.max()) if B else 0
        Wc = torch.zeros(B, lmax, dtype=G.dtype)
        Gc = torch.zeros(B, lmax, dtype=G.dtype)
        for i in range(B):
            n = int(lens[i])
            if n > 0:
                Wc[i, :n] = W[i, mb[i]]
                Gc[i, :n] = G[i, mb[i]]
        groups: dict[Hashable, list[int]] = defaultdict(list)
        for i in range(B):
            if int(lens[i]) > 0:
                groups[group_ids[i]].append(i)
        Bc = torch.zeros(B, lmax, dtype=G.dtype)
        for rows in groups.values():
            if len(rows) == 1:
                continue
            idx = torch.tensor(rows)
            num = (Gc[idx] * Wc[idx]).sum(dim=0)
            den = Wc[idx].sum(dim=0) + eps
            base = num / den
            for i in rows:
                Bc[i] = base
            if zero_tail:
                ls = sorted((int(lens[i]) for i in rows), reverse=True)
                if ls[0] > ls[1]:
                    star = next(i for i in rows if int(lens[i]) == ls[0])
                    Bc[star, ls[1] :] = 0
        Ac = Gc - Bc
        A = torch.zeros(B, T, dtype=G.dtype)
        for i in range(B):
            n = int(lens[i])
            if n > 0:
                A[i, mb[i]] = Ac[i, :n]
        return A * loss_mask.to(A.dtype)


def single_turn_otb_loop(
    token_rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    logprobs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    group_ids: Sequence[Hashable],
    *,
    zero_tail: bool = True,
    eps: float = 1e-8,
) -> torch.Tensor:
    """Single-turn variant, spec §3.2 (columns aligned by absolute position)."""
    with torch.no_grad():
        B, T = token_rewards.shape
        G, W = _energy_and_returns(token_rewards, loss_mask, logprobs, sum_pi_squared, None)
        m = loss_mask.to(G.dtype)
        Bl = torch.zeros(B, T, dtype=G.dtype)
        groups: dict[Hashable, list[int]] = defaultdict(list)
        for i in range(B):
            groups[group_ids[i]].append(i)
        for rows in groups.values():
            if len(rows) == 1:
                continue
            idx = torch.tensor(rows)
            num = (G[idx] * W[idx] * m[idx]).sum(dim=0)
            den = (W[idx] * m[idx]).sum(dim=0) + eps
            for i in rows:
                Bl[i] = num / den
            if zero_tail:
                lens = [int(m[i].sum()) for i in rows]
                order = sorted(lens, reverse=True)
                if order[0] > order[1]:
                    star = rows[lens.index(order[0])]
                    Bl[star, order[1] :] = 0
        return (G - Bl) * m


def tir_otb_episode_loop(
    token_rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    logprobs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    group_ids: Sequence[Hashable],
    episode_ids: Sequence[Hashable],
    *,
    is_weights: torch.Tensor | None = None,
    zero_tail: bool = True,
    eps: float = 1e-8,
) -> torch.Tensor:
    """OTB across the samples of multi-sample episodes (docs/otb-multisample.md), as plain Python loops.

    An episode is the rows sharing an episode id, in row order. Its model tokens, sample after sample, form
    one sequence: the energy W accumulates over it, the reward-to-go G sums the rewards from a token to the
    episode's end, and the k-th model token of the episode is baselined with the k-th tokens of the other
    episodes of its group.
    """
    with torch.no_grad():
        B, T = token_rewards.shape
        dt = token_rewards.dtype
        episodes: dict[Hashable, list[int]] = defaultdict(list)
        for b in range(B):
            episodes[episode_ids[b]].append(b)
        # Each episode as a list of (row, column, w, r) over its model tokens, in order.
        seqs: dict[Hashable, list[tuple[int, int, float, float]]] = {}
        for e, rows in episodes.items():
            seq = []
            for b in rows:
                assert group_ids[b] == group_ids[rows[0]]
                for t in range(T):
                    if loss_mask[b, t] != 0:
                        w = 1 - 2 * math.exp(float(logprobs[b, t])) + float(sum_pi_squared[b, t])
                        if is_weights is not None:
                            w *= float(is_weights[b, t]) ** 2
                        seq.append((b, t, w, float(token_rewards[b, t])))
            seqs[e] = seq
        W: dict[Hashable, list[float]] = {}
        G: dict[Hashable, list[float]] = {}
        for e, seq in seqs.items():
            acc, W[e] = 0.0, []
            for _, _, w, _ in seq:
                acc += w
                W[e].append(acc)
            G[e] = [sum(r for _, _, _, r in seq[k:]) for k in range(len(seq))]
        by_group: dict[Hashable, list[Hashable]] = defaultdict(list)
        for e, seq in seqs.items():
            if seq:
                by_group[group_ids[episodes[e][0]]].append(e)
        A = torch.zeros(B, T, dtype=dt)
        for members in by_group.values():
            lens = sorted((len(seqs[e]) for e in members), reverse=True)
            for e in members:
                for k, (b, t, _, _) in enumerate(seqs[e]):
                    alive = [o for o in members if len(seqs[o]) > k]
                    solo = len(members) == 1 or (zero_tail and lens[0] > lens[1] and k >= lens[1])
                    if solo:
                        base = 0.0
                    else:
                        num = sum(G[o][k] * W[o][k] for o in alive)
                        base = num / (sum(W[o][k] for o in alive) + eps)
                    A[b, t] = G[e][k] - base
        return A
