"""The learner's attention implementation: ``auto`` resolves per device and availability, bad values are
refused clearly, the switch holds only during the learner's passes, and packed rows under flex_attention /
eager give the padded SDPA path's log-probs, Σπ² (and, where torch can differentiate it, gradients)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

from agentrl.batch import pack_rows
from agentrl.errors import ConfigError
from agentrl.learner import Learner, LearnerConfig
from agentrl.learner.attention import (
    AttentionAvailability,
    attention_availability,
    attention_in_effect,
    one_row_per_micro_batch,
    resolve_attention,
)
from agentrl.learner.forward import forward_logprobs, packing_support
from agentrl.learner.learner import plan_packed_micro_batches

from .test_learner_packing import ragged_batch
from .tiny import tiny_llama, tiny_qwen2

# torch.compile's first run of flex_attention warns in torch's and transformers' own code: deprecations
# (create_block_mask's _compile flag, torch.jit.script_method) and, on a busy CPU, inductor's slow probe of
# the vector instructions (it then compiles without them).
FLEX_COMPILE_WARNINGS = ("ignore::DeprecationWarning", "ignore::UserWarning")
NONE = AttentionAvailability(flash_attn=False, flex_attention=False)
FLEX = AttentionAvailability(flash_attn=False, flex_attention=True)
BOTH = AttentionAvailability(flash_attn=True, flex_attention=True)


@pytest.mark.parametrize(
    ("device", "avail", "want"),
    [
        ("cuda", BOTH, "flash_attention_2"),
        ("cuda", FLEX, "sdpa"),  # flex only when asked by name
        ("cuda", NONE, "sdpa"),
        ("cpu", BOTH, "sdpa"),
        ("cpu", NONE, "sdpa"),
        ("mps", FLEX, "sdpa"),
    ],
)
def test_auto_resolves_per_device_and_availability(device, avail, want):
    assert resolve_attention("auto", device, avail) == want


def test_explicit_choices_are_checked():
    assert resolve_attention("sdpa", "cpu", NONE) == "sdpa"
    assert resolve_attention("eager", "cuda", BOTH) == "eager"
    assert resolve_attention("flex_attention", "cuda", FLEX) == "flex_attention"
    assert resolve_attention("flash_attention_2", "cuda", BOTH) == "flash_attention_2"
    with pytest.raises(ConfigError, match="flash_attn package is not installed"):
        resolve_attention("flash_attention_2", "cuda", FLEX)
    with pytest.raises(ConfigError, match="needs CUDA, not cpu"):
        resolve_attention("flash_attention_2", "cpu", BOTH)
    with pytest.raises(ConfigError, match="backward on CUDA only"):
        resolve_attention("flex_attention", "cpu", BOTH)
    with pytest.raises(ConfigError, match="lacks it"):
        resolve_attention("flex_attention", "cuda", NONE)
    with pytest.raises(ConfigError, match=r"attention must be one of .*'flash'"):
        resolve_attention("flash", "cuda", BOTH)


def test_bad_config_value_is_refused():
    with pytest.raises(ConfigError, match=r"attention must be one of \('auto', 'sdpa'.*got 'flash'"):
        LearnerConfig(attention="flash")  # type: ignore[arg-type]
    assert LearnerConfig().attention == "auto"


def test_availability_probe_here():
    """This CPU machine's torch and transformers have flex_attention; flash_attn is never CUDA-less."""
    here = attention_availability("cpu")
    assert here.flex_attention and not here.flash_attn


def test_one_row_layouts():
    assert one_row_per_micro_batch("flex_attention") and one_row_per_micro_batch("flash_attention_2")
    assert not one_row_per_micro_batch("sdpa") and not one_row_per_micro_batch(None)


@pytest.mark.parametrize("budget", [None, 1, 16, 40, 100, 4096])
@pytest.mark.parametrize("seed", [0, 1])
def test_one_row_plan_covers_every_row_once_in_single_rows(budget, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 60, (37,), generator=g).tolist()
    plans = plan_packed_micro_batches(lengths, budget, one_row=True)
    assert sorted(i for mb in plans for row in mb for i in row) == list(range(len(lengths)))
    assert all(len(mb) == 1 for mb in plans)
    for (row,) in plans:  # a row fits the budget, or holds one longer sequence alone
        assert budget is None or sum(lengths[i] for i in row) <= budget or len(row) == 1
    if budget is None:
        assert len(plans) == 1


