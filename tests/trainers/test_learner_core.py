"""The learner core is the one learner: the single-process runtime and the Ray learner actor (one rank, driven
directly: no cluster) train, publish and checkpoint the same step identically."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentrl.groups import TrajectoryGroup, group_trajectories
from agentrl.learner import LearnerConfig
from agentrl.run import RunDir
from agentrl.staleness import StepOutcome
from agentrl.testing import RecordingWeightSink
from agentrl.trainers.learner_core import LearnerCore
from agentrl.trainers.local import LocalRuntime
from agentrl.trainers.ray.learner import LearnerActor
from agentrl.trainers.ray.weights import make_transport
from agentrl.trainers.train_setup import TrainConfig
from agentrl.types import Segment, TokenSource, Trajectory, TrajectoryMeta


def traj(
    prompt: list[int], model: list[int], tool: list[int], reward: float, group: str, eid: str
) -> Trajectory:
    """A prompt, one model turn, a tool output, a second model turn (log-probs of the sampler: -1)."""
    ids = [*prompt, *model, *tool, *model]
    p, m, t = len(prompt), len(model), len(tool)
    return Trajectory(
        token_ids=tuple(ids),
        loss_mask=tuple([0] * p + [1] * m + [0] * t + [1] * m),
        logprobs=tuple([None] * p + [-1.0] * m + [None] * t + [-1.0] * m),
        segments=(
            Segment(TokenSource.PROMPT, 0, p, -1),
            Segment(TokenSource.MODEL, p, p + m, 0),
            Segment(TokenSource.OBSERVATION, p + m, p + m + t, 0),
            Segment(TokenSource.MODEL, p + m + t, p + 2 * m + t, 1),
        ),
        messages=(),
        rewards=(reward,),
        meta=TrajectoryMeta(group_id=group, episode_id=eid, step=0, policy_version=0),
    )


def step_groups(rewards: tuple[float, ...] = (1.0, 0.0, 0.0, 1.0)) -> list[TrajectoryGroup]:
    trajs = [
        traj([1, 2, 3], [10, 11, 12], [90, 91], rewards[0], "q0", "a"),
        traj([1, 2, 3], [20, 21], [92], rewards[1], "q0", "b"),
        traj([4, 5], [30, 31, 32, 33], [93], rewards[2], "q1", "c"),
        traj([4, 5], [40, 41], [94, 95, 96], rewards[3], "q1", "d"),
    ]
    return list(group_trajectories(trajs))


def config(out: Path) -> TrainConfig:
    return TrainConfig(model="tiny", out=str(out), learner=LearnerConfig(lr=1e-2), progress=False)


def checkpoint(run: Path, step: int) -> tuple[dict, dict[str, torch.Tensor]]:
    folder = run / "checkpoints" / f"step-{step:06d}"
    state = json.loads((folder / "state.json").read_text())
    weights = load_file(str(next(folder.rglob("*.safetensors"))))
    return state, weights


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Step 0 trained on the same groups by the local runtime and by a one-rank learner actor."""
    tmp = tmp_path_factory.mktemp("core")
    out: dict[str, object] = {}

    local_dir, ray_dir = tmp / "local", tmp / "ray"
    for d in (local_dir, ray_dir):
        d.mkdir()
    cfg = config(local_dir)
    core = LearnerCore(cfg)
    run = RunDir(local_dir)
    assert core.load(run) == 0
    sink = RecordingWeightSink()
    rt = LocalRuntime(cfg, run, pool=None, agent=None, core=core, policy=sink, start_step=0)
    out["local_metrics"] = asyncio.run(rt.update(0, step_groups()))
    asyncio.run(rt.publish(1, StepOutcome(0, (0, 1), ())))
    out["local_published"] = sink.updates[-1].named_tensors
    asyncio.run(rt.save_checkpoint(run, 1, keep=3))

    actor = LearnerActor(0, 1, config(ray_dir))
    actor.setup(None)
    assert actor.load_checkpoint(str(ray_dir)) == 0
    out["ray_metrics"] = actor.update(0, step_groups())
    transport = make_transport("shared_disk", str(tmp / "weights"))
    ref = actor.publish(1, transport)
    assert ref is not None
    out["ray_published"] = transport.get(ref)
    actor.save_checkpoint(str(ray_dir), 1, keep=3)
    out["dirs"] = (local_dir, ray_dir)
    out["runtimes"] = (rt, actor)
    return out


def test_the_step_metrics_are_the_same(both: dict) -> None:
    local, ray = both["local_metrics"], both["ray_metrics"]
    assert set(local) == set(ray) and "learn/loss" in local
    for k in local:
        assert local[k] == pytest.approx(ray[k], nan_ok=True, rel=1e-6, abs=1e-9), k


def test_the_published_weights_are_the_same(both: dict) -> None:
    local, ray = both["local_published"], both["ray_published"]
    assert set(local) == set(ray)
    for k in local:
        assert torch.equal(local[k].to(ray[k].dtype), ray[k]), k


def test_the_checkpoints_and_step_scores_are_the_same(both: dict) -> None:
    local_dir, ray_dir = both["dirs"]
    (ls, lw), (rs, rw) = checkpoint(local_dir, 1), checkpoint(ray_dir, 1)
    assert ls["step"] == rs["step"] == 1
    assert ls["extra"] == rs["extra"] and "next_step" not in ls["extra"]  # written once, nothing unread
    assert set(lw) == set(rw) and all(torch.equal(lw[k], rw[k]) for k in lw)
    local_scores = sorted(p.relative_to(local_dir) for p in local_dir.rglob("*score*"))
    assert local_scores and local_scores == sorted(p.relative_to(ray_dir) for p in ray_dir.rglob("*score*"))


def test_a_step_without_signal_is_skipped_and_said_on_both_runtimes(both: dict, capsys) -> None:
    """Every episode failed (reward 0): every advantage is zero, so no optimizer step is taken
    (AdamW's momentum and decay would still move the weights) and the console and the metrics say so."""
    assert both["local_metrics"]["learn/zero_advantage_skip"] == 0.0  # the first step had signal
    rt, actor = both["runtimes"]
    flat = (0.0, 0.0, 0.0, 0.0)  # OTB's zero tail gives a solo tail A = G: equal rewards of 1 are not zero
    for name, model, update in (
        ("local", rt.core.model, lambda: asyncio.run(rt.update(1, step_groups(flat)))),
        ("ray", actor.core.model, lambda: actor.update(1, step_groups(flat))),
    ):
        before = {k: v.clone() for k, v in model.state_dict().items()}
        capsys.readouterr()
        metrics = update()
        assert metrics["learn/zero_advantage_skip"] == 1.0 and metrics["learn/micro_batches"] == 0, name
        assert "step 1: every advantage is zero" in capsys.readouterr().err, name
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), name
