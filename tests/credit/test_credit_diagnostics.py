"""Variance-proxy diagnostics (spec §4)."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.credit import VarianceProxy, variance_proxy_metrics


def setup():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 3.0, 9.0], [-1.0, -1.0, -1.0]], dtype=torch.float64)
    p = torch.tensor([[0.5, 0.8, 0.3], [0.9, 0.5, 0.2]], dtype=torch.float64)
    sp = torch.tensor([[0.45, 0.66, 0.3], [0.815, 0.3, 0.1]], dtype=torch.float64)  # consistent
    return adv, mask, p.log(), sp, p


def test_by_hand():
    adv, mask, lp, sp, p = setup()
    w = 1 - 2 * p + sp
    w_hat = [float(w[0, :2].sum()), float(w[1].sum())]
    a_bar = [2.0, -1.0]
    power = (a_bar[0] ** 2 * w_hat[0] + a_bar[1] ** 2 * w_hat[1]) / 2
    m = variance_proxy_metrics(adv, mask, lp, sp, grad_norm=0.5)
    assert isinstance(m, VarianceProxy)
    assert m.total_power == pytest.approx(power)
    assert m.signal_strength == pytest.approx(0.25)
    assert m.pure_noise == pytest.approx(max(0.0, (power - 0.25) / 1))
    assert m.expected_a_squared == pytest.approx(2.5)
    assert m.expected_w == pytest.approx(sum(w_hat) / 2)
    assert m.num_trajectories == 2
    d = m.to_dict()
    assert d["variance_proxy/proxy2_total_power"] == pytest.approx(power)
    with pytest.raises(AttributeError):
        m.total_power = 1.0  # type: ignore[misc]


def test_without_grad_norm_and_with_is_weights():
    adv, mask, lp, sp, p = setup()
    rho = torch.tensor([[1.0, 2.0, 5.0], [0.5, 0.5, 1.0]], dtype=torch.float64)
    m = variance_proxy_metrics(adv, mask, lp, sp, is_weights=rho)
    assert m.signal_strength is None and m.pure_noise is None
    assert "variance_proxy/proxy3_pure_noise" not in m.to_dict()
    w = 1 - 2 * p + sp
    rho_bar = [1.5, 2 / 3]
    power = (rho_bar[0] ** 2 * 4 * float(w[0, :2].sum()) + rho_bar[1] ** 2 * float(w[1].sum())) / 2
    assert m.total_power == pytest.approx(power)
    assert m.expected_w == pytest.approx(
        (float((w[0, :2] * rho[0, :2] ** 2).sum()) + float((w[1] * rho[1] ** 2).sum())) / 2
    )
    m2 = variance_proxy_metrics(adv, mask, lp, sp, grad_norm=math.nan)
    assert m2.signal_strength is None
