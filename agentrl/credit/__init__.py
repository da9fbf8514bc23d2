"""Credit assignment: the Optimal Token Baseline, group baselines and variance diagnostics.

Every estimator takes the same arguments, right-padded [B, T] tensors plus one group id per row. The
typed estimators (:mod:`agentrl.credit.estimators`, what the trainer is configured with) carry their
options as fields::

    adv_B_T = OTB(zero_tail=True).advantages(token_rewards_B_T, loss_mask_B_T, logprobs_B_T,
                                             sum_pi_squared_B_T, group_ids)

and sit on the pure functions below, also reachable by name::

    adv_B_T = compute_advantages("otb", token_rewards_B_T, loss_mask_B_T, logprobs_B_T,
                                 sum_pi_squared_B_T, group_ids, zero_tail=True)

Names: ``otb`` (OTB specification otb-spec.md §3.3), ``grpo`` (group mean, optional std), ``rloo``
(leave-one-out), ``opo`` (length-weighted), ``none`` (reward-to-go, no baseline). Only ``otb`` reads
``logprobs`` and ``sum_pi_squared``; the others accept ``None`` there.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, cast

from agentrl._lazy import load
from agentrl.credit.estimators import (
    ESTIMATOR_CONFIGS,
    GRPO,
    OPO,
    OTB,
    RLOO,
    AdvantageEstimator,
    Estimator,
    NoBaseline,
    estimator_config,
)
from agentrl.errors import ConfigError

# The torch-backed names are imported on first use (PEP 562): a TrainConfig carries an estimator config, and
# the rollout workers and inference servers that unpickle it never train, so they must not pay for torch
# (~3 CPU-s and ~300 MB per actor).
if TYPE_CHECKING:
    import torch

    from agentrl.credit._common import GroupIds, returns_to_go, token_energy
    from agentrl.credit.baselines import grpo_advantages, no_baseline, opo_advantages, rloo_advantages
    from agentrl.credit.diagnostics import VarianceProxy, variance_proxy_metrics
    from agentrl.credit.estimators import ESTIMATORS
    from agentrl.credit.otb import optimal_token_baseline, sum_pi_squared

_WHERE = {
    "ESTIMATORS": "agentrl.credit.estimators",
    "GroupIds": "agentrl.credit._common",
    "returns_to_go": "agentrl.credit._common",
    "token_energy": "agentrl.credit._common",
    "grpo_advantages": "agentrl.credit.baselines",
    "no_baseline": "agentrl.credit.baselines",
    "opo_advantages": "agentrl.credit.baselines",
    "rloo_advantages": "agentrl.credit.baselines",
    "VarianceProxy": "agentrl.credit.diagnostics",
    "variance_proxy_metrics": "agentrl.credit.diagnostics",
    "optimal_token_baseline": "agentrl.credit.otb",
    "sum_pi_squared": "agentrl.credit.otb",
}


def __getattr__(name: str) -> Any:
    return load(__name__, _WHERE, name)


__all__ = [
    "ESTIMATORS",
    "ESTIMATOR_CONFIGS",
    "GRPO",
    "OPO",
    "OTB",
    "RLOO",
    "AdvantageEstimator",
    "Estimator",
    "GroupIds",
    "NoBaseline",
    "VarianceProxy",
    "compute_advantages",
    "estimator_config",
    "grpo_advantages",
    "no_baseline",
    "opo_advantages",
    "optimal_token_baseline",
    "returns_to_go",
    "rloo_advantages",
    "sum_pi_squared",
    "token_energy",
    "variance_proxy_metrics",
]


def compute_advantages(
    name: str,
    token_rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    logprobs: torch.Tensor | None,
    sum_pi_squared: torch.Tensor | None,
    group_ids: GroupIds | None,
    **options: Any,
) -> torch.Tensor:
    """Run the estimator called ``name`` on [B, T] inputs; ``options`` are its settings (``otb``:
    zero_tail, eps; ``grpo``: norm_by_std, eps) and the per-batch inputs of
    :meth:`AdvantageEstimator.advantages` (all: ``episode_ids``, the rows that are samples of one episode;
    ``otb``: ``is_weights``, the importance weights ρ̄). Returns [B, T] advantages.

    A shorthand for the typed estimator: ``compute_advantages("grpo", ..., norm_by_std=False)`` is
    ``GRPO(norm_by_std=False).advantages(...)``, the one path to the estimator functions."""
    cls = ESTIMATOR_CONFIGS.get(name)
    if cls is None:
        raise ConfigError(f"unknown advantage estimator {name!r}; choose from {sorted(ESTIMATOR_CONFIGS)}")
    settings = {f.name for f in dataclasses.fields(cast(Any, cls))}
    allowed = settings | {"episode_ids"} | ({"is_weights"} if cls.uses_importance_weights else set())
    unknown = set(options) - allowed
    if unknown:
        raise ConfigError(
            f"estimator {name!r} does not take {sorted(unknown)}; its options are {sorted(allowed)}"
        )
    estimator = cls(**{k: v for k, v in options.items() if k in settings})
    return estimator.advantages(
        token_rewards,
        loss_mask,
        logprobs,
        sum_pi_squared,
        group_ids,
        episode_ids=options.get("episode_ids"),
        is_weights_B_T=options.get("is_weights"),
    )
