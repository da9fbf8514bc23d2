r"""The learner on Qwen2.5-0.5B's shape with and without LoRA: peak memory and step time.

fp32 master weights under bf16 autocast (the default on CUDA), one micro-batch of ``rows × length`` tokens,
AdamW; full fine-tuning against ``--lora.rank`` adapters on every attention and MLP linear (peft). Peak memory
is ``torch.cuda.max_memory_allocated`` over three steps (the first builds the optimizer state); the time is
the median of steps 2-3. Random weights, nothing downloaded. On CPU use ``--shape tiny``::

    python benchmarks/lora_cuda.py --device cuda --json out.json
    python benchmarks/lora_cuda.py --device cpu --shape tiny
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from precision_cuda import SHAPES, batch, build

from agentrl.learner import Learner, LearnerConfig
from agentrl.lora import LoraConfig, apply_lora


def run(shape: str, device: str, rank: int, rows: int, length: int) -> dict[str, Any]:
    model = build(shape, device, torch.float32)
    total = sum(p.numel() for p in model.parameters())
    if rank:
        apply_lora(model, LoraConfig(rank=rank), name=shape, seed=0)
    b, adv = batch(model.config.vocab_size, rows, length, device)
    cfg = LearnerConfig(
        lr=3e-5 if rank else 3e-6,
        bf16_autocast=device == "cuda",
        micro_batch_tokens=rows * length,
        chunk_size=1024,
        policy_loss="reinforce",
    )
    learner = Learner(model, cfg)
    trainable = sum(p.numel() for g in learner.optimizer.param_groups for p in g["params"])
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(3):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        learner.step(b, adv)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    del model, learner
    if device == "cuda":
        torch.cuda.empty_cache()
    step_s = statistics.median(times[1:])
    return {
        "config": f"LoRA rank {rank}" if rank else "full fine-tuning",
        "params": total,
        "trainable": trainable,
        "peak_gib": peak,
        "step_s": step_s,
        "tokens_per_s": rows * length / step_s,
        "first_step_s": times[0],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shape", default="qwen0.5b", choices=sorted(SHAPES))
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    results = [run(a.shape, a.device, r, a.rows, a.length) for r in (0, a.rank)]
    print(
        f"| learner ({a.shape}, {a.device}, {a.rows}x{a.length} tokens) | trainable | peak | s/step | tok/s |"
    )
    print("|---|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['config']} | {r['trainable'] / 1e6:.2f} M of {r['params'] / 1e6:.0f} M | "
            f"{r['peak_gib']:.2f} GiB | {r['step_s']:.3f} | {r['tokens_per_s']:.0f} |"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
