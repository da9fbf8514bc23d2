"""The learner with LoRA adapters (peft): only adapter parameters are optimised, the base never moves,
log-probs and Σπ² go through the adapted model, and FSDP2 (2 gloo ranks) shards an adapted model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from agentrl.errors import ConfigError
from agentrl.learner import Learner, LearnerConfig
from agentrl.lora import LoraConfig, adapter_state, apply_lora

from .fsdp_case import build_case
from .test_learner_fsdp import free_port
from .tiny import naive_logprobs

HERE = Path(__file__).resolve().parent
LORA = LoraConfig(rank=4, alpha=8.0)


def adapted_case(model, cfg=LORA):
    return apply_lora(model, cfg, name="tiny-test", seed=11)


def _case():
    model, batch, adv, cfg_kw = build_case()
    return adapted_case(model), batch, adv, cfg_kw


def test_the_optimizer_holds_only_adapter_parameters_and_the_base_never_moves():
    adapted, batch, adv, cfg_kw = _case()
    model = adapted.model
    base_before = {k: v.clone() for k, v in model.state_dict().items() if "lora_" not in k}
    adapter_before = {k: v.clone() for k, v in adapter_state(model).items()}
    learner = Learner(model, LearnerConfig(**{**cfg_kw, "lr": 1e-2}))
    held = {id(p) for g in learner.optimizer.param_groups for p in g["params"]}
    names = [n for n, p in model.named_parameters() if id(p) in held]
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    assert len(names) == 2 * 7 * 2  # A and B of 7 linear layers in each of the 2 blocks ("all-linear")
    lp0, _ = learner.score(batch)
    for _ in range(2):  # two steps: the first moves only B (A's gradient is 0 while B is 0), the second both
        stats = learner.step(batch, adv)
        assert stats.update_rel_norm > 0
    after = model.state_dict()
    for k, v in base_before.items():
        assert torch.equal(after[k], v), f"base weight {k} moved"
    moved = [k for k, v in adapter_before.items() if not torch.equal(after[k], v)]
    assert len(moved) == len(adapter_before)  # every lora_A and lora_B changed
    lp1, _ = learner.score(batch)
    assert (lp1 - lp0).abs().max() > 1e-4  # the adapter changes the policy


def test_scores_go_through_the_adapted_model():
    adapted, batch, _, cfg_kw = _case()
    model = adapted.model
    with torch.no_grad():  # a nonzero adapter, so the adapted model differs from its base
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(n)))
    learner = Learner(model, LearnerConfig(**cfg_kw))
    lp, sp = learner.score(batch)
    want_lp, want_sp, _ = naive_logprobs(model, batch.input_ids_B_T, batch.attention_mask_B_T)
    m = batch.loss_mask_B_T != 0
    assert torch.allclose(lp[m].double(), want_lp[m], atol=1e-5)
    assert torch.allclose(sp[m].double(), want_sp[m], atol=1e-5)
    with adapted.peft_model.disable_adapter():  # the base alone scores differently: the adapter is used
        base_lp, _, _ = naive_logprobs(model, batch.input_ids_B_T, batch.attention_mask_B_T)
    assert (base_lp[m] - want_lp[m]).abs().max() > 1e-3


def test_a_fresh_adapter_leaves_the_model_exactly_at_its_base_and_is_seeded():
    model, batch, _, _ = build_case()
    base_lp, _, _ = naive_logprobs(model, batch.input_ids_B_T, batch.attention_mask_B_T)
    adapted = adapted_case(model)
    lp, _, _ = naive_logprobs(adapted.model, batch.input_ids_B_T, batch.attention_mask_B_T)
    assert torch.equal(lp, base_lp)  # lora_B starts at 0: the adapted model is the base, bit for bit
    again = adapted_case(build_case()[0])
    a, b = adapter_state(adapted.model), adapter_state(again.model)
    assert all(torch.equal(a[k], b[k]) for k in a)  # the same seed draws the same initial adapter


def test_bad_lora_settings_are_refused():
    with pytest.raises(ConfigError, match=r"lora\.rank"):
        LoraConfig(rank=-1)
    with pytest.raises(ConfigError, match=r"lora\.dropout"):
        LoraConfig(rank=2, dropout=1.0)
    with pytest.raises(ConfigError, match=r"lora\.targets"):
        apply_lora(build_case()[0], LoraConfig(rank=2, targets=("no_such_proj",)), name="t", seed=0)


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
def test_fsdp_with_adapters_matches_the_single_process_step(tmp_path):
    adapted, batch, adv, cfg_kw = _case()
    model = adapted.model
    trainable = [p for p in model.parameters() if p.requires_grad]
    learner = Learner(model, LearnerConfig(**cfg_kw), optimizer=torch.optim.SGD(trainable, lr=0.1))
    lp0, _ = learner.score(batch)
    base_sum = float(sum(v.double().sum() for k, v in model.state_dict().items() if "lora_" not in k))
    single = learner.step(batch, adv)
    single_lp, _ = learner.score(batch)
    assert (single_lp - lp0).abs().max() > 1e-4  # not vacuous: the step moved the policy
    port = str(free_port())
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "lora_fsdp_worker.py"), str(r), "2", port, str(outs[r])],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(2)
    ]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=240)[0].decode(errors="replace"))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("FSDP workers hung")
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)[-4000:]
    n_adapter = sum(p.numel() for p in trainable)
    res = [json.loads(o.read_text()) for o in outs]
    assert [r["base_sum"] is not None for r in res] == [True, False]
    for r in res:
        assert r["sharded"]
        assert r["optimizer_params"] == n_adapter
        assert r["loss"] == pytest.approx(single.loss, abs=1e-6)
        assert r["grad_norm"] == pytest.approx(single.grad_norm, rel=1e-5)
        if r["base_sum"] is not None:  # rank 0 gathered the full weights: the frozen base did not move
            assert r["base_sum"] == pytest.approx(base_sum, rel=1e-12)
        for k, row in enumerate(r["rows"]):
            got = torch.tensor(r["logprobs"][k])
            assert torch.allclose(got, single_lp[row, : got.numel()], atol=1e-5)
