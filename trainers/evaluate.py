"""``agentrl eval`` and the held-out evaluation of ``agentrl train``: pass@1 (with a 95 % interval) and pass@k
of a policy on an environment's held-out split.

Intervals are percentile bootstraps **over tasks** (2,000 resamples, fixed seed): the ``k`` samples of
one task are correlated (an easy task is solved by all of them), so tasks, not episodes, are the
independent units; a binomial interval over episodes would be too narrow. A trained-vs-untrained
comparison on the same tasks bootstraps the paired per-task differences (:func:`paired_gain`); both
evaluations also use the same sampling seeds per (task, sample, turn) — common random numbers — so the
difference is not blurred by sampling luck.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import agentrl
from agentrl import TrajectoryMeta
from agentrl.chat import ChatRenderer
from agentrl.config import config_from_dict, config_to_dict
from agentrl.errors import ConfigError
from agentrl.models import ModelSpec, model_folder, resolve_model
from agentrl.protocols import Policy
from agentrl.rollout import GroupHook, RolloutConfig, run_groups
from agentrl.run import RunDir
from agentrl.trainers.tool_format import with_tool_format

__all__ = [
    "INTERVAL",
    "EvalConfig",
    "EvalReport",
    "Gain",
    "RunSettings",
    "bootstrap_interval",
    "evaluate",
    "evaluate_policy",
    "format_report",
    "group_hook_of",
    "held_out_env",
    "paired_gain",
    "pass_at_k",
    "run_held_out",
    "run_settings",
    "split_label",
    "write_comparison",
]

INTERVAL = "95% percentile bootstrap over tasks (2000 resamples)"
"""How every interval of this module is computed."""
_RESAMPLES = 2000


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al., 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ConfigError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _quantiles(values: list[float], level: float) -> tuple[float, float]:
    values.sort()
    lo = values[math.floor((1 - level) / 2 * (len(values) - 1))]
    hi = values[math.ceil((1 + level) / 2 * (len(values) - 1))]
    return lo, hi


def bootstrap_interval(
    successes: Sequence[int], samples: Sequence[int], *, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Interval of pass@1 = Σ successes / Σ samples, resampling tasks (one entry per task)."""
    if len(successes) != len(samples):
        raise ConfigError("successes and samples need one entry per task")
    n = len(successes)
    if n == 0 or sum(samples) == 0:
        return (math.nan, math.nan)
    rng = random.Random(seed)
    stats = []
    for _ in range(_RESAMPLES):
        pick = [rng.randrange(n) for _ in range(n)]
        total = sum(samples[i] for i in pick)
        stats.append(sum(successes[i] for i in pick) / total if total else 0.0)
    return _quantiles(stats, level)


@dataclass(frozen=True)
class EvalConfig:
    """The held-out evaluation ``agentrl train`` runs before its first step and after its last."""

    tasks: int = 32
    """Held-out tasks (the env's test split, task seeds ``seed, seed+1, ...``); 0 turns the evaluation off."""
    samples: int = 2
    """Episodes per task (pass@1 averages them; pass@k uses k = samples)."""
    seed: int = 10_000
    """First task seed; also the base of the sampling seeds (the same for the untrained and trained
    policy)."""
    split: str = "test"
    """Split asked of envs that have one (others are evaluated on their only task distribution)."""

    def __post_init__(self) -> None:
        for name in ("tasks", "samples", "seed"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"--eval.{name} must be an integer >= 0, got {v!r}")
        if self.samples < 1:
            raise ConfigError(f"--eval.samples must be >= 1, got {self.samples}")


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
    pass_at_1_low: float = math.nan
    """Lower end of pass@1's 95 % interval (:data:`INTERVAL`)."""
    pass_at_1_high: float = math.nan
    """Upper end of pass@1's 95 % interval."""
    interval: str = INTERVAL
    """How the interval was computed."""
    task_ids: tuple[str, ...] = ()
    """Evaluated tasks, in task-seed order (pairs two reports in :func:`paired_gain`)."""
    task_successes: tuple[int, ...] = ()
    """Successful episodes of each task."""
    task_samples: tuple[int, ...] = ()
    """Episodes of each task that count (infrastructure failures left out)."""
    token_limited: int = 0
    """Episodes (of those counted) that a token limit ended: their answers were cut off."""
    episodes: int = 0
    """Episodes counted (infra failures excluded)."""
    terms: dict[str, float] = field(default_factory=dict)
    """Each reward term's mean score per counted episode (envs that report terms: judges, rubrics, math)."""


