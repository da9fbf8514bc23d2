"""The run's tool-call format: one setting, decided once, said out loud.

``--rollout.tool-format`` names the format a ToolEnv's parser reads; ``--env-kwargs '{"tool_format": ...}'``
could name another, and the env silently took the env-kwargs one. :func:`tool_format_agrees` refuses that
contradiction. ``auto`` picks the format the model's chat template renders: :func:`resolve_auto` decides it,
and :func:`record_choice` prints the choice and writes it into the run's config (``config.json`` then names
the format the run really used, so eval, resume and ``replay --reexec`` read the model's calls the same way).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrl.errors import ConfigError

__all__ = ["record_choice", "resolve_auto", "tool_format_agrees"]

_FORMATS = "hermes, llama3_json, mistral, qwen3_coder, deepseek_v3, harmony"


def tool_format_agrees(fmt: str | None, env_kwargs: Mapping[str, Any]) -> None:
    """Refuse ``--rollout.tool-format`` and an env-kwargs ``tool_format`` that name different formats.

    Raises:
        ConfigError: both are given and differ (``auto`` differs from every named format: it may choose
            another one).
    """
    given = env_kwargs.get("tool_format") if isinstance(env_kwargs, Mapping) else None
    if fmt is not None and given is not None and given != fmt:
        raise ConfigError(
            f"--rollout.tool-format {fmt} and --env-kwargs tool_format {given!r} contradict each other; "
            f"name the format once: --rollout.tool-format {given} (and drop tool_format from --env-kwargs)"
        )


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
    """The format a run records for ``--rollout.tool-format fmt``: ``auto`` replaced by the format it chose,
    printed (a fresh run records it in its config). Runs that hand no format to their env (not a ToolEnv)
    keep ``auto``: there is nothing to choose. Takes the settings, not the config, so that this module and
    ``train_config`` (which owns ``TrainConfig``) import one way."""
    import agentrl
    from agentrl.envs.tool_env import ToolEnv

    if fmt != "auto" or (agent is not None and env.endswith(".jsonl")):
        return fmt
    cls = agentrl.registry.entry_point(env)
    if not (isinstance(cls, type) and issubclass(cls, ToolEnv)):
        return fmt
    chosen = resolve_auto(model)
    print(
        f"--rollout.tool-format auto: {chosen} (the chat template of {model} renders it); "
        "config.json records it"
    )
    return chosen
