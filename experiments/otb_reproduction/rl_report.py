"""Experiment 2 summaries: held-out success against generated tokens, tokens-to-target with intervals,
gradient-norm curves, collapse counts. Reads the per-run JSON files of :mod:`train_tiny`."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

COLORS = {
    "otb-N4": "#d62728",
    "grpo-N4": "#1f77b4",
    "grpo-N8": "#4f9fd4",
    "grpo-N16": "#7fbfe4",
    "grpo-N32": "#17375e",
    "rloo-N4": "#2ca02c",
    "opo-N4": "#9467bd",
}


def load_runs(
    root: Path, setting: str, budget_of: Callable[[int], int] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Runs of one setting by configuration label (``otb-N4``...), sorted by seed; with ``budget_of``
    (group size → token budget) each run is cut to its configuration's budget (:func:`truncate`)."""
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in sorted((root / setting).glob("*.json")):
        r = json.loads(p.read_text())
        if budget_of is not None:
            r = truncate(r, budget_of(r["group_size"]))
        by[f"{r['estimator']}-N{r['group_size']}"].append(r)
    return {k: sorted(v, key=lambda r: r["seed"]) for k, v in by.items()}


def truncate(run: dict[str, Any], budget: int) -> dict[str, Any]:
    """The run as if it had stopped at ``budget`` generated tokens (a probe run that went on longer is
    cut, so that its final success and censoring match the other seeds'); evaluations are on a shared
    token grid, so the cut curve is exactly the one a shorter run would have logged."""
    if run["setting"]["token_budget"] <= budget:
        return run
    curve = [c for c in run["curve"] if c["tokens"] < budget + EVAL_SLACK]
    last = curve[-1]["tokens"]
    steps = [s for s in run["steps"] if s["tokens"] <= last]
    setting = {**run["setting"], "token_budget": budget}
    return {**run, "curve": curve, "steps": steps, "setting": setting}


EVAL_SLACK = 10_000
"""A run evaluates at the first step that crosses a milestone, so logged token counts overshoot the
milestone by less than one step's tokens (< 10k here)."""


def tokens_to_target(
    curve: Sequence[dict[str, float]], target: float, budget: float, axis: str = "tokens"
) -> tuple[float, bool]:
    """First generated-token count (``axis="step"``: RL step) at which held-out success reaches
    ``target``, interpolated linearly between evaluations; (``budget``, True) when it never does
    (censored at the run's budget on that axis)."""
    xs = [c[axis] for c in curve]
    ys = [c["success"] for c in curve]
    for i in range(1, len(xs)):
        if ys[i - 1] >= target:
            return float(xs[i - 1]), False
        if ys[i] >= target:
            return xs[i - 1] + (target - ys[i - 1]) / (ys[i] - ys[i - 1]) * (xs[i] - xs[i - 1]), False
    return float(budget), True


def boot_mean(x: np.ndarray, rng: np.random.Generator, B: int = 2000) -> tuple[float, float, float]:
    """Mean and 95% percentile bootstrap interval over seeds."""
    if len(x) == 0:
        return (float("nan"),) * 3  # type: ignore[return-value]
    reps = x[rng.integers(0, len(x), size=(B, len(x)))].mean(1)
    lo, hi = np.percentile(reps, [2.5, 97.5])
    return float(x.mean()), float(lo), float(hi)


def _surge(g: np.ndarray, k: int = 10, early: int = 10) -> float:
    """The largest ``k``-step mean gradient norm of a run over the median of its first ``early`` steps: how
    far the norm rises above the run's own early level (a collapsed run's norm drops to 0 afterwards, so its
    overall median would be no reference)."""
    if len(g) < max(k, early):
        return float("nan")
    return float(np.convolve(g, np.ones(k) / k, mode="valid").max() / max(np.median(g[:early]), 1e-12))


