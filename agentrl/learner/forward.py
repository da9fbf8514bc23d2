"""The learner's forward pass: per-token log-probs, Σπ² and entropy, chunked over tokens.

The vocabulary projection is applied to the final hidden states ``chunk_size`` tokens at a time and only
where a value is needed (model tokens), so no [T, V] fp32 tensor exists; with gradients each chunk is
checkpointed (its logits are recomputed in backward), keeping the extra memory O(chunk_size × V). The first
``saved_tokens`` tokens' chunks may instead keep their log-softmax for backward (no recomputation of the LM
head: one [chunk, V] product fewer per chunk, for ``saved_tokens × V × 4`` bytes held until backward). On
CPU, a plain linear head in float32/float64 goes through :mod:`agentrl.learner.head` instead: the same
chunks with a hand-written backward (less work per chunk, one weight-gradient buffer per micro-batch).
"""

from __future__ import annotations

import inspect
import sys
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from agentrl.errors import ConfigError
from agentrl.learner.head import fused_head_of, head_logprobs

__all__ = ["ForwardOutput", "forward_logprobs", "packing_support"]


@dataclass(frozen=True, slots=True)
class ForwardOutput:
    """Per-token results of :func:`forward_logprobs`, all [B, T] float32 (0 where not computed)."""

    logprobs_B_T: torch.Tensor
    """log π(input_ids[:, t] | input_ids[:, :t]); 0 at t = 0 and at positions not computed."""
    sum_pi_squared_B_T: torch.Tensor | None
    """Σ_v π(v)² of the distribution that produced token t (no grad); None unless requested."""
    entropy_B_T: torch.Tensor | None
    """Entropy of that distribution (differentiable unless ``entropy_grad=False``); None unless requested."""


def _head_parts(model: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """(decoder, output head) of an HF causal LM, or None for models that only return logits."""
    get_dec = getattr(model, "get_decoder", None)
    get_head = getattr(model, "get_output_embeddings", None)
    if get_dec is None or get_head is None:
        return None
    try:
        dec, head = get_dec(), get_head()
    except (AttributeError, NotImplementedError):
        return None
    if not isinstance(dec, nn.Module) or not isinstance(head, nn.Module) or dec is model:
        return None
    return dec, head


def _logit_transform(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """What HF applies after the LM head: Cohere-style ``logit_scale``, Gemma-style final
    softcapping."""
    cfg = getattr(model, "config", None)
    scale = getattr(cfg, "logit_scale", None)
    cap = getattr(cfg, "final_logit_softcapping", None)

    def f(z: torch.Tensor) -> torch.Tensor:
        if isinstance(scale, int | float) and scale != 1:
            z = z * scale
        if isinstance(cap, int | float) and cap > 0:
            z = torch.tanh(z / cap) * cap
        return z

    return f


def _run_backbone(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor], nn.Module | None]:
    """Final hidden states [B, T, H], a function hidden → logits and the output head, or logits [B, T, V],
    identity and None.

    The model itself is called (not its decoder), so wrappers' hooks (FSDP unshard/reshard, hooks of
    accelerate) run; the decoder's output is captured with a forward hook, and the head is asked for
    one position only (``logits_to_keep=1``) so the full [B, T, V] logits are never built.

    With ``position_ids`` (packed rows) no attention mask is passed: transformers then finds the sequences
    from the restarts of the positions and keeps attention inside each (see :func:`packing_supported`).
    """
    params = inspect.signature(model.forward).parameters
    kwargs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask}
    if position_ids is not None:
        kwargs = {"input_ids": input_ids, "attention_mask": None, "position_ids": position_ids}
    if "use_cache" in params:
        kwargs["use_cache"] = False
    parts = _head_parts(model)
    keep = "logits_to_keep" if "logits_to_keep" in params else None
    if keep is None and "num_logits_to_keep" in params:
        keep = "num_logits_to_keep"
    if parts is None or keep is None:
        out = model(**kwargs)
        logits = out.logits if hasattr(out, "logits") else out
        return logits, lambda z: z, None
    dec, head = parts
    captured: list[torch.Tensor] = []

    def hook(_mod: nn.Module, _inp: Any, out: Any) -> None:
        h = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        captured.append(h)

    handle = dec.register_forward_hook(hook)
    try:
        out = model(**kwargs, **{keep: 1})
    finally:
        handle.remove()
    if len(captured) != 1:
        raise RuntimeError(f"expected one decoder call, saw {len(captured)}")
    hidden = captured[0]
    if torch.is_grad_enabled() and hidden.requires_grad and _hooks_root_outputs(model):
        # Tie the model's real output into the graph (with weight 0) so wrappers that hook the root's
        # outputs (FSDP pre-backward) see the backward pass. Only for such wrappers: the tie's backward
        # builds a full [V, H] gradient of the LM head per micro-batch (a zero one, added to the tied
        # embedding's), a few percent of a CPU update of a small model.
        logits = out.logits if hasattr(out, "logits") else out[0]
        hidden = hidden + 0.0 * logits.reshape(-1)[0].to(hidden.dtype)
    post = _logit_transform(model)
    return hidden, lambda h: post(head(h)), head


