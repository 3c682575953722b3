"""Plans (SPEC §10): a DAG of tool calls, run level by level, written (and repaired) by a model.

    plan = Plan([
        Task("paris", "get_weather", {"city": "Paris"}),
        Task("rome", "get_weather", {"city": "Rome"}),
        Task("report", "write_report", {"text": "Paris: ${paris.temp}, Rome: ${rome.temp}"},
             depends_on=["paris", "rome"]),
    ])
    result = await execute_plan(plan, tools)   # paris and rome run together, then report

Levels. `plan.levels()` groups tasks by topological level (Kahn's algorithm): a task's level comes
after the levels of all its dependencies. Duplicate ids, unknown dependencies and cycles raise a
`PlanError` naming the ids at fault (for a cycle, the ids around it).

Execution. Each level's tasks run concurrently; the first task to fail cancels the rest of its level
and stops the plan: the `PlanResult` holds the results so far, the failed task id and the error. Inside
an agent run, every task goes through the agent's tool-execution choke point — argument validation,
risk rating, the safety gate, the ledger, the timeout and output truncation — exactly as a call made
by the model would; outside a run, tasks are validated, timed out and truncated the same way.

References. A task's arguments can use the results of tasks it depends on (directly or not):

- `"${a}"` — the whole value is replaced by task `a`'s result: its JSON value when the output is
  JSON, else its text;
- `"${a.field.0.name}"` — a field of a JSON result (numbers index lists);
- `"total: ${a.sum} (${b})"` — references inside a longer string are replaced by their text;
- `"$${a}"` — a literal `${a}`.

References are checked before anything runs: each must name a task the referring task depends on.

Plan-and-execute. A model can write the plan as JSON: `plan_tool(tools)` is a `run_plan` tool taking
the plan as its argument (so any loop mode can use it; a failed plan comes back as an observation and
the model can call `run_plan` again with a repaired plan, up to `max_attempts` per run), and
`run_plan_and_execute(model, goal, tools)` asks a model for a plan, runs it, shows the model any
failure for a repaired plan (at most `max_repairs` times), and asks it for the final answer.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ._errors import ConfigurationError, ModelError, RunError
from ._events import ErrorKind, Event, PlanCreated, TaskFinished, TaskSkipped, TaskStarted
from ._execute import RETURNED_LATER, execute_calls, returned_result, start_invocation
from ._messages import Message, ModelRequest, ModelSettings, ToolCall, Usage
from ._risk import RiskLevel
from ._tools import (
    MAX_DESCRIPTION,
    Tool,
    ToolArgumentsError,
    ToolContext,
    ToolRegistry,
    _check_against_schema,
    _safe_str,
    explain_errors,
    render_output,
    truncate_output,
)

if TYPE_CHECKING:
    from ._loop import RunContext
    from ._state import LedgerEntry
    from .models import Model

__all__ = [
    "Plan",
    "PlanError",
    "PlanOutcome",
    "PlanResult",
    "Task",
    "TaskResult",
    "execute_plan",
    "parse_plan",
    "plan_tool",
    "run_plan_and_execute",
]

EmitFn = Callable[[Event], None]
_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_REF_RE = re.compile(r"\$(\$?)\{([A-Za-z0-9_-]+)((?:\.[A-Za-z0-9_-]+)*)\}")
_ANY_REF_RE = re.compile(r"\$(\$?)\{([^{}]*)\}")  # anything written like a reference, valid or not
DEFAULT_TIMEOUT = 120.0
DEFAULT_OUTPUT_MAX_LENGTH = 10_000
_MAX_JSON_STARTS = 32
MAX_ARGS_DEPTH = 32  # levels of lists and objects in a task's args
_MAX_LISTED = 20  # ids or problems quoted in one error: a 1,000-task plan gets a message a model can read


DEFAULT_MAX_CONCURRENCY = 8
"""The most tasks of a plan running at once, by default."""


def _check_concurrency(limit: int) -> None:
    if type(limit) is not int or limit < 1:
        raise ConfigurationError(f"max_concurrency must be an integer of at least 1, got {limit!r}")


def _check_count(name: str, value: object, least: int) -> None:
    """A count (`max_attempts`, `max_repairs`): `"3"` or `2.5` failed inside the run with a TypeError."""
    if type(value) is not int or value < least:
        raise ConfigurationError(f"{name} must be {least} or more (a whole number), not {value!r}")


def _check_emit(emit: object) -> None:
    if emit is not None and not callable(emit):
        raise ConfigurationError(f"emit must be a function receiving each plan event (or None), not {emit!r}")


def _check_limits(tool_timeout: float | None, output_max_length: int | None) -> None:
    """A timeout of 0 or NaN waited forever (0 fell back to the default, NaN never fires), -1 failed every
    task at once: a positive number of seconds (or None), and a positive number of characters."""
    if tool_timeout is not None and (
        isinstance(tool_timeout, bool) or not (isinstance(tool_timeout, int | float) and tool_timeout > 0)
    ):
        raise ConfigurationError(
            f"tool_timeout must be a positive number of seconds or None, not {tool_timeout!r}"
        )
    if output_max_length is not None and not (type(output_max_length) is int and output_max_length > 0):
        raise ConfigurationError(
            f"output_max_length must be a positive number of characters or None, not {output_max_length!r}"
        )


class PlanError(RunError):
    """A plan that cannot run as written (bad ids, dependencies, references, tools or arguments).

    A plan is run input (often written by a model), so this is a run error; its message names the
    offending task ids and is written to be shown to the model that wrote the plan.
    """


# ============================================================================================ types


class Task(BaseModel):
    """One step of a plan: call `tool` with `args` once the tasks in `depends_on` are done."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    depends_on: list[str] = Field(default_factory=list)

    def __init__(
        self,
        id: str | None = None,
        tool: str | None = None,
        args: Mapping[str, Any] | None = None,
        depends_on: Sequence[str] | None = None,
        **extra: Any,
    ) -> None:
        given = {"id": id, "tool": tool, "args": args, "depends_on": depends_on}
        fields = {k: v for k, v in given.items() if v is not None}  # a missing field: a ValidationError
        super().__init__(**fields, **extra)


