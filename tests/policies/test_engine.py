"""GenerationEngine with a tiny random model and the real SmolLM2 tokenizer: continuous batching, KV reuse
across turns and group members, the cache budget, invalidation on weight updates, per-request random
streams."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from agentrl.audit import recompute_logprobs
from agentrl.errors import ConfigError, PolicyError
from agentrl.models import tiny_model
from agentrl.policies import HFPolicy
from agentrl.policies.engine import GenerationEngine
from agentrl.protocols import FinishReason, Sampling

NEVER = 49151  # a stop id the random model practically never samples first: turns run to max_new_tokens


def _engine(model, **kw) -> GenerationEngine:
    kw.setdefault("stop_token_ids", [NEVER])
    kw.setdefault("seed", 0)
    return GenerationEngine(model, **kw)


def _max_err(model, prompt, gen, temperature=1.0) -> float:
    ref = recompute_logprobs(model, [*prompt, *gen.token_ids], temperature=temperature)[-len(gen.token_ids) :]
    return max(abs(a - b) for a, b in zip(ref, gen.logprobs, strict=True))


def test_finished_rows_leave_and_waiting_ones_join_at_the_next_step(tok):
    """Two rows at most: the short request finishes at step 3, the waiting one takes its row at step 4 and
    finishes long before the long request (a static batch would have started it after the long one)."""
    model = tiny_model(tok, seed=1)
    eng = _engine(model, max_batch_size=2)
    done_at: dict[str, int] = {}
    steps = 0
    names = {}
    for name, n in (("short", 3), ("long", 30), ("waiting", 3)):
        req = eng.submit([5, 6, 7, 8], Sampling(max_new_tokens=n, seed=len(names)), None)
        names[name] = req
    while eng.has_work():
        eng.step()
        steps += 1
        for name, req in names.items():
            if req.done and name not in done_at:
                done_at[name] = steps
    assert done_at == {"short": 3, "waiting": 6, "long": 30}
    assert list(eng.batch_sizes)[:6] == [2, 2, 2, 2, 2, 2] and list(eng.batch_sizes)[6:] == [1] * 24
    for req in names.values():
        assert req.result().finish_reason is FinishReason.LENGTH


def test_next_turn_reuses_the_conversation_kv(tok):
    model = tiny_model(tok, seed=2)
    eng = _engine(model)
    prompt = list(range(100, 160))
    g1 = eng.generate_sync([prompt], [Sampling(max_new_tokens=12, seed=1)])[0]
    s1 = eng.stats()
    assert s1.prefill_tokens == len(prompt) and s1.reused_tokens == 0
    turn2 = [*prompt, *g1.token_ids, 7, 8, 9, 10]  # + a tool observation
    g2 = eng.generate_sync([turn2], [Sampling(max_new_tokens=12, seed=2)])[0]
    s2 = eng.stats()
    # Only the last sampled token (never fed) and the observation are run; the rest comes from the cache.
    assert s2.reused_tokens == len(prompt) + len(g1.token_ids) - 1
    assert s2.prefill_tokens - s1.prefill_tokens == 1 + 4
    assert _max_err(model, turn2, g2) < 1e-4
    assert s2.slot_bytes == 0  # the rows' buffer is freed when nothing runs


def test_group_members_share_the_prompt_prefill(tok):
    """4 groups x 4 identical prompts that share a long system prefix: each group's suffix is prefilled once,
    the system prefix once in all; every member still samples its own tokens with exact log-probs."""
    model = tiny_model(tok, seed=3)
    eng = _engine(model, max_batch_size=16)
    system = list(range(200, 300))
    prompts = [[*system, *range(1000 * g, 1000 * g + 20)] for g in range(1, 5) for _ in range(4)]
    gens = eng.generate_sync(prompts, [Sampling(max_new_tokens=6, seed=i) for i in range(16)])
    s = eng.stats()
    assert s.prefill_tokens == 100 + 4 * 20 + 12  # system once, each question once, 1 token per follower
    assert s.prefill_tokens + s.reused_tokens == sum(map(len, prompts))
    assert len({g.token_ids for g in gens}) == 16
    for p, g in zip(prompts[::5], gens[::5], strict=True):
        assert _max_err(model, p, g) < 1e-4


def test_cache_budget_evicts_least_recently_used(tok):
    model = tiny_model(tok, seed=4)
    per_token = 2 * 2 * 2 * 16 * 4  # layers x (k, v) x kv heads x head dim x fp32
    eng = _engine(model, cache_bytes=150 * per_token)
    a, b = list(range(100, 200)), list(range(300, 400))
    eng.generate_sync([a], [Sampling(max_new_tokens=4, seed=0)])
    eng.generate_sync([b], [Sampling(max_new_tokens=4, seed=0)])  # over budget: a (older) is evicted
    s = eng.stats()
    assert s.cache_bytes <= 150 * per_token and s.cache_evictions >= 1
    eng.generate_sync([[*b, 5]], [Sampling(max_new_tokens=2, seed=0)])
    assert eng.stats().reused_tokens == 100  # b is still cached
    g = eng.generate_sync([[*a, 5]], [Sampling(max_new_tokens=2, seed=0)])[0]
    assert eng.stats().reused_tokens == 100  # a was recomputed, correctly
    assert _max_err(model, [*a, 5], g) < 1e-4


def test_weight_update_invalidates_cached_kv(tok):
    """After an in-place update (under the lock) and set_version, nothing computed with the old weights is
    reused: the next turn's log-probs match the new weights."""
    model = tiny_model(tok, seed=5)
    policy = HFPolicy(model, tok, stop_token_ids=[NEVER], seed=0)
    prompt = list(range(100, 150))
    g1 = policy.generate_batch_sync([prompt], [Sampling(max_new_tokens=8, seed=1)])[0]
    assert g1.policy_version == 0
    with policy.lock, torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        policy.set_version(1)
    turn2 = [*prompt, *g1.token_ids, 9]
    reused = policy.stats().reused_tokens
    g2 = policy.generate_batch_sync([turn2], [Sampling(max_new_tokens=8, seed=2)])[0]
    assert policy.stats().reused_tokens == reused and g2.policy_version == 1
    assert _max_err(model, turn2, g2) < 1e-4


