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

:func:`run_steps` is the driver: wait until step k is ready, take its batch, judge it (:func:`judge`: what is
trained, what is dropped and why), update, publish the step's outcome, log. :class:`Leases` owns admission and
the groups in flight: one :class:`InFlight` record per lease (its seed, its rollout, its group, when it ran)
and one :class:`StepState` per step not yet trained (its draws, its progress bar, what it reused).

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
from agentrl.trainers.train_config import TrainConfig

if TYPE_CHECKING:
    from agentrl.trainers.task_sampler import TaskSampler

__all__ = ["Session", "reusable_groups", "run_steps", "until_stopped"]

T = TypeVar("T")

INFRA_DROP = "every episode failed for infrastructure reasons"
STRAGGLER_DROP = "not finished when its step trained (--on-stale drop)"
STALE_DROP = "finished over the staleness bound (--max-staleness)"
UNREWARDED_DROP = "never rewarded: its session ended without a reward and none came before --reward-deadline"


@dataclass
class Session:
    """What a running training loop holds (built once in :func:`agentrl.trainers.train.train`)."""

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
    events = s.runtime.run_groups(step, seeds=(seed,), group_size=s.cfg.batch.group_size, meta=meta)
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
    plan: StepPlan,
    adm: Admission,
    in_flight: int,
) -> dict[str, float]:
    """A step's line of metrics.jsonl. Synchronous and asynchronous runs write the same keys, so that plots
    and comparisons of the two never branch: in lock step the learner's idle fraction is the rollout's share
    of the step, and nothing is in flight, dropped or stale (0)."""
    row: dict[str, float] = episode_metrics([t for g in groups for t in g])
    row["episodes/reused"] = float(reused)
    row.update(draw_metrics(draws, groups, usable))
    row.update(update)
    row.update(times)
    row["async/learner_idle_frac"] = times["time/rollout_s"] / max(times["time/step_s"], 1e-9)
    row["async/groups_in_flight"] = float(in_flight)
    row["async/groups_dropped"] = float(len(plan.dropped))
    row["async/groups_dropped_total"] = float(adm.dropped_total)
    row["async/max_staleness_seen"] = float(adm.max_seen)
    return row


@dataclass
class InFlight:
    """One leased group, from its lease to its step's training: the loop's one record of it."""

    lease: Lease
    seed: int
    """Its task seed (what the step's outcome names)."""
    task: asyncio.Task[None] | None = None
    """Its rollout while it runs (None once it finished, or for a group reused from disk)."""
    group: TrajectoryGroup | None = None
    """The finished group."""
    span: tuple[float, float] | None = None
    """(start, end) of its generation; None for a reused group (it took none)."""


@dataclass
class StepState:
    """One step's draws before it trains: what was issued and judged (refills), its bar, what was reused."""

    draws: StepDraws
    bar: Progress
    reused: int = 0
    """Episodes of the step reused from disk (a resume)."""


@dataclass
class Taken:
    """A step's batch as :meth:`Leases.take` hands it over: the plan and the groups it names."""

    plan: StepPlan
    groups: list[TrajectoryGroup]
    """The trained leases' groups, in the order they finished."""
    seeds: list[int]
    """Their task seeds."""
    dropped: list[DroppedGroup]
    """The plan's dropped groups that had a task, with the reason."""
    spans: list[tuple[float, float]]
    """Generation spans of the trained groups that ran in this process."""
    state: StepState


