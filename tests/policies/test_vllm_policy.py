"""VLLMPolicy: only on GPU machines with vllm installed (skipped elsewhere, with the reason)."""

from __future__ import annotations

import importlib.util

import pytest

from agentrl.protocols import Policy, Sampling

pytestmark = pytest.mark.gpu


def test_import_is_lazy():
    import agentrl.policies as policies

    assert "VLLMPolicy" in policies.__all__
    from agentrl.policies.vllm import VLLMPolicy  # importing the module must not import vllm

    assert VLLMPolicy.__name__ == "VLLMPolicy"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed (GPU only)")
async def test_generate_and_logprobs_on_gpu(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from agentrl.audit import recompute_logprobs
    from agentrl.chat import ChatRenderer
    from agentrl.models import load_model, load_tokenizer, smollm2_dir
    from agentrl.policies import VLLMPolicy

    path = smollm2_dir()
    tok = load_tokenizer(path)
    r = ChatRenderer(tok)
    policy = VLLMPolicy(
        str(path), stop_token_ids=r.stop_token_ids, gpu_memory_utilization=0.3, dtype="float32"
    )
    assert isinstance(policy, Policy)
    prompt = r.render_prompt([__import__("agentrl").Message("user", "What is 2+3?")]).token_ids
    g = await policy.generate(prompt, Sampling(max_new_tokens=16, temperature=0.8))
    ref = recompute_logprobs(load_model(path, "float32", "cuda"), [*prompt, *g.token_ids], temperature=0.8)
    assert max(abs(a - b) for a, b in zip(ref[len(prompt) :], g.logprobs, strict=True)) < 5e-2
