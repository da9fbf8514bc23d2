"""@tool: schema generation with transformers' conventions, argument validation, sync/async, errors."""

from __future__ import annotations

import asyncio
import enum
import json
import threading
from typing import Literal

import pytest
from transformers.utils import get_json_schema

from agentrl import Tool, ToolContext, ToolOutput, ToolStatus
from agentrl.errors import ConfigError
from agentrl.tools import FunctionTool, tool

CTX = ToolContext()


def add(a: int, b: int = 2) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@tool
def describe(
    n: int,
    x: float,
    flag: bool,
    names: list[str],
    pair: tuple[int, str],
    mapping: dict[str, int],
    maybe: int | None = None,
    mode: Literal["fast", "slow"] = "fast",
    color: Color = Color.RED,
    unit: str = "m",
) -> dict:
    """Echo the arguments back with their Python types.

    Args:
        n: An integer.
        x: A float.
        flag: A boolean.
        names: Some names.
        pair: A pair.
        mapping: A mapping.
        maybe: Optional integer.
        mode: A literal.
        color: An enum.
        unit: A unit (choices: ["m", "km"])
    """
    values = dict(
        n=n,
        x=x,
        flag=flag,
        names=names,
        pair=pair,
        mapping=mapping,
        maybe=maybe,
        mode=mode,
        color=color,
        unit=unit,
    )
    return {k: [type(v).__name__, v.value if isinstance(v, enum.Enum) else v] for k, v in values.items()}


GOOD = {"n": 1, "x": 1.5, "flag": True, "names": ["a"], "pair": [1, "b"], "mapping": {"k": 1}}


async def call(t: FunctionTool, **arguments) -> ToolOutput:
    return await t(arguments, CTX)


# -- schema ----------------------------------------------------------------------------------------
def test_schema_is_transformers_get_json_schema_without_return():
    t = tool(add)
    expected = get_json_schema(add)
    expected["function"].pop("return")
    assert t.schema == expected
    assert t.schema["function"]["parameters"]["required"] == ["a"]
    assert t.name == "add"
    assert isinstance(t, Tool)


def test_schema_covers_containers_literals_enums_and_choices():
    props = describe.parameters["properties"]
    assert props["names"] == {"type": "array", "items": {"type": "string"}, "description": "Some names."}
    assert props["maybe"]["nullable"] is True
    assert props["mode"]["enum"] == ["fast", "slow"]
    assert props["color"]["enum"] == ["red", "blue"]
    assert props["unit"]["enum"] == ["m", "km"]
    assert describe.parameters["required"] == ["n", "x", "flag", "names", "pair", "mapping"]


def test_context_parameter_is_injected_and_hidden_from_the_schema():
    @tool
    def whoami(prefix: str, context: ToolContext) -> str:
        """Say the episode id.

        Args:
            prefix: Text to put first.
        """
        return prefix + context.episode_id

    assert list(whoami.parameters["properties"]) == ["prefix"]
    out = asyncio.run(whoami({"prefix": "ep-"}, ToolContext(episode_id="7")))
    assert out == ToolOutput("ep-7")


def test_name_and_description_overrides():
    t = tool(name="plus", description="Sum.")(add)
    assert t.name == "plus" and t.schema["function"]["name"] == "plus"
    assert t.schema["function"]["description"] == "Sum."


def test_undocumented_or_untyped_functions_are_config_errors():
    def no_doc(a: int) -> int:
        return a

    def no_arg_doc(a: int) -> int:
        """Do it."""
        return a

    def untyped(a):
        """Do it.

        Args:
            a: A thing.
        """

    def star(*a: int) -> int:
        """Do it.

        Args:
            a: Things.
        """
        return 0

    for fn, words in [(no_doc, "docstring"), (no_arg_doc, "'a'"), (untyped, "type hint"), (star, "*args")]:
        with pytest.raises(ConfigError, match=r"no_doc|no_arg_doc|untyped|star") as info:
            tool(fn)
        assert words in str(info.value)


# -- argument validation -----------------------------------------------------------------------------
async def test_valid_arguments_pass_through_with_their_types():
    out = await call(describe, **GOOD)
    assert out.status == "ok"
    got = json.loads(out.content)
    assert got["n"] == ["int", 1] and got["x"] == ["float", 1.5] and got["pair"] == ["tuple", [1, "b"]]
    assert got["color"] == ["Color", "red"] and got["maybe"] == ["NoneType", None]