def test_seeded_requests_do_not_depend_on_batch_mates_or_arrival(tok):
    """The same seeded requests, alone and in a busy batch that fills at random times (other requests
    joining and leaving, different key lengths and row positions), sample the same ids."""
    model = tiny_model(tok, seed=6)
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 40000) for _ in range(rng.randrange(3, 60))] for _ in range(12)]
    samplings = [Sampling(max_new_tokens=rng.randrange(4, 24), temperature=0.9, seed=i) for i in range(12)]
    alone = [
        _engine(model, max_batch_size=1, cache_bytes=0).generate_sync([p], [s])[0]
        for p, s in zip(prompts, samplings, strict=True)
    ]

    async def busy() -> list:
        policy = HFPolicy(model, stop_token_ids=[NEVER], max_batch_size=5, seed=1)

        async def one(i: int):
            await asyncio.sleep(rng.uniform(0, 0.05))
            return await policy.generate(prompts[i], samplings[i])

        noise = [policy.generate(prompts[i % 12][::-1], Sampling(max_new_tokens=9)) for i in range(8)]
        out = await asyncio.gather(*(one(i) for i in range(12)), *noise)
        return out[:12]

    batched = asyncio.run(busy())
    same = sum(a.token_ids == b.token_ids for a, b in zip(alone, batched, strict=True))
    assert same >= 11, same  # float differences of other batch shapes may flip a near-tie, rarely
    for a, b in zip(alone, batched, strict=True):
        if a.token_ids == b.token_ids:
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4


