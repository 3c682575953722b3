"""Bad input at the public API: each wrong argument is refused where it is given, with an error saying what
was wrong and what to do — not a crash deep inside a run, a silent fallback, or a run that never ends."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from thinkloop import Agent, Budget, ConfigurationError, RiskLevel, RunState, Tool, _tools, tool
from thinkloop.mcp import MCPServerStdio
from thinkloop.plans import execute_plan, parse_plan, plan_tool, run_plan_and_execute
from thinkloop.testing import ScriptedModel


def plain(a: int) -> int:
    """Return a."""
    return a


def tool_outputs(state: RunState) -> list[str]:
    return [m.content for m in state.messages if m.role == "tool"]


def calling(name: str) -> ScriptedModel:
    return ScriptedModel([{"tool_calls": [{"name": name, "args": {}}]}, "done"])


# ------------------------------------------------------------------------------------------------ risk


@pytest.mark.parametrize(
    ("given", "level"),
    [
        ("high", RiskLevel.HIGH),
        ("HIGH", RiskLevel.HIGH),
        (" Medium ", RiskLevel.MEDIUM),
        ("low", RiskLevel.LOW),
    ],
)
def test_a_risk_given_as_text_is_the_risk_level(given: str, level: RiskLevel) -> None:
    # risk="low" was taken for a risk function: calling it failed at every call, and rated it HIGH.
    by_hand = Tool("t", "T.", None, plain, risk=given)  # type: ignore[arg-type]
    decorated = tool(risk=given)(plain)  # type: ignore[arg-type]
    for made in (by_hand, decorated):
        assert made.risk is level and made.risk_for({}) is level


@pytest.mark.parametrize("given", ["dangerous", None, 2, RiskLevel])
def test_a_risk_that_is_no_level_is_refused_naming_the_levels(given: object) -> None:
    with pytest.raises(
        ConfigurationError, match=r"the risk of tool 't' must be a RiskLevel \('low', 'medium'"
    ):
        Tool("t", "T.", None, plain, risk=given)  # type: ignore[arg-type]


def test_a_risk_function_returning_a_level_in_capitals_is_that_level() -> None:
    # RiskLevel("LOW") raised ValueError: the call was rated HIGH.
    made = Tool("t", "T.", None, plain, risk=lambda arguments: "LOW")  # type: ignore[arg-type,return-value]
    assert made.risk_for({}) is RiskLevel.LOW


# ------------------------------------------------------------------------------------------------ flags


@pytest.mark.parametrize("flag", ["idempotent", "in_thread"])
@pytest.mark.parametrize("value", ["false", None, 0])
def test_a_yes_no_flag_that_is_no_bool_is_refused(flag: str, value: object) -> None:
    # in_thread="false" ran the tool in a thread; idempotent="no" re-ran a started call on resume.
    with pytest.raises(ConfigurationError, match=f"{flag} of tool 't' must be True or False"):
        Tool("t", "T.", None, plain, **{flag: value})  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=f"{flag} of tool 'plain' must be True or False"):
        tool(**{flag: value})(plain)  # type: ignore[call-overload]


# ------------------------------------------------------------------------------------ hand-made tools


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ({"function": "plain"}, "the function of tool 't' must be a function"),
        ({"function": None}, "the function of tool 't' must be a function"),
        ({"validator": dict}, "the validator of tool 't' must be a pydantic model class"),
        ({"context_param": 1}, "context_param of tool 't' must be the name of the function's parameter"),
    ],
)
def test_a_hand_made_tool_with_a_part_of_the_wrong_type_is_refused(
    parts: dict[str, Any], message: str
) -> None:
    # each failed only at the tool's first call, inside a run ("'str' object is not callable").
    arguments: dict[str, Any] = {"function": plain, **parts}
    function = arguments.pop("function")
    with pytest.raises(ConfigurationError, match=message):
        Tool("t", "T.", None, function, **arguments)


@pytest.mark.parametrize(
    ("name", "description", "parameters", "message"),
    [
        (3, "T.", None, "invalid tool name 3"),
        ("", "T.", None, "invalid tool name ''"),
        ("two words", "T.", None, "invalid tool name 'two words'.*use 'two_words'"),
        ("t", 3, None, "the description of tool 't' must be text"),
        ("t", "T.", [1], r"the parameters of tool 't' must be a JSON Schema object \(a dict\)"),
    ],
)
def test_a_hand_made_tool_with_a_bad_name_description_or_schema_is_refused(
    name: object, description: object, parameters: object, message: str
) -> None:
    # (already refused before this audit; kept with the others)
    with pytest.raises(ConfigurationError, match=message):
        Tool(name, description, parameters, plain)  # type: ignore[arg-type]


def test_tool_given_a_name_where_the_function_goes_says_how_to_name_it() -> None:
    # @tool("search") failed far from the mistake, with an AttributeError.
    with pytest.raises(
        ConfigurationError, match=r"tool\(\) takes the function, not its name 'search'.*name='search'"
    ):
        tool("search")  # type: ignore[call-overload]
    with pytest.raises(
        ConfigurationError, match="tool\\(\\) makes a tool from a function, not from an int \\(3\\)"
    ):
        tool(3)  # type: ignore[call-overload]


def test_tool_given_a_description_or_name_that_is_not_text_is_refused() -> None:
    def undocumented(a: int) -> int:
        return a

    # description=3 raised AttributeError ('int' object has no attribute 'strip'); so did name=3 without
    # a docstring
    with pytest.raises(ConfigurationError, match="the description of a tool must be text"):
        tool(description=3)(plain)  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match="invalid tool name 3"):
        tool(name=3)(undocumented)  # type: ignore[call-overload]


# --------------------------------------------------------------------------- callables and type hints


def test_a_builtin_without_a_signature_is_refused_saying_to_wrap_it() -> None:
    # inspect.signature(max) raised ValueError("no signature found for builtin") out of tool().
    with pytest.raises(
        ConfigurationError, match="cannot read the parameters of 'max'.*make the tool from a function"
    ):
        tool(max)


def test_a_c_function_with_a_text_signature_becomes_a_tool() -> None:
    made = tool(math.sqrt)
    assert list(made.parameters["properties"]) == ["x"]


def test_a_class_made_a_tool_has_its_typed_parameters_and_its_doc() -> None:
    # every parameter was untyped (the hints were read from `type.__call__`) and the description was
    # "Call self as a function."
    @dataclasses.dataclass
    class Point:
        """A point on the plane."""

        x: int
        y: float = 0.0

    class Greeting:
        """A greeting."""

        def __init__(self, name: str) -> None:
            self.name = name

    point = tool(Point)
    assert point.description == "A point on the plane."
    assert point.parameters["properties"] == {
        "x": {"type": "integer"},
        "y": {"type": "number", "default": 0.0},
    }
    greeting = tool(Greeting)
    assert greeting.description == "A greeting."
    assert greeting.parameters["properties"] == {"name": {"type": "string"}}


class Connection:
    """Not a JSON value: no schema."""


def test_a_parameter_whose_type_has_no_schema_is_named_with_what_to_do() -> None:
    # pydantic's "Unable to generate pydantic-core schema for <class ...>. Set arbitrary_types_allowed=True"
    # named neither the parameter nor anything a tool can do.
    def query(sql: str, connection: Connection) -> str:
        return sql

    def each(values: list[int], apply: Callable[[int], int]) -> list[int]:
        return [apply(v) for v in values]

    with pytest.raises(
        ConfigurationError,
        match=r"parameter 'connection' of tool function 'query' is annotated Connection, which has no JSON "
        r"schema.*annotate it with a JSON type.*ToolContext",
    ):
        tool(query)
    with pytest.raises(
        ConfigurationError, match=r"parameter 'apply' of tool function 'each' is annotated Callable"
    ):
        tool(each)


# --------------------------------------------------------------------------------- endless generators

BOUND = 4.0  # seconds a generator yields for: far past the tools' timeout, so a test fails, never hangs


@pytest.fixture
def no_item_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """The time limit under test: the item cap (`MAX_ITEMS`) would stop these generators first."""
    monkeypatch.setattr(_tools, "MAX_ITEMS", 10**12)


def endless() -> Iterator[str]:
    ends = time.monotonic() + BOUND
    while time.monotonic() < ends:
        yield "x"


async def endless_async() -> AsyncIterator[str]:
    ends = time.monotonic() + BOUND
    while time.monotonic() < ends:
        yield "x"  # never awaits: nothing else on the event loop runs, not even the timer


async def returns_endless() -> Iterator[str]:
    return endless()


async def returns_endless_async() -> AsyncIterator[str]:
    return endless_async()


@pytest.mark.usefixtures("no_item_cap")
@pytest.mark.parametrize(
    ("function", "options"),
    [
        (endless, {"in_thread": False}),
        (endless_async, {}),
        (returns_endless, {}),
        (returns_endless_async, {}),
    ],
)
async def test_a_generator_tool_yielding_for_ever_is_stopped_at_its_timeout(
    function: Callable[..., Any], options: dict[str, Any]
) -> None:
    # drained on the event loop, the generator held it: the timeout never fired, the run hung (here: for
    # the generator's BOUND seconds, then it "succeeded" with millions of lines).
    made = tool(name="endless", timeout=0.3, **options)(function)
    started = time.monotonic()
    result = await Agent(calling("endless"), tools=[made]).run("go")
    assert time.monotonic() - started < BOUND / 2
    assert tool_outputs(result.state) == ["Error: endless was abandoned: it timed out after 0.3 s."]
    assert result.output == "done"


@pytest.mark.usefixtures("no_item_cap")
async def test_a_generator_abandoned_in_its_thread_stops_there_too() -> None:
    # abandoned at its timeout, its thread went on draining it (CPU, and a list growing without end).
    yielded = [0]
    closed = threading.Event()

    def counting() -> Iterator[int]:
        try:
            ends = time.monotonic() + BOUND
            while time.monotonic() < ends:
                yielded[0] += 1
                yield yielded[0]
        finally:
            closed.set()

    made = tool(name="counting", timeout=0.2)(counting)
    result = await Agent(calling("counting"), tools=[made]).run("go")
    assert "timed out after 0.2 s" in tool_outputs(result.state)[0]
    assert await asyncio.to_thread(closed.wait, BOUND / 2)
    count = yielded[0]
    await asyncio.sleep(0.1)
    assert yielded[0] == count


@pytest.mark.usefixtures("no_item_cap")
async def test_a_generator_task_of_a_plan_outside_a_run_is_stopped_at_its_timeout() -> None:
    made = tool(name="endless", timeout=0.3)(endless_async)
    started = time.monotonic()
    result = await execute_plan(parse_plan({"tasks": [{"id": "a", "tool": "endless", "args": {}}]}), [made])
    assert time.monotonic() - started < BOUND / 2
    assert not result.ok and "endless timed out after 0.3 s" in result.results["a"].output


# ---------------------------------------------------------------------------------------------- Agent


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("gpt-4o", r"unknown model 'gpt-4o' \(did you mean 'openai:gpt-4o'\?\)"),
        ("ollama:llama3", "unknown model 'ollama:llama3': there is no provider 'ollama'"),
        ("router:local,gpt4", r"unknown model 'gpt4' \(did you mean 'openai:gpt4'\?\)"),
        (["local", 3], "a list of models holds model strings or Models, not 3"),
        ([], "the list of models is empty"),
        (3, "model must be a model string, a Model or a list of them"),
    ],
)
def test_an_agent_refuses_a_wrong_model_when_it_is_made(model: object, message: str) -> None:
    # a model string is read at the first run (loading is slow): a wrong one failed there, not here.
    with pytest.raises(ConfigurationError, match=message):
        Agent(model)  # type: ignore[arg-type]


def test_an_agent_takes_valid_model_strings_without_loading_them() -> None:
    for model in ("local", "local:0.5b", "openai:gpt-4o-mini", "router:openai:gpt-4o-mini,local", "", None):
        agent = Agent(model)
        assert agent._model is None  # nothing resolved yet


def test_an_agent_refuses_mcp_servers_of_the_wrong_kind() -> None:
    # a URL as text became a list of its characters, failing at the first run.
    with pytest.raises(ConfigurationError, match="mcp_servers must be a list of MCP servers"):
        Agent(ScriptedModel(["x"]), mcp_servers="http://localhost:8000/mcp")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="mcp_servers must hold MCP servers.*it holds 1"):
        Agent(ScriptedModel(["x"]), mcp_servers=[1])  # type: ignore[list-item]
    server = MCPServerStdio("uvx", ["mcp-server-time"])
    assert Agent(ScriptedModel(["x"]), mcp_servers=server).mcp_servers == [server]  # type: ignore[arg-type]


async def test_an_agent_refuses_an_output_validator_that_is_no_plain_function() -> None:
    async def checks(answer: str) -> str:
        return answer

    with pytest.raises(ConfigurationError, match="output_validator must be a function of the final answer"):
        Agent(ScriptedModel(["x"]), output_validator="strict")  # type: ignore[arg-type]
    # an async one's coroutine was taken as the answer
    with pytest.raises(
        ConfigurationError, match="output_validator=.* is an async function: it is called, not awaited"
    ):
        Agent(ScriptedModel(["x"]), output_validator=checks)


def test_an_agent_refuses_final_answer_on_stop_that_is_no_bool() -> None:
    with pytest.raises(ConfigurationError, match="final_answer_on_stop must be True or False, not 'no'"):
        Agent(ScriptedModel(["x"]), final_answer_on_stop="no")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("budget", "message"),
    [
        (5, r"budget must be a Budget.*did you mean Budget\(max_steps=5\)"),
        ({"max_steps": 3}, "budget must be a Budget"),
    ],
)
async def test_run_resume_and_stream_refuse_a_budget_of_the_wrong_type(budget: object, message: str) -> None:
    # failed inside the run with an AttributeError ('int' object has no attribute 'max_steps')
    agent = Agent(ScriptedModel(["x"]))
    with pytest.raises(ConfigurationError, match=message):
        await agent.run("go", budget=budget)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=message):
        await agent.resume("r", budget=budget)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=message):
        async for _ in agent.stream("go", budget=budget):  # type: ignore[arg-type]
            pass
    assert (await agent.run("go", budget=Budget(max_steps=2))).output == "x"


async def test_run_and_resume_refuse_an_on_event_that_is_not_callable() -> None:
    agent = Agent(ScriptedModel(["x"]))
    with pytest.raises(ConfigurationError, match="on_event must be a function taking each event"):
        await agent.run("go", on_event=[])  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="on_event must be a function taking each event"):
        await agent.resume("r", on_event="print")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="on_event must be a function"):  # (refused already)
        Agent(ScriptedModel(["x"]), on_event=3)  # type: ignore[arg-type]


async def test_run_refuses_a_run_id_that_is_not_text() -> None:
    with pytest.raises(ConfigurationError, match=r"run_id must be a string \(None: a new id\), not 7"):
        await Agent(ScriptedModel(["x"]), store=_NotAStore()).run("go", run_id=7)  # type: ignore[arg-type]


class _NotAStore:
    """A checkpointer that is no `Store`: run ids are not checked as a store's."""

    async def checkpoint(self, state: RunState, events: Any = ()) -> None:
        return None


