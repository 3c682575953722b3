"""Runtime tool discovery (SPEC §3.5): a 300-tool catalogue, `discover_tools`, native and ReAct modes."""

from __future__ import annotations

from typing import Any

import pytest

from discovery_catalogue import _generated, catalogue
from thinkloop import Agent, ConfigurationError, RunState, Tool
from thinkloop._discovery import DISCOVER_TOOLS, ToolDiscovery, ToolIndex, tokenize
from thinkloop._loop import build_request
from thinkloop._messages import ModelRequest, ToolDefinition
from thinkloop.testing import FunctionModel, ScriptedModel


def names(request: ModelRequest) -> list[str]:
    return [t.name for t in request.tools]


GOAL = "What will the weather be in Paris tomorrow, and how much is 100 USD in EUR?"
NATIVE_SCRIPT = [
    {"tool_calls": [{"name": DISCOVER_TOOLS, "args": {"query": "weather forecast for a city"}}]},
    {"tool_calls": [{"name": DISCOVER_TOOLS, "args": {"query": "convert money between currencies"}}]},
    {
        "tool_calls": [
            {"name": "get_weather_forecast", "args": {"city": "Paris", "days": 1}},
            {
                "name": "convert_currency",
                "args": {"amount": 100, "from_currency": "USD", "to_currency": "EUR"},
            },
        ]
    },
    "Paris: 18°C with light rain; 100 USD is 92.00 EUR.",
]


# ------------------------------------------------------------------------------------------ search


def test_tokenize_splits_snake_and_camel_case_and_stems() -> None:
    assert tokenize("getWeatherForecasts for HTTPServer") == ["get", "weather", "forecast", "http", "server"]
    assert tokenize("convert_currency amounts, converting") == ["convert", "currency", "amount", "convert"]
    assert tokenize("天气预报") == ["天", "气", "预", "报", "天气", "气预", "预报"]


def test_search_ranks_the_needed_tools_first_in_300() -> None:
    tools = catalogue()
    assert len(tools) == 300
    index = ToolIndex(t.definition for t in tools)
    assert index.search("weather forecast for a city", 3)[0].name == "get_weather_forecast"
    assert index.search("convert money between currencies", 3)[0].name == "convert_currency"
    assert index.search("exchange rate USD to EUR", 1)[0].name == "convert_currency"
    top = [h.name for h in index.search("create an invoice", 5)]
    assert top[0] == "create_invoice"
    assert index.search("zzzz qqqq") == []


def test_search_uses_parameter_names_and_descriptions() -> None:
    index = ToolIndex(
        [
            ToolDefinition(name="lookup", description="Look something up.", parameters={
                "type": "object", "properties": {"isbn": {"type": "string", "description": "book number"}}}),
            ToolDefinition(name="fetch", description="Fetch something."),
        ]
    )  # fmt: skip
    assert [h.name for h in index.search("isbn")] == ["lookup"]
    assert [h.name for h in index.search("book")] == ["lookup"]
    assert [h.name for h in index.search("look up a book", exclude=["lookup"])] == []


# -------------------------------------------------------------------------------------- native run


async def test_scripted_run_discovers_and_calls_the_two_tools_it_needs() -> None:
    model = ScriptedModel(NATIVE_SCRIPT)
    agent = Agent(model, tools=catalogue(), discovery=ToolDiscovery(always=["calculator"], max_results=3))
    result = await agent.run(GOAL)

    assert result.output == "Paris: 18°C with light rain; 100 USD is 92.00 EUR."
    model.assert_used_up()
    first, second, third, _ = model.requests
    assert names(first) == ["calculator", DISCOVER_TOOLS]
    assert names(second)[:2] == ["calculator", DISCOVER_TOOLS]
    assert "get_weather_forecast" in names(second) and "convert_currency" not in names(second)
    assert {"get_weather_forecast", "convert_currency"} <= set(names(third))
    assert len(names(third)) <= 2 + 2 * 3
    assert result.state.discovered_tools[0] == "get_weather_forecast"
    assert "convert_currency" in result.state.discovered_tools

    observations = [m.content for m in result.state.messages if m.role == "tool"]
    assert observations[0].startswith("Found 3 tool(s) for 'weather forecast for a city'")
    assert "- get_weather_forecast(city: string, days?: integer): Get the weather forecast" in observations[0]
    assert observations[2:] == ["Paris: 18°C, light rain, for 1 day(s)", "100.0 USD = 92.00 EUR"]


