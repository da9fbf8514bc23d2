"""Reproduce the OTB paper's two claims at CPU scale: every number and figure of docs/reproduction.md.

    python experiments/otb_reproduction/run.py --quick              # whole pipeline, small, ~3 minutes
    python experiments/otb_reproduction/run.py sweep main           # full RL sweep of one setting
    python experiments/otb_reproduction/run.py variance-tiny        # exact variance, tiny policy
    flock /tmp/agentrl-heavy.lock python experiments/otb_reproduction/run.py smollm2-pools --prompts 0 1
    python experiments/otb_reproduction/run.py variance-smollm2      # analysis of the saved SmolLM2 pools
    python experiments/otb_reproduction/run.py report               # tables (JSON) and figures (PNG)
    python experiments/otb_reproduction/run.py pool                 # committed seeds + new runs' seeds

Intermediate results go under ``--work`` (default ``runs/otb-reproduction``, not committed): warm starts,
one JSON per RL run, variance pools. ``report`` writes the small summary JSON files and PNGs that are
committed (``experiments/otb_reproduction/results`` and ``docs/reproduction``). Fixed seeds throughout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import rl_report  # noqa: E402
import settings as S  # noqa: E402
import torch  # noqa: E402
import train_smollm2  # noqa: E402
import var_report  # noqa: E402
import variance  # noqa: E402
from pools import load_all, smollm2_pools, tiny_pools  # noqa: E402
from train_tiny import Setting, sweep  # noqa: E402
from warmstart import load_or_train  # noqa: E402

ROOT = HERE.parents[1]


def warm_state(work: Path, k: int, quick: bool) -> dict[str, torch.Tensor]:
    """The cached warm start for K numbers (trained on first use)."""
    w = (S.QUICK_WARM if quick else S.WARM)[k]
    path = work / f"warm-k{k}-slip{w.slip}-steps{w.steps}.pt"
    model = load_or_train(path, w.steps, ks=(w.k,), slip=w.slip)
    return model.state_dict()


def budget_fn(setting: Setting, quick: bool) -> Callable[[int], int]:
    """Group size → the token budget of its runs in ``setting``."""
    return lambda n: setting.token_budget if quick else int(setting.token_budget * S.BUDGET_SCALE[n])


def cmd_sweep(
    work: Path, name: str, quick: bool, seeds: list[int] | None, only: list[str] | None = None
) -> list[dict]:
    """Run (or load) every run of one setting's sweep (``only``: just these configurations, ``otb-N4``...)."""
    setting, configs = {
        "main": (S.MAIN, S.MAIN_CONFIGS),
        "stress": (S.STRESS, S.STRESS_CONFIGS),
        "stress-lt": (S.STRESS_LT, S.STRESS_CONFIGS),
        "main-lt": (S.MAIN_LT, S.STRESS_CONFIGS),
    }[name]
    if quick:
        setting, configs = S.quick(setting), S.QUICK_CONFIGS
    if only:
        unknown = sorted(set(only) - {f"{e}-N{n}" for e, n in configs})
        if unknown:
            raise SystemExit(f"--configs: {unknown} are not configurations of the {name!r} sweep")
        configs = [(e, n) for e, n in configs if f"{e}-N{n}" in only]
    use_seeds = seeds if seeds is not None else (S.QUICK_SEEDS if quick else S.SEEDS)
    warm = warm_state(work, setting.k, quick)
    recs = []
    for seed in use_seeds:  # seeds outermost: an interrupted sweep stays balanced across configurations
        for est, n in configs:
            st = setting
            if not quick:
                budget = budget_fn(setting, quick)(n)
                st = replace(setting, token_budget=budget, milestones=budget // S.EVAL_EVERY)
            recs += sweep(work / "rl", st, [(est, n)], [seed], warm)
    return recs


SMOL_JSONL = "smollm2_pool.jsonl"
VAR_NAMES = (
    "none",
    "grpo",
    "rloo",
    "opo",
    "otb",
    "otb_exact",
    "otb_exact_prefix",
    "eob",
    "otb_loo",
    "grpo_std",
)
PLOT_NAMES = ("none", "grpo", "rloo", "opo", "otb", "otb_exact", "eob", "otb_loo")


def _load(path: Path) -> dict[str, Any]:
    """A committed summary, or {} where there is none yet."""
    return dict(json.loads(path.read_text())) if path.exists() else {}


def _save(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, default=float) + "\n")


