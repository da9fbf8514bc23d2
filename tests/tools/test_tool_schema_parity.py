"""@tool schemas are transformers' get_json_schema, key order included, built without importing torch.

The chat template renders these schemas with ``tojson`` (insertion order kept), so "the same" means the same
JSON text. The reference is the installed transformers; a release that changes its mapping fails here.
"""

# ruff: noqa: UP006, UP007, UP035, UP045 -- typing.List, Optional, Union... are hint forms users write: covered

from __future__ import annotations

import enum
import importlib
import inspect
import json
import re
import subprocess
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Tuple, Union

import pytest
import transformers
from transformers.utils import get_json_schema

import agentrl.tools.function as function_module
from agentrl.errors import ConfigError
from agentrl.tools import FunctionTool, LookupTool, PythonTool, _schema, tool
from agentrl.tools._schema import Unsupported, json_schema, schema_without_torch

REPO = Path(__file__).resolve().parents[2]


# On another transformers release tools/_schema.py's path is off and json_schema is get_json_schema itself
# (test_other_transformers_code_gets_get_json_schema_itself): the mirror's own tests then skip, naming the
# hash to re-check, instead of failing CI the day the registry serves a new transformers.
MIRRORED = _schema.installed_source_hash() == _schema.MIRRORED_SOURCE
mirrored = pytest.mark.skipif(
    not MIRRORED,
    reason=f"transformers {transformers.__version__} is not the release tools/_schema.py mirrors (its hash: "
    f"{_schema.installed_source_hash()}): schemas come from get_json_schema and import torch until parity "
    "is re-checked here and MIRRORED_SOURCE updated",
)


def same_json(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert json.dumps(got, indent=1) == json.dumps(want, indent=1)


def fn_with(hints: dict[str, Any], doc: str, defaults: dict[str, Any] | None = None) -> Callable[..., None]:
    """A function ``f`` with these resolved hints (in order), docstring and defaults."""
    defaults = defaults or {}

    def f() -> None: ...

    f.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(
                n,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                annotation=h,
                default=defaults.get(n, inspect.Parameter.empty),
            )
            for n, h in hints.items()
        ]
    )
    f.__annotations__ = {n: h for n, h in hints.items() if h is not inspect.Parameter.empty}
    f.__doc__ = doc
    return f


def assert_parity(fn: Callable[..., Any]) -> None:
    """The torch-free builder (no fallback) gives get_json_schema's JSON; so does @tool, less "return"."""
    want = get_json_schema(fn)
    same_json(schema_without_torch(fn), want)
    same_json(json_schema(fn), want)
    want["function"].pop("return", None)
    same_json(tool(fn).schema, want)


# -- every hint form get_json_schema maps without torch --------------------------------------------------
class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Mixed(enum.Enum):
    A = "a"
    ONE = 1
    HALF = 0.5
    YES = True
    NOTHING = None
    ALIAS = "a"  # an alias, not a member: iteration skips it


HINTS: list[Any] = [
    str,
    int,
    float,
    bool,
    None,
    type(None),
    Any,
    list,
    tuple,
    dict,
    List,
    Dict,
    Tuple,
    list[int],
    List[str],
    list[list[int]],
    list[dict[str, float]],
    tuple[int, str],
    tuple[()],
    Tuple[int, float, bool],
    tuple[int, list[str]],
    dict[str, int],
    Dict[str, List[int]],
    dict[str, Any],
    dict[str, Color],
    Optional[int],
    int | None,
    int | str,
    int | str | None,
    Union[int, float],
    bool | int,
    str | int,
    Union[float, bool, None],
    dict | list | str,
    list | tuple,
    list[int] | tuple,
    list[int] | None,
    list[int] | dict[str, int],
    Optional[list[Optional[int]]],
    Any | None,
    Literal["a", "b"],
    Literal[1, "a", True, None, 2.5],
    Literal["x"] | None,
    list[Literal["up", "down"]],
    Color,
    Level,
    Mixed,
    Optional[Color],
    Color | Level,
    Color | str,
]


@mirrored
@pytest.mark.parametrize("hint", HINTS, ids=[repr(h).replace("typing.", "") for h in HINTS])
def test_every_supported_hint_form_matches_get_json_schema(hint: Any) -> None:
    doc = "Do a thing.\n\nArgs:\n    x: The argument.\n    n: A number.\n"
    assert_parity(fn_with({"x": hint, "n": int}, doc))
    assert_parity(fn_with({"n": int, "x": hint}, doc, defaults={"x": None}))


@mirrored
def test_defaults_decide_required_and_hints_decide_order() -> None:
    doc = "Sum.\n\nArgs:\n    c: C.\n    a: A.\n    b: B.\n"
    assert_parity(fn_with({"c": int, "a": str, "b": float}, doc, defaults={"a": "x", "b": 1.0}))
    all_optional = fn_with({"a": int}, "Sum.\n\nArgs:\n    a: A.\n", defaults={"a": 3})
    assert "required" not in schema_without_torch(all_optional)["function"]["parameters"]
    assert_parity(all_optional)
    assert_parity(fn_with({}, "Takes nothing."))


