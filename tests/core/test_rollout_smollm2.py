"""A group of episodes with the real SmolLM2-135M-Instruct (converted offline, fp32, CPU)."""

from __future__ import annotations

import pytest

from agentrl.audit import audit_trajectory, recompute_logprobs
from agentrl.models import load_model, smollm2_dir
from agentrl.policies import HFPolicy
from agentrl.rollout import RolloutConfig, collect
from agentrl.testing import MemoryStore


@pytest.mark.slow
async def test_smollm2_group_on_exact_answer(tok, renderer):
    model = load_model(smollm2_dir(), "float32", "cpu")
    policy = HFPolicy(model, tok, stop_token_ids=renderer.stop_token_ids, seed=0)
    cfg = RolloutConfig(max_new_tokens=24, temperature=0.7, audit=True)
    store = MemoryStore()
    (trajs,) = await collect(
        "exact-answer-v0", policy, renderer, n_groups=1, group_size=4, store=store, config=cfg, seed=0
    )
    assert len(trajs) == 4 and len(store.trajectories) == 4
    assert policy.batch_sizes[0] == 4
    assert len({t.meta.group_id for t in trajs}) == 1
    for t in trajs:
        assert not t.infra_failure and t.num_turns == 1
        audit_trajectory(t, renderer)
        assert t.messages[-1].role == "assistant" and t.messages[-1].content.strip()
    # A real model's sampled log-probs are reproduced by one forward pass too.
    t = trajs[0]
    ref = recompute_logprobs(model, t.token_ids, temperature=0.7)
    assert max(abs(ref[i] - lp) for i, lp in enumerate(t.logprobs) if lp is not None) < 1e-4
