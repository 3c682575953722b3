"""Faults at the tool boundary: what a tool returns, raises or hangs on, what a model sends it, and a tool
defined wrongly. Each must end as an observation the model can act on (or a clear error when the tool is
defined), with the run's state still saved and readable."""

from __future__ import annotations

import asyncio
import datetime
import json
import math
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from thinkloop import Agent, ConfigurationError, RunState, Tool, ToolContext, tool
from thinkloop._tools import NO_OUTPUT, _ToolThreads, render_output
from thinkloop.models._openai import _parse_arguments
from thinkloop.stores import SQLiteStore
from thinkloop.testing import FunctionModel, ScriptedModel


def call(name: str, **args: object) -> dict[str, object]:
    return {"tool_calls": [{"name": name, "args": args}]}


def tool_outputs(state: RunState) -> list[str]:
    return [m.content for m in state.messages if m.role == "tool"]


def nested(depth: int) -> dict[str, Any]:
    value: Any = 1
    for _ in range(depth - 1):
        value = {"x": value}
    return {"data": value}


@tool
def keep(data: dict[str, Any]) -> str:
    """Keep a document."""
    return "kept"


# ------------------------------------------------------------------------------------ deep arguments


@pytest.mark.parametrize("as_text", [False, True])
async def test_arguments_nested_hundreds_deep_are_refused_and_the_state_still_saves(
    tmp_path: Path, as_text: bool
) -> None:
    # 300 levels: the state holding them could not be saved (pydantic refuses the depth) — the run
    # failed with a StateError that blamed the store and suggested resuming it.
    args: Any = nested(300)
    script = [{"tool_calls": [{"name": "keep", "args": json.dumps(args) if as_text else args}]}, "gave up"]
    store = SQLiteStore(tmp_path / "runs.db")
    result = await Agent(ScriptedModel(script), tools=[keep], store=store).run("x", run_id="r")
    assert result.output == "gave up"
    [observation] = tool_outputs(result.state)
    assert observation.startswith("Error: keep was not called: its arguments nest more than 64 levels deep.")
    saved = await store.load_state("r")
    assert saved is not None and tool_outputs(saved) == [observation]
    assert RunState.from_json(result.state.to_json()).messages == result.state.messages


async def test_arguments_nested_64_levels_deep_still_reach_the_tool() -> None:
    seen: list[dict[str, Any]] = []

    @tool
    def store_doc(data: dict[str, Any]) -> str:
        """Store a document."""
        seen.append(data)
        return "stored"

    args = nested(63)  # with the arguments object itself: 64 levels
    result = await Agent(ScriptedModel([call("store_doc", **args), "ok"]), tools=[store_doc]).run("x")
    assert tool_outputs(result.state) == ["stored"] and seen == [args["data"]]
    assert RunState.from_json(result.state.to_json()).messages == result.state.messages


def test_the_openai_adapter_reads_arguments_nested_too_deep_as_malformed() -> None:
    text = json.dumps(nested(100))
    parsed = _parse_arguments("c1", "keep", text)
    assert parsed.arguments == {} and parsed.raw_arguments == text
    shallow = _parse_arguments("c2", "keep", json.dumps(nested(10)))
    assert shallow.raw_arguments is None and shallow.arguments == nested(10)


async def test_arguments_nested_near_the_recursion_limit_do_not_crash_the_run() -> None:
    script = [{"tool_calls": [{"name": "keep", "args": nested(900)}]}, "gave up"]
    result = await Agent(ScriptedModel(script), tools=[keep]).run("x")
    assert result.output == "gave up"
    assert tool_outputs(result.state)[0].startswith("Error: keep was not called: its arguments nest")


# ------------------------------------------------------------------------------- text that is not UTF-8


async def test_an_error_naming_a_file_whose_name_is_not_utf8_is_told_and_saved(tmp_path: Path) -> None:
    # os.listdir() gives such names with lone surrogates (surrogateescape); the error text holding one
    # made the state impossible to save as JSON (only a successful output was made valid UTF-8).
    @tool
    def read(path: str) -> str:
        """Read a file."""
        name = b"caf\xe9.txt".decode("utf-8", "surrogateescape")
        raise LookupError(f"no file {name} here")

    store = SQLiteStore(tmp_path / "runs.db")
    agent = Agent(ScriptedModel([call("read", path="x"), "missing"]), tools=[read], store=store)
    result = await agent.run("x", run_id="r")
    assert result.output == "missing"
    [observation] = tool_outputs(result.state)
    assert observation == "Error: read raised LookupError: no file caf\ufffd.txt here"
    observation.encode("utf-8")  # valid: no lone surrogate left
    saved = await store.load_state("r")
    assert saved is not None and tool_outputs(saved) == [observation]
    events = [
        event
        async for event in Agent(ScriptedModel([call("read", path="x"), "missing"]), tools=[read]).stream("x")
    ]
    for event in events:
        event.model_dump_json()  # every event serialises (the web page and the CLI send them as JSON)


