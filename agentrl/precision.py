"""Mixed precision as the large systems do it: fp32 master weights, bf16 compute, a sampler in its own dtype.

Three dtypes describe a run, resolved once from ``--dtype`` and ``--master-dtype`` for the device:

* **master**: the learner's parameters and the optimizer's view of them. float32 unless pure bf16 is asked
  for explicitly: an Adam step moves a weight by about the learning rate, and bfloat16 keeps 8 significant
  bits, so at lr 3e-6 nearly every update of a weight near 0.02 rounds away (on an H100, 3.97 % of a 0.5B
  model's parameters changed in two steps with bf16 master weights, 99.9995 % with fp32 ones);
* **compute**: the forward and backward passes (under autocast when it differs from the master dtype; FSDP2
  uses its ``MixedPrecisionPolicy`` instead);
* **sampler**: the copy the sampler generates from, equal to the compute dtype. When it differs from the
  master dtype the sampler holds its own copy, refreshed after every step (:func:`served_copy`), and weight
  checksums say which copy they describe (:class:`WeightsDigest`).

On CPU the defaults resolve to float32 everywhere: the sampler shares the learner's model object, exactly as
before mixed precision existed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from agentrl.errors import ConfigError
from agentrl.models import resolve_dtype
from agentrl.weights import weights_checksum

if TYPE_CHECKING:
    import torch

__all__ = ["MasterDtype", "Precision", "WeightsDigest", "resolve_precision", "served_copy", "weights_digest"]

MasterDtype = Literal["float32", "bfloat16"]
_MASTER: tuple[str, ...] = ("float32", "bfloat16")


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True, slots=True)
class Precision:
    """The dtypes of one run on one device (:func:`resolve_precision`)."""

    master: torch.dtype
    """The learner's parameters and optimizer updates."""
    compute: torch.dtype
    """Forward and backward passes (autocast to it when it differs from :attr:`master`)."""
    sampler: torch.dtype
    """The sampler's copy of the weights."""

    @property
    def autocast(self) -> bool:
        """The learner computes under autocast (master and compute dtypes differ)."""
        return self.master != self.compute

    @property
    def shares_weights(self) -> bool:
        """A sampler in this process can generate from the learner's own tensors (same dtype)."""
        return self.sampler == self.master

    @property
    def pure_low_precision(self) -> bool:
        """Master weights below float32: small updates round away (warned about at start)."""
        import torch

        return self.master in (torch.bfloat16, torch.float16)

    def describe(self) -> str:
        """``master float32, compute bfloat16, sampler bfloat16``."""
        return f"master {_name(self.master)}, compute {_name(self.compute)}, sampler {_name(self.sampler)}"

    def warning(self) -> str | None:
        """Why pure low-precision master weights are risky, or None."""
        if not self.pure_low_precision:
            return None
        return (
            f"warning: master weights in {_name(self.master)} (--master-dtype): the optimizer updates them "
            "in place, and a step much smaller than a weight's resolution (bfloat16 keeps 8 significant "
            "bits: ~1e-4 for a weight of 0.02, against an Adam step of about the learning rate) rounds "
            "away. Watch learn/unchanged_frac; the default float32 master weights with bf16 compute do not "
            "lose updates"
        )


def resolve_precision(dtype: str, master_dtype: str, device: torch.device) -> Precision:
    """The run's :class:`Precision`: ``dtype`` (``--dtype``: ``auto`` is bfloat16 on CUDA, float32 elsewhere)
    is the compute and sampler dtype; ``master_dtype`` (``--master-dtype``) the learner's weights.

    Raises:
        ConfigError: an unknown dtype, or master weights less precise than the compute dtype.
    """
    import torch

    if master_dtype not in _MASTER:
        raise ConfigError(f"--master-dtype must be one of {list(_MASTER)}, got {master_dtype!r}")
    compute = resolve_dtype(dtype, device)
    master = resolve_dtype(master_dtype, device)
    if compute not in (torch.float32, torch.bfloat16):
        raise ConfigError(f"--dtype must resolve to float32 or bfloat16, got {_name(compute)}")
    if master == torch.bfloat16 and compute == torch.float32:
        raise ConfigError(
            "--master-dtype bfloat16 with --dtype float32 would compute in more precision than the weights "
            "hold; use --dtype bfloat16 (pure bf16) or the default float32 master weights"
        )
    return Precision(master=master, compute=compute, sampler=compute)


def served_copy(named_tensors: Mapping[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """``named_tensors`` as a sampler in ``dtype`` holds them: floating-point tensors cast (a new tensor only
    where the dtype differs), others as they are."""
    return {
        k: (t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t)
        for k, t in named_tensors.items()
    }


@dataclass(frozen=True, slots=True)
class WeightsDigest:
    """A weights checksum that says which copy it describes: the learner's ``master`` weights, or a copy
    ``served`` to a sampler in :attr:`dtype`. Two digests agree only when copy, dtype and bytes do."""

    copy: Literal["master", "served"]
    """Which copy the bytes are."""
    dtype: str
    """Their floating-point dtype (``float32``, ``bfloat16``; ``a+b`` when mixed)."""
    sha256: str
    """:func:`agentrl.weights.weights_checksum` of the tensors."""

    def __str__(self) -> str:
        return f"{self.copy} {self.dtype} sha256:{self.sha256[:16]}"


def weights_digest(named_tensors: Mapping[str, Any], copy: Literal["master", "served"]) -> WeightsDigest:
    """The :class:`WeightsDigest` of ``named_tensors`` as ``copy``."""
    dtypes = sorted({_name(t.dtype) for t in named_tensors.values() if t.is_floating_point()})
    return WeightsDigest(copy, "+".join(dtypes) or "none", weights_checksum(named_tensors))