async def test_prompt_is_much_smaller_than_showing_all_tools() -> None:
    shown_all = ScriptedModel(NATIVE_SCRIPT[2:])
    await Agent(shown_all, tools=catalogue()).run(GOAL)
    discovering = ScriptedModel(NATIVE_SCRIPT)
    await Agent(discovering, tools=catalogue(), discovery=ToolDiscovery(always=["calculator"])).run(GOAL)
    assert len(shown_all.requests[0].tools) == 300
    size_all = sum(len(str(r.tools)) for r in shown_all.requests)
    size_discovering = sum(len(str(r.tools)) for r in discovering.requests)
    assert size_discovering * 5 < size_all


async def test_undiscovered_tool_still_runs() -> None:
    model = ScriptedModel(
        [{"tool_calls": [{"name": "convert_currency", "args": {"amount": 1, "from_currency": "USD",
                                                               "to_currency": "EUR"}}]}, "done"]
    )  # fmt: skip
    result = await Agent(model, tools=catalogue(), discovery=ToolDiscovery()).run(GOAL)
    assert result.state.messages[2].content == "1.0 USD = 0.92 EUR"
    assert result.state.discovered_tools == []


async def test_unknown_tool_error_lists_only_the_shown_tools() -> None:
    model = ScriptedModel([{"tool_calls": [{"name": "teleport", "args": {}}]}, "done"])
    result = await Agent(model, tools=catalogue(), discovery=ToolDiscovery(always=["calculator"])).run(GOAL)
    assert result.state.messages[2].content == (
        "Error: there is no tool named 'teleport'. Available tools: calculator, discover_tools."
    )


async def test_discovery_reports_already_shown_and_no_match() -> None:
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": DISCOVER_TOOLS, "args": {"query": "evaluate arithmetic expression"}}]},
            {"tool_calls": [{"name": DISCOVER_TOOLS, "args": {"query": "xylophone"}}]},
            {"tool_calls": [{"name": DISCOVER_TOOLS, "args": {"query": "  "}}]},
            "done",
        ]
    )
    result = await Agent(model, tools=catalogue(), discovery=ToolDiscovery(always=["calculator"])).run(GOAL)
    observations = [m.content for m in result.state.messages if m.role == "tool"]
    assert "Already available: calculator." in observations[0]
    assert observations[1].startswith("No tool matches 'xylophone'.")
    assert observations[2].startswith("Error: describe what you need")


async def test_discovered_tools_are_capped_oldest_first() -> None:
    queries = ["invoice", "customer", "shipment"]
    model = ScriptedModel(
        [*({"tool_calls": [{"name": DISCOVER_TOOLS, "args": {"query": q}}]} for q in queries), "done"]
    )
    discovery = ToolDiscovery(max_results=2, max_discovered=3)
    result = await Agent(model, tools=catalogue(), discovery=discovery).run(GOAL)
    discovered = result.state.discovered_tools
    assert len(discovered) == 3
    assert all("shipment" in n for n in discovered[-2:])
    assert len(names(model.requests[-1])) == 1 + 3


# --------------------------------------------------------------------------------------- ReAct run


async def test_react_run_discovers_tools_into_the_system_prompt() -> None:
    replies = [
        'Thought: I need a forecast tool\nAction: discover_tools\nAction Input: {"query": "weather forecast"}',
        'Thought: and a currency one\nAction: discover_tools\nAction Input: {"query": "convert currency"}',
        'Thought: forecast\nAction: get_weather_forecast\nAction Input: {"city": "Paris"}',
        'Thought: money\nAction: convert_currency\nAction Input: {"amount": 100, "from_currency": "USD", '
        '"to_currency": "EUR"}',
        "Thought: I know the final answer\nFinal Answer: 18°C and rain; 92.00 EUR.",
    ]
    model = ScriptedModel(replies, tools=False)
    agent = Agent(model, tools=catalogue(), discovery=ToolDiscovery(always=["calculator"], max_results=2))
    result = await agent.run(GOAL)

    assert result.state.mode == "react"
    assert result.output == "18°C and rain; 92.00 EUR."
    prompts = [r.messages[0].content for r in model.requests]
    assert all(r.tools == [] for r in model.requests)
    assert "- discover_tools:" in prompts[0] and "- calculator:" in prompts[0]
    assert "get_weather_forecast" not in prompts[0] and "create_invoice" not in prompts[0]
    assert "- get_weather_forecast:" in prompts[1] and "convert_currency" not in prompts[1]
    assert "- convert_currency:" in prompts[2]
    assert "one of: calculator, discover_tools, get_weather_forecast" in prompts[2]
    tool_outputs = [m.content for m in result.state.messages if m.role == "tool"]
    assert tool_outputs[2:] == ["Paris: 18°C, light rain, for 1 day(s)", "100.0 USD = 92.00 EUR"]


