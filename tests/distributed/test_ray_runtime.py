"""The Ray runtime on a real (small) Ray cluster: equivalence with the single-process trainer, and every fault
the issue lists: a rollout worker killed, its node removed, an inference server killed (the driver SIGKILLed:
test_killed_drivers.py).

The sampler is the scripted math-tir policy (sleep-bound, plan chosen by the sampling seed), the envs and
sandboxes are real, the learner is the tiny model."""

import asyncio
import dataclasses
import json
import time
from collections import defaultdict

import pytest

from agentrl import read_trajectories
from agentrl.learner import Learner, LearnerConfig
from agentrl.metrics import read_metrics
from agentrl.models import resolve_model, resolve_tokenizer
from agentrl.rollout import RolloutConfig
from agentrl.run import RunDir
from agentrl.staleness import DroppedGroup, StepOutcome
from agentrl.tools import _schema
from agentrl.trainers import factories, train_setup
from agentrl.trainers import train as pg
from agentrl.trainers.evaluate import EvalConfig
from agentrl.trainers.ray import GroupLedger, GroupState, RayOptions, ray_runtime
from agentrl.types import StopReason, TrajectoryMeta
from agentrl.update import score_and_credit
from agentrl.weights import weights_checksum

from .conftest import add_rollout_node
from .scripted import ScriptedTIRFactory, ScriptedTIRPolicy, handover_probe

ray = pytest.importorskip("ray", reason="the Ray runtime's tests need the ray extra (bash .ci/setup --dev)")

pytestmark = pytest.mark.slow


def config(tmp_path, *, ray="auto", **kw):
    """The tests' run; ``rollout_workers``, ``inference_servers``, ``learners``, ``weights_dir`` go to its
    ``deploy``."""
    moved = ("rollout_workers", "inference_servers", "learners", "weights_dir")
    deploy = {k: kw.pop(k) for k in moved if k in kw}
    base = dict(
        model="tiny",
        env="math-tir-arith-v0",
        group_size=2,
        groups_per_step=4,
        steps=1,
        out=str(tmp_path / "run"),
        rollout=RolloutConfig(
            max_turns=3, max_new_tokens=48, concurrency=4, on_template_mismatch="stop", seed=3
        ),
        learner=LearnerConfig(lr=1e-3),
        progress=False,
        deploy=train_setup.DeployConfig(ray=ray, **deploy),
        # No held-out evaluation before and after training: 2 x 64 episodes, more than the runs' own steps.
        # It runs on Ray in test_one_worker_server_learner_equals_the_single_process_trainer (4 tasks).
        eval=EvalConfig(tasks=0),
    )
    base.update(kw)
    return train_setup.TrainConfig(**base)


def new_run(cfg):
    cfg, run = train_setup.prepare_run(cfg)
    return cfg, run


async def wait_until(predicate, timeout=180.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.05)


class Rollout:
    """One step's run_groups driven in the background, so a test can break things while it runs."""

    def __init__(self, rt, cfg, step=0):
        self.events = []
        seeds = train_setup.task_seeds(cfg.seed, step, cfg.groups_per_step)
        meta = TrajectoryMeta(env_id=cfg.env, step=step, policy_version=rt.version)
        self.expected = sorted(f"{cfg.env}:{s}" for s in seeds)

        async def consume():
            async for done in rt.run_groups(step, seeds=seeds, group_size=cfg.group_size, meta=meta):
                self.events.append(done)

        self.task = asyncio.ensure_future(consume())

    async def finish(self, timeout=300.0):
        await asyncio.wait_for(self.task, timeout)
        groups = [d.group for d in self.events if d.group is not None]
        trajs = [d.trajectory for d in self.events]
        ids = [t.meta.episode_id for t in trajs]
        assert sorted(g.task_id for g in groups) == self.expected  # exactly the step's groups, once each
        assert len(ids) == len(set(ids)) == len(self.expected) * len(groups[0])  # no duplicate trajectory
        return groups, trajs


def leased_by(rt, worker):
    return any(e.state is GroupState.LEASED and e.worker == worker for e in rt.ledger.entries.values())


async def finish_step(rt, groups, version):
    """Train on the groups and publish: the ledger must settle and every server hold the learner's weights."""
    usable = [u for g in groups if (u := g.usable()) is not None]
    metrics = await rt.update(version - 1, usable)
    trained = tuple(g[0].meta.seed for g in usable)
    infra = [DroppedGroup(g[0].meta.seed, "every episode failed") for g in groups if g.usable() is None]
    await rt.publish(version, StepOutcome(version - 1, trained, tuple(infra)))
    assert all(s.version == version and s.checksum == rt.learner_checksum for s in rt.last_sync)
    return metrics


