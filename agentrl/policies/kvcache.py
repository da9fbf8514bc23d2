"""KV storage for :class:`~agentrl.policies.engine.GenerationEngine`: per-row slots the model writes into,
and a prefix tree of reusable KV with a byte budget.

``SlotCache`` is a transformers :class:`~transformers.Cache` whose layers write each row's new keys/values at
that row's own positions in one preallocated buffer, so rows of different lengths decode together (with an
explicit 4D attention mask) without re-padding every step. transformers' own layers cannot do this:
``DynamicLayer`` appends at one shared length and ``StaticLayer`` keeps one ``cumulative_length`` for the
whole batch.

``PrefixTree`` is a radix tree over token ids; each node holds the KV of its edge's tokens, so a prompt prefix
shared by the episodes of a group is stored once, and an episode's next turn finds its conversation so far by
longest-prefix match. Least-recently-used leaves are evicted when the tree is over its byte budget.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from agentrl.errors import ConfigError, PolicyError

__all__ = ["KVSpec", "PrefixTree", "SlotCache"]


@dataclass(frozen=True, slots=True)
class KVSpec:
    """Shape of one token's keys and values across the model."""

    layers: int
    """Attention layers."""
    kv_heads: int
    """Key/value heads per layer."""
    head_dim: int
    """Size of one head."""
    dtype: torch.dtype
    """Storage dtype (the model's)."""
    device: torch.device
    """Where the KV lives (the model's device)."""

    @property
    def bytes_per_token(self) -> int:
        """Bytes of keys + values of one token over all layers."""
        return self.layers * 2 * self.kv_heads * self.head_dim * torch.finfo(self.dtype).bits // 8

    @classmethod
    def from_model(cls, model: Any, device: torch.device) -> KVSpec:
        """The KV geometry from a causal LM's config; refuses models whose attention the engine cannot run."""
        cfg = model.config
        layer_types = getattr(cfg, "layer_types", None)
        if layer_types and any(t != "full_attention" for t in layer_types):
            raise ConfigError(
                f"the generation engine supports full-attention models only; {type(model).__name__} has "
                f"layer types {sorted(set(layer_types))}"
            )
        impl = getattr(cfg, "_attn_implementation", None) or "eager"
        if impl not in ("sdpa", "eager"):
            raise ConfigError(
                f"the generation engine needs attn_implementation 'sdpa' or 'eager' (explicit 4D masks), "
                f"got {impl!r}"
            )
        heads = int(cfg.num_attention_heads)
        kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        dtype = next(model.parameters()).dtype
        return cls(int(cfg.num_hidden_layers), kv_heads, head_dim, dtype, device)


class _SlotLayer(CacheLayerMixin):
    """One layer's view of the :class:`SlotCache` buffer (storage and bookkeeping live in the cache)."""

    is_sliding = False

    def __init__(self, owner: SlotCache, index: int):
        super().__init__()  # type: ignore[no-untyped-call]  # transformers' cache layer is unannotated
        self.owner = owner
        self.index = index
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass  # the owner allocates one buffer for all layers

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.owner._write(self.index, key_states, value_states)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.kv_len, 0

    def get_seq_length(self) -> int:
        return self.owner.kv_len

    def get_max_length(self) -> int:
        return self.owner.capacity


