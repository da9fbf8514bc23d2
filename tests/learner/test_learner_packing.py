"""Sequence packing: the layout by hand, the planner's invariants, and packed == padded to fp tolerance for
log-probs, Σπ², entropy, the loss statistics and the gradients (Llama- and Qwen2-shaped models)."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from agentrl import models
from agentrl.batch import TokenBatch, pack_rows
from agentrl.errors import ConfigError
from agentrl.learner import Learner, LearnerConfig
from agentrl.learner.forward import forward_logprobs, packing_support
from agentrl.learner.learner import plan_micro_batches, plan_packed_micro_batches

from .tiny import VOCAB, tiny_llama, tiny_qwen2


def ragged_batch(lengths: list[int], seed: int = 0, vocab: int = VOCAB) -> TokenBatch:
    """Random tokens, right-padded with 7 (not 0, so padding ids cannot hide a layout bug); the loss mask
    covers a random 70 % of each row after its first token."""
    g = torch.Generator().manual_seed(seed)
    B, T = len(lengths), max(lengths)
    lens = torch.tensor(lengths)
    attn = (torch.arange(T)[None] < lens[:, None]).long()
    ids = torch.where(attn != 0, torch.randint(vocab, (B, T), generator=g), torch.full((B, T), 7))
    mask = (torch.rand(B, T, generator=g) < 0.7).float() * attn
    mask[:, 0] = 0
    old = -torch.rand(B, T, generator=g) * 3 * mask
    return TokenBatch(ids, attn, mask, old, torch.zeros(B, T), tuple(str(i // 2) for i in range(B)), lens)


def test_pack_rows_layout_by_hand():
    """Rows [1 2 3] and [4 5] and [6 7 8 9]; packed rows: (row 2, row 1) and (row 0)."""
    ids = torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0], [6, 7, 8, 9]])
    lengths = torch.tensor([3, 2, 4])
    attn = (torch.arange(4)[None] < lengths[:, None]).long()
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0], [0, 0, 1, 1]], dtype=torch.float32)
    b = TokenBatch(ids, attn, mask, -mask * 0.5, torch.zeros(3, 4), ("a", "a", "b"), lengths)
    p = pack_rows(b, [[2, 1], [0]])
    assert p.input_ids_B_T.tolist() == [[6, 7, 8, 9, 4, 5], [1, 2, 3, 0, 0, 0]]
    assert p.position_ids_B_T.tolist() == [[0, 1, 2, 3, 0, 1], [0, 1, 2, 0, 1, 2]]
    assert p.attention_mask_B_T.tolist() == [[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]]
    assert p.loss_mask_B_T.tolist() == [[0, 0, 1, 1, 0, 1], [0, 1, 1, 0, 0, 0]]
    assert p.source_B_T.tolist() == [[8, 9, 10, 11, 4, 5], [0, 1, 2, -1, -1, -1]]
    assert p.rows == (2, 1, 0) and p.num_tokens == 12
    assert torch.equal(p.gather(b.old_logprobs_B_T), -p.loss_mask_B_T * 0.5)
    out = torch.full((3, 4), -9.0)
    p.scatter(p.gather(b.loss_mask_B_T) + 1, out)
    assert out.tolist() == [[1, 2, 2, -9], [1, 2, -9, -9], [1, 1, 2, 2]]
    with pytest.raises(ConfigError, match="at least one"):
        pack_rows(b, [[0], []])


@pytest.mark.parametrize("budget", [None, 1, 16, 40, 100, 4096])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_packed_plan_covers_every_row_once_within_the_budget(budget, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 60, (37,), generator=g).tolist()
    plans = plan_packed_micro_batches(lengths, budget, row_tokens=64)
    flat = sorted(i for mb in plans for row in mb for i in row)
    assert flat == list(range(len(lengths)))
    cap = 64 if budget is None else min(budget, 64)
    for mb in plans:
        fills = [sum(lengths[i] for i in row) for row in mb]
        # A packed row holds one sequence longer than the cap, or sequences fitting the cap together.
        assert all(f <= cap or len(row) == 1 for f, row in zip(fills, mb, strict=True))
        if budget is not None and len(mb) > 1:
            assert len(mb) * max(fills) <= budget
    if budget is None:
        assert len(plans) == 1


def test_packed_plan_pads_little_on_the_issue_batch():
    """32 rows of 256–4096 tokens in the micro-batches an H100 / H200 gets (17 k / 34 k tokens): the padding
    after the packed rows' ends averages < 5 % (right-padded micro-batches: ~15 %), and packed rows are no
    longer than the longest sequence (so attention costs no more per token than with padded rows)."""
    pads, padded_pads = [], []
    for seed in range(10):
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(256, 4097, (32,), generator=g).tolist()
        for budget in (17408, 33792):
            plans = plan_packed_micro_batches(lengths, budget)
            fills = [[sum(lengths[i] for i in row) for row in mb] for mb in plans]
            assert max(max(f) for f in fills) <= max(lengths)
            padded = sum(len(f) * max(f) for f in fills)
            assert all(len(f) * max(f) <= budget for f in fills)
            pads.append(1 - sum(lengths) / padded)
            rows = plan_micro_batches(lengths, budget)
            padded_pads.append(1 - sum(lengths) / sum(len(mb) * max(lengths[i] for i in mb) for mb in rows))
    assert sum(pads) / len(pads) < 0.05 and max(pads) < 0.1
    assert sum(padded_pads) / len(padded_pads) > 0.1


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2], ids=["llama", "qwen2"])
def test_forward_packed_equals_padded(make):
    model = make()
    b = ragged_batch([13, 5, 30, 22, 1, 9, 17])
    assert packing_support(model) is None
    p = pack_rows(b, [[2, 4, 1], [3, 0], [6, 5]])
    kw = dict(chunk_size=5, with_entropy=True, temperature=0.8)
    with torch.no_grad():
        pad = forward_logprobs(model, b.input_ids_B_T, b.attention_mask_B_T, **kw)  # type: ignore[arg-type]
        got = forward_logprobs(
            model, p.input_ids_B_T, p.attention_mask_B_T, position_ids_B_T=p.position_ids_B_T, **kw
        )  # type: ignore[arg-type]
    for name in ("logprobs_B_T", "sum_pi_squared_B_T", "entropy_B_T"):
        want, have = getattr(pad, name), getattr(got, name)
        back = torch.zeros_like(want)
        p.scatter(have, back)
        assert (back - want).abs().max() < 2e-5, name
    # Sequence starts inside a packed row are not scored (nothing predicts them).
    assert float(got.logprobs_B_T[0, 30]) == 0.0 and float(got.logprobs_B_T[0, 31]) == 0.0


def _learners(model, **cfg):
    out = []
    for pack in (False, True):
        m = copy.deepcopy(model)
        opt = torch.optim.SGD(m.parameters(), lr=1.0)
        out.append(Learner(m, LearnerConfig(pack_sequences=pack, max_grad_norm=None, **cfg), optimizer=opt))
    return out


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2], ids=["llama", "qwen2"])
@pytest.mark.parametrize(
    "cfg",
    [
        dict(micro_batch_tokens=48, chunk_size=7),
        dict(micro_batch_tokens=None, chunk_size=64, loss_agg="seq-mean-token-mean", entropy_coef=0.05),
        dict(micro_batch_tokens=20, chunk_size=3, policy_loss="reinforce", loss_agg="seq-mean-token-sum"),
    ],
    ids=["token-mean", "whole-batch", "long-rows-recomputed"],
)
def test_learner_packed_equals_padded(make, cfg):
    """Scores, step statistics and the gradient (SGD at lr 1 makes the update the gradient) agree."""
    model = make()
    b = ragged_batch([13, 5, 30, 22, 1, 9, 17, 26], seed=3)
    adv = torch.randn(b.input_ids_B_T.shape, generator=torch.Generator().manual_seed(4))
    padded, packed = _learners(model, **cfg)
    (lp0, sp0), (lp1, sp1) = padded.score(b), packed.score(b)
    assert (lp1 - lp0).abs().max() < 2e-5 and (sp1 - sp0).abs().max() < 2e-6
    assert torch.equal(lp1 == 0, lp0 == 0)
    s0, s1 = padded.step(b, adv), packed.step(b, adv)
    for f in ("loss", "pg_loss", "entropy", "clip_frac", "approx_kl", "ratio_max", "grad_norm"):
        assert getattr(s1, f) == pytest.approx(getattr(s0, f), rel=1e-4, abs=1e-6), f
    assert (s1.tokens, s1.sequences) == (s0.tokens, s0.sequences)
    if cfg["micro_batch_tokens"] is not None:
        assert s1.micro_batches < s0.micro_batches  # no padding: fewer passes for the same budget
    for p0, p1 in zip(padded.model.parameters(), packed.model.parameters(), strict=True):
        assert (p1 - p0).abs().max() < 1e-5


def test_learner_packed_kl_to_reference_equals_padded():
    model = tiny_qwen2(seed=1)
    ref = tiny_qwen2(seed=2)
    b = ragged_batch([11, 19, 4, 25], seed=5)
    adv = torch.randn(b.input_ids_B_T.shape, generator=torch.Generator().manual_seed(6))
    stats = []
    for pack in (False, True):
        cfg = LearnerConfig(pack_sequences=pack, kl_coef=0.3, micro_batch_tokens=32, chunk_size=8)
        learner = Learner(copy.deepcopy(model), cfg, ref_model=ref)
        stats.append(learner.step(b, adv))
    assert stats[1].kl == pytest.approx(stats[0].kl, rel=1e-4)
    assert stats[1].loss == pytest.approx(stats[0].loss, rel=1e-4)


def test_agentrl_tiny_model_packs(tok):
    """The tiny model the trainer tests use (SmolLM2's vocabulary) takes packed rows."""
    model = models.tiny_model(tok, seed=0, arch="qwen2")
    assert packing_support(model) is None
    b = ragged_batch([9, 14, 3], seed=7, vocab=len(tok))
    padded, packed = _learners(model, micro_batch_tokens=64, chunk_size=16)
    (lp0, sp0), (lp1, sp1) = padded.score(b), packed.score(b)
    assert (lp1 - lp0).abs().max() < 2e-5 and (sp1 - sp0).abs().max() < 2e-6


class _LeakyLlama(type(tiny_llama())):  # type: ignore[misc]
    """Takes position ids but drops them: a packed row would be one long sequence (the probe must see it)."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, **kw):  # type: ignore[override]
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, **kw)


def test_models_that_cannot_pack_fall_back_to_padding(caplog):
    leaky = _LeakyLlama(tiny_llama().config)
    why = packing_support(leaky)
    assert why is not None and "differ" in why
    eager = tiny_llama()
    eager.config._attn_implementation = "made-up"
    assert "attention implementation" in str(packing_support(eager))
    b = ragged_batch([6, 10, 4], seed=8)
    with caplog.at_level(logging.WARNING, logger="agentrl.learner.learner"):
        lp, _ = Learner(leaky, LearnerConfig(micro_batch_tokens=32)).score(b)
    assert "pads rows instead of packing" in caplog.text
    with torch.no_grad():
        want = forward_logprobs(
            leaky,
            b.input_ids_B_T,
            b.attention_mask_B_T,
            with_sum_pi_squared=False,
            token_mask_B_T=b.loss_mask_B_T,
        )
    assert (lp - want.logprobs_B_T).abs().max() < 2e-5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_learner_packed_equals_padded_on_cuda(autocast):
    """SDPA on CUDA (and the machine's transformers) detects the packed sequences: packed == padded."""
    model = tiny_qwen2().cuda()
    assert packing_support(model) is None
    b = ragged_batch([13, 5, 30, 22, 1, 9, 17, 26], seed=3).to("cuda")
    adv = torch.randn(b.input_ids_B_T.shape, generator=torch.Generator().manual_seed(4)).cuda()
    padded, packed = _learners(model, micro_batch_tokens=48, chunk_size=7, bf16_autocast=autocast)
    (lp0, _), (lp1, _) = padded.score(b), packed.score(b)
    tol = 0.05 if autocast else 1e-4
    assert (lp1 - lp0).abs().max() < tol
    s0, s1 = padded.step(b, adv), packed.step(b, adv)
    assert s1.loss == pytest.approx(s0.loss, rel=tol, abs=tol)
    assert s1.grad_norm == pytest.approx(s0.grad_norm, rel=0.05 if autocast else 1e-3)
