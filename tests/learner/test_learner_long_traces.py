"""Packed rows never attend across documents (every attention path that runs on CPU), and one long trace
trains through the chunked LM head with checkpointing: its log-probs are those of the documents scored on
their own, masked by the loss mask, and its gradients those of the unchunked, uncheckpointed computation."""

from __future__ import annotations

import pytest
import torch

from agentrl.batch import TokenBatch, pack_rows
from agentrl.learner import Learner, LearnerConfig
from agentrl.learner.attention import attention_in_effect
from agentrl.learner.forward import forward_logprobs

from .test_learner_attention import FLEX_COMPILE_WARNINGS
from .tiny import VOCAB, naive_logprobs, tiny_qwen2

DOCS = [11, 17, 9]  # A, B, C laid end to end in one packed row


def _packed(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One row holding documents A, B, C (random tokens from ``seed`` for A, fixed for B and C) and its
    per-document position ids."""
    g = torch.Generator().manual_seed(100)
    b_c = torch.randint(VOCAB, (sum(DOCS[1:]),), generator=g)
    a = torch.randint(VOCAB, (DOCS[0],), generator=torch.Generator().manual_seed(seed))
    pos = torch.cat([torch.arange(n) for n in DOCS])
    return torch.cat([a, b_c])[None], pos[None]


def _scores(model: torch.nn.Module, attention: str, seed: int) -> torch.Tensor:
    ids, pos = _packed(seed)
    with torch.no_grad(), attention_in_effect(model, attention):
        out = forward_logprobs(model, ids, torch.ones_like(ids), position_ids_B_T=pos, with_entropy=True)
    assert out.sum_pi_squared_B_T is not None and out.entropy_B_T is not None
    return torch.stack([out.logprobs_B_T[0], out.sum_pi_squared_B_T[0], out.entropy_B_T[0]])


def _assert_no_cross_document_attention(model: torch.nn.Module, attention: str) -> None:
    base, other = _scores(model, attention, seed=1), _scores(model, attention, seed=2)
    a = DOCS[0]
    assert (base[0, 1:a] - other[0, 1:a]).abs().max() > 1e-2  # A's own scores did change
    # B's and C's log-probs, Σπ² and entropy did not: no attention from them into A.
    assert (base[:, a:] - other[:, a:]).abs().max() <= 1e-6


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_changing_one_document_leaves_the_others_scores_unchanged(attention):
    _assert_no_cross_document_attention(tiny_qwen2(seed=2), attention)


@pytest.mark.slow
@pytest.mark.filterwarnings(*FLEX_COMPILE_WARNINGS)
def test_flex_attention_keeps_documents_apart_on_cpu():
    """flex_attention's forward (compiled by torch's CPU backend) with the document mask transformers builds
    from the packed position ids."""
    static = torch._dynamo.config.patch(automatic_dynamic_shapes=False)
    with static:
        _assert_no_cross_document_attention(tiny_qwen2(seed=2), "flex_attention")


def _long_model() -> torch.nn.Module:
    model = tiny_qwen2(seed=4)
    model.config.max_position_embeddings = 8192  # RoPE needs no table; the config only caps the length
    return model


def _long_batch(docs: list[int]) -> TokenBatch:
    """One row per document, right-padded; the loss mask covers alternating stretches (as tool output would
    interleave with model turns)."""
    g = torch.Generator().manual_seed(9)
    B, T = len(docs), max(docs)
    lens = torch.tensor(docs)
    attn = (torch.arange(T)[None] < lens[:, None]).long()
    ids = torch.randint(VOCAB, (B, T), generator=g) * attn
    mask = (((torch.arange(T) // 97) % 2 == 0)[None] & (attn != 0)).float()
    mask[:, 0] = 0
    return TokenBatch(ids, attn, mask, torch.zeros(B, T), torch.zeros(B, T), ("0",) * B, lens)


@pytest.mark.slow
def test_a_4k_token_trace_chunked_and_checkpointed_equals_the_plain_computation():
    """A 4,096-token trajectory (a row of its own) and two short ones (packed together), scored and stepped
    with 128-token LM-head chunks and checkpointing on: the masked log-probs equal each trajectory's
    full-logits log-probs computed alone, and the step equals one taken unchunked, unpacked and without
    checkpointing."""
    docs = [4096, 300, 200]
    batch = _long_batch(docs)
    model = _long_model()
    mask = batch.loss_mask_B_T != 0
    with torch.no_grad():
        want = torch.zeros(batch.loss_mask_B_T.shape, dtype=torch.float64)
        for i, n in enumerate(docs):  # each document alone, full [T, V] logits
            lp, _, _ = naive_logprobs(
                model, batch.input_ids_B_T[i : i + 1, :n], batch.attention_mask_B_T[i : i + 1, :n]
            )
            want[i, :n] = lp[0]
    assert pack_rows(batch, [[1, 2]]).input_ids_B_T.shape == (1, 500)

    def learner(m: torch.nn.Module, **kw: object) -> Learner:
        cfg = LearnerConfig(policy_loss="reinforce", max_grad_norm=None, **kw)  # type: ignore[arg-type]
        return Learner(m, cfg, optimizer=torch.optim.SGD(m.parameters(), lr=1.0))

    chunked = learner(model, chunk_size=128, gradient_checkpointing="on", micro_batch_tokens=sum(docs))
    assert chunked._micro(batch, model) == [[[0]], [[1, 2]]]  # the long trace alone, the others packed
    lp, _ = chunked.score(batch)
    assert (lp[~mask] == 0).all()
    assert (lp.double() - want)[mask].abs().max() < 1e-4

    adv = torch.randn(batch.loss_mask_B_T.shape, generator=torch.Generator().manual_seed(3))
    plain_model = _long_model()
    plain = learner(plain_model, chunk_size=1 << 20, gradient_checkpointing="off", pack_sequences=False)
    chunked.step(batch, adv * batch.loss_mask_B_T)
    plain.step(batch, adv * batch.loss_mask_B_T)
    for (name, p), q in zip(model.named_parameters(), plain_model.parameters(), strict=True):
        assert (p - q).abs().max() < 1e-5, name