class Plan(BaseModel):
    """A DAG of tasks. `levels()` orders them; `check()` validates everything before a run."""

    model_config = ConfigDict(extra="forbid")

    tasks: list[Task]

    def __init__(self, tasks: Iterable[Task | Mapping[str, Any]] = (), **extra: Any) -> None:
        if not isinstance(tasks, list | str | bytes | Mapping):
            tasks = list(tasks)
        super().__init__(tasks=tasks, **extra)

    def __len__(self) -> int:
        return len(self.tasks)

    def task(self, task_id: str) -> Task:
        for task in self.tasks:
            if task.id == task_id:
                return task
        raise KeyError(task_id)

    def levels(self) -> list[list[Task]]:
        """Tasks grouped by topological level (Kahn), in plan order within a level.

        Raises:
            PlanError: duplicate or invalid ids, unknown dependencies, or a cycle (named in order).
        """
        by_id = self._index()
        waiting = {t.id: len(set(t.depends_on)) for t in self.tasks}
        dependents: dict[str, list[str]] = {t.id: [] for t in self.tasks}
        for task in self.tasks:
            for dep in dict.fromkeys(task.depends_on):
                dependents[dep].append(task.id)
        order = {t.id: i for i, t in enumerate(self.tasks)}
        level = [t.id for t in self.tasks if waiting[t.id] == 0]
        levels: list[list[Task]] = []
        while level:
            levels.append([by_id[i] for i in level])
            ready = []
            for task_id in level:
                for dependent in dependents[task_id]:
                    waiting[dependent] -= 1
                    if waiting[dependent] == 0:
                        ready.append(dependent)
            level = sorted(ready, key=order.__getitem__)
        if sum(len(lv) for lv in levels) < len(self.tasks):
            raise PlanError(
                f"the plan has a cycle: {_cycle_text(self._cycle(waiting))} (each task depends on the next); "
                "remove one of these dependencies"
            )
        return levels

    def _index(self) -> dict[str, Task]:
        by_id: dict[str, Task] = {}
        duplicates: list[str] = []
        folded: dict[str, str] = {}  # lower-cased id -> the first id written so
        for task in self.tasks:
            _check_id(task.id)
            if task.id in by_id and task.id not in duplicates:
                duplicates.append(task.id)
            first = folded.setdefault(task.id.lower(), task.id)
            if first != task.id:
                raise PlanError(
                    f"task ids {first!r} and {task.id!r} differ only in case: give each task a clearly "
                    "different id (references and depends_on must match an id exactly)"
                )
            by_id[task.id] = task
        if duplicates:
            raise PlanError(
                f"duplicate task id(s): {_listing(map(repr, duplicates))}; every task needs its own id"
            )
        unknown = [(t.id, d) for t in self.tasks for d in t.depends_on if d not in by_id]
        if unknown:
            listing = _listing((f"task {t!r} depends on unknown task {d!r}" for t, d in unknown), sep="; ")
            raise PlanError(f"{listing} (known tasks: {_listing(by_id)})")
        return by_id

    def _cycle(self, waiting: Mapping[str, int]) -> list[str]:
        """A cycle among the tasks Kahn could not place: follow unplaced dependencies until one repeats."""
        stuck = {task_id for task_id, count in waiting.items() if count > 0}
        deps = {t.id: [d for d in t.depends_on if d in stuck] for t in self.tasks if t.id in stuck}
        node = next(t.id for t in self.tasks if t.id in stuck)
        path: list[str] = []
        seen: dict[str, int] = {}
        while node not in seen:
            seen[node] = len(path)
            path.append(node)
            node = deps[node][0]
        return [*path[seen[node] :], node]

    def check(self, tools: ToolRegistry | None = None) -> list[list[Task]]:
        """Everything that can be checked before running; the levels.

        The graph (`levels()`), the references (each must name a task the referring task depends on,
        directly or not) and, given `tools`, that every tool exists and the arguments fit its schema
        (arguments holding references are checked once filled in, when the task runs).

        Raises:
            PlanError: listing every problem found, by task id.
        """
        levels = self.levels()
        too_deep = [t.id for t in self.tasks if _nesting(t.args) > MAX_ARGS_DEPTH]
        if too_deep:  # before the checks below, which recurse into the arguments
            raise PlanError(
                f"the args of task(s) {_listing(map(repr, too_deep))} are nested more than {MAX_ARGS_DEPTH} "
                "levels deep: flatten them (a tool's arguments need only a few levels)"
            )
        problems = [
            f"task {t.id!r}: {ref} is not a reference: write ${{task}} or ${{task.field.0}} "
            "(letters, digits, '_', '-', dots between parts), or $${...} for the literal text"
            for t in self.tasks
            for ref in _malformed_references(t.args)
        ]
        problems += self._reference_problems(levels)
        if tools is not None:
            problems += [p for t in self.tasks if (p := _tool_problem(t, tools))]
        if problems:
            shown = [f"- {p}" for p in problems[:_MAX_LISTED]]
            if len(problems) > _MAX_LISTED:
                shown.append(f"- … and {len(problems) - _MAX_LISTED} more problems")
            raise PlanError("the plan is invalid:\n" + "\n".join(shown))
        return levels

    def ancestors(self) -> dict[str, set[str]]:
        """Each task's direct and indirect dependencies (the plan must be acyclic). The answer itself is
        quadratic in a chain's length: `check()` does not build it."""
        bits, ids = self._ancestor_bits(), [t.id for t in self.tasks]
        return {task_id: {ids[i] for i in range(len(ids)) if mask >> i & 1} for task_id, mask in bits.items()}

    def _ancestor_bits(self) -> dict[str, int]:
        """Each task's ancestors as a bit set over plan positions (n²/8 bytes for a chain of n tasks; a
        chain of 5,000 took 650 MB as sets of ids)."""
        bit = {t.id: 1 << i for i, t in enumerate(self.tasks)}
        result: dict[str, int] = {}
        for level in self.levels():
            for task in level:
                mask = 0
                for dep in task.depends_on:
                    mask |= bit[dep] | result[dep]
                result[task.id] = mask
        return result

    def _reference_problems(self, levels: list[list[Task]]) -> list[str]:
        """Each reference must name a task the referring task depends on, directly or not. Checked in
        memory linear in the plan (ancestors as bit sets took n²/8 bytes for a chain: 225 MB at 40,000)."""
        known = {t.id for t in self.tasks}
        refs = {task.id: sorted(_references(task.args)) for task in self.tasks}
        indirect = [
            (task.id, ref)
            for task in self.tasks
            for ref in refs[task.id]
            if ref in known and ref not in task.depends_on
        ]
        unreached = _Reach(self, levels).unreached(indirect) if indirect else set()
        problems = []
        for task in self.tasks:
            for ref in refs[task.id]:
                if ref not in known:
                    problems.append(f"task {task.id!r} refers to ${{{ref}}}, but there is no task {ref!r}")
                elif (task.id, ref) in unreached:
                    problems.append(
                        f"task {task.id!r} refers to ${{{ref}}} but does not depend on {ref!r}: "
                        f"add {ref!r} to its depends_on"
                    )
        return problems

    def describe(self) -> list[dict[str, Any]]:
        """The tasks as JSON-ready dicts."""
        return [t.model_dump() for t in self.tasks]


