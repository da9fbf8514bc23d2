"""The decoding twin with pre-packed linear weights (agentrl.policies.packed) and the engine's use of it: the
same outputs as the model, packs that follow in-place weight updates, memory given back on demand, and a
learner's model left untouched."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from agentrl.errors import ConfigError
from agentrl.models import tiny_model
from agentrl.policies import packed as packed_mod
from agentrl.policies.engine import GenerationEngine
from agentrl.policies.packed import InferenceTwin, packed_linear_available
from agentrl.protocols import Sampling

pytestmark = pytest.mark.skipif(not packed_linear_available(), reason="torch without MKL's packed GEMM")

NEVER = 49151


def _logits(module: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        out: torch.Tensor = module(input_ids=ids, use_cache=False).logits
        return out


def _ids(rows: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(5, 4000, (rows, length), generator=torch.Generator().manual_seed(seed))


def test_twin_shares_the_weights_and_computes_what_the_model_does(tok):
    model = tiny_model(tok, seed=3)
    twin = InferenceTwin(model)
    assert twin.refresh() == len(twin.layers) > 0
    mine = {p.data_ptr() for p in model.parameters()}
    assert {p.data_ptr() for p in twin.module.parameters()} <= mine  # no copy of any weight
    linears = [m for m in model.modules() if type(m) is nn.Linear]
    assert len(twin.layers) == len(linears)
    assert twin.packed_bytes == sum(m.weight.numel() * 4 for m in linears)
    # rows x positions covering every path: matrix-vector (1-3 rows), one padded pack (4-16), chunks (17-64)
    # and the plain product (longer inputs)
    for rows, length in ((1, 1), (3, 1), (4, 1), (9, 1), (16, 1), (5, 7), (2, 40), (4, 50)):
        ids = _ids(rows, length)
        torch.testing.assert_close(_logits(twin.module, ids), _logits(model, ids), atol=2e-5, rtol=1e-5)
    # the learner's model is untouched: its own modules, mode and gradients
    assert all(type(m) is not type(twin.layers[0]) for m in model.modules())
    model.train()
    assert not twin.module.training
    model(input_ids=_ids(2, 5)).logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_packs_follow_in_place_weight_updates(tok):
    model = tiny_model(tok, seed=4)
    twin = InferenceTwin(model)
    twin.refresh()
    ids = _ids(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model(input_ids=_ids(2, 6)).logits.square().mean().backward()
    opt.step()
    stale = _logits(twin.module, ids)  # packs of the old weights: what refresh exists to prevent
    assert not torch.allclose(stale, _logits(model, ids), atol=1e-3)
    assert twin.refresh() == len(twin.layers)
    torch.testing.assert_close(_logits(twin.module, ids), _logits(model, ids), atol=2e-5, rtol=1e-5)
    assert twin.refresh() == 0  # nothing changed since
    other = tiny_model(tok, seed=5)
    model.load_state_dict(other.state_dict())  # weights copied in place (how a sampler takes an update)
    assert twin.refresh() == len(twin.layers)
    torch.testing.assert_close(_logits(twin.module, ids), _logits(other, ids), atol=2e-5, rtol=1e-5)


def test_drop_gives_the_memory_back_and_the_plain_path_still_works(tok):
    model = tiny_model(tok, seed=6)
    twin = InferenceTwin(model)
    twin.refresh()
    twin.drop()
    assert twin.packed_bytes == 0
    ids = _ids(8, 1)
    torch.testing.assert_close(_logits(twin.module, ids), _logits(model, ids), atol=2e-5, rtol=1e-5)
    assert twin.refresh() == len(twin.layers) and twin.packed_bytes > 0


def _run(model, packed: bool, rows: int = 8) -> tuple[GenerationEngine, list]:
    eng = GenerationEngine(model, stop_token_ids=[NEVER], seed=0, packed_weights=packed)
    reqs = [
        eng.submit(list(range(100 + r, 130 + 3 * r)), Sampling(max_new_tokens=12, seed=r))
        for r in range(rows)
    ]
    eng.run()
    return eng, [r.result() for r in reqs]


def test_engine_samples_the_same_turns_with_and_without_packs(tok):
    model = tiny_model(tok, seed=7)
    eng, packed = _run(model, True)
    assert eng.packed_weights and eng._twin is not None and eng._twin.packed_bytes > 0
    _, plain = _run(model, False)
    assert [g.token_ids for g in packed] == [g.token_ids for g in plain]
    for a, b in zip(packed, plain, strict=True):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4


def test_engine_clear_cache_drops_the_packs_and_the_next_step_rebuilds_them(tok):
    model = tiny_model(tok, seed=8)
    eng, _ = _run(model, True)
    assert eng.stats().packed_bytes > 0
    eng.clear_cache()
    assert eng.stats().packed_bytes == 0
    with torch.no_grad():  # a learner's step in place while the packs are gone
        for p in model.parameters():
            p.mul_(0.9)
    eng.submit(list(range(100, 120)), Sampling(max_new_tokens=3, seed=1))
    eng.run()
    assert eng.stats().packed_bytes > 0
    assert eng._twin is not None and eng._twin.refresh() == 0  # rebuilt from the new weights


def test_packed_weights_on_demand_needs_the_kernel(tok, monkeypatch):
    model = tiny_model(tok, seed=9)
    monkeypatch.setattr(packed_mod, "packed_linear_available", lambda: False)
    with pytest.raises(ConfigError, match="packed GEMM"):
        GenerationEngine(model, stop_token_ids=[NEVER], packed_weights=True)
    eng = GenerationEngine(model, stop_token_ids=[NEVER])  # auto: off without the kernel
    assert not eng.packed_weights and eng.stats().packed_bytes == 0


def test_default_twin_packs_exactly_the_shapes_measured_faster_packed(tok):
    # Whether a pack pays depends on the CPU (issue 46: on an AMD EPYC host MKL's packed GEMM lost to the
    # plain product for most of SmolLM2's shapes), so the default twin asks pack_pays per shape.
    model = tiny_model(tok, seed=10)
    twin = InferenceTwin(model, pack_all=False)
    threads = torch.get_num_threads()
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    want = {
        id(m.weight) for m in linears if packed_mod.pack_pays(*m.weight.shape, packed_mod.PACK_ROWS, threads)
    }
    assert {id(layer.weight) for layer in twin.layers} == want
    eng = GenerationEngine(model, stop_token_ids=[NEVER], seed=0)  # the default: measured per shape
    assert eng._twin is not None and {id(x.weight) for x in eng._twin.layers} == want
    twin.refresh()
    ids = _ids(8, 1)  # one decode step of 8 rows: the packed path where a layer has a pack
    assert torch.allclose(_logits(twin.module, ids), _logits(model, ids), atol=1e-4)


@pytest.mark.skipif("onednn" not in packed_mod.available_kernels(), reason="torch without oneDNN's linear")
def test_onednn_twin_computes_what_the_model_does(tok):
    """oneDNN's packing (chosen per shape where it is faster, issue 46) takes any number of rows unpadded."""
    model = tiny_model(tok, seed=11)
    twin = InferenceTwin(model, kernel="onednn")
    assert twin.refresh() == len(twin.layers) > 0
    assert {layer.kernel for layer in twin.layers} == {"onednn"}
    for rows, length in ((1, 1), (3, 1), (9, 1), (16, 1), (5, 7), (4, 50)):
        ids = _ids(rows, length)
        torch.testing.assert_close(_logits(twin.module, ids), _logits(model, ids), atol=2e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match="kernel"):
        InferenceTwin(model, kernel="blas")
