"""Traces (SPEC §13.3): every run becomes an OpenTelemetry trace, checked with the real SDK."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from thinkloop import Agent, Budget, ModelError, ModelRetryableError, StopReason, tool
from thinkloop.testing import FunctionModel, ScriptedModel
from thinkloop.tracing import OpenTelemetryTracing, json_lines_provider


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def broken(x: int) -> int:
    """Always fails."""
    raise RuntimeError(f"broken for {x}")


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def by_name(finished: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for span in finished:
        out.setdefault(span.name, []).append(span)
    return out


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "args": args}]}


async def test_a_run_is_one_trace_with_a_span_per_model_call_and_tool_call(spans: Any) -> None:
    provider, exporter = spans
    agent = Agent(ScriptedModel([call("add", a=2, b=3), "5"]), tools=[add], name="adder")
    result = await agent.run("What is 2+3?", on_event=OpenTelemetryTracing(provider))
    finished = exporter.get_finished_spans()
    named = by_name(finished)
    assert sorted(named) == ["chat script", "execute_tool add", "invoke_agent adder"]
    (run,) = named["invoke_agent adder"]
    chats, (tool_span,) = named["chat script"], named["execute_tool add"]
    assert len(chats) == 2
    assert all(s.parent is not None and s.parent.span_id == run.context.span_id for s in [*chats, tool_span])
    assert len({s.context.trace_id for s in finished}) == 1
    assert run.attributes is not None and chats[0].attributes is not None and tool_span.attributes is not None
    assert run.attributes["thinkloop.run_id"] == result.run_id
    assert run.attributes["thinkloop.stop_reason"] == "final_answer"
    assert run.attributes["gen_ai.usage.input_tokens"] == result.usage.input_tokens
    assert run.status.status_code is StatusCode.UNSET
    assert chats[0].kind is SpanKind.CLIENT and chats[0].attributes["gen_ai.operation.name"] == "chat"
    assert (
        sum(int(c.attributes["gen_ai.usage.output_tokens"]) for c in chats if c.attributes)
        == result.usage.output_tokens
    )
    assert (
        tool_span.attributes["gen_ai.tool.name"] == "add"
        and tool_span.attributes["thinkloop.success"] is True
    )
    assert "gen_ai.tool.call.arguments" not in tool_span.attributes  # no content unless asked
    # the spans nest in time: the run contains its calls, which come in order
    assert run.start_time is not None and run.end_time is not None
    assert all(s.start_time is not None and s.end_time is not None for s in [*chats, tool_span])
    assert run.start_time <= chats[0].start_time <= chats[0].end_time <= tool_span.start_time  # type: ignore[operator]
    assert tool_span.end_time <= chats[1].start_time and chats[1].end_time <= run.end_time  # type: ignore[operator]


async def test_failures_are_error_spans_and_content_is_captured_when_asked(spans: Any) -> None:
    provider, exporter = spans
    script = [call("broken", x=1), call("nope"), "I could not do it."]
    agent = Agent(ScriptedModel(script), tools=[broken])
    await agent.run("Break it", on_event=OpenTelemetryTracing(provider, capture_content=True))
    named = by_name(exporter.get_finished_spans())
    (failed,) = named["execute_tool broken"]
    (unknown,) = named["execute_tool nope"]
    assert failed.status.status_code is StatusCode.ERROR and failed.attributes is not None
    assert (
        failed.attributes["error.type"] == "exception"
        and failed.attributes["gen_ai.tool.call.arguments"] == '{"x": 1}'
    )
    assert "broken for 1" in str(failed.attributes["gen_ai.tool.call.result"])
    assert unknown.attributes is not None and unknown.attributes["error.type"] == "unknown_tool"
    (run,) = named["invoke_agent agent"]
    assert run.attributes is not None and run.attributes["thinkloop.answer"] == "I could not do it."
    assert run.attributes["thinkloop.goal"] == "Break it"


async def test_an_errored_run_and_retries_show_on_the_run_span(spans: Any) -> None:
    provider, exporter = spans
    attempts = 0

    def flaky(request: Any) -> str:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise ModelRetryableError("overloaded", provider="test", scope="chat", retry_after=0.001)
        raise ModelError("the model broke", provider="test", scope="chat")

    agent = Agent(FunctionModel(flaky), model_retries=1)
    result = await agent.run("go", on_event=OpenTelemetryTracing(provider))
    assert result.stop_reason is StopReason.ERROR
    (run,) = by_name(exporter.get_finished_spans())["invoke_agent agent"]
    assert run.status.status_code is StatusCode.ERROR and run.attributes is not None
    assert run.attributes["error.type"] == "error"
    names = [event.name for event in run.events]
    assert names[0] == "model_attempt" and "error" in names


async def test_runs_nest_under_the_callers_span_and_concurrent_runs_get_their_own_traces(spans: Any) -> None:
    provider, exporter = spans
    tracing = OpenTelemetryTracing(provider)
    tracer = provider.get_tracer("app")
    model = FunctionModel(lambda r: call("add", a=1, b=1) if r.turn == 0 else "2", name="script")
    agent = Agent(model, tools=[add], on_event=tracing)
    with tracer.start_as_current_span("request") as outer:
        await agent.run("one")
    await asyncio.gather(agent.run("two"), agent.run("three"))
    finished = exporter.get_finished_spans()
    runs = by_name(finished)["invoke_agent agent"]
    assert len(runs) == 3
    first = next(s for s in runs if s.parent is not None)
    assert first.parent is not None and first.parent.span_id == outer.get_span_context().span_id
    others = [s for s in runs if s is not first]
    assert all(s.parent is None for s in others) and others[0].context.trace_id != others[1].context.trace_id
    for run in runs:  # each run's calls are under its own span
        children = [s for s in finished if s.parent is not None and s.parent.span_id == run.context.span_id]
        assert sorted(s.name for s in children) == ["chat script", "chat script", "execute_tool add"]


async def test_a_stopped_run_marks_the_final_answer_call(spans: Any) -> None:
    provider, exporter = spans
    model = FunctionModel(lambda r: call("add", a=r.turn, b=1) if r.tools else "best effort")
    await Agent(model, tools=[add], budget=Budget(max_steps=2)).run(
        "go", on_event=OpenTelemetryTracing(provider)
    )
    chats = by_name(exporter.get_finished_spans())["chat function"]
    assert [c.attributes["thinkloop.final_answer_call"] for c in chats if c.attributes] == [
        False,
        False,
        True,
    ]


def test_json_lines_provider_writes_one_span_per_line(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    provider = json_lines_provider(str(path))
    Agent(ScriptedModel([call("add", a=2, b=3), "5"]), tools=[add]).run_sync(
        "2+3?", on_event=OpenTelemetryTracing(provider)
    )
    provider.shutdown()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(line["name"] for line in lines) == [
        "chat script",
        "chat script",
        "execute_tool add",
        "invoke_agent agent",
    ]
    assert len({line["context"]["trace_id"] for line in lines}) == 1


# ================================================================================== faults (audit)


@pytest.mark.parametrize("where", ["directory", "missing_parent"])
def test_json_lines_provider_checks_its_file_when_made(tmp_path: Path, where: str) -> None:
    from thinkloop import ConfigurationError

    path = tmp_path if where == "directory" else tmp_path / "nope" / "trace.jsonl"
    with pytest.raises(ConfigurationError, match="cannot write the trace file") as caught:
        json_lines_provider(str(path))
    assert str(path) in str(caught.value) and "directory that exists" in str(caught.value)


def test_json_lines_provider_logs_a_write_failure_once_and_the_run_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "trace.jsonl"
    provider = json_lines_provider(path)
    path.unlink()
    path.mkdir()  # the file became unwritable after the check (as a full disk would)
    agent = Agent(ScriptedModel([call("add", a=2, b=3), call("add", a=1, b=1), "5"]), tools=[add])
    with caplog.at_level("DEBUG"):
        result = agent.run_sync("2+3?", on_event=OpenTelemetryTracing(provider))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    failures = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert len(failures) == 1 and "cannot write the trace file" in failures[0].getMessage()


async def test_names_and_ids_a_model_sends_are_cut_in_spans(spans: Any) -> None:
    provider, exporter = spans
    huge = "x" * 100_000
    script = [{"tool_calls": [{"name": huge, "args": {}, "id": "c" * 50_000}]}, "ok"]
    await Agent(ScriptedModel(script), tools=[add]).run("go", on_event=OpenTelemetryTracing(provider))
    (tool_span,) = [s for s in exporter.get_finished_spans() if s.name.startswith("execute_tool")]
    assert tool_span.attributes is not None and len(tool_span.name) <= 220
    assert len(str(tool_span.attributes["gen_ai.tool.name"])) == 200
    assert len(str(tool_span.attributes["gen_ai.tool.call.id"])) == 200


async def test_an_interrupted_run_resumed_in_the_same_process_ends_its_first_span(
    spans: Any, tmp_path: Path
) -> None:
    from thinkloop.stores import SQLiteStore

    provider, exporter = spans
    tracing = OpenTelemetryTracing(provider)
    store = SQLiteStore(str(tmp_path / "runs.db"))
    waiting = asyncio.Event()

    async def slow(request: Any) -> Any:
        if request.turn == 1:
            waiting.set()
            await asyncio.Event().wait()  # until interrupted
        return call("add", a=1, b=2)

    agent = Agent(FunctionModel(slow, name="script"), tools=[add], store=store, on_event=tracing)
    task = asyncio.create_task(agent.run("go", run_id="r1"))
    await waiting.wait()
    assert agent.interrupt("r1") == ["r1"]
    with pytest.raises(asyncio.CancelledError):
        await task
    resumed = Agent(ScriptedModel(["3"]), tools=[add], store=store, on_event=tracing)
    await resumed.resume("r1")
    runs = by_name(exporter.get_finished_spans())["invoke_agent agent"]
    assert len(runs) == 2  # the first part was never ended (nor exported): its calls had no parent
    first = next(s for s in runs if s.attributes and s.attributes.get("thinkloop.interrupted"))
    second = next(s for s in runs if s is not first)
    assert (
        first.end_time is not None and second.start_time is not None and first.end_time <= second.start_time
    )
    assert tracing._runs == {} and tracing._last == {}


async def test_a_run_whose_store_fails_ends_its_span_with_an_error(spans: Any, tmp_path: Path) -> None:
    # a first save that failed (a file that is no database) left `run_started` as the last event and the
    # run's span open for ever (one leaked per attempt); now an `error` with `stopped` ends both
    from thinkloop import StateError
    from thinkloop.stores import SQLiteStore

    provider, exporter = spans
    tracing = OpenTelemetryTracing(provider)
    path = tmp_path / "runs.db"
    path.write_bytes(b"garbage" * 200)
    for _ in range(2):
        events: list[Any] = []
        agent = Agent(ScriptedModel(["x"]), store=SQLiteStore(path), on_event=tracing)
        with pytest.raises(StateError):
            await agent.run("goal", on_event=events.append)
        assert [e.type for e in events] == ["run_started", "error"] and events[-1].stopped
    runs = by_name(exporter.get_finished_spans())["invoke_agent agent"]
    assert len(runs) == 2 and all(s.status.status_code is StatusCode.ERROR for s in runs)
    assert tracing._runs == {} and tracing._last == {}


async def test_a_second_run_under_a_taken_id_says_why_after_run_started() -> None:
    agent = Agent(ScriptedModel(["one", "two"]))
    await agent.run("first", run_id="same")
    events: list[Any] = []
    with pytest.raises(Exception, match="already exists in the store"):
        await agent.run("second", run_id="same", on_event=events.append)
    assert [e.type for e in events] == ["run_started", "error"]
    assert events[-1].stopped and "already exists in the store" in events[-1].message
