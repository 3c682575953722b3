"""Scale-out on Celery (SPEC §13.4): thinkloop runs as Celery tasks, resumed when a worker dies.

`agent_task(app, make_agent)` registers a task on your Celery app that drives one run, its task id
being the run id. Each worker process builds its agent once (`make_agent()`, on the process's own
event loop, in a background thread) and runs its tasks with it; every worker's agent saves its runs
in one shared store (`PostgresStore`, or `SQLiteStore` for the processes of one machine).

The task is idempotent per run id — a run the store has finished returns its result, an unfinished one
is resumed from its checkpoint (a completed tool call is never run again), a new one starts — and it
is acknowledged only once the run has ended (`acks_late`, `reject_on_worker_lost`, one message
prefetched at a time), so the broker redelivers it when its worker dies and another worker resumes
the run. A warm shutdown of a `threads` or `solo` worker interrupts its runs (saved unfinished) and
hands their messages back at once. A run that keeps killing its worker is not redelivered forever: after
`max_attempts` (3) attempts it is abandoned — ended with stop reason `error` — and its message acknowledged.
A store that fails (unreachable, not answering, locked: a `StateError`) fails only the delivery: the task
is retried with a growing delay (`store_retries`, 5), the run resumed from its last checkpoint, and only
then does the task fail, with the store's error.

    app = Celery("agents", broker="redis://127.0.0.1:6379/0", backend="redis://127.0.0.1:6379/0")
    run_agent = agent_task(app, lambda: Agent("openai:gpt-4o-mini", store=PostgresStore(DSN)))
    ...                                                  # celery -A tasks worker --pool threads
    job = run_agent.submit("Summarise yesterday's incidents")     # a Celery AsyncResult
    print(job.get(timeout=600)["output"])                # the JSON summary of the RunResult

Needs the `celery` extra (`pip install 'thinkloop[celery]'`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import threading
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from . import _aio
from ._errors import ConfigurationError, StateError, ThinkloopError, UserError
from .distributed import (
    DEFAULT_MAX_ATTEMPTS,
    CorruptRunError,
    check_max_attempts,
    run_or_resume,
    shared_store,
)
from .stores._base import check_id

try:
    from celery import signals, states
    from celery.backends.base import DisabledBackend
    from celery.backends.rpc import RPCBackend
    from celery.exceptions import Reject
except ImportError:  # pragma: no cover - the extra is not installed
    raise ImportError("thinkloop.celery needs Celery: pip install 'thinkloop[celery]'") from None

if TYPE_CHECKING:
    from ._agent import Agent
    from ._budget import Budget
    from ._events import RunResult

__all__ = ["AgentTask", "TaskResult", "agent_task", "task_result"]

logger = logging.getLogger("thinkloop.celery")

T = TypeVar("T")
AgentFactory = Callable[[], "Agent | Awaitable[Agent]"]

# Set on the app unless its configuration already says otherwise.
_APP_DEFAULTS = {
    "worker_prefetch_multiplier": 1,  # a worker reserves no run it is not driving yet
    "worker_cancel_long_running_tasks_on_connection_loss": True,  # the broker redelivers them anyway
}
# Set on the task unless `agent_task(**options)` says otherwise.
_TASK_DEFAULTS = {
    "acks_late": True,  # acknowledged when the run has ended, not when it starts
    "reject_on_worker_lost": True,  # a pool process that dies hands its message back
    "track_started": False,  # the task marks itself STARTED, with its delivery count (`_Deliveries`)
}
_DELIVERIES = "thinkloop_deliveries"  # in the STARTED result's meta: the deliveries of the run so far
DEFAULT_STORE_RETRIES = 5
DEFAULT_STORE_RETRY_DELAY = 2.0  # seconds before the first retry; doubled for each one after it
_MAX_STORE_RETRY_DELAY = 300.0


class TaskResult(TypedDict):
    """What the task returns through Celery's result backend: a JSON summary of the `RunResult` (the
    full state — messages, ledger, events — stays in the thinkloop store, under `run_id`)."""

    run_id: str
    output: str
    stop_reason: str
    ok: bool
    steps: int
    tool_calls: int
    duration: float
    forced_final: bool
    error: str | None
    usage: dict[str, Any]


def task_result(result: RunResult) -> TaskResult:
    """The JSON summary of a run's result that the Celery task returns."""
    return TaskResult(
        run_id=result.run_id,
        output=result.output,
        stop_reason=result.stop_reason.value,
        ok=result.ok,
        steps=result.steps,
        tool_calls=result.tool_calls,
        duration=result.duration,
        forced_final=result.forced_final,
        error=result.error,
        usage=result.usage.model_dump(mode="json"),
    )


