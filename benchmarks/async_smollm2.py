"""A real run: SmolLM2-135M on the default task, --max-staleness 1 against 0, the same steps and seed.

Runs ``agentrl train`` twice (subprocesses, one after the other), then writes the reward, gradient-norm and
sampler/learner-KL curves side by side to ``docs/async_smollm2.png`` and a table to
``docs/benchmarks/async_smollm2.md``: wall time, mean step time, learner idle fraction, largest staleness,
and whether the correction kept training stable (grad norm, KL, ρ̄ statistics). Heavy: run it under the lock::

    flock /tmp/agentrl-heavy.lock .venv/bin/python benchmarks/async_smollm2.py --steps 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PNG = ROOT / "docs" / "async_smollm2.png"
MD = ROOT / "docs" / "benchmarks" / "async_smollm2.md"


def train(S: int, out: Path, args: argparse.Namespace) -> float:
    cmd = [
        sys.executable, "-m", "agentrl.trainers", "train",
        "--steps", str(args.steps),
        "--groups-per-step", str(args.groups),
        "--group-size", str(args.group_size),
        "--rollout.max-new-tokens", str(args.max_new_tokens),
        "--max-staleness", str(S),
        "--out", str(out),
        "--no-progress",
        "--eval.tasks", str(args.eval_tasks),
    ]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"S={S} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    print(proc.stdout, file=sys.stderr)
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument(
        "--eval-tasks",
        type=int,
        default=0,
        help="held-out evaluation at both ends (0: off; the curves are training reward)",
    )
    ap.add_argument("--timeout", type=int, default=3600)
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agentrl.metrics import read_metrics

    with tempfile.TemporaryDirectory() as tmp:
        walls, rows = {}, {}
        for S in (0, 1):
            walls[S] = train(S, Path(tmp) / f"s{S}", args)
            rows[S] = read_metrics(Path(tmp) / f"s{S}")
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, key, title in (
        (axes[0], "reward/mean", "reward"),
        (axes[1], "learn/grad_norm", "gradient norm"),
        (axes[2], "correction/kl_sampler_learner", "KL(sampler ‖ learner) per token"),
    ):
        for S, style in ((0, "o-"), (1, "s--")):
            xs = [r["step"] for r in rows[S] if key in r]
            ax.plot(xs, [r[key] for r in rows[S] if key in r], style, label=f"S = {S}")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend()
    fig.suptitle(f"SmolLM2-135M, math-tir-arith-v0, {args.groups}x{args.group_size} episodes/step, OTB")
    fig.tight_layout()
    PNG.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PNG, dpi=110)

    def mean(S: int, key: str) -> float:
        vals = [r[key] for r in rows[S] if isinstance(r.get(key), float)]
        return statistics.mean(vals) if vals else float("nan")

    lines = [
        "# Asynchronous training, a real run",
        "",
        "`benchmarks/async_smollm2.py`: `agentrl train` on the default (SmolLM2-135M-Instruct,",
        f"math-tir-arith-v0, OTB), {args.groups} groups x {args.group_size} episodes per step, "
        f"{args.steps} steps, `--rollout.max-new-tokens {args.max_new_tokens}`, seed 0, `--max-staleness 0`",
        "and `1`, one after the other on a 2-core CPU (1-minute load average "
        f"{os.getloadavg()[0]:.1f} at the end; shared machine).",
        "Curves: `docs/async_smollm2.png`.",
        "",
        "| S | wall s | mean step s | learner idle | max staleness | mean reward | mean grad norm | "
        "max KL(μ‖π_old) | mean ρ̄ on stale tokens |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for S in (0, 1):
        idle = [r.get("async/learner_idle_frac", r["time/rollout_s"] / r["time/step_s"]) for r in rows[S]]
        kl = max((r.get("correction/kl_sampler_learner", 0.0) for r in rows[S]), default=0.0)
        lines.append(
            f"| {S} | {walls[S]:.0f} | {mean(S, 'time/step_s'):.1f} | {statistics.mean(idle):.0%} | "
            f"{max(r.get('staleness/max', 0.0) for r in rows[S]):.0f} | {mean(S, 'reward/mean'):.3f} | "
            f"{mean(S, 'learn/grad_norm'):.3f} | {kl:.2e} | {mean(S, 'correction/rho_mean'):.3f} |"
        )
    lines += [
        "",
        "Per step (S = 1): "
        + ", ".join(
            f"step {r['step']}: reward {r['reward/mean']:.2f}, grad {r['learn/grad_norm']:.2f}, "
            f"stale tokens {r.get('staleness/stale_token_frac', 0.0):.0%}"
            for r in rows[1]
        ),
    ]
    MD.parent.mkdir(parents=True, exist_ok=True)
    MD.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"async smollm2 S=1 vs S=0 wall: {walls[0] / walls[1]:.2f}x")


if __name__ == "__main__":
    main()
