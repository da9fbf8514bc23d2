"""Activation checkpointing (``--learner.gradient-checkpointing auto|on|off``): on and off take the same step
(packed and padded rows, with and without LoRA), ``on`` really recomputes the decoder layers, ``auto`` is off
on CPU, the old boolean spellings still read, and the fit rule of ``auto`` on CUDA."""

from __future__ import annotations

import pytest
import torch

from agentrl.config import config_from_args, config_from_dict
from agentrl.errors import ConfigError
from agentrl.learner import Learner, LearnerConfig
from agentrl.learner.checkpointing import ActivationCost, measure_activation_cost, needs_checkpointing
from agentrl.lora import LoraConfig, apply_lora
from agentrl.trainers.cli import build_parser
from agentrl.trainers.train import TrainConfig

from .test_learner_packing import ragged_batch
from .tiny import tiny_qwen2

LENGTHS = [13, 5, 30, 22, 9, 17]


def _layer_calls(model: torch.nn.Module) -> list[int]:
    """A counter of the decoder layers' MLP activation calls: a checkpointed layer runs them again in
    backward. (transformers keeps the layer's own hooks out of the recompute, and torch stops recomputing once
    the saved tensors it needs are back, before the MLP's output: the activation inside it is counted.)"""
    calls = [0]
    for layer in model.get_decoder().layers:
        layer.mlp.act_fn.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def _step(mode: str, *, pack: bool, lora: bool) -> tuple[dict[str, torch.Tensor], float, int, int]:
    """One SGD step (lr 1, no clipping: the update is minus the gradient) on a fresh tiny model: the trainable
    weights after it, the loss, the layer forward calls and the recomputed micro-batches."""
    model = tiny_qwen2(seed=3)
    if lora:
        model = apply_lora(model, LoraConfig(rank=4, alpha=8.0), name="tiny-test", seed=11).model
    batch = ragged_batch(LENGTHS, seed=4)
    adv = torch.randn(batch.loss_mask_B_T.shape, generator=torch.Generator().manual_seed(5))
    cfg = LearnerConfig(
        gradient_checkpointing=mode,  # type: ignore[arg-type]
        pack_sequences=pack,
        micro_batch_tokens=64,
        max_grad_norm=None,
        entropy_coef=0.01,
        chunk_size=16,
    )
    trainable = [p for p in model.parameters() if p.requires_grad]
    learner = Learner(model, cfg, optimizer=torch.optim.SGD(trainable, lr=1.0))
    learner.score(batch)  # the one-time packing probe runs here, before the count starts
    calls = _layer_calls(model)
    st = learner.step(batch, adv * batch.loss_mask_B_T)
    after = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return after, st.loss, calls[0], st.recomputed_micro_batches


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("pack", [True, False], ids=["packed", "padded"])
def test_on_and_off_take_the_same_step(pack, lora):
    on, loss_on, calls_on, _ = _step("on", pack=pack, lora=lora)
    off, loss_off, calls_off, _ = _step("off", pack=pack, lora=lora)
    assert calls_on == 2 * calls_off > 0  # every layer ran again in backward: checkpointing was on
    assert loss_on == pytest.approx(loss_off, rel=1e-6, abs=1e-7)
    assert on.keys() == off.keys() and on
    for name in on:
        assert (on[name] - off[name]).abs().max() <= 1e-6, name


def test_auto_is_off_on_cpu():
    _, _, calls_auto, recomputed = _step("auto", pack=True, lora=False)
    _, _, calls_off, _ = _step("off", pack=True, lora=False)
    assert calls_auto == calls_off and recomputed == 0


def test_modes_and_their_old_boolean_spellings():
    assert LearnerConfig().checkpointing == "auto"
    for given, want in ((True, "on"), (False, "off"), ("true", "on"), ("false", "off"), ("off", "off")):
        cfg = LearnerConfig(gradient_checkpointing=given)  # type: ignore[arg-type]
        assert cfg.checkpointing == want and cfg.gradient_checkpointing == given  # kept as written
    with pytest.raises(ConfigError, match="gradient_checkpointing"):
        LearnerConfig(gradient_checkpointing="sometimes")  # type: ignore[arg-type]
    # An older run's config.json (a boolean) and the old flag still read.
    assert config_from_dict(LearnerConfig, {"gradient_checkpointing": False}).checkpointing == "off"
    for flag, want in (("true", "on"), ("auto", "auto"), ("on", "on")):
        ns = build_parser().parse_args(["train", "--learner.gradient-checkpointing", flag])
        assert config_from_args(TrainConfig, ns).learner.checkpointing == want


def test_on_needs_a_model_that_can_checkpoint():
    class Plain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Linear(2, 2)

    with pytest.raises(ConfigError, match="gradient_checkpointing on"):
        Learner(Plain(), LearnerConfig(gradient_checkpointing="on"))
    Learner(Plain(), LearnerConfig(gradient_checkpointing="auto"))  # auto falls back to off


def test_fit_rule_and_the_probe_needs_cuda():
    cost = ActivationCost(bytes_per_token=1000.0, fixed_bytes=5000.0, probe_tokens=(512, 1024))
    assert cost.need(10) == 15000.0
    assert not needs_checkpointing(10, cost, available=20_000)  # 15 kB of 18 kB usable
    assert needs_checkpointing(20, cost, available=20_000)  # 25 kB
    with pytest.raises(ConfigError, match="CUDA"):
        measure_activation_cost(lambda n: None, torch.device("cpu"))
