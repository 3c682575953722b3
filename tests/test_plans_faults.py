"""Plans under faults: a crash while a task runs, a task id run with other arguments in between, a sibling
cancelled by a failure and then repaired."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import private_schema
from thinkloop import Agent, ConfigurationError, Tool, tool
from thinkloop.plans import PlanError, execute_plan, parse_plan, plan_tool, run_plan_and_execute
from thinkloop.stores import SQLiteStore
from thinkloop.testing import FunctionModel, ScriptedModel


class _Crash(BaseException):
    """Stands in for the process dying: nothing in thinkloop catches it."""


def _tool_observations(result: Any) -> list[str]:
    return [m.content for m in result.state.messages if m.role == "tool"]


async def test_a_task_running_when_the_process_died_is_not_run_again_on_resume(tmp_path: Path) -> None:
    # The process dies while `send` runs (its effect is done, its result never saved): the ledger says
    # "started". On resume the model sends the same plan again; the task was run a second time, sending the
    # message twice. A non-idempotent task whose outcome is unknown is now refused, as the engine refuses a
    # call of its own in that state; the model is told how to run it anyway.
    sent: list[str] = []
    crash = [True]

    @tool
    def send(to: str) -> str:
        """Send a message (not idempotent)."""
        sent.append(to)
        if crash.pop() if crash else False:
            raise _Crash
        return f"sent to {to}"

    plan = {"tasks": [{"id": "a", "tool": "send", "args": {"to": "bob"}}]}
    renamed = {"tasks": [{"id": "a2", "tool": "send", "args": {"to": "bob"}}]}
    script: list[Any] = [
        {"tool_calls": [{"name": "run_plan", "args": plan}]},
        {"tool_calls": [{"name": "run_plan", "args": plan}]},
        {"tool_calls": [{"name": "run_plan", "args": renamed}]},
        "sent",
    ]

    def agent() -> Agent:  # a new agent and plan tool each time, as in a new process
        return Agent(
            ScriptedModel(script, by_turn=True),
            tools=[plan_tool([send])],
            store=SQLiteStore(tmp_path / "runs.db"),
        )

    with pytest.raises(_Crash):
        await agent().run("send to bob", run_id="r")
    assert sent == ["bob"]
    result = await agent().resume("r")
    observations = _tool_observations(result)
    assert sent == ["bob", "bob"]  # once before the crash, once more only when the model renamed the task
    assert "[a] send → FAILED: Error: the outcome of task 'a' (send) is unknown" in observations[1]
    assert "to run it anyway, give the task a new id" in observations[1]
    assert "[a2] send → ok: sent to bob" in observations[2]


async def test_an_idempotent_task_running_when_the_process_died_runs_again(tmp_path: Path) -> None:
    fetched: list[str] = []
    crash = [True]

    @tool(idempotent=True)
    def fetch(key: str) -> str:
        """Read a value (idempotent)."""
        fetched.append(key)
        if crash.pop() if crash else False:
            raise _Crash
        return f"value of {key}"

    plan = {"tasks": [{"id": "f", "tool": "fetch", "args": {"key": "k"}}]}
    script: list[Any] = [
        {"tool_calls": [{"name": "run_plan", "args": plan}]},
        {"tool_calls": [{"name": "run_plan", "args": plan}]},
        "done",
    ]

    def agent() -> Agent:
        return Agent(
            ScriptedModel(script, by_turn=True),
            tools=[plan_tool([fetch])],
            store=SQLiteStore(tmp_path / "r.db"),
        )

    with pytest.raises(_Crash):
        await agent().run("fetch k", run_id="r")
    result = await agent().resume("r")
    assert fetched == ["k", "k"]
    assert "[f] fetch → ok: value of k" in _tool_observations(result)[1]


async def test_a_task_that_succeeded_is_not_rerun_after_running_with_other_arguments() -> None:
    # Only the latest arguments of a task id were remembered: a sent to bob, then (repair) to carol, then
    # the model goes back to bob — and bob got the message twice, though the docs say a task that
    # succeeded with the same arguments is not run again.
    sent: list[str] = []

    @tool
    def send(to: str) -> str:
        """Send a message (not idempotent)."""
        sent.append(to)
        return f"sent to {to}"

    @tool
    def boom() -> str:
        """Always fails."""
        raise ValueError("no")

    def plan(to: str, *, fail: bool) -> dict[str, Any]:
        tasks: list[dict[str, Any]] = [{"id": "a", "tool": "send", "args": {"to": to}}]
        if fail:
            tasks.append({"id": "z", "tool": "boom", "args": {}, "depends_on": ["a"]})
        return {"tasks": tasks}

    script: list[Any] = [
        {"tool_calls": [{"name": "run_plan", "args": plan("bob", fail=True)}]},
        {"tool_calls": [{"name": "run_plan", "args": plan("carol", fail=True)}]},
        {"tool_calls": [{"name": "run_plan", "args": plan("bob", fail=False)}]},
        "done",
    ]
    result = await Agent(ScriptedModel(script), tools=[plan_tool([send, boom])]).run("x")
    assert sent == ["bob", "carol"]
    assert "[a] send → ok: sent to bob" in _tool_observations(result)[2]


async def test_execute_plan_takes_a_list_of_earlier_results() -> None:
    sent: list[str] = []

    @tool
    def send(to: str) -> str:
        """Send."""
        sent.append(to)
        return f"sent to {to}"

    first = await execute_plan(
        parse_plan({"tasks": [{"id": "a", "tool": "send", "args": {"to": "bob"}}]}), [send]
    )
    second = await execute_plan(
        parse_plan({"tasks": [{"id": "a", "tool": "send", "args": {"to": "carol"}}]}), [send]
    )
    earlier = [*first.results.values(), *second.results.values()]
    again = await execute_plan(
        parse_plan({"tasks": [{"id": "a", "tool": "send", "args": {"to": "bob"}}]}), [send], reuse=earlier
    )
    assert again.ok and sent == ["bob", "carol"]


async def test_a_sibling_cancelled_by_a_failure_runs_in_the_repaired_plan() -> None:
    # The cancelled sibling's ledger entry said "started" forever; it is now done ("cancelled"), so the
    # repaired plan runs it (it is not mistaken for a call cut off by a crash).
    started = asyncio.Event()
    slow_runs: list[int] = []
    gate = {"open": False}

    async def slow() -> str:
        slow_runs.append(1)
        started.set()
        if not gate["open"]:
            await asyncio.sleep(3600)
        return "slow done"

    async def flaky() -> str:
        await started.wait()
        if not gate["open"]:
            gate["open"] = True
            raise RuntimeError("first time fails")
        return "ok"

    schema = {"type": "object", "properties": {}}
    tools = [Tool("slow", "slow", schema, slow), Tool("flaky", "flaky", schema, flaky)]
    plan = {"tasks": [{"id": "s", "tool": "slow", "args": {}}, {"id": "f", "tool": "flaky", "args": {}}]}
    script: list[Any] = [
        {"tool_calls": [{"name": "run_plan", "args": plan}]},
        {"tool_calls": [{"name": "run_plan", "args": plan}]},
        "done",
    ]
    result = await Agent(ScriptedModel(script), tools=[plan_tool(tools)]).run("go")
    observations = _tool_observations(result)
    assert "Cancelled (same level): s" in observations[0]
    assert "[s] slow → ok: slow done" in observations[1]
    assert len(slow_runs) == 2
    cancelled = [e for e in result.state.ledger.values() if e.error_kind == "cancelled"]
    assert [e.name for e in cancelled] == ["slow"] and all(e.status == "done" for e in cancelled)


def _strict(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise ValueError(constant)

    return json.loads(text, parse_constant=refuse)


async def test_a_tool_output_with_nan_does_not_put_nan_into_the_run_state() -> None:
    # Python's json reads NaN, Infinity and 1e999 as floats: a tool's output `{"v": NaN}` referred to as
    # ${a.v} put NaN into the next task's arguments, so into the ledger and events — JSON that strict
    # parsers (PostgreSQL's jsonb, JavaScript) refuse. The output is now read as text, and the reference
    # fails, naming it.
    @tool
    def reading() -> str:
        """A sensor reading."""
        return '{"v": NaN, "max": 1e999}'

    @tool
    def store(v: float) -> str:
        """Store a value."""
        return "stored"

    plan = {
        "tasks": [
            {"id": "a", "tool": "reading", "args": {}},
            {"id": "b", "tool": "store", "args": {"v": "${a.v}"}, "depends_on": ["a"]},
        ]
    }
    events: list[Any] = []
    model = ScriptedModel([{"tool_calls": [{"name": "run_plan", "args": plan}]}, "done"])
    result = await Agent(model, tools=[plan_tool([reading, store])], on_event=events.append).run("go")
    assert "[b] store → FAILED: Error: ${a.v}: the result is str" in _tool_observations(result)[0]
    _strict(result.state.to_json())
    for event in events:
        _strict(event.model_dump_json())


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_plan_with_a_non_json_number_is_a_plan_error(number: str) -> None:
    text = '{"tasks": [{"id": "a", "tool": "t", "args": {"x": NUMBER}}]}'.replace("NUMBER", number)
    with pytest.raises(PlanError, match="the plan is not valid JSON"):
        parse_plan(text)
    with pytest.raises(PlanError, match="the plan is not valid JSON"):
        parse_plan(f"Here is the plan: {text} — done.")  # found in prose


def test_a_task_whose_args_text_nests_too_deeply_is_a_plan_error() -> None:
    # args given as JSON text nested past Python's recursion limit raised RecursionError out of parse_plan
    # (and the plan tool's observation was "run_plan raised RecursionError")
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(PlanError, match="tasks.0.args: Input should be a valid dictionary"):
        parse_plan({"tasks": [{"id": "a", "tool": "t", "args": deep}]})


async def test_a_planner_model_raising_any_exception_is_reported_not_raised() -> None:
    # Only ModelError was caught: a model raising anything else (a custom adapter, a FunctionModel) escaped
    # run_plan_and_execute, though an agent run takes the same failure as a failed run.
    def down(request: Any) -> Any:
        raise RuntimeError("planner down")

    @tool
    def echo(text: str) -> str:
        """Echo."""
        return text

    outcome = await run_plan_and_execute(FunctionModel(down), "x", [echo])
    assert not outcome.ok and outcome.attempts == 1
    assert outcome.error == "the model failed: the model raised RuntimeError: planner down"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"tool_timeout": 0}, "tool_timeout must be a positive number of seconds or None, not 0"),
        (
            {"tool_timeout": float("nan")},
            "tool_timeout must be a positive number of seconds or None, not nan",
        ),
        ({"tool_timeout": -1}, "tool_timeout must be a positive number"),
        ({"tool_timeout": "5"}, "tool_timeout must be a positive number"),
        ({"output_max_length": 0}, "output_max_length must be a positive number of characters"),
        ({"output_max_length": 1.5}, "output_max_length must be a positive number of characters"),
    ],
)
async def test_bad_limits_for_execute_plan_are_refused_before_anything_runs(
    settings: dict[str, Any], message: str
) -> None:
    # tool_timeout=0 fell back to the 120 s default and NaN never fired: a hanging task hung the plan;
    # -1 failed every task at once ("timed out after -1 s").
    ran: list[str] = []

    @tool
    def note() -> str:
        """Note."""
        ran.append("note")
        return "ok"

    plan = parse_plan({"tasks": [{"id": "n", "tool": "note", "args": {}}]})
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        await execute_plan(plan, [note], **settings)
    assert ran == []


def _task_events(events: list[Any]) -> list[tuple[str, str, str]]:
    """(type, task id, how it ended) of the task events, checking the stream's promise on the way: each task
    of the plan ends with exactly one task_finished (after its task_started) or one task_skipped (none)."""
    (created,) = [e for e in events if e.type == "plan_created"]
    started: set[str] = set()
    ended: list[str] = []
    out = []
    for e in events:
        if e.type == "task_started":
            assert e.task_id not in started and e.task_id not in ended, e
            started.add(e.task_id)
        elif e.type == "task_finished":
            assert e.task_id in started and e.task_id not in ended, f"{e.task_id} finished without a start"
            ended.append(e.task_id)
        elif e.type == "task_skipped":
            assert e.task_id not in started and e.task_id not in ended, f"{e.task_id} skipped after a start"
            ended.append(e.task_id)
        else:
            continue
        how = (
            ("cancelled" if e.cancelled else "ok" if e.success else "failed")
            if e.type == "task_finished"
            else (f"{e.reason} by {e.failed_task}" if e.type == "task_skipped" else "")
        )
        out.append((e.type, e.task_id, how))
    assert sorted(ended) == sorted(t["id"] for t in created.tasks)
    return out


async def test_tasks_that_never_started_are_skipped_not_finished() -> None:
    # A sibling waiting for its turn (max_concurrency) when another failed got a task_finished without a
    # task_started; the tasks of later levels got no event at all, so a consumer never saw them end.
    running: list[str] = []
    both = asyncio.Event()

    async def slow(name: str) -> str:
        running.append(name)
        if len(running) == 2:
            both.set()
        await asyncio.sleep(3600)
        return name

    async def boom() -> str:
        await both.wait()
        raise RuntimeError("disk full")

    tools = [tool(slow), tool(boom)]
    plan = parse_plan(
        [
            {"id": "a", "tool": "boom", "args": {}},
            {"id": "b", "tool": "slow", "args": {"name": "b"}},
            {"id": "c", "tool": "slow", "args": {"name": "c"}},
            {"id": "d", "tool": "slow", "args": {"name": "d"}},  # waits for a free slot
            {"id": "e", "tool": "slow", "args": {"name": "e"}, "depends_on": ["a"]},
        ]
    )
    events: list[Any] = []
    result = await execute_plan(plan, tools, emit=events.append, max_concurrency=3)
    assert result.failed == "a" and result.cancelled == ["b", "c", "d"] and result.not_run == ["e"]
    assert _task_events(events) == [
        ("task_started", "a", ""),
        ("task_started", "b", ""),
        ("task_started", "c", ""),
        ("task_finished", "a", "failed"),
        ("task_finished", "b", "cancelled"),
        ("task_finished", "c", "cancelled"),
        ("task_skipped", "d", "cancelled by a"),
        ("task_skipped", "e", "not_run by a"),
    ]


async def test_a_reused_result_and_a_reference_that_fails_are_started_then_finished() -> None:
    @tool
    def get(key: str) -> dict[str, str]:
        """A record."""
        return {"key": key}

    plan = parse_plan(
        [
            {"id": "a", "tool": "get", "args": {"key": "k"}},
            {"id": "b", "tool": "get", "args": {"key": "${a.missing}"}, "depends_on": ["a"]},
        ]
    )
    first = await execute_plan(plan, [get])
    events: list[Any] = []
    again = await execute_plan(plan, [get], emit=events.append, reuse=first.results)
    assert again.failed == "b" and "has no field 'missing'" in (again.error or "")
    assert _task_events(events) == [
        ("task_started", "a", ""),  # reused: no tool call, but the task was taken up
        ("task_finished", "a", "ok"),
        ("task_started", "b", ""),  # its reference failed
        ("task_finished", "b", "failed"),
    ]


async def test_skipped_tasks_are_in_the_run_s_saved_event_log(tmp_path: Path) -> None:
    @tool
    def fail() -> str:
        """Fails."""
        raise RuntimeError("no")

    plan = {
        "tasks": [{"id": "a", "tool": "fail", "args": {}}, {"id": "b", "tool": "fail", "depends_on": ["a"]}]
    }
    store = SQLiteStore(tmp_path / "runs.db")
    script: list[Any] = [{"tool_calls": [{"name": "run_plan", "args": plan}]}, "gave up"]
    result = await Agent(ScriptedModel(script), tools=[plan_tool([fail])], store=store).run("go")
    saved = await store.read_events(result.run_id)
    await store.aclose()
    assert _task_events(saved) == [
        ("task_started", "a", ""),
        ("task_finished", "a", "failed"),
        ("task_skipped", "b", "not_run by a"),
    ]


async def test_a_task_waiting_for_its_turn_does_not_start_once_a_sibling_failed() -> None:
    # The failing task freed its slot before the level saw the failure: the task waiting for it started
    # (its tool ran — a shell command, a payment) and was cancelled right after.
    ran: list[str] = []

    async def record(name: str) -> str:
        ran.append(name)
        await asyncio.sleep(3600)
        return name

    async def boom() -> str:
        await asyncio.sleep(0)
        raise RuntimeError("disk full")

    plan = parse_plan(
        [{"id": "a", "tool": "boom", "args": {}}, {"id": "b", "tool": "record", "args": {"name": "b"}}]
    )
    events: list[Any] = []
    result = await execute_plan(plan, [tool(boom), tool(record)], emit=events.append, max_concurrency=1)
    assert result.failed == "a" and result.cancelled == ["b"]
    assert ran == []  # was ['b']
    assert _task_events(events)[-1] == ("task_skipped", "b", "cancelled by a")


async def test_a_tool_that_ignores_its_timeout_is_abandoned_and_fails_as_timed_out() -> None:
    # Outside a run the task was awaited under asyncio.timeout: a tool that caught the cancellation and
    # went on was waited for however long it took, and its late result counted as a success.
    finished: list[str] = []

    async def stubborn() -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(5)  # ignores its timeout (a cancellation arriving now ends it)
        finished.append("late")
        return "late"

    result = await execute_plan(
        parse_plan([{"id": "s", "tool": "stubborn"}]), [tool(stubborn)], tool_timeout=0.1
    )
    assert result.failed == "s" and result.results["s"].error_kind == "timeout"
    assert result.error == "Error: stubborn timed out after 0.1 s and was abandoned."
    assert finished == []  # the plan did not wait for it


_STUBBORN_PLAN = """
import asyncio
from thinkloop import _aio, tool
from thinkloop.plans import execute_plan, parse_plan

