"""Tools: @tool schemas from signatures and docstrings, validation, registry, output rendering."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import datetime
import enum
import functools
import json
import re
import sys
import time
import typing
import warnings
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Annotated, Any

import pytest
import typing_extensions
from pydantic import BaseModel, Field

from thinkloop import Agent, ConfigurationError, RiskLevel, Tool, ToolContext, ToolRegistry, _tools, tool
from thinkloop._tools import ToolArgumentsError, ToolRaisedError, render_output, truncate_output
from thinkloop.testing import FunctionModel, ScriptedModel
from thinkloop.tools.calculator import CalculatorError, calculator, evaluate, format_number


@tool
def add(a: int, b: int = 2) -> int:
    """Add two integers.

    Args:
        a: the first number.
        b: the second number,
            with a continuation line.
    """
    return a + b


def test_tool_schema_from_signature_and_docstring() -> None:
    assert add.name == "add"
    assert add.description == "Add two integers."
    assert add.parameters["properties"]["a"] == {"type": "integer", "description": "the first number."}
    assert add.parameters["properties"]["b"]["description"] == "the second number, with a continuation line."
    assert add.parameters["properties"]["b"]["default"] == 2
    assert add.parameters["required"] == ["a"]
    assert add.parameters["additionalProperties"] is False


def test_tool_decorator_with_options() -> None:
    @tool(name="kill", risk=RiskLevel.HIGH, timeout=5, idempotent=False)
    async def kill_process(pid: int) -> str:
        """Kill a process."""
        return f"killed {pid}"

    assert kill_process.name == "kill"
    assert kill_process.risk_for({"pid": 1}) is RiskLevel.HIGH
    assert kill_process.timeout == 5


def test_validation_coerces_and_explains() -> None:
    assert add.validate({"a": "3"}) == {"a": 3, "b": 2}
    with pytest.raises(ToolArgumentsError, match="a: required, not given"):
        add.validate({})
    with pytest.raises(ToolArgumentsError, match="c: no such argument"):
        add.validate({"a": 1, "c": 2})
    with pytest.raises(ToolArgumentsError, match="a: Input should be a valid integer"):
        add.validate({"a": "three"})


def test_hand_written_tool_checks_schema() -> None:
    echo = Tool(
        "echo",
        "Echo text.",
        {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        str,
    )
    assert echo.validate({"text": "hi"}) == {"text": "hi"}
    with pytest.raises(ToolArgumentsError, match="text: required, not given"):
        echo.validate({})
    with pytest.raises(ToolArgumentsError, match="text: Input should be a string"):
        echo.validate({"text": 3})


def test_dynamic_risk_and_failing_risk_function() -> None:
    t = Tool(
        "rm",
        "",
        None,
        lambda path: path,
        risk=lambda args: RiskLevel.CRITICAL if args["path"] == "/" else RiskLevel.LOW,
    )
    assert t.risk_for({"path": "/"}) is RiskLevel.CRITICAL
    assert t.risk_for({"path": "x"}) is RiskLevel.LOW
    assert t.risk_for({}) is RiskLevel.HIGH  # the risk function raised: rated high, never low


def test_an_async_risk_function_is_refused_when_the_tool_is_made() -> None:
    """Never awaited where a call is rated, it rated every call HIGH in silence."""

    async def rated(args: dict[str, Any]) -> RiskLevel:
        return RiskLevel.LOW

    with pytest.raises(ConfigurationError, match="risk function of tool 'rm' is async: it must be a plain"):
        Tool("rm", "", None, lambda path: path, risk=rated)

    def echo(text: str) -> str:
        """Echo."""
        return text

    with pytest.raises(ConfigurationError, match="risk function of tool 'echo' is async"):
        tool(risk=rated)(echo)


async def test_sync_and_async_invoke() -> None:
    @tool
    async def double(x: int) -> int:
        """Double."""
        return 2 * x

    assert await add.invoke({"a": 1, "b": 2}) == 3
    assert await double.invoke({"x": 4}) == 8


async def test_an_awaitable_returned_by_a_sync_callable_is_awaited() -> None:
    class Fetcher:  # a callable object with an async __call__ is not a coroutine function
        async def __call__(self, key: str) -> str:
            await asyncio.sleep(0)
            return f"value of {key}"

    for in_thread in (True, False):
        t = Tool("fetch", "Fetch.", {"type": "object", "properties": {"key": {"type": "string"}}}, Fetcher(),
                 in_thread=in_thread)  # fmt: skip
        assert await t.invoke({"key": "k1"}) == "value of k1"


def test_invalid_definitions_are_user_errors() -> None:
    with pytest.raises(ConfigurationError, match="invalid tool name"):
        Tool("bad name!", "", None, print)

    def star(*args: int) -> None: ...

    with pytest.raises(ConfigurationError, match="named parameters only"):
        tool(star)


def test_registry_rejects_duplicates() -> None:
    registry = ToolRegistry([add])
    with pytest.raises(ConfigurationError, match="two tools are named 'add'"):
        registry.add(add)
    assert registry.names == ["add"]
    assert registry.definitions()[0].name == "add"


def test_render_and_truncate() -> None:
    assert render_output({"a": 1}) == '{"a": 1}'
    assert render_output(None) == "(no output)"
    assert render_output("") == render_output(" \n\t") == "(no output)"  # was an empty tool message
    assert render_output(" x ") == " x "
    text, cut = truncate_output("x" * 100 + "TAIL", 60)
    assert cut and text.endswith("TAIL") and text.startswith("x") and "truncated of 104" in text
    assert len(text) <= 60
    assert truncate_output("short", 60) == ("short", False)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("17*23+4", "395"),
        ("2^10", "1024"),
        ("sqrt(16)", "4"),
        ("0.1+0.2", "0.3"),
        ("-(3-5)*2", "4"),
        ("10/4", "2.5"),
    ],
)
def test_calculator(expr: str, expected: str) -> None:
    assert format_number(evaluate(expr)) == expected


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("__import__('os').system('ls')", "unknown function"),
        ("9**9**9", "too large"),
        ("1/0", "division by zero"),
        ("x + 1", "'x' is not a number"),
        ("(1", "cannot parse"),
        ("factorial(100000)", "too large"),
        ("", "empty"),
    ],
)
def test_calculator_refuses(expr: str, message: str) -> None:
    with pytest.raises(CalculatorError, match=message):
        evaluate(expr)


def test_calculator_tool_accepts_numbers_as_expression() -> None:
    assert calculator.validate({"expression": 391}) == {"expression": "391"}


# ------------------------------------------------------------------------------- the call timeout


async def test_within_returns_the_result_before_the_deadline() -> None:
    from thinkloop._execute import within

    loop = asyncio.get_running_loop()
    assert await within(loop.time() + 5, asyncio.sleep(0, result="ok")) == "ok"


async def test_within_raises_timeout_error_at_the_deadline_and_the_task_stays_usable() -> None:
    from thinkloop._execute import within

    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        await within(loop.time() + 0.02, asyncio.sleep(10))
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # our cancellation was withdrawn
    await asyncio.sleep(0)  # no cancellation is left pending


async def test_within_lets_an_outside_cancellation_through() -> None:
    from thinkloop._execute import within

    loop = asyncio.get_running_loop()
    inner = asyncio.create_task(within(loop.time() + 10, asyncio.sleep(10)))
    await asyncio.sleep(0.01)
    inner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await inner
    assert inner.cancelled()


async def test_within_an_outside_cancellation_racing_the_deadline_stays_a_cancellation() -> None:
    from thinkloop._execute import within

    loop = asyncio.get_running_loop()
    when = loop.time() + 0.01  # one instant for both: two `loop.time()` reads fired apart on a busy machine

    async def body() -> None:
        await within(when, asyncio.sleep(10))

    task = asyncio.create_task(body())
    await asyncio.sleep(0.0)
    loop.call_at(when, task.cancel)  # fires with the timer, in the same loop iteration
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_deadlines_of_one_run_share_a_timer_and_each_await_gets_its_own_limit() -> None:
    from thinkloop._execute import Deadlines

    loop = asyncio.get_running_loop()
    deadlines = Deadlines()
    start = loop.time()

    async def limited(seconds: float, limit: float) -> str:
        try:
            await deadlines.within(loop.time() + limit, asyncio.sleep(seconds))
        except TimeoutError:
            return f"timeout after {loop.time() - start:.2f}"
        return "done"

    # a long limit arms the timer first; a shorter one set later must still be honoured, and a quick
    # await under a long limit is untouched
    results = await asyncio.gather(
        limited(1.0, 5.0), limited(1.0, 0.05), limited(0.01, 5.0), limited(0.3, 0.15)
    )
    assert results[0] == "done" and results[2] == "done"
    # a deadline not honoured lets its 1.0 s / 0.3 s sleep end ("done"): the upper bounds only leave room
    # for a busy machine's late timer, below the 1.0 s at which every other outcome would show
    assert results[1].startswith("timeout") and float(results[1].split()[-1]) < 0.9
    assert results[3].startswith("timeout") and 0.1 <= float(results[3].split()[-1]) < 0.9
    deadlines.close()
    assert deadlines._handle is None


def test_a_hand_written_validator_gives_its_fields_by_name() -> None:
    from pydantic import BaseModel, ConfigDict, Field

    class Args(BaseModel):
        model_config = ConfigDict(extra="allow", populate_by_name=True)
        path: str = Field(alias="file")
        lines: int = 10

    t = Tool(
        "head", "First lines of a file.", Args.model_json_schema(), lambda path, lines: None, validator=Args
    )
    assert t.validate({"file": "a.txt", "lines": "3"}) == {"path": "a.txt", "lines": 3}  # coerced, by name
    assert t.validate({"path": "b.txt", "other": 1}) == {
        "path": "b.txt",
        "lines": 10,
    }  # extras are not arguments


# ------------------------------------------------------------------------------------- ToolContext


@dataclass
class Shop:
    user: str
    orders: dict[str, str]


async def test_a_tool_context_brings_each_run_its_own_deps_and_is_hidden_from_the_model() -> None:
    seen: list[tuple[str, str, int, str]] = []

    @tool
    async def order_status(ctx: ToolContext[Shop], order_id: str) -> str:
        """The status of one of the user's orders."""
        seen.append((ctx.run_id, ctx.call_id, ctx.step, ctx.goal))
        return f"{ctx.deps.user}: {ctx.deps.orders.get(order_id, 'no such order')}"

    @tool
    def whoami(context: ToolContext) -> str:  # type: ignore[type-arg]
        """Who is asking (a sync tool, a bare annotation)."""
        return str(context.deps.user)

    assert order_status.parameters["properties"].keys() == {"order_id"}
    assert whoami.parameters["properties"] == {} and whoami.context_param == "context"

    def reply(request: Any) -> Any:
        if request.turn == 0:
            return {
                "tool_calls": [
                    {"name": "order_status", "args": {"order_id": "A1"}},
                    {"name": "whoami", "args": {}},
                ]
            }
        return "done"

    agent = Agent(FunctionModel(reply), tools=[order_status, whoami])
    ada, bob = Shop("ada", {"A1": "shipped"}), Shop("bob", {"A1": "lost"})
    first, second = await asyncio.gather(
        agent.run("status of A1", deps=ada, run_id="run-ada"),
        agent.run("status of A1", deps=bob, run_id="run-bob"),
    )
    outputs = {r.run_id: [m.content for m in r.state.messages if m.role == "tool"] for r in (first, second)}
    assert outputs == {"run-ada": ["ada: shipped", "ada"], "run-bob": ["bob: lost", "bob"]}
    assert sorted(seen) == [
        ("run-ada", "call_0_0", 1, "status of A1"),
        ("run-bob", "call_0_0", 1, "status of A1"),
    ]
    tools_shown = agent.model.requests[0].tools  # type: ignore[attr-defined]
    assert all(
        "ctx" not in json.dumps(t.parameters) and "context" not in t.parameters["properties"]
        for t in tools_shown
    )


