"""The Think → Act → Observe loop (SPEC §4) and the per-run context it works on.

`run_loop()` is the whole algorithm; each helper below it has one concern.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Container, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pydantic import BaseModel

from . import _choice, _json, _react
from ._budget import Budget, PriceTable
from ._context import ContextManager
from ._data import fast_constructor
from ._errors import (
    ContextOverflowError,
    DeadlineExceeded,
    ModelError,
    ModelRetryableError,
    RunError,
    StateError,
    ToolsUnsupportedError,
    UserError,
    as_model_error,
)
from ._events import (
    AnswerDelta,
    AnswerReset,
    Done,
    ErrorEvent,
    Event,
    Hint,
    ModelAttempt,
    ModelCalled,
    ModeSwitched,
    Progress,
    ResetReason,
    RunResult,
    Thought,
    ToolCallEvent,
    ToolResultEvent,
)
from ._execute import UNWRITABLE, AllowAll, Deadlines, ToolGate, ToolOutcome, execute_calls
from ._guards import Guards
from ._messages import (
    Message,
    ModelRequest,
    ModelResponse,
    ModelSettings,
    TextDelta,
    ToolCall,
    Usage,
    arguments_json,
    new_message,
    new_request,
)
from ._output import OutputSpec
from ._prompt import final_answer_prompt, system_prompt
from ._state import LedgerEntry, Mode, RunState, StopReason, new_ledger_entry, record_list
from ._tokens import estimate_message
from ._tools import ToolRegistry, truncate_output
from .models._base import bad_response, estimated_usage

if TYPE_CHECKING:
    from ._discovery import ToolDiscovery
    from ._messages import ToolDefinition
    from .models import Model

EventSink = Callable[[Event], None]
T = TypeVar("T")
logger = logging.getLogger("thinkloop.events")

current_run: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar("current_run", default=None)
"""The run being driven in this context (set by `Agent` around the loop), for code below the loop."""


def emit_current(event: Event) -> bool:
    """Emit `event` to the run of the current context (e.g. a router's `ModelAttempt`); False if none."""
    run = current_run.get()
    if run is None:
        return False
    run.emit(event)
    return True


class Checkpointer(Protocol):
    """Where a run's state and events are saved at every step boundary (a `Store` implements this)."""

    async def checkpoint(self, state: RunState, events: list[Event]) -> None: ...


@dataclass(frozen=True)
class LoopConfig:
    """The agent's settings the loop needs (an `Agent` builds this once)."""

    budget: Budget
    settings: ModelSettings
    tool_timeout: float = 120.0
    output_max_length: int = 10_000
    final_answer_on_stop: bool = True
    final_answer_prompt: str | None = None
    stream: bool = False
    price_table: PriceTable = field(default_factory=PriceTable)
    model_retries: int = 2
    retry_backoff: float = 1.0


@dataclass(slots=True)
class RunContext:
    """One run: its state plus everything the loop uses. Never shared between runs."""

    state: RunState
    model: Model
    tools: ToolRegistry
    config: LoopConfig
    guards: Guards
    context: ContextManager
    prompt_layers: dict[str, Any] = field(default_factory=dict)
    gate: ToolGate = field(default_factory=AllowAll)
    store: Checkpointer | None = None
    sinks: list[EventSink] = field(default_factory=list)
    pending: list[Event] = field(default_factory=list)
    clock_start: float = field(default_factory=time.monotonic)
    elapsed_before: float = 0.0
    discovery: ToolDiscovery | None = None  # runtime tool discovery: which tools the model is shown
    deadlines: Deadlines = field(default_factory=Deadlines)  # the time limits of its tool and model calls
    saved: bool = False  # whether the store has seen this run (a live store needs no more until the end)
    saving: asyncio.Lock | None = None  # held while a checkpoint is written: parallel tool calls save in turn
    output: OutputSpec | None = None  # `Agent(output_type=…)`: what the final answer must be
    parsed: Any = None  # the final answer validated against `output`
    deps: Any = None  # `agent.run(..., deps=…)`: handed to tools that take a `ToolContext`
    interrupted: bool = False  # `Agent.interrupt()`: the cancellation that comes leaves the run resumable
    streamer: _AnswerStreamer | None = None  # the last streamed reply, while its text may be the answer
    save_interrupted: bool = True  # False: an interrupted run writes nothing more (another process owns it)
    cut_call: str = ""  # the id of a native call whose arguments the reply's length limit cut off
    _shown: dict[tuple[Mode, tuple[str, ...]], tuple[Message, list[ToolDefinition]]] = field(
        default_factory=dict, repr=False
    )
    _last_shown: tuple[Mode, tuple[str, ...], tuple[Message, list[ToolDefinition]]] | None = field(
        default=None, init=False, repr=False
    )  # what `shown` returned last
    # set from the fields above (`__post_init__`)
    logs_events: bool = field(init=False, default=False)
    observed: bool = field(init=False, default=False)
    live_store: bool = field(init=False, default=False)
    step_saves: bool = field(init=False, default=False)

    def visible_names(self) -> list[str]:
        """The tools the model is shown: all of them, or with tool discovery the shown and discovered ones."""
        return self.tools.names if self.discovery is None else self.discovery.visible_names(self)

    def visible_definitions(self) -> list[ToolDefinition]:
        return self.tools.definitions(None if self.discovery is None else self.visible_names())

    def system_for(self, mode: Mode) -> str:
        """The system prompt for a mode: the agent's layers, plus the tool list and format in ReAct."""
        return self.shown(mode)[0].content

    def forget_shown(self) -> None:
        """Build the system message and tool list for this run alone (its tools differ from the agent's)."""
        self._shown = {}
        self._last_shown = None
        self.context.reserve_cache = {}

    def shown(self, mode: Mode) -> tuple[Message, list[ToolDefinition]]:
        """The system message and the tool definitions the model is shown in `mode` (built once per tool set)."""
        names = self.tools.key if self.discovery is None else tuple(self.visible_names())
        last = self._last_shown  # the same as the step before, most steps: no key to hash
        if last is not None and last[0] == mode and last[1] == names:
            return last[2]
        found = self._shown.get((mode, names))
        if found is None:
            definitions = self.tools.definitions(names)
            tools = _react.tools_prompt(definitions) if mode == "react" and definitions else ""
            system = Message.system(system_prompt(tools=tools, **self.prompt_layers))
            found = self._shown[(mode, names)] = (system, definitions)
        self._last_shown = (mode, names, found)
        return found

    # ------------------------------------------------------------------------------------- events

    def __post_init__(self) -> None:
        # Whether the store keeps an event log (events are queued for its next checkpoint); whether
        # anyone reads this run's events at all (else none are built); whether the store holds the live
        # state object (so only the first and the last checkpoint matter).
        self.logs_events = self.store is not None and getattr(self.store, "keeps_events", True)
        self.observed = bool(self.sinks) or self.logs_events
        self.live_store = getattr(self.store, "live", False) is True
        self.step_saves = self.store is not None and not self.live_store  # checkpoints within a run matter

    def emit(self, event: Event | Callable[[], Event]) -> None:
        """Number the event, hand it to the sinks, and queue it for the next checkpoint.

        Rare events may pass a factory (`lambda: Hint(...)`): it is only called when someone reads events.
        The hottest paths test `observed` first and call `skip_event()` instead (no closure to build).
        """
        self.state.event_version += 1
        if not isinstance(event, BaseModel):
            if not self.observed:
                return
            event = event()
        event.run_id = self.state.run_id
        event.seq = self.state.event_version
        if self.logs_events:
            self.pending.append(event)
        for sink in self.sinks:
            try:
                returned: Any = sink(event)
            except Exception:  # a listener's bug must not break the run's bookkeeping (SPEC §8.2)
                self._drop_sink(sink, event)
            else:
                if returned is not None and inspect.isawaitable(returned):
                    self._drop_async_sink(sink, returned)

    def _drop_async_sink(self, sink: EventSink, returned: Any) -> None:
        """An async listener returns a coroutine nobody awaits: it would never see an event."""
        if inspect.iscoroutine(returned):
            returned.close()  # no "coroutine was never awaited" warning per event
        logger.error(
            "an event listener (%r) is async: listeners are called, not awaited, so it would never run; "
            "pass a plain function (e.g. one doing `queue.put_nowait(event)`); it gets no events of run %s",
            sink, self.state.run_id,
        )  # fmt: skip
        self.sinks = [s for s in self.sinks if s is not sink]
        self.observed = bool(self.sinks) or self.logs_events

    def _drop_sink(self, sink: EventSink, event: Event) -> None:
        """Stop calling a listener that raised (logged once, with its traceback); the run goes on."""
        logger.exception(
            "an event listener (%r) raised on the %r event of run %s: it gets no more events of this run",
            sink, event.type, self.state.run_id,
        )  # fmt: skip
        self.sinks = [s for s in self.sinks if s is not sink]
        self.observed = bool(self.sinks) or self.logs_events

    def skip_event(self) -> None:
        """Count an event nobody reads (so `seq` numbers do not depend on who listens)."""
        self.state.event_version += 1

    async def checkpoint(self) -> None:
        """Save the state with the events emitted since the last checkpoint, in one transaction."""
        if self.store is None or (self.saved and self.live_store and not self.state.finished):
            return
        if not self.step_saves:  # saved at the start and the end only: two saves never overlap
            await self._save(self.store)
            return
        if self.saving is None:
            self.saving = asyncio.Lock()
        async with self.saving:  # two saves at once (parallel tool calls) would write the same version twice
            await self._save(self.store)

    async def _save(self, store: Checkpointer) -> None:
        if not self.state.finished:  # a finished run's time was fixed by `finish` (and its `done` event)
            self.state.elapsed = self.elapsed
        events, self.pending = self.pending, []  # those emitted while it is written go with the next
        try:
            await store.checkpoint(self.state, events)
        except BaseException as exc:
            self.pending = events + self.pending  # kept after a failure: the next checkpoint carries them
            if isinstance(exc, RunError) or not isinstance(exc, Exception):
                raise
            name = type(store).__name__  # a store of the user's making: a StateError all the same
            raise StateError(f"the store {name} could not save run {self.state.run_id}: {exc!r}") from exc
        self.saved = True

    async def ledger_started(self, call: ToolCall) -> None:
        """Mark a call as started (its planned entry, or a new one) and save that before it runs. When the
        save fails the call does not run: its entry is planned again (a resume runs it, it never ran)."""
        self.mark_started(call)
        if not self.step_saves:
            return
        try:
            await self.checkpoint()
        except StateError:
            self.state.ledger[call.id].status = "planned"
            raise

    async def ledger_done(
        self, call_id: str, output: str, success: bool, *, error_kind: str | None = None
    ) -> None:
        """Record a call's result in the ledger and save it."""
        self.mark_done(call_id, output, success, error_kind=error_kind)
        if self.step_saves:
            await self.checkpoint()

    def mark_started(self, call: ToolCall) -> None:
        """The ledger entry of `call` says started (its planned entry, or a new one); not saved yet."""
        entry = self.state.ledger.get(call.id)
        if entry is None:
            entry = LedgerEntry(
                call_id=call.id, name=call.name, arguments=call.arguments, step=self.state.step
            )
            self.state.ledger[call.id] = entry
        else:
            entry.status, entry.step, entry.output, entry.success, entry.error_kind = (
                "started", self.state.step, None, None, None,
            )  # fmt: skip

    def mark_done(self, call_id: str, output: str, success: bool, *, error_kind: str | None = None) -> None:
        """The ledger entry of a call holds its result; not saved yet."""
        entry = self.state.ledger.get(call_id)
        if entry is not None:
            entry.status, entry.output, entry.success = "done", output, success
            entry.error_kind = error_kind

    @property
    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.clock_start

    @property
    def deadline(self) -> float | None:
        timeout = self.config.budget.timeout
        return None if timeout is None else time.monotonic() + max(timeout - self.elapsed, 0.0)


new_run_context = fast_constructor(RunContext)
"""`RunContext(...)` for the start of every run (see `fast_constructor`)."""


@dataclass(slots=True)
class Reply:
    """A model reply as the loop understands it."""

    text: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    problem: str | None = None  # why the reply could not be understood (to heal)


_new_reply = fast_constructor(Reply)


# ================================================================================================ loop


async def run_loop(run: RunContext, *, resumed: bool = False) -> RunResult:
    """Run Think → Act → Observe until a final answer or a stop condition.

    0. A resumed run first settles the tool calls its interruption left without a result (`_resume`).
    1. Check the stop conditions: budgets, then the guards (loop, no progress).
    2. Think: send the context view to the model and record its reply.
    3. A reply that cannot be understood is healed: the model is told what was wrong, then back to 1
       (more than `max_heals` bad replies in a row stop the run with `error`).
    4. A reply without tool calls is the final answer: stop. With an output type, an answer that does not
       validate goes back to the model with the errors instead (counted as a heal, like 3).
    5. Act: run the tool calls — screened for loops, validated, risk-checked, timed out, truncated.
    6. Observe: record the results, update the guards, add a checkpoint hint; save; back to 1.
    A hard stop (budget, loop, no progress) makes one last call for a best-effort final answer.
    """
    try:
        if resumed:
            await _settle_pending(run)
        while True:
            reason = check_stop(run)
            if reason is not None:
                return await finish_forced(run, reason)
            reply = await think(run)
            if reply.problem is not None:
                if heal(run, reply):
                    continue
                return await finish_unreadable(run, reply)
            if not reply.calls:
                result = await final_answer(run, reply.text)
                if result is not None:
                    return result
                continue  # the answer did not match the output type: the model was told why
            outcomes = await act(run, reply.calls)
            observe(run, outcomes)
            if run.step_saves:
                await run.checkpoint()
    except DeadlineExceeded:  # the run's time limit; a TimeoutError the user's code raised is not
        return await finish(
            run,
            StopReason.TIMEOUT,
            answer=_best_known(run),
            error=run.config.budget.describe(StopReason.TIMEOUT),
        )
    except asyncio.CancelledError:
        await ended_by_cancellation(run)
        raise
    except RunError as exc:  # the run ends with `error`; a store failure (StateError) is raised instead
        return await ended_by_error(run, exc)


# =============================================================================================== steps


def check_stop(run: RunContext) -> StopReason | None:
    """Budgets first, then the guards."""
    state, budget = run.state, run.config.budget
    if budget.timeout is None and budget.max_cost is None and budget.max_tokens is None:
        reason = StopReason.MAX_STEPS if state.step >= budget.max_steps else None  # only a step limit
    else:
        reason = budget.check(steps=state.step, usage=state.usage, elapsed=run.elapsed)
    return reason or run.guards.stop_reason(state)


async def think(run: RunContext) -> Reply:
    """One model call on the context view; the reply is recorded in the history."""
    state = run.state
    state.step += 1
    state.phase = "thinking"
    if run.observed:
        run.emit(Progress(step=state.step, max_steps=run.config.budget.max_steps, usage=state.usage.copy()))
    else:
        state.event_version += 1  # `run.skip_event()`, inlined: the hot path
    if run.context.summarizer is not None:  # a model-written summary of dropped steps, within the deadline
        deadline = None if run.config.budget.timeout is None else run.deadline
        await _within(run, deadline, run.context.prepare(state))
    while True:
        request = build_request(run)
        try:
            response = await call_model(run, request)
            break
        except _Rebuild:  # the context was shrunk, or the mode switched: build the request again
            continue
    reply = _valid_unicode_reply(interpret(run, response, request))
    if response.finish_reason == "length" and not reply.calls and reply.problem is None:
        reply = _cut_answer(run, reply, response)
    if run.streamer is not None and (reply.calls or reply.problem is not None):
        _retract(run, "tool_calls" if reply.calls else "correction")
    _record_reply(run, reply)
    return reply


def _final_within_budget(run: RunContext, messages: list[Message]) -> list[Message]:
    """The final-answer request's messages within the run's context budget: remembered turns of the
    session dropped oldest first, then the final prompt (its tool results) cut, head and tail kept. It
    bypassed the context manager: 20 remembered turns made a 5,400-token request for a 2,000-token window."""
    context = run.context
    budget = int(context.budget / max(context.scale, 0.5))
    total = sum(estimate_message(m) for m in messages)
    if total <= budget:
        return messages
    kept = list(messages)
    for message in messages:
        if total <= budget:
            break
        if message.kind == "memory":
            kept.remove(message)
            total -= estimate_message(message)
    last = kept[-1]
    if total > budget and last.kind == "final_prompt":
        room = max((budget - (total - estimate_message(last))) * 3, 600)  # characters: ~3 a token
        content, _ = truncate_output(last.content, room)
        kept[-1] = last.model_copy(update={"content": content})
    return kept


def build_request(run: RunContext, *, final: bool = False) -> ModelRequest:
    """The model request of this step: the context view, plus tools (native) or the ReAct format."""
    state, react = run.state, run.state.mode == "react"
    if final:  # compact: the task, then the final prompt listing what the tools returned (see finish_forced)
        messages = [m for m in state.messages if m.kind in ("memory", "task") or m.kind == "final_prompt"]
        return ModelRequest(
            messages=_final_within_budget(run, [run.shown("native")[0], *messages[-40:]]),
            settings=run.config.settings,
            run_id=state.run_id,
            turn=state.usage.requests,
        )
    system, definitions = run.shown(state.mode)
    tools = [] if react else definitions
    messages = run.context.view(state, system=system.content, tools=tools)
    messages.insert(0, system)
    if not react:
        return new_request(
            messages=messages, tools=tools, settings=run.config.settings, run_id=state.run_id,
            turn=state.usage.requests,
        )  # fmt: skip
    settings = run.config.settings
    return ModelRequest(
        messages=_react.render_transcript(messages),
        settings=settings.model_copy(update={"stop": [*settings.stop, *_react.STOP_SEQUENCES]}),
        run_id=state.run_id,
        turn=state.usage.requests,
        prefill="Thought:" if run.model.capabilities.prefill else "",
    )


async def call_model(run: RunContext, request: ModelRequest) -> ModelResponse:
    """Call the model (streaming when asked) under the run's deadline; account its usage.

    A transient failure (429, 5xx, timeout, lost connection) is retried with exponential backoff (or the
    provider's Retry-After), unless a streamed answer had already started, or the error says it was
    retried already (`ModelError.retried`: a router's, after its own retries and fallbacks, even behind a
    model wrapping the router) — except for a stream that broke before anything of it was shown (a ReAct
    reply before its `Final Answer:`), which a router cannot fall back from. One coroutine for all of it: each
    level of coroutines a model call waits in costs every step.
    """
    started = time.perf_counter()
    deadline = None if run.config.budget.timeout is None else run.deadline
    attempt = 0
    while True:
        streamer = None
        try:
            if run.config.stream and run.model.capabilities.streaming:
                run.streamer = streamer = _AnswerStreamer(run, react=run.state.mode == "react")
                response = await _within(run, deadline, _stream_model(run, request, streamer))
            elif deadline is None:
                response = await run.model.request(request)
            else:
                response = await run.deadlines.within(deadline, run.model.request(request))
            break
        except Exception as exc:
            attempt += 1
            if isinstance(exc, ModelError) and exc.usage is not None:  # tokens the failed request(s) took
                run.state.usage.add(exc.usage.model_copy(update={"requests": 0}))
            delay = _retry_delay(run, exc, attempt, streamer)  # raises unless the call is tried again
        await _within(run, deadline, asyncio.sleep(delay))
    if not isinstance(response, ModelResponse) or type(response.text) is not str:
        raise bad_response(response, run.model.provider)
    usage = response.usage
    if (
        not (  # the fields reach events, state and budgets: checked inline, every step
            type(response.finish_reason) is str
            and type(usage) is Usage
            and type(usage.input_tokens) is int
            and type(usage.output_tokens) is int
            and type(usage.cost) is float
            and usage.input_tokens >= 0
            and usage.output_tokens >= 0
            and 0.0 <= usage.cost < math.inf
            and type(response.tool_calls) is list
            and _plain_calls(response.tool_calls)
        )
        and (problem := _malformed(response)) is not None
    ):  # a model of the user's making
        raise ModelError(
            f"the model returned a malformed ModelResponse: {problem}",
            provider=run.model.provider,
            scope="model request",
        )
    if (  # the prefill put back
        request.prefill
        and response.text
        and not response.text.lstrip().lower().startswith(request.prefill.lower())
    ):
        response = response.model_copy(update={"text": f"{request.prefill} {response.text}"})
    _account(run, request, response, started)
    return response


async def _within(run: RunContext, deadline: float | None, awaitable: Awaitable[T]) -> T:
    return await awaitable if deadline is None else await run.deadlines.within(deadline, awaitable)


def _retry_delay(run: RunContext, exc: Exception, attempt: int, streamer: _AnswerStreamer | None) -> float:
    """The wait before trying a failed model call again (announced as `model_attempt`); raises the error
    that ends the call instead: the failure itself, `_Rebuild` when the request must be built anew, or a
    `ModelError` for anything a model of the user's making raised."""
    exc = model_failure(run, exc)
    if isinstance(exc, ContextOverflowError):
        if streamer is not None and streamer.started:
            raise exc
        _shrink_context(run, exc)
        raise _Rebuild from exc
    if isinstance(exc, ToolsUnsupportedError):
        if run.state.mode != "native" or (streamer is not None and streamer.started):
            raise exc
        switch_mode(run, "react", f"the model does not take tool definitions ({exc})")
        raise _Rebuild from exc
    if isinstance(exc, ModelRetryableError):
        shown = streamer is not None and streamer.started
        # a router retries and falls back itself, but not once tokens flowed; unshown ones are ours to retry
        unseen_break = streamer is not None and bool(streamer.buffer) and not shown
        if attempt > run.config.model_retries or shown or (exc.retried and not unseen_break):
            raise exc
        backoff = run.config.retry_backoff * 2 ** (attempt - 1)
        wait = backoff if exc.retry_after is None else exc.retry_after  # a Retry-After of 0 means now
        delay = min(wait, MAX_RETRY_WAIT)
        timeout = run.config.budget.timeout
        if (exc.retry_after or 0.0) > MAX_RETRY_WAIT or (
            timeout is not None and run.elapsed + delay >= timeout
        ):
            raise exc  # a wait longer than the loop waits, or than the run has left: the provider's error now
        run.emit(
            ModelAttempt(
                model=run.model.spec, attempt=attempt, error=str(exc), next_action="retry", delay=delay
            )
        )
        return delay
    raise exc


def model_failure(run: RunContext, exc: Exception) -> Exception:
    """The error a failed model call stands for: a `ModelError`, a `UserError` (missing weights … are the
    caller's) and the run's own deadline as they are; a `TimeoutError` the model raised itself (its own
    `asyncio.wait_for`, a socket timeout) is a transient `ModelRetryableError`, not the run's time limit;
    anything else a model of the user's making raised is a `ModelError` naming it."""
    if isinstance(exc, ModelError | UserError | DeadlineExceeded):
        return exc
    return as_model_error(exc, run.model.provider)


def _plain_calls(calls: list[ToolCall]) -> bool:
    """Whether every call is a `ToolCall` of text id and name, with a dict of arguments (and text or None as
    its raw arguments): a loop, not `all()` over a generator (a frame less every step)."""
    for call in calls:
        if not (
            type(call) is ToolCall
            and type(call.id) is str
            and type(call.name) is str
            and type(call.arguments) is dict
            and (call.raw_arguments is None or type(call.raw_arguments) is str)
        ):
            return False
    return True


def _malformed(response: ModelResponse) -> str | None:
    """What is wrong with a response's fields (a custom model's: thinkloop's adapters build them right), or
    None: `finish_reason` text, usage of whole non-negative token counts and a finite non-negative cost,
    tool calls with text ids and names and an object of arguments."""
    usage = response.usage
    if type(response.finish_reason) is not str:
        return f'its finish_reason is {response.finish_reason!r}, not text ("stop", "tool_calls", "length" …)'
    if type(usage) is not Usage:
        return f"its usage is a {type(usage).__name__}, not a Usage"
    for name in ("input_tokens", "output_tokens", "requests"):
        count = getattr(usage, name)
        if type(count) is not int or count < 0:
            return f"its usage.{name} is {count!r}, not a whole number >= 0"
    cost = usage.cost
    if type(cost) not in (float, int) or not 0 <= cost < math.inf:
        return f"its usage.cost is {cost!r}, not a finite number >= 0"
    if type(response.tool_calls) is not list:
        return f"its tool_calls is a {type(response.tool_calls).__name__}, not a list"
    for call in response.tool_calls:
        if type(call) is not ToolCall:
            return f"a tool call is a {type(call).__name__}, not a ToolCall"
        if type(call.id) is not str or type(call.name) is not str:
            return f"a tool call's id and name must be text, not {call.id!r} and {call.name!r}"
        if type(call.arguments) is not dict or not (
            call.raw_arguments is None or type(call.raw_arguments) is str
        ):
            return f"the arguments of tool call {call.name!r} must be a dict (or raw_arguments text), not {call.arguments!r:.60}"
    return None


MAX_SHRINKS_PER_STEP = 2
MAX_RETRY_WAIT = 30.0
"""The longest the loop waits before trying a failed model call again; a provider asking for longer
(`Retry-After`) fails the call at once, with its error (a `RouterModel` falls back instead)."""


class _Rebuild(Exception):
    """Private signal from `_call_with_retries` to `think`: the request must be built again — the run's
    context budget was lowered after an overflow, or the run switched to ReAct because the model takes no
    tool definitions."""


def _shrink_context(run: RunContext, error: ContextOverflowError) -> None:
    """Lower the run's context budget after the model rejected the prompt as too long (at most
    `MAX_SHRINKS_PER_STEP` times a step); raise the error that ends the run when shrinking cannot help."""
    state, context = run.state, run.context
    shrinks: list[Any] = record_list(state.metadata, "context_shrinks")
    done = sum(1 for s in shrinks if isinstance(s, dict) and s.get("step") == state.step)
    before, scale = context.max_context_tokens, context.scale
    to_tokens = None
    if error.limit:  # the window, minus room for the reply
        room = error.completion_tokens or run.config.settings.max_output_tokens
        to_tokens = error.limit - min(room, error.limit // 4)
    after = before
    if done < MAX_SHRINKS_PER_STEP:
        after = context.shrink(to_tokens, prompt_tokens=error.prompt_tokens)
    if after >= before and context.scale <= scale:  # nothing left to shrink, or shrunk too often already
        window = f" of {error.limit:,} tokens" if error.limit else ""
        size = f" (the prompt had {error.prompt_tokens:,} tokens)" if error.prompt_tokens else ""
        now = context.max_context_tokens
        times = {1: "once", 2: "twice"}.get(done, f"{done} times")
        how = f"even after shrinking the run's context {times}, to {now:,} tokens"
        if not done:
            how = f"and the run's context cannot shrink below {now:,} tokens"
        said = str(error).removeprefix(f"{error.provider}: {error.scope} failed: ")
        raise ContextOverflowError(
            f"the prompt does not fit the model's context window{window}{size}, {how}: lower "
            "max_context_tokens or max_output_tokens, shorten the instructions or tool descriptions, or use a "
            f"model with a larger context window (the provider said: {said})",
            provider=error.provider,
            scope=error.scope,
            status_code=error.status_code,
            limit=error.limit,
            prompt_tokens=error.prompt_tokens,
            completion_tokens=error.completion_tokens,
        ) from error
    shrinks.append(
        {"step": state.step, "from": before, "to": after, "limit": error.limit, "prompt": error.prompt_tokens}
    )
    run.emit(
        ModelAttempt(
            model=run.model.spec,
            attempt=done + 1,
            error=f"{error} (the run's context was shrunk from {before:,} to {after:,} tokens)",
            next_action="retry",
        )
    )


async def _stream_model(run: RunContext, request: ModelRequest, answer: _AnswerStreamer) -> ModelResponse:
    """Stream a reply; text is forwarded as `answer_delta` while it can still be the final answer."""
    final: ModelResponse | None = None
    async for chunk in run.model.stream(request):
        if isinstance(chunk, TextDelta):
            answer.feed(chunk.text)
        elif isinstance(chunk, ModelResponse):
            final = chunk
        else:
            answer.called = True  # a tool call: the rest of the reply is not the answer
    if final is None:
        raise ModelError(
            "the stream ended without a final response", provider=run.model.provider, scope="streaming"
        )
    return final


_THINK_CLOSE_RE = _react.THINK_CLOSE_RE
_THINK_OPEN_RE = re.compile(r"<think>", re.IGNORECASE)


class _AnswerStreamer:
    """Emits `answer_delta` events for the text of a streamed reply that can still be the final answer.

    Native mode: the text before any tool call — after a leading `<think>…</think>` block, and only after
    `Final Answer:` when the reply opens with a `Thought:` label. ReAct: the text after `Final Answer:`.
    Whitespace after a label or reasoning block is skipped, and trailing whitespace held back until more
    text follows (such answers are stripped). The loop retracts what was sent (`answer_reset`) when the reply is not the answer after all.
    Each delta looks only at the text it added: a long reply costs linear time.
    """

    __slots__ = (
        "run",
        "buffer",
        "called",
        "labelled",
        "opening",
        "thinking",
        "scanned",
        "looked",
        "first",
        "sent",
    )

    def __init__(self, run: RunContext, *, react: bool) -> None:
        self.run, self.buffer, self.called = run, "", False
        self.labelled = react  # the answer starts after a `Final Answer:` label
        self.opening = not react  # native: whether the reply's opening (reasoning, a label) is still unknown
        self.thinking = False  # inside a leading `<think>` block
        self.scanned = 0  # where the answer (or its label's line, or the end of the reasoning) may start
        self.looked = 0  # labelled: the text before this offset holds no newline after `scanned`
        self.first = -1  # where the sent text starts in `buffer` (-1: nothing sent yet)
        self.sent = 0  # where it ends

    @property
    def started(self) -> bool:
        """Whether any answer text was sent (a failure after that cannot be retried unseen)."""
        return self.first >= 0

    @property
    def text(self) -> str:
        """The text sent as `answer_delta` events."""
        return self.buffer[self.first : self.sent] if self.first >= 0 else ""

    def feed(self, text: str) -> None:
        if not text.isascii():
            # a lone surrogate (half an emoji's JSON escape) fails JSON output
            text = _json.valid_unicode(text)
        buffer, self.buffer = self.buffer, ""  # the attribute's reference dropped: `+=` grows it in place
        buffer += text
        self.buffer = buffer
        if self.called or (self.first < 0 and not self._answer_starts()):
            return
        sent = self.sent
        end = sent + len(buffer[sent:].rstrip())  # only the text not sent yet is looked at
        if end > sent:
            piece, self.sent = buffer[sent:end], end
            self.run.emit(AnswerDelta(text=piece))

    def _answer_starts(self) -> bool:
        """Before anything was sent: whether the answer has begun (then `first` and `sent` are its start)."""
        if self.opening and not self._opened():
            return False
        at = self.scanned
        if self.labelled and (at := self._after_label()) < 0:
            return False
        rest = self.buffer[at:]
        stripped = rest.lstrip() if at else rest  # a labelled answer, or one after reasoning, is stripped
        if not stripped.strip():
            return False
        self.first = self.sent = at + len(rest) - len(stripped)
        return True

    def _opened(self) -> bool:
        """Native: whether the reply's opening is known — past a leading reasoning block, plain text, or a
        `Thought:` label (then the answer is the labelled one)."""
        buffer = self.buffer
        if not self.thinking:
            head = buffer.lstrip()
            lower = head[:16].lower()
            if len(lower) < 7 and "<think>".startswith(lower):
                return False  # too little to tell
            if not lower.startswith("<think>"):
                if "\n" not in head and len(head) < 12 and "thought".startswith(lower.lstrip(" \t>*_#")[:7]):
                    return False  # maybe a `Thought:` label
                self.labelled = _react._THOUGHT_RE.match(head) is not None
                self.opening = False
                return True
            self.thinking, self.scanned = True, len(buffer) - len(head) + len("<think>")
        match = _THINK_CLOSE_RE.search(buffer, self.scanned)
        if match is None:  # reasoning: never the answer
            self.scanned = max(self.scanned, len(buffer) - len("</think>"))
            return False
        self.scanned, self.thinking, self.opening = match.end(), False, False
        return True

    def _after_label(self) -> int:
        """Labelled: where the text after `Final Answer:` starts, or -1 while no line begins with it."""
        buffer = self.buffer
        while (match := _react._FINAL_RE.match(buffer, self.scanned)) is None:
            newline = buffer.find("\n", max(self.scanned, self.looked))
            if newline < 0:  # the last line may still grow into the label
                self.looked = len(buffer)
                return -1
            self.scanned = newline + 1
        return match.end()


def _retract(run: RunContext, reason: ResetReason) -> None:
    """The text streamed as the answer was not the answer: tell the consumers (`answer_reset`)."""
    streamer, run.streamer = run.streamer, None
    if streamer is not None and streamer.started:
        run.emit(AnswerReset(step=run.state.step, reason=reason))


def _stream_answer(run: RunContext, answer: str) -> None:
    """At the end of a streamed run: make the `answer_delta` text since the last reset the run's answer —
    the rest of it, or (after `answer_reset`) all of it when what was streamed differs."""
    streamer, run.streamer = run.streamer, None
    sent = streamer.text if streamer is not None else ""
    if sent == answer:
        return
    if sent and not answer.startswith(sent):
        run.emit(AnswerReset(step=run.state.step, reason="answer"))
        sent = ""
    if len(answer) > len(sent):
        run.emit(AnswerDelta(text=answer[len(sent) :]))


def _account(
    run: RunContext, request: ModelRequest, response: ModelResponse, started: float, *, final: bool = False
) -> None:
    """Add the call's usage and cost to the run's, and announce the call (`model_call`)."""
    state = run.state
    usage = response.usage if response.usage.requests else estimated_usage(request, response)
    state.usage.add(usage)
    cost = usage.cost
    if cost == 0.0:  # priced here: the provider did not say what it cost
        name = response.model_name or run.model.name
        cost = run.config.price_table.cost(name, usage.input_tokens, usage.output_tokens)
        state.usage.cost += cost
    if not usage.estimated:
        run.context.record_usage(usage.input_tokens)
    if run.observed:
        run.emit(
            ModelCalled(
                step=run.state.step,
                model=response.model_name or run.model.name,
                provider=run.model.provider,
                duration=time.perf_counter() - started,
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                cost=cost,
                estimated=usage.estimated,
                tool_calls=len(response.tool_calls),
                finish_reason=response.finish_reason,
                final=final,
            )  # fmt: skip
        )
    else:
        state.event_version += 1  # `run.skip_event()`, inlined: the hot path


def interpret(run: RunContext, response: ModelResponse, request: ModelRequest) -> Reply:
    """Turn a raw response into a `Reply`: native tool calls, or a parsed ReAct step."""
    if run.state.mode == "react" and not response.tool_calls:
        return _interpret_react(run, response, request)
    calls = response.tool_calls
    if calls:
        call = calls[0]
        if (  # the common case, at once: one well-formed call, of a fresh id, naming a tool exactly
            len(calls) == 1
            and call.raw_arguments is None
            and call.id
            and call.id not in run.state.ledger
            and call.name in run.tools
        ):
            return _new_reply(text=response.text, calls=calls)
        calls = _settled(run, calls)
    if not calls and response.text and run.tools.names and _react.may_hold_calls(response.text):
        said = reasoning_removed(response.text)  # a call the model only considered in its reasoning is none
        answer = _react.json_answer(said, run.tools.names)  # {"name": "final_answer", ...} as text
        if answer is not None:
            return Reply(text=answer)
        thought, text_calls = _react.text_calls(said, run.tools.names, f"text_{run.state.step}")
        if text_calls and _cut_inside_call(response, said):
            return Reply(text=response.text, problem=_cut_call_problem(text_calls[-1].name))
        if text_calls:  # a native model (or a server without a tool-call parser) wrote its calls as text
            _calls_written_as_text(run)
            return _answer_calls(run, Reply(text=thought, calls=_settled(run, text_calls)))
    malformed = unknown = False
    for call in calls:
        malformed = malformed or call.raw_arguments is not None
        unknown = unknown or call.name not in run.tools  # perhaps a `final_answer` call
    if malformed and response.finish_reason == "length" and calls[-1].raw_arguments is not None:
        run.cut_call = calls[-1].id  # told it was cut (`_execute._checked`); not a reason to leave native
        malformed = any(call.raw_arguments is not None for call in calls[:-1])
    if malformed:
        _note_malformed_native(run)
    if not calls:
        return _native_final(run, response)
    reply = _new_reply(text=response.text, calls=calls)
    return _answer_calls(run, reply) if unknown else reply


def _native_final(run: RunContext, response: ModelResponse) -> Reply:
    """A native reply without calls: its answer, checked when `GuardConfig.answer_checks` asks for it."""
    answer = native_answer(response.text)
    if run.tools.names and _only_announces(run, answer):
        return Reply(text=response.text, problem=_react.PLAN_ONLY_NATIVE)
    if _checks_answers(run):  # asked for (`answer_checks=True`): a small model behind a server
        return _checked_answer(run, answer, reasoning_removed(response.text), response.text)
    return _new_reply(text=answer, calls=[])


def _only_announces(run: RunContext, answer: str) -> bool:
    """A native reply without calls that only says what comes next ("I will look up the weather for
    you.", "I will try again later."): asked once per run to take that step or answer; a second stands."""
    return (
        len(answer) < 400
        and _react.announces_next_step(answer)
        and not _react.told(run.state.messages, _react.PLAN_ONLY_NATIVE)
    )


def _interpret_react(run: RunContext, response: ModelResponse, request: ModelRequest) -> Reply:
    said = reasoning_removed(response.text)  # labels in `<think>` reasoning are drafts, not the reply's
    step = _react.parse_react(said, run.tools.names, call_id=f"react_{run.state.step}")
    if step.error == _react.PLAN_ONLY and _react.told(run.state.messages, _react.PLAN_ONLY):
        return Reply(text=step.thought)  # once told, a reply that only says what comes next is the answer
    if step.error:
        return Reply(text=response.text, problem=step.error)
    if step.call is not None and _cut_inside_call(response, said):
        return Reply(text=response.text, problem=_cut_call_problem(step.call.name))
    if step.call is not None:
        calls = _settled(run, [step.call])
        reply = Reply(text=step.thought, calls=calls)
        return reply if calls[0].name in run.tools else _answer_calls(run, reply)
    final = step.final or ""
    if final and _react.copied_final(final, request.messages, run.state):
        return Reply(
            text=response.text,
            problem=f"It {_react.COPIED} instead of answering the task. The task: {run.state.goal}",
        )
    if final.startswith(("{", "`")):  # {"name": "final_answer", "arguments": {...}} written as the answer
        final = _react.json_answer(final, run.tools.names) or final
    if not _checks_answers(run):
        return Reply(text=final)
    return _checked_answer(run, final, said, response.text)


def _checked_answer(run: RunContext, final: str, said: str, text: str) -> Reply:
    """A final answer checked against the run's tool results (`GuardConfig.answer_checks`): a computation
    written out wrong is put right, numbers no result gives are asked about, a superlative its own figures
    contradict is asked about once, then put right; the answer in the form the task asks for. `said` is
    the reply without its reasoning, `text` the whole reply (kept with a problem, to heal)."""
    results = [(m.tool_call_id, m.content) for m in run.state.messages if m.role == "tool"]
    if results:  # a computation written out wrong is put right; numbers no result gives are asked about
        made_up: list[tuple[str, str]] = []
        sources = _sources(run, [run.state.goal], results, made_up)
        final = _react.corrected_arithmetic(final, said, sources)
        unsourced = _unsourced(run, final, said, sources, made_up)
        if unsourced:
            return Reply(text=text, problem=unsourced)
        work = [m.content for m in run.state.messages if m.role == "assistant"]
        checked = _react.superlative_check(final, run.state.goal, [*work, said], sources)
        if checked is not None:  # "Anvil has the most" beside its own 2530, 2880 (Bolt) and 1010: told once
            if not _react.told(run.state.messages, _react.SUPERLATIVE):
                return Reply(text=text, problem=checked[0])
            final = checked[1]
    return Reply(text=_react.requested_form(final, run.state.goal))


def _sources(
    run: RunContext,
    sources: list[str],
    results: Sequence[tuple[str | None, str]],
    made_up: list[tuple[str, str]] | None = None,
) -> list[str]:
    """`sources` and then the tool results (call id, text) in order, but for the calculator's results of
    numbers none of which an earlier source gives, constants aside (made-up numbers put through the
    calculator are still made up): those go to `made_up` as (what it computed, result). A computation with
    one sourced number at least is a source: its other numbers may be constants no list here holds (a tip's
    `* 0.15` was taken for made up, and the right answer for "Could not be found")."""
    ledger = run.state.ledger
    for call_id, text in results:
        entry = ledger.get(call_id) if call_id is not None else None
        expression = (
            entry.arguments.get("expression") if entry is not None and entry.name == "calculator" else None
        )
        if isinstance(expression, str) and _react.computed_from_nowhere(expression, sources):
            if made_up is not None and entry is not None:  # its output: the message may hold a note
                made_up.append((expression, entry.output or text))
            continue
        sources.append(text)
    return sources


def _unsourced(
    run: RunContext, answer: str, reply: str, sources: list[str], made_up: list[tuple[str, str]]
) -> str | None:
    """The correction of a final answer, after tool calls, whose numbers neither the task nor a tool result
    (`sources`) gives, nor arithmetic on them (made up, or worked out wrong in the model's head) — once per
    run; once more when the number came from a calculator call of made-up numbers (`made_up`), naming
    that call (the 1.5B model, told once, sent `1000 * 2` again and answered $2000 again). A further such
    answer stands."""
    messages = run.state.messages
    told = _react.told(messages, _react.UNSOURCED)
    if told and _react.told(messages, _react.LAUNDERED):
        return None
    missing = _react.unsourced_numbers(answer, sources, reply)
    if not missing:
        return None
    shown = ", ".join(missing[:3])
    what_to_do = (
        "Take each value from an observation, as it is written there; compute a new value with a tool instead "
        "of in your head; if the observations do not have what the task asks for, say it could not be found. "
        f"The task: {run.state.goal}"
    )
    call = _react.made_up_result(missing, made_up)
    if call is not None and not _react.told(messages, _react.LAUNDERED):
        expression, result = call
        operands = ", ".join(_react.computed_from_nowhere(expression, sources)[:3])
        others = [n for n in run.visible_names() if n != "calculator"]
        if others and all(e.name == "calculator" for e in run.state.ledger.values()):  # nothing looked up
            what_to_do = (
                f"No tool has looked anything up yet: call the one that gives the values the task needs (one "
                f"of: {', '.join(others[:8])}), then compute with what it returns. The task: {run.state.goal}"
            )
        return (
            f"The Final Answer gives {shown}: the calculator computed {result.strip()[:60]} from "
            f"{json.dumps(expression[:200])}, but no observation or the task gives {operands}: "
            f"{_react.LAUNDERED}. {what_to_do}"
        )
    if told:
        return None
    return f"The Final Answer gives {shown}, {_react.UNSOURCED}. {what_to_do}"


def _answer_calls(run: RunContext, reply: Reply) -> Reply:
    """Calls of a tool that does not exist but hands in the answer (`final_answer(answer=…)`, `Action: Final
    Answer`): alone, they are the final answer; beside real calls they are dropped (an answer given before
    the results it needs is premature)."""
    answers = [c for c in reply.calls if _react.is_answer_call(c, run.tools.names)]
    if not answers:
        return reply
    if len(answers) == len(reply.calls):
        return Reply(text=_react.answer_of(answers[0]))
    reply.calls = [c for c in reply.calls if all(c is not a for a in answers)]
    return reply


def reasoning_removed(text: str) -> str:
    """What a reply says, for reading its calls and labels: `<think>…</think>` reasoning blocks removed, and
    everything before a closing tag whose opening one was part of the prompt, and a block never closed (cut
    off while reasoning). An `Action:` or a `Final Answer:` a model wrote while reasoning is a draft it may
    reject in the next line — one was run."""
    if "think>" not in text.lower():
        return text
    cleaned = _react.without_think_blocks(text)
    close = _react.last_match(_THINK_CLOSE_RE, cleaned)
    if close is not None:
        cleaned = cleaned[close.end() :]
    opened = _THINK_OPEN_RE.search(cleaned)
    return cleaned if opened is None else cleaned[: opened.start()]


def native_answer(text: str) -> str:
    """The answer in a native reply without tool calls: reasoning blocks of thinking models
    (`<think>…</think>`) removed, and the text after a `Final Answer:` label when the model wrote one."""
    if "think>" in text.lower():
        cleaned = _react.without_think_blocks(text)
        close = _react.last_match(_THINK_CLOSE_RE, cleaned)
        # the opening tag was part of the prompt: everything before the close is reasoning
        if close is not None:
            cleaned = cleaned[close.end() :]
        elif cleaned.lstrip().lower().startswith("<think>"):  # cut off while reasoning: keep it, untagged
            cleaned = cleaned.lstrip()[len("<think>") :]
        text = cleaned.strip() or text.replace("<think>", "").replace("</think>", "").strip()
    match = _react._FINAL_RE.search(text)
    if match is not None and text[match.end() :].strip():
        return text[match.end() :].strip()
    return text


_CUT_ANSWER = "cut off by its length limit before it ended"


def _cut_answer(run: RunContext, reply: Reply, response: ModelResponse) -> Reply:
    """A final answer in a reply cut off by its token limit may be missing its end (`The total is 1` of
    `… 1,250`): the model is asked once per run for the complete answer; a second cut answer stands."""
    if not reply.text.strip() or _react.told(run.state.messages, _CUT_ANSWER):
        return reply
    return Reply(
        text=response.text,
        problem=f"The reply was {_CUT_ANSWER}, so its answer may be incomplete. Write the complete final "
        "answer again, shorter: leave out the reasoning.",
    )


def _cut_inside_call(response: ModelResponse, said: str) -> bool:
    """Whether a reply holding calls written as text was cut off by its token limit inside the last one's
    arguments (`_react.ends_inside_call`): the call is not run."""
    return response.finish_reason == "length" and _react.ends_inside_call(said)


def _cut_call_problem(name: str) -> str:
    return (
        f"The reply was cut off by its length limit inside the arguments of {name}, so the call was not run "
        "(it would have run with part of them). Send the call again, complete, with a shorter Thought before it."
    )


def _settled(run: RunContext, calls: list[ToolCall]) -> list[ToolCall]:
    """The calls with ids unique in the run (`_unique_ids`) and each tool's own name for a name that is a
    near miss of it (`SHELL`, `functions.shell`: `ToolRegistry.resolve`): the ledger, the loop guards and
    the safety policy's look at earlier calls then see one tool under one name — a near miss hid a call
    from them. The given list when nothing changes (the loop never changes a list of calls in place)."""
    calls = _unique_ids(calls, run.state.step, run.state.ledger)
    tools = run.tools
    renamed: list[ToolCall] | None = None
    for index, call in enumerate(calls):
        if call.name in tools:
            continue
        tool = tools.resolve(call.name)
        if tool is not None:
            renamed = renamed or list(calls)
            renamed[index] = call.model_copy(update={"name": tool.name})
    return calls if renamed is None else renamed


def _unique_ids(calls: list[ToolCall], step: int, taken: Container[str] = ()) -> list[ToolCall]:
    """The calls with non-empty ids unique in the run: results are matched to calls by id, and models
    repeat them — in one reply, and from one step to the next (`call_0` each time), which would overwrite
    an earlier call's ledger entry (`taken`: the ids in it).

    The response's own list when its ids are fine (the loop never changes a list of calls in place)."""
    ids = {c.id for c in calls}
    if len(ids) == len(calls) and "" not in ids and not any(c.id in taken for c in calls):
        return calls
    seen: set[str] = set()
    out = []
    for index, call in enumerate(calls):
        if not call.id or call.id in seen or call.id in taken:
            new_id = f"call_{step}_{index}"
            while new_id in ids or new_id in seen or new_id in taken:
                new_id += "_"
            call = call.model_copy(update={"id": new_id})
        seen.add(call.id)
        out.append(call)
    return out


def _calls_written_as_text(run: RunContext) -> None:
    """Tool calls that came back as text although tools were sent natively: the server does not turn the
    model's calls into tool calls (llama-cpp-python's, a chat template without tool-call markup), and its
    tool results reach the model no better. The calls run, and the rest of the run is in text ReAct at once
    (through llama-cpp-python's server, 9/34 local tasks passed staying native, 16/34 switching here)."""
    if run.state.mode == "native":
        switch_mode(run, "react", "the model writes its tool calls as text: the server does not parse them")


def _note_malformed_native(run: RunContext) -> None:
    if run.state.mode == "native" and run.guards.note_malformed_native(run.state):
        switch_mode(run, "react", "the model kept producing malformed tool calls")


def switch_mode(run: RunContext, mode: Mode, reason: str) -> None:
    previous = run.state.mode
    run.state.mode = mode
    record_list(run.state.metadata, "mode_switches").append(
        {"step": run.state.step, "to": mode, "reason": reason}
    )
    step = run.state.step
    run.emit(lambda: ModeSwitched(step=step, from_mode=previous, to_mode=mode, reason=reason))


def _valid_unicode_reply(reply: Reply) -> Reply:
    """The reply with lone surrogates replaced, and calls whose arguments hold NaN or an infinity, or nest
    deeper than `_json.MAX_DEPTH`, marked as malformed (the state must stay UTF-8 and JSON, and be read
    back)."""
    if not reply.text.isascii():
        reply.text = _json.valid_unicode(reply.text)
    for call in reply.calls:  # plain calls need nothing: name and arguments ASCII, no `NaN`/`Infinity`
        if call.raw_arguments is not None or not call.name.isascii():
            break
        try:  # kept: the guards' signature and the token estimate read it
            text = arguments_json(call.arguments)
        except (ValueError, RecursionError):  # an integer of over 4,300 digits, nesting past recursion
            break
        if not text.isascii() or "NaN" in text or "Infinity" in text:
            break
        if text.count("{") + text.count("[") > _json.MAX_DEPTH and _json.too_deep(call.arguments):
            break
        if not _json.saveable(call.arguments):  # an object a Model of the user's put in (JSON holds no such)
            break
    else:
        return reply  # the common case: nothing that can hold a lone surrogate
    calls = []
    for call in reply.calls:
        kept = None if call.raw_arguments is not None else _unsaveable(call.arguments)
        if kept is not None:  # answered as malformed: a state holding them could not be saved, or read
            call = call.model_copy(update={"arguments": {}, "raw_arguments": kept})
        fields = {"name": call.name, "arguments": call.arguments, "raw_arguments": call.raw_arguments}
        clean = _json.valid_unicode(fields)
        if _json.non_finite(clean["arguments"]):  # `{"x": NaN}` from json.loads: answered as malformed
            clean["raw_arguments"], clean["arguments"] = arguments_json(clean["arguments"]), {}
        calls.append(call.model_copy(update=clean) if clean != fields else call)
    reply.calls = calls  # a new list: the response's own is left as it was
    return reply


def _unsaveable(arguments: dict[str, Any]) -> str | None:
    """For arguments a run state could not hold — nested deeper than `_json.MAX_DEPTH`, or not writable as
    JSON at all (an integer of over 4,300 digits) — the text kept of them instead (the first 2,000
    characters of their JSON, or what is wrong); None for arguments that can be saved."""
    try:
        text = arguments_json(arguments)
    except RecursionError:  # deeper than Python can write
        return "{" * (_json.MAX_DEPTH + 1) + " …"
    except (TypeError, ValueError) as exc:
        why = "an integer has more than 4,300 digits" if "integer string conversion" in str(exc) else str(exc)
        return f"{UNWRITABLE}{why})"[:2000]
    if _json.too_deep(arguments, text):
        return text[:2000]
    if not _json.saveable(_json.valid_unicode(arguments)):  # half an emoji is mended, not refused
        return f"{UNWRITABLE}a value is a Python object, not JSON: {text[:1000]})"
    return None


def _record_reply(run: RunContext, reply: Reply) -> None:
    state = run.state
    state.messages.append(
        new_message(role="assistant", content=reply.text, tool_calls=reply.calls or (), step=state.step)
    )
    if reply.calls and reply.text.strip():
        run.guards.note_thought(state, reply.text)
        if run.observed:
            run.emit(Thought(step=state.step, text=reply.text.strip()))
        else:
            state.event_version += 1  # `run.skip_event()`, inlined: the hot path
    elif reply.calls:
        state.guards.recent_thoughts.clear()  # a step without reasoning breaks a streak


async def _settle_pending(run: RunContext) -> None:
    from ._resume import resume_pending  # `_resume` builds on this module

    await resume_pending(run)


async def final_answer(run: RunContext, answer: str) -> RunResult | None:
    """End the run with the answer; with an output type, an answer that does not validate is sent back to
    the model instead (None), until that has failed too often (the run ends with `error`). An answer that
    only thanks for a tool's result is asked for again, once (`_only_thanks`)."""
    if len(answer) < 200 and run.state.ledger and _only_thanks(answer, run.state.goal):
        if not _react.told(run.state.messages, _THANKS):
            text = f"{_THANKS} Now give the final answer to the task itself, from those results. The task: "
            run.state.messages.append(
                Message.user(text + run.state.goal, kind="correction", step=run.state.step)
            )
            _retract(run, "correction")
            return None
        answer = _best_known(run) or answer  # told once already: what the tools found is the answer
    if run.state.ledger and len(answer) <= 2000:
        compared = _compared(run, answer)
        if compared is None:
            return None
        answer = compared
    problem = check_output(run, answer)
    if problem is None:
        return await finish(run, StopReason.FINAL_ANSWER, answer=answer)
    if ask_output_again(run, problem):
        _retract(run, "correction")
        return None
    what = problem.split(" Give the final answer again", 1)[0]  # the instructions were for the model
    error = f"the final answer did not match the output type: {what}"
    return await finish(run, StopReason.ERROR, answer=answer, error=error)


def _compared(run: RunContext, answer: str) -> str | None:
    """The answer, its comparison put right when the results contradict it and the model was told once
    already; None when it is sent back (`comparison_check`: "gizmo is cheaper than widget"; with answer
    checks on, `choice_check`: the wrong one of the options the task names, by the values separate calls
    gave them)."""
    checked = _react.comparison_check(answer, _results(run))
    if checked is not None:
        return None if _send_back(run, checked[0], _react.COMPARED) else checked[1]
    if _checks_answers(run):
        chosen = _choice.choice_check(answer, run.state.goal, _calls(run))
        if chosen is not None and _send_back(run, chosen, _choice.CHOSEN):
            return None
        if chosen is not None:  # told once already: the pick is put right where it can be
            return _choice.righted_choice(answer, run.state.goal, _calls(run))
    return answer


def _calls(run: RunContext) -> list[_choice.Call]:
    """The successful tool calls of the run, with their results."""
    return [
        _choice.Call(e.name, e.arguments, e.output)
        for e in run.state.ledger.values()
        if e.success and e.output is not None
    ]


def _results(run: RunContext) -> list[str]:
    return [m.content for m in run.state.messages if m.role == "tool"]


def _send_back(run: RunContext, correction: str, marker: str) -> bool:
    """Send an answer back with `correction` (and the task), once per run: False when a correction with
    `marker` was sent already. An answer whose comparison the tool results contradict ("gizmo is cheaper
    than widget" beside gizmo 19.99 EUR and widget 12.75 EUR: `comparison_check`) is sent back so."""
    messages = run.state.messages
    if _react.told(messages, marker):
        return False
    messages.append(
        Message.user(f"{correction} The task: {run.state.goal}", kind="correction", step=run.state.step)
    )
    _retract(run, "correction")
    return True


_THANKS = "Your reply only acknowledged the results: they came from the tools you called, not from a person."
_THANKS_START = re.compile(
    r"(?i)\W*(thanks?|thank you|you'?re welcome|glad|happy to help|i hope|hope this)\b"
)
_THANKS_TEXT = (  # the words of thanks and pleasantries (`_only_thanks`)
    "thank thanks you your you're youre welcome great perfect glad happy to help helps helped i hope this "
    "that it for providing sharing giving the a result results information info answer calculation data "
    "output response me with so much very let know if need anything else more questions question have any "
    "further again all of and is was be can could assist there"
)
_THANKS_WORDS = frozenset(_THANKS_TEXT.split())
_WORD_RE = re.compile(r"[a-z']+")


def _only_thanks(answer: str, goal: str) -> bool:
    """A reply of thanks and pleasantries only ("Thank you for providing the result."): a small model took
    a tool's result for a person's message. Any other word, or a digit, makes it an answer; so does a goal
    that speaks of thanks."""
    text = answer.lower()
    if not _THANKS_START.match(text) or any(c.isdigit() for c in text):
        return False
    if "thank" in goal.lower() or "welcome" in goal.lower():
        return False
    words = _WORD_RE.findall(text.replace("\u2019", "'"))
    return bool(words) and all(w.strip("'") in _THANKS_WORDS for w in words)


async def ended_by_cancellation(run: RunContext) -> None:
    """An interrupted run (`Agent.interrupt`) is saved resumable; any other cancellation finishes it."""
    if run.interrupted:
        await suspend(run)
    else:
        await finish(run, StopReason.CANCELLED, error="the run was cancelled")


async def finish_unreadable(run: RunContext, reply: Reply) -> RunResult:
    """End the run with `error` after too many replies that could not be understood (healing failed)."""
    return await finish(
        run,
        StopReason.ERROR,
        answer=_best_known(run) or _react._strip_label(_final_text(reply.text), _react._THOUGHT_RE),
        error=f"the model's replies could not be understood: {reply.problem}",
    )


def heal(run: RunContext, reply: Reply) -> bool:
    """Ask the model to correct an unreadable reply; False when healing has failed too often."""
    if run.guards.note_heal(run.state, malformed=True):
        return False
    names = ", ".join(run.visible_names())
    planned = reply.problem in (_react.PLAN_ONLY, _react.PLAN_ONLY_NATIVE)
    task = f" The task: {run.state.goal}" if planned else ""
    problem = reply.problem or ""
    corrected = (
        any(marker in problem for marker in (_react.UNSOURCED, _react.LAUNDERED, _react.SUPERLATIVE))
        or problem == _react.PLAN_ONLY_NATIVE
    )
    lead = "needs a correction" if corrected else "could not be understood"
    if run.state.mode == "native":  # the ReAct lines would teach it to write its calls as text
        choice = f"Either call one of your tools ({names}), or reply" if names else "Reply"
        text = f"Your last reply {lead}: {reply.problem}{task} {choice} with the complete final answer."
    else:
        text = (
            f"Your last reply {lead}: {reply.problem}{task} Reply either with\n"
            f"Thought: ...\nAction: <the tool name, one of: {names}>\n"
            "Action Input: <the tool's arguments as a JSON object>\n"
            "or with\nFinal Answer: your answer"
        )
    run.state.messages.append(Message.user(text, kind="correction", step=run.state.step))
    return True


def check_output(run: RunContext, answer: str) -> str | None:
    """With an output type: validate the final answer (kept in `run.parsed`); what is wrong, or None."""
    if run.output is None:
        return None
    run.parsed, problem = run.output.parse(answer, react=run.state.mode == "react")
    return problem


def ask_output_again(run: RunContext, problem: str) -> bool:
    """Tell the model why its final answer cannot be used; False when that has failed too often. In text
    ReAct the answer is shown with its 'Final Answer:' label (as the model wrote it: the history keeps the
    answer alone), so the model sees the form to keep and the part to change."""
    if run.guards.note_heal(run.state, malformed=True):
        return False
    messages = run.state.messages
    if run.state.mode == "react" and messages and messages[-1].role == "assistant":
        last = messages[-1]
        if not last.tool_calls and not last.content.lstrip().startswith(_react.FINAL_LABEL):
            messages[-1] = last.model_copy(update={"content": f"{_react.FINAL_LABEL} {last.content.strip()}"})
    text = f"Your final answer cannot be used: {problem}"
    run.state.messages.append(Message.user(text, kind="correction", step=run.state.step))
    return True


async def act(run: RunContext, calls: list[ToolCall]) -> list[ToolOutcome]:
    """Run one reply's tool calls; repeats the guards block are answered without running."""
    state = run.state
    state.phase = "acting"
    blocked = run.guards.screen(state, calls)
    plan_calls(run, calls, blocked)  # saved with the first tool's start, or before an approval wait
    if not blocked:
        outcomes = await execute_calls(run, calls)
        state.tool_calls += len(calls)
        return outcomes
    runnable = [c for c in calls if c.id not in blocked]
    executed = {o.call.id: o for o in await execute_calls(run, runnable)} if runnable else {}
    outcomes = []
    for call in calls:
        if call.id in blocked:
            run.emit(functools.partial(ToolCallEvent, step=state.step, call=call, decision="blocked"))
            outcomes.append(
                ToolOutcome(call, blocked[call.id], False, error_kind="repeated_call", decision="blocked")
            )
        else:
            outcomes.append(executed[call.id])
    state.tool_calls += len(runnable)
    return outcomes


def plan_calls(run: RunContext, calls: list[ToolCall], blocked: dict[str, str]) -> None:
    """Record a reply's calls in the ledger before anything runs: planned, or done if the guards blocked it."""
    ledger, step = run.state.ledger, run.state.step
    for call in calls:
        entry = new_ledger_entry(
            call_id=call.id, name=call.name, arguments=call.arguments, step=step, status="planned"
        )
        if blocked and call.id in blocked:
            entry.status, entry.output, entry.success = "done", blocked[call.id], False
            entry.error_kind = "repeated_call"
        ledger[call.id] = entry


def observe(run: RunContext, outcomes: list[ToolOutcome]) -> None:
    """Record each result as a tool message, update the guards, add a hint when due (saved by the caller)."""
    state, guards, step = run.state, run.guards, run.state.step
    repeats = guards.observe(
        state, outcomes
    )  # the heal count too: a step of only malformed calls is a failed heal
    for outcome in outcomes:
        text, call = outcome.output, outcome.call
        if repeats and call.id in repeats:  # a successful call that repeats an earlier one, result included
            text = f"{text}\n\n{guards.config.hint('repeat_note')}"
        elif call.name == "calculator" and outcome.success:
            text += _made_up_note(run, call)
        elif outcome.success and ":" in text and len(text) < 4000 and _ID_LINE_RE.search(text):
            text += _fetch_note(run, call, text)
        state.messages.append(
            new_message(role="tool", content=text, tool_call_id=call.id, name=call.name, step=step)
        )
        if run.observed:
            run.emit(_result_event(step, outcome))
        else:
            state.event_version += 1  # `run.skip_event()`, inlined: the hot path
    hint = guards.hint(state, run.config.budget.max_steps)
    if hint is not None:
        text, reason = hint
        if reason in _STUCK_HINTS:
            text += _untried_tools(run)
        state.messages.append(Message.user(text, kind="hint", step=step))
        run.emit(lambda: Hint(step=step, text=text, reason=reason))


_ID_LINE_RE = re.compile(r"(?m)^[ \t]*(?:[-*][ \t]+)?([A-Z][A-Z0-9]{0,7}-[A-Z0-9]{1,10}):[ \t]+\S")
_ID_PARAM_RE = re.compile(r"(?:^|_)id$", re.IGNORECASE)


def _fetch_note(run: RunContext, call: ToolCall, text: str) -> str:
    """After a result listing ids with titles (`KB-17: Resetting your password`), when another tool takes
    such an id and was not called with one of them yet: a note naming that tool and how to call it (the
    1.5B model read a search result's title as the whole article, "it doesn't specify the validity time",
    and never called read_article). "" otherwise."""
    lines = [line for line in text.splitlines() if line.strip()]
    listed = [line for line in lines if _ID_LINE_RE.match(line)]
    if not 0 < len(listed) <= 20 or 2 * len(listed) < len(lines) or any(len(line) > 120 for line in listed):
        return ""  # a list of ids with titles, not records (`ORD-1: shipped on … via DHL, …` is whole)
    ids = list(dict.fromkeys(_ID_LINE_RE.findall(text)))
    takers = []
    for definition in run.visible_definitions():
        if definition.name == call.name:
            continue
        required = definition.parameters.get("required") or []
        param = next((r for r in required if isinstance(r, str) and _ID_PARAM_RE.search(r)), None)
        if param is not None and len(required) == 1:
            takers.append((definition.name, param))
    if not takers or len(takers) > 3:
        return ""
    for entry in run.state.ledger.values():  # one of them was read already
        if any(entry.name == name and entry.arguments.get(param) in ids for name, param in takers):
            return ""
    calls = " or ".join(f"{name} with {json.dumps({param: ids[0]})}" for name, param in takers)
    return f"\n\nNote: this lists ids and names only, not what they hold. Next, call {calls} to read one."


_STUCK_HINTS = frozenset({"similar_errors", "repeated_error", "change_approach"})


def _untried_tools(run: RunContext) -> str:
    """For a hint to a model stuck on failing calls: the tools it has not called yet (the 1.5B model
    guessed 'Project X', 'Project Y' … for get_project past the hint, never calling get_ticket, the
    chain's first step). "" when it has called them all, or when there are many."""
    called = {entry.name for entry in run.state.ledger.values()}
    untried = [name for name in run.visible_names() if name not in called]
    return f" Tools not called yet: {', '.join(untried)}." if 0 < len(untried) <= 8 else ""


def _made_up_note(run: RunContext, call: ToolCall) -> str:
    """After a calculator call none of whose numbers the task or an earlier result gives, when other tools
    could have looked them up: a note saying so (the 1.5B model sent `(100 - 90) * 100` for a price
    difference before looking a price up, and `1000 * 2` after "no products match"). "" otherwise."""
    expression = call.arguments.get("expression")
    others = [n for n in run.visible_names() if n != "calculator"]
    if not isinstance(expression, str) or not others or len(expression) > 500:
        return ""
    given = [run.state.goal, *(m.content for m in run.state.messages if m.kind in ("task", "memory"))]
    results = [(m.tool_call_id, m.content) for m in run.state.messages if m.role == "tool"]
    numbers = _react.computed_from_nowhere(expression, _sources(run, given, results))
    if not numbers:
        return ""
    note = run.guards.config.hint(
        "made_up_numbers", numbers=", ".join(numbers[:4]), tools=", ".join(others[:8])
    )
    return f"\n\n{note}" if note else ""  # a replacement text of "" turns it off


def _result_event(step: int, o: ToolOutcome) -> ToolResultEvent:
    return ToolResultEvent(
        step=step, call_id=o.call.id, name=o.call.name, output=o.output, success=o.success,
        duration=o.duration, error_kind=o.error_kind, truncated=o.truncated, decision=o.decision,
    )  # fmt: skip


# ============================================================================================= endings


async def finish_forced(run: RunContext, reason: StopReason) -> RunResult:
    """A hard stop: one last call without tools for a best-effort answer (SPEC §4.8), then finish."""
    why = run.config.budget.describe(reason) if reason.is_budget else run.guards.describe(reason, run.state)
    if not (reason.gets_final_answer_call and run.config.final_answer_on_stop):
        return await finish(run, reason, answer=_best_known(run), error=why)
    state = run.state
    prompt = final_answer_prompt(
        run.config.final_answer_prompt,
        reason=why,
        goal=state.goal,
        facts=_known_facts(run),
        failures=_failed_calls(run),
    )
    if run.output is not None and run.output.rule:
        prompt = f"{prompt}\n{run.output.rule}"
    if state.messages and state.messages[-1].kind == "final_prompt":
        state.messages.pop()  # the prompt of a final call interrupted (then resumed): asked once, anew
    state.messages.append(Message.user(prompt, kind="final_prompt", step=state.step))
    try:
        request = build_request(run, final=True)
        answer = _forced_answer(run, await _final_call(run, request))
    except (ModelError, TimeoutError) as exc:
        return await finish(
            run, reason, answer=_best_known(run), error=f"{why} The final-answer call failed: {exc}"
        )
    if _checks_answers(run) and reason not in (StopReason.MAX_TOKENS, StopReason.MAX_COST):
        answer = await _recheck_forced(run, request, answer)
    if state.ledger and len(answer) <= 2000:  # no second chance: a contradicted comparison is put right
        answer = _react.righted_comparison(answer, _results(run))
        if _checks_answers(run):
            answer = _choice.righted_choice(answer, state.goal, _calls(run))
    check_output(run, answer)  # a best effort: kept as `parsed` when it validates, never asked again
    state.messages.append(Message.assistant(answer, step=state.step))
    state.forced_final = True
    return await finish(run, reason, answer=answer, error=why)


async def _final_call(run: RunContext, request: ModelRequest) -> ModelResponse:
    started = time.perf_counter()
    deadline = run.deadline
    try:
        if deadline is None:
            response = await run.model.request(request)
        else:
            response = await run.deadlines.within(deadline, run.model.request(request))
    except Exception as exc:
        raise model_failure(run, exc)  # noqa: B904 - model_failure sets the cause (or it is exc itself)
    _account(run, request, response, started, final=True)
    return response


async def _recheck_forced(run: RunContext, request: ModelRequest, answer: str) -> str:
    """A forced answer whose numbers neither the task nor a successful tool result gives is asked for again,
    once, naming them (in ReAct, like `_unsourced`; not after a token or cost budget stop): the second
    answer stands; the first does when the second call fails or replies with a tool call."""
    given = [run.state.goal, *(m.content for m in run.state.messages if m.kind in ("task", "memory"))]
    done = [
        (e.call_id, e.output or "") for e in run.state.ledger.values() if e.status == "done" and e.success
    ]
    sources = _sources(run, given, done)
    answer = _react.corrected_arithmetic(answer, answer, sources)
    correction = _react.forced_correction(answer, sources)
    if correction is None:
        return answer
    asked = [
        Message.assistant(answer, step=run.state.step),
        Message.user(correction, kind="correction", step=run.state.step),
    ]
    run.state.messages.extend(asked)
    retry = ModelRequest(
        messages=[*request.messages, *asked], settings=request.settings, run_id=request.run_id,
        turn=run.state.usage.requests,
    )  # fmt: skip
    try:
        return _forced_answer(run, await _final_call(run, retry), fallback=answer)
    except (ModelError, TimeoutError):
        return answer


def _final_text(text: str) -> str:
    match = _react._FINAL_RE.search(text)
    return (text[match.end() :] if match else _react._cut_invented_observation(text)).strip()


def _forced_answer(run: RunContext, response: ModelResponse, fallback: str | None = None) -> str:
    """The forced final answer; `fallback` (default: the best known result) when the model replied with a
    tool call again."""
    text = _final_text(response.text)
    acting = _react._ACTION_RE.search(text) or _react._bare_json_call(text, run.tools.names, "final")
    if response.tool_calls or not text or acting:
        return (_best_known(run) if fallback is None else fallback) or text
    prompt = next((m.content for m in reversed(run.state.messages) if m.kind == "final_prompt"), "")
    kept = _react.drop_copied_lines(text, prompt) if prompt else text
    return _react.requested_form(kept, run.state.goal) if _checks_answers(run) else kept


def _checks_answers(run: RunContext) -> bool:
    """Whether final answers are checked against the tool results (`GuardConfig.answer_checks`)."""
    setting = run.guards.config.answer_checks
    return run.state.mode == "react" if setting is None else setting


def _known_facts(run: RunContext, limit: int = 12) -> list[str]:
    """`name(arguments) -> result` of the distinct successful tool calls, the most relevant to the goal
    last (nearest the restated task: small models lean on what they read last), ties by recency."""
    facts: dict[str, tuple[int, str, float]] = {}
    goal = _words(run.state.goal)
    for order, entry in enumerate(run.state.ledger.values()):
        if entry.status == "done" and entry.success and entry.output:
            args = json.dumps(entry.arguments, ensure_ascii=False)
            call = f"{entry.name}({args[:200]})"
            words = _words(args)
            relevance = len(words & goal) / len(words) if words else 0.0
            # JSON shown with its characters ("Kovač"), as the model saw it during the run
            result = _react.readable_json(entry.output)[:1000]
            facts[call] = (order, f"{call} -> {result}", relevance)
    recent = sorted(facts.values())[-limit:]
    return [text for _, text, _ in sorted(recent, key=lambda f: (f[2], f[0]))]


def _failed_calls(run: RunContext, limit: int = 6) -> list[str]:
    """`name(arguments) failed: error` of the distinct calls that failed and never succeeded later (the
    latest `limit`): a model asked for its best answer should say what could not be found, not invent it."""
    worked = {
        (e.name, json.dumps(e.arguments, sort_keys=True)) for e in run.state.ledger.values() if e.success
    }
    failed: dict[str, str] = {}
    for entry in run.state.ledger.values():
        key = (entry.name, json.dumps(entry.arguments, sort_keys=True))
        if entry.status != "done" or entry.success or entry.error_kind == "repeated_call" or key in worked:
            continue
        call = f"{entry.name}({json.dumps(entry.arguments, ensure_ascii=False)[:200]})"
        error = " ".join((entry.output or "no result").split())[:240]
        failed.pop(call, None)  # the latest failure of a call comes last
        failed[call] = f"{call} failed: {error}"
    return list(failed.values())[-limit:]


def _words(text: str) -> set[str]:
    """Lower-case words, numbers and operator signs (so `17*23` and `17 * 23` share all three)."""
    return set(re.findall(r"[a-z]+|\d+(?:\.\d+)?|[-+*/^%=<>]", text.lower()))


def _best_known(run: RunContext) -> str:
    """Without a usable final answer: the output of the last successful tool call (by the ledger), if any."""
    for entry in reversed(run.state.ledger.values()):
        if entry.status == "done" and entry.success and entry.output:
            return entry.output
    return ""


async def suspend(run: RunContext) -> None:
    """An interrupted run (`Agent.interrupt`) is saved as it is, unfinished: `Agent.resume()` continues it
    like a run whose process stopped, with the ledger deciding about a tool call that was running."""
    run.deadlines.close()
    state = run.state
    if not run.save_interrupted:
        return
    if (
        state.step
        and state.phase == "thinking"
        and not (state.messages and state.messages[-1].step == state.step)
    ):
        state.step -= 1  # the step had not got its reply: it is taken again on resume
    state.metadata["interrupted"] = {"step": state.step, "at": time.time()}
    try:
        await run.checkpoint()
    except Exception as exc:  # e.g. another process took the run over: its state is not ours to save
        logger.warning("saving interrupted run %s failed (%s: %s)", state.run_id, type(exc).__name__, exc)


async def ended_by_error(run: RunContext, error: RunError) -> RunResult:
    """A `RunError` ends the run with `error` — unless the store failed (a `StateError`): that is not the
    run's failure, so it stops unfinished and resumable (`store_failed`), and the error is raised."""
    if isinstance(error, StateError):
        raise await store_failed(run, error) from error
    return await finish(run, StopReason.ERROR, error=str(error))


async def store_failed(run: RunContext, error: StateError) -> StateError:
    """The error to raise when the store could not save the run (SPEC §9): a run that had ended keeps its
    stop reason (`finish` says its final state could not be saved). Any other run stops unfinished, as
    if its process had stopped — a tool whose start could not be saved did not run — so that it can be
    resumed once the store works again; one more save is tried first (the store may be back already: the
    resume then starts from the latest results)."""
    run.deadlines.close()
    state = run.state
    if state.finished:
        return error
    run.emit(lambda: ErrorEvent(message=str(error), stopped=True))
    if not _json.saveable(_json.valid_unicode(state.model_dump())):  # not the store: the state itself
        return StateError(
            f"{error} — run {state.run_id} stopped unfinished at step {state.step}: its state holds a value "
            "that cannot be written as JSON (an object put in it by a hook, a tool's context or a Model of "
            f"your own); agent.resume({state.run_id!r}) continues it from its last checkpoint",
            state=state,
        )
    try:
        await run.checkpoint()
        saved = "as it is now"
    except Exception as exc:  # still failing: the last checkpoint that was saved is where it resumes
        logger.warning("saving run %s after its store failed failed again: %s", state.run_id, exc)
        saved = "from its last checkpoint"
    return StateError(
        f"{error} — run {state.run_id} stopped unfinished at step {state.step}: once the store works, "
        f"agent.resume({state.run_id!r}) continues it {saved}, without running a finished tool call again",
        state=state,
    )


async def finish(
    run: RunContext, reason: StopReason, *, answer: str = "", error: str | None = None
) -> RunResult:
    """End the run with exactly one stop reason; save it; emit `done` (and `error` first on errors)."""
    run.deadlines.close()
    state = run.state
    state.stop_reason = reason
    state.answer = answer
    state.error = error if reason is not StopReason.FINAL_ANSWER else None
    state.phase = "error" if reason in (StopReason.ERROR, StopReason.CANCELLED) else "done"
    state.ended_at = time.time()
    state.elapsed = run.elapsed
    if run.config.stream:
        _stream_answer(run, answer)
    if reason is StopReason.ERROR:
        run.emit(ErrorEvent(message=error or "error"))
    result = RunResult.from_state(state)
    result.parsed = run.parsed
    if run.observed:
        run.emit(Done(result=result))
    else:
        state.event_version += 1  # `run.skip_event()`, inlined: every run
    try:
        await run.checkpoint()
    except StateError as exc:  # the store failed: nothing is lost, the final state goes with the error
        raise StateError(
            f"{exc} — the run ended ({reason.value}) but its final state could not be saved: it is in this "
            "error's `state` (RunResult.from_state(error.state) gives the result)",
            state=state,
        ) from exc
    return result
