"""The multi-rank side of the learner: rank-count and all-reduce helpers, and FSDP2 wrapping."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from agentrl.errors import ConfigError

__all__ = ["all_reduce_floats", "world_size", "wrap_fsdp"]


def world_size() -> int:
    """Ranks in the default process group (1 without torch.distributed)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def all_reduce_floats(values: list[float], op: Any, device: torch.device) -> list[float]:
    """``values`` reduced over all ranks with ``op`` (returned as is on one rank)."""
    if world_size() == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return [float(v) for v in t.tolist()]


def wrap_fsdp(
    model: nn.Module,
    *,
    bf16: bool = False,
    reshard_after_forward: bool = True,
    layer_classes: Sequence[type[nn.Module]] | None = None,
) -> nn.Module:
    """Shard ``model`` over the default process group with torch FSDP2 (``fully_shard``).

    Each transformer block (HF ``_no_split_modules`` classes, or ``layer_classes``) becomes its own
    FSDP unit, then the root. ``bf16``: parameters in bf16 for compute, gradients reduced in fp32.
    Call after ``torch.distributed.init_process_group`` and after moving the model to its device;
    build the :class:`Learner` (and its optimizer) from the returned model.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigError("wrap_fsdp needs torch.distributed.init_process_group() first")
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError as e:  # pragma: no cover - torch < 2.6
        raise ConfigError("wrap_fsdp needs torch >= 2.6 (fully_shard)") from e
    names = set(getattr(model, "_no_split_modules", None) or ())
    classes = tuple(layer_classes or ())
    mp = None
    if bf16:
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    kw: dict[str, Any] = {"reshard_after_forward": reshard_after_forward}
    if mp is not None:
        kw["mp_policy"] = mp
    n = 0
    for mod in model.modules():
        if mod is model:
            continue
        if (classes and isinstance(mod, classes)) or type(mod).__name__ in names:
            fully_shard(mod, **kw)
            n += 1
    if n == 0:
        raise ConfigError("wrap_fsdp found no transformer blocks to shard; pass layer_classes=(YourBlock,)")
    root_kw = dict(kw)
    root_kw["reshard_after_forward"] = False  # the head is used again right after the forward
    fully_shard(model, **root_kw)
    return model