def test_two_tool_context_parameters_are_refused() -> None:
    def twice(a: ToolContext, b: ToolContext) -> str:  # type: ignore[type-arg]
        """Two contexts."""
        return ""

    with pytest.raises(ConfigurationError, match="2 ToolContext parameters"):
        tool(twice)


# ====================================================================== any callable, any return value


class Point(BaseModel):
    x: int
    y: int


@dataclasses.dataclass
class Box:
    w: float
    h: float


class Color(enum.Enum):
    RED = "red"


def test_rich_return_values_render_as_json_and_bytes_as_text() -> None:
    value = {
        "p": Point(x=1, y=2),
        "b": Box(w=1, h=2.5),
        "c": Color.RED,
        "d": datetime.date(2026, 1, 2),
        "s": {3},
    }
    assert json.loads(render_output(value)) == {
        "p": {"x": 1, "y": 2},
        "b": {"w": 1.0, "h": 2.5},
        "c": "red",
        "d": "2026-01-02",
        "s": [3],
    }
    assert render_output(b"caf\xc3\xa9 \xff") == "café \ufffd"
    assert render_output(["line 1", "line 2"]) == "line 1\nline 2"
    assert render_output([1, "a"]) == '[1, "a"]'


def test_dicts_keyed_by_enums_dates_or_tuples_render_as_json_not_repr() -> None:
    rendered = render_output({Color.RED: 1, datetime.date(2026, 1, 2): [Point(x=1, y=2)], (1, 2): None})
    assert json.loads(rendered) == {"red": 1, "2026-01-02": [{"x": 1, "y": 2}], "1,2": None}
    cycle: dict[str, Any] = {}
    cycle["self"] = cycle
    assert render_output(cycle) == "{'self': {...}}"  # no JSON for a cycle: its text, not a crash


