"""The off-policy correction: ρ̄ by hand and against a plain loop, the decoupled loss, OTB under ρ̄ (bit for
bit at ρ̄ ≡ 1, against the loop reference otherwise), and the update path with the tiny model."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from agentrl.credit import GRPO, OPO, OTB, RLOO, optimal_token_baseline
from agentrl.errors import ConfigError
from agentrl.groups import group_trajectories
from agentrl.learner import Learner, LearnerConfig, policy_loss
from agentrl.learner.correction import Correction, importance_weights, truncated_is_weights
from agentrl.learner.losses import decoupled_policy_loss
from agentrl.types import Segment, TokenSource, Trajectory, TrajectoryMeta
from agentrl.update import policy_update, score_and_credit

from .tiny import tiny_llama


def loop_rho(old, mu, correct, cap):
    """ρ̄ one token at a time, straight from the definition."""
    B, T = old.shape
    rho = [[1.0] * T for _ in range(B)]
    clipped = [[False] * T for _ in range(B)]
    for b in range(B):
        for t in range(T):
            if correct[b][t]:
                r = math.exp(float(old[b, t]) - float(mu[b, t]))
                rho[b][t] = min(r, cap)
                clipped[b][t] = r > cap
    return torch.tensor(rho), torch.tensor(clipped)


def test_rho_is_exactly_one_when_sampler_equals_learner():
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 7, generator=g) * 4
    rho, clipped = truncated_is_weights(old, old.clone(), torch.ones(3, 7, dtype=torch.bool))
    assert torch.equal(rho, torch.ones(3, 7)) and not clipped.any()


def test_rho_clipping_by_hand():
    # ratios π_old/μ: 3 (clipped to 2), 0.5, 1, 2 exactly (not clipped), e^30 (clamped, clipped)
    mu = torch.tensor([[math.log(0.1), math.log(0.4), math.log(0.3), math.log(0.25), -40.0]])
    old = torch.tensor([[math.log(0.3), math.log(0.2), math.log(0.3), math.log(0.5), -10.0]])
    rho, clipped = truncated_is_weights(old, mu, torch.ones(1, 5, dtype=torch.bool), cap=2.0)
    assert rho.tolist()[0] == pytest.approx([2.0, 0.5, 1.0, 2.0, 2.0], rel=1e-6)
    assert clipped.tolist() == [[True, False, False, False, True]]
    # Positions not corrected get exactly 1, whatever their ratio.
    rho, clipped = truncated_is_weights(old, mu, torch.tensor([[False, True, False, False, False]]))
    assert rho.tolist()[0] == pytest.approx([1.0, 0.5, 1.0, 1.0, 1.0]) and not clipped.any()


def test_rho_matches_the_loop_version():
    g = torch.Generator().manual_seed(1)
    for cap in (1.0, 1.5, 2.0, 10.0):
        old = -torch.rand(4, 9, generator=g) * 3
        mu = old + torch.randn(4, 9, generator=g)
        correct = torch.rand(4, 9, generator=g) > 0.3
        rho, clipped = truncated_is_weights(old, mu, correct, cap=cap)
        ref_rho, ref_clipped = loop_rho(old, mu, correct.tolist(), cap)
        torch.testing.assert_close(rho, ref_rho, rtol=1e-6, atol=1e-7)
        assert torch.equal(clipped, ref_clipped)


def test_scope_sequence_mask_and_metrics():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float32)
    stale = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)
    mu = torch.zeros(3, 4) - 1.0
    # row 0: ratio 1.5 everywhere (geo mean 1.5); row 1 fresh; row 2: ratios 4 and 1 on its stale tokens
    old = mu + torch.tensor(
        [[math.log(1.5)] * 4, [math.log(3.0)] * 4, [math.log(4.0), 0.0, math.log(5.0), math.log(5.0)]]
    )
    w = importance_weights(old, mu, mask, stale, Correction(cap=2.0))
    assert w.rho_B_T[0, :3].tolist() == pytest.approx([1.5] * 3)
    assert torch.equal(w.rho_B_T[1], torch.ones(4))  # fresh: exactly 1 although π_old/μ = 3
    assert w.rho_B_T[2].tolist() == pytest.approx([2.0, 1.0, 1.0, 1.0])  # only stale tokens corrected
    n_corr = 5
    assert w.metrics["correction/corrected_token_frac"] == pytest.approx(n_corr / 9)
    assert w.metrics["correction/clip_frac"] == pytest.approx(1 / n_corr)
    rhos = torch.tensor([1.5, 1.5, 1.5, 1, 1, 2, 1, 1, 1], dtype=torch.float64)
    assert w.metrics["correction/ess"] == pytest.approx(float(rhos.sum() ** 2 / (9 * (rhos**2).sum())))
    lr = (old - mu)[mask.bool()].double()
    assert w.metrics["correction/kl_sampler_learner"] == pytest.approx(float(-lr.mean()))
    # geometric-mean band [0.9, 1.2]: row 0 (1.5) and row 2 (exp(mean(log 4, 0)) = 2) masked, row 1 kept
    w = importance_weights(old, mu, mask, stale, Correction(seq_mask_low=0.9, seq_mask_high=1.2))
    assert w.seq_masked_B.tolist() == [True, False, True]
    assert torch.equal(w.rho_B_T[0, :3], torch.zeros(3)) and torch.equal(w.rho_B_T[1], torch.ones(4))
    assert w.metrics["correction/seq_masked_frac"] == pytest.approx(2 / 3)
    # scope all: fresh row corrected too
    w = importance_weights(old, mu, mask, None, Correction(scope="all"))
    assert w.rho_B_T[1, :2].tolist() == pytest.approx([2.0, 2.0])
    with pytest.raises(ConfigError, match="staleness"):
        importance_weights(old, mu, mask, None, Correction())


def test_correction_config_is_validated():
    for bad in (
        {"mode": "nope"},
        {"cap": 0.5},
        {"scope": "x"},
        {"seq_mask_low": 2.0},
        {"seq_mask_high": 0.5},
    ):
        with pytest.raises(ConfigError):
            Correction(**bad)


@pytest.mark.parametrize("kind", ["ppo", "reinforce"])
@pytest.mark.parametrize("dual", [None, 3.0])
def test_decoupled_loss_is_rho_times_ppo_and_equals_weighted_advantages(kind, dual):
    g = torch.Generator().manual_seed(2)
    lp = (-torch.rand(3, 6, generator=g) * 2).requires_grad_()
    old = lp.detach() + 0.4 * torch.randn(3, 6, generator=g)
    adv = torch.randn(3, 6, generator=g)
    rho = torch.rand(3, 6, generator=g) * 2
    rho[0, 0] = 0.0
    kw = {"kind": kind, "dual_clip_c": dual}
    pg, clipped = decoupled_policy_loss(lp, old, adv, rho, **kw)
    base, base_clipped = policy_loss(lp, old, adv, **kw)
    torch.testing.assert_close(pg, rho * base)
    assert torch.equal(clipped, base_clipped)
    # What the trainer does: the learner's plain loss on ρ̄·A; same values and same gradient.
    folded, _ = policy_loss(lp, old, rho * adv, **kw)
    torch.testing.assert_close(folded, pg, rtol=1e-6, atol=1e-7)
    (g1,) = torch.autograd.grad(pg.sum(), lp)
    (g2,) = torch.autograd.grad(folded.sum(), lp)
    torch.testing.assert_close(g1, g2, rtol=1e-6, atol=1e-7)
    with pytest.raises(ConfigError):
        decoupled_policy_loss(lp, old, adv, -rho - 1)


# --- the update path, with the tiny model ----------------------------------------------------------------
def _traj(prompt, turns, reward, group, versions, lp=-1.0):
    ids, mask, lps, segs = list(prompt), [0] * len(prompt), [None] * len(prompt), []
    segs.append(Segment(TokenSource.PROMPT, 0, len(ids), -1))
    for k, (model_toks, tool_toks) in enumerate(turns):
        s = len(ids)
        ids += model_toks
        mask += [1] * len(model_toks)
        lps += [lp] * len(model_toks)
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
        meta=TrajectoryMeta(group_id=group, policy_version=min(versions)),
        policy_versions=tuple(versions),
    )


def _groups(versions=((3, 3), (3, 3), (3,), (3, 3))):
    trajs = [
        _traj([1, 2, 3], [([10, 11, 12], [90, 91]), ([13, 14], [])], 1.0, "q0", versions[0]),
        _traj([1, 2, 3], [([20, 21], [92]), ([22, 23, 24], [])], 0.0, "q0", versions[1]),
        _traj([4, 5], [([30, 31, 32, 33], [])], 1.0, "q1", versions[2]),
        _traj([4, 5], [([40], [95, 96, 97]), ([41, 42], [])], 0.0, "q1", versions[3]),
    ]
    return list(group_trajectories(trajs))


def _with_learner_logprobs(groups, learner):
    """The same trajectories with μ := the learner's own scores (an on-policy sampler, bitwise)."""
    credit = score_and_credit(learner, groups, estimator=GRPO(), pad_id=0)
    out = []
    for g, rows in zip(groups, _rows(groups, credit.logprobs_B_T), strict=True):
        out.append(type(g)(tuple(dataclasses.replace(t, logprobs=r) for t, r in zip(g, rows, strict=True))))
    return out


