"""A recorded run's typed settings, its tokenizer, and the weights of each policy version."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from agentrl.checkpoint import describe_checkpoint
from agentrl.errors import ConfigError, StoreError
from agentrl.models import resolve_model, resolve_tokenizer
from agentrl.replay import Run
from agentrl.run import RunDir
from agentrl.tokenizer_id import TokenizerInfo
from agentrl.trainers.factories import model_spec
from agentrl.trainers.train_config import TrainConfig

__all__ = ["exact_weights", "find_tokenizer", "load_tokenizer_for", "load_weights", "train_config"]


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
    """The tokenizer of a run or trajectory file (see :func:`find_tokenizer`; None when nothing says)."""
    return find_tokenizer(run, path)[0]


def find_tokenizer(run: Run | None, path: str | os.PathLike[str] | None = None) -> tuple[Any | None, str]:
    """``(tokenizer, which)``: the tokenizer of recorded trajectories and a phrase saying where it came from.

    In order: ``path`` when given (a tokenizer or model folder, a checkpoint, ``smollm2``; a mismatch with
    the fingerprint the trajectories record is said in ``which``); the tokenizer the trajectories name,
    loaded by its recorded name or — when that folder is gone — found among the run's checkpoint, its
    ``model`` setting and ``smollm2`` by its fingerprint; for files from before tokenizers were recorded,
    the run's newest checkpoint's, else its ``model`` setting's. ``(None, why)`` when nothing says which.
    """
    recorded = _recorded_tokenizer(run)
    if path is not None:
        tok = resolve_tokenizer(path)
        if recorded is not None and not recorded.matches(tok):
            return tok, (
                f"{path} (--tokenizer), which does NOT match the recorded tokenizer {recorded.name} "
                f"({recorded.fingerprint})"
            )
        return tok, f"{path} (--tokenizer)"
    run_names = _run_tokenizer_names(run)
    if recorded is not None:
        for name in (recorded.name, *run_names, "smollm2"):
            try:
                tok = resolve_tokenizer(name)
            except (ConfigError, StoreError, OSError, ValueError):
                continue
            if recorded.matches(tok):
                how = "" if name == recorded.name else f", found as {name}"
                return tok, f"{recorded.name} (recorded with the trajectories, fingerprint matches{how})"
        return None, (
            f"the trajectories name tokenizer {recorded.name} ({recorded.fingerprint}), which is not on this "
            "machine; pass --tokenizer"
        )
    if run_names:
        name = run_names[0]
        return resolve_tokenizer(name), f"{name} (the run's; the trajectories name no tokenizer)"
    return None, "the trajectories name no tokenizer and are not in a run directory; pass --tokenizer"


def _recorded_tokenizer(run: Run | None) -> TokenizerInfo | None:
    if run is None:
        return None
    infos = {t.tokenizer for t in run.trajectories if t.tokenizer is not None}
    if len(infos) > 1:
        raise ConfigError(
            f"{run.trajectories_path} mixes trajectories of {len(infos)} tokenizers "
            f"({', '.join(sorted(i.fingerprint for i in infos))}); replay them separately"
        )
    return infos.pop() if infos else None


def _run_tokenizer_names(run: Run | None) -> list[str]:
    """The run's own tokenizer sources: its newest checkpoint's, else its ``model`` setting's."""
    if run is None or run.run_dir is None:
        return []
    latest = run.run_dir.latest_checkpoint()
    if latest is not None and (latest.model_dir / "tokenizer_config.json").is_file():
        return [str(latest.model_dir)]
    return [_model_name(run)]


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
        if (
            cfg.weights.lora.enabled
        ):  # the base plus the seeded initial adapter, exactly as the trainer built them
            from agentrl.lora import apply_lora

            apply_lora(loaded.model, cfg.weights.lora, name=cfg.model, seed=cfg.seed)
            return (
                loaded.model,
                f"initial weights ({loaded.source}) with a fresh rank-{cfg.weights.lora.rank} adapter",
            )
        return loaded.model, f"initial weights ({loaded.source})"
    ckpt = run.run_dir.require_checkpoint(version, keep=cfg.output.keep_checkpoints)
    loaded = resolve_model(dataclasses.replace(spec, name=str(ckpt.path)), tokenizer=False)
    contents = describe_checkpoint(ckpt)
    if not contents.exact:  # an older checkpoint compacted to float16: say so wherever the weights are named
        return loaded.model, f"{loaded.source} ({contents.weights_dtype} copy of {contents.trained_dtype})"
    return loaded.model, loaded.source


def exact_weights(run: Run, version: int) -> bool:
    """Whether replay has the weights of ``version`` bit for bit (the rebuilt initial weights, or a checkpoint
    that was not compacted to float16); False also when the checkpoint is not on disk."""
    if run.run_dir is None:
        return False
    ckpt = run.run_dir.find_checkpoint(version)
    if ckpt is None:
        return version == 0
    return describe_checkpoint(ckpt).exact