async def test_generator_tools_give_their_items() -> None:
    @tool
    def lines(n: int) -> Iterator[str]:
        """Yield lines."""
        for i in range(n):
            yield f"line {i}"

    @tool
    async def numbers(n: int) -> AsyncIterator[int]:
        """Yield numbers."""
        for i in range(n):
            await asyncio.sleep(0)
            yield i

    assert render_output(await lines.invoke({"n": 2})) == "line 0\nline 1"
    assert render_output(await numbers.invoke({"n": 3})) == "[0, 1, 2]"
    model = ScriptedModel([{"tool_calls": [{"name": "numbers", "args": {"n": 2}}]}, "done"])
    result = await Agent(model, tools=[numbers]).run("count")
    assert [e.output for e in result.state.ledger.values()] == ["[0, 1]"]


async def test_partials_callable_objects_and_methods_are_tools() -> None:
    def scale(x: float, factor: float) -> float:
        """Multiply x by a factor."""
        return x * factor

    class Greeter:
        """Greets people."""

        def __init__(self, greeting: str) -> None:
            self.greeting = greeting

        async def __call__(self, name: str) -> str:
            return f"{self.greeting}, {name}"

        def shout(self, text: str) -> str:
            """Upper-case the text."""
            return text.upper()

    double = tool(functools.partial(scale, factor=2.0))
    assert (double.name, double.description) == ("scale", "Multiply x by a factor.")
    assert list(double.parameters["properties"]) == ["x"] and double.parameters["required"] == ["x"]
    assert await double.invoke({"x": 4}) == 8.0
    greet = tool(Greeter("Hello"))
    assert (greet.name, greet.description, greet.parameters["required"]) == (
        "Greeter",
        "Greets people.",
        ["name"],
    )
    assert await greet.invoke({"name": "Ada"}) == "Hello, Ada"
    shout = tool(Greeter("x").shout)
    assert (shout.name, await shout.invoke({"text": "hi"})) == ("shout", "HI")


def test_a_callable_objects_description_is_its_call_doc_or_its_class_doc_never_pythons() -> None:
    class Adder:
        """Add two numbers."""

        def __call__(self, a: int, b: int) -> int:  # no docstring of its own
            return a + b

    class Subtracter(Adder):
        def __call__(self, a: int, b: int) -> int:
            """Subtract b from a."""
            return a - b

    class Quiet(Subtracter):
        def __call__(self, a: int, b: int) -> int:
            return a - b

    class Bare:
        def __call__(self, a: int) -> int:
            return a

    assert tool(Adder()).description == "Add two numbers."  # was "Call self as a function."
    assert tool(Quiet()).description == "Subtract b from a."  # the inherited __call__'s doc
    assert tool(functools.partial(Adder(), b=1), name="inc").description == "Add two numbers."
    assert tool(Bare()).description == "Bare"


def test_callables_without_a_usable_name_or_signature_say_what_to_do() -> None:
    with pytest.raises(ConfigurationError, match=r"a lambda has no name.*tool\(name="):
        tool(lambda x: x)
    assert tool(name="echo")(lambda x: x).name == "echo"

    def kw(**options: int) -> None:
        """Options."""

    with pytest.raises(ConfigurationError, match=r"'kw' takes \*\*options"):
        tool(kw)


# ----------------------------------------------------------------------------- audit: adversarial use


def _observations(result: Any) -> list[str]:
    return [m.content for m in result.state.messages if m.role == "tool"]


async def _run_once(t: Tool, args: dict[str, Any] | str) -> list[str]:
    model = ScriptedModel([{"tool_calls": [{"name": t.name, "args": args}]}, "done"])
    return _observations(await Agent(model, tools=[t]).run("go"))


async def test_exceptions_asyncio_misreads_are_failed_calls_of_a_sync_tool() -> None:
    """StopIteration hung the call until its timeout (it cannot cross into an asyncio future); a
    TimeoutError read as the call's own timeout; a concurrent CancelledError, GeneratorExit and a
    KeyboardInterrupt from the worker thread cancelled or ended the whole run."""

    def failing(kind: type[BaseException]) -> Tool:
        def fails() -> str:
            raise kind("boom")

        return tool(name=f"fails_{kind.__name__}", timeout=30)(fails)

    kinds = [
        StopIteration,
        TimeoutError,
        concurrent.futures.CancelledError,
        asyncio.CancelledError,
        GeneratorExit,
        KeyboardInterrupt,
    ]
    for kind in kinds:
        t = failing(kind)
        started = time.perf_counter()
        observations = await _run_once(t, {})
        assert observations == [f"Error: {t.name} raised {kind.__name__}: boom"], kind
        assert time.perf_counter() - started < 5, kind  # StopIteration waited for the 30 s timeout

    @tool
    def next_item() -> str:
        """The next item."""
        return next(iter([]))

    with pytest.raises(ToolRaisedError) as caught:  # what tool.invoke raises, the original as its cause
        await next_item.invoke({})
    assert type(caught.value).__name__ == "StopIteration"
    assert isinstance(caught.value.__cause__, StopIteration)


def test_positional_only_parameters_are_passed_by_position() -> None:
    def power(base: float, exponent: int = 2, /, *, label: str = "") -> str:
        """Raise a number to a power."""
        return f"{label}{base**exponent}"

    t = tool(power)
    assert asyncio.run(t.invoke(t.validate({"base": 3, "exponent": 3}))) == "27.0"
    assert asyncio.run(t.invoke(t.validate({"base": 3, "label": "x="}))) == "x=9.0"  # the default fills in
    observations = asyncio.run(_run_once(t, {"base": "2"}))
    assert observations == ["4.0"]  # was: raised TypeError: some positional-only arguments passed as keyword


def test_annotated_constraints_and_descriptions_reach_the_schema_and_validation() -> None:
    @tool
    def take(count: Annotated[int, Field(ge=0, le=10, description="how many")]) -> int:
        """Take some."""
        return count

    assert take.parameters["properties"]["count"] == {
        "type": "integer",
        "minimum": 0,
        "maximum": 10,
        "description": "how many",
    }
    with pytest.raises(ToolArgumentsError, match="count: Input should be greater than or equal to 0"):
        take.validate({"count": -1})  # was accepted: get_type_hints dropped the Annotated metadata


@pytest.mark.parametrize(
    "doc",
    [
        """Book a room.

        Parameters
        ----------
        room : str
            The room's name,
            as on the door.
        people : int, optional
            How many people.

        Returns
        -------
        str
            The booking id.
        """,
        """Book a room.

        :param room: The room's name,
            as on the door.
        :type room: str
        :param int people: How many people.
        :returns: The booking id.
        :rtype: str
        """,
        """Book a room.

        Args:
            room (str): The room's name,
                as on the door.
            people: How many people.

        Keyword Args:
            ignored: not a parameter.

        Returns:
            The booking id.
        """,
    ],
    ids=["numpy", "sphinx", "google"],
)
def test_numpy_sphinx_and_google_docstrings_document_each_parameter(doc: str) -> None:
    def book(room: str, people: int = 1) -> str:
        return f"{room}:{people}"

    book.__doc__ = doc
    t = tool(book)
    assert t.description == "Book a room."  # not the whole docstring with its sections
    properties = t.parameters["properties"]
    assert properties["room"]["description"] == "The room's name, as on the door."
    assert properties["people"]["description"] == "How many people."