def _variance_set(work: Path, name: str, pools: list, quick: bool, group_sizes: tuple[int, ...]) -> dict:
    """Analyse one pool set (or load its cached summary) and cache the proxy scatter points."""
    out = work / "variance" / f"{name}.json"
    if out.exists():
        summ = json.loads(out.read_text())
        if "trajectory level" not in summ["proxy"]:  # summaries written before the tracking was extended
            summ["proxy"] = variance.proxy_tracking(pools, boot=20 if quick else 200)["strata"]
            _save(out, summ)
        return summ
    res = variance.analyze(
        pools,
        group_sizes=group_sizes,
        draws=S.QUICK_DRAWS if quick else S.VAR_DRAWS,
        boot=S.QUICK_BOOT if quick else S.VAR_BOOT,
        boot_draws=S.VAR_BOOT_DRAWS,
        names=VAR_NAMES,
    )
    summ = variance.summarize(res)
    prox = variance.proxy_tracking(pools, boot=20 if quick else 200)
    summ["proxy"] = prox["strata"]
    summ["pools"] = {
        "prompts": len(pools),
        "trajectories": int(sum(len(p.rewards) for p in pools)),
        "model_tokens": int(sum(len(p.logprobs) for p in pools)),
        "mean_reward": float(np.mean([p.rewards.mean() for p in pools])),
        "tool_use_frac": float(np.mean(np.concatenate([p.tool_calls > 0 for p in pools]))),
        "mean_model_tokens": float(np.mean(np.concatenate([p.lengths for p in pools]))),
    }
    _save(out, summ)
    np.save(work / "variance" / f"{name}-proxy-points.npy", prox["points"])
    row = summ["table"].get("4", summ["table"][str(group_sizes[0])])
    print(
        f"[variance] {name}: OTB/GRPO total variance at N=4 = "
        + var_report.fmt(row["otb"]["total_var_ratio"]),
        flush=True,
    )
    return summ


def cmd_variance_tiny(work: Path, quick: bool) -> dict[str, dict]:
    """Exact variance on the tiny policy (chain-sum, K = 4): every parameter, and the tail subset."""
    P, M = S.QUICK_POOL if quick else S.TINY_POOL
    out = {}
    for k, modes in ((4, ("full", "tail")),):
        paths = tiny_pools(work, warm_state(work, k, quick), k, P, M, modes)
        for mode in modes:
            name = f"tiny-k{k}-{mode}"
            out[name] = _variance_set(work, name, load_all(paths[mode]), quick, S.GROUP_SIZES)
    return out


def cmd_variance_smollm2(work: Path) -> dict[str, dict]:
    """Exact (tail) variance on the recorded SmolLM2 pools, overall and by stratum."""
    paths = sorted((work / "pools" / "smollm2-tail").glob("prompt*.npz"))
    if not paths:
        print("no SmolLM2 pools yet (run smollm2-pools under the heavy lock)")
        return {}
    pools = load_all(paths)
    out = {"smollm2-tail": _variance_set(work, "smollm2-tail", pools, False, S.GROUP_SIZES)}
    strata = {
        "smollm2-tool-use": lambda p: p.tool_calls > 0,
        "smollm2-no-tool": lambda p: p.tool_calls == 0,
        "smollm2-short": lambda p: p.lengths <= np.median(p.lengths),
        "smollm2-long": lambda p: p.lengths > np.median(p.lengths),
    }
    for name, sel in strata.items():
        sub = [p.restrict(sel(p)) for p in pools if sel(p).sum() >= 4]
        if sub:
            out[name] = _variance_set(work, name, sub, False, (2, 4, 8))
    out["smollm2-proxy-full-sample"] = smollm2_full_sample(paths)
    _save(work / "variance" / "smollm2-proxy-full-sample.json", out["smollm2-proxy-full-sample"])
    return out


def smollm2_full_sample(paths: list[Path]) -> dict:
    """Spearman of the proxy (and of the tail norm) against full-parameter norms on the sampled tokens."""
    prox, tail, full, head = [], [], [], []
    for p in paths:
        pool, extra = variance.load_pool(p)
        t = extra["full_tok"]
        prox.append(pool.proxy[t])
        tail.append(np.diagonal(pool.gram)[t])
        head.append(pool.blocks["lm_head"][t])
        full.append(extra["full_sq"])
    x, y, z, h = (np.concatenate(a) for a in (prox, full, tail, head))
    return {
        "tokens": len(x),
        "spearman_proxy_vs_full": variance.spearman(x, y),
        "spearman_tail_vs_full": variance.spearman(z, y),
        "spearman_proxy_vs_tail_without_head": variance.spearman(x, z - h),
        "head_share_of_tail_norm": float(np.median(h / z)),
        "tail_share_of_full_norm": float(np.median(z / y)),
        "points": np.stack([x, y]).T.tolist(),
    }


