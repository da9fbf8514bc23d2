"""The Ray runtime: the controller (this driver process) and the actors it runs.

::

    driver / controller ── ledger.jsonl, trajectories.jsonl, metrics.jsonl (the run directory)
      │  lease groups                          ▲ GroupResult (whole groups)
      ▼                                        │
    RolloutWorker × N (rollout + sandbox resources; a sandbox pool each)
      │  per episode: LoadBalancer.acquire → one InferenceServer for all its turns
      ▼
    InferenceServer × N (inference; any UpdatablePolicy) ◀── WeightBroker ◀── LearnerActor × N
                                                             (newest WeightRef)  (learner; placement group)

Faults. A worker that dies (actor killed, node gone) fails its calls with ``RayActorError``: the controller
releases its leases (the groups go back to pending, under a new attempt id), starts a replacement worker and
carries on; a lease past its deadline is released the same way. Inference servers restart (Ray) and pull
the newest weights before serving; an episode whose server died is run again on another server, or recorded
as an infrastructure failure (never reward 0). Both restarts have a budget per time window
(:class:`~.ledger.RestartBudget`). The ledger file lets ``--resume`` pick up after the driver was killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentrl.errors import ConfigError, InfraError, removed_arguments
from agentrl.groups import TrajectoryGroup
from agentrl.rollout import EpisodeDone, task_id
from agentrl.run import RunDir
from agentrl.staleness import RuntimeVersions, StepOutcome
from agentrl.trainers.ray.actors import (
    GroupLease,
    GroupResult,
    InferenceServer,
    LoadBalancer,
    PolicyFactory,
    RolloutWorker,
    ServerPolicy,
    ServerState,
    handed_tokenizer,
    hf_policy_factory,
)
from agentrl.trainers.ray.learner import LearnerActor, shard_groups
from agentrl.trainers.ray.ledger import GroupKey, GroupLedger, GroupState, LedgerEntry, RestartBudget
from agentrl.trainers.ray.weights import WeightBroker, WeightRef, make_transport
from agentrl.types import EpisodeFailure, StopReason, Trajectory, TrajectoryMeta

if TYPE_CHECKING:
    from agentrl.trainers.evaluate import EvalReport
    from agentrl.trainers.train_config import TrainConfig

__all__ = ["RESOURCES", "RayOptions", "RayRuntime", "connect", "ray_runtime", "require_ray"]

RESOURCES = ("rollout", "sandbox", "inference", "learner")
"""Custom resources that place the roles: a rollout worker takes 1 ``rollout`` and 1 ``sandbox``, an
inference server 1 ``inference``, a learner 1 ``learner``. Nodes offer them with ``ray start --resources``."""


def require_ray() -> Any:
    """Import Ray, or say how to get it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "--ray needs Ray, which is not installed: pip install 'agentrl[ray]' (or run without --ray)"
        ) from None
    return ray


@removed_arguments(
    dict.fromkeys(
        ("weights", "weights_dir"),
        "the weight transport is the run's --weights-dir: TrainConfig(deploy=DeployConfig(weights_dir=...)) "
        "publishes through that shared folder, unset through the Ray object store",
    )
)
@dataclass(frozen=True)
class RayOptions:
    """Settings of the Ray runtime that are not part of the experiment (tests and benchmarks set them)."""

    policy_factory: PolicyFactory = hf_policy_factory
    """Builds each server's sampler (default: the HF/vLLM policy the single-process trainer would use)."""
    worker_setup: Callable[[], None] | None = None
    """Run in each rollout worker before anything else (e.g. register an environment)."""
    lease_s: float = 600.0
    """Seconds a worker may hold a group before it is given to another."""
    max_attempts: int = 3
    """Attempts per group before it is dropped."""
    server_restarts: int = 3
    """Restarts (by Ray) of one inference server within ``budget_window_s`` before the run gives up."""
    max_replacements: int = 16
    """Rollout workers the controller may start in place of dead ones within ``budget_window_s``."""
    budget_window_s: float = 3600.0
    """The sliding window of both restart budgets (:class:`~.ledger.RestartBudget`)."""
    local_cpus: int = 2
    """CPUs of the Ray instance ``--ray local`` starts."""
    learner_actor: type[LearnerActor] = LearnerActor
    """The learner actor's class (a benchmark's subclass may add a fixed cost to each update)."""
    gpus_per_actor: float | None = None
    """GPUs each learner and inference server reserves (Ray hides GPUs from actors that reserve none).
    None: 0.5 with ``--device cuda`` (a server and a learner share one GPU), else 0."""

    def gpus(self, cfg: TrainConfig) -> float:
        """The GPUs a learner or server reserves for ``cfg``."""
        if self.gpus_per_actor is not None:
            return self.gpus_per_actor
        return 0.5 if str(cfg.weights.device).startswith("cuda") else 0.0