# ------------------------------------------------------------------------------------ state, config


async def test_a_resumed_run_keeps_its_discovered_tools() -> None:
    model = ScriptedModel(NATIVE_SCRIPT[:1] + ["stop here"])
    agent = Agent(model, tools=catalogue(), discovery=ToolDiscovery())
    result = await agent.run(GOAL)
    state = RunState.from_json(result.state.to_json())
    assert "get_weather_forecast" in state.discovered_tools
    run = agent._context(state, budget=None, sinks=[], stream=False)
    assert "get_weather_forecast" in names(build_request(run))


def test_a_tool_named_discover_tools_is_refused() -> None:
    clash = Tool(DISCOVER_TOOLS, "mine", None, lambda: "x")
    with pytest.raises(ConfigurationError, match="rename that tool"):
        Agent(ScriptedModel([]), tools=[clash], discovery=ToolDiscovery())
    with pytest.raises(ConfigurationError, match="max_results and max_discovered must be ≥ 1"):
        ToolDiscovery(max_results=0)


async def test_discover_tools_outside_a_run_says_so() -> None:
    discovery = ToolDiscovery()
    assert (await discovery.tool.invoke({"query": "x"})).startswith("Error: discover_tools can only be used")


def test_the_index_is_cached_until_the_tools_change() -> None:
    discovery = ToolDiscovery()
    agent = Agent(ScriptedModel([]), tools=catalogue(), discovery=discovery)
    registry = discovery.with_tool(agent.tools)
    first = discovery.index(registry)
    assert discovery.index(registry) is first
    assert len(first) == 300
    bigger = discovery.with_tool(
        Agent(ScriptedModel([]), tools=[*catalogue(), _generated("get", "x", "y")]).tools
    )
    assert len(discovery.index(bigger)) == 301


async def test_mcp_server_tools_are_part_of_the_catalogue() -> None:
    from thinkloop.mcp import MCPServerStdio

    def reply(request: ModelRequest) -> Any:
        results = [m.content for m in request.messages if m.role == "tool"]
        if not results:
            return {"tool_calls": [{"name": DISCOVER_TOOLS, "args": {"query": "current time in a timezone"}}]}
        if len(results) == 1:
            return {"tool_calls": [{"name": "time_get_current_time", "args": {"timezone": "Europe/Paris"}}]}
        return f"It is {results[-1]}"

    model = FunctionModel(reply)
    server = MCPServerStdio.from_command_line("python -m mcp_server_time", name="time", prefix="time_")
    discovery = ToolDiscovery(always=["calculator"], max_results=2)
    async with Agent(model, tools=catalogue(), mcp_servers=[server], discovery=discovery) as agent:
        result = await agent.run("What time is it in Paris?")
    assert names(model.requests[0]) == ["calculator", DISCOVER_TOOLS]
    assert result.state.discovered_tools[0] == "time_get_current_time"
    assert "time_get_current_time" in names(model.requests[1])
    assert result.ok and "Europe/Paris" in result.output


# ---------------------------------------------------------------------------------- faults (audit)


async def test_one_tool_with_a_broken_schema_does_not_break_the_search_of_the_catalogue() -> None:
    # `Tool` refuses such schemas when made; these were changed afterwards (a subclass, a mutation)
    broken = Tool("get_weather_alerts", "Weather alerts for a region.", None, lambda: "ok")
    union = Tool("get_weather_sensor", "Get one weather sensor.", None, lambda **kw: "ok")
    for made, schema in (
        (broken, {"type": "object", "properties": ["region"]}),
        (union, {"type": "object", "properties": {"id": {"type": ["string", "null"]}}, "required": "id"}),
    ):
        made.parameters = schema
        made.definition = made.definition.model_copy(update={"parameters": schema})
    model = ScriptedModel(
        [{"tool_calls": [{"name": DISCOVER_TOOLS, "args": {"query": "weather forecast"}}]}, "done"]
    )
    agent = Agent(model, tools=[*catalogue(), broken, union], discovery=ToolDiscovery(max_results=8))
    result = await agent.run(GOAL)
    observation = next(m.content for m in result.state.messages if m.role == "tool")
    assert observation.startswith("Found ") and "get_weather_forecast(city: string" in observation
    assert "get_weather_alerts()" in observation  # listed, without the parameters it cannot describe
    assert "get_weather_sensor(id?: string|null)" in observation  # a `required` that is not a list: none


