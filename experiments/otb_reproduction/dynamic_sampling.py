"""Dynamic sampling and the curriculum on chain-sum: tokens to a held-out success target, every generated
token counted.

    python experiments/otb_reproduction/dynamic_sampling.py --seeds 0 1 --configs otb grpo \
        --budget 220000 --eval-every 20000
    python experiments/otb_reproduction/dynamic_sampling.py --report

One run = (estimator, N = 4, seed, dynamic sampling on/off, curriculum none/difficulty) on the main
setting (K = 4, AdamW 3e-4, clip 1, 8 prompts per step) from the reproduction's warm start, with the same
rollout and update path as ``train_tiny.run_one``. With dynamic sampling a step keeps drawing prompts
(fresh ones) until it holds 8 groups whose rewards vary (:func:`agentrl.dynamic_sampling.group_verdict`,
the trainer's own test) or it has drawn ``4 × 8`` groups; the filtered groups' tokens count in the token
axis (they were generated). Held-out success (256 prompts, one episode each) is evaluated every
``--eval-every`` generated tokens; tokens-to-target interpolates between evaluations
(``rl_report.tokens_to_target``), censored at the budget. One JSON per run under ``--work`` (by default
in ``results/``, written as each run ends, so a cut sweep keeps what it finished); ``--report`` prints
the table (mean and 95 % bootstrap interval over seeds) and writes ``results/dynamic_sampling.json``.

Prompts. Without the curriculum a run's prompts come from one random stream seeded by the run's seed (as
they always did here: such runs are the same as before the curriculum was added). With ``--curricula
difficulty`` the trainer's own :class:`~agentrl.trainers.task_sampler.TaskSampler` picks a *task seed* for
every draw (fresh ones from the run's seed, or known ones from its difficulty pools) and the prompt is
:func:`task_numbers` of it, so a task drawn again is the same prompt; every group drawn (filtered ones too)
is observed when its step trains, as in ``trainers/train.py``. The lag is 0 (the synchronous loop).
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
from agentrl.trainers.task_sampler import TaskSampler  # noqa: E402
from agentrl.update import policy_update  # noqa: E402

TARGETS = (0.5, 0.6, 0.7)
CURRICULA = ("none", "difficulty")


def task_numbers(task_seed: int, k: int) -> list[int]:
    """The chain-sum prompt of a task seed: a pure function, so a task drawn again is the same prompt."""
    return sample_numbers(np.random.default_rng(task_seed), k, "train")


def run_name(est: str, n: int, seed: int, ds: bool, curriculum: str) -> str:
    """A run's file stem (runs without the curriculum keep the names they had before it existed)."""
    cur = "" if curriculum == "none" else f"-cur{curriculum}"
    return f"{est}-N{n}-s{seed}-ds{'on' if ds else 'off'}{cur}"


