"""A checksum of model weights, the same wherever it is computed.

A learner publishes weights; a sampler (in process, in a Ray actor, in a ``vllm serve`` process) loads them.
After a sync both sides compute :func:`weights_checksum` over the tensors they hold and compare: equal
checksums mean the sampler samples from exactly the weights the learner published, not merely that it
received *a* message with the right version number.

The digest covers, in sorted name order, each tensor's name, dtype, shape and raw bytes (moved to CPU and
made contiguous). It is therefore sensitive to dtype: a bf16 copy of fp32 weights has another checksum, on
purpose (it samples from other numbers). Names must match too; a sampler that renames parameters (vLLM fuses
q/k/v projections) must checksum the learner-side names it was given, or map back before hashing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from agentrl.errors import ConfigError

__all__ = ["weights_checksum"]


def weights_checksum(named_tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> str:
    """SHA-256 hex digest of ``name -> tensor`` (a ``state_dict()``, or ``(name, tensor)`` pairs).

    Tensors may live on any device and be non-contiguous; each is copied to CPU for hashing only.

    Raises:
        ConfigError: no tensors, a repeated name, or a value that is not a tensor.
    """
    import torch

    items = list(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
    if not items:
        raise ConfigError("weights_checksum needs at least one tensor")
    names = [n for n, _ in items]
    if len(set(names)) != len(names):
        raise ConfigError("weights_checksum got the same parameter name twice")
    h = hashlib.sha256()
    for name, t in sorted(items, key=lambda kv: kv[0]):
        if not isinstance(t, torch.Tensor):
            raise ConfigError(f"weights_checksum: {name!r} is a {type(t).__name__}, not a tensor")
        cpu = t.detach().to("cpu").contiguous()
        h.update(f"{name}\0{cpu.dtype}\0{tuple(cpu.shape)}\0".encode())
        # A byte view of any dtype (bf16 has no numpy equivalent, so go through uint8).
        h.update(cpu.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
