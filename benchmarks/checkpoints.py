"""Checkpoint disk use of the default run (SmolLM2-135M on CPU, float32) and what compaction costs replay.

One run, side by side: the trainer's model and optimizer (``Learner`` with the default ``agentrl train``
settings) after one real AdamW step, saved as the trainer saves (``save_checkpoint``). Step 1 is written
whole, then step 2 is written and step 1 is compacted (``--older-checkpoints exact``, the default; and
``half`` into a second run directory). Reported: each file's size, the default run's total (8 steps,
``--keep-checkpoints 3``: two compacted checkpoints and the newest whole one) before and after, the time
compaction takes, and the precision replay loses with float16 weights: |Δ log-prob| and |Δ Σπ²| of the
float16 copy against the float32 weights on real chat tokens (the learner's own scoring pass).

Usage: python benchmarks/checkpoints.py [--out docs/benchmarks/checkpoints.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
MB = 1e6


def size(path: Path) -> int:
    return (
        path.stat().st_size
        if path.is_file()
        else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "checkpoints.md"))
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    from agentrl.chat import ChatRenderer
    from agentrl.checkpoint import CheckpointState, describe_checkpoint, save_checkpoint
    from agentrl.learner import Learner
    from agentrl.learner.forward import forward_logprobs
    from agentrl.models import load_model, resolve_model
    from agentrl.run import RunDir
    from agentrl.trainers.train_setup import TrainConfig, model_spec
    from agentrl.types import Message

    hf_logging.disable_progress_bar()
    cfg = TrainConfig(device="cpu")
    torch.manual_seed(0)
    loaded = resolve_model(model_spec(cfg))
    model, tok = loaded.model, loaded.tokenizer
    learner = Learner(model, cfg.learner)
    renderer = ChatRenderer(tok)
    chat = [
        Message("system", "You are a helpful assistant. Use python to compute when it helps."),
        Message("user", "What is 37 * 91 - 12? Think step by step, then answer with 'Answer: <number>'."),
        Message("assistant", "Let me compute it: 37 * 91 = 3367, and 3367 - 12 = 3355. Answer: 3355"),
    ]
    ids = torch.tensor([renderer.encode(renderer.render_text(chat, add_generation_prompt=False))])
    # One real AdamW step, so the optimizer holds its two moments per weight as after any training step.
    model.train()
    model(ids, labels=ids).loss.backward()
    learner.optimizer.step()
    learner.optimizer.zero_grad()
    model.eval()
    notes: list[str] = []
    prec: dict[str, tuple[float, float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for older in ("exact", "half"):
            run = RunDir(Path(tmp) / older)
            for step in (1, 2):
                t0 = time.perf_counter()
                save_checkpoint(
                    run,
                    model=model,
                    optimizer=learner.optimizer,
                    tokenizer=tok,
                    state=CheckpointState(step, step, {}),
                    keep=3,
                    older=older,
                )
                took = time.perf_counter() - t0
            full, compact = run.checkpoint(2), run.checkpoint(1)
            # Precision: the scoring pass with the trained float32 weights vs this run's copy of them.
            with torch.no_grad():
                mask = torch.ones_like(ids, dtype=torch.float32)
                ref = forward_logprobs(model, ids, mask)
                got = forward_logprobs(load_model(compact.model_dir, dtype="float32"), ids, mask)
            assert ref.sum_pi_squared_B_T is not None and got.sum_pi_squared_B_T is not None
            dlp = (ref.logprobs_B_T - got.logprobs_B_T)[:, 1:].abs()
            dsp = (ref.sum_pi_squared_B_T - got.sum_pi_squared_B_T)[:, 1:].abs()
            prec[older] = (float(dlp.max()), float(dlp.mean()), float(dsp.max()))
            if older == "half":
                whole = {
                    "weights (model.safetensors, float32)": size(full.model_dir / "model.safetensors"),
                    "optimizer.pt (AdamW moments)": size(full.path / "optimizer.pt"),
                    "tokenizer + config files": size(full.model_dir)
                    - size(full.model_dir / "model.safetensors"),
                    "rng.pt + state.json": size(full.path / "rng.pt") + size(full.state_path),
                }
                half_size, full_size = size(compact.path), size(full.path)
                notes.append(f"save of step 2 with compaction of step 1: {took:.1f} s")
                assert describe_checkpoint(compact).weights_dtype == "float16"
            else:
                exact_size = size(compact.path)
    import sys

    print(whole, half_size, full_size, exact_size, prec, notes, file=sys.stderr)
    default_before = 3 * full_size
    default_after = 2 * half_size + full_size
    default_exact = 2 * exact_size + full_size
    lines = [
        "## Checkpoints",
        "",
        f"`python benchmarks/checkpoints.py` on {platform.machine()} CPU, torch {torch.__version__}, "
        f"load average {os.getloadavg()[0]:.1f}. SmolLM2-135M-Instruct as `agentrl train` loads it on CPU "
        "(float32), AdamW state after one real step, saved with `save_checkpoint` as the trainer does.",
        "",
        "| a whole checkpoint (the newest) | MB |",
        "|---|---:|",
        *[f"| {k} | {v / MB:,.0f} |" for k, v in whole.items()],
        f"| **total** | **{full_size / MB:,.0f}** |",
        "",
        "| what the default run keeps (8 steps, `--keep-checkpoints 3`) | MB on disk |",
        "|---|---:|",
        f"| before: three whole checkpoints | {default_before / MB:,.0f} |",
        f"| `--older-checkpoints exact` (default): two float32 copies, no optimizer ({exact_size / MB:,.0f} "
        f"MB each) + the newest | {default_exact / MB:,.0f} |",
        f"| `--older-checkpoints half`: two float16 copies ({half_size / MB:,.0f} MB each) "
        f"+ the newest | {default_after / MB:,.0f} |",
        f"| `--older-checkpoints whole`: as before | {default_before / MB:,.0f} |",
        "",
        f"Disk use falls by {100 * (1 - default_exact / default_before):.0f}% with the default (exact), "
        f"{100 * (1 - default_after / default_before):.0f}% with half. " + "; ".join(notes) + ".",
        "",
        f"Precision replay loses (the scoring pass over {ids.shape[1] - 1} chat tokens, the trained "
        "float32 weights vs the older checkpoint's copy of them):",
        "",
        "| older checkpoint | max abs Δ log-prob | mean abs Δ log-prob | max abs Δ Σπ² |",
        "|---|---:|---:|---:|",
        *[f"| `{k}` | {v[0]:.2g} | {v[1]:.2g} | {v[2]:.2g} |" for k, v in prec.items()],
        "",
    ]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
