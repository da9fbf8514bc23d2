"""``agentrl eval``: pass@1 and pass@k of a model on an environment's held-out split."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import agentrl
from agentrl import TrajectoryMeta
from agentrl.chat import ChatRenderer
from agentrl.errors import ConfigError
from agentrl.models import ModelSpec, model_folder, resolve_model
from agentrl.policies import HFPolicy
from agentrl.rollout import RolloutConfig, run_groups

__all__ = ["EvalReport", "evaluate", "pass_at_k"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al., 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ConfigError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass(frozen=True)
class EvalReport:
    """What an evaluation measured."""

    env: str
    """Environment id."""
    split: str | None
    """Split the tasks came from (None when the env has no splits)."""
    tasks: int
    """Tasks evaluated."""
    samples_per_task: int
    """Episodes per task (n)."""
    pass_at_1: float
    """Mean success rate over all episodes."""
    pass_at_k: float
    """Unbiased pass@k with k = samples_per_task."""
    mean_reward: float
    """Mean episode reward."""
    infra_failures: int
    """Episodes lost to infrastructure failures (excluded from the rates)."""


async def evaluate(
    model: str,
    env: str,
    *,
    k: int = 4,
    tasks: int = 32,
    split: str = "test",
    seed: int = 10_000,
    max_turns: int = 3,
    max_new_tokens: int = 96,
    temperature: float = 1.0,
    device: str = "cpu",
) -> EvalReport:
    """Sample ``k`` episodes on each of ``tasks`` held-out tasks and report pass@1 / pass@k.

    ``model`` is ``smollm2``, a model folder, a checkpoint (``<run>/checkpoints/step-N``) or a run directory
    (its newest checkpoint), as :func:`agentrl.models.resolve_model` reads it.
    """
    spec = ModelSpec(model, device=device)
    model_folder(spec.name)  # a wrong --model fails here, before any env is built
    kwargs: dict[str, Any] = {"split": split}
    try:
        agentrl.make(env, **kwargs)
    except ConfigError:
        kwargs = {}  # the env has no split argument: evaluate on its only task distribution
    loaded = resolve_model(spec)
    renderer = ChatRenderer(loaded.tokenizer)
    policy = HFPolicy(
        loaded.model,
        loaded.tokenizer,
        stop_token_ids=renderer.stop_token_ids,
        device=loaded.device,
        seed=seed,
    )
    cfg = RolloutConfig(max_turns=max_turns, max_new_tokens=max_new_tokens, temperature=temperature)
    by_task: dict[str, list[float]] = {}
    infra = 0
    async for done in run_groups(
        lambda: agentrl.make(env, **kwargs),
        policy,
        renderer,
        cfg,
        seeds=range(seed, seed + tasks),
        group_size=k,
        meta=TrajectoryMeta(env_id=env),
    ):
        usable = done.group.usable() if done.group is not None else None
        if done.group is not None:
            infra += done.group.infra_failures
        if usable is not None:
            by_task[usable.task_id] = list(usable.rewards)
    rewards = [r for rs in by_task.values() for r in rs]
    full = [rs for rs in by_task.values() if len(rs) == k]
    return EvalReport(
        env=env,
        split=kwargs.get("split"),
        tasks=len(by_task),
        samples_per_task=k,
        pass_at_1=sum(r >= 1.0 for r in rewards) / max(len(rewards), 1),
        pass_at_k=sum(pass_at_k(k, sum(r >= 1.0 for r in rs), k) for rs in full) / max(len(full), 1),
        mean_reward=sum(rewards) / max(len(rewards), 1),
        infra_failures=infra,
    )
