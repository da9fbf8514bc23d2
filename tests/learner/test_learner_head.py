"""The LM head's hand-written backward (agentrl.learner.head) against autograd's checkpointed chunks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from agentrl.learner import forward_logprobs
from agentrl.learner.head import fused_head_of

from .tiny import VOCAB, tiny_llama, tiny_qwen2


def _inputs(seed: int, B: int = 3, T: int = 17) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (B, T), generator=g)
    attn = torch.ones(B, T, dtype=torch.long)
    attn[1, 11:] = 0
    attn[2, 5:] = 0
    mask = (torch.rand(B, T, generator=g) > 0.3).long()
    return ids, attn, mask


def _run(model: nn.Module, fused: bool, seed: int, **kw: object) -> tuple[object, dict[str, torch.Tensor]]:
    ids, attn, mask = _inputs(seed)
    g = torch.Generator().manual_seed(seed + 1)
    w_lp = torch.randn(ids.shape, generator=g)
    w_ent = torch.randn(ids.shape, generator=g)
    model.zero_grad(set_to_none=True)
    out = forward_logprobs(model, ids, attn, token_mask_B_T=mask, fused_head=fused, **kw)  # type: ignore[arg-type]
    loss = (out.logprobs_B_T * w_lp).sum()
    if out.entropy_B_T is not None and out.entropy_B_T.requires_grad:
        loss = loss + (out.entropy_B_T * w_ent).sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2])
@pytest.mark.parametrize(
    ("temperature", "entropy_grad", "spi2", "chunk"),
    [(1.0, False, False, 4), (0.7, True, True, 5), (1.0, True, False, 1), (1.3, False, True, 4096)],
)
def test_fused_head_same_values_and_gradients(make, temperature, entropy_grad, spi2, chunk):
    """Values to the bit, every parameter's gradient (the tied embedding's included) to fp32 rounding."""
    model = make()
    kw = dict(
        chunk_size=chunk,
        temperature=temperature,
        with_entropy=True,
        entropy_grad=entropy_grad,
        with_sum_pi_squared=spi2,
    )
    ref, want = _run(model, False, 3, **kw)
    got, have = _run(model, True, 3, **kw)
    assert torch.equal(got.logprobs_B_T, ref.logprobs_B_T)  # type: ignore[attr-defined]
    assert torch.equal(got.entropy_B_T, ref.entropy_B_T)  # type: ignore[attr-defined]
    if spi2:
        assert torch.equal(got.sum_pi_squared_B_T, ref.sum_pi_squared_B_T)  # type: ignore[attr-defined]
        assert not got.sum_pi_squared_B_T.requires_grad  # type: ignore[attr-defined]
    assert got.entropy_B_T.requires_grad is entropy_grad  # type: ignore[attr-defined]
    assert want.keys() == have.keys()
    for n, g in want.items():
        scale = float(g.abs().max()) or 1.0
        assert float((have[n] - g).abs().max()) <= 2e-5 * scale, n


def test_fused_head_is_used_and_differs_from_no_op():
    """The fused path runs (its backward node is in the graph) and moves the head's gradient."""
    model = tiny_llama()
    ids, attn, mask = _inputs(7)
    out = forward_logprobs(model, ids, attn, token_mask_B_T=mask, chunk_size=4)
    names, seen = set(), set()
    todo = [out.logprobs_B_T.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        names.add(type(fn).__name__)
        todo += [f for f, _ in fn.next_functions]
    assert "_HeadLogprobsBackward" in names and "CheckpointFunctionBackward" not in names
    out.logprobs_B_T.sum().backward()
    assert float(model.lm_head.weight.grad.abs().sum()) > 0


def test_fused_head_with_a_bias_and_a_frozen_weight():
    model = tiny_llama()
    model.lm_head = nn.Linear(64, VOCAB, bias=True)
    torch.nn.init.normal_(model.lm_head.bias)
    ref, want = _run(model, False, 11, chunk_size=3)
    got, have = _run(model, True, 11, chunk_size=3)
    assert torch.equal(got.logprobs_B_T, ref.logprobs_B_T)  # type: ignore[attr-defined]
    for n, g in want.items():
        assert torch.allclose(have[n], g, rtol=1e-5, atol=1e-6), n
    model.lm_head.weight.requires_grad_(False)  # a frozen head (LoRA on the decoder): no weight gradient
    _, have = _run(model, True, 11, chunk_size=3)
    assert "lm_head.weight" not in have and "lm_head.bias" in have


def test_fused_head_declines_what_it_cannot_compute_exactly():
    model = tiny_llama()
    h = torch.zeros(2, 64)
    assert fused_head_of(model, model.lm_head, h) is model.lm_head
    assert fused_head_of(model, model.lm_head, h.double()) is None  # dtype of the head differs
    handle = model.lm_head.register_forward_hook(lambda *_: None)
    assert fused_head_of(model, model.lm_head, h) is None
    handle.remove()
    model.config.final_logit_softcapping = 30.0
    assert fused_head_of(model, model.lm_head, h) is None
    model.config.final_logit_softcapping = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fused_head_of(model, model.lm_head, h) is None
    assert fused_head_of(model, nn.Sequential(model.lm_head), h) is None


@pytest.mark.parametrize("saved", [4, 8, 10_000])
def test_fused_head_saved_chunks_same_values_and_gradients(saved):
    """Chunks that keep their softmax for backward: the values of the recomputing path to the bit, and its
    gradients (to fp32 rounding); with a differentiable entropy nothing is kept (every chunk is rerun)."""
    model = tiny_qwen2()
    for entropy_grad in (False, True):
        kw = dict(chunk_size=4, with_entropy=True, entropy_grad=entropy_grad, temperature=0.9)
        ref, want = _run(model, True, 5, **kw)
        got, have = _run(model, True, 5, saved_tokens=saved, **kw)
        assert torch.equal(got.logprobs_B_T, ref.logprobs_B_T)  # type: ignore[attr-defined]
        assert torch.equal(got.entropy_B_T, ref.entropy_B_T)  # type: ignore[attr-defined]
        for n, g in want.items():
            scale = float(g.abs().max()) or 1.0
            assert float((have[n] - g).abs().max()) <= 2e-5 * scale, n