# ----------------------------------------------------------------------------------- what tools return


@pytest.mark.parametrize("value", [[""], ["", "  "], ["\n"]])
def test_a_list_of_blank_texts_is_no_output(value: list[str]) -> None:
    assert render_output(value) == NO_OUTPUT


async def test_a_tool_returning_blank_lines_is_shown_as_no_output() -> None:
    @tool
    def lines() -> list[str]:
        """List lines."""
        return ["", ""]

    result = await Agent(ScriptedModel([call("lines"), "none"]), tools=[lines]).run("x")
    assert tool_outputs(result.state) == [NO_OUTPUT]


async def test_an_async_tool_returning_a_generator_shows_its_items() -> None:
    async def rows() -> AsyncIterator[str]:
        for row in ("alpha", "beta"):
            await asyncio.sleep(0)
            yield row

    def numbers() -> Iterator[int]:
        yield from (1, 2, 3)

    @tool
    async def fetch_rows() -> Any:
        """Fetch rows."""
        return rows()

    @tool
    async def fetch_numbers() -> Any:
        """Fetch numbers."""
        return numbers()

    script = [call("fetch_rows"), call("fetch_numbers"), "done"]
    result = await Agent(ScriptedModel(script), tools=[fetch_rows, fetch_numbers]).run("x")
    assert tool_outputs(result.state) == ["alpha\nbeta", "[1, 2, 3]"]


async def test_an_async_generator_returned_by_an_async_tool_is_bounded_by_its_timeout() -> None:
    async def endless() -> AsyncIterator[str]:
        while True:
            await asyncio.sleep(0.01)
            yield "more"

    @tool(timeout=0.2)
    async def tail() -> Any:
        """Follow a log."""
        return endless()

    result = await Agent(ScriptedModel([call("tail"), "stopped"]), tools=[tail]).run("x")
    assert tool_outputs(result.state) == ["Error: tail was abandoned: it timed out after 0.2 s."]


# ------------------------------------------------------------------------------------- what models send


async def test_an_unknown_tool_name_of_a_whole_text_is_not_echoed_whole() -> None:
    name = "x" * 100_000
    result = await Agent(ScriptedModel([call(name), "sorry"]), tools=[keep]).run("x")
    [observation] = tool_outputs(result.state)
    assert observation.startswith(f"Error: there is no tool named {'x' * 100!r}… (100,000 characters).")
    assert len(observation) < 500 and observation.endswith("Available tools: keep.")


async def test_call_ids_a_model_reuses_from_step_to_step_each_keep_their_own_ledger_entry() -> None:
    # Some servers number calls per reply (`call_0` every time): the second call overwrote the first's
    # ledger entry, which then named the first tool with the second call's result.
    @tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    script = [
        {"tool_calls": [{"id": "call_0", "name": "weather", "args": {"city": "Paris"}}]},
        {"tool_calls": [{"id": "call_0", "name": "keep", "args": {"data": {"a": 1}}}]},
        "done",
    ]
    result = await Agent(ScriptedModel(script), tools=[weather, keep]).run("x")
    ledger = result.state.ledger
    assert len(ledger) == 2
    entries = sorted(ledger.values(), key=lambda entry: entry.step)
    assert [(e.name, e.arguments, e.output) for e in entries] == [
        ("weather", {"city": "Paris"}, "sunny in Paris"),
        ("keep", {"data": {"a": 1}}, "kept"),
    ]
    asked = [c.id for m in result.state.messages if m.role == "assistant" for c in m.tool_calls]
    answered = [m.tool_call_id for m in result.state.messages if m.role == "tool"]
    assert asked == answered and len(set(asked)) == 2 and asked[0] == "call_0"