def test_google_args_with_nested_types_and_deep_indents_document_each_parameter() -> None:
    def merge(names: list[str], limit: int = 3) -> str:
        return ""

    merge.__doc__ = """Merge names.

    Args:
            names (list(str)): The names,
                in order.
            limit (Optional(int)): At most this many.
    """
    properties = tool(merge).parameters["properties"]
    assert properties["names"]["description"] == "The names, in order."
    assert properties["limit"]["description"] == "At most this many."


def test_a_description_paragraph_ending_in_a_colon_is_kept() -> None:
    @tool
    def convert(path: str) -> str:
        """Convert a file.

        Supported formats:
            csv, json
        """
        return path

    assert convert.description == "Convert a file.\n\nSupported formats:\n    csv, json"


def test_lists_and_objects_sent_as_json_text_are_decoded() -> None:
    @tool
    def plot(values: list[int], point: Point, limits: dict[str, float], pair: tuple[int, int]) -> str:
        """Plot."""
        return f"{values} {point.x},{point.y} {limits} {pair}"

    args = {"values": "[1, 2]", "point": '{"x": 1, "y": 2}', "limits": ' {"lo": 0} ', "pair": "[3, 4]"}
    assert plot.validate(args) == {
        "values": [1, 2],
        "point": Point(x=1, y=2),
        "limits": {"lo": 0.0},
        "pair": (3, 4),
    }
    with pytest.raises(ToolArgumentsError, match=r"values\[1\]: Input should be a valid integer"):
        plot.validate({**args, "values": '[1, "x"]'})  # decoded, then told what is wrong inside
    with pytest.raises(ToolArgumentsError, match="values: Input should be a valid list"):
        plot.validate({**args, "values": "1, 2"})  # not JSON: the original error


def test_null_for_a_parameter_with_a_default_takes_the_default() -> None:
    @tool
    def search(query: str, limit: int = 10, tags: list[str] | None = None) -> str:
        """Search."""
        return query

    assert search.validate({"query": "q", "limit": None, "tags": None}) == {
        "query": "q",
        "limit": 10,
        "tags": None,
    }
    with pytest.raises(ToolArgumentsError, match="query: Input should be a valid string"):
        search.validate({"query": None})  # a required parameter has no default to fall back on


def test_parameters_named_like_pydantic_members_are_ordinary_parameters() -> None:
    def lookup(model_config: str, json: int, _id: int = 0, model_dump: bool = False) -> str:
        """Look up."""
        return f"{model_config} {json} {_id} {model_dump}"

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # was: 'Field name "json" shadows an attribute' warnings
        t = tool(lookup)  # `_id` and `model_dump` were ConfigurationErrors
    assert list(t.parameters["properties"]) == ["model_config", "json", "_id", "model_dump"]
    assert t.parameters["required"] == ["model_config", "json"]
    arguments = t.validate({"model_config": "a", "json": "2", "_id": 3})
    assert arguments == {"model_config": "a", "json": 2, "_id": 3, "model_dump": False}
    assert asyncio.run(t.invoke(arguments)) == "a 2 3 False"  # model_config was silently dropped
    with pytest.raises(ToolArgumentsError, match="json: Input should be a valid integer"):
        t.validate({"model_config": "a", "json": "x"})


async def test_a_tool_changing_its_arguments_does_not_rewrite_the_recorded_call() -> None:
    @tool
    def grab(items: Any, options: dict[str, Any]) -> str:
        """Grab."""
        items.append("changed")
        options["nested"].append("changed")
        return "ok"

    sent = {"items": [1], "options": {"nested": [2]}}
    model = ScriptedModel([{"tool_calls": [{"name": "grab", "args": sent}]}, "done"])
    result = await Agent(model, tools=[grab]).run("go")
    (call,) = [c for m in result.state.messages for c in m.tool_calls]
    assert call.arguments == {"items": [1], "options": {"nested": [2]}}  # what the model sent
    shared: list[Any] = [1]
    detached = grab.validate({"items": [shared, shared], "options": {"nested": shared}})
    assert detached["items"][0] is detached["items"][1] and detached["items"][0] is not shared


@pytest.mark.parametrize(
    ("name", "suggested"),
    [("db.query", "db_query"), ("add\n", "add"), ("météo", "meteo"), ("a b", "a_b"), ("x" * 65, "x" * 64)],
)
def test_names_providers_reject_are_refused_with_a_valid_one_suggested(name: str, suggested: str) -> None:
    with pytest.raises(ConfigurationError, match="invalid tool name") as caught:
        Tool(name, "d", None, str)  # '.' and a trailing newline were accepted (OpenAI refuses them)
    assert f"use {suggested!r}" in str(caught.value)


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no str")

    __repr__ = __str__


async def test_a_result_that_cannot_be_shown_is_described_not_reported_as_raised() -> None:
    @tool
    def odd() -> Any:
        """Odd."""
        return {"x": _Unprintable()}

    @tool
    def huge() -> int:
        """Huge."""
        return 7 * 10**5000

    assert await _run_once(odd, {}) == [
        "(the tool returned a dict that cannot be shown as text: RuntimeError: no str)"
    ]  # was: "Error: odd raised RuntimeError: no str" — the tool had not raised
    assert render_output(_Unprintable()).startswith("(the tool returned a _Unprintable that cannot")
    assert await _run_once(huge, {}) == ["7.000000000000000e+5000 (an integer of 5,001 digits)"]
    assert render_output(-(10**5000)) == "-1.000000000000000e+5000 (an integer of 5,001 digits)"


def test_binary_bytes_are_described_not_shown() -> None:
    data = bytes(range(256)) * 64
    assert render_output(data) == (
        "(16,384 bytes of binary data, not shown; they begin 00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f)"
    )
    assert render_output(memoryview(b"text \xff")) == "text \ufffd"  # text with a bad byte is still text


def test_truncation_says_exactly_how_many_characters_are_missing() -> None:
    for length, limit in [(10_001, 10_000), (1_000_000, 10_000), (1_000, 60)]:
        text = "x" * length
        out, truncated = truncate_output(text, limit)
        said = int(re.search(r"\[(\d+) characters truncated of (\d+)\]", out).group(1))  # type: ignore[union-attr]
        assert truncated and len(out) == limit
        assert out.count("x") + said == length  # was "1 characters truncated" when 41 were


@tool
async def impatient() -> str:
    """Waits for something with its own short time limit."""
    await asyncio.wait_for(asyncio.sleep(5), 0.01)
    return "never"


@tool
async def abandons() -> str:
    """Awaits a helper task that it cancels itself."""
    helper = asyncio.ensure_future(asyncio.sleep(5))
    asyncio.get_running_loop().call_later(0.01, helper.cancel)
    await helper
    return "never"


