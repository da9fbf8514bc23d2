"""long-chain-v0 measurements with the tiny policy: compaction (env-written, policy-written) vs truncation,
and OTB vs GRPO with multi-sample episodes, trained from the CLI.

    nice -n 15 python experiments/long_horizon/run.py success --seeds 0 1 2
    nice -n 15 python experiments/long_horizon/run.py rl --seeds 0 1 --steps 8
    python experiments/long_horizon/run.py report

``success``: for each seed, a warm-started policy (``policy.warm_start``, trained on demonstrations of
all three modes) plays ``--tasks`` held-out chains in each mode at the same token budget per turn
(``max_new_tokens``) and per context (``max_total_tokens``), one episode per task, temperature 1; plus the
full-history reference (truncate with a budget that holds the whole history). ``rl``: ``agentrl train
--model <warm start> --env long-chain-v0 --env-kwargs '{"context": "env-compaction", ...}'`` with
``--estimator otb`` and ``--estimator grpo`` per seed; the trainer's held-out eval (``eval.json``) before
and after. Results go to ``results/*.json``; ``report`` prints the tables with 95 % bootstrap intervals
(over tasks, seeds pooled; paired by task for differences). Threads: one per process (see ``main``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
RESULTS = HERE / "results"
WORK = Path("/tmp/agentrl-long-horizon")

K, EVERY = 8, 3
"""Chain length and tool calls per sample: the whole history is about 220 tokens. (K = 12, about 400
tokens, was tried first: after its 400-step warm start the tiny policy solved no chain in any mode, not even
with the whole history in context, so its measurement could not tell the modes apart.)"""
TURN_TOKENS = 3 * K + 12
"""Token budget per turn (max_new_tokens), the same in every mode."""
CONTEXT = 160
"""Context budget (max_total_tokens): one compacted sample fits (at most about 145 tokens), the whole
history (about 220) does not."""
FULL = 1024
"""The full-history reference's budget (holds every turn)."""
MODES = ("env-compaction", "policy-compaction", "truncate")


@dataclass(frozen=True)
class WarmStart:
    """How the policy is warm-started: SFT steps, demonstrations per mode, learning rate.

    The defaults are the first round's. Its policy depended on the seed (seed 0 solved 6-20 % of the
    chains, seeds 1 and 2 at most 6 %); later rounds train longer (``--warm-steps``), on more
    demonstrations (``--warm-episodes``) and at a lower rate (``--warm-lr``)."""

    steps: int = 600
    episodes: int = 96
    lr: float = 3e-3

    @property
    def tag(self) -> str:
        """File-name tag (empty for the first round's, whose names predate the flags)."""
        first = WarmStart()
        if self == first:
            return ""
        episodes = "" if self.episodes == first.episodes else f"-e{self.episodes}"
        return f"-w{self.steps}{episodes}" + ("" if self.lr == first.lr else f"-lr{self.lr:g}")


def results_path(kind: str, ws: WarmStart) -> Path:
    """``results/success.json`` or ``results/rl.json``, one pair per warm start."""
    return RESULTS / f"{kind}{ws.tag}.json"


def warm(seed: int, ws: WarmStart) -> Path:
    from policy import warm_start

    t0 = time.perf_counter()
    out = warm_start(
        WORK / f"warm-k{K}{ws.tag}-{seed}",
        seed=seed,
        steps=ws.steps,
        episodes=ws.episodes,
        lr=ws.lr,
        modes=MODES,
        k=K,
        compact_every=EVERY,
    )
    print(f"warm start seed {seed}: {out} ({time.perf_counter() - t0:.0f}s)", flush=True)
    return out


async def _success(folder: Path, mode: str, budget: int, tasks: int, seed: int) -> list[float]:
    """One episode per held-out task; the episode's return (the sum over its samples) per task."""
    from agentrl.chat import ChatRenderer
    from agentrl.envs.long_chain import LongChainEnv
    from agentrl.models import load_model, load_tokenizer
    from agentrl.policies import HFPolicy
    from agentrl.rollout import RolloutConfig, collect

    tok = load_tokenizer(folder)
    renderer = ChatRenderer(tok)
    policy = HFPolicy(load_model(folder), tok, stop_token_ids=renderer.stop_token_ids, seed=seed)
    cfg = RolloutConfig(
        max_turns=4 * K, max_new_tokens=TURN_TOKENS, max_total_tokens=budget, seed=seed, concurrency=16
    )
    groups = await collect(
        lambda: LongChainEnv(k=K, context=mode, compact_every=EVERY, split="test"),
        policy,
        renderer,
        n_groups=tasks,
        group_size=1,
        config=cfg,
        seed=10_000,
    )
    by_task: dict[str, float] = {}
    for g in groups:
        if g.infra_failures:  # never scored as a failure of the policy
            bad = next(t for t in g if t.infra_failure)
            raise SystemExit(f"{mode}@{budget}: infra failure in {g.task_id}: {bad.stop_reason} {bad.errors}")
        by_task[g.task_id] = sum(t.reward for t in g.trajectories)
    return [by_task[k] for k in sorted(by_task)]


