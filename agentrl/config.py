"""Typed configs from the command line and ``config.json``: frozen dataclasses in, ``argparse`` flags out.

Every field of a config dataclass becomes a flag; nested dataclasses become dotted flags
(``--learner.lr 1e-6``). Underscores may be written as dashes (``--group-size``). Each field's attribute
docstring is its ``--help`` text. A field typed as a union of dataclasses that name themselves with a class
attribute ``name`` is a *choice* (the advantage estimators): ``--estimator grpo`` picks the member,
``--estimator.norm-by-std false`` sets one of its options, and its dict form is the member's fields plus
``"name"`` (a bare name also reads). Unknown flags, values of the wrong type, options the chosen member lacks
and (through the config's own ``__post_init__``) contradictory settings are rejected with a message naming
the flag, so nothing is a silent no-op. The README's "Training" section says why this is not a library.

A nested config marked with ``metadata=FLAT_FLAGS`` (``TrainConfig.deploy``) is a group of settings split out
of its enclosing config: its fields keep the flags they had as the enclosing config's own (``--ray``, not
``--deploy.ray``), and a dict that has them at the top level (a ``config.json`` written before the split)
reads with them lifted into the nested config.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import itertools
import json
import textwrap
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import cache
from typing import Any, TypeVar

from agentrl.errors import ConfigError

__all__ = [
    "FLAT_FLAGS",
    "add_config_arguments",
    "config_from_args",
    "config_from_dict",
    "config_to_dict",
    "field_docs",
    "flat_keywords",
]

C = TypeVar("C")

FLAT_FLAGS: Mapping[str, Any] = types.MappingProxyType({"agentrl.config": "flat"})
"""Field metadata of a nested config whose settings keep flat flags and flat ``config.json`` keys:
``deploy: DeployConfig = field(default_factory=DeployConfig, metadata=FLAT_FLAGS)``."""


def _is_flat(f: dataclasses.Field[Any]) -> bool:
    return bool(f.metadata.get("agentrl.config") == "flat")


_T = TypeVar("_T", bound=type)


def flat_keywords(cls: _T) -> _T:
    """Class decorator (above ``@dataclass``): a keyword naming a setting of one of the class's flat nested
    configs (:data:`FLAT_FLAGS`) sets it there, as the flag does: ``TrainConfig(group_size=2)`` is
    ``TrainConfig(batch=BatchConfig(group_size=2))``, and with ``batch=`` given too it replaces that one
    setting of it (what ``dataclasses.replace(cfg, group_size=2)`` needs). Code written before the settings
    were grouped keeps working; the signature seen by ``inspect`` is kept."""
    init: Callable[..., None] = cls.__init__  # type: ignore[misc]  # the class's own, not an instance's
    klass: type = cls
    own = {f.name for f in dataclasses.fields(klass)}

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.keys() - own:
            hints = _hints(klass)
            for f in dataclasses.fields(klass):
                if not (f.init and _is_flat(f)):
                    continue
                names = {g.name for g in dataclasses.fields(hints[f.name]) if g.init} - own
                lifted = {k: kwargs.pop(k) for k in names & kwargs.keys()}
                if lifted:
                    base = kwargs.get(f.name)
                    base = _default(f) if base is None else base
                    kwargs[f.name] = dataclasses.replace(base, **lifted)
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[misc]  # the wrapper replaces the generated __init__
    return cls


@cache
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass (the string literal right under each field)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, nxt in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _leaf_type(tp: Any) -> tuple[Any, bool]:
    """Strip ``Optional``; return (type, optional)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _convert(value: str, tp: Any, flag: str) -> Any:
    tp, optional = _leaf_type(tp)
    if optional and value.lower() in ("none", "null"):
        return None
    origin = typing.get_origin(tp)
    try:
        if tp is bool:
            low = value.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError("expected true/false")
        if tp in (int, float, str):
            return tp(value)
        if isinstance(tp, type) and issubclass(tp, Enum):
            return tp(value)
        if origin is typing.Literal:
            allowed = typing.get_args(tp)
            if value not in allowed:
                raise ValueError(f"expected one of {list(allowed)}")
            return value
        if origin in (tuple, list, Sequence):
            (inner, *_) = typing.get_args(tp) or (str,)
            parts = json.loads(value) if value.startswith("[") else [v for v in value.split(",") if v]
            return tuple(_convert(str(p), inner, flag) for p in parts)
        if origin in (dict, Mapping):
            return json.loads(value)
    except (ValueError, json.JSONDecodeError) as e:
        raise ConfigError(f"{flag}: cannot read {value!r} as {getattr(tp, '__name__', tp)}: {e}") from e
    raise ConfigError(f"{flag}: unsupported field type {tp!r}")


