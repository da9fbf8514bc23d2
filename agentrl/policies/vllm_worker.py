"""The vLLM worker extension that takes agentrl's weight updates (runs inside vLLM's worker processes).

vLLM loads it with ``--worker-extension-cls`` (``worker_extension_cls=`` for the in-process engine); its
methods are then callable by name through ``collective_rpc`` (``POST /collective_rpc`` on a server started
with ``VLLM_SERVER_DEV_MODE=1``). One update is one call, :meth:`AgentRLWorkerExtension.agentrl_load_weights`
with the path of a safetensors file the learner wrote on a disk both can read:

1. the worker reads the file (parameter names as in the learner's ``state_dict()``),
2. computes :func:`checksum` over exactly those tensors, cast to the dtype the engine serves in,
3. loads them with vLLM's in-place ``reload_weights``, which maps names onto vLLM's fused layers (q/k/v,
   gate/up) and re-runs the post-load processing. On CPU that processing repacks every linear weight for
   oneDNN and frees the original tensor, so a plain ``model.load_weights`` would leave the old packed
   weights in use; ``reload_weights`` is the path that rebuilds them,
4. returns the checksum, which the caller compares with the learner's
   :func:`agentrl.weights.weights_checksum`.

This module imports nothing from agentrl: the vLLM server runs in its own virtualenv (vLLM pins its own
torch and transformers), where agentrl and its dependencies need not be installed. The launcher in
:mod:`agentrl.policies.vllm_server` puts a link to this file on the server's ``PYTHONPATH`` as
``agentrl_vllm_worker``; :func:`checksum` must therefore repeat :func:`agentrl.weights.weights_checksum`'s
digest, and a test pins the two to the same value.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

__all__ = ["QUALNAME", "AgentRLWorkerExtension", "checksum"]

QUALNAME = "agentrl_vllm_worker.AgentRLWorkerExtension"
"""``--worker-extension-cls`` for a server whose ``PYTHONPATH`` holds this file as ``agentrl_vllm_worker``
(what :func:`agentrl.policies.vllm_server.server_command` sets up)."""


def checksum(named_tensors: Iterable[tuple[str, Any]]) -> str:
    """SHA-256 over ``(name, tensor)`` pairs: the digest of :func:`agentrl.weights.weights_checksum`."""
    import torch

    h = hashlib.sha256()
    for name, t in sorted(named_tensors, key=lambda kv: kv[0]):
        cpu = t.detach().to("cpu").contiguous()
        h.update(f"{name}\0{cpu.dtype}\0{tuple(cpu.shape)}\0".encode())
        h.update(cpu.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class AgentRLWorkerExtension:
    """Mixed into vLLM's worker class by vLLM; ``self`` is the worker (``model_runner``, ``model_config``)."""

    _agentrl_checksum: str | None = None

    def agentrl_load_weights(self, path: str) -> str:
        """Load the safetensors file at ``path`` into the model in place; return the checksum of what was
        loaded (learner-side names, the engine's dtype)."""
        from safetensors.torch import load_file

        worker: Any = self
        dtype = worker.model_runner.model_config.dtype
        tensors = {name: t.to(dtype) for name, t in load_file(path, device="cpu").items()}
        digest = checksum(tensors.items())
        # Cleared first so that a load that fails half-way never reports the old weights' checksum.
        self._agentrl_checksum = None
        worker.reload_weights(weights_iterator=iter(list(tensors.items())))
        self._agentrl_checksum = digest
        return digest

    def agentrl_weights_checksum(self) -> str:
        """The checksum of the last weights loaded through :meth:`agentrl_load_weights` ("" before any:
        the engine still serves the folder it started from)."""
        return self._agentrl_checksum or ""