def connect(address: str, cfg: TrainConfig, opts: RayOptions) -> bool:
    """Join or start Ray for ``address`` (``local``, ``auto`` or ``ray://host:port``); True when this call
    started it (and so must shut it down). An already initialised Ray (a test's cluster) is used as is."""
    ray = require_ray()
    if ray.is_initialized():
        return False
    handlers = _signal_handlers()
    dep = cfg.deploy
    if address == "local":
        res = {
            "rollout": dep.rollout_workers + 1,  # + 1: room for a replacement worker
            "sandbox": dep.rollout_workers + 1,
            "inference": dep.inference_servers,
            "learner": dep.learners,
        }
        # address="local": a new instance even where this machine already runs a cluster (without it
        # ray.init joins the last one started here, and refuses num_cpus for it).
        ray.init(
            address="local",
            num_cpus=opts.local_cpus,
            resources=res,
            include_dashboard=False,
            log_to_driver=False,
        )
    elif address == "auto" or address.startswith("ray://") or re.fullmatch(r"[\w.\-]+:\d+", address):
        ray.init(address=address, log_to_driver=False)
    else:
        raise ConfigError(f"--ray {address!r}: give local, auto, ray://host:port or a head's host:port")
    _restore_signal_handlers(handlers)
    return True


_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _signal_handlers() -> dict[int, Any]:
    """This process's Python handlers of SIGTERM and SIGINT (the trainer's), before ``ray.init``."""
    if threading.current_thread() is not threading.main_thread():
        return {}  # only the main thread may set handlers
    return {sig: signal.getsignal(sig) for sig in _SIGNALS}


def _restore_signal_handlers(handlers: dict[int, Any]) -> None:
    """Put back the handlers ``ray.init`` replaced: it sets a SIGTERM handler of its own (exit 15) and its
    crash handler at the C level, so a driver sent SIGTERM died without the trainer's stop (checkpoint, the
    resume command). Setting the saved Python handlers again restores both levels."""
    for sig, handler in handlers.items():
        if handler is not None:
            signal.signal(sig, handler)


def _check_resources(ray: Any, cfg: TrainConfig) -> None:
    have = ray.cluster_resources()
    dep = cfg.deploy
    need = {"rollout": 1, "sandbox": 1, "inference": dep.inference_servers, "learner": dep.learners}
    short = {k: (have.get(k, 0), v) for k, v in need.items() if have.get(k, 0) < v}
    if short:
        lines = ", ".join(f"{k}: has {h:g}, needs {n}" for k, (h, n) in short.items())
        raise ConfigError(
            f"the Ray cluster lacks custom resources ({lines}); start nodes with e.g. "
            'ray start --resources=\'{"rollout": 2, "sandbox": 2}\' (see docs/distributed.md)'
        )


