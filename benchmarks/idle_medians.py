"""Medians of repeated idle runs of the two speed checks of issue 46, derived from their result files.

The targets of issue 46 are medians of three idle runs: the default run's rollout against plain
``model.generate`` on the same tokens (``benchmarks/train_default.py --json``) and the learner's update
against its packed floor (``benchmarks/learner_throughput.py --out``). Each idle session keeps its raw result
files in ``docs/benchmarks/idle/<date>/`` (``td-*.json``, ``lt-*.json`` and a ``meta.json`` naming the
commit); this script turns one such folder into the markdown table that docs/benchmarks.md and the README
quote, so no number is copied by hand.

    .venv/bin/python benchmarks/idle_medians.py docs/benchmarks/idle/2026-11-28 > docs/benchmarks/idle.md
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def _load(folder: Path, pattern: str) -> list[dict[str, Any]]:
    runs = [json.loads(p.read_text()) for p in sorted(folder.glob(pattern))]
    if not runs:
        raise SystemExit(f"{folder}: no {pattern} result files")
    return runs


def _cell(values: list[float], digits: int = 2, unit: str = "") -> str:
    listed = ", ".join(f"{v:.{digits}f}" for v in values)
    return f"**{statistics.median(values):.{digits}f}{unit}** ({listed})"


def _learner_detail(lt: list[dict[str, Any]]) -> list[str]:
    """Rows for what the learner files of 2026-11-28 on also record: the headline ratio is then the median of
    paired repetitions, so the ratio of the medians (the definition before) and the CPU-time ratio are shown
    beside it; nothing for older files."""
    if not all("learner_over_floor_of_medians" in r for r in lt):
        return []
    medians = [r["learner_over_floor_of_medians"] for r in lt]
    cpu = [r["learner_over_floor_cpu"] for r in lt]
    return [
        f"| learner / floor, ratio of the medians (the definition before 2026-11-28) | {_cell(medians)} | |",
        f"| learner / floor by process CPU time (paired) | {_cell(cpu)} | |",
    ]


def report(folder: Path) -> str:
    """The markdown table of one idle session's runs."""
    td, lt = _load(folder, "td-*.json"), _load(folder, "lt-*.json")
    last = [r["steps"][-1]["ratio"] for r in td]
    whole = [r["ratio_all"] for r in td]
    wall = [r["wall_s"] / 60 for r in td]
    peak = [r["peak_rss_gib"] for r in td]
    first = [r["first_step_end_s"] / 60 for r in td]
    trained = [r["eval"]["trained"]["pass_at_1"] for r in td]
    untrained = [r["eval"]["untrained"]["pass_at_1"] for r in td]
    learner = [r["learner_over_floor"] for r in lt]
    loads = [r["load_end"] for r in td] + [r["load_average"] for r in lt]
    dates = sorted(r["date"] for r in td)
    seeds = sorted({r["seed"] for r in td})
    rows = [
        "| check | median (runs) | target |",
        "|---|---|---|",
        f"| default run: last step's rollout / plain `generate` (wall) | {_cell(last)} | ≤ 1.2x |",
        f"| default run: all steps' rollout / plain `generate` (wall) | {_cell(whole)} | |",
        f"| learner update / packed floor (`learner_throughput.py`) | {_cell(learner)} | ≥ 0.9x |",
        *_learner_detail(lt),
        f"| default run: wall time, minutes | {_cell(wall, 1)} | |",
        f"| default run: first step ends, minutes after the command | {_cell(first, 1)} | |",
        f"| default run: peak resident memory, GiB | {_cell(peak)} | 4 GiB |",
        f"| default run: held-out pass@1, untrained | {_cell(untrained, 3)} | |",
        f"| default run: held-out pass@1, trained | {_cell(trained, 3)} | |",
    ]
    meta = json.loads((folder / "meta.json").read_text()) if (folder / "meta.json").exists() else {}
    commit = f" of commit {meta['commit']}" if "commit" in meta else ""
    # meta.json's "order" says which ran first (the learner files carry no date of their own).
    default_runs = f"default runs ending {dates[0]} to {dates[-1]} UTC"
    if meta.get("order") == "learner first":
        when = f"the learner runs first, then {default_runs}"
    else:
        when = f"{default_runs}, then the learner runs"
    head = (
        f"Idle runs{commit} ({when}; "
        f"seed(s) {', '.join(map(str, seeds))}; "
        f"1-minute load average {min(loads):.1f}-{max(loads):.1f} at the end of each run, 2 being this run "
        f"alone on the 2 cores). Raw files: `{folder.as_posix()}/`."
    )
    return head + "\n\n" + "\n".join(rows) + "\n"


def main() -> None:
    """Print the table for the folder given."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    print(report(ap.parse_args().folder), end="")


if __name__ == "__main__":
    main()