@tool(timeout=0.05)
async def slowpoke() -> str:
    """Takes longer than its time limit."""
    await asyncio.sleep(5)
    return "never"


async def test_an_async_tool_raising_timeout_or_cancelled_itself_is_a_failed_call_not_a_timeout() -> None:
    """A tool's own `asyncio.wait_for` timing out was reported as the call's 120 s timeout after 0.01 s,
    and a tool awaiting a task it cancelled ended the whole run as cancelled; a real time limit and a real
    cancellation still are what they were."""
    calls = [{"name": n, "args": {}} for n in ("impatient", "abandons", "slowpoke")]
    model = ScriptedModel([{"tool_calls": calls}, "done"])
    result = await Agent(model, tools=[impatient, abandons, slowpoke]).run("go")
    assert result.output == "done"
    outputs = [m.content for m in result.state.messages if m.role == "tool"]
    assert outputs[0].startswith("Error: impatient raised TimeoutError")
    assert outputs[1].startswith("Error: abandons raised CancelledError")
    assert outputs[2] == "Error: slowpoke was abandoned: it timed out after 0.05 s."

    task = asyncio.ensure_future(
        Agent(ScriptedModel([{"tool_calls": calls[2:]}, "done"]), tools=[slowpoke]).run("go")
    )
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# ============================================================ plain scalar arguments: checked without pydantic


@tool
def _booking(city: str, nights: int, budget: float, breakfast: bool = False, note: str = "none") -> str:
    """Book a room."""
    return city


def _pydantic_says(t: Tool, arguments: dict[str, Any]) -> dict[str, Any] | str:
    assert t.validator is not None
    try:
        return dict(t.validator.model_validate(arguments).__dict__)
    except Exception as exc:
        return type(exc).__name__


def _validate_says(t: Tool, arguments: dict[str, Any]) -> dict[str, Any] | str:
    try:
        return t.validate(arguments)
    except ToolArgumentsError:
        return "ValidationError"


@pytest.mark.parametrize(
    "arguments",
    [
        {"city": "Oslo", "nights": 2, "budget": 99.5},  # exact types: the plain check
        {"city": "Oslo", "nights": 2, "budget": 99.5, "breakfast": True, "note": "late"},
        {"nights": 2, "budget": 99.5, "city": "Oslo"},  # another order
        {"city": "Oslo", "nights": "2", "budget": 99.5},  # "2" -> 2: pydantic coerces
        {"city": "Oslo", "nights": 2, "budget": 99},  # 99 -> 99.0: a float, as pydantic gives it
        {"city": "Oslo", "nights": True, "budget": 1.0},  # a bool for an int: pydantic decides
        {"city": "Oslo", "nights": 2},  # a required argument missing
        {"city": "Oslo", "nights": 2, "budget": 1.0, "stars": 4},  # an unknown argument
        {"city": None, "nights": 2, "budget": 1.0},
        {"city": "Oslo", "nights": 2, "budget": float("inf")},
    ],
)
def test_plain_arguments_are_validated_exactly_as_pydantic_would(arguments: dict[str, Any]) -> None:
    assert _booking._plain is not None  # the tool qualifies for the plain check
    got, expected = _validate_says(_booking, arguments), _pydantic_says(_booking, arguments)
    assert got == expected
    if isinstance(got, dict):
        assert isinstance(expected, dict)
        assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in expected.items()}
        assert got is not arguments  # a new dict, as pydantic's was


def test_arguments_with_rules_always_go_through_pydantic() -> None:
    @tool
    def nights(n: Annotated[int, Field(ge=1)], name: str | None = None) -> int:
        """Count nights."""
        return n

    class Strict(BaseModel):
        model_config = {"extra": "forbid", "str_strip_whitespace": True}
        city: str

    def where(city: str) -> str:
        return city

    stripped = Tool("where", "Where.", {"type": "object"}, where, validator=Strict)
    assert nights._plain is None and stripped._plain is None  # a constraint / an optional, another config
    with pytest.raises(ToolArgumentsError):
        nights.validate({"n": 0})
    assert stripped.validate({"city": "  Oslo "}) == {"city": "Oslo"}


def test_a_risk_function_that_exits_or_returns_a_coroutine_rates_the_call_high_without_side_effects() -> None:
    import sys
    import warnings

    def exits(arguments: dict[str, Any]) -> RiskLevel:
        sys.exit(3)

    async def rates(arguments: dict[str, Any]) -> RiskLevel:
        return RiskLevel.LOW

    for risk in (exits, lambda arguments: rates(arguments)):  # the lambda is not seen as async when made
        t = Tool("t", "T.", None, lambda: "", risk=risk)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "coroutine was never awaited"
            assert t.risk_for({}) is RiskLevel.HIGH


# ====================================================================== audit: signatures, schemas, errors


def test_a_pydantic_field_as_a_default_documents_and_defaults_the_parameter() -> None:
    def find(
        query: str = Field(description="what to look for"),
        limit: int = Field(5, ge=1, description="at most this many"),
        tags: list[str] = Field(default_factory=list),  # noqa: B008  # what pydantic users write
    ) -> str:
        """Find things."""
        return f"{query} {limit} {tags}"

    t = tool(find)
    assert t.parameters["properties"] == {
        "query": {"type": "string", "description": "what to look for"},
        "limit": {"type": "integer", "minimum": 1, "description": "at most this many", "default": 5},
        "tags": {"type": "array", "items": {"type": "string"}},
    }
    assert t.parameters["required"] == ["query"]
    # was: the FieldInfo itself passed to the function as `limit` and `tags`, `query` not required
    assert asyncio.run(t.invoke(t.validate({"query": "q"}))) == "q 5 []"
    with pytest.raises(ToolArgumentsError, match="limit"):
        t.validate({"query": "q", "limit": 0})


class _Unit(enum.Enum):
    C = "celsius"
    F = "fahrenheit"


class _Place(BaseModel):
    """A place."""

    city: str
    country: str = Field(description="ISO code")


@dataclass
class _Size:
    w: float
    h: float


class _Target(typing_extensions.TypedDict):
    x: int
    y: int


class _Tree(BaseModel):
    value: int
    children: list[_Tree] = []


class _PlainTarget(typing.TypedDict):
    x: int


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="pydantic reads typing.TypedDict from Python 3.12")
def test_a_typing_typeddict_parameter_on_python_3_11_is_refused_with_what_to_use_instead() -> None:
    """The refusal suggested "a TypedDict", the very thing it refused."""

    def aim(target: _PlainTarget) -> str:
        """Aim."""
        return ""

    with pytest.raises(ConfigurationError, match="define it with typing_extensions.TypedDict"):
        tool(aim)


