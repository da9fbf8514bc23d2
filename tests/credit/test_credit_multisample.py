"""Credit across the samples of one episode (docs/otb-multisample.md): OTB against a loop reference, the
single-sample case bit for bit, and per-episode baselines for GRPO, RLOO, OPO and none."""

from __future__ import annotations

import random

import pytest
import torch

from agentrl.credit import (
    GRPO,
    OPO,
    OTB,
    RLOO,
    NoBaseline,
    compute_advantages,
    optimal_token_baseline,
)
from agentrl.errors import ConfigError

from .credit_data import Member, layout, random_members
from .otb_reference import tir_otb_episode_loop

F64 = torch.float64


def split_members(
    rng: random.Random, mem: list[Member], max_samples: int = 3, reward_on_every_sample: bool = False
) -> tuple[list[Member], list[str]]:
    """Cut each member into 1..max_samples consecutive samples (rows). The member's reward goes on its last
    sample (or, with ``reward_on_every_sample``, a random share of it on each sample)."""
    rows, eps = [], []
    for i, m in enumerate(mem):
        n = len(m.logprobs)
        k = rng.randint(1, max_samples) if n else 1
        # Cuts leave the last sample non-empty (a reward needs a model token to sit on); others may be empty.
        cuts = sorted(rng.randint(0, n - 1) for _ in range(k - 1))
        bounds = [0, *cuts, n]
        shares = [0.0] * (k - 1) + [m.reward]
        if reward_on_every_sample:
            shares = [round(rng.uniform(-1, 1), 3) for _ in range(k)]
        for s in range(k):
            a, b = bounds[s], bounds[s + 1]
            rho = m.rho[a:b] if m.rho else None
            rows.append(Member(m.group, m.logprobs[a:b], m.spi2[a:b], shares[s], rho))
            eps.append(f"e{i}")
    return rows, eps


def args(d):
    return d["token_rewards"], d["loss_mask"], d["logprobs"], d["sum_pi_squared"], d["group_ids"]


@pytest.mark.parametrize("zero_tail", [True, False])
@pytest.mark.parametrize("with_rho", [False, True])
@pytest.mark.parametrize("every_sample", [False, True])
def test_otb_multisample_matches_loop_reference(zero_tail, with_rho, every_sample):
    rng = random.Random(100 + zero_tail + 2 * with_rho + 4 * every_sample)
    mem = random_members(rng, n_groups=10, with_rho=with_rho, rewards=(0.0, 1.0, -1.0, 0.5), lengths=(0, 12))
    rows, eids = split_members(rng, mem, reward_on_every_sample=every_sample)
    spans = [[(rng.randint(0, 6), rng.randint(1, 4)) for _ in range(rng.randint(0, 2))] for _ in rows]
    d = layout(rows, spans=spans, junk=0.0)
    kw = {"zero_tail": zero_tail}
    if with_rho:
        kw["is_weights"] = d["is_weights"]
    got = optimal_token_baseline(*args(d), episode_ids=eids, **kw)
    want = tir_otb_episode_loop(*args(d), eids, **kw)
    assert any(eids[i] == eids[i + 1] for i in range(len(eids) - 1))  # some episodes really are split
    assert torch.allclose(got, want, atol=1e-12, rtol=0)


def test_otb_samples_interleaved_with_other_rows_keep_row_order():
    rng = random.Random(5)
    mem = random_members(rng, n_groups=4, group_sizes=(2, 4), lengths=(2, 8))
    rows, eids = split_members(rng, mem)
    perm = list(range(len(rows)))
    rng.shuffle(perm)
    # Keep each episode's samples in their order while interleaving them with other rows.
    order: dict[str, list[int]] = {}
    for i in range(len(rows)):
        order.setdefault(eids[i], []).append(i)
    shuffled = [order[eids[p]].pop(0) for p in perm]
    d = layout([rows[i] for i in shuffled], junk=0.0)
    e2 = [eids[i] for i in shuffled]
    got = optimal_token_baseline(*args(d), episode_ids=e2)
    assert torch.allclose(got, tir_otb_episode_loop(*args(d), e2), atol=1e-12, rtol=0)


def test_otb_one_sample_per_episode_is_todays_otb_bit_for_bit():
    rng = random.Random(7)
    for with_rho in (False, True):
        mem = random_members(rng, n_groups=12, with_rho=with_rho, rewards=(0.0, 1.0, -1.0, 0.5))
        spans = [[(rng.randint(0, 9), rng.randint(1, 4)) for _ in range(rng.randint(0, 3))] for _ in mem]
        for dtype in (F64, torch.float32):
            d = layout(mem, spans=spans, junk=0.0, dtype=dtype)
            kw = {"is_weights": d["is_weights"]} if with_rho else {}
            today = optimal_token_baseline(*args(d), **kw)
            for ids in ([f"ep{i}" for i in range(len(mem))], torch.arange(len(mem)) * 3):
                assert torch.equal(optimal_token_baseline(*args(d), episode_ids=ids, **kw), today)


