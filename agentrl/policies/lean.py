"""A lean forward for the generation engine: Llama-shaped decoders without Hugging Face's module dispatch.

A decode step of SmolLM2-135M at one row spends ~20 ms in its linear layers and ~70 ms in all (issue 46):
the rest is per-step overhead of the transformers forward (module calls and their hooks, keyword plumbing,
the mask helpers, the cache protocol, ``repeat_kv`` copies of the keys and values). The engine's real
rollouts run a mean batch of ~6 rows, so that overhead decides their speed. :class:`LeanForward` computes
the same function as ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` (RMSNorm, rotary embeddings, grouped-query
attention, SiLU-gated MLP) as a flat sequence of tensor operations over the engine's
:class:`~agentrl.policies.kvcache.SlotCache`:

- the hidden states stay ``[tokens, hidden]`` (no batch reshapes around every linear), and the linears run
  on the module tree's own weights, the pre-packed ones where the engine's
  :class:`~agentrl.policies.packed.InferenceTwin` has them;
- the mask is built once per forward; in a decode step (one query per row) each key/value head attends for
  its group of query heads as if they were that head's queries (no copy of the keys per query head); a
  prefill uses SDPA's grouped-query attention;
- the final norm and the LM head run only for the position each row samples from.

The arithmetic is the transformers modules' own, operation for operation where it is cheap to keep so (the
norm in fp32, ``x * cos + rotate_half(x) * sin``), so logits match the Hugging Face forward up to the
rounding of a different attention kernel (~1e-6 in fp32). A model is supported only when it is exactly one of
those classes with plain (or packed) linears, SiLU, full attention, no forward hooks and no dropout in
effect; anything else runs the Hugging Face forward (:func:`unsupported_reason` says why).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from agentrl.errors import ConfigError
from agentrl.policies.kvcache import SlotCache
from agentrl.policies.packed import (  # the hook attributes the twin copies
    _HOOK_DICTS,
    InferenceTwin,
    _PackedLinear,
)

__all__ = ["ENV_SWITCH", "SUPPORTED_CLASSES", "LeanForward", "lean_enabled", "lean_for", "unsupported_reason"]

SUPPORTED_CLASSES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
"""Model classes the lean forward computes (the same decoder layer, Qwen2 with biased q/k/v)."""
ENV_SWITCH = "AGENTRL_LEAN_DECODE"
"""Environment variable: ``0`` turns the lean forward off (the engine then runs the transformers forward)."""

_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lean_enabled(requested: bool | None) -> bool:
    """Whether the engine should try the lean forward: ``requested``, or by default unless the environment
    variable :data:`ENV_SWITCH` is ``0`` (also ``false``/``off``/``no``)."""
    if requested is not None:
        return bool(requested)
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "off", "no")


def lean_for(
    model: Any, twin: InferenceTwin | None, requested: bool | None, device: torch.device
) -> LeanForward | None:
    """The lean forward an engine runs ``model`` with (over ``twin``'s packed modules when there is a
    twin), or None for the transformers forward.

    ``requested``: ``False`` never; ``True`` wherever the model is supported (a :class:`ConfigError` if it
    is not); ``None`` (the default) on CPU for supported models, unless :data:`ENV_SWITCH` is ``0`` (on
    CUDA the transformers forward stays the default: the lean one has not been measured there).
    """
    why = unsupported_reason(model)
    if requested is True and why is not None:
        raise ConfigError(f"lean_forward=True, but the lean forward cannot run this model: {why}")
    if why is not None or not lean_enabled(requested) or (requested is None and device.type != "cpu"):
        return None
    return LeanForward(twin.module, model) if twin is not None else LeanForward(model)


def unsupported_reason(model: Any) -> str | None:
    """Why the lean forward cannot run ``model`` (a module tree), or None when it can."""
    name = type(model).__name__
    if name not in SUPPORTED_CLASSES:
        return f"{name} is not one of {SUPPORTED_CLASSES}"
    cfg = model.config
    if getattr(cfg, "hidden_act", None) != "silu":
        return f"activation {getattr(cfg, 'hidden_act', None)!r} (only silu)"
    if getattr(cfg, "use_sliding_window", False):
        return "sliding-window attention"
    if getattr(cfg, "pretraining_tp", 1) not in (1, None):
        return "pretraining_tp > 1"
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "attn_logit_softcapping", None):
        return "logit soft-capping"
    base: Any = getattr(model, "model", None)
    for part in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if base is None or not hasattr(base, part):
            return f"no model.{part}"
    if not isinstance(model.get_output_embeddings(), (nn.Linear, _PackedLinear)):
        return "the LM head is not a linear layer"
    for i, layer in enumerate(base.layers):
        for owner in (layer.self_attn, layer.mlp):
            for lin in _LINEARS:
                sub = owner._modules.get(lin)
                if sub is not None and type(sub) not in (nn.Linear, _PackedLinear):
                    return f"layer {i} {lin} is a {type(sub).__name__}"
        if getattr(layer.self_attn, "sliding_window", None):
            return f"layer {i} uses sliding-window attention"
    return None


class LeanForward:
    """The decoder of a supported model (see the module docstring) run as plain tensor operations.

    Args:
        module: The module tree to run (the model, or its packed :class:`InferenceTwin` module); its layers
            are looked up again on every call, so weights changed or replaced in place are used.
        model_hooks: Another module tree whose forward hooks must also be absent (the model the twin copies:
            they share hook registries, and a hook means someone wants the transformers forward).
    """

    def __init__(self, module: nn.Module, model_hooks: nn.Module | None = None):
        reason = unsupported_reason(module)
        if reason is not None:
            raise ConfigError(f"the lean forward cannot run this model: {reason}")
        self.module = module
        cfg: Any = module.config  # a transformers config (checked by unsupported_reason)
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads)
        self.scaling = self.head_dim**-0.5
        self.dropout = float(getattr(cfg, "attention_dropout", 0.0) or 0.0)
        trees = [module] if model_hooks is None else [module, model_hooks]
        # The registries are dicts mutated in place by register_forward_hook: keep them, check them per call.
        self._hooks = [
            d
            for tree in trees
            for m in tree.modules()
            for a in _HOOK_DICTS
            if (d := getattr(m, a, None)) is not None
        ]

    def usable(self) -> bool:
        """Whether this call may run lean: no forward hook anywhere and no dropout in effect."""
        from torch.nn.modules import module as _mod

        if any(self._hooks) or _mod._global_forward_hooks or _mod._global_forward_pre_hooks:
            return False
        return not (self.dropout and self.module.training)

    def __call__(
        self,
        slots: SlotCache,
        ids_B_Q: torch.Tensor,
        pos_B_Q: torch.Tensor,
        kv_len: int,
        last_B_1: torch.Tensor | None,
    ) -> torch.Tensor:
        """Run the rows of ``slots``' current window (:meth:`SlotCache.set_window` was called with
        ``pos_B_Q`` and ``kv_len``), writing their keys/values; returns the logits ``[B, V]`` at position
        ``last_B_1[b, 0]`` of each row (the last one when None)."""
        model: Any = self.module
        base = model.model
        B, Q = ids_B_Q.shape
        H, KV, D = self.heads, self.kv_heads, self.head_dim
        G = H // KV
        x_N_E = F.embedding(ids_B_Q.reshape(-1), base.embed_tokens.weight)
        cos_B_Q_D, sin_B_Q_D = base.rotary_emb(x_N_E, pos_B_Q)
        cos = cos_B_Q_D.reshape(B * Q, 1, D)
        sin = sin_B_Q_D.reshape(B * Q, 1, D)
        # Query q of row b sees keys at positions <= its own: the cached prefix and its own earlier tokens.
        keep_B_Q_K = torch.arange(kv_len, device=ids_B_Q.device) <= pos_B_Q[:, :, None]
        keep_B_1_Q_K = keep_B_Q_K[:, None]
        buf = slots.buf
        assert buf is not None
        s0, s1 = slots._start, slots._stop
        index = slots._index
        assert index is not None
        for i, layer in enumerate(base.layers):
            attn, mlp = layer.self_attn, layer.mlp
            h = _rms(x_N_E, layer.input_layernorm)
            q = _linear(attn.q_proj, h).view(B * Q, H, D)
            k = _linear(attn.k_proj, h).view(B * Q, KV, D)
            v = _linear(attn.v_proj, h).view(B, Q, KV, D)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            # This layer's keys/values into the rows' slots at their positions (what SlotCache._write does).
            K = buf[i, 0, s0:s1]
            V = buf[i, 1, s0:s1]
            K.scatter_(2, index, k.view(B, Q, KV, D).transpose(1, 2))
            V.scatter_(2, index, v.transpose(1, 2))
            K_B_KV_L_D = K[:, :, :kv_len]
            V_B_KV_L_D = V[:, :, :kv_len]
            if Q == 1:  # decode: each key/value head's G query heads attend as its G queries (no gqa copy)
                o = F.scaled_dot_product_attention(
                    q.view(B, KV, G, D), K_B_KV_L_D, V_B_KV_L_D, attn_mask=keep_B_1_Q_K, scale=self.scaling
                ).view(B, H * D)
            else:
                o_B_H_Q_D = F.scaled_dot_product_attention(
                    q.view(B, Q, H, D).transpose(1, 2),
                    K_B_KV_L_D,
                    V_B_KV_L_D,
                    attn_mask=keep_B_1_Q_K,
                    scale=self.scaling,
                    enable_gqa=G > 1,
                )
                o = o_B_H_Q_D.transpose(1, 2).reshape(B * Q, H * D)
            x_N_E = x_N_E + _linear(attn.o_proj, o)
            h = _rms(x_N_E, layer.post_attention_layernorm)
            x_N_E = x_N_E + _linear(
                mlp.down_proj, F.silu(_linear(mlp.gate_proj, h)) * _linear(mlp.up_proj, h)
            )
        if Q == 1:
            last_N_E = x_N_E
        else:
            rows = torch.arange(B, device=x_N_E.device) * Q
            at = rows + (last_B_1[:, 0] if last_B_1 is not None else torch.full_like(rows, Q - 1))
            last_N_E = x_N_E[at]
        logits: torch.Tensor = _linear(model.lm_head, _rms(last_N_E, base.norm))
        return logits


def _linear(layer: Any, x: torch.Tensor) -> torch.Tensor:
    if type(layer) is _PackedLinear:
        return layer.forward(x)
    return F.linear(x, layer.weight, layer.bias)


def _rms(x: torch.Tensor, norm: Any) -> torch.Tensor:
    # transformers' LlamaRMSNorm / Qwen2RMSNorm: normalized in fp32, weighted in the input's dtype.
    dtype = x.dtype
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    out: torch.Tensor = norm.weight * x32.to(dtype)
    return out


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