def summarize_setting(
    runs: dict[str, list[dict[str, Any]]], targets: Sequence[float], ref: str = "otb-N4", seed: int = 0
) -> dict[str, Any]:
    """Per configuration: final and best held-out success, tokens-to-target per target (mean, interval,
    censored count), the ratios to ``ref`` and to GRPO at N = 32 (paired by seed; bootstrap over the common
    seeds), grad-norm statistics and collapses."""
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    ttt_by: dict[str, dict[float, dict[int, float]]] = {}
    for label, rs in runs.items():
        finals = np.array([r["curve"][-1]["success"] for r in rs])
        peaks = np.array([max(c["success"] for c in r["curve"]) for r in rs])
        gn = [np.array([s["grad_norm"] for s in r["steps"]]) for r in rs]
        finite = [g[np.isfinite(g)] for g in gn]
        cell: dict[str, Any] = {
            "seeds": [r["seed"] for r in rs],
            "initial_success": boot_mean(np.array([r["curve"][0]["success"] for r in rs]), rng),
            "final_success": boot_mean(finals, rng),
            "best_success": boot_mean(peaks, rng),
            "grad_norm_median": float(np.median(np.concatenate(finite))) if finite else float("nan"),
            "grad_norm_max": float(max((g.max() for g in finite if len(g)), default=float("nan"))),
            # Surge relative to the run's own early level (advantage scales differ between estimators, e.g.
            # GRPO's std normalisation, so absolute norms are not comparable).
            "grad_norm_surge": [float(_surge(g)) for g in finite],
            "nonfinite_steps": int(sum((~np.isfinite(g)).sum() for g in gn)),
            # Collapsed: ends below half of its best held-out success (the start counts as a best, so a run
            # that only ever loses what the warm start had collapses too).
            "collapsed": int(sum(f < 0.5 * p for p, f in zip(peaks, finals, strict=True))),
            "steps": [len(r["steps"]) for r in rs],
            "tokens_to_target": {},
        }
        ttt_by[label] = {}
        for tg in targets:
            vals = [tokens_to_target(r["curve"], tg, r["setting"]["token_budget"]) for r in rs]
            x = np.array([v for v, _ in vals])
            cell["tokens_to_target"][str(tg)] = {
                "mean": boot_mean(x, rng),
                "censored": int(sum(c for _, c in vals)),
                "per_seed": [float(v) for v in x],
            }
            ttt_by[label][tg] = {r["seed"]: v for r, (v, _) in zip(rs, vals, strict=True)}
            svals = [tokens_to_target(r["curve"], tg, len(r["steps"]), axis="step") for r in rs]
            cell["tokens_to_target"][str(tg)]["steps"] = boot_mean(np.array([v for v, _ in svals]), rng)
        out[label] = cell
    for r in (ref, "grpo-N32"):
        if r not in ttt_by:
            continue
        for label in out:
            out[label]["ratio_to_" + r] = {}
            for tg in targets:
                a, b = ttt_by[label][tg], ttt_by[r][tg]
                common = sorted(set(a) & set(b))
                if not common:
                    continue
                xa = np.array([a[s] for s in common])
                xb = np.array([b[s] for s in common])
                reps = []
                for _ in range(2000):
                    pick = rng.integers(0, len(common), size=len(common))
                    reps.append(xa[pick].mean() / xb[pick].mean())
                lo, hi = np.percentile(reps, [2.5, 97.5])
                out[label]["ratio_to_" + r][str(tg)] = [float(xa.mean() / xb.mean()), float(lo), float(hi)]
    return out


