"""The `Store` interface (SPEC §9) and the helpers its implementations share.

A store keeps, per run, the latest `RunState` and an append-only event log with optimistic concurrency;
per session, a conversation memory. `checkpoint(state, events)` saves the state and appends the events
in one transaction: the log's version must be `state.event_version - len(events)` or nothing is written
and `ConcurrencyError` is raised (so two processes resuming the same run cannot both write it).
"""

from __future__ import annotations

import re
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import PydanticSerializationError

from .._errors import ConfigurationError, StateError
from .._events import Event, event_from_json
from .._messages import Usage
from .._state import RunState

RunStatus = Literal["running", "done", "error"]
MemoryRole = Literal["system", "user", "assistant"]

_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,200}")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")


class RunSummary(BaseModel):
    """One line of `list_runs()`: what a run is and how far it got, without its messages."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    agent_name: str = "agent"
    model: str = ""
    goal: str = ""
    session: str | None = None
    status: RunStatus = "running"
    phase: str = "thinking"
    stop_reason: str | None = None
    step: int = 0
    tool_calls: int = 0
    usage: Usage = Field(default_factory=Usage)
    created_at: float = 0.0
    updated_at: float = 0.0
    ended_at: float | None = None
    event_version: int = 0

    @classmethod
    def from_state(cls, state: RunState, *, updated_at: float | None = None) -> RunSummary:
        return cls(
            run_id=state.run_id,
            agent_name=state.agent_name,
            model=state.model,
            goal=state.goal,
            session=state.session,
            status=run_status(state),
            phase=state.phase,
            stop_reason=state.stop_reason.value if state.stop_reason else None,
            step=state.step,
            tool_calls=state.tool_calls,
            usage=state.usage.copy(),
            created_at=state.created_at,
            updated_at=updated_at if updated_at is not None else time.time(),
            ended_at=state.ended_at,
            event_version=state.event_version,
        )


class MemoryEntry(BaseModel):
    """One message of a session's conversation memory."""

    model_config = ConfigDict(extra="forbid")

    session: str
    role: MemoryRole
    content: str
    time: float = Field(default_factory=time.time)


class Store(ABC):
    """Where runs, their event logs and conversation memory live. Every method is async.

    Implementations: `SQLiteStore` (the embedded default), `PostgresStore`, `MemoryStore`, `FileStore`;
    `open_store(url)` picks one from a URL. A store may be used as `async with store: ...`.
    """

    url: str = ""

    @abstractmethod
    async def checkpoint(self, state: RunState, events: Sequence[Event]) -> None:
        """Save `state` and append `events` (numbered by the loop) in one transaction.

        Raises `ConcurrencyError` when the run's log is not at `state.event_version - len(events)`.
        When `events` holds the run's `done` event and the run has a session and an answer, the goal
        and the answer are added to the session's memory in the same transaction.
        """

    @abstractmethod
    async def load_state(self, run_id: str) -> RunState | None:
        """The run's last saved state, or None; a corrupt or too-new state raises `StateError`."""

    @abstractmethod
    async def append_events(self, run_id: str, events: Sequence[Event], expected_version: int) -> int:
        """Append `events` to the run's log if it is at `expected_version`; return the new version.

        The events are numbered `expected_version + 1 …` (their `seq` and `run_id` are set here).
        Raises `ConcurrencyError` when another writer got there first.
        """

    @abstractmethod
    async def read_events(self, run_id: str, after: int = 0) -> list[Event]:
        """The run's events with `seq > after`, in order."""

    @abstractmethod
    async def list_runs(
        self, limit: int = 50, *, status: RunStatus | None = None, session: str | None = None
    ) -> list[RunSummary]:
        """The most recently updated runs first."""

    @abstractmethod
    async def add_memory(self, session: str, role: MemoryRole, content: str) -> None:
        """Append one message to a session's conversation memory."""

    @abstractmethod
    async def get_memory(self, session: str, limit: int | None = None) -> list[MemoryEntry]:
        """A session's memory, oldest first; with `limit`, only the last `limit` messages."""

    async def aclose(self) -> None:
        """Release connections and threads. The store must not be used afterwards."""
        return None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"