async def test_calls_written_as_text_get_ids_unique_in_the_run_too() -> None:
    # Calls parsed from text get `text_<step>` / `react_<step>`: a native call of the same id at an
    # earlier step had its ledger entry overwritten, and the history held the id twice.
    from thinkloop import ModelResponse, ToolCall, validate_history

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    replies = [
        ModelResponse(tool_calls=[ToolCall(id="text_2", name="add", arguments={"a": 1, "b": 2})]),
        '{"name": "add", "arguments": {"a": 10, "b": 20}}',  # a call written as text, at step 2
        "3 and 30",
    ]
    result = await Agent(ScriptedModel(replies), tools=[add]).run("add 1+2 and 10+20")
    assert {entry.output for entry in result.state.ledger.values()} == {"3", "30"}
    asked = [c.id for m in result.state.messages for c in m.tool_calls]
    assert len(set(asked)) == 2 and asked == [
        m.tool_call_id for m in result.state.messages if m.role == "tool"
    ]
    validate_history(result.state.messages)


# --------------------------------------------------------------------------------- tools that hang


async def test_more_hung_sync_tools_than_worker_threads_do_not_block_the_calls_after_them() -> None:
    # 64 worker threads: a 65th call queued behind the hung ones, and every sync tool after them "timed
    # out" without ever running.
    release = threading.Event()

    @tool(timeout=0.1)
    def hang(n: int) -> str:
        """Hang until released."""
        release.wait(60)
        return "late"

    @tool(timeout=5)
    def quick() -> str:
        """Answer at once."""
        return "quick"

    hung = {"tool_calls": [{"name": "hang", "args": {"n": i}} for i in range(70)]}
    agent = Agent(ScriptedModel([hung, call("quick"), "done"]), tools=[hang, quick])
    try:
        result = await agent.run("x")
        outputs = tool_outputs(result.state)
        assert outputs[:70] == ["Error: hang was abandoned: it timed out after 0.1 s."] * 70
        assert outputs[70] == "quick" and result.output == "done"
    finally:
        release.set()


async def test_the_pool_starts_a_thread_for_each_abandoned_job_and_shrinks_back_when_it_ends() -> None:
    pool = _ToolThreads(1, max_abandoned=1)
    release = threading.Event()
    loop = asyncio.get_running_loop()
    stuck = asyncio.ensure_future(loop.run_in_executor(pool, release.wait, 30))
    await asyncio.sleep(0.05)
    stuck.cancel()  # given up on while it runs: abandoned
    assert await asyncio.wait_for(loop.run_in_executor(pool, lambda: "ran"), 5) == "ran"
    second = asyncio.ensure_future(loop.run_in_executor(pool, release.wait, 30))
    await asyncio.sleep(0.05)
    second.cancel()  # past max_abandoned: no third thread
    third = asyncio.ensure_future(loop.run_in_executor(pool, lambda: "queued"))
    await asyncio.sleep(0.1)
    assert not third.done()  # waits: the pool is at its limit
    release.set()
    assert await asyncio.wait_for(third, 5) == "queued"
    assert await asyncio.to_thread(_shrunk, pool), (pool._threads, pool._abandoned)


# --------------------------------------------------------------------------------- tools defined wrongly


def _noop(**_: Any) -> str:
    return ""


@pytest.mark.parametrize(
    ("parameters", "says"),
    [
        (["city"], "must be a JSON Schema object (a dict), not a list"),
        ({"type": "string"}, "must be an object schema"),
        ({"type": "object", "properties": ["city"]}, "'properties' must map each argument's name"),
        ({"type": "object", "properties": {"city": "string"}}, "the schema of 'city' must be a dict"),
        ({"type": "object", "properties": {}, "required": "city"}, "'required' must be a list"),
    ],
)
def test_a_hand_made_tool_with_a_malformed_schema_is_refused_when_made(parameters: Any, says: str) -> None:
    with pytest.raises(ConfigurationError, match="the parameters of tool 'lookup'") as raised:
        Tool("lookup", "Look up.", parameters, _noop)
    assert says in str(raised.value)


def test_a_hand_made_tool_needs_a_text_description() -> None:
    with pytest.raises(ConfigurationError, match="the description of tool 'lookup' must be text"):
        Tool("lookup", None, None, _noop)  # type: ignore[arg-type]


def test_well_formed_hand_made_schemas_are_taken() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "any": True}, "required": ["city"]}
    assert Tool("lookup", "Look up.", schema, _noop).parameters == schema
    assert Tool("lookup", "Look up.", {}, _noop).parameters == {"type": "object", "properties": {}}
    assert Tool("lookup", "Look up.", {"properties": {}}, _noop).parameters == {"properties": {}}


