"""The ratios that matter, side by side in one run, with a committed history (issue 46).

Run it before each submission that touches a hot path (the engine, the sampler, the rollout, the learner,
the loop, the gateway, the sandbox). Every number is a ratio of two things measured in this process one
right after the other, so a shared machine's load moves both sides alike; the rollout and learner ratios
are CPU time (``time.process_time``, one torch thread), which a busy machine inflates much less than wall
time. Measured:

* ``rollout_over_floor``: CPU seconds per sampled token of the default run's step-0 rollout on the real path
  (env, bubblewrap sandbox, the HF engine; 4 tasks x 4 episodes) over plain ``model.generate`` sampling at
  batch 16 on the same prompts (benchmarks/floor.py). Lower is better; target <= 1.2.
* ``learner_over_floor``: the packed floor's CPU seconds per update over the learner's (score + step;
  benchmarks/learner_throughput.py's CPU batch, SmolLM2). Higher is better; target >= 0.9.
* ``otb_kernel_over_loop``: the vectorised OTB over the loop reference (benchmarks/credit.py, B=256, T=1024).
* ``gateway_over_native``: a gateway request inside the server (p50) over a native rollout turn
  (benchmarks/gateway.py, instant scripted policy).
* ``sandbox_start_over_process``: a one-shot LocalSandbox call (start, run, close; p50) over a fresh
  ``python -I -S -c`` (benchmarks/sandbox.py).

Each is measured ``--repeats`` times; the relative range of the repeats is the run's noise. One row per
run is appended to docs/benchmarks/history.jsonl (commit, date, machine, load averages, idle flag, each
ratio's repeats), and the result is compared with the last idle row: what moved by more than the noise of
either run (and 5 %) is printed. ``--plot`` renders the history to docs/benchmarks/history.png and its
table to docs/benchmarks/history.md (a section of docs/benchmarks.md).

    .venv/bin/python benchmarks/quick.py                 # measure, append, compare (about 5 min idle)
    .venv/bin/python benchmarks/quick.py --no-record     # measure and compare only
    .venv/bin/python benchmarks/quick.py --plot          # redraw docs/benchmarks/history.png
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
HISTORY = ROOT / "docs" / "benchmarks" / "history.jsonl"
PLOT = ROOT / "docs" / "benchmarks" / "history.png"
DIRTY = ("status", "--porcelain", "-uno", "--", "agentrl", "trainers", "envs", "tools", "sandbox")
"""Uncommitted changes to the package (not to the benchmarks) mark a row's commit ``+dirty``."""
MIN_MOVE = 0.05
"""A ratio must move by more than this fraction (and more than either run's noise) to be reported."""
METRICS: dict[str, tuple[str, float | None]] = {
    # name: (which way is better, target)
    "rollout_over_floor": ("lower", 1.2),
    "learner_over_floor": ("higher", 0.9),
    "otb_kernel_over_loop": ("lower", None),
    "gateway_over_native": ("lower", None),
    "sandbox_start_over_process": ("lower", None),
}


# -- the measurements -----------------------------------------------------------------------------------
def rollout_and_learner(repeats: int, seed: int) -> dict[str, list[float]]:
    """rollout/floor and learner/floor, CPU time, one torch thread; the two sides of each alternate."""
    import torch
    from floor import sample_exactly
    from learner_throughput import agentrl_update, floor_update, make_batch
    from train_default import _load, step0_prompts, step0_rollout

    from agentrl.learner import Learner, LearnerConfig

    model, tok = _load(seed)
    ids, mask, pad = step0_prompts(seed, tok, 16)

    def floor_cpu(tokens: int) -> tuple[float, int]:
        n = max(1, round(tokens / ids.shape[0]))
        torch.manual_seed(seed)
        t0 = time.process_time()
        sample_exactly(model, ids, mask, n, pad)
        return time.process_time() - t0, n * ids.shape[0]

    floor_cpu(16)  # warm-up
    rollout: list[float] = []
    for k in range(repeats):
        took, trajs = asyncio.run(step0_rollout(seed, model, tok, clock=time.process_time))
        tokens = sum(t.num_model_tokens for t in trajs)
        f_s, f_tokens = floor_cpu(tokens)
        rollout.append((took / tokens) / (f_s / f_tokens))
        print(f"  rollout {k}: {tokens} tokens {took:.1f} cpu-s, floor {f_tokens} tokens {f_s:.1f} cpu-s")

    lmodel = model  # the same SmolLM2 fp32 weights (build_model's), trained from here on
    batch = make_batch(6, 32, 192, int(lmodel.config.vocab_size), seed, torch.device("cpu"))
    adv = torch.randn(batch.input_ids_B_T.shape, generator=torch.Generator().manual_seed(seed + 1))
    adv = adv * batch.loss_mask_B_T
    learner = Learner(lmodel, LearnerConfig(lr=1e-6, micro_batch_tokens=0, chunk_size=0))
    plans = learner._micro(batch, lmodel)
    attention = learner._attention()

    def timed(fn: Callable[[], object]) -> float:
        t0 = time.process_time()
        fn()
        return time.process_time() - t0

    def ours() -> float:
        return timed(lambda: agentrl_update(learner, batch, adv))

    def floor() -> float:
        return timed(lambda: floor_update(lmodel, learner.optimizer, batch, plans, False, attention))

    ours(), floor()  # warm-up
    learner_r: list[float] = []
    for k in range(repeats):
        a, f = ours(), floor()
        learner_r.append(f / a)
        print(f"  learner {k}: update {a:.2f} cpu-s, floor {f:.2f} cpu-s")
    return {"rollout_over_floor": rollout, "learner_over_floor": learner_r}


