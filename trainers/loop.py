"""The training loop of ``agentrl train``: one loop for synchronous and asynchronous training.

::

    Admission (agentrl.staleness): lease group i of the run (task j of step k = start + i // groups_per_step)
      while in-flight + buffered < (S + 1) × groups_per_step and the served version ≥ k − S
      → run its episodes (runtime.run_groups; all groups in flight share the runtime's episode limit),
        each trajectory appended to <run>/trajectories.jsonl as it finishes (meta.step = k: the step that
        trains it)
    learner, step k: wait until step k's groups are done (or, --on-stale drop, until one is and drop the
      rest) → drop infra failures (never scored as reward 0); --dynamic-sampling true: drop groups without
      reward signal, a fresh draw replacing each → runtime.update (π_old scored now; ρ̄ = min(π_old/μ, C) on
      stale tokens) → publish version k + 1 to the samplers → one metrics line, a checkpoint

S = ``--max-staleness``. With S = 0 (the default) a step's groups can only start once the previous step
has published its weights: the synchronous trainer, in lock step. With S ≥ 1 the next steps' episodes run
while the learner updates (in a worker thread locally, on the learner actors with ``--ray``), and weights
reach the samplers between turns: a turn that is sampling when the learner publishes finishes on the weights
it started with, and the episode's next turn samples with the new ones. Each turn records its version, so
each token's staleness is known and the correction applies per token.

The data order does not depend on S: step k trains the tasks ``task_sampler.task(k, j)``. A resumed run
reuses the complete groups on disk of its steps that were sampled by weights it still has (versions ≤ the
checkpoint's) and resamples the rest (:func:`reusable_groups`); the admission check drops anything beyond the
bound. SIGINT/SIGTERM (the session's ``stop``) end the loop at once, cancelling what runs
(:func:`until_stopped`).

The loop talks to the machinery only through the run's :class:`~agentrl.trainers.runtime.TrainRuntime`
(``run_groups`` for one group, ``update``, ``publish``, ``version``), so it runs on both runtimes:

* local: with S ≥ 1 the sampler has its own copy of the weights, so the learner's thread never writes
  weights a turn is sampling with;
* Ray (``--ray``): each group is one rollout on the controller, leasing only its own ledger entry to a
  rollout worker; ``update`` runs on the learner actors while workers keep sampling on the inference
  servers; ``publish`` syncs every server between its turns. A straggler this loop drops is abandoned in the
  ledger (its late result is discarded), and a resume rewinds the ledger with the checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeVar

from agentrl import JsonlStore, TrajectoryGroup, TrajectoryMeta, read_groups
from agentrl.dynamic_sampling import StepDraws, draw_metrics, group_verdict
from agentrl.metrics import MetricsLogger
from agentrl.run import RunDir
from agentrl.staleness import Admission, DroppedGroup, Lease, StepOutcome, StepPlan, oldest_version
from agentrl.trainers.runtime import TrainRuntime
from agentrl.trainers.step_metrics import (
    Progress,
    episode_metrics,
    format_async_row,
    format_row,
    stalled_update_warning,
    token_limit_warning,
    tool_use_alarm,
)
from agentrl.trainers.train_setup import TrainConfig

if TYPE_CHECKING:
    from agentrl.trainers.task_sampler import TaskSampler

__all__ = ["Session", "reusable_groups", "run_steps", "until_stopped"]

T = TypeVar("T")

INFRA_DROP = "every episode failed for infrastructure reasons"
STRAGGLER_DROP = "not finished when its step trained (--on-stale drop)"
STALE_DROP = "finished over the staleness bound (--max-staleness)"


@dataclass
class Session:
    """What a running training loop holds (built once in :func:`agentrl.trainers.pg.train`)."""

    cfg: TrainConfig
    run: RunDir
    runtime: TrainRuntime
    store: JsonlStore
    metrics: MetricsLogger
    stop: asyncio.Event
    """Set by SIGINT/SIGTERM: the loop ends at once (a checkpoint then records where it stopped)."""
    first_step: int
    """The step this process started at: only its steps can find their own episodes on disk (a resume)."""
    task_sampler: TaskSampler
    """The task of each draw of each step (its state loaded on resume)."""


async def until_stopped(
    work: Awaitable[T], stop: asyncio.Event
) -> tuple[Literal[True], T] | tuple[Literal[False], None]:
    """``(True, result)`` of ``work``, or ``(False, None)`` when ``stop`` is set first (``work`` is then
    cancelled and awaited). The one place the loop races its work against SIGINT/SIGTERM."""
    job = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({job, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not job.done():
            job.cancel()
            await asyncio.gather(job, return_exceptions=True)
    if job.cancelled():
        return False, None
    return True, job.result()


def reusable_groups(run: RunDir, group_size: int, first_step: int) -> dict[tuple[int, str], TrajectoryGroup]:
    """Complete groups on disk of the steps a process starting at ``first_step`` will train, sampled only by
    weights it has (every turn's version ≤ ``first_step``): ``(step, task id) → group`` (a resume reuses
    them instead of sampling them again; a fresh run finds none)."""
    path = run.trajectories_path
    if not path.exists():
        return {}
    out: dict[tuple[int, str], TrajectoryGroup] = {}
    for g in read_groups(path, size=group_size):
        step = g[0].meta.step
        newest = max(t.max_policy_version for t in g)
        if step is not None and step >= first_step and newest <= first_step:
            out[(step, g.task_id)] = g
    return out


async def run_group(
    s: Session, step: int, seed: int, meta: TrajectoryMeta, progress: Progress
) -> TrajectoryGroup:
    """One group of step ``step`` from the run's runtime, every trajectory appended to the run's store as it
    finishes (on disk before anything else: a kill -9 loses nothing)."""
    events = s.runtime.run_groups(step, seeds=(seed,), group_size=s.cfg.group_size, meta=meta)
    async for done in events:
        await s.store.append(done.trajectory)  # a plain write: no suspension point
        if done.trajectory.meta.is_last_sample:  # the bar counts episodes, not samples
            progress.update(reward=f"{done.trajectory.reward:.2f}")
        if done.group is not None:
            # Return at once: no await between the group's last line on disk and the caller's
            # bookkeeping, so a group cancelled as a straggler is never complete on disk.
            return done.group
    raise RuntimeError(f"the rollout of task {seed} ended without completing its group")


def step_row(
    groups: list[TrajectoryGroup],
    usable: list[TrajectoryGroup],
    draws: StepDraws,
    *,
    reused: int,
    update: dict[str, float],
    times: dict[str, float],
    plan: StepPlan | None,
    adm: Admission,
    in_flight: int,
) -> dict[str, float]:
    """A step's line of metrics.jsonl. ``plan`` is given when the run overlaps (S ≥ 1): the ``async/*``
    keys and ``time/generate_s`` are then added (a synchronous run's lines keep the keys they always had)."""
    row: dict[str, float] = episode_metrics([t for g in groups for t in g])
    row["episodes/reused"] = float(reused)
    row.update(draw_metrics(draws, groups, usable))
    row.update(update)
    row.update(times)
    if plan is not None:
        row["async/learner_idle_frac"] = times["time/rollout_s"] / max(times["time/step_s"], 1e-9)
        row["async/groups_in_flight"] = float(in_flight)
        row["async/groups_dropped"] = float(len(plan.dropped))
        row["async/groups_dropped_total"] = float(adm.dropped_total)
        row["async/max_staleness_seen"] = float(adm.max_seen)
    else:
        row.pop("time/generate_s", None)
    return row


async def run_steps(s: Session, after_step: Callable[[int], Awaitable[None]]) -> int:
    """Train steps ``s.first_step`` .. ``cfg.steps − 1``; call ``after_step(k)`` after each (checkpointing).
    Returns the next step to train: ``cfg.steps``, or the step during which a stop was requested."""
    cfg, runtime, sampler = s.cfg, s.runtime, s.task_sampler
    overlap = cfg.max_staleness > 0
    B = cfg.groups_per_step  # a step's first draws; refills (dynamic sampling) are draws B, B + 1, ...
    adm = Admission(cfg.max_staleness, B, on_stale=cfg.on_stale, start_step=s.first_step, end_step=cfg.steps)
    reuse = reusable_groups(s.run, cfg.group_size, s.first_step)
    results: dict[int, TrajectoryGroup] = {}
    spans: dict[int, tuple[float, float]] = {}
    """Lease index -> (start, end) of its group's generation: a step's generate time is their union's span."""
    draws: dict[int, StepDraws] = {}  # per step: draws issued, verdicts of those finished (refills)
    bars: dict[int, Progress] = {}
    reused_of: dict[int, int] = {}
    seed_of: dict[int, int] = {}  # lease index -> its task seed (what the step's outcome names)
    tasks: dict[int, asyncio.Task[None]] = {}
    wake = asyncio.Event()
    failure: list[BaseException] = []

    async def run_one(lease: Lease, seed: int) -> None:
        try:
            meta = TrajectoryMeta(env_id=cfg.env, step=lease.step, policy_version=runtime.version)
            t0 = time.perf_counter()
            group = await run_group(s, lease.step, seed, meta, bars[lease.step])
            spans[lease.index] = (t0, time.perf_counter())
            finished(lease, group)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # surfaces in the loop below
            failure.append(e)
        finally:
            tasks.pop(lease.index, None)
            wake.set()

    def finished(lease: Lease, group: TrajectoryGroup) -> None:
        results[lease.index] = group
        adm.complete(lease, oldest_version(group))
        draws[lease.step].record(group_verdict(group))

    def start(lease: Lease) -> None:
        from agentrl.rollout import task_id

        seed = seed_of[lease.index] = sampler.task(lease.step, lease.slot)
        old = reuse.pop((lease.step, task_id(cfg.env, seed)), None)
        if old is not None:
            reused_of[lease.step] = reused_of.get(lease.step, 0) + old.num_episodes
            finished(lease, old)
        else:
            tasks[lease.index] = asyncio.ensure_future(run_one(lease, seed))

    def lease_more() -> None:
        while True:
            # Refills first, oldest step first: they are counted in flight, so the bound holds with them.
            refill = [j for j in sorted(draws) if draws[j].need() and adm.can_refill(j, runtime.version)]
            if refill:
                j = refill[0]
                if draws[j].drawn >= B:
                    bars[j].set(f"step {j} refill ({draws[j].drawn + 1} drawn)")
                start(adm.refill(j, draws[j].issue(1)[0], runtime.version))
            elif adm.can_lease(runtime.version):
                lease = adm.lease(runtime.version)
                if lease.step not in draws:
                    draws[lease.step] = StepDraws.of(B, cfg.dynamic_sampling)
                    draws[lease.step].issue(B)  # the step's first draws, leased one by one
                    bars[lease.step] = Progress(
                        cfg.progress, B * cfg.group_size, f"step {lease.step} rollout"
                    )
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
            t_wait = time.perf_counter()
            lease_more()
            while not ready(k) and not failure:
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
                if not (await until_stopped(wake.wait(), s.stop))[0]:
                    return k
            if failure:
                raise failure[0]
            if s.stop.is_set():
                return k
            waited = time.perf_counter() - t_wait
            plan = adm.take(k)
            dropped: list[DroppedGroup] = []
            for lease in plan.dropped:
                task = tasks.pop(lease.index, None)
                if task is not None:
                    task.cancel()
                finished_late = results.pop(lease.index, None) is not None
                spans.pop(lease.index, None)
                seed = seed_of.pop(lease.index, None)
                if seed is not None:  # None: a slot never leased (drop mode), so no task was ever drawn
                    dropped.append(DroppedGroup(seed, STALE_DROP if finished_late else STRAGGLER_DROP))
            groups = [results.pop(lease.index) for lease in plan.trained]
            seeds = [seed_of.pop(lease.index) for lease in plan.trained]
            ran = [spans.pop(lease.index) for lease in plan.trained if lease.index in spans]
            in_flight = len(tasks)
            bars.pop(k).close()
            t_learn = time.perf_counter()
            step_draws = draws.pop(k)
            usable: list[TrajectoryGroup] = []
            trained: list[int] = []
            for seed, g in zip(seeds, groups, strict=True):
                verdict = group_verdict(g)
                u = g.usable()
                if u is None:
                    dropped.append(DroppedGroup(seed, INFRA_DROP))
                elif not step_draws.keep(verdict):
                    dropped.append(DroppedGroup(seed, f"filtered by dynamic sampling: {verdict.value}"))
                else:
                    usable.append(u)
                    trained.append(seed)
            sampler.observe(k, groups)
            drawn_note = step_draws.report(k)  # what dynamic sampling drew, kept, filtered (None: off)
            if drawn_note is not None:
                print(drawn_note)
            update: dict[str, float] = {}
            if usable:
                update = await runtime.update(k, usable)
            elif drawn_note is None:
                print(f"step {k}: no group to train on (every episode failed, or none had signal); no update")
            t_publish = time.perf_counter()
            await runtime.publish(k + 1, StepOutcome(k, tuple(trained), tuple(dropped)))
            now = time.perf_counter()
            times = {
                "time/publish_s": now - t_publish,
                "time/rollout_s": waited,  # the learner's wait for data (generation not hidden by learning)
                # The wall time this step's episodes were generating (first start to last end; reused
                # groups took none): with overlap it is mostly hidden behind the previous steps' learning.
                "time/generate_s": max(e for _, e in ran) - min(b for b, _ in ran) if ran else 0.0,
                "time/learn_s": now - t_learn,
                # Overlapping, a step is the time between two updates; in lock step it starts with its leases
                # (the previous step's checkpoint is not part of it, as it never was).
                "time/step_s": now - (t_prev if overlap else t_wait),
            }
            row = step_row(
                groups,
                usable,
                step_draws,
                reused=reused_of.pop(k, 0),
                update=update,
                times=times,
                plan=plan if overlap else None,
                adm=adm,
                in_flight=in_flight,
            )
            t_prev = now
            trajs = [t for g in groups for t in g]
            alarm = tool_use_alarm(trajs)
            row.update(alarm.metrics)
            s.metrics.log(k, row)
            line = format_row(k, row)
            if overlap:
                line = format_async_row(k, row, staleness=max(plan.staleness, default=0))
            print(line)
            warnings = (token_limit_warning(trajs, cfg.rollout), stalled_update_warning(row), alarm.warning)
            for warning in warnings:
                if warning is not None:
                    print(f"step {k}: {warning}", file=sys.stderr)
            await after_step(k)
            k += 1
        return k
    finally:
        for bar in bars.values():
            bar.close()
        pending = list(tasks.values())
        for task in pending:
            task.cancel()
        if pending:
            with contextlib.suppress(BaseException):
                await asyncio.gather(*pending, return_exceptions=True)
