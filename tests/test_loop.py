"""Every path of the Think → Act → Observe loop, driven by the scripted and function models."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest

from thinkloop import (
    Agent,
    Budget,
    ConfigurationError,
    ModelError,
    ModelRequest,
    ModelResponse,
    Price,
    PriceTable,
    RiskLevel,
    RunState,
    StateError,
    StopReason,
    Tool,
    ToolCall,
    Usage,
    UserError,
    tool,
)
from thinkloop._events import Done, Event, ModelCalled
from thinkloop.models import OpenAIModel
from thinkloop.stores import SQLiteStore
from thinkloop.testing import FunctionModel, Reply, ScriptedModel
from thinkloop.tools.calculator import calculator


def call(name: str, **args: object) -> dict[str, object]:
    return {"tool_calls": [{"name": name, "args": args}]}


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def test_native_tool_call_then_answer_transcript() -> None:
    model = ScriptedModel([call("add", a=2, b=3), "The answer is 5."])
    events: list[Event] = []
    result = await Agent(model, tools=[add]).run("What is 2+3?", on_event=events.append)

    assert result.output == "The answer is 5."
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert (result.steps, result.tool_calls, result.forced_final) == (2, 1, False)
    assert [(m.role, m.content) for m in result.state.messages] == [
        ("user", "What is 2+3?"),
        ("assistant", ""),
        ("tool", "5"),
        ("assistant", "The answer is 5."),
    ]
    assert result.state.messages[2].tool_call_id == result.state.messages[1].tool_calls[0].id
    assert [e.type for e in events] == [
        "run_started", "progress", "model_call", "tool_call", "tool_result", "progress", "model_call", "done",
    ]  # fmt: skip
    assert [e.seq for e in events] == list(range(1, 9))
    calls = [e for e in events if isinstance(e, ModelCalled)]
    assert [(c.step, c.model, c.provider, c.tool_calls, c.final) for c in calls] == [
        (1, "script", "test", 1, False), (2, "script", "test", 0, False),
    ]  # fmt: skip
    assert all(c.duration >= 0 and c.input_tokens > 0 and c.estimated for c in calls)
    assert sum(c.input_tokens + c.output_tokens for c in calls) == result.usage.total_tokens
    assert all(e.run_id == result.run_id for e in events)
    model.assert_used_up()
    # the model saw the tools and the tool result
    second = model.requests[1]
    assert [t.name for t in second.tools] == ["add"]
    assert second.messages[0].role == "system" and second.messages[-1].role == "tool"


async def test_react_mode_for_models_without_tools() -> None:
    model = ScriptedModel(
        [
            'Thought: I need to add.\nAction: add\nAction Input: {"a": 2, "b": 3}',
            "Thought: done\nFinal Answer: 5",
        ],
        tools=False,
    )
    result = await Agent(model, tools=[add]).run("What is 2+3?")
    assert result.output == "5"
    assert result.state.mode == "react"
    first, second = model.requests
    assert first.tools == [] and "\nObservation:" in first.settings.stop
    assert "Action Input:" in first.messages[0].content  # the ReAct format is in the system prompt
    assert second.messages[-1].content == "Observation: 5"  # the result came back as an observation
    assert second.messages[-2].content.startswith("Thought: I need to add.\nAction: add")


async def test_react_prefill_is_prepended_for_models_that_support_it() -> None:
    model = ScriptedModel([" done\nFinal Answer: ok"], tools=False, prefill=True)
    result = await Agent(model, tools=[add]).run("go")
    assert model.requests[0].prefill == "Thought:"
    assert result.output == "ok"


async def test_parallel_calls_run_concurrently_and_each_is_answered() -> None:
    started: list[str] = []
    both_started = asyncio.Event()

    @tool
    async def fetch(key: str) -> str:
        """Fetch a key."""
        started.append(key)
        if len(started) == 2:
            both_started.set()
        await asyncio.wait_for(both_started.wait(), 2)  # deadlocks unless both run at once
        return f"value-{key}"

    model = ScriptedModel(
        [
            {
                "tool_calls": [
                    {"name": "fetch", "args": {"key": "a"}},
                    {"name": "fetch", "args": {"key": "b"}},
                ]
            },
            "done",
        ]
    )
    result = await Agent(model, tools=[fetch]).run("fetch a and b")
    tool_msgs = [m for m in result.state.messages if m.role == "tool"]
    assert [(m.tool_call_id, m.content) for m in tool_msgs] == [
        ("call_0_0", "value-a"),
        ("call_0_1", "value-b"),
    ]
    assert result.tool_calls == 2


async def test_unknown_tool_and_invalid_arguments_become_observations() -> None:
    model = ScriptedModel(
        [
            call("nope"),
            call("add", a="x", b=1),
            {"tool_calls": [{"name": "add", "args": "{not json"}]},
            call("add", a=1, b=1),
            "2",
        ]
    )
    result = await Agent(model, tools=[add]).run("1+1")
    outputs = [m.content for m in result.state.messages if m.role == "tool"]
    assert outputs[0].startswith("Error: there is no tool named 'nope'. Available tools: add.")
    assert "invalid arguments for add: a: Input should be a valid integer" in outputs[1]
    assert "were not a JSON object" in outputs[2]
    assert outputs[3] == "2" and result.output == "2"


async def test_tool_exception_and_timeout_become_observations() -> None:
    @tool
    def boom() -> str:
        """Fail."""
        raise RuntimeError("disk on fire")

    @tool(timeout=0.05)
    async def slow() -> str:
        """Hang."""
        await asyncio.sleep(10)
        return "never"

    model = ScriptedModel([call("boom"), call("slow"), "gave up"])
    result = await Agent(model, tools=[boom, slow]).run("try")
    outputs = [m.content for m in result.state.messages if m.role == "tool"]
    assert outputs == [
        "Error: boom raised RuntimeError: disk on fire",
        "Error: slow was abandoned: it timed out after 0.05 s.",
    ]
    assert result.output == "gave up"


async def test_a_coroutine_a_tool_returned_instead_of_awaiting_it_is_awaited(
    recwarn: pytest.WarningsRecorder,
) -> None:
    """`return fetch(city)` for `return await fetch(city)` (or a sync tool handing back an async call): the
    model is shown the result, not `<coroutine object …>` — and nothing warns of a coroutine never awaited."""

    async def fetch(city: str) -> str:
        await asyncio.sleep(0)
        return f"sunny in {city}"

    async def again(city: str) -> object:
        return fetch(city)  # a coroutine returning one in turn

    @tool
    def weather(city: str) -> object:
        """The weather (a sync function returning an async call)."""
        return fetch(city)

    @tool
    async def forecast(city: str) -> object:
        """The forecast (forgot an await, twice)."""
        return again(city)

    @tool(timeout=0.05)
    def stuck() -> object:
        """Returns a coroutine that never ends."""
        return asyncio.sleep(10)

    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "weather", "args": {"city": "Oslo"}}]},
            {"tool_calls": [{"name": "forecast", "args": {"city": "Rome"}}]},
            call("stuck"),
            "done",
        ]
    )
    result = await Agent(model, tools=[weather, forecast, stuck]).run("x")
    outputs = [m.content for m in result.state.messages if m.role == "tool"]
    assert outputs == [
        "sunny in Oslo",
        "sunny in Rome",
        "Error: stuck was abandoned: it timed out after 0.05 s.",  # under the call's own time limit
    ]
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


async def test_a_tool_that_catches_its_timeout_and_answers_late_has_timed_out() -> None:
    """A late result is no success: the call was past its time limit (and its result is not used)."""

    @tool(timeout=0.05)
    async def stubborn() -> str:
        """Ignore the first cancellation."""
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # goes on after being told to stop
        return "late"

    model = ScriptedModel([call("stubborn"), "gave up"])
    result = await Agent(model, tools=[stubborn]).run("try")
    outputs = [m.content for m in result.state.messages if m.role == "tool"]
    assert outputs == ["Error: stubborn was abandoned: it timed out after 0.05 s."]
    entry = next(iter(result.state.ledger.values()))
    assert (entry.success, entry.error_kind) == (False, "timeout")
    assert result.output == "gave up" and result.stop_reason is StopReason.FINAL_ANSWER


async def test_a_tool_that_swallows_every_cancellation_is_stopped_after_a_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bare `except:` around an `await`, retried forever: the time limit still ends the call."""
    from thinkloop import _aio

    monkeypatch.setattr(_aio, "CANCEL_GRACE", 0.05)
    stopped = []

    @tool(timeout=0.05)
    async def stubborn() -> str:
        """Never give up."""
        try:
            while True:
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    continue
        finally:
            stopped.append(True)  # closed where it waited: its cleanup ran

    @tool(timeout=0.05)
    async def unstoppable() -> str:
        """Not even when closed."""
        while True:
            try:
                await asyncio.sleep(10)
            except BaseException:  # noqa: B036 - the fault under test: GeneratorExit too
                continue

    model = ScriptedModel([call("stubborn"), call("unstoppable"), "gave up"])
    result = await asyncio.wait_for(Agent(model, tools=[stubborn, unstoppable]).run("try"), timeout=30)
    outputs = [m.content for m in result.state.messages if m.role == "tool"]
    assert outputs == [
        "Error: stubborn was abandoned: it timed out after 0.05 s.",
        "Error: unstoppable was abandoned: it timed out after 0.05 s.",
    ]
    assert stopped == [True] and result.output == "gave up"


