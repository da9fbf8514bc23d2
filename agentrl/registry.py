"""Environment registry: ``register``/``make``/``list_envs``, and the bridge to ``gymnasium.make``.

Plug-ins load lazily. Third-party packages (and agentrl's own ``agentrl.envs``) register their environments
through the ``agentrl.envs`` entry-point group: each entry point names a module that calls :func:`register`
when imported. ``import agentrl`` imports none of them; the first :func:`make`, :func:`spec`,
:func:`list_envs` or :func:`register_gymnasium` does (:func:`load_plugins`). The core never imports a
plug-in package by name.

Gymnasium's registry is written explicitly. Nothing enters Gymnasium's global registry until
:func:`register_gymnasium` is called; from then on every agentrl id (those registered before and after the
call) is also Gymnasium's ``agentrl/<id>``, so ``gymnasium.make("agentrl/<id>")`` returns a synchronous
:class:`GymnasiumEnv` with text spaces.
"""

from __future__ import annotations

import importlib
import json
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

import gymnasium
from gymnasium import spaces

from agentrl._sync import run_sync
from agentrl.env import Env, StepResult, as_step_result
from agentrl.errors import ConfigError, EnvContractError, EnvNotFoundError
from agentrl.types import Action, Message

__all__ = [
    "EnvSpec",
    "GymnasiumEnv",
    "entry_point",
    "list_envs",
    "load_plugins",
    "make",
    "register",
    "register_gymnasium",
    "spec",
]

_ID_RE = re.compile(r"^[A-Za-z][\w.:-]*-v\d+$")
_REGISTRY: dict[str, EnvSpec] = {}
_plugins_loaded = False
_plugins_loading = False
_gymnasium_bridge = False

EntryPoint = str | Callable[..., Env]