class _Reach:
    """Whether a task depends on another, directly or not, in memory linear in the plan.

    Each task's deepest dependency makes it a child in a spanning forest; numbering the forest in depth-
    first order answers "is `a` above `b` in it" at once (every question in a chain). The other questions
    are answered per referred task by a walk along its dependents that stops at the level of the deepest
    task asking and as soon as all of them are reached.
    """

    def __init__(self, plan: Plan, levels: list[list[Task]]) -> None:
        self.level = {t.id: index for index, level in enumerate(levels) for t in level}
        self.dependents: dict[str, list[str]] = {t.id: [] for t in plan.tasks}
        children: dict[str, list[str]] = {t.id: [] for t in plan.tasks}
        roots = []
        for task in plan.tasks:
            for dep in dict.fromkeys(task.depends_on):
                self.dependents[dep].append(task.id)
            if task.depends_on:
                children[max(task.depends_on, key=self.level.__getitem__)].append(task.id)
            else:
                roots.append(task.id)
        self.enter: dict[str, int] = {}
        self.leave: dict[str, int] = {}
        clock = 0
        for root in roots:  # depth first, without recursion (a chain is as deep as it is long)
            stack = [(root, iter(children[root]))]
            self.enter[root] = clock = clock + 1
            while stack:
                node, rest = stack[-1]
                child = next(rest, None)
                if child is None:
                    stack.pop()
                    self.leave[node] = clock = clock + 1
                else:
                    self.enter[child] = clock = clock + 1
                    stack.append((child, iter(children[child])))

    def _above(self, ancestor: str, task: str) -> bool:
        return self.enter[ancestor] < self.enter[task] and self.leave[task] < self.leave[ancestor]

    def unreached(self, questions: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
        """The (task, referred) pairs where the task does not depend on the referred task."""
        asking: dict[str, set[str]] = {}
        for task, ref in questions:
            if not self._above(ref, task):
                asking.setdefault(ref, set()).add(task)
        unreached = set()
        for ref, tasks in asking.items():
            unreached |= {(task, ref) for task in tasks - self._reached(ref, tasks)}
        return unreached

    def _reached(self, start: str, wanted: set[str]) -> set[str]:
        """Which of `wanted` depend on `start`: its dependents, level by level, up to the deepest wanted."""
        deepest = max(self.level[t] for t in wanted)
        found: set[str] = set()
        seen, frontier = {start}, [start]
        while frontier and len(found) < len(wanted):
            following = []
            for node in frontier:
                for dependent in self.dependents[node]:
                    if dependent in seen or self.level[dependent] > deepest:
                        continue
                    seen.add(dependent)
                    if dependent in wanted:
                        found.add(dependent)
                    following.append(dependent)
            frontier = following
        return found


def _nesting(value: Any) -> int:
    """How deeply lists and objects nest in `value`, counted without recursion (a model may nest them
    thousands deep: the recursive checks died with a RecursionError that escaped run_plan_and_execute)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping | list | tuple):
            deepest = max(deepest, depth)
            if deepest > MAX_ARGS_DEPTH:
                break
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, Mapping) else item))
    return deepest


def _check_id(task_id: str) -> None:
    if _ID_RE.fullmatch(task_id):
        return
    hint = " (it has spaces or line breaks around it)" if _ID_RE.fullmatch(task_id.strip()) else ""
    raise PlanError(f"task id {task_id!r} is invalid{hint}: use 1-64 letters, digits, '_' or '-'")


def _listing(items: Iterable[str], sep: str = ", ") -> str:
    """At most `_MAX_LISTED` items, then how many more."""
    items = list(items)
    more = f"{sep}… and {len(items) - _MAX_LISTED} more" if len(items) > _MAX_LISTED else ""
    return sep.join(items[:_MAX_LISTED]) + more


def _cycle_text(cycle: list[str]) -> str:
    """`a → b → a`; a long cycle shows its first and last ids and how many tasks it goes through."""
    if len(cycle) <= _MAX_LISTED:
        return " → ".join(cycle)
    half = _MAX_LISTED // 2
    return f"{' → '.join(cycle[:half])} → … ({len(cycle) - 1} tasks) … → {' → '.join(cycle[-half:])}"


def parse_plan(text: str | Mapping[str, Any] | Sequence[Any]) -> Plan:
    """A plan from JSON text, a dict `{"tasks": [...]}`, or a list of tasks.

    Text may be a model's reply: the plan in a fenced code block (any language tag) or in prose.

    Raises:
        PlanError: not JSON, or not shaped like a plan (the message says what to fix).
    """
    data: Any = _plan_json(text) if isinstance(text, str) else text
    if isinstance(data, list):
        data = {"tasks": data}
    if isinstance(data, Mapping) and "tasks" not in data and isinstance(data.get("plan"), Mapping):
        data = data["plan"]  # {"plan": {"tasks": [...]}}
    if not isinstance(data, Mapping) or not isinstance(data.get("tasks"), list):
        raise PlanError(f"a plan is a JSON object with a 'tasks' list: {_PLAN_SHAPE}")
    data = {k: v for k, v in data.items() if not (isinstance(k, str) and k.lower() in _COMMENTARY)}
    data["tasks"] = [_as_written(t) if isinstance(t, Mapping) else t for t in data["tasks"]]
    try:
        return Plan.model_validate(dict(data))
    except ValidationError as exc:
        raise PlanError(f"the plan is not shaped right: {_explain(exc)}; write it as {_PLAN_SHAPE}") from None


_PLAN_SHAPE = '{"tasks": [{"id": "a", "tool": "TOOL", "args": {...}, "depends_on": []}, ...]}'

_COMMENTARY = frozenset(
    {"description", "reason", "reasoning", "thought", "explanation", "purpose", "title", "note", "notes"}
    | {"comment", "comments", "goal", "expected_output", "why"}
)  # what models add to a task to explain it: dropped, it changes nothing
_ALIASES = {"args": ("arguments", "parameters", "params", "input"), "tool": ("tool_name", "action")}


def _as_written(task: Mapping[str, Any]) -> dict[str, Any]:
    """A task as a model wrote it, in the shape `Task` takes: commentary keys dropped, `arguments` for
    `args` and `tool_name` for `tool`, args given as JSON text read, one dependency given as a string (or
    none as null) made a list, a number as id made text. Anything else is left for validation to explain."""
    out = {k: v for k, v in task.items() if not (isinstance(k, str) and k.lower() in _COMMENTARY)}
    for field_name, aliases in _ALIASES.items():
        if field_name not in out:
            alias = next((a for a in aliases if a in out), None)
            if alias is not None:
                out[field_name] = out.pop(alias)
    args = out.get("args")
    if isinstance(args, str):
        try:
            parsed = _strict_json(args) if args.strip() else {}
        except (ValueError, RecursionError):  # not JSON, or nested past Python's recursion limit
            parsed = None
        if isinstance(parsed, dict):
            out["args"] = parsed
    elif args is None and "args" in out:
        out["args"] = {}
    deps = out.get("depends_on", [])
    if deps is None or deps == "":
        out["depends_on"] = []
    elif isinstance(deps, str | int):
        out["depends_on"] = [str(deps)]
    elif isinstance(deps, list):
        out["depends_on"] = [str(d) if isinstance(d, int) and not isinstance(d, bool) else d for d in deps]
    if isinstance(out.get("id"), int) and not isinstance(out.get("id"), bool):
        out["id"] = str(out["id"])
    return out


_FENCE_RE = re.compile(r"```(?>[A-Za-z0-9_+-]*[ \t]*\n?)(.*?)```", re.DOTALL)  # atomic: see _output._FENCE_RE


def _plan_json(text: str) -> Any:
    """The plan in a model's reply: the whole text as JSON, else the first JSON object or list found
    in a fenced code block (any language tag) or in the prose around it.

    Raises:
        PlanError: no JSON plan in the text, or JSON nested too deeply to read.
    """
    candidates = [text.strip(), *(m.group(1).strip() for m in _FENCE_RE.finditer(text))]
    error = "no JSON found"
    for candidate in candidates:
        try:
            return _strict_json(candidate)
        except RecursionError:
            raise PlanError(f"the plan is nested too deeply to read; write it as {_PLAN_SHAPE}") from None
        except ValueError as exc:
            error = str(exc)  # a fenced block's error, when there is one, says the most
    embedded = _first_json_in(text)
    if embedded is not None:
        return embedded
    raise PlanError(f"the plan is not valid JSON ({error}); write it as {_PLAN_SHAPE}")


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _finite(number: str) -> float:
    value = float(number)
    if not math.isfinite(value):
        raise ValueError(f"{number} is out of range")
    return value


def _strict_json(text: str) -> Any:
    """JSON as the standard writes it: NaN, Infinity and 1e999 (Python's json reads them as floats) are
    refused — in a task's arguments they made the run's state and events JSON that stores reject."""
    return json.loads(text, parse_constant=_not_json, parse_float=_finite)


def _first_json_in(text: str) -> Any:
    """The first JSON object or list in `text` that looks like a plan (prose around it is ignored)."""
    decoder = json.JSONDecoder(parse_constant=_not_json, parse_float=_finite)
    starts = itertools.islice(
        re.finditer(r"[{\[]", text), _MAX_JSON_STARTS
    )  # bounded: each try may read to the end
    for match in starts:
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except RecursionError:
            raise PlanError(f"the plan is nested too deeply to read; write it as {_PLAN_SHAPE}") from None
        except ValueError:
            continue
        if _looks_like_plan(value):
            return value
    return None


def _looks_like_plan(value: Any) -> bool:
    """A plan's JSON: an object with a `tasks` list (perhaps under `plan`), or a list of task objects — not
    any list the prose around a plan holds (`no dependencies ([])` read as an empty plan, which "ran")."""
    if isinstance(value, dict):
        inner = value.get("plan")
        return isinstance(value.get("tasks"), list) or (
            isinstance(inner, dict) and isinstance(inner.get("tasks"), list)
        )
    return isinstance(value, list) and bool(value) and all(isinstance(item, dict) for item in value)


def _explain(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"])
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts[:8])


def _tool_problem(task: Task, tools: ToolRegistry) -> str | None:
    tool = tools.get(task.tool)
    if tool is None:
        return f"task {task.id!r} uses unknown tool {task.tool!r} (available: {_listing(tools.names)})"
    fixed = {k: v for k, v in task.args.items() if not _references(v)}
    pending = set(task.args) - set(fixed)
    problem = _static_argument_problem(tool, fixed, pending)
    return f"task {task.id!r}: invalid arguments for {tool.name}: {problem}" if problem else None


def _static_argument_problem(tool: Tool, fixed: dict[str, Any], pending: set[str]) -> str | None:
    """Validate the arguments without references; those with references are filled in later."""
    if tool.validator is not None:
        try:
            tool.validator.model_validate(fixed)
        except ValidationError as exc:
            errors = [e for e in exc.errors(include_url=False) if not (e["loc"] and e["loc"][0] in pending)]
            return explain_errors(errors, fixed) or None
        return None
    schema = dict(tool.parameters)
    schema["required"] = [r for r in schema.get("required", []) if r not in pending]
    try:
        _check_against_schema(fixed, schema)
    except ToolArgumentsError as exc:
        return str(exc)
    return None


# ======================================================================================= references


def _references(value: Any) -> set[str]:
    """The task ids referred to anywhere in an argument value."""
    if isinstance(value, str):
        return {m.group(2) for m in _REF_RE.finditer(value) if not m.group(1)}
    if isinstance(value, Mapping):
        return set().union(*(_references(v) for v in value.values()))
    if isinstance(value, list | tuple):
        return set().union(*(_references(v) for v in value))
    return set()


def _malformed_references(value: Any) -> list[str]:
    """`${...}` written where a reference was meant but not valid (`${a[0]}`, `${ a }`): without this
    the tool would silently receive the literal text."""
    if isinstance(value, str):
        return [
            m.group(0)
            for m in _ANY_REF_RE.finditer(value)
            if not m.group(1) and not _REF_RE.fullmatch(m.group(0))
        ]
    if isinstance(value, Mapping):
        return [ref for v in value.values() for ref in _malformed_references(v)]
    if isinstance(value, list | tuple):
        return [ref for v in value for ref in _malformed_references(v)]
    return []


def resolve(value: Any, results: Mapping[str, TaskResult], *, text_args: Iterable[str] = ()) -> Any:
    """`value` with every reference replaced by the referred result (see the module docs). The arguments
    named in `text_args` (a tool's parameters of type string) take a whole-value reference as text: a
    result `12345` (an order id) is `"12345"` there, not the number, which a string parameter refuses.

    Raises:
        PlanError: a reference to a missing result or field.
    """
    if isinstance(value, str):
        return _resolve_string(value, results)
    if isinstance(value, Mapping):
        texts = frozenset(text_args)
        return {k: _resolve_string(v, results, as_text=True) if k in texts and isinstance(v, str)
                else resolve(v, results) for k, v in value.items()}  # fmt: skip
    if isinstance(value, list | tuple):
        return [resolve(v, results) for v in value]
    return value


def _resolve_string(text: str, results: Mapping[str, TaskResult], *, as_text: bool = False) -> Any:
    whole = _REF_RE.fullmatch(text)
    if whole and not whole.group(1) and not as_text:
        return _lookup(whole, results)

    def replace(match: re.Match[str]) -> str:
        reference = _REF_RE.fullmatch(match.group(0))
        if match.group(1) or reference is None:
            return match.group(0)[1:] if match.group(1) else match.group(0)  # "$${…}" → "${…}"
        found = _lookup(reference, results)
        if isinstance(found, str):
            return found
        if not reference.group(3).strip(
            "."
        ):  # a whole result in text: as the tool wrote it ("1.10", not 1.1)
            return results[reference.group(2)].output.strip()
        return json.dumps(found, ensure_ascii=False)

    return _ANY_REF_RE.sub(replace, text)


def _text_parameters(tool: Tool | None) -> list[str]:
    """The parameters of `tool` whose schema type is string (only): they take references as text."""
    properties = tool.parameters.get("properties") if tool is not None else None
    if not isinstance(properties, Mapping):
        return []
    return [
        name
        for name, schema in properties.items()
        if isinstance(schema, Mapping) and schema.get("type") == "string"
    ]


def _lookup(match: re.Match[str], results: Mapping[str, TaskResult]) -> Any:
    task_id, path = match.group(2), [p for p in match.group(3).split(".") if p]
    result = results.get(task_id)
    if result is None or not result.success:
        raise PlanError(f"{match.group(0)}: task {task_id!r} has no result")
    value = result.value
    cut = _CUT_RE.search(result.output) if path and isinstance(value, str) else None
    if cut is not None:  # not JSON because it was cut: say so, not "the result is str '{…'"
        raise PlanError(
            f"{match.group(0)}: the output of task {task_id!r} was cut to its limit of {len(result.output):,} "
            f"characters (of {int(cut.group(1)):,}), so it is not JSON any more: have {result.tool} return "
            "less, or give it a larger output_max_length"
        )
    for index, key in enumerate(path):
        value = _step_into(value, key, match.group(0), path[:index])
    return value


_CUT_RE = re.compile(r"\n… \[\d+ characters truncated of (\d+)\] …\n")  # `truncate_output`'s marker


def _step_into(value: Any, key: str, ref: str, done: list[str]) -> Any:
    where = ".".join(done) or "the result"
    if isinstance(value, Mapping) and key in value:
        return value[key]
    if isinstance(value, list) and key.isdigit() and int(key) < len(value):
        return value[int(key)]
    if isinstance(value, Mapping):
        raise PlanError(
            f"{ref}: {where} has no field {key!r} (fields: {', '.join(map(str, value)) or 'none'})"
        )
    raise PlanError(f"{ref}: {where} is {type(value).__name__} {_short(value)}, not a JSON object or list")


def _short(value: Any, limit: int = 120) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return repr(text if len(text) <= limit else text[:limit] + "…")


def _json_value(text: str) -> Any:
    """A result's value for references: its JSON when it parses as JSON, else the text."""
    stripped = text.strip()
    if stripped[:1] in ("{", "[", '"') or stripped in ("true", "false", "null") or _looks_numeric(stripped):
        try:
            return _strict_json(stripped)
        except (ValueError, RecursionError):  # JSON nested too deeply to read is used as text
            return text
    return text


def _looks_numeric(text: str) -> bool:
    return bool(re.fullmatch(r"-?\d+(\.\d+)?([eE][-+]?\d+)?", text))


# ======================================================================================== execution


@dataclass(slots=True)
class TaskResult:
    """What one task produced. `value` is the output's JSON value (or its text) for references."""

    task_id: str
    tool: str
    output: str
    success: bool
    duration: float = 0.0
    error_kind: ErrorKind | None = None
    arguments: dict[str, Any] = field(default_factory=dict)

    @property
    def value(self) -> Any:
        return _json_value(self.output)


@dataclass(slots=True)
class PlanResult:
    """The results so far; on failure, the failed task, why, and which tasks were cancelled or never run."""

    results: dict[str, TaskResult]
    failed: str | None = None
    error: str | None = None
    cancelled: list[str] = field(default_factory=list)
    not_run: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failed is None

    def summary(self) -> str:
        """The results as text for a model: each task's output, then the failure if any."""
        lines = [
            f"[{r.task_id}] {r.tool} → {'ok' if r.success else 'FAILED'}: {r.output}"
            for r in self.results.values()
        ]
        if self.failed is not None:
            lines.append(f"Task {self.failed!r} failed: {self.error}")
            if self.cancelled:
                lines.append(f"Cancelled (same level): {', '.join(self.cancelled)}")
            if self.not_run:
                lines.append(f"Not run: {', '.join(self.not_run)}")
        return "\n".join(lines)


async def execute_plan(
    plan: Plan,
    tools: ToolRegistry | Iterable[Tool],
    *,
    emit: EmitFn | None = None,
    attempt: int = 1,
    reuse: Mapping[str, TaskResult] | Iterable[TaskResult] | None = None,
    tool_timeout: float | None = None,
    output_max_length: int | None = None,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
) -> PlanResult:
    """Run `plan` level by level, each level's tasks concurrently; stop at the first failure.

    Args:
        plan: the plan; it is checked (`plan.check(tools)`) before anything runs.
        tools: the tools tasks may use.
        emit: receives the `plan_created`, `task_started`, `task_finished` and `task_skipped` events
            (default: the current agent run's event stream, when called inside one).
        attempt: the attempt number reported in `plan_created` (repairs count up from 1).
        reuse: results of earlier attempts (by task id, or a list of them): a task with the same id,
            tool and arguments that succeeded then is not run again; one whose outcome is unknown
            (`error_kind` "unknown_outcome": it was running when the process died) is not run again
            either, unless its tool is idempotent — it fails, saying so.
        tool_timeout, output_max_length: outside an agent run, the defaults for tools that set none
            (inside one, the agent's settings apply).
        max_concurrency: the most tasks running at once (a level of a thousand `shell` tasks would
            otherwise start a thousand processes); the others wait for a free slot.

    Raises:
        PlanError: the plan is invalid (nothing ran).
    """
    _check_concurrency(max_concurrency)
    _check_limits(tool_timeout, output_max_length)
    _check_emit(emit)
    if not isinstance(plan, Plan):
        raise ConfigurationError(
            f"execute_plan needs a Plan, not {type(plan).__name__}: parse_plan(text or dict) makes one"
        )
    registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
    levels = plan.check(registry)
    runner = _Runner(registry, emit, _by_task(reuse), tool_timeout, output_max_length)
    runner.slots = asyncio.Semaphore(max_concurrency)
    runner.emit(
        PlanCreated(tasks=plan.describe(), levels=[[t.id for t in lv] for lv in levels], attempt=attempt)
    )
    result = PlanResult(results={})
    for index, level in enumerate(levels):
        await runner.run_level(index, level, result)
        if not result.ok:
            later = [t for lv in levels[index + 1 :] for t in lv]
            result.not_run = [t.id for t in later]
            for task in later:
                runner.emit(
                    TaskSkipped(task_id=task.id, tool=task.tool, reason="not_run", failed_task=result.failed)
                )
            break
    return result


def _by_task(reuse: Mapping[str, TaskResult] | Iterable[TaskResult] | None) -> dict[str, list[TaskResult]]:
    """Earlier results by task id: one task id may have run with several arguments in earlier attempts."""
    earlier: dict[str, list[TaskResult]] = {}
    for result in reuse.values() if isinstance(reuse, Mapping) else reuse or ():
        earlier.setdefault(result.task_id, []).append(result)
    return earlier


class _Runner:
    """Runs tasks: through the current agent run's choke point when there is one, else directly."""

    def __init__(
        self,
        tools: ToolRegistry,
        emit: EmitFn | None,
        reuse: Mapping[str, Sequence[TaskResult]],
        timeout: float | None,
        output_max_length: int | None,
    ) -> None:
        from ._loop import current_run

        self.tools = tools
        self.run = current_run.get()
        self._emit = emit
        self.reuse = reuse
        self.timeout = timeout
        self.output_max_length = output_max_length
        self.prefix = f"plan_{uuid.uuid4().hex[:8]}"
        self.slots = asyncio.Semaphore(DEFAULT_MAX_CONCURRENCY)  # tasks running at once
        self.started: set[str] = set()  # the tasks that got their task_started
        self.stopped: TaskResult | None = None  # the first failure: no other task starts after it

    def emit(self, event: Event) -> None:
        if self._emit is not None:
            self._emit(event)
        elif self.run is not None:
            self.run.emit(event)

    async def run_level(self, index: int, level: list[Task], result: PlanResult) -> None:
        """Run one level's tasks together; the first failure cancels the others."""
        pending = {asyncio.create_task(self.run_task(index, task, result.results)): task for task in level}
        unstarted: list[Task] = []  # those that never started: a sibling failed first
        try:
            while pending and result.ok:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for finished in done:
                    task, outcome = pending.pop(finished), finished.result()
                    if outcome is None:
                        unstarted.append(task)
                    else:
                        self._record(task, outcome, result)
        finally:  # a failure, or we were cancelled ourselves: take the rest of the level down with us
            await self._cancel(level, pending, unstarted, result)

    def _record(self, task: Task, outcome: TaskResult, result: PlanResult) -> None:
        result.results[task.id] = outcome
        if not outcome.success and result.failed is None:
            first = self.stopped or outcome
            result.failed, result.error = first.task_id, first.output

    async def _cancel(
        self,
        level: list[Task],
        pending: Mapping[asyncio.Task[TaskResult | None], Task],
        unstarted: list[Task],
        result: PlanResult,
    ) -> None:
        """Cancel the level's tasks still running and close them, and those that never started, in plan
        order: a started one with a cancelled `task_finished`, one that never started with `task_skipped`."""
        for running in pending:
            running.cancel()
        if pending:
            await asyncio.wait(pending)
        for running, task in pending.items():
            if not running.cancelled() and running.exception() is None and (outcome := running.result()):
                self._record(task, outcome, result)  # it ended before the cancellation reached it
        closing = {t.id for t in (*pending.values(), *unstarted)}
        for task in level:
            if task.id not in closing or task.id in result.results:
                continue
            result.cancelled.append(task.id)
            if task.id not in self.started:
                self.emit(
                    TaskSkipped(
                        task_id=task.id,
                        tool=task.tool,
                        reason="cancelled",
                        failed_task=self.stopped.task_id if self.stopped else None,
                    )
                )
                continue
            entry = self.run.state.ledger.get(self._call_id(task)) if self.run is not None else None
            if self.run is not None and entry is not None and entry.status == "started":
                # cancelled here, not cut off by a crash: a later attempt may run it again
                self.run.mark_done(entry.call_id, "cancelled", False, error_kind="cancelled")
            self.emit(
                TaskFinished(
                    task_id=task.id, tool=task.tool, success=False, output="cancelled", cancelled=True
                )
            )

    async def run_task(self, level: int, task: Task, results: Mapping[str, TaskResult]) -> TaskResult | None:
        """Run one task and emit its `task_started` and `task_finished`; None when it never started
        because a sibling failed first (its `task_skipped` is the level's to emit)."""
        if self.stopped is not None:
            return None
        try:
            arguments = resolve(task.args, results, text_args=_text_parameters(self.tools.get(task.tool)))
        except PlanError as exc:
            self._started(task, dict(task.args), level)
            outcome = TaskResult(task.id, task.tool, f"Error: {exc}", False, error_kind="invalid_arguments")
            return self._finished(outcome)
        earlier = self._earlier(task, arguments)
        if earlier is not None:  # no tool call, but the task is taken up: started, then finished
            self._started(task, arguments, level)
            return self._finished(earlier)
        async with self.slots:
            if self.stopped is not None:  # a sibling failed while this one waited for its turn
                return None
            self._started(task, arguments, level)
            if self.run is not None:
                outcome = await self._through_run(self.run, task, arguments)
            else:
                outcome = await self._direct(task, arguments)
            return self._finished(outcome)  # before the slot is free: a waiting task sees the failure

    def _started(self, task: Task, arguments: dict[str, Any], level: int) -> None:
        self.started.add(task.id)
        self.emit(TaskStarted(task_id=task.id, tool=task.tool, arguments=arguments, level=level))

    def _earlier(self, task: Task, arguments: dict[str, Any]) -> TaskResult | None:
        """The result of this very call (task id, tool, arguments) in an earlier attempt, if it must not
        run again: it succeeded, or it was running when the process died (its outcome is unknown) and
        its tool is not idempotent — running it twice could repeat its effect (a payment, a message)."""
        same = [r for r in self.reuse.get(task.id, ()) if r.tool == task.tool and r.arguments == arguments]
        done = next((r for r in same if r.success), None)
        if done is not None:
            return done
        tool = self.tools.get(task.tool)
        if tool is None or tool.idempotent or not any(r.error_kind == "unknown_outcome" for r in same):
            return None
        text = (
            f"Error: the outcome of task {task.id!r} ({task.tool}) is unknown: the run was interrupted while "
            f"it was running, and it was not run again because {task.tool} is not idempotent (running it "
            "twice could repeat its effect). Check whether it took effect; to run it anyway, give the task "
            "a new id."
        )
        return TaskResult(task.id, task.tool, text, False, error_kind="unknown_outcome", arguments=arguments)

    def _finished(self, outcome: TaskResult) -> TaskResult:
        if not outcome.success and self.stopped is None:
            self.stopped = outcome
        self.emit(
            TaskFinished(
                task_id=outcome.task_id,
                tool=outcome.tool,
                success=outcome.success,
                output=outcome.output,
                duration=outcome.duration,
                error_kind=outcome.error_kind,
            )
        )
        return outcome

    def _call_id(self, task: Task) -> str:
        return f"{self.prefix}_{task.id}"

    async def _through_run(self, run: RunContext, task: Task, arguments: dict[str, Any]) -> TaskResult:
        """The agent's choke point: validation, risk, safety gate, ledger, timeout, truncation."""
        call = ToolCall(id=self._call_id(task), name=task.tool, arguments=arguments)
        (outcome,) = await execute_calls(run, [call], tools=self.tools)
        return TaskResult(
            task.id,
            task.tool,
            outcome.output,
            outcome.success,
            outcome.duration,
            outcome.error_kind,
            arguments,
        )

    async def _direct(self, task: Task, arguments: dict[str, Any]) -> TaskResult:
        """Outside a run: the same validation, timeout, rendering and truncation, without a gate."""
        tool = self.tools.get(task.tool)
        assert tool is not None, "checked before running"
        started = time.perf_counter()
        timeout = tool.timeout or self.timeout or DEFAULT_TIMEOUT
        kind: ErrorKind | None = None
        try:
            valid = tool.validate(arguments)
            if tool.context_param is not None:  # outside a run: no run id, no deps
                context = ToolContext(run_id="", call_id=task.id, step=0, goal="", deps=None, metadata={})
                valid = {**valid, tool.context_param: context}
            text, success = render_output(await _bounded(tool.invoke(valid), timeout)), True
        except ToolArgumentsError as exc:
            text, success, kind = (
                f"Error: invalid arguments for {tool.name}: {exc}",
                False,
                "invalid_arguments",
            )
        except _TimedOut:  # not a TimeoutError the tool raised itself: that is its failure
            text, success, kind = (
                f"Error: {tool.name} timed out after {timeout:g} s and was abandoned.",
                False,
                "timeout",
            )
        except (Exception, SystemExit) as exc:  # a tool calling sys.exit() does not end the process
            text, success, kind = (
                f"Error: {tool.name} raised {type(exc).__name__}: {_safe_str(exc)}",
                False,
                "exception",
            )
        limit = tool.output_max_length or self.output_max_length or DEFAULT_OUTPUT_MAX_LENGTH
        text, _ = truncate_output(text, limit)
        return TaskResult(task.id, task.tool, text, success, time.perf_counter() - started, kind, arguments)


class _TimedOut(Exception):
    """A tool's invocation ran past its time limit (not a `TimeoutError` the tool raised itself)."""


async def _bounded(invocation: Awaitable[Any], limit: float) -> Any:
    """`await invocation` for at most `limit` seconds, as a run's tool call is: a tool that catches its
    cancellation and goes on is given `_aio.CANCEL_GRACE` seconds to end, then closed where it waits (its
    late result is not taken as a success); the thread of a sync tool is abandoned. A cancellation from
    outside (a sibling failed, the run was cancelled) stops it the same way. The invocation runs in the
    caller's task, never in one of its own: an abandoned task would be cancelled again, and waited for,
    when the event loop closes (`asyncio.run` never returned).

    Raises:
        _TimedOut: past `limit`.
    """
    finished, value = start_invocation(invocation)
    if finished and type(value) not in RETURNED_LATER:
        return value
    timer = asyncio.timeout(None if math.isinf(limit) else limit)
    try:
        async with timer:
            if not finished:
                value = await value
            return await returned_result(value)  # a coroutine the tool returned, not awaited: awaited here
    except TimeoutError:
        if timer.expired():
            raise _TimedOut from None
        raise  # the tool's own


# ================================================================================ plan-and-execute


def plan_instructions(tools: ToolRegistry) -> str:
    """How to write a plan, with the tools it may use: for a system prompt or a tool description."""
    listing = "\n".join(
        f"- {t.name}: {t.description} Arguments: {json.dumps(t.parameters.get('properties', {}), ensure_ascii=False)}"
        for t in tools
    )
    return (
        "A plan is JSON: " + _PLAN_SHAPE + "\n"
        'Tasks whose depends_on are done run at the same time. In args, "${a}" is task a\'s result '
        '(its JSON value when it is JSON), "${a.field}" a field of it, and "text ${a}" puts it in text; '
        "a task may only refer to tasks it depends on.\n"
        f"Tools:\n{listing}"
    )


def plan_tool(
    tools: ToolRegistry | Iterable[Tool],
    *,
    name: str = "run_plan",
    max_attempts: int = 3,
    risk: RiskLevel = RiskLevel.LOW,
    timeout: float = math.inf,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
) -> Tool:
    """A tool running a plan the model writes as its argument: `{"tasks": [...]}`.

    Independent tasks run in parallel; each task is a tool call checked by the agent's safety gate
    (so the plan tool itself is LOW risk). A failed or invalid plan is a failed observation showing
    what went wrong; the model can call the tool again with a repaired plan — at most `max_attempts`
    calls per run. Completed tasks of the previous attempt with unchanged arguments are not re-run.
    Both are read from the run's tool-call ledger, which is saved with the run: a resumed run goes on
    counting its attempts and does not re-run the tasks that finished before it was interrupted.

    The tool has no time limit of its own (`timeout`, default none): each task is timed out on its own
    and the run's time limit still applies. With the agent's per-call timeout, a plan of several levels
    was abandoned as a whole — results so far lost — although every task finished in time.
    """
    _check_concurrency(max_concurrency)
    _check_count("max_attempts", max_attempts, 1)
    registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)

    async def run_plan(_context: ToolContext[Any] | None = None, **arguments: Any) -> str:
        from ._loop import current_run

        run = current_run.get()
        attempts: int = 0  # outside a run (called directly): no earlier attempts
        previous: list[TaskResult] = []
        if run is not None and _context is not None:
            attempts = _attempts_before(run, _context.call_id, name)
            previous = _finished_in_ledger(run.state.ledger)
        if attempts >= max_attempts:
            raise PlanError(
                f"{name} was already called {attempts} times in this run (the limit): answer with what you have"
            )
        plan = parse_plan(arguments)  # an invalid plan counts as an attempt too
        result = await execute_plan(
            plan, registry, attempt=attempts + 1, reuse=previous, max_concurrency=max_concurrency
        )
        if not result.ok:
            raise PlanError(
                f"the plan failed.\n{result.summary()}\nFix the plan and call {name} again "
                f"(finished tasks with unchanged arguments are not re-run), or answer with what you have."
            )
        return result.summary()

    schema = {
        "type": "object",
        "properties": {
            "tasks": {
                "type": "array",
                "description": "the tasks: {id, tool, args, depends_on}",
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string"},
                        "tool": {"type": "string", "enum": registry.names},
                        "args": {"type": "object"},
                        "depends_on": {"type": "array", "items": {"type": "string"}},
                    },
                    "required": ["id", "tool", "args"],
                },
            }
        },
        "required": ["tasks"],
    }
    return Tool(
        name, _plan_tool_description(registry), schema, run_plan, risk=risk, timeout=timeout,
        context_param="_context",
    )  # fmt: skip


