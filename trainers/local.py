"""The single-process runtime: learner, sampler and environments in this process (the default)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import sys
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any, cast

from agentrl.chat import ChatRenderer
from agentrl.checkpoint import CheckpointState, load_checkpoint, save_checkpoint
from agentrl.groups import TrajectoryGroup
from agentrl.heap import return_freed_memory, trim_heap  # the first re-exported, for pg.py
from agentrl.learner import Learner
from agentrl.learner.stability import StabilityState, begin_step, stability_at, stability_extra
from agentrl.lora import Adapted, apply_lora
from agentrl.lora_sync import adapter_params, verify_served
from agentrl.models import resolve_model
from agentrl.policies import HFPolicy
from agentrl.protocols import UpdatablePolicy
from agentrl.rollout import EpisodeDone, run_groups
from agentrl.run import RunDir
from agentrl.scores import save_step_scores
from agentrl.trainers import train_setup
from agentrl.trainers.evaluate import EvalReport, run_held_out
from agentrl.trainers.train_setup import TrainConfig
from agentrl.types import TrajectoryMeta
from agentrl.update import policy_update

__all__ = ["LocalRuntime", "local_runtime", "return_freed_memory"]


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
        adapted: Adapted | None = None,
    ):
        self.cfg, self.run, self.agent = cfg, run, agent
        self.adapted = adapted
        """The LoRA adapters when ``--lora.rank`` > 0 (checkpoints then hold the adapter alone)."""
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self.learner, self.policy, self.renderer = learner, policy, renderer
        self.pool = pool
        self.make_env = train_setup.env_factory(cfg, pool) if agent is None else None
        self._start = start_step
        self.limit = asyncio.Semaphore(cfg.rollout.concurrency)
        """The episode limit (``--rollout.concurrency``) shared by every group of every step in flight."""
        self._stability: StabilityState | None = None  # read from the start checkpoint at the first update

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
                seeds=seeds, group_size=group_size, meta=meta, limit=self.limit
            )
            return events
        assert self.make_env is not None
        return run_groups(
            self.make_env,
            self.policy,
            self.renderer,
            train_setup.rollout_config(self.cfg, int(meta.step or 0)),
            seeds=seeds,
            group_size=group_size,
            meta=meta,
            limit=self.limit,
        )

    async def update(self, groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
        """One :func:`~agentrl.update.policy_update` in a worker thread; the learner's scores of the step
        are written to the run (:mod:`agentrl.scores`) so replay has its advantages once its checkpoint is
        rotated away."""
        clear = getattr(self.policy, "clear_cache", None)
        if callable(clear) and self.cfg.max_staleness == 0:
            clear()  # the KV of this step's turns is stale once the weights change: free it before learning
        trim_heap()
        step = int(groups[0][0].meta.step or 0)  # the step that trains them (the learner's version)
        if self._stability is None:
            self._stability = stability_at(self.run, self.start_step)
        stab = begin_step(self.cfg.learner, self.learner.optimizer, self._stability, groups, step=step)
        update = await asyncio.to_thread(
            policy_update,
            self.learner,
            groups,
            estimator=self.cfg.estimator,
            pad_id=train_setup.tokenizer_pad_id(self.renderer),
            correction=self.cfg.correction,
            learner_version=step,
        )
        c = update.credit
        save_step_scores(self.run, step, groups, c.logprobs_B_T, c.sum_pi_squared_B_T)
        self._stability = stab.state
        warning = stab.warning(step)
        if warning is not None:
            print(warning, file=sys.stderr)
        # The update's freed autograd and optimizer temporaries stay resident in glibc's heaps; the next
        # rollout rebuilds the packed weights and KV on top of them (the default run's peak phase).
        trim_heap()
        return {**update.metrics, **stab.metrics}

    async def held_out(self, label: str) -> EvalReport | None:
        """The held-out evaluation of the current weights (``--eval``), labelled ``untrained``/``trained``;
        None when it is off or with --agent (said once), whose task source may have no test split."""
        if not self.cfg.eval.tasks:
            return None
        if self.agent is not None:
            if label == "untrained":
                print("eval: no held-out evaluation with --agent (its task source may have no test split)")
            return None
        report = await run_held_out(
            self.policy,
            self.renderer,
            self.cfg.env,
            train_setup.env_kwargs(self.cfg, self.pool),
            self.cfg.eval,
            self.cfg.rollout,
            self.run.path,
            label,
        )
        clear = getattr(self.policy, "clear_cache", None)
        if callable(clear):
            clear()  # the eval's prompts are not the training tasks': give their KV back
        trim_heap()
        return report

    async def publish(self, version: int) -> None:
        """The learner's weights to the sampler; with LoRA, the sampler's served adapter is then checked
        against the learner's and recorded (:func:`agentrl.lora_sync.verify_served`)."""
        await train_setup.publish_weights(self.policy, self.learner.model, version)
        if self.adapted is not None:
            await verify_served(self.run, self.policy, self.learner.model, version)

    async def finish_updates(self) -> None:
        """The learner's AdamW moments (twice the weights) are on disk in the last checkpoint: freeing them
        keeps the trained evaluation, which rebuilds the sampler's packed weights and KV, under the
        default run's memory budget."""
        self.learner.release_optimizer_state()
        trim_heap()

    async def save_checkpoint(self, run: RunDir, step: int, *, keep: int) -> None:
        """Weights, optimizer, RNG and the learning-rate schedule's state after ``step`` steps."""
        if self._stability is None:  # no update since the start: keep the start checkpoint's state
            self._stability = stability_at(self.run, self.start_step)
        save_checkpoint(
            run,
            model=self.adapted if self.adapted is not None else self.model,
            optimizer=self.learner.optimizer,
            tokenizer=self.tokenizer,
            state=CheckpointState(step, step, {"next_step": step, **stability_extra(self._stability)}),
            keep=keep,
            older=self.cfg.older_checkpoints,
        )