async def test_a_run_cancelled_while_a_tool_swallows_cancellations_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from thinkloop import _aio

    monkeypatch.setattr(_aio, "CANCEL_GRACE", 0.05)
    started = asyncio.Event()

    @tool
    async def stubborn() -> str:
        """Never give up."""
        started.set()
        while True:
            try:
                await asyncio.sleep(10)
            except BaseException:  # noqa: B036 - the fault under test
                continue

    agent = Agent(ScriptedModel([call("stubborn"), "never"]), tools=[stubborn])
    task = asyncio.create_task(agent.run("try"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=30)


_STUBBORN_SCRIPT = """
import asyncio
from thinkloop import Agent, _aio, tool
from thinkloop.testing import ScriptedModel

_aio.CANCEL_GRACE = 0.05


@tool(timeout=0.05)
async def unstoppable() -> str:
    \"\"\"Not even when closed.\"\"\"
    while True:
        try:
            await asyncio.sleep(10)
        except BaseException:
            continue


result = Agent(ScriptedModel([{"tool_calls": [{"name": "unstoppable", "args": {}}]}, "gave up"]),
               tools=[unstoppable]).run_sync("x")
print(result.output)
"""


def test_a_process_whose_tool_ignored_being_closed_still_exits(tmp_path: Path) -> None:
    """The abandoned coroutine is never collected: closed again at interpreter exit, with no event loop,
    its `await asyncio.sleep` raised at once, it caught that and went round for ever — the process hung
    after its work was done (this test suite did, after its last test)."""
    import subprocess
    import sys

    script = tmp_path / "stubborn.py"
    script.write_text(_STUBBORN_SCRIPT, encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "gave up"), done.stderr


async def test_a_tool_that_returns_empty_or_blank_text_is_shown_as_no_output() -> None:
    # The model was sent an empty tool message: small models took it for a failure, or repeated the call.
    @tool
    def quiet(blank: bool) -> str:
        """Say nothing."""
        return "  \n" if blank else ""

    @tool
    async def quiet_async() -> str:
        """Say nothing, asynchronously."""
        await asyncio.sleep(0)
        return ""

    model = ScriptedModel(
        [
            {
                "tool_calls": [
                    {"name": "quiet", "args": {"blank": False}},
                    {"name": "quiet", "args": {"blank": True}},
                ]
            },
            {"tool_calls": [{"name": "quiet_async", "args": {}}]},
            "done",
        ]
    )
    result = await Agent(model, tools=[quiet, quiet_async]).run("go")
    outputs = [m.content for m in result.state.messages if m.role == "tool"]
    assert outputs == ["(no output)"] * 3 and result.output == "done"


async def test_long_output_is_truncated_keeping_head_and_tail() -> None:
    @tool
    def dump() -> str:
        """Dump."""
        return "HEAD" + "x" * 50_000 + "TAIL"

    result = await Agent(ScriptedModel([call("dump"), "ok"]), tools=[dump], output_max_length=1000).run(
        "dump"
    )
    out = next(m.content for m in result.state.messages if m.role == "tool")
    assert (
        len(out) <= 1000 and out.startswith("HEAD") and out.endswith("TAIL") and "truncated of 50008" in out
    )


async def test_empty_reply_ends_with_empty_answer() -> None:
    result = await Agent(ScriptedModel([""])).run("say nothing")
    assert (result.output, result.stop_reason) == ("", StopReason.FINAL_ANSWER)


async def test_max_steps_gets_a_best_effort_final_answer() -> None:
    def model_fn(request: ModelRequest) -> object:
        if not request.tools:  # the final-answer call has no tools
            return "best effort: 5"
        return call("add", a=request.turn, b=1)

    result = await Agent(FunctionModel(model_fn), tools=[add], budget=Budget(max_steps=3)).run("loop")
    assert result.stop_reason is StopReason.MAX_STEPS
    assert result.forced_final and result.output == "best effort: 5"
    assert result.steps == 3 and "step limit of 3" in (result.error or "")
    assert result.state.messages[-2].kind == "final_prompt"


async def test_final_answer_call_can_be_disabled() -> None:
    model = FunctionModel(lambda r: call("add", a=r.turn, b=1))
    result = await Agent(model, tools=[add], budget=Budget(max_steps=2), final_answer_on_stop=False).run(
        "loop"
    )
    assert result.stop_reason is StopReason.MAX_STEPS and not result.forced_final
    assert result.output == "2"  # the last useful observation (1 + 1) is kept as the answer


async def test_max_tokens_and_max_cost() -> None:
    model = FunctionModel(lambda r: call("add", a=r.turn, b=1) if r.tools else "partial")
    result = await Agent(model, tools=[add], budget=Budget(max_tokens=300)).run("x" * 600)
    assert result.stop_reason is StopReason.MAX_TOKENS and result.usage.total_tokens >= 300

    prices = PriceTable({"function": Price(1_000_000.0, 0.0)})  # $1 per input token
    model = FunctionModel(lambda r: call("add", a=r.turn, b=1) if r.tools else "partial")
    result = await Agent(model, tools=[add], budget=Budget(max_cost=500.0), price_table=prices).run("x" * 600)
    assert result.stop_reason is StopReason.MAX_COST and result.usage.cost >= 500


def test_a_price_table_changed_after_a_lookup_prices_by_its_new_prices() -> None:
    """The looked-up price was kept while the table kept its size: a changed price went unseen, and a
    `max_cost` budget was enforced with the old one."""
    given = {"function": Price(0.0, 0.0)}
    table = PriceTable(given)
    assert table.cost("function", 1_000_000, 0) == 0.0
    table.prices["function"] = Price(2.0, 0.0)
    assert table.cost("function", 1_000_000, 0) == 2.0
    table.prices.update({"function-x": Price(5.0, 0.0)})  # a longer prefix of the name
    assert table.cost("function-x1", 1_000_000, 0) == 5.0 and table.price("function-y") == Price(2.0, 0.0)
    del table.prices["function-x"]
    table.prices.setdefault("function-x", Price(7.0, 0.0))
    assert table.cost("function-x1", 1_000_000, 0) == 7.0
    table.prices = {"function": Price(3.0, 0.0)}
    assert table.cost("function-x1", 1_000_000, 0) == 3.0
    table.prices.clear()
    assert table.price("function") is None and table.cost("function", 10, 10) == 0.0
    assert given == {"function": Price(0.0, 0.0)}  # the caller's dict is its own
    assert table == PriceTable({}) and "function" not in repr(table)


@pytest.mark.parametrize(
    ("limits", "says"),
    [
        ({"max_steps": 0}, "max_steps must be an integer of at least 1, got 0"),
        ({"max_steps": 2.5}, "max_steps must be an integer"),
        ({"max_steps": True}, "max_steps must be an integer"),
        ({"max_steps": "8"}, "max_steps must be an integer"),
        ({"max_tokens": 0}, "max_tokens must be a positive integer or None"),
        ({"max_tokens": 1e9}, "max_tokens must be a positive integer"),
        ({"timeout": float("nan")}, "timeout must be a positive, finite number of seconds"),
        ({"timeout": float("inf")}, "timeout must be a positive, finite number"),
        ({"timeout": -1}, "timeout must be a positive"),
        ({"timeout": "30"}, "timeout must be a positive"),
        ({"max_cost": float("inf")}, "max_cost must be a positive, finite number of dollars"),
        ({"max_cost": float("nan")}, "max_cost must be a positive, finite number"),
    ],
)
def test_budget_refuses_limits_that_are_not_limits(limits: dict[str, Any], says: str) -> None:
    """nan compared false with everything (a NaN timeout never stopped a run), inf meant "no limit" in
    disguise, and a string or a float step count failed later with a bare TypeError."""
    with pytest.raises(ConfigurationError, match=f"Budget.{says}"):
        Budget(**limits)
    assert Budget(max_steps=3, max_tokens=10, max_cost=0.5, timeout=2).timeout == 2


async def test_timeout_stops_a_hanging_model() -> None:
    model = ScriptedModel(["late"], latency=5)
    result = await Agent(model, budget=Budget(timeout=0.1)).run("hurry")
    assert result.stop_reason is StopReason.TIMEOUT
    assert "time limit" in (result.error or "")


async def test_model_error_stops_with_error_and_keeps_state() -> None:
    def failing(request: ModelRequest) -> object:
        if request.turn == 1:
            raise ModelError("HTTP 400 bad request", provider="acme")
        return call("add", a=1, b=2)

    result = await Agent(FunctionModel(failing), tools=[add]).run("x")
    assert result.stop_reason is StopReason.ERROR
    assert result.error == "acme: model request failed: HTTP 400 bad request"
    assert [m.content for m in result.state.messages if m.role == "tool"] == ["3"]  # work so far kept


async def test_self_healing_then_giving_up() -> None:
    bad = "Thought:"  # no action, no answer
    healed = await Agent(ScriptedModel([bad, bad, "Final Answer: ok"], tools=False), tools=[add]).run("x")
    assert healed.output == "ok"
    assert [m.kind for m in healed.state.messages].count("correction") == 2

    failed = await Agent(ScriptedModel([bad] * 4, tools=False), tools=[add]).run("x")
    assert failed.stop_reason is StopReason.ERROR
    assert "could not be understood" in (failed.error or "")
    assert [m.kind for m in failed.state.messages].count("correction") == 3


async def test_cancelled_run_records_its_state() -> None:
    asked = asyncio.Event()

    async def wait(request: ModelRequest) -> str:
        asked.set()
        await asyncio.sleep(10)
        return "never"

    agent = Agent(FunctionModel(wait))
    events: list[Event] = []
    task = asyncio.create_task(agent.run("wait", on_event=events.append))
    await asyncio.wait_for(asked.wait(), 30)  # the run waits in the model (a fixed sleep may end before)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    done = events[-1]
    assert isinstance(done, Done) and done.result.stop_reason is StopReason.CANCELLED


async def test_stream_yields_events_and_answer_deltas() -> None:
    agent = Agent(ScriptedModel([call("add", a=1, b=2), "The sum is 3."], stream_chunk=4), tools=[add])
    events = [e async for e in agent.stream("1+2")]
    types = [e.type for e in events]
    assert types[0] == "run_started" and types[-1] == "done"
    assert "".join(e.text for e in events if e.type == "answer_delta") == "The sum is 3."  # type: ignore[union-attr]
    last = events[-1]
    assert isinstance(last, Done) and last.result.output == "The sum is 3."


async def test_stream_consumer_that_stops_cancels_the_run_cleanly() -> None:
    agent = Agent(FunctionModel(lambda r: call("add", a=1, b=r.turn), latency=0.01), tools=[add])
    before = len(asyncio.all_tasks())
    stream = agent.stream("forever")
    async for event in stream:
        if event.type == "tool_result":
            break
    await stream.aclose()  # type: ignore[attr-defined]
    await asyncio.sleep(0)
    assert len(asyncio.all_tasks()) == before  # no leaked run task


async def test_react_streams_only_the_final_answer() -> None:
    agent = Agent(
        ScriptedModel(["Thought: easy\nFinal Answer: forty-two"], tools=False, stream_chunk=3), tools=[add]
    )
    deltas = [e.text async for e in agent.stream("q") if e.type == "answer_delta"]  # type: ignore[union-attr]
    assert "".join(deltas).strip() == "forty-two"


async def test_one_agent_serves_many_concurrent_runs() -> None:
    def model_fn(request: ModelRequest) -> object:
        goal = request.messages[1].content
        n = int(goal.split()[-1])
        if request.messages[-1].role == "tool":
            return f"answer {request.messages[-1].content}"
        return call("add", a=n, b=n)

    agent = Agent(FunctionModel(model_fn, latency=0.001), tools=[add])
    results = await asyncio.gather(*(agent.run(f"double {i}") for i in range(50)))
    assert [r.output for r in results] == [f"answer {2 * i}" for i in range(50)]
    assert len({r.run_id for r in results}) == 50


async def test_state_round_trips_through_json_exactly() -> None:
    result = await Agent(ScriptedModel([call("add", a=2, b=3), "5"]), tools=[add, calculator]).run("2+3")
    text = result.state.to_json()
    again = RunState.from_json(text)
    assert again == result.state and again.to_json() == text
    assert json.loads(text)["schema_version"] == 1


def test_newer_or_corrupt_state_is_refused() -> None:
    with pytest.raises(StateError, match="newer than this thinkloop supports"):
        RunState.from_json(json.dumps({"schema_version": 99, "unknown_field": 1}))
    with pytest.raises(StateError, match="corrupt run state"):
        RunState.from_json('{"messages": 3}')


async def test_run_sync_refuses_a_running_loop() -> None:
    with pytest.raises(UserError, match="await agent.run"):
        Agent(ScriptedModel(["x"])).run_sync("hi")


def test_run_sync_works_without_a_loop() -> None:
    assert Agent(ScriptedModel(["hello"])).run_sync("hi").output == "hello"


@pytest.mark.parametrize("sync", ["run_sync", "resume_sync"])
def test_errors_out_of_the_sync_wrappers_do_not_carry_the_loop_probe(sync: str, tmp_path: Path) -> None:
    # the run ran inside the `except RuntimeError` of the check for a running loop: every error it
    # raised (and every traceback logged during it) began with "RuntimeError: no running event loop"
    path = tmp_path / "runs.db"
    path.write_bytes(b"not a database" * 100)
    agent = Agent(ScriptedModel(["x"]), store=SQLiteStore(path))
    with pytest.raises(StateError) as caught:
        agent.run_sync("goal") if sync == "run_sync" else agent.resume_sync("some-run")
    chain: list[BaseException] = []
    error: BaseException | None = caught.value
    while error is not None and len(chain) < 20:
        chain.append(error)
        error = error.__context__
    assert not any(isinstance(link, RuntimeError) for link in chain), chain


async def test_bad_goal_is_a_user_error() -> None:
    with pytest.raises(UserError, match="non-empty string"):
        await Agent(ScriptedModel(["x"])).run("   ")


async def test_tool_returning_objects_is_rendered_as_json() -> None:
    t = Tool("info", "Info.", None, lambda: {"cpu": 3, "ok": True})
    result = await Agent(ScriptedModel([call("info"), "fine"]), tools=[t]).run("info")
    assert next(m.content for m in result.state.messages if m.role == "tool") == '{"cpu": 3, "ok": true}'


async def test_run_timeout_also_bounds_a_running_tool() -> None:
    @tool
    async def sleepy() -> str:
        """Sleep a long time."""
        await asyncio.sleep(30)
        return "woke"

    model = ScriptedModel([call("sleepy")])
    result = await Agent(model, tools=[sleepy], budget=Budget(timeout=0.2)).run("nap")
    assert result.stop_reason is StopReason.TIMEOUT
    assert result.duration < 5
    out = next(m.content for m in result.state.messages if m.role == "tool")
    assert out == "Error: sleepy was abandoned: the run's time limit was reached."


async def test_tool_output_with_broken_unicode_keeps_the_state_serialisable() -> None:
    t = Tool("bad", "Bad text.", None, lambda: "half an emoji \ud83d", in_thread=False)
    result = await Agent(ScriptedModel([call("bad"), "ok"]), tools=[t]).run("go")
    assert RunState.from_json(result.state.to_json()) == result.state


def test_context_limit_leaves_room_for_the_reply_in_the_models_window() -> None:
    from thinkloop.models import ModelCapabilities

    small = ScriptedModel(["x"])
    small.capabilities = ModelCapabilities(context_window=8192)
    assert Agent(small)._context_limit() == 8192 - 2048  # a quarter of the window for the reply
    assert Agent(small, max_context_tokens=4000)._context_limit() == 4000
    assert Agent(ScriptedModel(["x"]))._context_limit() == 8000  # no declared window: the setting


async def test_transient_model_failures_are_retried_with_the_providers_delay() -> None:
    from thinkloop import ModelRetryableError

    failures = iter(
        [
            ModelRetryableError("HTTP 429", provider="acme", retry_after=0.01),
            ModelRetryableError("HTTP 429", provider="acme", retry_after=0.0),  # retry at once, not backoff
            None,
        ]
    )

    def flaky(request: ModelRequest) -> object:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return "fine"

    events: list[Event] = []
    result = await Agent(FunctionModel(flaky)).run("hi", on_event=events.append)
    assert result.output == "fine"
    attempts = [e for e in events if e.type == "model_attempt"]
    assert [(a.attempt, a.next_action, a.delay) for a in attempts] == [(1, "retry", 0.01), (2, "retry", 0.0)]  # type: ignore[union-attr]


async def test_retries_are_bounded_and_permanent_errors_are_not_retried() -> None:
    from thinkloop import ModelRetryableError

    calls: list[int] = []

    def down(request: ModelRequest) -> object:
        calls.append(request.turn)
        raise ModelRetryableError("HTTP 503", provider="acme", retry_after=0.001)

    result = await Agent(FunctionModel(down), model_retries=2).run("hi")
    assert result.stop_reason is StopReason.ERROR and len(calls) == 3 and "HTTP 503" in (result.error or "")

    calls.clear()

    def bad(request: ModelRequest) -> object:
        calls.append(request.turn)
        raise ModelError("HTTP 400", provider="acme")

    result = await Agent(FunctionModel(bad)).run("hi")
    assert result.stop_reason is StopReason.ERROR and len(calls) == 1


async def test_test_doubles_can_run_without_keeping_a_request_log() -> None:
    model = FunctionModel(lambda request: "done", record=False)
    scripted = ScriptedModel(["done"], record=False)
    assert (await Agent(model).run("go")).output == "done"
    assert (await Agent(scripted).run("go")).output == "done"
    assert model.requests == [] and scripted.requests == []
    scripted.assert_used_up()


@pytest.mark.parametrize(
    ("reply", "answer"),
    [
        ("The answer is 42.", "The answer is 42."),
        ("Thought: I can answer now.\nFinal Answer: 42", "42"),
        ("<think>6 times 7 is 42, let me double-check… yes.</think>\n\n42", "42"),
        ("6 times 7, so 42.</think>\nThe answer is 42.", "The answer is 42."),  # opening tag in the template
        ("<THINK>hmm</THINK>Final answer: 42", "42"),
        (
            "<think>still reasoning about 6*7 when the reply was cut",
            "still reasoning about 6*7 when the reply was cut",
        ),
        ("Final Answer:", "Final Answer:"),  # a label with nothing after it is kept as written
    ],
)
def test_a_native_final_answer_drops_reasoning_blocks_and_labels(reply: str, answer: str) -> None:
    result = Agent(FunctionModel(lambda request: reply)).run_sync("What is 6*7?")
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.output == answer


async def test_async_tools_that_wait_are_driven_to_the_end_like_an_await() -> None:
    """A coroutine tool is started eagerly; one that waits goes on under its deadline, with everything the
    event loop sends or throws in passed through (results, exceptions after a wait, handled cancellations)."""
    log: list[str] = []

    @tool
    async def instant(x: int) -> int:
        """No wait."""
        return x * 2

    @tool
    async def several_waits(n: int) -> str:
        """Wait n times, with a value passed back each time."""
        total = 0
        for i in range(n):
            await asyncio.sleep(0)
            total += await asyncio.sleep(0.001, result=i)
        return f"waited {n}, sum {total}"

    @tool
    async def fails_later() -> str:
        """Raise after waiting."""
        await asyncio.sleep(0.001)
        raise ValueError("late failure")

    @tool(timeout=0.05)
    async def stubborn() -> str:
        """Hang, clean up when abandoned."""
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            log.append("cleaned up")
            raise
        return "never"

    model = ScriptedModel(
        [call("instant", x=4), call("several_waits", n=3), call("fails_later"), call("stubborn"), "done"]
    )
    result = await Agent(model, tools=[instant, several_waits, fails_later, stubborn]).run("go")
    outputs = [m.content for m in result.state.messages if m.role == "tool"]
    assert outputs == [
        "8",
        "waited 3, sum 3",
        "Error: fails_later raised ValueError: late failure",
        "Error: stubborn was abandoned: it timed out after 0.05 s.",
    ]
    assert log == ["cleaned up"] and result.output == "done"


async def test_cancelling_a_run_reaches_a_waiting_tool() -> None:
    entered, cancelled = asyncio.Event(), asyncio.Event()

    @tool
    async def wait_forever() -> str:
        """Wait."""
        entered.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    task = asyncio.create_task(Agent(ScriptedModel([call("wait_forever")]), tools=[wait_forever]).run("go"))
    await asyncio.wait_for(entered.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled.is_set()


async def test_a_listener_that_raises_is_dropped_and_the_run_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[str] = []
    good: list[str] = []

    def buggy(event: Event) -> None:
        seen.append(event.type)
        if event.type == "tool_call":
            raise RuntimeError("listener bug")

    agent = Agent(
        ScriptedModel([call("add", a=1, b=2), "3"]), tools=[add], on_event=lambda e: good.append(e.type)
    )
    with caplog.at_level("ERROR", logger="thinkloop.events"):
        result = await agent.run("1+2", on_event=buggy)
    assert result.stop_reason is StopReason.FINAL_ANSWER and result.output == "3" and result.tool_calls == 1
    assert seen[-1] == "tool_call" and "done" not in seen  # called no more after it raised
    assert good[-1] == "done" and "tool_result" in good  # the other listener got everything
    assert "listener bug" in caplog.text and "gets no more events" in caplog.text


def test_tools_may_be_none_or_a_single_tool_but_not_a_string() -> None:
    assert Agent(ScriptedModel(["x"]), tools=None).tools.names == []
    assert Agent(ScriptedModel(["x"]), tools=add).tools.names == ["add"]
    with pytest.raises(UserError, match="tools must be a list"):
        Agent(ScriptedModel(["x"]), tools="add")  # type: ignore[arg-type]


async def test_a_tool_calling_sys_exit_is_a_failed_call_not_the_end_of_the_process() -> None:
    import sys

    @tool
    def quits() -> str:
        """Exit."""
        sys.exit(3)

    @tool
    async def quits_later() -> str:
        """Exit after a wait."""
        await asyncio.sleep(0.001)
        raise SystemExit("bye")

    result = await Agent(
        ScriptedModel([call("quits"), call("quits_later"), "still here"]), tools=[quits, quits_later]
    ).run("x")
    outputs = [m.content for m in result.state.messages if m.role == "tool"]
    assert outputs == ["Error: quits raised SystemExit: 3", "Error: quits_later raised SystemExit: bye"]
    assert result.output == "still here"


async def test_abandoned_sync_tools_neither_starve_other_threads_nor_block_later_tools() -> None:
    import threading
    import time

    release = threading.Event()

    @tool(timeout=0.05)
    def stuck(n: int) -> str:
        """Hang until released."""
        release.wait(30)
        return "late"

    @tool
    def quick() -> str:
        """Answer at once."""
        return "quick"

    stuck_calls = {
        "tool_calls": [{"name": "stuck", "args": {"n": i}} for i in range(40)]
    }  # more than any default pool
    agent = Agent(ScriptedModel([stuck_calls, call("quick"), "done"]), tools=[stuck, quick])
    try:
        started = time.monotonic()
        result = await agent.run("x")
        assert time.monotonic() - started < 10
        outputs = [m.content for m in result.state.messages if m.role == "tool"]
        assert outputs[:40] == ["Error: stuck was abandoned: it timed out after 0.05 s."] * 40
        assert outputs[40] == "quick" and result.output == "done"
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), 5) == "free"  # the loop's own pool
    finally:
        release.set()