def run_one(
    est_name: str, n: int, seed: int, ds: bool, args: argparse.Namespace, warm: Any, curriculum: str = "none"
) -> dict[str, Any]:
    """Train one run; return its record."""
    if curriculum not in CURRICULA:
        raise ValueError(f"curriculum must be one of {CURRICULA}, got {curriculum!r}")
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
    sampler = None
    if curriculum != "none":
        sampler = TaskSampler(seed, B, cap if ds else B, "difficulty", lag=0)
    known: set[int] = set()  # task seeds drawn by an earlier step
    tokens, next_eval, step = 0, 0, 0
    curve: list[dict[str, float]] = []
    steps: list[dict[str, float]] = []
    t0 = time.perf_counter()
    while tokens < args.budget:
        if tokens >= next_eval:
            curve.append({"tokens": tokens, "step": step, "success": success(model, vocab, evals, seed=seed)})
            next_eval += args.eval_every
        kept, drawn, zero, gen_tok = [], 0, 0, 0
        every, seeds = [], []  # the step's groups (filtered ones too) and task seeds, with the curriculum
        while len(kept) < B and drawn < (cap if ds else B):
            want = min(B - len(kept), (cap if ds else B) - drawn)
            if sampler is None:
                prompts = [sample_numbers(prompt_rng, st.k, "train") for _ in range(want)]
                trajs = group_rollout(model, vocab, prompts, n, generator=gen, step=step)
            else:
                round_seeds = sampler.tasks(step, range(drawn, drawn + want))
                prompts = [task_numbers(t, st.k) for t in round_seeds]
                trajs = group_rollout(
                    model, vocab, prompts, n, generator=gen, step=step, task_seeds=round_seeds
                )
                seeds += round_seeds
            drawn += want
            gen_tok += sum(t.num_model_tokens for t in trajs)
            for g in group_trajectories(trajs, size=n):
                every.append(g)
                signal = group_verdict(g) is GroupVerdict.SIGNAL
                zero += not signal
                if signal or not ds:
                    kept.append(g)
        tokens += gen_tok
        cur: dict[str, Any] = {}
        if sampler is not None:
            sampler.observe(step, every)
            cur = {
                "tasks": seeds,
                "observed": [[g[0].meta.seed, float(np.mean(g.rewards))] for g in every],
                "revisits": sum(t in known for t in seeds),
            }
            known.update(seeds)
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
                **cur,
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
        "curriculum": curriculum,
        "max_draws": args.max_draws,
        "eval_every": args.eval_every,
        "eval_prompts": args.eval_prompts,
        "budget": args.budget,
        "curve": curve,
        "steps": steps,
        "wall_s": time.perf_counter() - t0,
    }


def report(work: Path) -> dict[str, Any]:
    """Tokens-to-target per (estimator, dynamic sampling, curriculum) over the seeds on disk."""
    runs = [json.loads(p.read_text()) for p in sorted(work.glob("*.json"))]
    out: dict[str, Any] = {}
    rng = np.random.default_rng(0)
    config = lambda r: (r["estimator"], r["group_size"], r["dynamic_sampling"], r.get("curriculum", "none"))  # noqa: E731
    for key in sorted({config(r) for r in runs}):
        rs = sorted((r for r in runs if config(r) == key), key=lambda r: r["seed"])
        name = f"{key[0]}-N{key[1]}-ds{'on' if key[2] else 'off'}-cur{key[3]}"
        zero = [s["zero_variance"] / s["drawn"] for r in rs for s in r["steps"]]
        row: dict[str, Any] = {
            "seeds": [r["seed"] for r in rs],
            "budget": sorted({r["budget"] for r in rs}),
            "zero_variance_frac_of_drawn": float(np.mean(zero)),
            "draws_per_step": float(np.mean([s["drawn"] for r in rs for s in r["steps"]])),
            "steps": [len(r["steps"]) for r in rs],
            "capped_steps": int(
                sum(s["trained"] < 8 for r in rs for s in r["steps"] if r["dynamic_sampling"])
            ),
            "final_success": boot_mean(np.array([r["curve"][-1]["success"] for r in rs]), rng),
            "final_success_per_seed": [round(r["curve"][-1]["success"], 3) for r in rs],
            "wall_s": [round(r["wall_s"]) for r in rs],
        }
        if key[3] != "none":
            row["revisit_frac_of_drawn"] = float(
                sum(s["revisits"] for r in rs for s in r["steps"])
                / sum(s["drawn"] for r in rs for s in r["steps"])
            )
        for t in TARGETS:
            hit = [tokens_to_target(r["curve"], t, r["budget"]) for r in rs]
            row[f"tokens_to_{t}"] = {
                "mean_ci": boot_mean(np.array([h[0] for h in hit]), rng),
                "censored": sum(h[1] for h in hit),
                "per_seed": [round(h[0]) for h in hit],
                "censored_per_seed": [bool(h[1]) for h in hit],
            }
        out[name] = row
    return out


def _k(x: float) -> str:
    return f"{x / 1000:.0f}k"


