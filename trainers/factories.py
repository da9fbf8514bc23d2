"""What a training run is built from its :class:`~agentrl.trainers.train_config.TrainConfig`: the run folder
and what it resolved (:func:`prepare_run`), task order, the model's spec and precision, the learner's
settings, the sampler, the env and its sandbox pool.

The runtimes (trainers/local.py, trainers/ray/) and the loop (trainers/loop.py) build on these; the
trainer's entry point is :mod:`agentrl.trainers.train`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import agentrl
from agentrl._lazy import load
from agentrl.chat import ChatRenderer
from agentrl.errors import ConfigError
from agentrl.learner import LearnerConfig
from agentrl.lora import published_state
from agentrl.models import model_folder
from agentrl.precision import Precision, resolve_precision
from agentrl.protocols import UpdatablePolicy, WeightSink, WeightUpdate
from agentrl.rewards import RewardConfig
from agentrl.rollout import RolloutConfig
from agentrl.run import ModelSpec, RunDir
from agentrl.trainers.tool_format import record_choice, resolve_auto
from agentrl.trainers.train_config import ResolvedRun, TrainConfig, resumed_config

# torch and the HF policy are imported where they are used: a rollout worker or inference server builds its
# env and renderer from these factories but never trains, and torch costs it ~3 CPU-s and ~300 MB per actor.
if TYPE_CHECKING:
    import torch

    from agentrl.policies import HFPolicy
    from agentrl.sandbox import SandboxPool

__all__ = [
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
    "sandbox_pool",
    "task_seeds",
    "tokenizer_pad_id",
    "with_sandbox_cap",
]


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
    return ModelSpec(cfg.model, seed=cfg.seed, device=cfg.weights.device, dtype=cfg.weights.master_dtype)


def sampler_spec(cfg: TrainConfig) -> ModelSpec:
    """A sampler's own copy of the weights (an inference server, the gateway's policy): the compute dtype."""
    return ModelSpec(cfg.model, seed=cfg.seed, device=cfg.weights.device, dtype=cfg.weights.dtype)


def precision(cfg: TrainConfig, device: torch.device) -> Precision:
    """The run's master, compute and sampler dtypes on ``device`` (:mod:`agentrl.precision`)."""
    return resolve_precision(cfg.weights.dtype, cfg.weights.master_dtype, device)


