"""Act (SPEC §3.3–3.4, §6): the one choke point every tool call goes through.

For each call: look the tool up, validate the arguments, rate the risk, ask the safety gate, record the
call as started in the ledger, run it under a timeout, render and truncate its output, record the result.
Every failure becomes an observation the model can act on; nothing here raises into the loop except
cancellation.
"""

from __future__ import annotations

import asyncio
import contextvars
import difflib
import json
import logging
import math
import re
import time
import types
from collections.abc import Awaitable, Coroutine, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from . import _aio, _json
from ._data import fast_constructor
from ._errors import DeadlineExceeded
from ._events import Decision, ErrorKind, ToolCallEvent
from ._messages import ToolCall
from ._react import KEYWORD_ARGUMENTS_RE, arguments_example, parse_arguments, unfenced
from ._risk import RiskLevel
from ._state import unsaved_metadata
from ._tools import (
    Tool,
    ToolArgumentsError,
    ToolContext,
    ToolRegistry,
    _safe_str,
    collect_items,
    drain_in_thread,
    plain_tool_name,
    render_output,
    truncate_output,
)

if TYPE_CHECKING:
    from ._loop import RunContext

T = TypeVar("T")
logger = logging.getLogger("thinkloop.tools")


@dataclass(slots=True)
class ToolOutcome:
    """What one tool call produced: the observation text and how it went."""

    call: ToolCall
    output: str
    success: bool
    duration: float = 0.0
    error_kind: ErrorKind | None = None
    truncated: bool = False
    risk: RiskLevel = RiskLevel.LOW
    decision: Decision | None = None


_new_outcome = fast_constructor(ToolOutcome)  # `ToolOutcome(...)` on the hot path


@dataclass(frozen=True, slots=True)
class GateDecision:
    """The safety gate's verdict on one call. `message` is told to the model when the call is refused.

    `risk` is the risk the gate rated the call at, when it differs from the tool's own (a policy override
    or the command classifier); None keeps the tool's.
    """

    allowed: bool
    decision: Decision
    reason: str = ""
    message: str = ""
    risk: RiskLevel | None = None


class ToolGate(Protocol):
    """Decides whether a call may run (the safety controller implements this)."""

    async def check(self, call: ToolCall, tool: Tool, risk: RiskLevel, run: RunContext) -> GateDecision: ...


_AUTO = GateDecision(True, "auto")


class AllowAll:
    """The gate of an agent without a safety policy: every call runs."""

    async def check(self, call: ToolCall, tool: Tool, risk: RiskLevel, run: RunContext) -> GateDecision:
        return _AUTO


@dataclass(slots=True)
class _Prepared:
    call: ToolCall
    tool: Tool
    arguments: dict[str, object]
    risk: RiskLevel
    decision: Decision = "auto"
    note: str = ""  # told to the model after the result (arguments that were ignored)


_new_prepared = fast_constructor(_Prepared)


async def execute_calls(
    run: RunContext, calls: list[ToolCall], *, tools: ToolRegistry | None = None
) -> list[ToolOutcome]:
    """Execute one reply's tool calls: checks and approvals in order, then the allowed calls concurrently.

    Outcomes come back in the order of `calls`, so each call is answered by its own id. `tools` is
    where calls are looked up (default: the run's tools; a plan passes its own).
    """
    if len(calls) == 1 and type(run.gate) is AllowAll:  # the common case, without a coroutine per check
        prepared = _decided(run, _checked(run, calls[0], tools), _AUTO)
        return [prepared if isinstance(prepared, ToolOutcome) else await _run_one(run, prepared)]
    outcomes: dict[str, ToolOutcome] = {}
    ready: list[_Prepared] = []
    for call in calls:
        prepared = await _prepare(run, call, tools)
        if isinstance(prepared, ToolOutcome):
            outcomes[call.id] = prepared
        else:
            ready.append(prepared)
    if len(ready) == 1:
        outcomes[ready[0].call.id] = await _run_one(run, ready[0])
    elif ready:
        outcomes.update((o.call.id, o) for o in await _run_together(run, ready))
    return [outcomes[c.id] for c in calls]


async def _run_together(run: RunContext, ready: list[_Prepared]) -> list[ToolOutcome]:
    """Run approved calls concurrently. When one fails (its checkpoint could not be saved, the process is
    going down), the others are stopped and waited for before the failure is raised: left running, they
    went on to take effect — and to save their results — after the run had stopped as it was."""
    tasks = [asyncio.ensure_future(_run_one(run, prepared)) for prepared in ready]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _prepare(
    run: RunContext, call: ToolCall, tools: ToolRegistry | None = None
) -> _Prepared | ToolOutcome:
    """Everything before running: lookup, argument checks, risk, the safety gate."""
    checked = _checked(run, call, tools)
    if isinstance(checked, ToolOutcome):
        return _decided(run, checked, _AUTO)
    gate = run.gate
    verdict = _AUTO if type(gate) is AllowAll else await gate.check(call, checked.tool, checked.risk, run)
    return _decided(run, checked, verdict)