# ---------------------------------------------------------------------------------------------------
async def test_one_worker_server_learner_equals_the_single_process_trainer(cluster, tmp_path, monkeypatch):
    """Also: the held-out evaluation runs on an inference server (one runtime start for both claims)."""
    # Single process: the same scripted sampler in place of HFPolicy.
    monkeypatch.setattr(
        factories,  # where the local runtime builds its sampler
        "make_policy",
        lambda cfg, model, tok, renderer, device, *, version: ScriptedTIRPolicy(tok, version=version),
    )
    local_cfg = config(tmp_path, ray=None, out=str(tmp_path / "local"))
    await pg.train(local_cfg)
    # The Ray run also evaluates on held-out tasks, before and after its step, on its inference server (the
    # evaluation writes only eval*.json: the trajectories and metrics compared below are the training's).
    ray_cfg = config(tmp_path, out=str(tmp_path / "ray"), eval=EvalConfig(tasks=4, samples=1))
    opts = RayOptions(policy_factory=ScriptedTIRFactory())
    await pg.train(ray_cfg, runtime=lambda c, r: ray_runtime(c, r, opts))
    report = json.loads((tmp_path / "ray" / "eval.json").read_text())
    for label in ("untrained", "trained"):
        # Every episode was sampled on the scripted inference server (none lost to the infrastructure).
        assert report[label]["tasks"] == 4 and report[label]["infra_failures"] == 0, report[label]
        assert (tmp_path / "ray" / f"eval-{label}.json").is_file()

    def by_task(run):
        out = defaultdict(list)
        for t in read_trajectories(run):
            out[t.meta.task_id].append(t)
        return out

    local, remote = by_task(tmp_path / "local"), by_task(tmp_path / "ray")
    assert sorted(local) == sorted(remote) and len(local) == 4

    def rows(ts):
        return sorted((t.token_ids, t.rewards, t.policy_versions) for t in ts)

    for task in local:
        assert rows(local[task]) == rows(remote[task]), task
    # Advantages: the estimator on each group, scored by the same initial weights.
    learner = Learner(resolve_model(train_setup.model_spec(local_cfg)).model, local_cfg.learner)
    from agentrl.groups import TrajectoryGroup

    def advantages(ts):
        credit = score_and_credit(
            learner, [TrajectoryGroup(tuple(ts))], estimator=local_cfg.estimator, pad_id=0
        )
        m = credit.batch.loss_mask_B_T.bool()
        return sorted(
            tuple(round(float(a), 6) for a in credit.advantages_B_T[i][m[i]]) for i in range(len(ts))
        )

    rewards = set()
    for task in local:
        assert advantages(local[task]) == advantages(remote[task]), task
        rewards |= {t.reward for t in local[task]}
    assert rewards == {0.0, 1.0}  # the groups are not trivial: some members right, some wrong
    # Provenance on the Ray side only; the trajectory format is otherwise the same.
    t = remote[next(iter(remote))][0]
    prov = t.meta.provenance
    assert prov is not None and prov.node and prov.sandbox_pool.startswith("worker-0@")
    assert prov.server == "server-0" and prov.worker == "worker-0"
    assert not {"worker", "server", "node", "sandbox_pool"} & set(t.meta.extra)  # one record: the typed one
    # The learner saw the same batch: the same update, the same checkpoint.
    lm, rm = read_metrics(tmp_path / "local")[0], read_metrics(tmp_path / "ray")[0]
    for key in ("reward/mean", "learn/adv_mean", "learn/adv_abs_mean", "learn/loss"):
        assert lm[key] == pytest.approx(rm[key], rel=1e-5, abs=1e-7), key
    assert rm["ray/groups_issued"] == 4 and rm["ray/leases_released"] == 0
    ckpts = [RunDir(tmp_path / r).latest_checkpoint() for r in ("local", "ray")]
    assert all(c is not None and c.step == 1 for c in ckpts)