def test_a_process_whose_tool_hangs_still_exits_after_its_run(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = tmp_path / "hang.py"
    script.write_text(
        "import time\n"
        "from thinkloop import Agent, tool\n"
        "from thinkloop.testing import ScriptedModel\n"
        "@tool(timeout=0.2)\n"
        "def hang() -> str:\n"
        '    """Hang."""\n'
        "    time.sleep(1000)\n"
        "    return 'never'\n"
        "r = Agent(ScriptedModel([{'tool_calls': [{'name': 'hang', 'args': {}}]}, 'gave up']), tools=[hang]).run_sync('x')\n"
        "print(r.output)\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "gave up", done.stderr


@pytest.mark.parametrize(
    "raw",
    [
        "{'a': 17, 'b': 23}",  # Python notation
        "{a: 17, b: 23}",  # JavaScript notation
        "a=17, b=23",  # keyword arguments written as code
        '```json\n{"a": 17, "b": 23}\n```',  # fenced
        '"{\\"a\\": 17, \\"b\\": 23}"',  # encoded twice
    ],
)
async def test_arguments_that_are_not_json_but_say_what_they_mean_are_read_so(raw: str) -> None:
    model = ScriptedModel([{"tool_calls": [{"name": "add", "args": raw}]}, "40"])
    result = await Agent(model, tools=[add]).run("17+23")
    assert [m.content for m in result.state.messages if m.role == "tool"] == ["40"]


async def test_a_list_of_arguments_is_read_in_order_and_the_model_told_so() -> None:
    @tool
    def total(numbers: list[float]) -> float:
        """Sum numbers."""
        return sum(numbers)

    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "add", "args": "[17, 23]"}]},
            {"tool_calls": [{"name": "total", "args": "[1, 2.5]"}]},  # the one list parameter
            {"tool_calls": [{"name": "add", "args": "[1, 2, 3]"}]},  # more values than parameters
            "done",
        ]
    )
    result = await Agent(model, tools=[add, total]).run("x")
    outputs = [m.content for m in result.state.messages if m.role == "tool"]
    assert outputs[0] == (
        '40\nNote: the arguments were a list, read in order as {"a": 17, "b": 23}; send a JSON object of named'
        " arguments."
    )
    assert outputs[1] == "3.5"
    assert outputs[2].startswith("Error: the arguments of add were not a JSON object: '[1, 2, 3]'.")


