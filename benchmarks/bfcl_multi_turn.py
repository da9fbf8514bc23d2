"""BFCL multi-turn accuracy per category of a model on bfcl-multi-turn-v0's held-out split, and episode
throughput against math-tir-arith-v0 in the same process.

    python benchmarks/bfcl_multi_turn.py --model smollm2 --tasks 4      # the first 4 test tasks per category

Accuracy is BFCL's: the share of tasks whose every user turn passes BFCL's checker (pass@1, one sample
per task, temperature 1 as ``agentrl eval`` samples). Each category is one ``agentrl eval`` run
(:func:`agentrl.trainers.evaluate.evaluate`) on the test split's first ``--tasks`` tasks (seeds 10000 on:
task indices 0..N-1); math-tir-arith-v0 runs the same number of tasks with the same model right after, so
the episodes/s ratio is side by side (``--no-math`` leaves it out where the time is short). Writes
``docs/benchmarks/bfcl.md`` and ``bfcl.json``.

    python benchmarks/bfcl_multi_turn.py --model smollm2 --until 05:20 --no-math   # rounds, to a deadline

``--until HH:MM`` (UTC) runs in rounds instead: one model and one generation engine for every category, each
round the next ``--per-round`` held-out tasks of every category at once, so the engine batches the
categories' episodes (decode steps shared, each prompt prefilled once with its prefix reused over the
turns). The files are rewritten after each round, a round starts only if the last one's duration still fits
before the deadline, so a stopped run leaves every category with the same number of tasks; ``--resume
docs/benchmarks/bfcl.json`` goes on from the next task, adding to its counts. The interval is
Wilson's (95 %), which stays informative at 0 of n where a bootstrap over tasks gives [0, 0].
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import agentrl
from agentrl.chat import ChatRenderer
from agentrl.models import ModelSpec, resolve_model
from agentrl.policies import HFPolicy
from agentrl.rollout import RolloutConfig
from agentrl.trainers.evaluate import evaluate, evaluate_policy, held_out_env

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


def wilson(c: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson's 95 % score interval of a proportion c/n."""
    if n == 0:
        return (math.nan, math.nan)
    p = c / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, mid - half), min(1.0, mid + half))


def _deadline(hhmm: str) -> float:
    now = dt.datetime.now(dt.UTC)
    h, m = (int(x) for x in hhmm.split(":"))
    at = now.replace(hour=h, minute=m, second=0, microsecond=0)
    return at.timestamp() if at > now else (at + dt.timedelta(days=1)).timestamp()


