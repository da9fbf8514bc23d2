r"""Do updates survive? Two learner steps at the default learning rate with bf16 master weights against fp32
master weights under bf16 compute, on Qwen2.5-0.5B's shape (random weights, initializer range 0.02 like real
ones; nothing is downloaded).

For each configuration it reports the fraction of the master weights that two :meth:`Learner.step` calls
changed (compared directly, before and after), the learner's own ``unchanged_frac`` metric per step, the
relative update and the time per step. It runs on any device; on CPU use ``--shape tiny``::

    python benchmarks/precision_cuda.py --device cuda --json out.json
    python benchmarks/precision_cuda.py --device cpu --shape tiny
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from agentrl.batch import TokenBatch
from agentrl.learner import Learner, LearnerConfig

SHAPES = {
    # Qwen2.5-0.5B: 494 M parameters.
    "qwen0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=4096,
    ),
}


def build(shape: str, device: str, dtype: torch.dtype) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        **SHAPES[shape], tie_word_embeddings=True, initializer_range=0.02, attn_implementation="sdpa"
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).to(device=device, dtype=dtype)


def batch(vocab: int, rows: int, length: int, device: str) -> tuple[TokenBatch, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, vocab, (rows, length), generator=g)
    attn = torch.ones(rows, length, dtype=torch.long)
    mask = torch.ones(rows, length)
    mask[:, : length // 4] = 0  # a prompt
    b = TokenBatch(
        ids,
        attn,
        mask,
        torch.zeros(rows, length),
        torch.zeros(rows, length),
        tuple(str(i // 4) for i in range(rows)),
        torch.full((rows,), length),
    )
    adv = torch.where(torch.arange(rows)[:, None] % 2 == 0, 1.0, -1.0) * mask
    return b.to(torch.device(device)), adv.to(device)


def run(
    shape: str, device: str, master: torch.dtype, autocast: bool, rows: int, length: int
) -> dict[str, Any]:
    model = build(shape, device, master)
    b, adv = batch(model.config.vocab_size, rows, length, device)
    learner = Learner(
        model,
        LearnerConfig(
            lr=3e-6,
            bf16_autocast=autocast,
            micro_batch_tokens=rows * length,
            chunk_size=1024,
            policy_loss="reinforce",
        ),
    )
    # Each parameter once: a tied embedding is one tensor under two state-dict names (counting both
    # overstated Qwen2.5-0.5B's 494 M parameters as 630 M in the first recorded JSON).
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    steps = []
    for _ in range(2):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        s = learner.step(b, adv)
        if device == "cuda":
            torch.cuda.synchronize()
        steps.append(
            {
                "unchanged_frac": s.unchanged_frac,
                "update_rel_norm": s.update_rel_norm,
                "step_s": time.perf_counter() - t,
                "loss": s.loss,
            }
        )
    after = dict(model.named_parameters())
    changed = sum(int((after[k] != v).sum()) for k, v in before.items())
    total = sum(v.numel() for v in before.values())
    name = "bf16 master (pure bf16)" if master == torch.bfloat16 else "fp32 master + bf16 compute"
    del model, learner, before
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"config": name, "params": total, "changed_frac": changed / total, "steps": steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shape", default="qwen0.5b", choices=sorted(SHAPES))
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    results = [
        run(a.shape, a.device, torch.bfloat16, False, a.rows, a.length),
        run(a.shape, a.device, torch.float32, True, a.rows, a.length),
    ]
    print(
        f"| configuration ({a.shape}, {a.device}) | master weights changed by 2 steps | learner "
        "unchanged_frac per step | relative update | s/step |"
    )
    print("|---|---:|---|---:|---:|")
    for r in results:
        st = r["steps"]
        per_step = ", ".join(f"{x['unchanged_frac']:.4f}" for x in st)
        print(
            f"| {r['config']} | {100 * r['changed_frac']:.4f} % | "
            f"{per_step} | {st[-1]['update_rel_norm']:.2e} | "
            f"{st[-1]['step_s']:.2f} |"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "device": a.device,
                    "gpu": torch.cuda.get_device_name() if a.device == "cuda" else None,
                    "results": results,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
