"""`Agent`: configuration of an agent, and the entry points `run`, `run_sync`, `stream`."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import inspect
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, Literal

from . import _aio, _json
from ._budget import Budget, PriceTable
from ._context import DEFAULT_MAX_CONTEXT_TOKENS, ContextManager, Summarizer
from ._discovery import ToolDiscovery
from ._errors import ConcurrencyError, ConfigurationError, UserError
from ._events import Done, ErrorEvent, Event, RunResult, RunStarted
from ._execute import AllowAll, ToolGate
from ._guards import GuardConfig, Guards
from ._loop import (
    Checkpointer,
    EventSink,
    LoopConfig,
    RunContext,
    current_run,
    new_run_context,
    run_loop,
    suspend,
)
from ._messages import Message, ModelSettings
from ._output import OutputSpec
from ._prompt import DEFAULT_RULES, template_problem
from ._resume import load_resumable, memory_messages
from ._state import Mode, RunState, StopReason, new_run_state, record_list, unsaved_metadata
from ._tokens import TokenCounter, TokenCounterLike, as_counter
from ._tools import Tool, ToolRegistry
from .experience import Learner, RunRecord
from .mcp import MCPServer, registry_with_mcp
from .models import MODEL_VARIABLE, PROVIDERS, Model, resolve_model, variable_error
from .models import _unknown as unknown_model_message
from .stores._base import Store, check_goal, check_id
from .stores._memory import InProcessStore

ModeSetting = Literal["auto", "native", "react"]
logger = logging.getLogger("thinkloop.agent")
RECALL_TIMEOUT = 10.0  # seconds a learner may take to recall lessons before a run starts without them
LEARN_TIMEOUT = 30.0  # seconds a learner may take to learn from a finished run (SPEC §11.1)


def _kind(value: object) -> str:
    return "None" if value is None else f"{value!r} (of type {type(value).__name__})"


def _check_numbers(
    tool_timeout: object,
    output_max_length: object,
    max_context_tokens: object,
    retries: object,
    lessons: object,
) -> None:
    """The agent's numbers, checked as `Tool()` checks a tool's: `True`, `2.5` characters or a NaN timeout
    were taken, and cut every observation to nothing or waited for ever."""
    if isinstance(tool_timeout, bool) or not isinstance(tool_timeout, int | float) or not tool_timeout > 0:
        raise ConfigurationError(
            f"tool_timeout must be a positive number of seconds, not {_kind(tool_timeout)}"
        )
    whole = {"output_max_length": (output_max_length, 1), "model_retries": (retries, 0),
             "lessons_limit": (lessons, 0), "max_context_tokens": (max_context_tokens, None)}  # fmt: skip
    for name, (value, least) in whole.items():
        if isinstance(value, bool) or not isinstance(value, int) or (least is not None and value < least):
            what = "a whole number" if least is None else "a positive whole number" if least else "0 or more"
            raise ConfigurationError(f"{name} must be {what}, not {_kind(value)}")


def _check_texts(*, rules: object, **texts: object) -> None:
    for name, value in texts.items():
        if not isinstance(value, str):
            raise ConfigurationError(f'{name} must be a string ("" for none), not {_kind(value)}')
    if isinstance(rules, str) or not isinstance(rules, Iterable):
        raise ConfigurationError(f"rules must be a list of strings, one rule each, not {_kind(rules)}")
    bad = next((rule for rule in rules if not isinstance(rule, str)), None)
    if bad is not None:
        raise ConfigurationError(f"rules must be a list of strings, one rule each; it holds {_kind(bad)}")


_PARTS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "budget": (Budget, "Budget(max_steps=16)"),
    "settings": (ModelSettings, "ModelSettings(temperature=0)"),
    "guards": (GuardConfig, "GuardConfig(...)"),
    "price_table": (PriceTable, "PriceTable({...})"),
    "discovery": (ToolDiscovery, "ToolDiscovery(catalogue)"),
    "final_answer_prompt": (str, "a string"),
}
_HOOKS: dict[str, tuple[str, str]] = {  # an object with this method
    "safety": ("check", "SafetyController('strict', approval=...) from thinkloop.safety"),
    "store": (
        "checkpoint",
        "SQLiteStore('runs.db') from thinkloop.stores, or open_store('sqlite:///runs.db')",
    ),
    "experience": ("recall", "LessonBook('lessons.jsonl') from thinkloop.experience"),
}


def _check_parts(**parts: object) -> None:
    """The agent's parts, each of the kind it must be (None: the default): a `budget=5`, a
    `safety="strict"` or a `store="memory:"` failed later, inside a run, with an AttributeError."""
    for name, value in parts.items():
        if value is None:
            continue
        if name in _PARTS:
            kind, example = _PARTS[name]
            if not isinstance(value, kind):
                raise ConfigurationError(f"{name} must be {example}, not {_kind(value)}")
        elif name in _HOOKS:
            method, example = _HOOKS[name]
            if not callable(getattr(value, method, None)):
                raise ConfigurationError(f"{name} must be an object like {example}, not {_kind(value)}")
        elif not callable(value):
            raise ConfigurationError(f"{name} must be a function (or None), not {_kind(value)}")


def _check_sink(sink: EventSink | None) -> EventSink | None:
    """An `async def` listener would never run (listeners are called, not awaited): refused at once; so is
    one that is no function at all (it failed at the first event, inside the run)."""
    if sink is not None and not callable(sink):
        raise ConfigurationError(
            f"on_event must be a function taking each event (or None), not {_kind(sink)}; e.g. "
            "on_event=print, or use `agent.stream()`"
        )
    if sink is not None and (
        inspect.iscoroutinefunction(sink) or inspect.iscoroutinefunction(type(sink).__call__)
    ):
        raise ConfigurationError(
            f"on_event={sink!r} is an async function: listeners are called, not awaited, so it would never "
            "run. Pass a plain function (it may do `queue.put_nowait(event)`), or use `agent.stream()`"
        )
    return sink


def _check_budget(budget: object) -> None:
    """A run's `budget=`: a `budget=5` failed inside the run with an AttributeError."""
    if budget is None or isinstance(budget, Budget):
        return
    meant = (
        f" (did you mean Budget(max_steps={budget})?)"
        if isinstance(budget, int) and not isinstance(budget, bool)
        else ""
    )
    raise ConfigurationError(
        f"budget must be a Budget, e.g. Budget(max_steps=16), or None for the agent's, not {_kind(budget)}{meant}"
    )


