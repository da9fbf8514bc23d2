"""The pieces of the OTB reproduction checked against independent references: the fast chain-sum sampler
against agentrl's real rollout + ToolEnv, the tail Gram against per-token autograd, the variance moments
against explicit per-sample gradients, the exact-baseline code against agentrl's OTB."""

import asyncio

import gradvar as gv
import numpy as np
import pytest
import torch
from fast_rollout import Vocab, sample_episodes
from rl_report import tokens_to_target
from tiny_task import ChainSumEnv, build_tokenizer, expert_turns, sample_numbers, tiny_policy, turn_budget

from agentrl.chat import ChatRenderer
from agentrl.learner import forward_logprobs
from agentrl.rollout import RolloutConfig, run_episode
from agentrl.testing import ScriptedPolicy


@pytest.fixture(scope="module")
def tiny_tok():
    return build_tokenizer()


def _scripts(vocab, nums):
    good = [[*vocab.encode(t), vocab.eot] for t in expert_turns(nums)]
    wrong = list(good)
    # A wrong operand: the tool obeys, and the answer follows the wrong running sum.
    wrong[1] = [*vocab.encode(f"[1]A{nums[0] + nums[1]}+1"), vocab.eot]
    wrong[2] = [*vocab.encode(f"R{nums[0] + nums[1] + 1}"), vocab.eot]
    cut = [*good[:1], [*vocab.encode("[" + "1" * (turn_budget(len(nums)) + 5))]]  # never ends its turn
    junk = [*good[:2], [*vocab.encode("R"), vocab.eot]]  # a final turn without a number
    loop = [good[0]] * 4  # keeps calling the tool until the turn limit
    return {"good": good, "wrong": wrong, "cut": cut, "junk": junk, "loop": loop}


@pytest.mark.parametrize("case", ["good", "wrong", "cut", "junk", "loop"])
def test_fast_sampler_reproduces_agentrl_rollout_token_for_token(tiny_tok, case):
    vocab = Vocab.of(tiny_tok)
    env = ChainSumEnv(k=3)
    _, info = asyncio.run(env.reset(seed=5))
    nums = [int(x) for x in info["numbers"].split()]
    script = _scripts(vocab, nums)[case]
    renderer = ChatRenderer(tiny_tok)
    cfg = RolloutConfig(max_turns=4, max_new_tokens=turn_budget(3), audit=True)
    ref = asyncio.run(run_episode(env, ScriptedPolicy(script, stop_ids=[vocab.eot]), renderer, cfg, seed=5))
    model = tiny_policy(len(tiny_tok), hidden=16, layers=1)
    (fast,), rewards = sample_episodes(
        model, vocab, [nums], generator=torch.Generator().manual_seed(0), script=[script]
    )
    assert fast.token_ids == ref.token_ids
    assert fast.loss_mask == ref.loss_mask
    assert fast.logprobs == ref.logprobs
    assert fast.reward == ref.reward == rewards[0] == (1.0 if case == "good" else 0.0)
    assert fast.stop_reason == ref.stop_reason
    assert fast.truncated == ref.truncated
    assert fast.policy_versions == ref.policy_versions == (0,) * ref.num_turns  # one builder for both
    assert [(c.call_id, c.arguments, c.output, c.turn) for c in fast.tool_calls] == [
        (c.call_id, c.arguments, c.output, c.turn) for c in ref.tool_calls
    ]


def _llama(vocab_size, tied):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        tie_word_embeddings=tied,
    )
    return LlamaForCausalLM(cfg).float()


def _episodes(tiny_tok, model, n=3, k=3):
    vocab = Vocab.of(tiny_tok)
    nums = sample_numbers(np.random.default_rng(0), k, "train")
    trajs, _ = sample_episodes(model, vocab, [nums] * n, generator=torch.Generator().manual_seed(1))
    return trajs


def test_tail_gram_equals_per_token_autograd_on_the_same_parameters(tiny_tok):
    model = _llama(len(tiny_tok), tied=False)
    trajs = _episodes(tiny_tok, model)
    tail = {
        "model.layers.1.self_attn.o_proj.weight",
        "model.layers.1.post_attention_layernorm.weight",
        "model.layers.1.mlp.gate_proj.weight",
        "model.layers.1.mlp.up_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
        "model.norm.weight",
        "lm_head.weight",
    }
    for name, p in model.named_parameters():
        p.requires_grad_(name in tail)
    K_ref, lp_ref, _ = gv.gram_full(model, trajs)
    for p in model.parameters():
        p.requires_grad_(True)
    K, lp, _, blocks = gv.gram_tail(model, trajs)
    assert gv.tail_parameter_count(model) == sum(p.numel() for n, p in model.named_parameters() if n in tail)
    np.testing.assert_allclose(K, K_ref, rtol=1e-4, atol=1e-5 * np.abs(K_ref).max())
    np.testing.assert_allclose(lp, lp_ref, atol=1e-6)
    np.testing.assert_allclose(sum(blocks.values()), np.diagonal(K), rtol=1e-9)