def plot_curves(runs: dict[str, list[dict[str, Any]]], path: Path, title: str, target: float | None) -> None:
    """Held-out success vs generated model tokens (mean over seeds, band = min..max) and grad norms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6), dpi=100)
    for label in sorted(runs, key=lambda s: (s.split("-")[0] != "otb", s)):
        rs = runs[label]
        col = COLORS.get(label)
        xs = np.array([c["tokens"] for c in rs[0]["curve"]]) / 1e3
        ys = np.array([[c["success"] for c in r["curve"]] for r in rs if len(r["curve"]) == len(xs)])
        ax1.plot(
            xs, ys.mean(0), label=f"{label} ({len(ys)} seeds)", color=col, lw=2 if "otb" in label else 1.2
        )
        ax1.fill_between(xs, ys.min(0), ys.max(0), color=col, alpha=0.12)
        grid = np.linspace(0, xs[-1] * 1e3, 60)
        g = []
        for r in rs:
            t = np.array([s["tokens"] for s in r["steps"]])
            v = np.array([s["grad_norm"] for s in r["steps"]])
            ok = np.isfinite(v)
            if ok.sum() < 2:
                continue
            k = max(1, len(v) // 40)
            sm = np.convolve(np.where(ok, v, 0), np.ones(k) / k, mode="same")
            g.append(np.interp(grid, t[ok], sm[ok]))
        if g:
            ax2.plot(grid / 1e3, np.mean(g, 0), color=col, lw=2 if "otb" in label else 1.2)
    if target is not None:
        ax1.axhline(target, color="gray", ls=":", lw=1)
    ax1.set_xlabel("generated model tokens (thousands)")
    ax1.set_ylabel("held-out success")
    ax1.set_ylim(0, 1)
    ax1.legend(fontsize=7, loc="lower right")
    ax2.set_xlabel("generated model tokens (thousands)")
    ax2.set_ylabel("gradient norm (pre-clip, smoothed)")
    ax2.set_yscale("log")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def success_at(curve: Sequence[dict[str, float]], tokens: float) -> float:
    """Held-out success at a token count, interpolated between evaluations (NaN past the run's end)."""
    xs = [c["tokens"] for c in curve]
    if tokens > xs[-1]:
        return float("nan")
    return float(np.interp(tokens, xs, [c["success"] for c in curve]))


def markdown(summary: dict[str, Any], runs: dict[str, list[dict[str, Any]]], at: Sequence[int]) -> str:
    """Markdown tables of one setting: success at fixed token counts, tokens-to-target, grad norms."""
    rng = np.random.default_rng(0)
    order = sorted(summary, key=lambda s: (s.split("-")[0] != "otb", s.split("-")[0], int(s.split("N")[1])))
    head = "| config | seeds | " + " | ".join(f"success @ {t // 1000}k tok" for t in at) + " |"
    lines = [head, "|---|---:|" + "---:|" * len(at)]
    for label in order:
        cells = []
        for t in at:
            x = np.array([success_at(r["curve"], t) for r in runs[label]])
            x = x[np.isfinite(x)]
            cells.append("—" if not len(x) else "{:.2f} [{:.2f}, {:.2f}]".format(*boot_mean(x, rng)))
        lines.append(f"| {label} | {len(runs[label])} | " + " | ".join(cells) + " |")
    targets = list(next(iter(summary.values()))["tokens_to_target"])
    lines += [
        "",
        "| config | "
        + " | ".join(f"tokens to {t} (k)" for t in targets)
        + " | vs otb-N4 at 0.7 | vs grpo-N32 at 0.7 | steps to 0.7 |",
    ]
    lines.append("|---|" + "---:|" * (len(targets) + 3))
    for label in order:
        cells = []
        for t in targets:
            c = summary[label]["tokens_to_target"][t]
            m, lo, hi = (v / 1e3 for v in c["mean"])
            cens = f" ({c['censored']} censored)" if c["censored"] else ""
            cells.append(f"{m:.0f} [{lo:.0f}, {hi:.0f}]{cens}")
        for ref in ("otb-N4", "grpo-N32"):
            r = summary[label].get("ratio_to_" + ref, {}).get("0.7")
            cells.append("{:.2f} [{:.2f}, {:.2f}]".format(*r) if r else "—")
        st = summary[label]["tokens_to_target"].get("0.7", {}).get("steps")
        cells.append("{:.0f} [{:.0f}, {:.0f}]".format(*st) if st else "—")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| config | grad norm median | grad norm max | surge (max 10-step mean / early median), per seed "
        "| collapsed runs | final success |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for label in order:
        c = summary[label]
        fs = "{:.2f} [{:.2f}, {:.2f}]".format(*c["final_success"])
        surge = ", ".join(f"{x:.1f}" for x in c["grad_norm_surge"])
        lines.append(
            f"| {label} | {c['grad_norm_median']:.3g} | {c['grad_norm_max']:.3g} | {surge} | "
            f"{c['collapsed']}/{len(c['seeds'])} | {fs} |"
        )
    return "\n".join(lines)


def pool_tokens_to_target(
    stored: dict[str, Any],
    new_runs: dict[str, list[dict[str, Any]]],
    targets: Sequence[float],
    budget_of: Callable[[int], int],
    refs: Sequence[str] = ("otb-N4", "grpo-N32"),
    seed: int = 0,
) -> dict[str, Any]:
    """Tokens-to-target over the seeds of a committed summary (``stored``: ``rl.json``'s ``configs``, whose
    per-seed values are kept) plus runs of seeds it lacks (``new_runs``, cut to their budget): per
    configuration the per-seed values, their mean with a bootstrap interval, the censored count, and the
    ratios to each of ``refs`` paired by seed. For when the raw runs behind ``stored`` are gone: the
    summary keeps only what this needs (success curves and gradient norms cannot be pooled)."""
    rng = np.random.default_rng(seed)
    per: dict[str, dict[float, dict[int, float]]] = {}
    origin: dict[str, dict[int, str]] = {}
    for label in sorted(set(stored) | set(new_runs)):
        per[label] = {tg: {} for tg in targets}
        origin[label] = {}
        cell = stored.get(label)
        if cell is not None:
            for tg in targets:
                for sd, v in zip(cell["seeds"], cell["tokens_to_target"][str(tg)]["per_seed"], strict=True):
                    per[label][tg][int(sd)] = float(v)
            origin[label] = {int(sd): "committed" for sd in cell["seeds"]}
        for r in new_runs.get(label, []):
            if r["seed"] in origin[label]:
                continue  # a rerun of a committed seed: the committed value stands
            r = truncate(r, budget_of(r["group_size"]))
            for tg in targets:
                per[label][tg][r["seed"]], _ = tokens_to_target(r["curve"], tg, r["setting"]["token_budget"])
            origin[label][r["seed"]] = "new"
    out: dict[str, Any] = {}
    for label, by_tg in per.items():
        n = int(label.split("-N")[1])
        cell = {"seeds": sorted(origin[label]), "origin": origin[label], "tokens_to_target": {}}
        for tg, vals in by_tg.items():
            x = np.array([vals[sd] for sd in sorted(vals)])
            cell["tokens_to_target"][str(tg)] = {
                "mean": boot_mean(x, rng),
                "censored": int(sum(v >= budget_of(n) for v in x)),
                "per_seed": {str(sd): vals[sd] for sd in sorted(vals)},
            }
        for ref in refs:
            if ref not in per:
                continue
            cell["ratio_to_" + ref] = {}
            for tg in targets:
                a, b = by_tg[tg], per[ref][tg]
                common = sorted(set(a) & set(b))
                xa, xb = np.array([a[s] for s in common]), np.array([b[s] for s in common])
                picks = rng.integers(0, len(common), size=(2000, len(common)))
                reps = xa[picks].mean(1) / xb[picks].mean(1)
                lo, hi = np.percentile(reps, [2.5, 97.5])
                cell["ratio_to_" + ref][str(tg)] = [float(xa.mean() / xb.mean()), float(lo), float(hi)]
        out[label] = cell
    return out


def pooled_markdown(pooled: dict[str, Any], targets: Sequence[float]) -> str:
    """The pooled tokens-to-target table."""
    head = " | ".join(f"tokens to {tg} (k)" for tg in targets)
    lines = [
        f"| config | seeds | {head} | vs otb-N4 at 0.7 | vs grpo-N32 at 0.7 |",
        "|---|---:|" + "---:|" * (len(targets) + 2),
    ]

    def ci(v: Sequence[float], scale: float = 1.0, fmt: str = "{:.0f}") -> str:
        return f"{fmt.format(v[0] / scale)} [{fmt.format(v[1] / scale)}, {fmt.format(v[2] / scale)}]"

    for label in sorted(pooled, key=lambda k: (k.split("-N")[0] != "otb", int(k.split("-N")[1]), k)):
        cell = pooled[label]
        cols = []
        for tg in targets:
            t = cell["tokens_to_target"][str(tg)]
            extra = f" ({t['censored']} censored)" if t["censored"] else ""
            cols.append(ci(t["mean"], 1000) + extra)
        ratios = [
            ci(cell[f"ratio_to_{r}"]["0.7"], fmt="{:.2f}") if f"ratio_to_{r}" in cell else "—"
            for r in ("otb-N4", "grpo-N32")
        ]
        new = sum(o == "new" for o in cell["origin"].values())
        lines.append(f"| {label} | {len(cell['seeds'])} ({new} new) | " + " | ".join(cols + ratios) + " |")
    return "\n".join(lines)
