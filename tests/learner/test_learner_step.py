"""Learner: score, one policy-gradient step, losses by hand, micro-batching, options."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from agentrl.batch import TokenBatch
from agentrl.errors import ConfigError
from agentrl.learner import Learner, LearnerConfig, plan_micro_batches, policy_loss

from .tiny import naive_logprobs, tiny_llama


def make_batch(old_shift=0.0):
    """4 rows: prompt tokens then model tokens, one row with a tool span in the middle, ragged lengths."""
    ids = torch.tensor(
        [
            [11, 12, 13, 21, 22, 23, 0, 0],
            [14, 15, 31, 32, 99, 98, 33, 34],
            [16, 41, 42, 0, 0, 0, 0, 0],
            [17, 18, 51, 52, 53, 0, 0, 0],
        ]
    )
    lengths = torch.tensor([6, 8, 3, 5])
    attn = (torch.arange(8)[None] < lengths[:, None]).long()
    mask = torch.tensor(
        [
            [0, 0, 0, 1, 1, 1, 0, 0],
            [0, 0, 1, 1, 0, 0, 1, 1],
            [0, 1, 1, 0, 0, 0, 0, 0],
            [0, 0, 1, 1, 1, 0, 0, 0],
        ],
        dtype=torch.float32,
    )
    return TokenBatch(
        input_ids_B_T=ids,
        attention_mask_B_T=attn,
        loss_mask_B_T=mask,
        old_logprobs_B_T=torch.zeros(4, 8),
        token_rewards_B_T=torch.zeros(4, 8),
        group_ids=("a", "a", "b", "b"),
        lengths_B=lengths,
    )


ADV_ROWS = torch.tensor([1.0, -1.0, 0.5, -2.0])


def advantages(batch):
    return ADV_ROWS[:, None] * batch.loss_mask_B_T


def current_logprobs(model, batch):
    with torch.no_grad():
        lp, _, ent = naive_logprobs(model, batch.input_ids_B_T, batch.attention_mask_B_T)
    return lp.float(), ent.float()


@pytest.mark.parametrize("kind", ["reinforce", "ppo"])
def test_one_step_moves_logprobs_with_the_advantage_sign(kind):
    model = tiny_llama()
    batch = make_batch()
    lp0, _ = current_logprobs(model, batch)
    batch = dataclasses.replace(batch, old_logprobs_B_T=lp0 * batch.loss_mask_B_T)
    learner = Learner(
        model,
        LearnerConfig(policy_loss=kind, max_grad_norm=None),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
    )
    stats = learner.step(batch, advantages(batch))
    assert not stats.skipped and stats.tokens == 12 and stats.sequences == 4
    lp1, _ = current_logprobs(model, batch)
    m = batch.loss_mask_B_T != 0
    delta = (lp1 - lp0)[m]
    sign = advantages(batch)[m].sign()
    assert (delta * sign > 0).all(), (delta, sign)


def hand_loss(lp, old, adv, mask, agg, eps=0.2, kl_coef=0.0, ref=None, ent_coef=0.0, ent=None):
    """Plain Python loops over tokens: PPO-clip + k3 KL − entropy, then the chosen aggregation."""
    per_seq = []
    total, n_tok = 0.0, 0
    for b in range(lp.shape[0]):
        s, n = 0.0, 0
        for t in range(lp.shape[1]):
            if mask[b, t] == 0:
                continue
            r = math.exp(lp[b, t] - old[b, t])
            a = float(adv[b, t])
            loss = max(-a * r, -a * min(max(r, 1 - eps), 1 + eps))
            if kl_coef:
                d = float(ref[b, t] - lp[b, t])
                loss += kl_coef * (math.exp(d) - d - 1)
            if ent_coef:
                loss -= ent_coef * float(ent[b, t])
            s += loss
            n += 1
        total += s
        n_tok += n
        if n:
            per_seq.append((s, n))
    if agg == "token-mean":
        return total / n_tok
    if agg == "seq-mean-token-sum":
        return sum(s for s, _ in per_seq) / len(per_seq)
    return sum(s / n for s, n in per_seq) / len(per_seq)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_loss_equals_hand_computation(agg):
    model = tiny_llama(seed=1)
    batch = make_batch()
    lp0, ent0 = current_logprobs(model, batch)
    g = torch.Generator().manual_seed(0)
    # Old log-probs off by up to ±0.5 so that some ratios fall outside [0.8, 1.2] and get clipped.
    old = (lp0 + (torch.rand(lp0.shape, generator=g) - 0.5)) * batch.loss_mask_B_T
    ref = lp0 + 0.3 * torch.randn(lp0.shape, generator=g)
    batch = dataclasses.replace(batch, old_logprobs_B_T=old)
    cfg = LearnerConfig(loss_agg=agg, kl_coef=0.1, entropy_coef=0.01, micro_batch_tokens=12)
    stats = Learner(model, cfg).step(batch, advantages(batch), ref_logprobs_B_T=ref)
    want = hand_loss(
        lp0,
        old,
        advantages(batch),
        batch.loss_mask_B_T,
        agg,
        kl_coef=0.1,
        ref=ref,
        ent_coef=0.01,
        ent=ent0,
    )
    assert stats.loss == pytest.approx(want, abs=1e-5)
    assert stats.micro_batches > 1
    assert 0 < stats.clip_frac < 1
    m = batch.loss_mask_B_T != 0
    d = (ref - lp0)[m]
    assert stats.kl == pytest.approx(float((d.exp() - d - 1).mean()), abs=1e-5)
    assert stats.entropy == pytest.approx(float(ent0[m].mean()), abs=1e-4)


def test_micro_batching_gives_the_same_update():
    results = []
    for budget in (None, 8, 16):
        model = tiny_llama(seed=2)
        batch = make_batch()
        lp0, _ = current_logprobs(model, batch)
        batch = dataclasses.replace(batch, old_logprobs_B_T=lp0 * batch.loss_mask_B_T)
        learner = Learner(
            model,
            LearnerConfig(micro_batch_tokens=budget, max_grad_norm=0.5),
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        )
        st = learner.step(batch, advantages(batch))
        results.append((st, torch.cat([p.detach().flatten() for p in model.parameters()])))
    (s0, p0), *rest = results
    for st, p in rest:
        assert st.micro_batches > s0.micro_batches == 1
        assert st.loss == pytest.approx(s0.loss, abs=1e-6)
        assert st.grad_norm == pytest.approx(s0.grad_norm, rel=1e-5)
        assert torch.allclose(p, p0, atol=1e-6)


def test_a_row_over_the_budget_is_recomputed_with_the_same_update():
    """Rows longer than micro_batch_tokens run with activation checkpointing (bounding the memory one long
    episode can take) and give the update of the plain pass."""
    results = []
    for budget in (None, 4):
        model = tiny_llama(seed=2)
        batch = make_batch()
        lp0, _ = current_logprobs(model, batch)
        batch = dataclasses.replace(batch, old_logprobs_B_T=lp0 * batch.loss_mask_B_T)
        learner = Learner(
            model,
            LearnerConfig(micro_batch_tokens=budget, max_grad_norm=0.5),
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        )
        st = learner.step(batch, advantages(batch))
        assert not model.is_activation_checkpointing  # switched off again after each micro-batch
        results.append((st, torch.cat([p.detach().flatten() for p in model.parameters()])))
    (s0, p0), (s1, p1) = results
    assert s0.recomputed_micro_batches == 0
    assert s1.micro_batches == 4 and s1.recomputed_micro_batches == 3  # lengths 6, 8, 5 > 4; 3 is not
    assert s1.loss == pytest.approx(s0.loss, abs=1e-6)
    assert s1.grad_norm == pytest.approx(s0.grad_norm, rel=1e-5)
    assert torch.allclose(p1, p0, atol=1e-6)


def test_plan_micro_batches_balances_tokens():
    plans = plan_micro_batches([10, 3, 7, 2, 9, 1], budget=20)
    assert sorted(i for p in plans for i in p) == list(range(6))
    lengths = [10, 3, 7, 2, 9, 1]
    for p in plans:
        assert len(p) == 1 or max(lengths[i] for i in p) * len(p) <= 20
    assert plan_micro_batches([50, 1], budget=10) == [[0], [1]]
    assert plan_micro_batches([3, 4], None) == [[1, 0]]


def test_policy_loss_ppo_and_dual_clip_by_hand():
    lp = torch.tensor([[0.0, 0.0, 0.0, 0.0]])
    old = torch.log(torch.tensor([[0.5, 2.0, 0.2, 1.0]]))  # ratios 2, 0.5, 5, 1
    adv = torch.tensor([[1.0, 1.0, -1.0, -3.0]])
    pg, clipped = policy_loss(lp, old, adv, kind="ppo", clip_eps_low=0.2, clip_eps_high=0.28)
    assert pg.tolist()[0] == pytest.approx([-1.28, -0.5, 5.0, 3.0])
    assert clipped.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    pg2, clipped2 = policy_loss(lp, old, adv, kind="ppo", dual_clip_c=3.0)
    assert pg2.tolist()[0] == pytest.approx([-1.2, -0.5, 3.0, 3.0])
    assert clipped2[0, 2] == 1.0
    pr, _ = policy_loss(lp - 1.0, old, adv, kind="reinforce")
    assert pr.tolist()[0] == pytest.approx([1.0, 1.0, -1.0, -3.0])


def test_score_matches_naive_and_masks():
    model = tiny_llama(seed=3)
    batch = make_batch()
    lp, sp = Learner(model, LearnerConfig(micro_batch_tokens=10, chunk_size=3)).score(batch)
    want_lp, want_sp, _ = naive_logprobs(model, batch.input_ids_B_T, batch.attention_mask_B_T)
    m = batch.loss_mask_B_T != 0
    assert torch.allclose(lp[m].double(), want_lp[m], atol=1e-5)
    assert torch.allclose(sp[m].double(), want_sp[m], atol=1e-6)
    assert (lp[~m] == 0).all() and (sp[~m] == 0).all()


def test_kl_with_ref_model_and_nonfinite_skip():
    model = tiny_llama(seed=4)
    learner = Learner(model, LearnerConfig(kl_coef=0.5), ref_model=copy.deepcopy(model))
    batch = make_batch()
    lp0, _ = current_logprobs(model, batch)
    batch = dataclasses.replace(batch, old_logprobs_B_T=lp0 * batch.loss_mask_B_T)
    st = learner.step(batch, advantages(batch))
    assert st.kl == pytest.approx(0.0, abs=1e-9)  # same weights before the step
    before = [p.detach().clone() for p in model.parameters()]
    st = learner.step(batch, advantages(batch) * 1e38)  # the loss overflows → inf/nan gradient
    assert st.skipped and not math.isfinite(st.grad_norm)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_gradient_checkpointing_and_bf16_autocast_run():
    model = tiny_llama(seed=5)
    batch = make_batch()
    cfg = LearnerConfig(gradient_checkpointing=True, bf16_autocast=True, policy_loss="reinforce")
    st = Learner(model, cfg, optimizer=torch.optim.SGD(model.parameters(), lr=0.01)).step(
        batch, advantages(batch)
    )
    assert math.isfinite(st.loss) and st.grad_norm > 0 and not st.skipped
    # Only inside the update: a sampler sharing the model must keep its KV cache.
    assert not model.is_activation_checkpointing


def test_config_and_input_validation():
    for bad in (
        {"policy_loss": "a2c"},
        {"loss_agg": "sum"},
        {"clip_eps_low": 1.0},
        {"dual_clip_c": 1.0},
        {"kl_coef": -1.0},
        {"max_grad_norm": 0.0},
        {"micro_batch_tokens": -1},
        {"temperature": 0.0},
        {"chunk_size": -1},
        {"lr": math.nan},
    ):
        with pytest.raises(ConfigError):
            LearnerConfig(**bad)
    learner = Learner(tiny_llama(), LearnerConfig(kl_coef=0.1))
    batch = make_batch()
    with pytest.raises(ConfigError, match="shape"):
        learner.step(batch, torch.zeros(4, 3))
    with pytest.raises(ConfigError, match="ref_model"):
        learner.step(batch, advantages(batch))
    with pytest.raises(ConfigError, match="finite"):
        Learner(tiny_llama()).step(batch, advantages(batch) * math.nan)
    assert set(LearnerConfig().__dataclass_fields__) >= {"policy_loss", "loss_agg", "max_grad_norm"}


def test_end_to_end_collate_score_otb_step():
    from agentrl.batch import collate
    from agentrl.credit import compute_advantages, variance_proxy_metrics
    from agentrl.groups import group_trajectories
    from agentrl.types import Segment, TokenSource, Trajectory, TrajectoryMeta

    def traj(prompt, turns, reward, group):
        ids, mask, lps, segs = list(prompt), [0] * len(prompt), [None] * len(prompt), []
        segs.append(Segment(TokenSource.PROMPT, 0, len(ids), -1))
        for k, (model_toks, tool_toks) in enumerate(turns):
            s = len(ids)
            ids += model_toks
            mask += [1] * len(model_toks)
            lps += [-1.0] * len(model_toks)
            segs.append(Segment(TokenSource.MODEL, s, len(ids), k))
            if tool_toks:
                s = len(ids)
                ids += tool_toks
                mask += [0] * len(tool_toks)
                lps += [None] * len(tool_toks)
                segs.append(Segment(TokenSource.OBSERVATION, s, len(ids), k))
        return Trajectory(
            token_ids=tuple(ids),
            loss_mask=tuple(mask),
            logprobs=tuple(lps),
            segments=tuple(segs),
            messages=(),
            rewards=(reward,),
            meta=TrajectoryMeta(group_id=group),
        )

    trajs = [
        traj([1, 2, 3], [([10, 11, 12], [90, 91]), ([13, 14], [])], 1.0, "q0"),
        traj([1, 2, 3], [([20, 21], [92]), ([22], [93, 94]), ([23, 24, 25], [])], 0.0, "q0"),
        traj([4, 5], [([30, 31, 32, 33], [])], 1.0, "q1"),
        traj([4, 5], [([40], [95, 96, 97]), ([41, 42], [])], 0.0, "q1"),
    ]
    for t in trajs:
        t.validate()
    batch = collate(list(group_trajectories(trajs)), pad_id=0)
    model = tiny_llama(seed=6)
    learner = Learner(model, LearnerConfig(micro_batch_tokens=24, lr=1e-3))
    lp, sp = learner.score(batch)
    batch = dataclasses.replace(batch, old_logprobs_B_T=lp)
    adv = compute_advantages("otb", batch.token_rewards_B_T, batch.loss_mask_B_T, lp, sp, batch.group_ids)
    m = batch.loss_mask_B_T != 0
    assert (adv[~m] == 0).all() and (adv[0][m[0]] > 0).all()
    # Row 1 has 6 model tokens, row 0 has 5: its 6th is a solo tail → baseline 0 → A = G = 0.
    a1 = adv[1][m[1]]
    assert (a1[:5] < 0).all() and a1[5] == 0
    stats = learner.step(batch, adv)
    assert stats.approx_kl == pytest.approx(0.0, abs=1e-6)  # on-policy: ratio 1
    assert stats.clip_frac == 0.0 and stats.tokens == int(m.sum())
    diag = variance_proxy_metrics(adv, batch.loss_mask_B_T, lp, sp, grad_norm=stats.grad_norm)
    assert diag.total_power > 0 and diag.pure_noise is not None


def test_release_optimizer_state_frees_the_moments_and_refuses_further_steps():
    model = tiny_llama()
    batch = make_batch()
    lp0, _ = current_logprobs(model, batch)
    batch = dataclasses.replace(batch, old_logprobs_B_T=lp0 * batch.loss_mask_B_T)
    learner = Learner(model, LearnerConfig(lr=1e-3))
    learner.step(batch, advantages(batch))
    state = learner.optimizer.state.values()
    moments = sum(t.numel() for s in state for t in s.values() if torch.is_tensor(t))
    assert moments >= 2 * sum(p.numel() for p in model.parameters())  # AdamW: exp_avg and exp_avg_sq
    learner.release_optimizer_state()
    assert len(learner.optimizer.state) == 0
    with pytest.raises(ConfigError, match="released its optimizer state"):
        learner.step(batch, advantages(batch))
