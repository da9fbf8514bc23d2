"""``@tool``: a typed Python function with a Google-style docstring becomes an agentrl :class:`Tool`.

The schema is the OpenAI function schema that ``transformers.utils.get_json_schema`` builds (the convention
TRL, verl and verifiers share), so the same function works with any chat template's ``tools=`` argument::

    @tool
    def add(a: int, b: int) -> int:
        \"\"\"Add two integers.

        Args:
            a: The first number.
            b: The second number.
        \"\"\"
        return a + b

Calling the tool validates the model's arguments against the signature first: values are coerced where the
intent is unambiguous (``"3"`` or ``3.0`` for an ``int``, ``7`` for a ``str``, ``"true"`` for a ``bool``), and
missing, unexpected or ill-typed arguments come back as :attr:`ToolStatus.BAD_ARGUMENTS` with a message the
model can act on. An exception inside the function comes back as :attr:`ToolStatus.ERROR` with a short
traceback of the function's own frames. Neither ends the episode.

A parameter annotated :class:`~agentrl.protocols.ToolContext` receives the episode's context (sandbox,
limits, extras) and is left out of the schema; a tool that runs code in ``context.sandbox`` says so with
``@tool(needs_sandbox=True)``. Sync functions run in a worker thread by default so a slow one cannot stall
the event loop; pass ``thread=False`` for cheap pure functions.

Hand-written tools whose name or parameters are chosen at run time (:class:`~agentrl.tools.PythonTool`,
:class:`~agentrl.tools.LookupTool`) build their schema with :func:`function_schema`, the same machinery.
"""  # noqa: D214 -- the indented Args section belongs to the example docstring inside this one

from __future__ import annotations

import asyncio
import enum
import functools
import inspect
import json
import math
import os
import re
import traceback
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, Union, get_args, get_origin, overload

from agentrl.errors import ConfigError, InfraError, ToolCallError
from agentrl.protocols import ToolContext, ToolOutput
from agentrl.types import ToolStatus

from ._schema import json_schema

__all__ = ["FunctionTool", "coerce_arguments", "function_schema", "tool"]

_INT_RE = re.compile(r"^[+-]?\d+$")
_TRACEBACK_CHARS = 1500