def test_tokenize_does_not_cache_the_words_of_huge_text() -> None:
    from thinkloop._discovery import _terms_of

    before = _terms_of.cache_info().currsize
    terms = tokenize("weather " + "y" * 1_000_000 + " 天气预报" * 3 + "天" * 200_000)
    assert terms[0] == "weather" and len(terms) < 20_000  # a 200,000-character CJK run counts 4,096
    cached = _terms_of.cache_info().currsize - before
    assert cached <= 3  # "weather" and the short CJK words; never the megabyte word or the long run


async def test_a_huge_query_is_searched_and_echoed_cut() -> None:
    query = "weather forecast " + "zzz " * 300_000
    model = ScriptedModel([{"tool_calls": [{"name": DISCOVER_TOOLS, "args": {"query": query}}]}, "done"])
    result = await Agent(model, tools=catalogue(), discovery=ToolDiscovery()).run(GOAL)
    observation = next(m.content for m in result.state.messages if m.role == "tool")
    assert "get_weather_forecast" in observation and len(observation) < 2_000
    assert "get_weather_forecast" in result.state.discovered_tools


async def test_an_empty_unicode_or_repeated_query_is_answered() -> None:
    script = [
        {"tool_calls": [{"name": DISCOVER_TOOLS, "args": {"query": "weather forecast"}}]},
        {"tool_calls": [{"name": DISCOVER_TOOLS, "args": {"query": "weather forecast"}}]},
        {"tool_calls": [{"name": DISCOVER_TOOLS, "args": {"query": "🌦️ \u200b 天气"}}]},
        {"tool_calls": [{"name": DISCOVER_TOOLS, "args": {"query": "\n\t "}}]},
        {"tool_calls": [{"name": DISCOVER_TOOLS, "args": {}}]},
        "done",
    ]
    result = await Agent(ScriptedModel(script), tools=catalogue(), discovery=ToolDiscovery()).run(GOAL)
    observations = [m.content for m in result.state.messages if m.role == "tool"]
    assert observations[0].startswith("Found ")
    assert "Already available: get_weather_forecast" in observations[1]  # and the next best ones are added
    assert observations[2].startswith("No tool matches")
    assert observations[3].startswith("Error: describe what you need")
    assert "query" in observations[4] and result.stop_reason.value == "final_answer"
    discovered = result.state.discovered_tools
    assert len(discovered) == len(set(discovered)) > 5  # the repeat added new ones, never one twice


def test_a_catalogue_of_thousands_of_tools_is_searched_quickly() -> None:
    import time

    tools = [
        Tool(f"{verb}_{thing}_{i}", f"{verb.title()} a {thing} in system {i}.", None, lambda: "ok")
        for i in range(500)
        for verb in ("get", "create", "delete", "sync")
        for thing in ("invoice", "ticket", "order")
    ]
    discovery = ToolDiscovery()
    index = discovery.index(discovery.with_tool(Agent(ScriptedModel(["x"]), tools=tools).tools))
    assert len(index) == 6_000
    started = time.perf_counter()
    hits = index.search("create invoice", 5)
    assert time.perf_counter() - started < 0.5 and all(h.name.startswith("create_invoice") for h in hits)


def test_always_takes_one_name_a_list_of_names_or_tools_and_refuses_anything_else() -> None:
    """`always="calculator"` was split into its letters, and `always=[calculator]` silently matched nothing:
    the model was shown only discover_tools."""
    calculator = next(t for t in catalogue() if t.name == "calculator")
    assert ToolDiscovery(always="calculator").always == ("calculator",)
    assert ToolDiscovery(always=[calculator, "weather"]).always == ("calculator", "weather")
    with pytest.raises(ConfigurationError, match="takes tool names, not 3"):
        ToolDiscovery(always=["calculator", 3])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match="max_results and max_discovered"):
        ToolDiscovery(max_results="5")  # type: ignore[arg-type]
