"""Weight sync between the learner group and the inference servers: one versioned interface, two transports.

The learner publishes ``(version, named tensors)`` through a :class:`WeightTransport` and gets a
:class:`WeightRef` back (the version, the learner-side :func:`agentrl.weights_checksum`, and where the bytes
are). The controller hands the ref to the :class:`WeightBroker` (a named actor holding the newest one) and
asks every inference server to sync: each pulls the newest ref, loads it through the
:class:`~agentrl.protocols.WeightSink` protocol of the policy it wraps, and reports its version and the
checksum of the weights it now holds. The controller checks that they all equal the learner's. A server
that restarts pulls the same ref before it serves again.

Transports:

* ``object_store`` (default): ``ray.put`` of the CPU tensors; works across nodes with no shared disk.
* ``shared_disk``: one safetensors file per version under a folder every node mounts
  (``--weights-dir``); the newest two versions are kept.
* NCCL broadcast / vLLM's in-engine update for GPU clusters is not implemented here: on one GPU the vLLM
  policy (``agentrl.policies.VLLMPolicy``) takes the tensors through the same ``load_weights`` call (see
  docs/distributed.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agentrl.errors import ConfigError, StoreError
from agentrl.precision import weights_digest
from agentrl.weights import weights_checksum

__all__ = [
    "TRANSPORTS",
    "ObjectStoreTransport",
    "SharedDiskTransport",
    "WeightBroker",
    "WeightRef",
    "WeightTransport",
    "make_transport",
]


@dataclass(frozen=True)
class WeightRef:
    """Where one published version of the weights is."""

    version: int
    """The learner step that produced them."""
    checksum: str
    """:func:`agentrl.weights_checksum` of the tensors as the learner published them."""
    transport: str
    """Which :class:`WeightTransport` wrote them."""
    location: Any
    """Transport-specific: ``[ObjectRef]`` (a list, so Ray does not resolve it in transit) or a file path."""
    copy: str = ""
    """Which copy :attr:`checksum` describes: ``served bfloat16`` (the learner's fp32 master weights cast to
    the servers' dtype) or ``served float32`` (the master weights as they are, on CPU)."""


class WeightTransport(Protocol):
    """Moves named tensors from the learner to the servers."""

    name: str
    """The transport's name, as ``--ray-weights`` spells it."""

    def put(self, version: int, named_tensors: Mapping[str, Any]) -> WeightRef:
        """Publish the tensors as ``version`` (called in the learner's process)."""
        ...

    def get(self, ref: WeightRef) -> dict[str, Any]:
        """The tensors of ``ref`` (called in a server's process)."""
        ...


def _cpu_copies(named_tensors: Mapping[str, Any]) -> dict[str, Any]:
    # Own contiguous CPU copies: tied parameters share storage, which safetensors refuses and which must
    # not alias the learner's live tensors while they travel.
    return {k: v.detach().to("cpu").clone().contiguous() for k, v in named_tensors.items()}


def _copy(tensors: Mapping[str, Any]) -> str:
    d = weights_digest(tensors, "served")
    return f"{d.copy} {d.dtype}"


class ObjectStoreTransport:
    """Weights through the Ray object store (the default; any cluster, CPU or GPU)."""

    name = "object_store"

    def put(self, version: int, named_tensors: Mapping[str, Any]) -> WeightRef:
        """``ray.put`` the tensors; the ref lives as long as the broker (or a server) holds it."""
        import ray

        tensors = _cpu_copies(named_tensors)
        return WeightRef(version, weights_checksum(tensors), self.name, [ray.put(tensors)], _copy(tensors))

    def get(self, ref: WeightRef) -> dict[str, Any]:
        """Fetch the tensors from the object store (zero-copy on the same node)."""
        import ray

        tensors: dict[str, Any] = ray.get(ref.location[0])
        return tensors


class SharedDiskTransport:
    """Weights as safetensors files in a folder every node mounts (NFS, a shared volume)."""

    name = "shared_disk"

    def __init__(self, folder: str | os.PathLike[str]):
        if not folder:
            raise ConfigError("the shared_disk weight transport needs a folder that every node mounts")
        self.folder = Path(folder)

    def put(self, version: int, named_tensors: Mapping[str, Any]) -> WeightRef:
        """Write ``weights-v<version>.safetensors`` atomically; keep the newest two versions."""
        from safetensors.torch import save_file

        self.folder.mkdir(parents=True, exist_ok=True)
        tensors = _cpu_copies(named_tensors)
        path = self.folder / f"weights-v{version:06d}.safetensors"
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        save_file(tensors, str(tmp))
        os.replace(tmp, path)
        for old in sorted(self.folder.glob("weights-v*.safetensors"))[:-2]:
            old.unlink(missing_ok=True)
        return WeightRef(version, weights_checksum(tensors), self.name, str(path), _copy(tensors))

    def get(self, ref: WeightRef) -> dict[str, Any]:
        """Read the file of ``ref``."""
        from safetensors.torch import load_file

        try:
            return dict(load_file(str(ref.location)))
        except OSError as e:
            raise StoreError(
                f"weights of version {ref.version} are not readable at {ref.location}: {e}"
            ) from e


TRANSPORTS = ("object_store", "shared_disk")
"""The transports: ``shared_disk`` when the run sets ``--weights-dir``, else ``object_store``."""


def make_transport(name: str, folder: str | None = None) -> WeightTransport:
    """The transport called ``name`` (``shared_disk`` needs ``folder``)."""
    if name == "object_store":
        return ObjectStoreTransport()
    if name == "shared_disk":
        return SharedDiskTransport(folder or "")
    raise ConfigError(f"unknown weight transport {name!r}; one of {TRANSPORTS}")


class WeightBroker:
    """Holds the newest :class:`WeightRef` (run as a named Ray actor): servers pull from it when the
    controller asks them to sync and when they restart."""

    def __init__(self) -> None:
        self._ref: WeightRef | None = None
        self._starts: dict[str, int] = {}

    def started(self, server: str) -> int:
        """Count a start of ``server`` (Ray restarts an actor by running its ``__init__`` again); return
        how many times it has started."""
        self._starts[server] = self._starts.get(server, 0) + 1
        return self._starts[server]

    def set(self, ref: WeightRef) -> None:
        """Make ``ref`` the newest; versions never go back."""
        if self._ref is not None and ref.version < self._ref.version:
            raise ConfigError(f"weights version {ref.version} is older than {self._ref.version}")
        self._ref = ref

    def latest(self) -> WeightRef | None:
        """The newest ref (None before the first publish)."""
        return self._ref
