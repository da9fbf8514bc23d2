"""A recorded run's typed settings, its tokenizer, and the weights of each policy version."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from agentrl.errors import ConfigError, StoreError
from agentrl.models import resolve_model, resolve_tokenizer
from agentrl.replay import Run
from agentrl.run import RunDir
from agentrl.trainers.pg import TrainConfig, model_spec

__all__ = ["load_tokenizer_for", "load_weights", "train_config"]


def _run_dir(run: Run, what: str) -> RunDir:
    if run.run_dir is None:
        raise ConfigError(
            f"{run.path} is not a run directory (no config.json next to it); {what} needs the run's settings"
        )
    return run.run_dir


def train_config(run: Run) -> TrainConfig:
    """The run's settings (its ``config.json``) as the trainer's typed config."""
    return _run_dir(run, "this").read_config(TrainConfig)


def load_tokenizer_for(run: Run | None, path: str | os.PathLike[str] | None = None) -> Any | None:
    """The tokenizer of a run: ``path`` if given (a tokenizer or model folder, a checkpoint, ``smollm2``),
    else the newest checkpoint's, else the one its ``model`` setting names. None when nothing says which
    (a bare JSONL file)."""
    if path is not None:
        return resolve_tokenizer(path)
    if run is None or run.run_dir is None:
        return None
    latest = run.run_dir.latest_checkpoint()
    if latest is not None and (latest.model_dir / "tokenizer_config.json").is_file():
        return resolve_tokenizer(latest.model_dir)
    return resolve_tokenizer(_model_name(run))


def _model_name(run: Run) -> str:
    """The ``model`` setting of a training run, or of a gateway's recording folder (its own config)."""
    run_dir = _run_dir(run, "this")
    try:
        return train_config(run).model
    except ConfigError as first:
        from agentrl.trainers.gateway.cli import ServeConfig

        try:
            return run_dir.read_config(ServeConfig).model
        except ConfigError:
            raise first from None


def load_weights(
    run: Run, version: int, *, device: str | None = None, dtype: str | None = None
) -> tuple[Any, str]:
    """The policy weights of ``version`` (= after ``version`` training steps) as ``(model, description)``.

    ``checkpoints/step-N`` when it is on disk. Version 0 without a checkpoint is rebuilt from the run's
    ``model`` setting (``tiny`` is re-initialised with the run's seed; ``smollm2`` or a folder is loaded),
    exactly as the trainer built it. ``device``/``dtype`` override the run's. Raises :class:`StoreError`
    when the checkpoint was rotated away (the trainer keeps only the newest ``keep_checkpoints``).
    """
    if run.run_dir is None:
        raise StoreError(
            f"weights of policy version {version} are unknown: {run.trajectories_path} is not inside a run "
            "directory; pass a model folder (--model)"
        )
    cfg = train_config(run)
    spec = model_spec(cfg)
    spec = dataclasses.replace(spec, device=device or spec.device, dtype=dtype or spec.dtype)
    ckpt = run.run_dir.find_checkpoint(version)
    if ckpt is None and version == 0:
        loaded = resolve_model(spec, tokenizer=False)
        return loaded.model, f"initial weights ({loaded.source})"
    ckpt = run.run_dir.require_checkpoint(version, keep=cfg.keep_checkpoints)
    loaded = resolve_model(dataclasses.replace(spec, name=str(ckpt.path)), tokenizer=False)
    return loaded.model, loaded.source