_aio.CANCEL_GRACE = 0.05


async def stubborn() -> str:
    \"\"\"Never gives up.\"\"\"
    while True:
        try:
            await asyncio.sleep(10)
        except BaseException:
            continue


async def main() -> None:
    result = await execute_plan(parse_plan([{"id": "s", "tool": "stubborn"}]), [tool(stubborn)], tool_timeout=0.1)
    print(result.error)


_aio.run(main())
"""


def test_a_plan_whose_tool_ignores_every_cancellation_still_lets_the_program_end(tmp_path: Path) -> None:
    # The task was abandoned in a task of its own, which asyncio.run cancelled again when it closed the
    # loop, and waited for: for ever, the program never ended after the plan's result was printed.
    script = tmp_path / "stubborn_plan.py"
    script.write_text(_STUBBORN_PLAN, encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Error: stubborn timed out after 0.1 s and was abandoned.\n"


async def test_a_timeout_error_a_tool_raises_itself_is_its_failure_not_its_timeout() -> None:
    async def waits_for_a_server() -> str:
        raise TimeoutError("the server did not answer in 5 s")

    result = await execute_plan(
        parse_plan([{"id": "w", "tool": "waits_for_a_server"}]), [tool(waits_for_a_server)]
    )
    assert result.results["w"].error_kind == "exception"
    assert result.error == "Error: waits_for_a_server raised TimeoutError: the server did not answer in 5 s"


async def test_a_field_of_an_output_cut_to_its_limit_fails_saying_it_was_cut() -> None:
    # The output was cut to output_max_length, so it was no longer JSON: `${a.count}` failed with "the
    # result is str '{"count": 3, …', not a JSON object or list" — showing JSON, and not saying why.
    @tool
    def rows() -> dict[str, Any]:
        """Many rows."""
        return {"count": 2000, "items": [{"name": f"row {i}", "pad": "x" * 50} for i in range(2000)]}

    @tool
    def show(text: str) -> str:
        """Show text."""
        return text

    plan = parse_plan(
        [
            {"id": "a", "tool": "rows"},
            {"id": "b", "tool": "show", "args": {"text": "${a.count}"}, "depends_on": ["a"]},
        ]
    )
    result = await execute_plan(plan, [rows, show], output_max_length=1000)
    assert result.failed == "b"
    assert result.error is not None and result.error.startswith(
        "Error: ${a.count}: the output of task 'a' was cut to its limit of 1,000 characters (of 164,916)"
    )
    assert (
        "so it is not JSON any more: have rows return less, or give it a larger output_max_length"
        in result.error
    )
    # inside a run, the same (the agent's limit cuts it)
    p = {
        "tasks": [
            {"id": "a", "tool": "rows"},
            {"id": "b", "tool": "show", "args": {"text": "${a.count}"}, "depends_on": ["a"]},
        ]
    }
    script: list[Any] = [{"tool_calls": [{"name": "run_plan", "args": p}]}, "done"]
    run = await Agent(ScriptedModel(script), tools=[plan_tool([rows, show])]).run("go")
    assert "the output of task 'a' was cut to its limit of" in _tool_observations(run)[0]


@pytest.mark.parametrize(
    ("replies", "last"),
    [
        (["garbage", "more garbage", "still not JSON"], "the plan is not valid JSON"),
        (['{"tasks": [{"id": "a", "tool": "shout"'] * 3, "the plan is not valid JSON"),
        (
            [
                '{"tasks": [{"id": "a", "tool": "shout", "args": {"text": "x"}, "depends_on": ["b"]}, '
                '{"id": "b", "tool": "shout", "args": {"text": "y"}, "depends_on": ["a"]}]}'
            ]
            * 3,
            "the plan has a cycle: a → b → a",
        ),
        (['{"tasks": [{"id": "a", "tool": "fly", "args": {}}]}'] * 3, "task 'a' uses unknown tool 'fly'"),
        (['{"tasks": [{"id": "a", "tool": "shout", "args": {}}]}'] * 3, "invalid arguments for shout"),
    ],
)
async def test_a_planner_that_never_writes_a_runnable_plan_ends_saying_what_was_wrong(
    replies: list[str], last: str
) -> None:
    # The outcome said only "no plan succeeded in 3 attempts": not why.
    @tool
    def shout(text: str) -> str:
        """Upper-case text."""
        return text.upper()

    model = ScriptedModel([*replies, "never asked"])
    outcome = await run_plan_and_execute(model, "shout x", [shout])
    assert not outcome.ok and outcome.attempts == 3 and outcome.answer == ""
    assert outcome.error is not None and outcome.error.startswith(
        "no plan succeeded in 3 attempts; the last one: "
    )
    assert last in outcome.error
    assert len(model.requests) == 3  # each attempt was shown the problem, and no answer was asked for
    assert all("Reply with a corrected JSON plan" in r.messages[-1].content for r in model.requests[1:])


async def test_the_outcome_of_a_failed_planner_holds_the_last_attempt_s_plan() -> None:
    # A last reply that was not a plan left the plan of an earlier attempt in the outcome, beside the
    # last attempt's error.
    @tool
    def shout(text: str) -> str:
        """Upper-case text."""
        raise ValueError("no")

    plan = '{"tasks": [{"id": "a", "tool": "shout", "args": {"text": "x"}}]}'
    outcome = await run_plan_and_execute(ScriptedModel([plan, "garbage"]), "shout x", [shout], max_repairs=1)
    assert outcome.plan is None and outcome.result is None and "not valid JSON" in (outcome.error or "")
    outcome = await run_plan_and_execute(ScriptedModel(["garbage", plan]), "shout x", [shout], max_repairs=1)
    assert outcome.plan is not None and outcome.result is not None and outcome.result.failed == "a"
    assert "task 'a' failed: Error: shout raised ValueError: no" in (outcome.error or "")


PLAN_CHILD = """
import asyncio, json, os, signal, sys
from thinkloop import Agent, tool
from thinkloop.plans import plan_tool
from thinkloop.stores import open_store
from thinkloop.testing import ScriptedModel