def markdown(rep: dict[str, Any]) -> str:
    """The report as the table of docs/benchmarks/dynamic_sampling.md: mean [95 % interval] (per seed, in
    seed order; ``>220k``: censored, the run never reached the target and counts at the budget)."""
    head = (
        "| estimator, N = 4 | dynamic sampling | curriculum | seeds | groups zero-variance | tasks revisited "
        "| " + " | ".join(f"tokens to {t}" for t in TARGETS) + " | final success |"
    )
    lines = [head, "|" + "---|" * (7 + len(TARGETS))]
    for name, row in rep.items():
        est, _, ds, cur = name.split("-", 3)
        cells = [
            est,
            ds.removeprefix("ds"),
            cur.removeprefix("cur"),
            ",".join(map(str, row["seeds"])),
            f"{100 * row['zero_variance_frac_of_drawn']:.0f} %",
            f"{100 * row['revisit_frac_of_drawn']:.0f} %" if "revisit_frac_of_drawn" in row else "-",
        ]
        for t in TARGETS:
            h = row[f"tokens_to_{t}"]
            m, lo, hi = h["mean_ci"]
            per = ", ".join(
                f">{_k(v)}" if c else _k(v)
                for v, c in zip(h["per_seed"], h["censored_per_seed"], strict=True)
            )
            cens = f", {h['censored']} censored" if h["censored"] else ""
            cells.append(f"{_k(m)} [{_k(lo)}, {_k(hi)}] ({per}{cens})")
        m, lo, hi = row["final_success"]
        cells.append(
            f"{m:.2f} [{lo:.2f}, {hi:.2f}] ({', '.join(f'{x:.2f}' for x in row['final_success_per_seed'])})"
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_report(work: Path) -> dict[str, Any]:
    """:func:`report`, written to ``results/dynamic_sampling.json``."""
    rep = report(work)
    (HERE / "results" / "dynamic_sampling.json").write_text(json.dumps(rep, indent=1) + "\n")
    return rep


def main() -> None:
    """Run the sweep (seeds outermost, then estimator, dynamic sampling, curriculum) or print the report."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=HERE / "results" / "dynamic_sampling_runs")
    ap.add_argument("--warm", type=Path, default=Path("runs/otb-reproduction/warm-k4-slip0.1-steps800.pt"))
    ap.add_argument("--seeds", type=int, nargs="*", default=[0])
    ap.add_argument("--configs", nargs="*", default=["otb", "grpo"])
    ap.add_argument("--dynamic", nargs="*", default=["off", "on"], choices=["off", "on"])
    ap.add_argument("--curricula", nargs="*", default=["none", "difficulty"], choices=CURRICULA)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--budget", type=int, default=220_000)
    ap.add_argument("--eval-every", type=int, default=20_000)
    ap.add_argument("--eval-prompts", type=int, default=256)
    ap.add_argument("--max-draws", type=int, default=4)
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is faster on a busy machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.report:
        print(markdown(write_report(args.work)))
        return
    w = S.WARM[4]
    warm = load_or_train(args.warm, w.steps, ks=(w.k,), slip=w.slip).state_dict()
    for seed in args.seeds:
        for est in args.configs:
            for ds in (d == "on" for d in args.dynamic):
                for cur in args.curricula:
                    p = args.work / f"{run_name(est, args.group_size, seed, ds, cur)}.json"
                    if p.exists():
                        continue
                    rec = run_one(est, args.group_size, seed, ds, args, warm, cur)
                    p.parent.mkdir(parents=True, exist_ok=True)
                    tmp = p.with_suffix(".tmp")
                    tmp.write_text(json.dumps(rec))
                    tmp.replace(p)
                    write_report(args.work)
                    c = rec["curve"]
                    print(
                        f"{p.name}: success {c[0]['success']:.2f} -> {c[-1]['success']:.2f}, "
                        f"{len(rec['steps'])} steps, {rec['wall_s']:.0f}s",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
