"""How a learner's weights reach a vLLM engine, for both transports (``vllm serve`` over HTTP, and the
in-process engine): safetensors on a disk both sides read, loaded by agentrl's worker extension.

:func:`push_weights` is the one sequence both :class:`~agentrl.policies.VLLMServerPolicy` and
:class:`~agentrl.policies.VLLMPolicy` run, against an :class:`EngineControl` (the few engine calls it
needs). The learner-side checksum (:func:`agentrl.weights.weights_checksum`) is compared with the one each
vLLM worker computes over the tensors it loaded (:mod:`agentrl.policies.vllm_worker`); a mismatch is a
:class:`~agentrl.errors.PolicyError`, never a silent success.

Why a file and not the request body: vLLM's RPC route only passes strings (the server refuses pickled
arguments), and its built-in weight-transfer backends (``nccl``, ``ipc``) need CUDA. On GPU machines a NCCL
broadcast is faster; the file path works everywhere, including this CPU build, and is the "safetensors on
shared disk" sync of the distributed design.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agentrl.errors import PolicyError
from agentrl.protocols import WeightUpdate
from agentrl.weights import weights_checksum

__all__ = [
    "EngineControl",
    "UpdateGate",
    "WeightPush",
    "default_weights_dir",
    "push_weights",
    "write_safetensors",
]

LOAD_METHOD = "agentrl_load_weights"
"""The worker extension's method that loads a file (:mod:`agentrl.policies.vllm_worker`)."""
CHECKSUM_METHOD = "agentrl_weights_checksum"
"""The worker extension's method that reports the checksum of the weights it loaded last."""


class EngineControl(Protocol):
    """The engine calls a weight push needs; one implementation per transport."""

    async def collective_rpc(self, method: str, *args: str) -> list[Any]:
        """Call ``method`` of the worker extension on every worker; one result per worker."""
        ...

    async def pause(self) -> None:
        """Let running requests finish and hold new ones until :meth:`resume`."""
        ...

    async def resume(self) -> None:
        """Schedule requests again."""
        ...

    async def reset_prefix_cache(self) -> None:
        """Drop cached keys/values computed with the old weights."""
        ...

    async def set_weight_version(self, version: str) -> None:
        """Record the version in the engine (``GET /weight_info`` reports it)."""
        ...


@dataclass(frozen=True, slots=True)
class WeightPush:
    """What one weight push did, for logs and benchmarks."""

    version: int
    """The version now served."""
    checksum: str
    """:func:`~agentrl.weights.weights_checksum` of the pushed tensors (learner and every worker agree)."""
    bytes: int
    """Size of the safetensors file written."""
    write_s: float
    """Seconds to checksum and write the file on the learner side."""
    load_s: float
    """Seconds from pausing the engine to resuming it (the workers read, checksum and load)."""


class UpdateGate:
    """Keeps generations and weight updates of one policy apart.

    A generation reads the policy's version when it starts; the engine, paused for an update, would hold a
    request submitted meanwhile and run it after the update, with the new weights, under the old label. So
    generations wait (:meth:`wait`) while an update runs (:meth:`updating`), and updates run one at a time.
    """

    def __init__(self) -> None:
        self._idle = asyncio.Event()
        self._idle.set()
        self._lock = asyncio.Lock()

    async def wait(self) -> None:
        """Return when no update is running."""
        await self._idle.wait()

    @asynccontextmanager
    async def updating(self) -> AsyncIterator[None]:
        """Hold new generations back for the duration of the block (one update at a time)."""
        async with self._lock:
            self._idle.clear()
            try:
                yield
            finally:
                self._idle.set()


def default_weights_dir() -> Path:
    """Where weight files go unless told: ``/dev/shm`` (memory, no disk traffic) when present, else the
    temporary folder. A server on another machine needs a folder both can read (``weights_dir=``)."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def write_safetensors(named_tensors: Mapping[str, Any], path: Path) -> int:
    """Write ``name -> tensor`` to ``path`` (safetensors); return its size in bytes.

    Tied parameters (SmolLM2's ``lm_head.weight`` is ``embed_tokens.weight``) share storage, which
    safetensors refuses; the later name gets a copy, so the file holds every name the learner publishes and
    both checksums cover the same set.
    """
    from safetensors.torch import save_file

    seen: set[tuple[int, int]] = set()
    out: dict[str, Any] = {}
    for name, t in named_tensors.items():
        cpu = t.detach().to("cpu")
        key = (cpu.untyped_storage().data_ptr(), cpu.storage_offset())
        out[name] = cpu.contiguous() if key not in seen else cpu.clone().contiguous()
        seen.add(key)
    save_file(out, str(path))
    return path.stat().st_size


async def push_weights(engine: EngineControl, update: WeightUpdate, weights_dir: Path) -> WeightPush:
    """Load ``update`` into every worker of ``engine``; return once each reports the learner's checksum.

    The engine is paused (running requests finish with the old weights, new ones wait) from before the load
    until the prefix cache is cleared and the version recorded, so no request mixes the two.

    Raises:
        PolicyError: the engine failed, or a worker's checksum differs from the learner's (the engine then
            serves weights that are not the update's; the caller keeps its old version).
    """
    t0 = time.perf_counter()
    expected = weights_checksum(update.named_tensors)
    path = Path(weights_dir) / f"agentrl-weights-v{update.version}-{uuid.uuid4().hex[:8]}.safetensors"
    try:
        size = write_safetensors(update.named_tensors, path)
        # The server may run as another user; it only needs to read this file.
        path.chmod(0o644)
        t1 = time.perf_counter()
        await engine.pause()
        try:
            results = await engine.collective_rpc(LOAD_METHOD, str(path))
            await engine.reset_prefix_cache()
            _check_checksums(results, expected)
            await engine.set_weight_version(str(update.version))
        finally:
            await engine.resume()
        t2 = time.perf_counter()
    finally:
        path.unlink(missing_ok=True)
    return WeightPush(update.version, expected, size, t1 - t0, t2 - t1)


async def served_checksum(engine: EngineControl) -> str | None:
    """The checksum every worker reports for the weights it loaded last (None before any push: the engine
    serves the folder it started from). Raises PolicyError when the workers disagree."""
    results = await engine.collective_rpc(CHECKSUM_METHOD)
    sums = {str(r) for r in results}
    if len(sums) != 1:
        raise PolicyError(f"vLLM workers hold different weights (checksums {sorted(sums)})")
    value = sums.pop()
    return value or None


def _check_checksums(results: Sequence[Any], expected: str) -> None:
    if not results:
        raise PolicyError("vLLM ran the weight load on no worker")
    for i, got in enumerate(results):
        if str(got) != expected:
            raise PolicyError(
                f"vLLM worker {i} loaded weights with checksum {str(got)[:16]}..., the learner published "
                f"{expected[:16]}... (a dtype differs between learner and engine, or the file was changed)"
            )
