"""`Agent.stream()` and `on_event` under fault: consumers that stop, raise, are cancelled or lag; every stop
reason ends with `done`; `seq` has no gaps; every event survives a JSON round-trip."""

from __future__ import annotations

import asyncio
import logging
import typing
import warnings
from typing import Any

import pytest

from thinkloop import (
    Agent,
    Budget,
    ConfigurationError,
    ModelRequest,
    Price,
    PriceTable,
    RiskLevel,
    StopReason,
    UserError,
    tool,
)
from thinkloop._messages import ToolCall, Usage
from thinkloop.events import Done, Event, RunResult, event_from_json
from thinkloop.testing import FunctionModel, ScriptedModel


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "args": args}]}


def forever(request: ModelRequest) -> dict[str, Any]:
    return call("add", a=1, b=request.turn)  # never answers: a new call each step


class Ended:
    """An agent-wide sink that records every event and lets a test await a run's `done`."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.done = asyncio.Event()

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        if isinstance(event, Done):
            self.done.set()

    async def result(self) -> RunResult:
        await asyncio.wait_for(self.done.wait(), 5)
        last = self.events[-1]
        assert isinstance(last, Done)
        return last.result


def endless_agent() -> tuple[Agent, Ended]:
    ended = Ended()
    return Agent(FunctionModel(forever, latency=0.001), tools=[add], on_event=ended), ended


def other_tasks(before: set[asyncio.Task[Any]]) -> set[asyncio.Task[Any]]:
    return {t for t in asyncio.all_tasks() if t not in before and t is not asyncio.current_task()}


# ============================================================================== consumers that stop


async def test_breaking_out_after_the_first_event_cancels_the_run() -> None:
    agent, ended = endless_agent()
    before = asyncio.all_tasks()
    async for event in agent.stream("forever"):
        assert event.type == "run_started"
        break  # the generator is dropped here: asyncio closes it, which cancels the run
    result = await ended.result()
    assert result.stop_reason is StopReason.CANCELLED and agent._active == {}
    await asyncio.gather(*other_tasks(before), return_exceptions=True)  # the generator's closing, if left
    assert not other_tasks(before)


async def test_a_consumer_that_raises_inside_the_loop_cancels_the_run() -> None:
    agent, ended = endless_agent()
    with pytest.raises(ValueError, match="consumer bug"):
        async for event in agent.stream("forever"):
            if event.type == "tool_result":
                raise ValueError("consumer bug")
    assert (await ended.result()).stop_reason is StopReason.CANCELLED


async def test_a_cancelled_consumer_cancels_the_run_and_leaks_no_task() -> None:
    agent, ended = endless_agent()
    before = asyncio.all_tasks()
    seen = asyncio.Event()

    async def consume() -> None:
        async for event in agent.stream("forever"):
            if event.type == "tool_result":
                seen.set()

    consumer = asyncio.create_task(consume())
    await seen.wait()
    consumer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await consumer
    result = await ended.result()
    assert result.stop_reason is StopReason.CANCELLED and result.state.finished
    assert not other_tasks(before)


async def test_aclose_before_the_first_event_starts_no_run() -> None:
    agent, ended = endless_agent()
    stream = agent.stream("forever")
    await stream.aclose()  # type: ignore[attr-defined]
    assert ended.events == [] and agent._active == {}


async def test_a_consumer_that_does_not_read_for_a_while_loses_no_event() -> None:
    """The run does not wait for its reader: its events are queued (at most one run's worth)."""
    ended = Ended()
    agent = Agent(
        ScriptedModel([call("add", a=1, b=2), "The sum is 3."], stream_chunk=2), tools=[add], on_event=ended
    )
    stream = agent.stream("1+2")
    first = await anext(stream)  # type: ignore[call-overload]
    await ended.result()  # the run finished while nobody read its stream
    rest = [event async for event in stream]  # type: ignore[attr-defined]
    assert [first, *rest] == ended.events and rest[-1].type == "done"


async def test_two_concurrent_streams_of_one_agent_are_separate_runs() -> None:
    agent = Agent(FunctionModel(lambda r: call("add", a=1, b=1) if r.turn == 0 else "2"), tools=[add])

    async def collect(goal: str) -> list[Event]:
        return [event async for event in agent.stream(goal)]

    one, two = await asyncio.gather(collect("one"), collect("two"))
    assert one[0].run_id != two[0].run_id
    for events in (one, two):
        assert {e.run_id for e in events} == {events[0].run_id}
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert isinstance(events[-1], Done) and events[-1].result.output == "2"


async def test_a_listener_that_raises_does_not_break_the_stream(caplog: pytest.LogCaptureFixture) -> None:
    def buggy(event: Event) -> None:
        if event.type == "tool_call":
            raise RuntimeError("listener bug")

    agent = Agent(ScriptedModel([call("add", a=1, b=2), "3"]), tools=[add], on_event=buggy)
    with caplog.at_level(logging.ERROR, logger="thinkloop.events"):
        events = [event async for event in agent.stream("1+2")]
    assert isinstance(events[-1], Done) and events[-1].result.output == "3"
    assert "listener bug" in caplog.text and caplog.text.count("gets no more events") == 1


async def test_a_usage_error_surfaces_at_the_first_read() -> None:
    agent = Agent(ScriptedModel(["x"]))
    with pytest.raises(UserError, match="the goal must be a non-empty string"):
        async for _ in agent.stream("  "):
            pass


# ================================================================== every stop reason ends with done


def _agents() -> dict[StopReason, tuple[Agent, Budget | None]]:
    looping = FunctionModel(lambda r: call("add", a=1, b=1) if r.tools else "best effort")
    return {
        StopReason.FINAL_ANSWER: (Agent(ScriptedModel([call("add", a=1, b=2), "3"]), tools=[add]), None),
        StopReason.ERROR: (Agent(ScriptedModel([call("add", a=1, b=2)]), tools=[add]), None),
        StopReason.MAX_STEPS: (Agent(FunctionModel(forever), tools=[add]), Budget(max_steps=3)),
        StopReason.MAX_TOKENS: (Agent(FunctionModel(forever), tools=[add]), Budget(max_tokens=600)),
        StopReason.MAX_COST: (
            Agent(FunctionModel(forever), tools=[add], price_table=PriceTable({"function": Price(1e6, 0.0)})),
            Budget(max_cost=500.0),  # $1 per input token
        ),
        StopReason.TIMEOUT: (Agent(FunctionModel(forever, latency=0.02), tools=[add]), Budget(timeout=0.1)),
        StopReason.DANGEROUS_LOOP: (Agent(looping, tools=[add]), None),
    }


@pytest.mark.parametrize("reason", list(_agents()))
async def test_every_stop_reason_ends_with_done_numbered_without_gaps_and_json_safe(
    reason: StopReason,
) -> None:
    agent, budget = _agents()[reason]
    events = [event async for event in agent.stream("go", budget=budget)]
    last = events[-1]
    assert isinstance(last, Done) and last.result.stop_reason is reason
    assert sum(isinstance(e, Done) for e in events) == 1 and events[0].type == "run_started"
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert all(e.run_id == last.result.run_id for e in events)
    for event in events:
        assert event_from_json(event.model_dump_json()) == event


async def test_a_cancelled_stream_still_emits_done_to_the_listeners() -> None:
    agent, ended = endless_agent()
    stream = agent.stream("forever")
    async for event in stream:
        if event.type == "tool_result":
            break
    await stream.aclose()  # type: ignore[attr-defined]
    assert ended.events[-1].type == "done" and (await ended.result()).stop_reason is StopReason.CANCELLED
    assert [e.seq for e in ended.events] == list(range(1, len(ended.events) + 1))


def test_every_event_type_round_trips_through_json() -> None:
    from thinkloop import RunState

    state = RunState(agent_name="a", model="m", goal="g", stop_reason=StopReason.FINAL_ANSWER)
    values: dict[str, Any] = {
        "goal": "g", "model": "m", "mode": "native", "step": 1, "text": "ünïcode 😀", "call": ToolCall(id="c", name="add", arguments={"a": 1, "nested": [{"x": None}]}),
        "risk": RiskLevel.HIGH, "call_id": "c", "name": "add", "output": "3", "success": True, "duration": 0.5,
        "max_steps": 4, "usage": Usage(input_tokens=3), "reason": "r", "from_mode": "native", "to_mode": "react",
        "attempt": 2, "error": "boom", "next_action": "retry", "tasks": [{"id": "t1", "tool": "add"}],
        "levels": [["t1"]], "task_id": "t1", "tool": "add", "arguments": {"a": 1}, "level": 0, "message": "m",
        "result": RunResult.from_state(state),
    }  # fmt: skip
    members = typing.get_args(typing.get_args(Event)[0])
    assert len(members) == 19
    own = {
        "TaskSkipped": {"reason": "cancelled"},
        "AnswerReset": {"reason": "tool_calls"},
    }  # fields whose values are a closed set of their own
    for cls in members:
        given = {**values, **own.get(cls.__name__, {})}
        required = {k: given[k] for k, f in cls.model_fields.items() if f.is_required()}
        event = cls(**required, run_id="r", seq=7)
        assert event_from_json(event.model_dump_json()) == event, cls.__name__
        assert event_from_json(event.model_dump(mode="json")) == event, cls.__name__


async def test_an_async_listener_is_refused_with_a_clear_error() -> None:
    async def sink(event: Event) -> None: ...

    class AsyncSink:
        async def __call__(self, event: Event) -> None: ...

    for bad in (sink, AsyncSink()):
        with pytest.raises(
            ConfigurationError, match="is an async function: listeners are called, not awaited"
        ):
            Agent(ScriptedModel(["hi"]), on_event=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="async function"):
            await Agent(ScriptedModel(["hi"])).run("go", on_event=bad)  # type: ignore[arg-type]


async def test_a_listener_returning_an_awaitable_is_dropped_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    got: list[Event] = []

    async def record(event: Event) -> None:
        got.append(event)

    agent = Agent(ScriptedModel(["hi"]), on_event=lambda event: record(event))  # a lambda hides the async def
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "coroutine ... was never awaited" per event
        with caplog.at_level(logging.ERROR, logger="thinkloop.events"):
            result = await agent.run("go")
    assert result.output == "hi" and got == []
    assert caplog.text.count("is async: listeners are called, not awaited") == 1


async def test_a_lone_surrogate_in_a_streamed_answer_stays_json_safe() -> None:
    model = ScriptedModel(["the answer \ud83d is here"], stream_chunk=4)
    events = [event async for event in Agent(model).stream("go")]
    deltas = [e for e in events if e.type == "answer_delta"]
    for event in events:
        event.model_dump_json()  # raised PydanticSerializationError: `thinkloop run --json` lost every later event
    assert "".join(e.text for e in deltas) == "the answer \ufffd is here"  # type: ignore[attr-defined]
    assert isinstance(events[-1], Done) and events[-1].result.output == "the answer \ufffd is here"


# ------------------------------------------------------------------- answer_delta is the answer, or retracted

ADD_2_3 = 'Action: add\nAction Input: {"a": 2, "b": 3}'
STREAM_CASES: dict[str, tuple[str, list[Any]]] = {
    "react: an action, then an answer in the same reply": (
        "react", [f"Thought: add them\n{ADD_2_3}\nFinal Answer: 6", "Final Answer: 5"]
    ),
    "react: an observation the model invented": ("react", [f"{ADD_2_3}\nObservation: 99\nFinal Answer: 99", "Final Answer: 5"]),
    "react: an answer sent back (a number no result gives)": ("react", [ADD_2_3, "Final Answer: 4217", "Final Answer: 5"]),
    "react: an answer without its label": ("react", [ADD_2_3, "The sum is 5."]),
    "react: a bold label": ("react", [ADD_2_3, "**Final Answer:** 5"]),
    "react: the label split over chunks": ("react", [ADD_2_3, "Thought: done\nFinal   Answer:\n\n  5\n"]),
    "native: text before a tool call": (
        "native", [{"text": "Let me compute that.", **call("add", a=2, b=3)}, "It is 5."]
    ),
    "native: a reasoning block": ("native", ["<think>2+3, easy</think>\n\nIt is 5."]),
    "native: a reasoning block never closed": ("native", ["<think>2+3 is 5"]),
    "native: the ReAct format": ("native", ["Thought: easy\nFinal Answer: It is 5."]),
    "native: whitespace around": ("native", ["  It is 5.\n"]),
    "native: a tool call written as text": ("native", ['{"name": "add", "arguments": {"a": 2, "b": 3}}', "5"]),
}  # fmt: skip


async def _deltas_since_reset(agent: Agent, goal: str) -> tuple[str, list[str], Any]:
    shown, kinds = "", []
    async for event in agent.stream(goal):
        if event.type == "answer_delta":
            shown += event.text
            kinds.append("delta")
        elif event.type == "answer_reset":
            shown = ""
            kinds.append(f"reset:{event.reason}")
    assert event.type == "done"
    return shown, kinds, event.result


@pytest.mark.parametrize("chunk", [1, 3, 8, 1000])
@pytest.mark.parametrize("case", list(STREAM_CASES))
async def test_the_answer_deltas_since_the_last_reset_are_the_answer(case: str, chunk: int) -> None:
    """Text streamed that turned out not to be the answer (a thought before tool calls, an answer the loop
    did not take, a labelled or reasoning reply) is retracted with `answer_reset`; the deltas after the last
    reset join to `result.output` — however the reply was cut into chunks."""
    mode, script = STREAM_CASES[case]
    model = ScriptedModel(script, tools=mode == "native", stream_chunk=chunk)
    shown, kinds, result = await _deltas_since_reset(Agent(model, tools=[add], mode=mode), "What is 2+3?")
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert shown == result.output and result.output.strip()
    assert "<think>" not in "".join(kinds) and not result.output.startswith(("Thought", "<think"))


async def test_a_thought_streamed_before_a_tool_call_is_retracted_at_once() -> None:
    model = ScriptedModel([{"text": "Let me add.", **call("add", a=2, b=3)}, "It is 5."])
    events = [e async for e in Agent(model, tools=[add]).stream("What is 2+3?")]
    kinds = [e.type for e in events]
    reset = kinds.index("answer_reset")
    assert kinds[:reset].count("answer_delta") >= 1 and "tool_call" not in kinds[:reset]
    assert kinds[reset + 1 :].index("tool_call") >= 0  # the reset came before the tool ran
    assert events[reset].reason == "tool_calls"  # type: ignore[union-attr]


async def test_a_reasoning_block_is_never_streamed_as_the_answer() -> None:
    model = ScriptedModel(["<think>secret reasoning</think>It is 5."], stream_chunk=2)
    events = [e async for e in Agent(model).stream("What is 2+3?")]
    deltas = [e.text for e in events if e.type == "answer_delta"]
    assert "".join(deltas) == "It is 5." and "answer_reset" not in [e.type for e in events]


async def test_a_forced_final_answer_is_streamed_too() -> None:
    """The best-effort answer after a budget stop comes from a call that does not stream: it still reaches
    the stream as `answer_delta`, so that a consumer of deltas gets every run's answer."""
    model = ScriptedModel([call("add", a=1, b=1), "Best effort: 2."], stream_chunk=3)
    shown, kinds, result = await _deltas_since_reset(
        Agent(model, tools=[add], budget=Budget(max_steps=1)), "1+1?"
    )
    assert result.stop_reason is StopReason.MAX_STEPS and result.forced_final
    assert shown == result.output == "Best effort: 2." and kinds == ["delta"]


async def test_an_answer_the_output_type_refused_is_retracted() -> None:
    from pydantic import BaseModel

    class Sum(BaseModel):
        total: int

    model = ScriptedModel(["about five", '{"total": 5}'])
    shown, kinds, result = await _deltas_since_reset(Agent(model, output_type=Sum), "2+3?")
    assert kinds.count("reset:correction") == 1 and shown == result.output == '{"total": 5}'


async def test_a_run_that_is_not_streamed_emits_no_answer_deltas() -> None:
    events: list[Event] = []
    result = await Agent(ScriptedModel(["It is 5."]), on_event=events.append).run("2+3?")
    assert result.output == "It is 5." and not [
        e for e in events if e.type in ("answer_delta", "answer_reset")
    ]
