"""The README's main job, whole: the default `agentrl train` run, its timings, memory and held-out result.

One invocation runs `agentrl train --seed S` with every default (SmolLM2-135M-Instruct fp32,
math-tir-arith-v0, OTB, 4 tasks x 4 episodes per step, the held-out evaluation at both ends) in a child
process under `/usr/bin/time -v` (peak RSS, wall time), timestamps its output lines (setup, the untrained
evaluation, each step, the trained evaluation), then measures in this process — after the run, so the two
never compete for the cores — the floor of the rollout: plain `model.generate` on the same model, sampling
at batch size 16 (the rollout's concurrency) as many tokens as the median step sampled, prompts taken from
the env's own tasks. rollout / floor compares the step's rollout wall time with the time `model.generate`
needs for those tokens (targets: ≤ 1.5x, peak RSS ≤ 4 GiB).

Each seed's result is kept in docs/benchmarks/train_default.json; docs/benchmarks/train.md is rebuilt from all
of them (a table per seed, the held-out pass@1 untrained vs trained per seed and pooled).

    flock /tmp/agentrl-heavy.lock .venv/bin/python benchmarks/train_default.py --seed 0

Last line: ``rollout/generate floor: X.XXx, peak RSS Y.Y GiB``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "benchmarks"
STORE = DOCS / "train_default.json"
GIB = 2**30


def run_train(seed: int, out: Path, extra: list[str]) -> dict[str, Any]:
    """`agentrl train --seed seed` (defaults) under /usr/bin/time -v; output lines timestamped."""
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "agentrl.trainers", "train", "--seed", str(seed)]
    cmd += ["--no-progress", "--out", str(out), *extra]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    assert proc.stdout is not None and proc.stderr is not None
    stop = threading.Event()
    trace: list[tuple[float, float]] = []
    tracer = threading.Thread(target=_trace_rss, args=(proc.pid, t0, stop, trace), daemon=True)
    tracer.start()
    lines: list[tuple[float, str]] = []
    for line in proc.stdout:
        lines.append((time.perf_counter() - t0, line.rstrip("\n")))
        print(f"[{lines[-1][0]:6.0f}s] {line}", end="", flush=True)
    err = proc.stderr.read()
    wall = time.perf_counter() - t0
    stop.set()
    tracer.join()
    if proc.wait() != 0:
        raise RuntimeError(f"agentrl train failed:\n{err[-4000:]}")

    def at(prefix: str) -> float | None:
        return next((t for t, text in lines if text.startswith(prefix)), None)

    def timev(key: str) -> str:
        return next(ln.split(": ", 1)[1] for ln in err.splitlines() if ln.strip().startswith(key))

    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evaluation = json.loads((out / "eval.json").read_text()) if (out / "eval.json").exists() else None
    eval_s = {}
    for label in ("untrained", "trained"):
        path = out / f"eval-{label}.json"
        if path.exists():
            eval_s[label] = json.loads(path.read_text())["seconds"]
    ends = [at(f"step {i}:") for i in range(len(metrics))]
    phases: list[tuple[str, float, float]] = []  # (name, start, end) in seconds since the start
    for i, (m, end) in enumerate(zip(metrics, ends, strict=True)):
        if end is not None:
            start = end - m["time/step_s"]
            phases += [(f"step {i} rollout", start, start + m["time/rollout_s"])]
            phases += [(f"step {i} learn", start + m["time/rollout_s"], end)]
    first = phases[0][1] if phases else wall
    last = phases[-1][2] if phases else wall
    phases = [("start + untrained eval", 0.0, first), *phases, ("checkpoint + trained eval", last, wall)]
    peak_by_phase = {
        name: round(max((g for t, g in trace if a <= t <= b), default=0.0), 3) for name, a, b in phases
    }
    return {
        "seed": seed,
        "wall_s": wall,
        "rss_by_phase_gib": peak_by_phase,
        "peak_rss_gib": int(timev("Maximum resident set size")) * 1024 / GIB,
        "cpu_s": float(timev("User time")) + float(timev("System time")),
        "setup_s": at("agentrl train:"),
        "first_step_end_s": at("step 0:"),
        "eval_s": eval_s,
        "steps": [
            {
                "rollout_s": m["time/rollout_s"],
                "learn_s": m["time/learn_s"],
                "step_s": m["time/step_s"],
                "sampled_tokens": round(
                    m["tokens/model_per_episode"] * (m["episodes/total"] - m["episodes/infra_failures"])
                ),
                "episodes": m["episodes/total"],
                "reward": m["reward/mean"],
                "used_tool": m["tools/used_frac"],
                # Groups whose rewards all tie carry no gradient (issue 29 measures how often).
                "groups_drawn": m.get("groups/drawn"),
                "groups_zero_variance": m.get("groups/zero_variance"),
            }
            for m in metrics
        ],
        "eval": evaluation,
        "load_end": os.getloadavg()[0],
    }


def _trace_rss(pid: int, t0: float, stop: threading.Event, out: list[tuple[float, float]]) -> None:
    """Resident memory (GiB) of the trainer (the child of ``/usr/bin/time``, pid ``pid``) every 0.25 s."""
    child = None
    while not stop.is_set():
        try:
            if child is None:
                kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
                child = int(kids[0]) if kids else None
            if child is not None:
                status = Path(f"/proc/{child}/status").read_text()
                kib = next(int(x.split()[1]) for x in status.splitlines() if x.startswith("VmRSS:"))
                out.append((time.perf_counter() - t0, kib * 1024 / GIB))
        except (OSError, StopIteration, ValueError):
            pass
        stop.wait(0.25)


def _load(seed: int) -> tuple[Any, Any]:
    from agentrl.models import ModelSpec, resolve_model
    from agentrl.trainers.train import TrainConfig

    loaded = resolve_model(ModelSpec(TrainConfig().model, seed=seed, device="cpu", dtype="auto"))
    return loaded.model, loaded.tokenizer


async def step0_rollout(
    seed: int, model: Any, tok: Any, clock: Callable[[], float] = time.perf_counter
) -> tuple[float, list[Any]]:
    """Step 0's rollout of the default run on the real path (env, bubblewrap sandbox, the HF engine) with
    ``model``, the trainer's seeding and concurrency: ``(seconds on clock, trajectories)``."""
    import agentrl
    from agentrl.chat import ChatRenderer
    from agentrl.policies import HFPolicy
    from agentrl.rollout import run_groups
    from agentrl.sandbox import LocalSandbox, SandboxPool
    from agentrl.trainers.train_setup import TrainConfig, rollout_config, task_seeds

    cfg = TrainConfig(seed=seed)
    renderer = ChatRenderer(tok)
    policy = HFPolicy(
        model,
        tok,
        stop_token_ids=renderer.stop_token_ids,
        max_batch_size=cfg.rollout.concurrency,
        seed=cfg.seed,
    )
    pool = SandboxPool(LocalSandbox, size=cfg.rollout.concurrency)
    async with pool:
        t0 = clock()
        trajs = [
            done.trajectory
            async for done in run_groups(
                lambda: agentrl.make(cfg.env, sandbox_pool=pool),
                policy,
                renderer,
                rollout_config(cfg, 0),
                seeds=task_seeds(cfg.seed, 0, cfg.groups_per_step),
                group_size=cfg.group_size,
            )
        ]
        return clock() - t0, trajs