def _is_choice_member(tp: Any) -> bool:
    """A dataclass that names itself with a class attribute ``name`` (not a field)."""
    return (
        isinstance(tp, type)
        and dataclasses.is_dataclass(tp)
        and isinstance(getattr(tp, "name", None), str)
        and "name" not in {f.name for f in dataclasses.fields(tp)}
    )


def _choices(tp: Any) -> dict[str, type] | None:
    """``{name: class}`` when ``tp`` is a union of self-naming dataclasses (a *choice*), else None."""
    if typing.get_origin(tp) not in (typing.Union, types.UnionType):
        return None
    members = typing.get_args(tp)
    if not all(_is_choice_member(m) for m in members):
        return None
    return {m.name: m for m in members}


@dataclass(frozen=True)
class _Setting:
    """One flag: a plain field, a choice's selector (``--estimator``) or a choice's option."""

    path: str
    """Dotted path of the field (``learner.lr``, ``estimator``, ``estimator.eps``)."""
    tp: Any
    """The field's type (the union for a selector; None for an option, whose type depends on the member)."""
    default: Any
    """The field's default (``MISSING`` when it has none)."""
    doc: str
    """The field's attribute docstring."""
    choices: Mapping[str, type] | None = None
    """Selector only: the members by name."""
    options: Mapping[str, tuple[Any, Any, str]] | None = None
    """Option only: member name → (type, default, doc) for each member that has this field."""
    choice_path: str = ""
    """Option only: the path of its selector."""
    flag: str = ""
    """The flag's name without ``--`` where it is not the path: a field of a flat nested config
    (:data:`FLAT_FLAGS`) has its own name (``ray`` for ``deploy.ray``)."""

    @property
    def name(self) -> str:
        """The flag's name without ``--`` (``learner.lr``, ``ray``)."""
        return self.flag or self.path


def _walk(cls: type, prefix: str = "", flag_prefix: str | None = None) -> list[_Setting]:
    out = []
    hints = _hints(cls)
    docs = field_docs(cls)
    flag_prefix = prefix if flag_prefix is None else flag_prefix
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints[f.name]
        path = f"{prefix}{f.name}"
        flag = "" if flag_prefix == prefix else f"{flag_prefix}{f.name}"
        doc = docs.get(f.name, "")
        choices = _choices(tp)
        if dataclasses.is_dataclass(tp):
            inner_flags = flag_prefix if _is_flat(f) else f"{flag or path}."
            out += _walk(tp, path + ".", inner_flags)  # type: ignore[arg-type]
        elif choices is not None:
            out.append(_Setting(path, tp, _default(f), doc, choices=choices, flag=flag))
            per: dict[str, dict[str, tuple[Any, Any, str]]] = {}
            for name, member in choices.items():
                member_hints, member_docs = _hints(member), field_docs(member)
                for mf in dataclasses.fields(member):
                    if mf.init:
                        per.setdefault(mf.name, {})[name] = (
                            member_hints[mf.name],
                            _default(mf),
                            member_docs.get(mf.name, ""),
                        )
            out += [
                _Setting(
                    f"{path}.{opt}",
                    None,
                    dataclasses.MISSING,
                    "",
                    options=m,
                    choice_path=path,
                    flag=f"{flag}.{opt}" if flag else "",
                )
                for opt, m in per.items()
            ]
        else:
            out.append(_Setting(path, tp, _default(f), doc, flag=flag))
    return out


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _shown(value: Any) -> str:
    return repr(value.value if isinstance(value, Enum) else value)