@pytest.mark.parametrize(
    "raw",
    [
        '{"a": 17, "b": 2',  # cut off by the token limit: never mended
        '{"text": "hello wor}',  # cut off inside a string that happened to end with a brace
        "b=23, c=1",  # keywords naming no parameter … (c)
        "17, 23",
    ],
)
async def test_arguments_cut_off_or_unclear_are_not_guessed(raw: str) -> None:
    @tool
    def note(text: str, a: int = 0, b: int = 0) -> str:
        """Keep a note."""
        return f"kept {text!r}"

    model = ScriptedModel([{"tool_calls": [{"name": "note", "args": raw}]}, "gave up"])
    result = await Agent(model, tools=[note]).run("x")
    (output,) = [m.content for m in result.state.messages if m.role == "tool"]
    assert output.startswith("Error: the arguments of note were not a JSON object"), output


async def test_json_text_for_a_tool_of_one_text_parameter_stays_its_value() -> None:
    @tool
    def echo(text: str) -> str:
        """Echo."""
        return text

    model = ScriptedModel([{"tool_calls": [{"name": "echo", "args": '"{\\"x\\": 1}"'}]}, "done"])
    result = await Agent(model, tools=[echo]).run("x")
    assert [m.content for m in result.state.messages if m.role == "tool"] == ['{"x": 1}']


async def test_a_native_call_with_a_near_miss_tool_name_runs_the_tool_it_meant() -> None:
    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    @tool
    def get_Weather(city: str) -> str:  # two tools that differ only by case
        """Another weather tool."""
        return "other"

    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "functions.add", "args": {"a": 1, "b": 2}}]},
            {"tool_calls": [{"name": " Add ", "args": {"a": 2, "b": 2}}]},
            {"tool_calls": [{"name": "GET-WEATHER", "args": {"city": "Oslo"}}]},  # ambiguous: not guessed
            "done",
        ]
    )
    result = await Agent(model, tools=[add, get_weather, get_Weather]).run("x")
    outputs = [m.content for m in result.state.messages if m.role == "tool"]
    assert outputs[:2] == ["3", "4"]
    assert outputs[2] == (
        "Error: there is no tool named 'GET-WEATHER'. It matches get_weather and get_Weather: call one of"
        " them by its exact name. Available tools: add, get_weather, get_Weather."
    )
    assert result.tool_calls == 3 and result.output == "done"


@pytest.mark.parametrize(
    "name", ["GetWeather", "getWeather", "get weather", "get_weather()", "get_weather(city)", "<get_weather>"]
)
async def test_a_tool_name_written_in_another_style_runs_the_one_tool_it_names(name: str) -> None:
    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    model = ScriptedModel([{"tool_calls": [{"name": name, "args": {"city": "Oslo"}}]}, "done"])
    result = await Agent(model, tools=[add, get_weather]).run("x")
    assert [m.content for m in result.state.messages if m.role == "tool"] == ["sunny in Oslo"]


async def test_a_misspelt_tool_name_is_answered_with_the_name_it_probably_meant() -> None:
    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "get_wether", "args": {"city": "Oslo"}}]},  # a typo: not run
            {"tool_calls": [{"name": "search_web", "args": {"q": "x"}}]},  # nothing like it
            {"tool_calls": [{"name": "get_weather", "args": {"city": "Oslo"}}]},
            "done",
        ]
    )
    result = await Agent(model, tools=[add, get_weather]).run("x")
    outputs = [m.content for m in result.state.messages if m.role == "tool"]
    assert outputs == [
        "Error: there is no tool named 'get_wether'. Did you mean get_weather? Available tools: add, get_weather.",
        "Error: there is no tool named 'search_web'. Available tools: add, get_weather.",
        "sunny in Oslo",
    ]
    assert result.output == "done"


async def test_bare_text_that_python_reads_as_a_non_finite_number_stays_text() -> None:
    """`Action Input: NaN` for a one-parameter tool: JSON has no NaN or infinities, so it is the text."""

    @tool
    def label(text: str) -> str:
        """Label something."""
        return f"label: {text}"

    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "label", "args": "NaN"}]},
            {"tool_calls": [{"name": "label", "args": "1e999"}]},
            {"tool_calls": [{"name": "label", "args": "-Infinity"}]},
            "done",
        ]
    )
    result = await Agent(model, tools=[label]).run("x")
    outputs = [m.content for m in result.state.messages if m.role == "tool"]
    assert outputs == ["label: NaN", "label: 1e999", "label: -Infinity"]
    assert json.loads(result.state.to_json())["ledger"]  # and the state is valid JSON


async def test_arguments_a_small_model_gets_slightly_wrong_are_understood() -> None:
    @tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    @tool
    def square(n: int) -> int:
        """Square a number."""
        return n * n

    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "weather", "args": "Paris"}]},  # bare text for a one-parameter tool
            {"tool_calls": [{"name": "weather", "args": '"Oslo"'}]},  # a JSON string
            {"tool_calls": [{"name": "square", "args": "7"}]},  # a JSON number
            {"tool_calls": [{"name": "add", "args": {"arguments": {"a": 1, "b": 2}}}]},  # wrapped
            {"tool_calls": [{"name": "add", "args": "3 4"}]},  # two parameters: not guessed
            {"tool_calls": [{"name": "weather", "args": '{"city": "Ro'}]},  # a broken object: not guessed
            {"tool_calls": [{"name": "add", "args": {"input": {"a": "x"}}}]},  # wrapped, still invalid
            "done",
        ]
    )
    result = await Agent(model, tools=[weather, square, add]).run("x")
    outputs = [m.content for m in result.state.messages if m.role == "tool"]
    assert outputs[:4] == ["sunny in Paris", "sunny in Oslo", "49", "3"]
    assert outputs[4].startswith("Error: the arguments of add were not a JSON object: '3 4'")
    assert outputs[5].startswith("Error: the arguments of weather were not a JSON object")
    assert outputs[6].startswith("Error: invalid arguments for add: ")
    assert result.output == "done"


async def test_arguments_a_tool_does_not_take_are_ignored_when_the_rest_is_valid_and_the_model_told() -> None:
    @tool
    def offices() -> str:
        """Every office."""
        return '[{"city": "Dublin"}, {"city": "Austin"}]'

    @tool
    def sales(store: str, months: int = 3) -> str:
        """Sales of a store."""
        return f"{store}: {months} months"

    @tool(risk=RiskLevel.HIGH)
    def delete(path: str) -> str:
        """Delete a file."""
        return f"deleted {path}"

    model = ScriptedModel(
        [
            call("offices", city="Dublin"),  # the 0.5B model's filter: the tool takes none
            call("sales", store="Kiosk 4", month_count=6, region="north"),
            call("sales", shop="Kiosk 4"),  # the required argument is missing: still an error
            call("delete", path="a.txt", dry_run=True),  # a call that acts runs only as written
            "done",
        ]
    )
    result = await Agent(model, tools=[offices, sales, delete]).run("x")
    outputs = [m.content for m in result.state.messages if m.role == "tool"]
    assert outputs[0] == (
        '[{"city": "Dublin"}, {"city": "Austin"}]\nNote: offices has no argument "city", so it was ignored: '
        "the result above is for the call without it (it takes no arguments)."
    )
    assert outputs[1] == (
        'Kiosk 4: 3 months\nNote: sales has no arguments "month_count", "region", so they were ignored: the '
        "result above is for the call without them (its arguments are store, months)."
    )
    assert outputs[2].startswith(
        "Error: invalid arguments for sales: store: required, not given; shop: no such argument (did you mean store?)"
    )
    assert outputs[3].startswith("Error: invalid arguments for delete: dry_run: no such argument")
    assert result.output == "done"


