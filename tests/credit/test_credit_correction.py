"""OTB under the off-policy correction (otb-spec.md §3.5): with ρ̄ ≡ 1 it is today's OTB bit for bit; with
ρ̄ it matches the plain-loop reference that scales each energy increment by ρ̄²."""

from __future__ import annotations

import random

import pytest
import torch

from agentrl.credit import optimal_token_baseline

from .credit_data import layout, random_members
from .otb_reference import tir_otb_loop


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_otb_with_rho_one_is_bit_for_bit_todays_otb(dtype):
    rng = random.Random(3)
    for _ in range(20):
        d = layout(random_members(rng, n_groups=4), dtype=dtype)
        args = (d["token_rewards"], d["loss_mask"], d["logprobs"], d["sum_pi_squared"], d["group_ids"])
        plain = optimal_token_baseline(*args)
        ones = optimal_token_baseline(*args, is_weights=torch.ones_like(d["token_rewards"]))
        assert torch.equal(plain, ones)


def test_otb_with_rho_matches_the_loop_reference():
    rng = random.Random(4)
    for _ in range(20):
        d = layout(random_members(rng, n_groups=4, with_rho=True), junk=0.0)
        args = (d["token_rewards"], d["loss_mask"], d["logprobs"], d["sum_pi_squared"], d["group_ids"])
        got = optimal_token_baseline(*args, is_weights=d["is_weights"])
        ref = tir_otb_loop(*args, is_weights=d["is_weights"])
        torch.testing.assert_close(got, ref, rtol=1e-7, atol=1e-9)
