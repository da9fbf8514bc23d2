"""forward_logprobs: equals a naive full log_softmax gather, chunked, with gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from agentrl.errors import ConfigError
from agentrl.learner import forward_logprobs

from .tiny import VOCAB, naive_logprobs, tiny_llama, tiny_qwen2


def inputs(seed=0, B=3, T=13):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (B, T), generator=g)
    attn = torch.ones(B, T, dtype=torch.long)
    attn[1, 9:] = 0
    attn[2, 4:] = 0
    return ids, attn


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2])
@pytest.mark.parametrize("chunk", [1, 5, 4096])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_equals_naive_fp64(make, chunk, temperature):
    model = make(dtype=torch.float64)
    ids, attn = inputs()
    with torch.no_grad():
        out = forward_logprobs(model, ids, attn, temperature=temperature, chunk_size=chunk, with_entropy=True)
        lp, sp, ent = naive_logprobs(model, ids, attn, temperature)
    assert out.logprobs_B_T.dtype == torch.float64
    assert (out.logprobs_B_T - lp).abs().max() < 1e-10
    assert (out.sum_pi_squared_B_T - sp).abs().max() < 1e-12
    assert (out.entropy_B_T - ent).abs().max() < 1e-10
    assert (out.logprobs_B_T[:, 0] == 0).all()


def test_token_mask_limits_positions_and_fp32_output():
    model = tiny_llama()
    ids, attn = inputs(1)
    tm = torch.zeros_like(attn)
    tm[:, 6:] = 1
    with torch.no_grad():
        out = forward_logprobs(model, ids, attn, token_mask_B_T=tm, chunk_size=3)
        lp, sp, _ = naive_logprobs(model, ids, attn)
    keep = (tm != 0) & (attn != 0)
    assert out.logprobs_B_T.dtype == torch.float32
    assert (out.logprobs_B_T[~keep] == 0).all()
    assert torch.allclose(out.logprobs_B_T[keep].double(), lp[keep], atol=1e-5)
    assert torch.allclose(out.sum_pi_squared_B_T[keep].double(), sp[keep], atol=1e-6)
    assert out.entropy_B_T is None


def test_gradients_equal_naive():
    model = tiny_llama(dtype=torch.float64)
    ids, attn = inputs(2)
    weights = torch.randn(ids.shape, dtype=torch.float64)
    out = forward_logprobs(model, ids, attn, chunk_size=4, with_sum_pi_squared=False, with_entropy=True)
    (out.logprobs_B_T * weights + 0.1 * out.entropy_B_T).sum().backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    lp, _, ent = naive_logprobs(model, ids, attn)
    (lp * weights + 0.1 * ent).sum().backward()
    for n, p in model.named_parameters():
        assert torch.allclose(got[n], p.grad, atol=1e-10), n


@pytest.mark.parametrize("saved", [0, 4, 8, 10_000])
def test_saved_chunks_give_the_checkpointed_values_and_gradients(saved):
    """Chunks kept for backward (``saved_tokens``) instead of checkpointed: the same values and gradients."""
    model = tiny_llama(dtype=torch.float64)
    ids, attn = inputs(4)
    weights = torch.randn(ids.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    lp, _, ent = naive_logprobs(model, ids, attn)
    (lp * weights + 0.1 * ent).sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    out = forward_logprobs(model, ids, attn, chunk_size=4, with_entropy=True, saved_tokens=saved)
    assert (out.logprobs_B_T - lp).abs().max() < 1e-10
    assert out.entropy_B_T is not None and (out.entropy_B_T - ent).abs().max() < 1e-10
    (out.logprobs_B_T * weights + 0.1 * out.entropy_B_T).sum().backward()
    for n, p in model.named_parameters():
        assert torch.allclose(want[n], p.grad, atol=1e-10), n


@pytest.mark.parametrize("saved", [0, 10_000])
def test_entropy_as_a_metric_is_detached_with_the_same_values(saved):
    model = tiny_llama(dtype=torch.float64)
    ids, attn = inputs(5)
    with torch.no_grad():
        _, sp, ent = naive_logprobs(model, ids, attn)
    out = forward_logprobs(
        model, ids, attn, chunk_size=4, with_entropy=True, entropy_grad=False, saved_tokens=saved
    )
    assert out.entropy_B_T is not None and not out.entropy_B_T.requires_grad
    assert out.logprobs_B_T.requires_grad
    assert (out.entropy_B_T - ent).abs().max() < 1e-10
    assert (out.sum_pi_squared_B_T - sp).abs().max() < 1e-12
    (out.logprobs_B_T.sum()).backward()  # the log-probs still carry the gradient
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


class LogitsOnly(nn.Module):
    """A non-HF model that returns a logits tensor directly."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(VOCAB, 16)
        self.out = nn.Linear(16, VOCAB)

    def forward(self, input_ids, attention_mask=None):
        return self.out(torch.cumsum(self.emb(input_ids), dim=1))


def test_plain_module_returning_logits():
    model = LogitsOnly().double()
    ids, attn = inputs(3)
    with torch.no_grad():
        out = forward_logprobs(model, ids, attn, chunk_size=2)
        ls = torch.log_softmax(model(ids), -1)
    want = torch.zeros(ids.shape, dtype=torch.float64)
    want[:, 1:] = ls[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1) * attn[:, 1:]
    assert (out.logprobs_B_T - want).abs().max() < 1e-12


def test_bad_arguments():
    model = tiny_llama()
    ids, attn = inputs()
    with pytest.raises(ConfigError):
        forward_logprobs(model, ids, attn[:, :3])
    with pytest.raises(ConfigError):
        forward_logprobs(model, ids, attn, temperature=0.0)
    with pytest.raises(ConfigError):
        forward_logprobs(model, ids, attn, chunk_size=0)
    with pytest.raises(ConfigError):
        forward_logprobs(model, ids, attn, saved_tokens=-1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16_autocast_close_to_cpu_fp32():
    model = tiny_llama()
    ids, attn = inputs()
    with torch.no_grad():
        cpu = forward_logprobs(model, ids, attn, chunk_size=4)
        model = model.cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            gpu = forward_logprobs(model, ids.cuda(), attn.cuda(), chunk_size=4)
    assert gpu.logprobs_B_T.dtype == torch.float32
    assert torch.allclose(gpu.logprobs_B_T.cpu(), cpu.logprobs_B_T, atol=0.1)
    assert torch.allclose(gpu.sum_pi_squared_B_T.cpu(), cpu.sum_pi_squared_B_T, atol=0.02)