@pytest.mark.parametrize("mode", ["native", "react"])
async def test_an_answer_whose_comparison_the_results_contradict_is_sent_back_once(mode: str) -> None:
    """The 1.5B model read gizmo 19.99 EUR and widget 12.75 EUR and answered "gizmo is cheaper than widget
    by 7.24 EUR". It is told both values and which is cheaper, once per run; a second such answer, or a
    forced one, has its two sides swapped."""

    @tool
    def unit_price(item: str) -> str:
        """The unit price of an item."""
        return {"gizmo": "gizmo: 19.99 EUR", "widget": "widget: 12.75 EUR"}[item]

    wrong, right = (
        "gizmo is cheaper than widget by 7.24 EUR.",
        "The widget is cheaper than the gizmo, by 7.24 EUR.",
    )
    lookups = [call("unit_price", item="gizmo"), call("unit_price", item="widget")]
    if mode == "react":
        lookups = [
            f'Thought: x\nAction: unit_price\nAction Input: {{"item": "{item}"}}'
            for item in ("gizmo", "widget")
        ]
        wrong, right = f"Final Answer: {wrong}", f"Final Answer: {right}"
    model = ScriptedModel([*lookups, wrong, right], tools=mode == "native")
    result = await Agent(model, tools=[unit_price]).run(
        "Which is cheaper, a gizmo or a widget, and by how much?"
    )
    assert result.output == "The widget is cheaper than the gizmo, by 7.24 EUR."
    (correction,) = [m.content for m in result.state.messages if m.kind == "correction"]
    assert correction.startswith(
        "The Final Answer says gizmo is cheaper than widget, but the observations give gizmo 19.99 and widget "
        "12.75: widget is the cheaper one. Correct the answer. The task: Which is cheaper"
    )
    stubborn = ScriptedModel([*lookups, wrong, wrong], tools=mode == "native")
    result = await Agent(stubborn, tools=[unit_price]).run("Which is cheaper?")
    assert result.output == "widget is cheaper than gizmo by 7.24 EUR."  # told once: put right, as arithmetic
    forced = ScriptedModel([*lookups, "gizmo is cheaper than widget."], tools=mode == "native")
    result = await Agent(forced, tools=[unit_price], budget=Budget(max_steps=2)).run("Which is cheaper?")
    assert result.forced_final and result.output == "widget is cheaper than gizmo."


async def test_a_failed_call_close_to_a_value_its_error_lists_is_told_the_value() -> None:
    """The 1.5B model, told "no item named 'gadget1'; the catalogue has: widget, gadget, gizmo, sprocket",
    went on to gadget2, gadget3 … past a hint to read the error: the error now names the closest value."""

    @tool
    def unit_price(item: str) -> str:
        """The unit price of an item."""
        catalogue = {
            "widget": "12.75 EUR",
            "gadget": "8.40 EUR",
            "gizmo": "19.99 EUR",
            "sprocket": "0.35 EUR",
        }
        if item not in catalogue:
            raise LookupError(f"no item named {item!r}; the catalogue has: {', '.join(catalogue)}")
        return catalogue[item]

    @tool
    def person(who: str) -> str:
        """A person's phone extension."""
        raise KeyError(f"no person {who!r}; known people: Ann Lee, Bob Keller and Cy Young")

    model = ScriptedModel(
        [
            call("unit_price", item="gadget1"),
            call("unit_price", item="banana"),
            call("person", who="Bob"),
            call("unit_price", item="gadget"),
            "8.40 EUR",
        ]
    )
    result = await Agent(model, tools=[unit_price, person]).run("How much is a gadget?")
    outputs = [m.content for m in result.state.messages if m.role == "tool"]
    assert outputs[0].endswith(
        "\nNote: 'gadget1' is not one of the values this error lists; the closest is 'gadget'. If that is what "
        'you meant, call unit_price again with "item": "gadget".'
    )
    assert outputs[1].endswith(  # nothing close, but the task names one of the values listed
        "\nNote: 'banana' is not one of the values this error lists, but the task names 'gadget', which it does "
        'list. If that is what the task asks about, call unit_price again with "item": "gadget".'
    )
    assert "the closest is 'Bob Keller'" in outputs[2]
    assert outputs[3] == "8.40 EUR"

    # The task names none of the values, or several of them: the list alone.
    for goal in ("How much is a banana?", "Is a gadget dearer than a widget?", "Price of gadgetry?"):
        model = ScriptedModel([call("unit_price", item="banana"), "I do not know."])
        result = await Agent(model, tools=[unit_price]).run(goal)
        outputs = [m.content for m in result.state.messages if m.role == "tool"]
        assert "Note:" not in outputs[0] and "the catalogue has: widget, gadget" in outputs[0], goal
    # An argument that is no name (an expression the calculator refused, listing its words): no note.
    model = ScriptedModel([call("calculator", expression="count(orders) - count(shipped)"), "I do not know."])
    result = await Agent(model, tools=[unit_price, calculator]).run(
        "Which of Mia Chen's orders have not shipped yet?"
    )
    refused = next(m.content for m in result.state.messages if m.role == "tool")
    assert "'orders', 'shipped' are not numbers" in refused and "Note:" not in refused
    # Plural in the task ("gadgets") still names it.
    model = ScriptedModel([call("unit_price", item="Smartphone"), "I do not know."])
    result = await Agent(model, tools=[unit_price]).run("How much do two gadgets cost?")
    assert "the task names 'gadget'" in next(m.content for m in result.state.messages if m.role == "tool")


async def test_a_failed_call_using_another_tool_inside_its_argument_is_told_to_call_that_tool_first() -> None:
    @tool
    def monthly_sales(store: str) -> str:
        """Unit sales of a store."""
        return "January: 18,432, February: 21,907, March: 19,655"

    model = ScriptedModel(
        [
            call("calculator", expression="sum(monthly_sales['Kiosk 4'][:3]) / 3"),  # the 1.5B model, 3 times
            call("calculator", expression="monthly_sales + 1"),  # a name, not a call: no note
            "done",
        ]
    )
    result = await Agent(model, tools=[calculator, monthly_sales]).run("x")
    outputs = [m.content for m in result.state.messages if m.role == "tool"]
    assert outputs[0].startswith("Error: calculator raised CalculatorError: unsupported element")
    assert outputs[0].endswith(
        "\nNote: monthly_sales is a tool, which calculator cannot call. Call monthly_sales first, on its own, "
        "then use the values it returns in calculator."
    )
    assert "Note:" not in outputs[1]


# ====================================================================== answers handed in as a tool call


@pytest.mark.parametrize("mode", ["native", "react"])
@pytest.mark.parametrize(
    "reply",
    [
        {"tool_calls": [{"name": "final_answer", "args": {"answer": "391"}}]},  # smolagents' habit
        {"tool_calls": [{"name": "Final_Answer", "args": "391"}]},  # raw text arguments
        {"tool_calls": [{"name": "finish", "args": {"result": 391}}]},
        {"text": '{"name": "final_answer", "arguments": {"answer": "391"}}'},
        {"text": '```json\n{"action": "Final Answer", "action_input": "391"}\n```'},
        {"text": "Thought: I know it.\nAction: Final Answer\nAction Input: 391"},
        {"text": 'Thought: done\nAction: final_answer\nAction Input: {"answer": "391"}'},
    ],
)
async def test_an_answer_handed_in_through_a_tool_that_does_not_exist_is_the_final_answer(
    reply: dict[str, object], mode: str
) -> None:
    model = ScriptedModel([reply, "not asked"])
    result = await Agent(model, tools=[calculator], mode=mode).run("What is 17*23?")
    assert result.stop_reason is StopReason.FINAL_ANSWER and result.output == "391"
    assert result.steps == 1 and result.tool_calls == 0


async def test_an_answer_call_beside_real_calls_is_dropped_and_a_real_answer_tool_is_called() -> None:
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "calculator", "args": {"expression": "17*23"}}, {"name": "final_answer", "args": {"answer": "guess"}}]},
            "391",
        ]
    )  # fmt: skip
    result = await Agent(model, tools=[calculator]).run("What is 17*23?")
    assert result.output == "391" and result.tool_calls == 1
    assert [c.name for c in result.state.messages[1].tool_calls] == ["calculator"]  # every call answered

    @tool
    def submit(answer: str) -> str:
        """Submit the answer to the grader."""
        return f"submitted {answer}"

    model = ScriptedModel([{"tool_calls": [{"name": "submit", "args": {"answer": "391"}}]}, "done"])
    result = await Agent(model, tools=[submit]).run("Submit 391.")
    assert result.output == "done" and result.tool_calls == 1  # a real tool of that name is a real call
    empty = ScriptedModel([{"tool_calls": [{"name": "final_answer", "args": {}}]}, "391"])
    result = await Agent(empty, tools=[calculator]).run("What is 17*23?")
    assert result.output == "391" and result.steps == 2  # nothing handed in: answered as an unknown tool


# =============================================================================== stores and models that fail


class _FailingStore(SQLiteStore):
    """A real SQLite store whose checkpoints fail from the `fail_from`-th on (`times` of them)."""

    def __init__(
        self, path: Path, fail_from: int, times: int = 1_000, error: Exception | None = None
    ) -> None:
        super().__init__(path)
        self.calls, self.fail_from, self.times = 0, fail_from, times
        self.error = error or StateError("disk full (simulated)")

    async def checkpoint(self, state: RunState, events: Any) -> None:
        self.calls += 1
        if self.fail_from <= self.calls < self.fail_from + self.times:
            raise self.error
        await super().checkpoint(state, events)


def _two_step_model() -> ScriptedModel:
    return ScriptedModel(
        [
            {"tool_calls": [{"name": "record", "args": {"item": "a"}}]},
            {"tool_calls": [{"name": "record", "args": {"item": "b"}}]},
            "done",
        ],
        by_turn=True,  # a resumed run goes on with the reply of its turn
    )


async def test_a_store_that_fails_mid_run_stops_it_unfinished_before_the_unsaved_call_and_loses_nothing(
    tmp_path: Path,
) -> None:
    effects: list[str] = []

    @tool
    def record(item: str) -> str:
        """Record an item (a side effect)."""
        effects.append(item)
        return f"recorded {item}"

    # checkpoints: 1 run started; 2 'a' started, 3 'a' done, 4 observations; 5 'b' started -> fails
    store = _FailingStore(tmp_path / "runs.db", fail_from=5)
    agent = Agent(_two_step_model(), tools=[record], store=store)
    with pytest.raises(
        StateError, match=r"disk full.*stopped unfinished at step 2: once the store works, agent\.resume"
    ) as caught:
        await agent.run("Record a then b.")
    assert effects == ["a"]  # 'b' never ran: its start could not be saved
    state = caught.value.state
    assert state is not None and state.stop_reason is None and not state.finished
    assert [e.status for e in state.ledger.values()] == ["done", "planned"]  # 'b' never started
    assert "from its last checkpoint" in str(caught.value)  # the store was still failing

    store.fail_from = 1_000_000  # the store works again: the run goes on from its last checkpoint
    result = await agent.resume(state.run_id)
    assert result.output == "done" and result.stop_reason is StopReason.FINAL_ANSWER
    assert effects == ["a", "b"]  # 'a' not run again, 'b' run once

    for error in (OSError(28, "No space left on device"), KeyError("boom")):  # a store of the user's making
        store = _FailingStore(tmp_path / f"{type(error).__name__}.db", fail_from=2, error=error)
        with pytest.raises(StateError, match=r"the store _FailingStore could not save run .*(No space|boom)"):
            await Agent(_two_step_model(), tools=[record], store=store).run("Record a then b.")


