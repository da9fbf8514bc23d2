"""Decoding-time twin of a model whose linear layers run on pre-packed weights (CPU, fp32, MKL).

A decode step multiplies a handful of rows (one per running request) by every weight matrix. For such
small ``M``, MKL's ``sgemm`` re-packs the whole weight matrix on every call, so a step at 16 rows costs 3-4x
the time of reading the weights once (SmolLM2-135M on 2 cores: 35 ms for the LM head alone, 10 ms with a
packed copy; docs/benchmarks/generation.md). Packing once per weight version removes that: the twin's
``nn.Linear`` layers keep a packed copy (``torch.ops.mkl._mkl_reorder_linear_weight``, the packing
torch's own CPU compiler uses) and multiply up to ``rows`` rows against it, padding smaller batches to
``rows`` (inputs of a few times ``rows`` run in chunks); long inputs (prefills) and anything with
gradients take the plain path.

The twin shares every parameter and buffer with the model (no copy of the weights), and its modules share
the model's forward-hook registries (a hook added to the model later runs in generation too): only the
module tree is duplicated, so the learner's model keeps its own modules and modes (the twin is always in
eval mode). A pack is rebuilt whenever its
weight changed in place (the tensor's version counter: optimizer steps, ``copy_`` of new weights) or was
replaced; :meth:`InferenceTwin.drop` frees the packs (they hold as much memory as the weights) and the next
:meth:`InferenceTwin.refresh` rebuilds them.

Whether a pack pays depends on the CPU, not only on the shape: on the Intel host the numbers above come
from, the packed product was 3-4x faster; on an AMD EPYC (Zen 4) host of the same kind MKL's packed GEMM
was no faster for the LM head and 1.7x slower for the MLP's matrices, while the plain product (which
``model.generate`` uses) was twice as fast, so a twin packing every layer decoded at half the plain
floor's speed (issue 46). :func:`best_kernel` therefore times the plain product against each packed one
once per weight shape in the process, and by default a twin packs a layer only with a kernel measured
faster for its shape. Two packings are tried: MKL's (above) and oneDNN's
(``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``, the other packing torch's CPU compiler
uses), whose kernels are chosen by instruction set rather than by CPU vendor.
"""

from __future__ import annotations

import copy
import functools
import itertools
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from agentrl.errors import ConfigError

__all__ = [
    "KERNELS",
    "InferenceTwin",
    "available_kernels",
    "best_kernel",
    "pack_pays",
    "packed_linear_available",
    "use_packed",
]

PACK_ROWS = 16
"""Rows a pack is built for: decode batches of up to this many rows use it (padded to it)."""
MIN_ROWS = 4
"""Below this many rows the plain product is faster than MKL's pack (MKL multiplies 1-3 rows as
matrix-vector products without packing), so an MKL pack is skipped; a oneDNN pack is used from one row (at
1 row it was no slower than the plain product, issue 46)."""
MAX_CHUNKS = 4
"""Inputs of up to this many packs' rows run as chunks on the pack (still faster than the plain product);
longer ones (prefills) take the plain path, which is efficient at that size."""
PAYS = 0.9
"""A layer is packed by default only when its packed product takes at most this fraction of the plain
one's time (a pack costs as much memory as the weight, so a tie is not worth it)."""

KERNELS = ("mkl", "onednn")
"""The packed products: MKL's packed GEMM, oneDNN's inner product on a reordered weight."""

_kernels: tuple[str, ...] | None = None
_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
)


def packed_linear_available() -> bool:
    """Whether this torch has MKL's packed GEMM (x86 CPU wheels do; ARM and CUDA-only builds may not)."""
    return "mkl" in available_kernels()


def _pack(kernel: str, w: torch.Tensor, rows: int) -> torch.Tensor:
    if kernel == "mkl":
        out: torch.Tensor = torch.ops.mkl._mkl_reorder_linear_weight(w, rows)
    else:
        out = torch.ops.mkldnn._reorder_linear_weight(w, rows)
    return out


