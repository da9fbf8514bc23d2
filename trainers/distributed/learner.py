"""The learner group: one or more learner actors in a placement group (``learner`` resources).

With one learner the actor is the single-process trainer's learner, unchanged (same model, same
:func:`~agentrl.update.policy_update`), so a Ray run with one learner trains exactly like a local one. With
``N > 1`` the actors form a ``torch.distributed`` process group (gloo on CPU, NCCL on GPU) and shard the
model with FSDP2 (:func:`agentrl.learner.wrap_fsdp`); each rank takes whole groups of the batch (the
estimators' baselines stay within a group) and the learner's normalisers are reduced over ranks. Publishing
and checkpointing gather the full state dict on every rank; rank 0 writes it.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from agentrl.groups import TrajectoryGroup
from agentrl.run import RunDir
from agentrl.trainers.distributed.weights import WeightRef, WeightTransport

if TYPE_CHECKING:
    from agentrl.trainers.train_setup import TrainConfig

__all__ = ["LearnerActor", "free_port", "shard_groups"]


def free_port() -> int:
    """A TCP port free on this host now (for the process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def shard_groups(groups: Sequence[TrajectoryGroup], ranks: int) -> list[list[TrajectoryGroup]]:
    """Whole groups dealt round-robin to ``ranks`` shards (a group never spans ranks)."""
    shards: list[list[TrajectoryGroup]] = [[] for _ in range(ranks)]
    for i, g in enumerate(groups):
        shards[i % ranks].append(g)
    return shards


class LearnerActor:
    """One rank of the learner group."""

    def __init__(self, rank: int, world: int, cfg: TrainConfig):
        self.rank, self.world, self.cfg = rank, world, cfg
        self.model: Any = None
        self.precision: Any = None
        self.learner: Any = None
        self.tokenizer: Any = None
        self.pad_id = 0
        self.run_path: str | None = None
        self.adapted: Any = None
        """The LoRA adapters (``--lora.rank`` > 0): published and checkpointed alone."""
        self.stability: Any = None  # the lr schedule's and collapse check's StabilityState (checkpointed)

    def address(self) -> tuple[str, int]:
        """Where rank 0 listens for the process group (call on rank 0)."""
        return socket.gethostbyname(socket.gethostname()), free_port()

    def setup(self, master: tuple[str, int] | None) -> None:
        """Load the model, join the process group when ``world > 1``, build the learner."""
        import os

        import torch

        from agentrl.chat import ChatRenderer
        from agentrl.learner import Learner, wrap_fsdp
        from agentrl.models import resolve_model
        from agentrl.trainers import train_setup

        torch.manual_seed(self.cfg.seed)
        loaded = resolve_model(train_setup.model_spec(self.cfg))
        self.precision = train_setup.precision(self.cfg, loaded.device)
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        if self.cfg.lora.enabled:  # adapters before FSDP shards the model: the optimizer holds only them
            from agentrl.lora import apply_lora

            self.adapted = apply_lora(self.model, self.cfg.lora, name=self.cfg.model, seed=self.cfg.seed)
        self.pad_id = train_setup.tokenizer_pad_id(ChatRenderer(loaded.tokenizer))
        if self.world > 1:
            import torch.distributed as dist

            assert master is not None
            os.environ.update(MASTER_ADDR=master[0], MASTER_PORT=str(master[1]))
            backend = "nccl" if loaded.device.type == "cuda" else "gloo"
            dist.init_process_group(backend, rank=self.rank, world_size=self.world)
            # FSDP2's mixed-precision policy: bf16 compute over fp32 master shards, fp32 gradient reduction.
            self.model = wrap_fsdp(self.model, bf16=self.precision.autocast)
        self.learner = Learner(
            self.model, train_setup.learner_config(self.cfg, self.precision, fsdp=self.world > 1)
        )

    def load_checkpoint(self, run_path: str) -> int:
        """Load the run's newest checkpoint (weights and optimizer); return its step (0 when none)."""
        from agentrl.checkpoint import load_checkpoint
        from agentrl.learner.stability import StabilityState, stability_at

        self.run_path = run_path
        ckpt = RunDir(Path(run_path)).latest_checkpoint()
        self.stability = StabilityState() if ckpt is None else stability_at(RunDir(Path(run_path)), ckpt.step)
        if ckpt is None:
            return 0
        if self.world == 1:
            if self.adapted is not None:
                self.adapted.load_adapter(ckpt.model_dir)  # refuses an adapter trained on another base
            weights = None if self.adapted is not None else self.model
            return load_checkpoint(ckpt, model=weights, optimizer=self.learner.optimizer).step
        return self._load_sharded(ckpt)

    def update(self, groups: Sequence[TrajectoryGroup], learner_version: int) -> dict[str, float]:
        """One :func:`~agentrl.update.policy_update` on this rank's groups, trained as step
        ``learner_version`` (tokens sampled by older versions get the off-policy correction); its metrics.
        With one rank the learner's scores of the step go to the run, as the local runtime's do, so replay
        has them once the step's checkpoint is rotated away."""
        from agentrl.learner.stability import StabilityState, StepInputs, begin_step
        from agentrl.scores import save_step_scores
        from agentrl.update import policy_update

        inputs = StepInputs.of(groups)
        if self.world > 1:  # every rank decides the rate on the whole step's episodes, so they agree
            import torch.distributed as dist

            parts: list[Any] = [None] * self.world
            dist.all_gather_object(parts, inputs)
            inputs = StepInputs.merge(parts)
        state = self.stability or StabilityState()
        stab = begin_step(self.cfg.learner, self.learner.optimizer, state, inputs, step=learner_version)
        update = policy_update(
            self.learner,
            groups,
            estimator=self.cfg.estimator,
            pad_id=self.pad_id,
            correction=self.cfg.correction,
            learner_version=learner_version,
        )
        if self.world == 1 and self.run_path is not None:
            c = update.credit
            save_step_scores(
                RunDir(Path(self.run_path)), learner_version, groups, c.logprobs_B_T, c.sum_pi_squared_B_T
            )
        self.stability = stab.state
        warning = stab.warning(learner_version)
        if warning is not None and self.rank == 0:
            print(warning, flush=True)
        return {**update.metrics, **stab.metrics}

    def _full_state(self) -> dict[str, Any]:
        if self.world == 1:
            return dict(self.model.state_dict())
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # A collective: every rank takes part; each gets the full tensors on CPU.
        return dict(
            get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        )

    def publish(self, version: int, transport: WeightTransport) -> WeightRef | None:
        """Publish the current weights as ``version`` (rank 0 returns the ref; other ranks None)."""
        from agentrl.lora import published_state
        from agentrl.precision import served_copy

        state = self._full_state()
        if self.adapted is not None:  # the servers hold the base already: ship the adapter alone
            state = published_state(_StateOnly(state))
        # The servers sample in the compute dtype: ship that copy (half the bytes of fp32 master weights for
        # bf16), so the checksum the servers report of their own weights is the one published.
        return transport.put(version, served_copy(state, self.precision.sampler)) if self.rank == 0 else None

    def release_optimizer_state(self) -> None:
        """No update follows (:meth:`Learner.release_optimizer_state`): free this rank's optimizer moments."""
        self.learner.release_optimizer_state()

    def save_checkpoint(self, run_path: str, step: int, keep: int) -> None:
        """Write ``checkpoints/step-<step>`` (rank 0 writes; every rank joins the gathers)."""
        from agentrl.checkpoint import CheckpointState, save_checkpoint
        from agentrl.learner.stability import StabilityState, stability_extra

        stab = stability_extra(self.stability or StabilityState())
        state = CheckpointState(step, step, {"next_step": step, **stab})
        if self.world == 1:
            save_checkpoint(
                RunDir(Path(run_path)),
                model=self.adapted if self.adapted is not None else self.model,
                optimizer=self.learner.optimizer,
                tokenizer=self.tokenizer,
                state=state,
                keep=keep,
                older=self.cfg.older_checkpoints,
            )
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        full = self._full_state()
        optim = get_optimizer_state_dict(
            self.model,
            self.learner.optimizer,
            options=StateDictOptions(full_state_dict=True, cpu_offload=True),
        )
        if self.rank == 0:
            save_checkpoint(
                RunDir(Path(run_path)),
                model=_Plain(self.cfg, full),
                optimizer=cast(Any, _Saved(optim)),  # a saved state, not a live optimizer
                tokenizer=self.tokenizer,
                state=state,
                keep=keep,
                older=self.cfg.older_checkpoints,
            )
        import torch.distributed as dist

        dist.barrier()

    def _load_sharded(self, ckpt: Any) -> int:
        import torch
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        from agentrl.checkpoint import load_checkpoint

        plain = _plain_model(self.cfg)
        if self.cfg.lora.enabled:
            from agentrl.lora import apply_lora

            apply_lora(plain, self.cfg.lora, name=self.cfg.model, seed=self.cfg.seed).load_adapter(
                ckpt.model_dir
            )
            step = load_checkpoint(ckpt).step
        else:
            step = load_checkpoint(ckpt, model=plain).step
        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
        set_model_state_dict(self.model, plain.state_dict(), options=opts)
        optim = torch.load(ckpt.path / "optimizer.pt", weights_only=False)
        set_optimizer_state_dict(self.model, self.learner.optimizer, optim, options=opts)
        return step

    def shutdown(self) -> None:
        """Leave the process group."""
        if self.world > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def _plain_model(cfg: TrainConfig) -> Any:
    from agentrl.models import resolve_model
    from agentrl.trainers import train_setup

    return resolve_model(train_setup.model_spec(cfg), tokenizer=False).model


class _Plain:
    """An unsharded copy of the model holding ``state`` (for ``save_pretrained``; with LoRA, the adapter)."""

    def __init__(self, cfg: TrainConfig, state: dict[str, Any]):
        self.model = _plain_model(cfg)
        self.saver: Any = self.model
        if cfg.lora.enabled:
            from agentrl.lora import apply_lora

            self.saver = apply_lora(self.model, cfg.lora, name=cfg.model, seed=cfg.seed)
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
