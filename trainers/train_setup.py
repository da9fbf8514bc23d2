"""Moved: the trainer's settings are :mod:`agentrl.trainers.train_config`, what a run is built from them
:mod:`agentrl.trainers.factories`. This module re-exports both for code written before the split, until
0.2.0 (CHANGELOG.md)."""

from __future__ import annotations

from agentrl.trainers.deploy import DeployConfig
from agentrl.trainers.factories import (
    env_arguments,
    env_factory,
    env_kwargs,
    learner_config,
    make_policy,
    model_spec,
    needs_sandbox,
    precision,
    prepare_run,
    publish_weights,
    reward_config,
    rollout_config,
    sampler_spec,
    task_seeds,
    tokenizer_pad_id,
)
from agentrl.trainers.train_config import RESUMABLE, TrainConfig

__all__ = [
    "RESUMABLE",
    "DeployConfig",
    "TrainConfig",
    "env_arguments",
    "env_factory",
    "env_kwargs",
    "learner_config",
    "make_policy",
    "model_spec",
    "needs_sandbox",
    "precision",
    "prepare_run",
    "publish_weights",
    "reward_config",
    "rollout_config",
    "sampler_spec",
    "task_seeds",
    "tokenizer_pad_id",
]
