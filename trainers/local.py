"""The single-process runtime: learner, sampler and environments in this process (the default)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

from agentrl.chat import ChatRenderer
from agentrl.checkpoint import CheckpointState, load_checkpoint, save_checkpoint
from agentrl.groups import TrajectoryGroup
from agentrl.learner import Learner
from agentrl.models import resolve_model
from agentrl.protocols import UpdatablePolicy
from agentrl.rollout import EpisodeDone, run_groups
from agentrl.run import RunDir
from agentrl.trainers import pg
from agentrl.trainers.pg import TrainConfig
from agentrl.types import TrajectoryMeta
from agentrl.update import policy_update

__all__ = ["LocalRuntime", "local_runtime"]


class LocalRuntime:
    """The single-process :class:`~agentrl.trainers.runtime.TrainRuntime`: learner, sampler and environments
    in this process (the default). The HF sampler shares the learner's model object."""

    def __init__(
        self,
        cfg: TrainConfig,
        run: RunDir,
        *,
        pool: Any,
        agent: Any,
        loaded: Any,
        learner: Learner,
        policy: UpdatablePolicy,
        renderer: ChatRenderer,
        start_step: int,
    ):
        self.cfg, self.run, self.agent = cfg, run, agent
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self.learner, self.policy, self.renderer = learner, policy, renderer
        self.make_env = pg._env_factory(cfg, pool) if agent is None else None
        self._start = start_step

    @property
    def start_step(self) -> int:
        """The step this run starts at."""
        return self._start

    @property
    def version(self) -> int:
        """The sampler's weights version."""
        return self.policy.version

    def run_groups(
        self, *, seeds: Iterable[int], group_size: int, meta: TrajectoryMeta
    ) -> AsyncIterator[EpisodeDone]:
        """The step's groups, from the env scheduler or (with --agent) the agent through the gateway."""
        if self.agent is not None:
            events: AsyncIterator[EpisodeDone] = self.agent.run_groups(
                seeds=seeds, group_size=group_size, meta=meta
            )
            return events
        assert self.make_env is not None
        return run_groups(
            self.make_env,
            self.policy,
            self.renderer,
            self.cfg.rollout,
            seeds=seeds,
            group_size=group_size,
            meta=meta,
        )

    async def update(self, groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
        """One :func:`~agentrl.update.policy_update` in a worker thread."""
        update = await asyncio.to_thread(
            policy_update,
            self.learner,
            groups,
            estimator=self.cfg.estimator,
            pad_id=pg.tokenizer_pad_id(self.renderer),
        )
        return update.metrics

    async def publish(self, version: int) -> None:
        """The learner's weights to the sampler."""
        await pg.publish_weights(self.policy, self.learner.model, version)

    async def save_checkpoint(self, run: RunDir, step: int, *, keep: int) -> None:
        """Weights, optimizer and RNG after ``step`` steps."""
        save_checkpoint(
            run,
            model=self.model,
            optimizer=self.learner.optimizer,
            tokenizer=self.tokenizer,
            state=CheckpointState(step, step, {"next_step": step}),
            keep=keep,
        )


@contextlib.asynccontextmanager
async def local_runtime(cfg: TrainConfig, run: RunDir) -> AsyncIterator[LocalRuntime]:
    """Load the model (and a resumed run's checkpoint), build the learner, sampler, sandbox pool and (with
    --agent) the gateway; close them on exit."""
    from agentrl.sandbox import LocalSandbox, SandboxPool
    from agentrl.trainers.gateway.agent_rollout import agent_runner

    loaded = resolve_model(pg.model_spec(cfg))
    renderer = ChatRenderer(loaded.tokenizer)
    learner = Learner(loaded.model, cfg.learner)
    start = 0
    ckpt = run.latest_checkpoint()
    if ckpt is not None:
        start = load_checkpoint(ckpt, model=loaded.model, optimizer=learner.optimizer).step
        print(f"resumed {run.path} at step {start} from {ckpt.path.name}")
    policy = pg.make_policy(cfg, loaded.model, loaded.tokenizer, renderer, loaded.device, version=start)
    pool = SandboxPool(LocalSandbox, size=cfg.rollout.concurrency, max_waiting=4 * cfg.rollout.concurrency)
    async with pool, agent_runner(cfg, policy, renderer) as agent:
        yield LocalRuntime(
            cfg,
            run,
            pool=pool,
            agent=agent,
            loaded=loaded,
            learner=learner,
            policy=policy,
            renderer=renderer,
            start_step=start,
        )
