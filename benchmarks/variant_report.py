"""Numbers the docs quote about the default-run variants, derived from the recorded runs (issue 46).

Reads docs/benchmarks/default-run-variants.json (LoRA, dynamic sampling and the re-measured default runs of
2026-11-27) and prints what docs/benchmarks.md and docs/benchmarks/dynamic_sampling.md state about them, so
the text can be checked against the data instead of copied by hand:

* the extra sampled tokens of each dynamic-sampling run against the default run of the same seed;
* per step, the groups drawn and the zero-variance groups;
* each run's learner seconds per step (median and range) with its date and load, so that learner times are
  compared only between runs of the same code and a similar load.

    .venv/bin/python benchmarks/variant_report.py
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

RUNS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "default-run-variants.json"


def tokens(run: dict[str, Any]) -> int:
    """Model tokens sampled over the run's steps."""
    return sum(int(s["sampled_tokens"]) for s in run["steps"])


def dynamic_sampling_cost(runs: dict[str, dict[str, Any]]) -> list[str]:
    """Extra tokens of each ``dyn-S`` run over the default run of seed S with the same per-step tasks (the
    latest such run: every default run of a seed sampled the same tokens)."""
    lines = []
    for key, run in sorted(runs.items()):
        if not key.startswith("dyn-"):
            continue
        seed = run["seed"]
        base = [r for k, r in runs.items() if k.startswith("base-") and r["seed"] == seed]
        if not base:
            continue
        b = tokens(base[-1])
        d = tokens(run)
        lines.append(f"seed {seed}: {d} tokens with dynamic sampling, {b} without: {d / b - 1:+.1%}")
    return lines


def zero_variance(runs: dict[str, dict[str, Any]]) -> list[str]:
    """Per run with group counts: groups drawn and zero-variance groups per step."""
    lines = []
    for key, run in runs.items():
        steps = run["steps"]
        if steps[0].get("groups_drawn") is None:
            continue
        drawn = [int(s["groups_drawn"]) for s in steps]
        zero = [int(s["groups_zero_variance"]) for s in steps]
        lines.append(
            f"{key} (seed {run['seed']}): drawn {drawn}, zero variance {zero} ({sum(zero)} of {sum(drawn)})"
        )
    return lines


def learn_times(runs: dict[str, dict[str, Any]]) -> list[str]:
    """Each run's learner seconds per step, with its date, load at the end and settings."""
    lines = []
    for key, run in sorted(runs.items(), key=lambda kv: kv[1]["date"]):
        learn = [float(s["learn_s"]) for s in run["steps"]]
        args = " ".join(run.get("extra_args") or []) or "defaults"
        lines.append(
            f"{run['date']} {key:10s} load {run['load_end']:4.1f}: "
            f"learn median {statistics.median(learn):5.1f} s, "
            f"range {min(learn):.0f}-{max(learn):.0f} s ({args})"
        )
    return lines


def main() -> None:
    runs: dict[str, dict[str, Any]] = json.loads(RUNS.read_text())
    for title, lines in (
        ("Dynamic sampling: extra sampled tokens", dynamic_sampling_cost(runs)),
        ("Groups drawn and zero-variance groups per step", zero_variance(runs)),
        ("Learner seconds per step (compare only same code, similar load)", learn_times(runs)),
    ):
        print(f"## {title}")
        print("\n".join(lines))
        print()


if __name__ == "__main__":
    main()