# -- docstrings ----------------------------------------------------------------------------------------
def several_lines(query: str, limit: int = 10, unit: str = "m", level: int = 1) -> str:
    """Search the index for documents that match a query,
    ranked by relevance.

    The second paragraph of the summary stays in the description.

    Args:
        query: What to search for; a phrase
            that runs onto a second line
            and a third.
        limit (int): How many results to return.
        unit: The unit to report distances in (choices: ["m", "km", "mi"])
        level: How deep to search (CHOICES: [1, 2, 3])

    Returns:
        The matching documents, one per line.

    Raises:
        ValueError: never, really.
    """
    return query


def nested_args(config: dict[str, Any], mode: str = "a") -> None:
    """Apply a configuration.

    Args:
        config: The configuration, with keys:
            retries: How often to retry.
            delay: Seconds between tries.
        mode: How to apply it (choices: [" a ", "b"])
    """


def choices_on_a_literal(mode: Literal["x", "y"], size: str | None = None) -> None:
    """Pick a mode.

    Args:
        mode: The mode (choices: ["x"])
        size: A size (choices: ["S", "M", "L"])
    """


def returns_first(a: int) -> int:
    """Return a.

    Returns:
        The number.

    Args:
        a: A number.
    """
    return a


class Receiver:
    def method(self, a: int) -> int:
        """Use a method.

        Args:
            a: A number.
        """
        return a


@mirrored
@pytest.mark.parametrize(
    "fn",
    [several_lines, nested_args, choices_on_a_literal, returns_first, Receiver.method],
    ids=lambda f: f.__name__,
)
def test_docstring_forms_match_get_json_schema(fn: Callable[..., Any]) -> None:
    want = get_json_schema(fn)
    same_json(schema_without_torch(fn), want)
    same_json(json_schema(fn), want)
    if fn is not Receiver.method:  # an unbound method's self is not a tool argument
        want["function"].pop("return", None)
        same_json(tool(fn).schema, want)


@mirrored
def test_the_parsed_docstring_is_what_the_model_sees() -> None:
    fn = tool(several_lines).schema["function"]
    assert fn["description"].startswith("Search the index for documents that match a query,\nranked")
    props = fn["parameters"]["properties"]
    assert (
        props["query"]["description"]
        == "What to search for; a phrase that runs onto a second line and a third."
    )
    assert props["unit"] == {
        "type": "string",
        "enum": ["m", "km", "mi"],
        "description": "The unit to report distances in",
    }
    assert props["level"]["enum"] == [1, 2, 3]
    assert fn["parameters"]["required"] == ["query"]


# -- every tool the repo ships ---------------------------------------------------------------------------
def shipped_tool_files() -> dict[str, list[str]]:
    """Files under tools/, envs/, agentrl/, examples/ that decorate with @tool or call function_schema."""
    found: dict[str, list[str]] = {"@tool": [], "function_schema": []}
    for folder in ("tools", "envs", "agentrl", "examples"):
        for path in sorted((REPO / folder).rglob("*.py")):
            text = path.read_text()
            rel = str(path.relative_to(REPO))
            if rel == "tools/function.py":  # the home of both (its docstring shows an example)
                continue
            if re.search(r"^\s*@tool\b", text, re.M):
                found["@tool"].append(rel)
            if re.search(r"\bfunction_schema\(", text):
                found["function_schema"].append(rel)
    return found


@mirrored
def test_every_shipped_tool_schema_matches_get_json_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    files = shipped_tool_files()
    # Hand-written tools build their schema with function_schema; a new one belongs in the list below.
    assert files["function_schema"] == ["tools/lookup.py", "tools/python.py"]
    built: list[Callable[..., Any]] = []

    def recording(fn: Callable[..., Any]) -> dict[str, Any]:  # a spy: the real builder still runs
        built.append(fn)
        return json_schema(fn)

    monkeypatch.setattr(function_module, "json_schema", recording)
    shipped: list[FunctionTool] = []
    for rel in files["@tool"]:
        parts = Path(rel).with_suffix("").parts
        module = importlib.import_module(".".join(parts if parts[0] == "agentrl" else ("agentrl", *parts)))
        tools = [v for v in vars(module).values() if isinstance(v, FunctionTool)]
        assert tools, f"{rel} decorates with @tool but no module-level tool was found; list it here"
        shipped += tools
    names = []
    for t in shipped:
        again = FunctionTool(t.fn, name=t.name, thread=t.thread, needs_sandbox=t.needs_sandbox)
        assert again.schema == t.schema
        names.append(t.name)
    assert {"calculator", "run_tests", "A"} <= set(names)
    for hand_written in (PythonTool(), LookupTool({"k": 1}), LookupTool(name="units", key_name="unit")):
        assert hand_written.schema["function"]["name"] == hand_written.name
    # Modules imported for the first time above add their own builds; every tool is among them.
    assert {t.fn.__name__ for t in shipped} | {"python", "lookup", "units"} <= {f.__name__ for f in built}
    for stand_in in built:
        same_json(schema_without_torch(stand_in), get_json_schema(stand_in))


