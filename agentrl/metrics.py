"""Per-step metrics: ``metrics.jsonl`` (one line per training step), optional TensorBoard / W&B, PNG plots."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError, StoreError
from agentrl.run import RunDir

__all__ = ["PLOT_GROUPS", "MetricsLogger", "plot_run", "read_metrics"]


class MetricsLogger:
    """Append one JSON line per step to ``<run>/metrics.jsonl``; mirror to TensorBoard/W&B when asked.

    ``backends`` may contain ``"tensorboard"`` and ``"wandb"``; each is used only if its package imports,
    otherwise a ConfigError says what to install (asking for a logger and silently not getting it would be a
    silent no-op).
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, backends: Sequence[str] = (), config: Any = None):
        self.path = RunDir(Path(run_dir)).metrics_path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tb = None
        self._wandb = None
        for name in backends:
            if name == "tensorboard":
                try:
                    from torch.utils.tensorboard import SummaryWriter
                except ImportError as e:
                    raise ConfigError("tensorboard logging needs `pip install tensorboard`") from e
                self._tb = SummaryWriter(log_dir=str(RunDir(Path(run_dir)).tensorboard_path))
            elif name == "wandb":
                try:
                    import wandb
                except ImportError as e:
                    raise ConfigError("W&B logging needs `pip install wandb`") from e
                self._wandb = wandb.init(dir=str(run_dir), config=config, resume="allow")
            else:
                raise ConfigError(f"unknown metrics backend {name!r}; use 'tensorboard' or 'wandb'")

    def truncate_from(self, step: int) -> None:
        """Drop lines of ``step`` and later (a resumed run redoes them; no step is logged twice)."""
        if not self.path.exists():
            return
        keep = [r for r in read_metrics(self.path.parent) if r.get("step", -1) < step]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
        os.replace(tmp, self.path)

    def log(self, step: int, metrics: Mapping[str, float | int]) -> None:
        """Write one line ``{"step": step, **metrics}``; non-finite values are stored as null."""
        clean = {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in metrics.items()}
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"step": step, **clean}) + "\n")
            fh.flush()
        if self._tb is not None:
            for k, v in clean.items():
                if isinstance(v, int | float):
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(dict(clean), step=step)

    def close(self) -> None:
        """Flush and close the TensorBoard writer, if one is open."""
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_metrics(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All step records of a run (a torn last line is skipped)."""
    path = RunDir(Path(run_dir)).metrics_path
    if not path.exists():
        raise StoreError(f"{path} does not exist; is {run_dir} a run directory?")
    rows: list[dict[str, Any]] = []
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                break
            raise StoreError(f"{path}:{i + 1}: corrupt metrics line: {e}") from e
    return rows


PLOT_GROUPS: dict[str, tuple[str, ...]] = {
    "reward": ("reward/mean", "reward/pass_rate"),
    "lengths": ("tokens/model_per_episode", "tokens/observation_per_episode"),
    "tools": ("tools/calls_per_episode", "tools/errors_per_episode"),
    "grad_norm": ("learn/grad_norm",),
    "variance": (
        "variance/proxy1_signal_strength",
        "variance/proxy2_total_power",
        "variance/proxy3_pure_noise",
    ),
    # An asynchronous run's time/rollout_s is the learner's wait for data (0 when generation overlapped
    # learning); time/generate_s is the generation that happened.
    "time": ("time/rollout_s", "time/generate_s", "time/learn_s"),
    "staleness": ("staleness/max", "staleness/mean", "staleness/stale_token_frac"),
    "correction": (
        "correction/rho_mean",
        "correction/rho_min",
        "correction/clip_frac",
        "correction/corrected_token_frac",
    ),
}
"""One PNG per group; a metric missing from the run is skipped (a synchronous run has no staleness)."""

_ALWAYS_PLOTTED = frozenset({"reward", "grad_norm"})
"""Groups drawn even when every value is 0 (a run that earns nothing, or learns nothing, shows it)."""

_STYLES = (("o", "-"), ("s", "--"), ("^", ":"), ("D", "-."))
"""Marker and line style per line of a plot: lines that coincide (reward/mean and pass_rate with 0/1
rewards) stay distinguishable."""


def plot_run(
    run_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str] | None = None,
    *,
    skipped: list[str] | None = None,
) -> list[Path]:
    """Write one PNG per metric group of :data:`PLOT_GROUPS` that has data, and ``held_out.png`` when the
    run has its evaluation (``eval.json``); return their paths. A group whose every value is 0 (staleness in
    a synchronous run, tool calls of an env without tools) is not drawn as a flat line: its name goes to
    ``skipped`` when given. Rewards and the gradient norm are always drawn: their zeros are the finding."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows = read_metrics(run_dir)
    if not rows:
        raise StoreError(f"{run_dir}/metrics.jsonl has no steps yet")
    out = Path(out_dir) if out_dir is not None else RunDir(Path(run_dir)).plots_path
    out.mkdir(parents=True, exist_ok=True)
    written = []
    # Synchronous and asynchronous rows have the same keys: no plot branches on which one the run was. In
    # lock step the learner's wait for data is the whole generation; overlapping, only what was not hidden.
    labels = {"time/rollout_s": "time/rollout_s (learner's wait for data)"}
    for name, keys in PLOT_GROUPS.items():
        series = {
            k: [(r["step"], r[k]) for r in rows if isinstance(r.get(k), int | float)]
            for k in keys
            if any(isinstance(r.get(k), int | float) for r in rows)
        }
        if not series:
            continue
        if name not in _ALWAYS_PLOTTED and all(y == 0 for pts in series.values() for _, y in pts):
            if skipped is not None:
                skipped.append(name)
            continue
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for i, (k, pts) in enumerate(series.items()):
            xs, ys = zip(*pts, strict=True)
            marker, line = _STYLES[i % len(_STYLES)]
            # Later lines are drawn smaller and hollow, so one on top of another leaves both visible.
            ax.plot(
                xs,
                ys,
                marker=marker,
                linestyle=line,
                markersize=7 - 1.5 * i,
                fillstyle="full" if i == 0 else "none",
                label=labels.get(k, k),
            )
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        ax.set_xlabel("step")
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    held_out = _plot_eval(Path(run_dir), out, plt)
    if held_out is not None:
        written.append(held_out)
    return written


def _plot_eval(run_dir: Path, out: Path, plt: Any) -> Path | None:
    """pass@1 of the untrained and trained policy with their 95 % intervals, from ``eval.json``."""
    path = RunDir(run_dir).eval_path
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        reports = [(label, data[label]) for label in ("untrained", "trained")]
        values = [float(r["pass_at_1"]) for _, r in reports]
        lows = [float(r["pass_at_1_low"]) for _, r in reports]
        highs = [float(r["pass_at_1_high"]) for _, r in reports]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise StoreError(f"{path} is not an evaluation this version can read: {e}") from e
    split = reports[1][1].get("split")
    title = f"held-out pass@1 ({split} split)" if split else "pass@1 (all tasks, no test split)"
    fig, ax = plt.subplots(figsize=(4, 3.5))
    errors = [
        [max(v - lo, 0.0) for v, lo in zip(values, lows, strict=True)],
        [max(hi - v, 0.0) for v, hi in zip(values, highs, strict=True)],
    ]
    ax.errorbar([0, 1], values, yerr=errors, fmt="o", capsize=6)
    ax.set_xticks([0, 1], [label for label, _ in reports])
    ax.set_xlim(-0.5, 1.5)
    ax.set_ylim(-0.05, 1.05)
    tasks = reports[1][1].get("tasks")
    ax.set_title(f"{title}\n{tasks} tasks, 95% interval", fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    png = out / "held_out.png"
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png