def _checked(run: RunContext, call: ToolCall, tools: ToolRegistry | None) -> _Prepared | ToolOutcome:
    """Lookup, argument checks and risk; a failed check is the outcome."""
    tool = (run.tools if tools is None else tools).resolve(call.name)
    if tool is None:
        names = run.visible_names() if tools is None else tools.names
        return _failed(call, "unknown_tool", _unknown_tool_message(call.name, names))
    raw = call.raw_arguments
    if raw is not None and (_json.text_too_deep(raw) or raw.startswith(UNWRITABLE)):
        return _failed(call, "invalid_arguments", _unreadable_message(tool, raw))
    if raw is not None and call.id == run.cut_call:
        return _failed(call, "invalid_arguments", _cut_message(tool))
    given = call.arguments if raw is None else arguments_from_text(tool, raw)
    if given is None:
        return _failed(call, "invalid_arguments", _bad_json_message(call, tool))
    note = "" if raw is None else _read_as_note(tool, raw, given)
    try:
        arguments = tool.validate(given)
    except ToolArgumentsError as exc:
        retried = _validated_unwrapped(tool, given)
        if retried is None:
            retried, note = _validated_without_extras(tool, given)
        if retried is None:
            return _failed(call, "invalid_arguments", _invalid_args_message(tool, str(exc)))
        arguments = retried
    risk = tool.risk if isinstance(tool.risk, RiskLevel) else tool.risk_for(arguments)
    return _new_prepared(call, tool, arguments, risk, note=note)


_WRAPPERS = frozenset({"arguments", "args", "parameters", "params", "input", "kwargs", "action_input"})


def arguments_from_text(tool: Tool, raw: str) -> dict[str, Any] | None:
    """Arguments a model sent as text that is not a JSON object, read as it meant them — or None, and the
    model is told to send a JSON object. The safety policy rates what this returns: what runs.

    - for a tool of one parameter, the text is that parameter's value (`Paris` for `weather(city)`);
    - a whole object in Python or JavaScript notation (`{'city': 'Paris'}`, `{city: "Paris"}`) or keyword
      arguments (`city="Paris", days=2`) are read as written;
    - a JSON string holding any of these (arguments encoded twice) is read as what it holds;
    - a JSON list gives the parameters in order when it holds as many values as the tool has parameters,
      or its required ones at least (`[17, 23]` for `add(a, b)`); for a tool of one list parameter, it is
      that list.

    Text cut off (an object not closed, a string not ended, as a token limit leaves them) is never mended:
    a call must not run with half an argument."""
    text = unfenced(raw).strip()
    if KEYWORD_ARGUMENTS_RE.match(text) and (keywords := _keywords(tool, text)) is not None:
        return keywords  # before the one-parameter reading: `command="ls"` is not the command `command="ls`
    if text.startswith('"') and text.endswith('"') and (inner := _encoded_twice(tool, text)) is not None:
        return inner
    sole = _as_sole_argument(tool, raw)
    if sole is not None:
        return sole
    if text.startswith("[") and text.endswith("]"):
        return _positional(tool, text)
    if not (text.startswith("{") and text.endswith("}")) or _cut_off(text):
        return None
    arguments, unread = parse_arguments(text)
    return arguments if unread is None and arguments else None


def _encoded_twice(tool: Tool, text: str) -> dict[str, Any] | None:
    """The arguments a JSON string holds (`"{\\"city\\": \\"Paris\\"}"`), or None: a string holding no object
    of the tool's arguments is a value (of a tool's one parameter)."""
    try:
        inner = _json.loads(text)
    except ValueError:
        return None
    if not isinstance(inner, str) or inner.strip()[:1] not in ("{", "["):
        return None
    arguments = arguments_from_text(tool, inner)
    properties = tool.parameters.get("properties") or {}
    if arguments is None or not any(key in properties or key.lower() in _WRAPPERS for key in arguments):
        return None  # no argument of the tool's: JSON text meant as the value of its one parameter
    return arguments


def _keywords(tool: Tool, text: str) -> dict[str, Any] | None:
    """`city="Paris", days=2`: keyword arguments written as code, each naming one of the tool's parameters."""
    arguments, unread = parse_arguments(text)
    properties = tool.parameters.get("properties") or {}
    if unread is not None or not arguments or not all(key in properties for key in arguments):
        return None
    return arguments


def _cut_off(text: str) -> bool:
    """Whether `text` ends inside a string: what a reply cut off by its token limit leaves."""
    try:
        _json.loads(text)
    except ValueError as exc:
        return str(exc).startswith("Unterminated string")
    return False