def _plan_tool_description(tools: ToolRegistry) -> str:
    """The plan tool's description: how to write a plan and the tools it may use, in full when that fits
    the 1,024 characters model APIs take for a description (OpenAI refuses the request otherwise), else
    each tool by its name and arguments (its own definition describes it), else as many names as fit."""
    lead = "Run several tool calls as a plan (independent ones in parallel). "
    full = lead + plan_instructions(tools)
    if len(full) <= MAX_DESCRIPTION:
        return full
    head = lead + plan_instructions(ToolRegistry()).removesuffix("Tools:\n")
    short = [f"{t.name}({', '.join(t.parameters.get('properties') or {})})" for t in tools]
    listing = "Tools: " + "; ".join(short) + "."
    if len(head) + len(listing) <= MAX_DESCRIPTION:
        return head + listing
    names, left = [], MAX_DESCRIPTION - len(head) - len("Tools: ") - 40
    for t in tools:
        if len(t.name) + 2 > left:
            break
        names.append(t.name)
        left -= len(t.name) + 2
    more = len(tools.names) - len(names)
    return (
        head
        + "Tools: "
        + ", ".join(names)
        + (f", and {more} more (the tool field lists them all)." if more else ".")
    )


def _attempts_before(run: RunContext, call_id: str, name: str) -> int:
    """How often the run called the plan tool `name` before its call `call_id`, from the run's ledger (in
    the order the calls were made). A call that never started (refused by the safety gate, arguments that
    did not validate) is no attempt; one cut off by a crash is."""
    attempts = 0
    for entry in run.state.ledger.values():
        if entry.call_id == call_id:
            break
        if entry.status != "planned":
            tool = run.tools.resolve(entry.name)  # the name as the model wrote it: `Run_Plan` too
            attempts += tool is not None and tool.name == name
    return attempts


