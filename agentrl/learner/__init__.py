"""The policy-gradient learner: chunked log-prob/Σπ² forward pass, REINFORCE and PPO-clip losses.

Data flow for one training step (the trainer in ``agentrl.trainers`` drives it through
:func:`agentrl.update.policy_update`)::

    batch = collate(groups, pad_id=pad_id)                    # agentrl.batch; groups: TrajectoryGroup
    logprobs, sum_pi_sq = learner.score(batch)                # no grad, trainer's own π_old and Σπ²
    batch = dataclasses.replace(batch, old_logprobs_B_T=logprobs)
    adv = OTB().advantages(batch.token_rewards_B_T, batch.loss_mask_B_T,
                           logprobs, sum_pi_sq, batch.group_ids)   # agentrl.credit
    stats = learner.step(batch, adv)

Modules (each imports only those above it):

* :mod:`~agentrl.learner.attention` — the attention implementation of the learner's passes (``auto``: varlen
  flash or flex_attention on CUDA, which keep packed sequences apart without a dense mask);
* :mod:`~agentrl.learner.checkpointing` — activation checkpointing (``auto``: from measured memory);
* :mod:`~agentrl.learner.forward` — :func:`forward_logprobs`: log π, Σπ² and entropy, chunked over tokens;
* :mod:`~agentrl.learner.losses` — :func:`policy_loss` (REINFORCE, PPO-clip, dual clip) and the k3 KL;
* :mod:`~agentrl.learner.schedule` — the learning-rate schedules (``constant``, ``length-triggered``), pure;
* :mod:`~agentrl.learner.config` — :class:`LearnerConfig` and :class:`LearnerStats`;
* :mod:`~agentrl.learner.distributed` — rank helpers and :func:`wrap_fsdp` (torch FSDP2);
* :mod:`~agentrl.learner.learner` — :class:`Learner` (micro-batching, ``score``, ``step``);
* :mod:`~agentrl.learner.stability` — the trainers' per-step schedule and collapse check, checkpointed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentrl._lazy import load
from agentrl.learner.config import LearnerConfig, LearnerStats, LossAgg
from agentrl.learner.losses import PolicyLossName

# The torch-backed names are imported on first use (PEP 562): a TrainConfig holds a LearnerConfig, and the
# rollout workers and inference servers that unpickle it never train, so they must not pay for torch
# (~3 CPU-s and ~300 MB per actor).
if TYPE_CHECKING:
    from agentrl.batch import TokenBatch, collate
    from agentrl.learner.distributed import wrap_fsdp
    from agentrl.learner.forward import ForwardOutput, forward_logprobs
    from agentrl.learner.learner import Learner, plan_micro_batches
    from agentrl.learner.losses import kl_k3, policy_loss

__all__ = [
    "ForwardOutput",
    "Learner",
    "LearnerConfig",
    "LearnerStats",
    "LossAgg",
    "PolicyLossName",
    "TokenBatch",
    "collate",
    "forward_logprobs",
    "kl_k3",
    "plan_micro_batches",
    "policy_loss",
    "wrap_fsdp",
]

_WHERE = {
    "TokenBatch": "agentrl.batch",
    "collate": "agentrl.batch",
    "wrap_fsdp": "agentrl.learner.distributed",
    "ForwardOutput": "agentrl.learner.forward",
    "forward_logprobs": "agentrl.learner.forward",
    "Learner": "agentrl.learner.learner",
    "plan_micro_batches": "agentrl.learner.learner",
    "kl_k3": "agentrl.learner.losses",
    "policy_loss": "agentrl.learner.losses",
}


def __getattr__(name: str) -> Any:
    return load(__name__, _WHERE, name)