def test_cancelled_request_leaves_the_batch(tok):
    model = tiny_model(tok, seed=7)
    eng = _engine(model)
    keep = eng.submit([5, 6, 7], Sampling(max_new_tokens=6, seed=0))
    gone = eng.submit([8, 9], Sampling(max_new_tokens=1000, seed=1))
    eng.step()
    eng.cancel(gone)
    eng.run()
    assert keep.done and keep.result().token_ids and not eng.has_work()
    assert len(gone.token_ids) <= 2 and list(eng.batch_sizes)[1:] == [1] * 5


@pytest.mark.parametrize("arch,attn", [("llama", "eager"), ("qwen2", "sdpa"), ("qwen2", "eager")])
def test_architectures_and_attention_implementations(tok, arch, attn):
    model = tiny_model(tok, arch=arch, seed=8)
    model.config._attn_implementation = attn
    eng = _engine(model, max_batch_size=3)
    prompts = [[5, 6, 7], list(range(100, 140)), [9] * 11]
    gens = eng.generate_sync(prompts, [Sampling(max_new_tokens=7, seed=i) for i in range(3)])
    for p, g in zip(prompts, gens, strict=True):
        assert _max_err(model, p, g) < 1e-4


def test_refuses_what_it_cannot_run(tok):
    m = tiny_model(tok, arch="qwen2")
    m.config.layer_types = ["sliding_attention", "full_attention"]
    with pytest.raises(ConfigError, match="full-attention"):
        _engine(m)
    m = tiny_model(tok)
    m.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ConfigError, match="sdpa"):
        _engine(m)
    with pytest.raises(ConfigError, match="max_prefill_tokens"):
        _engine(tiny_model(tok), max_prefill_tokens=0)
    eng = _engine(tiny_model(tok))
    with pytest.raises(PolicyError, match="empty prompt"):
        eng.submit([], Sampling())
    with pytest.raises(ConfigError, match="same length"):
        eng.generate_sync([[1]], [])


def test_a_failing_forward_fails_its_requests_and_the_engine_recovers(tok):
    model = tiny_model(tok, seed=9)
    eng = _engine(model)
    calls = []

    def boom(*_a, **_k):
        calls.append(1)
        raise RuntimeError("device lost")

    handle = model.model.layers[0].register_forward_pre_hook(boom)
    results: list = []
    eng.submit([5, 6, 7], Sampling(max_new_tokens=4), results.append)
    with pytest.raises(PolicyError, match="device lost"):
        eng.generate_sync([[8, 9]], [Sampling(max_new_tokens=4)])
    assert len(results) == 1 and isinstance(results[0], PolicyError) and not eng.has_work()
    handle.remove()
    g = eng.generate_sync([[8, 9]], [Sampling(max_new_tokens=4, seed=0)])[0]
    assert len(g.token_ids) == 4 and _max_err(model, [8, 9], g) < 1e-4


def test_prefill_token_budget_spreads_admission_over_steps(tok):
    model = tiny_model(tok, seed=10)
    eng = _engine(model, max_prefill_tokens=64)
    prompts = [[k * 100 + i for i in range(50)] for k in range(1, 4)]
    eng.generate_sync(prompts, [Sampling(max_new_tokens=5, seed=k) for k in range(3)])
    assert list(eng.batch_sizes)[:3] == [1, 2, 3]  # one 50-token prompt per step


def test_serve_drives_the_engine_from_its_own_thread(tok):
    """The sync core under a dedicated thread (how an inference server runs it): submit from anywhere."""
    import threading

    model = tiny_model(tok, seed=11)
    eng = _engine(model)
    stop = threading.Event()
    worker = threading.Thread(target=eng.serve, args=(stop,), daemon=True)
    worker.start()
    got: list = []
    done = threading.Event()

    def on_done(out):
        got.append(out)
        if len(got) == 3:
            done.set()

    for k in range(3):
        eng.submit([5 + k, 6, 7], Sampling(max_new_tokens=4, seed=k), on_done)
    assert done.wait(30)
    stop.set()
    worker.join(5)
    assert not worker.is_alive()
    assert sorted(len(g.token_ids) for g in got) == [4, 4, 4] and eng.stats().slot_bytes == 0


