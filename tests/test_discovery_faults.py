"""discover_tools under faults: arguments a model adds, malformed arguments, an empty catalogue."""

from __future__ import annotations

from typing import Any

import pytest

from thinkloop import Agent, Tool, ToolDiscovery, tool
from thinkloop.testing import ScriptedModel


@tool
def get_weather_forecast(city: str) -> str:
    """Get the weather forecast for a city."""
    return f"{city}: sunny"


OTHERS = [
    Tool(f"get_{thing}", f"Get a {thing}.", None, lambda: "ok") for thing in ("invoice", "order", "ticket")
]


async def _observations(args: Any, tools: list[Tool]) -> tuple[list[str], list[str]]:
    model = ScriptedModel([{"tool_calls": [{"name": "discover_tools", "args": args}]}, "done"])
    result = await Agent(model, tools=tools, discovery=ToolDiscovery()).run("weather in Paris?")
    return [m.content for m in result.state.messages if m.role == "tool"], result.state.discovered_tools


async def test_arguments_a_model_adds_to_discover_tools_are_ignored_and_said_so() -> None:
    # discover_tools(query=..., limit=3) raised "TypeError: ToolDiscovery._discover() got an unexpected
    # keyword argument 'limit'": the search did not run, and the error named a private method.
    (observation,), discovered = await _observations(
        {"query": "weather forecast", "limit": 3, "category": "meteo"}, [get_weather_forecast, *OTHERS]
    )
    assert observation.startswith("Found 1 tool(s) for 'weather forecast'")
    assert observation.endswith("(Ignored argument(s) limit, category: discover_tools takes only `query`.)")
    assert discovered == ["get_weather_forecast"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({}, "query: required, not given"),
        ({"q": "weather"}, "query: required, not given"),
        ({"query": None}, "query: Input should be a string"),
        ({"query": ["weather"]}, "query: Input should be a string"),
        ({"query": "   "}, "Error: describe what you need a tool for"),
        ({"query": "zzzz qqqq"}, "No tool matches 'zzzz qqqq'"),
    ],
)
async def test_malformed_discover_calls_are_explained_and_discover_nothing(args: Any, expected: str) -> None:
    (observation,), discovered = await _observations(args, [get_weather_forecast, *OTHERS])
    assert expected in observation
    assert discovered == []


async def test_an_empty_catalogue_finds_nothing() -> None:
    (observation,), discovered = await _observations({"query": "weather"}, [])
    assert observation.startswith("No tool matches 'weather'") and discovered == []


def test_the_cached_index_keeps_its_tools_so_a_new_tool_cannot_take_a_freed_ones_identity() -> None:
    """The index was cached by the tools' id(): a tool freed since could leave its id to a new tool with
    another description, and the stale index would be searched."""
    import gc
    import weakref

    from thinkloop import Tool, ToolRegistry
    from thinkloop._discovery import ToolDiscovery

    discovery = ToolDiscovery()
    old = Tool("lookup", "Look up a word in the dictionary.", None, lambda: "")
    alive = weakref.ref(old)
    discovery.index(ToolRegistry([old]))
    del old
    gc.collect()
    assert alive() is not None  # held by the cache key: its id cannot be reused while the index is cached
    new = Tool("lookup", "Convert a currency amount.", None, lambda: "")
    index = discovery.index(ToolRegistry([new]))
    assert alive() is None  # replaced: the old tool is freed with the old index
    assert [hit.name for hit in index.search("currency amount", 1)] == ["lookup"]
    assert index.search("dictionary word", 1) == []  # the new catalogue's index, not the old one's