def _packed_mm(
    kernel: str,
    x_R_K: torch.Tensor,
    pack: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    rows: int,
) -> torch.Tensor:
    if kernel == "mkl":
        out: torch.Tensor = torch.ops.mkl._mkl_linear(x_R_K, pack, w, bias, rows)
    else:
        out = torch.ops.mkldnn._linear_pointwise(x_R_K, pack, bias, "none", [], "")
    return out


def available_kernels() -> tuple[str, ...]:
    """The packed products this torch build runs correctly (checked once on a small product)."""
    global _kernels
    if _kernels is None:
        ok = []
        w = torch.randn(8, 4)
        x = torch.randn(2, 4)
        for kernel in KERNELS:
            try:
                with torch.no_grad():
                    out = _packed_mm(kernel, x, _pack(kernel, w, 2), w, None, 2)
                if torch.allclose(out, x @ w.T, atol=1e-5):
                    ok.append(kernel)
            except (AttributeError, RuntimeError, NotImplementedError):
                pass
        _kernels = tuple(ok)
    return _kernels


def use_packed(requested: bool | None, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether an engine decodes on packs: ``requested``, or by default for fp32 CPU models."""
    if requested is None:
        return device.type == "cpu" and dtype == torch.float32 and packed_linear_available()
    if requested and not packed_linear_available():
        raise ConfigError("packed_weights=True needs a torch build with MKL's packed GEMM (x86 CPU)")
    return bool(requested)


def pack_pays(out_features: int, in_features: int, rows: int = PACK_ROWS, threads: int = 0) -> bool:
    """Whether some packed product beats the plain one for this shape on this CPU (:func:`best_kernel`)."""
    return best_kernel(out_features, in_features, rows, threads) is not None


@functools.cache
def best_kernel(out_features: int, in_features: int, rows: int = PACK_ROWS, threads: int = 0) -> str | None:
    """The fastest packed product (one of :data:`KERNELS`) for a ``[rows, in_features] x [in_features,
    out_features]`` product on this CPU if it takes at most :data:`PAYS` of the plain product's time, else
    None (``threads``: the torch threads it was measured with, part of the cache key; callers pass
    :func:`torch.get_num_threads`).

    Measured once per shape and process on random weights: alternating timings of every product, the
    fastest of each counted (the minimum is the least disturbed by other processes on a shared machine).
    Takes well under a second for a 135M model's shapes (the LM head's dominates)."""
    del threads  # only a cache key
    g = torch.Generator().manual_seed(0)
    w = torch.randn(out_features, in_features, generator=g)
    x = torch.randn(rows, in_features, generator=g)
    with torch.no_grad():
        fns: dict[str | None, Any] = {None: lambda: F.linear(x, w)}
        for kernel in available_kernels():
            pack = _pack(kernel, w, rows)
            fns[kernel] = functools.partial(_packed_mm, kernel, x, pack, w, None, rows)
        # Enough calls per timing for ~1 ms of work at the smallest shapes; one call for the LM head.
        calls = max(1, min(64, (1 << 20) // max(1, out_features * in_features // 16)))
        best = dict.fromkeys(fns, float("inf"))
        for fn in fns.values():
            fn()  # warm-up (first-touch of the buffers)
        for _ in range(5):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                best[name] = min(best[name], time.perf_counter() - t0)
    fastest = min((k for k in best if k is not None), key=best.__getitem__, default=None)
    return fastest if fastest is not None and best[fastest] <= PAYS * best[None] else None


class _PackedLinear(nn.Module):
    """``nn.Linear`` over the original layer's (shared) weight, with a packed copy for small inputs."""

    def __init__(self, linear: nn.Linear, rows: int, kernel: str = "mkl"):
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias
        self.rows = rows
        self.kernel = kernel
        self.pack: torch.Tensor | None = None
        self._key: tuple[int, int] | None = None
        self._pad: torch.Tensor | None = None

    def refresh(self) -> bool:
        w = self.weight
        key = (w.data_ptr(), w._version)
        if self.pack is not None and key == self._key:
            return False
        with torch.no_grad():
            self.pack = _pack(self.kernel, w.detach(), self.rows)
        self._key = key
        return True

    def drop(self) -> None:
        self.pack, self._key, self._pad = None, None, None

    @property
    def packed_bytes(self) -> int:
        return 0 if self.pack is None else self.weight.numel() * self.weight.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = x.shape[-1]
        m = x.numel() // k if k else 0
        least = MIN_ROWS if self.kernel == "mkl" else 1
        if (
            self.pack is None
            or not least <= m <= self.rows * MAX_CHUNKS
            or torch.is_grad_enabled()
            or x.dtype != torch.float32
        ):
            return F.linear(x, self.weight, self.bias)
        x_M_K = x.reshape(m, k)
        if self.kernel != "mkl":  # oneDNN's reordered weight takes any number of rows as they are
            return self._mm(x_M_K.contiguous()).reshape(*x.shape[:-1], -1)
        pieces = []
        for i in range(0, m, self.rows):
            chunk = x_M_K[i : i + self.rows]
            n = chunk.shape[0]
            if n < self.rows:  # padded to the pack's rows; rows past n hold earlier inputs (finite, dropped)
                if self._pad is None:
                    self._pad = torch.zeros(self.rows, k, dtype=x.dtype)
                self._pad[:n].copy_(chunk)
                chunk = self._pad
            pieces.append(self._mm(chunk.contiguous())[:n])
        out_M_N = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        return out_M_N.reshape(*x.shape[:-1], out_M_N.shape[-1])

    def _mm(self, x_R_K: torch.Tensor) -> torch.Tensor:
        assert self.pack is not None
        return _packed_mm(self.kernel, x_R_K, self.pack, self.weight, self.bias, self.rows)