url, effects, command = sys.argv[1:4]

def effect(line):
    with open(effects, "a") as f:
        f.write(line + "\\n")
        f.flush()
        os.fsync(f.fileno())

@tool
def send(to: str) -> str:
    "Send a message (not idempotent)."
    effect("send:" + to)
    if to == "carol" and os.environ.get("KILL"):
        os.kill(os.getpid(), signal.SIGKILL)  # after its effect, before its result is saved
    return "sent to " + to

@tool(idempotent=True)
def lookup(name: str) -> str:
    "Look a name up (idempotent)."
    effect("lookup:" + name)
    return name

def plan(last):
    return {"tasks": [
        {"id": "l", "tool": "lookup", "args": {"name": "bob"}},
        {"id": "b", "tool": "send", "args": {"to": "${l}"}, "depends_on": ["l"]},
        {"id": last, "tool": "send", "args": {"to": "carol"}, "depends_on": ["b"]},
    ]}

script = [
    {"tool_calls": [{"name": "run_plan", "args": plan("c")}]},
    {"tool_calls": [{"name": "run_plan", "args": plan("c")}]},  # after the crash: the same plan again
    {"tool_calls": [{"name": "run_plan", "args": plan("c2")}]},  # told c's outcome is unknown: renamed
    "sent",
]

