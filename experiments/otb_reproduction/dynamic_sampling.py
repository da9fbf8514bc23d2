"""Dynamic sampling on chain-sum: tokens to reach a held-out success target, counting every generated token.

    python experiments/otb_reproduction/dynamic_sampling.py --seeds 0 1 --configs otb grpo
    python experiments/otb_reproduction/dynamic_sampling.py --report

One run = (estimator, N = 4, seed, dynamic sampling on/off) on the main setting (K = 4, AdamW 3e-4, clip 1,
8 prompts per step) from the reproduction's warm start, with the same rollout and update path as
``train_tiny.run_one``. With dynamic sampling a step keeps drawing prompts (fresh ones, from the run's
prompt stream) until it holds 8 groups whose rewards vary (:func:`agentrl.dynamic_sampling.group_verdict`,
the trainer's own test) or it has drawn ``4 × 8`` groups; the filtered groups' tokens count in the token
axis (they were generated). Held-out success (256 prompts, one episode each) is evaluated every
``--eval-every`` generated tokens; tokens-to-target interpolates between evaluations
(``rl_report.tokens_to_target``), censored at the budget. One JSON per run under ``--work``; ``--report``
prints the table (mean and 95 % bootstrap interval over seeds) and writes ``results/dynamic_sampling.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import settings as S  # noqa: E402
import torch  # noqa: E402
from fast_rollout import Vocab, group_rollout  # noqa: E402
from rl_report import boot_mean, tokens_to_target  # noqa: E402
from tiny_task import build_tokenizer, sample_numbers, tiny_policy  # noqa: E402
from warmstart import held_out, load_or_train, success  # noqa: E402

from agentrl.credit import estimator_config  # noqa: E402
from agentrl.dynamic_sampling import GroupVerdict, group_verdict  # noqa: E402
from agentrl.groups import group_trajectories  # noqa: E402
from agentrl.learner import Learner, LearnerConfig  # noqa: E402
from agentrl.update import policy_update  # noqa: E402

TARGETS = (0.5, 0.6, 0.7)


def run_one(
    est_name: str, n: int, seed: int, ds: bool, args: argparse.Namespace, warm: Any
) -> dict[str, Any]:
    """Train one run; return its record."""
    st = S.MAIN
    tok = build_tokenizer()
    vocab = Vocab.of(tok)
    model = tiny_policy(len(tok), hidden=64, layers=2)
    model.load_state_dict(warm)
    torch.manual_seed(seed)
    learner = Learner(
        model,
        LearnerConfig(
            policy_loss=st.policy_loss,  # type: ignore[arg-type]
            loss_agg=st.loss_agg,  # type: ignore[arg-type]
            lr=st.lr,
            max_grad_norm=st.max_grad_norm,
            chunk_size=4096,
        ),
    )
    est = estimator_config(est_name)
    prompt_rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(10_000 + seed)
    evals = held_out(st.k, args.eval_prompts)
    B, cap = st.prompts_per_step, st.prompts_per_step * args.max_draws
    tokens, next_eval, step = 0, 0, 0
    curve: list[dict[str, float]] = []
    steps: list[dict[str, float]] = []
    t0 = time.perf_counter()
    while tokens < args.budget:
        if tokens >= next_eval:
            curve.append({"tokens": tokens, "step": step, "success": success(model, vocab, evals, seed=seed)})
            next_eval += args.eval_every
        kept, drawn, zero, gen_tok = [], 0, 0, 0
        while len(kept) < B and drawn < (cap if ds else B):
            want = min(B - len(kept), (cap if ds else B) - drawn)
            prompts = [sample_numbers(prompt_rng, st.k, "train") for _ in range(want)]
            trajs = group_rollout(model, vocab, prompts, n, generator=gen, step=step)
            drawn += want
            gen_tok += sum(t.num_model_tokens for t in trajs)
            for g in group_trajectories(trajs, size=n):
                signal = group_verdict(g) is GroupVerdict.SIGNAL
                zero += not signal
                if signal or not ds:
                    kept.append(g)
        tokens += gen_tok
        m: dict[str, float] = {}
        if kept:
            m = policy_update(learner, kept, estimator=est, pad_id=vocab.pad).metrics
        steps.append(
            {
                "tokens": tokens,
                "drawn": drawn,
                "zero_variance": zero,
                "trained": len(kept),
                "grad_norm": m.get("learn/grad_norm", math.nan),
            }
        )
        step += 1
        if kept and not math.isfinite(m["learn/grad_norm"]):
            break
    curve.append({"tokens": tokens, "step": step, "success": success(model, vocab, evals, seed=seed)})
    return {
        "estimator": est_name,
        "group_size": n,
        "seed": seed,
        "dynamic_sampling": ds,
        "max_draws": args.max_draws,
        "budget": args.budget,
        "curve": curve,
        "steps": steps,
        "wall_s": time.perf_counter() - t0,
    }


def report(work: Path) -> dict[str, Any]:
    """Tokens-to-target per (estimator, dynamic sampling) over the seeds on disk."""
    runs = [json.loads(p.read_text()) for p in sorted(work.glob("*.json"))]
    out: dict[str, Any] = {}
    rng = np.random.default_rng(0)
    for key in sorted({(r["estimator"], r["group_size"], r["dynamic_sampling"]) for r in runs}):
        rs = [r for r in runs if (r["estimator"], r["group_size"], r["dynamic_sampling"]) == key]
        name = f"{key[0]}-N{key[1]}-ds{'on' if key[2] else 'off'}"
        zero = [s["zero_variance"] / s["drawn"] for r in rs for s in r["steps"]]
        row: dict[str, Any] = {
            "seeds": [r["seed"] for r in rs],
            "zero_variance_frac_of_drawn": float(np.mean(zero)),
            "capped_steps": int(
                sum(s["trained"] < 8 for r in rs for s in r["steps"] if r["dynamic_sampling"])
            ),
            "final_success": boot_mean(np.array([r["curve"][-1]["success"] for r in rs]), rng),
            "wall_s": [round(r["wall_s"]) for r in rs],
        }
        for t in TARGETS:
            hit = [tokens_to_target(r["curve"], t, r["budget"]) for r in rs]
            row[f"tokens_to_{t}"] = {
                "mean_ci": boot_mean(np.array([h[0] for h in hit]), rng),
                "censored": sum(h[1] for h in hit),
                "per_seed": [round(h[0]) for h in hit],
            }
        out[name] = row
    return out


def main() -> None:
    """Run the sweep (seeds outermost) or print the report."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("runs/otb-reproduction/dynamic-sampling"))
    ap.add_argument("--warm", type=Path, default=Path("runs/otb-reproduction/warm-k4-slip0.1-steps800.pt"))
    ap.add_argument("--seeds", type=int, nargs="*", default=[0])
    ap.add_argument("--configs", nargs="*", default=["otb", "grpo"])
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--budget", type=int, default=250_000)
    ap.add_argument("--eval-every", type=int, default=25_000)
    ap.add_argument("--eval-prompts", type=int, default=256)
    ap.add_argument("--max-draws", type=int, default=4)
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is faster on a busy machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.report:
        rep = report(args.work)
        print(json.dumps(rep, indent=1))
        (HERE / "results" / "dynamic_sampling.json").write_text(json.dumps(rep, indent=1) + "\n")
        return
    w = S.WARM[4]
    warm = load_or_train(args.warm, w.steps, ks=(w.k,), slip=w.slip).state_dict()
    for seed in args.seeds:
        for est in args.configs:
            for ds in (False, True):
                p = args.work / f"{est}-N{args.group_size}-s{seed}-ds{'on' if ds else 'off'}.json"
                if p.exists():
                    continue
                rec = run_one(est, args.group_size, seed, ds, args, warm)
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(json.dumps(rec))
                c = rec["curve"]
                print(
                    f"{p.name}: success {c[0]['success']:.2f} -> {c[-1]['success']:.2f}, "
                    f"{len(rec['steps'])} steps, {rec['wall_s']:.0f}s",
                    flush=True,
                )


if __name__ == "__main__":
    main()
