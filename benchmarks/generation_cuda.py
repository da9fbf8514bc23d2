r"""Generation on a GPU: the engine against plain ``model.generate``, same model, prompts and token counts.

SmolLM2-135M's architecture in bf16 on CUDA (the real weights when the converted folder has them, else the
same config with random weights: the cost of a decode step does not depend on the weights' values, and with
no stop token both sides sample exactly ``--new`` tokens per row). Rows come in groups of 4 that share their
prompt, the default run's shape (a shared system prefix, a per-group question). For each batch size:

* ``generate``: ``model.generate`` on the padded batch (sampling, temperature 1, ``min_new_tokens``).
* ``engine``: :class:`agentrl.policies.engine.GenerationEngine` (continuous batching, prefix sharing, KV
  slots), each row with its own seed.
* ``engine-cudnn``: the same with cuDNN's attention allowed (what the engine did before
  :meth:`~agentrl.policies.kvcache.SlotCache.attention` ruled it out).

Each variant runs once to warm up, then ``--repeats`` times; the best wall time counts. Writes JSON
(``--json``) and a markdown table (``--out``, default docs/benchmarks/generation-cuda.md)::

    python benchmarks/generation_cuda.py --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import time
from pathlib import Path
from typing import Any

import torch
from floor import sample_exactly

ROOT = Path(__file__).resolve().parents[1]
NEVER = 49151  # the stop id given to the engine; a random model practically never samples it first


def load(dtype: torch.dtype) -> tuple[Any, str]:
    from transformers import AutoConfig, AutoModelForCausalLM

    from agentrl.models import smollm2_dir

    folder = smollm2_dir()  # a folder holding only the config and tokenizer also works (random weights)
    if (folder / "model.safetensors").is_file():
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
        source = "SmolLM2-135M-Instruct weights"
    else:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(folder)), dtype=dtype)
        source = "SmolLM2-135M-Instruct config, random weights"
    return model.to("cuda").eval(), source


def prompts(rows: int) -> list[list[int]]:
    system = list(range(1000, 1150))  # 150 shared tokens
    return [[*system, *range(2000 + 50 * (r // 4), 2040 + 50 * (r // 4))] for r in range(rows)]


def timed(fn: Any) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def run_generate(model: Any, ps: list[list[int]], new: int) -> None:
    width = max(map(len, ps))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in ps], device="cuda")
    attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ps], device="cuda")
    sample_exactly(model, ids, attn, new, 0)


def run_engine(model: Any, ps: list[list[int]], new: int, cudnn: bool = False) -> None:
    from agentrl.policies.engine import GenerationEngine
    from agentrl.protocols import Sampling

    eng = GenerationEngine(model, stop_token_ids=[NEVER], max_batch_size=len(ps), seed=0)
    if cudnn:
        eng._slots.attention = contextlib.nullcontext  # type: ignore[method-assign]
    gens = eng.generate_sync(ps, [Sampling(max_new_tokens=new, seed=i) for i in range(len(ps))])
    assert sum(len(g.token_ids) for g in gens) >= 0.99 * new * len(ps)


def run_engine_cudnn(model: Any, ps: list[list[int]], new: int) -> None:
    run_engine(model, ps, new, cudnn=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--new", type=int, default=256, help="tokens sampled per row")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "generation-cuda.md")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA")
    model, source = load(torch.bfloat16)
    results: list[dict[str, Any]] = []
    for rows in args.rows:
        ps = prompts(rows)
        row: dict[str, Any] = {"rows": rows, "new_tokens": args.new}
        for name, fn in (
            ("generate", run_generate),
            ("engine", run_engine),
            ("engine-cudnn", run_engine_cudnn),
        ):
            fn(model, ps, 8)  # warm-up (kernels, allocator)
            torch.cuda.reset_peak_memory_stats()
            best = min(timed(lambda fn=fn, ps=ps: fn(model, ps, args.new)) for _ in range(args.repeats))
            row[name] = {
                "wall_s": best,
                "tokens_per_s": rows * args.new / best,
                "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
            }
        row["engine_over_generate"] = row["engine"]["wall_s"] / row["generate"]["wall_s"]
        row["engine_cudnn_over_generate"] = row["engine-cudnn"]["wall_s"] / row["generate"]["wall_s"]
        results.append(row)
        print(json.dumps(row), flush=True)
    meta = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "python": platform.python_version(),
        "model": source,
        "dtype": "bfloat16",
    }
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    lines = [
        "# Generation on a GPU: engine vs `model.generate`",
        "",
        "Written by `benchmarks/generation_cuda.py`. "
        + ", ".join(f"{k} {v}" for k, v in meta.items())
        + f". Groups of 4 rows share a prompt (150 shared + 40 own tokens); {args.new} tokens per row, no "
        f"stop; best of {args.repeats} after a warm-up.",
        "",
        "| rows | `generate` tok/s | engine tok/s | engine / `generate` time | engine with cuDNN attention / "
        "`generate` | peak GiB (generate, engine) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        g, e = r["generate"], r["engine"]
        lines.append(
            f"| {r['rows']} | {g['tokens_per_s']:,.0f} | {e['tokens_per_s']:,.0f} | "
            f"{r['engine_over_generate']:.2f}x | {r['engine_cudnn_over_generate']:.2f}x | "
            f"{g['peak_gib']:.2f}, {e['peak_gib']:.2f} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
