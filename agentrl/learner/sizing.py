"""Micro-batch token budget and LM-head chunk chosen for the device (``LearnerConfig`` fields set to 0).

* CPU: 384 tokens per micro-batch and 128-token LM-head chunks, what keeps the default run (SmolLM2-135M
  fp32) under 4 GiB resident (docs/benchmarks.md, memory_budget).
* CUDA: sized from the free memory. Backward keeps about ``10 · layers · (4 · hidden + 2 · intermediate)``
  bytes per token (measured: 1.5 MB for SmolLM2-135M in fp32, 2.8 MB for Qwen2.5-0.5B's shape with fp32
  weights and bf16 autocast; the formula gives 1.6 and 3.2). The weights, their gradients and AdamW's two
  moments (16 bytes per parameter in fp32) come off first, and 20 % is left free for the allocator's
  fragmentation and the scoring pass; the LM-head chunk gets ~5 % of the rest (its fp32 [chunk, vocab]
  buffers, about four live at once with gradients).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from agentrl.errors import ConfigError

__all__ = [
    "CPU_CHUNK_SIZE",
    "CPU_MICRO_BATCH_TOKENS",
    "CPU_SAVED_TOKENS",
    "LearnerSizes",
    "ModelShape",
    "device_sizes",
]

CPU_MICRO_BATCH_TOKENS = 384
"""Tokens per micro-batch on CPU (the 4 GiB default-run budget)."""
CPU_CHUNK_SIZE = 128
"""LM-head chunk on CPU (a [128, 49152] fp32 buffer is 24 MiB)."""
CPU_SAVED_TOKENS = 384
"""Scored tokens per micro-batch whose LM-head chunks keep their softmax for backward on CPU instead of being
recomputed: 384, a whole CPU micro-batch, so backward reruns no LM-head product (72 MiB held per micro-batch
for SmolLM2's vocabulary). With the hand-written head backward (:mod:`agentrl.learner.head`) the update's
peak still fell (issue 46, 2026-11-28, SmolLM2-135M fp32, 3 micro-batches of 384 tokens, live peak above the
resident set: 1,188 MiB autograd's chunks, 999 MiB the new backward recomputing, 1,012 MiB keeping them).
CPU time of learner_throughput's update at one thread against autograd's checkpointed chunks, 5 interleaved
repetitions (contended, load 5-14): 0.96x (0.92-0.97x) keeping, 0.95x (0.91-1.02x) recomputing. Until then
0: with autograd's chunks the saved log-softmax measured no faster."""


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the sizing needs to know of a causal LM (from its HF config)."""

    layers: int
    """Decoder layers."""
    hidden: int
    """Hidden size."""
    intermediate: int
    """MLP inner size."""
    vocab: int
    """Vocabulary size (columns of the LM head)."""
    parameters: int
    """Parameter count (weights, gradients and optimizer state scale with it)."""

    @classmethod
    def from_config(cls, cfg: Any) -> ModelShape:
        """From a transformers ``PretrainedConfig`` (or its config.json as a dict) of a decoder-only LM."""

        def get(key: str) -> Any:
            return cfg.get(key) if isinstance(cfg, dict) else getattr(cfg, key, None)

        dims = [get(k) for k in ("num_hidden_layers", "hidden_size", "vocab_size")]
        if not all(isinstance(v, int) and v > 0 for v in dims):
            raise ConfigError("the model config lacks num_hidden_layers, hidden_size or vocab_size")
        layers, hidden, vocab = (int(v) for v in dims)
        inter = int(get("intermediate_size") or 4 * hidden)
        heads = int(get("num_attention_heads") or 1)
        kv = int(get("num_key_value_heads") or heads)
        attn = hidden * hidden * 2 + 2 * hidden * (hidden // heads) * kv
        tied = bool(get("tie_word_embeddings"))
        params = layers * (attn + 3 * hidden * inter) + vocab * hidden * (1 if tied else 2)
        return cls(layers=layers, hidden=hidden, intermediate=inter, vocab=vocab, parameters=params)


@dataclass(frozen=True, slots=True)
class LearnerSizes:
    """The chosen ``micro_batch_tokens`` and ``chunk_size``, and where they came from."""

    micro_batch_tokens: int
    """Tokens per micro-batch (packed rows × their length)."""
    chunk_size: int
    """Tokens per LM-head chunk."""
    why: str
    """One line for the log: the device and the memory it was sized from."""


def _floor_to(x: float, step: int, least: int) -> int:
    return max(least, int(x // step) * step)


def device_sizes(
    device: torch.device | str,
    shape: ModelShape | None = None,
    *,
    free_bytes: int | None = None,
    reserved_bytes: int = 0,
) -> LearnerSizes:
    """The micro-batch token budget and the LM-head chunk for ``device``.

    On CUDA ``shape`` is required; ``free_bytes`` defaults to the device's free memory now (call it before
    the model is loaded; its weights, gradients and optimizer state are subtracted from the shape), and
    ``reserved_bytes`` is memory something else will take (an in-process vLLM engine).
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        return LearnerSizes(
            CPU_MICRO_BATCH_TOKENS, CPU_CHUNK_SIZE, f"{dev.type}: the 4 GiB default-run budget"
        )
    if shape is None:
        raise ConfigError("sizing the learner for CUDA needs the model's shape")
    if free_bytes is None:
        free_bytes, _ = torch.cuda.mem_get_info(dev)
    states = 16 * shape.parameters
    usable = (free_bytes - reserved_bytes - states) * 0.8
    if usable <= 0:
        raise ConfigError(
            f"{free_bytes / 2**30:.1f} GiB free on {dev} does not hold the model's weights, gradients and "
            f"optimizer state ({states / 2**30:.1f} GiB); pass --learner.micro-batch-tokens and "
            "--learner.chunk-size yourself"
        )
    chunk_budget = 0.05 * usable
    chunk = 1 << max(7, min(12, int(chunk_budget / (16 * shape.vocab)).bit_length() - 1))
    per_token = 10 * shape.layers * (4 * shape.hidden + 2 * shape.intermediate)
    tokens = _floor_to((usable - 16 * chunk * shape.vocab) / per_token, 1024, 1024)
    tokens = min(tokens, 65536)  # beyond this a micro-batch gains nothing and one sequence is rarely longer
    why = f"{dev}: {free_bytes / 2**30:.1f} GiB free, {per_token / 2**20:.2f} MiB per token"
    return LearnerSizes(tokens, chunk, why)