def success(seeds: list[int], tasks: int, ws: WarmStart) -> None:
    RESULTS.mkdir(exist_ok=True)
    path = results_path("success", ws)
    data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    for seed in seeds:
        folder = warm(seed, ws)
        for mode, budget in [*((m, CONTEXT) for m in MODES), ("truncate", FULL)]:
            key = f"{mode}@{budget}/seed{seed}"
            if key in data:
                continue
            t0 = time.perf_counter()
            data[key] = asyncio.run(_success(folder, mode, budget, tasks, seed))
            print(f"{key}: success {np.mean(data[key]):.3f} ({time.perf_counter() - t0:.0f}s)", flush=True)
            path.write_text(json.dumps(data, indent=1))


def rl(
    seeds: list[int],
    steps: int,
    credits: list[str],
    eval_tasks: int,
    lr: float,
    warm_seed: int | None,
    ws: WarmStart,
) -> None:
    """``agentrl train`` per seed and estimator from the warm start of that seed (or of ``warm_seed``:
    then the seeds vary only the training run, its tasks and its sampling)."""
    RESULTS.mkdir(exist_ok=True)
    path = results_path("rl", ws)
    data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    kwargs = json.dumps({"context": "env-compaction", "k": K, "compact_every": EVERY})
    for seed in seeds:
        folder = warm(seed if warm_seed is None else warm_seed, ws)
        for credit in credits:
            key = f"{credit}/seed{seed}" + (f"-warm{warm_seed}" if warm_seed not in (None, seed) else "")
            if key in data:
                continue
            run = WORK / f"rl-k{K}{ws.tag}-{credit}-{key.split('/')[1]}-{steps}-lr{lr:g}"
            cmd = [
                sys.executable, "-m", "agentrl.trainers", "train", "--model", str(folder),
                "--env", "long-chain-v0", "--env-kwargs", kwargs, "--estimator", credit, "--seed", str(seed),
                "--steps", str(steps), "--group-size", "4", "--groups-per-step", "4",
                "--rollout.max-new-tokens", str(TURN_TOKENS), "--rollout.max-total-tokens", str(CONTEXT),
                "--rollout.max-turns", str(4 * K), "--learner.lr", str(lr), "--eval.tasks", str(eval_tasks),
                "--no-progress", "--out", str(run),
            ]  # fmt: skip
            t0 = time.perf_counter()
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"{key} failed:\n{out.stderr[-3000:]}")
            ev = json.loads((run / "eval.json").read_text())
            metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
            data[key] = {
                "eval": ev,
                "lr": lr,
                "warm_start_seed": seed if warm_seed is None else warm_seed,
                "warm_start_steps": ws.steps,
                "warm_start_episodes": ws.episodes,
                "warm_start_lr": ws.lr,
                "steps": steps,
                "seconds": time.perf_counter() - t0,
                "metrics": metrics,
                "stdout": out.stdout[-4000:],
            }
            print(f"{key}: {out.stdout.strip().splitlines()[-2]}", flush=True)
            path.write_text(json.dumps(data, indent=1))


