"""A driver for the SIGKILL/--resume tests:
``python drive.py ADDRESS RUN_DIR STEPS [--resume] [--max-staleness S]``.

It is ``agentrl train --ray ADDRESS`` with one substitution: the inference servers sample with the
scripted math-tir policy (sleep-bound, seed-determined), so a run is slow enough to be killed mid-step and
reproducible after the resume.
"""

from __future__ import annotations

import asyncio
import sys


def main(argv: list[str]) -> int:
    from scripted import ScriptedTIRFactory  # drive.py runs as a script: its folder is on sys.path

    from agentrl.learner import LearnerConfig
    from agentrl.rollout import RolloutConfig
    from agentrl.trainers import train as pg
    from agentrl.trainers import train_setup
    from agentrl.trainers.evaluate import EvalConfig
    from agentrl.trainers.ray import RayOptions, ray_runtime

    address, out, steps = argv[0], argv[1], int(argv[2])
    resume = "--resume" in argv
    staleness = int(argv[argv.index("--max-staleness") + 1]) if "--max-staleness" in argv else 0
    cfg = train_setup.TrainConfig(
        model="tiny",
        env="math-tir-arith-v0",
        group_size=2,
        groups_per_step=4,
        steps=steps,
        out=None if resume else out,
        resume=out if resume else None,
        rollout=RolloutConfig(
            max_turns=3, max_new_tokens=48, concurrency=2, on_template_mismatch="stop", seed=7
        ),
        learner=LearnerConfig(lr=1e-3),
        progress=False,
        deploy=train_setup.DeployConfig(ray=address),
        max_staleness=staleness,
        keep_checkpoints=10,
        # No held-out evaluation (2 x 64 episodes at 0.4 s a turn, more than the run): the tests check the
        # resume; the evaluation on Ray is test_ray_runtime's equivalence test's.
        eval=EvalConfig(tasks=0),
    )
    opts = RayOptions(policy_factory=ScriptedTIRFactory(generate_s=0.4), lease_s=120)
    asyncio.run(pg.train(cfg, runtime=lambda c, r: ray_runtime(c, r, opts)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