def test_a_turn_running_across_an_update_is_not_cached(tok):
    model = tiny_model(tok, seed=12)
    eng = _engine(model)
    prompt = list(range(100, 140))
    req = eng.submit(prompt, Sampling(max_new_tokens=10, seed=0))
    for _ in range(4):
        eng.step()
    with eng.lock, torch.no_grad():
        for p in model.parameters():
            p.mul_(1.01)
        eng.set_version(1)
    eng.run()
    g = req.result()
    assert g.policy_version == 0 and len(g.token_ids) == 10
    before = eng.stats().reused_tokens
    nxt = [*prompt, *g.token_ids, 5]
    g2 = eng.generate_sync([nxt], [Sampling(max_new_tokens=3, seed=1)])[0]
    assert eng.stats().reused_tokens == before and g2.policy_version == 1
    assert _max_err(model, nxt, g2) < 1e-4


def test_prefix_tree_splits_matches_and_evicts_lru_leaves():
    from agentrl.policies.kvcache import PrefixTree

    def kv_of(seq):  # a fake [layers, 2, heads, n, dim] KV whose values are the token ids
        def read(start, stop):
            t = torch.tensor(seq[start:stop], dtype=torch.float32)
            return t.view(1, 1, 1, -1, 1).expand(1, 2, 1, -1, 1)

        return read

    tree = PrefixTree(budget_bytes=10**9)
    a, b = [1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 9]
    tree.insert(a, kv_of(a))
    tree.insert(b, kv_of(b))  # splits a's edge after [1, 2, 3]
    assert len(tree) == 3 and tree.nbytes == (3 + 3 + 2) * 2 * 4
    m = tree.match([1, 2, 3, 9, 9, 7], limit=5)
    assert m.length == 5
    got = torch.cat([kv[0, 0, 0, :, 0] for _, kv in m.segments])
    assert got.tolist() == [1, 2, 3, 9, 9] and [p for p, _ in m.segments] == [0, 3]
    assert tree.match([1, 2, 3, 4, 5, 6], limit=4).length == 4  # stops inside an edge
    assert tree.match([7], limit=1).length == 0
    # Over budget: the least recently used leaf goes first (b's was just used; a's leaf goes).
    tree.budget_bytes = (3 + 2) * 2 * 4
    tree.match(b, limit=5)
    tree.evict()
    assert tree.match(a, limit=6).length == 3 and tree.match(b, limit=5).length == 5
    assert tree.evictions == 1
    tree.clear()
    assert len(tree) == 0 and tree.nbytes == 0


def test_older_transformers_logits_to_keep_gives_the_same_tokens(tok, monkeypatch):
    """Where the model's forward keeps only the last K positions of every row (transformers 5.17 and older
    take no per-row positions), a prefill bucket of uneven suffixes keeps enough positions and picks each
    row's own: the same tokens and log-probs as the per-row path."""
    import agentrl.policies.engine as engine_mod

    model = tiny_model(tok, seed=5)
    # No shared prefixes, so the five prompts are one prefill bucket with uneven suffixes.
    prompts = [list(range(1000 * i, 1000 * i + n)) for i, n in enumerate((40, 31, 27, 40, 35), start=1)]
    samplings = [Sampling(max_new_tokens=6, seed=i) for i in range(len(prompts))]
    per_row = _engine(model, max_batch_size=8)
    if not per_row._row_keep:
        pytest.skip(
            "this transformers takes no per-row logits_to_keep: both engines would take the same path"
        )
    want = per_row.generate_sync(prompts, samplings)
    monkeypatch.setattr(engine_mod, "keeps_logits_per_row", lambda m: False)
    last_k = _engine(model, max_batch_size=8)
    got = last_k.generate_sync(prompts, samplings)
    assert [g.token_ids for g in got] == [g.token_ids for g in want]
    for g, w in zip(got, want, strict=True):
        assert max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs, strict=True)) < 1e-4
    assert last_k.stats().prefill_forwards == per_row.stats().prefill_forwards == 1
