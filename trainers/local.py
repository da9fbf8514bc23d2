"""The single-process runtime: learner, sampler and environments in this process (the default)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

from agentrl.groups import TrajectoryGroup
from agentrl.heap import return_freed_memory, trim_heap  # the first re-exported, for train.py
from agentrl.lora_sync import verify_served
from agentrl.policies import HFPolicy
from agentrl.protocols import UpdatablePolicy, WeightUpdate
from agentrl.rollout import EpisodeDone, run_groups
from agentrl.run import RunDir
from agentrl.staleness import StepOutcome
from agentrl.trainers import factories
from agentrl.trainers.evaluate import EvalReport, run_held_out
from agentrl.trainers.learner_core import LearnerCore
from agentrl.trainers.runtime import group_hook
from agentrl.trainers.train_config import TrainConfig
from agentrl.types import TrajectoryMeta

if TYPE_CHECKING:
    from agentrl.chat import ChatRenderer
    from agentrl.trainers.gateway.agent_rollout import EpisodeSource

__all__ = ["LocalRuntime", "SourceFactory", "local_runtime", "return_freed_memory"]

SourceFactory = Callable[
    [TrainConfig, UpdatablePolicy, "ChatRenderer"],
    contextlib.AbstractAsyncContextManager["EpisodeSource | None"],
]
"""Opens the episode source of a run that runs no env: ``train --agent``'s (the default,
:func:`agentrl.trainers.gateway.agent_rollout.agent_runner`, None without --agent) or ``gateway
--train``'s."""


