"""The run's tool-call format: one setting, one owner, decided once, said out loud.

The format a ToolEnv's parser reads is the env's own construction argument, ``tool_format``: a run keeps it
in ``env_kwargs`` (``--env-kwargs '{"tool_format": ...}'``), and nowhere else. ``--rollout.tool-format NAME``
is the flag that sets it there (:func:`with_tool_format`, which refuses an ``--env-kwargs`` naming another
format); a ``config.json`` of an earlier run, which kept it in ``rollout.tool_format``, loads with it moved
there the same way. ``auto`` picks the format the model's chat template renders: :func:`resolve_auto` decides
it, and :func:`record_choice` prints the choice and writes it into the run's config (``config.json`` then
names the format the run really used, so eval, resume and ``replay --reexec`` read the model's calls the same
way).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrl.errors import AgentRLError, ConfigError

__all__ = [
    "FLAG",
    "check_tool_format",
    "record_choice",
    "resolve_auto",
    "takes_tool_format",
    "with_tool_format",
]

FLAG = "--rollout.tool-format"
"""The flag that sets the env's ``tool_format`` (kept from when the rollout config held it)."""

_FORMATS = "hermes, llama3_json, mistral, qwen3_coder, deepseek_v3, harmony"


def check_tool_format(fmt: Any) -> None:
    """Refuse a ``tool_format`` that names no parser (``auto`` is allowed: the trainer resolves it).

    Raises:
        ConfigError: ``fmt`` is neither ``auto`` nor a key of ``agentrl.tools.PARSERS``.
    """
    from agentrl.tools import PARSERS

    if fmt != "auto" and fmt not in PARSERS:
        raise ConfigError(f"{FLAG} {fmt!r}: unknown; one of {sorted(PARSERS)} or auto")


def takes_tool_format(env: str) -> bool:
    """Whether the env ``env`` names is a ToolEnv, which reads tool calls in a format (an env it cannot look
    up counts as one: building it reports what is wrong)."""
    import agentrl
    from agentrl.envs.tool_env import ToolEnv

    if env.endswith(".jsonl"):
        return False  # an --agent's task file: the agent's own client writes its calls
    try:
        cls = agentrl.registry.entry_point(env)
    except (AgentRLError, ImportError, OSError):
        return True
    return isinstance(cls, type) and issubclass(cls, ToolEnv)


def with_tool_format(
    env_kwargs: Mapping[str, Any], fmt: str | None, *, env: str, given: str = FLAG
) -> dict[str, Any]:
    """``env_kwargs`` with its ``tool_format`` set to ``fmt``, which ``given`` named (the flag, or an earlier
    ``config.json``'s ``rollout.tool_format``). ``None`` changes nothing, and neither does any format for an
    env that is not a ToolEnv (it reads no tool calls; the flag was always ignored for it).

    Raises:
        ConfigError: ``fmt`` names no format, or ``env_kwargs`` names a different one (``auto`` differs from
            every named format: it may choose another one).
    """
    out = dict(env_kwargs)
    if fmt is None:
        return out
    check_tool_format(fmt)
    if not takes_tool_format(env):
        return out
    have = out.get("tool_format")
    if have is not None and have != fmt:
        raise ConfigError(
            f"{given} {fmt} and --env-kwargs tool_format {have!r} contradict each other; name the format "
            f"once: {FLAG} {have} (and drop tool_format from --env-kwargs)"
        )
    out["tool_format"] = fmt
    return out


def resolve_auto(model: str) -> str:
    """The tool-call format the chat template of ``model`` renders (``--rollout.tool-format auto``).

    Raises:
        ConfigError: the template renders no format agentrl knows.
    """
    from agentrl.models import load_tokenizer, model_folder, smollm2_tokenizer
    from agentrl.tools import detect_tool_format

    folder = model_folder(model)
    tok = smollm2_tokenizer() if folder is None else load_tokenizer(folder)
    found = detect_tool_format(getattr(tok, "chat_template", None))
    if found is None:
        raise ConfigError(
            f"--rollout.tool-format auto: the chat template of {model!r} renders no tool-call format "
            f"agentrl knows; name one ({_FORMATS})"
        )
    return found


def record_choice(fmt: str | None, *, env: str, agent: str | None, model: str) -> str | None:
    """The format a run records for the env's ``tool_format`` ``fmt``: ``auto`` replaced by the format it
    chose, printed (a fresh run records it in its config). Runs that hand no format to their env (not a
    ToolEnv) keep ``auto``: there is nothing to choose. Takes the settings, not the config, so that this
    module and ``train_config`` (which owns ``TrainConfig``) import one way."""
    if fmt != "auto" or (agent is not None and env.endswith(".jsonl")) or not takes_tool_format(env):
        return fmt
    chosen = resolve_auto(model)
    print(
        f"--rollout.tool-format auto: {chosen} (the chat template of {model} renders it); "
        "config.json records it"
    )
    return chosen
