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

LoRA runs (``enable_lora``) load adapters through vLLM's own LoRA path instead (``add_lora`` in process,
``/v1/load_lora_adapter`` on a server). :meth:`AgentRLWorkerExtension.agentrl_lora_checksums` then reports,
for every adapter the worker holds, :func:`checksum` of its tensors as vLLM keeps them
(:func:`lora_engine_form` names them, for both sides): the caller compares it with the same digest of the
learner's adapter, so an adapter that never reached the worker, or reached it with other values, is caught.

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

__all__ = ["QUALNAME", "AgentRLWorkerExtension", "checksum", "lora_engine_form"]

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


def lora_engine_form(named_tensors: Iterable[tuple[str, Any]], scaling: float, dtype: Any) -> dict[str, Any]:
    """A peft adapter's tensors as a vLLM worker holds them after loading: ``<module>.lora_A`` (rank × in)
    and ``<module>.lora_B`` (out × rank) per adapted module, in the engine's ``dtype``, with ``lora_B``
    multiplied in place by ``scaling`` (alpha / rank), which is what vLLM's ``LoRALayerWeights.optimize``
    does when it registers an adapter. ``named_tensors`` are named as in the learner's ``state_dict()``
    (``model.layers.0.self_attn.q_proj.lora_A.default.weight``) or as in peft's file
    (``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``)."""
    out: dict[str, Any] = {}
    for name, t in named_tensors:
        for part in (".lora_A.", ".lora_B."):
            if part in name:
                module = name.split(part)[0].removeprefix("base_model.model.")
                x = t.detach().to("cpu").to(dtype).clone()
                if part == ".lora_B.":
                    x *= scaling  # the same float op as vLLM's, so the bytes agree exactly
                out[module + part.rstrip(".")] = x
    return out


def _served_form(lora_model: Any, packed: dict[str, list[str]]) -> dict[str, Any]:
    """The tensors of a registered vLLM ``LoRAModel``, named as :func:`lora_engine_form` names them: a fused
    module (``qkv_proj``, ``gate_up_proj``) holds one A and B per original module, in ``packed``'s order."""
    out: dict[str, Any] = {}
    for module, weights in lora_model.loras.items():
        if isinstance(weights.lora_a, list):
            for sub, a, b in zip(packed[module], weights.lora_a, weights.lora_b, strict=True):
                if a is not None:
                    out[sub + ".lora_A"], out[sub + ".lora_B"] = a, b
        else:
            out[module + ".lora_A"], out[module + ".lora_B"] = weights.lora_a, weights.lora_b
    return out


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

    def agentrl_lora_checksums(self) -> str:
        """JSON ``{lora id: checksum}`` of every LoRA adapter this worker holds (registered in its LoRA
        cache), over :func:`lora_engine_form`'s names; ``{}`` when it holds none."""
        import json

        worker: Any = self
        manager = worker.model_runner.lora_manager._adapter_manager
        held = manager.list_adapters()
        return json.dumps(
            {str(i): checksum(_served_form(m, manager.packed_modules).items()) for i, m in held.items()}
        )

    def agentrl_remove_lora(self, lora_id: str) -> str:
        """Drop adapter ``lora_id`` from this worker's LoRA cache (``vllm serve``'s unload route only forgets
        the name; the worker would keep the tensors until its cache evicts them)."""
        worker: Any = self
        return str(bool(worker.remove_lora(int(lora_id))))