class _Interrupted(Exception):
    """The run was interrupted by the worker's shutdown: saved unfinished, to be resumed elsewhere."""


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """The body of a process's loop thread: run the loop until it is stopped, then close it."""
    try:
        loop.run_forever()
    finally:
        loop.close()


class _AgentHost:
    """A worker process's agent and the event loop it lives on (a daemon thread), made on first use.

    Celery tasks are synchronous; an agent's store, model clients and MCP connections belong to one event
    loop. So each process gets one loop, in its own thread, and one agent built on it; every task of the
    process (one at a time with `prefork` and `solo`, several with `threads`) runs its run there. A forked
    child never inherits the parent's loop: it builds its own.
    """

    def __init__(self, make_agent: AgentFactory) -> None:
        self._make_agent = make_agent
        self._lock = threading.Lock()
        self._pid = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._agent: Agent | None = None
        self._runs: dict[str, asyncio.Task[Any]] = {}
        self.stopping = False

    def call(self, work: Callable[[Agent], Coroutine[Any, Any, T]]) -> T:
        """Run `work(agent)` on the process's loop and wait for its result (from a task's thread)."""
        loop, agent = self._started()
        return asyncio.run_coroutine_threadsafe(work(agent), loop).result()

    def _started(self) -> tuple[asyncio.AbstractEventLoop, Agent]:
        with self._lock:
            if self._pid != os.getpid():  # first use in this process (or a fork of the one that had it)
                self._loop, self._agent, self._runs, self.stopping = None, None, {}, False
                loop = _aio.new_event_loop()
                threading.Thread(target=_serve, args=(loop,), name="thinkloop-celery", daemon=True).start()
                try:
                    agent = asyncio.run_coroutine_threadsafe(self._build(), loop).result()
                except BaseException:
                    loop.call_soon_threadsafe(loop.stop)
                    raise
                self._pid, self._loop, self._agent = os.getpid(), loop, agent
            assert self._loop is not None and self._agent is not None
            return self._loop, self._agent

    async def _build(self) -> Agent:
        from ._agent import Agent

        made = self._make_agent()
        agent = await made if inspect.isawaitable(made) else made
        if not isinstance(agent, Agent):
            raise ConfigurationError(
                f"make_agent() must return an Agent (or an awaitable of one), not {type(agent).__name__}"
            )
        shared_store(agent, "an agent run by Celery workers")
        return agent

    async def drive(self, agent: Agent, run_id: str, goal: str, options: dict[str, Any]) -> RunResult:
        """The run, to its end — or `_Interrupted` when the worker shuts down meanwhile."""
        if self.stopping:
            raise _Interrupted
        task = asyncio.current_task()
        assert task is not None
        self._runs[run_id] = task
        try:
            return await run_or_resume(agent, run_id, goal, **options)
        except asyncio.CancelledError:
            if self.stopping:  # interrupted by `interrupt_all`: the run was saved unfinished
                raise _Interrupted from None
            raise
        finally:
            self._runs.pop(run_id, None)

    def interrupt_all(self) -> None:
        """Interrupt every run of this process (safe from a signal handler): they are saved unfinished."""
        if self._loop is None or self._pid != os.getpid():
            return  # no run in this process (e.g. the parent of prefork children)
        self.stopping = True
        self._loop.call_soon_threadsafe(self._interrupt)

    def _interrupt(self) -> None:
        assert self._agent is not None
        for run_id, task in list(self._runs.items()):
            if not self._agent.interrupt(run_id):  # not driving it yet (loading its state): stop that
                task.cancel()
        if self._runs:
            logger.warning("worker shutting down: interrupted run(s) %s", ", ".join(self._runs))

    def close(self) -> None:
        """Close the agent and its store, and stop the loop (the process is exiting)."""
        with self._lock:
            loop, agent = self._loop, self._agent
            if loop is None or agent is None or self._pid != os.getpid():
                return
            self._loop = self._agent = None
            self._pid = 0

        async def closing() -> None:
            await agent.aclose()
            with contextlib.suppress(Exception):
                await shared_store(agent, "closing").aclose()

        try:
            asyncio.run_coroutine_threadsafe(closing(), loop).result(timeout=10)
        except Exception as exc:
            logger.warning("closing the agent of this worker failed: %s", exc)
        loop.call_soon_threadsafe(loop.stop)


