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

The loop (:func:`agentrl.trainers.loop.run_steps`: one loop, in lock step at ``--max-staleness 0``,
overlapping generation with learning above) runs over a :class:`~agentrl.trainers.runtime.TrainRuntime`:
this process (trainers/local.py, the default) or Ray actors (``--ray``, trainers/ray/). Resume
(``--resume RUN``) loads the last checkpoint, drops metrics lines of steps it will redo and reuses every
*complete* group of the interrupted step already on disk (:func:`~agentrl.trainers.loop.reusable_groups`),
so no finished trajectory is lost and no step is logged twice. SIGINT/SIGTERM stop.
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

from agentrl import JsonlStore
from agentrl.config import config_to_dict
from agentrl.metrics import MetricsLogger
from agentrl.run import RunDir
from agentrl.trainers.evaluate import EvalReport, write_comparison
from agentrl.trainers.factories import prepare_run
from agentrl.trainers.loop import Session, run_steps, until_stopped
from agentrl.trainers.runtime import TrainRuntime
from agentrl.trainers.task_sampler import load_sampler_state, save_sampler_state, task_sampler
from agentrl.trainers.train_config import TrainConfig

__all__ = ["RuntimeFactory", "TrainConfig", "open_runtime", "train"]
"""``TrainConfig`` is the trainer's config (defined in :mod:`agentrl.trainers.train_config`; what a run is
built from it is :mod:`agentrl.trainers.factories`); the loop itself is :mod:`agentrl.trainers.loop`."""


RuntimeFactory = Callable[[TrainConfig, RunDir], contextlib.AbstractAsyncContextManager[TrainRuntime]]
"""Opens the runtime of a run (:func:`open_runtime`, or a test's own)."""


def open_runtime(cfg: TrainConfig, run: RunDir) -> contextlib.AbstractAsyncContextManager[TrainRuntime]:
    """The runtime the config asks for: Ray actors with ``--ray``
    (:func:`agentrl.trainers.ray.ray_runtime`), else this process
    (:func:`agentrl.trainers.local.local_runtime`)."""
    if cfg.deploy.ray is not None:
        from agentrl.trainers.ray import ray_runtime

        return ray_runtime(cfg, run)
    from agentrl.trainers.local import local_runtime

    return local_runtime(cfg, run)


async def train(cfg: TrainConfig, *, runtime: RuntimeFactory | None = None) -> Path:
    """Run the training loop on the runtime the config asks for (or ``runtime``); return the run directory.

    A start that fails before anything is recorded leaves no run directory behind (or, in a directory that
    was already there, none of its files)."""
    out = cfg.output
    created = out.resume is None and (out.out is None or not Path(out.out).is_dir())
    cfg, run = prepare_run(cfg)
    try:
        return await _train(cfg, run, runtime)
    except BaseException:
        if cfg.output.resume is None and run.discard_unstarted(created=created):
            print(f"the run recorded nothing; removed {run.path}", file=sys.stderr)
        raise


async def _train(cfg: TrainConfig, run: RunDir, runtime: RuntimeFactory | None) -> Path:
    run_dir = run.path
    torch.manual_seed(cfg.seed)

    t0 = time.perf_counter()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    out = cfg.output
    store = JsonlStore(run.trajectories_path, mode="append" if out.resume is not None else "new")
    metrics = MetricsLogger(run_dir, backends=out.loggers, config=config_to_dict(cfg))
    try:
        async with (runtime or open_runtime)(cfg, run) as rt:
            start = step = rt.start_step
            metrics.truncate_from(start)
            print(
                f"agentrl train: {cfg.model} on {cfg.env}, {cfg.estimator}, {cfg.batch.groups_per_step}x"
                f"{cfg.batch.group_size} episodes/step, steps {start}..{out.steps - 1}, run dir {run_dir} "
                f"(setup {time.perf_counter() - t0:.1f}s)"
            )
            sampler = task_sampler(cfg)
            load_sampler_state(run, start, sampler)
            session = Session(cfg, run, rt, store, metrics, stop, first_step=start, task_sampler=sampler)
            before = await _held_out(rt, "untrained", stop)

            async def after_step(step: int) -> None:
                if (step + 1) % out.checkpoint_every == 0 or step + 1 == out.steps:
                    save_sampler_state(run, step + 1, sampler)  # before the checkpoint: it always has one
                    await rt.save_checkpoint(run, step + 1, keep=out.keep_checkpoints)

            step = await run_steps(session, after_step)
            if stop.is_set():
                # The weights are those after the last completed step: make sure a checkpoint says so.
                latest = run.latest_checkpoint()
                if latest is None or latest.step != step:
                    save_sampler_state(run, step, sampler)
                    await rt.save_checkpoint(run, step, keep=out.keep_checkpoints)
            if not stop.is_set() and before is not None:
                await rt.finish_updates()  # the last checkpoint is written: no update follows
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
    """The runtime's held-out evaluation (None where it has none: the runtime says why); SIGINT/SIGTERM
    cancel it (not worth waiting for)."""
    return (await until_stopped(rt.held_out(label), stop))[1]


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
