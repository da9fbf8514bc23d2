"""Typed estimators: each config computes what its pure function computes with the same options."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from agentrl.config import config_from_dict, config_to_dict
from agentrl.credit import (
    ESTIMATOR_CONFIGS,
    ESTIMATORS,
    GRPO,
    OPO,
    OTB,
    RLOO,
    AdvantageEstimator,
    Estimator,
    NoBaseline,
    compute_advantages,
    estimator_config,
)
from agentrl.errors import ConfigError

from .credit_data import layout, random_members

CONFIGS = [
    OTB(),
    OTB(zero_tail=False),
    OTB(eps=1e-3),
    GRPO(),
    GRPO(norm_by_std=False),
    GRPO(eps=0.5),
    RLOO(),
    OPO(),
    NoBaseline(),
]


def test_every_named_function_has_a_typed_config():
    assert list(ESTIMATOR_CONFIGS) == ["otb", "grpo", "rloo", "opo", "none"]
    assert set(ESTIMATOR_CONFIGS) == set(ESTIMATORS)
    for name, cls in ESTIMATOR_CONFIGS.items():
        assert cls.name == name and issubclass(cls, AdvantageEstimator)


@pytest.mark.parametrize("est", CONFIGS, ids=str)
def test_typed_config_matches_the_pure_function_with_its_options(est):
    rng = random.Random(7)
    # Tool spans between model tokens and NaN junk off the mask: the typed path must ignore both too.
    members = random_members(rng, 6, group_sizes=(1, 5), lengths=(0, 9), rewards=(0.0, 0.3, 1.0))
    spans = [[(rng.randint(0, 3), rng.randint(1, 3))] for _ in members]
    d = layout(members, spans)
    args = (d["token_rewards"], d["loss_mask"], d["logprobs"], d["sum_pi_squared"], d["group_ids"])
    want = ESTIMATORS[est.name](*args, **dataclasses.asdict(est))
    got = est.advantages(*args)
    assert torch.equal(got, want)
    assert got.abs().sum() > 0  # the data give every estimator something to do


def test_importance_weights_go_through_the_one_interface():
    rng = random.Random(11)
    d = layout(random_members(rng, 5, group_sizes=(3, 4), lengths=(2, 8), rewards=(0.0, 1.0)))
    args = (d["token_rewards"], d["loss_mask"], d["logprobs"], d["sum_pi_squared"], d["group_ids"])
    rho = torch.rand(d["loss_mask"].shape, generator=torch.Generator().manual_seed(0)) + 0.5
    # OTB scales its energy by ρ̄² (the pure function's is_weights); the typed call and the named one agree.
    want = ESTIMATORS["otb"](*args, is_weights=rho, zero_tail=True, eps=1e-8)
    assert torch.equal(OTB().advantages(*args, is_weights_B_T=rho), want)
    assert torch.equal(compute_advantages("otb", *args, is_weights=rho), want)
    assert not torch.equal(want, OTB().advantages(*args))  # the weights changed the baseline
    # A group baseline does not read them (the loss applies ρ̄ to its advantages), and says so by name.
    assert OTB.uses_importance_weights and not GRPO.uses_importance_weights
    assert torch.equal(GRPO().advantages(*args, is_weights_B_T=rho), GRPO().advantages(*args))
    with pytest.raises(ConfigError, match=r"estimator 'grpo' does not take \['is_weights'\]"):
        compute_advantages("grpo", *args, is_weights=rho)


def test_options_change_the_result():
    rng = random.Random(3)
    d = layout(random_members(rng, 4, group_sizes=(3, 5), lengths=(2, 9), rewards=(0.0, 1.0, 3.0)))
    args = (d["token_rewards"], d["loss_mask"], d["logprobs"], d["sum_pi_squared"], d["group_ids"])
    assert not torch.allclose(GRPO().advantages(*args), GRPO(norm_by_std=False).advantages(*args))


def test_str_names_the_estimator_and_its_changed_options():
    assert str(OTB()) == "otb" and str(NoBaseline()) == "none"
    assert str(GRPO(norm_by_std=False)) == "grpo(norm_by_std=False)"
    assert str(OTB(zero_tail=False, eps=0.01)) == "otb(zero_tail=False, eps=0.01)"


def test_bad_options_are_refused():
    with pytest.raises(ConfigError, match="eps must be a finite number >= 0, got -1"):
        OTB(eps=-1)
    with pytest.raises(ConfigError, match="eps must be a finite number >= 0, got nan"):
        GRPO(eps=float("nan"))
    with pytest.raises(ConfigError, match="norm_by_std must be true or false, got 'no'"):
        GRPO(norm_by_std="no")  # type: ignore[arg-type]
    x = torch.zeros(1, 2)
    with pytest.raises(ConfigError, match="needs logprobs"):
        OTB().advantages(x, x, None, None, ["a"])
    with pytest.raises(ConfigError, match="group_ids"):
        OTB().advantages(x, x, x, x, None)


def test_config_json_forms():
    # Old run directories say "estimator": "otb"; new ones record the options.
    assert estimator_config("otb") == OTB()
    assert estimator_config({"name": "grpo", "norm_by_std": False}) == GRPO(norm_by_std=False)
    est = GRPO(eps=0.1)
    assert estimator_config(est) is est
    for est in CONFIGS:
        form = config_to_dict(est)
        assert form["name"] == est.name
        assert estimator_config(form) == est
        assert config_from_dict(Estimator, form) == est  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"unknown name 'ppo'; expected one of \['otb', 'grpo'"):
        estimator_config("ppo")
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) of rloo \['estimator.eps'\]; known: none"):
        estimator_config({"name": "rloo", "eps": 0.1})
    with pytest.raises(ConfigError, match="estimator: eps must be a finite number"):
        estimator_config({"name": "otb", "eps": -1.0})
