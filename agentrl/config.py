"""Typed configs from the command line: frozen dataclasses in, ``argparse`` flags out.

Every field of a config dataclass becomes a flag; nested dataclasses become dotted flags
(``--learner.lr 1e-6``). Underscores may be written as dashes (``--group-size``). Each field's attribute
docstring is its ``--help`` text. Unknown flags, values of the wrong type and (through the config's own
``__post_init__``) contradictory settings are rejected with a message naming the flag, so nothing is a
silent no-op.
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
from collections.abc import Mapping, Sequence
from enum import Enum
from functools import cache
from typing import Any, TypeVar

from agentrl.errors import ConfigError

__all__ = ["add_config_arguments", "config_from_args", "config_from_dict", "config_to_dict", "field_docs"]

C = TypeVar("C")


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


def _walk(cls: type, prefix: str = "") -> list[tuple[str, dataclasses.Field[Any], Any, str]]:
    out = []
    hints = _hints(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints[f.name]
        path = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            out += _walk(tp, path + ".")  # type: ignore[arg-type]
        else:
            out.append((path, f, tp, docs.get(f.name, "")))
    return out


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def add_config_arguments(
    parser: argparse.ArgumentParser, cls: type, *, aliases: Mapping[str, str] = {}
) -> None:
    """Add one flag per (nested) field of ``cls``; ``aliases`` maps short flags to dotted paths."""
    reverse = {v: k for k, v in aliases.items()}
    try:  # a nested config's defaults are those of the outer config's default instance, not its class's
        base: Any = cls()
    except (TypeError, ConfigError):
        base = None
    for path, f, tp, doc in _walk(cls):
        flags = [f"--{path}"]
        if "_" in path:
            flags.append(f"--{path.replace('_', '-')}")
        if path in reverse:
            flags.append(f"--{reverse[path]}")
        default = _default(f) if base is None else functools.reduce(getattr, path.split("."), base)
        leaf, _ = _leaf_type(tp)
        choices = ""
        if isinstance(leaf, type) and issubclass(leaf, Enum):
            choices = " {" + ",".join(str(m.value) for m in leaf) + "}"
        elif typing.get_origin(leaf) is typing.Literal:
            choices = " {" + ",".join(map(str, typing.get_args(leaf))) + "}"
        shown = default.value if isinstance(default, Enum) else default
        help_text = f"{doc}{choices} (default: {shown!r})" if default is not dataclasses.MISSING else doc
        parser.add_argument(
            *dict.fromkeys(flags),
            dest=path,
            default=argparse.SUPPRESS,
            metavar=getattr(leaf, "__name__", "VALUE").upper(),
            help=help_text.replace("%", "%%"),
        )
        if leaf is bool:
            parser.add_argument(
                f"--no-{path.replace('_', '-')}",
                dest=path,
                action="store_const",
                const="false",
                default=argparse.SUPPRESS,
                help=f"same as --{path} false",
            )


def config_from_args(cls: type[C], ns: argparse.Namespace, base: C | None = None) -> C:
    """Build ``cls`` from parsed flags, starting from ``base`` (or the defaults)."""
    given = {k: v for k, v in vars(ns).items() if "." in k or k in {f.name for f in dataclasses.fields(cls)}}  # type: ignore[arg-type]
    overrides: dict[str, Any] = {}
    types_by_path = {path: tp for path, _, tp, _ in _walk(cls)}
    for path, raw in given.items():
        if path not in types_by_path:
            continue
        overrides[path] = _convert(raw, types_by_path[path], f"--{path}") if isinstance(raw, str) else raw
    start = config_to_dict(base) if base is not None else {}
    for path, value in overrides.items():
        node = start
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return config_from_dict(cls, start)


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A JSON-ready dict of a config (enums as their values, tuples as lists)."""

    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, Enum):
            return v.value
        if isinstance(v, tuple | list):
            return [plain(x) for x in v]
        if isinstance(v, Mapping):
            return {str(k): plain(x) for k, x in v.items()}
        return v

    out: dict[str, Any] = plain(cfg)
    return out


def config_from_dict(cls: type[C], data: Mapping[str, Any], *, where: str = "") -> C:
    """Build ``cls`` from a (possibly partial, nested) dict; unknown keys are an error."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where or cls.__name__}: expected a mapping, got {type(data).__name__}")
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = set(data) - names
    if unknown:
        raise ConfigError(
            f"unknown setting(s) {sorted(where + k for k in unknown)}; "
            f"known: {sorted(where + n for n in names)}"
        )
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = config_from_dict(tp, value, where=f"{where}{name}.")  # type: ignore[arg-type]
            continue
        leaf, _ = _leaf_type(tp)
        if (
            isinstance(leaf, type)
            and issubclass(leaf, Enum)
            and value is not None
            and not isinstance(value, leaf)
        ):
            try:
                value = leaf(value)
            except ValueError as e:
                raise ConfigError(f"--{where}{name}: {e}") from e
        elif typing.get_origin(leaf) in (tuple, Sequence) and isinstance(value, list):
            value = tuple(value)
        elif leaf is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ConfigError(f"{where or cls.__name__}: {e}") from e