def _positional(tool: Tool, text: str) -> dict[str, Any] | None:
    try:
        values = _json.loads(text)
    except ValueError:
        return None
    properties = list(tool.parameters.get("properties") or {})
    if not isinstance(values, list) or not properties:
        return None
    if len(properties) == 1 and (tool.parameters["properties"][properties[0]] or {}).get("type") == "array":
        return {properties[0]: values}
    required = tool.parameters.get("required") or []
    if not len(required) <= len(values) <= len(properties):
        return None
    return dict(zip(properties, values, strict=False))


def _read_as_note(tool: Tool, raw: str, given: dict[str, Any]) -> str:
    """For arguments given as a list: how they were read, so that the model can tell (and send names)."""
    if not unfenced(raw).strip().startswith("[") or len(given) == 1:
        return ""
    shown = json.dumps(given, ensure_ascii=False)
    return (
        f"Note: the arguments were a list, read in order as {shown}; send a JSON object of named arguments."
    )


def _as_sole_argument(tool: Tool, raw: str) -> dict[str, Any] | None:
    """Arguments that are not a JSON object, for a tool of one parameter: that parameter's value
    (`Action Input: Paris` for `weather(city)`); None when the tool takes more, or the text is a broken
    object or list (the model is then told to send a JSON object)."""
    properties = tool.parameters.get("properties") or {}
    text = raw.strip()
    if len(properties) != 1 or not text or text[0] in "{[":
        return None
    if text[0] in "\"'" and (len(text) == 1 or text[-1] != text[0]):
        return None  # a string never closed: cut off (by the token limit), not a value to run with
    try:
        value = _json.loads(text)  # strict: `NaN` or `1e999` is text, not a float JSON does not have
    except ValueError:
        value = text.strip("`'\"").strip()
    return None if isinstance(value, dict | list) else {next(iter(properties)): value}


def _validated_unwrapped(tool: Tool, arguments: dict[str, Any]) -> dict[str, Any] | None:
    """`{"arguments": {...}}` (and alike) sent instead of the arguments themselves: the inner object,
    validated; None when the arguments are not so wrapped or the inner object is not valid either."""
    if len(arguments) != 1:
        return None
    key, value = next(iter(arguments.items()))
    properties = tool.parameters.get("properties") or {}
    if not (isinstance(value, dict) and key.lower() in _WRAPPERS and key not in properties):
        return None
    try:
        return tool.validate(value)
    except ToolArgumentsError:
        return None