def test_switch_holds_only_inside_and_is_restored():
    model = tiny_qwen2()
    assert model.config._attn_implementation == "sdpa"
    with attention_in_effect(model, "eager"):
        assert model.config._attn_implementation == "eager"
        assert model.model.config._attn_implementation == "eager"
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError, match="boom"), attention_in_effect(model, "eager"):
        raise RuntimeError("boom")
    assert model.config._attn_implementation == "sdpa"
    with attention_in_effect(nn.Linear(2, 2), None):  # a plain module: nothing to switch
        pass
    plain = nn.Linear(2, 2)
    with pytest.raises(ConfigError, match="needs a transformers model"), attention_in_effect(plain, "eager"):
        pass


def test_packing_support_judges_the_learners_implementation():
    model = tiny_llama()
    assert packing_support(model, "flex_attention") is None
    assert "attention implementation 'made-up'" in str(packing_support(model, "made-up"))


def test_learner_eager_packed_equals_padded_sdpa_with_gradients():
    """An explicit implementation reaches the model in score and step (eager differentiates on CPU): packed
    eager rows give the padded SDPA scores, statistics and gradient; the model is SDPA again after."""
    model = tiny_qwen2()
    b = ragged_batch([13, 5, 30, 22, 1, 9, 17, 26], seed=3)
    adv = torch.randn(b.input_ids_B_T.shape, generator=torch.Generator().manual_seed(4))
    learners = []
    for pack, attention in ((False, "sdpa"), (True, "eager")):
        m = copy.deepcopy(model)
        cfg = LearnerConfig(
            pack_sequences=pack, attention=attention, max_grad_norm=None, micro_batch_tokens=48, chunk_size=7
        )
        learners.append(Learner(m, cfg, optimizer=torch.optim.SGD(m.parameters(), lr=1.0)))
    padded, packed = learners
    assert packing_support(packed.model) is None  # its probe runs the model's own SDPA, once per model
    seen: list[str] = []
    hook = packed.model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda mod, _args: seen.append(mod.config._attn_implementation)
    )
    (lp0, sp0), (lp1, sp1) = padded.score(b), packed.score(b)
    assert (lp1 - lp0).abs().max() < 2e-5 and (sp1 - sp0).abs().max() < 2e-6
    s0, s1 = padded.step(b, adv), packed.step(b, adv)
    hook.remove()
    assert seen and set(seen) == {"eager"}
    assert packed.model.config._attn_implementation == "sdpa"
    assert s1.grad_norm == pytest.approx(s0.grad_norm, rel=1e-4)
    assert s1.loss == pytest.approx(s0.loss, rel=1e-4, abs=1e-6)
    for p0, p1 in zip(padded.model.parameters(), packed.model.parameters(), strict=True):
        assert (p1 - p0).abs().max() < 1e-5


def test_learner_refuses_flex_on_cpu_clearly():
    with pytest.raises(ConfigError, match="backward on CUDA only"):
        Learner(tiny_qwen2(), LearnerConfig(attention="flex_attention"))


