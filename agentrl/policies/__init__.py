"""Policy backends behind :class:`agentrl.protocols.Policy` (token ids in, token ids + log-probs out).

* :class:`HFPolicy` — transformers on CPU or GPU (the default), served by :class:`GenerationEngine`:
  continuous batching across concurrent episodes, KV reuse across turns and the members of a group.
* :class:`OpenAIPolicy` — any OpenAI-compatible completions server (vLLM ``serve``, SGLang...).
* :class:`VLLMPolicy` — vLLM's engine in this process (``pip install agentrl[vllm]``; imported lazily).
* :class:`VLLMServerPolicy` — a ``vllm serve`` process, token in and token out, with weight updates
  (docs/vllm.md).

Imported lazily so ``import agentrl.policies`` does not load torch, openai or vllm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentrl._lazy import load

if TYPE_CHECKING:
    from agentrl.policies.engine import GenerationEngine
    from agentrl.policies.hf import HFPolicy
    from agentrl.policies.openai import OpenAIPolicy
    from agentrl.policies.vllm import VLLMPolicy
    from agentrl.policies.vllm_server import VLLMServerPolicy

__all__ = ["GenerationEngine", "HFPolicy", "OpenAIPolicy", "VLLMPolicy", "VLLMServerPolicy"]

_WHERE = {
    "GenerationEngine": "agentrl.policies.engine",
    "HFPolicy": "agentrl.policies.hf",
    "OpenAIPolicy": "agentrl.policies.openai",
    "VLLMPolicy": "agentrl.policies.vllm",
    "VLLMServerPolicy": "agentrl.policies.vllm_server",
}


def __getattr__(name: str) -> Any:
    return load(__name__, _WHERE, name)