class _Deliveries:
    """Counts a run's deliveries in the result backend — the task's STARTED state, with `pid`, `hostname`
    (as Celery's `track_started` writes it) and the count — so that a delivery whose process dies before
    the run is first saved in the store (in `make_agent()`, while loading the state) counts as an attempt
    too. Not counted without a result backend that another process can read (none, or `rpc://`)."""

    def __init__(self, task: Any) -> None:
        self.task = task
        backend = task.backend
        self.backend = None if isinstance(backend, DisabledBackend | RPCBackend) else backend

    def count(self, run_id: str) -> int | None:
        """This delivery's number (1 for the first), saved before the run goes on; None if not counted."""
        if self.backend is None:
            return None
        try:
            meta = self.backend.get_task_meta(run_id)
            info = meta.get("result") if meta.get("status") == states.STARTED else None
            made = info.get(_DELIVERIES) if isinstance(info, dict) else None
            number = made + 1 if isinstance(made, int) and not isinstance(made, bool) and made >= 0 else 1
            self._save(run_id, number)
        except Exception as exc:  # the backend is down: the store's own count still holds
            logger.warning("counting the delivery of run %s in the result backend failed: %s", run_id, exc)
            return None
        return number

    def uncount(self, run_id: str, number: int | None) -> None:
        """Take back a delivery that handed its run back unharmed (interrupted by a warm shutdown)."""
        if number is not None:
            with contextlib.suppress(Exception):
                self._save(run_id, number - 1)

    def _save(self, run_id: str, number: int) -> None:
        meta = {"pid": os.getpid(), "hostname": self.task.request.hostname, _DELIVERIES: number}
        self.task.update_state(task_id=run_id, state=states.STARTED, meta=meta)


class _StoreRetries:
    """What the task does when the run's store fails (a `StateError` that is not the run's own: the store
    unreachable, not answering in time, locked — not a corrupt state): the delivery is retried, `retries`
    times at most, after `delay` seconds doubled each time; the next delivery resumes the run from its
    last checkpoint (a tool call whose end could not be saved is not run again unless it is idempotent)."""

    def __init__(self, retries: object, delay: object) -> None:
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConfigurationError(
                f"store_retries must be a whole number ≥ 0 (how many times a delivery whose store failed is "
                f"retried; default {DEFAULT_STORE_RETRIES}), got {retries!r}"
            )
        if isinstance(delay, bool) or not isinstance(delay, int | float) or not 0 < delay < float("inf"):
            raise ConfigurationError(
                f"store_retry_delay must be a positive number of seconds (the wait before the first retry "
                f"when the store failed, doubled for each one after it), got {delay!r}"
            )
        self.retries, self.delay = retries, float(delay)

    @staticmethod
    def transient(exc: BaseException) -> bool:
        """Whether `exc` is the store failing (worth another delivery), not something no retry mends."""
        return isinstance(exc, StateError) and not isinstance(exc, CorruptRunError)

    def retry(
        self, task: Any, run_id: str, exc: StateError, counter: _Deliveries, delivery: int | None
    ) -> Exception:
        """The exception that ends this delivery: Celery's `Retry` (a copy of the message, due after the
        delay, is sent before this one is acknowledged), or — the retries used up — the task's failure."""
        made = int(task.request.retries or 0)
        if made >= self.retries:
            return StateError(  # Celery logs it, and acknowledges the message
                f"run {run_id}: its store failed on {made + 1} deliveries (store_retries="
                f"{self.retries}), the last time with: {exc} — once the store works again, submit the "
                "goal again with the same run id: the run resumes from its last checkpoint (or starts, if "
                "it has none)",
                state=exc.state,
            )
        delay = min(self.delay * 2**made, _MAX_STORE_RETRY_DELAY)
        logger.warning(
            "run %s: its store failed (%s); retrying in %g s (retry %d of %d)",
            run_id, exc, delay, made + 1, self.retries,
        )  # fmt: skip
        try:
            retry: Exception = task.retry(exc=exc, countdown=delay, max_retries=self.retries, throw=False)
        except Reject:  # the broker took no copy: hand this message back instead of dropping it
            back: Exception = Reject(f"run {run_id}: its store failed; retry not sent", requeue=True)
            return back
        counter.uncount(run_id, delivery)  # it handed the run back: not an attempt that died
        return retry