async def main():
    store = open_store(url)
    agent = Agent(ScriptedModel(script, by_turn=True), tools=[plan_tool([send, lookup])], store=store)
    try:
        if command == "start":
            result = await agent.run("send to bob and carol", run_id="plan-run")
        else:
            result = await agent.resume("plan-run")
    finally:
        await store.aclose()
    observations = [m.content for m in result.state.messages if m.role == "tool"]
    print(json.dumps({"output": result.output, "observations": observations}))

asyncio.run(main())
"""


@pytest.fixture
def plan_pg_dsn() -> Iterator[str]:
    yield from private_schema("tl_plans")


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_plan_killed_mid_task_resumes_in_a_new_process_without_repeating_an_effect(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # SIGKILL inside the plan's last task, after its effect: the new process resumes the run from the
    # store, the model sends the same plan, the finished tasks are not run again, the killed one is
    # refused as "outcome unknown" (not idempotent), and runs only once the model renames it.
    url = f"sqlite:///{tmp_path}/runs.db" if kind == "sqlite" else request.getfixturevalue("plan_pg_dsn")
    effects = tmp_path / "effects.txt"

    def child(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", PLAN_CHILD, url, str(effects), command],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )

    crashed = child("start", {"KILL": "1"})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert effects.read_text().split() == ["lookup:bob", "send:bob", "send:carol"]
    resumed = child("resume", {})
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)
    assert result["output"] == "sent"
    assert effects.read_text().split() == ["lookup:bob", "send:bob", "send:carol", "send:carol"]
    interrupted, again, renamed = result["observations"]
    assert "the outcome of run_plan is unknown" in interrupted  # the call the process died in
    assert "[l] lookup → ok: bob" in again and "[b] send → ok: sent to bob" in again
    assert "[c] send → FAILED: Error: the outcome of task 'c' (send) is unknown" in again
    assert "[c2] send → ok: sent to carol" in renamed


def test_the_plan_tools_description_fits_what_model_apis_take(tmp_path: Path) -> None:
    """With the built-in tools the listing alone is over 2,000 characters: OpenAI refused every request."""
    from thinkloop._tools import MAX_DESCRIPTION
    from thinkloop.tools import BUILTIN_TOOL_NAMES, builtin_tools

    tools = builtin_tools([n for n in BUILTIN_TOOL_NAMES if n != "ssh_execute"], root=tmp_path)
    made = plan_tool(tools)
    assert len(made.description) <= MAX_DESCRIPTION
    for t in tools:  # every tool is named, with its arguments
        assert f"{t.name}(" in made.description
    many = [
        Tool(f"tool_number_{i}", "A tool.", {"type": "object", "properties": {}}, lambda: "x")
        for i in range(200)
    ]
    crowded = plan_tool(many)
    assert (
        len(crowded.description) <= MAX_DESCRIPTION
        and "more (the tool field lists them all)" in crowded.description
    )
    assert crowded.parameters["properties"]["tasks"]["items"]["properties"]["tool"]["enum"] == [
        f"tool_number_{i}" for i in range(200)
    ]
    small = plan_tool([Tool("echo", "Echo.", {"type": "object", "properties": {}}, lambda: "x")])  # in full
    assert "- echo:" in small.description
