"""LoRA on the Ray runtime, with real HF inference servers (the default policy factory) on the tiny model and
two learners sharding it with FSDP: each sync ships the adapter alone, every server reports the learner's
adapter checksum for the new version, and the served adapter changes after a step (a server that kept the
initial adapter would fail the sync: verl #7495); the checkpoint holds the adapter, and a resume loads it. An
entropy bonus gives the tiny model's zero-reward episodes a gradient, so the adapter moves."""

import pytest

from agentrl.learner import LearnerConfig
from agentrl.lora import LoraConfig, adapter_digest
from agentrl.rollout import RolloutConfig
from agentrl.run import RunDir
from agentrl.trainers.ray import ray_runtime

from .test_ray_runtime import Rollout, config, finish_step, new_run

ray = pytest.importorskip("ray", reason="the Ray runtime's tests need the ray extra (bash .ci/setup --dev)")

pytestmark = pytest.mark.slow


async def test_two_learners_ship_only_the_adapter_checkpoint_it_and_resume(cluster, tmp_path):
    """Two learners shard the adapted model with FSDP, and the HF servers (the default factory) serve what
    they gather: one runtime start and its resume hold every claim of the module (a start of the actors is
    most of a Ray test's time):

    - each sync ships the adapter alone, and every server reports the learner's adapter checksum, at the
      start and after the step (the served adapter changed: a server that kept the initial one would fail);
    - the checkpoint holds the adapter alone, the adapter the servers reported;
    - a resumed learner group loads that adapter (and the servers serve it again).

    A LoRA run with one learner on Ray ships through the same ``LearnerActor.publish`` (its Ray path:
    test_ray_runtime's equivalence test; one learner's adapter sync and checkpoint: tests/trainers/
    test_lora_train.py)."""
    import dataclasses

    from safetensors.torch import load_file

    cfg, run = new_run(
        config(
            tmp_path,
            env="calculator-v0",
            groups_per_step=2,  # one group per learner
            learners=2,
            lora=LoraConfig(rank=4, alpha=8.0),
            learner=LearnerConfig(lr=1e-2, entropy_coef=0.1),
            rollout=RolloutConfig(max_turns=1, max_new_tokens=6, concurrency=4, seed=3),
        )
    )
    async with ray_runtime(cfg, run) as rt:
        start = rt.learner_checksum
        assert [s.version for s in rt.last_sync] == [0] and rt.last_sync[0].checksum == start
        ref = await rt.broker.latest.remote()
        shipped = rt.transport.get(ref)
        assert shipped and all(".lora_A." in k or ".lora_B." in k for k in shipped)  # the adapter alone
        assert adapter_digest(shipped) == start
        groups, _ = await Rollout(rt, cfg).finish()
        metrics = await finish_step(rt, groups, 1)  # asserts every server reports version 1, learner's sum
        assert metrics["learn/grad_norm"] > 0
        assert rt.learner_checksum != start  # the served adapter changed with the step
        shipped = rt.transport.get(await rt.broker.latest.remote())
        assert shipped and all(".lora_" in k for k in shipped)  # FSDP gathered, then the adapter alone
        await rt.save_checkpoint(run, 1, keep=2)
        trained = rt.learner_checksum
    model_dir = RunDir(run.path).require_checkpoint(1).model_dir
    assert (model_dir / "adapter_model.safetensors").is_file() and not (
        model_dir / "model.safetensors"
    ).exists()
    saved = load_file(str(model_dir / "adapter_model.safetensors"))
    assert len(saved) == len(shipped)
    # The adapter the servers reported is the one checkpointed (peft drops the adapter name when saving).
    renamed = {
        k.removeprefix("base_model.model.").replace(".weight", ".default.weight"): v for k, v in saved.items()
    }
    assert adapter_digest(renamed) == trained
    async with ray_runtime(dataclasses.replace(cfg, resume=str(run.path)), run) as rt:
        # The sharded learners loaded the adapter, and every server serves it again.
        assert rt.start_step == 1 and rt.learner_checksum == trained
        assert all(s.version == 1 and s.checksum == trained for s in rt.last_sync)
