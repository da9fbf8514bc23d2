"""Asynchronous training (``--max-staleness S``) on the Ray runtime, on a real small Ray cluster: S = 0 is the
synchronous Ray trainer; S ≥ 1 keeps the staleness bound under random server latencies and replay reproduces
its steps; ``--on-stale drop`` abandons stragglers in the ledger; a rollout worker killed mid-run is replaced
without breaking the bound; ``--curriculum difficulty`` draws each step's tasks from the driver's sampler.

The sampler is the scripted math-tir policy on the inference servers (plan chosen by the sampling seed,
latencies drawn from it), the envs and sandboxes are real, the learner is the tiny model.

A runtime start is most of a Ray test's cost (a worker process and the torch imports of each actor), so the
S = 1 claims share one run (the ``s1_run`` fixture): the staleness bound and replay of
test_staleness_bound_holds_on_ray_with_random_latencies_and_replay_reproduces[1], the worker replacement of
test_a_rollout_worker_killed_during_async_training and the curriculum of
test_curriculum_on_ray_with_staleness_1_draws_from_its_saved_state are each checked on it, in full."""

import asyncio
import contextlib
import dataclasses
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentrl import read_trajectories
from agentrl.groups import group_trajectories
from agentrl.metrics import read_metrics
from agentrl.models import resolve_tokenizer
from agentrl.replay import load as load_run
from agentrl.run import RunDir
from agentrl.trainers import train as pg
from agentrl.trainers.ray import GroupLedger, GroupState, RayOptions, ray_runtime
from agentrl.trainers.replay.reproduce import reproduce_step
from agentrl.trainers.task_sampler import TaskSampler, sampler_state_path

from .scripted import ScriptedTIRFactory
from .test_ray_runtime import config

ray = pytest.importorskip("ray", reason="the Ray runtime's tests need the ray extra (bash .ci/setup --dev)")

pytestmark = pytest.mark.slow

KEYS = ("reward/mean", "learn/loss", "learn/pg_loss", "learn/adv_mean", "learn/adv_abs_mean")


def async_config(tmp_path, name, **kw):
    base = dict(steps=3, keep_checkpoints=10, out=str(tmp_path / name))
    base.update(kw)
    return config(tmp_path, **base)


def train(cfg, opts, *, on_start=None):
    """``pg.train`` on the Ray runtime; ``on_start(rt)`` runs once the actors are up (a test's saboteur)."""

    @contextlib.asynccontextmanager
    async def runtime(c, r):
        async with ray_runtime(c, r, opts) as rt:
            task = asyncio.ensure_future(on_start(rt)) if on_start is not None else None
            try:
                yield rt
            finally:
                if task is not None:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)

    return asyncio.run(pg.train(cfg, runtime=runtime))


def by_step_and_task(run):
    out = defaultdict(list)
    for t in read_trajectories(run):
        out[(t.meta.step, t.meta.task_id)].append((t.token_ids, t.rewards, t.policy_versions))
    return {k: sorted(v) for k, v in out.items()}


def ledger_of(run):
    led = GroupLedger(run / "ledger.jsonl")
    led.close()
    return led


# ---------------------------------------------------------------------------------------------------
def test_s0_on_ray_runs_in_lock_step_and_trains_every_group_once(cluster, tmp_path):
    # S = 0 is the same loop as S >= 1 (trainers/loop.py); that it equals the single-process trainer is
    # test_ray_runtime's test_one_worker_server_learner_equals_the_single_process_trainer.
    opts = RayOptions(policy_factory=ScriptedTIRFactory(jitter_s=(0.0, 0.02, 0.1)))
    run = train(async_config(tmp_path, "sync"), opts)
    assert len(by_step_and_task(run)) == 3 * 4
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        # A synchronous row carries the async keys too (one key set for every S), with nothing in flight,
        # dropped or stale.
        assert r["staleness/max"] == 0.0 and r["async/max_staleness_seen"] == 0
        assert r["async/groups_in_flight"] == 0 and r["async/groups_dropped"] == 0
        assert r["ray/groups_issued"] == 4 and r["ray/groups_dropped"] == 0
    assert any(r["learn/adv_abs_mean"] > 0 for r in rows)  # not vacuous
    assert all(t.policy_versions == (t.meta.step,) * len(t.policy_versions) for t in read_trajectories(run))
    c = ledger_of(run).check(settled=True)
    assert c["trained"] == 12 and c["dropped"] == 0


@dataclass(frozen=True)
class S1Run:
    """The shared S = 1 run (``s1_run``)."""

    cfg: pg.TrainConfig
    run: Path
    killed: bool
    """Whether the saboteur killed worker-0."""