def otb(repeats: int) -> list[float]:
    """Vectorised OTB over the loop reference (each the best of 3), ``repeats`` times."""
    from credit import bench_otb

    return [1 / bench_otb(256, 1024, 8, 8, 3)["speedup"] for _ in range(repeats)]


def gateway(repeats: int) -> list[float]:
    """In-server p50 of a gateway request over a native rollout turn, the server in its own process."""
    import gateway as gw

    from agentrl.chat import ChatRenderer
    from agentrl.models import smollm2_tokenizer

    renderer = ChatRenderer(smollm2_tokenizer())
    script = str(Path(gw.__file__).resolve())
    proc = subprocess.Popen([sys.executable, script, "--serve"], stdout=subprocess.PIPE, text=True)
    out = []
    try:
        assert proc.stdout is not None
        m = re.match(r"URL (\S+)", proc.stdout.readline())
        if m is None:
            raise RuntimeError("the gateway benchmark server did not start")
        asyncio.run(gw.load(m.group(1), proc.pid, 10, 1, "warm"))
        for k in range(repeats):
            native_ms = asyncio.run(gw.native(renderer, 20))
            inside = asyncio.run(gw.load(m.group(1), proc.pid, 30, 1, f"q{k}"))["server_p50"]
            out.append(inside / native_ms)
    finally:
        proc.kill()
        proc.wait()
    return out


def sandbox(repeats: int) -> list[float]:
    """One-shot sandbox call p50 over a fresh ``python -I -S -c`` p50 (10 calls each, interleaved)."""
    import sandbox as sb

    out = []
    for _ in range(repeats):
        fresh = asyncio.run(sb.serial(lambda: sb.fresh_process(["-I", "-S", "-c"]), 10))
        one = asyncio.run(sb.serial(sb.one_shot, 10))
        out.append(statistics.median(one) / statistics.median(fresh))
    return out


# -- the record -----------------------------------------------------------------------------------------
def _git(*args: str) -> str:
    r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return r.stdout.strip()


def machine() -> str:
    """The CPU model and core count (a ratio can move with the host: issue 46's floor did)."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores"


def noise(xs: list[float]) -> float:
    """Relative range of the repeats (0 for one)."""
    return (max(xs) - min(xs)) / statistics.median(xs) if len(xs) > 1 else 0.0


def read_history(path: Path) -> list[dict[str, Any]]:
    """The rows of the history file, oldest first."""
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def compare(row: dict[str, Any], base: dict[str, Any] | None) -> list[str]:
    """What moved against ``base`` by more than either run's noise (and :data:`MIN_MOVE`)."""
    if base is None:
        return ["no earlier idle row to compare with"]
    lines = []
    for name, (better, _) in METRICS.items():
        new, old = row["ratios"].get(name), base["ratios"].get(name)
        if not new or not old:
            continue
        a, b = statistics.median(new), statistics.median(old)
        change = a / b - 1
        limit = max(noise(new), noise(old), MIN_MOVE)
        if abs(change) > limit:
            worse = (change > 0) == (better == "lower")
            lines.append(
                f"{name}: {b:.3f} -> {a:.3f} ({change:+.0%}, noise {limit:.0%}): "
                f"{'WORSE' if worse else 'better'} than {base['commit']} ({base['date']})"
            )
    return lines or [f"nothing moved beyond the noise against {base['commit']} ({base['date']})"]