def _rows(groups, lp_B_T):
    rows, b = [], 0
    for g in groups:
        rs = []
        for t in g:
            rs.append(tuple(float(lp_B_T[b, i]) if t.loss_mask[i] else None for i in range(len(t.token_ids))))
            b += 1
        rows.append(rs)
    return rows


@pytest.mark.parametrize("estimator", [OTB(), GRPO(), RLOO(), OPO()])
def test_update_with_correction_and_mu_equal_pi_old_is_todays_update(estimator):
    learner = Learner(tiny_llama(seed=7), LearnerConfig(lr=1e-3))
    groups = _with_learner_logprobs(_groups(versions=((2, 3), (2, 2), (2,), (3, 3))), learner)
    plain = score_and_credit(learner, groups, estimator=estimator, pad_id=0)
    corr = score_and_credit(
        learner, groups, estimator=estimator, pad_id=0, correction=Correction(scope="all"), learner_version=3
    )
    assert corr.weights is not None and torch.equal(
        corr.weights.rho_B_T, torch.ones_like(corr.weights.rho_B_T)
    )
    assert torch.equal(corr.advantages_B_T, plain.advantages_B_T)
    assert torch.equal(corr.loss_advantages_B_T, plain.advantages_B_T)


@pytest.mark.parametrize("estimator", [OTB(), GRPO(), RLOO(), OPO()])
def test_update_with_stale_tokens_weights_the_loss_by_rho(estimator):
    learner = Learner(tiny_llama(seed=8), LearnerConfig(lr=1e-3))
    # Row 0: turn 0 by version 2, turn 1 by 3 (the learner's): only turn 0's tokens are corrected.
    groups = _groups(versions=((2, 3), (3, 3), (1,), (3, 3)))
    credit = score_and_credit(
        learner, groups, estimator=estimator, pad_id=0, correction=Correction(), learner_version=3
    )
    w = credit.weights
    assert w is not None
    batch = credit.batch
    m = batch.loss_mask_B_T.bool()
    rows = [t for g in groups for t in g]
    for b, t in enumerate(rows):
        expect_stale = {0: [1, 1, 1, 0, 0], 2: [1, 1, 1, 1]}.get(b)
        got = w.corrected_B_T[b][m[b]].int().tolist()
        assert got == (expect_stale or [0] * len(got)), (b, t.meta.group_id)
    sel = w.corrected_B_T
    expect = torch.clamp(torch.exp(credit.logprobs_B_T - (-1.0)), max=2.0)
    torch.testing.assert_close(w.rho_B_T[sel], expect[sel])
    assert torch.equal(w.rho_B_T[~sel], torch.ones(int((~sel).sum())))
    torch.testing.assert_close(credit.loss_advantages_B_T, credit.advantages_B_T * w.rho_B_T)
    if estimator.name == "otb":  # energies scaled by ρ̄²: the loop reference agrees
        args = (batch.token_rewards_B_T, batch.loss_mask_B_T, credit.logprobs_B_T, credit.sum_pi_squared_B_T)
        ref = optimal_token_baseline(*args, batch.group_ids, is_weights=w.rho_B_T)
        assert torch.equal(credit.advantages_B_T, ref)  # (the loop reference: tests/credit)
        assert not torch.equal(ref, optimal_token_baseline(*args, batch.group_ids))
    else:  # group baselines do not read ρ̄; the correction reaches them through the loss only
        plain = score_and_credit(learner, groups, estimator=estimator, pad_id=0)
        assert torch.equal(credit.advantages_B_T, plain.advantages_B_T)
    update = policy_update(
        learner, groups, estimator=estimator, pad_id=0, correction=Correction(), learner_version=3
    )
    for key in ("correction/rho_mean", "correction/ess", "correction/clip_frac", "staleness/max"):
        assert math.isfinite(update.metrics[key]), key
    assert update.metrics["staleness/max"] == 2.0


def test_bypass_refuses_otb_and_runs_group_estimators():
    learner = Learner(tiny_llama(seed=9), LearnerConfig(lr=1e-3))
    groups = _groups()
    with pytest.raises(ConfigError, match="Σπ²"):
        policy_update(learner, groups, estimator=OTB(), pad_id=0, correction=Correction(mode="bypass"))
    update = policy_update(learner, groups, estimator=GRPO(), pad_id=0, correction=Correction(mode="bypass"))
    # π_old := μ = −1 on every model token: the first ratio is π_θ/μ, not 1.
    assert update.stats.approx_kl != pytest.approx(0.0, abs=1e-3)
    assert "variance/proxy2_total_power" not in update.metrics