def _hooks_root_outputs(model: nn.Module) -> bool:
    """Whether something may hook the root module's outputs for its backward: an FSDP wrapper (FSDP1's class
    or FSDP2's ``fully_shard``, which subclasses the module), any hook on the root (accelerate's), or a
    process group of more than one rank."""
    if any(
        cls.__name__.startswith("FSDP") or cls.__name__ == "FullyShardedDataParallel"
        for cls in type(model).__mro__
    ):
        return True
    if model._forward_hooks or model._forward_pre_hooks or getattr(model, "_backward_hooks", None):
        return True
    dist = torch.distributed
    return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


def _chunk_stats(
    h: torch.Tensor,
    targets: torch.Tensor,
    to_logits: Callable[[torch.Tensor], torch.Tensor],
    temperature: float,
    want_spi2: bool,
    want_entropy: bool,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Compute log π(target), Σπ² (detached) and entropy (detached unless ``entropy_grad``) for one chunk of
    hidden states (or logits)."""
    z = to_logits(h)
    z = z.to(torch.float64 if z.dtype == torch.float64 else torch.float32)
    if temperature != 1.0:
        z = z / temperature
    logp_all = torch.log_softmax(z, dim=-1)
    del z  # the chunk's logits are not needed any more; free them before the next [C, V] buffer
    lp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    empty = lp.new_zeros(0)
    spi2 = empty
    ent = empty
    if not torch.is_grad_enabled():
        # Scoring: reuse the log-softmax buffer in place (one [C, V] fp32 buffer per chunk).
        if want_entropy:
            ent = -_rowdot(logp_all.exp(), logp_all)
        if want_spi2:
            q = logp_all.exp_()
            spi2 = _rowdot(q, q)
    elif want_spi2 or want_entropy:
        p = logp_all.exp() if want_entropy and entropy_grad else None
        if p is not None:
            ent = -(p * logp_all).sum(dim=-1)
        with torch.no_grad():
            # Reads of the log-softmax only: nothing here is kept for backward, so an entropy that is a metric
            # alone costs no backward pass over [C, V].
            q = p.detach() if p is not None else logp_all.detach().exp()
            if want_entropy and p is None:
                ent = -_rowdot(q, logp_all.detach())
            if want_spi2:
                spi2 = _rowdot(q, q)
    return lp, spi2, ent


def _rowdot(a_C_V: torch.Tensor, b_C_V: torch.Tensor) -> torch.Tensor:
    """Σ_v a[c, v] · b[c, v] per row, without a [C, V] product in memory."""
    out: torch.Tensor = torch.linalg.vecdot(a_C_V, b_C_V)
    return out


def forward_logprobs(
    model: nn.Module,
    input_ids_B_T: torch.Tensor,
    attention_mask_B_T: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_sum_pi_squared: bool = True,
    with_entropy: bool = False,
    token_mask_B_T: torch.Tensor | None = None,
    position_ids_B_T: torch.Tensor | None = None,
    entropy_grad: bool = True,
    saved_tokens: int = 0,
    fused_head: bool = True,
) -> ForwardOutput:
    """One forward pass → per-token log-probs of the next token (and Σπ², entropy), chunked over
    tokens.

    ``logprobs[:, t] = log π(input_ids[:, t] | input_ids[:, :t])`` with π = softmax(logits /
    temperature); column 0 is 0. Values are computed at positions t ≥ 1 with ``attention_mask[:, t]
    = 1`` (and ``token_mask[:, t] = 1`` when given, e.g. the loss mask), 0 elsewhere. Differentiable
    when grad is enabled; Σπ² is always detached.

    For HF causal LMs the final hidden states are projected through ``get_output_embeddings()``
    ``chunk_size`` tokens at a time (extra memory O(chunk_size × V) fp32; with grad each chunk is
    checkpointed). Other models (returning ``.logits`` or a tensor) are called as is; their logits
    are then only upcast chunk by chunk.

    Packed rows (:func:`agentrl.batch.pack_rows`) pass ``position_ids_B_T``: several sequences share a row,
    positions restart at 0 at each one's start, and values are computed where the position is not 0 (the
    first token of a sequence has no prediction). Only for models where :func:`packing_supported` holds.

    ``entropy_grad=False`` returns the entropy detached (a metric: no backward work for it). With grad,
    chunks that start within the first ``saved_tokens`` computed tokens are not checkpointed: their
    log-softmax is kept for backward (about ``(saved_tokens + chunk_size) × V × 4`` bytes at most) instead of
    recomputing the chunk's LM-head product in backward. Values and gradients are the same either way.

    ``fused_head`` (default): with grad, where :func:`~agentrl.learner.head.fused_head_of` allows it (a plain
    linear head in float32/float64 on CPU, no autocast, no hooks), the chunks go through
    :func:`~agentrl.learner.head.head_logprobs`, whose hand-written backward does less work per chunk than
    checkpointed autograd (saved chunks keep their softmax there, ``saved_tokens × V`` values): the same
    values to the bit, gradients equal to float rounding. False keeps autograd's chunks (for comparisons).
    """
    if input_ids_B_T.dim() != 2 or attention_mask_B_T.shape != input_ids_B_T.shape:
        raise ConfigError(
            f"input_ids and attention_mask must both be [B, T], got {tuple(input_ids_B_T.shape)} "
            f"and {tuple(attention_mask_B_T.shape)}"
        )
    if temperature <= 0:
        raise ConfigError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ConfigError(f"chunk_size must be >= 1, got {chunk_size}")
    if saved_tokens < 0:
        raise ConfigError(f"saved_tokens must be >= 0, got {saved_tokens}")
    B, T = input_ids_B_T.shape
    dev = input_ids_B_T.device
    if position_ids_B_T is not None and position_ids_B_T.shape != input_ids_B_T.shape:
        raise ConfigError("position_ids must have the shape of input_ids")
    hidden, to_logits, head = _run_backbone(model, input_ids_B_T, attention_mask_B_T, position_ids_B_T)
    grad = torch.is_grad_enabled() and hidden.requires_grad

    sel_B_T = attention_mask_B_T[:, 1:] != 0
    if position_ids_B_T is not None:
        sel_B_T = sel_B_T & (position_ids_B_T[:, 1:] != 0)
    if token_mask_B_T is not None:
        if token_mask_B_T.shape != input_ids_B_T.shape:
            raise ConfigError("token_mask must have the shape of input_ids")
        sel_B_T = sel_B_T & (token_mask_B_T[:, 1:] != 0)
    idx = sel_B_T.reshape(-1).nonzero().squeeze(1)
    n = B * (T - 1) if T > 0 else 0
    flat_h = hidden[:, :-1].reshape(n, hidden.shape[-1]).index_select(0, idx)
    flat_tgt = input_ids_B_T[:, 1:].reshape(-1).index_select(0, idx)

    lps, spis, ents = [], [], []
    fused = None
    if grad and fused_head and head is not None and not _hooks_root_outputs(model):
        fused = fused_head_of(model, head, flat_h)
    if fused is not None and idx.numel() > 0:
        lp, spi2, ent = head_logprobs(
            flat_h,
            flat_tgt,
            fused,
            temperature=temperature,
            chunk_size=chunk_size,
            want_spi2=with_sum_pi_squared,
            want_entropy=with_entropy,
            entropy_grad=entropy_grad,
            saved_tokens=saved_tokens,
        )
        lps, spis, ents = [lp], [spi2], [ent]
    elif fused is None:
        for s in range(0, int(idx.numel()), chunk_size):
            h, tg = flat_h[s : s + chunk_size], flat_tgt[s : s + chunk_size]
            args = (h, tg, to_logits, temperature, with_sum_pi_squared, with_entropy, entropy_grad)
            if grad and s >= saved_tokens:
                lp, spi2, ent = checkpoint(_chunk_stats, *args, use_reentrant=False)
            else:
                lp, spi2, ent = _chunk_stats(*args)
            lps.append(lp)
            spis.append(spi2)
            ents.append(ent)

    out_dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    if grad and not lps:
        # Nothing to score (e.g. a micro-batch of prompts only): keep the outputs in the model's graph, so the
        # backward pass still runs (zero gradients; FSDP's collectives need every rank to take it).
        tie = flat_h[:0, 0].to(out_dtype) * 0
        lps, ents = [tie], [tie] if with_entropy else ents

    def place(parts: list[torch.Tensor]) -> torch.Tensor:
        vals = torch.cat(parts) if parts else torch.zeros(0, dtype=out_dtype, device=dev)
        full = torch.zeros(n, dtype=vals.dtype, device=dev).index_copy(0, idx, vals)
        return torch.cat([torch.zeros(B, 1, dtype=vals.dtype, device=dev), full.view(B, T - 1)], 1)

    if T == 0:
        z = torch.zeros(B, 0, dtype=out_dtype, device=dev)
        return ForwardOutput(z, z if with_sum_pi_squared else None, z if with_entropy else None)
    return ForwardOutput(
        logprobs_B_T=place(lps),
        sum_pi_squared_B_T=place(spis) if with_sum_pi_squared else None,
        entropy_B_T=place(ents) if with_entropy else None,
    )


# Attention implementations whose transformers code keeps packed sequences apart when it is given position ids
# and no attention mask (SDPA/eager/flex through masking_utils' packed-sequence mask, FlashAttention through
# its varlen kernel, which transformers uses for a batch of one packed row: the learner lays micro-batches out
# so for it, agentrl.learner.attention.one_row_per_micro_batch).
_PACKABLE_ATTENTION = ("sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3")
_PACKING: weakref.WeakKeyDictionary[nn.Module, str | None] = weakref.WeakKeyDictionary()


def _static_packing_obstacle(model: nn.Module, attention: str | None = None) -> str | None:
    """Why ``model`` cannot take packed rows with ``attention`` (None: its own implementation), judged from
    its code alone; None when it can."""
    masking = sys.modules.get("transformers.masking_utils")
    if masking is None:
        try:
            import transformers.masking_utils as masking
        except ImportError:
            return "transformers has no masking_utils (it is older than 4.53)"
    if not hasattr(masking, "find_packed_sequence_indices"):
        return "this transformers does not detect packed sequences from position ids"
    if "position_ids" not in inspect.signature(model.forward).parameters:
        return f"{type(model).__name__}.forward takes no position_ids"
    impl = attention or getattr(getattr(model, "config", None), "_attn_implementation", None)
    if impl not in _PACKABLE_ATTENTION:
        return f"attention implementation {impl!r} is not one of {_PACKABLE_ATTENTION}"
    # The model's own modeling file must build its mask with masking_utils (which finds the sequences).
    for cls in type(model).__mro__:
        mod = sys.modules.get(cls.__module__)
        if cls.__module__.startswith("transformers.models.") and mod is not None:
            if not hasattr(mod, "create_causal_mask"):
                return f"{cls.__module__} does not build its mask with masking_utils.create_causal_mask"
            return None
    return f"{type(model).__name__} is not a transformers model"


def _probe_packing(model: nn.Module) -> str | None:
    """Score two short sequences packed in one row and padded in two: a model that lets one sequence see
    the other disagrees. Run only for float32/float64 weights, where the two agree to ~1e-6."""
    param = next(model.parameters())
    if param.dtype not in (torch.float32, torch.float64):
        return None
    cfg = getattr(model, "config", None)
    vocab = int(getattr(cfg, "vocab_size", 0) or 0)
    if vocab < 2:
        return None
    gen = torch.Generator().manual_seed(1234)
    a = torch.randint(vocab, (7,), generator=gen)
    b = torch.randint(vocab, (5,), generator=gen)
    dev = param.device
    ids = torch.zeros(2, 7, dtype=torch.long)
    ids[0], ids[1, :5] = a, b
    attn = torch.zeros(2, 7, dtype=torch.long)
    attn[0], attn[1, :5] = 1, 1
    packed = torch.cat([a, b])[None]
    pos = torch.cat([torch.arange(7), torch.arange(5)])[None]
    was_training = model.training
    model.eval()
    # Full fp32 matmuls (no TF32), so that rounding stays far below what a leak between sequences moves. (Some
    # torch versions warn about this older switch; it still works.)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        precision = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")
    try:
        with torch.no_grad(), torch.autocast(dev.type, enabled=False):
            pad = forward_logprobs(model, ids.to(dev), attn.to(dev), with_sum_pi_squared=False)
            got = forward_logprobs(
                model,
                packed.to(dev),
                torch.ones_like(packed).to(dev),
                with_sum_pi_squared=False,
                position_ids_B_T=pos.to(dev),
            )
    except Exception as e:  # a model that cannot run this way at all
        return f"packed forward failed ({type(e).__name__}: {e})"
    finally:
        model.train(was_training)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.set_float32_matmul_precision(precision)
    want = torch.cat([pad.logprobs_B_T[0], pad.logprobs_B_T[1, :5]])
    err = float((got.logprobs_B_T[0].double() - want.double()).abs().max())
    if not err < 1e-3:
        return f"packed and padded log-probs differ by {err:.2g} on a probe"
    return None


def packing_support(model: nn.Module, attention: str | None = None) -> str | None:
    """None when ``model`` can score packed rows (several sequences per row, told apart by position ids, no
    attention mask) with the attention implementation ``attention`` (None: the model's own), else why not
    (then the learner pads rows instead). Judged from its code (transformers' packed-sequence detection,
    position ids, a known attention implementation) and, for float32 weights, a probe that compares packed
    and padded log-probs with the model's own implementation: the probe checks that the model's code keeps
    the sequences apart, which does not depend on the kernel (and a compiled kernel's warm-up would cost
    seconds). The probe runs once per model."""
    why = _static_packing_obstacle(model, attention)
    if why is not None:
        return why
    if model not in _PACKING:
        why = _static_packing_obstacle(model)
        _PACKING[model] = why if why is not None else _probe_packing(model)
    return _PACKING[model]