class InferenceTwin:
    """A copy of ``model``'s module tree sharing all its tensors, whose fp32 CPU linears decode on packs.

    Use :attr:`module` like the model (same forward); call :meth:`refresh` before a forward (cheap when
    nothing changed) and :meth:`drop` to give the packs' memory back. ``pack_all=True`` packs every layer
    with ``kernel`` (one of :data:`KERNELS`); ``pack_all=False`` packs a layer only with the kernel
    :func:`best_kernel` found faster for its shape on this CPU (the others run the plain product).
    """

    def __init__(
        self, model: nn.Module, rows: int = PACK_ROWS, *, pack_all: bool = True, kernel: str = "mkl"
    ):
        if kernel not in KERNELS:
            raise ConfigError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        shared: dict[int, Any] = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
        config = getattr(model, "config", None)
        if config is not None:
            shared[id(config)] = config  # one config: attention-implementation switches reach both
        self.module: nn.Module = copy.deepcopy(model, shared)
        self.module.eval()  # generation never uses dropout, whatever mode the learner left the model in
        self.layers: list[_PackedLinear] = []
        for parent in list(self.module.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is not nn.Linear or not _packable(child.weight):
                    continue
                out_features, in_features = child.weight.shape
                threads = torch.get_num_threads()
                chosen = kernel if pack_all else best_kernel(out_features, in_features, rows, threads)
                if chosen is None:
                    continue
                packed = _PackedLinear(child, rows, chosen)
                setattr(parent, name, packed)
                self.layers.append(packed)
        # Forward hooks registered on the model's modules, now or later, run in the twin too (they get the
        # twin's module as their first argument).
        for name, original in model.named_modules():
            twin = self.module.get_submodule(name)
            for attr in _HOOK_DICTS:
                if hasattr(original, attr):
                    setattr(twin, attr, getattr(original, attr))

    def refresh(self) -> int:
        """Re-pack every layer whose weight changed since it was packed; returns how many were."""
        return sum(layer.refresh() for layer in self.layers)

    def drop(self) -> None:
        """Free the packs (the next :meth:`refresh` rebuilds them)."""
        for layer in self.layers:
            layer.drop()

    @property
    def packed_bytes(self) -> int:
        """Bytes the packs hold now."""
        return sum(layer.packed_bytes for layer in self.layers)


def _packable(w: torch.Tensor) -> bool:
    return w.device.type == "cpu" and w.dtype == torch.float32 and w.dim() == 2 and not w.is_quantized