class SlotCache(Cache):
    """Keys/values of up to ``slots`` rows in one buffer ``[layers, 2, slots, kv_heads, capacity, head_dim]``.

    Before each forward the engine calls :meth:`set_window` with the rows taking part (a contiguous range of
    slots), the position every new token is written at, and the key length attention reads; each layer then
    scatters the new keys/values to those positions and returns a view of the window (no copy). Rows keep
    their own lengths; the engine's attention mask hides each row's unused tail.

    The buffer is allocated on first use and grows (with a copy) when a row needs more positions. On CPU,
    pages a row never writes are never touched, so resident memory follows the rows' real lengths.
    """

    def __init__(self, spec: KVSpec, slots: int):
        self.spec = spec
        self.slots = slots
        self.buf: torch.Tensor | None = None
        self.capacity = 0
        self.zeroed = [0] * slots  # positions [0, zeroed[r]) of row r hold finite values (written or zero)
        self.kv_len = 0
        self._start = 0
        self._stop = 0
        self._index: torch.Tensor | None = None
        super().__init__(layers=[_SlotLayer(self, i) for i in range(spec.layers)])

    # -- storage ----------------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Bytes reserved by the buffer (on CPU, resident memory is what rows actually wrote)."""
        return 0 if self.buf is None else self.buf.numel() * self.buf.element_size()

    def reserve(self, length: int, round_to: int = 256) -> None:
        """Make room for ``length`` positions per row (grows by at least half, keeping every row's KV)."""
        if length <= self.capacity:
            return
        cap = max(length, self.capacity + self.capacity // 2)
        cap = -(-cap // round_to) * round_to
        s = self.spec
        new = torch.empty(
            (s.layers, 2, self.slots, s.kv_heads, cap, s.head_dim), dtype=s.dtype, device=s.device
        )
        if self.buf is not None:
            for r, z in enumerate(self.zeroed):
                if z:
                    new[:, :, r, :, :z].copy_(self.buf[:, :, r, :, :z])
        self.buf, self.capacity = new, cap

    def release(self) -> None:
        """Free the buffer (the next :meth:`reserve` allocates a fresh one)."""
        self.buf, self.capacity, self._index = None, 0, None
        self.zeroed = [0] * self.slots

    def _touch(self, row: int, stop: int) -> None:
        # Masked positions still enter attention as 0 x value, so they must never hold NaN/inf from
        # uninitialized memory. Zeroing lazily, row by row, ahead of every write and read keeps the pages
        # of unused rows and positions untouched (uncommitted on CPU).
        z = self.zeroed[row]
        if stop > z:
            assert self.buf is not None
            stop = min(self.capacity, max(stop, z + 64))
            self.buf[:, :, row, :, z:stop].zero_()
            self.zeroed[row] = stop

    def read(self, row: int, start: int, stop: int) -> torch.Tensor:
        """A copy of row ``row``'s KV at positions ``[start, stop)`` (``[layers, 2, heads, n, head_dim]``)."""
        assert self.buf is not None
        return self.buf[:, :, row, :, start:stop].clone()

    def reader(self, row: int) -> Callable[[int, int], torch.Tensor]:
        """``read_kv(start, stop)`` over row ``row`` (what :meth:`PrefixTree.insert` asks for)."""
        return lambda start, stop: self.read(row, start, stop)

    def write(self, row: int, start: int, kv: torch.Tensor) -> None:
        """Put ``kv`` (as returned by :meth:`read`) at positions ``[start, start + n)`` of row ``row``."""
        assert self.buf is not None
        self._touch(row, start + kv.shape[3])
        self.buf[:, :, row, :, start : start + kv.shape[3]].copy_(kv)

    def move_row(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` positions of row ``src`` to row ``dst``."""
        assert self.buf is not None
        if src != dst and length > 0:
            self.buf[:, :, dst, :, :length].copy_(self.buf[:, :, src, :, :length])
            self.zeroed[dst] = max(self.zeroed[dst], length)

    # -- the forward's window ------------------------------------------------------------------
    def set_window(self, start: int, positions_B_Q: torch.Tensor, kv_len: int) -> None:
        """Rows ``[start, start + B)`` take part in the next forward; query ``q`` of row ``b`` is written at
        ``positions_B_Q[b, q]`` and attention reads positions ``[0, kv_len)``."""
        if self.buf is None or kv_len > self.capacity or int(positions_B_Q.max()) >= self.capacity:
            raise PolicyError("internal error: the KV window exceeds the reserved capacity")
        B, Q = positions_B_Q.shape
        s = self.spec
        stop = max(kv_len, int(positions_B_Q.max()) + 1)
        for row in range(start, start + B):
            self._touch(row, stop)
        self._start, self._stop, self.kv_len = start, start + B, kv_len
        self._index = positions_B_Q.view(B, 1, Q, 1).expand(B, s.kv_heads, Q, s.head_dim)

    def attention(self) -> contextlib.AbstractContextManager[Any]:
        """The SDPA backends a forward over this cache may use: on CUDA every one but cuDNN's.

        The engine hands attention an explicit mask whose key length grows by one each step; cuDNN's
        attention then plans anew on every call (measured on an H100, torch 2.11: 1.6 ms of CPU per layer
        call, against 0.05 ms for ``generate``'s maskless calls), which made a 64-row decode step 1.4x slower
        than ``generate``. The memory-efficient kernel takes the mask as it is.
        """
        if self.spec.device.type != "cuda":
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])

    def _write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.buf is not None and self._index is not None
        if k.shape[1] != self.spec.kv_heads or k.shape[-1] != self.spec.head_dim:
            raise PolicyError(
                f"the model produced keys of shape {tuple(k.shape)}, but the KV cache was laid out for "
                f"{self.spec.kv_heads} heads of size {self.spec.head_dim}"
            )
        K = self.buf[layer, 0, self._start : self._stop]
        V = self.buf[layer, 1, self._start : self._stop]
        K.scatter_(2, self._index, k.to(K.dtype))
        V.scatter_(2, self._index, v.to(V.dtype))
        return K[:, :, : self.kv_len], V[:, :, : self.kv_len]


# ---------------------------------------------------------------------------------------------------
class _Node:
    __slots__ = ("children", "kv", "last_used", "parent", "tokens")

    def __init__(self, tokens: tuple[int, ...], kv: torch.Tensor | None, parent: _Node | None):
        self.tokens = tokens
        self.kv = kv  # [layers, 2, kv_heads, len(tokens), head_dim]
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.last_used = 0

    @property
    def nbytes(self) -> int:
        return 0 if self.kv is None else self.kv.numel() * self.kv.element_size()


def _common_prefix(a: Sequence[int], b: Sequence[int], start: int, stop: int) -> int:
    """Length of the common prefix of ``a`` and ``b[start:stop]``."""
    n = min(len(a), stop - start)
    i = 0
    while i < n and a[i] == b[start + i]:
        i += 1
    return i


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """The cached KV for a prefix of some token sequence."""

    length: int
    """Tokens matched."""
    segments: tuple[tuple[int, torch.Tensor], ...]
    """``(start position, kv)`` pieces that together cover positions ``[0, length)``."""


class PrefixTree:
    """Radix tree of token-id prefixes with their KV, bounded by ``budget_bytes`` (LRU eviction of leaves).

    The KV of a prefix is the prefix of the KV (attention is causal), so a node serves every sequence that
    starts with the path to it. Not thread-safe: the engine uses it under its lock.
    """

    def __init__(self, budget_bytes: int):
        if budget_bytes < 0:
            raise ConfigError(f"cache budget must be >= 0 bytes, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self.root = _Node((), None, None)
        self.nbytes = 0
        self.evictions = 0
        self._clock = itertools.count(1)

    def __len__(self) -> int:
        return sum(1 for _ in self._nodes())

    def _nodes(self) -> Any:
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def clear(self) -> None:
        """Drop every entry (e.g. when the weights changed)."""
        self.root = _Node((), None, None)
        self.nbytes = 0

    def match(self, ids: Sequence[int], limit: int) -> PrefixMatch:
        """The longest cached prefix of ``ids[:limit]``; marks the nodes on its path as recently used."""
        node, pos, now = self.root, 0, next(self._clock)
        segments: list[tuple[int, torch.Tensor]] = []
        while pos < limit:
            child = node.children.get(ids[pos])
            if child is None:
                break
            n = _common_prefix(child.tokens, ids, pos, limit)
            assert child.kv is not None and n > 0
            child.last_used = now
            segments.append((pos, child.kv if n == len(child.tokens) else child.kv[:, :, :, :n]))
            pos += n
            if n < len(child.tokens):
                break
            node = child
        return PrefixMatch(pos, tuple(segments))

    def insert(self, ids: Sequence[int], read_kv: Callable[[int, int], torch.Tensor]) -> None:
        """Cache the KV of ``ids``; ``read_kv(start, stop)`` returns it for positions ``[start, stop)`` and is
        called only for the part not cached yet. Evicts down to the budget afterwards."""
        node, pos, now = self.root, 0, next(self._clock)
        while pos < len(ids):
            child = node.children.get(ids[pos])
            if child is None:
                new = _Node(tuple(ids[pos:]), read_kv(pos, len(ids)), node)
                new.last_used = now
                node.children[ids[pos]] = new
                self.nbytes += new.nbytes
                break
            n = _common_prefix(child.tokens, ids, pos, len(ids))
            child.last_used = now
            if n < len(child.tokens):
                child = self._split(child, n)
            pos += n
            node = child
        self.evict()

    def _split(self, node: _Node, n: int) -> _Node:
        """Cut ``node``'s edge after ``n`` tokens; returns the new upper node."""
        assert node.kv is not None and node.parent is not None
        upper = _Node(node.tokens[:n], node.kv[:, :, :, :n].clone(), node.parent)
        upper.last_used = node.last_used
        node.parent.children[node.tokens[0]] = upper
        node.tokens, node.kv, node.parent = node.tokens[n:], node.kv[:, :, :, n:].clone(), upper
        upper.children[node.tokens[0]] = node
        return upper

    def evict(self) -> None:
        """Remove least-recently-used leaves until the tree fits its budget."""
        while self.nbytes > self.budget_bytes:
            leaves = [n for n in self._nodes() if not n.children]
            if not leaves:
                break
            victim = min(leaves, key=lambda n: n.last_used)
            assert victim.parent is not None
            del victim.parent.children[victim.tokens[0]]
            self.nbytes -= victim.nbytes
            self.evictions += 1
