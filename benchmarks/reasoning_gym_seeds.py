r"""Held-out pass@1 before and after the default run's recipe, per seed and pooled over seeds, read from the
runs' own files (no model is run here).

    python benchmarks/reasoning_gym_seeds.py \\
        docs/benchmarks/reasoning_gym_default_run.json runs/rg-s1:s1.log runs/rg-s2:s2.log

Each argument is a run folder of ``agentrl train`` (its ``eval.json``, or ``eval-untrained.json`` alone for a
run stopped before its trained evaluation, and ``metrics.jsonl``; ``:LOG`` adds the ``/usr/bin/time -v`` log
it was started under, for the wall time and peak RSS), or a raw file this script wrote before (one run, as
``docs/benchmarks/reasoning_gym_default_run.json`` holds seed 0). Per seed: the run's own evaluation, its
95 % percentile bootstrap over tasks and the paired gain (:func:`agentrl.trainers.evaluate.paired_gain`).
Pooled: every seed's samples of a task count for that task, the bootstrap resamples tasks (so the interval
is over tasks, the seeds' spread is shown beside it), and the gain's interval over runs is Student's t on
the per-seed gains. Writes ``docs/benchmarks/reasoning_gym_seeds.json`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

from agentrl.config import config_from_dict
from agentrl.trainers.evaluate import EvalReport, bootstrap_interval, paired_gain

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571}
"""Student's t, two-sided 95 %, by degrees of freedom."""


def load(arg: str) -> dict[str, Any]:
    """One run: its evaluations, its step rows and, with a log, its wall time and peak RSS."""
    path, _, log = arg.partition(":")
    p = Path(path)
    if p.is_file():
        return dict(json.loads(p.read_text()))
    config = json.loads((p / "config.json").read_text())
    run: dict[str, Any] = {
        "env": config["env"],
        "env_kwargs": config["env_kwargs"],
        "seed": config["seed"],
        "run_dir": str(p),
        "steps": [json.loads(line) for line in (p / "metrics.jsonl").read_text().splitlines() if line],
    }
    if (p / "eval.json").exists():
        run["eval"] = json.loads((p / "eval.json").read_text())
    else:  # stopped before the trained evaluation: the untrained one alone
        run["eval"] = {"untrained": json.loads((p / "eval-untrained.json").read_text())}
    if log:
        text = Path(log).read_text()
        rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
        wall = re.search(r"Elapsed \(wall clock\) time.*: (\S+)", text)
        run["peak_rss_gib"] = round(int(rss.group(1)) / 2**20, 2) if rss else None
        run["wall"] = wall.group(1) if wall else None
    return run


def report(raw: dict[str, Any]) -> EvalReport:
    """An EvalReport back from its JSON (tuples where the dataclass has them)."""
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k != "interval"}
    return config_from_dict(EvalReport, fields)


def pooled(reports: list[EvalReport]) -> tuple[float, float, float]:
    """pass@1 over every seed's samples; the bootstrap resamples tasks (a task: its samples of all seeds)."""
    tasks: dict[str, list[int]] = {}
    for r in reports:
        for t, c, n in zip(r.task_ids, r.task_successes, r.task_samples, strict=True):
            acc = tasks.setdefault(t, [0, 0])
            acc[0] += c
            acc[1] += n
    wins, ns = [v[0] for v in tasks.values()], [v[1] for v in tasks.values()]
    low, high = bootstrap_interval(wins, ns)
    return sum(wins) / sum(ns), low, high


def pooled_gain(pairs: list[tuple[EvalReport, EvalReport]]) -> dict[str, float]:
    """The paired gain with each task's samples summed over seeds (bootstrap over tasks)."""

    def merge(side: int) -> EvalReport:
        rs = [p[side] for p in pairs]
        ids = rs[0].task_ids
        succ = tuple(sum(dict(zip(r.task_ids, r.task_successes, strict=True))[t] for r in rs) for t in ids)
        samp = tuple(sum(dict(zip(r.task_ids, r.task_samples, strict=True))[t] for r in rs) for t in ids)
        return dataclasses.replace(rs[0], task_successes=succ, task_samples=samp)

    g = paired_gain(merge(0), merge(1))
    return {"before": g.before, "after": g.after, "gain": g.gain, "low": g.low, "high": g.high}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run folders (RUN or RUN:LOG) or raw JSON files of one run")
    p.add_argument("--out", default=str(DOCS / "reasoning_gym_seeds.json"))
    args = p.parse_args()
    runs = [load(a) for a in args.runs]
    lines = [
        "| seed | pass@1 untrained [95 % CI] | pass@1 after [95 % CI] | paired gain [95 % CI] |"
        " steps updated | token-limited before -> after | wall | peak RSS GiB |",
        "|---:|---|---|---|---:|---|---|---:|",
    ]
    pairs, gains, befores = [], [], []
    for run in runs:
        ev = run["eval"]
        before = report(ev["untrained"])
        befores.append(before)
        cells = f"{before.pass_at_1:.3f} [{before.pass_at_1_low:.3f}, {before.pass_at_1_high:.3f}]"
        updated = sum(1 for s in run["steps"] if s.get("learn/grad_norm", 0) > 0)
        if "trained" in ev:
            after = report(ev["trained"])
            g = paired_gain(before, after)
            pairs.append((before, after))
            gains.append(g.gain)
            lines.append(
                f"| {run['seed']} | {cells} | {after.pass_at_1:.3f} [{after.pass_at_1_low:.3f}, "
                f"{after.pass_at_1_high:.3f}] | {g.gain:+.3f} [{g.low:+.3f}, {g.high:+.3f}] | "
                f"{updated} of {len(run['steps'])} | {before.token_limited} -> {after.token_limited} | "
                f"{run.get('wall')} | {run.get('peak_rss_gib')} |"
            )
        else:
            lines.append(
                f"| {run['seed']} | {cells} | not reached ({len(run['steps'])} steps done) | - | "
                f"{updated} of {len(run['steps'])} | {before.token_limited} -> - | {run.get('wall')} | "
                f"{run.get('peak_rss_gib')} |"
            )
    summary: dict[str, Any] = {"seeds": [r["seed"] for r in runs], "trained_seeds": len(pairs)}
    b, bl, bh = pooled(befores)
    summary["untrained"] = {"pass_at_1": b, "low": bl, "high": bh, "seeds": len(befores)}
    if pairs:
        a, al, ah = pooled([q[1] for q in pairs])
        summary["trained"] = {"pass_at_1": a, "low": al, "high": ah, "seeds": len(pairs)}
        summary["gain_over_tasks"] = pooled_gain(pairs)
        if len(gains) > 1:
            m, sd = statistics.mean(gains), statistics.stdev(gains)
            half = T95[len(gains) - 1] * sd / math.sqrt(len(gains))
            summary["gain_over_runs"] = {"mean": m, "sd": sd, "low": m - half, "high": m + half}
        g = summary["gain_over_tasks"]
        over_runs = summary.get("gain_over_runs")
        runs_cell = (
            f"; over runs (t) [{over_runs['low']:+.3f}, {over_runs['high']:+.3f}]" if over_runs else ""
        )
        lines.append(
            f"| pooled ({len(pairs)} trained of {len(runs)}) | {b:.3f} [{bl:.3f}, {bh:.3f}] | {a:.3f} "
            f"[{al:.3f}, {ah:.3f}] | {g['gain']:+.3f} [{g['low']:+.3f}, {g['high']:+.3f}]{runs_cell} "
            "| | | | |"
        )
    Path(args.out).write_text(json.dumps({"summary": summary, "runs": runs}, indent=1))
    print("\n".join(lines))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
