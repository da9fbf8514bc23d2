"""The transfer check: OTB against GRPO on the real default (SmolLM2-135M, math-tir-arith-v0), a few seeds.

Each run is ``agentrl train`` with every default except ``--estimator`` and ``--seed`` (the shipped
defaults: 5 steps of 4 × 4 episodes), then ``agentrl eval`` of its last checkpoint on 32 held-out tasks × 4
samples. A default run takes ~10 minutes and ~4 GiB; every piece runs under the heavy lock in chunks of
at most ``--chunk`` seconds: training is stopped with SIGTERM at the end of a chunk (the trainer
checkpoints and exits) and resumed with ``--resume`` in the next one; the lock is released between chunks.
Re-running the script skips what is done (one ``eval.json`` per run under ``--out``)::

    .venv/bin/python experiments/otb_reproduction/train_smollm2.py --seeds 0 1 2 --estimators otb grpo
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCK = "/tmp/agentrl-heavy.lock"


def locked(cmd: list[str], chunk: int) -> int:
    """Run ``cmd`` under the heavy lock for at most ``chunk`` seconds (SIGTERM, then SIGKILL 60 s later)."""
    full = ["flock", LOCK, "timeout", "-k", "60", "-s", "TERM", str(chunk), *cmd]
    print("$", " ".join(full), flush=True)
    return subprocess.call(full, cwd=ROOT)


def done_steps(run: Path) -> int:
    """Training steps finished in a run directory (lines of metrics.jsonl)."""
    m = run / "metrics.jsonl"
    return sum(1 for line in m.read_text().splitlines() if line.strip()) if m.exists() else 0


def one_run(out: Path, estimator: str, seed: int, steps: int, chunk: int) -> dict:
    """Train (in chunks) and evaluate one run; returns its eval record."""
    run = out / f"{estimator}-s{seed}"
    rec_path = run / "eval.json"
    if rec_path.exists():
        return json.loads(rec_path.read_text())
    agentrl = str(ROOT / ".venv" / "bin" / "agentrl")
    t0 = time.time()
    while done_steps(run) < steps:
        if (run / "config.json").exists():
            cmd = [agentrl, "train", "--resume", str(run), "--steps", str(steps), "--no-progress"]
        else:
            cmd = [agentrl, "train", "--estimator", estimator, "--seed", str(seed), "--steps", str(steps)]
            cmd += ["--out", str(run), "--no-progress"]
        before = done_steps(run)
        locked(cmd, chunk)
        if done_steps(run) == before and (run / "config.json").exists() and done_steps(run) < steps:
            print(f"{run}: no progress in a whole chunk; giving up", file=sys.stderr)
            raise SystemExit(1)
    model = run / "checkpoints" / f"step-{steps:06d}" / "model"
    report = run / "eval-report.json"
    if not report.exists():
        locked([sys.executable, __file__, "--eval", str(model), str(report)], chunk)
    rec = {
        "estimator": estimator,
        "seed": seed,
        "steps": steps,
        "metrics": [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()],
        "eval": json.loads(report.read_text()),
        "wall_s": time.time() - t0,
    }
    rec_path.write_text(json.dumps(rec, indent=1))
    return rec


def baseline(out: Path, chunk: int) -> dict:
    """``agentrl eval`` of the untrained SmolLM2 (same tasks and settings as the trained runs)."""
    report = out / "untrained-eval-report.json"
    if not report.exists():
        from agentrl.models import smollm2_dir

        locked([sys.executable, __file__, "--eval", str(smollm2_dir()), str(report)], chunk)
    return json.loads(report.read_text())


def _step_tokens(m: dict) -> float:
    return float(m.get("tokens/model_per_episode", 0.0)) * float(m.get("episodes/total", 0.0))


def summarize(out: Path) -> dict:
    """Every finished run under ``out``: held-out pass@1 per estimator (with the binomial standard error of
    each evaluation) and the training reward per step."""
    import numpy as np

    runs: dict[str, list[dict]] = {}
    for p in sorted(out.glob("*/eval.json")):
        rec = json.loads(p.read_text())
        ev = rec["eval"]
        n = ev["tasks"] * ev["samples_per_task"] - ev["infra_failures"]
        p1 = ev["pass_at_1"]
        runs.setdefault(rec["estimator"], []).append(
            {
                "seed": rec["seed"],
                "steps": rec["steps"],
                "pass_at_1": p1,
                "stderr": float(np.sqrt(p1 * (1 - p1) / max(n, 1))),
                "episodes": n,
                "train_reward": [m.get("reward/mean") for m in rec["metrics"]],
                "model_tokens": float(
                    sum(
                        m.get("tokens/model_per_episode", 0) * m.get("episodes/total", 16)
                        for m in rec["metrics"]
                    )
                ),
                "grad_norm": [m.get("learn/grad_norm") for m in rec["metrics"]],
            }
        )
    summary: dict = {"runs": runs}
    for est, rs in runs.items():
        x = np.array([r["pass_at_1"] for r in rs])
        summary[est] = {"seeds": [r["seed"] for r in rs], "pass_at_1_mean": float(x.mean())}
    untrained = out / "untrained-eval-report.json"
    if untrained.exists():
        summary["untrained"] = json.loads(untrained.read_text())
    return summary


def eval_only(model: str, out: str) -> None:
    """``agentrl eval``'s defaults (32 held-out tasks × 4, temperature 1), the report written as JSON."""
    import asyncio
    import dataclasses
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from agentrl.trainers.evaluate import evaluate

    torch.set_num_threads(1)
    rep = asyncio.run(evaluate(model, "math-tir-arith-v0"))
    Path(out).write_text(json.dumps(dataclasses.asdict(rep), indent=1))


def main() -> None:
    """CLI."""
    if len(sys.argv) == 4 and sys.argv[1] == "--eval":
        eval_only(sys.argv[2], sys.argv[3])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--estimators", nargs="+", default=["otb", "grpo"])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=840, help="seconds per locked chunk (at most 900)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "otb-reproduction" / "smollm2-train")
    ap.add_argument("--untrained", action="store_true", help="also evaluate the untrained model (last)")
    a = ap.parse_args()
    if a.chunk > 900:
        raise SystemExit("--chunk must be at most 900 seconds (never hold the heavy lock longer)")
    a.out.mkdir(parents=True, exist_ok=True)
    for seed in a.seeds:  # seeds outermost, so partial results stay paired
        for est in a.estimators:
            rec = one_run(a.out, est, seed, a.steps, a.chunk)
            print(f"{est} seed {seed}: done ({rec['wall_s']:.0f}s)", flush=True)
    if a.untrained:
        print(f"untrained: pass@1 {baseline(a.out, a.chunk)['pass_at_1']:.3f}", flush=True)


if __name__ == "__main__":
    main()