_PLAN_CALL_RE = re.compile(r"plan_[0-9a-f]{8}_([A-Za-z0-9_-]{1,64})")  # the ids `_Runner` gives its calls


def _finished_in_ledger(ledger: Mapping[str, LedgerEntry]) -> list[TaskResult]:
    """The plan tasks of this run that succeeded, or whose outcome is unknown (still "started": the process
    died while they ran), from the run's ledger (it is saved with the run, so a resumed run knows them):
    a repeated plan does not run them again. Every earlier run of a task id counts (a task may have run
    with other arguments in between)."""
    found: list[TaskResult] = []
    for entry in ledger.values():
        match = _PLAN_CALL_RE.fullmatch(entry.call_id)
        if match is None:
            continue
        if entry.status == "done" and entry.success:
            found.append(
                TaskResult(match.group(1), entry.name, entry.output or "", True, arguments=entry.arguments)
            )
        elif entry.status == "started":
            found.append(
                TaskResult(
                    match.group(1),
                    entry.name,
                    "",
                    False,
                    error_kind="unknown_outcome",
                    arguments=entry.arguments,
                )
            )
    return found


@dataclass(slots=True)
class PlanOutcome:
    """What `run_plan_and_execute` produced: the answer, the last plan and its result, attempts, usage."""

    answer: str
    plan: Plan | None
    result: PlanResult | None
    attempts: int
    usage: Usage
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


