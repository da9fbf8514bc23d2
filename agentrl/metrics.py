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
                self._tb = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))
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
    "time": ("time/rollout_s", "time/learn_s"),
}
"""One PNG per group; a metric missing from the run is skipped."""


def plot_run(run_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Write one PNG per metric group of :data:`PLOT_GROUPS` that has data; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    if not rows:
        raise StoreError(f"{run_dir}/metrics.jsonl has no steps yet")
    out = Path(out_dir) if out_dir is not None else Path(run_dir) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, keys in PLOT_GROUPS.items():
        series = {
            k: [(r["step"], r[k]) for r in rows if isinstance(r.get(k), int | float)]
            for k in keys
            if any(isinstance(r.get(k), int | float) for r in rows)
        }
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for k, pts in series.items():
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, marker="o", label=k)
        ax.set_xlabel("step")
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
