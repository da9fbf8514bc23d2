"""What the one loop and the one scheduler let compose on Ray: ``--agent`` trains with its gateway in each
rollout worker in front of the inference servers (the real tiny model, the real gateway, a real local Ray
cluster). That the held-out evaluation runs on an inference server is checked in test_ray_runtime's
test_one_worker_server_learner_equals_the_single_process_trainer (one runtime start for both)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agentrl import read_trajectories
from agentrl.metrics import read_metrics
from agentrl.trainers import train as pg
from agentrl.trainers.train_setup import DeployConfig, TrainConfig

ray = pytest.importorskip("ray", reason="the Ray runtime's tests need the ray extra (bash .ci/setup --dev)")

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


async def test_an_agent_trains_on_ray_through_a_gateway_per_worker(cluster, tmp_path, capsys):
    cfg = TrainConfig(
        model="tiny",
        agent=f"{ROOT / 'examples' / 'gateway_agent.py'}:solve",
        env="calculator-v0",
        steps=2,
        group_size=2,
        groups_per_step=2,
        out=str(tmp_path / "run"),
        progress=False,
        deploy=DeployConfig(ray="auto", rollout_workers=2),
    )
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, max_new_tokens=24))
    run = await pg.train(cfg)
    assert [r["step"] for r in read_metrics(run)] == [0, 1]
    trajs = list(read_trajectories(run))
    assert len(trajs) == 8 and len({t.meta.group_id for t in trajs}) == 4
    assert all(t.meta.extra["source"] == "gateway" and not t.infra_failure for t in trajs)
    assert all(t.meta.task_id.startswith("calculator-v0:") for t in trajs)
    assert all(t.meta.provenance is not None for t in trajs)
    assert {t.meta.provenance.worker for t in trajs if t.meta.provenance} <= {"worker-0", "worker-1"}
    assert all(t.meta.policy_version == t.meta.step for t in trajs)  # S = 0: the step's own weights
    assert "no held-out evaluation with --agent" in capsys.readouterr().out