@dataclass(frozen=True)
class Gain:
    """``after`` minus ``before`` pass@1 on the tasks both evaluated, with its paired 95 % interval."""

    tasks: int
    """Tasks in both reports."""
    before: float
    """pass@1 of the first report on those tasks."""
    after: float
    """pass@1 of the second report on those tasks."""
    gain: float
    """after − before."""
    low: float
    """Lower end of the gain's 95 % interval (paired bootstrap over tasks)."""
    high: float
    """Upper end of the gain's 95 % interval."""


def paired_gain(before: EvalReport, after: EvalReport, *, seed: int = 0) -> Gain:
    """The pass@1 difference of two evaluations of the same tasks, bootstrapped over tasks (paired)."""
    b = dict(zip(before.task_ids, zip(before.task_successes, before.task_samples, strict=True), strict=True))
    a = dict(zip(after.task_ids, zip(after.task_successes, after.task_samples, strict=True), strict=True))
    common = [t for t in before.task_ids if t in a and b[t][1] and a[t][1]]
    if not common:
        raise ConfigError("the two evaluations share no task with usable episodes")
    diffs = [a[t][0] / a[t][1] - b[t][0] / b[t][1] for t in common]
    pb = sum(b[t][0] for t in common) / sum(b[t][1] for t in common)
    pa = sum(a[t][0] for t in common) / sum(a[t][1] for t in common)
    rng = random.Random(seed)
    n = len(diffs)
    stats = [sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(_RESAMPLES)]
    low, high = _quantiles(stats, 0.95)
    return Gain(tasks=n, before=pb, after=pa, gain=pa - pb, low=low, high=high)


def held_out_env(env: str, split: str, **env_kwargs: Any) -> tuple[Callable[[], agentrl.Env], str | None]:
    """A factory for ``env``'s ``split`` (and the split used: None when the env has no split argument)."""
    kwargs: dict[str, Any] = {**env_kwargs, "split": split}
    try:
        agentrl.make(env, **{k: v for k, v in kwargs.items() if k != "sandbox_pool"})
    except ConfigError:
        kwargs.pop("split")  # the env has no split argument: evaluate on its only task distribution
    return (lambda: agentrl.make(env, **kwargs)), kwargs.get("split")


async def evaluate_policy(
    policy: Policy,
    renderer: ChatRenderer,
    make_env: Callable[[], agentrl.Env],
    *,
    env: str,
    split: str | None,
    k: int,
    tasks: int,
    seed: int,
    rollout: RolloutConfig,
    finish_group: GroupHook | None = None,
) -> EvalReport:
    """Sample ``k`` episodes on each of ``tasks`` tasks (seeds ``seed ...``) with ``policy``; the sampling
    seeds derive from ``seed`` (``rollout.seed`` is replaced), so two policies evaluated with the same
    arguments see the same tasks and the same random numbers. ``finish_group`` judges each task's ``k``
    episodes together, as in training (``--reward.relative-judge``: :func:`group_hook_of`)."""
    cfg = dataclasses.replace(rollout, seed=seed)
    by_task: dict[str, list[float]] = {}
    term_sums: dict[str, float] = {}
    infra = limited = counted = 0
    async for done in run_groups(
        make_env,
        policy,
        renderer,
        cfg,
        seeds=range(seed, seed + tasks),
        group_size=k,
        meta=TrajectoryMeta(env_id=env),
        finish_group=finish_group,
    ):
        t = done.trajectory
        if not t.infra_failure and t.meta.is_last_sample:
            counted += 1
            limited += t.stop_reason.is_token_limit
        if not t.infra_failure:
            for term in t.reward_terms:
                term_sums[term.name] = term_sums.get(term.name, 0.0) + term.score
        if done.group is None:
            continue
        infra += done.group.infra_failures
        usable = done.group.usable()  # its episodes' returns are summed over their samples
        by_task[done.group.task_id] = list(usable.rewards) if usable is not None else []
    order = sorted(by_task, key=lambda t: int(t.rsplit(":", 1)[-1]) if t.rsplit(":", 1)[-1].isdigit() else 0)
    wins = [sum(r >= 1.0 for r in by_task[t]) for t in order]
    ns = [len(by_task[t]) for t in order]
    rewards = [r for t in order for r in by_task[t]]
    full = [(n, c) for n, c in zip(ns, wins, strict=True) if n == k]
    low, high = bootstrap_interval(wins, ns)
    return EvalReport(
        env=env,
        split=split,
        tasks=sum(n > 0 for n in ns),
        samples_per_task=k,
        pass_at_1=sum(wins) / max(sum(ns), 1),
        pass_at_k=sum(pass_at_k(n, c, k) for n, c in full) / max(len(full), 1),
        mean_reward=sum(rewards) / max(len(rewards), 1),
        infra_failures=infra,
        pass_at_1_low=low,
        pass_at_1_high=high,
        task_ids=tuple(order),
        task_successes=tuple(wins),
        task_samples=tuple(ns),
        token_limited=limited,
        episodes=counted,
        terms={k: v / max(counted, 1) for k, v in sorted(term_sums.items())},
    )