def _undeliverable(run_id: str, deliveries: int, max_attempts: int) -> ThinkloopError:
    return ThinkloopError(
        f"run {run_id} abandoned: its message was delivered {deliveries - 1} time(s) (max_attempts="
        f"{max_attempts}) and no delivery finished it — its workers died, the last one while ending it, "
        "maybe before the run was first saved (in make_agent(), or while connecting MCP servers): "
        f"inspect the workers' logs and `thinkloop runs show {run_id} --store STORE`, fix the cause, and "
        "submit the goal again under a new run id"
    )


class AgentTask:
    """A Celery task running thinkloop runs (made by `agent_task`): `submit()` them, get their results.

    `task` is the Celery task itself (for `.s()`, canvas, routing); `host` the agent of this process.
    """

    def __init__(self, task: Any, host: _AgentHost) -> None:
        self.task = task
        self.host = host
        self.name: str = task.name

    def submit(
        self,
        goal: str,
        *,
        run_id: str | None = None,
        budget: Budget | None = None,
        metadata: dict[str, Any] | None = None,
        session: str | None = None,
        **options: Any,
    ) -> Any:
        """Send a run to the workers; returns its Celery `AsyncResult` (its id is the run id), whose
        `get()` gives the `TaskResult`. Submitting a run id again is safe: a finished run returns its
        result, an unfinished one is resumed. `options` go to `apply_async` (queue, countdown, …)."""
        if not isinstance(goal, str) or not goal.strip():
            raise UserError(f"the goal must be a non-empty string, got {goal!r}")
        run_id = check_id(run_id) if run_id is not None else uuid.uuid4().hex
        kwargs = {
            "budget": budget.as_dict() if budget is not None else None,
            "metadata": metadata,
            "session": check_id(session, "session id") if session is not None else None,
        }
        return self.task.apply_async(args=(goal,), kwargs=kwargs, task_id=run_id, **options)

    def result(self, run_id: str) -> Any:
        """The Celery `AsyncResult` of a run submitted earlier (from any process)."""
        return self.task.AsyncResult(check_id(run_id))

    def __repr__(self) -> str:
        return f"AgentTask({self.name!r})"


