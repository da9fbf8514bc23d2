"""Environment registry: ``register``/``make``/``list_envs``, and the bridge to ``gymnasium.make``.

Environments are named by a registered id (``math-tir-v0``) or by reference to a class or factory:
``path/to/file.py:Class`` or ``package.module:Class`` (:func:`canonical_env`, :func:`make`); the reference
may also name an id that the module registers when imported (``path/to/file.py:my-env-v0``).

Families: ``register_family("reasoning-gym", "pkg.module:Class", arg="dataset")`` makes every
``reasoning-gym:<name>`` an env, built as ``Class(dataset="<name>", **kwargs)``, for envs that wrap a
library's whole catalogue. A family's prefix wins over a ``module:Name`` reference of the same spelling; the
names it accepts are its class's to check (``names=`` optionally lists them for ``agentrl envs``, loaded only
when asked: listing families imports nothing).

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

import json
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import gymnasium
from gymnasium import spaces

from agentrl._sync import run_sync
from agentrl.env import Env, StepResult, as_step_result
from agentrl.errors import AgentRLError, ConfigError, EnvContractError, EnvNotFoundError
from agentrl.loading import is_file_reference, load_module, load_object, split_reference
from agentrl.types import Action, Message

__all__ = [
    "EnvFamily",
    "EnvSpec",
    "GymnasiumEnv",
    "canonical_env",
    "entry_point",
    "env_slug",
    "family_names",
    "list_envs",
    "list_families",
    "load_plugins",
    "make",
    "register",
    "register_family",
    "register_gymnasium",
    "spec",
]

_ID_RE = re.compile(r"^[A-Za-z][\w.:-]*-v\d+$")
_FAMILY_RE = re.compile(r"^[A-Za-z][\w.-]*$")
_REGISTRY: dict[str, EnvSpec] = {}
_FAMILIES: dict[str, EnvFamily] = {}
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


@dataclass(frozen=True, slots=True)
class EnvFamily:
    """A family of environments named ``<prefix>:<name>``, all built by one entry point."""

    prefix: str
    """What comes before the colon: ``reasoning-gym`` in ``reasoning-gym:chain_sum``."""
    entry_point: EntryPoint
    """``"package.module:Class"`` or a callable returning an :class:`Env`; called with ``arg=<name>``."""
    arg: str
    """The keyword argument that receives the name after the colon."""
    names: str | Callable[[], list[str]] | None = None
    """``"package.module:function"`` or a callable listing the accepted names (``agentrl envs PREFIX``);
    ``None``: the family does not enumerate them."""

    def spec_of(self, ref: str) -> EnvSpec:
        """The :class:`EnvSpec` of one member, ``<prefix>:<name>``."""
        name = ref[len(self.prefix) + 1 :]
        if not name:
            raise ConfigError(f"env {ref!r} names no member of the family: write {self.prefix}:<name>")
        return EnvSpec(id=ref, entry_point=self.entry_point, defaults={self.arg: name})


def register_family(
    prefix: str, entry_point: EntryPoint, *, arg: str, names: str | Callable[[], list[str]] | None = None
) -> EnvFamily:
    """Make every ``<prefix>:<name>`` an environment built as ``entry_point(**{arg: name}, **kwargs)``.

    The entry point is imported on the first ``make`` of a member, so registering a family that wraps an
    optional library costs nothing until it is used. Re-registering the same prefix with the same entry point
    is allowed; a different one is an error, as for ids.
    """
    if not isinstance(prefix, str) or not _FAMILY_RE.match(prefix):
        raise ConfigError(f"family prefix must be letters, digits, '_', '.', '-', got {prefix!r}")
    if not isinstance(arg, str) or not arg.isidentifier():
        raise ConfigError(f"family arg must be a keyword argument name, got {arg!r}")
    if isinstance(entry_point, str) and (entry_point.count(":") != 1 or not all(entry_point.split(":"))):
        raise ConfigError(f"entry_point must be 'package.module:Name', got {entry_point!r}")
    if not isinstance(entry_point, str) and not callable(entry_point):
        raise ConfigError(f"entry_point must be a 'module:Name' string or a callable, got {entry_point!r}")
    old = _FAMILIES.get(prefix)
    if old is not None and old.entry_point != entry_point:
        raise ConfigError(f"env family {prefix!r} is already registered to {old.entry_point!r}")
    family = EnvFamily(prefix=prefix, entry_point=entry_point, arg=arg, names=names)
    _FAMILIES[prefix] = family
    return family


def list_families() -> list[EnvFamily]:
    """Every registered family, by prefix (imports the plug-ins, not the libraries the families wrap)."""
    load_plugins()
    return [_FAMILIES[p] for p in sorted(_FAMILIES)]


def family_names(prefix: str) -> list[str]:
    """The member names a family accepts, sorted (this imports what the family wraps)."""
    load_plugins()
    family = _FAMILIES.get(prefix)
    if family is None:
        raise EnvNotFoundError(f"no env family {prefix!r}; families: {sorted(_FAMILIES)}")
    if family.names is None:
        return []
    lister = family.names
    if isinstance(lister, str):
        try:
            lister = load_object(lister)  # type: ignore[assignment]
        except ConfigError as e:
            raise ConfigError(f"cannot load the name list {family.names!r} of family {prefix!r}: {e}") from e
    assert callable(lister)
    return sorted(lister())


def _family_of(ref: str) -> EnvFamily | None:
    prefix, sep, _ = ref.partition(":")
    return _FAMILIES.get(prefix) if sep else None


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
    """The :class:`EnvSpec` of a registered id or of a reference (``file.py:Class``, ``module:Class``).

    Raises :class:`EnvNotFoundError` for an unknown id and :class:`ConfigError` for a reference that cannot
    be loaded, saying what was tried.
    """
    load_plugins()
    found = _REGISTRY.get(id) if isinstance(id, str) else None
    if found is not None:
        return found
    family = _family_of(id) if isinstance(id, str) else None
    if family is not None:
        return family.spec_of(id)
    if isinstance(id, str) and id.startswith("agentrl/") and id.removeprefix("agentrl/") in _REGISTRY:
        bare = id.removeprefix("agentrl/")
        raise EnvNotFoundError(
            f"{id!r} is the Gymnasium name: agentrl.make takes {bare!r}. gymnasium.make({id!r}) needs "
            "agentrl.register_gymnasium() called once first (since 2026-11-26, import agentrl no longer "
            "writes Gymnasium's registry)"
        )
    if not isinstance(id, str) or ":" not in id:
        close = [k for k in _REGISTRY if k.split("-v")[0] == str(id).split("-v")[0]]
        hint = f" Did you mean {close}?" if close else f" Registered: {sorted(_REGISTRY)}."
        raise EnvNotFoundError(
            f"no environment registered as {id!r}.{hint} A class of your own is named "
            "path/to/file.py:Class or package.module:Class."
        )
    return _spec_of_reference(id)


def _spec_of_reference(ref: str) -> EnvSpec:
    where, name = split_reference(ref)
    kind = "file" if is_file_reference(where) else "module"
    try:
        module = load_module(where)
    except ConfigError as e:
        raise ConfigError(f"env {ref!r} is not a registered id, so it was read as {kind}:Name; {e}") from e
    obj = getattr(module, name, None)
    if obj is None:
        if name in _REGISTRY:  # the module registered an id on import, as plug-ins do
            return _REGISTRY[name]
        envs = sorted(
            k for k, v in vars(module).items() if isinstance(v, type) and issubclass(v, Env) and v is not Env
        )
        raise ConfigError(
            f"env {ref!r}: the {kind} {where!r} was imported but defines no {name!r} and registers no such "
            f"id (Env classes there: {envs or 'none'})"
        )
    if isinstance(obj, type) and not issubclass(obj, Env):
        raise ConfigError(f"env {ref!r}: {name} is a class but not a subclass of agentrl.Env")
    if not callable(obj):
        raise ConfigError(f"env {ref!r}: {name} is a {type(obj).__name__}, not an Env class or factory")
    return EnvSpec(id=ref, entry_point=obj)


def canonical_env(ref: str) -> str:
    """How a run records ``--env``: a registered id as it is, a file reference with the file's absolute
    path (so resume, eval and replay from another directory build the same env), a module reference as
    it is. Checks that the reference loads."""
    spec(ref)
    if ref in _REGISTRY or _family_of(ref) is not None:
        return ref
    where, name = split_reference(ref)
    if is_file_reference(where):
        return f"{Path(where).expanduser().resolve()}:{name}"
    return ref


def env_slug(ref: str) -> str:
    """A short name for a run folder: the id, a family member as ``prefix_name``, or the ``Name`` of
    ``where:Name``."""
    if _family_of(ref) is not None:
        return re.sub(r"[^\w.-]+", "_", ref)
    tail = ref.rsplit(":", 1)[-1] if ":" in ref and ref not in _REGISTRY else ref
    return re.sub(r"[^\w.-]+", "_", tail.rsplit("/", 1)[-1]) or "env"


def _resolve(entry_point: EntryPoint) -> Callable[..., Env]:
    if not isinstance(entry_point, str):
        return entry_point
    try:
        return load_object(entry_point)  # type: ignore[return-value]
    except ConfigError as e:
        raise ConfigError(f"cannot load env entry point {entry_point!r}: {e}") from e


def entry_point(id: str) -> Callable[..., Env]:
    """The class or factory registered under ``id``, imported (to inspect what ``make`` would build)."""
    return _resolve(spec(id).entry_point)


def make(id: str, **kwargs: Any) -> Env:
    """Build the environment registered under ``id`` (or named by a ``file.py:Class`` or
    ``module:Class`` reference); ``kwargs`` override its registered defaults."""
    env_spec = spec(id)
    factory = _resolve(env_spec.entry_point)
    try:
        env = factory(**{**env_spec.defaults, **kwargs})
    except TypeError as e:
        raise ConfigError(f"cannot build {id!r} with arguments {sorted(kwargs)}: {e}") from e
    except AgentRLError:
        raise
    except Exception as e:
        raise ConfigError(f"building the env {id!r} raised {type(e).__name__}: {e}") from e
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
        """Reset the wrapped env (run to completion); observation as a JSON string."""
        super().reset(seed=seed)
        obs, info = run_sync(self.env.reset(seed=seed, options=options))
        return encode_observation(obs), _plain_info(info)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play one model turn; Gymnasium's 5-tuple with the typed result's core data under
        ``info['agentrl']``."""
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
        """Close the wrapped env."""
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
