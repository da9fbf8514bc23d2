"""Activation checkpointing of the learner's update (``LearnerConfig.gradient_checkpointing``).

``on`` recomputes every decoder layer's activations in backward (HF ``activation_checkpointing_enable`` with
``use_reentrant=False``, so frozen bases under LoRA and FSDP-wrapped models work), ``off`` never does, and
``auto`` decides per micro-batch from measured memory:

* off CUDA, ``auto`` is ``off`` (the CPU default run's memory budget was measured without it);
* on CUDA, the first update measures what a micro-batch costs: two probe passes (forward and backward, no
  checkpointing, result discarded) of ``n`` and ``2n`` tokens give the peak allocation's growth per token (the
  slope) and the fixed part (gradient buffers, LM-head chunks; the intercept), from
  ``torch.cuda.max_memory_allocated`` — not from a formula of the model's shape. Each micro-batch then runs
  checkpointed when ``fixed + tokens × slope`` exceeds 90 % of what is available at that moment
  (``torch.cuda.mem_get_info``'s free memory plus what the caching allocator holds unused).

The probe rows are single documents, so the slope is the linear per-token cost. SDPA and eager attention on
packed rows also build a dense [T, T] mask per row, which the slope does not include; the flash and flex
paths have no such term (docs/gpu.md, "Variable-length attention").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from agentrl.errors import ConfigError

# torch is imported inside the functions that compute: LearnerConfig (and the TrainConfig that holds it)
# needs only this module's names, and the rollout workers and inference servers that unpickle it never
# train (torch costs them ~3 CPU-s and ~300 MB per actor).
if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = [
    "CHECKPOINTING_CHOICES",
    "ActivationCost",
    "CheckpointingMode",
    "available_bytes",
    "checkpointing_mode",
    "checkpointing_switch",
    "measure_activation_cost",
    "needs_checkpointing",
]

CheckpointingMode = Literal["auto", "on", "off", "true", "false"]
"""``true``/``false`` are the spellings of ``on``/``off`` from when the setting was a boolean."""
CHECKPOINTING_CHOICES: tuple[str, ...] = ("auto", "on", "off", "true", "false")
HEADROOM = 0.9
"""Fraction of the available memory a micro-batch may take before ``auto`` checkpoints it."""


def checkpointing_mode(value: object) -> Literal["auto", "on", "off"]:
    """``value`` as one of auto/on/off: booleans and true/false (the old boolean setting) map to on/off.

    Raises:
        ConfigError: anything else.
    """
    if value is True or value == "true":
        return "on"
    if value is False or value == "false":
        return "off"
    if value in ("auto", "on", "off"):
        return value
    raise ConfigError(f"gradient_checkpointing must be one of {CHECKPOINTING_CHOICES}, got {value!r}")


def checkpointing_switch(model: nn.Module) -> tuple[Callable[[], Any], Callable[[], Any]] | None:
    """(enable, disable) of ``model``'s HF activation checkpointing (non-reentrant); None when it has none."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        return None
    kw = {"use_reentrant": False}
    on = getattr(model, "activation_checkpointing_enable", None)
    off = getattr(model, "activation_checkpointing_disable", None)
    if callable(on) and callable(off):
        return (lambda: on(activation_checkpointing_kwargs=kw)), off
    # transformers < 5 spells it gradient_checkpointing_*.
    on = getattr(model, "gradient_checkpointing_enable", None)
    off = getattr(model, "gradient_checkpointing_disable", None)
    if callable(on) and callable(off):
        return (lambda: on(gradient_checkpointing_kwargs=kw)), off
    return None


@dataclass(frozen=True, slots=True)
class ActivationCost:
    """What an update's forward and backward take on the device (:func:`measure_activation_cost`)."""

    bytes_per_token: float
    """Growth of the peak allocation per token of a micro-batch, without checkpointing."""
    fixed_bytes: float
    """Peak allocation of a zero-token micro-batch (the intercept: gradients, LM-head chunk buffers)."""
    probe_tokens: tuple[int, int]
    """The two probe sizes the line was fitted through."""

    def need(self, tokens: int) -> float:
        """Bytes a micro-batch of ``tokens`` tokens is expected to take, without checkpointing."""
        return self.fixed_bytes + tokens * self.bytes_per_token


def measure_activation_cost(
    run: Callable[[int], None], device: torch.device, tokens: int = 512
) -> ActivationCost:
    """Fit the peak allocation of ``run(n)`` (one forward and backward over an ``n``-token micro-batch,
    without checkpointing) at ``n = tokens`` and ``2 · tokens`` on CUDA ``device``.

    Raises:
        ConfigError: ``device`` is not a CUDA device (there is no allocator to read).
    """
    import torch

    if device.type != "cuda":
        raise ConfigError(f"measuring activation memory needs CUDA, not {device.type}")
    peaks = []
    sizes = (tokens, 2 * tokens)
    for n in sizes:
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        run(n)
        torch.cuda.synchronize(device)
        peaks.append(torch.cuda.max_memory_allocated(device) - before)
    slope = max(0.0, (peaks[1] - peaks[0]) / (sizes[1] - sizes[0]))
    fixed = max(0.0, peaks[0] - slope * sizes[0])
    return ActivationCost(bytes_per_token=slope, fixed_bytes=fixed, probe_tokens=sizes)


def available_bytes(device: torch.device) -> int:
    """Memory a micro-batch can take on CUDA ``device`` now: free on the device plus what the caching
    allocator holds but does not use."""
    import torch

    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(free + max(cached, 0))


def needs_checkpointing(tokens: int, cost: ActivationCost, available: int) -> bool:
    """Whether a micro-batch of ``tokens`` tokens would not fit in ``available`` bytes (with
    :data:`HEADROOM`) without checkpointing."""
    return cost.need(tokens) > HEADROOM * available