@pytest.mark.parametrize(
    ("key", "value", "want"),
    [
        ("n", "12", ["int", 12]),
        ("n", 3.0, ["int", 3]),
        ("x", 2, ["float", 2.0]),
        ("x", "2.5", ["float", 2.5]),
        ("flag", "false", ["bool", False]),
        ("flag", 1, ["bool", True]),
        ("names", '["p", "q"]', ["list", ["p", "q"]]),
        ("maybe", "5", ["int", 5]),
        ("maybe", None, ["NoneType", None]),
        ("color", "blue", ["Color", "blue"]),
        ("unit", "km", ["str", "km"]),
        ("mapping", '{"z": "3"}', ["dict", {"z": 3}]),
    ],
)
async def test_unambiguous_values_are_coerced(key, value, want):
    out = await call(describe, **{**GOOD, key: value})
    assert out.status == "ok", out.content
    assert json.loads(out.content)[key] == want


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("n", "twelve", "argument 'n' must be an integer, got 'twelve' (string)"),
        ("n", 2.5, "must be an integer"),
        ("n", True, "must be an integer"),
        ("flag", "maybe", "must be true or false"),
        ("names", "p", "must be a list"),
        ("names", [1, {"a": 1}], "must be a string"),
        ("pair", [1], "must be a list of 2 items"),
        ("mode", "medium", "must be one of ['fast', 'slow']"),
        ("color", "green", "must be one of ['red', 'blue']"),
        ("unit", "mile", "must be one of ['m', 'km']"),
        ("maybe", "x", "must be an integer or null"),
    ],
)
async def test_ill_typed_values_are_bad_arguments_with_a_readable_message(key, value, words):
    out = await call(describe, **{**GOOD, key: value})
    assert out.status == ToolStatus.BAD_ARGUMENTS.value
    assert out.content.startswith("Error: ")
    assert words in out.content


async def test_missing_and_unexpected_arguments_are_named():
    t = tool(add)
    out = await call(t, b=1, c=2, d=3)
    assert out.status == "bad_arguments"
    assert "missing required argument 'a'" in out.content
    assert "unexpected arguments 'c', 'd'" in out.content
    assert "Expected arguments: a, b (optional)" in out.content
    out = await t(["not", "a", "dict"], CTX)  # type: ignore[arg-type]
    assert out.status == "bad_arguments" and "JSON object" in out.content


# -- execution ---------------------------------------------------------------------------------------
async def test_sync_tools_run_in_a_worker_thread_unless_told_not_to():
    seen = []

    def where() -> str:
        """Report the thread.

        Args:
        """
        seen.append(threading.current_thread() is threading.main_thread())
        return "ok"

    await tool(where)({}, CTX)
    await tool(thread=False)(where)({}, CTX)
    assert seen == [False, True]


async def test_async_tools_are_awaited():
    @tool
    async def slow_double(x: int) -> int:
        """Double a number, slowly.

        Args:
            x: The number.
        """
        await asyncio.sleep(0.01)
        return 2 * x

    assert await slow_double({"x": "21"}, CTX) == ToolOutput("42")


async def test_exceptions_become_error_output_with_a_short_traceback():
    @tool
    def divide(a: int, b: int) -> float:
        """Divide.

        Args:
            a: Numerator.
            b: Denominator.
        """
        return a / b

    out = await divide({"a": 1, "b": 0}, CTX)
    assert out.status == ToolStatus.ERROR.value
    assert out.content.startswith("Traceback (most recent call last):")
    assert "in divide" in out.content and "return a / b" in out.content
    assert out.content.rstrip().endswith("ZeroDivisionError: division by zero")
    assert 'File "test_tools_function.py", line' in out.content  # no host directories shown
    assert '"function.py"' not in out.content and "asyncio" not in out.content  # framework frames dropped
    assert "tools/function.py" in out.detail  # the full traceback is kept for debugging
    assert await divide({"a": 6, "b": 3}, CTX) == ToolOutput("2.0")  # the tool keeps working


async def test_return_values_become_text():
    def make(value):
        def f() -> object:
            """Return a value.

            Args:
            """
            return value

        return tool(thread=False)(f)

    assert (await make(None)({}, CTX)).content == ""
    assert (await make("plain")({}, CTX)).content == "plain"
    assert (await make({"a": [1, 2]})({}, CTX)).content == '{"a": [1, 2]}'
    assert (await make(Color.BLUE)({}, CTX)).content == '"blue"'
    custom = ToolOutput("x", status="error", detail="d")
    assert await make(custom)({}, CTX) is custom


def test_function_schema_is_what_tool_builds_for_the_same_function():
    from agentrl.tools.function import function_schema

    def lookup(city: str, days: int) -> str:
        """Forecast for a city.

        Args:
            city: The city name.
            days: How many days ahead.
        """
        return ""

    built = function_schema(
        "lookup",
        "Forecast for a city.",
        {"city": (str, "The city name."), "days": (int, "How many days ahead.")},
    )
    assert built == tool(lookup).schema
    # The description is kept verbatim (the docstring path would fold it); argument texts are folded.
    multi = function_schema("f", "Line one.\n\nLine two.", {"x": (str, "An\n   argument.")})
    assert multi["function"]["description"] == "Line one.\n\nLine two."
    assert multi["function"]["parameters"]["properties"]["x"]["description"] == "An argument."
    for name, description, params, match in [
        ("f", "  ", {}, "description"),
        ("f", "Does f.", {"not an id": (str, "x")}, "identifier"),
        ("f", "Does f.", {"x": (str, " ")}, "needs a description"),
    ]:
        with pytest.raises(ConfigError, match=match):
            function_schema(name, description, params)


def test_needs_sandbox_is_declared_and_defaults_to_false():
    assert tool(add).needs_sandbox is False

    @tool(needs_sandbox=True)
    async def run_it(code: str, context: ToolContext) -> str:
        """Run code in the episode's sandbox.

        Args:
            code: The code.
        """
        return (await context.sandbox.run(code)).stdout if context.sandbox else ""

    assert run_it.needs_sandbox is True and isinstance(run_it, Tool)
    assert "context" not in run_it.parameters["properties"]