def _check_variable() -> None:
    """`$THINKLOOP_MODEL`'s spelling, when the agent names no model (blank: the local model)."""
    variable = os.environ.get(MODEL_VARIABLE, "").strip()
    if variable:
        try:
            _check_model(variable)
        except ConfigurationError as exc:
            raise variable_error(variable, exc) from exc


def _check_model(model: object) -> None:
    """A model string is read when the model is first needed (loading the local model is slow), but a
    wrong one — a bare name like "gpt-4o", an unknown provider — is refused now: it failed at the first
    run, far from the line that made the agent. Only the spelling is checked here, nothing is loaded;
    no model named (None, a blank string), `$THINKLOOP_MODEL`'s is."""
    if model is None or (isinstance(model, str) and not model.strip()):
        _check_variable()
    elif isinstance(model, str):
        text = model.strip()
        provider, colon, name = text.partition(":")
        provider, name = provider.strip().lower(), name.strip()
        if text and provider not in PROVIDERS:
            raise ConfigurationError(unknown_model_message(text, provider, name if colon else None))
        if provider == "router":
            for part in (p for p in name.split(",") if p.strip()):
                _check_model(part)
    elif isinstance(model, Sequence) and not isinstance(model, bytes | bytearray):
        if not model:
            raise ConfigurationError(
                "the list of models is empty: give at least one, e.g. Agent(['openai:gpt-4o-mini', 'local'])"
            )
        for each in model:
            if not isinstance(each, str | Model):
                raise ConfigurationError(
                    f"a list of models holds model strings or Models, not {_kind(each)}; "
                    "e.g. Agent(['openai:gpt-4o-mini', 'local'])"
                )
            _check_model(each)
    elif model is not None and not isinstance(model, Model):
        raise ConfigurationError(
            f"model must be a model string, a Model or a list of them (None: $THINKLOOP_MODEL or 'local'), "
            f"not {_kind(model)}; e.g. Agent('local') or Agent('openai:gpt-4o-mini')"
        )


def _mcp_servers(servers: object) -> list[MCPServer]:
    """`mcp_servers=`: MCP servers, in a list (one alone is taken as meant); a URL or a command line as
    text, or anything else, failed at the first run with an AttributeError."""
    if isinstance(servers, MCPServer):
        return [servers]
    if isinstance(servers, str | bytes) or not isinstance(servers, Iterable):
        raise ConfigurationError(
            f"mcp_servers must be a list of MCP servers (MCPServerStdio(...), MCPServerHTTP(...) from "
            f"thinkloop.mcp), not {_kind(servers)}"
        )
    found = list(servers)
    bad = next((server for server in found if not isinstance(server, MCPServer)), None)
    if bad is not None:
        raise ConfigurationError(
            f"mcp_servers must hold MCP servers (MCPServerStdio(...), MCPServerHTTP(...) from "
            f"thinkloop.mcp); it holds {_kind(bad)}"
        )
    return found


