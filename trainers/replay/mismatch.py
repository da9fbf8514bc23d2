"""Recompute log π and Σπ² of recorded tokens with the weights that sampled them (training–inference
mismatch)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from agentrl.errors import AuditError, ConfigError
from agentrl.learner import forward_logprobs
from agentrl.models import ModelSpec, resolve_model
from agentrl.replay import RecomputeReport, Run, TokenDiff, TrajectoryRecompute, token_text
from agentrl.trainers.replay.weights import load_tokenizer_for, load_weights, train_config
from agentrl.types import Trajectory

__all__ = ["recompute", "recompute_run"]


def _score_one(
    model: Any, traj: Trajectory, temperature: float, chunk_size: int
) -> tuple[list[float], list[float]]:
    dev = next(model.parameters()).device
    ids = torch.tensor([list(traj.token_ids)], dtype=torch.long, device=dev)
    mask = torch.tensor([list(traj.loss_mask)], dtype=torch.float32, device=dev)
    with torch.no_grad():
        out = forward_logprobs(
            model,
            ids,
            torch.ones_like(ids),
            temperature=temperature,
            chunk_size=chunk_size,
            with_sum_pi_squared=True,
            token_mask_B_T=mask,
        )
    assert out.sum_pi_squared_B_T is not None
    return out.logprobs_B_T[0].float().tolist(), out.sum_pi_squared_B_T[0].float().tolist()


def recompute(
    trajectories: Sequence[Trajectory],
    model: Any,
    *,
    tokenizer: Any = None,
    temperature: float = 1.0,
    indices: Sequence[int] | None = None,
    top: int = 10,
    chunk_size: int = 1024,
    weights: str = "",
    device: str | None = None,
    dtype: str | None = None,
) -> RecomputeReport:
    """Recompute log π and Σπ² of every sampled token with ``model`` and compare with the recorded sampler
    log-probs; ``largest`` lists the ``top`` worst tokens.

    ``model`` is a loaded module or a model name as :func:`agentrl.models.resolve_model` reads it (a model
    folder, a checkpoint, a run directory, ``smollm2``), loaded on ``device`` (default CPU) in ``dtype``.
    """
    if isinstance(model, str | os.PathLike):
        spec = ModelSpec(os.fspath(model), device=device or "cpu", dtype=dtype or "auto")
        loaded = resolve_model(spec, tokenizer=False)
        weights = weights or loaded.source
        model = loaded.model
    label = weights or type(model).__name__
    return _recompute_with(
        lambda _t: (model, label),
        trajectories,
        tokenizer=tokenizer,
        temperature=temperature,
        indices=indices,
        top=top,
        chunk_size=chunk_size,
    )


def recompute_run(
    run: Run,
    *,
    indices: Sequence[int] | None = None,
    model: Any = None,
    tokenizer: Any = None,
    top: int = 10,
    device: str | None = None,
    dtype: str | None = None,
) -> RecomputeReport:
    """:func:`recompute` for a run: each trajectory is scored by the weights that sampled it
    (``checkpoints/step-<policy_version>``, one model in memory at a time) at the run's temperature, unless
    ``model`` is given."""
    idx = list(indices) if indices is not None else list(range(len(run.trajectories)))
    trajs = [run.trajectories[i] for i in idx]
    # The learner scores at the sampling temperature (the trainer refuses runs where the two differ).
    temperature = train_config(run).learner.temperature if run.run_dir is not None else 1.0
    if tokenizer is None:
        tokenizer = load_tokenizer_for(run)
    if model is not None:
        return recompute(
            trajs,
            model,
            tokenizer=tokenizer,
            temperature=temperature,
            indices=idx,
            top=top,
            device=device,
            dtype=dtype,
        )
    cache: dict[int, tuple[Any, str]] = {}

    def pick(t: Trajectory) -> tuple[Any, str]:
        v = t.min_policy_version
        if v not in cache:
            cache.clear()  # one model in memory at a time
            cache[v] = load_weights(run, v, device=device, dtype=dtype)
        return cache[v]

    order = sorted(range(len(trajs)), key=lambda k: trajs[k].min_policy_version)
    rep = _recompute_with(
        pick,
        [trajs[k] for k in order],
        tokenizer=tokenizer,
        temperature=temperature,
        indices=[idx[k] for k in order],
        top=top,
        chunk_size=1024,
    )
    # Back to the caller's order.
    pos = {k: j for j, k in enumerate(order)}
    return dataclasses.replace(rep, trajectories=tuple(rep.trajectories[pos[k]] for k in range(len(trajs))))


def _recompute_with(
    pick: Callable[[Trajectory], tuple[Any, str]],
    trajectories: Sequence[Trajectory],
    *,
    tokenizer: Any,
    temperature: float,
    indices: Sequence[int] | None,
    top: int,
    chunk_size: int,
) -> RecomputeReport:
    if indices is not None and len(indices) != len(trajectories):
        raise ConfigError("indices must have one entry per trajectory")
    tx = token_text(tokenizer)
    per: list[TrajectoryRecompute] = []
    diffs: list[TokenDiff] = []
    total = 0
    sum_abs = 0.0
    sum_spi2 = 0.0
    for k, traj in enumerate(trajectories):
        index = indices[k] if indices is not None else k
        n_tok = len(traj.token_ids)
        if len(traj.loss_mask) != n_tok or len(traj.logprobs) != n_tok:
            raise AuditError(
                f"trajectory {index}: {n_tok} ids, {len(traj.loss_mask)} mask entries, {len(traj.logprobs)} "
                "log-probs; the columns do not line up (replay.check says where)"
            )
        model, weights = pick(traj)
        lps: list[float | None] = [None] * len(traj.token_ids)
        sps: list[float | None] = [None] * len(traj.token_ids)
        worst, worst_i, s_abs, n = 0.0, None, 0.0, 0
        if traj.num_model_tokens and len(traj.token_ids) > 1:
            lp_all, sp_all = _score_one(model, traj, temperature, chunk_size)
            for i, (mk, rec) in enumerate(zip(traj.loss_mask, traj.logprobs, strict=True)):
                if mk != 1 or i == 0:
                    continue
                lps[i], sps[i] = lp_all[i], sp_all[i]
                if rec is None:
                    continue
                d = abs(rec - lp_all[i])
                n += 1
                s_abs += d
                sum_spi2 += sp_all[i]
                if d > worst or worst_i is None:
                    worst, worst_i = d, i
                tid = traj.token_ids[i]
                diffs.append(
                    TokenDiff(
                        index,
                        traj.meta.episode_id,
                        i,
                        tid,
                        tx.token(tid) if tx else "",
                        rec,
                        lp_all[i],
                        sp_all[i],
                    )
                )
            if len(diffs) > 4 * max(top, 1):
                diffs.sort(key=lambda d: -d.abs_diff)
                del diffs[max(top, 1) :]
        total += n
        sum_abs += s_abs
        per.append(
            TrajectoryRecompute(
                index,
                traj.meta.episode_id,
                weights,
                tuple(lps),
                tuple(sps),
                worst,
                s_abs / n if n else 0.0,
                worst_i,
            )
        )
    diffs.sort(key=lambda d: -d.abs_diff)
    return RecomputeReport(
        tuple(per),
        tuple(diffs[: max(top, 0)]),
        total,
        max((t.max_abs_diff for t in per), default=0.0),
        sum_abs / total if total else 0.0,
        sum_spi2 / total if total else 0.0,
        temperature,
    )
