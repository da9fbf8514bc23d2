"""Policy backends behind :class:`agentrl.protocols.Policy` (token ids in, token ids + log-probs out).

* :class:`HFPolicy` — transformers on CPU or GPU (the default), served by :class:`GenerationEngine`:
  continuous batching across concurrent episodes, KV reuse across turns and the members of a group.
* :class:`OpenAIPolicy` — any OpenAI-compatible completions server (vLLM ``serve``, SGLang...).
* :class:`VLLMPolicy` — in-process vLLM (``pip install agentrl[vllm]``; GPU machines; imported lazily).

Imported lazily so ``import agentrl.policies`` does not load torch, openai or vllm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl.policies.engine import GenerationEngine
    from agentrl.policies.hf import HFPolicy
    from agentrl.policies.openai import OpenAIPolicy
    from agentrl.policies.vllm import VLLMPolicy

__all__ = ["GenerationEngine", "HFPolicy", "OpenAIPolicy", "VLLMPolicy"]

_WHERE = {
    "GenerationEngine": "agentrl.policies.engine",
    "HFPolicy": "agentrl.policies.hf",
    "OpenAIPolicy": "agentrl.policies.openai",
    "VLLMPolicy": "agentrl.policies.vllm",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'agentrl.policies' has no attribute {name!r}")