@pytest.mark.parametrize("timeout", ["5", math.nan, -1, 0, True])
def test_a_tool_timeout_must_be_a_positive_number(timeout: Any) -> None:
    with pytest.raises(ConfigurationError, match="the timeout of tool 'slow' must be a positive number"):
        tool(timeout=timeout)(_named("slow"))


@pytest.mark.parametrize("length", [0, -5, 2.5, True, "100"])
def test_a_tool_output_max_length_must_be_a_positive_whole_number(length: Any) -> None:
    with pytest.raises(ConfigurationError, match="the output_max_length of tool 'slow' must be a positive"):
        tool(output_max_length=length)(_named("slow"))


def test_valid_tool_limits_are_kept() -> None:
    made = tool(timeout=math.inf, output_max_length=50)(_named("slow"))
    assert made.timeout == math.inf and made.output_max_length == 50
    assert tool(timeout=0.5)(_named("slow")).timeout == 0.5


def _named(name: str) -> Any:
    def function() -> str:
        """Do it."""
        return "done"

    function.__name__ = function.__qualname__ = name
    return function


def _shrunk(pool: _ToolThreads) -> bool:
    """Whether the pool is back to its one thread, with no abandoned job (waited for up to 5 s)."""
    deadline = time.monotonic() + 5
    while (pool._threads, pool._abandoned) != (1, 0) and time.monotonic() < deadline:
        time.sleep(0.01)
    return (pool._threads, pool._abandoned) == (1, 0)


# ------------------------------------------------------------------------------------------- metadata


async def test_a_value_a_tool_puts_in_metadata_that_cannot_be_saved_is_removed_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # It failed every save of the run, as a StateError blaming the store and suggesting a resume.
    @tool
    def remember(ctx: ToolContext, note: str) -> str:
        """Remember a note."""
        ctx.metadata["note"] = note
        ctx.metadata["handle"] = threading.Lock()
        return "remembered"

    store = SQLiteStore(tmp_path / "runs.db")
    script = [call("remember", note="buy milk"), "done"]
    with caplog.at_level("WARNING", logger="thinkloop.tools"):
        result = await Agent(ScriptedModel(script), tools=[remember], store=store).run("x", run_id="r")
    assert result.output == "done" and tool_outputs(result.state) == ["remembered"]
    saved = await store.load_state("r")
    assert saved is not None and saved.metadata["note"] == "buy milk" and "handle" not in saved.metadata
    [warning] = [r.getMessage() for r in caplog.records if r.name == "thinkloop.tools"]
    assert warning.startswith("tool remember put metadata['handle'] (of type lock) in its ToolContext")


@pytest.mark.parametrize(
    ("metadata", "says"),
    [
        ({"handle": object()}, "metadata['handle'] (of type object) cannot be saved with the run's state"),
        ({"deep": nested(100)}, "metadata['deep'] (of type dict) cannot be saved"),
        # written, but never read back: every checkpoint "succeeded" and the run could not be resumed
        ({"n": 10**4400}, "metadata['n'] (of type int) cannot be saved"),
        ({"x": [1, {"r": float("nan")}]}, "metadata['x'] (of type list) cannot be saved"),  # saved as null
        ({"ok": 1, "inf": float("inf")}, "metadata['inf'] (of type float) cannot be saved"),
        (["not", "a", "dict"], "metadata must be a dict of JSON values, not a list"),
    ],
)
async def test_run_metadata_that_cannot_be_saved_is_refused_before_the_run(metadata: Any, says: str) -> None:
    model = ScriptedModel(["done"])
    with pytest.raises(ConfigurationError) as raised:
        await Agent(model).run("x", metadata=metadata)
    assert says in str(raised.value)
    assert model.requests == []  # refused before the model was asked anything


async def test_a_number_a_tool_puts_in_metadata_that_would_not_read_back_is_removed(tmp_path: Path) -> None:
    """An integer of 4,342 digits was saved at every checkpoint and refused by every load: the crashed run
    could never be resumed (DamagedRunError, "number out of range")."""

    @tool
    def remember(ctx: ToolContext, note: str) -> str:
        """Remember a note."""
        ctx.metadata.update(note=note, big=3**9100, ratio=float("nan"), digits=10**4298)
        return "remembered"

    store = SQLiteStore(tmp_path / "runs.db")
    script = [call("remember", note="n"), "done"]
    result = await Agent(ScriptedModel(script), tools=[remember], store=store).run("x", run_id="r")
    saved = await store.load_state("r")
    assert saved is not None and result.output == "done"
    assert {k: saved.metadata.get(k) for k in ("note", "big", "ratio")} == {
        "note": "n",
        "big": None,
        "ratio": None,
    }
    assert (
        "big" not in saved.metadata and "ratio" not in saved.metadata and saved.metadata["digits"] == 10**4298
    )


