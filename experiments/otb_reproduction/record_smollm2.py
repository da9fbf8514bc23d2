"""Record a pool of SmolLM2-135M trajectories on math-tir-arith-v0 for the exact-variance measurement.

Real policy (SmolLM2-135M-Instruct, offline), real bubblewrap sandbox, the trainer's rollout settings
(3 turns, 96 new tokens per turn, temperature 1). Each prompt (env seed) gets ``--samples`` episodes: the
pool from which :mod:`variance` draws groups of N. Appends to ``--out`` (a ``trajectories.jsonl``), skipping
prompts already complete there, so a long recording can be done in chunks (run it under the heavy lock)::

    flock /tmp/agentrl-heavy.lock .venv/bin/python experiments/otb_reproduction/record_smollm2.py \
        --seeds 0 1 2 --samples 40 --out runs/otb-reproduction/smollm2_pool.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections import Counter
from pathlib import Path

import agentrl
from agentrl import JsonlStore, TrajectoryMeta, read_trajectories
from agentrl.chat import ChatRenderer
from agentrl.models import load_model, load_tokenizer, smollm2_dir
from agentrl.policies import HFPolicy
from agentrl.rollout import RolloutConfig, run_groups

ENV = "math-tir-arith-v0"


async def record(seeds: list[int], samples: int, out: Path, concurrency: int, max_new_tokens: int) -> None:
    """Run ``samples`` episodes for every seed not yet complete in ``out``."""
    from agentrl.sandbox import rollout_pool

    done = Counter(t.meta.task_id for t in read_trajectories(out)) if out.exists() else Counter()
    todo = [s for s in seeds if done[f"{ENV}:{s}"] < samples]
    if not todo:
        print("nothing to do: every prompt is complete")
        return
    path = smollm2_dir()
    tok = load_tokenizer(path)
    renderer = ChatRenderer(tok)
    policy = HFPolicy(
        load_model(path),
        tok,
        stop_token_ids=renderer.stop_token_ids,
        max_batch_size=concurrency,
        seed=1234,
    )
    cfg = RolloutConfig(
        max_turns=3,
        max_new_tokens=max_new_tokens,
        temperature=1.0,
        seed=1234,
        max_total_tokens=1024,
        concurrency=concurrency,
        on_template_mismatch="stop",
    )
    store = JsonlStore(out)
    t0 = time.perf_counter()
    n = 0
    async with rollout_pool(concurrency) as pool:

        def make_env() -> agentrl.Env:
            return agentrl.make(ENV, sandbox_pool=pool)

        for s in todo:
            # A partial prompt from an interrupted chunk is redone whole (its group id differs anyway).
            meta = TrajectoryMeta(env_id=ENV, group_id=f"{ENV}:{s}:m{max_new_tokens}", policy_version=0)
            async for done_ep in run_groups(
                make_env, policy, renderer, cfg, seeds=[s], group_size=samples, meta=meta
            ):
                await store.append(done_ep.trajectory)
                n += 1
            print(f"seed {s}: {samples} episodes, {time.perf_counter() - t0:.0f}s so far", flush=True)
    store.close()
    print(f"recorded {n} episodes in {time.perf_counter() - t0:.0f}s -> {out}")


def main() -> None:
    """CLI."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", required=True, help="env seeds (one prompt each)")
    ap.add_argument("--samples", type=int, default=40, help="episodes per prompt")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--concurrency", type=int, default=40)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is faster on a busy machine)")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    asyncio.run(record(args.seeds, args.samples, args.out, args.concurrency, args.max_new_tokens))


if __name__ == "__main__":
    main()