def test_schemas_are_self_contained_without_titles_and_keep_only_recursive_defs() -> None:
    @tool
    def forecast(place: _Place, title: str, unit: _Unit = _Unit.C, home: _Place | None = None) -> str:
        """Forecast.

        Args:
            place: where.
        """
        return ""

    place = {
        "type": "object",
        "description": "where.",
        "properties": {"city": {"type": "string"}, "country": {"type": "string", "description": "ISO code"}},
        "required": ["city", "country"],
    }
    assert forecast.parameters == {
        "type": "object",
        "properties": {
            "place": place,
            "title": {"type": "string"},  # a parameter named `title` is a parameter, not a title
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
            "home": {"anyOf": [{**place, "description": "A place."}, {"type": "null"}], "default": None},
        },
        "required": ["place", "title"],
        "additionalProperties": False,
    }  # was: "$ref": "#/$defs/_Place" and "title": "_Place", "City", … in $defs

    @tool
    def walk(tree: _Tree) -> int:
        """Walk a tree."""
        return tree.value

    assert walk.parameters["properties"]["tree"] == {"$ref": "#/$defs/_Tree"}  # recursive: kept as a $ref
    assert walk.parameters["$defs"] == {
        "_Tree": {
            "type": "object",
            "properties": {
                "value": {"type": "integer"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/_Tree"}, "default": []},
            },
            "required": ["value"],
        }
    }


async def test_the_schema_an_invalid_call_is_answered_with_has_no_dangling_reference() -> None:
    @tool
    def forecast(place: _Place, unit: _Unit = _Unit.C) -> str:
        """Forecast."""
        return ""

    (observation,) = await _run_once(forecast, {"place": {"city": "Oslo"}, "unit": "kelvin"})
    assert "$ref" not in observation  # was: {"$ref": "#/$defs/_Place"} without the $defs it points into
    assert (
        'one of "celsius", "fahrenheit"' in observation and '"country": "<string: ISO code>"' in observation
    )
    assert observation.endswith("(required: place).")  # placeholders that say it all: no schema after them


def test_shared_definitions_stay_references_when_inlining_them_would_explode() -> None:
    from pydantic import create_model

    level: Any = create_model("L0", v=(int, ...))
    for i in range(1, 30):  # each level uses the one below twice: 2**29 copies if all were inlined
        level = create_model(f"L{i}", left=(level, ...), right=(level, ...))

    def deep(root: Any) -> str:
        """Deep."""
        return ""

    deep.__annotations__["root"] = level
    t = tool(deep)
    assert t.parameters["properties"]["root"] == {"$ref": "#/$defs/L29"}
    assert set(t.parameters["$defs"]) == {f"L{i}" for i in range(30)}
    assert len(json.dumps(t.parameters)) < 10_000


def test_what_a_model_reads_for_a_wrong_call_names_the_argument_the_value_and_what_is_expected() -> None:
    @tool
    def book(
        place: _Place,
        nights: int,
        unit: _Unit = _Unit.C,
        guests: int | str = 1,
        near: _Place | _Size | None = None,
        rooms: list[int] | None = None,
    ) -> str:
        """Book."""
        return ""

    oslo = {"city": "Oslo", "country": "NO"}

    def told(arguments: dict[str, Any]) -> str:
        with pytest.raises(ToolArgumentsError) as caught:
            book.validate(arguments)
        return str(caught.value)

    # what pydantic said: "Field required", "Extra inputs are not permitted", no value given, "valid
    # dictionary or instance of _Place", and a union's Python members in the path ("guests.int", "near._Place")
    assert told({"place": oslo, "nights": "three"}) == (
        'nights: Input should be a valid integer, unable to parse string as an integer (got "three")'
    )
    assert told({"place": oslo}) == "nights: required, not given"
    assert told({"plac": oslo, "nights": 1}) == (
        "place: required, not given; plac: no such argument (did you mean place?)"
    )
    assert told({"place": oslo, "nights": 1, "unit": "kelvin"}) == (
        "unit: Input should be 'celsius' or 'fahrenheit' (got \"kelvin\")"
    )
    assert told({"place": {"city": "Oslo"}, "nights": 1}) == "place.country: required, not given"
    assert told({"place": "Oslo", "nights": 1}) == 'place: Input should be an object (got "Oslo")'
    assert told({"place": oslo, "nights": 1, "rooms": [1, "x"]}) == (
        'rooms[1]: Input should be a valid integer, unable to parse string as an integer (got "x")'
    )
    assert told({"place": oslo, "nights": 1, "guests": [2]}) == (
        "guests: Input should be a valid integer or a valid string (got [2])"
    )
    assert told({"place": oslo, "nights": 1, "near": {"city": "Oslo"}}) == (
        "near: matches none of the forms it accepts (first form: country: required, not given / "
        "second form: w: required, not given, h: required, not given, city: no such field)"
    )
    many = told({"place": oslo, "nights": 1, **{f"x{i}": i for i in range(8)}})
    assert many.endswith("x4: no such argument; and 3 more problems")
    long = told({"place": oslo, "nights": "9" * 50 + "x" * 100})
    assert long.endswith('(got "' + "9" * 50 + "x" * 28 + "…)")


async def test_types_defined_in_the_enclosing_function_resolve_under_postponed_annotations() -> None:
    # this module has `from __future__ import annotations`: every hint is a string, and `Order` and
    # `Shelf` exist only in this function's locals, which `get_type_hints` does not see
    class Order(BaseModel):
        sku: str
        quantity: int = 1

    @dataclass
    class Shelf:
        row: int

    @tool
    def place_order(order: Order, shelf: Shelf | None, ctx: ToolContext[Shop]) -> str:
        """Place an order."""
        return f"{ctx.deps.user}: {order.quantity} x {order.sku} from row {shelf and shelf.row}"

    def restock(order: Order) -> str:  # made a tool by the agent, deeper in the stack
        """Restock."""
        return order.sku

    assert place_order.context_param == "ctx"  # was: ConfigurationError "name 'Order' is not defined"
    assert place_order.parameters["properties"]["order"]["properties"]["sku"] == {"type": "string"}
    calls = [{"name": "place_order", "args": {"order": {"sku": "A1"}, "shelf": {"row": 2}}}]
    agent = Agent(ScriptedModel([{"tool_calls": calls}, "done"]), tools=[place_order, restock])
    result = await agent.run("order", deps=Shop("ada", {}))
    assert _observations(result) == ["ada: 1 x A1 from row 2"]
    assert agent.tools.get("restock") is not None

    def later(item: Missing) -> str:  # type: ignore[name-defined]  # noqa: F821
        """Uses a type defined nowhere."""
        return ""

    with pytest.raises(ConfigurationError, match=r"name 'Missing' is not defined: .*module level"):
        tool(later)


class _Catalog:
    KINDS = ("book", "film")

    def __init__(self, items: list[str]) -> None:
        self.items = items

    @tool
    def search(self, query: str, limit: int = 5) -> list[str]:
        """Search the catalog.

        Args:
            query: words to look for.
        """
        return [item for item in self.items if query in item][:limit]

    @tool
    async def count(self) -> int:
        """How many items there are."""
        return len(self.items)

    @tool
    @classmethod
    def kinds(cls) -> str:
        """The kinds of items."""
        return ", ".join(cls.KINDS)

    @tool
    @staticmethod
    def shout(text: str) -> str:
        """Upper-case the text."""
        return text.upper()

    def lookup(self, sku: str) -> str:
        """Look an item up."""
        return sku


async def test_tool_on_a_method_binds_to_each_instance_and_hides_self() -> None:
    assert _catalog_properties() == {
        "search": ["query", "limit"],  # was: "self" was a required parameter the model was asked for
        "count": [],
        "kinds": [],
        "shout": ["text"],
    }
    books, films = _Catalog(["dune", "emma"]), _Catalog(["alien", "dune (1984)"])
    assert books.search.function.__self__ is books and films.search.function.__self__ is films
    calls = [{"name": "search", "args": {"query": "dune"}}, {"name": "count", "args": {}}]
    for catalog, expected in [(books, ["dune", "2"]), (films, ["dune (1984)", "2"])]:
        agent = Agent(ScriptedModel([{"tool_calls": calls}, "done"]), tools=[catalog.search, catalog.count])
        assert _observations(await agent.run("find dune")) == expected
    assert await _catalog_invoke(_Catalog.kinds) == "book, film"
    assert await _catalog_invoke(books.kinds) == "book, film"
    assert await _catalog_invoke(_Catalog.shout, text="hi") == "HI"

    with pytest.raises(
        ConfigurationError, match=r"'search' is a method of _Catalog: .*\(_Catalog\(\.\.\.\)\.search\)"
    ):
        Agent(ScriptedModel(["done"]), tools=[_Catalog.search])  # the class's: no instance to call it on
    with pytest.raises(ConfigurationError, match=r"'lookup' is a method of _Catalog"):
        tool(_Catalog.lookup)  # was: a tool with a "self" parameter
    assert tool(books.lookup).parameters["properties"].keys() == {"sku"}
    with pytest.raises(ConfigurationError, match=r"Tool\('shout'\) is a tool already: use it as it is"):
        tool(timeout=5)(_Catalog.shout)  # was: "cannot read the type hints of tool function 'Tool'"


def _catalog_properties() -> dict[str, list[str]]:
    tools = [_Catalog.search, _Catalog.count, _Catalog.kinds, _Catalog.shout]
    return {t.name: list(t.parameters["properties"]) for t in tools}


async def _catalog_invoke(t: Tool, **arguments: Any) -> Any:
    return await t.invoke(t.validate(arguments))


def test_two_tools_of_one_name_are_refused_saying_whose_they_are_and_what_to_do() -> None:
    with pytest.raises(ConfigurationError) as caught:
        ToolRegistry([add, add])
    assert (
        str(caught.value)
        == "two tools are named 'add' (the same tool, given twice): tool names must be unique"
    )
    with pytest.raises(ConfigurationError) as caught:
        ToolRegistry([add, Tool("add", "Add.", None, sum)])
    assert str(caught.value) == (
        f"two tools are named 'add' ({__name__}.add and builtins.sum): tool names must be unique; "
        "give one another name (tool(name=...))"
    )


def test_the_fields_of_an_object_parameter_sent_flat_are_taken_as_that_object() -> None:
    @tool
    def forecast(place: _Place, days: int = 1) -> str:
        """Forecast."""
        return f"{place.city} for {days} days"

    @tool
    def area(size: _Size | None) -> float:
        """Area."""
        return size.w * size.h if size else 0.0

    @tool
    def move(to: _Target) -> str:
        """Move."""
        return str(to)

    oslo = _Place(city="Oslo", country="NO")
    # small models write the fields of the one object parameter as the arguments themselves
    assert forecast.validate({"city": "Oslo", "country": "NO"}) == {"place": oslo, "days": 1}
    assert forecast.validate({"city": "Oslo", "country": "NO", "days": 3}) == {"place": oslo, "days": 3}
    assert area.validate({"w": 2, "h": "3"}) == {"size": _Size(w=2.0, h=3.0)}
    assert move.validate({"x": 1, "y": 2}) == {"to": {"x": 1, "y": 2}}
    with pytest.raises(ToolArgumentsError) as caught:
        forecast.validate({"city": "Oslo"})  # taken as the place, and told what the place lacks
    assert str(caught.value) == "place.country: required, not given"
    with pytest.raises(ToolArgumentsError) as caught:
        forecast.validate({"city": "Oslo", "country": "NO", "when": "now"})  # not all the place's fields
    assert str(caught.value) == (  # several unknown arguments: none is said to mean the place
        "place: required, not given; city: no such argument; country: no such argument; when: no such argument"
    )
    assert asyncio.run(_run_once(forecast, {"city": "Oslo", "country": "NO"})) == ["Oslo for 1 days"]


def test_a_description_longer_than_model_apis_accept_is_refused_when_the_tool_is_made() -> None:
    def report(day: str) -> str:
        return day

    report.__doc__ = "Report. " + "Very detailed. " * 80 + "\n\nArgs:\n    day: the day."
    with pytest.raises(ConfigurationError) as caught:
        tool(report)  # was accepted: then every request to OpenAI failed with 400 string_above_max_length
    assert str(caught.value) == (
        "the description of tool 'report' has 1,207 characters, more than the 1,024 model APIs accept "
        "(OpenAI refuses the request): shorten the docstring before its first section (Args:), move "
        "details into the parameters' docs, or pass tool(description=...)"
    )
    with pytest.raises(ConfigurationError, match="has 1,025 characters"):
        tool(description="x" * 1025)(report)
    assert len(tool(description="x" * 1024)(report).description) == 1024


def test_a_text_in_annotated_documents_the_parameter() -> None:
    @tool
    def convert(
        amount: Annotated[float, "the amount to convert"],
        to: Annotated[str, Field(min_length=3), "an ISO 4217 code"] = "EUR",
        rounding: Annotated[int, "ignored: the docstring says more"] = 2,
    ) -> str:
        """Convert money.

        Args:
            rounding: digits after the point.
        """
        return f"{amount} {to}"

    properties = convert.parameters["properties"]
    assert properties["amount"] == {"type": "number", "description": "the amount to convert"}  # was lost
    assert properties["to"] == {
        "type": "string",
        "minLength": 3,
        "default": "EUR",
        "description": "an ISO 4217 code",
    }
    assert properties["rounding"]["description"] == "digits after the point."


def test_the_react_prompt_shows_the_rules_and_formats_of_the_schema() -> None:
    from thinkloop._react import arguments_example

    @tool
    def schedule(
        day: datetime.date,
        at: datetime.datetime | None = None,
        people: Annotated[int, Field(ge=1, le=12)] = 2,
        budget: Annotated[float, Field(gt=0)] = 100.0,
        code: Annotated[str, Field(pattern=r"^[A-Z]{3}$", description="the room code")] = "ABC",
        name: Annotated[str, Field(min_length=2, max_length=40)] = "guest",
        notes: Annotated[list[str], Field(max_length=3)] = [],  # noqa: B006  # never changed
    ) -> str:
        """Schedule a meeting."""
        return ""

    example, complete = arguments_example(schedule.parameters)
    # was: "<string>" for the day, "<integer, optional, default 2>" — a small model saw no range or format
    assert example == (
        '{"day": "<string (date: YYYY-MM-DD)>", "at": "<string (date and time: ISO 8601, e.g. '
        '2025-01-31T14:30:00), optional>", "people": <integer, 1 to 12, optional, default 2>, '
        '"budget": <number, above 0, optional, default 100.0>, "code": "<string, matching ^[A-Z]{3}$, '
        'optional, default \\"ABC\\": the room code>", "name": "<string, 2 to 40 characters, optional, '
        'default \\"guest\\">", "notes": <list of strings, at most 3 items, optional, default []>}'
    )
    assert complete


async def test_arguments_bound_by_a_partial_are_neither_shown_to_the_model_nor_taken_from_it() -> None:
    def send(to: str, text: str, api_key: str, retries: int = 3) -> str:
        """Send a message."""
        return f"{to}: {text} ({api_key[:2]}…, {retries})"

    t = tool(functools.partial(functools.partial(send, api_key="sk-secret"), retries=5))
    assert "sk-secret" not in json.dumps(t.parameters)  # was: "api_key": {"default": "sk-secret", ...}
    assert list(t.parameters["properties"]) == ["to", "text"] and t.parameters["required"] == ["to", "text"]
    assert await t.invoke(t.validate({"to": "ada", "text": "hi"})) == "ada: hi (sk…, 5)"
    with pytest.raises(ToolArgumentsError, match="api_key: no such argument"):
        t.validate({"to": "ada", "text": "hi", "api_key": "mine"})  # the model cannot replace it


def test_a_hand_written_tool_coerces_scalars_as_pydantic_would_and_explains_like_tool() -> None:
    schema = {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "offset": {"type": "integer"},
            "ratio": {"type": "number"},
            "follow": {"type": "boolean"},
            "odd": True,  # a boolean schema: any value
        },
        "required": ["path"],
        "additionalProperties": False,
    }
    t = Tool("read", "Read.", schema, lambda **kwargs: kwargs)
    # small models send numbers and booleans as text: a @tool tool took them, a hand-written one refused
    assert t.validate({"path": "a", "offset": "100", "ratio": "0.5", "follow": "True"}) == {
        "path": "a",
        "offset": 100,
        "ratio": 0.5,
        "follow": True,
    }
    assert t.validate({"path": "a", "offset": 2.0, "odd": [1]}) == {"path": "a", "offset": 2, "odd": [1]}

    def told(arguments: dict[str, Any]) -> str:
        with pytest.raises(ToolArgumentsError) as caught:
            t.validate(arguments)
        return str(caught.value)

    assert told({}) == "path: required, not given"  # was: "missing required argument(s): path"
    assert told({"pth": "a"}) == "path: required, not given; pth: no such argument (did you mean path?)"
    assert told({"path": 3}) == "path: Input should be a string (got 3)"  # was: "expected string, got int 3"
    assert told({"path": "a", "offset": "1.5"}) == 'offset: Input should be an integer (got "1.5")'
    assert told({"path": "a", "ratio": True, "follow": "maybe"}) == (
        'ratio: Input should be a number (got true); follow: Input should be true or false (got "maybe")'
    )