class FunctionTool:
    """A :class:`~agentrl.protocols.Tool` wrapping a Python function; built by :func:`tool`."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        thread: bool = True,
        needs_sandbox: bool = False,
    ):
        if not callable(fn):
            raise ConfigError(f"@tool needs a function, got {fn!r}")
        if not inspect.isroutine(fn) and hasattr(fn, "schema") and hasattr(fn, "name"):
            # A hand-written Tool that misses a member of the Protocol: wrapping it as a function would
            # describe the wrong thing to the model.
            missing = [m for m in ("name", "schema", "needs_sandbox") if not hasattr(fn, m)]
            raise ConfigError(
                f"{fn!r} looks like a Tool but lacks {missing} (agentrl.protocols.Tool); "
                "a tool that never uses ToolContext.sandbox sets `needs_sandbox = False`"
            )
        self.fn = fn
        self.thread = thread
        self.needs_sandbox = bool(needs_sandbox)
        """Whether the function uses ``ToolContext.sandbox`` (the environment then opens one per episode)."""
        self._is_async = inspect.iscoroutinefunction(fn)
        self._signature = inspect.signature(fn)
        try:
            hints = typing.get_type_hints(fn)
        except Exception as e:
            raise ConfigError(f"cannot resolve the type hints of {fn.__name__!r}: {e}") from e
        self._context_param = next((p for p, h in hints.items() if h is ToolContext and p != "return"), None)
        self._hints = {p: h for p, h in hints.items() if p not in ("return", self._context_param)}
        shown = [p for n, p in self._signature.parameters.items() if n != self._context_param]
        self._schema = _build_schema(
            getattr(fn, "__name__", "tool"),
            inspect.getdoc(fn),
            self._signature.replace(parameters=shown),
            self._hints,
        )
        fn_schema = self._schema["function"]
        if name is not None:
            fn_schema["name"] = name
        if description is not None:
            fn_schema["description"] = description
        self._name: str = fn_schema["name"]
        functools.update_wrapper(self, fn)

    @property
    def name(self) -> str:
        """The function's name, as the model calls it."""
        return self._name

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema built from the signature and docstring."""
        return self._schema

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON Schema of the arguments."""
        params: dict[str, Any] = self._schema["function"]["parameters"]
        return params

    def __repr__(self) -> str:
        return f"FunctionTool({self._name!r})"

    async def __call__(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
        """Validate and coerce ``arguments`` against the signature, then call the function."""
        try:
            kwargs = coerce_arguments(
                self._signature, self._hints, self.parameters, arguments, skip=self._context_param
            )
        except ToolCallError as e:
            return ToolOutput(content=f"Error: {e}", status=ToolStatus.BAD_ARGUMENTS)
        if self._context_param is not None:
            kwargs[self._context_param] = context
        try:
            if self._is_async:
                result = await self.fn(**kwargs)
            elif self.thread:
                result = await asyncio.to_thread(self.fn, **kwargs)
            else:
                result = self.fn(**kwargs)
        except InfraError:
            raise  # ours, not the model's: the executor records it as SANDBOX_ERROR
        except Exception as e:  # the model's recoverable problem: show it, keep the episode going
            return ToolOutput(
                content=_short_traceback(e),
                status=ToolStatus.ERROR,
                detail="".join(traceback.format_exception(e)),
            )
        return to_output(result)


@overload
def tool(fn: Callable[..., Any], /) -> FunctionTool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    thread: bool = True,
    needs_sandbox: bool = False,
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    thread: bool = True,
    needs_sandbox: bool = False,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Turn a typed, documented function (sync or async) into a :class:`FunctionTool`.

    Args:
        fn: The function. Every argument needs a type hint and an ``Args:`` entry in the docstring.
        name: Tool name shown to the model (default: the function's name).
        description: Overrides the docstring's summary.
        thread: Run a sync function in a worker thread (default) rather than on the event loop.
        needs_sandbox: The function runs code in ``ToolContext.sandbox`` (take a ``ToolContext`` parameter);
            environments then open a sandbox session per episode.

    Raises:
        ConfigError: the function cannot be described as a schema (missing hint or docstring entry).
    """
    options: dict[str, Any] = {
        "name": name,
        "description": description,
        "thread": thread,
        "needs_sandbox": needs_sandbox,
    }
    if fn is not None:
        return FunctionTool(fn, **options)
    return lambda f: FunctionTool(f, **options)


def to_output(result: Any) -> ToolOutput:
    """Turn a tool function's return value into a :class:`ToolOutput` (JSON for data, str otherwise)."""
    if isinstance(result, ToolOutput):
        return result
    if result is None:
        return ToolOutput(content="")
    if isinstance(result, str):
        return ToolOutput(content=result)
    if isinstance(result, enum.Enum):
        result = result.value
    try:
        return ToolOutput(content=json.dumps(result, ensure_ascii=False, default=str))
    except (TypeError, ValueError):
        return ToolOutput(content=str(result))


# ---------------------------------------------------------------------------------------------------
# schema
def function_schema(name: str, description: str, parameters: Mapping[str, tuple[Any, str]]) -> dict[str, Any]:
    """The OpenAI function schema ``@tool`` builds for ``name(**parameters)``, for tools made at run time.

    Args:
        name: The tool name shown to the model.
        description: What the tool does (shown to the model; kept verbatim).
        parameters: Argument name -> (type hint, description), in order; every argument is required.

    Raises:
        ConfigError: an argument name is not an identifier, a description is empty, or a hint has no schema.
    """
    summary = " ".join(description.split())
    if not name or not summary:
        raise ConfigError(f"a tool needs a name and a description, got {name!r} and {description!r}")
    params, hints, doc = [], {}, [summary, "", "Args:"]
    for arg, (hint, text) in parameters.items():
        if not arg.isidentifier():
            raise ConfigError(f"tool {name!r}: argument name {arg!r} is not an identifier")
        if not text.strip():
            raise ConfigError(f"tool {name!r}: argument {arg!r} needs a description")
        params.append(inspect.Parameter(arg, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=hint))
        hints[arg] = hint
        doc.append(f"    {arg}: {' '.join(text.split())}")

    schema = _build_schema(name, "\n".join(doc), inspect.Signature(params), hints)
    schema["function"]["description"] = description
    return schema


def _build_schema(
    name: str, doc: str | None, signature: inspect.Signature, hints: dict[str, Any]
) -> dict[str, Any]:
    """The schema of a function called ``name`` with this docstring, signature and resolved hints."""

    # json_schema is transformers' get_json_schema without its torch import (tools/_schema.py says how);
    # it reads __signature__, resolved annotations, __name__ and the docstring of a function.
    # A stand-in carries them, so a tool's own function is never touched (its context parameter is hidden).
    def stand_in() -> None: ...

    stand_in.__signature__ = signature  # type: ignore[attr-defined]
    stand_in.__annotations__ = dict(hints)
    stand_in.__name__ = name
    stand_in.__doc__ = doc
    for p in signature.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ConfigError(f"tool {name!r}: *args/**kwargs cannot be described to a model")
    # transformers reads an empty summary as "no Args: section" and then blames the first argument; say what
    # is really missing. The summary is what comes before the first section header (Args:, Returns:, ...).
    head = re.split(
        r"^\s*(?:Args|Arguments|Returns|Raises)\s*:", inspect.cleandoc(doc or ""), maxsplit=1, flags=re.M
    )
    if not head[0].strip():
        what = "has no docstring" if not (doc or "").strip() else "has a docstring without a summary"
        raise ConfigError(
            f"tool {name!r} {what}: its first line must say what the tool does (the model reads it), "
            "followed by an Args: entry per argument"
        )
    try:
        schema = json_schema(stand_in)
    except Exception as e:  # get_json_schema's own exceptions say exactly what is missing
        raise ConfigError(f"cannot build a tool schema for {name!r}: {e}") from e
    schema["function"].pop("return", None)  # not part of the OpenAI function schema
    if not schema["function"].get("description"):
        raise ConfigError(f"tool {name!r} needs a one-line summary in its docstring")
    return schema


# ---------------------------------------------------------------------------------------------------
# argument validation
def coerce_arguments(
    signature: inspect.Signature,
    hints: Mapping[str, Any],
    parameters: Mapping[str, Any],
    arguments: Mapping[str, Any],
    *,
    skip: str | None = None,
) -> dict[str, Any]:
    """Check ``arguments`` against a signature and return them converted to the annotated types.

    Raises:
        ToolCallError: with a message naming what is missing, unexpected or of the wrong type.
    """
    if not isinstance(arguments, Mapping):
        raise ToolCallError(
            f"arguments must be a JSON object, got {type(arguments).__name__} {_show(arguments)}"
        )
    expected = [n for n in signature.parameters if n != skip]
    unexpected = [k for k in arguments if k not in expected]
    missing = [
        n
        for n in expected
        if n not in arguments and signature.parameters[n].default is inspect.Parameter.empty
    ]
    problems = []
    if missing:
        problems.append(
            "missing required argument"
            + ("s " if len(missing) > 1 else " ")
            + ", ".join(repr(m) for m in missing)
        )
    if unexpected:
        problems.append(
            "unexpected argument"
            + ("s " if len(unexpected) > 1 else " ")
            + ", ".join(repr(u) for u in unexpected)
        )
    if problems:
        raise ToolCallError("; ".join(problems) + f". Expected arguments: {_describe(expected, signature)}.")
    props = parameters.get("properties", {})
    out: dict[str, Any] = {}
    for key, value in arguments.items():
        hint = hints.get(key, Any)
        try:
            v = _coerce(value, hint)
        except _Mismatch as e:
            raise ToolCallError(f"argument {key!r} {e}") from None
        choices = props.get(key, {}).get("enum")
        if choices is not None and _plain(v) not in choices:
            raise ToolCallError(f"argument {key!r} must be one of {choices}, got {_show(value)}")
        out[key] = v
    return out


class _Mismatch(Exception):
    pass


_TYPE_WORDS = {
    int: "an integer",
    float: "a number",
    str: "a string",
    bool: "true or false",
    list: "a list",
    tuple: "a list",
    dict: "an object",
    type(None): "null",
}


def _coerce(value: Any, hint: Any) -> Any:
    if hint is Any or hint is inspect.Parameter.empty:
        return value
    origin, args = get_origin(hint), get_args(hint)
    if origin is Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        members = [a for a in args if a is not type(None)]
        # An exact type match wins over a coercion (so 3 stays an int in ``int | str``).
        for member in members:
            if isinstance(member, type) and type(value) is member:
                return value
        for member in members:
            try:
                return _coerce(value, member)
            except _Mismatch:
                continue
        raise _Mismatch(f"must be {' or '.join(_word(m) for m in args)}, got {_show(value)}")
    if origin is Literal:
        for choice in args:
            try:
                if _coerce(value, type(choice)) == choice:
                    return choice
            except _Mismatch:
                continue
        raise _Mismatch(f"must be one of {list(args)}, got {_show(value)}")
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        for member in hint:
            if value == member.value or (isinstance(value, str) and str(member.value) == value):
                return member
        raise _Mismatch(f"must be one of {[m.value for m in hint]}, got {_show(value)}")
    if origin in (list, tuple) or hint in (list, tuple):
        value = _maybe_json(value, list)
        if not isinstance(value, list | tuple):
            raise _Mismatch(f"must be a list, got {_show(value)}")
        if origin is tuple and args:
            if len(args) != len(value):
                raise _Mismatch(f"must be a list of {len(args)} items, got {len(value)}")
            return tuple(_coerce(v, a) for v, a in zip(value, args, strict=True))
        items = [_coerce(v, args[0]) if args else v for v in value]
        return tuple(items) if (origin or hint) is tuple else items
    if origin is dict or hint is dict:
        value = _maybe_json(value, dict)
        if not isinstance(value, dict):
            raise _Mismatch(f"must be an object, got {_show(value)}")
        if len(args) == 2:
            return {str(k): _coerce(v, args[1]) for k, v in value.items()}
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return int(value)
        if isinstance(value, str) and _INT_RE.match(value.strip().replace("_", "")):
            return int(value.strip())
    elif hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                pass
    elif hint is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
    elif hint is type(None):
        if value is None:
            return None
    elif isinstance(hint, type):
        if isinstance(value, hint):
            return value
    else:
        return value  # a hint we cannot check (the schema builder already rejected exotic ones)
    raise _Mismatch(f"must be {_word(hint)}, got {_show(value)}")


def _maybe_json(value: Any, want: type) -> Any:
    # Some models JSON-encode a list or object a second time; accept it when it decodes to the right kind.
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            return value
        if isinstance(decoded, want):
            return decoded
    return value


def _plain(v: Any) -> Any:
    return v.value if isinstance(v, enum.Enum) else v


def _word(hint: Any) -> str:
    if hint in _TYPE_WORDS:
        return _TYPE_WORDS[hint]
    origin = get_origin(hint)
    if origin in _TYPE_WORDS:
        return _TYPE_WORDS[origin]
    return getattr(hint, "__name__", str(hint))


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=repr) if not isinstance(value, str) else repr(value)
    kind = {
        str: "string",
        bool: "boolean",
        int: "integer",
        float: "number",
        list: "list",
        dict: "object",
        type(None): "null",
    }.get(type(value), type(value).__name__)
    return f"{text[:80]}{'...' if len(text) > 80 else ''} ({kind})"


def _describe(names: list[str], signature: inspect.Signature) -> str:
    if not names:
        return "none"
    parts = []
    for n in names:
        optional = signature.parameters[n].default is not inspect.Parameter.empty
        parts.append(f"{n}{' (optional)' if optional else ''}")
    return ", ".join(parts)


def _short_traceback(e: BaseException) -> str:
    """The error and the tool function's own frames (framework frames dropped), capped for the model."""
    tb = traceback.extract_tb(e.__traceback__)
    here = __file__
    frames = [
        f
        for f in tb
        if f.filename != here and "asyncio" not in f.filename and "concurrent/futures" not in f.filename
    ]
    for f in frames:  # the model needs the line, not this machine's directory layout
        f.filename = os.path.basename(f.filename)
    lines = ["Traceback (most recent call last):\n"]
    lines += traceback.format_list(frames[-3:])
    lines += traceback.format_exception_only(type(e), e)
    text = "".join(lines).rstrip()
    if len(text) > _TRACEBACK_CHARS:
        text = "..." + text[-_TRACEBACK_CHARS:]
    return text
