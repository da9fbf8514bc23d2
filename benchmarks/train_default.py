"""The README's main job, first step: wall time from the command to the end of step 0, and tool use.

Runs `agentrl train` on its embedded default (SmolLM2-135M-Instruct, math-tir-arith-v0, OTB, 4x4
episodes) for one step in a subprocess, then reads the run directory. Targets (issue 6): the first
step ends within 5 minutes of the command on 2 cores, and at least a quarter of the episodes run
Python and read its output before answering. Writes docs/benchmarks/train.md.

    .venv/bin/python benchmarks/train_default.py [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_run(out: Path) -> dict[str, float]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentrl.trainers",
            "train",
            "--steps",
            "1",
            "--no-progress",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - t0
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    trajs = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    ran_python = sum(any(c["name"] == "python" for c in t["tool_calls"]) for t in trajs)
    return {
        "wall_s": wall,
        "episodes": len(trajs),
        "ran_python_frac": ran_python / len(trajs),
        "used_tool_frac": row["tools/used_frac"],
        "reward_mean": row["reward/mean"],
        "rollout_s": row["time/rollout_s"],
        "sandbox_s": row["time/sandbox_s"],
        "learn_s": row["time/learn_s"],
        "model_tokens": row["tokens/model_per_episode"],
        "stdout_tail": proc.stdout.strip().splitlines()[-2],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    rows = []
    for k in range(args.repeats):
        with tempfile.TemporaryDirectory() as d:
            rows.append(one_run(Path(d) / f"run{k}"))
    load = os.getloadavg()[0]
    lines = [
        "# `agentrl train` (embedded default): the first step",
        "",
        f"Run: `python benchmarks/train_default.py --repeats {args.repeats}` on {platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}; "
        f"1-minute load average at the end {load:.1f}. SmolLM2-135M-Instruct (fp32, CPU), "
        "math-tir-arith-v0, OTB, 4 tasks x 4 episodes, real bubblewrap sandbox.",
        "",
        "| run | command → end of step 0 | rollout | sandbox (sum of calls) | learn "
        "| episodes that ran python | ran python and answered after reading it | reward mean "
        "| model tokens / episode |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for k, r in enumerate(rows):
        lines.append(
            f"| {k} | {r['wall_s']:.0f} s | {r['rollout_s']:.0f} s | {r['sandbox_s']:.1f} s "
            f"| {r['learn_s']:.0f} s | {r['ran_python_frac']:.0%} | {r['used_tool_frac']:.0%} "
            f"| {r['reward_mean']:.2f} "
            f"| {r['model_tokens']:.0f} |"
        )
    worst = max(r["wall_s"] for r in rows)
    used = min(r["used_tool_frac"] for r in rows)
    lines += [
        "",
        f"Targets: first step within 300 s: **{'met' if worst <= 300 else 'missed'}** "
        f"(slowest {worst:.0f} s, {worst / 300:.2f}x the budget); at least 25 % of episodes use the tool: "
        f"**{'met' if used >= 0.25 else 'missed'}** ({used:.0%}).",
        "The wall time includes Python start-up, loading the converted model (cached by `.ci/setup`), "
        "the sandbox self-test, the rollout, the learner's scoring pass and update, "
        "and writing the checkpoint.",
    ]
    out = ROOT / "docs" / "benchmarks" / "train.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
