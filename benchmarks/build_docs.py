"""Rebuild docs/benchmarks.md from the sections the benchmark scripts write to docs/benchmarks/*.md."""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"
SECTIONS = [
    (
        "train",
        "`benchmarks/train_default.py`",
        "the default run: rollout vs the `generate` floor, peak RSS, held-out pass@1",
    ),
    ("rollout", "`benchmarks/rollout.py`", "framework overhead per turn (target ≤ 1 ms, ≥ 1,000 turns/s)"),
    ("sandbox", "`benchmarks/sandbox.py`", "stateful vs fresh process, one-shot throughput, 64 sessions"),
    ("credit", "`benchmarks/credit.py`", "OTB vectorised vs loop; chunked log-prob + Σπ² memory and speed"),
    (
        "generation",
        "`benchmarks/generation.py`",
        "generation engine vs static batches vs `model.generate` (the floor), vLLM CPU; reproducibility",
    ),
    (
        "precision-cuda",
        "`benchmarks/precision_cuda.py`",
        "bf16 vs fp32 master weights: how much of two AdamW steps at lr 3e-6 survives (one H100)",
    ),
    (
        "generation-cuda",
        "`benchmarks/generation_cuda.py`",
        "the engine vs `model.generate` on one H100 in bf16, with and without cuDNN attention",
    ),
    ("memory", "`benchmarks/memory_profile.py`", "the default train step's resident memory, per phase"),
    ("memory_budget", "(by hand, from the two above)", "where the 11.8 / 16.5 GiB went; whole-run peaks"),
    ("gateway", "`benchmarks/gateway.py`", "recording gateway vs the bare policy call (target ≤ 2 ms p50)"),
    (
        "gateway_apis",
        "`benchmarks/gateway.py --apis`",
        "chat completions vs Responses vs Anthropic Messages, per turn (target ≤ 1.2x)",
    ),
    (
        "gateway_load",
        "`benchmarks/gateway.py --load`",
        "256 concurrent sessions, disconnects and malformed bodies: turn p50/p99, sessions/s, RSS, none lost",
    ),
    ("scale", "`benchmarks/scale.py`", "episodes/s with 1, 2, 4 Ray rollout workers (target ≥ 1.8x at 2)"),
    (
        "chaos",
        "`benchmarks/chaos.py`",
        "`agentrl train --ray` on a 2-node cluster under a fault every 30 s: "
        "faults survived, lost, duplicated",
    ),
    (
        "async",
        "`benchmarks/async_overlap.py`",
        "async training: step time at S = 0, 1, 2 (target S = 1 ≥ 1.6x)",
    ),
    (
        "async_smollm2",
        "`benchmarks/async_smollm2.py`",
        "async training for real: SmolLM2, S = 1 vs S = 0, reward / grad-norm / KL curves",
    ),
    ("checkpoints", "`benchmarks/checkpoints.py`", "checkpoint disk use of the default run, float16 cost"),
    (
        "learner",
        "`benchmarks/learner_throughput.py`",
        "the learner's update (packed) vs plain HF training on the same tokens: tokens/s, padding, memory",
    ),
    (
        "history",
        "`benchmarks/quick.py`",
        "the ratios that matter (rollout, learner, OTB, gateway, sandbox) per commit, and their plot",
    ),
    (
        "bfcl",
        "`benchmarks/bfcl_multi_turn.py`",
        "BFCL multi-turn accuracy per category (held-out split); episodes/s vs math-tir-arith-v0",
    ),
    (
        "env_families",
        "`benchmarks/env_families.py`, `agentrl train`",
        "reasoning-gym, textarena, BFCL: episode throughput vs math-tir-arith-v0; a reasoning-gym train run",
    ),
]


def main() -> None:
    out = [
        "# Benchmarks",
        "",
        "Each section below is written by its script (to `docs/benchmarks/<name>.md`); `python",
        "benchmarks/build_docs.py` rebuilds this page. Every ratio is measured side by side in one run.",
        "All sections but one ran on the 2-core CPU machines this project targets; they are shared and",
        "noisy, so each states its load average. The exception, generation-cuda, ran on a lent H100",
        "(docs/gpu.md).",
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
