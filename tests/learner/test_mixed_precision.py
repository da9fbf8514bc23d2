"""Mixed precision on CPU: fp32 master weights under bf16 compute learn at the default learning rate; bf16
master weights lose most updates, and the learner's update metric says so; the sampler's bf16 copy follows
the master weights and its checksum is the master's cast to bf16."""

from __future__ import annotations

import asyncio
import copy
import math

import pytest
import torch

from agentrl.learner import Learner, LearnerConfig
from agentrl.learner.optim_step import measured_step
from agentrl.models import tiny_model
from agentrl.policies import HFPolicy
from agentrl.precision import resolve_precision, served_copy, weights_digest
from agentrl.protocols import WeightUpdate
from agentrl.trainers.step_metrics import stalled_update_warning
from agentrl.weights import weights_checksum

from .fsdp_case import build_case

LR = 3e-6  # agentrl train's default learning rate


def _batch():
    _, batch, adv, _ = build_case()
    return batch, adv


def _snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _changed_frac(before, model) -> float:
    after = model.state_dict()
    changed = sum(int((after[k] != v).sum()) for k, v in before.items())
    return changed / sum(v.numel() for v in before.values())


def test_measured_step_in_slices_is_the_plain_step_exactly_and_measures_it():
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    b = copy.deepcopy(a)
    x = torch.randn(8, 16)
    for model in (a, b):
        model(x).pow(2).sum().backward()
    opt_a = torch.optim.AdamW(a.parameters(), lr=1e-2, weight_decay=0.1)
    opt_b = torch.optim.AdamW(b.parameters(), lr=1e-2, weight_decay=0.1)
    before = _snapshot(b)
    opt_a.step()
    stats = measured_step(opt_b, slice_elems=100)  # several slices, one parameter split across none
    for (n, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), n
        assert pb.grad is None
    diff = sum(float(((b.state_dict()[k] - v) ** 2).sum()) for k, v in before.items())
    norm = sum(float((v**2).sum()) for v in before.values())
    assert stats.rel_norm == pytest.approx(math.sqrt(diff / norm), rel=1e-5)
    # Every element here has a gradient, so "unchanged among those with one" is simply "unchanged".
    assert all(bool((p.grad != 0).all()) for p in a.parameters())
    assert stats.unchanged_frac == pytest.approx(1 - _changed_frac(before, b), abs=1e-9)


def test_bf16_compute_over_fp32_master_changes_nearly_every_weight_at_the_default_lr(tok):
    model = tiny_model(tok, seed=1)  # fp32: the master weights
    batch, adv = _batch()
    prec = resolve_precision("bfloat16", "float32", torch.device("cpu"))
    assert prec.autocast and not prec.shares_weights and prec.sampler == torch.bfloat16
    learner = Learner(model, LearnerConfig(lr=LR, bf16_autocast=prec.autocast, policy_loss="reinforce"))
    sampler = HFPolicy(copy.deepcopy(model).to(prec.sampler), tok, stop_token_ids=[0], device="cpu")
    before, served_before = _snapshot(model), _snapshot(sampler.model)
    for version in (1, 2):
        stats = learner.step(batch, adv)
        assert stats.unchanged_frac < 0.01 and stats.update_rel_norm > 0
        assert stalled_update_warning({"learn/unchanged_frac": stats.unchanged_frac}) is None
        asyncio.run(sampler.load_weights(WeightUpdate(version, model.state_dict())))
    assert next(model.parameters()).dtype == torch.float32
    assert _changed_frac(before, model) > 0.99
    # The bf16 copy changes where the accumulated fp32 change crossed a bf16 rounding step (~17 % of the
    # weights after two steps here): small updates accumulate in the master instead of vanishing.
    assert _changed_frac(served_before, sampler.model) > 0.1
    # The sampler holds exactly the master weights cast to its dtype, and its checksum says so.
    served = served_copy(model.state_dict(), prec.sampler)
    own = sampler.model.state_dict()
    assert weights_checksum(own) == weights_checksum(served)
    digest = weights_digest(served, "served")
    assert str(digest).startswith("served bfloat16 sha256:")
    assert digest != weights_digest(model.state_dict(), "master")