@pytest.mark.slow
@pytest.mark.filterwarnings(*FLEX_COMPILE_WARNINGS)
def test_flex_packed_forward_equals_padded_sdpa_on_cpu():
    """flex_attention runs forward (compiled by torch's CPU backend) but not backward on CPU in torch 2.13:
    the packed rows' log-probs, Σπ² and entropy under flex (one packed row, the learner's layout for it,
    and several rows with padding after their ends) equal the padded SDPA path's. Each shape compiles on its
    own: torch 2.13's CPU template for a dynamic-shape recompile does not build (C++ errors); CUDA uses
    triton's."""
    model = tiny_qwen2()
    b = ragged_batch([13, 5, 30, 22, 1, 9, 17])
    kw = dict(chunk_size=5, with_entropy=True, temperature=0.8)
    with torch.no_grad():
        pad = forward_logprobs(model, b.input_ids_B_T, b.attention_mask_B_T, **kw)  # type: ignore[arg-type]
    for layout in ([[2, 4, 1, 3, 0, 6, 5]], [[2, 4, 1], [3, 0], [6, 5]]):
        p = pack_rows(b, layout)
        static = torch._dynamo.config.patch(automatic_dynamic_shapes=False)
        with torch.no_grad(), static, attention_in_effect(model, "flex_attention"):
            got = forward_logprobs(
                model, p.input_ids_B_T, p.attention_mask_B_T, position_ids_B_T=p.position_ids_B_T, **kw
            )  # type: ignore[arg-type]
        for name in ("logprobs_B_T", "sum_pi_squared_B_T", "entropy_B_T"):
            want, have = getattr(pad, name), getattr(got, name)
            back = torch.zeros_like(want)
            p.scatter(have, back)
            assert (back - want).abs().max() < 2e-5, (layout, name)
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.gpu
@pytest.mark.filterwarnings(*FLEX_COMPILE_WARNINGS)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_learner_flex_packed_equals_padded_sdpa_on_cuda(autocast):
    """On CUDA, packed rows under flex_attention (asked by name; ``auto`` does not pick it) give
    the padded SDPA path's scores, loss and gradient (SGD at lr 1: the update is the gradient)."""
    model = tiny_qwen2().cuda()
    b = ragged_batch([13, 5, 30, 22, 1, 9, 17, 26], seed=3).to("cuda")
    adv = torch.randn(b.input_ids_B_T.shape, generator=torch.Generator().manual_seed(4)).cuda()
    learners = []
    for pack, attention in ((False, "sdpa"), (True, "flex_attention")):
        m = copy.deepcopy(model)
        cfg = LearnerConfig(
            pack_sequences=pack,
            attention=attention,
            max_grad_norm=None,
            micro_batch_tokens=48,
            chunk_size=7,
            bf16_autocast=autocast,
        )
        learners.append(Learner(m, cfg, optimizer=torch.optim.SGD(m.parameters(), lr=1.0)))
    padded, packed = learners
    assert packed._attention() == "flex_attention" and packed._packs(packed.model)
    (lp0, sp0), (lp1, sp1) = padded.score(b), packed.score(b)
    tol = 0.05 if autocast else 1e-4
    assert (lp1 - lp0).abs().max() < tol and (sp1 - sp0).abs().max() < tol
    s0, s1 = padded.step(b, adv), packed.step(b, adv)
    assert s1.loss == pytest.approx(s0.loss, rel=tol, abs=tol)
    assert s1.grad_norm == pytest.approx(s0.grad_norm, rel=0.05 if autocast else 1e-3)
    if not autocast:
        for p0, p1 in zip(padded.model.parameters(), packed.model.parameters(), strict=True):
            assert (p1 - p0).abs().max() < 1e-3
    assert packed.model.config._attn_implementation == "sdpa"


def test_trainer_records_the_attention_and_a_resume_keeps_it(tmp_path, capsys):
    """``--learner.attention`` reaches the CLI; ``auto`` stays in config.json as asked, and what it means here
    (sdpa on CPU) is printed and recorded in resolved.json; a resume with the default keeps the recorded
    value; a config.json written before the field existed still loads (auto)."""
    from agentrl.config import config_from_dict
    from agentrl.trainers.cli import _train_config, build_parser
    from agentrl.trainers.factories import prepare_run, resolved
    from agentrl.trainers.train import TrainConfig

    cfg, run = prepare_run(TrainConfig(model="tiny", device="cpu", out=str(tmp_path / "a")))
    assert cfg.learner.attention == "auto" and resolved(cfg, run).attention == "sdpa"
    assert "learner: attention=sdpa (asked: auto)" in capsys.readouterr().out
    data = json.loads(run.config_path.read_text())
    assert data["learner"]["attention"] == "auto"
    assert json.loads(run.resolved_path.read_text())["attention"] == "sdpa"
    again, _ = prepare_run(TrainConfig(model="tiny", device="cpu", resume=str(run.path)))
    assert resolved(again, run).attention == "sdpa"
    del data["learner"]["attention"]
    assert config_from_dict(TrainConfig, data).learner.attention == "auto"
    parser = build_parser()
    parsed = _train_config(parser.parse_args(["train", "--learner.attention", "eager", "--model", "tiny"]))
    assert parsed.learner.attention == "eager"
    with pytest.raises((SystemExit, ConfigError)):
        _train_config(parser.parse_args(["train", "--learner.attention", "flash"]))