# -- which transformers the torch-free path stands in for ----------------------------------------------


def test_other_transformers_code_gets_get_json_schema_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_schema, "MIRRORED_SOURCE", "the hash of some other release")
    fn = fn_with({"x": list[int] | None, "c": Color}, "Do it.\n\nArgs:\n    x: X.\n    c: C.\n")
    with pytest.raises(Unsupported, match="other code"):
        schema_without_torch(fn)
    same_json(json_schema(fn), get_json_schema(fn))


# -- hints only transformers can map, and functions it rejects -----------------------------------------
def test_hints_outside_the_torch_free_set_go_to_get_json_schema() -> None:
    import torch

    tensor = fn_with({"audio": torch.Tensor}, "Listen.\n\nArgs:\n    audio: A waveform.\n")
    with pytest.raises(Unsupported):
        schema_without_torch(tensor)
    same_json(json_schema(tensor), get_json_schema(tensor))
    assert tool(tensor).parameters["properties"]["audio"]["type"] == "audio"


class Point:
    pass


class Empty(enum.Enum):
    pass


class Nested(enum.Enum):
    PAIR = (1, 2)


DOC_X = "Do a thing.\n\nArgs:\n    x: The argument.\n"
REJECTED = {
    "custom class": fn_with({"x": Point}, DOC_X),
    "custom class inside a list": fn_with({"x": list[Point]}, DOC_X),
    "custom class inside a union": fn_with({"x": int | Point}, DOC_X),
    "set": fn_with({"x": set[int]}, DOC_X),
    "one-item tuple": fn_with({"x": tuple[int]}, DOC_X),
    "variable tuple": fn_with({"x": tuple[int, ...]}, DOC_X),
    "non-JSON literal": fn_with({"x": Literal[b"raw"]}, DOC_X),
    "empty enum": fn_with({"x": Empty}, DOC_X),
    "non-scalar enum": fn_with({"x": Nested}, DOC_X),
    "missing Args entry": fn_with({"x": int, "y": int}, DOC_X),
    "no Args section": fn_with({"x": int}, "Do a thing."),
    "bad choices JSON": fn_with({"x": str}, "Do a thing.\n\nArgs:\n    x: The argument (choices: [a, b])\n"),
    "missing hint": fn_with({"x": inspect.Parameter.empty}, DOC_X),
}


@pytest.mark.parametrize("case", list(REJECTED))
def test_a_bad_tool_fails_at_decoration_with_get_json_schemas_message(case: str) -> None:
    fn = REJECTED[case]
    with pytest.raises(Exception) as reference:
        get_json_schema(fn)
    with pytest.raises(Unsupported):
        schema_without_torch(fn)
    with pytest.raises(ConfigError) as info:
        tool(fn)
    assert str(info.value) == f"cannot build a tool schema for 'f': {reference.value}"


def test_our_own_checks_name_what_is_missing() -> None:
    def undocumented(a: int) -> int:
        return a

    def no_summary(a: int) -> int:
        """Args:
        a: A number.
        """
        return a

    def star(*a: int) -> int:
        """Do it.

        Args:
            a: Things.
        """
        return 0

    def keywords(**a: int) -> int:
        """Do it.

        Args:
            a: Things.
        """
        return 0

    def unresolvable(a: NoSuchType) -> int:  # type: ignore[name-defined]  # noqa: F821
        """Do it.

        Args:
            a: A thing.
        """
        return 0

    for fn, words in [
        (undocumented, "'undocumented' has no docstring"),
        (no_summary, "'no_summary' has a docstring without a summary"),
        (star, "'star': *args/**kwargs cannot be described"),
        (keywords, "'keywords': *args/**kwargs cannot be described"),
        (unresolvable, "cannot resolve the type hints of 'unresolvable'"),
    ]:
        with pytest.raises(ConfigError) as info:
            tool(fn)
        assert words in str(info.value)


# -- the point of it all ---------------------------------------------------------------------------------
@mirrored
def test_importing_the_tools_and_building_schemas_leaves_torch_unimported() -> None:
    code = (
        "import sys, typing\n"
        "import agentrl.tools\n"
        "from agentrl.tools import tool\n"
        "def f(a: int, b: typing.Literal['x', 'y'] = 'x', c: list[float] | None = None) -> str:\n"
        "    '''Do it.\n\n    Args:\n        a: A.\n        b: B.\n        c: C.\n    '''\n"
        "tool(f)\n"
        "import agentrl\n"
        "agentrl.make('math-tir-arith-v0')\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@mirrored
def test_hints_come_resolved_like_get_json_schema_resolves_them() -> None:
    # String annotations (this module uses `from __future__ import annotations`) resolve in the function's
    # globals on both paths.
    def local(a: Optional[Color], b: dict[str, Level]) -> None:
        """Do it.

        Args:
            a: A colour.
            b: Levels by name.
        """

    assert isinstance(local.__annotations__["a"], str)
    assert typing.get_type_hints(local)["b"] == dict[str, Level]
    assert_parity(local)