def _choices_text(leaf: Any) -> str:
    if isinstance(leaf, type) and issubclass(leaf, Enum):
        return " {" + ",".join(str(m.value) for m in leaf) + "}"
    if typing.get_origin(leaf) is typing.Literal:
        return " {" + ",".join(map(str, typing.get_args(leaf))) + "}"
    return ""


def _summary(cls: type) -> str:
    """First sentence of a class docstring, without its full stop."""
    return " ".join((cls.__doc__ or cls.__name__).split()).split(". ")[0].rstrip(".")


def _help(s: _Setting) -> tuple[str, str, bool]:
    """(help text, metavar, is a bool) of one setting."""
    if s.choices is not None:
        text = f"{{{','.join(s.choices)}}}"
        if s.default is not dataclasses.MISSING:
            text += f" (default: {s.default.name!r})"
        return text, "NAME", False
    if s.options is not None:
        parts = [
            f"{n}: {doc}{_choices_text(_leaf_type(tp)[0])} (default: {_shown(d)})"
            for n, (tp, d, doc) in s.options.items()
        ]
        leaves = {_leaf_type(tp)[0] for tp, _, _ in s.options.values()}
        leaf = next(iter(leaves)) if len(leaves) == 1 else None
        return "; ".join(parts), getattr(leaf, "__name__", "VALUE").upper(), leaf is bool
    leaf, _ = _leaf_type(s.tp)
    text = f"{s.doc}{_choices_text(leaf)}"
    if s.default is not dataclasses.MISSING:
        text += f" (default: {_shown(s.default)})"
    return text, getattr(leaf, "__name__", "VALUE").upper(), leaf is bool


def add_config_arguments(
    parser: argparse.ArgumentParser, cls: type, *, aliases: Mapping[str, str] = {}
) -> None:
    """Add one flag per (nested) field of ``cls``; ``aliases`` maps short flags to dotted paths.

    A field typed as a union of self-naming dataclasses (a *choice*, e.g. the advantage estimators) gets
    a selector flag (``--estimator grpo``) and one flag per option of its members
    (``--estimator.norm-by-std false``).
    """
    reverse = {v: k for k, v in aliases.items()}
    groups: dict[str, argparse._ArgumentGroup] = {}
    try:  # a nested config's defaults are those of the outer config's default instance, not its class's
        base: Any = cls()
    except (TypeError, ConfigError):
        base = None
    for s in _walk(cls):
        if base is not None and s.options is None and s.default is not dataclasses.MISSING:
            s = dataclasses.replace(s, default=functools.reduce(getattr, s.path.split("."), base))
        if s.choices is not None:
            members = "; ".join(f"{n} = {_summary(c)}" for n, c in s.choices.items())
            groups[s.path] = parser.add_argument_group(
                f"--{s.name}",
                f"{s.doc.rstrip('.')}. --{s.name} NAME picks one: {members}. --{s.name}.<option> sets an "
                "option of the one picked (an option it does not have is an error).".replace("%", "%%"),
            )
        target = groups.get(s.choice_path or s.path, parser)
        # The hyphen form first: argparse's usage and help show the first (the docs spell flags so); the
        # underscore form stays accepted.
        flags = [f"--{s.name.replace('_', '-')}", f"--{s.name}"]
        if s.path in reverse:
            flags.append(f"--{reverse[s.path]}")
        text, metavar, is_bool = _help(s)
        target.add_argument(
            *dict.fromkeys(flags),
            dest=s.path,
            default=argparse.SUPPRESS,
            metavar=metavar,
            help=text.replace("%", "%%"),
        )
        if is_bool:
            target.add_argument(
                f"--no-{s.name.replace('_', '-')}",
                dest=s.path,
                action="store_const",
                const="false",
                default=argparse.SUPPRESS,
                help=f"same as --{s.name} false",
            )


def _node(tree: dict[str, Any], path: str) -> tuple[dict[str, Any], str]:
    """The dict holding ``path``'s last part in a nested dict (created on the way), and that part."""
    *parents, leaf = path.split(".")
    for p in parents:
        tree = tree.setdefault(p, {})
    return tree, leaf


