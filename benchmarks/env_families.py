"""Episode throughput of the library env families against math-tir-arith-v0, in one process.

Each env plays scripted right episodes (no model: the env's cost alone, through SmolLM2's real tokenizer,
chat template and audited rollout): math-tir-arith-v0 and ``reasoning-gym:chain_sum`` with the python tool
(one sandboxed run, then the answer), ``reasoning-gym:chain_sum`` without it (one turn),
``textarena:TowerOfHanoi-v0`` (the 7 moves that win it) and ``bfcl-multi-turn-v0`` (a ``base`` task's ground
truth: every user turn's calls against the task's backends, BFCL's checker after each). Rounds interleave
the envs so that a change of the machine's load hits them alike; the ratio to math-tir-arith-v0 is the
number to read.

    python benchmarks/env_families.py --rounds 3 --episodes 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Sequence

import agentrl
from agentrl.chat import ChatRenderer
from agentrl.episode import RolloutConfig, run_episode
from agentrl.models import smollm2_tokenizer
from agentrl.testing import ScriptedPolicy

ENVS: dict[str, tuple[str, dict[str, object]]] = {
    "math-tir-arith-v0": ("math-tir-arith-v0", {}),
    "reasoning-gym:chain_sum (python)": ("reasoning-gym:chain_sum", {"python": True}),
    "reasoning-gym:chain_sum": ("reasoning-gym:chain_sum", {}),
    "textarena:TowerOfHanoi-v0": ("textarena:TowerOfHanoi-v0", {}),
    "bfcl-multi-turn-v0 (base)": ("bfcl-multi-turn-v0", {"category": "base"}),
}


def turns_for(env: agentrl.Env, info: dict[str, object]) -> Sequence[str]:
    actions = env.sample_actions()
    if actions:
        return actions
    # math-tir-v0 declares no sample episode: the same shape as the reasoning-gym one, a run then the answer.
    return ("```python\nprint(1)\n```", f"Answer: {info['answer']}")


async def one_episode(name: str, seed: int, tokenizer: object, renderer: ChatRenderer) -> tuple[float, float]:
    env_id, kwargs = ENVS[name]
    async with agentrl.make(env_id, **kwargs) as env:
        _, info = await env.reset(seed=seed)
        turns = [[*tokenizer.encode(t), renderer.stop_token_ids[0]] for t in turns_for(env, info)]  # type: ignore[attr-defined]
        policy = ScriptedPolicy(turns, stop_ids=renderer.stop_token_ids)
        # BFCL's prompt alone is 2,500-5,400 tokens, and a ground-truth turn of calls can pass 128 tokens.
        config = RolloutConfig(
            max_turns=len(turns), max_new_tokens=max(map(len, turns)), max_total_tokens=32768, audit=True
        )
        start = time.perf_counter()
        trajectory = await run_episode(env, policy, renderer, config, seed=seed)
        return time.perf_counter() - start, trajectory.reward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=4, help="episodes per env per round")
    parser.add_argument("--out", default=None, help="write the raw results here as JSON")
    args = parser.parse_args()
    tokenizer = smollm2_tokenizer()
    renderer = ChatRenderer(tokenizer)
    for name in ENVS:  # build each once outside the timing (imports, library start-up)
        asyncio.run(one_episode(name, 0, tokenizer, renderer))
    seconds: dict[str, list[float]] = {n: [] for n in ENVS}
    rewards: dict[str, list[float]] = {n: [] for n in ENVS}
    for r in range(args.rounds):
        for name in ENVS:
            for e in range(args.episodes):
                took, reward = asyncio.run(one_episode(name, 1000 * r + e, tokenizer, renderer))
                seconds[name].append(took)
                rewards[name].append(reward)
    base = sum(seconds["math-tir-arith-v0"]) / len(seconds["math-tir-arith-v0"])
    print(
        f"load average {os.getloadavg()[0]:.1f} at the end; {args.rounds} rounds x {args.episodes} episodes"
    )
    print(f"{'env':36} {'episodes/s':>10} {'ms/episode':>10} {'x math-tir':>10} {'mean reward':>11}")
    for name in ENVS:
        mean = sum(seconds[name]) / len(seconds[name])
        rew = sum(rewards[name]) / len(rewards[name])
        print(f"{name:36} {1 / mean:10.2f} {1000 * mean:10.0f} {base / mean:10.2f} {rew:11.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"seconds": seconds, "rewards": rewards, "load_end": os.getloadavg()}, f, indent=1)


if __name__ == "__main__":
    main()
