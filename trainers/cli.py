"""The ``agentrl`` command: train, eval, check, plot, replay, gateway, export, envs."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentrl.config import add_config_arguments, config_from_args, config_to_dict
from agentrl.errors import AgentRLError

if TYPE_CHECKING:
    from agentrl.registry import EnvFamily
    from agentrl.trainers.train_config import TrainConfig

ENV_HELP = (
    "registered environment id (agentrl envs), family member (reasoning-gym:chain_sum), "
    "path/to/file.py:Class or package.module:Class"
)
TRAIN_ALIASES = {"lr": "learner.lr", "temperature": "rollout.temperature"}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    from agentrl.trainers.train_config import TrainConfig

    parser = argparse.ArgumentParser(prog="agentrl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser(
        "train",
        help="train an agent (default: SmolLM2-135M on math-tir-arith-v0 with OTB, CPU)",
        description=(TrainConfig.__doc__ or "") + " Nested settings take dotted flags (--learner.lr 1e-6).",
    )
    add_config_arguments(train, TrainConfig, aliases=TRAIN_ALIASES)
    train.add_argument(
        "--rollout.tool-format",
        "--rollout.tool_format",
        dest="tool_format",
        metavar="NAME",
        help="the tool-call format a ToolEnv's parser reads: hermes, llama3_json, mistral, qwen3_coder, "
        "deepseek_v3, harmony, python, or auto (the one the model's chat template renders); sets the env's "
        "tool_format argument, as --env-kwargs '{\"tool_format\": NAME}' does (default: each env's own)",
    )

    ev = sub.add_parser(
        "eval",
        help="pass@1 / pass@k on an environment's held-out split (all its tasks when it has no test split)",
    )
    ev.add_argument(
        "--model",
        required=True,
        help="'smollm2', 'tiny', a run directory (its newest checkpoint), a checkpoint "
        "(<run>/checkpoints/step-N) or a Hugging Face model folder",
    )
    ev.add_argument(
        "--env",
        default=None,
        help=ENV_HELP + "; default with --model RUN (or one of its checkpoints): the env the run trained on",
    )
    ev.add_argument("--k", type=int, default=4, help="samples per task (default 4)")
    ev.add_argument("--tasks", type=int, default=32, help="tasks to evaluate (default 32)")
    ev.add_argument("--split", default="test", help="split for envs that have one (default test)")
    ev.add_argument("--seed", type=int, default=10_000, help="first task seed (default 10000)")
    ev.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ev.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="token limit per model turn (default: the run's --rollout.max-new-tokens, else 96)",
    )
    ev.add_argument(
        "--max-turns",
        type=int,
        default=None,
        help="model turns per episode (default: the run's --rollout.max-turns, else 3)",
    )
    ev.add_argument(
        "--max-total-tokens",
        type=int,
        default=None,
        help="token budget of a whole episode (default: the run's --rollout.max-total-tokens, else 1024)",
    )
    ev.add_argument(
        "--env-kwargs",
        default=None,
        help="JSON keyword arguments for the environment (default: the run's, when it is the same env)",
    )
    ev.add_argument(
        "--reward.judge-url",
        dest="judge_url",
        help="judge endpoint for an env that takes a reward argument (default: the run's --reward.*)",
    )
    ev.add_argument(
        "--reward.judge-model",
        dest="judge_model",
        default=None,
        help="the judge's model (default: the run's, else 'judge')",
    )
    ev.add_argument("--json", action="store_true", help="print the report as JSON")

    chk = sub.add_parser(
        "check",
        help="check an environment against the Env contract and Gymnasium's env checker",
        description="Runs agentrl.check_env (contract, seeding, bad actions, episode ends, the env's "
        "sample_action through its tools and scoring) and Gymnasium's own check_env on the Gymnasium view.",
    )
    chk.add_argument("--env", required=True, help=ENV_HELP)
    chk.add_argument("--env-kwargs", default="{}", help="JSON keyword arguments for the environment")
    chk.add_argument("--seed", type=int, default=1234, help="seed of the checked episodes (default 1234)")
    chk.add_argument("--no-gymnasium", action="store_true", help="skip Gymnasium's checker")

    plot = sub.add_parser("plot", help="write PNG curves of a run's metrics")
    plot.add_argument("run", help="run directory")
    plot.add_argument("--out", default=None, help="folder for the PNGs (default <run>/plots)")

    from agentrl.trainers import replay

    replay.add_parser(sub)

    from agentrl.trainers.gateway import cli as gateway_cli

    gateway_cli.add_parser(sub)

    from agentrl.trainers import export

    export.add_parser(sub)

    envs = sub.add_parser(
        "envs",
        help="list registered environments, each with the first line of its docstring, and env families",
    )
    envs.add_argument(
        "family",
        nargs="?",
        help="list the members of this env family instead (e.g. reasoning-gym, textarena)",
    )
    return parser


def _train_config(ns: argparse.Namespace) -> TrainConfig:
    from agentrl.trainers.tool_format import with_tool_format
    from agentrl.trainers.train_config import TrainConfig, saved_config

    resume = getattr(ns, "output.resume", None)
    if resume is None:
        cfg = config_from_args(TrainConfig, ns)
    else:
        # The run's own settings are the base; the flags given now may only change what a resume allows
        # (prepare_run checks, with resumed_config).
        cfg = config_from_args(TrainConfig, ns, base=saved_config(resume))
    if ns.tool_format is None:
        return cfg
    return dataclasses.replace(cfg, env_kwargs=with_tool_format(cfg.env_kwargs, ns.tool_format, env=cfg.env))


def _env_kwargs(text: str) -> dict[str, Any]:
    """``--env-kwargs``: a JSON object, or a :class:`ConfigError` saying what is wrong with it."""
    from agentrl.errors import ConfigError

    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--env-kwargs is not JSON: {e}") from e
    if not isinstance(kwargs, dict):
        raise ConfigError("--env-kwargs must be a JSON object")
    return kwargs


def _check(ns: argparse.Namespace) -> int:
    import warnings

    import agentrl
    from agentrl.errors import ConfigError

    kwargs = _env_kwargs(ns.env_kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env = agentrl.make(ns.env, **kwargs)
        _check_sandbox(ns.env, env)
        agentrl.check_env(env, seed=ns.seed)
        print(f"{ns.env}: agentrl check_env passed")
        if not ns.no_gymnasium:
            from gymnasium.utils.env_checker import check_env as gymnasium_check

            gym_env = agentrl.GymnasiumEnv(agentrl.make(ns.env, **kwargs))
            try:
                gymnasium_check(gym_env, skip_render_check=True)
            except AgentRLError:
                raise
            except Exception as e:  # Gymnasium's checker asserts; say which checker failed
                raise ConfigError(f"Gymnasium's check_env failed: {type(e).__name__}: {e}") from e
            finally:
                gym_env.close()
            print(f"{ns.env}: Gymnasium check_env passed")
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    return 0


def _check_sandbox(env_id: str, env: object) -> None:
    """An env whose tools run code fails the check when its sandbox cannot start here: its episodes would
    all end in ``sandbox_error``, whether or not the env declares a sample episode that runs code."""
    from agentrl.envs.tool_env import ToolEnv
    from agentrl.errors import SandboxError

    if not (isinstance(env, ToolEnv) and env.needs_sandbox):
        return
    try:
        asyncio.run(env.check_sandbox())
    except SandboxError as e:
        raise SandboxError(
            f"{env_id}: its tools run code in a sandbox, and none can run here: {e}. "
            "`python -m agentrl.sandbox` prints what this host lacks"
        ) from e
    print(f"{env_id}: the sandbox starts and runs code here")


def _eval_env_kwargs(ns: argparse.Namespace, kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
    """The run's env arguments, with ``--reward.judge-url``/``--reward.judge-model`` (a judge for
    ``judged-v0`` or any env taking ``reward``) in place of the run's judge. The run's other ``--reward.*``
    settings stay as training used them (:meth:`RewardConfig.with_judge`: a group judge stays a group
    judge); an env given no reward settings gets a judge with the defaults."""
    if ns.judge_url is None and ns.judge_model is None:
        return kwargs
    from agentrl.rewards import RewardConfig

    base = (kwargs or {}).get("reward")
    if isinstance(base, dict):
        base = RewardConfig(**base)
    if not isinstance(base, RewardConfig) or not base.enabled:
        base = RewardConfig()
    return {**(kwargs or {}), "reward": base.with_judge(ns.judge_url, ns.judge_model)}


def _eval(ns: argparse.Namespace) -> int:
    from agentrl.errors import ConfigError
    from agentrl.trainers.evaluate import evaluate, format_report, run_settings

    run = run_settings(ns.model)
    env = ns.env or (run.env if run is not None else None)
    if env is None:
        raise ConfigError(
            "--env is required unless --model is a training run (or one of its checkpoints), whose "
            "config.json names the env"
        )
    same_env = run is not None and (ns.env is None or ns.env == run.env)
    max_turns = ns.max_turns if ns.max_turns is not None else (run.max_turns if run is not None else 3)
    max_new = ns.max_new_tokens if ns.max_new_tokens is not None else (run.max_new_tokens if run else 96)
    max_total = (
        ns.max_total_tokens if ns.max_total_tokens is not None else (run.max_total_tokens if run else None)
    )
    if ns.env_kwargs is not None:
        env_kwargs: dict[str, Any] | None = _env_kwargs(ns.env_kwargs)
    else:
        env_kwargs = run.env_kwargs if run is not None and same_env else None
    if run is not None:
        print(
            f"eval: from {run.run / 'config.json'}: env {env if same_env else '(--env given)'}, "
            f"max_turns {max_turns}, max_new_tokens {max_new}, max_total_tokens {run.max_total_tokens}, "
            f"temperature {run.temperature}",
            file=sys.stderr,
        )
    report = asyncio.run(
        evaluate(
            ns.model,
            env,
            k=ns.k,
            tasks=ns.tasks,
            split=ns.split,
            seed=ns.seed,
            max_turns=max_turns,
            max_new_tokens=max_new,
            max_total_tokens=max_total,
            temperature=run.temperature if run is not None else 1.0,
            device=ns.device,
            env_kwargs=_eval_env_kwargs(ns, env_kwargs),
        )
    )
    print(json.dumps(config_to_dict(report)) if ns.json else format_report(report))
    if 2 * report.token_limited > report.episodes:
        print(
            f"warning: {report.token_limited} of {report.episodes} episodes ended at a token limit; "
            f"their answers are cut off. Raise --max-new-tokens (now {max_new}) if "
            f"{report.env} needs longer answers",
            file=sys.stderr,
        )
    return 0


def _describe(env_id: str) -> str:
    """The first line of the env's docstring, and the arguments its id fixes (math-tir-arith-v0 is math-tir-v0
    with one of them)."""
    import agentrl

    env_spec = agentrl.registry.spec(env_id)
    try:
        doc = (agentrl.registry.entry_point(env_id).__doc__ or "").strip()
    except AgentRLError as e:  # one broken plug-in must not hide the others
        return f"(cannot be imported: {e})"
    line = doc.split("\n\n")[0].replace("\n", " ").strip()
    line = " ".join(line.split())
    fixed = ", ".join(f"{k}={v!r}" for k, v in env_spec.defaults.items())
    return f"{line} [{fixed}]" if fixed else line


def _describe_family(family: EnvFamily) -> str:
    """The first line of a family's entry point's docstring."""
    from agentrl.loading import load_object

    try:
        entry = load_object(family.entry_point) if isinstance(family.entry_point, str) else family.entry_point
    except AgentRLError as e:
        return f"(cannot be imported: {e})"
    return " ".join((entry.__doc__ or "").strip().split("\n\n")[0].split())


def _envs(family: str | None = None) -> int:
    import agentrl

    if family is not None:  # imports the library the family wraps (an error names its install command)
        for name in agentrl.registry.family_names(family):
            print(f"{family}:{name}")
        return 0
    ids = agentrl.list_envs()
    # A family is listed by its entry point's docstring; the library it wraps is imported only by
    # `agentrl envs FAMILY`.
    families = {f"{f.prefix}:<{f.arg}>": f for f in agentrl.registry.list_families()}
    width = max((len(i) for i in [*ids, *families]), default=0)
    for env_id in ids:
        print(f"{env_id:<{width}}  {_describe(env_id)}".rstrip())
    for name, fam in families.items():
        more = f" (agentrl envs {fam.prefix} lists them)" if fam.names is not None else ""
        print(f"{name:<{width}}  {_describe_family(fam)}{more}".rstrip())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``agentrl`` console script."""
    ns = build_parser().parse_args(argv)
    try:
        if ns.command == "train":
            from agentrl.trainers import train

            return train.main(_train_config(ns))
        if ns.command == "eval":
            return _eval(ns)
        if ns.command == "check":
            return _check(ns)
        if ns.command == "plot":
            from agentrl.metrics import plot_run

            skipped: list[str] = []
            for p in plot_run(ns.run, ns.out, skipped=skipped):
                print(p)
            if skipped:
                print(f"not plotted, every value 0 in this run: {', '.join(skipped)}")
            return 0
        if ns.command == "replay":
            from agentrl.trainers import replay

            return replay.run(ns)
        if ns.command == "export":
            from agentrl.trainers import export

            return export.run(ns)
        if ns.command == "gateway":
            from agentrl.trainers.gateway import cli as gateway_cli

            return gateway_cli.run(ns)
        if ns.command == "envs":
            return _envs(ns.family)
    except AgentRLError as e:
        print(f"agentrl {ns.command}: error: {e}", file=sys.stderr)
        return 2
    return 2