def test_a_number_argument_sent_as_nan_or_infinity_text_is_refused() -> None:
    """pydantic's lax mode reads "NaN" and "inf" as floats JSON does not have: the tool got nan."""

    @tool
    def square(x: float) -> float:
        """Square a number."""
        return x * x

    for text in ["NaN", "inf", "-Infinity"]:
        with pytest.raises(ToolArgumentsError, match="finite number"):
            square.validate({"x": text})
    assert square.validate({"x": "2.5"}) == {"x": 2.5}  # a number as text is still read


async def test_a_model_that_got_the_arguments_wrong_is_shown_how_to_call_the_tool() -> None:
    # It was shown the JSON Schema of the properties ('Expected properties: {...}; required: [...]'): a small
    # model answered with a schema, or copied "type" keys into its next call.
    @tool
    def add(a: int, b: int = 2) -> int:
        """Add.

        Args:
            a: the first number.
            b: the second.
        """
        return a + b

    (wrong,) = await _run_once(add, {"b": "three"})
    assert wrong.startswith("Error: invalid arguments for add: ")
    assert wrong.endswith(
        'Call it with a JSON object like {"a": <integer: the first number.>, '
        '"b": <integer, optional, default 2: the second.>} (required: a).'
    )
    (not_json,) = await _run_once(add, '{"a": 1,')
    assert not_json.startswith("Error: the arguments of add were not a JSON object: ")
    assert "Call it with a JSON object like {" in not_json

    @tool
    def nothing_needed(verbose: bool = False) -> str:
        """Say nothing."""
        return ""

    (optional,) = await _run_once(nothing_needed, {"verbose": "loud"})
    assert optional.endswith("(every argument is optional).")