def cmd_report(work: Path, out: Path, figs: Path, quick: bool) -> str:
    """Write the summary JSON files and figures; return the quick line.

    A summary (and its figure) whose raw inputs are not in ``work`` keeps its committed version in ``out``
    rather than disappearing: a new machine that reruns one part rebuilds that part only.
    """
    rl_root = work / "rl"
    before_rl = _load(out / "rl.json")
    rl_sum = {}
    names = {"main": S.MAIN, "stress": S.STRESS}
    for key, setting in names.items():
        st = S.quick(setting) if quick else setting
        runs = rl_report.load_runs(rl_root, st.name, budget_fn(st, quick))
        if not runs:
            if key in before_rl:
                rl_sum[key] = before_rl[key]
                print(f"kept the committed rl.json[{key!r}] (no raw runs of it in {work})", file=sys.stderr)
            continue
        targets = S.TARGETS
        rl_sum[key] = {"setting": st.__dict__, "configs": rl_report.summarize_setting(runs, targets)}
        rl_report.plot_curves(runs, figs / f"rl-{key}.png", f"chain-sum, setting '{st.name}'", 0.7)
    transfer = work / "smollm2-train"
    if transfer.exists():
        rl_sum["smollm2_transfer"] = train_smollm2.summarize(transfer)
    _save(out / "rl.json", rl_sum)
    var_sum = _load(out / "variance.json")
    rebuilt = {p.stem: json.loads(p.read_text()) for p in sorted((work / "variance").glob("*.json"))}
    kept = sorted(set(var_sum) - set(rebuilt))
    if kept:
        print(f"kept the committed variance.json entries {kept} (not in {work})", file=sys.stderr)
    var_sum.update(rebuilt)
    _save(out / "variance.json", var_sum)
    main_sets = {k: v for k, v in var_sum.items() if k in ("tiny-k4-full", "tiny-k4-tail", "smollm2-tail")}
    if main_sets:
        var_report.plot_ratios(main_sets, figs / "variance-ratios.png", PLOT_NAMES)
    pts = {}
    for name in ("tiny-k4-full", "smollm2-tail"):
        f = work / "variance" / f"{name}-proxy-points.npy"
        if f.exists():
            pts[name] = np.load(f)
    if len(pts) == 2 or (pts and quick):
        var_report.plot_proxy(pts, figs / "proxy-vs-true.png", {k: var_sum[k]["proxy"] for k in pts})
    elif pts:
        print(f"kept proxy-vs-true.png: only {sorted(pts)}'s points are in {work}", file=sys.stderr)
    v = (
        var_sum.get("tiny-k4-full", {})
        .get("table", {})
        .get("4", {})
        .get("otb", {})
        .get("total_var_ratio", [np.nan])[0]
    )
    y = np.nan
    main = rl_sum.get("main", {}).get("configs", {})
    if "otb-N4" in main and "grpo-N32" in main:
        y = main["grpo-N32"]["ratio_to_otb-N4"]["0.7"][0]
        y = 1.0 / y if y else np.nan
    return f"variance OTB/GRPO at N=4: {v:.2f}; tokens-to-target OTB N=4 vs GRPO N=32: {y:.2f}"


def cmd_pool(work: Path, out: Path) -> str:
    """Tokens-to-target of the main sweep over the committed summary's seeds plus the runs in ``work`` of
    seeds it lacks (results/rl_pooled.json); return the markdown table."""
    stored = json.loads((out / "rl.json").read_text())["main"]["configs"]
    budget = budget_fn(S.MAIN, False)
    new = rl_report.load_runs(work / "rl", S.MAIN.name)
    pooled = rl_report.pool_tokens_to_target(stored, new, S.TARGETS, budget)
    _save(out / "rl_pooled.json", pooled)
    return rl_report.pooled_markdown(pooled, S.TARGETS)