def split_label(split: str | None) -> str:
    """How a report names where its tasks came from: an env without a ``split`` argument has no held-out
    tasks, only other seeds of the one distribution it trains on (they may repeat training tasks)."""
    return f"{split} split" if split else "all tasks, no test split"


def format_report(report: EvalReport) -> str:
    """One line: pass@1 with its interval, pass@k, mean reward."""
    return (
        f"{report.env} ({split_label(report.split)}): {report.tasks} tasks x {report.samples_per_task}: "
        f"pass@1={report.pass_at_1:.3f} [95% CI {report.pass_at_1_low:.3f}-{report.pass_at_1_high:.3f}] "
        f"pass@{report.samples_per_task}={report.pass_at_k:.3f} mean reward={report.mean_reward:.3f} "
        f"infra failures={report.infra_failures}" + "".join(f" {k}={v:.3f}" for k, v in report.terms.items())
    )


@dataclass(frozen=True)
class RunSettings:
    """What ``agentrl eval --model RUN`` takes from the training run's ``config.json`` when not given."""

    run: Path
    """The run directory."""
    env: str
    """The env the run trained on."""
    env_kwargs: dict[str, Any]
    """Its keyword arguments."""
    max_turns: int
    """The run's ``--rollout.max-turns``."""
    max_new_tokens: int
    """The run's ``--rollout.max-new-tokens``."""
    max_total_tokens: int
    """The run's ``--rollout.max-total-tokens``."""
    temperature: float
    """The run's sampling temperature (its own held-out evaluation used it too)."""


def run_settings(model: str) -> RunSettings | None:
    """The env and rollout settings of the training run ``model`` names: a run directory, one of its
    checkpoints (``<run>/checkpoints/step-N``) or a checkpoint's ``model/`` folder; None for anything else
    (``smollm2``, ``tiny``, a plain model folder).

    Raises:
        ConfigError: the run trained an ``--agent`` on a ``.jsonl`` task file, which is no env to evaluate.
    """
    path = Path(model)
    for run in (path, *list(path.parents)[:3]):
        config = RunDir(run).config_path
        if not config.is_file():
            continue
        try:
            data = json.loads(config.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or not isinstance(data.get("env"), str):
            continue  # a model folder's own config.json (Hugging Face), or a gateway's folder
        if run != path and not path.is_relative_to(RunDir(run).checkpoints_path):
            return None
        env = data["env"]
        if data.get("agent") and env.endswith(".jsonl"):
            raise ConfigError(
                f"{run} trained the agent {data['agent']} on the task file {env}, which is not an env "
                "eval can run; pass --env ID"
            )
        rollout = data.get("rollout")
        r: dict[str, Any] = rollout if isinstance(rollout, dict) else {}
        kwargs = dict(data.get("env_kwargs") or {})
        if r.get("tool_format") is not None:  # a run from before #41 kept its tool-call format there
            kwargs = with_tool_format(kwargs, r["tool_format"], env=env, given="rollout.tool_format")
        return RunSettings(
            run=run,
            env=env,
            env_kwargs=kwargs | _run_reward(data, run),
            max_turns=int(r.get("max_turns", 3)),
            max_new_tokens=int(r.get("max_new_tokens", 96)),
            max_total_tokens=int(r.get("max_total_tokens", 1024)),
            temperature=float(r.get("temperature", 1.0)),
        )
    return None


def _run_reward(data: dict[str, Any], run: Path) -> dict[str, Any]:
    """``{"reward": RewardConfig}`` when the run was rewarded by ``--reward.*`` (with the run's cache)."""
    from agentrl.rewards import RewardConfig

    block = data.get("reward")
    if not isinstance(block, dict):
        return {}
    reward = RewardConfig(**block)
    if not reward.enabled:
        return {}
    if reward.cache is None:
        reward = dataclasses.replace(reward, cache=str(RunDir(run).judge_cache_path))
    return {"reward": reward}


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
    max_total_tokens: int | None = None,
    temperature: float = 1.0,
    device: str = "cpu",
    env_kwargs: dict[str, Any] | None = None,
) -> EvalReport:
    """Sample ``k`` episodes on each of ``tasks`` held-out tasks and report pass@1 (with its interval) and
    pass@k.

    ``env`` is a registered id or a ``path/to/file.py:Class`` / ``package.module:Class`` reference.
    ``model`` is ``smollm2``, a model folder, a checkpoint (``<run>/checkpoints/step-N``) or a run directory
    (its newest checkpoint), as :func:`agentrl.models.resolve_model` reads it.
    """
    env = agentrl.registry.canonical_env(env)  # a file reference works from any directory, and is recorded so
    spec = ModelSpec(model, device=device)
    model_folder(spec.name)  # a wrong --model fails here, before any env is built
    make_env, used_split = held_out_env(env, split, **(env_kwargs or {}))
    # Imported here, not at the top: EvalConfig is part of every TrainConfig, and the rollout workers and
    # inference servers that unpickle one never evaluate a model (torch: ~3 CPU-s and ~300 MB per actor).
    from agentrl.policies import HFPolicy

    loaded = resolve_model(spec)
    renderer = ChatRenderer(loaded.tokenizer)
    policy = HFPolicy(
        loaded.model,
        loaded.tokenizer,
        stop_token_ids=renderer.stop_token_ids,
        device=loaded.device,
        seed=seed,
    )
    limits: dict[str, Any] = {} if max_total_tokens is None else {"max_total_tokens": max_total_tokens}
    cfg = RolloutConfig(max_turns=max_turns, max_new_tokens=max_new_tokens, temperature=temperature, **limits)
    return await evaluate_policy(
        policy,
        renderer,
        make_env,
        env=env,
        split=used_split,
        k=k,
        tasks=tasks,
        seed=seed,
        rollout=cfg,
        finish_group=group_hook_of(env_kwargs),
    )


