"""The learner's chunked LM head with its backward written out (:func:`head_logprobs`).

Why: with autograd, :func:`~agentrl.learner.forward.forward_logprobs` checkpoints each LM-head chunk. Its
backward then reruns the whole chunk (the [C, V] product, the log-softmax and the metric work: the entropy's
exp and row dot), runs the gather's and the log-softmax's backward (two more [C, V] buffers), and makes a
fresh [V, H] gradient of the head's weight per chunk, which autograd adds into the weight's gradient (with a
tied embedding, a 113 MiB buffer per 128-token chunk for SmolLM2). Here the backward recomputes only the
product and the log-softmax, forms the gradient of the logits in place in the softmax's buffer, and
accumulates the weight's gradient of every chunk into one [V, H] buffer (``addmm_``): the same arithmetic
less the rerun metric work, two [C, V] passes and one [V, H] buffer per chunk (issue 46: the CPU learner
against its packed floor).

Values (log π, Σπ², entropy) are computed by the very operations of the autograd path, so they are the same
to the bit; gradients agree to float rounding (the weight's gradient sums the chunks in another order).

Used only where it is exact by construction: a plain ``nn.Linear`` head without hooks or parametrizations,
no logit scale or softcap, float32/float64 weights without autocast, on CPU (:func:`fused_head_of`). Anything
else keeps the autograd path.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _module
from torch.nn.utils import parametrize

__all__ = ["fused_head_of", "head_logprobs"]


def fused_head_of(model: nn.Module, head: nn.Module, hidden: torch.Tensor) -> nn.Linear | None:
    """``head`` when :func:`head_logprobs` computes exactly what ``head`` (plus the model's logit transform)
    under autograd would for ``hidden``; None otherwise."""
    if type(head) is not nn.Linear or parametrize.is_parametrized(head):
        return None
    if head._forward_hooks or head._forward_pre_hooks or head._backward_hooks or head._backward_pre_hooks:
        return None
    if _module._global_forward_hooks or _module._global_forward_pre_hooks:
        return None
    cfg = getattr(model, "config", None)
    scale = getattr(cfg, "logit_scale", None)
    cap = getattr(cfg, "final_logit_softcapping", None)
    if (isinstance(scale, int | float) and scale != 1) or (isinstance(cap, int | float) and cap > 0):
        return None
    w = head.weight
    if hidden.device.type != "cpu" or w.device != hidden.device or type(w) is not nn.Parameter:
        return None  # measured on CPU only; a DTensor or otherwise wrapped weight keeps autograd's path
    if w.dtype not in (torch.float32, torch.float64) or hidden.dtype != w.dtype:
        return None
    if torch.is_autocast_enabled(hidden.device.type):
        return None
    return head


def _log_softmax(h: torch.Tensor, head: nn.Linear, temperature: float) -> torch.Tensor:
    """The chunk's log-softmax, by the operations of the autograd path (forward.py's ``_chunk_stats``)."""
    z = head(h)
    z = z.to(torch.float64 if z.dtype == torch.float64 else torch.float32)
    if temperature != 1.0:
        z = z / temperature
    return torch.log_softmax(z, dim=-1)


def _rowdot(a_C_V: torch.Tensor, b_C_V: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = torch.linalg.vecdot(a_C_V, b_C_V)
    return out


class _HeadLogprobs(torch.autograd.Function):
    """log π(target) (and Σπ², entropy) of hidden states through a linear head, chunked; see the module."""

    @staticmethod
    def forward(
        ctx: Any,
        h: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        head: nn.Linear,
        temperature: float,
        chunk: int,
        want_spi2: bool,
        want_entropy: bool,
        entropy_grad: bool,
        saved_tokens: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        lps, spis, ents = [], [], []
        # Chunks starting within the first saved_tokens rows keep their softmax for backward (no rerun of the
        # product there); not with a differentiable entropy, whose gradient needs the log-softmax as well.
        save = 0 if entropy_grad and want_entropy else saved_tokens
        kept: list[torch.Tensor] = []
        for s in range(0, h.shape[0], chunk):
            logp = _log_softmax(h[s : s + chunk], head, temperature)
            lps.append(logp.gather(-1, targets[s : s + chunk, None]).squeeze(-1))
            if want_entropy or want_spi2 or s < save:
                p = logp.exp()
                if want_entropy:
                    # The autograd path's two formulas: a differentiable entropy as mul + sum, a metric as a
                    # row dot (the same value to the bit in each case).
                    ents.append(-(p * logp).sum(dim=-1) if entropy_grad else -_rowdot(p, logp))
                if want_spi2:
                    spis.append(_rowdot(p, p))
                if s < save:
                    kept.append(p)
                del p
            del logp
        empty = h.new_zeros(0, dtype=torch.float64 if h.dtype == torch.float64 else torch.float32)
        lp = torch.cat(lps) if lps else empty
        spi2 = torch.cat(spis) if spis else empty.clone()
        ent = torch.cat(ents) if ents else empty.clone()
        ctx.save_for_backward(h, weight, bias, targets, ent if entropy_grad and want_entropy else None)
        ctx.head, ctx.temperature, ctx.chunk, ctx.kept = head, temperature, chunk, kept
        # One call: each call replaces the set of the last.
        ctx.mark_non_differentiable(*((spi2,) if entropy_grad and want_entropy else (spi2, ent)))
        return lp, spi2, ent

    @staticmethod
    def backward(
        ctx: Any, g_lp: torch.Tensor | None, _g_spi2: torch.Tensor | None, g_ent: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        h, weight, bias, targets, ent = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        head, temperature, chunk, kept = ctx.head, ctx.temperature, ctx.chunk, ctx.kept
        ctx.kept = []  # each kept softmax becomes its chunk's gradient buffer below
        grad_h = torch.empty_like(h) if need_h else None
        grad_w: torch.Tensor | None = None
        grad_b: torch.Tensor | None = None
        with torch.no_grad():
            for k, s in enumerate(range(0, h.shape[0], chunk)):
                hc = h[s : s + chunk]
                g = g_lp[s : s + chunk, None] if g_lp is not None else None
                ge = g_ent[s : s + chunk, None] if g_ent is not None and ent is not None else None
                logp: torch.Tensor | None = None
                if k < len(kept):  # the forward's softmax (never with an entropy gradient)
                    p, e = kept[k], None
                    kept[k] = p.new_empty(0)
                elif ge is not None:
                    logp = _log_softmax(hc, head, temperature)
                    p = logp.exp()
                    # d(-Σ p log p)/dz_v = -p_v (log p_v + H), formed in the log-softmax's buffer.
                    e = logp.add_(ent[s : s + chunk, None]).mul_(p).mul_(-ge)
                else:
                    logp = _log_softmax(hc, head, temperature)
                    p, e = logp.exp_(), None
                # d log p_y / dz_v = [v = y] - p_v, in the softmax's own buffer.
                gz = p.mul_(-g) if g is not None else p.zero_()
                if g is not None:
                    gz.scatter_add_(1, targets[s : s + chunk, None], g)
                if e is not None:
                    gz.add_(e)
                del e, logp
                if temperature != 1.0:
                    gz.div_(temperature)
                gz = gz.to(weight.dtype)
                if grad_h is not None:
                    torch.mm(gz, weight, out=grad_h[s : s + chunk])
                if need_w:
                    grad_w = gz.t().mm(hc) if grad_w is None else grad_w.addmm_(gz.t(), hc)
                if need_b:
                    grad_b = gz.sum(0) if grad_b is None else grad_b.add_(gz.sum(0))
                del gz, p
        if need_w and grad_w is None:
            grad_w = torch.zeros_like(weight)
        if need_b and grad_b is None and bias is not None:
            grad_b = torch.zeros_like(bias)
        return grad_h, grad_w, grad_b, None, None, None, None, None, None, None, None


def head_logprobs(
    h_N_H: torch.Tensor,
    targets_N: torch.Tensor,
    head: nn.Linear,
    *,
    temperature: float,
    chunk_size: int,
    want_spi2: bool,
    want_entropy: bool,
    entropy_grad: bool,
    saved_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log π(target), Σπ², entropy) per row of ``h_N_H`` through ``head`` at ``temperature``, ``chunk_size``
    rows at a time, differentiable in ``h_N_H`` and the head's parameters (the entropy only with
    ``entropy_grad``; Σπ² never). Σπ² and entropy are empty tensors unless wanted. ``head`` must pass
    :func:`fused_head_of`.

    Chunks that start within the first ``saved_tokens`` rows keep their softmax ([chunk, V], the head's
    dtype) until backward, which then does not rerun their product and log-softmax (unless the entropy is
    differentiable: then every chunk is rerun). The same values and gradients either way."""
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = _HeadLogprobs.apply(  # type: ignore[no-untyped-call]
        h_N_H,
        head.weight,
        head.bias,
        targets_N,
        head,
        temperature,
        chunk_size,
        want_spi2,
        want_entropy,
        entropy_grad,
        saved_tokens,
    )
    return out