async def test_a_store_failure_that_passes_leaves_the_run_resumable_with_its_latest_results(
    tmp_path: Path,
) -> None:
    """One failed save ('a' done), then the store is back: the run stops unfinished (it used to be saved as
    finished with `error`, so nothing could resume it), saved as it is, and resuming finishes it."""
    effects: list[str] = []

    @tool
    def record(item: str) -> str:
        """Record an item (a side effect)."""
        effects.append(item)
        return f"recorded {item}"

    store = _FailingStore(tmp_path / "runs.db", fail_from=3, times=1)
    agent = Agent(_two_step_model(), tools=[record], store=store)
    with pytest.raises(
        StateError, match=r"disk full.*stopped unfinished.*continues it as it is now"
    ) as caught:
        await agent.run("Record a then b.")
    run_id = caught.value.state.run_id  # type: ignore[union-attr]
    saved = await store.load_state(run_id)
    assert saved is not None and not saved.finished
    assert [(e.name, e.status) for e in saved.ledger.values()] == [("record", "done")]  # its result was kept
    result = await agent.resume(run_id)
    assert result.stop_reason is StopReason.FINAL_ANSWER and effects == ["a", "b"]
    events = await store.read_events(run_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))  # no gap where the failure was
    assert "error" in [e.type for e in events] and events[-1].type == "done"


async def test_a_run_whose_final_save_fails_keeps_its_stop_reason(tmp_path: Path) -> None:
    """The final checkpoint failed: the error says the run ended, and its state says how (it was turned
    into an `error` run before)."""
    store = _FailingStore(tmp_path / "runs.db", fail_from=2)  # 1 run started; 2 the end
    with pytest.raises(
        StateError, match=r"disk full \(simulated\) — the run ended \(final_answer\) but its final state"
    ) as caught:
        await Agent(ScriptedModel(["42"]), store=store).run("The answer?")
    state = caught.value.state
    assert state is not None and state.stop_reason is StopReason.FINAL_ANSWER and state.answer == "42"


async def test_a_model_that_raises_something_unexpected_ends_the_run_with_an_error() -> None:
    class Buggy(FunctionModel):
        async def request(self, request: ModelRequest) -> Any:
            raise KeyError("choices")

    result = await Agent(Buggy(lambda r: "x"), tools=[calculator]).run("What is 1+1?")
    assert result.stop_reason is StopReason.ERROR
    assert result.error is not None and "the model raised KeyError: 'choices'" in result.error


async def test_a_timeout_the_model_raised_itself_is_retried_not_taken_for_the_runs_time_limit() -> None:
    """`asyncio.wait_for` inside a model (or `socket.timeout`, the same class) raises TimeoutError: it is the
    model call's transient failure, retried, and the run — which has no time limit — ends with `error`
    naming it, not with `timeout` ("the time limit of None s")."""
    calls = 0

    async def slow_backend(request: ModelRequest) -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            await asyncio.wait_for(asyncio.sleep(10), 0.001)
        return "answered on the second try"

    events: list[Event] = []
    agent = Agent(FunctionModel(slow_backend), model_retries=1, on_event=events.append)
    result = await agent.run("hi")
    assert (result.stop_reason, result.output, calls) == (
        StopReason.FINAL_ANSWER,
        "answered on the second try",
        2,
    )
    attempts = [e for e in events if e.type == "model_attempt"]
    assert [a.error for a in attempts] == [
        "test: model request failed: the model call timed out (TimeoutError)"
    ]

    def always(request: ModelRequest) -> str:
        raise TimeoutError("read timed out")

    failed = await Agent(FunctionModel(always), model_retries=0).run("hi")
    assert failed.stop_reason is StopReason.ERROR
    assert (
        failed.error == "test: model request failed: the model call timed out (TimeoutError: read timed out)"
    )


async def test_a_model_raising_in_the_forced_final_call_keeps_the_budget_stop() -> None:
    """The best-effort final call after a budget stop fails with an exception of the model's own: the run
    still ends on its budget, saying the final call failed (the exception escaped the run before)."""

    def model(request: ModelRequest) -> Reply:
        if not request.tools:
            raise RuntimeError("backend crashed")
        return {"tool_calls": [{"name": "calculator", "args": {"expression": "1+1"}}]}

    result = await Agent(FunctionModel(model), tools=[calculator], budget=Budget(max_steps=2)).run("go")
    assert result.stop_reason is StopReason.MAX_STEPS and not result.forced_final
    assert result.error is not None
    assert (
        "The final-answer call failed: test: model request failed: the model raised RuntimeError: backend crashed"
        in result.error
    )


@pytest.mark.parametrize("header", ["1000000000", "31"])
async def test_a_retry_after_longer_than_the_loop_waits_fails_the_call_at_once(header: str) -> None:
    """A provider asking to wait longer than the loop's 30 s cap: the call fails now with the provider's
    error (it used to sleep 30 s per retry, then fail anyway)."""
    from thinkloop.testing_server import Fault, OpenAICompatibleServer

    async with OpenAICompatibleServer(
        [Fault(429, "Rate limit reached", headers={"Retry-After": header})]
    ) as server:
        agent = Agent(OpenAIModel("gpt-4o-mini", base_url=server.url, api_key="test"))
        result = await asyncio.wait_for(agent.run("hi"), 20)
    assert result.stop_reason is StopReason.ERROR
    assert result.error is not None and "429" in result.error and "Rate limit reached" in result.error
    assert len(server.chat_requests) == 1


async def test_a_retry_wait_the_run_has_no_time_left_for_ends_with_the_providers_error() -> None:
    """With `Budget(timeout=…)` shorter than the provider's Retry-After, the run ends with the 429 in its
    error, not a `timeout` stop that hides it."""
    from thinkloop.testing_server import Fault, OpenAICompatibleServer

    async with OpenAICompatibleServer(
        [Fault(429, "Rate limit reached", headers={"Retry-After": "20"})]
    ) as server:
        model = OpenAIModel("gpt-4o-mini", base_url=server.url, api_key="test")
        agent = Agent(model, budget=Budget(timeout=10))
        result = await asyncio.wait_for(agent.run("hi"), 20)
    assert result.stop_reason is StopReason.ERROR and result.duration < 10
    assert result.error is not None and "429" in result.error
    assert len(server.chat_requests) == 1


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
def test_arguments_holding_nan_or_infinity_are_answered_as_malformed_and_the_state_round_trips(
    number: float,
) -> None:
    """json.loads reads `{"x": NaN}` (and `1e999` as infinity), JSON has neither: run as they were, the call's
    arguments were written to the state as null and the saved state no longer equalled the run's."""
    ran: list[float] = []

    @tool
    def scale(x: float) -> float:
        """Scale a number."""
        ran.append(x)
        return x

    def reply(request: ModelRequest) -> ModelResponse:
        if request.turn == 0:
            return ModelResponse(tool_calls=[ToolCall(id="c1", name="scale", arguments={"x": number})])
        return ModelResponse(text="done")

    result = Agent(FunctionModel(reply), tools=[scale]).run_sync("Scale it.")
    assert ran == []  # not run with a number JSON cannot hold
    observation = result.state.messages[-2]
    assert observation.role == "tool" and "not a JSON object" in observation.content
    assert RunState.model_validate_json(result.state.model_dump_json()) == result.state


async def test_a_goal_with_nul_or_a_bad_run_id_is_refused_before_the_run_starts() -> None:
    """As the server, the CLI and the job queue refuse them; a bad run id failed at the first save, as a
    store failure (a StateError quoting the raw id)."""
    from thinkloop import ConfigurationError, UserError

    agent = Agent(ScriptedModel(["never asked"]))
    with pytest.raises(UserError, match="NUL character"):
        await agent.run("go\x00al")
    with pytest.raises(UserError, match="NUL character"):
        [e async for e in agent.stream("go\x00al")]
    with pytest.raises(ConfigurationError, match="invalid run id"):
        await agent.run("x", run_id="a\x00b")
    assert agent.model.requests == []  # type: ignore[attr-defined]  # nothing ran


@pytest.mark.parametrize("is_async", [False, True])
async def test_a_tool_exception_whose_str_raises_is_a_failed_call_not_an_escape(is_async: bool) -> None:
    """`class ApiError(Exception): def __str__(self): return self.payload["message"]` with the key missing:
    the KeyError of its `__str__` escaped run(), stream() ended without `done`, a store kept the call started."""

    class ApiError(Exception):
        def __str__(self) -> str:
            raise KeyError("message")

    def fail() -> str:
        raise ApiError()

    async def afail() -> str:
        raise ApiError()

    broken = Tool("broken", "Fails.", {"type": "object", "properties": {}}, afail if is_async else fail)
    model = ScriptedModel([{"tool_calls": [{"name": "broken", "args": {}}]}, "gave up"])
    events = [e async for e in Agent(model, tools=[broken]).stream("go")]
    assert events[-1].type == "done" and events[-1].result.output == "gave up"  # type: ignore[union-attr]
    (result,) = [e for e in events if e.type == "tool_result"]
    assert result.output == "Error: broken raised ApiError: <ApiError object; str() raised KeyError>"  # type: ignore[union-attr]


@pytest.mark.parametrize("mode", ["react", "native"])
@pytest.mark.parametrize(
    ("reply", "answer"),
    [
        (  # an action considered and rejected while reasoning was run (the real answer dropped)
            '<think>I could do\nAction: delete_file\nAction Input: {"path": "/etc/hosts"}\nbut no.</think>\n'
            "Final Answer: nothing to delete",
            "nothing to delete",
        ),
        ("<think>Final Answer: maybe 12? No, recount.</think>\nFinal Answer: 14", "14"),  # a draft answer
        ("<think>the user wants a number</think>\n14", "14"),  # kept the reasoning block, in ReAct
        ('Reasoning before.</think>\n{"name": "final_answer", "arguments": {"answer": "14"}}', "14"),
    ],
)
def test_what_a_model_writes_while_reasoning_is_neither_run_nor_answered(
    mode: str, reply: str, answer: str
) -> None:
    deleted: list[str] = []

    @tool
    def delete_file(path: str) -> str:
        """Delete a file."""
        deleted.append(path)
        return "deleted"

    model = ScriptedModel([reply, "Final Answer: (a second reply)"], tools=mode == "native")
    result = Agent(model, tools=[delete_file], mode=mode).run_sync("count it")  # type: ignore[arg-type]
    assert (result.output, deleted) == (answer, [])


def _cut(text: str = "", *, calls: list[ToolCall] | None = None) -> ModelResponse:
    return ModelResponse(text=text, tool_calls=calls or [], finish_reason="length")


