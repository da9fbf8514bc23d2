"""Experiment 1: exact gradient variance of group estimators, and how well the logit-gradient proxy tracks
the true per-token gradient norm. Pools come from :mod:`gradvar`; this module draws the groups, bootstraps
and summarises.

Sampling design (fair by construction): for each prompt a pool of M trajectories is recorded once; the
variance of an estimator at group size N is its variance over groups of N drawn i.i.d. from the pool (the
plug-in distribution), and **every estimator sees the same drawn groups** (paired comparison). Intervals:
a two-level bootstrap — prompts resampled with replacement, then trajectories within each prompt — with
the draws redone inside each replicate; ratios are computed within replicates (paired).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gradvar as gv
import numpy as np
import torch
from gradvar import PromptPool


def save_pool(pool: PromptPool, path: Path, **extra: np.ndarray) -> None:
    """Write a pool (and extra arrays) to one ``.npz``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    blocks = {f"block_{k}": v for k, v in pool.blocks.items()}
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(
        tmp,
        name=np.array(pool.name),
        rewards=pool.rewards,
        lengths=pool.lengths,
        tool_calls=pool.tool_calls,
        logprobs=pool.logprobs,
        spi2=pool.spi2,
        tool_turn=pool.tool_turn,
        gram=pool.gram,
        **blocks,
        **extra,
    )
    tmp.replace(path)


def load_pool(path: Path) -> tuple[PromptPool, dict[str, np.ndarray]]:
    """Read a pool written by :func:`save_pool`; returns (pool, extra arrays)."""
    z = dict(np.load(path))
    blocks = {k[6:]: z.pop(k) for k in list(z) if k.startswith("block_")}
    pool = PromptPool(
        str(z.pop("name")),
        z.pop("rewards"),
        z.pop("lengths"),
        z.pop("tool_calls"),
        z.pop("logprobs"),
        z.pop("spi2"),
        z.pop("tool_turn"),
        z.pop("gram"),
        blocks,
    )
    return pool, z


