"""The JSON schema of a tool function, as ``transformers.utils.get_json_schema`` writes it, without torch.

Why this module exists: ``get_json_schema`` looks up every bare type hint in a table that it extends with
``torch.Tensor`` whenever torch is installed, so building any ``@tool`` schema imported torch (~2.5 CPU-s),
and ``agentrl.tools`` builds one at import (the calculator). Rollout workers and inference servers never
need torch; this module lets them skip it.

Why this design, and not our own copy of the whole function: the chat template renders these schemas, so a
tool must look to the model exactly as it does under TRL, verl and the other libraries that call
``get_json_schema`` (the same dicts, keys in the same order, since ``tojson`` keeps insertion order).
:func:`json_schema` therefore

* converts, itself, only the hint forms whose JSON ``get_json_schema`` fixes without torch: ``str``,
  ``int``, ``float``, ``bool``, ``None``, ``Any``, ``list``/``tuple``/``dict`` bare or with arguments,
  ``Union``/``Optional``/``X | Y``, ``Literal`` and ``Enum`` classes;
* reads the docstring with transformers' own parser (``parse_google_format_docstring``, a public, pure
  function of that module), so summaries, ``Args:`` entries and their line folding follow the installed
  transformers rather than a second parser of ours;
* does so only while the installed ``get_json_schema`` is the one it mirrors: the source of that function
  and of its hint helpers must hash to :data:`MIRRORED_SOURCE` (that of transformers 5.24). The mapping
  moved within the versions we accept (5.17 turns a custom class into ``{"type": "object"}`` and has no
  ``Enum`` support), so another release, older or newer, takes the reference path below until its
  parity has been checked here and the hash updated (the parity test says so, with the new hash);
* hands everything else to ``get_json_schema`` itself: a hint outside the set above (``torch.Tensor``, a PIL
  image, a custom class), and every function it cannot describe (no docstring, an argument without a hint or
  an ``Args:`` entry, a one-element tuple, a non-JSON ``Literal``...). Its result or its exception is then,
  by construction, what transformers says: a good tool with an exotic hint still gets its schema (torch is
  imported only then), and a bad tool fails with transformers' own message. Should transformers rename
  the docstring parser, every function takes that path: slower, never different.

``tests/tools/test_tool_schema_parity.py`` compares :func:`schema_without_torch` with ``get_json_schema``
(key order included) for every shipped tool and a corpus of signatures; it is what catches a transformers
release that changes the mapping.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import inspect
import json
import re
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union, get_args, get_origin

__all__ = [
    "MIRRORED_SOURCE",
    "Unsupported",
    "installed_source_hash",
    "json_schema",
    "schema_without_torch",
]

MIRRORED_SOURCE = "dbf967ecd46f7080ec75d470f9cdf429bfbc884c4ace4dd74f7453838ae0d4c8"
"""sha256 of the code in transformers 5.24's ``chat_template_utils`` that turns hints into JSON (see
:func:`installed_source_hash`): the code :func:`schema_without_torch` reproduces."""
# Private names of transformers, read only to recognise the code mirrored here; any missing one means
# "not recognised", never an error.
_REFERENCE_CODE = (
    "get_json_schema",
    "_convert_type_hints_to_json_schema",
    "_parse_type_hint",
    "_get_json_schema_type",
    "_enum_values_to_json_schema",
)

# JSON types of the values that may appear in a schema "enum" (Literal arguments, Enum member values).
_SCALAR_TYPES: dict[type, str] = {
    int: "integer",
    float: "number",
    str: "string",
    bool: "boolean",
    type(None): "null",
}
# Bare hints and their schema; get_json_schema's table has these plus torch.Tensor and PIL's Image.
_BARE_TYPES: dict[Any, str | None] = {
    **_SCALAR_TYPES,
    list: "array",
    tuple: "array",
    dict: "object",
    Any: None,
}
# "(choices: [...])" ending an argument's description becomes the property's "enum" (get_json_schema's
# documented convention); the JSON list is parsed, never evaluated.
_CHOICES = re.compile(r"\(choices:\s*(.*?)\)\s*$", re.IGNORECASE)


class Unsupported(Exception):
    """A function or hint :func:`schema_without_torch` leaves to ``get_json_schema``."""


def json_schema(func: Callable[..., Any]) -> dict[str, Any]:
    """``transformers.utils.get_json_schema(func)``, importing torch only for hints that need it.

    Args:
        func: A function with type hints and a Google-style docstring (``__signature__`` is honoured).

    Raises:
        Exception: whatever ``get_json_schema`` raises for ``func`` (its messages name what is missing).
    """
    try:
        return schema_without_torch(func)
    except Exception:  # the reference implementation settles it: its schema, or its error
        pass
    from transformers.utils.chat_template_utils import get_json_schema

    schema: dict[str, Any] = get_json_schema(func)
    return schema


def schema_without_torch(func: Callable[..., Any]) -> dict[str, Any]:
    """What ``get_json_schema(func)`` returns, built without torch, for the hint forms listed above.

    Args:
        func: A function with type hints and a Google-style docstring.

    Raises:
        Unsupported: ``func`` needs ``get_json_schema`` itself (an exotic hint, or a function it rejects).
    """
    if installed_source_hash() != MIRRORED_SOURCE:
        raise Unsupported("the installed transformers converts hints with other code than 5.24's")
    try:
        from transformers.utils.chat_template_utils import parse_google_format_docstring
    except ImportError as e:  # renamed in some transformers release: take the reference path
        raise Unsupported("transformers has no parse_google_format_docstring") from e
    doc = inspect.getdoc(func)
    if not doc:
        raise Unsupported("no docstring")
    summary, arg_docs, returns_doc = parse_google_format_docstring(doc.strip())
    parameters = _parameters(func)
    returns = parameters["properties"].pop("return", None)
    if returns is not None and returns_doc is not None:
        returns["description"] = returns_doc
    for arg, prop in parameters["properties"].items():
        if arg_docs is None or arg not in arg_docs:
            raise Unsupported(f"no Args: entry for {arg!r}")
        text = arg_docs[arg]
        choices = _CHOICES.search(text)
        if choices:
            try:
                values = json.loads(choices.group(1))
            except ValueError as e:
                raise Unsupported(f"choices of {arg!r} are not JSON") from e
            prop["enum"] = [c.strip() if isinstance(c, str) else c for c in values]
            text = text[: choices.start()].strip()
        prop["description"] = text
    function: dict[str, Any] = {
        "name": getattr(func, "__name__", "operation"),
        "description": summary,
        "parameters": parameters,
    }
    if returns is not None:
        function["return"] = returns
    return {"type": "function", "function": function}


@functools.cache
def installed_source_hash() -> str | None:
    """sha256 of the installed ``get_json_schema`` and its hint helpers (source text and scalar table).

    None when transformers lacks one of them or ships no source; a few milliseconds, once per process.
    """
    try:
        from transformers.utils import chat_template_utils as reference

        parts = [inspect.getsource(getattr(reference, name)) for name in _REFERENCE_CODE]
        parts.append(repr(reference.JSON_SCALAR_TYPES))
    except (ImportError, AttributeError, OSError, TypeError):
        return None
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _parameters(func: Callable[..., Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(func)
    signature = inspect.signature(func)
    # A method's first parameter named self or cls without a hint is the receiver, not an argument.
    first = next(iter(signature.parameters.values()), None)
    receiver = (
        first.name
        if first is not None and first.name in ("self", "cls") and first.annotation == inspect.Parameter.empty
        else None
    )
    # `==` rather than `is`, as get_json_schema compares: a default whose `==` misbehaves (an array) then
    # raises here too and the reference path gives its own answer.
    required = []
    for name, param in signature.parameters.items():
        if name == receiver:
            continue
        if param.annotation == inspect.Parameter.empty:
            raise Unsupported(f"argument {name!r} has no type hint")
        if param.default == inspect.Parameter.empty:
            required.append(name)
    properties: dict[str, Any] = {}
    for name, hint in hints.items():
        if name != receiver:
            properties[name] = _hint_schema(hint)
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return parameters


def _hint_schema(hint: Any) -> dict[str, Any]:
    """The JSON schema of one resolved type hint (a fresh dict: the caller adds keys to it)."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is None:
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            return _enum_schema([member.value for member in hint])
        try:
            json_type = _BARE_TYPES[hint]
        except (KeyError, TypeError) as e:  # custom classes, torch.Tensor, PIL images, unhashable oddities
            raise Unsupported(f"hint {hint!r}") from e
        return {} if json_type is None else {"type": json_type}
    if origin is Union or origin is types.UnionType:
        members = [_hint_schema(a) for a in args if a is not type(None)]
        out: dict[str, Any]
        if len(members) == 1:
            out = members[0]
        elif all(m.keys() == {"type"} and isinstance(m["type"], str) for m in members):
            names = sorted({m["type"] for m in members})
            out = {"type": names[0] if len(names) == 1 else names}
        else:  # members with items/enum/... keep them under anyOf
            out = {"anyOf": members}
        if type(None) in args:
            out["nullable"] = True
        return out
    if origin is Literal and args:
        return _enum_schema(list(args))
    if origin is list:
        return {"type": "array", "items": _hint_schema(args[0])} if args else {"type": "array"}
    if origin is tuple:
        if not args:
            return {"type": "array"}
        if len(args) == 1 or ... in args:
            raise Unsupported("tuple with one item or ...")
        return {"type": "array", "prefixItems": [_hint_schema(a) for a in args]}
    if origin is dict:
        obj: dict[str, Any] = {"type": "object"}
        if len(args) == 2:
            obj["additionalProperties"] = _hint_schema(args[1])
        return obj
    raise Unsupported(f"hint {hint!r}")


def _enum_schema(values: list[Any]) -> dict[str, Any]:
    if not values or any(type(v) not in _SCALAR_TYPES for v in values):
        raise Unsupported(f"enum values {values!r}")
    # Each JSON type once, in the order the values first show it.
    kinds = list(dict.fromkeys(_SCALAR_TYPES[type(v)] for v in values))
    return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": values}
