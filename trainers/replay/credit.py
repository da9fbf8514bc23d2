"""A step's advantages by whatever way the run still allows: recomputed from the weights that sampled it, or,
once its checkpoint was rotated away, computed from what the run recorded (rewards, and for OTB the
learner's log π and Σπ² in ``<run>/scores``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentrl.batch import collate
from agentrl.errors import StoreError
from agentrl.groups import group_trajectories
from agentrl.replay import Run
from agentrl.scores import load_step_scores, step_scores_tensors
from agentrl.trainers.replay.reproduce import _pad_id, _per_token, step_advantages, step_batch
from agentrl.trainers.replay.weights import exact_weights, train_config

__all__ = ["StepAdvantages", "advantages_of_step"]


@dataclass(frozen=True)
class StepAdvantages:
    """The per-token advantages of one training step, and where they came from."""

    step: int
    """The training step."""
    values: dict[int, tuple[float | None, ...]]
    """Per trained trajectory (by run position), per token: its advantage (None off the model tokens)."""
    source: str
    """How they were obtained, for reports (``recomputed from ...``, ``computed from recorded ...``)."""
    from_record: bool
    """Computed from recorded data because the step's checkpoint is gone (not recomputed from weights)."""
    error: str | None = None
    """Why the step has no advantages (then :attr:`values` is empty)."""


def advantages_of_step(
    run: Run, step: int, *, device: str | None = None, dtype: str | None = None, tokenizer: object = None
) -> StepAdvantages:
    """The advantages of ``step``: recomputed with the weights that sampled it when they are on disk (as
    :func:`step_advantages`), else computed with the run's estimator from the recorded rewards and — for an
    estimator that reads the policy (OTB) — the log π and Σπ² the trainer recorded for the step. A step that
    allows neither (an OTB run written before scores were recorded, its checkpoint rotated away) gets an
    :attr:`StepAdvantages.error` saying so, not an exception."""
    assert run.run_dir is not None, "advantages need a run directory"
    cfg = train_config(run)
    _all, trained = step_batch(run, step)
    if not trained:
        return StepAdvantages(step, {}, "no trained episode", False)
    if step == 0 or run.run_dir.find_checkpoint(step) is not None:
        values = step_advantages(run, step, device=device, dtype=dtype, tokenizer=tokenizer)
        how = "" if exact_weights(run, step) else " (a float16 copy of them)"
        return StepAdvantages(step, values, f"recomputed with the weights that sampled it{how}", False)
    gone = f"checkpoint step {step} is not on disk"
    try:
        run.run_dir.require_checkpoint(step, keep=cfg.output.keep_checkpoints)
    except StoreError as e:
        gone = str(e)
    groups = list(group_trajectories(run.trajectories[i] for i in trained))
    trajs = [t for g in groups for t in g]
    batch = collate(groups, pad_id=_pad_id(tokenizer) if tokenizer is not None else 0)
    name = cfg.estimator.name
    lp: torch.Tensor | None = None
    sp: torch.Tensor | None = None
    if cfg.estimator.needs_policy_stats:
        scores = load_step_scores(run.run_dir, step)
        if scores is None:
            why = (
                f"the {name} estimator needs log π and Σπ² of the weights that sampled step {step}, and "
                f"the run recorded none (it predates <run>/scores); {gone}"
            )
            return StepAdvantages(step, {}, "", True, why)
        try:
            lp, sp = step_scores_tensors(scores, trajs, batch.loss_mask_B_T.shape[1])
        except StoreError as e:
            return StepAdvantages(step, {}, "", True, str(e))
        source = "computed from the trainer's recorded log π and Σπ² (checkpoint rotated away)"
    else:
        source = f"computed from the recorded rewards ({name} needs no weights; checkpoint rotated away)"
    adv = cfg.estimator.advantages(
        batch.token_rewards_B_T,
        batch.loss_mask_B_T,
        lp,
        sp,
        batch.group_ids,
        episode_ids=batch.episode_ids_or_none,
    )
    return StepAdvantages(step, dict(zip(trained, _per_token(adv, trajs), strict=True)), source, True)
