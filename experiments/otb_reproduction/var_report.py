"""Figures and markdown tables for experiment 1 (variance) from the summaries of :mod:`variance`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

STYLE = {
    "none": ("#999999", "REINFORCE (no baseline)"),
    "grpo": ("#1f77b4", "GRPO (group mean)"),
    "grpo_std": ("#7fbfe4", "GRPO (mean/std)"),
    "rloo": ("#2ca02c", "RLOO"),
    "opo": ("#9467bd", "OPO"),
    "otb": ("#d62728", "OTB (proxy)"),
    "otb_exact": ("#ff7f0e", "OTB, exact ‖s_t‖²"),
    "otb_exact_prefix": ("#8c564b", "OTB, exact prefix norm"),
    "eob": ("#17becf", "exact sequence baseline"),
    "otb_loo": ("#e377c2", "OTB leave-one-out"),
}


def _mpl() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_ratios(summaries: dict[str, dict[str, Any]], path: Path, names: Sequence[str]) -> None:
    """Per pool set: total-variance ratio and signal-to-noise ratio to GRPO against N, with intervals."""
    plt = _mpl()
    sets = list(summaries)
    fig, axes = plt.subplots(2, len(sets), figsize=(3.6 * len(sets), 6), dpi=100, squeeze=False)
    for c, name in enumerate(sets):
        s = summaries[name]
        Ns = s["group_sizes"]
        for r, (metric, lab) in enumerate(
            [
                ("total_var_ratio", "tr Cov(ĝ) / GRPO's"),
                ("snr_ratio", "signal/noise along the mean, / GRPO's"),
            ]
        ):
            ax = axes[r][c]
            lowest = 1.0
            for e in names:
                if e not in s["estimators"]:
                    continue
                v = np.array([s["table"][str(N)][e][metric] for N in Ns], dtype=float)
                if not np.isfinite(v[:, 0]).any():
                    continue
                lowest = min(lowest, float(np.nanmin(v[:, 0])))
                col, label = STYLE.get(e, ("k", e))
                ax.errorbar(
                    Ns,
                    v[:, 0],
                    yerr=[np.maximum(v[:, 0] - v[:, 1], 0), np.maximum(v[:, 2] - v[:, 0], 0)],
                    color=col,
                    label=label,
                    marker="o",
                    ms=3,
                    lw=2 if e == "otb" else 1,
                    capsize=2,
                )
            ax.axhline(1, color="gray", lw=0.8, ls=":")  # also gives an empty panel a valid range
            ax.set_yscale("log", base=2)
            # Down to 1/8, or further when a point estimate lies below (SmolLM2's OTB trace: ~1/12).
            k = int(min(6, max(3, np.ceil(-np.log2(max(lowest, 2.0**-6))))))
            ticks = [2.0**i for i in range(-k, 4)]
            ax.set_ylim(ticks[0], 8)
            ax.set_yticks(ticks, [f"1/{int(1 / t)}" if t < 1 else str(int(t)) for t in ticks])
            ax.set_xscale("log", base=2)
            ax.set_xticks(Ns, [str(n) for n in Ns])
            ax.set_xlabel("group size N")
            ax.set_ylabel(lab, fontsize=8)
            if r == 0:
                ax.set_title(name, fontsize=9)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def plot_proxy(points: dict[str, np.ndarray], path: Path, rho: dict[str, dict[str, Any]]) -> None:
    """Scatter of the logit-gradient proxy against the true per-token squared gradient norm (log-log)."""
    plt = _mpl()
    fig, axes = plt.subplots(1, len(points), figsize=(3.8 * len(points), 3.6), dpi=100, squeeze=False)
    rng = np.random.default_rng(0)
    for ax, (name, arr) in zip(axes[0], points.items(), strict=True):
        if len(arr) > 4000:
            arr = arr[rng.choice(len(arr), 4000, replace=False)]
        floor = 1e-12
        for flag, col, lab in ((1, "#d62728", "tool-call turns"), (0, "#1f77b4", "other turns")):
            sel = arr[:, 2] == flag
            ax.scatter(
                np.maximum(arr[sel, 0], floor),
                np.maximum(arr[sel, 1], floor),
                s=3,
                alpha=0.35,
                color=col,
                label=lab,
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("proxy 1 − 2π + Σπ²")
        ax.set_ylabel("true ‖∇θ log π(y_t)‖²")
        r = rho.get(name, {}).get("all", {}).get("spearman")
        ax.set_title(f"{name}\nSpearman {r[0]:.2f} [{r[1]:.2f}, {r[2]:.2f}]" if r else name, fontsize=8)
        ax.legend(fontsize=6, markerscale=3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def fmt(cell: Sequence[float], digits: int = 2) -> str:
    """``x [lo, hi]``."""
    return f"{cell[0]:.{digits}f} [{cell[1]:.{digits}f}, {cell[2]:.{digits}f}]"


def markdown_table(summary: dict[str, Any], metric: str, names: Sequence[str], digits: int = 2) -> str:
    """Estimators × group sizes, one metric with its interval."""
    Ns = summary["group_sizes"]
    lines = ["| estimator | " + " | ".join(f"N = {n}" for n in Ns) + " |", "|---|" + "---:|" * len(Ns)]
    for e in names:
        if e not in summary["estimators"]:
            continue
        cells = [fmt(summary["table"][str(n)][e][metric], digits) for n in Ns]
        lines.append(f"| {STYLE.get(e, ('', e))[1]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compact_table(sets: dict[str, dict[str, Any]], n: int, names: Sequence[str]) -> str:
    """One group size, every pool set side by side: total-variance ratio, projection-variance ratio and
    signal-to-noise ratio to GRPO (each with its interval)."""
    metrics = (("total_var_ratio", "tr Cov"), ("proj_var_ratio", "proj. var"), ("snr_ratio", "signal/noise"))
    use = {k: v for k, v in sets.items() if str(n) in v.get("table", {})}
    head = " | ".join(f"{lab}, {k}" for k in use for _, lab in metrics)
    lines = [f"| estimator (N = {n}) | {head} |", "|---|" + "---:|" * (len(use) * len(metrics))]
    for e in names:
        cells = []
        for summ in use.values():
            row = summ["table"][str(n)]
            cells += [fmt(row[e][m]) if e in row else "—" for m, _ in metrics]
        lines.append(f"| {STYLE.get(e, ('', e))[1]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