class RayRuntime(RuntimeVersions):
    """The :class:`~agentrl.trainers.runtime.TrainRuntime` on a Ray cluster (built by :func:`ray_runtime`)."""

    def __init__(self, ray: Any, cfg: TrainConfig, run: RunDir, opts: RayOptions):
        self.ray, self.cfg, self.run, self.opts = ray, cfg, run, opts
        self.ledger = GroupLedger(run.ledger_path, lease_s=opts.lease_s, max_attempts=opts.max_attempts)
        folder = cfg.deploy.weights_dir
        self.transport = make_transport("object_store" if folder is None else "shared_disk", folder)
        self.broker: Any = None
        self.learners: list[Any] = []
        self.placement: Any = None
        self.servers: list[Any] = []
        self.balancer: Any = None
        self.workers: dict[str, Any] = {}
        self._busy: dict[str, int] = {}
        """Workers known to be alive -> groups they hold now (shared by every rollout in flight: the
        asynchronous trainer runs one per group)."""
        self._starting: set[asyncio.Task[None]] = set()
        """Replacement workers not yet answering (leased to only once they do)."""
        self._worker_count = 0
        self._start = 0
        self._version = 0
        self.replaced_workers = 0
        window, k = opts.budget_window_s, range(cfg.deploy.inference_servers)
        self.replacements = RestartBudget("rollout worker replacements", opts.max_replacements, window)
        self.restarts = {
            f"server-{i}": RestartBudget(f"restarts of server-{i}", opts.server_restarts, window) for i in k
        }
        self.last_sync: list[ServerState] = []
        self.learner_checksum = ""
        self.sync_s = 0.0
        """Seconds the last weight sync took (publish, every server loaded and checked)."""

    # --- construction -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the broker, learner group, servers, balancer and workers; publish the starting weights."""
        ray, cfg, dep = self.ray, self.cfg, self.cfg.deploy
        _check_resources(ray, cfg)
        from ray.util import scheduling_strategies as strategies
        from ray.util.placement_group import placement_group

        # The broker and the balancer live on the driver's node: if that node goes, the run goes anyway.
        here = strategies.NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.broker = ray.remote(WeightBroker).options(num_cpus=0, scheduling_strategy=here).remote()
        gpus = self.opts.gpus(cfg)
        self.tok = handed_tokenizer(ray, cfg.model)  # put once for every server and worker (restarts too)
        # Servers and workers start while the learners load: a resume waits for the slowest, not the sum.
        server = ray.remote(InferenceServer)
        self.servers = [
            server.options(
                num_cpus=0,
                num_gpus=gpus,
                resources={"inference": 1},
                max_restarts=-1,  # the controller's budget per window decides when to give up (_publish)
                max_task_retries=0,
            ).remote(f"server-{k}", self.opts.policy_factory, cfg, self.broker, self.transport, self.tok)
            for k in range(dep.inference_servers)
        ]
        # Restarted, its calls retried: were it to die (Ray's OOM killer), every episode would fail.
        retried = {"max_restarts": -1, "max_task_retries": -1, "scheduling_strategy": here}
        self.balancer = ray.remote(LoadBalancer).options(num_cpus=0, **retried).remote(dep.inference_servers)
        for _ in range(dep.rollout_workers):
            self._spawn_worker()
        bundle = {"learner": 1.0, **({"GPU": gpus} if gpus else {})}
        self.placement = placement_group([bundle] * dep.learners, strategy="PACK")
        await self.placement.ready()
        from agentrl.trainers.factories import resolved

        found = resolved(cfg, self.run)  # the learner's sizes this run chose for its device
        actor = ray.remote(self.opts.learner_actor)
        self.learners = [
            actor.options(
                num_cpus=0,
                scheduling_strategy=strategies.PlacementGroupSchedulingStrategy(
                    self.placement, placement_group_bundle_index=r
                ),
                resources={"learner": 1},
                num_gpus=gpus,
            ).remote(r, dep.learners, cfg, resolved=found)
            for r in range(dep.learners)
        ]
        master = await self.learners[0].address.remote() if dep.learners > 1 else None
        await asyncio.gather(*(lrn.setup.remote(master) for lrn in self.learners))
        steps = await asyncio.gather(
            *(lrn.load_checkpoint.remote(str(self.run.path)) for lrn in self.learners)
        )
        self._start = self._version = int(steps[0])
        self.ledger.rewind(self._start)
        if self._start:
            print(f"resumed {self.run.path} at step {self._start} (Ray learner group of {dep.learners})")
        await self._workers_up()
        await self._publish(self._start)

    async def _workers_up(self) -> None:
        """Wait for the first workers to answer. One that dies while it starts (killed, its node gone) is
        replaced like a worker that dies later, instead of failing the run's start; one whose own setup
        raised (Ray's ``actor_init_failed``) fails it with that error."""
        from ray.exceptions import RayActorError

        names = list(self.workers)
        answers = await asyncio.gather(
            *(self.workers[n].where.remote() for n in names), return_exceptions=True
        )
        for a in answers:
            if isinstance(a, BaseException) and not (
                isinstance(a, RayActorError) and not getattr(a, "actor_init_failed", False)
            ):
                raise a
        self._busy = {n: 0 for n, a in zip(names, answers, strict=True) if not isinstance(a, BaseException)}
        for n, a in zip(names, answers, strict=True):
            if isinstance(a, BaseException):
                self._replace_worker(n)

    def _spawn_worker(self) -> str:
        name = f"worker-{self._worker_count}"
        self._worker_count += 1
        self.workers[name] = (
            self.ray.remote(RolloutWorker)
            .options(num_cpus=0, resources={"rollout": 1, "sandbox": 1}, max_concurrency=10_000)
            .remote(name, self.cfg, self.servers, self.balancer, self.opts.worker_setup, tokenizer=self.tok)
        )
        return name

    def _replace_worker(self, dead: str) -> None:
        """Start a worker in place of ``dead``; it takes leases once it answers."""
        if dead not in self.workers:
            return  # another rollout already replaced it
        del self.workers[dead]
        self._busy.pop(dead, None)
        self.replacements.spend()  # InfraError once the window's budget is spent
        self.replaced_workers += 1
        name = self._spawn_worker()

        async def come_up() -> None:
            try:
                await self.workers[name].where.remote()
            except Exception:  # it died before it served (e.g. placed on a node that was going away)
                self._replace_worker(name)
            else:
                self._busy[name] = 0

        task = asyncio.ensure_future(come_up())
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    async def close(self) -> None:
        """Stop every actor and the placement group; close the ledger."""
        ray = self.ray
        for task in list(self._starting):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*(w.close.remote() for w in self.workers.values())), 10)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*(lrn.shutdown.remote() for lrn in self.learners)), 10)
        for a in [*self.workers.values(), *self.servers, *self.learners, self.balancer, self.broker]:
            if a is not None:
                with contextlib.suppress(Exception):
                    ray.kill(a, no_restart=True)
        if self.placement is not None:
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(self.placement)
        self.ledger.close()

    # --- TrainRuntime (start_step: the step of the checkpoint the learner group loaded; version: the one
    # every server reported at the last sync) -----------------------------------------------------------
    async def run_groups(
        self, step: int, *, seeds: Iterable[int], group_size: int, meta: TrajectoryMeta
    ) -> AsyncIterator[EpisodeDone]:
        """Lease the step's groups to the workers and yield every episode of each group that comes back
        (the ledger discards late duplicates); re-lease groups of dead workers and expired leases."""
        from ray.exceptions import OutOfMemoryError, RayActorError, RayTaskError, WorkerCrashedError

        keys = set(self.ledger.issue(step, list(seeds)))
        gone = (RayActorError, OutOfMemoryError, WorkerCrashedError)
        slots = max(1, -(-self.cfg.rollout.concurrency // group_size)) + 1
        busy = self._busy
        running: dict[asyncio.Future[Any], tuple[GroupKey, str, str, Any]] = {}
        given_up: set[GroupKey] = set()

        try:
            while True:
                for e in self.ledger.expired():
                    if e.key in keys:
                        self.ledger.release(e.key, e.group_id, f"lease expired on {e.worker}")
                # A group the ledger dropped after its last attempt still ends as a group (the seam contract:
                # one per seed) of infrastructure failures with the ledger's reason, which the trainer drops.
                for k in sorted(keys - given_up):
                    if self.ledger.entries[k].state is GroupState.DROPPED:
                        given_up.add(k)
                        trajs = _given_up(self.ledger.entries[k], group_size, meta)
                        for i, t in enumerate(trajs):
                            yield EpisodeDone(t, TrajectoryGroup(trajs) if i == len(trajs) - 1 else None)
                # Each lease goes to the worker with the fewest groups in flight (ties by name), so a step of
                # a few groups spreads over the workers instead of filling the first one's slots.
                while free := [n for n in busy if busy[n] < slots]:
                    name = min(free, key=lambda n: (busy[n], n))
                    got = self.ledger.lease(name, keys=keys)
                    if got is None:
                        break
                    lease = GroupLease(got.step, got.seed, got.group_id, group_size, meta)
                    ref = self.workers[name].run_group.remote(lease)
                    running[asyncio.wrap_future(ref.future())] = (got.key, got.group_id, name, ref)
                    busy[name] += 1
                states = [self.ledger.entries[k].state.value for k in keys]
                if all(s in ("done", "dropped", "trained") for s in states):
                    return
                if not running:
                    if not busy and not self._starting:
                        raise InfraError("no rollout worker is alive and none could be started")
                    # Every slot taken by other rollouts, a replacement still starting, or leases held by
                    # nobody we know (waiting for their expiry).
                    await asyncio.sleep(0.05)
                    continue
                finished, _ = await asyncio.wait(running, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
                for fut in finished:
                    key, gid, name, _ref = running.pop(fut)
                    if name in busy:
                        busy[name] -= 1
                    try:
                        result: GroupResult = fut.result()
                    except RayTaskError as err:  # the worker is alive but raised (a call of its own failed)
                        # The exception itself, not Ray's header line (which names only the method and pid).
                        cause = getattr(err, "cause", None) or err
                        why = f"{type(cause).__name__}: {(str(cause).strip().splitlines() or [''])[-1]}"
                        print(f"{name} failed on {gid}: {err}", flush=True)  # with its traceback, for the log
                        self.ledger.release(key, gid, f"{name} failed: {why}"[:300])
                        continue
                    except gone as err:  # its process is gone (killed, its node lost, or by Ray's OOM killer)
                        self.ledger.release(key, gid, f"{name} died: {type(err).__name__}")
                        self._replace_worker(name)
                        continue
                    except Exception as err:  # the worker raised: a bug or an infra fault, not the model's
                        self.ledger.release(key, gid, f"{name} failed: {type(err).__name__}: {err}"[:300])
                        continue
                    if not self.ledger.complete(key, gid):
                        continue  # a late result of an attempt that lost its lease: never trained on
                    trajs = result.trajectories
                    for i, t in enumerate(trajs):
                        yield EpisodeDone(t, TrajectoryGroup(trajs) if i == len(trajs) - 1 else None)
        finally:
            for fut, (key, gid, name, ref) in running.items():
                fut.cancel()
                with contextlib.suppress(Exception):
                    self.ray.cancel(ref)
                if name in busy:
                    busy[name] -= 1
                self.ledger.release(key, gid, "cancelled")

    async def update(self, step: int, groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
        """Deal the groups to the learner ranks and train step ``step``; rank 0's metrics plus the
        controller's."""
        if len(groups) < len(self.learners):
            raise ConfigError(
                f"{len(groups)} usable groups cannot feed {len(self.learners)} learners; lower --learners "
                "or raise --groups-per-step"
            )
        shards = shard_groups(groups, len(self.learners))
        out = await asyncio.gather(
            *(lrn.update.remote(step, s) for lrn, s in zip(self.learners, shards, strict=True))
        )
        metrics: dict[str, float] = dict(out[0])
        metrics.update(self.metrics(step))
        return metrics

    async def publish(self, version: int, outcome: StepOutcome) -> None:
        """Close the step in the ledger as the loop decided it (``outcome``), then publish the learner's
        weights as ``version``, sync every server, and check that each holds exactly the learner's weights."""
        self._settle(outcome)
        await self._publish(version)

    async def _publish(self, version: int) -> None:
        t0 = time.perf_counter()
        refs = await asyncio.gather(*(lrn.publish.remote(version, self.transport) for lrn in self.learners))
        ref: WeightRef = refs[0]
        await self.broker.set.remote(ref)
        states: list[ServerState] = list(await asyncio.gather(*(self._sync(s) for s in self.servers)))
        for s in states:  # each start of a server after its first is a restart by Ray: spend its budget
            while self.restarts[s.name].total < s.starts - 1:
                self.restarts[s.name].spend()
        bad = [s for s in states if s.version != version or s.checksum != ref.checksum]
        if bad:
            raise ConfigError(
                f"weight sync to version {version} failed: {bad} (checksum of the learner's "
                f"{ref.copy or 'published'} copy: {ref.checksum})"
            )
        self.last_sync, self.learner_checksum, self._version = states, ref.checksum, version
        self.sync_s = time.perf_counter() - t0

    async def _sync(self, server: Any, timeout: float = 300.0) -> ServerState:
        """One server's sync; a server that Ray is restarting is waited for (it syncs as it starts)."""
        from ray.exceptions import ActorUnavailableError

        deadline = time.monotonic() + timeout
        while True:
            try:
                state: ServerState = await server.sync.remote()
                return state
            except ActorUnavailableError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

    def _settle(self, outcome: StepOutcome) -> None:
        """Close ``outcome.step`` in the ledger as the loop decided it: its trained groups are trained, each
        dropped one is dropped (finished) or abandoned (still pending or leased) with the loop's reason. A
        group the ledger holds for the step that the outcome does not name (left pending by an interrupted
        run, and not drawn again by this one) is given up as such. Then check the ledger's accounting."""
        step, entries = outcome.step, self.ledger.entries
        trained = {(step, seed) for seed in outcome.trained}
        self.ledger.mark_trained(sorted(trained))
        reasons = {(step, d.seed): d.reason for d in outcome.dropped}
        for k, e in list(entries.items()):
            if e.step != step or k in trained or e.state.value in ("trained", "dropped"):
                continue
            reason = reasons.get(k, f"not in step {step}'s outcome (left from an interrupted run)")
            if e.state.value == "done":
                self.ledger.drop(k, reason)
            else:
                self.ledger.abandon(k, reason)
        self.ledger.check(step, settled=True)

    def metrics(self, step: int) -> dict[str, float]:
        """The controller's counters for ``step`` (``ray/*`` in metrics.jsonl)."""
        c = self.ledger.counts(step)
        return {
            "ray/groups_issued": float(c["issued"]),
            "ray/groups_dropped": float(c["dropped"]),
            "ray/leases_released": float(self.ledger.released),
            "ray/results_discarded": float(self.ledger.discarded),
            "ray/workers_replaced": float(self.replaced_workers),
        }

    async def held_out(self, label: str) -> EvalReport | None:
        """The held-out evaluation (``--eval``) of the served weights, on an inference server (the least
        loaded; every turn goes to it) with the env built in this process, as the local runtime builds it
        (a sandbox pool of its own when the env runs code)."""
        cfg = self.cfg
        if not cfg.output.eval.tasks:
            return None
        if cfg.agent is not None:
            if label == "untrained":
                print("eval: no held-out evaluation with --agent (its task source may have no test split)")
            return None
        from agentrl.chat import ChatRenderer
        from agentrl.models import resolve_tokenizer
        from agentrl.trainers import factories
        from agentrl.trainers.evaluate import run_held_out

        renderer = ChatRenderer(resolve_tokenizer(cfg.model))
        policy = ServerPolicy(self.servers, self.balancer, await self.balancer.acquire.remote())
        pool = factories.sandbox_pool(cfg, cfg.rollout.concurrency)
        try:
            async with pool or contextlib.nullcontext():
                kwargs = factories.env_kwargs(cfg, pool)
                return await run_held_out(
                    policy, renderer, cfg.env, kwargs, cfg.output.eval, cfg.rollout, self.run.path, label
                )
        finally:
            self.balancer.release.remote(policy.index)

    async def finish_updates(self) -> None:
        """Every learner rank frees its optimizer moments (the last checkpoint holds them)."""
        await asyncio.gather(*(lrn.release_optimizer_state.remote() for lrn in self.learners))

    async def save_checkpoint(self, run: RunDir, step: int, *, keep: int) -> None:
        """The learner group writes the checkpoint (the run directory must be on a disk the learner's node
        shares with the driver: with one node, or a shared file system)."""
        await asyncio.gather(
            *(lrn.save_checkpoint.remote(str(run.path), step, keep) for lrn in self.learners)
        )


def _given_up(entry: LedgerEntry, group_size: int, meta: TrajectoryMeta) -> tuple[Trajectory, ...]:
    """A group dropped after its last attempt: empty infra-failure records saying why (never trained on)."""
    base = dataclasses.replace(
        meta,
        seed=entry.seed,
        task_id=task_id(meta.env_id, entry.seed),
        group_id=entry.group_id,
    )
    failure = EpisodeFailure("GroupGivenUp", entry.reason, -1, True)
    return tuple(
        Trajectory(
            token_ids=(),
            loss_mask=(),
            logprobs=(),
            segments=(),
            messages=(),
            stop_reason=StopReason.ENV_ERROR,
            errors=(failure,),
            meta=dataclasses.replace(base, episode_id=f"{entry.group_id}-m{m}"),
        )
        for m in range(group_size)
    )


@contextlib.asynccontextmanager
async def ray_runtime(
    cfg: TrainConfig, run: RunDir, options: RayOptions | None = None
) -> AsyncIterator[RayRuntime]:
    """Connect to Ray (``cfg.deploy.ray``), start the actors, yield the runtime; stop them on exit."""
    from agentrl.trainers.factories import with_sandbox_cap

    opts = options or RayOptions()
    ray = require_ray()
    cfg = with_sandbox_cap(cfg)  # the workers build their pools with the driver's cap
    if cfg.deploy.ray is None:
        raise ConfigError("the Ray runtime needs --ray (local, auto, ray://host:port or a head's host:port)")
    started = connect(cfg.deploy.ray, cfg, opts)
    rt = RayRuntime(ray, cfg, run, opts)
    try:
        await rt.start()
        yield rt
    finally:
        await rt.close()
        if started:
            ray.shutdown()
