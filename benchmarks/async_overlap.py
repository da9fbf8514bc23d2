"""Asynchronous overlap: wall time per training step with --max-staleness S = 0, 1, 2, side by side.

The real trainer (``agentrl.trainers.pg.train``: the synchronous loop for S = 0, the asynchronous loop of
``trainers/async_loop.py`` for S >= 1) on the tiny model, with sleep-bound generation and a learner step of
similar duration, both configurable:

* generation: ``agentrl.testing.ScriptedPolicy`` behind a ``RecordingWeightSink`` sleeps ``--gen-s`` per
  model turn (one-turn episodes of ``guess-number-v0``), like an inference server's latency;
* learning: the tiny model's real update (collate, scoring pass, OTB with the correction, PPO step) plus
  ``--learn-sleep-s`` of sleep inside ``Learner.step`` (a harness subclass), so the learner is as slow as
  generation.

Measured per S: wall time per step (steps after the first, which pays for warm-up), the learner's idle
fraction (time waiting for data / step time), the largest staleness trained on. The target (issue 13):
S = 1 at least 1.6x the throughput of S = 0 when generation ≈ learning (ceiling 2x). This runs in one
process on the local runtime, not on Ray (branch ``ray`` was not available to it).

    .venv/bin/python benchmarks/async_overlap.py            # writes docs/benchmarks/async.md
    .venv/bin/python benchmarks/async_overlap.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "async.md"


def run_one(S: int, args: argparse.Namespace, out: Path) -> dict[str, float]:
    import functools

    import agentrl.trainers.local as local
    import agentrl.trainers.pg as pg
    from agentrl.learner import Learner, LearnerConfig
    from agentrl.metrics import read_metrics
    from agentrl.models import smollm2_tokenizer
    from agentrl.rollout import RolloutConfig
    from agentrl.testing import RecordingWeightSink, ScriptedPolicy

    sleep_s = args.learn_sleep_s

    class SleepyLearner(Learner):
        """The real learner, with a sleep added to every step (the harness's stand-in for a bigger model)."""

        def step(self, *a: Any, **kw: Any) -> Any:
            time.sleep(sleep_s)
            return super().step(*a, **kw)

    tok = smollm2_tokenizer()
    stop = tok.convert_tokens_to_ids("<|im_end|>")

    def turn(prompt_ids: Any, sampling: Any) -> list[int]:
        guess = 1 + int(hashlib.sha256(str(sampling.seed).encode()).hexdigest(), 16) % 3
        return [*tok.encode(str(guess), add_special_tokens=False), stop]

    sink = RecordingWeightSink(ScriptedPolicy(turn, with_sampling=True, stop_ids=[stop], delay_s=args.gen_s))
    cfg = pg.TrainConfig(
        model="tiny",
        env="guess-number-v0",
        env_kwargs={"low": 1, "high": 3, "max_guesses": 1},
        group_size=args.group_size,
        groups_per_step=args.groups,
        steps=args.steps,
        out=str(out / f"s{S}"),
        progress=False,
        max_staleness=S,
        rollout=RolloutConfig(max_turns=1, max_new_tokens=8, max_total_tokens=256, seed=1, concurrency=64),
        learner=LearnerConfig(lr=1e-3),
        checkpoint_every=10_000,  # only the last step writes one: the benchmark times the loop
    )
    original = local.Learner
    local.Learner = SleepyLearner  # type: ignore[misc]
    try:
        t0 = time.perf_counter()
        asyncio.run(pg.train(cfg, runtime=functools.partial(local.local_runtime, sampler=sink)))
        total = time.perf_counter() - t0
    finally:
        local.Learner = original  # type: ignore[misc]
    rows = read_metrics(cfg.out)[1:]  # step 0 pays for warm-up
    idle = [r.get("async/learner_idle_frac", r["time/rollout_s"] / r["time/step_s"]) for r in rows]
    return {
        "step_s": statistics.mean(r["time/step_s"] for r in rows),
        "rollout_wait_s": statistics.mean(r["time/rollout_s"] for r in rows),
        "learn_s": statistics.mean(r["time/learn_s"] for r in rows),
        "idle": statistics.mean(idle),
        "staleness": max(r.get("staleness/max", 0.0) for r in read_metrics(cfg.out)),
        "total_s": total,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gen-s", type=float, default=1.0, help="sleep per model turn (generation)")
    ap.add_argument("--learn-sleep-s", type=float, default=0.7, help="sleep added to each learner step")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--groups", type=int, default=2, help="groups per step")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="4 steps, shorter sleeps")
    ap.add_argument("--no-docs", action="store_true", help="do not write docs/benchmarks/async.md")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.gen_s, args.learn_sleep_s = 4, 0.5, 0.3
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    res: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for S in (0, 1, 2):
            res[S] = run_one(S, args, Path(tmp))
            print(f"S={S}: {res[S]}", file=sys.stderr)
    speed = {S: res[0]["step_s"] / res[S]["step_s"] for S in res}
    load = os.getloadavg()[0]
    lines = [
        "# Asynchronous overlap",
        "",
        "`benchmarks/async_overlap.py`: the real trainer on the tiny model, local runtime (one process;",
        "not Ray), sleep-bound generation (a scripted policy sleeping per turn, one-turn episodes) and a",
        "learner step of similar duration (the tiny model's real update plus a sleep). S = 0 is the",
        "synchronous loop; S >= 1 the asynchronous loop (`trainers/async_loop.py`). Means over steps 1..",
        "(step 0 warms up).",
        "Target (issue 13): S = 1 >= 1.6x the throughput of S = 0 (ceiling 2x).",
        "",
        f"Settings: {args.groups} groups x {args.group_size} episodes per step, {args.steps} steps, "
        f"generation {args.gen_s} s per turn, learner sleep {args.learn_sleep_s} s per step. Machine: "
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; 1-minute load "
        f"average {load:.1f} at the end (other jobs may share the machine).",
        "",
        "| S | wall s / step | learner waits for data, s / step | learn s / step | learner idle | "
        "max staleness | throughput vs S = 0 |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for S, r in res.items():
        lines.append(
            f"| {S} | {r['step_s']:.2f} | {r['rollout_wait_s']:.2f} | {r['learn_s']:.2f} | {r['idle']:.0%} | "
            f"{r['staleness']:.0f} | {speed[S]:.2f}x |"
        )
    lines += [
        "",
        "At S = 0 the learner idles for the whole rollout and generation idles for the whole update; at",
        "S = 1 the next step's episodes run during the update, so a step costs about max(generation,",
        "learning) instead of their sum. S = 2 adds nothing when the two are equal (the bound is not what",
        "limits throughput), it only allows older data.",
    ]
    if not args.no_docs:
        DOCS.parent.mkdir(parents=True, exist_ok=True)
        DOCS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"async overlap S=1: {speed[1]:.2f}x")


if __name__ == "__main__":
    main()
