"""HFPolicy with a tiny random model and the real SmolLM2 tokenizer: exact log-probs, batching, stops."""

from __future__ import annotations

import asyncio

import pytest
import torch

import agentrl
from agentrl.audit import audit_trajectory, recompute_logprobs
from agentrl.errors import ConfigError, PolicyError
from agentrl.models import tiny_model
from agentrl.policies import HFPolicy
from agentrl.policies.hf import _nucleus
from agentrl.protocols import FinishReason, Policy, Sampling
from agentrl.rollout import RolloutConfig, run_episode, run_group
from agentrl.types import TokenSource


def test_is_a_policy(model, tok):
    assert isinstance(HFPolicy(model, tok), Policy)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_recorded_logprobs_match_one_forward_pass(model, tok, renderer, temperature):
    """The issue's acceptance check: re-scoring a recorded multi-turn trajectory with one forward pass
    gives the sampler's log-probs within 1e-4 (fp32, CPU) on every sampled token."""
    policy = HFPolicy(model, tok, stop_token_ids=renderer.stop_token_ids, seed=1)
    cfg = RolloutConfig(max_turns=3, max_new_tokens=24, temperature=temperature, audit=True)
    trajs = await run_group("guess-number-v0", policy, renderer, cfg, group_size=3, seed=4)
    checked = 0
    for traj in trajs:
        assert traj.num_turns >= 1
        ref = recompute_logprobs(model, traj.token_ids, temperature=temperature)
        for i, (m, lp) in enumerate(zip(traj.loss_mask, traj.logprobs, strict=True)):
            if m:
                assert abs(ref[i] - lp) < 1e-4, (i, ref[i], lp)
                checked += 1
    assert checked >= 10
    assert any(t.num_turns >= 2 for t in trajs)  # observations really were interleaved


async def test_concurrent_episodes_share_batches(model, tok, renderer):
    policy = HFPolicy(model, tok, stop_token_ids=renderer.stop_token_ids, seed=0, max_batch_size=8)
    cfg = RolloutConfig(max_turns=2, max_new_tokens=8, audit=True)
    trajs = await run_group("guess-number-v0", policy, renderer, cfg, group_size=6, seed=2)
    assert len(trajs) == 6 and not any(t.infra_failure for t in trajs)
    assert policy.batch_sizes[0] == 6  # the first turns of all six episodes ran as one batch
    assert max(policy.batch_sizes) <= 8


async def test_batching_does_not_change_samples(model, tok, renderer):
    """Left padding and the KV cache are invisible: with per-request seeds, a batch of prompts of very
    different lengths samples the same ids as one request at a time, with the same log-probs."""
    policy = HFPolicy(model, tok, stop_token_ids=renderer.stop_token_ids)
    prompts = [renderer.encode("hi"), renderer.encode("a much longer prompt " * 6), renderer.encode("x y")]
    samplings = [Sampling(max_new_tokens=10, temperature=0.9, seed=s) for s in (1, 2, 3)]
    batched = await asyncio.gather(*(policy.generate(p, s) for p, s in zip(prompts, samplings, strict=True)))
    assert policy.batch_sizes == [3]
    for p, s, b in zip(prompts, samplings, batched, strict=True):
        single = policy.generate_batch_sync([p], [s])[0]
        assert single.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(single.logprobs, b.logprobs, strict=True)) < 1e-5


def test_stop_and_length(model, tok, renderer):
    policy = HFPolicy(model, tok, stop_token_ids=renderer.stop_token_ids, seed=0)
    prompts = [renderer.encode(f"prompt {k}") for k in range(8)]
    gens = policy.generate_batch_sync(prompts, [Sampling(max_new_tokens=6)] * 8)
    for g in gens:
        assert 1 <= len(g.token_ids) <= 6 and len(g.logprobs) == len(g.token_ids)
        stops = [t for t in g.token_ids if t in renderer.stop_token_ids]
        if g.finish_reason is FinishReason.STOP:
            assert stops == [g.token_ids[-1]]
        else:
            assert stops == [] and len(g.token_ids) == 6
    assert {g.finish_reason for g in gens} == {FinishReason.STOP, FinishReason.LENGTH}


def test_top_p_logprobs_are_of_the_nucleus(model, tok, renderer):
    policy = HFPolicy(model, tok, stop_token_ids=renderer.stop_token_ids, seed=0)
    prompt = renderer.encode("hello there")
    g = policy.generate_batch_sync([prompt], [Sampling(max_new_tokens=1, top_p=0.3)])[0]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt])).logits[0, -1].float()
    nucleus = _nucleus(torch.log_softmax(logits, -1), 0.3)
    assert torch.isfinite(nucleus[g.token_ids[0]])
    assert abs(float(nucleus[g.token_ids[0]]) - g.logprobs[0]) < 1e-4
    kept = torch.isfinite(nucleus)
    assert 1 <= int(kept.sum()) < kept.numel()
    assert abs(float(nucleus[kept].exp().sum()) - 1) < 1e-4


