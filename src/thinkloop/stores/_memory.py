"""`MemoryStore`: everything in this process's memory (tests, and `Agent()` without a store)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence

from .._errors import ConcurrencyError
from .._events import Event
from .._state import RunState
from ._base import (
    MemoryEntry,
    MemoryRole,
    RunStatus,
    RunSummary,
    Store,
    as_saved,
    base_version,
    check_id,
    check_role,
    check_saves,
    clean_text,
    load_state_text,
    memory_turn,
    newest_runs,
    numbered,
    parse_event,
    to_json,
)

_WHERE = "the memory store"


class MemoryStore(Store):
    """A store in memory: states and events are kept as JSON, so stored runs never change under you.

    Args:
        max_runs: keep at most this many runs; beyond it the oldest finished runs (state and events)
            are forgotten, so a long-lived process does not grow without bound. None keeps all.
    """

    url = "memory:"

    def __init__(self, max_runs: int | None = None) -> None:
        self.max_runs = max_runs
        self._states: dict[str, tuple[str, RunSummary]] = {}
        self._events: dict[str, list[str]] = {}
        self._saves: dict[str, int] = {}  # each run's save count (`RunState.saves`)
        self._memory: dict[str, list[MemoryEntry]] = {}

    async def checkpoint(self, state: RunState, events: Sequence[Event]) -> None:
        run_id = check_id(state.run_id)
        expected = base_version(state, events)
        self._check_version(run_id, expected)
        check_saves(run_id, state.saves, self._saves.get(run_id))
        saved = to_json(as_saved(state))  # first: a state that cannot be saved leaves the events unsaved too
        state.saves += 1
        self._saves[run_id] = state.saves
        self._events.setdefault(run_id, []).extend(to_json(e) for e in events)
        summary = RunSummary.from_state(state)
        summary.goal = clean_text(summary.goal)  # as saved (text that UTF-8 cannot hold has U+FFFD)
        self._states[run_id] = (saved, summary)
        for role, content in memory_turn(state, events):
            self._remember(state.session or "", role, content)
        if self.max_runs is not None and len(self._states) > self.max_runs and state.finished:
            self._forget_finished()

    def _forget_finished(self) -> None:
        assert self.max_runs is not None
        for run_id in [r for r, (_, s) in self._states.items() if s.status != "running"]:
            if len(self._states) <= self.max_runs:
                break
            del self._states[run_id]
            self._events.pop(run_id, None)
            self._saves.pop(run_id, None)

    async def load_state(self, run_id: str) -> RunState | None:
        stored = self._states.get(check_id(run_id))
        return None if stored is None else load_state_text(run_id, stored[0], _WHERE)

    async def append_events(self, run_id: str, events: Sequence[Event], expected_version: int) -> int:
        self._check_version(check_id(run_id), expected_version)
        log = self._events.setdefault(run_id, [])
        log.extend(to_json(e) for e in numbered(run_id, events, expected_version))
        return len(log)

    async def read_events(self, run_id: str, after: int = 0) -> list[Event]:
        log = self._events.get(check_id(run_id), [])
        start = max(after, 0)
        return [parse_event(run_id, text, _WHERE, start + i) for i, text in enumerate(log[start:], 1)]

    async def list_runs(
        self, limit: int = 50, *, status: RunStatus | None = None, session: str | None = None
    ) -> list[RunSummary]:
        rows = newest_runs([s for _, s in self._states.values()], limit, status, session)
        return [r.model_copy() for r in rows]

    async def add_memory(self, session: str, role: MemoryRole, content: str) -> None:
        self._remember(check_id(session, "session id"), check_role(role), content)

    async def get_memory(self, session: str, limit: int | None = None) -> list[MemoryEntry]:
        entries = self._memory.get(check_id(session, "session id"), [])
        if limit is not None:
            entries = entries[-limit:] if limit > 0 else []
        return [e.model_copy() for e in entries]

    def _check_version(self, run_id: str, expected: int) -> None:
        actual = len(self._events.get(run_id, []))
        if actual != expected:
            raise ConcurrencyError(run_id, expected, actual)

    def _remember(self, session: str, role: MemoryRole, content: str) -> None:
        self._memory.setdefault(session, []).append(
            MemoryEntry(session=session, role=role, content=clean_text(content), time=time.time())
        )


class InProcessStore(MemoryStore):
    """The default of `Agent(store=None)`: the live state of each run and the session memory.

    Unlike `MemoryStore` it keeps no copies and no event log, so a checkpoint costs next to nothing;
    `load_state()` returns a deep copy, so a resumed run never shares objects with the old one. Runs
    survive only as long as the process: use `SQLiteStore` or `PostgresStore` to survive crashes.
    """

    url = "memory:in-process"
    keeps_events = False  # runs without a listener skip building events altogether
    live = True  # it holds the state object itself: a run saves it once, then only when it ends

    def __init__(self, max_runs: int | None = 1000) -> None:
        super().__init__(max_runs)
        self._live: dict[str, RunState] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()  # ids of finished runs, oldest first
        self._remembered: set[str] = set()

    async def checkpoint(self, state: RunState, events: Sequence[Event]) -> None:
        existing = self._live.get(state.run_id)
        if existing is None:
            check_id(state.run_id)
        elif existing is not state and existing.created_at != state.created_at:
            # another run under a taken id (a resumed copy has the run's creation time): refused like
            # the other stores refuse it, not written over the run and its session turn
            raise ConcurrencyError(state.run_id, 0, existing.event_version)
        self._live[state.run_id] = state  # a resumed copy replaces the old object
        if (
            state.session is not None
            and state.finished
            and state.answer
            and state.run_id not in self._remembered
        ):
            self._remembered.add(state.run_id)  # one turn per run, like the other stores' `done` check
            self._remember(state.session, "user", state.goal)
            self._remember(state.session, "assistant", state.answer)
        if state.finished:
            self._finished[state.run_id] = None
            if self.max_runs is not None:
                self._forget_oldest(self.max_runs)

    def _forget_oldest(self, max_runs: int) -> None:
        """Forget the oldest finished runs beyond `max_runs` (O(1) per run: finished ids are kept in order)."""
        while len(self._live) > max_runs and self._finished:
            # O(1): finding a plain dict's first key is O(n) once keys before it were deleted
            run_id, _ = self._finished.popitem(last=False)
            state = self._live.get(run_id)
            if state is not None and state.finished:  # a run resumed since is live again: kept
                del self._live[run_id]
                self._remembered.discard(run_id)

    async def load_state(self, run_id: str) -> RunState | None:
        state = self._live.get(check_id(run_id))
        return None if state is None else state.model_copy(deep=True)

    async def append_events(self, run_id: str, events: Sequence[Event], expected_version: int) -> int:
        state = self._live.get(check_id(run_id))
        actual = state.event_version if state is not None else 0
        if actual != expected_version:
            raise ConcurrencyError(run_id, expected_version, actual)
        return expected_version + len(events)  # the in-process store keeps no event log

    async def read_events(self, run_id: str, after: int = 0) -> list[Event]:
        return []

    async def list_runs(
        self, limit: int = 50, *, status: RunStatus | None = None, session: str | None = None
    ) -> list[RunSummary]:
        return newest_runs([RunSummary.from_state(s) for s in self._live.values()], limit, status, session)
