"""Replay that runs things again: re-execute tool calls, re-score, recompute log-probs, reproduce a step.

The offline half of replay (load, filter, check, render, HTML) is :mod:`agentrl.replay` in the core and
needs no env or model. This package adds what does, one layer up beside the ``agentrl replay`` command::

    from agentrl import replay
    from agentrl.trainers.replay import load_tokenizer_for, reexec, reproduce_step, train_config

    run = replay.load("runs/math-tir")
    cfg = train_config(run)                       # the run's TrainConfig, typed
    tok = load_tokenizer_for(run)
    reexec(run.trajectories[0], env_kwargs=cfg.env_kwargs, tokenizer=tok)   # real env, real sandbox
    assert reproduce_step(run, 1).matches         # the trainer's update, recomputed from the record

Modules: :mod:`~agentrl.trainers.replay.weights` (the run's settings, tokenizer and weights of each
version), :mod:`~agentrl.trainers.replay.reexec` (a fresh env fed the recorded turns),
:mod:`~agentrl.trainers.replay.mismatch` (log π and Σπ² with the weights that sampled each episode),
:mod:`~agentrl.trainers.replay.reproduce` (a training step from its record) and
:mod:`~agentrl.trainers.replay.cli` (``agentrl replay``).
"""

from typing import TYPE_CHECKING, Any

from agentrl._lazy import load
from agentrl.trainers.replay.cli import add_parser, run
from agentrl.trainers.replay.reexec import (
    CallReplay,
    ReexecReport,
    RescoreReport,
    StepReplay,
    areexec,
    areexec_many,
    arescore,
    reexec,
    rescore,
)

# `agentrl` builds its parser with add_parser, so every command (envs, check, gateway, --help) imports
# this package: the names below load on first use, since recompute, reproduce and the step's credit
# import torch (~2 CPU-s a command that never touches a model would pay). A lazy name must not be a
# submodule's name too (importing the submodule would bind the module in its place): hence mismatch.py,
# not recompute.py; reexec, light, is bound here after its submodule.
if TYPE_CHECKING:
    from agentrl.trainers.replay.credit import StepAdvantages, advantages_of_step
    from agentrl.trainers.replay.mismatch import recompute, recompute_run
    from agentrl.trainers.replay.reproduce import (
        HALF_ATOL,
        HALF_RTOL,
        MetricCheck,
        StepReport,
        reproduce_step,
        step_advantages,
        step_batch,
    )
    from agentrl.trainers.replay.weights import (
        exact_weights,
        find_tokenizer,
        load_tokenizer_for,
        load_weights,
        train_config,
    )

__all__ = [
    "HALF_ATOL",
    "HALF_RTOL",
    "CallReplay",
    "MetricCheck",
    "ReexecReport",
    "RescoreReport",
    "StepAdvantages",
    "StepReplay",
    "StepReport",
    "add_parser",
    "advantages_of_step",
    "areexec",
    "areexec_many",
    "arescore",
    "exact_weights",
    "find_tokenizer",
    "load_tokenizer_for",
    "load_weights",
    "recompute",
    "recompute_run",
    "reexec",
    "reproduce_step",
    "rescore",
    "run",
    "step_advantages",
    "step_batch",
    "train_config",
]

_WHERE = {
    "HALF_ATOL": "agentrl.trainers.replay.reproduce",
    "HALF_RTOL": "agentrl.trainers.replay.reproduce",
    "MetricCheck": "agentrl.trainers.replay.reproduce",
    "StepAdvantages": "agentrl.trainers.replay.credit",
    "StepReport": "agentrl.trainers.replay.reproduce",
    "advantages_of_step": "agentrl.trainers.replay.credit",
    "exact_weights": "agentrl.trainers.replay.weights",
    "find_tokenizer": "agentrl.trainers.replay.weights",
    "load_tokenizer_for": "agentrl.trainers.replay.weights",
    "load_weights": "agentrl.trainers.replay.weights",
    "recompute": "agentrl.trainers.replay.mismatch",
    "recompute_run": "agentrl.trainers.replay.mismatch",
    "reproduce_step": "agentrl.trainers.replay.reproduce",
    "step_advantages": "agentrl.trainers.replay.reproduce",
    "step_batch": "agentrl.trainers.replay.reproduce",
    "train_config": "agentrl.trainers.replay.weights",
}


def __getattr__(name: str) -> Any:
    return load(__name__, _WHERE, name)