def rerun_step0(run: Path, seed: int, model: Any, tok: Any) -> dict[str, Any]:
    """Step 0's rollout again, in this process, with the untrained weights and the trainer's seeding (the
    real rollout path: env, sandbox, engine, per-episode streams); how many of its episodes sampled exactly
    the tokens of the run's step 0, where other episodes shared their batches in another order."""
    import asyncio

    from agentrl import read_trajectories

    before: dict[int | None, list[tuple[int, ...]]] = {}
    for t in read_trajectories(run / "trajectories.jsonl"):
        if t.meta.step == 0:
            before.setdefault(t.meta.seed, []).append(t.token_ids)

    took, trajs = asyncio.run(step0_rollout(seed, model, tok))
    same = 0
    for t in trajs:
        pool_ = before.get(t.meta.seed, [])
        if t.token_ids in pool_:
            pool_.remove(t.token_ids)
            same += 1
    return {
        "rollout_s": took,
        "episodes": len(trajs),
        "identical": same,
        "sampled_tokens": sum(t.num_model_tokens for t in trajs),
    }


def step0_prompts(seed: int, tok: Any, batch: int) -> tuple[Any, Any, int]:
    """The prompts of the default run's step 0 (its tasks x group size, the first ``batch``), left-padded for
    ``model.generate``: ``(input ids, attention mask, pad id)``."""
    import asyncio

    import torch

    import agentrl
    from agentrl.chat import ChatRenderer
    from agentrl.trainers.train_setup import TrainConfig, task_seeds

    cfg = TrainConfig(seed=seed)
    renderer = ChatRenderer(tok)
    env = agentrl.make(cfg.env)

    async def prompt(task_seed: int) -> list[int]:
        obs, _ = await env.reset(seed=task_seed)
        tools = list(getattr(env, "tools", ()) or ())
        return list(renderer.render_prompt(list(obs), tools=tools).token_ids)

    seeds = task_seeds(seed, 0, cfg.groups_per_step)
    prompts = [asyncio.run(prompt(s)) for s in seeds for _ in range(cfg.group_size)][:batch]
    asyncio.run(env.close())
    width = max(len(p) for p in prompts)
    pad = tok.pad_token_id if tok.pad_token_id is not None else renderer.stop_token_ids[0]
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask, pad