async def test_what_placeholders_cannot_say_is_shown_as_the_schema_after_them() -> None:
    @tool
    def pick(item: int | _Place) -> str:
        """Pick by number or by place."""
        return str(item)

    (wrong,) = await _run_once(pick, {"item": "x"})
    example = wrong.split("Call it with a JSON object like ", 1)[1]
    assert example.startswith('{"item": ') and "(required: item). Its properties' JSON Schema: " in example
    assert (
        '"anyOf"' in example and '"city"' in example
    )  # a union with an object: its fields are in the schema


async def test_a_generator_tool_yielding_for_ever_is_stopped_at_the_item_cap_and_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Python yields millions of items a second: collected until the call's time limit, an endless
    generator filled the memory first. The items past the cap are not taken, and the model is told."""
    monkeypatch.setattr(_tools, "MAX_ITEMS", 5)
    closed: list[str] = []

    @tool
    def endless() -> Iterator[str]:
        """Yield for ever."""
        try:
            while True:
                yield "x"
        finally:
            closed.append("sync")

    @tool
    async def endless_async() -> AsyncIterator[int]:
        """Yield for ever, never awaiting."""
        try:
            while True:
                yield 1
        finally:
            closed.append("async")

    @tool
    def exactly(n: int) -> Iterator[str]:
        """Yield n lines."""
        for i in range(n):
            yield f"line {i}"

    note = "(stopped after 5 items: the tool yields more; ask it for fewer)"
    assert render_output(await asyncio.wait_for(endless.invoke({}), 30)) == "\n".join(["x"] * 5 + [note])
    assert await asyncio.wait_for(endless_async.invoke({}), 30) == [1, 1, 1, 1, 1, note]
    assert render_output(await exactly.invoke({"n": 5})).splitlines() == [f"line {i}" for i in range(5)]
    assert closed == ["sync", "async"]
    model = ScriptedModel([{"tool_calls": [{"name": "endless", "args": {}}]}, "done"])
    result = await asyncio.wait_for(Agent(model, tools=[endless]).run("go"), timeout=30)
    assert [e.output for e in result.state.ledger.values()][0].endswith(note)
