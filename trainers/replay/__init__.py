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
:mod:`~agentrl.trainers.replay.recompute` (log π and Σπ² with the weights that sampled each episode),
:mod:`~agentrl.trainers.replay.reproduce` (a training step from its record) and
:mod:`~agentrl.trainers.replay.cli` (``agentrl replay``).
"""

from agentrl.trainers.replay.cli import add_parser, run
from agentrl.trainers.replay.recompute import recompute, recompute_run
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
from agentrl.trainers.replay.reproduce import (
    MetricCheck,
    StepReport,
    reproduce_step,
    step_advantages,
    step_batch,
)
from agentrl.trainers.replay.weights import load_tokenizer_for, load_weights, train_config

__all__ = [
    "CallReplay",
    "MetricCheck",
    "ReexecReport",
    "RescoreReport",
    "StepReplay",
    "StepReport",
    "add_parser",
    "areexec",
    "areexec_many",
    "arescore",
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