@contextlib.asynccontextmanager
async def local_runtime(
    cfg: TrainConfig, run: RunDir, *, sampler: UpdatablePolicy | None = None
) -> AsyncIterator[LocalRuntime]:
    """Load the model (and a resumed run's checkpoint), build the learner, sampler, sandbox pool and (with
    --agent) the gateway; close them on exit. ``sampler`` replaces the policy the config would build (tests,
    custom backends); it gets the learner's weights through ``load_weights`` after each step."""
    from agentrl.sandbox import LocalSandbox, SandboxPool
    from agentrl.trainers.gateway.agent_rollout import agent_runner

    loaded = resolve_model(train_setup.model_spec(cfg))
    prec = train_setup.precision(cfg, loaded.device)
    warning = prec.warning()
    if warning is not None:
        print(warning, file=sys.stderr)
    if prec.autocast or prec.pure_low_precision:
        print(f"precision: {prec.describe()}")
    renderer = ChatRenderer(loaded.tokenizer)
    adapted = None
    if cfg.lora.enabled:  # adapters injected in place: loaded.model is the adapted model from here on
        adapted = apply_lora(loaded.model, cfg.lora, name=cfg.model, seed=cfg.seed)
        print(f"lora: rank {cfg.lora.rank} on {adapted.base.describe()}, {adapter_params(loaded.model)}")
    learner = Learner(loaded.model, train_setup.learner_config(cfg, prec))
    start = 0
    ckpt = run.latest_checkpoint()
    if ckpt is not None:
        if adapted is not None:
            adapted.load_adapter(ckpt.model_dir)  # refuses an adapter trained on another base
        weights = None if adapted is not None else loaded.model
        start = load_checkpoint(ckpt, model=weights, optimizer=learner.optimizer).step
        print(f"resumed {run.path} at step {start} from {ckpt.path.name}")
    if sampler is not None:
        policy: UpdatablePolicy = sampler
        if policy.version < start:  # a resumed run: the sampler starts from the checkpoint's weights
            await train_setup.publish_weights(policy, loaded.model, start)
    else:
        # The sampler needs weights of its own when it samples in another dtype than the master weights
        # (bf16 on CUDA), and asynchronously (--max-staleness ≥ 1: the learner trains in a thread while
        # episodes sample; new weights are published between turns); otherwise it shares the learner's.
        sampler_model = loaded.model
        if cfg.max_staleness > 0 or not prec.shares_weights:
            sampler_model = cast(Any, copy.deepcopy(loaded.model)).to(prec.sampler)
        policy = train_setup.make_policy(
            cfg, sampler_model, loaded.tokenizer, renderer, loaded.device, version=start
        )
    if sampler is None and not isinstance(policy, HFPolicy):
        # A sampler with its own copy of the weights starts from the learner's (a resumed run's too).
        connect = getattr(policy, "connect", None)
        if connect is not None:
            await connect()
        await train_setup.publish_weights(policy, loaded.model, start)
    if adapted is not None:
        await verify_served(run, policy, loaded.model, start)  # what the first episodes sample with
    n = cfg.rollout.concurrency
    pool = SandboxPool(LocalSandbox, size=n, max_waiting=4 * n) if train_setup.needs_sandbox(cfg) else None
    async with pool or contextlib.nullcontext(), agent_runner(cfg, policy, renderer) as agent:
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
            adapted=adapted,
        )
