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


class _FakeEngine:
    """Stands in for vLLM's async engine (vLLM does not install on CPU machines): runs the RPC on one fake
    worker so the policy's glue around it (versions, errors) is checked here."""

    def __init__(self, fail: bool = False):
        self.loaded: list[list[tuple[str, object]]] = []
        self.fail, self.resets = fail, 0
        model = type("Model", (), {"load_weights": lambda _self, weights: self.loaded.append(list(weights))})
        runner = type("Runner", (), {"model": model()})
        self.worker = type("Worker", (), {"model_runner": runner()})()

    async def collective_rpc(self, fn):
        if self.fail:
            raise RuntimeError("worker died")
        return [fn(self.worker)]

    async def reset_prefix_cache(self):
        self.resets += 1


def _policy(engine: _FakeEngine, version: int = 0):
    from agentrl.policies.vllm import VLLMPolicy

    policy = object.__new__(VLLMPolicy)  # no engine start-up: the constructor needs vllm
    policy.engine, policy.stop_token_ids, policy._version = engine, (2,), version
    return policy


async def test_load_weights_pushes_every_tensor_then_takes_the_version():
    from agentrl.errors import ConfigError
    from agentrl.protocols import UpdatablePolicy, WeightUpdate

    engine = _FakeEngine()
    policy = _policy(engine, version=1)
    assert isinstance(policy, UpdatablePolicy)
    await policy.load_weights(WeightUpdate(2, {"a": 1, "b": 2}))
    assert engine.loaded == [[("a", 1), ("b", 2)]] and engine.resets == 1 and policy.version == 2
    with pytest.raises(ConfigError, match="stale"):
        await policy.load_weights(WeightUpdate(1, {"a": 1}))
    assert len(engine.loaded) == 1


async def test_a_failed_weight_push_is_a_policy_error_and_keeps_the_old_version():
    from agentrl.errors import PolicyError
    from agentrl.protocols import WeightUpdate

    policy = _policy(_FakeEngine(fail=True), version=3)
    with pytest.raises(PolicyError, match="worker died"):
        await policy.load_weights(WeightUpdate(4, {"a": 1}))
    assert policy.version == 3