def group_hook_of(env_kwargs: dict[str, Any] | None) -> GroupHook | None:
    """The group judge of the env's ``reward`` settings (``--reward.relative-judge``), or None."""
    from agentrl.rewards import RewardConfig

    reward = (env_kwargs or {}).get("reward")
    if isinstance(reward, dict):
        reward = RewardConfig(**reward)
    return reward.group_reward() if isinstance(reward, RewardConfig) else None


async def run_held_out(
    policy: Policy,
    renderer: ChatRenderer,
    env: str,
    env_kwargs: dict[str, Any],
    config: EvalConfig,
    rollout: RolloutConfig,
    run_dir: Path,
    label: str,
) -> EvalReport:
    """The trainer's held-out evaluation of ``policy`` (``label``: untrained / trained), printed and written
    to ``<run_dir>/eval-<label>.json``; the untrained one of a resumed run is read back from there."""
    path = RunDir(run_dir).eval_report_path(label)
    if label == "untrained" and path.exists():
        return config_from_dict(EvalReport, json.loads(path.read_text())["report"])
    make_env, split = held_out_env(env, config.split, **env_kwargs)
    t0 = time.perf_counter()
    report = await evaluate_policy(
        policy,
        renderer,
        make_env,
        env=env,
        split=split,
        k=config.samples,
        tasks=config.tasks,
        seed=config.seed,
        rollout=rollout,
        finish_group=group_hook_of(env_kwargs),
    )
    took = time.perf_counter() - t0
    path.write_text(json.dumps({"label": label, "seconds": took, "report": config_to_dict(report)}) + "\n")
    # Held out only when the env has a test split; otherwise say what it is (docs/writing-environments.md).
    kind = "held-out eval" if split else "eval (the env has no test split, so these tasks are not held out)"
    print(f"{kind}, {label} ({took:.0f}s): {format_report(report)}", flush=True)
    return report


def write_comparison(run_dir: Path, before: EvalReport, after: EvalReport) -> Gain:
    """Print the trained-vs-untrained gain and write both reports with it to ``<run_dir>/eval.json``."""
    gain = paired_gain(before, after)
    out = {
        "untrained": config_to_dict(before),
        "trained": config_to_dict(after),
        "gain": config_to_dict(gain),
        "interval": INTERVAL,
    }
    RunDir(run_dir).eval_path.write_text(json.dumps(out, indent=1) + "\n")
    on = f"held-out pass@1 on {gain.tasks} {after.split}" if after.split else f"pass@1 on {gain.tasks} (all"
    print(
        f"{on} tasks{', no test split)' if not after.split else ''} x {after.samples_per_task}: untrained "
        f"{before.pass_at_1:.3f} [{before.pass_at_1_low:.3f}, {before.pass_at_1_high:.3f}] -> trained "
        f"{after.pass_at_1:.3f} [{after.pass_at_1_low:.3f}, {after.pass_at_1_high:.3f}], gain "
        f"{gain.gain:+.3f} [{gain.low:+.3f}, {gain.high:+.3f}] ({INTERVAL}; {run_dir / 'eval.json'})",
        flush=True,
    )
    return gain