def _boot(x: np.ndarray, n: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(n, len(x)))].mean(axis=1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def report(ws: WarmStart) -> None:
    print(f"warm start: {ws.steps} steps on {ws.episodes} demonstrations per mode, lr {ws.lr:g}")
    path = results_path("success", ws)
    if path.exists():
        data = json.loads(path.read_text())
        print("| mode | context budget | seeds | tasks per seed | success | 95 % interval |")
        print("|---|---|---|---|---|---|")
        for mode, budget in [*((m, CONTEXT) for m in MODES), ("truncate", FULL)]:
            runs = {k: v for k, v in data.items() if k.startswith(f"{mode}@{budget}/")}
            if not runs:
                continue
            x = np.concatenate([np.asarray(v, dtype=float) for v in runs.values()])
            lo, hi = _boot(x)
            n = len(next(iter(runs.values())))
            print(f"| {mode} | {budget} | {len(runs)} | {n} | {x.mean():.3f} | [{lo:.3f}, {hi:.3f}] |")
        compaction = (f"env-compaction@{CONTEXT}", f"policy-compaction@{CONTEXT}")
        for a in compaction:
            for b in (f"truncate@{CONTEXT}", f"truncate@{FULL}"):
                seeds = sorted({k.split("/")[1] for k in data if k.startswith(f"{a}/")})
                diffs = [
                    np.asarray(data[f"{a}/{s}"]) - np.asarray(data[f"{b}/{s}"])
                    for s in seeds
                    if f"{b}/{s}" in data
                ]
                if diffs:
                    d = np.concatenate(diffs)
                    lo, hi = _boot(d)
                    print(f"\n{a} - {b}: {d.mean():+.3f} [{lo:+.3f}, {hi:+.3f}] (paired by task)")
    path = results_path("rl", ws)
    if path.exists():
        data = json.loads(path.read_text())
        head = "| estimator | seed | warm start | held-out pass@1 before | after | gain (paired) | seconds |"
        print(f"\n{head}")
        print("|---|---|---|---|---|---|---|")
        for key, v in sorted(data.items()):
            ev = v["eval"]
            b, a, g = ev["untrained"], ev["trained"], ev["gain"]
            print(
                f"| {key.split('/')[0]} | {key.split('/')[1]} | {v.get('warm_start_seed', key[-1])} | "
                f"{b['pass_at_1']:.3f} "
                f"[{b['pass_at_1_low']:.3f}, {b['pass_at_1_high']:.3f}] | {a['pass_at_1']:.3f} "
                f"[{a['pass_at_1_low']:.3f}, {a['pass_at_1_high']:.3f}] | {g['gain']:+.3f} "
                f"[{g['low']:+.3f}, {g['high']:+.3f}] | {v['seconds']:.0f} |"
            )
        seeds = sorted({k.split("/")[1] for k in data})
        pairs = [
            (data[f"otb/{s}"], data[f"grpo/{s}"]) for s in seeds if f"otb/{s}" in data and f"grpo/{s}" in data
        ]
        if pairs:
            d = np.concatenate([_task_diff(o["eval"]["trained"], g["eval"]["trained"]) for o, g in pairs])
            lo, hi = _boot(d)
            print(
                f"\notb - grpo, trained held-out pass@1 ({len(pairs)} runs each, {len(d)} tasks, paired by "
                f"task): {d.mean():+.3f} [{lo:+.3f}, {hi:+.3f}]"
            )


def _task_diff(a: dict[str, Any], b: dict[str, Any]) -> np.ndarray:
    """Per-task pass@1 of report ``a`` minus report ``b`` on the tasks both evaluated."""
    ra = {t: s / n for t, s, n in zip(a["task_ids"], a["task_successes"], a["task_samples"], strict=True)}
    rb = {t: s / n for t, s, n in zip(b["task_ids"], b["task_successes"], b["task_samples"], strict=True)}
    return np.asarray([ra[t] - rb[t] for t in sorted(set(ra) & set(rb))], dtype=float)


def main() -> None:
    # One thread: on a contended 2-core machine two threads per process ran the tiny model about 5x
    # slower than one (measured: 15.7 s vs 3.1 s per SFT step of 32 x 405 tokens). The trainer
    # subprocesses inherit OMP_NUM_THREADS.
    import os

    import torch

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("success")
    s.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    s.add_argument("--tasks", type=int, default=64)
    r = sub.add_parser("rl")
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    r.add_argument("--steps", type=int, default=8)
    r.add_argument("--credits", nargs="+", default=["otb", "grpo"])
    r.add_argument("--eval-tasks", type=int, default=32)
    # The OTB reproduction's tiny-policy rate. 1e-3 was tried first: OTB seed 0 went from held-out pass@1
    # 0.156 to 0.000 after 8 steps, every training reward 0 from the second step on.
    r.add_argument("--lr", type=float, default=3e-4)
    r.add_argument("--warm-seed", type=int, default=None, help="one warm start for every seed")
    rep = sub.add_parser("report")
    first = WarmStart()
    for q in (s, r, rep):
        q.add_argument("--warm-steps", type=int, default=first.steps, help="SFT steps of the warm start")
        q.add_argument("--warm-episodes", type=int, default=first.episodes, help="demonstrations per mode")
        q.add_argument("--warm-lr", type=float, default=first.lr, help="the warm start's SFT learning rate")
    a = p.parse_args()
    ws = WarmStart(a.warm_steps, a.warm_episodes, a.warm_lr)
    if a.cmd == "success":
        success(a.seeds, a.tasks, ws)
    elif a.cmd == "rl":
        rl(a.seeds, a.steps, a.credits, a.eval_tasks, a.lr, a.warm_seed, ws)
    else:
        report(ws)


if __name__ == "__main__":
    main()
