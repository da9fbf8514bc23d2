"""Random OTB inputs with consistent (log π, Σπ²) pairs and tool spans, shared by the credit tests."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch


@dataclass
class Member:
    """One trajectory in compact form: its model tokens only."""

    group: str
    logprobs: list[float]
    spi2: list[float]
    reward: float
    rho: list[float] | None = None


def energy_pair(p: float, frac: float) -> tuple[float, float]:
    """(log p, Σπ²) consistent with a real distribution: Σπ² = p² + frac·(1 − p)², frac ∈ [0, 1]."""
    return math.log(p), p * p + frac * (1 - p) ** 2


def random_members(
    rng: random.Random,
    n_groups: int,
    group_sizes: tuple[int, int] = (1, 5),
    lengths: tuple[int, int] = (0, 9),
    rewards: tuple[float, ...] = (0.0, 1.0),
    with_rho: bool = False,
) -> list[Member]:
    out = []
    for g in range(n_groups):
        for _ in range(rng.randint(*group_sizes)):
            n = rng.randint(*lengths)
            pairs = [energy_pair(rng.uniform(0.02, 0.98), rng.random()) for _ in range(n)]
            out.append(
                Member(
                    group=f"g{g}",
                    logprobs=[a for a, _ in pairs],
                    spi2=[b for _, b in pairs],
                    reward=rng.choice(rewards),
                    rho=[rng.uniform(0.2, 2.0) for _ in range(n)] if with_rho else None,
                )
            )
    return out


def layout(
    members: list[Member],
    spans: list[list[tuple[int, int]]] | None = None,
    dtype: torch.dtype = torch.float64,
    junk: float = float("nan"),
) -> dict[str, torch.Tensor | list[str]]:
    """Right-padded [B, T] tensors. ``spans[i]`` = (insert before model token k, span length) tool spans;
    tool and padding positions get ``junk`` log-probs/Σπ² (ignored by OTB)."""
    rows = []
    for i, mem in enumerate(members):
        ins = dict()
        for k, ln in spans[i] if spans else []:
            ins[k] = ins.get(k, 0) + ln
        cols: list[tuple[int, float, float, float]] = []  # mask, logprob, spi2, rho
        n = len(mem.logprobs)
        for k in range(n + 1):
            cols += [(0, junk, junk, 1.0)] * ins.get(k, 0)
            if k < n:
                rho = mem.rho[k] if mem.rho else 1.0
                cols.append((1, mem.logprobs[k], mem.spi2[k], rho))
        rows.append(cols)
    B, T = len(rows), max((len(r) for r in rows), default=0)
    mask = torch.zeros(B, T, dtype=dtype)
    lp = torch.full((B, T), junk, dtype=dtype)
    sp = torch.full((B, T), junk, dtype=dtype)
    rho = torch.ones(B, T, dtype=dtype)
    rew = torch.zeros(B, T, dtype=dtype)
    for i, cols in enumerate(rows):
        last = None
        for t, (mk, a, b, c) in enumerate(cols):
            mask[i, t], lp[i, t], sp[i, t], rho[i, t] = mk, a, b, c
            if mk:
                last = t
        if last is not None:
            rew[i, last] = members[i].reward
    return {
        "token_rewards": rew,
        "loss_mask": mask,
        "logprobs": lp,
        "sum_pi_squared": sp,
        "is_weights": rho,
        "group_ids": [m.group for m in members],
    }


def model_token_values(adv: torch.Tensor, mask: torch.Tensor) -> list[list[float]]:
    """Each row's advantages at its model tokens, in order."""
    return [adv[i][mask[i] != 0].tolist() for i in range(adv.shape[0])]