def _check_answer_settings(final_answer_on_stop: object, output_validator: object) -> None:
    if not isinstance(final_answer_on_stop, bool):
        raise ConfigurationError(
            f"final_answer_on_stop must be True or False, not {_kind(final_answer_on_stop)}"
        )
    if output_validator is None:
        return
    if not callable(output_validator):
        raise ConfigurationError(
            f"output_validator must be a function of the final answer (or None), not {_kind(output_validator)}"
        )
    if inspect.iscoroutinefunction(output_validator) or inspect.iscoroutinefunction(
        getattr(output_validator, "__call__", None)  # noqa: B004  # an object with an async __call__
    ):
        raise ConfigurationError(
            f"output_validator={output_validator!r} is an async function: it is called, not awaited, so "
            "its coroutine would be taken as the answer. Pass a plain function that returns the answer or "
            "raises ValueError"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class _Shared:
    """Per-agent objects every run uses read-only."""

    model: Model
    tools: ToolRegistry
    counter: TokenCounter
    context_limit: int
    prompt_layers: dict[str, Any]
    gate: ToolGate
    shown: dict[Any, Any] = dataclasses.field(default_factory=dict)  # system message + tools by mode/names
    reserves: dict[Any, int] = dataclasses.field(default_factory=dict)  # their tokens


class Agent:
    """An agent's configuration: a model, tools, instructions, budgets, guards, safety and storage.

    An `Agent` holds no run state: every `run()` gets its own, so one agent serves many concurrent runs.

    Args:
        model: a `Model`, or a model string: `"local"` (the default: the embedded local model),
            `"local:0.5b"`, `"openai:gpt-4o-mini"`, `"script:replies.json"`; a list of them (or
            `"router:SPEC,SPEC"`) makes a `RouterModel` with retries and fallback.
        tools: `Tool`s or plain functions (made into tools with `@tool`); None or a single tool are accepted too.
        instructions: the role layer of the system prompt.
        budget: the limits of each run (`Budget(max_steps=16)` by default).
        mode: `"native"` tool calling, `"react"` text, or `"auto"` (native when the model supports tools).
        settings: sampling settings (temperature 0.3, max output tokens 4096 by default).
        environment, rules: more layers of the system prompt.
        tool_timeout, output_max_length: defaults for tools that do not set their own.
        max_context_tokens: the context window to keep the history within (≤ 0 means 8,000); never
            more than the model's own window minus room for the reply (a quarter of it, at most
            `settings.max_output_tokens`).
        token_counter: how the context manager counts tokens: a `TokenCounter` or a function
            `(messages) -> int`; by default the model's own tokenizer, else the estimate chars/3 + 1.
        summarizer: an async `(messages, previous_summary) -> str` that summarises the steps dropped
            from the context; by default a deterministic summary (tool calls and result snippets).
        guards: settings of the loop guards and checkpoint hints.
        safety: the gate every tool call passes (a `SafetyController`); None lets every call run.
        store: where runs are checkpointed (a `Store`); None keeps them in this process's memory
            (an `InProcessStore`: the live state of at most 1,000 runs, forgetting the oldest finished
            ones, and the session memory; no event log), enough for `resume()` and `session=` within
            the process.
        model_retries: how often a transient model failure (429, 5xx, timeout, lost connection) is
            retried with exponential backoff or the provider's Retry-After (2; a `RouterModel` retries
            itself instead).
        final_answer_on_stop: on a hard stop, make one last call for a best-effort answer.
        final_answer_prompt: the text of that call, in place of the default; `{reason}`, `{goal}` and
            `{facts}` (the tool calls that worked and failed, appended when it has no such placeholder)
            are filled in; write `{{` and `}}` for a literal brace. A text that cannot be filled in is
            refused when the agent is made.
        on_event: a callback receiving every event of every run.
        discovery: runtime tool discovery (`ToolDiscovery`): the model is shown only a few tools plus
            `discover_tools`, which finds the others in the catalogue when needed.
        mcp_servers: MCP servers whose tools are added to every run. `async with agent:` opens and
            closes them; otherwise the first run connects them and `await agent.aclose()` closes them.
        experience: a `Learner` (e.g. `LessonBook`): lessons relevant to each goal go into the system
            prompt, and every finished run is handed to it in the background to learn from
            (`await agent.wait_for_learning()` waits for that; `run_sync` does it before returning).
        lessons_limit: the most lessons put into one run's prompt.
        output_type: what the final answer must be — a pydantic model, a dataclass, a TypedDict or a type
            such as `list[str]`: the model is told its JSON Schema, the answer is validated (one that does
            not validate goes back to the model with the errors) and `result.parsed` holds the value.
        output_validator: a function of the final answer (the `output_type` value, or the text) that
            returns it (possibly changed) or raises `ValueError`, whose message goes back to the model
            (a heal) — checks a schema cannot express, e.g. "the total must equal the sum of the items".
    """

    def __init__(
        self,
        model: str | Model | Sequence[str | Model] | None = None,
        *,
        tools: Iterable[Tool | Callable[..., Any]] | Tool | None = (),
        instructions: str = "",
        name: str = "agent",
        budget: Budget | None = None,
        mode: ModeSetting = "auto",
        settings: ModelSettings | None = None,
        environment: str = "",
        rules: Sequence[str] = DEFAULT_RULES,
        tool_timeout: float = 120.0,
        output_max_length: int = 10_000,
        max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS,
        token_counter: TokenCounterLike | None = None,
        summarizer: Summarizer | None = None,
        guards: GuardConfig | None = None,
        safety: ToolGate | None = None,
        store: Checkpointer | None = None,
        final_answer_on_stop: bool = True,
        final_answer_prompt: str | None = None,
        price_table: PriceTable | None = None,
        model_retries: int = 2,
        on_event: EventSink | None = None,
        discovery: ToolDiscovery | None = None,
        mcp_servers: Sequence[MCPServer] = (),
        experience: Learner | None = None,
        lessons_limit: int = 3,
        output_type: Any = None,
        output_validator: Callable[[Any], Any] | None = None,
    ) -> None:
        if mode not in ("auto", "native", "react"):
            raise ConfigurationError(f"mode must be 'auto', 'native' or 'react', not {mode!r}")
        _check_numbers(tool_timeout, output_max_length, max_context_tokens, model_retries, lessons_limit)
        _check_texts(name=name, instructions=instructions, environment=environment, rules=rules)
        _check_parts(
            budget=budget, settings=settings, guards=guards, price_table=price_table, discovery=discovery,
            safety=safety, store=store, experience=experience, on_event=on_event, summarizer=summarizer,
            final_answer_prompt=final_answer_prompt,
        )  # fmt: skip
        _check_answer_settings(final_answer_on_stop, output_validator)
        if final_answer_prompt is not None:
            problem = template_problem(final_answer_prompt, ("reason", "goal", "facts"))
            if problem is not None:
                raise ConfigurationError(f"final_answer_prompt cannot be filled in: {problem}")
        _check_model(model)
        if token_counter is not None:
            as_counter(token_counter)  # a counter, or a function: anything else is refused now
        self.name = name
        self._model_spec = model
        self._model: Model | None = model if isinstance(model, Model) else None
        self.tools = ToolRegistry(tools)
        self.instructions = instructions
        self.budget = budget or Budget()
        self.mode: ModeSetting = mode
        self.settings = settings or ModelSettings()
        self.environment = environment
        self.rules = tuple(rules)
        self.tool_timeout = tool_timeout
        self.output_max_length = output_max_length
        self.max_context_tokens = max_context_tokens if max_context_tokens > 0 else DEFAULT_MAX_CONTEXT_TOKENS
        self.guard_config = guards or GuardConfig()
        self.token_counter = token_counter
        self.summarizer = summarizer
        self.safety = safety
        self.store: Checkpointer = InProcessStore(max_runs=1000) if store is None else store
        self.final_answer_on_stop = final_answer_on_stop
        self.final_answer_prompt = final_answer_prompt
        self.price_table = price_table or PriceTable()
        self.model_retries = model_retries
        self.on_event = _check_sink(on_event)
        self.discovery = discovery
        if discovery is not None:
            discovery.check(self.tools.names)
        self.mcp_servers = _mcp_servers(mcp_servers)
        self.experience = experience
        self.lessons_limit = lessons_limit
        self.output = OutputSpec.of(output_type, output_validator)
        self._learning: set[asyncio.Task[None]] = set()
        self._configs: dict[tuple[Budget, bool], LoopConfig] = {}
        self._last_config: LoopConfig | None = None
        self._active: dict[str, tuple[RunContext, asyncio.Task[Any] | None]] = {}  # runs being driven
        self._shared_by_model: _Shared | None = None

    # ------------------------------------------------------------------------------------- model

    @property
    def model(self) -> Model:
        """The model, resolved from its string on first use (loading the local model happens then)."""
        if self._model is None:
            self._model = resolve_model(self._model_spec)
        return self._model

    def _initial_mode(self) -> Mode:
        if self.mode == "auto":
            return "native" if self.model.capabilities.tools else "react"
        return self.mode

    # ----------------------------------------------------------------------------- MCP lifetime

    async def __aenter__(self) -> Agent:
        """Connect the agent's MCP servers (all or none)."""
        results = await asyncio.gather(*(s.connect() for s in self.mcp_servers), return_exceptions=True)
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            await self.aclose()
            raise failure
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the agent's MCP server connections (stdio servers are stopped). Safe to call twice."""
        for server in self.mcp_servers:
            await server.aclose()

    # ---------------------------------------------------------------------------------- entry points

    async def run(
        self,
        goal: str,
        *,
        budget: Budget | None = None,
        run_id: str | None = None,
        on_event: EventSink | None = None,
        metadata: dict[str, Any] | None = None,
        session: str | None = None,
        deps: Any = None,
    ) -> RunResult:
        """Run the agent on `goal` until a final answer or a stop condition; the result is always returned.

        With `session`, the session's earlier turns (from the store's conversation memory) come before
        the goal, and the goal and the answer are added to it when the run ends. `deps` is handed to
        the tools that take a `ToolContext` (it is not saved: give it again to `resume()`).
        """
        sink = _check_sink(on_event)
        run = self._new_run(goal, budget=budget, run_id=run_id, metadata=metadata, sinks=[sink], stream=False)
        run.state.session = self._session(session)
        run.deps = deps
        return await self._drive(run)

    async def resume(
        self,
        run_id: str,
        *,
        budget: Budget | None = None,
        on_event: EventSink | None = None,
        deps: Any = None,
    ) -> RunResult:
        """Continue a run from its last checkpoint, exactly where it stopped (SPEC §9.2).

        The step counter, usage, elapsed time, guard counters, approvals, mode and budget (unless
        `budget` is given) carry on. Tool calls interrupted mid-flight are settled with the ledger:
        a completed call is never executed again; a started one is re-run only if its tool is idempotent.
        A run that already ended raises `StateError`.
        """
        _check_budget(budget)
        sink = _check_sink(on_event)
        state = await load_resumable(self._store_for("resume a run"), check_id(run_id))
        self._adopt(state)
        run = self._context(state, budget=budget, sinks=[sink], stream=False)
        run.deps = deps
        return await self._drive(run, resumed=True)

    def _adopt(self, state: RunState) -> None:
        """A run resumed with another model names it (events, `runs show`; the earlier ones in
        `metadata["models"]`), and goes on in text ReAct if the new model takes no tool definitions."""
        if state.model == self.model.spec:
            return
        models = record_list(state.metadata, "models")
        if not models:
            models.append(state.model)
        models.append(self.model.spec)
        state.model = self.model.spec
        if state.mode == "native" and self._initial_mode() == "react":
            state.mode = "react"

    def resume_sync(self, run_id: str, **kwargs: Any) -> RunResult:
        """`resume()` for code without an event loop."""
        _outside_a_loop(
            "resume_sync() cannot be called from a running event loop: use `await agent.resume(...)`"
        )
        return _aio.run(self._then_learn(self.resume(run_id, **kwargs)))

    def interrupt(self, run_id: str | None = None, *, save: bool = True) -> list[str]:
        """Stop a run now, leaving it resumable: it is saved as it is, unfinished (no stop reason), and
        `resume()` continues it later — in this process or another one sharing the store. A tool call that
        was running is settled by the ledger on resume (re-run only if idempotent). A run still being set up
        (MCP servers connecting, lessons recalled, its first save) is interrupted the same way. Without
        `run_id`, every run this agent is driving is interrupted. Returns the ids interrupted (a run not
        running: none).

        The task driving the run is cancelled: `await agent.run(...)` raises `asyncio.CancelledError`.
        `task.cancel()` instead ends a run for good (`stop_reason="cancelled"`). With `save=False` the run
        writes nothing more to the store (for a process that lost the run to another one).
        """
        interrupted = []
        for each in list(self._active) if run_id is None else [run_id]:
            run, task = self._active.get(each, (None, None))
            if run is not None and task is not None and not task.done():
                run.interrupted, run.save_interrupted = True, save
                task.cancel()
                interrupted.append(each)
        return interrupted

    def _store_for(self, what: str) -> Store:
        if not isinstance(self.store, Store):
            raise UserError(
                f"to {what} the agent needs a `Store` (e.g. `Agent(store=SQLiteStore())`), "
                f"not {type(self.store).__name__}"
            )
        return self.store

    def _session(self, session: str | None) -> str | None:
        if session is None:
            return None
        self._store_for("use a session")
        return check_id(session, "session id")

    def run_sync(self, goal: str, **kwargs: Any) -> RunResult:
        """`run()` for code without an event loop."""
        _outside_a_loop(
            "run_sync() cannot be called from a running event loop (e.g. Jupyter or async code): "
            "use `await agent.run(...)` instead"
        )
        return _aio.run(self._then_learn(self.run(goal, **kwargs)))

    async def stream(
        self,
        goal: str,
        *,
        budget: Budget | None = None,
        run_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        session: str | None = None,
        deps: Any = None,
    ) -> AsyncIterator[Event]:
        """Run the agent, yielding its events live; the last event is `Done`, carrying the result.

        Stopping the iteration (break, `aclose()`, cancellation) cancels the run cleanly.
        """
        queue: asyncio.Queue[Event | None] = asyncio.Queue()
        run = self._new_run(
            goal, budget=budget, run_id=run_id, metadata=metadata, sinks=[queue.put_nowait], stream=True
        )
        run.state.session = self._session(session)
        run.deps = deps
        task = asyncio.create_task(self._drive(run))
        task.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (event := await queue.get()) is not None:
                yield event
                if isinstance(event, Done):
                    break
            await task
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    # ------------------------------------------------------------------------------------- internals

    def _new_run(
        self,
        goal: str,
        *,
        budget: Budget | None,
        run_id: str | None,
        metadata: dict[str, Any] | None,
        sinks: list[EventSink | None],
        stream: bool,
    ) -> RunContext:
        check_goal(goal)  # a string, not blank, without NUL (as the server, the CLI and the job queue take)
        _check_metadata(metadata)
        _check_budget(budget)
        if run_id is not None and not isinstance(run_id, str):
            raise ConfigurationError(f"run_id must be a string (None: a new id), not {_kind(run_id)}")
        state = new_run_state(
            agent_name=self.name,
            model=self.model.spec,
            goal=goal,
            mode=self._initial_mode(),
            metadata=copy.deepcopy(metadata) if metadata else {},  # the run's own: tools add to it
        )
        if run_id is not None:  # an id thinkloop's stores refuse is refused here, not at the first save
            state.run_id = check_id(run_id) if isinstance(self.store, Store) else run_id
        state.messages.append(Message.user(goal))
        return self._context(state, budget=budget, sinks=sinks, stream=stream)

    def _context(
        self, state: RunState, *, budget: Budget | None, sinks: list[EventSink | None], stream: bool
    ) -> RunContext:
        if budget is None and state.budget:  # a resumed run keeps the limits it started with
            budget = Budget(**state.budget)
        config = self._config(budget or self.budget, stream)
        state.budget = config.budget.as_dict()
        model = self.model
        shared = self._shared(model)
        run = new_run_context(
            state=state,
            model=model,
            tools=shared.tools,
            discovery=self.discovery,
            config=config,
            guards=Guards(self.guard_config),
            context=self._context_manager(shared),
            _shown=shared.shown,
            prompt_layers=shared.prompt_layers,
            gate=shared.gate,
            output=self.output,
            store=self.store,
            sinks=[s for s in (self.on_event, *sinks) if s is not None],
            elapsed_before=state.elapsed,
        )
        shrinks = state.metadata.get("context_shrinks")
        if (
            isinstance(shrinks, list)
            and shrinks
            and isinstance(shrinks[-1], dict)
            and isinstance(shrinks[-1].get("to"), int)
        ):
            context = run.context  # a resumed run keeps the smaller context its model's window forced on it
            context.max_context_tokens = max(min(context.max_context_tokens, shrinks[-1]["to"]), 256)
        return run

    def _config(self, budget: Budget, stream: bool) -> LoopConfig:
        """The loop's settings for a run (the same object for runs with the same budget)."""
        last = self._last_config
        if last is not None and last.budget is budget and last.stream == stream:
            return last  # the common case: every run with the agent's budget, without hashing it
        key = (budget, stream)
        config = self._configs.get(key)
        if config is None:
            config = LoopConfig(
                budget=budget,
                settings=self.settings,
                tool_timeout=self.tool_timeout,
                output_max_length=self.output_max_length,
                final_answer_on_stop=self.final_answer_on_stop,
                final_answer_prompt=self.final_answer_prompt,
                stream=stream,
                price_table=self.price_table,
                model_retries=self.model_retries,
            )
            if len(self._configs) > 64:
                self._configs.clear()
            self._configs[key] = config
        self._last_config = config
        return config

    def _context_manager(self, shared: _Shared) -> ContextManager:
        manager = ContextManager(shared.context_limit, counter=shared.counter, summarizer=self.summarizer)
        manager.reserve_cache = shared.reserves  # the system prompt and tools are counted once per agent
        return manager

    def _shared(self, model: Model) -> _Shared:
        """What every run of this agent shares read-only (built once per model; the settings are fixed).

        The agent's settings are read when the first run starts; change them before, not after.
        """
        shared = self._shared_by_model
        if shared is None or shared.model is not model:
            shared = self._shared_by_model = _Shared(
                model=model,
                tools=self.tools if self.discovery is None else self.discovery.with_tool(self.tools),
                counter=as_counter(self.token_counter, model),
                context_limit=self._context_limit(),
                prompt_layers={
                    "role": self.instructions,
                    "environment": self.environment,
                    "rules": self.rules
                    if self.output is None or not self.output.rule
                    else (*self.rules, self.output.rule),
                },
                gate=self.safety or AllowAll(),
            )
        return shared

    def _context_limit(self) -> int:
        """`max_context_tokens`, capped so that the prompt leaves room for the reply in the model's window."""
        window = self.model.capabilities.context_window
        if window is None:
            return self.max_context_tokens
        reply_room = min(self.settings.max_output_tokens, window // 4)
        return max(min(self.max_context_tokens, window - reply_room), 256)

    async def _drive(self, run: RunContext, *, resumed: bool = False) -> RunResult:
        state = run.state
        # `interrupt()` reaches the run from here on, while it is set up too (a duplicate id stays out)
        if self._active.setdefault(state.run_id, (run, asyncio.current_task()))[0] is not run:
            raise UserError(
                f"run {state.run_id!r} is being run by this agent right now (a run or resume of it has not "
                f"ended): wait for it to end, or interrupt it (agent.interrupt({state.run_id!r})), then resume "
                "it — two at once would run its tool calls twice"
            )
        try:
            try:
                await self._set_up(run, resumed=resumed)
            except asyncio.CancelledError:
                if run.interrupted:  # interrupted before its loop: saved as it is, resumable
                    await suspend(run)
                raise
            token = current_run.set(run)  # lets a router emit its `model_attempt` events to this run
            try:
                result = await run_loop(run, resumed=resumed)
            finally:
                current_run.reset(token)
        finally:
            self._active.pop(state.run_id, None)
        if self.experience is not None and result.stop_reason is not StopReason.CANCELLED:
            self._learn_later(result.state)
        return result

    async def _set_up(self, run: RunContext, *, resumed: bool) -> None:
        """Before the loop: the MCP servers' tools, the session's earlier turns, lessons, `run_started`,
        and the first checkpoint."""
        state = run.state
        if self.mcp_servers:  # connects servers not yet connected; a server that cannot start raises
            run.tools = await registry_with_mcp(run.tools, self.mcp_servers)
            run.forget_shown()  # this run's tool set is its own
        if state.session is not None and not resumed:
            memory = await self._store_for("use a session").get_memory(state.session)
            state.messages[:0] = memory_messages([(m.role, m.content) for m in memory])
        if self.experience is not None:
            await self._use_lessons(run, resumed=resumed)
        if run.observed:
            run.emit(RunStarted(goal=state.goal, model=state.model, mode=state.mode, resumed=resumed))
        else:
            state.event_version += 1  # `run.skip_event()`, inlined: every run
        # the first checkpoint, before the first model call: a crash leaves a resumable run
        try:
            try:
                await run.checkpoint()
            except ConcurrencyError as exc:
                if resumed or exc.expected != 0:
                    raise
                run_id = run.state.run_id
                raise UserError(
                    f"a run with id {run_id!r} already exists in the store: give the new run another run_id "
                    f"(or, if that run is unfinished, continue it with agent.resume({run_id!r}))"
                ) from exc
        except Exception as failure:  # the run stops before its loop: `run_started` is followed by why
            message = str(failure)
            run.emit(lambda: ErrorEvent(message=message, stopped=True))
            raise

    # ------------------------------------------------------------------------------------ experience

    def _lessons(self, recalled: Any) -> list[str]:
        """What a learner recalled, as lessons for a prompt: strings only, at most `lessons_limit`, each
        cut to 1,000 characters (a learner returning one string or a megabyte must not reach the model)."""
        if isinstance(recalled, str) or not isinstance(recalled, Iterable):
            raise TypeError(f"recall() must return a list of strings, got {type(recalled).__name__}")
        lessons = [" ".join(x.split()) for x in recalled if isinstance(x, str) and x.strip()]
        return [x if len(x) <= 1000 else x[:999] + "…" for x in lessons[: self.lessons_limit]]

    async def _use_lessons(self, run: RunContext, *, resumed: bool) -> None:
        """Put the lessons relevant to the goal into the prompt (a resumed run keeps the ones it had)."""
        assert self.experience is not None
        state = run.state
        lessons = state.metadata.get("lessons")
        if not resumed or not isinstance(lessons, list):
            try:
                async with asyncio.timeout(RECALL_TIMEOUT):
                    lessons = self._lessons(
                        await self.experience.recall(state.goal, limit=self.lessons_limit)
                    )
            except (Exception, asyncio.CancelledError) as exc:  # an optimisation: the run goes on without
                _raise_if_cancelled(exc)
                logger.warning(
                    "recalling lessons failed (%s); running without them",
                    _learner_failure(exc, RECALL_TIMEOUT),
                )
                lessons = []
            state.metadata["lessons"] = lessons
        if lessons:
            run.prompt_layers = {**run.prompt_layers, "experience": tuple(str(x) for x in lessons)}
            run.forget_shown()  # this run's system prompt is its own

    def _learn_later(self, state: RunState) -> None:
        """Hand the finished run to the learner in the background (the answer never waits for it)."""
        task = asyncio.get_running_loop().create_task(self._learn(RunRecord.from_state(state)))
        self._learning.add(task)
        task.add_done_callback(self._learning.discard)

    async def _learn(self, record: RunRecord) -> None:
        assert self.experience is not None
        try:
            async with asyncio.timeout(LEARN_TIMEOUT):
                await self.experience.learn(record)
        except (
            Exception,
            asyncio.CancelledError,
        ) as exc:  # never surfaces: the run is over, its answer given
            _raise_if_cancelled(exc)
            logger.warning(
                "learning from run %s failed (%s)", record.run_id, _learner_failure(exc, LEARN_TIMEOUT)
            )

    async def _then_learn(self, run: Awaitable[RunResult]) -> RunResult:
        """For the sync entry points: their event loop ends with the call, so learning is awaited."""
        result = await run
        await self.wait_for_learning()
        return result

    async def wait_for_learning(self) -> None:
        """Wait until the learner has taken in every finished run (each within 30 s)."""
        while self._learning:
            await asyncio.gather(*self._learning, return_exceptions=True)


def _raise_if_cancelled(exc: BaseException) -> None:
    """Re-raise a CancelledError that cancels this task; one a learner raised of its own is its failure."""
    task = asyncio.current_task()
    if isinstance(exc, asyncio.CancelledError) and (task is None or task.cancelling()):
        raise exc


def _learner_failure(exc: BaseException, limit: float) -> str:
    if isinstance(exc, TimeoutError) and not str(exc):  # the limit ran out: str() says nothing
        return f"it took over {limit:g} s"
    return f"{type(exc).__name__}: {exc}"


def _check_metadata(metadata: object) -> None:
    """`run(metadata=...)`: a dict the run's state can be saved with (it is saved at every step)."""
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise ConfigurationError(f"metadata must be a dict of JSON values, not a {type(metadata).__name__}")
    bad = unsaved_metadata(metadata)
    if bad:
        key = bad[0]
        raise ConfigurationError(
            f"metadata[{key!r}] (of type {type(metadata[key]).__name__}) cannot be saved with the run's state: "
            f"metadata holds JSON values (text, numbers — finite, integers under 4,300 digits —, booleans, None, "
            f"lists and dicts of them, at most {_json.MAX_DEPTH} levels deep); pass objects the tools need as "
            "deps="
        )


def _outside_a_loop(problem: str) -> None:
    """`UserError(problem)` when an event loop runs in this thread. The run itself starts after the
    check, not in its `except` block: every error of the run carried the probe's RuntimeError."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise UserError(problem)