@pytest.mark.timeout(600)  # three steps, each broken once, on one runtime (the default 300 s is for one)
async def test_a_worker_killed_a_server_killed_and_a_node_removed_mid_step(cluster, tmp_path):
    """Every fault of the issue on one runtime start (a start of the actors is most of a Ray test's time),
    one per step, each asserting what its own test did:

    - step 0, a rollout worker killed mid-step: its leases are released, a replacement starts, the step ends
      with exactly its groups (no duplicate), re-run groups ran on another worker, none lost;
    - step 1, an inference server killed mid-step (``--weights-dir``: the weights travel as files in a
      shared folder, and the restarted server reads the newest): Ray restarts it, it catches up to the
      current version before it serves, nothing is sampled with stale weights; the replacement worker
      and the restarted server use the tokenizer the driver handed over, and the worker imported no torch;
    - step 2, the node of a worker removed mid-step: its groups re-run on another node.

    Two workers and two servers throughout, so each fault has a survivor of its kind."""
    shared = tmp_path / "weights"
    cfg, run = new_run(
        config(tmp_path, rollout_workers=2, inference_servers=2, groups_per_step=6, weights_dir=str(shared))
    )
    opts = RayOptions(policy_factory=ScriptedTIRFactory(generate_s=0.3), lease_s=120)
    removed = False
    try:
        async with ray_runtime(cfg, run, opts) as rt:
            assert rt.transport.name == "shared_disk"
            # --- step 0: a rollout worker killed while it holds a lease.
            rollout = Rollout(rt, cfg)
            await wait_until(lambda: leased_by(rt, "worker-0"))
            ray.kill(rt.workers["worker-0"], no_restart=True)
            groups, trajs = await rollout.finish()
            assert rt.ledger.released >= 1 and rt.replaced_workers == 1
            assert "worker-0" not in rt.workers and "worker-2" in rt.workers
            assert not any(t.infra_failure for t in trajs)
            retried = [g for g in groups if not g.group_id.endswith("-a0")]
            assert retried and all(t.meta.provenance.worker != "worker-0" for g in retried for t in g)
            metrics = await finish_step(rt, groups, 1)
            assert metrics["ray/workers_replaced"] == 1 and metrics["ray/groups_dropped"] == 0

            # --- step 1: an inference server killed while it serves. The servers hold version 1 (the step
            # above); the restarted one starts at 0 and must catch up.
            rollout = Rollout(rt, cfg, step=1)
            await wait_until(lambda: len(rollout.events) >= 1)
            ray.kill(rt.servers[0], no_restart=False)
            groups, trajs = await rollout.finish()
            for t in trajs:
                if t.infra_failure:  # lost with its server after the retries: recorded, never scored
                    assert t.stop_reason is StopReason.POLICY_ERROR and "died" in t.errors[-1].message
                else:  # nothing sampled with stale weights
                    assert set(t.policy_versions) == {1}, t.meta.provenance
            assert any(
                t.infra_failure
                or t.meta.provenance.episode_attempts > 1
                or t.meta.provenance.server_failovers
                for t in trajs
            )
            states = await asyncio.gather(*(rt._sync(s) for s in rt.servers))
            assert [s.starts for s in states] == [2, 1]
            assert all(s.version == 1 and s.checksum == rt.learner_checksum for s in states)
            # The replacement worker and the restarted server render with the tokenizer the driver handed
            # over (one object in the store), not one each loaded through AutoTokenizer; the worker, which
            # renders and runs episodes, has imported no torch after two steps' episodes.
            tok = resolve_tokenizer(cfg.model)
            chat = tok.apply_chat_template([{"role": "user", "content": "2+2? 数学"}], tokenize=False)
            probed = (rt.workers["worker-2"], rt.servers[0])
            worker, server = await asyncio.gather(
                *(a.__ray_call__.remote(handover_probe, cfg.model) for a in probed)
            )
            for p in (worker, server):
                assert p["used_is_handed"] and p["resolves_to_handed"], p
                assert p["backend"] == tok.backend_tokenizer.to_str() and p["chat"] == chat
            if _schema.installed_source_hash() == _schema.MIRRORED_SOURCE:  # else @tool schemas import torch
                assert not worker["torch"]
            await finish_step(rt, groups, 2)

            # --- step 2: the node of a worker removed while the worker holds a lease.
            released, replaced = rt.ledger.released, rt.replaced_workers
            victim_worker = sorted(rt.workers)[0]
            where = await rt.workers[victim_worker].where.remote()
            (victim,) = [n for n in cluster.worker_nodes if n.node_id.startswith(where)]
            rollout = Rollout(rt, cfg, step=2)
            await wait_until(lambda: leased_by(rt, victim_worker))
            removed = True
            cluster.remove_node(victim, allow_graceful=False)
            groups, _ = await rollout.finish()
            assert rt.ledger.released > released and rt.replaced_workers > replaced
            nodes = {t.meta.provenance.node for g in groups if not g.group_id.endswith("-a0") for t in g}
            assert nodes and where not in nodes  # the re-run groups ran elsewhere
            await finish_step(rt, groups, 3)
    finally:
        if removed:
            add_rollout_node(cluster)  # give the session its capacity back
    with GroupLedger(run.path / "ledger.jsonl") as ledger:
        c = ledger.check(0, settled=True)
    assert c["issued"] == c["trained"] == 6
    # The newest weights file in the shared folder is the last version published.
    assert sorted(p.name for p in shared.glob("*.safetensors"))[-1] == "weights-v000003.safetensors"


