"""Checkpoints of a training run: model, optimizer, RNG states and the data position, written atomically.

Layout under a run directory (named by :class:`agentrl.run.RunDir`)::

    checkpoints/step-000003/   model (HF save_pretrained), rng.pt, state.json                older: for replay
    checkpoints/step-000006/   model (HF save_pretrained), optimizer.pt, rng.pt, state.json  newest: resume

Only the newest checkpoint is ever resumed from, so only it keeps the optimizer state (two moments per
weight: twice the weights' size). When a newer one is in place, each older one is *compacted*
(:func:`compact_checkpoint`): its optimizer state is deleted, keeping the weights replay needs to re-score the
episodes that version sampled — bit for bit with ``older="exact"`` (the default: a third of the full size).
``older="half"`` also rewrites float32 weights as float16 (a sixth), at a measured cost: after training,
SmolLM2's replayed log-probs move by up to ~1 (docs/checkpoints.md); a tensor that does not fit float16's
range stays float32, and bfloat16 weights (training on a GPU) stay as they are, exactly.
``older="whole"`` keeps everything (any kept checkpoint can be resumed). ``state.json`` records what
compaction did under ``"compact"``; loaders upcast half-precision weights to the model's dtype, so readers
from before compaction existed read compacted checkpoints too.

``step-N`` holds the state *after* N completed training steps, so resuming from it runs step N next (steps
are 0-based). Each checkpoint is written to a temporary folder and renamed into place, so a kill at any moment
leaves either the old or the new checkpoint, never half of one. Finding checkpoints is
:meth:`RunDir.latest_checkpoint <agentrl.run.RunDir.latest_checkpoint>`'s job; this module reads and writes
their contents.
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import torch

from agentrl.errors import ConfigError, StoreError
from agentrl.run import Checkpoint, RunDir, checkpoint_step

_T = TypeVar("_T")

__all__ = [
    "CheckpointContents",
    "CheckpointState",
    "OlderCheckpoints",
    "compact_checkpoint",
    "describe_checkpoint",
    "load_checkpoint",
    "save_checkpoint",
]

_FP16_MAX = 65504.0

OlderCheckpoints = Literal["exact", "half", "whole"]
"""What checkpoints other than the newest keep: ``exact`` (the weights as trained, no optimizer state),
``half`` (float16 weights, no optimizer state) or ``whole`` (everything, as the newest)."""


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
    older: OlderCheckpoints = "exact",
) -> Checkpoint:
    """Write ``checkpoints/step-<N>`` atomically, keep only the newest ``keep`` checkpoints and compact the
    older ones as ``older`` says (see :func:`compact_checkpoint`)."""
    if keep < 1:
        raise ConfigError(f"keep must be >= 1, got {keep}")
    if older not in ("half", "exact", "whole"):
        raise ConfigError(f"older must be 'half', 'exact' or 'whole', got {older!r}")
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
        torch.save(optimizer.state_dict(), staged.optimizer_path)
    torch.save(_rng_state(), staged.rng_path)
    staged.state_path.write_text(
        json.dumps({"step": state.step, "policy_version": state.policy_version, "extra": state.extra})
    )
    _fsync_tree(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    on_disk = run.checkpoints(complete=False)
    for old in on_disk[:-keep]:
        shutil.rmtree(old.path, ignore_errors=True)
    if older != "whole":
        # Only after the new checkpoint is in place: a crash before this leaves an extra whole checkpoint.
        for prev in on_disk[-keep:]:
            if prev.step < ckpt.step and prev.complete:
                compact_checkpoint(prev, half=older == "half")
    return ckpt


@dataclass(frozen=True, slots=True)
class CheckpointContents:
    """What a checkpoint folder holds, read from its files."""

    weights_dtype: str
    """dtype of its floating-point weights as stored (``float32``, ``float16``; ``a+b`` when mixed)."""
    trained_dtype: str
    """dtype the weights had when trained (differs from :attr:`weights_dtype` after a ``half`` compaction)."""
    optimizer: bool
    """It holds the optimizer state, so training can resume from it."""

    @property
    def exact(self) -> bool:
        """Its weights are the trained ones bit for bit (no half-precision rounding)."""
        return self.weights_dtype == self.trained_dtype

    def describe(self) -> str:
        """A short phrase for reports: ``float16 copy of float32 weights, no optimizer state``."""
        w = (
            f"{self.weights_dtype} weights"
            if self.exact
            else f"{self.weights_dtype} copy of {self.trained_dtype} weights"
        )
        return w + ("" if self.optimizer else ", no optimizer state")


def describe_checkpoint(ckpt: Checkpoint) -> CheckpointContents:
    """The stored and trained dtype of a checkpoint's weights and whether it holds optimizer state."""
    from safetensors import safe_open

    dtypes: set[str] = set()
    for f in sorted(ckpt.model_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():  # noqa: SIM118 - safe_open is not a mapping
                dt = fh.get_slice(key).get_dtype()
                if dt.startswith(("F", "BF")):
                    dtypes.add({"F32": "float32", "F16": "float16", "BF16": "bfloat16"}.get(dt, dt.lower()))
    stored = "+".join(sorted(dtypes)) or "none"
    try:
        meta = json.loads(ckpt.state_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise StoreError(f"{ckpt.path} is not a complete checkpoint: {e}") from e
    compact = meta.get("compact") or {}
    trained = str(compact.get("trained_dtype", stored))
    return CheckpointContents(stored, trained, ckpt.optimizer_path.is_file())


def compact_checkpoint(ckpt: Checkpoint, *, half: bool = True) -> CheckpointContents:
    """Delete a checkpoint's optimizer state and, with ``half``, store its float32 weights as float16.

    Idempotent and safe to interrupt: ``state.json`` records the compaction first, each weights file is
    replaced atomically, and running it again finishes the job. A float32 tensor with values beyond
    float16's range (or non-finite ones) is kept as float32.
    """
    before = describe_checkpoint(ckpt)
    meta = json.loads(ckpt.state_path.read_text())
    if "compact" not in meta:
        meta["compact"] = {"half": half, "trained_dtype": before.weights_dtype, "optimizer": False}
        tmp = ckpt.state_path.with_name(f".state.json.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, ckpt.state_path)
    if half:
        for f in sorted(ckpt.model_dir.glob("*.safetensors")):
            _halve(f)
    ckpt.optimizer_path.unlink(missing_ok=True)
    return describe_checkpoint(ckpt)


def _halve(path: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    changed = False
    for k, t in tensors.items():
        fits = t.numel() == 0 or (bool(torch.isfinite(t).all()) and float(t.abs().max()) <= _FP16_MAX)
        if t.dtype == torch.float32 and fits:
            tensors[k] = t.to(torch.float16)
            changed = True
    if not changed:
        return
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, path)


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
            state.update(_read(f, "safetensors weights", functools.partial(load_file, str(f))))
        missing, unexpected = model.load_state_dict(state, strict=False)
        # Tied embeddings are saved once; a missing lm_head that is tied is not an error.
        missing = [k for k in missing if not (k.endswith("lm_head.weight") and _tied(model))]
        if missing or unexpected:
            raise StoreError(
                f"{ckpt}: weights do not fit the model (missing {missing}, unexpected {unexpected})"
            )
    if optimizer is not None:
        if not found.optimizer_path.is_file():
            raise StoreError(
                f"{ckpt} has no optimizer state, so training cannot resume from it: only a run's newest "
                "checkpoint keeps it (older ones are compacted for replay; --older-checkpoints whole keeps "
                "every one resumable)"
            )
        opt_path = found.optimizer_path
        optimizer.load_state_dict(
            _read(opt_path, "optimizer state", lambda: torch.load(opt_path, weights_only=False))
        )
    if restore_rng:
        rng_path = found.rng_path
        _set_rng_state(_read(rng_path, "RNG state", lambda: torch.load(rng_path, weights_only=False)))
    return CheckpointState(
        step=int(meta["step"]), policy_version=int(meta["policy_version"]), extra=meta["extra"]
    )


def _read(path: Path, what: str, load: Callable[[], _T]) -> _T:
    """``load()``, with a damaged file (truncated by a full disk, overwritten) reported as a
    :class:`StoreError` that names it, not as the reader library's own exception."""
    try:
        return load()
    except Exception as e:
        raise StoreError(
            f"{path} is damaged and cannot be read as {what} ({type(e).__name__}: {e}); resume from an "
            "older checkpoint of the run, or delete this one"
        ) from e


def _tied(model: Any) -> bool:
    cfg = getattr(model, "config", None)
    return bool(getattr(cfg, "tie_word_embeddings", False))
