"""Optimal Token Baseline: worked example, loop reference, properties, numerics."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.credit import optimal_token_baseline, returns_to_go, token_energy
from agentrl.errors import ConfigError

from .credit_data import Member, energy_pair, layout, model_token_values, random_members
from .otb_reference import single_turn_otb_loop, tir_otb_loop

F64 = torch.float64


def otb(d, **kw):
    return optimal_token_baseline(
        d["token_rewards"], d["loss_mask"], d["logprobs"], d["sum_pi_squared"], d["group_ids"], **kw
    )


def ref(d, **kw):
    return tir_otb_loop(
        d["token_rewards"], d["loss_mask"], d["logprobs"], d["sum_pi_squared"], d["group_ids"], **kw
    )


def members_with_energy(ws: list[list[float]], rewards: list[float], group: str = "g") -> list[Member]:
    """Members whose per-token proxy w takes exactly the given values."""
    out = []
    for w_row, r in zip(ws, rewards, strict=True):
        lps, sps = [], []
        for w in w_row:
            # (1-p)^2 = w/1.5 and the rest w/3 <= (1-p)^2, so 1 - 2p + Σπ² = w.
            p = 1 - math.sqrt(w / 1.5)
            lp, _ = energy_pair(p, 0.5) if p > 0 else (0.0, 1.0)
            lps.append(lp if w > 0 else 0.0)
            sps.append(w - 1 + 2 * p if w > 0 else 1.0)
        out.append(Member(group, lps, sps, r))
    return out


# --------------------------------------------------------------------------------------------
def test_worked_example_3_5b():
    mem = members_with_energy([[0.5, 0.2, 0.0, 0.3], [0.4, 0.6], [0.1, 0.1, 0.8]], [1, 0, 1])
    d = layout(mem, junk=0.0)
    A = otb(d)
    b1 = 0.9 / 1.9  # (0.7·1 + 1.0·0 + 0.2·1) / (0.7 + 1.0 + 0.2)
    want = torch.tensor(
        [
            [1 - 0.6, 1 - b1, 0.0, 1.0],  # t3: member 0 alone → zero-tail → A = G = 1
            [0 - 0.6, 0 - b1, 0.0, 0.0],
            [1 - 0.6, 1 - b1, 0.0, 0.0],
        ],
        dtype=F64,
    )
    assert torch.allclose(A, want, atol=1e-7)
    assert A[0, 1].item() == pytest.approx(0.5263, abs=1e-4)
    # Without the zero-tail rule member 0's solo tail is baselined by itself: A ≈ 0 there.
    assert otb(d, zero_tail=False)[0, 3].abs().item() < 1e-7


def test_worked_example_with_tool_spans_and_nan_junk():
    mem = members_with_energy([[0.5, 0.2, 0.0, 0.3], [0.4, 0.6], [0.1, 0.1, 0.8]], [1, 0, 1])
    plain = otb(layout(mem, junk=0.0))
    d = layout(mem, spans=[[(0, 3), (2, 2)], [(1, 5)], [(3, 1)]])  # NaN on every tool token
    A = otb(d)
    assert not torch.isnan(A).any()
    got = model_token_values(A, d["loss_mask"])
    want = model_token_values(plain, layout(mem, junk=0.0)["loss_mask"])
    for g_row, w_row in zip(got, want, strict=True):
        assert g_row == pytest.approx(w_row, abs=1e-12)
    assert (A[d["loss_mask"] == 0] == 0).all()


@pytest.mark.parametrize("zero_tail", [True, False])
@pytest.mark.parametrize("with_rho", [False, True])
def test_matches_loop_reference(zero_tail, with_rho):
    rng = random.Random(7 + zero_tail + 2 * with_rho)
    mem = random_members(rng, n_groups=12, with_rho=with_rho, rewards=(0.0, 1.0, -1.0, 0.5))
    spans = [[(rng.randint(0, 9), rng.randint(1, 4)) for _ in range(rng.randint(0, 3))] for _ in mem]
    d = layout(mem, spans=spans, junk=0.0)
    kw = {"zero_tail": zero_tail}
    if with_rho:
        kw["is_weights"] = d["is_weights"]
    got, want = otb(d, **kw), ref(d, **kw)
    assert got.dtype == F64
    assert torch.allclose(got, want, atol=1e-12, rtol=0)


def test_float32_matches_float64_reference():
    rng = random.Random(3)
    mem = random_members(rng, n_groups=20, lengths=(0, 40))
    d64 = layout(mem, junk=0.0)
    d32 = {k: v.float() if isinstance(v, torch.Tensor) else v for k, v in d64.items()}
    got = otb(d32)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), ref(d64), atol=2e-6)


def test_single_turn_data_equals_single_turn_variant():
    rng = random.Random(11)
    mem = random_members(rng, n_groups=10, group_sizes=(2, 6), lengths=(1, 12))
    d = layout(mem, junk=0.0)  # contiguous masks from column 0: single-turn data
    for zt in (True, False):
        st_ref = single_turn_otb_loop(
            d["token_rewards"],
            d["loss_mask"],
            d["logprobs"],
            d["sum_pi_squared"],
            d["group_ids"],
            zero_tail=zt,
        )
        assert torch.allclose(otb(d, zero_tail=zt), st_ref, atol=1e-12, rtol=0)


def test_group_ids_tensor_or_strings():
    rng = random.Random(5)
    d = layout(random_members(rng, n_groups=6), junk=0.0)
    as_int = torch.tensor([int(g[1:]) * 7 for g in d["group_ids"]])
    a = otb(d)
    b = optimal_token_baseline(d["token_rewards"], d["loss_mask"], d["logprobs"], d["sum_pi_squared"], as_int)
    assert torch.equal(a, b)


def test_zero_energy_prefix_gets_the_return():
    # π(y) = 1 exactly on the first two tokens of every member: ΣW = 0 there → baseline 0/eps = 0 → A = R
    # (spec §3.5, documented); later tokens have energy, constant rewards → A ≈ 0.
    mem = [Member("g", [0.0, 0.0, math.log(0.5)], [1.0, 1.0, 0.3], 1.0) for _ in range(3)]
    A = otb(layout(mem))
    assert torch.allclose(A[:, :2], torch.ones(3, 2, dtype=F64))
    assert A[:, 2].abs().max() < 1e-7


def test_zero_tail_only_for_a_unique_longest_member():
    tie = [Member("g", [math.log(0.5)] * n, [0.5] * n, r) for n, r in ((4, 1.0), (4, 0.0), (2, 1.0))]
    A = otb(layout(tie))
    # Two members alive at k = 2, 3: shared baseline, not zero.
    assert A[0, 3].item() == pytest.approx(0.5, abs=1e-7)
    assert A[1, 3].item() == pytest.approx(-0.5, abs=1e-7)


def test_empty_member_is_excluded_and_gets_zero():
    mem = [Member("g", [math.log(0.5)] * 3, [0.4] * 3, 1.0), Member("g", [], [], 1.0)]
    A = otb(layout(mem))
    # The empty row does not count as a member: the other is a group of one → A = G = 1.
    assert torch.allclose(A[0], torch.ones(3, dtype=F64))
    assert (A[1] == 0).all()


def test_reward_on_masked_position_is_dropped():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=F64)
    rew = torch.tensor([[0.0, 0.0, 5.0], [0.0, 0.0, 1.0]], dtype=F64)
    lp = torch.full((2, 3), math.log(0.5), dtype=F64)
    A = optimal_token_baseline(rew, mask, lp, torch.full((2, 3), 0.4, dtype=F64), ["a", "b"])
    assert (A[0] == 0).all() and torch.allclose(A[1], torch.ones(3, dtype=F64))
    assert returns_to_go(rew, mask)[0].abs().sum() == 0


def test_input_errors():
    x = torch.zeros(2, 3)
    with pytest.raises(ConfigError, match="group ids"):
        optimal_token_baseline(x, x, x, x, ["a"])
    with pytest.raises(ConfigError, match="shape"):
        optimal_token_baseline(x, x, torch.zeros(2, 4), x, ["a", "b"])
    with pytest.raises(ConfigError, match="only 0 and 1"):
        optimal_token_baseline(x, torch.full((2, 3), 0.5), x, x, ["a", "b"])
    with pytest.raises(ConfigError, match="group_ids"):
        optimal_token_baseline(x, x, x, x, None)  # type: ignore[arg-type]
    assert optimal_token_baseline(
        torch.zeros(0, 0), torch.zeros(0, 0), torch.zeros(0, 0), torch.zeros(0, 0), []
    ).shape == (0, 0)


# --------------------------------------------------------------------------------------------
# Energy numerics (spec §2.4)
def test_token_energy_stable_where_naive_cancels():
    for one_minus_p in (1e-3, 1e-5, 1e-7, 1e-9):
        p64 = torch.tensor(1 - one_minus_p, dtype=F64)
        # The rest of the mass on one other token: Σπ² = p² + (1 − p)², true w = 2(1 − p)².
        sp64 = p64**2 + (1 - p64) ** 2
        true = 2 * one_minus_p**2
        lp32 = torch.log(p64).float()
        w32 = token_energy(lp32, sp64.float()).double()
        naive32 = (1 - 2 * torch.exp(lp32) + sp64.float()).double()
        assert w32 >= 0
        # Within the factor-2 band the clamp guarantees, and close when the inputs are exact enough.
        assert true / 2 * 0.999 <= w32.item() <= true * 1.001
        if one_minus_p <= 1e-5:
            assert abs(naive32.item() - true) > abs(w32.item() - true)
    lp = torch.tensor([-0.3, -2.0], dtype=F64)
    sp = torch.tensor([0.6, 0.2], dtype=F64)
    assert torch.allclose(token_energy(lp, sp), 1 - 2 * lp.exp() + sp, atol=1e-15, rtol=0)
    # Rounded inputs that no distribution can produce (Σπ² = 1 with π_y = 1 − 1e-12): the naive form says
    # 2e-12, the truth is at most 2(1 − π_y)² = 2e-24; the clamp keeps the result inside that band.
    w = token_energy(torch.tensor([-1e-12], dtype=F64), torch.tensor([1.0], dtype=F64))
    assert 0.99e-24 <= w.item() <= 2.01e-24


def test_token_energy_never_negative_on_inconsistent_inputs():
    lp = torch.log(torch.rand(1000, dtype=torch.float32).clamp(min=1e-6))
    sp = torch.rand(1000)  # arbitrary, often inconsistent with lp
    assert (token_energy(lp, sp) >= 0).all()


# --------------------------------------------------------------------------------------------
# Properties (hypothesis)
member_st = st.builds(
    lambda n, ps, fr, r: (n, ps[:n], fr[:n], r),
    st.integers(0, 7),
    st.lists(st.floats(0.02, 0.98), min_size=7, max_size=7),
    st.lists(st.floats(0.0, 1.0), min_size=7, max_size=7),
    st.sampled_from([0.0, 1.0, -1.0, 0.25]),
)
groups_st = st.lists(st.lists(member_st, min_size=1, max_size=5), min_size=1, max_size=4)


def to_members(groups) -> list[Member]:
    out = []
    for g, mems in enumerate(groups):
        for _n, ps, fr, r in mems:
            pairs = [energy_pair(p, f) for p, f in zip(ps, fr, strict=True)]
            out.append(Member(f"g{g}", [a for a, _ in pairs], [b for _, b in pairs], r))
    return out


@settings(max_examples=60, deadline=None)
@given(groups_st, st.data())
def test_prop_tool_spans_leave_model_token_advantages_unchanged(groups, data):
    mem = to_members(groups)
    base = otb(layout(mem))
    spans = [data.draw(st.lists(st.tuples(st.integers(0, 8), st.integers(1, 5)), max_size=3)) for _ in mem]
    d = layout(mem, spans=spans)
    A = otb(d)
    assert (A[d["loss_mask"] == 0] == 0).all()
    got = model_token_values(A, d["loss_mask"])
    want = model_token_values(base, layout(mem)["loss_mask"])
    for g_row, w_row in zip(got, want, strict=True):
        assert g_row == pytest.approx(w_row, abs=1e-12)
    assert torch.allclose(A, ref(layout(mem, spans=spans, junk=0.0)), atol=1e-12, rtol=0)


@settings(max_examples=60, deadline=None)
@given(groups_st, st.randoms(use_true_random=False))
def test_prop_permuting_members_permutes_result(groups, rnd):
    mem = to_members(groups)
    perm = list(range(len(mem)))
    rnd.shuffle(perm)
    A = otb(layout(mem))
    P = otb(layout([mem[i] for i in perm]))
    T = min(A.shape[1], P.shape[1])
    assert torch.allclose(P[:, :T], A[perm, :T], atol=1e-12, rtol=0)


@settings(max_examples=60, deadline=None)
@given(groups_st, st.sampled_from([1.0, -1.0, 3.5]))
def test_prop_constant_rewards_give_zero_except_zero_tail(groups, c):
    mem = to_members(groups)
    for m in mem:
        m.reward = c
    d = layout(mem)
    A = otb(d)
    mask = d["loss_mask"] != 0
    lens = mask.sum(dim=1)
    for i, m in enumerate(mem):
        peers = [j for j, o in enumerate(mem) if o.group == m.group and lens[j] > 0]
        others = sorted((int(lens[j]) for j in peers if j != i), reverse=True)
        second = others[0] if others else 0
        vals = A[i][mask[i]]
        for k, v in enumerate(vals.tolist()):
            # Energies here are ≥ (1 − 0.98)² = 4e-4 ≫ eps: no zero-energy positions.
            if k >= second:  # only member alive (zero tail / group of one): A = return
                assert v == pytest.approx(c, abs=1e-12)
            else:
                # A = c·eps / (ΣW + eps) exactly; ΣW ≥ 2 members × (1 − 0.98)² here.
                assert abs(v) <= abs(c) * 1e-8 / 8e-4 + 1e-12


@settings(max_examples=40, deadline=None)
@given(st.lists(member_st, min_size=1, max_size=6))
def test_prop_group_of_one_gives_returns(mems):
    mem = to_members([[x] for x in mems])  # every member its own group
    mem = [Member(f"solo{i}", m.logprobs, m.spi2, m.reward) for i, m in enumerate(mem)]
    d = layout(mem)
    for zt in (True, False):
        A = otb(d, zero_tail=zt)
        G = torch.where(d["loss_mask"] != 0, returns_to_go(d["token_rewards"], d["loss_mask"]), 0.0)
        assert torch.equal(A, G)


@settings(max_examples=40, deadline=None)
@given(groups_st, st.data())
def test_prop_masked_positions_are_zero(groups, data):
    mem = to_members(groups)
    spans = [data.draw(st.lists(st.tuples(st.integers(0, 8), st.integers(1, 3)), max_size=2)) for _ in mem]
    d = layout(mem, spans=spans, junk=float("inf"))
    A = otb(d, is_weights=d["is_weights"])
    assert torch.isfinite(A).all()
    assert (A[d["loss_mask"] == 0] == 0).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    rng = random.Random(1)
    d = layout(random_members(rng, n_groups=16, lengths=(0, 30)), junk=0.0)
    cpu = otb(d)
    dc = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in d.items()}
    assert torch.allclose(otb(dc).cpu(), cpu, atol=1e-12)


def test_tiny_energy_prefix_after_a_large_batch_is_exact():
    # Sums over earlier rows must not leak rounding error into a later row whose W is ~eps: there the
    # baseline G·W/(W + eps) is most sensitive (spec §3.5). Exact values by hand, w = 1.5·(1 − p)².
    rng = random.Random(9)
    mem = random_members(rng, n_groups=100, group_sizes=(2, 2), lengths=(150, 200))
    ps = {6: [1 - 1e-4] * 3 + [0.6] * 3, 5: [1 - 1e-4] * 3 + [0.6] * 2}
    for r, n in ((1.0, 6), (0.0, 5)):
        pairs = [energy_pair(p, 0.5) for p in ps[n]]
        mem.append(Member("confident", [a for a, _ in pairs], [b for _, b in pairs], r))
    d = layout(mem, junk=0.0)
    got = otb(d)
    # Everything else against the loop reference.
    assert torch.allclose(got[:-2], ref(d)[:-2], atol=1e-12, rtol=0)
    W = {n: [sum(1.5 * (1 - p) ** 2 for p in ps[n][: k + 1]) for k in range(n)] for n in (5, 6)}
    for k in range(5):
        # Tolerance: Σπ² ≈ 1 carries its (1 − p)²-sized remainder with ~8 digits only (input limit).
        base = W[6][k] * 1.0 / (W[6][k] + W[5][k] + 1e-8)
        assert got[-2, k].item() == pytest.approx(1.0 - base, abs=1e-8)
        assert got[-1, k].item() == pytest.approx(0.0 - base, abs=1e-8)
    # No leakage from the 200 rows before: the same group alone gives the same numbers to 1e-15.
    alone = otb(layout(mem[-2:], junk=0.0))
    assert torch.allclose(got[-2:, : alone.shape[1]], alone, atol=1e-15, rtol=0)
    assert got[-2, 5].item() == 1.0  # zero tail
    # The confident prefix really is in the sensitive regime: ΣW there is of order eps.
    assert 0.05 < abs(got[-1, 0].item()) < 0.95


@pytest.mark.parametrize("zero_tail", [True, False])
def test_intermediate_rewards_match_loop_reference(zero_tail):
    # Rewards on several model tokens per row (per-turn rewards), plus some on tool tokens (dropped).
    rng = random.Random(21)
    mem = random_members(rng, n_groups=10, lengths=(0, 12))
    spans = [[(rng.randint(0, 12), rng.randint(1, 3))] for _ in mem]
    d = layout(mem, spans=spans, junk=0.0)
    g = torch.Generator().manual_seed(0)
    extra = torch.randn(d["token_rewards"].shape, generator=g, dtype=F64)
    d["token_rewards"] = d["token_rewards"] + extra * (torch.rand(extra.shape, generator=g) < 0.3)
    got, want = otb(d, zero_tail=zero_tail), ref(d, zero_tail=zero_tail)
    assert torch.allclose(got, want, atol=1e-12, rtol=0)
    G = returns_to_go(d["token_rewards"], d["loss_mask"])
    assert not torch.allclose(G * d["loss_mask"], d["token_rewards"].sum(1, keepdim=True) * d["loss_mask"])