def agent_task(
    app: Any,
    make_agent: AgentFactory,
    *,
    name: str = "thinkloop.run",
    interrupt_on_shutdown: bool = True,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    store_retries: int = DEFAULT_STORE_RETRIES,
    store_retry_delay: float = DEFAULT_STORE_RETRY_DELAY,
    **options: Any,
) -> AgentTask:
    """Register on the Celery `app` a task that drives thinkloop runs with the agent `make_agent()` builds.

    Args:
        app: your `celery.Celery` application (workers must import the module that calls this).
        make_agent: builds the agent, once per worker process, on that process's event loop (a function
            or an async function). Its store must be shared by all workers (`PostgresStore`, or
            `SQLiteStore` for one machine); tools with side effects should say whether they are
            idempotent (`@tool(idempotent=True)`), since a resumed run re-runs an interrupted call only then.
        name: the task's name.
        interrupt_on_shutdown: on a warm shutdown of a worker whose tasks run in its main process
            (`--pool threads` or `solo`), interrupt the runs (saved unfinished) and put their messages
            back for another worker, instead of waiting for them to end. A `prefork` worker's warm
            shutdown waits for its runs (Celery's own behaviour).
        max_attempts: how many times a run may be started or resumed (each delivery of its message is an
            attempt, counted in the run's `metadata["attempts"]` before it runs). A run whose attempts all
            ended without finishing — its worker died, e.g. a tool that crashes the process — is then
            abandoned: ended with stop reason `error` and a message saying so, its message acknowledged.
            An attempt interrupted by a warm shutdown does not count.
        store_retries: how many times a delivery whose store failed — a `StateError` from reading or
            saving the run (the database unreachable, not answering, locked), not a corrupt state — is
            retried (Celery's `retry`, the same task id) before the task fails with that error. The next
            delivery resumes the run from its last checkpoint. A run's own errors (the model failing, a
            budget running out) end the run as before and are never retried.
        store_retry_delay: seconds before the first such retry; doubled for each one after it (at most
            300 s): 2, 4, 8, 16, 32 s by default.
        options: more task options (`time_limit`, `rate_limit`, `autoretry_for` …); they may override the
            defaults `acks_late=True`, `reject_on_worker_lost=True`, `track_started=False` (the task
            writes STARTED itself, with the run's delivery count: leave it off).

    The app's `worker_prefetch_multiplier` is set to 1 and `worker_cancel_long_running_tasks_on_connection_loss`
    to True unless its configuration sets them. With Redis as broker, set `broker_transport_options=
    {"visibility_timeout": …}` above your longest run (the default is one hour): a message not
    acknowledged by then is delivered again, and two workers would drive the same run.
    """
    if not callable(make_agent):
        raise ConfigurationError(f"make_agent must be a function that builds an Agent, not {make_agent!r}")
    max_attempts = check_max_attempts(max_attempts)
    store = _StoreRetries(store_retries, store_retry_delay)
    for key, value in _APP_DEFAULTS.items():
        if key not in app.conf.changes:
            app.conf[key] = value
    host = _AgentHost(make_agent)

    def run(
        self: Any, goal: str, budget: Any = None, metadata: Any = None, session: Any = None
    ) -> TaskResult:
        run_id = check_id(str(self.request.id))
        counter = _Deliveries(self)
        delivery = counter.count(run_id)
        if delivery is not None and delivery > max_attempts + 1:  # even ending it killed its worker
            raise _undeliverable(run_id, delivery, max_attempts)
        options = {
            "budget": budget, "metadata": metadata, "session": session,
            "max_attempts": max_attempts, "attempt": delivery,
        }  # fmt: skip
        try:
            result = host.call(lambda agent: host.drive(agent, run_id, goal, options))
        except _Interrupted:
            counter.uncount(run_id, delivery)
            raise Reject(f"run {run_id} interrupted by the worker's shutdown", requeue=True) from None
        except StateError as exc:
            if not store.transient(exc):
                raise
            raise store.retry(self, run_id, exc, counter, delivery) from exc
        return task_result(result)

    run.__doc__ = (
        "Drive a thinkloop run (task id = run id) to its end: start it, resume it, or return its result "
        "(or abandon it, with stop reason `error`, after `max_attempts` attempts that did not finish)."
    )
    task = app.task(bind=True, name=name, **{**_TASK_DEFAULTS, **options})(run)

    if interrupt_on_shutdown:

        def on_shutting_down(**_: Any) -> None:
            host.interrupt_all()

        signals.worker_shutting_down.connect(on_shutting_down, weak=False)

    def on_process_exit(**_: Any) -> None:
        host.close()

    signals.worker_process_shutdown.connect(on_process_exit, weak=False)
    signals.worker_shutdown.connect(on_process_exit, weak=False)
    return AgentTask(task, host)