@pytest.mark.parametrize(
    ("mode", "reply"),
    [
        (
            "react",
            _cut('Thought: clean up\nAction: shell\nAction Input: {"command": "rm -rf /home/user/build_tmp'),
        ),
        ("react", _cut('Action: transfer\nAction Input: {"account": "ACME", "amount": 12')),
        ("react", _cut("Action: shell\nAction Input: rm -rf /home/user/build_tmp")),
        (
            "native",
            _cut('<tool_call>{"name": "shell", "arguments": {"command": "rm -rf /home/user/build_tmp'),
        ),
        (
            "native",
            _cut(calls=[ToolCall(id="c1", name="shell", raw_arguments='"rm -rf /home/user/build_tmp')]),
        ),
    ],
)
def test_a_call_cut_off_by_the_token_limit_inside_its_arguments_is_not_run(
    mode: str, reply: ModelResponse
) -> None:
    # json_repair closed the object (or the quote was dropped) and the tool ran with half an argument.
    ran: list[object] = []

    @tool
    def shell(command: str) -> str:
        """Run a shell command."""
        ran.append(command)
        return "ok"

    @tool
    def transfer(account: str, amount: int) -> str:
        """Transfer money."""
        ran.append((account, amount))
        return "ok"

    model = ScriptedModel([reply, "Final Answer: done"], tools=mode == "native")
    result = Agent(model, tools=[shell, transfer], mode=mode).run_sync("tidy up")  # type: ignore[arg-type]
    assert ran == [] and result.output == "done"
    told = " ".join(m.content for m in result.state.messages if m.role in ("user", "tool"))
    assert "cut off" in told or "not a JSON object" in told, told


def test_a_native_call_cut_off_by_the_length_limit_is_told_so_and_the_run_stays_native() -> None:
    # it was told only that its arguments were not a JSON object, and two such replies switched the run to
    # ReAct "for malformed tool calls": a length limit is not fixed by another format
    written: list[str] = []

    @tool
    def write(path: str, text: str) -> str:
        """Write a text to a file."""
        written.append(path)
        return "written"

    cut = '{"path": "notes.md", "text": "a long text that goes on and'
    replies = [
        _cut(calls=[ToolCall(id="w1", name="write", raw_arguments=cut)]),
        _cut(calls=[ToolCall(id="w2", name="write", raw_arguments=cut)]),
        {"tool_calls": [{"name": "write", "args": {"path": "notes.md", "text": "short"}}]},
        "done",
    ]
    result = Agent(ScriptedModel(replies), tools=[write]).run_sync("write notes")
    assert result.output == "done" and written == ["notes.md"]
    assert result.state.mode == "native" and "mode_switches" not in result.state.metadata
    first = next(m.content for m in result.state.messages if m.role == "tool")
    assert first.startswith("Error: write was not called: your reply was cut off by its length limit")


@pytest.mark.parametrize(
    "reply",
    [  # complete calls: an invented observation after the call (cut off later), or no length limit at all
        _cut('Action: shell\nAction Input: {"command": "ls"}\nObservation: a.txt\nThought: now I kn'),
        _cut('Action: shell\nAction Input: {"command": "ls"}'),
        ModelResponse(text='Action: shell\nAction Input: {"command": "ls"', finish_reason="stop"),  # mended
    ],
)
def test_complete_calls_in_a_cut_off_reply_and_unclosed_ones_in_a_finished_reply_still_run(
    reply: ModelResponse,
) -> None:
    ran: list[str] = []

    @tool
    def shell(command: str) -> str:
        """Run a shell command."""
        ran.append(command)
        return "ok"

    result = Agent(ScriptedModel([reply, "Final Answer: done"]), tools=[shell], mode="react").run_sync("list")
    assert ran == ["ls"] and result.output == "done"


@pytest.mark.parametrize("mode", ["react", "native"])
def test_an_answer_cut_off_by_the_token_limit_is_asked_for_again_once(mode: str) -> None:
    prefix = "Final Answer: " if mode == "react" else ""
    cut = ModelResponse(text=f"{prefix}The total is 1", finish_reason="length")
    again = ModelResponse(text=f"{prefix}The total is 1,250.", finish_reason="stop")
    result = Agent(ScriptedModel([cut, again]), mode=mode).run_sync("total?")  # type: ignore[arg-type]
    assert result.output == "The total is 1,250."
    cut_twice = [cut, cut, again]
    model = ScriptedModel(cut_twice)
    result = Agent(model, mode=mode).run_sync("total?")  # type: ignore[arg-type]
    assert result.output == "The total is 1" and len(model.requests) == 2  # once per run: the second stands


@pytest.mark.parametrize(
    ("response", "says"),
    [
        (ModelResponse(text="42", finish_reason=None), "its finish_reason is None"),  # type: ignore[arg-type]
        (ModelResponse(text="42", usage=Usage(input_tokens=3.5, requests=1)), "usage.input_tokens is 3.5"),  # type: ignore[arg-type]
        (
            ModelResponse(text="42", usage=Usage(output_tokens=-9000, requests=1)),
            "usage.output_tokens is -9000",
        ),
        (ModelResponse(text="42", usage=Usage(cost=math.nan, requests=1)), "usage.cost is nan"),
        (ModelResponse(tool_calls=[ToolCall(id=None, name="add")]), "a tool call's id and name must be text"),  # type: ignore[arg-type]
        (ModelResponse(tool_calls=[ToolCall(id="c", name="add", arguments=[1, 2])]), "must be a dict"),  # type: ignore[arg-type]
    ],
)
def test_a_custom_model_s_malformed_response_ends_the_run_with_an_error_saying_what(
    response: ModelResponse, says: str
) -> None:
    # They raised a pydantic ValidationError from an event (or an AttributeError) out of run(); a NaN cost
    # or negative tokens were added to the budget (a state that did not load; max_tokens never reached).
    result = Agent(ScriptedModel([response]), tools=[add]).run_sync("what is 40+2?", on_event=lambda _: None)
    assert result.stop_reason is StopReason.ERROR
    assert result.error is not None and "the model returned a malformed ModelResponse: " in result.error
    assert says in result.error
    assert RunState.from_json(result.state.to_json()).usage == result.state.usage


def test_scripted_replies_take_usage_and_a_null_finish_reason() -> None:
    script = [
        {"text": "42", "finish_reason": None, "usage": {"input_tokens": 10, "output_tokens": 2, "cost": 0.5}}
    ]
    result = Agent(ScriptedModel(script)).run_sync("x")
    assert result.output == "42" and (result.usage.input_tokens, result.usage.cost) == (10, 0.5)
    assert not result.usage.estimated
    with pytest.raises(ConfigurationError, match="usage needs whole token counts"):
        ScriptedModel([{"text": "x", "usage": {"input_tokens": -1}}]).assert_used_up()


def test_arithmetic_across_units_is_not_put_right_as_if_the_units_were_one() -> None:
    # "1 h - 15 min = 45 min" was "corrected" to 1 - 15: the answer became "-14 min".
    @tool
    def schedule(day: str) -> str:
        """The schedule of a day."""
        return "Workshop: 1 h, of which the break is 15 min"

    answer = "Thought: 1 h - 15 min = 45 min of work.\nFinal Answer: 45 min"
    replies = [
        'Thought: I need the schedule.\nAction: schedule\nAction Input: {"day": "monday"}',
        answer,
        answer,
    ]
    result = Agent(ScriptedModel(replies, tools=False), tools=[schedule]).run_sync(
        "How long is the workshop without its break on monday?"
    )
    assert result.output == "45 min"


async def test_the_forced_final_call_stays_within_the_context_budget() -> None:
    # Its request was the task, the remembered turns of the session and the final prompt, unchecked: 20
    # remembered turns made a 5,400-token request for a 2,000-token window (and the model refused it).
    from thinkloop._tokens import estimate_message

    @tool
    def fetch(n: int) -> str:
        """Fetch a record."""
        return f"r{n} " + "y" * 3000

    looping = [False]

    def reply(request: ModelRequest) -> Reply:
        if not request.tools and any(m.kind == "final_prompt" for m in request.messages):
            return "forced answer"
        if looping[0]:
            return call("fetch", n=request.turn)
        return "answer " + "z" * 3000  # long answers, kept in the session's memory

    model = FunctionModel(reply)
    agent = Agent(model, tools=[fetch], max_context_tokens=2000, budget=Budget(max_steps=3))
    for index in range(6):
        await agent.run(f"question {index}", session="s1")
    looping[0] = True
    result = await agent.run("the last question", session="s1")
    assert result.stop_reason is StopReason.MAX_STEPS and result.output == "forced answer"
    final = model.requests[-1]
    assert final.messages[-1].kind == "final_prompt" and any(m.kind == "task" for m in final.messages)
    assert sum(estimate_message(m) for m in final.messages) <= 2000


async def test_a_hung_summarizer_does_not_outlast_the_run_s_time_limit() -> None:
    @tool
    def read(n: int) -> str:
        """Read a chunk."""
        return f"chunk {n}: " + "lorem ipsum " * 300

    async def summarizer(messages: Any, previous: str) -> str:
        await asyncio.sleep(3600)  # a hung summary model: the run hung with it
        return "summary"

    def reply(request: ModelRequest) -> Reply:
        return "done" if request.turn > 10 else call("read", n=request.turn)

    agent = Agent(
        FunctionModel(reply), tools=[read], max_context_tokens=3000, summarizer=summarizer,
        budget=Budget(max_steps=30, timeout=1.0),
    )  # fmt: skip
    result = await asyncio.wait_for(agent.run("Read everything."), 30)
    assert result.stop_reason is StopReason.TIMEOUT


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        # taken before, then: every observation cut to nothing, no timeout at all, a TypeError inside a run
        ({"output_max_length": 2.5}, "output_max_length must be a positive whole number, not 2.5"),
        ({"output_max_length": True}, "output_max_length must be a positive whole number, not True"),
        ({"tool_timeout": math.nan}, "tool_timeout must be a positive number of seconds, not nan"),
        ({"tool_timeout": True}, "tool_timeout must be a positive number of seconds, not True"),
        (
            {"tool_timeout": "5"},
            r"tool_timeout must be a positive number of seconds, not '5' \(of type str\)",
        ),
        ({"model_retries": 1.5}, "model_retries must be 0 or more, not 1.5"),
        ({"max_context_tokens": "8k"}, "max_context_tokens must be a whole number, not '8k'"),
        ({"lessons_limit": -1}, "lessons_limit must be 0 or more, not -1"),
        # AttributeErrors and TypeErrors at run time, before
        ({"budget": 5}, r"budget must be Budget\(max_steps=16\), not 5 \(of type int\)"),
        ({"budget": {"max_steps": 2}}, "budget must be Budget"),
        ({"instructions": None}, 'instructions must be a string \\("" for none\\), not None'),
        ({"environment": 3}, "environment must be a string"),
        ({"guards": {"x": 1}}, r"guards must be GuardConfig\(...\)"),
        ({"settings": {"temperature": 0}}, r"settings must be ModelSettings\(temperature=0\)"),
        ({"safety": "strict"}, r"safety must be an object like SafetyController\('strict'"),
        ({"store": "memory:"}, r"store must be an object like SQLiteStore\('runs.db'\)"),
        ({"experience": "lessons.jsonl"}, "experience must be an object like LessonBook"),
        ({"rules": "be brief"}, "rules must be a list of strings, one rule each, not 'be brief'"),
        ({"rules": ["ok", 3]}, "rules must be a list of strings, one rule each; it holds 3"),
        ({"on_event": 5}, r"on_event must be a function \(or None\), not 5"),
        ({"summarizer": "short"}, "summarizer must be a function"),
        ({"token_counter": 4}, "token_counter must have a count"),
        ({"final_answer_prompt": 1}, "final_answer_prompt must be a string"),
        # a template the budget stop would fill in: it raised KeyError there, and resuming raised it again
        (
            {"final_answer_prompt": 'Stopped ({reason}). Reply like {"answer": "..."}.'},
            r'final_answer_prompt cannot be filled in: \{"answer": "..."\} is no placeholder \(its placeholders: '
            r"\{reason\}, \{goal\}, \{facts\}; write \{\{ and \}\} for a literal brace\)",
        ),
        ({"final_answer_prompt": "Answer {task}."}, r"the placeholder \{task\} is unknown"),
        ({"final_answer_prompt": "Answer {0}."}, r"\{0\} is no placeholder"),
        ({"final_answer_prompt": "Answer {goal"}, "expected '}' before end of string"),
    ],
)
def test_agent_arguments_of_the_wrong_kind_are_refused_when_the_agent_is_made(
    arguments: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConfigurationError, match=says):
        Agent(ScriptedModel(["hi"]), **arguments)


