"""The learner core: the one place a training step happens, wrapped by both runtimes.

::

    LearnerCore(cfg, rank, world)   model, LoRA, precision, FSDP2 when world > 1, the Learner
      .load(run)                    the newest checkpoint's weights, optimizer and stability state → its step
      .update(step, groups)         stability schedule → policy_update → the step's scores → the warning
      .state_to_publish()           what the samplers load after the step (the adapter alone with LoRA)
      .save(run, step, keep=…)      checkpoints/step-<step>: weights, optimizer, RNG, stability state

:class:`~agentrl.trainers.local.LocalRuntime` calls it in-process (``update`` in a worker thread);
:class:`~agentrl.trainers.ray.learner.LearnerActor` is one rank of it on a Ray actor. Every
world-size branch (the process group, FSDP2's gathers, rank 0 alone writing) is in here, so a change to the
learner step is one edit and both runtimes train the same way (``tests/trainers/test_learner_core.py``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from agentrl.chat import ChatRenderer
from agentrl.checkpoint import CheckpointState, load_checkpoint, save_checkpoint
from agentrl.groups import TrajectoryGroup
from agentrl.heap import trim_heap
from agentrl.learner import Learner, wrap_fsdp
from agentrl.learner.stability import StabilityState, StepInputs, begin_step, stability_at, stability_extra
from agentrl.lora import Adapted, apply_lora, published_state
from agentrl.lora_sync import adapter_params
from agentrl.models import resolve_model
from agentrl.run import RunDir
from agentrl.scores import save_step_scores
from agentrl.trainers import factories
from agentrl.update import policy_update

if TYPE_CHECKING:
    from agentrl.precision import Precision
    from agentrl.trainers.train_config import ResolvedRun, TrainConfig

__all__ = ["LearnerCore"]


class LearnerCore:
    """One rank of the learner (``world`` = 1: the whole learner). Building it loads the model; with
    ``world`` > 1 it joins the process group at ``master`` and shards the model with FSDP2 (collective calls:
    :meth:`update`, :meth:`state_to_publish` and :meth:`save` must then run on every rank)."""

    def __init__(
        self,
        cfg: TrainConfig,
        *,
        rank: int = 0,
        world: int = 1,
        master: tuple[str, int] | None = None,
        resolved: ResolvedRun | None = None,
    ):
        self.cfg, self.rank, self.world = cfg, rank, world
        torch.manual_seed(cfg.seed)
        loaded = resolve_model(factories.model_spec(cfg))
        self.device = loaded.device
        self.precision: Precision = factories.precision(cfg, loaded.device)
        if rank == 0:
            warning = self.precision.warning()
            if warning is not None:
                print(warning, file=sys.stderr)
            if self.precision.autocast or self.precision.pure_low_precision:
                print(f"precision: {self.precision.describe()}")
        self.model: Any = loaded.model
        """The learner's model (with LoRA: the adapted model; with ``world`` > 1: FSDP2's sharded one)."""
        self.tokenizer = loaded.tokenizer
        self.renderer = ChatRenderer(loaded.tokenizer)
        self.adapted: Adapted | None = None
        """The LoRA adapters when ``--lora.rank`` > 0 (published and checkpointed alone)."""
        lora = cfg.weights.lora
        if lora.enabled:  # adapters in place, before FSDP shards the model: the optimizer holds only them
            self.adapted = apply_lora(self.model, lora, name=cfg.model, seed=cfg.seed)
            if rank == 0:
                base = self.adapted.base.describe()
                print(f"lora: rank {lora.rank} on {base}, {adapter_params(self.model)}")
        self.pad_id = factories.tokenizer_pad_id(self.renderer)
        if world > 1:
            import torch.distributed as dist

            if master is None:
                raise ValueError(f"a learner group of {world} ranks needs rank 0's address (master)")
            os.environ.update(MASTER_ADDR=master[0], MASTER_PORT=str(master[1]))
            dist.init_process_group(
                "nccl" if self.device.type == "cuda" else "gloo", rank=rank, world_size=world
            )
            # FSDP2's mixed-precision policy: bf16 compute over fp32 master shards, fp32 gradient reduction.
            self.model = wrap_fsdp(self.model, bf16=self.precision.autocast)
        # The sizes the run resolved for its device (a resume keeps its run's; None: the config's own).
        settings = factories.learner_config(cfg, self.precision, resolved, fsdp=world > 1)
        self.learner = Learner(self.model, settings)
        self.stability = StabilityState()
        """The lr schedule's and the collapse check's state after the last update (checkpointed)."""
        self.run: RunDir | None = None
        """Where the step scores go (set by :meth:`load`)."""
        self.resumed_from: Path | None = None
        """The checkpoint :meth:`load` found (None for a new run)."""

    def load(self, run: RunDir) -> int:
        """Load ``run``'s newest checkpoint (weights, optimizer, RNG, stability state); its step, 0 when the
        run has none."""
        self.run = run
        ckpt = run.latest_checkpoint()
        if ckpt is None:
            self.stability = StabilityState()
            return 0
        if self.world > 1:
            step = self._load_sharded(ckpt)
        else:
            if self.adapted is not None:
                self.adapted.load_adapter(ckpt.model_dir)  # refuses an adapter trained on another base
            weights = None if self.adapted is not None else self.model
            step = load_checkpoint(ckpt, model=weights, optimizer=self.learner.optimizer).step
        self.stability = stability_at(run, step)
        self.resumed_from = ckpt.path
        return step

    def update(self, step: int, groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
        """Train step ``step`` on this rank's ``groups`` (tokens sampled by older versions get the off-policy
        correction): the stability schedule sets the rate (on the whole step's episodes: every rank agrees),
        :func:`~agentrl.update.policy_update`, the learner's scores of the step to the run (one rank: replay
        has them once the checkpoint is rotated away), the collapse warning. Returns the step's metrics."""
        trim_heap()  # the rollout's freed KV and packed weights: give them back before the update's peak
        inputs = StepInputs.of(groups)
        if self.world > 1:
            import torch.distributed as dist

            parts: list[Any] = [None] * self.world
            dist.all_gather_object(parts, inputs)
            inputs = StepInputs.merge(parts)
        stab = begin_step(self.cfg.learner, self.learner.optimizer, self.stability, inputs, step=step)
        update = policy_update(
            self.learner,
            groups,
            estimator=self.cfg.estimator,
            pad_id=self.pad_id,
            correction=self.cfg.async_.correction,
            learner_version=step,
        )
        if self.world == 1 and self.run is not None:
            c = update.credit
            save_step_scores(self.run, step, groups, c.logprobs_B_T, c.sum_pi_squared_B_T)
        self.stability = stab.state
        if update.metrics["learn/zero_advantage_skip"] and self.rank == 0:
            # stderr, with the other notices of a step: stdout's "step k:" lines are the metric rows
            print(
                f"step {step}: every advantage is zero (no reward differs from its baseline); update skipped",
                file=sys.stderr,
                flush=True,
            )
        warning = stab.warning(step)
        if warning is not None and self.rank == 0:
            print(warning, file=sys.stderr, flush=True)
        # The update's freed autograd and optimizer temporaries stay resident in glibc's heaps; the next
        # rollout rebuilds the packed weights and KV on top of them (the default run's peak phase).
        trim_heap()
        return {**update.metrics, **stab.metrics}

    def state_to_publish(self) -> dict[str, Any]:
        """The weights the samplers load after a step: every tensor, or the adapter alone with LoRA (the
        servers hold the base). With ``world`` > 1 a collective: every rank gets the full tensors on CPU."""
        return published_state(self.model if self.world == 1 else _StateOnly(self._full_state()))

    def release_optimizer_state(self) -> None:
        """No update follows (the last checkpoint holds the AdamW moments, twice the weights): free them, so
        the trained evaluation stays under the run's memory budget."""
        self.learner.release_optimizer_state()
        trim_heap()

    def save(self, run: RunDir, step: int, *, keep: int) -> None:
        """Write ``checkpoints/step-<step>``: weights after ``step`` steps, optimizer, RNG and the stability
        state (rank 0 writes; with ``world`` > 1 every rank joins the gathers)."""
        state = CheckpointState(step, step, stability_extra(self.stability))
        if self.world == 1:
            save_checkpoint(
                run,
                model=self.adapted if self.adapted is not None else self.model,
                optimizer=self.learner.optimizer,
                tokenizer=self.tokenizer,
                state=state,
                keep=keep,
                older=self.cfg.output.older_checkpoints,
            )
            return
        import torch.distributed as dist
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        full = self._full_state()
        optim = get_optimizer_state_dict(
            self.model,
            self.learner.optimizer,
            options=StateDictOptions(full_state_dict=True, cpu_offload=True),
        )
        if self.rank == 0:
            save_checkpoint(
                run,
                model=_Plain(self.cfg, full),
                optimizer=cast(Any, _Saved(optim)),  # a saved state, not a live optimizer
                tokenizer=self.tokenizer,
                state=state,
                keep=keep,
                older=self.cfg.output.older_checkpoints,
            )
        dist.barrier()

    def shutdown(self) -> None:
        """Leave the process group (``world`` > 1)."""
        if self.world > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()

    def _full_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # A collective: every rank takes part; each gets the full tensors on CPU.
        return dict(
            get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        )

    def _load_sharded(self, ckpt: Any) -> int:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        plain = _plain_model(self.cfg)
        if self.cfg.weights.lora.enabled:
            apply_lora(plain, self.cfg.weights.lora, name=self.cfg.model, seed=self.cfg.seed).load_adapter(
                ckpt.model_dir
            )
            step = load_checkpoint(ckpt).step
        else:
            step = load_checkpoint(ckpt, model=plain).step
        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
        set_model_state_dict(self.model, plain.state_dict(), options=opts)
        optim = torch.load(ckpt.optimizer_path, weights_only=False)
        set_optimizer_state_dict(self.model, self.learner.optimizer, optim, options=opts)
        return step


def _plain_model(cfg: TrainConfig) -> Any:
    return resolve_model(factories.model_spec(cfg), tokenizer=False).model


class _Plain:
    """An unsharded copy of the model holding ``state`` (for ``save_pretrained``; with LoRA, the adapter)."""

    def __init__(self, cfg: TrainConfig, state: dict[str, Any]):
        self.model = _plain_model(cfg)
        self.saver: Any = self.model
        if cfg.weights.lora.enabled:
            self.saver = apply_lora(self.model, cfg.weights.lora, name=cfg.model, seed=cfg.seed)
        self.model.load_state_dict(state)

    def save_pretrained(self, *args: Any, **kwargs: Any) -> None:
        self.saver.save_pretrained(*args, **kwargs)


class _StateOnly:
    """A gathered state dict where :func:`agentrl.lora.published_state` expects a model."""

    def __init__(self, state: dict[str, Any]):
        self._state = state

    def state_dict(self) -> dict[str, Any]:
        return self._state


class _Saved:
    """An optimizer's state dict already gathered (what ``save_checkpoint`` asks of an optimizer)."""

    def __init__(self, state: dict[str, Any]):
        self._state = state

    def state_dict(self) -> dict[str, Any]:
        return self._state
