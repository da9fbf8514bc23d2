"""Policy-gradient trainer for tool-using agents: rollout groups → credit (OTB, GRPO, RLOO, OPO) → update.

One step, top to bottom::

    tasks for step k (deterministic in seed and k; trainers/task_sampler.py, with --curriculum)
      → run_groups: N episodes per task with the current policy, each trajectory appended to
        <run>/trajectories.jsonl the moment it finishes, each TrajectoryGroup kept as it completes
      → drop infra failures (never scored as reward 0); --dynamic-sampling true: drop groups without
        reward signal and draw more tasks until the step has groups-per-step with signal (or the cap)
      → policy_update(groups): collate → Learner.score (log π and Σπ² of the current weights)
        → estimator.advantages (typed estimator config), baselines within each group
      → Learner.step (PPO-clip / REINFORCE) → the policy sees the new weights (version k+1)
      → one line in <run>/metrics.jsonl, a checkpoint in <run>/checkpoints/step-<k+1>

The loop runs over a :class:`~agentrl.trainers.runtime.TrainRuntime`: this process (trainers/local.py,
the default) or Ray actors (``--ray``, trainers/distributed/). Resume (``--resume RUN``) loads the last
checkpoint, drops metrics lines of steps it will redo and reuses every *complete* group of the interrupted
step already on disk, so no finished trajectory is lost and no step is logged twice. SIGINT/SIGTERM stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from agentrl import JsonlStore, TrajectoryGroup, TrajectoryMeta
from agentrl.config import config_to_dict
from agentrl.dynamic_sampling import StepDraws, draw_metrics, group_verdict
from agentrl.metrics import MetricsLogger
from agentrl.run import RunDir
from agentrl.trainers.evaluate import EvalReport, write_comparison
from agentrl.trainers.runtime import TrainRuntime
from agentrl.trainers.step_metrics import (
    Progress,
    episode_metrics,
    format_row,
    stalled_update_warning,
    token_limit_warning,
)
from agentrl.trainers.task_sampler import load_sampler_state, save_sampler_state, task_sampler
from agentrl.trainers.train_setup import (
    RESUMABLE,
    TrainConfig,
    _complete_groups,
    _Session,
    make_policy,
    model_spec,
    prepare_run,
    publish_weights,
    rollout_config,
    task_seeds,
    tokenizer_pad_id,
)

__all__ = [
    "RESUMABLE",
    "RuntimeFactory",
    "TrainConfig",
    "episode_metrics",
    "make_policy",
    "model_spec",
    "open_runtime",
    "prepare_run",
    "publish_weights",
    "rollout_config",
    "task_seeds",
    "tokenizer_pad_id",
    "train",
]


RuntimeFactory = Callable[[TrainConfig, RunDir], contextlib.AbstractAsyncContextManager[TrainRuntime]]
"""Opens the runtime of a run (:func:`open_runtime`, or a test's own)."""


def open_runtime(cfg: TrainConfig, run: RunDir) -> contextlib.AbstractAsyncContextManager[TrainRuntime]:
    """The runtime the config asks for: Ray actors with ``--ray``
    (:func:`agentrl.trainers.distributed.ray_runtime`), else this process
    (:func:`agentrl.trainers.local.local_runtime`)."""
    if cfg.ray is not None:
        from agentrl.trainers.distributed import ray_runtime

        return ray_runtime(cfg, run)
    from agentrl.trainers.local import local_runtime

    return local_runtime(cfg, run)


async def train(
    cfg: TrainConfig, *, runtime: RuntimeFactory | None = None, overlap: bool | None = None
) -> Path:
    """Run the training loop on the runtime the config asks for (or ``runtime``); return the run directory.

    A start that fails before anything is recorded leaves no run directory behind (or, in a directory that
    was already there, none of its files)."""
    created = cfg.resume is None and (cfg.out is None or not Path(cfg.out).is_dir())
    cfg, run = prepare_run(cfg)
    try:
        return await _train(cfg, run, runtime, overlap)
    except BaseException:
        if cfg.resume is None and run.discard_unstarted(created=created):
            print(f"the run recorded nothing; removed {run.path}", file=sys.stderr)
        raise


async def _train(cfg: TrainConfig, run: RunDir, runtime: RuntimeFactory | None, overlap: bool | None) -> Path:
    run_dir = run.path
    torch.manual_seed(cfg.seed)

    t0 = time.perf_counter()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    store = JsonlStore(run.trajectories_path, mode="append" if cfg.resume is not None else "new")
    metrics = MetricsLogger(run_dir, backends=cfg.loggers, config=config_to_dict(cfg))
    try:
        async with (runtime or open_runtime)(cfg, run) as rt:
            start = step = rt.start_step
            metrics.truncate_from(start)
            print(
                f"agentrl train: {cfg.model} on {cfg.env}, {cfg.estimator}, {cfg.groups_per_step}x"
                f"{cfg.group_size} episodes/step, steps {start}..{cfg.steps - 1}, run dir {run_dir} "
                f"(setup {time.perf_counter() - t0:.1f}s)"
            )
            sampler = task_sampler(cfg)
            load_sampler_state(run, start, sampler)
            session = _Session(cfg, run, rt, store, metrics, stop, first_step=start, task_sampler=sampler)
            before = await _held_out(rt, "untrained", stop)

            async def after_step(step: int) -> None:
                if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
                    save_sampler_state(run, step + 1, sampler)  # before the checkpoint: it always has one
                    await rt.save_checkpoint(run, step + 1, keep=cfg.keep_checkpoints)

            if cfg.max_staleness > 0 if overlap is None else overlap:
                from agentrl.trainers.async_loop import train_async

                step = await train_async(session, after_step)
            else:
                for step in range(start, cfg.steps):
                    if not await _train_step(session, step):
                        break
                    await after_step(step)
            if stop.is_set():
                # The weights are those after the last completed step: make sure a checkpoint says so.
                latest = run.latest_checkpoint()
                if latest is None or latest.step != step:
                    save_sampler_state(run, step, sampler)
                    await rt.save_checkpoint(run, step, keep=cfg.keep_checkpoints)
            if not stop.is_set() and before is not None:
                after = await _held_out(rt, "trained", stop)
                if after is not None:
                    write_comparison(run_dir, before, after)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        store.close()
        metrics.close()
    if stop.is_set():
        print(f"stopped by signal during step {step}; resume with: agentrl train --resume {run_dir}")
        raise KeyboardInterrupt
    return run_dir


async def _held_out(rt: TrainRuntime, label: str, stop: asyncio.Event) -> EvalReport | None:
    """The held-out evaluation, where the runtime offers one (the local runtime does, except with --agent,
    whose task source may have no test split); SIGINT/SIGTERM cancel it (not worth waiting for)."""
    held_out = getattr(rt, "held_out", None)
    if held_out is None:
        return None
    run = asyncio.ensure_future(held_out(label))
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({run, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not run.done():
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        return None
    report: EvalReport | None = run.result()
    return report


async def _train_step(s: _Session, step: int) -> bool:
    """One training step. Returns False when a stop was requested before it finished.

    The step draws ``groups-per-step`` tasks; with ``--dynamic-sampling true`` it drops the finished groups
    without reward signal and draws again (in rounds: as many as it still needs) until it has enough or
    reaches the cap (:class:`~agentrl.dynamic_sampling.StepDraws`)."""
    cfg, runtime = s.cfg, s.runtime
    t_step = time.perf_counter()
    draws = StepDraws.of(cfg.groups_per_step, cfg.dynamic_sampling)
    # Reading the run's trajectories back is only needed once, for the step a resumed run starts at.
    on_disk = (
        {g.task_id: g for g in _complete_groups(s.run, step, cfg.group_size)} if step == s.first_step else {}
    )
    reused: list[TrajectoryGroup] = []
    new: list[TrajectoryGroup] = []
    kept: set[int] = set()  # id() of the groups trained
    bar = Progress(cfg.progress, draws.need() * cfg.group_size, f"step {step} rollout")
    meta = TrajectoryMeta(env_id=cfg.env, step=step, policy_version=runtime.version)
    while (n := draws.need()) > 0:
        seeds = s.task_sampler.tasks(step, draws.issue(n))
        this_round = [g for seed in seeds if (g := on_disk.pop(f"{cfg.env}:{seed}", None)) is not None]
        reused += this_round
        done = {g.task_id for g in this_round}
        todo = [seed for seed in seeds if f"{cfg.env}:{seed}" not in done]
        if draws.drawn > cfg.groups_per_step:
            bar.set(f"step {step} refill ({draws.drawn} drawn)")
        if not await _rollout(s, todo, meta, bar, this_round, new):
            return False
        for g in this_round:
            if draws.record(group_verdict(g)):
                kept.add(id(g))
    bar.close()
    t_rollout = time.perf_counter() - t_step

    t_learn = time.perf_counter()
    groups = reused + new  # the order of their lines in the trajectory file (replay rebuilds it)
    usable = [u for g in groups if id(g) in kept and (u := g.usable()) is not None]
    row: dict[str, float] = episode_metrics([t for g in groups for t in g])
    row["episodes/reused"] = float(sum(len(g) for g in reused))
    row.update(draw_metrics(draws, groups, usable))
    s.task_sampler.observe(step, groups)
    if draws.capped:
        print(
            f"step {step}: drew the most groups --dynamic-sampling.max-draws allows ({draws.drawn}) and "
            f"{draws.with_signal} of {cfg.groups_per_step} had reward signal; training on those"
        )
    if usable:
        row.update(await runtime.update(usable))
    else:
        print(f"step {step}: no group to train on (every episode failed, or none had signal); no update")
    t_publish = time.perf_counter()
    await runtime.publish(step + 1)
    row["time/publish_s"] = time.perf_counter() - t_publish
    row["time/rollout_s"] = t_rollout
    row["time/learn_s"] = time.perf_counter() - t_learn
    row["time/step_s"] = time.perf_counter() - t_step
    s.metrics.log(step, row)
    print(format_row(step, row))
    for warning in (
        token_limit_warning([t for g in groups for t in g], cfg.rollout),
        stalled_update_warning(row),
    ):
        if warning is not None:
            print(f"step {step}: {warning}", file=sys.stderr)
    return True


async def _rollout(
    s: _Session,
    seeds: list[int],
    meta: TrajectoryMeta,
    bar: Progress,
    this_round: list[TrajectoryGroup],
    new: list[TrajectoryGroup],
) -> bool:
    """Run one group per seed, storing every trajectory as it finishes and appending each group to both
    lists as it completes; False when a stop was requested first (the rollout is cancelled)."""

    async def rollout() -> None:
        events = s.runtime.run_groups(seeds=seeds, group_size=s.cfg.group_size, meta=meta)
        async for done in events:
            await s.store.append(done.trajectory)  # on disk before anything else: kill -9 loses nothing
            if done.group is not None:
                this_round.append(done.group)
                new.append(done.group)
            bar.update(reward=f"{done.trajectory.reward:.2f}")

    if not seeds:
        return True
    rollout_task = asyncio.ensure_future(rollout())
    stop_task = asyncio.ensure_future(s.stop.wait())
    await asyncio.wait({rollout_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
    stop_task.cancel()
    if not rollout_task.done():
        rollout_task.cancel()
        await asyncio.gather(rollout_task, return_exceptions=True)
        bar.close()
        return False
    rollout_task.result()
    return True


def main(cfg: TrainConfig) -> int:
    """Synchronous entry point used by the CLI; returns the exit status."""
    from agentrl.trainers.local import return_freed_memory

    return_freed_memory()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # checkpoint writes would each draw a bar
    try:
        run_dir = asyncio.run(train(cfg))
    except KeyboardInterrupt:
        return 130
    print(f"done: {run_dir} (plot with: agentrl plot {run_dir})")
    return 0