@pytest.fixture(scope="module")
def s1_run(cluster, tmp_path_factory):
    """One S = 1 run of 4 steps on two rollout workers under random server latencies, with
    ``--curriculum difficulty``, and worker-0 killed once it has delivered a group and holds one of step 1 or
    later (the overlap under way): the run of the staleness test's S = 1 case, the killed-worker test and the
    curriculum test (module docstring)."""
    opts = RayOptions(policy_factory=ScriptedTIRFactory(generate_s=0.02, jitter_s=(0.0, 0.05, 0.3)))
    cfg = async_config(
        tmp_path_factory.mktemp("async-s1"),
        "s1",
        max_staleness=1,
        steps=4,
        rollout_workers=2,
        curriculum="difficulty",
    )
    killed = []

    async def saboteur(rt):
        # worker-0 must have delivered a group before it dies: the staleness test checks that both workers
        # ran episodes.
        held: dict[tuple[int, int], str] = {}  # group key -> attempt id, of leases seen on worker-0
        while True:
            entries = rt.ledger.entries
            for e in entries.values():
                if e.state is GroupState.LEASED and e.worker == "worker-0":
                    held[e.key] = e.group_id
            delivered = any(
                entries[k].group_id == gid and entries[k].state in (GroupState.DONE, GroupState.TRAINED)
                for k, gid in held.items()
            )
            if delivered and any(
                e.state is GroupState.LEASED and e.worker == "worker-0" and e.step >= 1
                for e in entries.values()
            ):
                break
            await asyncio.sleep(0.05)
        ray.kill(rt.workers["worker-0"], no_restart=True)
        killed.append(True)

    run = train(cfg, opts, on_start=saboteur)
    return S1Run(cfg, run, bool(killed))


@pytest.mark.parametrize("S", [1, 2])
def test_staleness_bound_holds_on_ray_with_random_latencies_and_replay_reproduces(
    cluster, tmp_path, request, S
):
    """S = 1 checks the shared run (``s1_run``: a worker is replaced and a curriculum draws the tasks as
    well), S = 2 a run of its own with neither."""
    if S == 1:
        run = request.getfixturevalue("s1_run").run
    else:
        opts = RayOptions(policy_factory=ScriptedTIRFactory(generate_s=0.02, jitter_s=(0.0, 0.05, 0.3)))
        cfg = async_config(tmp_path, f"s{S}", max_staleness=S, steps=4, rollout_workers=2)
        run = train(cfg, opts)
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert all(r["staleness/max"] <= S and r["async/max_staleness_seen"] <= S for r in rows)
    assert max(r["staleness/max"] for r in rows) >= 1  # the next steps' groups did sample during learning
    trajs = list(read_trajectories(run))
    assert all(t.meta.step - min(t.policy_versions) <= S for t in trajs)
    # Both workers ran episodes, and no other worker did but the replacements of a killed one (S = 1).
    replaced = int(rows[-1]["ray/workers_replaced"])
    assert (replaced >= 1) if S == 1 else (replaced == 0)
    workers = {t.meta.provenance.worker for t in trajs}
    assert (
        {"worker-0", "worker-1"}
        <= workers
        <= {"worker-0", "worker-1", *(f"worker-{2 + i}" for i in range(replaced))}
    )
    c = ledger_of(run).check(settled=True)
    assert c["trained"] == 16 and c["dropped"] == 0
    stale = [r for r in rows if r["staleness/stale_token_frac"] > 0]
    assert stale and all("correction/rho_mean" in r for r in stale)
    # Replay: each step from its checkpoint, its recorded trajectories (μ and versions) and the correction.
    tok = resolve_tokenizer("tiny")
    loaded = load_run(run)
    for k in range(4):
        report = reproduce_step(loaded, k, tokenizer=tok)
        assert report.matches, (k, [c for c in report.checks if not c.match])


def test_drop_mode_on_ray_abandons_stragglers_in_the_ledger(cluster, tmp_path):
    # One turn seed in five is a straggler (3 s) while the others take 20 ms.
    opts = RayOptions(policy_factory=ScriptedTIRFactory(jitter_s=(0.02, 0.02, 0.02, 0.02, 3.0)))
    cfg = async_config(tmp_path, "drop", max_staleness=1, on_stale="drop", steps=4)
    run = train(cfg, opts)
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert all(r["staleness/max"] <= 1 for r in rows)
    dropped = rows[-1]["async/groups_dropped_total"]
    assert dropped == sum(r["async/groups_dropped"] for r in rows) > 0
    led = ledger_of(run)
    c = led.check(settled=True)
    assert c["dropped"] == dropped and c["trained"] + c["dropped"] == 16
    reasons = {e.reason for e in led.entries.values() if e.state is GroupState.DROPPED}
    assert reasons <= {
        "not finished when its step trained (--on-stale drop)",
        "finished over the staleness bound (--max-staleness)",
    }
    # Nothing of an abandoned group was trained: the steps' episode counts are whole trained groups.
    assert all(r["episodes/total"] % cfg.group_size == 0 and r["episodes/total"] >= 2 for r in rows)


