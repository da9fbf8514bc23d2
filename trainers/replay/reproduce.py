"""Reproduce a training step from its record: advantages, loss and metrics recomputed, then compared."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.chat import ChatRenderer
from agentrl.dynamic_sampling import GroupVerdict, group_verdict
from agentrl.errors import ConfigError
from agentrl.groups import group_trajectories
from agentrl.learner import Learner
from agentrl.learner.correction import Correction
from agentrl.learner.stability import StepInputs, observe_step, stability_at
from agentrl.replay import Run
from agentrl.trainers.factories import learner_config, precision, resolved, tokenizer_pad_id
from agentrl.trainers.replay.weights import exact_weights, load_tokenizer_for, load_weights, train_config
from agentrl.trainers.step_metrics import episode_metrics
from agentrl.trainers.train_config import TrainConfig
from agentrl.types import Trajectory
from agentrl.update import policy_update, score_and_credit

__all__ = [
    "HALF_ATOL",
    "HALF_RTOL",
    "OPTIMIZER_STEP_METRICS",
    "MetricCheck",
    "StepReport",
    "reproduce_step",
    "run_correction",
    "step_advantages",
    "step_batch",
]

HALF_RTOL = 5e-3
"""Relative tolerance of a step reproduced from float16 weights (a checkpoint compacted with
``--older-checkpoints half``). Rounding each weight to 11 significant bits moves a tiny model's metrics by
well under 0.5%; a trained SmolLM2's log-probs move by up to ~1 (docs/checkpoints.md), so its steps may not
reproduce even so: the report names the float16 copy."""
HALF_ATOL = 1e-3
"""Absolute tolerance of a step reproduced from float16 weights (see :data:`HALF_RTOL`)."""
OPTIMIZER_STEP_METRICS = ("learn/update_rel_norm", "learn/unchanged_frac")
"""Metrics of the optimizer's own step: they depend on AdamW's moments from the earlier steps, so replay
compares them only where it has that state (step 0, or a checkpoint that kept ``optimizer.pt``)."""


@dataclass(frozen=True)
class MetricCheck:
    """One metric of a step: recorded in ``metrics.jsonl`` vs recomputed now."""

    name: str
    """Metric name (``learn/loss``...)."""
    recorded: float | None
    """Value in ``metrics.jsonl`` (None: absent or non-finite)."""
    recomputed: float
    """Value recomputed from the record and the checkpoint."""
    match: bool
    """Within tolerance."""

    @property
    def abs_diff(self) -> float | None:
        """|recorded − recomputed| (None when not comparable)."""
        if self.recorded is None or not math.isfinite(self.recomputed):
            return None
        return abs(self.recorded - self.recomputed)


@dataclass(frozen=True)
class StepReport:
    """A training step recomputed from its recorded trajectories and the weights that sampled them."""

    step: int
    """The step."""
    weights: str
    """Which weights were used (checkpoint folder, or the rebuilt initial weights)."""
    estimator: str
    """Advantage estimator of the run."""
    indices: tuple[int, ...]
    """Positions (in the run) of the trajectories the step trained on, in batch order."""
    episode_ids: tuple[str, ...]
    """Their episode ids."""
    advantages: tuple[tuple[float | None, ...], ...]
    """Per trajectory, per token: the recomputed advantage (None off the model tokens)."""
    checks: tuple[MetricCheck, ...]
    """Recorded against recomputed metrics."""
    device: str
    """Where it was recomputed."""
    tolerance: tuple[float, float] = (1e-4, 1e-6)
    """``(rtol, atol)`` the checks used: wider than asked when the weights are a float16 copy."""

    @property
    def matches(self) -> bool:
        """Every recorded metric was reproduced."""
        return all(c.match for c in self.checks)

    def advantages_of(self, index: int) -> tuple[float | None, ...] | None:
        """Advantages of the trajectory at run position ``index`` (None if it was not in the batch)."""
        try:
            return self.advantages[self.indices.index(index)]
        except ValueError:
            return None


def step_batch(run: Run, step: int) -> tuple[list[int], list[int]]:
    """``(all, trained)``: run positions of the step's trajectories (those the trainer counted in its
    episode metrics) and, among them, the ones it trained on (infra failures dropped), in batch order.

    The trainer uses every *complete* group of the step (a resumed step re-runs incomplete ones, whose
    leftovers stay in the file but were never trained on), the last one of each task; with
    ``--dynamic-sampling true`` only those with reward signal (:func:`agentrl.dynamic_sampling.group_verdict`,
    the trainer's own test: refills are groups of the step like the others).
    """
    cfg = train_config(run) if run.run_dir is not None else None
    group_size = cfg.batch.group_size if cfg is not None else None
    filtering = cfg is not None and cfg.batch.dynamic_sampling.enabled
    members: dict[str, list[int]] = {}
    for i, t in enumerate(run.trajectories):
        if t.meta.step == step:
            members.setdefault(t.meta.group_id, []).append(i)
    if not members:
        raise ConfigError(f"no trajectory of step {step} in {run.trajectories_path}")
    keep = {g for g, ix in members.items() if group_size is None or _episodes(run, ix) == group_size}
    # A task sampled twice for one step (an asynchronous run resumed: a group sampled by weights the resumed
    # run no longer had is sampled again) was trained on its last complete group.
    last: dict[str, str] = {}
    for g in sorted(keep, key=lambda g: members[g][-1]):
        last[run.trajectories[members[g][0]].meta.task_id or g] = g
    keep = set(last.values())
    all_idx = [i for i, t in enumerate(run.trajectories) if t.meta.step == step and t.meta.group_id in keep]
    # The trainer's rows: groups in the order they completed, members in finishing order (= file order).
    pos = {id(run.trajectories[i]): i for i in all_idx}
    groups = group_trajectories(run.trajectories[i] for i in all_idx)
    usable = (g.usable() for g in groups if not filtering or group_verdict(g) is GroupVerdict.SIGNAL)
    # Infra failures dropped as the trainer drops them: an episode with one failed sample goes whole.
    trained = [pos[id(t)] for u in usable if u is not None for t in u]
    return all_idx, trained


def _episodes(run: Run, indices: list[int]) -> int:
    """Complete episodes among one group's trajectories (a multi-sample episode counts once; one still
    missing a sample, a crash between its lines, not at all)."""
    return sum(g.num_episodes for g in group_trajectories(run.trajectories[i] for i in indices))


def run_correction(run: Run) -> Correction | None:
    """The off-policy correction the run trained with; None for a run recorded before corrections
    existed (its ``config.json`` has no ``correction``: its updates had none)."""
    if run.run_dir is None:
        return None
    raw = json.loads(run.run_dir.config_path.read_text())
    grouped = raw.get("async_")  # since the settings were grouped; before, at the top level
    written = "correction" in raw or (isinstance(grouped, dict) and "correction" in grouped)
    return train_config(run).async_.correction if written else None


def _pad_id(tokenizer: Any) -> int:
    return tokenizer_pad_id(ChatRenderer(tokenizer))


def _per_token(adv_B_T: Any, trajs: Sequence[Trajectory]) -> tuple[tuple[float | None, ...], ...]:
    rows = adv_B_T.detach().float().cpu().tolist()
    return tuple(
        tuple(rows[b][i] if t.loss_mask[i] == 1 else None for i in range(len(t.token_ids)))
        for b, t in enumerate(trajs)
    )


def step_advantages(
    run: Run, step: int, *, device: str | None = None, dtype: str | None = None, tokenizer: Any = None
) -> dict[int, tuple[float | None, ...]]:
    """Per-token advantages of step ``step``, recomputed with the run's estimator, by run position.

    ``otb`` needs the weights that sampled the step (log π and Σπ²); the other estimators only need the
    rewards, but the same path is used so the numbers are exactly the trainer's.
    """
    if run.run_dir is None:
        raise ConfigError("advantages need a run directory (config.json says which estimator the run used)")
    cfg = train_config(run)
    _all, trained = step_batch(run, step)
    if not trained:
        return {}
    model, _ = load_weights(run, step, device=device, dtype=dtype)
    tok = tokenizer if tokenizer is not None else load_tokenizer_for(run)
    credit = score_and_credit(
        _learner(model, cfg, run),
        list(group_trajectories(run.trajectories[i] for i in trained)),
        estimator=cfg.estimator,
        pad_id=_pad_id(tok),
        correction=run_correction(run),
        learner_version=step,
    )
    per = _per_token(credit.advantages_B_T, [run.trajectories[i] for i in trained])
    return dict(zip(trained, per, strict=True))


def _close(a: float | None, b: float, rtol: float, atol: float) -> bool:
    if a is None:
        return not math.isfinite(b)
    if not math.isfinite(b):
        return False
    return math.isclose(a, b, rel_tol=rtol, abs_tol=atol)


def reproduce_step(
    run: Run,
    step: int,
    *,
    device: str | None = None,
    dtype: str | None = None,
    rtol: float = 1e-4,
    atol: float = 1e-6,
    tokenizer: Any = None,
) -> StepReport:
    """Recompute training step ``step`` exactly as the trainer did and compare with ``metrics.jsonl``.

    From the recorded trajectories of the step (complete groups, infra failures dropped) and the weights
    the learner held when it trained them (``checkpoints/step-<step>``, or the rebuilt initial weights for
    step 0; in a synchronous run these also sampled them): collate →
    ``Learner.score`` (log π, Σπ²) → the run's advantage estimator → ``Learner.step``'s loss and gradient
    norm (before the optimizer moves anything) → the variance proxies. From a compacted (float16) checkpoint
    the tolerances widen to at least :data:`HALF_RTOL`/:data:`HALF_ATOL`. Raises :class:`StoreError` when the
    checkpoint was rotated away, :class:`ConfigError` when the step has no metrics or trajectories.
    """
    if run.run_dir is None:
        raise ConfigError(f"{run.path} is not a run directory (no config.json); --step needs one")
    cfg = train_config(run)
    row = run.metrics_row(step)
    if row is None:
        have = sorted({int(r["step"]) for r in run.metrics if "step" in r})
        raise ConfigError(f"metrics.jsonl has no row for step {step} (steps logged: {have})")
    all_idx, trained = step_batch(run, step)
    tok = tokenizer if tokenizer is not None else load_tokenizer_for(run)
    if tok is None:
        raise ConfigError("cannot tell the run's tokenizer; pass tokenizer=")
    rollout = episode_metrics([run.trajectories[i] for i in all_idx])  # per episode, as the trainer's
    got: dict[str, float] = {
        k: rollout[k] for k in ("episodes/total", "episodes/infra_failures", "reward/mean")
    }
    if trained and not exact_weights(run, step):
        # A compacted checkpoint holds float16 weights: their rounding, not a bug, moves the metrics a little.
        rtol, atol = max(rtol, HALF_RTOL), max(atol, HALF_ATOL)
    weights, dev_s = "", ""
    unmeasured: set[str] = set()
    advantages: tuple[tuple[float | None, ...], ...] = ()
    if trained:
        model, weights = load_weights(run, step, device=device, dtype=dtype)
        # The trainer's own update function, on the recorded episodes and the weights that sampled them.
        learner = _learner(model, cfg, run)
        if not _with_optimizer_state(run, step, learner):
            # The update's own measures depend on the optimizer's state (Adam's moments after `step` steps),
            # which only an uncompacted checkpoint keeps; a fresh optimizer would report another update.
            unmeasured = set(OPTIMIZER_STEP_METRICS)
        groups = list(group_trajectories(run.trajectories[i] for i in trained))
        # An asynchronous step: μ (the recorded log-probs), each turn's version (staleness) and the run's
        # correction give the same ρ̄; the checkpoint of the step is the learner's π_old.
        update = policy_update(
            learner,
            groups,
            estimator=cfg.estimator,
            pad_id=_pad_id(tok),
            correction=run_correction(run),
            learner_version=step,
            skip_zero="learn/zero_advantage_skip" in row,  # a run recorded before the skip stepped on zeros
        )
        dev_s = str(learner.device)
        got.update(update.metrics)
        # The lr schedule's and collapse check's decision, from the state the step's checkpoint stored.
        stab = observe_step(cfg.learner, stability_at(run.run_dir, step), StepInputs.of(groups), step=step)
        got.update(stab.metrics)
        advantages = _per_token(update.credit.advantages_B_T, [run.trajectories[i] for i in trained])
    checks = []
    for name, value in got.items():
        if name not in row or name in unmeasured:
            continue
        rec = row[name]
        rec_f = None if rec is None else float(rec)
        checks.append(MetricCheck(name, rec_f, float(value), _close(rec_f, float(value), rtol, atol)))
    return StepReport(
        step,
        weights or "(no trajectory to train on)",
        str(cfg.estimator),
        tuple(trained),
        tuple(run.trajectories[i].meta.episode_id for i in trained),
        advantages,
        tuple(checks),
        dev_s,
        (rtol, atol),
    )


def _with_optimizer_state(run: Run, step: int, learner: Learner) -> bool:
    """Load the optimizer state the trainer had before ``step`` into ``learner``; True when it is known (step
    0 starts from a fresh optimizer; a later step needs its checkpoint's ``optimizer.pt``)."""
    from agentrl.checkpoint import load_checkpoint

    ckpt = run.run_dir.find_checkpoint(step) if run.run_dir is not None else None
    if ckpt is None or not ckpt.optimizer_path.is_file():
        return step == 0
    load_checkpoint(ckpt, optimizer=learner.optimizer, restore_rng=False)
    return True


def _learner(model: Any, cfg: TrainConfig, run: Run) -> Learner:
    """The learner as the run trained: its precision on this device (bf16 autocast over fp32 master weights
    on CUDA) and the micro-batch sizes it resolved, so a replayed step scores with the arithmetic the
    trainer used."""
    prec = precision(cfg, next(model.parameters()).device)
    found = resolved(cfg, run.run_dir) if run.run_dir is not None else None
    return Learner(model, learner_config(cfg, prec, found))
