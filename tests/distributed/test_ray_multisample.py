"""Multi-sample episodes under ``--ray``: long-chain-v0 with env compaction (every episode is three linked
samples) trains a step on a real local Ray cluster, every episode's samples arrive together in one group
(same episode and worker, sample_index 0..n-1, num_samples n), and the ledger's accounting holds.

The sampler is a scripted policy that plays the chain right (:mod:`scripted_chain`), so the env really
compacts; env, rollout workers, inference servers and the learner (tiny model) are real."""

from collections import defaultdict

import pytest

from agentrl import read_groups, read_trajectories
from agentrl.learner import LearnerConfig
from agentrl.metrics import read_metrics
from agentrl.rollout import RolloutConfig
from agentrl.trainers import train as pg
from agentrl.trainers import train_setup
from agentrl.trainers.evaluate import EvalConfig
from agentrl.trainers.ray import GroupLedger, RayOptions, ray_runtime
from agentrl.types import StopReason

from .scripted_chain import ScriptedChainFactory

ray = pytest.importorskip("ray", reason="the Ray runtime's tests need the ray extra (bash .ci/setup --dev)")

pytestmark = pytest.mark.slow


async def test_env_compaction_episodes_train_a_step_on_ray_as_linked_samples(cluster, tmp_path):
    cfg = train_setup.TrainConfig(
        model="tiny",
        env="long-chain-v0",
        # 6 numbers, 5 tool calls, compacted after calls 2 and 4: three samples per episode, each of which
        # fits 160 tokens though the whole history (about 200) does not.
        env_kwargs={"context": "env-compaction", "k": 6, "compact_every": 2},
        group_size=2,
        groups_per_step=2,
        steps=1,
        out=str(tmp_path / "run"),
        rollout=RolloutConfig(max_turns=12, max_new_tokens=32, max_total_tokens=160, concurrency=4, seed=3),
        learner=LearnerConfig(lr=1e-3),
        progress=False,
        deploy=train_setup.DeployConfig(ray="auto"),
        eval=EvalConfig(tasks=0),  # the evaluation on Ray is test_ray_runtime's equivalence test's
    )
    opts = RayOptions(policy_factory=ScriptedChainFactory())
    await pg.train(cfg, runtime=lambda c, r: ray_runtime(c, r, opts))
    run = tmp_path / "run"

    trajs = list(read_trajectories(run))
    episodes = defaultdict(list)
    for t in trajs:
        episodes[t.meta.episode_id].append(t)
    assert len(episodes) == 4 and len(trajs) == 12
    for samples in episodes.values():
        metas = [t.meta for t in samples]
        assert [m.sample_index for m in metas] == [0, 1, 2] and {m.num_samples for m in metas} == {3}
        assert len({(m.group_id, m.task_id, m.step) for m in metas}) == 1
        workers = {m.provenance.worker for m in metas if m.provenance is not None}
        assert len(workers) == 1  # one episode, one rollout on one worker
        assert [t.stop_reason for t in samples] == [StopReason.COMPACTED] * 2 + [StopReason.TERMINATED]
        assert sum(t.reward for t in samples) == 1.0
        assert max(len(t.token_ids) for t in samples) <= 160
    # The file reads back as the step's groups of whole episodes, their samples consecutive.
    groups = list(read_groups(run / "trajectories.jsonl", size=2))
    assert len(groups) == 2
    for g in groups:
        assert g.num_episodes == 2 and len(g) == 6 and g.rewards == (1.0, 1.0)
        ids = [t.meta.episode_id for t in g]
        assert ids == sorted(ids, key=ids.index) and len(set(ids)) == 2  # each episode's samples together
    with GroupLedger(run / "ledger.jsonl") as ledger:
        c = ledger.check(0, settled=True)
        assert c["trained"] == 2 and c["dropped"] == 0 and c["issued"] == 2, c
    (row,) = read_metrics(run)
    assert row["ray/groups_issued"] == 2 and row["ray/leases_released"] == 0
    assert row["episodes/total"] == 4 and row["episodes/samples_per_episode"] == 3
    assert row["reward/mean"] == 1.0 and row["groups/trained"] == 2