# ---------------------------------------------------------------------------------------------- plans


async def test_plan_functions_refuse_counts_and_parts_of_the_wrong_type() -> None:
    # max_attempts="3" failed at the plan tool's call ('>=' not supported), max_repairs=2.5 in range(),
    # a plan given as a dict in plan.check(), emit=3 at the first event, tool_timeout=True was 1 s.
    with pytest.raises(ConfigurationError, match="max_attempts must be 1 or more"):
        plan_tool([tool(plain)], max_attempts="3")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="max_repairs must be 0 or more"):
        await run_plan_and_execute(ScriptedModel(["x"]), "go", [tool(plain)], max_repairs=2.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="settings must be ModelSettings"):
        await run_plan_and_execute(ScriptedModel(["x"]), "go", [tool(plain)], settings={"temperature": 0})  # type: ignore[arg-type]
    plan = {"tasks": [{"id": "a", "tool": "plain", "args": {"a": 1}}]}
    with pytest.raises(
        ConfigurationError, match=r"execute_plan needs a Plan, not dict: parse_plan\(text or dict\)"
    ):
        await execute_plan(plan, [tool(plain)])  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="emit must be a function receiving each plan event"):
        await execute_plan(parse_plan(plan), [tool(plain)], emit=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="tool_timeout must be a positive number of seconds"):
        await execute_plan(parse_plan(plan), [tool(plain)], tool_timeout=True)