def test_splitting_an_episode_into_samples_changes_nothing_when_the_reward_comes_last():
    """One episode as one row (its samples' model tokens back to back, with context tokens between) or as
    several rows: the same advantages on the same model tokens."""
    rng = random.Random(9)
    mem = random_members(rng, n_groups=8, group_sizes=(2, 5), lengths=(1, 15))
    rows, eids = split_members(rng, mem)
    whole = optimal_token_baseline(*args(layout(mem, junk=0.0)))
    d = layout(rows, junk=0.0)
    split = optimal_token_baseline(*args(d), episode_ids=eids)
    for name, fn in (("grpo", GRPO()), ("rloo", RLOO()), ("opo", OPO()), ("none", NoBaseline())):
        w = fn.advantages(*args(layout(mem, junk=0.0)))
        s = fn.advantages(*args(d), episode_ids=eids)
        _assert_same_per_episode(w, s, layout(mem, junk=0.0)["loss_mask"], d["loss_mask"], eids, name)
    _assert_same_per_episode(whole, split, layout(mem, junk=0.0)["loss_mask"], d["loss_mask"], eids, "otb")


def _assert_same_per_episode(whole, split, m_whole, m_split, eids, name):
    by_ep: dict[str, list[float]] = {}
    for i, e in enumerate(eids):
        by_ep.setdefault(e, []).extend(split[i][m_split[i] != 0].tolist())
    for i in range(whole.shape[0]):
        assert by_ep[f"e{i}"] == pytest.approx(whole[i][m_whole[i] != 0].tolist(), abs=1e-12), name


def _two_episode_group():
    """Group g: episode A in two samples (rewards 0.25 then 0.75, 2 + 3 model tokens), episode B in one
    (reward 0, 1 model token), episode C in one (reward 1, 4 model tokens)."""
    rows = [
        Member("g", [-0.5] * 2, [0.5] * 2, 0.25),
        Member("g", [-0.5] * 3, [0.5] * 3, 0.75),
        Member("g", [-0.5] * 1, [0.5] * 1, 0.0),
        Member("g", [-0.5] * 4, [0.5] * 4, 1.0),
    ]
    return layout(rows, junk=0.0), ["A", "A", "B", "C"]


def _row_values(adv, d):
    """Model-token advantages, row after row, as one flat list."""
    return [x for i in range(adv.shape[0]) for x in adv[i][d["loss_mask"][i] != 0].tolist()]


def _flat(rows):
    return [x for r in rows for x in r]


def test_grpo_rloo_opo_per_episode_baselines_by_hand():
    d, eids = _two_episode_group()
    mean = 2 / 3
    grpo = GRPO(norm_by_std=False).advantages(*args(d), episode_ids=eids)
    assert _row_values(grpo, d) == pytest.approx(
        _flat([[1 - mean] * 2, [1 - mean] * 3, [0 - mean], [1 - mean] * 4]), abs=1e-6
    )
    std = (((1 - mean) ** 2 * 2 + mean**2) / 2) ** 0.5
    grpo_std = GRPO().advantages(*args(d), episode_ids=eids)
    assert _row_values(grpo_std, d)[:5] == pytest.approx([(1 - mean) / (std + 1e-6)] * 5, abs=1e-6)
    rloo = RLOO().advantages(*args(d), episode_ids=eids)
    assert _row_values(rloo, d) == pytest.approx(_flat([[0.5] * 5, [0 - 1.0], [1 - 0.5] * 4]), abs=1e-6)
    # OPO: lengths A = 5 (both samples), B = 1, C = 4; b = (5·1 + 1·0 + 4·1) / 10 = 0.9.
    opo = OPO().advantages(*args(d), episode_ids=eids)
    assert _row_values(opo, d) == pytest.approx(_flat([[0.1] * 5, [-0.9], [0.1] * 4]), abs=1e-6)
    # none: the reward-to-go runs across A's samples (0.25 + 0.75 on the first, 0.75 on the second).
    none = NoBaseline().advantages(*args(d), episode_ids=eids)
    assert _row_values(none, d) == pytest.approx(_flat([[1.0] * 2, [0.75] * 3, [0.0], [1.0] * 4]), abs=1e-6)
    # Per sample instead (no episode ids): four members, A's samples scored on their own.
    assert _row_values(RLOO().advantages(*args(d)), d)[0] == pytest.approx(0.25 - (0.75 + 0 + 1) / 3)


def test_otb_two_sample_episode_by_hand():
    """Energy and return run across A's samples: A's third model token (first of sample 2) is its k = 2."""
    d, eids = _two_episode_group()
    A = optimal_token_baseline(*args(d), episode_ids=eids)
    assert torch.allclose(A, tir_otb_episode_loop(*args(d), eids), atol=1e-12)
    w = 1 - 2 * torch.exp(torch.tensor(-0.5, dtype=F64)).item() + 0.5
    # k = 0: all three alive, W = w each; G = 1 (A), 0 (B), 1 (C) → baseline 2/3.
    assert A[0, 0].item() == pytest.approx(1 - 2 / 3)
    # k = 2 (A's sample 1, token 0): A (reward-to-go 0.75) and C (1) alive with equal W → baseline 0.875.
    assert A[1, 0].item() == pytest.approx(0.75 - 0.875)
    # k = 4: A (length 5) is the unique longest → zero tail → advantage = return 0.75 (its reward-to-go).
    assert A[1, 2].item() == pytest.approx(0.75)
    assert w > 0


def test_episode_ids_errors():
    d, eids = _two_episode_group()
    with pytest.raises(ConfigError, match="episode ids for"):
        optimal_token_baseline(*args(d), episode_ids=eids[:3])
    d2 = dict(d, group_ids=["g", "h", "g", "g"])
    for name in ("otb", "grpo", "rloo", "opo", "none"):
        with pytest.raises(ConfigError, match="must share a group"):
            compute_advantages(name, *args(d2), episode_ids=eids)
    assert torch.equal(
        compute_advantages("otb", *args(d), episode_ids=eids), OTB().advantages(*args(d), episode_ids=eids)
    )
