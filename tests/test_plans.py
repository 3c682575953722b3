"""Plans (SPEC §10): levels (Kahn), errors, parallel execution, references, plan-and-execute, repairs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thinkloop import Agent, ConfigurationError, RiskLevel, RunState, Tool, ToolCall, ToolRegistry, tool
from thinkloop._events import PlanCreated, TaskFinished, TaskStarted, ToolResultEvent
from thinkloop._execute import GateDecision
from thinkloop.plans import (
    DEFAULT_MAX_CONCURRENCY,
    Plan,
    PlanError,
    PlanResult,
    Task,
    execute_plan,
    parse_plan,
    plan_tool,
    run_plan_and_execute,
)
from thinkloop.stores import SQLiteStore
from thinkloop.testing import ScriptedModel

# ------------------------------------------------------------------------------------------ levels


def _ids(levels: list[list[Task]]) -> list[list[str]]:
    return [[t.id for t in level] for level in levels]


def test_levels_group_tasks_by_topological_level_in_plan_order() -> None:
    plan = Plan(
        [
            Task("report", "t", depends_on=["b", "a"]),
            Task("b", "t"),
            Task("a", "t"),
            Task("c", "t", depends_on=["a"]),
            Task("final", "t", depends_on=["report", "c"]),
        ]
    )
    assert _ids(plan.levels()) == [["b", "a"], ["report", "c"], ["final"]]


def test_an_empty_plan_has_no_levels() -> None:
    assert Plan([]).levels() == []


def test_duplicate_ids_are_named() -> None:
    plan = Plan([Task("a", "t"), Task("b", "t"), Task("a", "t"), Task("b", "t"), Task("c", "t")])
    with pytest.raises(PlanError, match=r"duplicate task id\(s\): 'a', 'b'"):
        plan.levels()


def test_unknown_dependencies_are_named() -> None:
    plan = Plan([Task("a", "t"), Task("b", "t", depends_on=["a", "ghost"])])
    with pytest.raises(PlanError, match=r"task 'b' depends on unknown task 'ghost' \(known tasks: a, b\)"):
        plan.levels()


def test_a_cycle_is_named_in_order() -> None:
    plan = Plan(
        [
            Task("start", "t"),
            Task("a", "t", depends_on=["start", "b"]),
            Task("b", "t", depends_on=["c"]),
            Task("c", "t", depends_on=["a"]),
            Task("after", "t", depends_on=["c"]),
        ]
    )
    with pytest.raises(
        PlanError, match=r"the plan has a cycle: a → b → c → a \(each task depends on the next\)"
    ):
        plan.levels()


def test_a_task_depending_on_itself_is_a_cycle() -> None:
    with pytest.raises(PlanError, match="cycle: a → a"):
        Plan([Task("a", "t", depends_on=["a"])]).levels()


def test_invalid_ids_are_rejected() -> None:
    with pytest.raises(PlanError, match=r"task id 'a b' is invalid"):
        Plan([Task("a b", "t")]).levels()


def test_ids_differing_only_in_case_or_whitespace_are_rejected() -> None:
    with pytest.raises(PlanError, match=r"task ids 'fetch' and 'Fetch' differ only in case"):
        Plan([Task("fetch", "t"), Task("Fetch", "t", depends_on=["fetch"])]).levels()
    with pytest.raises(
        PlanError, match=r"task id 'a ' is invalid \(it has spaces or line breaks around it\)"
    ):
        Plan([Task("a", "t"), Task("a ", "t")]).levels()
    with pytest.raises(PlanError, match=r"task id 'a\\n' is invalid"):  # `$` used to accept a final newline
        Plan([Task("a\n", "t")]).levels()


def test_repeated_dependencies_count_once() -> None:
    plan = Plan([Task("a", "t"), Task("b", "t", depends_on=["a", "a"])])
    assert _ids(plan.levels()) == [["a"], ["b"]]


def test_a_deep_chain_is_checked_in_linear_memory() -> None:
    import tracemalloc

    n = 3000
    chain = Plan(
        [
            Task(f"t{i}", "t", {"x": f"${{t{i - 1}}}"} if i else {}, [f"t{i - 1}"] if i else [])
            for i in range(n)
        ]
    )
    tracemalloc.start()
    try:
        levels = chain.check()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(levels) == n
    assert peak < 30_000_000  # ancestors as sets of ids took ~4.5 million set entries (>300 MB) here


def test_errors_about_huge_plans_stay_readable() -> None:
    unknown = Plan([Task(f"t{i}", "nope") for i in range(1000)])
    with pytest.raises(PlanError) as info:
        unknown.check(ToolRegistry([shout]))
    message = str(info.value)
    assert message.count("uses unknown tool 'nope'") == 20 and "… and 980 more problems" in message
    ghosts = Plan([Task(f"t{i}", "t", depends_on=["ghost"]) for i in range(1000)])
    with pytest.raises(PlanError, match="… and 980 more") as info:
        ghosts.levels()
    assert len(str(info.value)) < 2000
    ring = Plan([Task(f"t{i}", "t", depends_on=[f"t{(i + 1) % 1000}"]) for i in range(1000)])
    with pytest.raises(
        PlanError, match=r"cycle: t0 → t1 → .* → … \(1000 tasks\) … → .* → t999 → t0 \("
    ) as info:
        ring.levels()
    assert len(str(info.value)) < 400


@st.composite
def dags(draw: st.DrawFn) -> Plan:
    """A random DAG: task i may depend only on tasks j < i; the tasks are then shuffled."""
    n = draw(st.integers(min_value=1, max_value=25))
    tasks = []
    for i in range(n):
        deps = draw(st.lists(st.integers(min_value=0, max_value=i - 1), max_size=4)) if i else []
        tasks.append(Task(f"t{i}", "tool", depends_on=[f"t{j}" for j in deps]))
    return Plan(draw(st.permutations(tasks)))


@settings(max_examples=300, deadline=None)
@given(dags())
def test_levels_of_random_dags(plan: Plan) -> None:
    levels = plan.levels()
    position = {t.id: i for i, level in enumerate(levels) for t in level}
    placed = [t.id for level in levels for t in level]
    assert sorted(placed) == sorted(t.id for t in plan.tasks)  # every task exactly once
    assert len(placed) == len(set(placed))
    for task in plan.tasks:
        for dep in task.depends_on:
            assert position[dep] < position[task.id]  # after all its dependencies
        # Kahn's levels are the earliest possible: one more than the deepest dependency
        expected = 1 + max((position[d] for d in task.depends_on), default=-1)
        assert position[task.id] == expected


@settings(max_examples=300, deadline=None)
@given(dags(), st.data())
def test_a_back_edge_always_makes_a_detected_cycle(plan: Plan, data: st.DataObject) -> None:
    ancestors = plan.ancestors()
    paths = [
        (t.id, a) for t in plan.tasks for a in sorted(ancestors[t.id])
    ]  # t depends on a, maybe indirectly
    if paths:
        descendant, ancestor = data.draw(st.sampled_from(paths))
    else:  # no dependency at all: close a cycle with a self-loop
        descendant = ancestor = data.draw(st.sampled_from(plan.tasks)).id
    # the back edge: the ancestor now depends on its descendant
    tasks = [
        Task(t.id, t.tool, depends_on=[*t.depends_on, descendant]) if t.id == ancestor else t
        for t in plan.tasks
    ]
    cyclic = Plan(tasks)
    with pytest.raises(PlanError, match="cycle") as info:
        cyclic.levels()
    cycle = str(info.value).split("cycle: ", 1)[1].split(" (", 1)[0].split(" → ")
    assert cycle[0] == cycle[-1] and len(cycle) >= 2
    deps = {t.id: set(t.depends_on) for t in cyclic.tasks}
    for node, nxt in zip(cycle, cycle[1:], strict=False):
        assert nxt in deps[node]  # every step of the reported cycle is a real dependency


# --------------------------------------------------------------------------------------- execution


@tool
async def weather(city: str) -> dict[str, Any]:
    """The weather of a city."""
    return {"city": city, "temp": len(city) * 3, "tags": ["mild", city.lower()]}


@tool
def report(text: str, total: int = 0) -> str:
    """Write a report."""
    return f"{text} | total={total}"


@tool
def shout(text: str) -> str:
    """Upper-case text (not JSON)."""
    return text.upper()


TOOLS = [weather, report, shout]


async def test_runs_a_plan_level_by_level_with_events() -> None:
    events: list[Any] = []
    plan = Plan(
        [
            Task("paris", "weather", {"city": "Paris"}),
            Task("rome", "weather", {"city": "Rome"}),
            Task(
                "rep", "report", {"text": "Paris ${paris.temp}", "total": "${rome.temp}"}, ["paris", "rome"]
            ),
        ]
    )
    result = await execute_plan(plan, TOOLS, emit=events.append)

    assert result.ok and result.failed is None
    assert result.results["rep"].output == "Paris 15 | total=12"
    assert [(e.type, getattr(e, "task_id", "")) for e in events] == [
        ("plan_created", ""),
        ("task_started", "paris"),  # a tool that never waits ends at once (concurrency: the next test)
        ("task_finished", "paris"),
        ("task_started", "rome"),
        ("task_finished", "rome"),
        ("task_started", "rep"),
        ("task_finished", "rep"),
    ]
    created = events[0]
    assert isinstance(created, PlanCreated)
    assert created.levels == [["paris", "rome"], ["rep"]] and created.attempt == 1
    started = [e for e in events if isinstance(e, TaskStarted)]
    assert started[-1].arguments == {"text": "Paris 15", "total": 12} and started[-1].level == 1
    assert all(e.success for e in events if isinstance(e, TaskFinished))


async def test_a_levels_tasks_run_concurrently() -> None:
    arrived: list[str] = []
    both = asyncio.Event()

    async def meet(name: str) -> str:
        """Wait until both tasks have started."""
        arrived.append(name)
        if len(arrived) == 2:
            both.set()
        await asyncio.wait_for(both.wait(), 5)
        return name

    plan = Plan([Task("x", "meet", {"name": "x"}), Task("y", "meet", {"name": "y"})])
    result = await execute_plan(plan, [Tool("meet", "meet", {"type": "object", "properties": {}}, meet)])
    assert result.ok  # sequential execution would have timed out waiting for the other
    assert sorted(arrived) == ["x", "y"]


async def test_the_first_failure_cancels_its_level_and_stops_the_plan() -> None:
    slow_started = asyncio.Event()
    slow_state: dict[str, bool] = {"completed": False, "cancelled": False}
    later_ran: list[str] = []

    async def slow() -> str:
        slow_started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            slow_state["cancelled"] = True
            raise
        slow_state["completed"] = True
        return "slow done"

    async def boom() -> str:
        await slow_started.wait()
        raise RuntimeError("disk full")

    def later() -> str:
        later_ran.append("later")
        return "later"

    schema = {"type": "object", "properties": {}}
    tools = [Tool(n, n, schema, f) for n, f in (("slow", slow), ("boom", boom), ("later", later))]
    plan = Plan(
        [
            Task("first", "later"),
            Task("s", "slow", depends_on=["first"]),
            Task("b", "boom", depends_on=["first"]),
            Task("end", "later", depends_on=["s", "b"]),
        ]
    )
    events: list[Any] = []
    result = await execute_plan(plan, tools, emit=events.append)

    assert isinstance(result, PlanResult) and not result.ok
    assert result.failed == "b"
    assert result.error == "Error: boom raised RuntimeError: disk full"
    assert result.cancelled == ["s"] and result.not_run == ["end"]
    assert slow_state == {"completed": False, "cancelled": True}  # the slow sibling never completed
    assert list(result.results) == ["first", "b"]  # the results so far
    assert later_ran == ["later"]  # "end" never ran
    cancelled = [e for e in events if isinstance(e, TaskFinished) and e.cancelled]
    assert [e.task_id for e in cancelled] == ["s"]
    assert "Task 'b' failed: Error: boom raised RuntimeError: disk full" in result.summary()


async def test_a_coroutine_a_task_tool_returned_is_awaited_outside_a_run_too() -> None:
    async def fetch() -> str:
        await asyncio.sleep(0)
        return "fetched"

    def hands_back() -> object:  # a sync tool returning an async call, not its result
        return fetch()

    def never() -> object:
        return asyncio.sleep(3600)

    empty = {"type": "object", "properties": {}}
    tools = [Tool("hands_back", "h", empty, hands_back), Tool("never", "n", empty, never, timeout=0.05)]
    result = await execute_plan(Plan([Task("h", "hands_back")]), tools)
    assert result.results["h"].output == "fetched"
    late = await execute_plan(Plan([Task("n", "never")]), tools)
    assert late.failed == "n" and late.results["n"].error_kind == "timeout"


async def test_invalid_arguments_and_timeouts_fail_the_task_outside_a_run() -> None:
    async def stuck() -> str:
        await asyncio.sleep(3600)
        return "never"

    stuck_tool = Tool("stuck", "stuck", {"type": "object", "properties": {}}, stuck, timeout=0.05)
    result = await execute_plan(Plan([Task("s", "stuck")]), [stuck_tool])
    assert result.failed == "s" and result.results["s"].error_kind == "timeout"
    assert "timed out after 0.05 s" in (result.error or "")

    bad = Plan(
        [Task("w", "weather", {"city": "Paris"}), Task("r", "report", {"text": "x", "total": "${w}"}, ["w"])]
    )
    result = await execute_plan(bad, TOOLS)  # the dict result is not a valid `total` integer
    assert result.failed == "r" and result.results["r"].error_kind == "invalid_arguments"


async def test_a_whole_reference_in_a_text_argument_is_the_result_as_the_tool_wrote_it() -> None:
    # A text id `12345` was read as the number 12345, which a string parameter refused; a JSON result
    # (an object) was refused too. In a longer text, `1.10` became `1.1` and `1e3` became `1000.0`.
    @tool
    def lookup(name: str) -> str:
        """Look a value up."""
        return {"order": "12345", "version": "1.10", "sci": "1e3"}[name]

    @tool
    def echo(text: str) -> str:
        """Echo a text."""
        return text

    @tool
    def double(n: int) -> int:
        """Double a number."""
        return 2 * n

    plan = Plan([
        Task("a", "lookup", {"name": "order"}),
        Task("v", "lookup", {"name": "version"}),
        Task("s", "lookup", {"name": "sci"}),
        Task("w", "weather", {"city": "Paris"}),
        Task("b", "echo", {"text": "${a}"}, depends_on=["a"]),
        Task("c", "echo", {"text": "version ${v}, count ${s}"}, depends_on=["v", "s"]),
        Task("d", "double", {"n": "${a}"}, depends_on=["a"]),  # a number where a number is wanted
        Task("r", "report", {"text": "${w}"}, ["w"]),
    ])  # fmt: skip
    result = await execute_plan(plan, [lookup, echo, double, *TOOLS])
    assert result.ok, result.error
    outputs = {task: result.results[task].output for task in "bcdr"}
    assert outputs["b"] == "12345" and outputs["c"] == "version 1.10, count 1e3" and outputs["d"] == "24690"
    assert json.loads(result.results["w"].output)["city"] == "Paris" and "Paris" in outputs["r"]


async def test_output_is_truncated_like_any_tool_output() -> None:
    def big() -> str:
        return "x" * 5000

    result = await execute_plan(
        Plan([Task("b", "big")]), [Tool("big", "big", None, big)], output_max_length=300
    )
    assert len(result.results["b"].output) <= 300 and "characters truncated" in result.results["b"].output


# -------------------------------------------------------------------------------------- references


async def test_reference_forms() -> None:
    plan = Plan(
        [
            Task("w", "weather", {"city": "Oslo"}),
            Task("s", "shout", {"text": "hi"}),
            Task(
                "r",
                "report",
                {
                    "text": "${w.city} is ${w.tags.0}, ${s}; all: ${w.tags}; literal $${w}",
                    "total": "${w.temp}",
                },
                depends_on=["w", "s"],
            ),
        ]
    )
    result = await execute_plan(plan, TOOLS)
    assert result.results["r"].output == 'Oslo is mild, HI; all: ["mild", "oslo"]; literal ${w} | total=12'


async def test_a_whole_value_reference_keeps_the_json_type() -> None:
    seen: dict[str, Any] = {}

    def keep(data: Any) -> str:
        seen["data"] = data
        return "ok"

    keep_tool = Tool("keep", "keep", {"type": "object", "properties": {"data": {}}}, keep)
    plan = Plan(
        [Task("w", "weather", {"city": "Rome"}), Task("k", "keep", {"data": ["${w}", "${w.temp}"]}, ["w"])]
    )
    result = await execute_plan(plan, [weather, keep_tool])
    assert result.ok
    assert seen["data"] == [{"city": "Rome", "temp": 12, "tags": ["mild", "rome"]}, 12]


async def test_references_must_point_to_dependencies_transitively() -> None:
    plan = Plan(
        [
            Task("a", "weather", {"city": "A"}),
            Task("b", "shout", {"text": "${a.city}"}, ["a"]),
            Task("c", "shout", {"text": "${a.city} ${b}"}, ["b"]),  # a through b: fine
            Task("d", "shout", {"text": "${c} ${nowhere}"}),
        ]
    )
    with pytest.raises(PlanError) as info:
        await execute_plan(plan, TOOLS)
    message = str(info.value)
    assert "task 'd' refers to ${c} but does not depend on 'c': add 'c' to its depends_on" in message
    assert "task 'd' refers to ${nowhere}, but there is no task 'nowhere'" in message
    assert "task 'c'" not in message


async def test_a_malformed_reference_is_a_plan_error_not_literal_text() -> None:
    ran: list[str] = []

    def record(text: str) -> str:
        ran.append(text)
        return text

    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    tools = [weather, Tool("record", "record", schema, record)]
    plan = Plan(
        [
            Task("w", "weather", {"city": "Rome"}),
            Task("r", "record", {"text": "${w[0]} and ${ w } but $${not a ref} and ${w.tags.0}"}, ["w"]),
        ]
    )
    with pytest.raises(PlanError) as info:
        await execute_plan(plan, tools)
    message = str(info.value)
    assert "task 'r': ${w[0]} is not a reference: write ${task} or ${task.field.0}" in message
    assert "task 'r': ${ w } is not a reference" in message
    assert "$${not a ref}" not in message and "${w.tags.0}" not in message
    assert ran == []  # the tool never received the literal "${w[0]}"

    escaped = Plan(
        [Task("w", "weather", {"city": "Rome"}), Task("r", "record", {"text": "$${w[0]} ${w.city}"}, ["w"])]
    )
    result = await execute_plan(escaped, tools)
    assert result.ok and ran == ["${w[0]} Rome"]  # $${…} is the literal text, whatever is inside


async def test_a_missing_field_fails_the_task_naming_the_reference() -> None:
    plan = Plan([Task("w", "weather", {"city": "Rome"}), Task("s", "shout", {"text": "${w.wind}"}, ["w"])])
    result = await execute_plan(plan, TOOLS)
    assert result.failed == "s"
    assert "${w.wind}: the result has no field 'wind' (fields: city, temp, tags)" in (result.error or "")

    plan = Plan([Task("s", "shout", {"text": "x"}), Task("t", "shout", {"text": "${s.field}"}, ["s"])])
    result = await execute_plan(plan, TOOLS)
    assert "${s.field}: the result is str 'X', not a JSON object or list" in (result.error or "")


async def test_a_result_nested_too_deeply_is_used_as_text() -> None:
    def deep() -> str:
        return "[" * 3000 + "]" * 3000

    tools = [Tool("deep", "deep", None, deep), shout]
    plan = Plan([Task("d", "deep"), Task("s", "shout", {"text": "${d}"}, ["d"])])
    result = await execute_plan(plan, tools)  # was a RecursionError escaping execute_plan
    assert result.ok and result.results["s"].output == "[" * 3000 + "]" * 3000


async def test_tools_and_static_arguments_are_checked_before_running() -> None:
    ran: list[str] = []

    def mark() -> str:
        ran.append("mark")
        return "ok"

    tools = [*TOOLS, Tool("mark", "mark", None, mark)]
    plan = Plan(
        [
            Task("m", "mark"),
            Task("x", "teleport", {"to": "Mars"}),
            Task("r", "report", {"total": "many"}),
            Task("w", "weather", {"city": "${m}"}, ["m"]),  # filled in later: not checked now
        ]
    )
    with pytest.raises(PlanError) as info:
        await execute_plan(plan, tools)
    message = str(info.value)
    assert "task 'x' uses unknown tool 'teleport'" in message
    assert (
        "task 'r': invalid arguments for report: text: required, not given; total: Input should be a valid integer"
        in message
    )
    assert "task 'w'" not in message
    assert ran == []


# ----------------------------------------------------------------------------------------- parsing


def test_parse_plan_forms() -> None:
    fenced = 'Here:\n```json\n{"tasks": [{"id": "a", "tool": "shout", "args": {"text": "x"}}]}\n```'
    assert parse_plan(fenced).tasks == [Task("a", "shout", {"text": "x"})]
    assert parse_plan([{"id": "a", "tool": "t"}]).tasks[0].depends_on == []
    with pytest.raises(PlanError, match="not valid JSON"):
        parse_plan("first get the weather")
    with pytest.raises(PlanError, match="a plan is a JSON object with a 'tasks' list"):
        parse_plan({"steps": []})
    with pytest.raises(PlanError, match=r"tasks\.0\.tool: Field required"):
        parse_plan({"tasks": [{"id": "a"}]})


PLAN_JSON = '{"tasks": [{"id": "a", "tool": "shout", "args": {"text": "x"}}]}'


@pytest.mark.parametrize(
    "reply",
    [
        f"Sure! Here is the plan: {PLAN_JSON} Let me know if you need more.",
        f"```python\n{PLAN_JSON}\n```",
        f"```JSON\n{PLAN_JSON}\n```",
        f"Step one:\n```\nget the weather\n```\nThe plan:\n```json\n{PLAN_JSON}\n```",
        f"Plan (tasks as a list): [{PLAN_JSON[11:-2]}]",
    ],
)
def test_parse_plan_finds_the_plan_in_what_a_small_model_writes(reply: str) -> None:
    assert parse_plan(reply).tasks == [Task("a", "shout", {"text": "x"})]


@pytest.mark.parametrize(
    "reply",
    ["[" * 100_000, "```json\n" + "[" * 50_000 + "]" * 50_000 + "\n```", "plan: " + '{"a": [' * 50_000],
)
def test_a_plan_nested_too_deeply_is_a_plan_error(reply: str) -> None:
    with pytest.raises(PlanError, match="nested too deeply"):  # was a RecursionError escaping
        parse_plan(reply)


def test_broken_json_names_the_error_of_the_fenced_block() -> None:
    with pytest.raises(PlanError, match=r"not valid JSON \(Expecting ',' delimiter: line 1 column 51"):
        parse_plan('Here:\n```json\n{"tasks": [{"id": "a", "tool": "shout", "args": {}\n```')


def test_plans_round_trip_as_json() -> None:
    plan = Plan([Task("a", "shout", {"text": "x"}), Task("b", "shout", {"text": "${a}"}, ["a"])])
    assert parse_plan(plan.model_dump_json()) == plan


# --------------------------------------------------------------------------- inside an agent run


class _DenyHigh:
    def __init__(self) -> None:
        self.seen: list[tuple[str, RiskLevel]] = []

    async def check(self, call: ToolCall, tool: Any, risk: RiskLevel, run: Any) -> GateDecision:
        self.seen.append((call.name, risk))
        if risk >= RiskLevel.HIGH:
            return GateDecision(False, "denied", reason="test policy")
        return GateDecision(True, "auto")


async def test_run_plan_tool_in_an_agent_run_goes_through_the_safety_gate() -> None:
    deleted: list[str] = []

    @tool(risk=RiskLevel.HIGH)
    def delete(path: str) -> str:
        """Delete a file."""
        deleted.append(path)
        return "deleted"

    tools = [weather, shout, delete]
    bad_plan = {
        "tasks": [
            {"id": "w", "tool": "weather", "args": {"city": "Paris"}},
            {"id": "d", "tool": "delete", "args": {"path": "/etc/${w.city}"}, "depends_on": ["w"]},
        ]
    }
    good_plan = {
        "tasks": [
            {"id": "w", "tool": "weather", "args": {"city": "Paris"}},
            {"id": "s", "tool": "shout", "args": {"text": "${w.city} is ${w.temp}"}, "depends_on": ["w"]},
        ]
    }
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "run_plan", "args": bad_plan}]},
            {"tool_calls": [{"name": "run_plan", "args": good_plan}]},
            "PARIS IS 15",
        ]
    )
    gate = _DenyHigh()
    events: list[Any] = []
    agent = Agent(model, tools=[plan_tool(tools)], safety=gate, on_event=events.append)
    result = await agent.run("Weather in Paris, shouted")

    assert deleted == []  # the denied task never ran
    assert ("delete", RiskLevel.HIGH) in gate.seen and ("run_plan", RiskLevel.LOW) in gate.seen
    observations = [e for e in events if isinstance(e, ToolResultEvent)]
    assert [o.success for o in observations] == [False, True]
    assert "Task 'd' failed: Denied: the call of delete was not run (test policy)" in observations[0].output
    assert "[s] shout → ok: PARIS IS 15" in observations[1].output
    created = [e for e in events if isinstance(e, PlanCreated)]
    assert [c.attempt for c in created] == [1, 2]
    assert all(c.run_id == result.run_id for c in created)  # emitted into the run's event stream
    finished = [(e.task_id, e.success) for e in events if isinstance(e, TaskFinished)]
    assert finished == [("w", True), ("d", False), ("w", True), ("s", True)]
    assert result.output == "PARIS IS 15"
    model.assert_used_up()


async def test_run_plan_attempts_are_bounded_per_run() -> None:
    plan = {"tasks": [{"id": "a", "tool": "shout", "args": {}}]}  # always invalid: text missing
    model = ScriptedModel([{"tool_calls": [{"name": "run_plan", "args": plan}]}] * 3 + ["gave up"])
    events: list[Any] = []
    agent = Agent(model, tools=[plan_tool([shout], max_attempts=2)], on_event=events.append)
    result = await agent.run("shout")
    outputs = [e.output for e in events if isinstance(e, ToolResultEvent)]
    assert "invalid arguments for shout: text: required, not given" in outputs[0]
    assert "already called 2 times in this run (the limit)" in outputs[2]
    assert result.output == "gave up"


async def test_run_plan_is_not_cut_by_the_per_call_timeout_when_each_task_is_within_it() -> None:
    async def step(n: int) -> str:
        """0.5 s each: well within the 1.2 s per-call timeout; three in a row (1.5 s) always exceed it."""
        await asyncio.sleep(0.5)
        return f"step {n}"

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    tasks = [
        {"id": f"s{n}", "tool": "step", "args": {"n": n}, "depends_on": [f"s{n - 1}"] if n else []}
        for n in range(3)
    ]
    model = ScriptedModel([{"tool_calls": [{"name": "run_plan", "args": {"tasks": tasks}}]}, "done"])
    events: list[Any] = []
    agent = Agent(
        model,
        tools=[plan_tool([Tool("step", "step", schema, step)])],
        tool_timeout=1.2,
        on_event=events.append,
    )
    await agent.run("three steps")
    (observation,) = [e for e in events if isinstance(e, ToolResultEvent)]
    assert observation.success, observation.output  # was "run_plan was abandoned: it timed out after 1 s"
    assert observation.output.splitlines() == [
        "[s0] step → ok: step 0",
        "[s1] step → ok: step 1",
        "[s2] step → ok: step 2",
    ]


async def test_a_hanging_task_in_run_plan_times_out_alone() -> None:
    async def hang() -> str:
        """Never returns."""
        await asyncio.Event().wait()
        return "never"

    tools = [Tool("hang", "hang", {"type": "object", "properties": {}}, hang), shout]
    plan = {
        "tasks": [
            {"id": "s", "tool": "shout", "args": {"text": "a"}},
            {"id": "h", "tool": "hang", "args": {}, "depends_on": ["s"]},
        ]
    }
    model = ScriptedModel([{"tool_calls": [{"name": "run_plan", "args": plan}]}, "done"])
    events: list[Any] = []
    await Agent(model, tools=[plan_tool(tools)], tool_timeout=0.2, on_event=events.append).run("go")
    (observation,) = [e for e in events if isinstance(e, ToolResultEvent)]
    assert "[s] shout → ok: A" in observation.output  # the results so far are kept
    assert "Task 'h' failed: Error: hang was abandoned: it timed out after 0.2 s." in observation.output


async def test_completed_tasks_are_not_rerun_on_repair() -> None:
    calls: list[str] = []

    def fetch(key: str) -> str:
        calls.append(key)
        return json.dumps({"key": key})

    def flaky(value: str) -> str:
        if value != "fixed":
            raise ValueError(f"bad value {value!r}")
        return "stored"

    schema = {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}
    tools = [
        Tool("fetch", "fetch", schema, fetch),
        Tool("flaky", "flaky", {"type": "object", "properties": {"value": {"type": "string"}}}, flaky),
    ]
    first = {
        "tasks": [
            {"id": "f", "tool": "fetch", "args": {"key": "k"}},
            {"id": "x", "tool": "flaky", "args": {"value": "${f.key}"}, "depends_on": ["f"]},
        ]
    }
    second = {
        "tasks": [
            {"id": "f", "tool": "fetch", "args": {"key": "k"}},
            {"id": "x", "tool": "flaky", "args": {"value": "fixed"}, "depends_on": ["f"]},
        ]
    }
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "run_plan", "args": first}]},
            {"tool_calls": [{"name": "run_plan", "args": second}]},
            "done",
        ]
    )
    await Agent(model, tools=[plan_tool(tools)]).run("store it")
    assert calls == ["k"]  # fetched once: the repaired plan reused the result


# ---------------------------------------------------------------------------------- plan-and-execute


async def test_plan_and_execute_repairs_then_answers() -> None:
    attempts: list[str] = []

    def convert(amount: int, currency: str) -> str:
        attempts.append(currency)
        if currency not in ("EUR", "USD"):
            raise ValueError(f"unknown currency {currency!r}")
        return json.dumps({"amount": amount * 2, "currency": currency})

    schema = {
        "type": "object",
        "properties": {"amount": {"type": "integer"}, "currency": {"type": "string"}},
        "required": ["amount", "currency"],
    }
    tools = [Tool("convert", "Convert money", schema, convert), shout]
    broken = "I will convert the money."  # not JSON
    failing = json.dumps(
        {"tasks": [{"id": "c", "tool": "convert", "args": {"amount": 5, "currency": "EURO"}}]}
    )
    repaired = json.dumps(
        {
            "tasks": [
                {"id": "c", "tool": "convert", "args": {"amount": 5, "currency": "EUR"}},
                {
                    "id": "s",
                    "tool": "shout",
                    "args": {"text": "${c.amount} ${c.currency}"},
                    "depends_on": ["c"],
                },
            ]
        }
    )
    model = ScriptedModel([broken, failing, f"```json\n{repaired}\n```", "You get 10 EUR."])
    events: list[Any] = []
    outcome = await run_plan_and_execute(model, "Convert 5 to euros", tools, emit=events.append)

    assert outcome.ok and outcome.answer == "You get 10 EUR."
    assert outcome.attempts == 3
    assert outcome.result is not None and outcome.result.results["s"].output == "10 EUR"
    assert attempts == ["EURO", "EUR"]
    assert outcome.usage.requests == 4
    # the model was shown each problem
    feedback = [m.content for m in model.requests[3].messages if m.role == "user"]
    assert "That plan cannot run: the plan is not valid JSON" in feedback[1]
    assert "Task 'c' failed: Error: convert raised ValueError: unknown currency 'EURO'" in feedback[2]
    assert "[s] shout → ok: 10 EUR" in feedback[3]
    assert [e.attempt for e in events if isinstance(e, PlanCreated)] == [2, 3]
    assert "convert" in model.requests[0].messages[0].content  # the tools were described


async def test_plan_and_execute_gives_up_after_max_repairs() -> None:
    bad = json.dumps({"tasks": [{"id": "a", "tool": "nope", "args": {}}]})
    model = ScriptedModel([bad, bad])
    outcome = await run_plan_and_execute(model, "goal", [shout], max_repairs=1)
    assert not outcome.ok and outcome.error == (
        "no plan succeeded in 2 attempts; the last one: the plan is invalid:\n"
        "- task 'a' uses unknown tool 'nope' (available: shout)"
    )
    assert outcome.attempts == 2 and outcome.answer == ""
    model.assert_used_up()


async def test_a_plan_whose_args_nest_too_deeply_is_a_plan_error_the_model_can_repair() -> None:
    # 500 levels parse as JSON, but the recursive checks died: RecursionError escaped execute_plan and
    # run_plan_and_execute (which promises never to raise for a bad plan)
    deep = '{"tasks": [{"id": "a", "tool": "shout", "args": {"text": ' + "[" * 500 + "]" * 500 + "}}]}"
    with pytest.raises(PlanError, match="the args of task\\(s\\) 'a' are nested more than 32 levels deep"):
        await execute_plan(parse_plan(deep), [shout])
    good = json.dumps({"tasks": [{"id": "s", "tool": "shout", "args": {"text": "ok"}}]})
    model = ScriptedModel([deep, good, "done"])
    outcome = await run_plan_and_execute(model, "shout ok", [shout])
    assert outcome.ok and outcome.attempts == 2 and outcome.answer == "done"
    assert "nested more than 32 levels deep" in model.requests[1].messages[-1].content


async def test_plan_and_execute_takes_an_agent() -> None:
    plan = json.dumps({"tasks": [{"id": "s", "tool": "shout", "args": {"text": "ok"}}]})
    agent = Agent(ScriptedModel([plan, "OK it is"]), tools=[shout])
    outcome = await run_plan_and_execute(agent, "shout ok")
    assert outcome.answer == "OK it is" and outcome.result is not None
    assert outcome.result.results["s"].output == "OK"


async def test_run_plan_works_in_react_mode() -> None:
    plan = {"tasks": [{"id": "s", "tool": "shout", "args": {"text": "quiet"}}]}
    model = ScriptedModel(
        [
            f"Thought: one step.\nAction: run_plan\nAction Input: {json.dumps(plan)}",
            "Thought: done.\nFinal Answer: QUIET",
        ],
        tools=False,
    )
    events: list[Any] = []
    result = await Agent(model, tools=[plan_tool([shout])], on_event=events.append).run("shout quiet")
    assert result.state.mode == "react"
    (observation,) = [e for e in events if isinstance(e, ToolResultEvent)]
    assert observation.success and observation.output == "[s] shout → ok: QUIET"
    assert result.output == "QUIET"


async def test_a_failure_inside_a_run_cancels_the_slow_sibling() -> None:
    slow_started = asyncio.Event()
    completed: list[str] = []

    async def slow() -> str:
        """Slow."""
        slow_started.set()
        await asyncio.sleep(3600)
        completed.append("slow")
        return "slow"

    async def boom() -> str:
        """Boom."""
        await slow_started.wait()
        raise RuntimeError("boom")

    schema = {"type": "object", "properties": {}}
    tools = [Tool("slow", "slow", schema, slow), Tool("boom", "boom", schema, boom)]
    plan = {"tasks": [{"id": "s", "tool": "slow", "args": {}}, {"id": "b", "tool": "boom", "args": {}}]}
    model = ScriptedModel([{"tool_calls": [{"name": "run_plan", "args": plan}]}, "it failed"])
    events: list[Any] = []
    result = await Agent(model, tools=[plan_tool(tools)], on_event=events.append).run("go")
    (observation,) = [e for e in events if isinstance(e, ToolResultEvent)]
    assert not observation.success
    assert "Task 'b' failed: Error: boom raised RuntimeError: boom" in observation.output
    assert "Cancelled (same level): s" in observation.output
    assert completed == []  # the slow sibling never completed
    assert result.output == "it failed"


def test_tasks_as_small_models_write_them_are_read() -> None:
    plan = parse_plan(
        """Here is my plan:
        ```json
        {"tasks": [
          {"id": 1, "tool": "lookup", "arguments": "{\\"key\\": \\"a\\"}", "description": "get a"},
          {"id": "b", "tool_name": "lookup", "args": null, "depends_on": 1, "reason": "then b"},
          {"id": "c", "action": "lookup", "parameters": {"key": "c"}, "depends_on": "", "Note": "alone"}
        ]}
        ```"""
    )
    assert [(t.id, t.tool, t.args, t.depends_on) for t in plan.tasks] == [
        ("1", "lookup", {"key": "a"}, []),
        ("b", "lookup", {}, ["1"]),
        ("c", "lookup", {"key": "c"}, []),
    ]


def test_what_cannot_be_read_as_a_task_is_still_explained() -> None:
    with pytest.raises(PlanError, match=r"tasks\.0\.args"):
        parse_plan({"tasks": [{"id": "a", "tool": "lookup", "args": "key=a"}]})  # not JSON: not guessed
    with pytest.raises(PlanError, match=r"tasks\.0\.agrs"):
        parse_plan({"tasks": [{"id": "a", "tool": "lookup", "agrs": {"key": "a"}}]})  # a typo is not dropped


async def test_plan_and_execute_reports_a_failing_model_and_refuses_bad_settings() -> None:
    from thinkloop import ConfigurationError, ModelError
    from thinkloop.testing import FunctionModel

    plan = json.dumps({"tasks": [{"id": "s", "tool": "shout", "args": {"text": "ok"}}]})

    def reply(request: Any) -> str:
        if len(request.messages) > 2:  # the final answer: the provider is down by then
            raise ModelError("HTTP 503 from the provider", provider="test")
        return plan

    outcome = await run_plan_and_execute(FunctionModel(reply), "shout ok", [shout])
    assert not outcome.ok and outcome.error is not None and "the model failed" in outcome.error
    assert "HTTP 503" in outcome.error and outcome.result is not None  # what ran is kept
    assert outcome.result.results["s"].output == "OK"
    with pytest.raises(ConfigurationError, match="max_repairs must be 0 or more"):
        await run_plan_and_execute(FunctionModel(reply), "x", [shout], max_repairs=-1)
    with pytest.raises(ConfigurationError, match="needs a Model or an Agent"):
        await run_plan_and_execute("gpt", "x", [shout])


class _Crash(BaseException):
    """Stands in for the process dying: nothing in thinkloop catches it."""


async def test_a_resumed_run_does_not_rerun_plan_tasks_that_finished_before_the_crash(
    tmp_path: Path,
) -> None:
    # The run dies after task a (a side effect) finished and was saved, while b had not run. On resume
    # run_plan's outcome is unknown (it is not idempotent) and the model sends the same plan again: a
    # must not be sent twice. It was: the tasks finished so far were only remembered in the process.
    sent: list[str] = []

    @tool
    def send(to: str) -> str:
        """Send a message (not idempotent)."""
        sent.append(to)
        return f"sent to {to}"

    plan = {
        "tasks": [
            {"id": "a", "tool": "send", "args": {"to": "bob"}},
            {"id": "b", "tool": "send", "args": {"to": "carol"}, "depends_on": ["a"]},
        ]
    }
    script: list[Any] = [
        {"tool_calls": [{"name": "run_plan", "args": plan}]},
        {"tool_calls": [{"name": "run_plan", "args": plan}]},
        "sent both",
    ]

    class DiesAfterA(SQLiteStore):
        async def checkpoint(self, state: RunState, events: Any) -> None:
            await super().checkpoint(state, events)
            if any(e.call_id.endswith("_a") and e.status == "done" for e in state.ledger.values()):
                raise _Crash

    def agent(store: SQLiteStore) -> Agent:  # a new plan tool each time, as in a new process
        return Agent(ScriptedModel(script, by_turn=True), tools=[plan_tool([send])], store=store)

    with pytest.raises(_Crash):
        await agent(DiesAfterA(tmp_path / "runs.db")).run("send to bob, then carol", run_id="r")
    assert sent == ["bob"]
    result = await agent(SQLiteStore(tmp_path / "runs.db")).resume("r")
    assert sent == ["bob", "carol"]  # not ["bob", "bob", "carol"]
    observations = [m.content for m in result.state.messages if m.role == "tool"]
    assert observations[0].startswith("Error: the outcome of run_plan is unknown")
    assert (
        "[a] send → ok: sent to bob" in observations[1] and "[b] send → ok: sent to carol" in observations[1]
    )
    assert result.output == "sent both"


async def test_a_resumed_run_goes_on_counting_its_run_plan_attempts(tmp_path: Path) -> None:
    # The attempts were counted in the plan tool's memory, which died with the process: a run that
    # crashed after using up its attempts could call run_plan max_attempts times more after resuming.
    sent: list[str] = []

    @tool
    def send(to: str) -> str:
        """Send a message (not idempotent)."""
        sent.append(to)
        return f"sent to {to}"

    def plan(to: str) -> dict[str, Any]:
        return {"tasks": [{"id": to, "tool": "send", "args": {"to": to}}]}

    script: list[Any] = [
        {"tool_calls": [{"name": "run_plan", "args": {"tasks": [{"id": "x", "tool": "nope", "args": {}}]}}]},
        {"tool_calls": [{"name": "Run_Plan", "args": plan("bob")}]},  # a near miss of the name counts too
        {"tool_calls": [{"name": "run_plan", "args": plan("carol")}]},  # the third: over the limit
        "sent to bob only",
    ]

    class DiesAfterTheSecondPlan(SQLiteStore):
        async def checkpoint(self, state: RunState, events: Any) -> None:
            await super().checkpoint(state, events)
            if sum(e.name.lower() == "run_plan" and e.status == "done" for e in state.ledger.values()) == 2:
                raise _Crash

    def agent(store: SQLiteStore) -> Agent:  # a new plan tool each time, as in a new process
        tools = [plan_tool([send], max_attempts=2)]
        return Agent(ScriptedModel(script, by_turn=True), tools=tools, store=store)

    with pytest.raises(_Crash):
        await agent(DiesAfterTheSecondPlan(tmp_path / "runs.db")).run("send to bob", run_id="r")
    assert sent == ["bob"]
    result = await agent(SQLiteStore(tmp_path / "runs.db")).resume("r")
    assert sent == ["bob"]  # not ["bob", "carol"]
    refused = [m.content for m in result.state.messages if m.role == "tool"][-1]
    assert refused == (
        "Error: run_plan raised PlanError: run_plan was already called 2 times in this run (the limit): "
        "answer with what you have"
    )
    assert result.output == "sent to bob only"


async def test_run_plan_outside_a_run_has_no_earlier_attempts() -> None:
    run_plan = plan_tool([shout], max_attempts=1)
    for _ in range(2):  # each direct call is a run of its own
        output = await run_plan.invoke({"tasks": [{"id": "a", "tool": "shout", "args": {"text": "hi"}}]})
        assert "[a] shout → ok: HI" in output


def _counting_tool() -> tuple[Tool, dict[str, int]]:
    """A tool that records how many of its calls run at once."""
    seen = {"now": 0, "peak": 0, "calls": 0}

    @tool
    async def probe(n: int) -> int:
        """Wait a moment, counting the calls in flight."""
        seen["now"] += 1
        seen["calls"] += 1
        seen["peak"] = max(seen["peak"], seen["now"])
        await asyncio.sleep(0.01)
        seen["now"] -= 1
        return n

    return probe, seen


async def test_a_wide_level_runs_at_most_max_concurrency_tasks_at_once() -> None:
    """A model-written level of many tasks started them all at once (a thousand `shell` tasks, a thousand
    processes); now at most `max_concurrency` (8 by default) run, the others wait for a slot."""
    plan = Plan([{"id": f"t{i}", "tool": "probe", "args": {"n": i}} for i in range(30)])
    probe, seen = _counting_tool()
    result = await execute_plan(plan, [probe])
    assert result.ok and seen["calls"] == 30 and seen["peak"] == DEFAULT_MAX_CONCURRENCY == 8
    probe, seen = _counting_tool()
    result = await execute_plan(plan, [probe], max_concurrency=3)
    assert result.ok and seen["peak"] == 3
    assert [result.results[f"t{i}"].output for i in range(30)] == [str(i) for i in range(30)]


async def test_the_plan_tool_passes_its_concurrency_limit_on() -> None:
    probe, seen = _counting_tool()
    tasks = [{"id": f"t{i}", "tool": "probe", "args": {"n": i}} for i in range(12)]
    model = ScriptedModel([{"tool_calls": [{"name": "run_plan", "args": {"tasks": tasks}}]}, "done"])
    agent = Agent(model, tools=[plan_tool([probe], max_concurrency=2)])
    result = await agent.run("probe twelve times")
    assert result.output == "done" and seen["calls"] == 12 and seen["peak"] == 2


@pytest.mark.parametrize("limit", [0, -1, 2.5, True])
async def test_a_concurrency_limit_that_is_not_a_positive_integer_is_refused(limit: Any) -> None:
    probe, _ = _counting_tool()
    with pytest.raises(ConfigurationError, match="max_concurrency must be an integer of at least 1"):
        await execute_plan(
            Plan([{"id": "a", "tool": "probe", "args": {"n": 1}}]), [probe], max_concurrency=limit
        )
    with pytest.raises(ConfigurationError, match="max_concurrency"):
        plan_tool([probe], max_concurrency=limit)


def _chain(n: int, refer: str) -> Plan:
    def args(i: int) -> dict[str, Any]:
        target = {"first": 0, "half": i // 2, "none": -1}[refer]
        return {"x": f"${{t{target}}}"} if 0 <= target < i - 1 else {}

    return Plan([Task(f"t{i}", "t", args(i), [f"t{i - 1}"] if i else []) for i in range(n)])


def _ladder(n: int) -> Plan:
    """Two chains, each b depending on its a and on the b before: b's references to b0 go the long way."""
    tasks = []
    for i in range(n // 2):
        tasks.append(Task(f"a{i}", "t", {}, [f"a{i - 1}"] if i else []))
        b_args = {"x": "${b0}"} if i > 1 else {}
        tasks.append(Task(f"b{i}", "t", b_args, [f"a{i}", f"b{i - 1}"] if i else [f"a{i}"]))
    return Plan(tasks)


@pytest.mark.parametrize("shape", ["chain, refer to the first", "chain, refer half way", "chain", "ladder"])
def test_a_very_long_chain_is_checked_in_linear_memory_whatever_it_refers_to(shape: str) -> None:
    # Each task's ancestors were a bit set over the plan: n²/8 bytes for a chain (40,000 tasks: 225 MB),
    # with or without references.
    import tracemalloc

    n = 40_000
    refer = {"chain, refer to the first": "first", "chain, refer half way": "half", "chain": "none"}
    plan = _ladder(n) if shape == "ladder" else _chain(n, refer[shape])
    tracemalloc.start()
    try:
        levels = plan.check()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sum(map(len, levels)) == n
    assert peak < 80_000_000  # ~30 MB now; 225 MB as bit sets


@st.composite
def referring_dags(draw: st.DrawFn) -> Plan:
    """A random DAG whose tasks refer to random tasks (ancestors or not, some unknown)."""
    plan = draw(dags())
    ids = [t.id for t in plan.tasks] + ["ghost"]
    tasks = []
    for task in plan.tasks:
        refs = draw(st.lists(st.sampled_from(ids), max_size=3))
        tasks.append(
            Task(task.id, task.tool, {f"a{k}": f"${{{r}}}" for k, r in enumerate(refs)}, task.depends_on)
        )
    return Plan(tasks)


@settings(max_examples=300, deadline=None)
@given(referring_dags())
def test_references_are_checked_against_the_real_ancestors(plan: Plan) -> None:
    ancestors = plan.ancestors()
    expected = []
    for task in plan.tasks:
        for ref in sorted({v[2:-1] for v in task.args.values()}):
            if ref == "ghost":
                expected.append(f"task {task.id!r} refers to ${{ghost}}, but there is no task 'ghost'")
            elif ref not in ancestors[task.id]:
                expected.append(
                    f"task {task.id!r} refers to ${{{ref}}} but does not depend on {ref!r}: "
                    f"add {ref!r} to its depends_on"
                )
    if not expected:
        plan.check()
        return
    with pytest.raises(PlanError) as info:
        plan.check()
    shown = [line[2:] for line in str(info.value).splitlines()[1:]]
    assert shown == expected[:20] + (
        [f"… and {len(expected) - 20} more problems"] if len(expected) > 20 else []
    )


_ONE_TASK = '{"tasks": [{"id": "a", "tool": "echo", "args": {"text": "hi"}}]}'


@pytest.mark.parametrize(
    "text",
    [
        f"No dependencies ([]) are needed. Plan: {_ONE_TASK}",  # was an empty plan, which "succeeded"
        f"Step [1] of my answer. Here is the plan:\n{_ONE_TASK}\nDone.",
        f'I will use ["echo"]: {_ONE_TASK}',
        '{"goal": "say hi", "reasoning": "simple", ' + _ONE_TASK[1:],  # commentary beside the tasks
        '{"plan": ' + _ONE_TASK + "}",  # the plan wrapped
    ],
)
def test_the_plan_is_found_in_prose_that_holds_other_json(text: str) -> None:
    plan = parse_plan(text)
    assert [(t.id, t.tool, t.args) for t in plan.tasks] == [("a", "echo", {"text": "hi"})]