async def test_version_and_weight_updates(model, tok, renderer):
    policy = HFPolicy(model, tok, stop_token_ids=renderer.stop_token_ids, seed=0, version=2)
    g = await policy.generate(renderer.encode("a"), Sampling(max_new_tokens=2))
    assert g.policy_version == 2
    with policy.lock:  # a learner sharing the model updates it under the lock
        policy.set_version(3)
    g = await policy.generate(renderer.encode("a"), Sampling(max_new_tokens=2))
    assert g.policy_version == 3 and policy.version == 3


async def test_event_loop_stays_responsive(tok, renderer):
    """Torch runs in a worker thread: other coroutines keep running while a batch samples."""
    big = tiny_model(tok, seed=1, hidden=128, layers=4)  # no stop bias: samples all max_new_tokens
    policy = HFPolicy(big, tok, stop_token_ids=renderer.stop_token_ids, seed=0)
    ticks = 0
    done = False

    async def ticker():
        nonlocal ticks
        while not done:
            ticks += 1
            await asyncio.sleep(0)

    t = asyncio.ensure_future(ticker())
    await policy.generate(renderer.encode("tick"), Sampling(max_new_tokens=40))
    done = True
    await t
    assert ticks > 10


async def test_errors(model, tok, renderer):
    policy = HFPolicy(model, tok, stop_token_ids=renderer.stop_token_ids)
    with pytest.raises(PolicyError, match="outside the model's vocabulary"):
        await policy.generate([10**7], Sampling(max_new_tokens=2))
    with pytest.raises(PolicyError, match="empty prompt"):
        await policy.generate([], Sampling(max_new_tokens=2))
    with pytest.raises(ConfigError, match="max_batch_size"):
        HFPolicy(model, tok, max_batch_size=0)
    # A failing batch becomes a POLICY_ERROR episode, not a crash.
    broken = HFPolicy(model, tok, stop_token_ids=renderer.stop_token_ids)
    broken.model = None  # type: ignore[assignment]
    traj = await run_episode(
        agentrl.make("exact-answer-v0"), broken, renderer, RolloutConfig(audit=True), seed=0
    )
    assert traj.infra_failure and traj.errors[0].kind == "PolicyError"


async def test_qwen2_architecture(tok, renderer):
    m = tiny_model(tok, arch="qwen2", seed=3)
    policy = HFPolicy(m, tok, stop_token_ids=renderer.stop_token_ids, seed=0)
    g = await policy.generate(renderer.encode("hi"), Sampling(max_new_tokens=5))
    ref = recompute_logprobs(m, [*renderer.encode("hi"), *g.token_ids])[-len(g.token_ids) :]
    assert max(abs(a - b) for a, b in zip(ref, g.logprobs, strict=True)) < 1e-4


async def test_truncated_turn_keeps_its_logprobs(model, tok, renderer):
    policy = HFPolicy(tiny_model(tok, seed=5), tok, stop_token_ids=renderer.stop_token_ids, seed=0)
    cfg = RolloutConfig(max_new_tokens=5, audit=True)
    traj = await run_episode(agentrl.make("exact-answer-v0"), policy, renderer, cfg, seed=0)
    assert traj.stop_reason.value == "turn_tokens" and traj.num_model_tokens == 5
    seg = next(s for s in traj.segments if s.source is TokenSource.MODEL)
    assert seg.end == len(traj.token_ids)
    audit_trajectory(traj, renderer)


def test_should_stop_ends_a_batch_early(model, tok):
    """Shutdown: when every episode waiting on a batch is gone, decoding stops at the next token."""
    policy = HFPolicy(model, tok, stop_token_ids=[tok.vocab_size - 1], seed=0)
    polls = []

    def should_stop():
        polls.append(1)
        return len(polls) >= 3

    (gen,) = policy.generate_batch_sync([[1, 2, 3]], [Sampling(max_new_tokens=500)], should_stop=should_stop)
    assert len(gen.token_ids) == 3


async def test_cancelled_episodes_free_the_policy_quickly(model, tok):
    policy = HFPolicy(model, tok, stop_token_ids=[tok.vocab_size - 1], seed=0)
    task = asyncio.ensure_future(policy.generate([1, 2, 3], Sampling(max_new_tokens=100_000)))

    def busy():
        if policy.lock.acquire(blocking=False):
            policy.lock.release()
            return False
        return True

    while not busy():  # wait until the batch runs in its worker thread
        await asyncio.sleep(0.01)
    task.cancel()
    # The worker notices the cancellation at the next token and releases the model.
    for _ in range(500):
        if not busy():
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("the decode loop kept running after its only request was cancelled")
