"""``--curriculum difficulty`` on the Ray runtime, on a real small Ray cluster (scripted math-tir policy
on the inference servers, real envs, the tiny learner), with ``--max-staleness 1``: the one loop draws
every step's tasks from the trainer's sampler on the driver, the sampler observes each trained group's mean
return, its state is saved beside every checkpoint, and a step's draws are what a sampler restored from that
state draws. The ledger stays settled (issued = trained + dropped)."""

import json
from collections import defaultdict

import pytest

from agentrl import read_trajectories
from agentrl.groups import group_trajectories
from agentrl.metrics import read_metrics
from agentrl.run import RunDir
from agentrl.trainers.ray import RayOptions
from agentrl.trainers.task_sampler import TaskSampler, sampler_state_path

from .scripted import ScriptedTIRFactory
from .test_async_ray import async_config, ledger_of, train

ray = pytest.importorskip("ray", reason="the Ray runtime's tests need the ray extra (bash .ci/setup --dev)")

pytestmark = pytest.mark.slow


def test_curriculum_on_ray_with_staleness_1_draws_from_its_saved_state(cluster, tmp_path):
    opts = RayOptions(policy_factory=ScriptedTIRFactory(jitter_s=(0.0, 0.02, 0.05)))
    cfg = async_config(tmp_path, "cur", max_staleness=1, steps=3, curriculum="difficulty")
    run = train(cfg, opts)
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2]
    c = ledger_of(run).check(settled=True)
    assert c["issued"] == c["trained"] == 12

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
