"""Typed advantage estimators: frozen configs that carry their options and compute [B, T] advantages.

::

    estimator = GRPO(norm_by_std=False)
    adv_B_T = estimator.advantages(token_rewards_B_T, loss_mask_B_T, logprobs_B_T, sum_pi_squared_B_T,
                                   group_ids)

Each class stands for one pure function of :mod:`agentrl.credit` (``ESTIMATORS[name]``) and holds that
function's keyword-only settings as fields, so a setting is an attribute (reachable from the command line as
``--estimator.<field>`` and recorded in ``config.json``) instead of a ``**options`` entry. ``name`` is what
``--estimator`` and ``config.json`` call the class. :data:`Estimator` is the union the trainer's config is
typed with.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar, cast

from agentrl.config import config_from_dict
from agentrl.errors import ConfigError

# The estimator configs are part of every TrainConfig, which rollout workers and inference servers unpickle
# without ever training: torch (~3 CPU-s and ~300 MB per actor) is imported only when advantages are computed.
if TYPE_CHECKING:
    import torch

    from agentrl.credit._common import GroupIds

__all__ = [
    "ESTIMATORS",
    "ESTIMATOR_CONFIGS",
    "GRPO",
    "OPO",
    "OTB",
    "RLOO",
    "AdvantageEstimator",
    "Estimator",
    "NoBaseline",
    "estimator_config",
    "require_policy_stats",
]


if TYPE_CHECKING:
    ESTIMATORS: dict[str, Callable[..., torch.Tensor]]
    """The pure estimator functions by name; all share the signature of
    :func:`agentrl.credit.compute_advantages` (minus ``name``). Built on first use (it imports torch)."""


@cache
def _estimator_functions() -> dict[str, Callable[..., torch.Tensor]]:
    # One dict for the process, so ``ESTIMATORS`` and :meth:`AdvantageEstimator.advantages` agree.
    from agentrl.credit.baselines import grpo_advantages, no_baseline, opo_advantages, rloo_advantages
    from agentrl.credit.otb import optimal_token_baseline

    return {
        "otb": optimal_token_baseline,
        "grpo": grpo_advantages,
        "rloo": rloo_advantages,
        "opo": opo_advantages,
        "none": no_baseline,
    }


def __getattr__(name: str) -> Any:
    if name == "ESTIMATORS":
        return _estimator_functions()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def require_policy_stats(
    name: str, logprobs: torch.Tensor | None, sum_pi_squared: torch.Tensor | None
) -> None:
    """Refuse to run an estimator that reads log π and Σπ² (OTB) without them."""
    if ESTIMATOR_CONFIGS[name].needs_policy_stats and (logprobs is None or sum_pi_squared is None):
        raise ConfigError(
            f"the {name!r} estimator needs logprobs and sum_pi_squared from the trainer's forward pass "
            "(Learner.score)"
        )


class AdvantageEstimator:
    """Base of the typed estimators: a frozen config whose fields are the keyword-only options of the
    function ``ESTIMATORS[name]``, and whose :meth:`advantages` calls that function with them."""

    name: ClassVar[str]
    """What ``--estimator`` and ``config.json`` call this estimator."""
    needs_policy_stats: ClassVar[bool] = False
    """True when :meth:`advantages` reads ``logprobs`` and ``sum_pi_squared`` (the others accept None)."""
    subtracts_group_baseline: ClassVar[bool] = True
    """True when the baseline comes from the other members of the group (a group of one gets none)."""

    uses_importance_weights: ClassVar[bool] = False
    """True when the estimator's baseline itself reads the truncated importance weights ρ̄ (OTB scales each
    energy increment by ρ̄², otb-spec.md §3.5). The others ignore them: the loss applies ρ̄ to every
    estimator's advantages (:attr:`agentrl.update.Credit.loss_advantages_B_T`)."""

    def advantages(
        self,
        token_rewards_B_T: torch.Tensor,
        loss_mask_B_T: torch.Tensor,
        logprobs_B_T: torch.Tensor | None,
        sum_pi_squared_B_T: torch.Tensor | None,
        group_ids: GroupIds | None,
        *,
        episode_ids: GroupIds | None = None,
        is_weights_B_T: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Per-token advantages for right-padded [B, T] tensors and one group id per row (0 where the
        loss mask is 0). ``episode_ids`` (one per row) marks the rows that are samples of one episode;
        None: one row per episode. ``is_weights_B_T``: the off-policy correction's ρ̄ (None: on-policy),
        read only by an estimator that :attr:`uses_importance_weights`.

        This is the one way every caller (the trainer's update, replay,
        :func:`agentrl.credit.compute_advantages`) reaches an estimator function."""
        require_policy_stats(self.name, logprobs_B_T, sum_pi_squared_B_T)
        options = {f.name: getattr(self, f.name) for f in dataclasses.fields(cast(Any, self))}
        if episode_ids is not None:
            options["episode_ids"] = episode_ids
        if is_weights_B_T is not None and self.uses_importance_weights:
            options["is_weights"] = is_weights_B_T
        return _estimator_functions()[self.name](
            token_rewards_B_T, loss_mask_B_T, logprobs_B_T, sum_pi_squared_B_T, group_ids, **options
        )

    def __str__(self) -> str:
        """The name and the options that differ from their defaults: ``otb``, ``grpo(norm_by_std=False)``."""
        changed = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(cast(Any, self))
            if f.default is not dataclasses.MISSING and getattr(self, f.name) != f.default
        ]
        return f"{self.name}({', '.join(changed)})" if changed else self.name


def _check_eps(eps: float) -> None:
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not math.isfinite(eps) or eps < 0:
        raise ConfigError(f"eps must be a finite number >= 0, got {eps!r}")


def _check_bool(field: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{field} must be true or false, got {value!r}")


@dataclass(frozen=True)
class OTB(AdvantageEstimator):
    """Optimal Token Baseline, a per-token baseline weighted by the policy's own gradient energy.

    Specification: otb-spec.md §3.3, the tool-integrated variant; see
    :func:`agentrl.credit.optimal_token_baseline`."""

    name: ClassVar[str] = "otb"
    needs_policy_stats: ClassVar[bool] = True
    uses_importance_weights: ClassVar[bool] = True

    zero_tail: bool = True
    """Give the unique longest member's solo tail baseline 0 (advantage = return)."""
    eps: float = 1e-8
    """Added to the baseline's denominator."""

    def __post_init__(self) -> None:
        _check_bool("zero_tail", self.zero_tail)
        _check_eps(self.eps)


@dataclass(frozen=True)
class GRPO(AdvantageEstimator):
    """Group mean score as baseline (GRPO), optionally divided by the group's std.

    See :func:`agentrl.credit.grpo_advantages`."""

    name: ClassVar[str] = "grpo"

    norm_by_std: bool = True
    """Divide by the group's (unbiased) std of scores, as verl's norm_adv_by_std_in_grpo."""
    eps: float = 1e-6
    """Added to the std before dividing."""

    def __post_init__(self) -> None:
        _check_bool("norm_by_std", self.norm_by_std)
        _check_eps(self.eps)


@dataclass(frozen=True)
class RLOO(AdvantageEstimator):
    """Mean score of the other members of the group as baseline (RLOO).

    See :func:`agentrl.credit.rloo_advantages`."""

    name: ClassVar[str] = "rloo"


@dataclass(frozen=True)
class OPO(AdvantageEstimator):
    """Length-weighted mean score of the group as baseline (OPO).

    See :func:`agentrl.credit.opo_advantages`."""

    name: ClassVar[str] = "opo"


@dataclass(frozen=True)
class NoBaseline(AdvantageEstimator):
    """No baseline: the reward-to-go itself is the advantage (plain REINFORCE).

    See :func:`agentrl.credit.no_baseline`."""

    name: ClassVar[str] = "none"
    subtracts_group_baseline: ClassVar[bool] = False


Estimator = OTB | GRPO | RLOO | OPO | NoBaseline
"""Any typed estimator; ``--estimator NAME`` picks the member, ``--estimator.<field>`` sets its options."""

ESTIMATOR_CONFIGS: dict[str, type[AdvantageEstimator]] = {
    cls.name: cls for cls in (OTB, GRPO, RLOO, OPO, NoBaseline)
}
"""The typed estimators by name."""


def estimator_config(value: AdvantageEstimator | str | Mapping[str, Any]) -> AdvantageEstimator:
    """An estimator from its name (``"otb"``, as old ``config.json`` files have it), its ``config.json``
    form (``{"name": "grpo", "norm_by_std": false}``) or an estimator (returned as is)."""
    if isinstance(value, AdvantageEstimator):
        return value
    est: AdvantageEstimator = config_from_dict(Estimator, value, where="estimator")  # type: ignore[arg-type]
    return est
