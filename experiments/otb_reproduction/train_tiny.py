"""RL on chain-sum with agentrl's update path: rollout → collate → Learner.score → credit → Learner.step.

One run = (setting, estimator, group size, seed). Every step samples ``prompts_per_step`` fresh training
prompts (the same sequence for every configuration with the same seed: common random numbers), runs
``group_size`` episodes per prompt with :mod:`fast_rollout`, and hands the trajectories to
:func:`agentrl.update.policy_update` (the trainer's own function). Held-out success is measured at fixed
milestones of *generated model tokens*, so curves of different group sizes line up on the token axis.
Each finished run is written to its own JSON file; an existing file is skipped (resumable sweeps).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from fast_rollout import Vocab, group_rollout
from tiny_task import build_tokenizer, sample_numbers
from warmstart import held_out, success

from agentrl.credit import estimator_config
from agentrl.groups import group_trajectories
from agentrl.learner import Learner, LearnerConfig
from agentrl.learner.stability import StabilityState, begin_step
from agentrl.update import policy_update


@dataclass(frozen=True)
class Setting:
    """The task and optimizer settings shared by all runs of one sweep."""

    name: str
    """Short name used in file names and tables."""
    k: int = 4
    """Numbers per prompt (K − 1 tool calls): the horizon."""
    prompts_per_step: int = 8
    """Prompts per RL step (fixed for every group size)."""
    lr: float = 1e-3
    """AdamW learning rate."""
    max_grad_norm: float | None = 1.0
    """Gradient clipping (None: off, as in a stress test)."""
    token_budget: int = 400_000
    """Generated model tokens per run."""
    milestones: int = 10
    """Held-out evaluations per run, evenly spaced in tokens (plus one at 0)."""
    eval_prompts: int = 256
    """Held-out prompts per evaluation (one sampled episode each, temperature 1)."""
    policy_loss: str = "reinforce"
    """Learner policy loss (one update per batch, so PPO's ratio would be 1 anyway)."""
    loss_agg: str = "token-mean"
    """Learner loss aggregation (agentrl's default)."""
    lr_schedule: str = "constant"
    """``constant`` or ``length-triggered`` (:mod:`agentrl.learner.schedule`); the lr_* options below are
    the schedule's (LearnerConfig's defaults)."""
    lr_window: int = 10
    lr_trigger: float = 1.3
    lr_decay: float = 0.5
    lr_floor: float = 0.1


def run_one(
    setting: Setting, estimator: str, group_size: int, seed: int, warm: dict[str, torch.Tensor], out: Path
) -> dict[str, Any]:
    """Train one run and write ``out`` (JSON); return the record."""
    from tiny_task import tiny_policy

    tok = build_tokenizer()
    vocab = Vocab.of(tok)
    hidden = int(warm["model.embed_tokens.weight"].shape[1])
    layers = sum(1 for k in warm if k.endswith("input_layernorm.weight"))
    model = tiny_policy(len(tok), hidden=hidden, layers=layers)
    model.load_state_dict(warm)
    torch.manual_seed(seed)
    learner = Learner(
        model,
        LearnerConfig(
            policy_loss=setting.policy_loss,  # type: ignore[arg-type]
            loss_agg=setting.loss_agg,  # type: ignore[arg-type]
            lr=setting.lr,
            max_grad_norm=setting.max_grad_norm,
            chunk_size=4096,
            lr_schedule=setting.lr_schedule,  # type: ignore[arg-type]
            lr_window=setting.lr_window,
            lr_trigger=setting.lr_trigger,
            lr_decay=setting.lr_decay,
            lr_floor=setting.lr_floor,
        ),
    )
    stab = StabilityState()
    # The trainer's typed estimator with its defaults (``grpo`` divides by the group std, as verl's
    # norm_adv_by_std_in_grpo).
    est = estimator_config(estimator)
    prompt_rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(10_000 + seed)
    evals = held_out(setting.k, setting.eval_prompts)
    marks = [round(setting.token_budget * j / setting.milestones) for j in range(setting.milestones + 1)]
    curve: list[dict[str, float]] = []
    steps: list[dict[str, float]] = []
    tokens = 0
    t0 = time.perf_counter()

    def evaluate() -> None:
        curve.append(
            {"tokens": tokens, "step": len(steps), "success": success(model, vocab, evals, seed=seed)}
        )

    evaluate()
    next_mark = 1
    while next_mark < len(marks):
        prompts = [sample_numbers(prompt_rng, setting.k, "train") for _ in range(setting.prompts_per_step)]
        trajs = group_rollout(model, vocab, prompts, group_size, generator=gen, step=len(steps))
        groups = list(group_trajectories(trajs, size=group_size))
        # The trainer's own schedule and collapse check (a constant schedule leaves the optimizer alone).
        st = begin_step(learner.config, learner.optimizer, stab, groups, step=len(steps))
        stab = st.state
        upd = policy_update(learner, groups, estimator=est, pad_id=vocab.pad)
        n_tok = sum(t.num_model_tokens for t in trajs)
        tokens += n_tok
        m = upd.metrics
        steps.append(
            {
                "tokens": tokens,
                "reward": float(np.mean([t.reward for t in trajs])),
                "model_tokens_per_episode": n_tok / len(trajs),
                "grad_norm": m["learn/grad_norm"],
                "entropy": m["learn/entropy"],
                "adv_abs_mean": m["learn/adv_abs_mean"],
                "proxy_noise": m.get("variance/proxy3_pure_noise", math.nan),
                **{k.split("/", 1)[1]: v for k, v in st.metrics.items() if k != "learn/response_length"},
            }
        )
        while next_mark < len(marks) and tokens >= marks[next_mark]:
            evaluate()
            next_mark += 1
        if not math.isfinite(m["learn/grad_norm"]):
            # A diverged run: keep its record (it counts as a failure), stop spending compute on it.
            while next_mark < len(marks):
                curve.append({"tokens": marks[next_mark], "step": len(steps), "success": 0.0})
                next_mark += 1
    rec = {
        "setting": dataclasses.asdict(setting),
        "estimator": estimator,
        "group_size": group_size,
        "seed": seed,
        "curve": curve,
        "steps": steps,
        "wall_s": time.perf_counter() - t0,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec))
    tmp.replace(out)
    return rec


def run_path(root: Path, setting: Setting, estimator: str, group_size: int, seed: int) -> Path:
    """Where one run's JSON lives."""
    return root / setting.name / f"{estimator}-N{group_size}-s{seed}.json"


def sweep(
    root: Path,
    setting: Setting,
    configs: list[tuple[str, int]],
    seeds: list[int],
    warm: dict[str, torch.Tensor],
    *,
    log: bool = True,
) -> list[dict[str, Any]]:
    """Every (estimator, N) × seed not yet on disk; seeds outermost so partial sweeps stay balanced."""
    recs = []
    for seed in seeds:
        for est, n in configs:
            p = run_path(root, setting, est, n, seed)
            if p.exists():
                recs.append(json.loads(p.read_text()))
                continue
            rec = run_one(setting, est, n, seed, warm, p)
            if log:
                last = rec["curve"][-1]
                print(
                    f"[{setting.name}] {est} N={n} seed={seed}: success {rec['curve'][0]['success']:.2f} -> "
                    f"{last['success']:.2f} in {len(rec['steps'])} steps, {rec['wall_s']:.0f}s",
                    flush=True,
                )
            recs.append(rec)
    return recs
