"""BFCL multi-turn accuracy per category of a model on bfcl-multi-turn-v0's held-out split, and episode
throughput against math-tir-arith-v0 in the same process.

    python benchmarks/bfcl_multi_turn.py --model smollm2 --tasks 4      # the first 4 test tasks per category

Accuracy is BFCL's: the share of tasks whose every user turn passes BFCL's checker (pass@1, one sample
per task, temperature 1 as ``agentrl eval`` samples). Each category is one ``agentrl eval`` run
(:func:`agentrl.trainers.evaluate.evaluate`) on the test split's first ``--tasks`` tasks (seeds 10000 on:
task indices 0..N-1); math-tir-arith-v0 runs the same number of tasks with the same model right after, so
the episodes/s ratio is side by side (``--no-math`` leaves it out where the time is short). Writes
``docs/benchmarks/bfcl.md`` and ``bfcl.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from agentrl.trainers.evaluate import evaluate

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for name, env, kwargs, limits in [
        *[
            (
                c,
                "bfcl-multi-turn-v0",
                {"category": c},
                {
                    "max_turns": args.max_turns,
                    "max_new_tokens": args.max_new_tokens,
                    "max_total_tokens": 8192,
                },
            )
            for c in args.categories
        ],
        *(
            [("math-tir-arith-v0", "math-tir-arith-v0", {}, {"max_turns": 3, "max_new_tokens": 96})]
            if args.math
            else []
        ),
    ]:
        start = time.perf_counter()
        report = await evaluate(
            args.model, env, k=1, tasks=args.tasks, split="test", env_kwargs=kwargs, **limits
        )
        took = time.perf_counter() - start
        rows[name] = {
            "env": env,
            "env_kwargs": kwargs,
            "limits": limits,
            "tasks": report.tasks,
            "accuracy": report.pass_at_1,
            "interval": [report.pass_at_1_low, report.pass_at_1_high],
            "task_ids": list(report.task_ids),
            "episodes": report.episodes,
            "token_limited": report.token_limited,
            "seconds": took,
            "episodes_per_s": report.episodes / took if took else 0.0,
            "load_after": os.getloadavg()[0],
        }
        print(name, json.dumps(rows[name]), flush=True)
    return rows


def write(rows: dict[str, Any], args: argparse.Namespace, note: str = "") -> None:
    math = rows.get("math-tir-arith-v0", {})
    lines = [
        "# BFCL multi-turn: accuracy per category and episode throughput",
        "",
        f"Run: `python benchmarks/bfcl_multi_turn.py --model {args.model} --tasks {args.tasks} --categories "
        f"{' '.join(args.categories)} --max-turns {args.max_turns} --max-new-tokens {args.max_new_tokens}"
        f"{'' if args.math else ' --no-math'}` "
        "on "
        f"{time.strftime('%Y-%m-%d')}, x86_64, {os.cpu_count()} CPUs, shared with other jobs (1-minute load "
        "average after each row below; 2 would be this run alone). One sample per task at temperature 1; "
        "the first tasks of each category's held-out split (seeds 10000 on). Accuracy is BFCL's (every user "
        "turn passes BFCL's checker), with its 95 % bootstrap interval over tasks.",
        "",
        "| category | tasks | accuracy | 95 % interval | episodes at a token limit | seconds | episodes/s |"
        " vs math-tir-arith-v0 | load |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        ratio = f"{r['episodes_per_s'] / math['episodes_per_s']:.3f}" if math.get("episodes_per_s") else "-"
        low, high = r["interval"]
        lines.append(
            f"| {name} | {r['tasks']} | {r['accuracy']:.3f} | [{low:.3f}, {high:.3f}] | "
            f"{r['token_limited']} | {r['seconds']:.0f} | {r['episodes_per_s']:.4f} | {ratio} | "
            f"{r['load_after']:.1f} |"
        )
    lines += ["", note, ""] if note else [""]
    DOCS.mkdir(parents=True, exist_ok=True)
    (DOCS / "bfcl.md").write_text("\n".join(lines))
    (DOCS / "bfcl.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--tasks", type=int, default=4, help="tasks per category (the test split's first N)")
    p.add_argument("--categories", nargs="+", default=list(CATEGORIES))
    p.add_argument("--max-turns", type=int, default=8, help="model turns per episode")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument(
        "--no-math", dest="math", action="store_false", help="skip the math-tir-arith-v0 row (the ratio)"
    )
    args = p.parse_args()
    rows = asyncio.run(measure(args))
    write(rows, args)


if __name__ == "__main__":
    main()