# --------------------------------------------------------------------------------------------------
def _split(rng: np.random.Generator, pool: PromptPool, w: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Two halves of the trajectories with positive weight (as weight vectors), stratified by reward so
    that both halves see successes and failures; None when that is impossible (fewer than two
    trajectories of some reward value)."""
    a = np.zeros_like(w)
    for r in np.unique(pool.rewards[w > 0]):
        live = rng.permutation(np.flatnonzero((w > 0) & (pool.rewards == r)))
        a[live[: len(live) // 2]] = 1
    halves = (w * a, w * (1 - a))
    ok = all(len(np.unique(pool.rewards[h > 0])) > 1 for h in halves)
    return halves if ok else None


def _stats(
    pool: PromptPool,
    K: torch.Tensor,
    rng: np.random.Generator,
    w: np.ndarray,
    D: int,
    N: int,
    names: Sequence[str],
) -> np.ndarray:
    """[len(names), 3]: total variance on D groups drawn from the whole pool (weights ``w``); mean and
    variance of the projection on the mean direction, **cross-fitted**: the direction is estimated on one
    half of the pool (:func:`gradvar.reference`) and the groups are drawn from the other half, then the
    halves swap (D/2 draws each). An independent direction keeps the pool's own sampling noise out of the
    projected mean, which is what makes that mean a fair "signal" for a signal-to-noise comparison. NaN
    where the pool cannot be split into two halves that both contain successes and failures."""
    idx = gv.draw(rng, w, D, N)
    halves = _split(rng, pool, w)
    cross = []
    if halves is not None:
        for half_a, half_b in (halves, halves[::-1]):
            cross.append((gv.draw(rng, half_b, max(D // 2, 2), N), gv.reference(pool, half_a)))
    out = np.full((len(names), 3), np.nan)
    for j, name in enumerate(names):
        A, mask = gv.advantages(pool, idx, name)
        out[j, 0] = gv.total_variance(K, gv.coefficients(pool, idx, A, mask))
        means, variances = [], []
        for ib, ref in cross:
            Ab, mb = gv.advantages(pool, ib, name)
            pr = gv.projections(gv.coefficients(pool, ib, Ab, mb), K, ref)
            means.append(pr.mean())
            variances.append(pr.var(ddof=1))
        if cross:
            out[j, 1], out[j, 2] = np.mean(means), np.mean(variances)
    return out


def analyze(
    pools: Sequence[PromptPool],
    *,
    group_sizes: Sequence[int],
    draws: int,
    boot: int,
    boot_draws: int,
    seed: int = 0,
    names: Sequence[str] = gv.ESTIMATORS,
) -> dict[str, Any]:
    """Point estimates and bootstrap replicates of every estimator's moments, per group size.

    Returns ``{"estimators", "group_sizes", "point": [N][est][3], "boot": [B][N][est][3]}``, the moments
    (total_var, proj_mean, proj_var) averaged over prompts (per-group quantities; the projection moments
    over the prompts where they are defined).
    """
    Ks = [torch.from_numpy(p.gram) for p in pools]
    rng = np.random.default_rng(seed)
    P = len(pools)
    per = np.zeros((P, len(group_sizes), len(names), 3))
    for p, (pool, K) in enumerate(zip(pools, Ks, strict=True)):
        ones = np.ones(len(pool.rewards))
        for a, N in enumerate(group_sizes):
            per[p, a] = _stats(pool, K, rng, ones, draws, N, names)
    point = _nanmean(per)
    reps = np.zeros((boot, len(group_sizes), len(names), 3))
    for b in range(boot):
        per = np.zeros((P, len(group_sizes), len(names), 3))
        for i, p in enumerate(rng.integers(0, P, size=P)):
            pool, K = pools[p], Ks[p]
            M = len(pool.rewards)
            w = rng.multinomial(M, np.ones(M) / M).astype(np.float64)
            for a, N in enumerate(group_sizes):
                per[i, a] = _stats(pool, K, rng, w, boot_draws, N, names)
        reps[b] = _nanmean(per)
    return {"estimators": list(names), "group_sizes": list(group_sizes), "point": point, "boot": reps}


def _nanmean(per: np.ndarray) -> np.ndarray:
    """Mean over prompts (axis 0), ignoring prompts where a moment is undefined (NaN where all are)."""
    ok = np.isfinite(per)
    return np.where(ok.any(0), np.where(ok, per, 0).sum(0) / np.maximum(ok.sum(0), 1), np.nan)


MOMENTS = ("total_var", "proj_mean", "proj_var")


def summarize(res: dict[str, Any], base: str = "grpo") -> dict[str, Any]:
    """Tables with 95% percentile intervals: each moment, its ratio to ``base``, and the signal-to-noise
    ratio along the mean direction, snr = proj_mean² / proj_var (scale-free: RLOO and GRPO, which differ
    only by the factor (N − 1)/N, have the same), with its ratio to ``base``."""
    names, Ns = res["estimators"], res["group_sizes"]
    pt, bs = res["point"], res["boot"]
    j0 = names.index(base)

    def derived(x: np.ndarray) -> dict[str, np.ndarray]:
        d = {m: x[..., i] for i, m in enumerate(MOMENTS)}
        d["snr"] = d["proj_mean"] ** 2 / d["proj_var"]
        for m in ("total_var", "proj_var", "snr"):
            d[m + "_ratio"] = d[m] / d[m][..., j0 : j0 + 1]
        return d

    P, B = derived(pt), derived(bs)
    table: dict[str, Any] = {}
    for a, N in enumerate(Ns):
        row = {}
        for j, name in enumerate(names):
            cell = {}
            for m in P:
                lo, hi = np.nanpercentile(B[m][:, a, j], [2.5, 97.5]) if len(bs) else (np.nan, np.nan)
                cell[m] = [float(P[m][a, j]), float(lo), float(hi)]
            row[name] = cell
        table[str(N)] = row
    return {"estimators": names, "group_sizes": list(Ns), "base": base, "table": table, "boot": len(bs)}


# --------------------------------------------------------------------------------------------------
def rankdata(x: np.ndarray) -> np.ndarray:
    """Ranks with ties averaged (as scipy.stats.rankdata)."""
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    ranks = np.empty(len(x))
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and xs[j + 1] == xs[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation."""
    if len(x) < 3:
        return float("nan")
    return float(np.corrcoef(rankdata(x), rankdata(y))[0, 1])


def proxy_tracking(pools: Sequence[PromptPool], boot: int = 200, seed: int = 0) -> dict[str, Any]:
    """Spearman(proxy w_t, true ‖s_t‖²) over all model tokens and by stratum, with a cluster bootstrap
    (trajectories resampled) for the intervals. Strata: tokens of turns that call a tool / that do not;
    trajectories that used a tool / that did not."""
    rows = []  # (proxy, true, tool_turn, traj_uses_tool, traj_id)
    tid = 0
    for pool in pools:
        true = np.diagonal(pool.gram)
        prox = pool.proxy
        for i, (a, b) in enumerate(pool.spans()):
            uses = pool.tool_calls[i] > 0
            for t in range(a, b):
                rows.append((prox[t], true[t], pool.tool_turn[t], uses, tid))
            tid += 1
    arr = np.array(rows, dtype=np.float64)
    strata = {
        "all": np.ones(len(arr), bool),
        "tool-call turns": arr[:, 2] > 0,
        "other turns": arr[:, 2] == 0,
        "episodes with tool use": arr[:, 3] > 0,
        "episodes without tool use": arr[:, 3] == 0,
    }
    rng = np.random.default_rng(seed)
    traj = arr[:, 4].astype(int)
    by_traj = [np.flatnonzero(traj == k) for k in range(tid)]
    out: dict[str, Any] = {}
    for name, sel in strata.items():
        if sel.sum() < 10:
            continue
        est = spearman(arr[sel, 0], arr[sel, 1])
        reps = []
        for _ in range(boot):
            pick = np.concatenate([by_traj[k] for k in rng.integers(0, tid, size=tid)])
            pick = pick[sel[pick]]
            reps.append(spearman(arr[pick, 0], arr[pick, 1]))
        lo, hi = np.nanpercentile(reps, [2.5, 97.5])
        out[name] = {"spearman": [est, float(lo), float(hi)], "tokens": int(sel.sum())}
    pos = (arr[:, 0] > 0) & (arr[:, 1] > 0)
    lx, ly = np.log(arr[pos, 0]), np.log(arr[pos, 1])
    out["all"]["loglog_slope"] = float(np.polyfit(lx, ly, 1)[0])
    out["all"]["loglog_pearson"] = float(np.corrcoef(lx, ly)[0, 1])
    out["trajectory level"] = trajectory_tracking(pools)
    return {"strata": out, "points": arr[:, :3]}


def trajectory_tracking(pools: Sequence[PromptPool]) -> dict[str, Any]:
    """What OTB's group weights see: per trajectory, the proxy energy W_T = Σ_t w_t against the true
    Σ_t ‖s_t‖² (OTB's target under orthogonal increments) and the true ‖Σ_t s_t‖² (the classic optimal
    baseline's weight). Spearman within each prompt's pool (the weights only compare group members),
    averaged over prompts."""
    a, b, c = [], [], []
    for pool in pools:
        prox = np.array([pool.proxy[i:j].sum() for i, j in pool.spans()])
        diag = np.array([np.trace(pool.gram[i:j, i:j]) for i, j in pool.spans()])
        seq = np.array([pool.gram[i:j, i:j].sum() for i, j in pool.spans()])
        a.append(spearman(prox, diag))
        b.append(spearman(prox, seq))
        c.append(spearman(diag, seq))
    return {
        "spearman_proxy_vs_sum_of_token_norms": float(np.nanmean(a)),
        "spearman_proxy_vs_sequence_norm": float(np.nanmean(b)),
        "spearman_sum_of_token_norms_vs_sequence_norm": float(np.nanmean(c)),
        "prompts": len(pools),
    }
