"""`RunManager`: the server's runs — started in the background, followed live, cancelled, shut down.

Each run the server starts is an asyncio task driving `agent.run()`. While it runs, the manager keeps
every event it emitted (the store only receives them at checkpoints) and hands new ones to the
followers' queues, so a follower gets the run's whole event sequence: the events after `after` that
already happened, then the live ones, each `seq` exactly once, ending with `done`. A run that is not
running here (finished, or running in another process sharing the store) is followed from the store's
event log, polled until its `done` event — or, if this server resumes it meanwhile, from then on live.

A run the store has unfinished (its process died) can be resumed here (`resume()`): it continues as a
live run whose event list starts with the events already logged, so its followers see one sequence. A
run that a live thinkloop process on this machine still runs (`thinkloop run` in a terminal, another
`thinkloop serve`) is refused unless forced, as `thinkloop runs resume` refuses it (`stores._owner`).

A follower never slows a run down: events are put on its queue without waiting; a follower that falls
more than `MAX_QUEUED` events behind is dropped (`FollowerTooSlow`) and may reconnect with `after=`.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._agent import Agent
from .._budget import Budget
from .._errors import ConcurrencyError, RunError, StateError, UserError
from .._events import Event
from .._state import RunState
from ..stores import Store
from ..stores._owner import KEY as OWNER_KEY
from ..stores._owner import StillRunningError, check_not_running, claim

logger = logging.getLogger("thinkloop.server")

MAX_QUEUED = 10_000  # events a follower may fall behind before it is dropped
POLL_INTERVAL = 1.0  # seconds between reads of the store when following a run of another process
SHUTDOWN_POLL = 0.02  # seconds between tries to interrupt a run still starting when the server stops


class UnknownRunError(UserError):
    """No run with this id, in this server or in the store."""


class NotRunningError(StateError):
    """The run exists but is not running in this server (it ended, or another process runs it)."""


class NotResumableError(StateError):
    """The run cannot be resumed here: it ended, or it is running in this server or another live process.

    `forceable` is True only when `resume(force=True)` would resume it: a live thinkloop process on this
    machine seems to run it still (the other refusals hold whatever the caller says).
    """

    def __init__(self, message: str, *, forceable: bool = False) -> None:
        super().__init__(message)
        self.forceable = forceable


class TooManyRunsError(UserError):
    """The server already runs its maximum of concurrent runs."""


class ShuttingDownError(UserError):
    """The server is shutting down: it starts and resumes no more runs."""


class FollowerTooSlowError(RunError):
    """A follower fell too far behind the run's events and was dropped; it may follow again with `after=`."""


class RunFailedError(RunError):
    """The run's task failed outside the loop (e.g. an MCP server would not start, the store failed)."""


class _Signal(enum.Enum):
    END = "end"  # the run's task ended: no more events
    OVERFLOW = "overflow"  # the follower fell too far behind and was dropped


_Item = Event | _Signal


_UNCLAIMED: Any = object()  # `_claim` of a run no thinkloop command recorded its process in: nothing saved
_Claim = Any  # what a claim replaced (`metadata["cli"]` before it), or `_UNCLAIMED`

MAX_FAILED = 256  # runs whose failure before their first save a server remembers


@dataclass
class LiveRun:
    """A run started by this server and not yet ended: its task and every event it emitted."""

    run_id: str
    goal: str
    session: str | None
    created_at: float = field(default_factory=time.time)
    task: asyncio.Task[None] | None = None
    events: list[Event] = field(default_factory=list)  # a resumed run's start with those already logged
    followers: set[asyncio.Queue[_Item]] = field(default_factory=set)
    in_loop: bool = False  # the run emitted an event past `run_started`: cancelling it now is clean
    cancel_requested: bool = False
    task_cancelled: bool = False
    failure: str | None = None

    def publish(self, event: Event) -> None:
        """The run's event sink: keep the event and give it to every follower (never waits)."""
        self.events.append(event)
        if event.type != "run_started" and not self.in_loop:
            self.in_loop = True
            if self.cancel_requested:
                self.cancel_task()
        for queue in list(self.followers):
            if queue.qsize() >= MAX_QUEUED:
                self.followers.discard(queue)
                queue.put_nowait(_Signal.OVERFLOW)
            else:
                queue.put_nowait(event)

    def cancel_task(self) -> None:
        if self.task is not None and not self.task.done() and not self.task_cancelled:
            self.task_cancelled = True
            self.task.cancel()

    def close(self) -> None:
        for queue in self.followers:
            queue.put_nowait(_Signal.END)
        self.followers.clear()