@dataclass(frozen=True, slots=True)
class EnvSpec:
    """How to build a registered environment."""

    id: str
    """Registered id, ``name-vN``."""
    entry_point: EntryPoint
    """``"package.module:Class"`` or a callable returning an :class:`Env`."""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments passed to the entry point unless ``make`` overrides them."""


def register(id: str, entry_point: EntryPoint, **defaults: Any) -> EnvSpec:
    """Register an environment under ``id`` (``name-vN``); also as Gymnasium's ``agentrl/<id>`` once
    :func:`register_gymnasium` has been called.

    Re-registering the same id with the same entry point replaces its defaults; a different entry point
    under an existing id is an error (two packages fighting over one name).
    """
    if not isinstance(id, str) or not _ID_RE.match(id):
        raise ConfigError(
            f"env id must look like 'name-v0' (letters, digits, '_', '.', ':', '-'), got {id!r}"
        )
    if isinstance(entry_point, str):
        if entry_point.count(":") != 1 or not all(entry_point.split(":")):
            raise ConfigError(f"entry_point must be 'package.module:Name', got {entry_point!r}")
    elif not callable(entry_point):
        raise ConfigError(f"entry_point must be a 'module:Name' string or a callable, got {entry_point!r}")
    old = _REGISTRY.get(id)
    if old is not None and old.entry_point != entry_point:
        raise ConfigError(
            f"env id {id!r} is already registered to {old.entry_point!r}; pick another id or version"
        )
    env_spec = EnvSpec(id=id, entry_point=entry_point, defaults=dict(defaults))
    _REGISTRY[id] = env_spec
    if _gymnasium_bridge:
        _register_with_gymnasium(id)
    return env_spec


def register_gymnasium() -> list[str]:
    """Make every agentrl environment a Gymnasium one: ``gymnasium.make("agentrl/<id>")``.

    Loads the plug-ins, registers each id as ``agentrl/<id>`` in Gymnasium's global registry, and keeps
    doing so for ids registered later in this process. Idempotent. Returns the Gymnasium ids.
    """
    global _gymnasium_bridge
    load_plugins()
    _gymnasium_bridge = True
    for env_id in _REGISTRY:
        _register_with_gymnasium(env_id)
    return [f"agentrl/{env_id}" for env_id in sorted(_REGISTRY)]


def _register_with_gymnasium(env_id: str) -> None:
    gym_id = f"agentrl/{env_id}"
    if gym_id in gymnasium.registry:
        del gymnasium.registry[gym_id]

    def factory(**kwargs: Any) -> GymnasiumEnv:
        return GymnasiumEnv(make(env_id, **kwargs))

    gymnasium.register(id=gym_id, entry_point=factory, disable_env_checker=False)


def load_plugins() -> None:
    """Import every module in the ``agentrl.envs`` entry-point group (once per process)."""
    global _plugins_loaded, _plugins_loading
    if _plugins_loaded or _plugins_loading:
        return
    _plugins_loading = True
    try:
        for ep in entry_points(group="agentrl.envs"):
            try:
                ep.load()
            except Exception as e:  # a broken third-party plug-in must not break agentrl itself
                warnings.warn(
                    f"agentrl: env plug-in {ep.name!r} ({ep.value}) failed to load: {e!r}",
                    stacklevel=2,
                )
        _plugins_loaded = True
    finally:
        _plugins_loading = False


def list_envs() -> list[str]:
    """Ids of every registered environment, sorted."""
    load_plugins()
    return sorted(_REGISTRY)


def spec(id: str) -> EnvSpec:
    """The :class:`EnvSpec` registered under ``id``."""
    load_plugins()
    try:
        return _REGISTRY[id]
    except KeyError:
        close = [k for k in _REGISTRY if k.split("-v")[0] == str(id).split("-v")[0]]
        hint = f" Did you mean {close}?" if close else f" Registered: {sorted(_REGISTRY)}."
        raise EnvNotFoundError(f"no environment registered as {id!r}.{hint}") from None


def _resolve(entry_point: EntryPoint) -> Callable[..., Env]:
    if not isinstance(entry_point, str):
        return entry_point
    module_name, attr = entry_point.split(":")
    try:
        factory: Callable[..., Env] = getattr(importlib.import_module(module_name), attr)
        return factory
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"cannot load env entry point {entry_point!r}: {e}") from e


def entry_point(id: str) -> Callable[..., Env]:
    """The class or factory registered under ``id``, imported (to inspect what ``make`` would build)."""
    return _resolve(spec(id).entry_point)


def make(id: str, **kwargs: Any) -> Env:
    """Build the environment registered under ``id``; ``kwargs`` override its registered defaults."""
    env_spec = spec(id)
    factory = _resolve(env_spec.entry_point)
    try:
        env = factory(**{**env_spec.defaults, **kwargs})
    except TypeError as e:
        raise ConfigError(f"cannot build {id!r} with arguments {sorted(kwargs)}: {e}") from e
    if not isinstance(env, Env):
        raise EnvContractError(f"entry point of {id!r} returned {type(env).__name__}, not an agentrl.Env")
    env.spec_id = id
    return env


# ---------------------------------------------------------------------------------------------------
# Gymnasium bridge
PRINTABLE = "".join(chr(c) for c in range(32, 127))
"""Observations are JSON with ``ensure_ascii``, so every character is printable ASCII."""


def encode_observation(messages: tuple[Message, ...]) -> str:
    """Observation text for Gymnasium: the new messages as a JSON list of OpenAI dicts."""
    return json.dumps([m.to_dict() for m in messages], ensure_ascii=True)


class GymnasiumEnv(gymnasium.Env[str, str]):
    """A synchronous Gymnasium view of an :class:`agentrl.Env`.

    Observation: the new messages as a JSON string (``[{"role": ..., "content": ...}, ...]``). Action: the
    model's turn as a string. ``step`` returns Gymnasium's 5-tuple: rewards and episode-end flags pass
    through unchanged; ``info`` is the env's own, plus, for a turn with a parsed message or tool calls, the
    key ``"agentrl"``: ``{"assistant_message": {...} | None, "tool_calls": [{...}, ...]}`` as plain dicts
    (without timings, which differ run to run).
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - Gymnasium's own convention

    def __init__(self, env: Env, *, max_observation_chars: int = 1 << 20, max_action_chars: int = 8192):
        self.env = env
        self.observation_space = spaces.Text(
            max_length=max_observation_chars, min_length=0, charset=PRINTABLE
        )
        self.action_space = spaces.Text(max_length=max_action_chars, min_length=0, charset=PRINTABLE)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        obs, info = run_sync(self.env.reset(seed=seed, options=options))
        return encode_observation(obs), _plain_info(info)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not isinstance(action, str):
            raise ConfigError(f"action must be the model's turn as a str, got {type(action).__name__}")
        result = as_step_result(run_sync(self.env.step(Action(text=action))))
        return (
            encode_observation(result.observation),
            result.reward,
            result.terminated,
            result.truncated,
            _gymnasium_info(result),
        )

    def close(self) -> None:
        run_sync(self.env.close())


def _gymnasium_info(result: StepResult) -> dict[str, Any]:
    info = _plain_info(result.info)
    if result.assistant_message is None and not result.tool_calls:
        return info
    if "agentrl" in info:
        raise EnvContractError("info key 'agentrl' is reserved for the Gymnasium view of an agentrl env")
    msg = result.assistant_message
    info["agentrl"] = {
        "assistant_message": None if msg is None else msg.to_dict(),
        "tool_calls": [
            {k: v for k, v in c.to_dict().items() if k != "duration_s"} for c in result.tool_calls
        ],
    }
    return info


def _plain_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """Turn agentrl records in ``info`` into plain dicts, without timings (they differ run to run)."""
    out: dict[str, Any] = {}
    for k, v in info.items():
        if isinstance(v, Message):
            out[k] = v.to_dict()
        elif isinstance(v, tuple) and v and hasattr(v[0], "to_dict"):
            out[k] = tuple({kk: vv for kk, vv in x.to_dict().items() if kk != "duration_s"} for x in v)
        else:
            out[k] = v
    return out