def test_a_rollout_worker_killed_during_async_training(s1_run):
    """On the shared S = 1 run (``s1_run``): worker-0 killed during the overlap of steps is replaced."""
    cfg, run = s1_run.cfg, s1_run.run
    assert s1_run.killed
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert rows[-1]["ray/workers_replaced"] >= 1 and rows[-1]["ray/leases_released"] >= 1
    assert all(r["staleness/max"] <= 1 and r["async/max_staleness_seen"] <= 1 for r in rows)
    assert all(t.meta.step - min(t.policy_versions) <= 1 for t in read_trajectories(run))
    c = ledger_of(run).check(settled=True)
    assert c["trained"] == 16 and c["dropped"] == 0
    ids = [t.meta.episode_id for t in read_trajectories(run)]
    # Every group trained once: the killed worker's groups were rerun under a new attempt id.
    trained = {e.group_id for e in ledger_of(run).entries.values() if e.state is GroupState.TRAINED}
    assert len(trained) == 16
    assert all(sum(i.startswith(g + "-") for i in ids) == cfg.group_size for g in trained)


def test_curriculum_on_ray_with_staleness_1_draws_from_its_saved_state(s1_run):
    """On the shared S = 1 run (``s1_run``): ``--curriculum difficulty`` with ``--max-staleness 1`` on Ray.
    The one loop draws every step's tasks from the trainer's sampler on the driver, the sampler observes each
    trained group's mean return, its state is saved beside every checkpoint, and a step's draws are what a
    sampler restored from that state draws. The ledger stays settled (issued = trained + dropped)."""
    cfg, run = s1_run.cfg, s1_run.run
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2, 3]
    c = ledger_of(run).check(settled=True)
    assert c["issued"] == c["trained"] == 16

    groups = list(group_trajectories(read_trajectories(run)))
    seeds: dict[int, list[int]] = defaultdict(list)
    mean_return: dict[tuple[int, int], float] = {}
    for g in groups:
        step, seed = g[0].meta.step, g[0].meta.seed
        seeds[step].append(seed)
        mean_return[(step, seed)] = sum(sum(t.rewards) for t in g) / len(g)
    # Lag 1: steps 0 and 1 see no observation yet, so both draw their fresh tasks.
    fresh = TaskSampler(cfg.seed, 4, 4, "difficulty", lag=1)
    assert {k: sorted(v) for k, v in seeds.items() if k < 2} == {
        k: sorted(fresh.tasks(k, range(4))) for k in (0, 1)
    }

    # The state saved after 2 steps holds exactly what the trained groups of steps 0 and 1 returned.
    state = json.loads(sampler_state_path(RunDir(run), 2).read_text())
    assert state["curriculum"] == "difficulty"
    assert state["history"] == {
        str(seed): [[k, pytest.approx(mean_return[(k, seed)])]] for k in (0, 1) for seed in seeds[k]
    }
    # Step 2 sees step 0's observations (lag 1): what a sampler restored from that state draws.
    ref = TaskSampler(cfg.seed, 4, 4, "difficulty", lag=1)
    ref.load_state(state)
    assert sorted(seeds[2]) == sorted(ref.tasks(2, range(4)))
    # Not vacuous: step 2 draws tasks of step 0 again (known ones, from the restored pools), none of step 1's
    # (lag 1), and the observed returns differ between tasks (so the pools are not all one difficulty).
    assert set(seeds[2]) & set(seeds[0]) and not set(seeds[2]) & set(seeds[1])
    assert len({mean_return[(0, s)] for s in seeds[0]}) > 1


def test_async_ray_cli_config_is_accepted(tmp_path):
    # The refusal of --max-staleness with --ray is gone; bad combinations still fail early.
    cfg = async_config(tmp_path, "cli", max_staleness=1, ray="local")
    assert cfg.max_staleness == 1 and cfg.deploy.ray == "local"
    with pytest.raises(Exception, match="on-stale drop needs"):
        dataclasses.replace(cfg, max_staleness=0, on_stale="drop")
