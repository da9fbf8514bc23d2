"""Asynchronous training (``agentrl train --max-staleness S``, S ≥ 1): episodes of the next steps run while
the learner updates (in a worker thread locally, on the learner actors with ``--ray``).

::

    Admission (agentrl.staleness): lease group i of the run (task j of step k = start + i // groups_per_step)
      while in-flight + buffered < (S + 1) × groups_per_step and the served version ≥ k − S
      → run its episodes with the sampler (its own copy of the weights), each trajectory appended to
        <run>/trajectories.jsonl as it finishes (meta.step = k, the step that will train it)
    learner, step k: wait until step k's groups are done (or, --on-stale drop, until one is and drop the
      rest) → policy_update in a thread (π_old scored now; ρ̄ = min(π_old/μ, C) on stale tokens; OTB's
      energy × ρ̄²) → publish version k + 1 to the sampler → metrics, checkpoint

Weights reach the sampler between turns: a turn that is sampling when the learner publishes finishes on
the weights it started with, and the episode's next turn samples with the new ones. Each turn records its
version (``Generation.policy_version``; a trajectory that spans versions lists them in
``Trajectory.policy_versions``), so each token's staleness is known and the correction applies per token.

The data order is the synchronous trainer's (step k trains the tasks ``task_seeds(seed, k)``), so S = 0
would be the synchronous trainer exactly (the tests run this loop at S = 0 and compare). A resumed run
reuses the complete groups on disk of its steps that were sampled by weights it still has (versions ≤ the
checkpoint's) and resamples the rest; the admission check drops anything beyond the bound.

The loop talks to the machinery only through the run's :class:`~agentrl.trainers.runtime.TrainRuntime`
(``run_groups`` for one group, ``update``, ``publish``, ``version``), like the synchronous loop, so it runs
on both runtimes:

* local: the sampler gets its own copy of the weights when S ≥ 1, so the learner's thread never writes
  weights a turn is sampling with;
* Ray (``--ray``): each group is one rollout on the controller, leasing only its own ledger entry to a
  rollout worker; ``update`` runs on the learner actors while workers keep sampling on the inference
  servers; ``publish`` syncs every server between its turns (a server's turn in flight finishes on the
  weights it started with, as above). A straggler this loop drops is abandoned in the ledger (its late
  result is discarded), and a resume rewinds the ledger with the checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from agentrl import TrajectoryGroup, TrajectoryMeta, read_groups
from agentrl.staleness import Admission, Lease, oldest_version

if TYPE_CHECKING:
    from agentrl.trainers.train_setup import _Session

__all__ = ["GroupRunner", "local_group_runner", "train_async"]


def _reusable_groups(s: _Session) -> dict[str, TrajectoryGroup]:
    """Complete groups on disk of the steps this process will train, sampled only by weights it has
    (every turn's version ≤ the start step): task id → group (a resume)."""
    path = s.run.trajectories_path
    if not path.exists():
        return {}
    out: dict[str, TrajectoryGroup] = {}
    for g in read_groups(path, size=s.cfg.group_size):
        step = g[0].meta.step
        newest = max(t.max_policy_version for t in g)
        if step is not None and step >= s.first_step and newest <= s.first_step:
            out[f"{step}:{g.task_id}"] = g
    return out


GroupRunner = Callable[[int, TrajectoryMeta], Awaitable[TrajectoryGroup]]
"""Runs one group of episodes: ``(task seed, meta) -> group``, storing each trajectory as it finishes. The
local runner is :func:`local_group_runner`; a distributed runtime hands the group to its rollout workers."""


def local_group_runner(s: _Session) -> GroupRunner:
    """Groups run by the run's runtime (this process, or the Ray controller's workers), every trajectory
    appended to the run's store as it finishes (on disk before anything else)."""
    cfg = s.cfg

    async def run(seed: int, meta: TrajectoryMeta) -> TrajectoryGroup:
        events = s.runtime.run_groups(seeds=(seed,), group_size=cfg.group_size, meta=meta)
        async for done in events:
            await s.store.append(done.trajectory)  # a plain write: no suspension point
            if done.group is not None:
                # Return at once: no await between the group's last line on disk and the caller's
                # bookkeeping, so a group cancelled as a straggler is never complete on disk.
                return done.group
        raise RuntimeError(f"the rollout of task {seed} ended without completing its group")

    return run


async def train_async(
    s: _Session, after_step: Callable[[int], Awaitable[None]], run_group: GroupRunner | None = None
) -> int:
    """Train steps ``s.first_step`` .. ``cfg.steps − 1`` with generation overlapping learning; call
    ``after_step(k)`` after each (checkpointing). Returns the next step to train: ``cfg.steps``, or the
    step during which a stop was requested. ``run_group`` runs one group (default: in this process)."""
    from agentrl.dynamic_sampling import StepDraws, draw_metrics, group_verdict
    from agentrl.trainers.step_metrics import (
        episode_metrics,
        format_async_row,
        stalled_update_warning,
        token_limit_warning,
    )

    cfg, runtime = s.cfg, s.runtime
    sampler = s.task_sampler
    runner = run_group or local_group_runner(s)
    B = cfg.groups_per_step  # a step's first draws; refills (dynamic sampling) are draws B, B + 1, ...
    adm = Admission(cfg.max_staleness, B, on_stale=cfg.on_stale, start_step=s.first_step, end_step=cfg.steps)
    reuse = _reusable_groups(s)
    results: dict[int, TrajectoryGroup] = {}
    spans: dict[int, tuple[float, float]] = {}
    """Lease index -> (start, end) of its group's generation: a step's generate time is their union's span."""
    draws: dict[int, StepDraws] = {}  # per step: draws issued, verdicts of those finished (refills)
    reused_of: dict[int, int] = {}
    tasks: dict[int, asyncio.Task[None]] = {}
    wake = asyncio.Event()
    failure: list[BaseException] = []

    async def run_one(lease: Lease, seed: int) -> None:
        try:
            meta = TrajectoryMeta(env_id=cfg.env, step=lease.step, policy_version=runtime.version)
            t0 = time.perf_counter()
            group = await runner(seed, meta)
            spans[lease.index] = (t0, time.perf_counter())
            results[lease.index] = group
            adm.complete(lease, oldest_version(group))
            draws[lease.step].record(group_verdict(group))
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # surfaces in the loop below
            failure.append(e)
        finally:
            tasks.pop(lease.index, None)
            wake.set()

    def start(lease: Lease) -> None:
        seed = sampler.task(lease.step, lease.slot)
        old = reuse.pop(f"{lease.step}:{cfg.env}:{seed}", None)
        if old is not None:
            results[lease.index] = old
            reused_of[lease.step] = reused_of.get(lease.step, 0) + len(old)
            adm.complete(lease, oldest_version(old))
            draws[lease.step].record(group_verdict(old))
        else:
            tasks[lease.index] = asyncio.ensure_future(run_one(lease, seed))

    def lease_more() -> None:
        while True:
            # Refills first, oldest step first: they are counted in flight, so the bound holds with them.
            refill = [j for j in sorted(draws) if draws[j].need() and adm.can_refill(j, runtime.version)]
            if refill:
                start(adm.refill(refill[0], draws[refill[0]].issue(1)[0], runtime.version))
            elif adm.can_lease(runtime.version):
                lease = adm.lease(runtime.version)
                if lease.step not in draws:
                    draws[lease.step] = StepDraws.of(B, cfg.dynamic_sampling)
                    draws[lease.step].issue(B)  # the step's first draws, leased one by one
                start(lease)
            else:
                return

    def ready(k: int) -> bool:
        # --on-stale wait: every draw finished and none more needed (refills included).
        return adm.ready(k) and (cfg.on_stale == "drop" or (k in draws and draws[k].complete))

    k = s.first_step
    t_prev = time.perf_counter()
    try:
        while k < cfg.steps:
            lease_more()
            t_wait = time.perf_counter()
            while not ready(k) and not failure and not s.stop.is_set():
                lease_more()  # refills of groups that finished without signal
                if ready(k):
                    break
                if not tasks:  # nothing running and nothing may start: this would wait forever
                    raise RuntimeError(
                        f"step {k} cannot get its data: no group is running and none may start (the sampler "
                        f"serves version {runtime.version}, max staleness {cfg.max_staleness}); the sampler "
                        "must be at the learner's version"
                    )
                wake.clear()
                stop_wait = asyncio.ensure_future(s.stop.wait())
                wake_wait = asyncio.ensure_future(wake.wait())
                await asyncio.wait({stop_wait, wake_wait}, return_when=asyncio.FIRST_COMPLETED)
                stop_wait.cancel()
                wake_wait.cancel()
            if failure:
                raise failure[0]
            if s.stop.is_set():
                return k
            waited = time.perf_counter() - t_wait
            plan = adm.take(k)
            for lease in plan.dropped:
                task = tasks.pop(lease.index, None)
                if task is not None:
                    task.cancel()
                results.pop(lease.index, None)
                spans.pop(lease.index, None)
            groups = [results.pop(lease.index) for lease in plan.trained]
            ran = [spans.pop(lease.index) for lease in plan.trained if lease.index in spans]
            in_flight = len(tasks)
            t_learn = time.perf_counter()
            step_draws = draws.pop(k)
            usable = [
                u for g in groups if step_draws.keep(group_verdict(g)) and (u := g.usable()) is not None
            ]
            row: dict[str, float] = episode_metrics([t for g in groups for t in g])
            row["episodes/reused"] = float(reused_of.pop(k, 0))
            row.update(draw_metrics(step_draws, groups, usable))
            sampler.observe(k, groups)
            if step_draws.capped:
                print(f"step {k}: reached --dynamic-sampling.max-draws with {len(usable)} groups with signal")
            if usable:
                row.update(await runtime.update(usable))
            else:
                print(f"step {k}: no group to train on (every episode failed, or none had signal); no update")
            t_publish = time.perf_counter()
            await runtime.publish(k + 1)
            now = time.perf_counter()
            row["time/publish_s"] = now - t_publish
            row["time/rollout_s"] = waited  # the learner's wait for data (generation not hidden by learning)
            # The wall time this step's episodes were actually generating (first start to last end; reused
            # groups took none): with overlap it is mostly hidden behind the previous steps' learning.
            row["time/generate_s"] = max(e for _, e in ran) - min(b for b, _ in ran) if ran else 0.0
            row["time/learn_s"] = now - t_learn
            row["time/step_s"] = now - t_prev
            row["async/learner_idle_frac"] = waited / max(now - t_prev, 1e-9)
            row["async/groups_in_flight"] = float(in_flight)
            row["async/groups_dropped"] = float(len(plan.dropped))
            row["async/groups_dropped_total"] = float(adm.dropped_total)
            row["async/max_staleness_seen"] = float(adm.max_seen)
            t_prev = now
            s.metrics.log(k, row)
            print(format_async_row(k, row, staleness=max(plan.staleness, default=0)))
            trajs = [t for g in groups for t in g]
            warnings = (token_limit_warning(trajs, cfg.rollout), stalled_update_warning(row))
            for warning in warnings:  # as the synchronous loop warns
                if warning is not None:
                    print(f"step {k}: {warning}", file=sys.stderr)
            await after_step(k)
            k += 1
        return k
    finally:
        pending = list(tasks.values())
        for task in pending:
            task.cancel()
        if pending:
            with contextlib.suppress(BaseException):
                await asyncio.gather(*pending, return_exceptions=True)