class Leases:
    """Admission, leasing and the groups in flight of a running loop (:func:`run_steps` drives it)."""

    def __init__(self, s: Session):
        self.s, cfg = s, s.cfg
        # A step's first draws; refills (dynamic sampling) are draws B, B + 1...
        self.B = cfg.batch.groups_per_step
        self.adm = Admission(
            cfg.async_.max_staleness,
            self.B,
            on_stale=cfg.async_.on_stale,
            start_step=s.first_step,
            end_step=cfg.output.steps,
        )
        self.reuse = reusable_groups(s.run, cfg.batch.group_size, s.first_step)
        self.leased: dict[int, InFlight] = {}
        """Lease index -> its record, from the lease until its step takes it."""
        self.steps: dict[int, StepState] = {}
        self.wake = asyncio.Event()
        """Set whenever a group finishes or fails: the driver looks again."""
        self.failure: list[BaseException] = []

    def running(self) -> int:
        """Groups whose rollout is running now."""
        return sum(1 for r in self.leased.values() if r.task is not None)

    def lease_more(self) -> None:
        """Lease every group the admission rules allow now: refills first, oldest step first (they count in
        flight, so the bound holds with them), then the next groups of the data order."""
        cfg, version = self.s.cfg, self.s.runtime.version
        while True:
            refill = [j for j in sorted(self.steps) if self.steps[j].draws.need()]
            refill = [j for j in refill if self.adm.can_refill(j, version)]
            if refill:
                st = self.steps[refill[0]]
                if st.draws.drawn >= self.B:
                    st.bar.set(f"step {refill[0]} refill ({st.draws.drawn + 1} drawn)")
                self._start(self.adm.refill(refill[0], st.draws.issue(1)[0], version))
            elif self.adm.can_lease(version):
                lease = self.adm.lease(version)
                if lease.step not in self.steps:
                    draws = StepDraws.of(self.B, cfg.batch.dynamic_sampling)
                    draws.issue(self.B)  # the step's first draws, leased one by one
                    size = self.B * cfg.batch.group_size
                    bar = Progress(cfg.output.progress, size, f"step {lease.step} rollout")
                    self.steps[lease.step] = StepState(draws, bar)
                self._start(lease)
            else:
                return

    def ready(self, k: int) -> bool:
        """Step ``k`` can train: the admission says so and, with --on-stale wait, every draw finished and
        none more is needed (refills included)."""
        st = self.steps.get(k)
        drop = self.s.cfg.async_.on_stale == "drop"
        return self.adm.ready(k) and (drop or (st is not None and st.draws.complete))

    def take(self, k: int) -> Taken:
        """Step ``k``'s batch (call when :meth:`ready`): its trained groups; its dropped ones cancelled, each
        with the reason."""
        plan = self.adm.take(k)
        dropped: list[DroppedGroup] = []
        for lease in plan.dropped:
            r = self.leased.pop(lease.index, None)
            if r is None:  # a slot never leased (drop mode): no task was ever drawn
                continue
            if r.task is not None:
                r.task.cancel()
            dropped.append(DroppedGroup(r.seed, STALE_DROP if r.group is not None else STRAGGLER_DROP))
        trained = [self.leased.pop(lease.index) for lease in plan.trained]
        groups = [r.group for r in trained if r.group is not None]
        spans = [r.span for r in trained if r.span is not None]
        state = self.steps.pop(k)
        state.bar.close()
        return Taken(plan, groups, [r.seed for r in trained], dropped, spans, state)

    async def close(self) -> None:
        """Close the bars and cancel every rollout still running."""
        for st in self.steps.values():
            st.bar.close()
        pending = [r.task for r in self.leased.values() if r.task is not None]
        for task in pending:
            task.cancel()
        if pending:
            with contextlib.suppress(BaseException):
                await asyncio.gather(*pending, return_exceptions=True)

    def _start(self, lease: Lease) -> None:
        from agentrl.rollout import task_id

        rec = self.leased[lease.index] = InFlight(lease, self.s.task_sampler.task(lease.step, lease.slot))
        old = self.reuse.pop((lease.step, task_id(self.s.cfg.env, rec.seed)), None)
        if old is not None:
            self.steps[lease.step].reused += old.num_episodes
            self._finished(rec, old)
        else:
            rec.task = asyncio.ensure_future(self._run(rec))

    async def _run(self, rec: InFlight) -> None:
        s, lease = self.s, rec.lease
        try:
            meta = TrajectoryMeta(env_id=s.cfg.env, step=lease.step, policy_version=s.runtime.version)
            t0 = time.perf_counter()
            group = await run_group(s, lease.step, rec.seed, meta, self.steps[lease.step].bar)
            rec.span = (t0, time.perf_counter())
            self._finished(rec, group)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # surfaces in the driver
            self.failure.append(e)
        finally:
            rec.task = None
            self.wake.set()

    def _finished(self, rec: InFlight, group: TrajectoryGroup) -> None:
        rec.group = group
        self.adm.complete(rec.lease, oldest_version(group))
        self.steps[rec.lease.step].draws.record(group_verdict(group))


