"""The stability comparison of docs/reproduction.md §3.4: the stress setting with the constant and the
length-triggered learning-rate schedule, and the main setting with the length-triggered one.

    python experiments/otb_reproduction/stability_report.py [--work runs/otb-reproduction]

Reads the per-run JSON files of :mod:`train_tiny` (``rl/stress-lr``, ``rl/stress-lr-lt``, ``rl/main-lt``) and
the committed summary ``results/rl.json`` (the constant runs' 5-seed summaries, for seeds whose raw constant
run is not in ``--work``); writes ``results/stability.json``, ``docs/reproduction/stability-stress.png`` and
prints the markdown tables. A length-triggered run that never decayed its rate took exactly the constant
run's steps (the schedule only reads lengths until it fires), which the report checks against the committed
per-seed numbers where both exist.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import rl_report  # noqa: E402
import settings as S  # noqa: E402

ROOT = HERE.parents[1]
CONFIGS = [f"{e}-N{n}" for e, n in S.STRESS_CONFIGS]
ARMS = {"length_triggered": S.STRESS_LT}
"""Length-triggered settings compared with the constant stress runs."""


def _budget(setting: Any) -> Any:
    return lambda n: int(setting.token_budget * S.BUDGET_SCALE[n])


def collapse_step(run: dict[str, Any], k: int = 10) -> int | None:
    """First step of the first ``k`` steps in a row with training reward 0, after a ``k``-step mean above
    0.05 (the absorbing all-fail state); None when the run never gets there."""
    r = np.array([s["reward"] for s in run["steps"]])
    if len(r) < k:
        return None
    m = np.convolve(r, np.ones(k) / k, mode="valid")
    seen = False
    for i, v in enumerate(m):
        seen = seen or v > 0.05
        if seen and v == 0.0:
            return i
    return None


def length_before(run: dict[str, Any], step: int, k: int = 10) -> float:
    """Mean episode length of the ``k`` steps before ``step`` over that of the ``k`` before them: the
    schedule's own signal (window ``k``) just before the collapse."""
    L = np.array([s["model_tokens_per_episode"] for s in run["steps"]])
    if step < 2 * k:
        return float("nan")
    return float(L[step - k : step].mean() / L[step - 2 * k : step - k].mean())


def per_run(run: dict[str, Any]) -> dict[str, Any]:
    """What one run says about stability."""
    peak = max(c["success"] for c in run["curve"])
    final = run["curve"][-1]["success"]
    steps = run["steps"]
    cs = collapse_step(run)
    decays = [
        i for i, s in enumerate(steps) if i and s.get("lr_decays", 0) > steps[i - 1].get("lr_decays", 0)
    ]
    if steps and steps[0].get("lr_decays", 0) > 0:
        decays = [0, *decays]
    g = np.array([s["grad_norm"] for s in steps])
    ratios = np.array([s.get("lr_length_ratio", np.nan) for s in steps], dtype=float)
    pre = ratios[:cs]  # the whole run when it never collapsed (cs None)
    return {
        "seed": run["seed"],
        "steps": len(steps),
        "final": final,
        "peak": peak,
        "collapsed": bool(final < 0.5 * peak),
        "collapse_step": cs,
        "length_ratio_before_collapse": None if cs is None else length_before(run, cs),
        "max_length_ratio": float(np.nanmax(ratios)) if np.isfinite(ratios).any() else None,
        "max_length_ratio_before_collapse": float(np.nanmax(pre)) if np.isfinite(pre).any() else None,
        "decay_steps": decays,
        "final_lr": steps[-1].get("lr") if steps else None,
        "surge": rl_report._surge(g[np.isfinite(g)]),
        "first_flagged_step": next((i for i, s in enumerate(steps) if s.get("collapsed")), None),
        # Longest run of flagged (no-signal) steps before the collapse, and the run's total flagged steps: how
        # often the per-step flag fires in a healthy phase.
        "longest_silent_before_collapse": max(
            (s.get("silent_steps", 0) for s in steps[: cs if cs is not None else len(steps)]), default=0
        ),
        "flagged_steps": int(sum(bool(s.get("collapsed")) for s in steps)),
        "tokens_per_episode_first10": float(np.mean([s["model_tokens_per_episode"] for s in steps[:10]])),
        "tokens_per_episode_last10": float(np.mean([s["model_tokens_per_episode"] for s in steps[-10:]])),
    }


def boot_frac(x: np.ndarray, seed: int = 0) -> list[float]:
    """Mean of 0/1 outcomes with a 95 % percentile bootstrap interval over seeds."""
    return list(rl_report.boot_mean(x.astype(float), np.random.default_rng(seed)))