class RunManager:
    """Starts the agent's runs in the background and follows them; one per server.

    Args:
        agent: the agent every run uses; its `store` (a `Store` with an event log) receives the runs.
        max_active_runs: the most runs at once; `start()` raises `TooManyRunsError` beyond it.
        metadata: put into every run's `state.metadata` (e.g. how `thinkloop serve` built the agent).
    """

    def __init__(
        self, agent: Agent, *, max_active_runs: int = 32, metadata: Mapping[str, Any] | None = None
    ) -> None:
        self.agent = agent
        self.store: Store = agent.store  # type: ignore[assignment]  # checked by create_app
        self.max_active_runs = max_active_runs
        self.metadata = dict(metadata or {})
        self._live: dict[str, LiveRun] = {}
        self._failed: dict[str, str] = {}  # the last runs whose task failed, by id: why (see `no_run`)
        self._resuming: set[str] = set()  # runs being resumed, not launched yet: they count as active
        self._closing = False

    # ------------------------------------------------------------------------------------- runs

    def start(self, goal: str, *, budget: Budget | None = None, session: str | None = None) -> LiveRun:
        """Start a run in the background and return it at once (its events follow)."""
        self._check_room()
        live = LiveRun(run_id=uuid.uuid4().hex, goal=goal, session=session)
        self._launch(
            live,
            lambda: self.agent.run(
                goal,
                budget=budget,
                run_id=live.run_id,
                on_event=live.publish,
                metadata=dict(self.metadata),
                session=session,
            ),
        )
        return live

    async def resume(self, run_id: str, *, force: bool = False) -> LiveRun:
        """Resume in the background a run the store has unfinished, as `agent.resume()` does.

        The run goes on from its last checkpoint with its own budget and metadata; the tool-call
        ledger settles the calls the interruption cut short (a completed call is never run again).
        Raises `UnknownRunError`, `NotResumableError` (it ended, it runs here, another process saved it
        meanwhile, or — unless `force` — a live thinkloop process on this machine still runs it: the one
        case with `forceable` True), `TooManyRunsError` or `ShuttingDownError`.

        A refused resume leaves the run as it was: the server records itself as the run's process (so that
        `thinkloop runs resume` elsewhere refuses it) only once it is sure to resume it, and takes that
        back if the resume then does not start after all.
        """
        if run_id in self._live or run_id in self._resuming:
            raise NotResumableError(f"run {run_id!r} is running in this server already")
        self._check_room()  # before anything is read or claimed: a full or closing server refuses at once
        self._resuming.add(run_id)  # holds its place among the active runs while the store is read
        try:
            state = await self._resumable(run_id, force)
            logged = await self.store.read_events(run_id)
            previous = await self._claim(state)
            if self._closing:  # the one refusal that can have come meanwhile: the run's place was held
                await self._release(state, previous)
                raise self._shutting_down()
            live = LiveRun(
                run_id=run_id,
                goal=state.goal,
                session=state.session,
                created_at=state.created_at,
                events=logged,  # a follower from `after=0` gets the logged events, then the new ones
            )
            self._launch(live, lambda: self._resumed(live, state, previous))
        finally:
            self._resuming.discard(run_id)
        return live

    async def _resumed(self, live: LiveRun, state: RunState, previous: _Claim) -> None:
        """The resumed run's task: `agent.resume()`. If that fails before the run emitted anything (an MCP
        server would not start, the store cannot be read …), the server's claim on the run is taken back:
        the run was not resumed, and `thinkloop runs resume` elsewhere may resume it."""
        logged = len(live.events)
        try:
            await self.agent.resume(live.run_id, on_event=live.publish)
        except Exception:
            if len(live.events) == logged:
                await self._release(state, previous)
            raise

    async def _resumable(self, run_id: str, force: bool) -> RunState:
        """The run's saved state, if this server may resume it (nothing is saved here)."""
        state = await self.store.load_state(run_id)
        if state is None:
            raise UnknownRunError(self.no_run(run_id))
        if state.finished:
            reason = state.stop_reason.value if state.stop_reason else state.phase
            raise NotResumableError(
                f"run {run_id!r} already ended ({reason}) and cannot be resumed: start a new run instead"
            )
        differs = self._other_setup(state)
        if differs:
            raise NotResumableError(
                f"run {run_id!r} was started with {differs}: this server would resume it with its own "
                f"tools and safety, not the run's. Resume it with `thinkloop runs resume {run_id} --store "
                "<this store>`, or from a server started with the run's options"
            )
        if not force and OWNER_KEY in state.metadata:
            try:
                check_not_running(run_id, state.metadata, force='the body {"force": true}')
            except StillRunningError as exc:
                raise NotResumableError(str(exc), forceable=True) from None
        return state

    def _other_setup(self, state: RunState) -> str:
        """How the command line a run was started with (`metadata["cli"]`: `thinkloop run` or another
        server) differs from this server's, in what a resume would change — tools, safety mode, working
        directory, MCP servers, hosts — as `--safety strict (this server: balanced)`; "" when it does not.
        A strict shell run resumed here ran its next command unapproved, in the server's directory."""
        run, own = state.metadata.get("cli"), self.metadata.get("cli")
        if not isinstance(run, dict) or not isinstance(own, dict):
            return ""
        differs = [
            f"--{key} {run.get(key)!r} (this server: {own.get(key)!r})"
            for key in ("safety", "tools", "workspace", "mcp", "hosts")
            if run.get(key) != own.get(key)
        ]
        return ", ".join(differs)

    async def _claim(self, state: RunState) -> _Claim:
        """Record this process as the run's own and save that (`thinkloop runs resume` elsewhere then refuses
        it); return what it replaced, for `_release`. A run no thinkloop command recorded its process in is
        left as it is (`_UNCLAIMED`)."""
        if OWNER_KEY not in state.metadata:
            return _UNCLAIMED
        previous = state.metadata[OWNER_KEY]
        claim(state.metadata)  # a new entry: `previous` is left as it was
        try:
            await self.store.checkpoint(state, [])
        except ConcurrencyError as exc:  # another process saved it meanwhile: forcing cannot change that
            state.metadata[OWNER_KEY] = previous
            raise NotResumableError(str(exc)) from None
        except BaseException:  # the store failed, or the request was cancelled: the claim may be saved
            await self._release(state, previous)
            raise
        return previous

    async def _release(self, state: RunState, previous: _Claim) -> None:
        """Take back a claim `_claim` saved: the run's process is again the one it replaced. Nothing is
        written if another process saved the run since (its state is newer than this one)."""
        if previous is _UNCLAIMED:
            return
        state.metadata[OWNER_KEY] = previous
        try:
            await self.store.checkpoint(state, [])
        except ConcurrencyError:
            pass
        except Exception as exc:
            logger.warning(
                "run %s was not resumed, but the server could not take back its claim on it (%r): "
                "`thinkloop runs resume` refuses it while this server runs, unless --force",
                state.run_id,
                exc,
            )

    def _check_room(self) -> None:
        """Raise `ShuttingDownError` or `TooManyRunsError` unless one more run may start (a run being
        resumed counts from the start of its `resume()`: nothing takes its place while the store is read)."""
        if self._closing:
            raise self._shutting_down()
        active = len(self._live) + len(self._resuming)
        if active >= self.max_active_runs:
            raise TooManyRunsError(
                f"the server is running {active} runs, its limit: try again when one has ended"
            )

    @staticmethod
    def _shutting_down() -> ShuttingDownError:
        return ShuttingDownError(
            "the server is shutting down and starts no more runs: try again when it is back"
        )

    def _launch(self, live: LiveRun, run: Callable[[], Awaitable[Any]]) -> None:
        self._live[live.run_id] = live
        live.task = asyncio.create_task(self._drive(live, run), name=f"thinkloop-run-{live.run_id}")

    async def _drive(self, live: LiveRun, run: Callable[[], Awaitable[Any]]) -> None:
        try:
            await run()
        except asyncio.CancelledError:
            if not live.events:
                logger.warning("run %s was cancelled before it started: nothing of it is saved", live.run_id)
            raise
        except Exception as exc:
            live.failure = f"{type(exc).__name__}: {exc}"
            logger.exception("run %s failed outside its loop", live.run_id)
            self._failed[live.run_id] = live.failure
            while len(self._failed) > MAX_FAILED:
                del self._failed[next(iter(self._failed))]
        finally:
            live.close()
            self._live.pop(live.run_id, None)

    def no_run(self, run_id: str) -> str:
        """What to answer for a run the store does not have: a run this server started may have failed
        before anything of it was saved (its store failing at once) — the client, told 202, learns why."""
        failure = self.failure(run_id)
        if failure is None:
            return f"no run {run_id!r}"
        return f"no run {run_id!r}: it failed before anything of it was saved ({failure})"

    def failure(self, run_id: str) -> str | None:
        """Why a run this server started failed outside its loop (one of the last `MAX_FAILED`), if it did."""
        return self._failed.get(run_id)

    def live(self, run_id: str) -> LiveRun | None:
        """The run if it is running in this server."""
        return self._live.get(run_id)

    def active(self) -> list[LiveRun]:
        return list(self._live.values())

    async def exists(self, run_id: str) -> bool:
        return run_id in self._live or await self.store.load_state(run_id) is not None

    def cancel(self, run_id: str) -> None:
        """Cancel a running run: it stops with `cancelled` (saved, with its `done` event).

        A run whose loop has not started yet is cancelled as soon as it has (so it is saved cleanly).
        """
        live = self._live.get(run_id)
        if live is None:
            raise NotRunningError(f"run {run_id!r} is not running in this server")
        live.cancel_requested = True
        if live.in_loop:
            live.cancel_task()

    async def shutdown(self, grace: float = 10.0) -> None:
        """Interrupt every running run and wait (up to `grace` seconds) until they are saved, unfinished and
        resumable (`Agent.interrupt`). From now on `start()` and `resume()` raise `ShuttingDownError`.

        A run accepted a moment ago whose loop has not started yet (its task has not run, or is connecting
        MCP servers) cannot be interrupted yet: it is interrupted as soon as it can be — after its first
        checkpoint, so it is saved and resumable too. Only one still not there after `grace` is cancelled.
        """
        self._closing = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        tasks = [live.task for live in self._live.values() if live.task is not None]
        starting = [live for live in self._live.values() if not self._interrupt(live)]
        while starting and loop.time() < deadline:
            await asyncio.sleep(SHUTDOWN_POLL)
            starting = [live for live in starting if not self._interrupt(live)]
        for live in starting:
            logger.warning(
                "run %s did not reach its first checkpoint before shutdown: cancelled", live.run_id
            )
            live.cancel_task()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=max(deadline - loop.time(), 0.0))
            if pending:
                logger.warning("%d run(s) did not stop within %g s of shutdown", len(pending), grace)

    def _interrupt(self, live: LiveRun) -> bool:
        """Interrupt the run if its loop is running (or its task is over); False while it is still starting."""
        return live.task is None or live.task.done() or bool(self.agent.interrupt(live.run_id))

    # ----------------------------------------------------------------------------------- events

    async def events_after(self, run_id: str, after: int = 0) -> list[Event]:
        """The run's events with `seq > after` so far (including those not yet checkpointed)."""
        live = self._live.get(run_id)
        if live is not None:
            return [e for e in live.events if e.seq > after]
        events = await self.store.read_events(run_id, after)
        if not events and run_id not in self._live and await self.store.load_state(run_id) is None:
            raise UnknownRunError(self.no_run(run_id))
        return events

    async def follow(self, run_id: str, after: int = 0) -> AsyncIterator[Event]:
        """The run's events with `seq > after`: those so far, then live ones, up to and including `done`.

        Raises `UnknownRunError`, `FollowerTooSlowError`, or `RunFailedError` (the run's task failed).
        """
        live = self._live.get(run_id)
        if live is None:
            async for event in self._follow_stored(run_id, after):
                yield event
            return
        queue: asyncio.Queue[_Item] = asyncio.Queue()
        live.followers.add(queue)
        snapshot = list(live.events)  # taken with the subscription: no event falls between them
        try:
            last = after
            for event in snapshot:
                if event.seq > last:
                    yield event
                    last = event.seq
                    if event.type == "done":
                        return
            while True:
                item = await queue.get()
                if item is _Signal.OVERFLOW:
                    raise FollowerTooSlowError(
                        f"the follower fell more than {MAX_QUEUED} events behind run {run_id!r}"
                    )
                if item is _Signal.END:
                    if live.failure is not None:
                        raise RunFailedError(live.failure)
                    return
                if item.seq > last:
                    yield item
                    last = item.seq
                    if item.type == "done":
                        return
        finally:
            live.followers.discard(queue)

    async def _follow_stored(self, run_id: str, after: int) -> AsyncIterator[Event]:
        """Follow a run from the store: its logged events, polled until `done` (for runs elsewhere)."""
        state = await self.store.load_state(run_id)
        if state is None:
            raise UnknownRunError(self.no_run(run_id))
        while True:
            if run_id in self._live:  # resumed in this server meanwhile: its events come live from now on
                async for event in self.follow(run_id, after):
                    yield event
                return
            for event in await self.store.read_events(run_id, after):
                yield event
                after = event.seq
                if event.type == "done":
                    return
            if (
                state is None or state.finished
            ):  # gone, or ended without a `done` in its log: nothing more comes
                return
            await asyncio.sleep(POLL_INTERVAL)
            state = await self.store.load_state(run_id)
