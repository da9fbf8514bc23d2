"""The ``agentrl`` command: train, eval, plot, replay, gateway, envs."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from agentrl.config import add_config_arguments, config_from_args, config_to_dict
from agentrl.errors import AgentRLError
from agentrl.run import RunDir

if TYPE_CHECKING:
    from agentrl.trainers.pg import TrainConfig

TRAIN_ALIASES = {"lr": "learner.lr", "temperature": "rollout.temperature"}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    from agentrl.trainers.pg import TrainConfig

    parser = argparse.ArgumentParser(prog="agentrl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser(
        "train",
        help="train an agent (default: SmolLM2-135M on math-tir-v0 with OTB, CPU)",
        description=(TrainConfig.__doc__ or "") + " Nested settings take dotted flags (--learner.lr 1e-6).",
    )
    add_config_arguments(train, TrainConfig, aliases=TRAIN_ALIASES)

    ev = sub.add_parser("eval", help="pass@1 / pass@k on an environment's held-out split")
    ev.add_argument(
        "--model", required=True, help="'smollm2' or a model folder (<run>/checkpoints/step-N/model)"
    )
    ev.add_argument("--env", required=True, help="registered environment id")
    ev.add_argument("--k", type=int, default=4, help="samples per task (default 4)")
    ev.add_argument("--tasks", type=int, default=32, help="tasks to evaluate (default 32)")
    ev.add_argument("--split", default="test", help="split for envs that have one (default test)")
    ev.add_argument("--seed", type=int, default=10_000, help="first task seed (default 10000)")
    ev.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ev.add_argument("--json", action="store_true", help="print the report as JSON")

    plot = sub.add_parser("plot", help="write PNG curves of a run's metrics")
    plot.add_argument("run", help="run directory")
    plot.add_argument("--out", default=None, help="folder for the PNGs (default <run>/plots)")

    from agentrl.trainers import replay

    replay.add_parser(sub)

    from agentrl.trainers.gateway import cli as gateway_cli

    gateway_cli.add_parser(sub)

    sub.add_parser("envs", help="list registered environments")
    return parser


def _train_config(ns: argparse.Namespace) -> TrainConfig:
    from agentrl.trainers.pg import TrainConfig

    resume = getattr(ns, "resume", None)
    if resume is None:
        return config_from_args(TrainConfig, ns)
    run = RunDir(Path(resume))
    if not run.exists():
        raise AgentRLError(f"--resume {resume}: no config.json there; is it a run directory?")
    # The run's own settings are the base; the flags given now may only change what a resume allows.
    base = run.read_config(TrainConfig, out=resume, resume=resume)
    return config_from_args(TrainConfig, ns, base=base)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``agentrl`` console script."""
    ns = build_parser().parse_args(argv)
    try:
        if ns.command == "train":
            from agentrl.trainers import pg

            return pg.main(_train_config(ns))
        if ns.command == "eval":
            from agentrl.trainers.evaluate import evaluate

            report = asyncio.run(
                evaluate(
                    ns.model, ns.env, k=ns.k, tasks=ns.tasks, split=ns.split, seed=ns.seed, device=ns.device
                )
            )
            if ns.json:
                print(json.dumps(config_to_dict(report)))
            else:
                print(
                    f"{report.env} ({report.split or 'all'}): "
                    f"{report.tasks} tasks x {report.samples_per_task}: "
                    f"pass@1={report.pass_at_1:.3f} pass@{report.samples_per_task}={report.pass_at_k:.3f} "
                    f"mean reward={report.mean_reward:.3f} infra failures={report.infra_failures}"
                )
            return 0
        if ns.command == "plot":
            from agentrl.metrics import plot_run

            for p in plot_run(ns.run, ns.out):
                print(p)
            return 0
        if ns.command == "replay":
            from agentrl.trainers import replay

            return replay.run(ns)
        if ns.command == "gateway":
            from agentrl.trainers.gateway import cli as gateway_cli

            return gateway_cli.run(ns)
        if ns.command == "envs":
            import agentrl

            for env_id in agentrl.list_envs():
                print(env_id)
            return 0
    except AgentRLError as e:
        print(f"agentrl {ns.command}: error: {e}", file=sys.stderr)
        return 2
    return 2