def first_decay(run: dict[str, Any], setting: Any) -> int | None:
    """The step at which ``setting``'s length-triggered schedule would first decay the rate, replayed on a
    constant run's recorded lengths (the schedule's only input); None when it never would. Until that step a
    length-triggered run takes exactly the constant run's steps, so when it is None the two runs are one."""
    from agentrl.learner.schedule import ScheduleState, observe_length

    state = ScheduleState()
    for k, s in enumerate(run["steps"]):
        out = observe_length(
            state,
            s["model_tokens_per_episode"],
            base_lr=setting.lr,
            step=k,
            schedule="length-triggered",
            window=setting.lr_window,
            trigger=setting.lr_trigger,
            decay=setting.lr_decay,
            floor=setting.lr_floor,
        )
        if out.triggered:
            return k
        state = out.state
    return None


def arm(
    const_runs: list[dict[str, Any]], lt_runs: list[dict[str, Any]], setting: Any
) -> tuple[list[dict[str, Any]], list[int]]:
    """The length-triggered arm per seed: its own run when one was trained, else the constant run of the
    seed when the schedule provably never fires on it; and the seeds that still need a run."""
    own = {r["seed"]: r for r in lt_runs}
    rows, missing = [], []
    for c in const_runs:
        fire = first_decay(c, setting)
        if c["seed"] in own:
            rows.append({**per_run(own[c["seed"]]), "source": "trained", "replayed_first_decay": fire})
        elif fire is None:
            rows.append({**per_run(c), "source": "constant run (the rule never fires on it)"})
        else:
            missing.append(c["seed"])
    return rows, missing


def same_as_committed(run: dict[str, Any], comm: dict[str, Any]) -> bool:
    """A rerun constant run equals the committed sweep's run of its seed: step count, tokens-to-target at
    every target and gradient-norm surge."""
    i = comm["seeds"].index(run["seed"])
    ok = len(run["steps"]) == comm["steps"][i]
    for tg, cell in comm["tokens_to_target"].items():
        t, _ = rl_report.tokens_to_target(run["curve"], float(tg), run["setting"]["token_budget"])
        ok = ok and abs(t - cell["per_seed"][i]) < 1e-6
    g = np.array([s["grad_norm"] for s in run["steps"]])
    return bool(ok and np.isclose(rl_report._surge(g[np.isfinite(g)]), comm["grad_norm_surge"][i]))


def summarize(work: Path, out: Path, arms: dict[str, Any]) -> dict[str, Any]:
    """Everything the stability section reports."""
    committed = json.loads((out / "rl.json").read_text())
    res: dict[str, Any] = {"stress": {}, "main": {}}
    const_raw = rl_report.load_runs(work / "rl", S.STRESS.name, _budget(S.STRESS))
    for label in CONFIGS:
        c_runs = const_raw.get(label, [])
        comm = committed["stress"]["configs"][label]
        const = [per_run(r) for r in c_runs]
        # The constant runs of this checkout against the committed sweep (same seeds, same code path).
        same = [same_as_committed(r, comm) for r in c_runs if r["seed"] in comm["seeds"]]
        cell: dict[str, Any] = {
            "committed_collapsed": comm["collapsed"],
            "rerun_matches_committed": same,
            "constant": const,
            "constant_collapsed": boot_frac(np.array([r["collapsed"] for r in const])),
            "constant_final": rl_report.boot_mean(
                np.array([r["final"] for r in const]), np.random.default_rng(1)
            ),
        }
        for name, setting in arms.items():
            lt_runs = rl_report.load_runs(work / "rl", setting.name, _budget(setting)).get(label, [])
            rows, missing = arm(c_runs, lt_runs, setting)
            cell[name] = {
                "runs": rows,
                "missing_seeds": missing,
                "collapsed": boot_frac(np.array([r["collapsed"] for r in rows])),
                "final": rl_report.boot_mean(np.array([r["final"] for r in rows]), np.random.default_rng(1)),
            }
        res["stress"][label] = cell
    main_const = rl_report.load_runs(work / "rl", S.MAIN.name, _budget(S.MAIN))
    main_lt = rl_report.load_runs(work / "rl", S.MAIN_LT.name, _budget(S.MAIN_LT))
    for label, runs in main_const.items():
        comm = committed["main"]["configs"][label]
        rows, missing = arm(runs, main_lt.get(label, []), S.MAIN_LT)
        per = []
        for r in runs:
            t, cens = rl_report.tokens_to_target(r["curve"], 0.7, r["setting"]["token_budget"])
            base = comm["tokens_to_target"]["0.7"]["per_seed"][comm["seeds"].index(r["seed"])]
            per.append({"seed": r["seed"], "tokens_to_0.7": t, "censored": cens, "committed": base})
        res["main"][label] = {"constant": per, "length_triggered": rows, "missing_seeds": missing}
    return res


def _fmt(x: Any, spec: str = ".2f") -> str:
    return "—" if x is None or (isinstance(x, float) and not np.isfinite(x)) else format(x, spec)