def cmd_tables(work: Path, quick: bool) -> str:
    """Markdown tables of everything (pasted into docs/reproduction.md)."""
    parts = []
    for setting in (S.MAIN, S.STRESS):
        st = S.quick(setting) if quick else setting
        runs = rl_report.load_runs(work / "rl", st.name, budget_fn(st, quick))
        if runs:
            summ = rl_report.summarize_setting(runs, S.TARGETS)
            at = sorted({50_000, 150_000, 300_000, st.token_budget} if not quick else {st.token_budget})
            parts.append(f"### RL: {st.name}\n\n" + rl_report.markdown(summ, runs, at))
    sets = {p.stem: json.loads(p.read_text()) for p in sorted((work / "variance").glob("*.json"))}
    sets = {k: v for k, v in sets.items() if "table" in v}
    for n in (4, 8):
        parts.append("### variance at a glance\n\n" + var_report.compact_table(sets, n, PLOT_NAMES))
    for name, summ in sets.items():
        p = Path(name)
        parts.append(f"### variance: {p.stem} ({summ['pools']})")
        for metric, digits in (
            ("total_var_ratio", 2),
            ("proj_var_ratio", 2),
            ("snr_ratio", 2),
            ("total_var", 3),
        ):
            parts.append(f"{metric}\n\n" + var_report.markdown_table(summ, metric, VAR_NAMES, digits))
        prox = summ["proxy"]
        parts.append(
            "proxy vs true norm (Spearman): "
            + "; ".join(
                f"{k}: {var_report.fmt(v['spearman'])} ({v['tokens']} tokens)"
                for k, v in prox.items()
                if "spearman" in v
            )
            + f"; log-log slope {prox['all'].get('loglog_slope', float('nan')):.2f}"
            + f"; trajectory level: {prox.get('trajectory level')}"
        )
    full = work / "variance" / "smollm2-proxy-full-sample.json"
    if full.exists():
        parts.append(
            "SmolLM2 full-parameter check: "
            + str({k: v for k, v in json.loads(full.read_text()).items() if k != "points"})
        )
    transfer = work / "smollm2-train"
    if transfer.exists():
        parts.append("### SmolLM2 transfer\n\n" + transfer_table(train_smollm2.summarize(transfer)))
    return "\n\n".join(parts)


def transfer_table(summ: dict) -> str:
    """Markdown: held-out pass@1 of every SmolLM2 run (± the binomial standard error of its evaluation)."""
    lines = [
        "| estimator | seed | steps | train reward by step | held-out pass@1 |",
        "|---|---:|---:|---|---:|",
    ]
    for est, runs in summ["runs"].items():
        for r in runs:
            rew = " ".join(f"{x:.2f}" for x in r["train_reward"] if x is not None)
            lines.append(
                f"| {est} | {r['seed']} | {r['steps']} | {rew} | {r['pass_at_1']:.3f} ± {r['stderr']:.3f} |"
            )
    if "untrained" in summ:
        u = summ["untrained"]
        lines.append(f"| untrained | — | 0 | — | {u['pass_at_1']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", nargs="?", default="all")
    ap.add_argument("args", nargs="*")
    ap.add_argument("--quick", action="store_true", help="small settings; the whole pipeline in minutes")
    ap.add_argument(
        "--work", type=Path, default=None, help="intermediate results (default runs/otb-reproduction)"
    )
    ap.add_argument("--out", type=Path, default=None, help="where summaries and figures go")
    ap.add_argument("--seeds", type=int, nargs="*", default=None)
    ap.add_argument("--configs", nargs="*", default=None, help="sweep only these (otb-N4 grpo-N32 ...)")
    ap.add_argument("--prompts", type=int, nargs="*", default=None, help="SmolLM2 prompt seeds")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = a.work or (ROOT / "runs" / ("otb-reproduction-quick" if a.quick else "otb-reproduction"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    out = a.out or (work / "report" if a.quick else HERE / "results")
    figs = out / "figures" if a.quick else ROOT / "docs" / "reproduction"
    cmd = a.command
    if cmd in ("sweep", "all"):
        for name in a.args or (["main"] if a.quick else ["main", "stress"]):
            cmd_sweep(work, name, a.quick, a.seeds, a.configs)
    if cmd in ("variance-tiny", "all"):
        cmd_variance_tiny(work, a.quick)
    if cmd == "smollm2-pools":
        smollm2_pools(work, work / SMOL_JSONL, a.prompts or [0, 1, 2, 3])
    if cmd in ("variance-smollm2", "all") and not a.quick:
        cmd_variance_smollm2(work)
    if cmd == "tables":
        print(cmd_tables(work, a.quick))
    if cmd == "pool":
        print(cmd_pool(work, out))
    known = ("sweep", "all", "variance-tiny", "smollm2-pools", "variance-smollm2", "report", "tables", "pool")
    if cmd not in known:
        raise SystemExit(f"unknown command {a.command!r}")
    if cmd in ("report", "all"):
        line = cmd_report(work, out, figs, a.quick)
        print(f"done in {time.perf_counter() - t0:.0f}s; results in {out}", file=sys.stderr)
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
