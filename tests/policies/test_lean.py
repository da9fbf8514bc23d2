"""The engine's lean forward (agentrl/policies/lean.py) against the transformers forward it replaces: the
same logits at 1-64 rows, prompt lengths from 1 to a few hundred tokens, prefix reuse across group members and
turns, packed and plain linears; the same seeded rollout; and the fall-backs (hooks, unsupported models, the
switch)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from agentrl.errors import ConfigError
from agentrl.models import tiny_model
from agentrl.policies import HFPolicy
from agentrl.policies.engine import GenerationEngine
from agentrl.policies.lean import ENV_SWITCH, lean_for, unsupported_reason
from agentrl.protocols import Sampling
from agentrl.rollout import run_groups
from agentrl.testing import EchoEnv
from agentrl.trainers.train_setup import TrainConfig, rollout_config

NEVER = 49151  # a stop id the random model practically never samples: turns run to max_new_tokens


class _Recording(GenerationEngine):
    """The engine, keeping a copy of the logits of every forward it samples from."""

    def __init__(self, *args, **kw):  # type: ignore[no-untyped-def]
        super().__init__(*args, **kw)
        self.logits: list[torch.Tensor] = []

    def _sample(self, rows, logits_B_V):  # type: ignore[no-untyped-def]
        self.logits.append(logits_B_V.clone())
        super()._sample(rows, logits_B_V)


def _pair(model, **kw):  # type: ignore[no-untyped-def]
    kw = {"stop_token_ids": [NEVER], "seed": 0, **kw}
    hf, lean = _Recording(model, lean_forward=False, **kw), _Recording(model, lean_forward=True, **kw)
    assert not hf.lean and lean.lean
    return hf, lean


def _run_both(hf, lean, prompts, max_new_tokens):  # type: ignore[no-untyped-def]
    samplings = [Sampling(max_new_tokens=n, seed=i) for i, n in enumerate(max_new_tokens)]
    return hf.generate_sync(prompts, samplings), lean.generate_sync(prompts, samplings)


def _assert_same(hf, lean, a, b, tol=1e-4):  # type: ignore[no-untyped-def]
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert len(hf.logits) == len(lean.logits)
    for x, y in zip(hf.logits, lean.logits, strict=True):
        assert x.shape == y.shape
        assert (x - y).abs().max().item() < tol


@pytest.mark.parametrize(("arch", "packed"), [("llama", None), ("llama", False), ("qwen2", None)])
def test_lean_logits_match_the_transformers_forward_at_1_to_64_rows(tok, arch, packed):
    """64 requests in 16 groups sharing their prompt (reused across members), prompts of 1-300 tokens,
    turns of different lengths so the batch shrinks from 64 rows to 1; then a second turn of every request
    (its conversation from the prefix tree). Every forward's logits agree and every token is the same."""
    model = tiny_model(tok, seed=4, arch=arch)
    hf, lean = _pair(model, max_batch_size=64, packed_weights=packed)
    lengths = [1, 2, 9, 33, 64, 120, 200, 300]
    prompts = [list(range(300 + 5 * g, 300 + 5 * g + lengths[g % 8])) for g in range(16) for _ in range(4)]
    new = [1 + (i * 7) % 11 for i in range(63)] + [14]  # the last request runs alone for its last steps
    a, b = _run_both(hf, lean, prompts, new)
    assert max(lean.batch_sizes) == 64 and min(lean.batch_sizes) == 1
    _assert_same(hf, lean, a, b)
    turn2 = [[*p, *g.token_ids, 11, 12, 13] for p, g in zip(prompts, a, strict=True)][::4]
    reused = lean.stats().reused_tokens
    a2, b2 = _run_both(hf, lean, turn2, new[::4])
    # Each second turn took its whole first turn (but the last, never fed token) from the prefix tree.
    assert lean.stats().reused_tokens - reused == sum(len(t) - 4 for t in turn2)
    _assert_same(hf, lean, a + a2, b + b2)


def test_lean_prefill_with_admissions_while_rows_decode(tok):
    """Requests arriving mid-decode are prefilled beside running rows (different lengths in one window)."""
    model = tiny_model(tok, seed=5)
    hf, lean = _pair(model, max_batch_size=8, max_prefill_tokens=64)
    for eng in (hf, lean):
        reqs = [
            eng.submit(list(range(50, 50 + 10 * (i + 1))), Sampling(max_new_tokens=6 + i, seed=i))
            for i in range(3)
        ]
        eng.step()
        eng.step()
        reqs += [
            eng.submit(list(range(900, 900 + 40 + i)), Sampling(max_new_tokens=5, seed=10 + i))
            for i in range(6)
        ]
        eng.run()
        eng.outs = [r.result().token_ids for r in reqs]  # type: ignore[attr-defined]
    assert hf.outs == lean.outs  # type: ignore[attr-defined]
    _assert_same(hf, lean, [], [])