def markdown(res: dict[str, Any]) -> str:
    """The tables of docs/reproduction.md §3.4."""
    lines = [
        "| estimator | seeds | constant: collapsed | length-triggered: collapsed | decays fired "
        "| final success, constant | final success, length-triggered |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for label, c in res["stress"].items():
        lt = c["length_triggered"]
        seeds = ", ".join(str(r["seed"]) for r in c["constant"])
        n_c = sum(r["collapsed"] for r in c["constant"])
        n_l = sum(r["collapsed"] for r in lt["runs"])
        dec = sum(len(r["decay_steps"]) for r in lt["runs"])
        ci = lambda v: f"{v[0]:.2f} [{v[1]:.2f}, {v[2]:.2f}]"  # noqa: E731
        lines.append(
            f"| {label} | {seeds} | {n_c}/{len(c['constant'])} | {n_l}/{len(lt['runs'])}"
            f"{' (missing ' + str(lt['missing_seeds']) + ')' if lt['missing_seeds'] else ''} | {dec} "
            f"| {ci(c['constant_final'])} | {ci(lt['final'])} |"
        )
    lines += [
        "",
        "| run | steps | peak → final held-out | collapse starts at step | length ratio, 10 steps before "
        "it | largest length ratio before it (any step) | first/total no-signal steps "
        "| longest no-signal streak before collapse | tokens/episode, first → last 10 steps |",
        "|---|---:|---|---:|---:|---:|---|---:|---|",
    ]
    for label, c in res["stress"].items():
        for r in c["constant"]:
            lines.append(
                f"| {label} s{r['seed']} | {r['steps']} | {r['peak']:.2f} → {r['final']:.2f} "
                f"| {_fmt(r['collapse_step'], 'd')} | {_fmt(r['length_ratio_before_collapse'])} "
                f"| {_fmt(r['max_length_ratio_before_collapse'])} ({_fmt(r['max_length_ratio'])}) "
                f"| {_fmt(r['first_flagged_step'], 'd')}/{r['flagged_steps']} "
                f"| {r['longest_silent_before_collapse']:.0f} "
                f"| {r['tokens_per_episode_first10']:.1f} → {r['tokens_per_episode_last10']:.1f} |"
            )
    return "\n".join(lines)


def plot(work: Path, path: Path, trigger: float) -> None:
    """Per estimator (columns), one line per seed of the constant stress runs: held-out success, gradient
    norm and the length-triggered schedule's signal against the trigger (a length-triggered run that was
    trained because the rule fired is drawn dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    const = rl_report.load_runs(work / "rl", S.STRESS.name, _budget(S.STRESS))
    lt = rl_report.load_runs(work / "rl", S.STRESS_LT.name, _budget(S.STRESS_LT))
    fig, axes = plt.subplots(3, len(CONFIGS), figsize=(12, 7.5), dpi=100, sharex=True)
    for j, label in enumerate(CONFIGS):
        col = rl_report.COLORS[label]
        for runs, ls in ((const.get(label, []), "-"), (lt.get(label, []), "--")):
            for r in runs:
                xs = np.array([c["tokens"] for c in r["curve"]]) / 1e3
                axes[0, j].plot(xs, [c["success"] for c in r["curve"]], ls, color=col, lw=1, alpha=0.8)
                t = np.array([s["tokens"] for s in r["steps"]]) / 1e3
                g = np.array([s["grad_norm"] for s in r["steps"]])
                k = 5
                sm = np.maximum(np.convolve(g, np.ones(k) / k, mode="valid"), 1e-4)  # 0 drawn at 1e-4
                axes[1, j].plot(t[k - 1 :], sm, ls, color=col, lw=0.8, alpha=0.8)
                q = np.array([s.get("lr_length_ratio", np.nan) for s in r["steps"]], dtype=float)
                axes[2, j].plot(t, q, ls, color=col, lw=0.8, alpha=0.8)
                cs = collapse_step(r)
                if cs is not None:
                    for ax in axes[:, j]:
                        ax.axvline(t[cs], color=col, lw=0.6, ls=":")
        n = len(const.get(label, []))
        axes[0, j].set_title(f"{label}, stress, {n} seed(s) (dotted: collapse starts)", fontsize=9)
        axes[0, j].set_ylim(0, 1)
        axes[1, j].set_yscale("log")
        axes[1, j].set_ylim(5e-5, 10)
        axes[2, j].axhline(trigger, color="gray", lw=1, ls="--")
        axes[2, j].set_ylim(0.3, 1.6)
        axes[2, j].set_xlabel("generated model tokens (thousands)")
    axes[0, 0].set_ylabel("held-out success")
    axes[1, 0].set_ylabel("grad norm (5-step mean; 0 at 1e-4)")
    axes[2, 0].set_ylabel(f"length ratio (trigger {trigger})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "otb-reproduction")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--figs", type=Path, default=ROOT / "docs" / "reproduction")
    a = ap.parse_args(argv)
    res = summarize(a.work, a.out, ARMS)
    (a.out / "stability.json").write_text(json.dumps(res, indent=1, default=float) + "\n")
    plot(a.work, a.figs / "stability-stress.png", S.STRESS_LT.lr_trigger)
    print(markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
