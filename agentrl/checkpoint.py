"""Checkpoints of a training run: model, optimizer, RNG states and the data position, written atomically.

Layout under a run directory (named by :class:`agentrl.run.RunDir`)::

    checkpoints/step-000003/   model (HF save_pretrained), optimizer.pt, rng.pt, state.json
    checkpoints/step-000006/   ...

``step-N`` holds the state *after* N completed training steps, so resuming from it runs step N next (steps
are 0-based). Each checkpoint is written to a temporary folder and renamed into place, so a kill at any moment
leaves either the old or the new checkpoint, never half of one. Finding checkpoints is
:meth:`RunDir.latest_checkpoint <agentrl.run.RunDir.latest_checkpoint>`'s job; this module reads and writes
their contents.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.errors import ConfigError, StoreError
from agentrl.run import Checkpoint, RunDir, checkpoint_step

__all__ = ["CheckpointState", "load_checkpoint", "save_checkpoint"]

_OPTIMIZER = "optimizer.pt"
_RNG = "rng.pt"


@dataclass(frozen=True, slots=True)
class CheckpointState:
    """What a checkpoint records besides tensors."""

    step: int
    """Completed training steps (the next step to run)."""
    policy_version: int
    """Version number of the weights (equals ``step`` for on-policy training)."""
    extra: dict[str, Any]
    """Trainer-specific JSON state (e.g. the data position)."""


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    run_dir: RunDir | str | os.PathLike[str],
    *,
    model: Any,
    optimizer: torch.optim.Optimizer | None,
    state: CheckpointState,
    tokenizer: Any = None,
    keep: int = 2,
) -> Checkpoint:
    """Write ``checkpoints/step-<N>`` atomically and keep only the newest ``keep`` checkpoints."""
    if keep < 1:
        raise ConfigError(f"keep must be >= 1, got {keep}")
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(Path(run_dir))
    ckpt = run.checkpoint(state.step)
    final = ckpt.path
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    staged = Checkpoint(state.step, tmp)
    model.save_pretrained(staged.model_dir, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(staged.model_dir)
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / _OPTIMIZER)
    torch.save(_rng_state(), tmp / _RNG)
    staged.state_path.write_text(
        json.dumps({"step": state.step, "policy_version": state.policy_version, "extra": state.extra})
    )
    _fsync_tree(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in run.checkpoints(complete=False)[:-keep]:
        shutil.rmtree(old.path, ignore_errors=True)
    return ckpt


def _fsync_tree(path: Path) -> None:
    for p in path.rglob("*"):
        if p.is_file():
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())


def load_checkpoint(
    path: Checkpoint | str | os.PathLike[str],
    *,
    model: Any = None,
    optimizer: torch.optim.Optimizer | None = None,
    restore_rng: bool = True,
) -> CheckpointState:
    """Load weights into ``model`` and state into ``optimizer`` (each optional); restore RNG states."""
    ckpt = path.path if isinstance(path, Checkpoint) else Path(path)
    found = Checkpoint(checkpoint_step(ckpt.name) or 0, ckpt)
    try:
        meta = json.loads(found.state_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise StoreError(f"{ckpt} is not a complete checkpoint: {e}") from e
    if model is not None:
        from safetensors.torch import load_file

        files = sorted(found.model_dir.glob("*.safetensors"))
        if not files:
            raise StoreError(f"{ckpt}/model has no safetensors weights")
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(f)))
        missing, unexpected = model.load_state_dict(state, strict=False)
        # Tied embeddings are saved once; a missing lm_head that is tied is not an error.
        missing = [k for k in missing if not (k.endswith("lm_head.weight") and _tied(model))]
        if missing or unexpected:
            raise StoreError(
                f"{ckpt}: weights do not fit the model (missing {missing}, unexpected {unexpected})"
            )
    if optimizer is not None:
        optimizer.load_state_dict(torch.load(ckpt / _OPTIMIZER, weights_only=False))
    if restore_rng:
        _set_rng_state(torch.load(ckpt / _RNG, weights_only=False))
    return CheckpointState(
        step=int(meta["step"]), policy_version=int(meta["policy_version"]), extra=meta["extra"]
    )


def _tied(model: Any) -> bool:
    cfg = getattr(model, "config", None)
    return bool(getattr(cfg, "tie_word_embeddings", False))
