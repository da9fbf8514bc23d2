"""Which attention implementation the learner's passes run with (``LearnerConfig.attention``).

Packed rows (several sequences per row, told apart by position ids) cost very different amounts per kernel:

* ``sdpa`` / ``eager``: transformers builds a dense block-diagonal [T, T] mask per row, which rules out the
  flash kernel and costs O(T²) memory and work, whatever the sequences' lengths;
* ``flex_attention``: transformers builds a document-masked ``BlockMask`` from the packed position ids
  (``masking_utils.flex_attention_mask`` with ``find_packed_sequence_indices``), and the kernel skips the
  blocks between sequences; it needs ``torch.compile`` (and triton on CUDA); torch 2.13 runs its forward on
  CPU but not its backward;
* ``flash_attention_2``: the varlen kernel, which transformers uses for packed position ids only when the
  row is the micro-batch's only one (``_is_packed_sequence`` needs batch size 1), so the learner lays each
  micro-batch out as one packed row for it (:func:`one_row_per_micro_batch`).

``auto`` takes the fastest that runs here (:func:`resolve_attention`): flash_attention_2 where the
``flash_attn`` package imports on CUDA, else flex_attention on CUDA, else sdpa. CPU keeps sdpa: the default
run's memory budget was measured with it.

The implementation is switched on the learner's model only while the learner runs a pass
(:func:`attention_in_effect`), and switched back after it: an HF sampler that shares the model object
generates with the model's own implementation and its KV cache.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
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
    "ATTENTION_CHOICES",
    "AttentionAvailability",
    "AttentionName",
    "attention_availability",
    "attention_in_effect",
    "one_row_per_micro_batch",
    "resolve_attention",
]

AttentionName = Literal["auto", "sdpa", "flex_attention", "flash_attention_2", "eager"]
ATTENTION_CHOICES: tuple[str, ...] = ("auto", "sdpa", "flex_attention", "flash_attention_2", "eager")


@dataclass(frozen=True, slots=True)
class AttentionAvailability:
    """What this process can run, for :func:`resolve_attention` (probed by :func:`attention_availability`)."""

    flash_attn: bool
    """The ``flash_attn`` package imports (FlashAttention 2, varlen)."""
    flex_attention: bool
    """torch has ``flex_attention`` and transformers builds its ``BlockMask`` (and triton imports: CUDA)."""


def attention_availability(device: torch.device | str) -> AttentionAvailability:
    """Probe the installed packages for ``device`` (no kernel runs; ``find_spec`` only)."""
    import torch

    dev = torch.device(device)
    cuda = dev.type == "cuda"

    def has(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            return False

    flex = has("torch.nn.attention.flex_attention") and (not cuda or has("triton"))
    if flex:
        try:
            from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
        except ImportError:
            flex = False
        else:
            flex = "flex_attention" in ALL_MASK_ATTENTION_FUNCTIONS
    return AttentionAvailability(flash_attn=cuda and has("flash_attn"), flex_attention=flex)


def resolve_attention(
    requested: str, device_type: str, availability: AttentionAvailability | None = None
) -> str:
    """The implementation ``requested`` means on ``device_type`` ('cpu', 'cuda', ...): ``auto`` becomes
    flash_attention_2 (CUDA with flash_attn), else sdpa (flex_attention only when asked by name); an explicit
    name is checked against what is available (:class:`ConfigError` when it cannot run: flash_attention_2
    without flash_attn or off CUDA, flex_attention off CUDA or without torch/transformers/triton support)."""
    if requested not in ATTENTION_CHOICES:
        raise ConfigError(f"attention must be one of {ATTENTION_CHOICES}, got {requested!r}")
    cuda = device_type == "cuda"
    avail = availability if availability is not None else attention_availability(device_type)
    if requested == "auto":
        # flex_attention is not chosen for you: on the lent H100 (2026-11-27) its first update spent 62 s
        # compiling, it needs a working C toolchain for triton (a broken /lib there made every CUDA run fail),
        # and its steady-state speed against packed SDPA is not measured yet. Ask for it by name.
        if cuda and avail.flash_attn:
            return "flash_attention_2"
        return "sdpa"
    if requested == "flash_attention_2" and not (cuda and avail.flash_attn):
        where = "the flash_attn package is not installed" if cuda else f"it needs CUDA, not {device_type}"
        raise ConfigError(
            f"attention flash_attention_2 cannot run: {where} (use auto, flex_attention or sdpa)"
        )
    if requested == "flex_attention" and not cuda:
        # torch (2.13 included) runs flex_attention's forward on CPU but refuses its backward.
        raise ConfigError(
            f"attention flex_attention cannot train on {device_type}: torch runs its backward on CUDA only "
            "(use auto or sdpa)"
        )
    if requested == "flex_attention" and not avail.flex_attention:
        raise ConfigError(
            "attention flex_attention cannot run: this torch/transformers (or triton, on CUDA) lacks it "
            "(use auto or sdpa)"
        )
    return requested


def one_row_per_micro_batch(implementation: str | None) -> bool:
    """Whether packed micro-batches should be a single row: FlashAttention's varlen path in transformers
    only finds packed sequences in a batch of one row, and flex_attention skips the blocks between
    sequences, so one long row costs it nothing extra (and saves the padding after shorter rows)."""
    return implementation in ("flash_attention_2", "flash_attention_3", "flex_attention")


def _hf_model(model: nn.Module) -> Any:
    """The transformers model inside ``model`` (itself, or an FSDP1 / DDP wrapper's ``module``), else None."""
    for m in (model, getattr(model, "module", None)):
        if m is not None and callable(getattr(m, "set_attn_implementation", None)):
            return m
    return None


def current_attention(model: nn.Module) -> str | None:
    """The model's attention implementation now (None for a model without a transformers config)."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return impl if isinstance(impl, str) else None


@contextmanager
def attention_in_effect(model: nn.Module, implementation: str | None) -> Iterator[None]:
    """Run the block with ``model``'s attention set to ``implementation`` (None: as it is), then restore it.

    A model that is not a transformers model cannot switch: for it only None (or its own) is accepted."""
    hf = _hf_model(model)
    before = current_attention(hf if hf is not None else model)
    if implementation is None or implementation == before:
        yield
        return
    if hf is None or before is None:
        raise ConfigError(
            f"attention {implementation!r} needs a transformers model (set_attn_implementation); "
            f"{type(model).__name__} has none: use attention auto"
        )
    try:
        hf.set_attn_implementation(implementation)
    except (ValueError, ImportError) as e:  # transformers' own refusals (model does not support it)
        raise ConfigError(f"{type(hf).__name__} cannot use attention {implementation!r}: {e}") from e
    try:
        yield
    finally:
        hf.set_attn_implementation(before)