def test_pure_bf16_master_weights_lose_most_updates_and_the_metric_warns(tok):
    model = tiny_model(tok, seed=1, dtype=torch.bfloat16)
    batch, adv = _batch()
    prec = resolve_precision("bfloat16", "bfloat16", torch.device("cpu"))
    warning = prec.warning()
    assert warning is not None and "rounds away" in warning
    learner = Learner(model, LearnerConfig(lr=LR, policy_loss="reinforce"))
    before = _snapshot(model)
    stats = [learner.step(batch, adv) for _ in range(2)]
    lost = 1 - _changed_frac(before, model)
    assert lost > 0.5  # the point of fp32 master weights
    assert stats[-1].unchanged_frac > 0.5
    message = stalled_update_warning({"learn/unchanged_frac": stats[-1].unchanged_frac})
    assert message is not None and "unchanged" in message


def test_precision_rules():
    from agentrl.errors import ConfigError

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    p = resolve_precision("auto", "float32", cpu)
    assert (p.master, p.compute, p.sampler) == (torch.float32,) * 3 and p.shares_weights and not p.autocast
    p = resolve_precision("auto", "float32", cuda)  # resolving needs no GPU
    assert (p.master, p.compute, p.sampler) == (torch.float32, torch.bfloat16, torch.bfloat16)
    assert p.describe() == "master float32, compute bfloat16, sampler bfloat16"
    with pytest.raises(ConfigError, match="--dtype bfloat16"):
        resolve_precision("float32", "bfloat16", cpu)
    with pytest.raises(ConfigError, match="--master-dtype"):
        resolve_precision("auto", "float16", cpu)


def test_an_unmeasured_or_skipped_step_reports_nan(tok):
    model = tiny_model(tok, seed=1)
    batch, adv = _batch()
    stats = Learner(model, LearnerConfig(lr=LR, measure_update=False)).step(batch, adv)
    assert math.isnan(stats.unchanged_frac) and math.isnan(stats.update_rel_norm)
    assert stalled_update_warning({"learn/unchanged_frac": stats.unchanged_frac}) is None


def test_a_step_without_gradient_has_nothing_to_move_and_is_not_a_stalled_update(tok):
    model = tiny_model(tok, seed=1)
    batch, adv = _batch()
    stats = Learner(model, LearnerConfig(lr=LR)).step(batch, torch.zeros_like(adv))  # all advantages 0
    assert stats.update_rel_norm == 0.0 and math.isnan(stats.unchanged_frac)
    assert stalled_update_warning({"learn/unchanged_frac": stats.unchanged_frac}) is None


def test_measured_step_estimates_a_large_tensor_from_its_sample():
    # 1 M elements: sampled (1/16 in runs). A third of them get no gradient, and a known share of the others
    # is too large for the step to move in bf16; the estimate must match the exact counts closely.
    torch.manual_seed(0)
    n = 1 << 20
    w = torch.nn.Parameter((torch.rand(n) * 2 + 0.5).to(torch.bfloat16))
    exact_before = w.detach().clone()
    g = torch.randn(n)
    g[torch.rand(n) < 1 / 3] = 0
    w.grad = g.to(torch.bfloat16)
    opt = torch.optim.SGD([w], lr=3e-3)  # moves small weights, rounds away on the large ones in bf16
    stats = measured_step(opt)
    has = g != 0
    stuck = float(((w.detach() == exact_before) & has).sum()) / float(has.sum())
    assert 0.05 < stuck < 0.95  # a mix, so the estimate has something to get right
    assert stats.unchanged_frac == pytest.approx(stuck, abs=0.01)
    d = (w.detach().float() - exact_before.float()).norm() / exact_before.float().norm()
    assert stats.rel_norm == pytest.approx(float(d), rel=0.02)