def test_gram_pass_scores_like_the_learner(tiny_tok):
    model = _llama(len(tiny_tok), tied=True)
    trajs = _episodes(tiny_tok, model)
    _, lp, sp = gv.gram_full(model, trajs)
    ref_lp, ref_sp = [], []
    for t in trajs:
        ids = torch.tensor(t.token_ids)[None]
        with torch.no_grad():
            out = forward_logprobs(
                model, ids, torch.ones_like(ids), token_mask_B_T=torch.tensor(t.loss_mask)[None]
            )
        m = torch.tensor(t.loss_mask).bool()
        ref_lp.append(out.logprobs_B_T[0, m])
        ref_sp.append(out.sum_pi_squared_B_T[0, m])
    np.testing.assert_allclose(lp, torch.cat(ref_lp).double().numpy(), atol=1e-5)
    np.testing.assert_allclose(sp, torch.cat(ref_sp).double().numpy(), atol=1e-5)


def _synthetic_pool(seed=0, M=6, P=7):
    """A pool with explicit per-token score vectors J [n, P] (so K = J Jᵀ is known exactly)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 6, size=M)
    n = int(lengths.sum())
    J = rng.normal(size=(n, P))
    lp = -rng.exponential(1.0, size=n)
    sp = np.minimum(np.exp(lp) ** 2 + rng.uniform(0, 0.3, size=n), 1.0)
    pool = gv.PromptPool(
        "syn",
        rng.integers(0, 2, size=M).astype(float),
        lengths,
        np.zeros(M, dtype=int),
        lp,
        sp,
        np.zeros(n, dtype=bool),
        J @ J.T,
    )
    return pool, J


def test_moments_equal_the_explicit_covariance_of_the_group_gradients():
    pool, J = _synthetic_pool()
    idx = gv.draw(np.random.default_rng(0), np.ones(len(pool.rewards)), 200, 3)
    for name in ("grpo", "otb", "otb_exact", "eob"):
        A, mask = gv.advantages(pool, idx, name)
        C = gv.coefficients(pool, idx, A, mask)
        ref = gv.reference(pool, np.arange(len(pool.rewards)) % 3.0)
        K = torch.from_numpy(pool.gram)
        g = C @ J  # explicit ĝ per draw
        u = ref @ J
        u /= np.linalg.norm(u)
        assert gv.total_variance(K, C) == pytest.approx(np.trace(np.cov(g.T)), rel=1e-4)
        np.testing.assert_allclose(gv.projections(C, K, ref), g @ u, rtol=1e-9, atol=1e-12)


def test_exact_token_baseline_code_reproduces_agentrl_otb_with_the_proxy():
    pool, _ = _synthetic_pool(seed=1)
    idx = gv.draw(np.random.default_rng(1), np.ones(len(pool.rewards)), 50, 4)
    A, mask = gv.advantages(pool, idx, "otb")
    L = pool.lengths[idx]
    Lmax = int(L.max())
    G = np.where(mask, pool.rewards[idx][..., None], 0.0)
    W = np.concatenate([np.cumsum(pool.proxy[a:b]) for a, b in pool.spans()])
    mine = gv.token_baseline(G, gv._gather(pool, idx, W, Lmax), mask)
    np.testing.assert_allclose(mine, A, atol=1e-10)


def test_otb_is_its_leave_one_out_version_scaled_by_one_minus_the_own_energy_share():
    pool, _ = _synthetic_pool(seed=2)
    idx = gv.draw(np.random.default_rng(2), np.ones(len(pool.rewards)), 40, 4)
    A, mask = gv.advantages(pool, idx, "otb")
    A_loo, _ = gv.advantages(pool, idx, "otb_loo")
    W = np.concatenate([np.cumsum(pool.proxy[a:b]) for a, b in pool.spans()])
    Wg = gv._gather(pool, idx, W, int(pool.lengths[idx].max()))
    share = Wg / np.maximum((Wg * mask).sum(1, keepdims=True), 1e-300)
    alive = mask.sum(1, keepdims=True)
    both = mask & (alive >= 2)
    np.testing.assert_allclose(A[both], ((1 - share) * A_loo)[both], atol=1e-6)


def test_tokens_to_target_interpolates_and_censors_at_the_budget():
    curve = [{"tokens": 0, "success": 0.1}, {"tokens": 100, "success": 0.5}, {"tokens": 200, "success": 0.9}]
    assert tokens_to_target(curve, 0.7, 300) == (150.0, False)
    assert tokens_to_target(curve, 0.05, 300) == (0.0, False)
    assert tokens_to_target(curve, 0.95, 300) == (300.0, True)
