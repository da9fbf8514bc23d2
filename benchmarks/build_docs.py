"""Rebuild docs/benchmarks.md from the sections the benchmark scripts write to docs/benchmarks/*.md."""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"
SECTIONS = [
    ("train", "`benchmarks/train_default.py`", "the README's main job: time to the end of step 0, tool use"),
    ("rollout", "`benchmarks/rollout.py`", "framework overhead per turn (target ≤ 1 ms, ≥ 1,000 turns/s)"),
    ("sandbox", "`benchmarks/sandbox.py`", "stateful vs fresh process, one-shot throughput, 64 sessions"),
    ("credit", "`benchmarks/credit.py`", "OTB vectorised vs loop; chunked log-prob + Σπ² memory and speed"),
    ("gateway", "`benchmarks/gateway.py`", "recording gateway vs the bare policy call (target ≤ 2 ms p50)"),
    ("checkpoints", "`benchmarks/checkpoints.py`", "checkpoint disk use of the default run, float16 cost"),
]


def main() -> None:
    out = [
        "# Benchmarks",
        "",
        "Each section below is written by its script (to `docs/benchmarks/<name>.md`); `python",
        "benchmarks/build_docs.py` rebuilds this page. Every ratio is measured side by side in one run",
        "on the 2-core CPU machines this project targets. The machines are shared and noisy, so each",
        "section states its load average. There are no GPU numbers: no GPU was available to these runs.",
        "",
        "| section | script | what it measures |",
        "|---|---|---|",
    ]
    out += [f"| {name} | {script} | {what} |" for name, script, what in SECTIONS]
    out.append("")
    for name, _, _ in SECTIONS:
        path = DOCS / "benchmarks" / f"{name}.md"
        if not path.exists():
            out += [f"## {name}", "", f"(not run yet: `{path.name}` is missing)", ""]
            continue
        for line in path.read_text().strip().splitlines():
            out.append("#" + line if line.startswith("#") else line)  # one level deeper
        out.append("")
    (DOCS / "benchmarks.md").write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
