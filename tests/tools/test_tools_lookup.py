"""LookupTool: fixed or per-episode tables, forgiving key matching, helpful misses."""

from __future__ import annotations

import pytest

from agentrl import ToolContext, ToolStatus
from agentrl.errors import ConfigError
from agentrl.tools import LookupTool

CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Kenya": "Nairobi"}


async def test_fixed_table_exact_and_case_insensitive():
    t = LookupTool(CAPITALS, name="capital", key_name="country")
    assert (await t({"country": "Japan"}, ToolContext())).content == "Tokyo"
    assert (await t({"country": "  kenya "}, ToolContext())).content == "Nairobi"
    assert t.schema["function"]["parameters"]["required"] == ["country"]


async def test_miss_suggests_close_keys():
    t = LookupTool(CAPITALS)
    out = await t({"key": "Frence"}, ToolContext())
    assert out.status == ToolStatus.ERROR.value and "Did you mean: France?" in out.content
    out = await t({"key": "zzz"}, ToolContext())
    assert "Known: France, Japan, Kenya." in out.content


async def test_per_episode_table_comes_from_the_context():
    t = LookupTool(name="price", key_name="item", extra_key="prices")
    ctx = ToolContext(extra={"prices": {"apple": 30}})
    assert (await t({"item": "apple"}, ctx)).content == "30"
    missing = await t({"item": "apple"}, ToolContext())
    assert missing.status == ToolStatus.ERROR.value and "prices" in missing.detail


async def test_bad_arguments():
    t = LookupTool(CAPITALS)
    for args in ({}, {"key": "France", "x": 1}, {"key": ["France"]}):
        assert (await t(args, ToolContext())).status == ToolStatus.BAD_ARGUMENTS.value
    with pytest.raises(ConfigError):
        LookupTool(["France"])  # type: ignore[arg-type]


def test_schema_is_built_by_the_tool_machinery():
    from agentrl.tools.function import function_schema

    t = LookupTool(
        CAPITALS,
        name="capital",
        description="Capital of a country.",
        key_name="country",
        key_description="The country, in English.",
    )
    assert t.schema == function_schema(
        "capital", "Capital of a country.", {"country": (str, "The country, in English.")}
    )
    assert t.schema["function"]["parameters"]["properties"]["country"] == {
        "type": "string",
        "description": "The country, in English.",
    }
    assert t.needs_sandbox is False
    with pytest.raises(ConfigError, match="identifier"):
        LookupTool(CAPITALS, key_name="the key")
