"""Sampling helpers shared by the generation engine and the policies."""

from __future__ import annotations

import torch

__all__ = ["nucleus"]


def nucleus(logp_V: torch.Tensor, top_p: float) -> torch.Tensor:
    """Log-probs renormalized over the smallest set of tokens whose mass reaches ``top_p``."""
    sorted_lp, order = torch.sort(logp_V, descending=True)
    cum = sorted_lp.exp().cumsum(-1)
    # Keep a token if the mass *before* it is < top_p (so the top token is always kept).
    keep_sorted = (cum - sorted_lp.exp()) < top_p
    keep = torch.zeros_like(keep_sorted)
    keep[order] = keep_sorted
    masked = logp_V.masked_fill(~keep, float("-inf"))
    return masked - torch.logsumexp(masked, dim=-1)