async def test_json_metadata_is_taken_as_it_is() -> None:
    metadata = {"user": "ada", "tags": ["a", "b"], "limits": {"n": 3, "ratio": 0.5, "on": True, "none": None}}
    result = await Agent(ScriptedModel(["done"])).run("x", metadata=metadata)
    assert result.state.metadata == metadata


async def test_each_run_has_its_own_copy_of_the_metadata_it_was_given() -> None:
    # the state held the caller's dict itself: two runs given the same defaults shared one dict, a
    # tool's note in one run appeared in the other's saved state, and the caller's dict changed too
    @tool
    def set_owner(ctx: ToolContext[None], owner: str) -> str:
        """Record who owns this run."""
        ctx.metadata["owner"] = owner
        ctx.metadata["tags"].append(owner)
        return "ok"

    def model(request: Any) -> Any:
        if request.turn == 0:
            return {"tool_calls": [{"name": "set_owner", "args": {"owner": request.messages[-1].content}}]}
        return "done"

    defaults: dict[str, Any] = {"tenant": "acme", "tags": []}
    agent = Agent(FunctionModel(model), tools=[set_owner])
    alice, bob = await asyncio.gather(
        agent.run("alice", metadata=defaults), agent.run("bob", metadata=defaults)
    )
    assert alice.state.metadata["owner"] == "alice" and alice.state.metadata["tags"] == ["alice"]
    assert bob.state.metadata["owner"] == "bob" and bob.state.metadata["tags"] == ["bob"]
    assert defaults == {"tenant": "acme", "tags": []}


async def test_arguments_holding_an_integer_too_long_to_write_are_refused_not_run() -> None:
    # A model (or a test double) handing over an integer of 5,001 digits: JSON cannot write it, so the
    # state could not be saved; the double itself failed on it ("the model raised ValueError").
    ran: list[object] = []

    @tool
    def store_value(value: Any) -> str:
        """Store a value."""
        ran.append(value)
        return "stored"

    script = [call("store_value", value=10**5000), "gave up"]
    result = await Agent(ScriptedModel(script), tools=[store_value]).run("x")
    assert result.output == "gave up" and ran == []
    [observation] = tool_outputs(result.state)
    assert observation.startswith(
        "Error: store_value was not called: its arguments cannot be written as JSON (an integer has more "
        "than 4,300 digits)."
    )
    RunState.from_json(result.state.to_json())


async def test_arguments_holding_python_objects_are_refused_and_the_run_saves(tmp_path: Path) -> None:
    # A Model of the user's making handing over an object JSON cannot hold: the run's state could not be
    # saved (the run stopped with a StateError advising a resume that failed the same way).
    ran: list[object] = []

    @tool
    def store_value(value: Any) -> str:
        """Store a value."""
        ran.append(value)
        return "stored"

    script = [
        {"tool_calls": [{"name": "store_value", "args": {"value": object()}}]},
        {"tool_calls": [{"name": "store_value", "args": {"value": datetime.date(2026, 1, 2)}}]},
        {"tool_calls": [{"name": "store_value", "args": {"value": "caf\udce9"}}]},
        "gave up",
    ]
    store = SQLiteStore(tmp_path / "runs.db")
    result = await Agent(ScriptedModel(script), tools=[store_value], store=store).run("x")
    assert result.output == "gave up"
    assert ran == [datetime.date(2026, 1, 2), "caf\ufffd"]  # a date is saved as JSON; half a character mended
    assert tool_outputs(result.state)[0].startswith(
        "Error: store_value was not called: its arguments cannot be written as JSON (a value is a Python "
        'object, not JSON: {"value":"<object object at'
    )
    saved = await store.load_state(result.run_id)
    assert saved is not None and saved.finished and saved.answer == "gave up"


async def test_a_scripted_call_nested_past_the_recursion_limit_is_malformed_not_a_crash() -> None:
    text = '{"data":' + "[" * 1500 + "]" * 1500 + "}"
    result = await Agent(ScriptedModel([call_text("keep", text), "gave up"]), tools=[keep]).run("x")
    assert result.output == "gave up"
    assert tool_outputs(result.state)[0].startswith(
        "Error: keep was not called: its arguments nest more than 64"
    )


def call_text(name: str, arguments: str) -> dict[str, object]:
    return {"tool_calls": [{"name": name, "args": arguments}]}
