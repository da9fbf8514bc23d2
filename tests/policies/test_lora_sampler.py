"""The HF sampler with LoRA adapters: the packed decoding twin follows adapter updates (it re-packs the
adapter's own linears when their weights change in place), a sampler with its own copy takes the adapter
alone, and what it serves is checked by digest: a dropped adapter is caught."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from agentrl.errors import PolicyError
from agentrl.lora import LoraConfig, adapter_digest, apply_lora, published_state
from agentrl.lora_sync import served_digest
from agentrl.models import tiny_model
from agentrl.policies import HFPolicy
from agentrl.policies.packed import InferenceTwin, packed_linear_available
from agentrl.protocols import Sampling, WeightUpdate

NEVER = 49151


def _adapted(tok, seed=3):
    return apply_lora(tiny_model(tok, seed=seed), LoraConfig(rank=4, alpha=8.0), name="tiny", seed=seed).model


def _step(model: nn.Module, seed: int) -> None:
    """What an optimizer step does to the adapter: its tensors change in place."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_" in n:
                p.add_(torch.randn(p.shape, generator=g) * 0.05)


def _logits(module: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        out: torch.Tensor = module(input_ids=ids, use_cache=False).logits
        return out


@pytest.mark.skipif(not packed_linear_available(), reason="torch without MKL's packed GEMM")
def test_the_packed_twin_follows_adapter_updates(tok):
    model = _adapted(tok)
    twin = InferenceTwin(model)
    twin.refresh()
    ids = torch.randint(5, 4000, (8, 1), generator=torch.Generator().manual_seed(0))
    _step(model, 1)
    stale = _logits(twin.module, ids)
    assert not torch.allclose(stale, _logits(model, ids), atol=1e-4)  # packs of the old adapter
    assert twin.refresh() == 2 * 7 * 2  # exactly the adapter's linears (A and B of 14 layers) re-packed
    torch.testing.assert_close(_logits(twin.module, ids), _logits(model, ids), atol=2e-5, rtol=1e-5)


async def test_a_shared_model_sampler_samples_from_the_updated_adapter(tok):
    model = _adapted(tok)
    policy = HFPolicy(model, tok, stop_token_ids=[NEVER], max_batch_size=4, seed=0)
    prompt = tok.encode("What is 2+3?")
    s = Sampling(max_new_tokens=6, temperature=1.0, seed=9)
    before = await policy.generate(prompt, s)
    with policy.lock:
        _step(model, 2)
    await policy.load_weights(WeightUpdate(1, published_state(model)))  # shared tensors: only the version
    after = await policy.generate(prompt, s)
    assert after.policy_version == 1 and served_digest(policy) == adapter_digest(model)
    # The recorded log-probs are the updated adapted model's, recomputed by one forward pass.
    ids = torch.tensor([prompt + list(after.token_ids)])
    with torch.no_grad():
        ls = torch.log_softmax(model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double(), -1)
    want = ls.gather(-1, torch.tensor(after.token_ids)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(after.logprobs, dtype=torch.float64), want, atol=1e-4)
    if before.token_ids == after.token_ids:  # same tokens (same seed): their log-probs must have moved
        assert max(abs(a - b) for a, b in zip(before.logprobs, after.logprobs, strict=True)) > 1e-4


async def test_an_own_copy_sampler_takes_the_adapter_alone_and_a_dropped_one_is_caught(tok):
    learner = _adapted(tok)
    own = copy.deepcopy(learner)
    policy = HFPolicy(own, tok, stop_token_ids=[NEVER], max_batch_size=4, seed=0)
    base_ptrs = {k: v.data_ptr() for k, v in own.state_dict().items() if ".lora_" not in k}
    _step(learner, 3)
    update = published_state(learner)
    assert update and all(".lora_" in k for k in update)
    await policy.load_weights(WeightUpdate(1, update))
    assert served_digest(policy) == adapter_digest(learner)
    assert {k: v.data_ptr() for k, v in own.state_dict().items() if ".lora_" not in k} == base_ptrs
    _step(learner, 4)
    policy.set_version(2)  # the version bumped, the adapter never delivered
    assert served_digest(policy) != adapter_digest(learner)
    bare = HFPolicy(tiny_model(tok, seed=3), tok, stop_token_ids=[NEVER])
    with pytest.raises(PolicyError, match="no LoRA adapter"):
        served_digest(bare)