async def test_a_seeded_rollout_samples_the_same_tokens_lean_and_not(tok, renderer, monkeypatch):
    """The real rollout path (env, renderer, HFPolicy with its defaults) with the switch on and off."""
    model = tiny_model(tok, seed=0)
    cfg = dataclasses.replace(
        rollout_config(TrainConfig(model="tiny", seed=3), 1), max_new_tokens=12, max_turns=2
    )
    out = {}
    for on in ("0", "1"):
        monkeypatch.setenv(ENV_SWITCH, on)
        policy = HFPolicy(model, tok, stop_token_ids=renderer.stop_token_ids, max_batch_size=16)
        assert policy.engine.lean is (on == "1")
        trajs = [
            d.trajectory
            async for d in run_groups(EchoEnv, policy, renderer, cfg, seeds=[1, 2, 3], group_size=4)
        ]
        out[on] = sorted((t.meta.seed, t.token_ids, t.logprobs) for t in trajs)
    assert [(s, ids) for s, ids, _ in out["0"]] == [(s, ids) for s, ids, _ in out["1"]]
    for (_, _, lp0), (_, _, lp1) in zip(out["0"], out["1"], strict=True):
        assert max((abs(x - y) for x, y in zip(lp0, lp1, strict=True) if x is not None), default=0.0) < 1e-4


@pytest.mark.slow
def test_lean_matches_on_smollm2(tok):
    """The shipped model (SmolLM2-135M, fp32, packed linears): 16 seeded rows, two turns, the same tokens
    and logits (30 layers, 9 query heads over 3 key/value heads)."""
    from agentrl.models import load_model, smollm2_dir

    model = load_model(smollm2_dir(), "float32", "cpu")
    hf, lean = _pair(model, max_batch_size=16)
    prompts = [list(range(1000 + 3 * (i // 4), 1150 + 3 * (i // 4))) for i in range(16)]
    new = [4 + i for i in range(16)]
    a, b = _run_both(hf, lean, prompts, new)
    a2, b2 = _run_both(hf, lean, [[*p, *g.token_ids, 30, 31] for p, g in zip(prompts, a, strict=True)], new)
    _assert_same(hf, lean, a + a2, b + b2, tol=2e-4)


def test_a_hook_on_the_model_sends_forwards_back_to_transformers(tok):
    """Forward hooks (stop_biased's on the LM head, or any added later) must run: the engine then takes the
    transformers forward for as long as a hook is there."""
    model = tiny_model(tok, seed=6)
    eng = GenerationEngine(model, stop_token_ids=[NEVER, 7], seed=0)
    assert eng.lean
    handle = model.get_output_embeddings().register_forward_hook(
        lambda _m, _i, out: out.index_fill(-1, torch.tensor([7]), 50.0)
    )
    g = eng.generate_sync([[5, 6, 8]], [Sampling(max_new_tokens=8, seed=1)])[0]
    assert g.token_ids == (7,)  # the hook's bias decided the first token: the hook ran
    handle.remove()
    g = eng.generate_sync([[5, 6, 8]], [Sampling(max_new_tokens=8, seed=1)])[0]
    assert g.token_ids[0] != 7


def test_unsupported_models_and_the_switch(tok, monkeypatch):
    model = tiny_model(tok, seed=7)
    assert unsupported_reason(model) is None
    model.config.hidden_act = "gelu"
    assert "silu" in (unsupported_reason(model) or "")
    assert not GenerationEngine(model, stop_token_ids=[NEVER]).lean  # falls back silently by default
    with pytest.raises(ConfigError, match="cannot run this model"):
        GenerationEngine(model, stop_token_ids=[NEVER], lean_forward=True)
    model.config.hidden_act = "silu"
    monkeypatch.setenv(ENV_SWITCH, "0")
    assert not GenerationEngine(model, stop_token_ids=[NEVER]).lean
    assert GenerationEngine(model, stop_token_ids=[NEVER], lean_forward=True).lean  # explicit wins
    monkeypatch.delenv(ENV_SWITCH)
    assert lean_for(model, None, None, torch.device("cuda")) is None  # not measured on CUDA: off by default
    assert not GenerationEngine(model, stop_token_ids=[NEVER], lean_forward=False).lean