class LocalRuntime:
    """The single-process :class:`~agentrl.trainers.runtime.TrainRuntime`: learner, sampler and environments
    in this process (the default). The learner is the :class:`~agentrl.trainers.learner_core.LearnerCore`
    the Ray learner actors wrap; the HF sampler shares its model object when it can."""

    def __init__(
        self,
        cfg: TrainConfig,
        run: RunDir,
        *,
        pool: Any,
        agent: EpisodeSource | None,
        core: LearnerCore,
        policy: UpdatablePolicy,
        start_step: int,
    ):
        self.cfg, self.run, self.agent = cfg, run, agent
        self.core = core
        self.policy, self.renderer = policy, core.renderer
        self.pool = pool
        self.make_env = factories.env_factory(cfg, pool) if agent is None else None
        self._start = start_step
        self.limit = asyncio.Semaphore(cfg.rollout.concurrency)
        """The episode limit (``--rollout.concurrency``) shared by every group of every step in flight."""
        self.finish_group = group_hook(cfg)
        """What judges each complete group before it is stored (``--reward.relative-judge``), or None."""

    @property
    def start_step(self) -> int:
        """The step this run starts at."""
        return self._start

    @property
    def version(self) -> int:
        """The sampler's weights version."""
        return self.policy.version

    def run_groups(
        self, step: int, *, seeds: Iterable[int], group_size: int, meta: TrajectoryMeta
    ) -> AsyncIterator[EpisodeDone]:
        """The step's groups, from the env scheduler or (with --agent) the agent through the gateway."""
        if self.agent is not None:
            events: AsyncIterator[EpisodeDone] = self.agent.run_groups(
                seeds=seeds, group_size=group_size, meta=meta, limit=self.limit
            )
            return events
        assert self.make_env is not None
        return run_groups(
            self.make_env,
            self.policy,
            self.renderer,
            factories.rollout_config(self.cfg, step),
            seeds=seeds,
            group_size=group_size,
            meta=meta,
            limit=self.limit,
            finish_group=self.finish_group,
        )

    async def update(self, step: int, groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
        """The learner core's update in a worker thread (sampling goes on in this one when it overlaps)."""
        clear = getattr(self.policy, "clear_cache", None)
        if callable(clear) and self.cfg.async_.max_staleness == 0:
            clear()  # the KV of this step's turns is stale once the weights change: free it before learning
        return await asyncio.to_thread(self.core.update, step, groups)

    async def held_out(self, label: str) -> EvalReport | None:
        """The held-out evaluation of the current weights (``--eval``), labelled ``untrained``/``trained``;
        None when it is off or with --agent (said once), whose task source may have no test split."""
        if not self.cfg.output.eval.tasks:
            return None
        if self.agent is not None:
            if label == "untrained":
                print("eval: no held-out evaluation with --agent (its task source may have no test split)")
            return None
        report = await run_held_out(
            self.policy,
            self.renderer,
            self.cfg.env,
            factories.env_kwargs(self.cfg, self.pool),
            self.cfg.output.eval,
            self.cfg.rollout,
            self.run.path,
            label,
        )
        clear = getattr(self.policy, "clear_cache", None)
        if callable(clear):
            clear()  # the eval's prompts are not the training tasks': give their KV back
        trim_heap()
        return report

    async def publish(self, version: int, outcome: StepOutcome) -> None:
        """The learner's weights to the sampler; with LoRA, the sampler's served adapter is then checked
        against the learner's and recorded (:func:`agentrl.lora_sync.verify_served`). The step's outcome is
        in trajectories.jsonl and metrics.jsonl already: this runtime keeps no ledger (an episode source may:
        it is handed the outcome)."""
        await self.policy.load_weights(WeightUpdate(version, self.core.state_to_publish()))
        if self.agent is not None:
            self.agent.record(outcome)
        if self.core.adapted is not None:
            await verify_served(self.run, self.policy, self.core.model, version)

    async def finish_updates(self) -> None:
        """Free the learner's optimizer state: the trained evaluation rebuilds the sampler's packed weights
        and KV, and must stay under the default run's memory budget."""
        self.core.release_optimizer_state()

    async def save_checkpoint(self, run: RunDir, step: int, *, keep: int) -> None:
        """Weights, optimizer, RNG and the learning-rate schedule's state after ``step`` steps."""
        self.core.save(run, step, keep=keep)


@contextlib.asynccontextmanager
async def local_runtime(
    cfg: TrainConfig,
    run: RunDir,
    *,
    sampler: UpdatablePolicy | None = None,
    source: SourceFactory | None = None,
) -> AsyncIterator[LocalRuntime]:
    """Load the model (and a resumed run's checkpoint), build the learner, sampler, sandbox pool and (with
    --agent) the gateway; close them on exit. ``sampler`` replaces the policy the config would build (tests,
    custom backends); it gets the learner's weights through ``load_weights`` after each step. ``source``
    replaces where episodes come from (``gateway --train``: sessions from outside; no env and no sandbox
    pool are built then)."""
    from agentrl.trainers.gateway.agent_rollout import agent_runner

    core = LearnerCore(cfg, resolved=factories.resolved(cfg, run))
    start = core.load(run)
    if core.resumed_from is not None:
        print(f"resumed {run.path} at step {start} from {core.resumed_from.name}")
    if sampler is not None:
        policy: UpdatablePolicy = sampler
        if policy.version < start:  # a resumed run: the sampler starts from the checkpoint's weights
            await factories.publish_weights(policy, core.model, start)
    else:
        # The sampler needs weights of its own when it samples in another dtype than the master weights
        # (bf16 on CUDA), and asynchronously (--max-staleness ≥ 1: the learner trains in a thread while
        # episodes sample; new weights are published between turns); otherwise it shares the learner's.
        sampler_model = core.model
        if cfg.async_.max_staleness > 0 or not core.precision.shares_weights:
            sampler_model = cast(Any, copy.deepcopy(core.model)).to(core.precision.sampler)
        policy = factories.make_policy(
            cfg, sampler_model, core.tokenizer, core.renderer, core.device, version=start
        )
    if sampler is None and not isinstance(policy, HFPolicy):
        # A sampler with its own copy of the weights starts from the learner's (a resumed run's too).
        connect = getattr(policy, "connect", None)
        if connect is not None:
            await connect()
        await factories.publish_weights(policy, core.model, start)
    if core.adapted is not None:
        await verify_served(run, policy, core.model, start)  # what the first episodes sample with
    pool = factories.sandbox_pool(cfg, cfg.rollout.concurrency) if source is None else None
    async with (
        pool or contextlib.nullcontext(),
        (source or agent_runner)(cfg, policy, core.renderer) as agent,
    ):
        yield LocalRuntime(
            cfg,
            run,
            pool=pool,
            agent=agent,
            core=core,
            policy=policy,
            start_step=start,
        )