_PLANNER_PROMPT = "You plan before you act. Reply with only a JSON plan (no prose) that reaches the goal with the tools below.\n"


async def run_plan_and_execute(
    model: Model | Any,
    goal: str,
    tools: ToolRegistry | Iterable[Tool] | None = None,
    *,
    max_repairs: int = 2,
    emit: EmitFn | None = None,
    settings: ModelSettings | None = None,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
) -> PlanOutcome:
    """Ask `model` for a plan, run it, repair it on failure (at most `max_repairs` times), then answer.

    `model` is a `Model` or an `Agent` (its model and tools are used; `tools` may then be omitted).
    An invalid plan (bad JSON, unknown tool, invalid arguments, bad references) counts as a failed
    attempt too: the model is shown the problem. Nothing raises for a plan that keeps failing, nor for a
    model that fails (`ModelError`): the outcome's `error` says why, with the plan and results so far.
    """
    _check_count("max_repairs", max_repairs, 0)
    _check_concurrency(max_concurrency)
    _check_emit(emit)
    if settings is not None and not isinstance(settings, ModelSettings):
        raise ConfigurationError(f"settings must be ModelSettings(...) or None, not {settings!r}")
    model, registry = _model_and_tools(model, tools)
    try:
        return await _plan_and_execute(model, registry, goal, max_repairs, emit, settings, max_concurrency)
    except _ModelFailed as failed:
        return failed.outcome