async def measure_rounds(args: argparse.Namespace) -> dict[str, Any]:
    """Rounds of ``--per-round`` tasks per category, all categories at once on one engine, to ``--until``."""
    until = _deadline(args.until)
    loaded = resolve_model(ModelSpec(args.model, device="cpu"))
    renderer = ChatRenderer(loaded.tokenizer)
    seed = 10_000
    policy = HFPolicy(
        loaded.model,
        loaded.tokenizer,
        stop_token_ids=renderer.stop_token_ids,
        device=loaded.device,
        seed=seed,
    )
    env = agentrl.registry.canonical_env("bfcl-multi-turn-v0")
    limits = {"max_turns": args.max_turns, "max_new_tokens": args.max_new_tokens, "max_total_tokens": 8192}
    cfg = RolloutConfig(**limits)
    factories = {c: held_out_env(env, "test", category=c)[0] for c in args.categories}
    rows: dict[str, Any] = {
        c: {
            "env": env,
            "env_kwargs": {"category": c},
            "limits": limits,
            "tasks": 0,
            "successes": 0,
            "task_ids": [],
            "task_successes": [],
            "episodes": 0,
            "token_limited": 0,
            "infra_failures": 0,
        }
        for c in args.categories
    }
    earlier, done = 0.0, 0
    if args.resume:  # go on after the tasks a stopped run measured, adding to its counts
        rows = json.loads(Path(args.resume).read_text())["rows"]
        done = min(rows[c]["tasks"] for c in args.categories)
        earlier = max(rows[c]["seconds"] for c in args.categories)
    start, last = time.perf_counter(), 0.0
    for r in range(done // args.per_round, args.max_rounds):
        if time.time() + last > until:
            print(f"round {r}: the last round took {last:.0f} s, no longer fits before {args.until} UTC")
            break
        began = time.perf_counter()
        first = seed + r * args.per_round
        reports = await asyncio.gather(
            *(
                evaluate_policy(
                    policy,
                    renderer,
                    factories[c],
                    env=env,
                    split="test",
                    k=1,
                    tasks=args.per_round,
                    seed=first,
                    rollout=cfg,
                )
                for c in args.categories
            )
        )
        last = time.perf_counter() - began
        for c, rep in zip(args.categories, reports, strict=True):
            row = rows[c]
            row["tasks"] += rep.tasks
            row["successes"] += sum(rep.task_successes)
            row["task_ids"] += list(rep.task_ids)
            row["task_successes"] += list(rep.task_successes)
            row["episodes"] += rep.episodes
            row["token_limited"] += rep.token_limited
            row["infra_failures"] += rep.infra_failures
            row["accuracy"] = row["successes"] / max(row["tasks"], 1)
            row["interval"] = list(wilson(row["successes"], row["tasks"]))
            row["seconds"] = earlier + time.perf_counter() - start
            row["episodes_per_s"] = row["episodes"] / row["seconds"]
            row["load_after"] = os.getloadavg()[0]
        tally = {c: [v["successes"], v["tasks"]] for c, v in rows.items()}
        print(f"round {r} ({last:.0f} s):", json.dumps(tally), flush=True)
        write(rows, args, note=f"{r + 1} rounds, {earlier + time.perf_counter() - start:.0f} s in all.")
    return rows


def write(rows: dict[str, Any], args: argparse.Namespace, note: str = "") -> None:
    """Write docs/benchmarks/bfcl.md and bfcl.json from the rows measured so far."""
    base = rows.get("math-tir-arith-v0", {})
    size = f"--until {args.until} --per-round {args.per_round}" if args.until else f"--tasks {args.tasks}"
    how = (
        "In rounds: every category's episodes of a round ran at once on one generation engine, so `seconds` "
        "is the whole run's wall time so far, shared by the categories. Wilson's 95 % interval."
        if args.until
        else "With its 95 % bootstrap interval over tasks."
    )
    lines = [
        "# BFCL multi-turn: accuracy per category and episode throughput",
        "",
        f"Run: `python benchmarks/bfcl_multi_turn.py --model {args.model} {size} --categories "
        f"{' '.join(args.categories)} --max-turns {args.max_turns} --max-new-tokens {args.max_new_tokens}"
        f"{'' if args.math else ' --no-math'}` "
        "on "
        f"{time.strftime('%Y-%m-%d')}, x86_64, {os.cpu_count()} CPUs, shared with other jobs (1-minute load "
        "average after each row below; 2 would be this run alone). One sample per task at temperature 1; "
        "the first tasks of each category's held-out split (seeds 10000 on). Accuracy is BFCL's (every user "
        f"turn passes BFCL's checker). {how}",
        "",
        "| category | tasks | accuracy | 95 % interval | episodes at a token limit | seconds | episodes/s |"
        " vs math-tir-arith-v0 | load |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        ratio = f"{r['episodes_per_s'] / base['episodes_per_s']:.3f}" if base.get("episodes_per_s") else "-"
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
    p.add_argument("--until", help="HH:MM UTC: run in rounds, all categories at once, until then")
    p.add_argument("--per-round", type=int, default=1, help="tasks per category in each round (--until)")
    p.add_argument("--max-rounds", type=int, default=40, help="at most this many rounds (--until)")
    p.add_argument("--resume", help="bfcl.json of a stopped --until run: go on from its next task (--until)")
    args = p.parse_args()
    if args.until:
        if args.math:
            p.error("--until measures BFCL only: add --no-math")
        asyncio.run(measure_rounds(args))
        return
    rows = asyncio.run(measure(args))
    write(rows, args)


if __name__ == "__main__":
    main()