async def test_a_cluster_without_the_roles_resources_is_refused(cluster, tmp_path):
    cfg, run = new_run(config(tmp_path, learners=3))
    with pytest.raises(Exception, match=r"lacks custom resources \(learner: has 2, needs 3\)"):
        async with ray_runtime(cfg, run, RayOptions(policy_factory=ScriptedTIRFactory())):
            pass


def test_weights_checksums_match_over_shared_disk(tmp_path):
    import torch

    from agentrl.trainers.ray import SharedDiskTransport

    t = SharedDiskTransport(tmp_path / "w")
    w = torch.ones(3)
    state = {"a.weight": w, "tied.weight": w}  # tied parameters share storage
    refs = [t.put(v, state) for v in range(3)]
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == [
        "weights-v000001.safetensors",
        "weights-v000002.safetensors",
    ]
    back = t.get(refs[-1])
    assert weights_checksum(back) == refs[-1].checksum == weights_checksum(state)
    assert dataclasses.asdict(refs[-1])["version"] == 2


async def test_two_learners_shard_the_model_with_fsdp_and_checkpoint_it(cluster, tmp_path):
    """Also: leases go to the worker with the fewest groups in flight, so the default step shape (4 groups of
    2) on two workers runs on both, not all on the first (one runtime start for both claims: a start of the
    actors is most of a Ray test's time)."""
    from agentrl.checkpoint import load_checkpoint

    cfg, run = new_run(config(tmp_path, learners=2, rollout_workers=2, groups_per_step=4))
    opts = RayOptions(policy_factory=ScriptedTIRFactory(generate_s=0.1))
    async with ray_runtime(cfg, run, opts) as rt:
        start = rt.learner_checksum
        groups, _ = await Rollout(rt, cfg).finish()
        per_worker = defaultdict(int)
        for g in groups:
            per_worker[g[0].meta.provenance.worker] += 1
        assert sorted(per_worker.values()) == [2, 2], dict(per_worker)
        metrics = await finish_step(rt, groups, 1)  # every server holds the gathered full weights
        assert rt.learner_checksum != start and metrics["learn/grad_norm"] > 0
        await rt.save_checkpoint(run, 1, keep=2)
        trained = rt.learner_checksum
    # The sharded learner wrote a plain checkpoint: it loads into an unsharded model, bit for bit.
    plain = resolve_model(train_setup.model_spec(cfg), tokenizer=False).model
    assert load_checkpoint(RunDir(run.path).require_checkpoint(1), model=plain).step == 1
    assert weights_checksum(plain.state_dict()) == trained
    # And a resumed learner group starts from it (weights and optimizer state); one rollout worker will do.
    resumed = dataclasses.replace(
        cfg, resume=str(run.path), deploy=dataclasses.replace(cfg.deploy, rollout_workers=1)
    )
    async with ray_runtime(resumed, run, opts) as rt:
        assert rt.start_step == 1 and rt.version == 1 and rt.learner_checksum == trained


async def test_bf16_compute_servers_hold_the_served_copy_of_the_fp32_master_weights(cluster, tmp_path):
    """--dtype bfloat16: the learner keeps fp32 master weights, the HF inference servers sample from bf16
    copies; the learner publishes that copy, so each server's checksum of its own weights equals it."""
    import torch

    from agentrl.precision import served_copy

    cfg, run = new_run(config(tmp_path, env="calculator-v0", dtype="bfloat16"))
    async with ray_runtime(cfg, run, RayOptions()) as rt:  # the default servers: HF policies
        await rt.publish(1, StepOutcome(0, (), ()))
        assert rt.last_sync and all(
            s.version == 1 and s.checksum == rt.learner_checksum for s in rt.last_sync
        )
        checksum = rt.learner_checksum
    master = resolve_model(train_setup.model_spec(cfg), tokenizer=False).model  # the initial weights, in fp32
    assert next(master.parameters()).dtype == torch.float32
    assert weights_checksum(served_copy(master.state_dict(), torch.bfloat16)) == checksum
    assert weights_checksum(master.state_dict()) != checksum
