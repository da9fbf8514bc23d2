"""sum_pi_squared: log-sum-exp identity, chunking, extreme logits."""

from __future__ import annotations

import pytest
import torch

from agentrl.credit import sum_pi_squared
from agentrl.errors import ConfigError


@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000])
def test_matches_softmax_square_fp64(chunk):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, 37, 301, generator=g, dtype=torch.float64) * 4
    want = torch.softmax(z, dim=-1).square().sum(-1)
    got = sum_pi_squared(z, chunk_size=chunk)
    assert got.shape == (3, 37) and got.dtype == torch.float64
    assert (got - want).abs().max().item() < 1e-10


def test_temperature():
    z = torch.randn(50, 200, dtype=torch.float64) * 3
    want = torch.softmax(z / 0.6, dim=-1).square().sum(-1)
    assert (sum_pi_squared(z, temperature=0.6, chunk_size=9) - want).abs().max() < 1e-10


def test_fp32_and_bf16_inputs_give_fp32():
    z = torch.randn(20, 500)
    want = torch.softmax(z.double(), -1).square().sum(-1)
    assert (sum_pi_squared(z).double() - want).abs().max() < 1e-6
    out = sum_pi_squared(z.bfloat16())
    assert out.dtype == torch.float32
    assert (out.double() - torch.softmax(z.bfloat16().double(), -1).square().sum(-1)).abs().max() < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_finite_at_huge_logits(dtype):
    z = torch.zeros(4, 1000, dtype=dtype)
    z[0, 3] = 1e4  # one-hot
    z[1, :] = -1e4
    z[1, 5] = 1e4  # one-hot from the other side
    z[2, 1] = z[2, 2] = 1e4  # two tied maxima → 1/2
    z[3] = torch.linspace(-1e4, 1e4, 1000, dtype=dtype)
    out = sum_pi_squared(z, chunk_size=3)
    assert torch.isfinite(out).all()
    assert out[:3].tolist() == pytest.approx([1.0, 1.0, 0.5], abs=1e-12)
    assert 0 < out[3] <= 1
    # Negative huge logits everywhere (uniform): 1/V.
    assert sum_pi_squared(torch.full((1, 1000), -1e4, dtype=dtype)).item() == pytest.approx(1e-3)


def test_bad_arguments():
    with pytest.raises(ConfigError):
        sum_pi_squared(torch.zeros(2, 3), temperature=0)
    with pytest.raises(ConfigError):
        sum_pi_squared(torch.zeros(2, 3), chunk_size=0)