def floor_seconds(tokens: int, batch: int, seed: int, model: Any, tok: Any) -> dict[str, float]:
    """Plain `model.generate` (sampling, temperature 1) at ``batch`` rows, ``tokens`` sampled tokens in all,
    prompts rendered from the default env's step-0 tasks; a short warm-up first."""
    import torch
    from floor import sample_exactly

    ids, mask, pad = step0_prompts(seed, tok, batch)
    new = max(1, round(tokens / batch))

    def gen(n: int) -> float:
        torch.manual_seed(seed)
        t0 = time.perf_counter()
        sample_exactly(model, ids, mask, n, pad)
        return time.perf_counter() - t0

    gen(4)  # warm-up
    took = gen(new)
    return {"floor_s": took, "floor_tokens": new * batch, "batch": batch, "threads": torch.get_num_threads()}


def record(seed: int, extra: list[str]) -> dict[str, Any]:
    model, tok = _load(seed)
    # This machine's speed drifts by tens of percent within minutes: the floor is timed just before the run
    # and again after it, and the faster of the two is used (the smaller floor: the larger, honest ratio).
    before = floor_seconds(1024, 16, seed, model, tok)
    with tempfile.TemporaryDirectory() as d:
        res = run_train(seed, Path(d) / "run", extra)
        res["rerun"] = rerun_step0(Path(d) / "run", seed, model, tok) if not extra else None
    steps = res["steps"]
    median = sorted(steps, key=lambda s: s["sampled_tokens"])[len(steps) // 2]
    after = floor_seconds(median["sampled_tokens"], 16, seed, model, tok)
    floor = max(before, after, key=lambda f: f["floor_tokens"] / f["floor_s"])
    res["floor_before"], res["floor_after"] = before, after
    rate = floor["floor_tokens"] / floor["floor_s"]
    for s in steps:
        s["floor_s"] = s["sampled_tokens"] / rate
        s["ratio"] = s["rollout_s"] / s["floor_s"]
    res["floor"] = floor
    res["ratio_all"] = sum(s["rollout_s"] for s in steps) / sum(s["floor_s"] for s in steps)
    if res["rerun"] is not None:
        res["rerun"]["floor_s"] = res["rerun"]["sampled_tokens"] / rate
    res["extra_args"] = extra
    res["date"] = time.strftime("%Y-%m-%d %H:%M")
    return res


# -- docs ----------------------------------------------------------------------------------------------
def _pooled(runs: list[dict[str, Any]]) -> dict[str, float] | None:
    """pass@1 untrained / trained pooled over seeds (the same held-out tasks in every seed), with a paired
    bootstrap over tasks of the per-task differences averaged over seeds."""
    evals = [r["eval"] for r in runs if r.get("eval")]
    if not evals:
        return None
    tasks = evals[0]["untrained"]["task_ids"]
    per: dict[str, list[float]] = {"untrained": [], "trained": []}
    for label in per:
        for t in tasks:
            s = n = 0
            for e in evals:
                rep = e[label]
                i = rep["task_ids"].index(t) if t in rep["task_ids"] else -1
                if i >= 0:
                    s += rep["task_successes"][i]
                    n += rep["task_samples"][i]
            per[label].append(s / n if n else float("nan"))
    diffs = [a - b for a, b in zip(per["trained"], per["untrained"], strict=True)]
    rng = random.Random(0)
    k = len(diffs)

    def boot(xs: list[float]) -> tuple[float, float]:
        stats = sorted(sum(xs[rng.randrange(k)] for _ in range(k)) / k for _ in range(2000))
        return stats[49], stats[1950]

    ul, uh = boot(per["untrained"])
    tl, th = boot(per["trained"])
    gl, gh = boot(diffs)
    return {
        "seeds": len(evals),
        "tasks": k,
        "samples": sum(e["untrained"]["samples_per_task"] for e in evals),
        "untrained": statistics.fmean(per["untrained"]),
        "untrained_low": ul,
        "untrained_high": uh,
        "trained": statistics.fmean(per["trained"]),
        "trained_low": tl,
        "trained_high": th,
        "gain": statistics.fmean(diffs),
        "gain_low": gl,
        "gain_high": gh,
    }


def _flags(r: dict[str, Any]) -> str:
    """The run's settings besides the defaults, as they appear after the seed in the tables."""
    extra = r.get("extra_args") or []
    return f" (`{' '.join(extra)}`)" if extra else ""


def write_docs(runs: list[dict[str, Any]]) -> list[str]:
    lines = [
        "# `agentrl train` (embedded default): a whole run, its floor, memory and held-out result",
        "",
        f"Run: `python benchmarks/train_default.py --seed S` per seed, on {platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, torch threads = cores. Every default: "
        "SmolLM2-135M-Instruct (fp32, CPU), math-tir-arith-v0, OTB, 4 tasks x 4 episodes per step, real "
        "bubblewrap sandbox, held-out evaluation before step 0 and after the last step. The machine was "
        "**shared** with other jobs during these runs (1-minute load average at the end of each run in the "
        "table; 2 means the cores were busy with this run alone), so wall times are upper bounds of an idle "
        "machine's. Peak RSS and wall time come from `/usr/bin/time -v` on the `agentrl train` process.",
        "",
        "The floor: plain `model.generate` (sampling at temperature 1, batch 16 = the rollout's concurrency, "
        "prompts from the env's tasks, 2 torch threads), timed in the same invocation just before the run "
        "(1,024 tokens) and after it (the median step's number of sampled tokens); the faster of the two "
        "rates is used (this machine's speed drifts by tens of percent within minutes; the faster floor "
        "gives the larger ratio), and each step's floor is its sampled tokens at that rate. "
        "rollout / floor includes everything a rollout does besides sampling (prefill of prompts and tool "
        "outputs, the sandboxed Python calls, the env's checks).",
        "",
        "| seed | date | load at end | setup | end of step 0 | whole run | untrained eval | trained eval "
        "| steps | mean rollout | mean learn | mean step | rollout / floor (all steps) | peak RSS |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        st = r["steps"]
        ev = r.get("eval_s", {})
        lines.append(
            f"| {r['seed']}{_flags(r)} | {r['date']} | {r['load_end']:.1f} | {r['setup_s']:.0f} s "
            f"| {r['first_step_end_s']:.0f} s | {r['wall_s'] / 60:.1f} min "
            f"| {ev.get('untrained', float('nan')):.0f} s | {ev.get('trained', float('nan')):.0f} s "
            f"| {len(st)} "
            f"| {statistics.fmean(s['rollout_s'] for s in st):.0f} s "
            f"| {statistics.fmean(s['learn_s'] for s in st):.0f} s "
            f"| {statistics.fmean(s['step_s'] for s in st):.0f} s | **{r['ratio_all']:.2f}x** "
            f"| **{r['peak_rss_gib']:.2f} GiB** |"
        )
    lines += [
        "",
        "Per step (sampled tokens, rollout, floor for those tokens, ratio, learn):",
        "",
        "| seed | step | sampled tokens | rollout | floor | rollout / floor | learn | reward (train batch) "
        "| used tool |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        for k, s in enumerate(r["steps"]):
            lines.append(
                f"| {r['seed']} | {k} | {s['sampled_tokens']} | {s['rollout_s']:.1f} s "
                f"| {s['floor_s']:.1f} s "
                f"| {s['ratio']:.2f}x | {s['learn_s']:.1f} s | {s['reward']:.2f} | {s['used_tool']:.0%} |"
            )
    lines += [
        "",
        "Floor measurements (used: the faster): "
        + "; ".join(
            f"seed {r['seed']}: "
            + ", ".join(
                f"{when} {f['floor_tokens']} tokens at batch {f['batch']} in {f['floor_s']:.1f} s "
                f"({f['floor_tokens'] / f['floor_s']:.0f} tok/s)"
                for when, f in (
                    ("before", r.get("floor_before")),
                    ("after", r.get("floor_after") or r["floor"]),
                )
                if f
            )
            for r in runs
        )
        + ".",
        "",
        *[f"Note on seed {r['seed']}: {r['note']}." for r in runs if r.get("note")],
        "",
        "The floor's own speed moved between recordings: plain `generate` sampled 57-61 tokens/s on "
        "2026-11-23 (transformers 5.23), 33-40 tokens/s on 2026-11-26 (transformers 5.24; the learner "
        "was ~10 % slower that day too) and 65-75 tokens/s on the idle runs of 2026-11-27 (the same "
        "transformers, torch and floor code, an AMD EPYC host), so compare ratios within one recording date. "
        "The 2026-11-27 runs (docs/benchmarks/default-run-variants.json) read 1.57x at best because of that "
        "floor: their rollouts sampled step 0 at 39 tokens/s, as on 2026-11-26 (issue 46). On that host "
        "MKL's packed GEMM, which the engine decodes on, was only 15 % faster than the plain product for "
        "the LM head and slower for an MLP projection (CPU time, one thread, 16 rows: 29.5 against 34.7 ms, "
        "0.87 against 0.52 ms), so the engine's advantage over "
        "`generate` was gone; the engine now packs only the shapes that measure faster packed.",
        "",
        "Peak resident memory by phase (the trainer's VmRSS sampled every 0.25 s; runs recorded before this "
        "trace existed have none): "
        + "; ".join(
            f"seed {r['seed']}: "
            + ", ".join(f"{name} {gib:.2f} GiB" for name, gib in r["rss_by_phase_gib"].items())
            for r in runs
            if r.get("rss_by_phase_gib")
        )
        + ".",
        "",
        "Reproducibility on the real rollout path: after the run, step 0's rollout again in the benchmark's "
        "process (untrained weights, the trainer's per-episode seeds, real env and sandbox; other "
        "batch-mates and timing): "
        + "; ".join(
            f"seed {r['seed']}: {r['rerun']['identical']} of {r['rerun']['episodes']} episodes sampled "
            f"identical token streams (rollout {r['rerun']['rollout_s']:.1f} s for "
            f"{r['rerun']['sampled_tokens']} tokens, {r['rerun']['rollout_s'] / r['rerun']['floor_s']:.2f}x "
            "the floor)"
            for r in runs
            if r.get("rerun")
        )
        + ". An episode differs only where floating-point differences between batch shapes flip a draw; "
        "after that its tokens, tool calls and observations diverge.",
        "",
        "## Held-out result",
        "",
        "pass@1 on the env's test split (the same 32 held-out tasks x 2 samples in every run and for both "
        "policies, with the same sampling seeds), before training (untrained) and after the last step; 95 % "
        "intervals are percentile bootstraps over tasks (2,000 resamples), the gain's a paired bootstrap of "
        "the per-task differences.",
        "",
        "| seed | untrained pass@1 [95% CI] | trained pass@1 [95% CI] | gain [95% CI] |",
        "|---|---:|---:|---:|",
    ]
    for r in runs:
        e = r.get("eval")
        if not e:
            continue
        u, t, g = e["untrained"], e["trained"], e["gain"]
        lines.append(
            f"| {r['seed']} | {u['pass_at_1']:.3f} [{u['pass_at_1_low']:.3f}, {u['pass_at_1_high']:.3f}] "
            f"| {t['pass_at_1']:.3f} [{t['pass_at_1_low']:.3f}, {t['pass_at_1_high']:.3f}] "
            f"| {g['gain']:+.3f} [{g['low']:+.3f}, {g['high']:+.3f}] |"
        )
    p = _pooled(runs)
    if p is not None:
        lines.append(
            f"| pooled ({p['seeds']} seeds, {p['tasks']} tasks x {p['samples']}) "
            f"| {p['untrained']:.3f} [{p['untrained_low']:.3f}, {p['untrained_high']:.3f}] "
            f"| {p['trained']:.3f} [{p['trained_low']:.3f}, {p['trained_high']:.3f}] "
            f"| **{p['gain']:+.3f} [{p['gain_low']:+.3f}, {p['gain_high']:+.3f}]** |"
        )
        lines += [
            "",
            "Pooled: per task, the success rate over all seeds' samples; the interval bootstraps tasks (the "
            "seeds' runs are not resampled, so it covers task sampling, not run-to-run variation, which the "
            "per-seed rows show).",
        ]
    (DOCS / "train.md").write_text("\n".join(lines) + "\n")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train-args", default="", help="more `agentrl train` arguments (recorded)")
    ap.add_argument("--docs-only", action="store_true", help="rebuild train.md from the stored results")
    ap.add_argument("--no-record", action="store_true", help="do not store the result in the docs")
    ap.add_argument("--json", type=Path, help="also write this run's result here")
    args = ap.parse_args()
    runs: list[dict[str, Any]] = json.loads(STORE.read_text()) if STORE.exists() else []
    if not args.docs_only:
        res = record(args.seed, args.train_args.split())
        if args.json:
            args.json.write_text(json.dumps(res, indent=1) + "\n")
        if not args.no_record:
            runs = [r for r in runs if r["seed"] != args.seed] + [res]
            runs.sort(key=lambda r: r["seed"])
            STORE.write_text(json.dumps(runs, indent=1) + "\n")
    if runs:
        write_docs(runs)
    if not args.docs_only:
        print(f"steps {len(res['steps'])}, whole run {res['wall_s'] / 60:.1f} min, eval {res['eval_s']}")
        print(f"rollout/generate floor: {res['ratio_all']:.2f}x, peak RSS {res['peak_rss_gib']:.1f} GiB")


if __name__ == "__main__":
    main()
