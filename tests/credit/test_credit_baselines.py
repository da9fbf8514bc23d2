"""GRPO, RLOO, OPO, no baseline, and the compute_advantages dispatcher."""

from __future__ import annotations

import math
import random

import pytest
import torch

from agentrl.credit import ESTIMATORS, compute_advantages
from agentrl.errors import ConfigError

from .credit_data import layout, random_members


def batch(rewards, lengths, groups):
    B, T = len(rewards), max(lengths)
    mask = torch.zeros(B, T, dtype=torch.float64)
    rew = torch.zeros(B, T, dtype=torch.float64)
    for i, (r, n) in enumerate(zip(rewards, lengths, strict=True)):
        mask[i, :n] = 1
        if n:
            rew[i, n - 1] = r
    return rew, mask, list(groups)


def row_values(A, mask):
    return [A[i][mask[i] != 0].unique().tolist() for i in range(A.shape[0])]


def test_grpo_by_hand():
    rew, mask, g = batch([1.0, 0.0, 0.0, 2.0, 5.0], [3, 2, 4, 1, 2], "aaabc")
    A = compute_advantages("grpo", rew, mask, None, None, g, norm_by_std=False)
    assert row_values(A, mask) == [
        [pytest.approx(2 / 3)],
        [pytest.approx(-1 / 3)],
        [pytest.approx(-1 / 3)],
        [2.0],
        [5.0],
    ]
    An = compute_advantages("grpo", rew, mask, None, None, g, eps=0.0)
    std = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)  # unbiased
    assert An[0, 0].item() == pytest.approx((2 / 3) / std)
    assert An[3, 0].item() == 2.0  # group of one: A = R
    assert (A[mask == 0] == 0).all()


def test_rloo_by_hand():
    rew, mask, g = batch([1.0, 0.0, 0.5, 3.0], [2, 2, 3, 1], "aaab")
    A = compute_advantages("rloo", rew, mask, None, None, g)
    assert A[0, 0].item() == pytest.approx(1 - 0.25)
    assert A[1, 0].item() == pytest.approx(0 - 0.75)
    assert A[2, 2].item() == pytest.approx(0.5 - 0.5)
    assert A[3, 0].item() == 3.0


def test_opo_by_hand():
    rew, mask, g = batch([1.0, 0.0, 1.0], [4, 2, 2], "aaa")
    A = compute_advantages("opo", rew, mask, None, None, g)
    b = (4 * 1 + 2 * 0 + 2 * 1) / 8
    assert row_values(A, mask) == [[pytest.approx(1 - b)], [pytest.approx(-b)], [pytest.approx(1 - b)]]


def test_none_is_reward_to_go():
    rew = torch.tensor([[0.0, 1.0, 0.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    A = compute_advantages("none", rew, mask, None, None, None)
    assert A.tolist() == [[3.0, 3.0, 0.0, 2.0]]


@pytest.mark.parametrize("name", ["grpo", "rloo", "opo"])
def test_constant_rewards_give_zero(name):
    rng = random.Random(2)
    d = layout(random_members(rng, 8, group_sizes=(2, 5), lengths=(1, 9), rewards=(0.7,)), junk=0.0)
    A = compute_advantages(name, d["token_rewards"], d["loss_mask"], None, None, d["group_ids"])
    assert A.abs().max() < 1e-9


def test_empty_rows_do_not_count():
    rew, mask, g = batch([1.0, 0.0, 9.0], [2, 2, 0], "aaa")
    rew = torch.cat([rew, torch.zeros(3, 1, dtype=rew.dtype)], 1)
    mask = torch.cat([mask, torch.zeros(3, 1, dtype=mask.dtype)], 1)
    for name in ("grpo", "rloo", "opo"):
        A = compute_advantages(name, rew, mask, None, None, g)
        assert (A[2] == 0).all()
    assert compute_advantages("rloo", rew, mask, None, None, g)[0, 0].item() == 1.0


def test_dispatcher_runs_all_estimators_with_one_convention():
    rng = random.Random(4)
    d = layout(random_members(rng, 5), junk=0.0)
    args = (d["token_rewards"], d["loss_mask"], d["logprobs"], d["sum_pi_squared"], d["group_ids"])
    assert set(ESTIMATORS) == {"otb", "grpo", "rloo", "opo", "none"}
    for name in ESTIMATORS:
        A = compute_advantages(name, *args)
        assert A.shape == d["loss_mask"].shape
        assert (A[d["loss_mask"] == 0] == 0).all()


def test_dispatcher_errors():
    x = torch.zeros(1, 2)
    with pytest.raises(ConfigError, match="unknown advantage estimator"):
        compute_advantages("ppo", x, x, x, x, ["a"])
    with pytest.raises(ConfigError, match="does not take"):
        compute_advantages("rloo", x, x, x, x, ["a"], norm_by_std=True)
    with pytest.raises(ConfigError, match="needs logprobs"):
        compute_advantages("otb", x, x, None, None, ["a"])
    with pytest.raises(ConfigError, match="group_ids"):
        compute_advantages("grpo", x, x, None, None, None)
