"""Sampling helpers shared by the generation engine and the policies."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentrl.protocols import Sampling

__all__ = ["exponential_race", "new_noise_buffer", "nucleus"]


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


def new_noise_buffer(rows: int, like_B_V: torch.Tensor) -> torch.Tensor:
    """A float32 ``[rows, V]`` buffer for :func:`exponential_race`, on ``like_B_V``'s device. Keep it across
    steps: a fresh one per step is fresh pages (a large tensor gets its own mapping) for the kernel to fault
    in and zero."""
    return torch.empty((rows, like_B_V.shape[-1]), dtype=torch.float32, device=like_B_V.device)


def exponential_race(
    logits_B_V: torch.Tensor,
    samplings: Sequence[Sampling],
    rngs: Sequence[torch.Generator],
    noise_R_V: torch.Tensor,
) -> tuple[list[int], list[float]]:
    """One token per row, and its log-prob under the distribution sampled from.

    Row ``b`` samples from ``log_softmax(logits / temperature)`` (renormalized over the nucleus when
    ``top_p < 1``) with noise from ``rngs[b]`` alone. ``noise_R_V`` (:func:`new_noise_buffer`, at least B
    rows) is overwritten.
    """
    B = logits_B_V.shape[0]
    z_B_V = logits_B_V.float()
    temps = [s.temperature for s in samplings]
    if any(t != 1.0 for t in temps):  # x / 1 == x exactly: the pass is skipped when no row tempers
        z_B_V = z_B_V / torch.tensor(temps, dtype=torch.float32, device=z_B_V.device)[:, None]
    logp_B_V = torch.log_softmax(z_B_V, dim=-1)
    for b, s in enumerate(samplings):
        if s.top_p < 1.0:
            logp_B_V[b] = nucleus(logp_B_V[b], s.top_p)
    # Exponential race (Gumbel-max): argmax(logp - log E) with E ~ Exp(1) from the request's own stream
    # samples exactly from softmax(logp), and unlike an inverse CDF a tiny change of the logits (another
    # batch shape) flips the choice only if the two best scores are within that change.
    u_B_V = noise_R_V[:B]
    for b, rng in enumerate(rngs):
        u_B_V[b].uniform_(generator=rng)  # ~4x cheaper than exponential_ on CPU
    tiny = torch.finfo(u_B_V.dtype).tiny
    exp_B_V = u_B_V.clamp_(min=tiny).log_().neg_().clamp_(min=tiny)  # E = -log U ~ Exp(1)
    # (-log E) + logp equals logp - log E to the bit (IEEE subtraction adds the negation); in place.
    tok_B_1 = exp_B_V.log_().neg_().add_(logp_B_V).argmax(dim=-1, keepdim=True)
    lps: list[float] = logp_B_V.gather(1, tok_B_1).view(-1).tolist()
    toks: list[int] = tok_B_1.view(-1).tolist()
    return toks, lps
