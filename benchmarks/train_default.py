"""The README's main job, first step: wall time from the command to the end of step 0, and tool use.

Runs `agentrl train` on its embedded default (SmolLM2-135M-Instruct, math-tir-arith-v0, OTB, 4x4
episodes) for one step in a subprocess, then reads the run directory. Targets (issue 6): the first
step ends within 5 minutes of the command on 2 cores, and at least a quarter of the episodes run
Python and read its output before answering. Writes docs/benchmarks/train.md.

    .venv/bin/python benchmarks/train_default.py [--repeats 1]
    .venv/bin/python benchmarks/train_default.py --curve RUN   # add the per-step table of a finished run
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


CURVE_KEYS = [
    ("reward/mean", "reward", "{:.3f}"),
    ("tools/used_frac", "used tool", "{:.0%}"),
    ("tools/calls_per_episode", "calls / ep", "{:.2f}"),
    ("tools/errors_per_episode", "tool errors / ep", "{:.3f}"),
    ("tokens/model_per_episode", "model tokens / ep", "{:.0f}"),
    ("learn/grad_norm", "grad norm", "{:.3f}"),
    ("variance/proxy1_signal_strength", "OTB signal", "{:.3f}"),
    ("time/step_s", "step s", "{:.0f}"),
]


def curve(run: Path) -> list[str]:
    """The per-step table of a finished `agentrl train` run (reads its metrics.jsonl and config.json)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    cfg = json.loads((run / "config.json").read_text())
    # config.json says "otb" (older runs) or {"name": "otb", ...options}; print it as the CLI names it.
    from agentrl.credit import estimator_config

    estimator = estimator_config(cfg["estimator"])
    lines = [
        "",
        "## A whole default run",
        "",
        f"`agentrl train` with every default ({cfg['model']}, {cfg['env']}, {estimator}, "
        f"{cfg['groups_per_step']} tasks x {cfg['group_size']} episodes, {cfg['steps']} steps), "
        f"summarised by `benchmarks/train_default.py --curve RUN`. Each step samples new tasks, so the "
        "reward of one step is a 16-episode estimate (±0.12 at p = 0.5).",
        "",
        "| step | " + " | ".join(name for _, name, _ in CURVE_KEYS) + " |",
        "|---:|" + "---:|" * len(CURVE_KEYS),
    ]
    for r in rows:
        cells = [fmt.format(r[k]) if isinstance(r.get(k), int | float) else "–" for k, _, fmt in CURVE_KEYS]
        lines.append(f"| {r['step']} | " + " | ".join(cells) + " |")
    total = sum(r.get("time/step_s", 0.0) for r in rows)
    lines += ["", f"Total step time {total / 60:.1f} min for {len(rows)} steps."]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--curve", type=Path, default=None, help="a finished run directory to add as a table")
    args = ap.parse_args()
    out = ROOT / "docs" / "benchmarks" / "train.md"
    if args.curve is not None:
        text = out.read_text().split("\n## A whole default run")[0].rstrip("\n")
        out.write_text(text + "\n" + "\n".join(curve(args.curve)) + "\n")
        print(out.read_text())
        return
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
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