def _validated_without_extras(tool: Tool, arguments: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """Arguments the tool does not take, beside others that are valid (`list_offices(city="Dublin")`): the
    call without them, validated, and a note for the model naming what was ignored (it may have meant to
    filter, and must not read the result as filtered). (None, "") when there are none, the rest is not
    valid either, or the call is rated above low risk: a call that acts runs only as written (an ignored
    `dry_run` would change what it does)."""
    properties = tool.parameters.get("properties") or {}
    extra = [key for key in arguments if key not in properties]
    if not extra:
        return None, ""
    rest = {key: value for key, value in arguments.items() if key in properties}
    try:
        validated = tool.validate(rest)
    except ToolArgumentsError:
        return None, ""
    if tool.risk_for(validated) is not RiskLevel.LOW:
        return None, ""
    return validated, _ignored_note(tool.name, extra, list(properties))


def _ignored_note(name: str, extra: list[str], takes: list[str]) -> str:
    listed = ", ".join(json.dumps(key, ensure_ascii=False) for key in extra)
    one = len(extra) == 1
    arguments = f"its arguments are {', '.join(takes)}" if takes else "it takes no arguments"
    return (
        f"Note: {name} has no argument{'' if one else 's'} {listed}, so {'it was' if one else 'they were'} ignored: the result "
        f"above is for the call without {'it' if one else 'them'} ({arguments})."
    )


def _decided(
    run: RunContext, checked: _Prepared | ToolOutcome, verdict: GateDecision
) -> _Prepared | ToolOutcome:
    """Apply the gate's verdict to a checked call (and announce the call). A call that will not run — its
    check failed, or the gate refused it — is done in the ledger at once: a resumed run answers it as it
    was answered, and never asks again about a call a person denied (then perhaps to run it)."""
    if isinstance(checked, ToolOutcome):
        run.mark_done(checked.call.id, checked.output, False, error_kind=checked.error_kind)
        return checked
    call, risk = checked.call, verdict.risk or checked.risk
    if run.observed:
        run.emit(ToolCallEvent(step=run.state.step, call=call, risk=risk, decision=verdict.decision))
    else:
        run.state.event_version += 1  # `run.skip_event()`, inlined: the hot path
    if not verdict.allowed:
        text = _json.valid_text(verdict.message or _denied_message(checked.tool, verdict.reason))
        run.mark_done(call.id, text, False, error_kind="denied")
        return ToolOutcome(call, text, False, error_kind="denied", risk=risk, decision=verdict.decision)
    checked.risk, checked.decision = risk, verdict.decision
    return checked


async def _run_one(run: RunContext, prepared: _Prepared) -> ToolOutcome:
    """Run one approved call: ledger start, timeout, render, truncate, ledger done."""
    call, tool = prepared.call, prepared.tool
    if run.step_saves:  # saved before it runs: a crash now leaves it "started", never run twice unseen
        await run.ledger_started(call)
    else:
        run.mark_started(call)
    timeout = tool.timeout if tool.timeout is not None else run.config.tool_timeout
    started = time.perf_counter()
    try:
        arguments = prepared.arguments
        invocation: Awaitable[Any]
        if tool.context_param is not None:
            invocation = _with_context(run, tool, call, arguments)
        else:
            invocation = tool.invoke(arguments)
        finished, value = start_invocation(invocation)
        if not finished:  # it waits: under its time limit and the run's deadline, whichever comes first
            value = await run.deadlines.within(_deadline(run, timeout), value)
        if type(value) in RETURNED_LATER:  # `return fetch(url)` meant `return await fetch(url)`
            left = max(timeout - (time.perf_counter() - started), 0.0)
            value = await run.deadlines.within(_deadline(run, left), returned_result(value))
        text = value if type(value) is str and value and not value.isspace() else render_output(value)
        success, kind = True, None
    except DeadlineExceeded:  # not a TimeoutError the tool raised itself (`asyncio.wait_for` inside it)
        by_run = _run_out_of_time(run)
        why = "the run's time limit was reached" if by_run else f"it timed out after {timeout:g} s"
        text, success, kind = f"Error: {tool.name} was abandoned: {why}.", False, "timeout"
    except asyncio.CancelledError as exc:
        if _cancelled_from_outside():
            raise
        text, success, kind = _raised(tool, exc)  # the tool's own (an inner task it awaited was cancelled)
    except (Exception, SystemExit, GeneratorExit) as exc:  # sys.exit() in a tool does not end the process
        text, success, kind = _raised(tool, exc)
        text += (
            _nested_call_note(run, tool, prepared.arguments)
            or _closest_value_note(tool, prepared.arguments, text, run.state.goal)
            or _form_note(run, tool, prepared.arguments, text)
        )
    duration = time.perf_counter() - started
    limit = tool.output_max_length if tool.output_max_length is not None else run.config.output_max_length
    text, truncated = truncate_output(text, limit) if len(text) > limit else (text, False)
    if prepared.note:
        text = f"{text}\n{prepared.note}"
    if not text.isascii():  # an error's text, a note may hold a lone surrogate too: the state stays UTF-8
        text = _json.valid_text(text)
    outcome = _new_outcome(call, text, success, duration, kind, truncated, prepared.risk, prepared.decision)  # type: ignore[arg-type]
    run.mark_done(call.id, text, success, error_kind=kind)
    if run.step_saves:
        await run.checkpoint()
    return outcome


async def _with_context(run: RunContext, tool: Tool, call: ToolCall, arguments: dict[str, object]) -> Any:
    """Invoke a tool that takes a `ToolContext`; then what it left in the metadata is checked."""
    assert tool.context_param is not None
    try:
        return await tool.invoke({**arguments, tool.context_param: _tool_context(run, call)})
    finally:
        if run.state.metadata:
            _drop_unsaved_metadata(run, tool)


def _drop_unsaved_metadata(run: RunContext, tool: Tool) -> None:
    """Values a tool put in `ToolContext.metadata` that the run's state cannot be saved with (an object,
    nesting too deep) are removed, with a warning naming the tool: the state is saved at every step, and
    one such value failed every save — as the store's fault."""
    metadata = run.state.metadata
    for key in unsaved_metadata(metadata):
        value = metadata.pop(key)
        logger.warning(
            "tool %s put metadata[%r] (of type %s) in its ToolContext, which cannot be saved with the run's state: "
            "it was removed. Store JSON values in metadata (text, finite numbers, booleans, None, lists and "
            "dicts of them); keep objects in deps=",
            tool.name, key, type(value).__name__,
        )  # fmt: skip


def start_invocation(awaitable: Awaitable[T]) -> tuple[bool, Any]:
    """Start a tool's invocation: `(True, its result)` when it finished at once, else `(False, an awaitable
    that goes on with it)`, to be awaited under the tool's time limit and the run's deadline.

    A coroutine is started right here: one that finishes without waiting (most async tools) could not
    have been interrupted by a timer anyway, so it needs none (nor a coroutine of ours around it).
    """
    if type(awaitable) is not types.CoroutineType:
        return False, awaitable
    try:
        waiting_on = awaitable.send(None)
    except StopIteration as finished:
        return True, finished.value
    return False, _resume(awaitable, waiting_on)


@types.coroutine
def _resume(coro: Coroutine[Any, Any, T], waiting_on: Any) -> Generator[Any, Any, T]:
    """Go on driving a coroutine started by hand (it is waiting on `waiting_on`), as `await` would:
    what the task sends or throws in is passed on; the coroutine's result is returned.

    A cancellation always takes effect: a coroutine that catches it and goes on (a bare `except:` around an
    `await`) gets `_aio.CANCEL_GRACE` seconds to end, then is closed where it waits; the cancellation is
    raised either way (what it returns after it is not used)."""
    swallowed: BaseException | None = None  # a cancellation the coroutine caught and went on after
    grace_end = 0.0
    while True:
        shown = waiting_on if swallowed is None else _until_done_or(waiting_on, grace_end)
        try:
            sent = yield shown
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # a cancellation (or anything else) thrown in by the task
            if swallowed is not None and isinstance(exc, asyncio.CancelledError):
                _close(coro)  # cancelled again while it went on: stopped now
                raise
            try:
                waiting_on = coro.throw(exc)
            except StopIteration as finished:
                if isinstance(exc, asyncio.CancelledError):
                    raise exc from None  # it returned instead of stopping: the cancellation stands
                return finished.value  # type: ignore[no-any-return]
            if isinstance(exc, asyncio.CancelledError):
                swallowed, grace_end = exc, asyncio.get_running_loop().time() + _aio.CANCEL_GRACE
            continue
        if swallowed is not None and not _done(waiting_on):
            _close(coro)  # its grace is over, and it still waits
            raise swallowed
        try:
            waiting_on = coro.send(sent)
        except StopIteration as finished:
            if swallowed is not None:
                raise swallowed from None
            return finished.value  # type: ignore[no-any-return]


def _done(waiting_on: Any) -> bool:
    """Whether what a coroutine yielded no longer holds it (a bare `yield`, as in `sleep(0)`, never does)."""
    return waiting_on is None or (asyncio.isfuture(waiting_on) and waiting_on.done())


def _until_done_or(waiting_on: Any, when: float) -> asyncio.Future[None]:
    """A future done when `waiting_on` is done, or at event-loop time `when`, whichever comes first."""
    loop = asyncio.get_running_loop()
    either: asyncio.Future[None] = loop.create_future()

    def done(*_: Any) -> None:
        if not either.done():
            either.set_result(None)

    handle = loop.call_at(when, done)
    either.add_done_callback(lambda _: handle.cancel())
    if _done(waiting_on):
        loop.call_soon(done)
    elif asyncio.isfuture(waiting_on):
        waiting_on.add_done_callback(done)
    either._asyncio_future_blocking = True  # yielded by hand, as `await` yields a future
    return either


def _close(coro: Coroutine[Any, Any, Any]) -> None:
    """Stop a coroutine that would not end when cancelled: its `finally` blocks run. One that catches even
    that (a bare `except:`) cannot be stopped: it is left where it waits, and kept for ever (`_keep`)."""
    try:
        coro.close()
    except RuntimeError:  # "coroutine ignored GeneratorExit"
        _keep(coro)


def _keep(coro: Coroutine[Any, Any, Any]) -> None:
    """Never collect `coro`, not even at interpreter exit. Closed again when it is collected, a coroutine
    that catches everything around an `await` would only complain with an event loop running — but with
    none (at exit, when the interpreter clears the modules) its `await asyncio.sleep(…)` raises at once,
    it catches that too and goes round for ever: the process never exits. An extra reference (CPython)
    leaves it alone; elsewhere it is kept in a set, as well as can be."""
    import ctypes  # here: a rare fault, and ctypes is not imported otherwise

    pythonapi = getattr(ctypes, "pythonapi", None)
    if pythonapi is not None and hasattr(pythonapi, "Py_IncRef"):
        pythonapi.Py_IncRef(ctypes.py_object(coro))
    else:  # pragma: no cover - not CPython
        _unstoppable.add(coro)


_unstoppable: set[Coroutine[Any, Any, Any]] = set()  # coroutines kept where ctypes cannot leak them


def _tool_context(run: RunContext, call: ToolCall) -> ToolContext[Any]:
    state = run.state
    return ToolContext(
        run_id=state.run_id, call_id=call.id, step=state.step, goal=state.goal, deps=run.deps,
        metadata=state.metadata,
    )  # fmt: skip


RETURNED_LATER = frozenset({types.CoroutineType, types.AsyncGeneratorType, types.GeneratorType})


async def returned_result(value: Any) -> Any:
    """`value`, or the result of the coroutine it is — one a tool returned instead of awaiting it (a sync
    function returning an async one's call) — and of a coroutine that one returns in turn; the items of a
    generator (async or not) an async tool returned, as a list. The caller bounds it by what is left of
    the call's time limit: a sync generator is drained in a tool thread, an async one lets the event loop
    run every so many items, so that one yielding for ever is stopped there too (it hung the run)."""
    while type(value) is types.CoroutineType:
        finished, value = start_invocation(value)
        if not finished:
            value = await value
    if type(value) is types.AsyncGeneratorType:
        return await collect_items(value)
    if type(value) is types.GeneratorType:
        return await drain_in_thread(value)
    return value


def _deadline(run: RunContext, timeout: float) -> float:
    """When the call must end: its own timeout, or the run's deadline if that comes first."""
    own = asyncio.get_running_loop().time() + timeout
    run_deadline = run.deadline
    return run_deadline if run_deadline is not None and run_deadline < own else own


def _run_out_of_time(run: RunContext) -> bool:
    """Whether the run's own time limit has (about) passed: what ended a call that timed out."""
    run_deadline = run.deadline
    return run_deadline is not None and run_deadline <= time.monotonic() + _TIMER_SLACK


def _nested_call_note(run: RunContext, tool: Tool, arguments: dict[str, object]) -> str:
    """After a failed call whose text argument uses another tool (`calculator` with
    `"sum(monthly_sales['Kiosk 4'][:3]) / 3"`): a note that the tool must be called first, on its own. ""
    otherwise."""
    texts = [
        value for value in arguments.values() if isinstance(value, str) and ("(" in value or "[" in value)
    ]
    if not texts:
        return ""
    for name in run.visible_names():
        if name != tool.name and any(re.search(rf"\b{re.escape(name)}\s*[(\[]", text) for text in texts):
            if any(e.name == name and e.success for e in run.state.ledger.values()):
                return (  # called already: calling it again does not help (the 1.5B model did, then guessed)
                    f"\nNote: {name} is a tool, which {tool.name} cannot read. Its result is above: write the "
                    f"values you need from it as numbers in {tool.name}."
                )
            return (
                f"\nNote: {name} is a tool, which {tool.name} cannot call. Call {name} first, on its own, then "
                f"use the values it returns in {tool.name}."
            )
    return ""


def _closest_value_note(tool: Tool, arguments: dict[str, object], error: str, goal: str) -> str:
    """After a failed call whose error lists the values that exist (`no item named 'gadget1'; the catalogue
    has: widget, gadget, gizmo, sprocket`) and a text argument close to one of them but not it: a note naming
    that value (the 1.5B model went on to 'gadget2', 'gadget3' … past a hint to read the error). When no
    value is close but the task names exactly one of the listed values (the 1.5B model asked for
    'Smartphone' five times for "How much does a gadget cost?"): a note naming that one. "" otherwise, and
    when several values are as close."""
    if len(error) > 4000:
        return ""
    options = _listed_values(error)
    if not options:
        return ""
    lowered = {o.lower(): o for o in options}
    texts = [
        (n, v) for n, v in arguments.items() if isinstance(v, str) and 0 < len(v) <= 60 and v not in options
    ]
    for name, value in texts:
        closest = _closest(value.strip().lower(), lowered)
        if closest is not None and closest != value:
            return (
                f"\nNote: {value!r} is not one of the values this error lists; the closest is {closest!r}. If "
                f"that is what you meant, call {tool.name} again with {json.dumps(name)}: {json.dumps(closest)}."
            )
    named = _named_in(goal, options) if len(texts) == 1 and _NAME_LIKE_RE.fullmatch(texts[0][1]) else None
    if named is not None:
        name, value = texts[0]
        return (
            f"\nNote: {value!r} is not one of the values this error lists, but the task names {named!r}, which "
            f"it does list. If that is what the task asks about, call {tool.name} again with "
            f"{json.dumps(name)}: {json.dumps(named)}."
        )
    return ""


_FORM_AFTER = r"""(?:\s+(?:'[^'\n]*'|"[^"\n]*"))?\s+(?:(?:must|should|has to|needs? to) be\b|is not (?:a |an )?[A-Z]{2})"""


def _form_note(run: RunContext, tool: Tool, arguments: dict[str, object], error: str) -> str:
    """After a failed call whose error names one of its text arguments and says how it must be written
    (`start must be a 24-hour time written HH:MM, like 08:30 or 17:00, not '3pm'`), and names no other
    tool: a note to rewrite the value in that form and call the tool again. The 1.5B model, told so by the
    error alone, called a time-zone tool to turn '3pm' into 15:00 until the guards stopped it. "" otherwise."""
    if len(error) > 1000:
        return ""
    named = [
        (n, v) for n, v in arguments.items()
        if isinstance(v, str) and re.search(rf"(?<![\w-]){re.escape(n)}{_FORM_AFTER}", error)
    ]  # fmt: skip  # what must be so is the argument: `start must be`, `date '12.12.2026' is not YYYY-MM-DD`
    if len(named) != 1 or any(t != tool.name and t in error for t in run.visible_names()):
        return ""
    name, value = named[0]
    return (
        f"\nNote: the error says how {name} must be written. Rewrite {json.dumps(value)} in that form yourself "
        f"and call {tool.name} again with it."
    )


_NAME_LIKE_RE = re.compile(r"[^\W\d][\w .'&-]{0,39}")  # `Smartphone`, not `count(orders) - count(shipped)`


def _named_in(goal: str, options: list[str]) -> str | None:
    """The one listed value the task names as a word or phrase (`gadget` in 'How much does a gadget
    cost?', plural or not); None when it names none of them, or several."""
    if not goal or len(goal) > 4000:
        return None
    named = {
        o
        for o in options
        if len(o) > 1 and re.search(rf"(?<![\w-]){re.escape(o)}(?:e?s)?(?![\w-])", goal, re.IGNORECASE)
    }
    return named.pop() if len(named) == 1 else None


_LIST_RE = re.compile(r"[:;]\s*\[?([^:;\n\[\]]+)")
_ITEM_SPLIT_RE = re.compile(r"\s*,\s*(?:(?:or|and)\s+)?|\s+(?:or|and)\s+")


def _listed_values(error: str) -> list[str]:
    """The values a list in an error gives after a colon (`…: widget, gadget, gizmo`): 2 to 100 short items."""
    found: list[str] = []
    for match in _LIST_RE.finditer(error):
        items = [i.strip().strip("'\"`.").strip() for i in _ITEM_SPLIT_RE.split(match.group(1).strip())]
        if 2 <= len(items) <= 100 and all(0 < len(i) <= 40 and len(i.split()) <= 4 for i in items):
            found.extend(items)
    return found


def _closest(value: str, options: dict[str, str]) -> str | None:
    """The one option `value` is a slip of: the same but for case, a number or an `s` added (`gadget1`,
    `Gadgets`), a near spelling (`widgt`), or one word of it (`Bob` of `Bob Keller`); None when none, or
    several, are that close."""
    if value in options:
        return options[value]
    stem = re.sub(r"(?:[\s_-]*\d+|e?s)$", "", value)
    if stem in options:
        return options[stem]
    near = difflib.get_close_matches(value, list(options), n=2, cutoff=0.8)
    if len(near) == 1:
        return options[near[0]]
    named = [o for o in options if " " in o and value in o.split()]  # `Bob` of `Bob Keller`
    return options[named[0]] if len(named) == 1 and not near else None


def _raised(tool: Tool, exc: BaseException) -> tuple[str, bool, ErrorKind]:
    return f"Error: {tool.name} raised {type(exc).__name__}: {_safe_str(exc)}", False, "exception"


def _cancelled_from_outside() -> bool:
    """Whether a CancelledError is the run being cancelled (its task was asked to stop), not one a tool
    raised by itself (after awaiting a task that was cancelled)."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


class Deadlines:
    """Time limits for the awaits of one run, kept with a single timer.

    `asyncio.timeout` schedules (and cancels) a timer per await; a run making thousands of quick tool
    calls would churn the event loop's timer heap. Here the timer stays armed at the earliest deadline it
    was set for; when it fires it cancels the awaits that are past their deadline (they raise
    `TimeoutError`) and re-arms itself for the earliest one still running. A cancellation from outside
    passes through unchanged. `close()` disarms it when the run ends.
    """

    __slots__ = ("_active", "_at", "_handle")

    def __init__(self) -> None:
        self._active: dict[int, list[Any]] = {}  # id -> [task, deadline, expired]
        self._handle: asyncio.TimerHandle | None = None
        self._at = math.inf

    async def within(self, when: float, awaitable: Awaitable[T]) -> T:
        """`await awaitable`, cancelled at event-loop time `when` with `TimeoutError`."""
        task = asyncio.current_task()
        if task is None:  # not in a task: nothing can be cancelled
            return await awaitable
        entry = [task, when, False]
        key = id(entry)
        self._active[key] = entry
        if when < self._at:
            self._arm(when)
        cancelling = task.cancelling()
        try:
            result = await awaitable
        except asyncio.CancelledError:
            if entry[2] and task.uncancel() <= cancelling:
                raise DeadlineExceeded from None
            raise
        else:
            if entry[2]:  # it ended after its deadline (it caught the cancellation and went on): too late
                task.uncancel()
                raise DeadlineExceeded
            return result
        finally:
            del self._active[key]

    def close(self) -> None:
        """Disarm the timer (the run is over)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle, self._at = None, math.inf

    def _arm(self, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._at = when
        self._handle = asyncio.get_running_loop().call_at(when, self._fire, context=_NO_CONTEXT)

    def _fire(self) -> None:
        self._handle, self._at = None, math.inf
        now = asyncio.get_running_loop().time() + _TIMER_SLACK
        earliest = math.inf
        for entry in self._active.values():
            if entry[2]:
                continue
            if entry[1] <= now:
                entry[2] = True
                entry[0].cancel()
            else:
                earliest = min(earliest, entry[1])
        if earliest < math.inf:
            self._arm(earliest)


_NO_CONTEXT = contextvars.Context()  # the timer needs no context variables (and so keeps no run alive)
_TIMER_SLACK = 0.001  # a timer may fire this much before its time (the event loop's clock resolution)


async def within(when: float, awaitable: Awaitable[T]) -> T:
    """`await awaitable`, cancelled at event-loop time `when` with `TimeoutError` (one-off `Deadlines`)."""
    deadlines = Deadlines()
    try:
        return await deadlines.within(when, awaitable)
    finally:
        deadlines.close()


def _failed(call: ToolCall, kind: ErrorKind, text: str) -> ToolOutcome:
    return ToolOutcome(call, _json.valid_text(text), False, error_kind=kind)


def _denied_message(tool: Tool, reason: str) -> str:
    return (
        f"Denied: the call of {tool.name} was not run ({reason or 'not approved'}). "
        "Do not retry it; find another way, or answer with what you know."
    )


def _unknown_tool_message(name: str, names: list[str]) -> str:
    listing = ", ".join(names) if names else "(none: answer without tools)"
    shown = repr(name) if len(name) <= _NAME_SHOWN else f"{name[:_NAME_SHOWN]!r}… ({len(name):,} characters)"
    return f"Error: there is no tool named {shown}.{_meant(name[:1000], names)} Available tools: {listing}."


_NAME_SHOWN = 100  # characters of an unknown tool's name told back (a model may send a whole text as one)


def _meant(name: str, names: list[str]) -> str:
    """What a model probably meant by a tool name that is none: the tools it matches ignoring case and
    separators when there are several (none is guessed), else the closest names (a typo)."""
    wanted = plain_tool_name(name)
    alike = [known for known in names if plain_tool_name(known) == wanted]
    if len(alike) > 1:
        return f" It matches {' and '.join(alike)}: call one of them by its exact name."
    plain = {plain_tool_name(known): known for known in names}
    close = difflib.get_close_matches(wanted, list(plain), n=3, cutoff=0.75) if wanted else []
    return f" Did you mean {' or '.join(plain[found] for found in close)}?" if close else ""


def _bad_json_message(call: ToolCall, tool: Tool) -> str:
    raw = (call.raw_arguments or "")[:300]
    return f"Error: the arguments of {tool.name} were not a JSON object: {raw!r}. {_call_it_with(tool)}"


def _cut_message(tool: Tool) -> str:
    return (
        f"Error: {tool.name} was not called: your reply was cut off by its length limit inside this call's "
        "arguments, and the call would have run with part of them. Send it again, complete and shorter: "
        "split a long text over several calls, and keep what you write before the call short."
    )


UNWRITABLE = "(arguments that cannot be written as JSON: "  # begins the text kept of such arguments


def _unreadable_message(tool: Tool, raw: str) -> str:
    """For arguments nested too deeply, or that cannot be written as JSON (an integer of over 4,300
    digits): what is wrong, and how to call the tool."""
    if raw.startswith(UNWRITABLE):
        why = raw[len(UNWRITABLE) : len(UNWRITABLE) + 200].removesuffix(")")
        problem = f"its arguments cannot be written as JSON ({why})"
    else:
        problem = f"its arguments nest more than {_json.MAX_DEPTH} levels deep"
    return f"Error: {tool.name} was not called: {problem}. {_call_it_with(tool)}"


def _invalid_args_message(tool: Tool, problem: str) -> str:
    return f"Error: invalid arguments for {tool.name}: {problem}. {_call_it_with(tool)}"


def _call_it_with(tool: Tool) -> str:
    """How to call a tool, for a model that got its arguments wrong: its arguments as a JSON object of
    `<type: description>` placeholders, the required ones named, and the JSON Schema of the properties too
    when the placeholders cannot say everything (a pattern, a range, a union …)."""
    example, complete = arguments_example(tool.parameters)
    required = [name for name in tool.parameters.get("required") or () if isinstance(name, str)]
    needs = f" (required: {', '.join(required)})" if required else " (every argument is optional)"
    text = f"Call it with a JSON object like {example}{needs}."
    if not complete:
        schema = json.dumps(tool.parameters.get("properties", {}), ensure_ascii=False)
        text += f" Its properties' JSON Schema: {schema}"
    return text