def learner_config(
    cfg: TrainConfig, prec: Precision, resolved: ResolvedRun | None = None, *, fsdp: bool = False
) -> LearnerConfig:
    """``--learner`` as the learner runs it: with the sizes the run ``resolved`` for its device (None: the
    config's own, a 0 then sized by the learner at start), under bf16 autocast when the master weights are
    more precise than the compute dtype (FSDP2 casts by its own mixed-precision policy instead,
    ``fsdp=True``)."""
    lc = cfg.learner if resolved is None else resolved.learner(cfg.learner)
    if prec.autocast and not fsdp and not lc.bf16_autocast:
        return dataclasses.replace(lc, bf16_autocast=True)
    return lc


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
    kind = cfg.sampler.policy
    if kind == "auto":
        kind = "vllm" if device.type == "cuda" and importlib.util.find_spec("vllm") is not None else "hf"
    # With LoRA, vLLM serves one adapter per live policy version (agentrl/policies/vllm_lora.py).
    lora = cfg.weights.lora if cfg.weights.lora.enabled else None
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    if kind == "vllm-server":
        if not cfg.sampler.vllm_url:
            raise ConfigError("--policy vllm-server needs --vllm-url (e.g. http://127.0.0.1:8000)")
        from agentrl.policies import VLLMServerPolicy

        return VLLMServerPolicy(
            cfg.sampler.vllm_url,
            cfg.sampler.vllm_model,
            stop_token_ids=renderer.stop_token_ids,
            tokenizer=tokenizer,
            version=version,
            lora=lora,
            max_live_adapters=cfg.async_.max_staleness + 1,
        )
    if kind == "vllm":
        if cfg.async_.max_staleness > 0:
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
    # Looked up on this module (imported on first use by __getattr__ below), where a test's scripted sampler
    # may stand in for it.
    hf_policy: type[HFPolicy] = sys.modules[__name__].HFPolicy
    return hf_policy(
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
    """The env's constructor arguments: ``--env-kwargs`` (a ToolEnv's ``tool_format`` among them, which
    ``--rollout.tool-format`` sets; ``auto``: the format the model's chat template renders) and the reward.
    Train, eval and ``replay --reexec`` all build the env from this, so they read the model's calls the same
    way."""
    kwargs = dict(cfg.env_kwargs)
    cls = agentrl.registry.entry_point(cfg.env)
    if cfg.reward.enabled:
        kwargs.setdefault("reward", reward_config(cfg, cls))
    if kwargs.get("tool_format") == "auto":
        kwargs["tool_format"] = resolve_auto(cfg.model)
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
    if cfg.reward.cache is None and cfg.output.out is not None:
        return dataclasses.replace(cfg.reward, cache=str(Path(cfg.output.out) / "judge_cache.jsonl"))
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


def sandbox_pool(cfg: TrainConfig, size: int) -> SandboxPool | None:
    """The sandbox pool of a runtime's episodes (``size`` sessions, at most ``--sandbox.max-starting``
    starting at once), or None when ``cfg.env`` runs no code (:func:`needs_sandbox`). Not entered yet."""
    if not needs_sandbox(cfg):
        return None
    from agentrl.sandbox import rollout_pool

    return rollout_pool(size, max_starting=cfg.deploy.sandbox.max_starting)


def with_sandbox_cap(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with ``--sandbox.max-starting`` resolved here (``$AGENTRL_SANDBOX_MAX_STARTING`` when not
    given), for processes that do not see this one's environment: Ray does not pass the driver's environment
    variables to its actors, which build their pools from the config they are handed."""
    if cfg.deploy.sandbox.max_starting is not None:
        return cfg
    from agentrl.sandbox.pool import default_max_starting

    cap = dataclasses.replace(cfg.deploy.sandbox, max_starting=default_max_starting())
    return dataclasses.replace(cfg, deploy=dataclasses.replace(cfg.deploy, sandbox=cap))


# ---------------------------------------------------------------------------------------------------
def prepare_run(cfg: TrainConfig) -> tuple[TrainConfig, RunDir]:
    """Resolve the run directory and the config actually used (a resumed run keeps its saved config,
    :func:`~agentrl.trainers.train_config.resumed_config`), and write it; a new run also writes what it
    resolved from its device (:class:`~agentrl.trainers.train_config.ResolvedRun`, :func:`resolved`)."""
    resume = cfg.output.resume
    if resume is not None:
        cfg = resumed_config(cfg)
        run = RunDir(Path(resume))
    else:
        if cfg.agent is None or not cfg.env.endswith(".jsonl"):
            cfg = dataclasses.replace(cfg, env=agentrl.registry.canonical_env(cfg.env))
        slug = agentrl.registry.env_slug(cfg.env)
        out = cfg.output.out or f"runs/{slug}-{time.strftime('%Y%m%d-%H%M%S')}"
        run = RunDir(Path(out))
        if run.exists() and run.has_records():
            raise ConfigError(f"{run.path} already holds a run; pass --resume {run.path} to continue it")
        cfg = dataclasses.replace(cfg, output=dataclasses.replace(cfg.output, out=str(run.path)))
        found = _resolve_for_device(cfg)
        # --rollout.tool-format auto: the format it chose, printed and recorded.
        asked = cfg.env_kwargs.get("tool_format")
        fmt = record_choice(asked, env=cfg.env, agent=cfg.agent, model=cfg.model)
        if fmt != asked:
            cfg = dataclasses.replace(cfg, env_kwargs={**cfg.env_kwargs, "tool_format": fmt})
        run.write_config(cfg)
        found.write(run)
        return cfg, run
    run.write_config(cfg)
    return cfg, run


def resolved(cfg: TrainConfig, run: RunDir) -> ResolvedRun:
    """What ``run`` (started with ``cfg``) resolved from its device (:class:`ResolvedRun`)."""
    return ResolvedRun.read(run, cfg)


def _resolve_for_device(cfg: TrainConfig) -> ResolvedRun:
    """The learner's sizes and attention left to the device (0, auto) as this device resolves them; each is
    printed."""
    from agentrl.learner.attention import resolve_attention
    from agentrl.models import resolve_device

    dev = resolve_device(cfg.weights.device)
    mbt, chunk = _learner_sizes(cfg, dev)
    impl = resolve_attention(cfg.learner.attention, dev.type)
    print(f"learner: attention={impl} (asked: {cfg.learner.attention})")
    return ResolvedRun(micro_batch_tokens=mbt, chunk_size=chunk, attention=impl)


def _learner_sizes(cfg: TrainConfig, dev: torch.device) -> tuple[int | None, int]:
    """The learner's micro_batch_tokens and chunk_size, those left at 0 chosen for ``dev`` (an explicit
    value wins), and say what was chosen. On CUDA the model's config.json gives its shape; a model without a
    folder ('tiny') keeps 0 and the learner sizes it when it starts."""
    import json

    from agentrl.learner.sizing import ModelShape, device_sizes

    lc = cfg.learner
    if lc.micro_batch_tokens != 0 and lc.chunk_size != 0:
        return lc.micro_batch_tokens, lc.chunk_size
    shape = None
    reserved = 0
    if dev.type == "cuda":
        folder = model_folder(cfg.model)
        if folder is None:
            print("learner: micro-batch and LM-head chunk sizes chosen by the learner at start")
            return lc.micro_batch_tokens, lc.chunk_size
        shape = ModelShape.from_config(json.loads((folder / "config.json").read_text()))
        policy = cfg.sampler.policy
        vllm = policy == "vllm" or (policy == "auto" and importlib.util.find_spec("vllm") is not None)
        if vllm:  # the in-process engine takes its share of the GPU after the learner's model is loaded
            import torch

            reserved = int(0.35 * torch.cuda.get_device_properties(dev).total_memory)
    sizes = device_sizes(dev, shape, reserved_bytes=reserved)
    mbt = sizes.micro_batch_tokens if lc.micro_batch_tokens == 0 else lc.micro_batch_tokens
    chunk = sizes.chunk_size if lc.chunk_size == 0 else lc.chunk_size
    print(f"learner: micro_batch_tokens={mbt} chunk_size={chunk} ({sizes.why})")
    return mbt, chunk


def tokenizer_pad_id(renderer: ChatRenderer) -> int:
    """Padding id for batches: the tokenizer's pad token, else its first stop token (masked anyway)."""
    pad = getattr(renderer.tokenizer, "pad_token_id", None)
    return int(pad) if pad is not None else int(renderer.stop_token_ids[0])


def __getattr__(name: str) -> Any:
    # HFPolicy stays reachable here as before (tests swap in a scripted sampler), imported on first use.
    return load(__name__, {"HFPolicy": "agentrl.policies"}, name)