class _ModelFailed(Exception):
    """The model failed mid-way: `outcome` holds what was done so far, and the error."""

    def __init__(self, outcome: PlanOutcome) -> None:
        self.outcome = outcome


async def _plan_and_execute(
    model: Model,
    registry: ToolRegistry,
    goal: str,
    max_repairs: int,
    emit: EmitFn | None,
    settings: ModelSettings | None,
    max_concurrency: int,
) -> PlanOutcome:
    usage = Usage()
    messages = [Message.system(_PLANNER_PROMPT + plan_instructions(registry)), Message.user(goal)]
    previous: list[TaskResult] = []  # every success so far: a task id may have run with other arguments
    plan: Plan | None = None
    result: PlanResult | None = None
    attempt = 0

    async def ask() -> str:
        try:
            return await _ask(model, messages, settings, usage)
        except Exception as exc:  # a ModelError, or any model's own failure (as an agent run takes it)
            why = str(exc) if isinstance(exc, ModelError) else f"the model raised {type(exc).__name__}: {exc}"
            raise _ModelFailed(
                PlanOutcome("", plan, result, attempt, usage, error=f"the model failed: {why}")
            ) from exc

    problem = ""
    for attempt in range(1, max_repairs + 2):
        text = await ask()
        messages.append(Message.assistant(text))
        plan, result = None, None  # this attempt's: an earlier plan must not stand beside its error
        try:
            plan = parse_plan(text)
            result = await execute_plan(
                plan, registry, emit=emit, attempt=attempt, reuse=previous, max_concurrency=max_concurrency
            )
        except PlanError as exc:
            problem = str(exc)
            feedback = f"That plan cannot run: {exc}\nReply with a corrected JSON plan."
        else:
            if result.ok:
                break
            previous += [r for r in result.results.values() if r.success]
            problem = f"task {result.failed!r} failed: {result.error}"
            feedback = f"The plan failed:\n{result.summary()}\nReply with a repaired JSON plan."
        messages.append(Message.user(feedback))
    else:
        error = f"no plan succeeded in {max_repairs + 1} attempts; the last one: {problem}"
        return PlanOutcome("", plan, result, max_repairs + 1, usage, error=error)
    messages.append(Message.user(f"The plan ran:\n{result.summary()}\nNow answer the goal: {goal}"))
    answer = await ask()
    return PlanOutcome(answer.strip(), plan, result, attempt, usage)


def _model_and_tools(source: Any, tools: ToolRegistry | Iterable[Tool] | None) -> tuple[Model, ToolRegistry]:
    from .models import Model

    model = source if isinstance(source, Model) else getattr(source, "model", None)
    if not isinstance(model, Model):
        raise ConfigurationError(f"run_plan_and_execute needs a Model or an Agent, not {source!r}")
    if tools is None:
        tools = getattr(source, "tools", None) or ()
    registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
    return model, registry


async def _ask(model: Model, messages: list[Message], settings: ModelSettings | None, usage: Usage) -> str:
    request = ModelRequest(messages=list(messages), settings=settings or ModelSettings(), turn=usage.requests)
    response = await model.request(request)
    usage.add(response.usage)
    return response.text