def test_agent_arguments_of_the_right_kind_are_taken() -> None:
    agent = Agent(
        ScriptedModel(["hi"]),
        tool_timeout=math.inf,
        output_max_length=1,
        model_retries=0,
        max_context_tokens=-5,  # corrected to the default (SPEC §5.3)
        rules=("be brief",),
        on_event=lambda event: None,
        token_counter=lambda messages: 1,
        final_answer_prompt="Answer {goal} now ({reason}), as {{'answer': ...}}.",
    )
    assert agent.max_context_tokens == 8_000 and agent.rules == ("be brief",)
    assert agent.run_sync("x").output == "hi"


@pytest.mark.parametrize("mode", ["native", "react"])
def test_an_answer_that_only_thanks_for_a_tools_result_is_asked_for_again_once(mode: str) -> None:
    # qwen2.5 1.5B, native: calculator -> "31768", then "Thank you for providing the result." was the answer
    @tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        return "31768"

    prefix = "Final Answer: " if mode == "react" else ""
    first = (
        {"tool_calls": [{"name": "calculator", "args": {"expression": "2**15-1000"}}]}
        if mode == "native"
        else 'Action: calculator\nAction Input: {"expression": "2**15-1000"}'
    )
    goal = "What is 2 to the power 15, minus 1000?"
    script = [first, f"{prefix}Thank you for providing the result.", f"{prefix}It is 31768."]
    result = Agent(ScriptedModel(script, tools=mode == "native"), tools=[calculator], mode=mode).run_sync(
        goal
    )  # type: ignore[arg-type]
    assert result.output == "It is 31768."
    told = [m.content for m in result.state.messages if m.kind == "correction"]
    assert (
        len(told) == 1 and told[0].startswith("Your reply only acknowledged the results") and goal in told[0]
    )

    thanks_twice = [first, f"{prefix}Thanks!", f"{prefix}You're welcome, glad to help!"]
    again = Agent(ScriptedModel(thanks_twice, tools=mode == "native"), tools=[calculator], mode=mode)  # type: ignore[arg-type]
    assert again.run_sync(goal).output == "31768"  # told once: what the tool found is the answer


def test_thanks_with_content_or_for_a_goal_about_thanks_is_the_answer() -> None:
    @tool
    def lookup(name: str) -> str:
        """Look a name up."""
        return "Paris"

    call_it = {"tool_calls": [{"name": "lookup", "args": {"name": "capital"}}]}
    for goal, answer in [
        ("What is the capital of France?", "Thank you! The capital is Paris."),
        ("What is the capital of France?", "Thanks, it has 2 million people."),
        ("Write a thank-you note", "Thank you for the help!"),
    ]:
        result = Agent(ScriptedModel([call_it, answer]), tools=[lookup]).run_sync(goal)
        assert result.output == answer


async def test_a_result_listing_ids_with_titles_names_the_tool_that_reads_one() -> None:
    """The 1.5B model read a search result's title as the whole article ("it doesn't specify the validity
    time") and never called read_article."""

    @tool
    def search_help(query: str) -> str:
        """Search the help centre."""
        return "KB-17: Resetting your password\nKB-31: Two-factor authentication"

    @tool
    def read_article(article_id: str) -> str:
        """An article's text."""
        return "The reset link is valid for 45 minutes."

    @tool
    def order_status(order_id: str) -> str:
        """An order's status."""
        return "ORD-1: shipped on 2026-03-14 via DHL"

    model = ScriptedModel(
        [
            call("search_help", query="password reset"),
            call("read_article", article_id="KB-17"),
            call("search_help", query="reset"),  # one was read: no note
            "45 minutes",
        ]
    )
    result = await Agent(model, tools=[search_help, read_article]).run("How long is a reset link valid?")
    outputs = [m.content for m in result.state.messages if m.role == "tool"]
    assert outputs[0] == (
        "KB-17: Resetting your password\nKB-31: Two-factor authentication\n\n"
        'Note: this lists ids and names only, not what they hold. Next, call read_article with {"article_id": '
        '"KB-17"} to read one.'
    )
    assert outputs[1] == "The reset link is valid for 45 minutes."
    assert "Note:" not in outputs[2]

    # No tool takes such an id, or the result is a record of its own tool: no note.
    for tools in ([search_help], [order_status, search_help]):
        model = ScriptedModel(
            [
                call(tools[0].name, **({"query": "x"} if tools[0] is search_help else {"order_id": "ORD-1"})),
                "done",
            ]
        )
        result = await Agent(model, tools=tools).run("Look it up.")
        assert "Note:" not in next(m.content for m in result.state.messages if m.role == "tool")


async def test_a_failed_call_whose_error_gives_the_form_of_an_argument_is_told_to_rewrite_it() -> None:
    """Suite C's book_room, seed 0: told "start must be a 24-hour time written HH:MM, like 08:30 or 17:00,
    not '3pm'", the 1.5B model called time_in to turn 3pm into 15:00 until the guards stopped it. The error
    now ends with a note to rewrite the value itself and call the tool again."""
    booked: list[str] = []

    @tool
    def book_room(room: str, start: str) -> str:
        """Book a meeting room."""
        if not start[:2].isdigit() or ":" not in start:
            raise ValueError(
                f"start must be a 24-hour time written HH:MM, like 08:30 or 17:00, not {start!r}"
            )
        booked.append(f"{room} {start}")
        return f"booked {room} at {start}"

    @tool
    def time_in(time: str, from_city: str, to_city: str) -> str:
        """A clock time in another city."""
        return time

    model = ScriptedModel(
        [
            'Thought: book\nAction: book_room\nAction Input: {"room": "Fjord", "start": "3pm"}',
            'Thought: 3pm is 15:00\nAction: book_room\nAction Input: {"room": "Fjord", "start": "15:00"}',
            "Final Answer: Booked.",
        ],
        tools=False,
    )
    result = await Agent(model, tools=[book_room, time_in]).run("Book the Fjord room from 3pm.")
    first = [m.content for m in result.state.messages if m.role == "tool"][0]
    assert first.endswith(
        "not '3pm'\nNote: the error says how start must be written. Rewrite \"3pm\" in that form yourself and "
        "call book_room again with it."
    )
    assert booked == ["Fjord 15:00"] and result.output == "Booked."

    @tool
    def stock_level(sku: str) -> str:
        """Units in stock by SKU."""
        raise ValueError(f"{sku!r} is not a SKU code; sku must be like SKU-0000. Use time_in to get it.")

    model = ScriptedModel(
        ['Thought: x\nAction: stock_level\nAction Input: {"sku": "widget"}', "Final Answer: ?"]
    )
    result = await Agent(model, tools=[stock_level, time_in]).run("How many widgets?")
    assert "Note:" not in [m.content for m in result.state.messages if m.role == "tool"][0]  # it names a tool


async def test_a_tool_already_called_inside_the_calculator_is_told_to_write_its_values() -> None:
    """Suite C's hinge_value: after site_stock answered, the 1.5B model sent a comprehension over
    `site_stock['zones']` to the calculator; told to call site_stock first, it called it again (and again,
    until the guards blocked it). Once the tool has answered, the note says to write its values instead."""

    @tool
    def site_stock(site: str) -> dict[str, object]:
        """Stock by bin."""
        return {"bins": [{"sku": "HINGE-H40", "qty": 35}]}

    expression = "sum([bin['qty'] for bin in site_stock['zones'][2]['bins'] if bin['sku'] == 'HINGE-H40'])"
    model = ScriptedModel(
        [call("site_stock", site="Hamburg"), call("calculator", expression=expression), "35"]
    )
    result = await Agent(model, tools=[calculator, site_stock]).run("x")
    refused = [m.content for m in result.state.messages if m.role == "tool"][1]
    assert refused.endswith(
        "\nNote: site_stock is a tool, which calculator cannot read. Its result is above: write the values you "
        "need from it as numbers in calculator."
    )
    assert "'bin', 'site_stock' are not numbers" in refused


async def test_no_form_note_when_the_argument_is_not_what_the_error_says_must_be_so() -> None:
    """Suite A's translate after the note was added: the calculator's own error ("… use numbers … like
    sqrt(x) … Put the numbers themselves in the expression") got the note, and the 1.5B model sent the
    sentence to the calculator three times. The argument must be the subject: `start must be …`."""
    model = ScriptedModel(
        [call("calculator", expression="translate 'good morning' into Spanish"), "Buenos días."]
    )
    result = await Agent(model, tools=[calculator]).run("Translate 'good morning' into Spanish.")
    assert "Note: the error says how" not in [m.content for m in result.state.messages if m.role == "tool"][0]

    @tool
    def trains(date: str) -> str:
        """Trains on a date."""
        raise ValueError(f"date {date!r} is not YYYY-MM-DD (like 2027-03-24)")

    model = ScriptedModel([call("trains", date="dec 12 2026"), "?"])
    result = await Agent(model, tools=[trains]).run("x")
    assert [m.content for m in result.state.messages if m.role == "tool"][0].endswith(
        'Note: the error says how date must be written. Rewrite "dec 12 2026" in that form yourself and call '
        "trains again with it."
    )