# ============================================================================================ helpers


def check_id(value: str, what: str = "run id") -> str:
    """Refuse ids that could escape a directory or a key space: only `[A-Za-z0-9_.-]`, no `..`."""
    if not isinstance(value, str) or not _ID_RE.fullmatch(value) or ".." in value or value in (".",):
        raise ConfigurationError(
            f"invalid {what} {value!r}: use 1-200 characters of letters, digits, '_', '-' and '.' "
            "(no '..', no '/')"
        )
    return value


def check_role(role: str) -> MemoryRole:
    if role not in ("system", "user", "assistant"):
        raise ConfigurationError(f"memory role must be 'system', 'user' or 'assistant', not {role!r}")
    return role  # type: ignore[return-value]


def run_status(state: RunState) -> RunStatus:
    if state.phase == "done":
        return "done"
    if state.phase == "error":
        return "error"
    return "running"


def base_version(state: RunState, events: Sequence[Event]) -> int:
    """The version the log must be at before `events` are appended by a checkpoint of `state`."""
    expected = state.event_version - len(events)
    for offset, event in enumerate(events, start=1):
        if event.seq != expected + offset or event.run_id != state.run_id:
            raise StateError(
                f"checkpoint of run {state.run_id!r}: event {event.type!r} has seq {event.seq} "
                f"(run {event.run_id!r}), expected seq {expected + offset}: events must come from the run's loop"
            )
    return expected


def numbered(run_id: str, events: Sequence[Event], expected_version: int) -> list[Event]:
    """Copies of `events` carrying `run_id` and the seq numbers that follow `expected_version`."""
    return [
        e.model_copy(update={"run_id": run_id, "seq": expected_version + i})
        for i, e in enumerate(events, start=1)
    ]


def memory_turn(state: RunState, events: Sequence[Event]) -> list[tuple[MemoryRole, str]]:
    """The messages a finishing checkpoint adds to the session memory: the goal and the answer."""
    if state.session is None or not state.answer or not any(e.type == "done" for e in events):
        return []
    return [("user", state.goal), ("assistant", state.answer)]


def load_state_text(run_id: str, text: str | bytes) -> RunState:
    """Parse a stored state; corrupt or too-new data, or the state of another run (a file copied or renamed
    in a `FileStore`), raises `StateError` naming the run."""
    try:
        state = RunState.from_json(text)
    except StateError as exc:
        raise StateError(f"run {run_id!r}: {exc}") from exc
    if state.run_id != run_id:
        raise StateError(
            f"run {run_id!r}: the state stored under that id is run {state.run_id!r}'s (a file copied or renamed?): "
            "put it back under its own id, or load that id"
        )
    return state


def parse_event(run_id: str, text: str | bytes) -> Event:
    try:
        return event_from_json(text)
    except ValueError as exc:
        raise StateError(f"run {run_id!r}: a stored event is corrupt: {exc}") from exc


# ================================================================================ text a store can hold


def clean_text(text: str) -> str:
    """`text` with lone surrogates (`"\\ud800"`: a JSON escape of half an emoji, a file name decoded with
    `surrogateescape`) replaced by U+FFFD: UTF-8, and so no file or database, can hold them."""
    return _SURROGATE_RE.sub("\ufffd", text) if _SURROGATE_RE.search(text) else text


def to_json(model: Any) -> str:
    """`model.model_dump_json()` (a state's `to_json()`), which fails on text with lone surrogates:
    U+FFFD takes their place."""
    try:
        return _dump(model)
    except PydanticSerializationError:
        clean = type(model).model_validate(_clean_tree(model.model_dump(mode="json")))
        return _dump(clean)  # still failing: not a surrogate, the error is the caller's


def _dump(model: Any) -> str:
    text: str = model.to_json() if isinstance(model, RunState) else model.model_dump_json()
    return text


def _clean_tree(value: object) -> object:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(k) if isinstance(k, str) else k: _clean_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean_tree(v) for v in value]
    return value
