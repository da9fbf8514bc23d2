"""Where a training run runs, apart from what it trains: :class:`DeployConfig` (``TrainConfig.deploy``).

The experiment (model, env, estimator, rollout and learner settings, seed...) decides the numbers a run
produces; the deployment only decides where the work happens: in this process, or on a Ray cluster with
so many rollout workers, inference servers and learners. A resumed run may therefore change its deployment
but not its experiment (:data:`agentrl.trainers.train_config.RESUMABLE`).

The flags keep their names (``--ray``, ``--rollout-workers``, ...: ``deploy`` is a flat nested config,
:data:`agentrl.config.FLAT_FLAGS`), and a ``config.json`` written before the split (these settings at its
top level) loads with them lifted into ``deploy``. ``--device``, ``--policy`` and ``--vllm-url`` stay with
the experiment: the device and the sampler decide the dtypes and kernels a run computes with, and a resume
refuses to change them.

``--sandbox.max-starting`` (:class:`SandboxConfig`, ``deploy.sandbox``) caps how many sandboxes each of the
run's pools starts at once: a property of the machines, not of the experiment.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrl.errors import ConfigError

__all__ = ["DeployConfig", "SandboxConfig"]


@dataclass(frozen=True)
class SandboxConfig:
    """The run's sandbox pools (one per process that runs episodes: this one, or each rollout worker)."""

    max_starting: int | None = None
    """Most sandboxes a pool starts (or resets) at once; later starts queue in arrival order. Default:
    $AGENTRL_SANDBOX_MAX_STARTING, else 4 (with --ray, the driver's value is handed to every worker)."""

    def __post_init__(self) -> None:
        n = self.max_starting
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ConfigError(f"--sandbox.max-starting must be a positive integer, got {n!r}")


@dataclass(frozen=True)
class DeployConfig:
    """Where the run's work runs: this process (the default), or Ray actors (``--ray``)."""

    ray: str | None = None
    """Run on Ray: 'local' (start Ray in this process), 'auto' (join the cluster this node belongs to) or
    'ray://host:port'; unset, everything runs in this process. See docs/distributed.md."""
    rollout_workers: int = 1
    """With --ray: rollout worker actors (each runs many episodes, with a sandbox pool on its node)."""
    inference_servers: int = 1
    """With --ray: inference server actors (episodes are spread over them by in-flight count)."""
    learners: int = 1
    """With --ray: learner actors (more than one shard the model with FSDP over gloo/NCCL)."""
    weights_dir: str | None = None
    """With --ray: publish weights as safetensors files in this folder (every node must mount it) instead of
    through the Ray object store."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Sandbox pools (--sandbox.max-starting)."""

    def __post_init__(self) -> None:
        for name in ("rollout_workers", "inference_servers", "learners"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {v!r}")
        if self.ray is None:
            extra = [n for n in ("rollout_workers", "inference_servers", "learners") if getattr(self, n) != 1]
            if self.weights_dir is not None:
                extra.append("weights_dir")
            if extra:
                flags = ", ".join(f"--{n.replace('_', '-')}" for n in extra)
                raise ConfigError(f"{flags} only apply with --ray (local, auto or ray://host:port)")