def judge(taken: Taken, draws: StepDraws) -> tuple[list[TrajectoryGroup], list[int], list[DroppedGroup]]:
    """The step's usable groups, their seeds and every group left out with why: a group whose episodes all
    failed for infrastructure reasons, or (dynamic sampling) one without reward signal."""
    usable: list[TrajectoryGroup] = []
    trained: list[int] = []
    dropped = list(taken.dropped)
    for seed, g in zip(taken.seeds, taken.groups, strict=True):
        verdict = group_verdict(g)
        u = g.usable()
        if u is None:
            dropped.append(DroppedGroup(seed, UNREWARDED_DROP if _unrewarded(g) else INFRA_DROP))
        elif not draws.keep(verdict):
            dropped.append(DroppedGroup(seed, f"filtered by dynamic sampling: {verdict.value}"))
        else:
            usable.append(u)
            trained.append(seed)
    return usable, trained, dropped


def _unrewarded(g: TrajectoryGroup) -> bool:
    """Every member is a gateway session whose reward never came (``gateway --train``)."""
    from agentrl.trainers.gateway.core import REWARD_MISSING

    return all(any(e.kind == REWARD_MISSING for e in t.errors) for t in g)


async def run_steps(s: Session, after_step: Callable[[int], Awaitable[None]]) -> int:
    """Train steps ``s.first_step`` .. ``cfg.output.steps − 1``; call ``after_step(k)`` after each
    (checkpointing). Returns the next step to train: ``cfg.output.steps``, or the step during which a stop
    was requested."""
    cfg, runtime = s.cfg, s.runtime
    overlap = cfg.async_.max_staleness > 0
    leases = Leases(s)
    k = s.first_step
    t_prev = time.perf_counter()
    try:
        while k < cfg.output.steps:
            t_wait = time.perf_counter()
            leases.lease_more()
            while not leases.ready(k) and not leases.failure:
                leases.lease_more()  # refills of groups that finished without signal
                if leases.ready(k):
                    break
                if not leases.running():  # nothing running and nothing may start: this would wait forever
                    raise RuntimeError(
                        f"step {k} cannot get its data: no group is running and none may start (the sampler "
                        f"serves version {runtime.version}, max staleness {cfg.async_.max_staleness}); "
                        "the sampler must be at the learner's version"
                    )
                leases.wake.clear()
                if not (await until_stopped(leases.wake.wait(), s.stop))[0]:
                    return k
            if leases.failure:
                raise leases.failure[0]
            if s.stop.is_set():
                return k
            waited = time.perf_counter() - t_wait
            taken = leases.take(k)
            in_flight = leases.running()
            t_learn = time.perf_counter()
            draws = taken.state.draws
            usable, trained, dropped = judge(taken, draws)
            s.task_sampler.observe(k, taken.groups)
            drawn_note = draws.report(k)  # what dynamic sampling drew, kept, filtered (None: off)
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
            ran = taken.spans
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
                taken.groups,
                usable,
                draws,
                reused=taken.state.reused,
                update=update,
                times=times,
                plan=taken.plan,
                adm=leases.adm,
                in_flight=in_flight,
            )
            t_prev = now
            trajs = [t for g in taken.groups for t in g]
            alarm = tool_use_alarm(trajs)
            row.update(alarm.metrics)
            s.metrics.log(k, row)
            line = format_row(k, row)
            if overlap:
                line = format_async_row(k, row, staleness=max(taken.plan.staleness, default=0))
            print(line)
            warnings = (token_limit_warning(trajs, cfg.rollout), stalled_update_warning(row), alarm.warning)
            for warning in warnings:
                if warning is not None:
                    print(f"step {k}: {warning}", file=sys.stderr)
            await after_step(k)
            k += 1
        return k
    finally:
        await leases.close()