def plot(rows: list[dict[str, Any]], out: Path) -> None:
    """One panel per ratio over the rows; idle runs filled, contended ones hollow."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(METRICS), 1, figsize=(9, 2.1 * len(METRICS)), sharex=True)
    labels = [f"{r['commit']}\n{r['date'][5:16]}" for r in rows]
    for ax, (name, (better, target)) in zip(axes, METRICS.items(), strict=True):
        for i, r in enumerate(rows):
            xs = r["ratios"].get(name)
            if not xs:
                continue
            ax.errorbar(
                i,
                statistics.median(xs),
                yerr=[[statistics.median(xs) - min(xs)], [max(xs) - statistics.median(xs)]],
                fmt="o",
                color="C0" if r["idle"] else "C1",
                mfc="C0" if r["idle"] else "none",
            )
        if target is not None:
            ax.axhline(target, color="grey", ls="--", lw=0.8)
        ax.set_ylabel(name.replace("_over_", " /\n"), fontsize=8)
        ax.set_title(f"{name} ({better} is better)", fontsize=8, loc="left")
    axes[-1].set_xticks(range(len(rows)), labels, fontsize=7)
    fig.suptitle("benchmarks/quick.py history (filled: idle, hollow: contended; bars: repeats)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    print(f"wrote {out}")


def markdown(rows: list[dict[str, Any]], png: Path) -> str:
    """docs/benchmarks/history.md: the plot and one line per row (medians; noise = range of the repeats)."""
    names = list(METRICS)
    head = " | ".join(n.replace("_over_", " / ").replace("_", " ") for n in names)
    lines = [
        "## Ratio history (`benchmarks/quick.py`)",
        "",
        "Written by `python benchmarks/quick.py --plot` from docs/benchmarks/history.jsonl (one row per",
        "run of `benchmarks/quick.py`). Each ratio is measured side by side in one process; the rollout",
        "and learner ratios by CPU time at one torch thread. Medians of the repeats, their relative range",
        "in brackets; a run is idle when the 1-minute load was at most half the cores at its start and",
        "at most the cores at its end. Targets: rollout / floor <= 1.2, learner / floor >= 0.9.",
        "",
        f"![ratio history]({png.name})",
        "",
        f"| commit | date | machine | load start / end | idle | {head} | note |",
        "|---|---|---|---|---|" + "---:|" * len(names) + "---|",
    ]
    for r in rows:
        cells = []
        for n in names:
            xs = r["ratios"].get(n)
            cells.append(f"{statistics.median(xs):.3f} [{noise(xs):.0%}]" if xs else "")
        lines.append(
            f"| {r['commit']} | {r['date']} | {r['machine']} "
            f"| {r['load_start'][0]:.1f} / {r['load_end'][0]:.1f} | {'yes' if r['idle'] else 'no'} "
            f"| {' | '.join(cells)} | {r.get('note', '')} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2, help="measurements of each ratio (the noise)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: CPU time is exact)")
    ap.add_argument("--history", type=Path, default=HISTORY)
    ap.add_argument("--no-record", action="store_true", help="do not append the row")
    ap.add_argument("--note", default="", help="recorded with the row (e.g. what the commit changed)")
    ap.add_argument("--plot", action="store_true", help="only redraw the plot from the history")
    a = ap.parse_args(argv)
    if a.repeats < 1:
        ap.error("--repeats must be at least 1")
    if a.plot:
        rows = read_history(a.history)
        png = a.history.with_suffix(".png")
        plot(rows, png)
        a.history.with_suffix(".md").write_text(markdown(rows, png))
        return 0
    import torch

    torch.set_num_threads(a.threads)
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    ratios = rollout_and_learner(a.repeats, a.seed)
    ratios["otb_kernel_over_loop"] = otb(a.repeats)
    ratios["gateway_over_native"] = gateway(a.repeats)
    ratios["sandbox_start_over_process"] = sandbox(a.repeats)
    load1 = os.getloadavg()
    cores = os.cpu_count() or 1
    row = {
        "commit": _git("rev-parse", "--short", "HEAD") + ("+dirty" if _git(*DIRTY) else ""),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "threads": a.threads,
        "load_start": [round(x, 2) for x in load0],
        "load_end": [round(x, 2) for x in load1],
        # Idle: nothing else ran when it started, and at the end the 1-minute load is this run's own.
        "idle": load0[0] <= cores / 2 and load1[0] <= cores,
        "wall_s": round(time.perf_counter() - t0),
        "ratios": {k: [round(x, 4) for x in v] for k, v in ratios.items()},
        "note": a.note,
    }
    history = read_history(a.history)
    base = next((r for r in reversed(history) if r["idle"]), None)
    print(json.dumps(row))
    for name, xs in row["ratios"].items():
        target = METRICS[name][1]
        goal = f" (target {'<=' if METRICS[name][0] == 'lower' else '>='} {target})" if target else ""
        print(f"{name:28s} {statistics.median(xs):.3f}  noise {noise(xs):.0%}{goal}")
    print(f"load {row['load_start']} -> {row['load_end']}: {'idle' if row['idle'] else 'CONTENDED'}")
    for line in compare(row, base):
        print(line)
    if not a.no_record:
        with a.history.open("a") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