def _chosen(value: Any, default: Any) -> str | None:
    """The member name a choice's dict form (or bare name) selects, else the default's."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and "name" in value:
        return str(value["name"])
    return default.name if _is_choice_member(type(default)) else None


def config_from_args(cls: type[C], ns: argparse.Namespace, base: C | None = None) -> C:
    """Build ``cls`` from parsed flags, starting from ``base`` (or the defaults)."""
    settings = {s.path: s for s in _walk(cls)}
    given = {k: v for k, v in vars(ns).items() if k in settings}
    tree = config_to_dict(base) if base is not None else {}
    # Selectors first: an option given before its --estimator still applies to the chosen member.
    for path in sorted(given, key=lambda p: settings[p].choices is None):
        s, raw = settings[path], given[path]
        flag = f"--{s.name}"
        node, leaf = _node(tree, s.choice_path or path)
        if s.choices is not None:
            if raw not in s.choices:
                raise ConfigError(f"{flag}: cannot read {raw!r}: expected one of {list(s.choices)}")
            if _chosen(node.get(leaf), s.default) != raw or not isinstance(node.get(leaf), Mapping):
                node[leaf] = {"name": raw}  # another member: its own defaults, not the old one's options
        elif s.options is not None:
            chosen = _chosen(node.get(leaf), settings[s.choice_path].default)
            if chosen is None or chosen not in s.options:
                selector = settings[s.choice_path].name
                own = [f"--{o.name}" for o in settings.values() if o.options and chosen in o.options]
                own = [o for o in own if o.startswith(f"--{selector}.")]
                raise ConfigError(
                    f"{flag} does not apply to --{selector} {chosen} "
                    f"(its options: {', '.join(own) if own else 'none'})"
                )
            tp = s.options[chosen][0]
            entry = dict(node[leaf]) if isinstance(node.get(leaf), Mapping) else {"name": chosen}
            entry[path.rsplit(".", 1)[1]] = _convert(raw, tp, flag) if isinstance(raw, str) else raw
            node[leaf] = entry
        else:
            node[leaf] = _convert(raw, s.tp, flag) if isinstance(raw, str) else raw
    return config_from_dict(cls, tree)


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A JSON-ready dict of a config (enums as their values, tuples as lists, a choice's member as its
    fields plus ``"name"``)."""

    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            fields = {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
            if _is_choice_member(type(v)):
                return {"name": type(v).name, **fields}  # type: ignore[attr-defined]
            return fields
        if isinstance(v, Enum):
            return v.value
        if isinstance(v, tuple | list):
            return [plain(x) for x in v]
        if isinstance(v, Mapping):
            return {str(k): plain(x) for k, x in v.items()}
        return v

    out: dict[str, Any] = plain(cfg)
    return out


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _choice_from(choices: Mapping[str, type], value: Any, where: str, default: Any) -> Any:
    if isinstance(value, tuple(choices.values())):
        return value
    if not isinstance(value, str | Mapping):
        raise ConfigError(
            f"{where}: expected a name from {list(choices)} or a mapping with 'name', "
            f"got {type(value).__name__}"
        )
    name = _chosen(value, default)
    if name is None or name not in choices:
        raise ConfigError(f"{where}: unknown name {name!r}; expected one of {list(choices)}")
    options = {k: v for k, v in value.items() if k != "name"} if isinstance(value, Mapping) else {}
    cls = choices[name]
    # The same member as the default starts from the default's options; another member from its own.
    return config_from_dict(cls, options, where=where, defaults=default if type(default) is cls else None)


def _from_json(tp: Any, value: Any, where: str, default: Any) -> Any:
    """One field's value from its JSON form."""
    if dataclasses.is_dataclass(tp):
        return config_from_dict(
            tp,  # type: ignore[arg-type]
            value,
            where=where,
            defaults=None if default is dataclasses.MISSING else default,
        )
    choices = _choices(tp)
    if choices is not None:
        return _choice_from(choices, value, where, default)
    leaf, _ = _leaf_type(tp)
    if (
        isinstance(leaf, type)
        and issubclass(leaf, Enum)
        and value is not None
        and not isinstance(value, leaf)
    ):
        try:
            return leaf(value)
        except ValueError as e:
            raise ConfigError(f"--{where}: {e}") from e
    if typing.get_origin(leaf) in (tuple, Sequence) and isinstance(value, list):
        return tuple(value)
    if leaf is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _lift_flat(
    fields: Sequence[dataclasses.Field[Any]], hints: Mapping[str, Any], data: Mapping[str, Any], where: str
) -> Mapping[str, Any]:
    """``data`` with the top-level keys of a flat nested config's settings (:data:`FLAT_FLAGS`; the form
    ``config.json`` had before they were split out) moved into that config's dict."""
    own = {f.name for f in fields}
    out: dict[str, Any] | None = None
    for f in fields:
        if not _is_flat(f):
            continue
        inner = {g.name for g in dataclasses.fields(hints[f.name]) if g.init} - own
        lifted = {k: data[k] for k in data if k in inner}
        if not lifted:
            continue
        out = dict(data) if out is None else out
        for k in lifted:
            del out[k]
        nested = out.get(f.name)
        if dataclasses.is_dataclass(nested) and not isinstance(nested, type):
            nested = config_to_dict(nested)
        if nested is None:
            nested = {}
        if not isinstance(nested, Mapping):
            raise ConfigError(f"{_join(where, f.name)}: expected a mapping, got {type(nested).__name__}")
        both = sorted(lifted.keys() & nested.keys())
        if both:
            raise ConfigError(
                f"{sorted(_join(where, k) for k in both)} given both at the top level (the form of earlier "
                f"releases) and in {_join(where, f.name)!r}; give each once"
            )
        out[f.name] = {**nested, **lifted}
    return data if out is None else out


def config_from_dict(cls: type[C], data: Any, *, where: str = "", defaults: C | None = None) -> C:
    """Build ``cls`` from a (possibly partial, nested) dict; unknown keys are an error.

    Missing settings take the value in ``defaults`` when given, else the field's default; a nested
    config's missing settings take the values of the enclosing config's default for it (so
    ``{"learner": {"lr": 1e-6}}`` keeps every other setting of the default learner). ``cls`` may also be
    a choice (a union of self-naming dataclasses); ``data`` is then a member's name or its dict form. The
    settings of a flat nested config (:data:`FLAT_FLAGS`) read at the top level too, as they were written
    before they were split out of ``cls``; a class with a ``lift_earlier(data) -> data`` static method moves
    other settings an earlier release kept elsewhere.
    """
    choices = _choices(cls)
    if choices is not None:
        out: C = _choice_from(choices, data, where or "value", defaults)
        return out
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where or cls.__name__}: expected a mapping, got {type(data).__name__}")
    lift_earlier = getattr(cls, "lift_earlier", None)
    if callable(lift_earlier):
        data = lift_earlier(data)
    hints = _hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    data = _lift_flat(fields, hints, data, where)
    unknown = set(data) - {f.name for f in fields}
    if unknown:
        owner = f" of {cls.name}" if _is_choice_member(cls) else ""  # type: ignore[attr-defined]
        raise ConfigError(
            f"unknown setting(s){owner} {sorted(_join(where, k) for k in unknown)}; "
            f"known: {sorted(_join(where, f.name) for f in fields) or 'none'}"
        )
    kwargs: dict[str, Any] = {}
    for f in fields:
        default = getattr(defaults, f.name) if defaults is not None else _default(f)
        if f.name in data:
            # A flat nested config's settings are named as its parent's own (their flags are).
            inner = where if _is_flat(f) else _join(where, f.name)
            kwargs[f.name] = _from_json(hints[f.name], data[f.name], inner, default)
        elif default is not dataclasses.MISSING:
            kwargs[f.name] = default
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ConfigError(f"{where or cls.__name__}: {e}") from e
    except ConfigError as e:
        if not where:
            raise
        raise ConfigError(f"{where}: {e}") from e
