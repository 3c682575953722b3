"""The `Store` interface (SPEC §9) and the helpers its implementations share.

A store keeps, per run, the latest `RunState` and an append-only event log with optimistic concurrency;
per session, a conversation memory. `checkpoint(state, events)` saves the state and appends the events
in one transaction: the log's version must be `state.event_version - len(events)` or nothing is written
and `ConcurrencyError` is raised (so two processes resuming the same run cannot both write it) — or, when
the log is behind that version (events lost: no writer raced this one), `DamagedRunError` (`lost_events`).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import logging
import operator
import os
import pathlib
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticSerializationError

from .. import _json
from .._errors import ConcurrencyError, ConfigurationError, StateError, UserError
from .._events import Event, event_from_json
from .._messages import Message, Usage
from .._state import LedgerEntry, RunState

if TYPE_CHECKING:
    from pydantic import TypeAdapter

T = TypeVar("T")
logger = logging.getLogger("thinkloop.stores")
RunStatus = Literal["running", "done", "error"]
MemoryRole = Literal["system", "user", "assistant"]

_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,200}")


class RunSummary(BaseModel):
    """One line of `list_runs()`: what a run is and how far it got, without its messages."""

    model_config = ConfigDict(extra="forbid", defer_build=True)  # built at first use: import stays fast

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

    model_config = ConfigDict(extra="forbid", defer_build=True)

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

        Raises `ConcurrencyError` when the run's log is past `state.event_version - len(events)` (another
        writer saved it); a file or database store raises `DamagedRunError` (a `StateError`) when it is
        behind (events it held were lost).
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
        shown = (
            repr(value)
            if not isinstance(value, str) or len(value) <= 80
            else f"{value[:60]!r}… ({len(value):,} characters)"
        )
        raise ConfigurationError(
            f"invalid {what} {shown}: use 1-200 characters of letters, digits, '_', '-' and '.' "
            "(no '..', no '/')"
        )
    return value


def newest_runs(
    rows: Sequence[RunSummary], limit: int, status: RunStatus | None, session: str | None
) -> list[RunSummary]:
    """`list_runs()` of a store that holds its summaries in memory: those of `status` and `session`, the most
    recently updated first, at most `limit`."""
    kept = [
        r
        for r in rows
        if (status is None or r.status == status) and (session is None or r.session == session)
    ]
    kept.sort(key=lambda r: r.updated_at, reverse=True)
    return kept[: check_limit(limit)]


def check_limit(limit: int) -> int:
    """`list_runs()`'s `limit`: a whole number of runs, 0 or more (`ConfigurationError` otherwise)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ConfigurationError(f"list_runs() limit must be a whole number, 0 or more, not {limit!r}")
    return limit


def file_in_the_way(path: pathlib.Path) -> pathlib.Path | None:
    """The regular file among `path`'s parent directories, if one is (`a-file/runs.db`): no store can be
    made under it."""
    return next((parent for parent in path.parents if parent.is_file()), None)


def check_goal(goal: object) -> str:
    """A run's goal: a string that is not blank and holds no NUL character (`UserError` otherwise). Every
    entry point takes the same goals — PostgreSQL text (a `PostgresStore`'s memory, the job queue) cannot
    hold a NUL, so no goal has one. What a run produces may: tool outputs and model replies with NULs are
    kept by every store (escaped in the JSON of states and events)."""
    if not isinstance(goal, str) or not goal.strip():
        raise UserError(f"the goal must be a non-empty string, got {goal!r}")
    nul = goal.find("\x00")
    if nul >= 0:
        raise UserError(
            f"the goal holds a NUL character (\\x00) at character {nul + 1} of {len(goal)}, which a goal "
            "cannot hold (PostgreSQL text cannot store it): remove it from the goal"
        )
    return goal


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


def as_saved(state: RunState) -> RunState:
    """`state` as a checkpoint writes it: a shallow copy whose save count (`saves`) is one more. The store
    sets `state.saves` to it once the checkpoint is written (events serialised with the state — `done`
    carries it — keep the count it had, as printed when they were emitted)."""
    return state.model_copy(update={"saves": state.saves + 1})


def check_saves(run_id: str, expected: int, stored: object) -> None:
    """Raise `ConcurrencyError` when a run's stored save count (`stored`: None when the store holds no
    such count — no run, or one saved by an older thinkloop) is not the `expected` one. A state that was
    never saved nor loaded (`expected` 0: made by hand, or by an older thinkloop) is checked by its event
    version alone, as before."""
    if expected and isinstance(stored, int) and stored != expected:
        raise ConcurrencyError(run_id, expected, stored, saved_since=True)


def first_save_failed(error: StateError, run_id: str) -> StateError:
    """The failure of a run's first save (its log at version 0): nothing of the run is stored, so the
    message says there is nothing to resume. A later save that fails leaves the last one, which a resume
    continues from (the loop says so)."""
    return StateError(
        f"{error}; nothing of run {run_id!r} was saved (this was its first save), so there is nothing to "
        "resume: start it again"
    )


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


DAMAGED = "the store is left as it is: restore it from a backup"


class DamagedRunError(StateError):
    """What the store holds of a run cannot be loaded (corrupt, missing rows, from a newer thinkloop): the
    store answered, so trying again cannot help — unlike a store that failed (unreachable, locked).
    `what` says what is wrong; the message adds what to do."""

    def __init__(self, what: str, advice: str = "") -> None:
        super().__init__(f"{what}; {advice}" if advice else what)
        self.what = what


def load_state_text(run_id: str, text: str | bytes, where: str = "") -> RunState:
    """Parse a stored state; corrupt or too-new data, or the state of another run (a file copied or renamed
    in a `FileStore`), raises `StateError` naming the run and `where` it is stored (a file, a database)."""
    try:
        state = RunState.from_json(text)
    except StateError as exc:
        newer = "newer than this thinkloop" in str(exc)  # says what to do: upgrade
        advice = "" if newer else f"{DAMAGED}, or start the run again under another id"
        raise DamagedRunError(f"run {run_id!r}{_in(where)}: {exc}", advice) from exc
    if state.run_id != run_id:
        if _no_run_id(text):  # not another run's: its random default (`{}` loads as a new state)
            raise DamagedRunError(
                f"run {run_id!r}{_in(where)}: the state stored under that id has no run id",
                f"{DAMAGED}, or start the run again under another id",
            )
        raise DamagedRunError(
            f"run {run_id!r}{_in(where)}: the state stored under that id is run {state.run_id!r}'s (a file copied "
            "or renamed?)",
            "put it back under its own id, or load that id",
        )
    return state


def _no_run_id(text: str | bytes) -> bool:
    """Whether a stored state (one that loads) holds no `run_id` field of its own."""
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        return False
    return isinstance(raw, dict) and "run_id" not in raw


def lost_events(run_id: str, where: str, saved: int, logged: int) -> DamagedRunError:
    """What a checkpoint raises when the run's event log ends at `logged`, behind the `saved` version of
    the state being saved (loaded from the store): events the store committed are gone — the log was cut,
    deleted or restored from an older backup. No writer raced this one (that leaves the log ahead: a
    `ConcurrencyError`), so trying again cannot help; the state itself still loads."""
    if logged == 0:
        log = f"holds no events, but its state was saved at event {saved}: all {saved} are lost"
    else:
        lost = f"event {saved} is" if saved == logged + 1 else f"events {logged + 1}-{saved} are"
        log = f"ends at event {logged}, but its state was saved at event {saved}: {lost} lost"
    return DamagedRunError(
        f"run {run_id!r}{_in(where)}: its event log {log} (deleted, or the log trimmed or restored from an "
        "older backup) — not a race with another writer: trying again cannot help",
        f"its state is intact (`thinkloop runs export {run_id}` writes it and the events left); {_AGAIN}",
    )


def parse_event(run_id: str, text: str | bytes, where: str = "", number: int | None = None) -> Event:
    """Parse a stored event (`number`: its seq, when known); a corrupt one raises `StateError` naming it."""
    try:
        return event_from_json(text)
    except ValueError as exc:
        which = f"its event {number}" if number is not None else "a stored event"
        raise StateError(
            f"run {run_id!r}{_in(where)}: {which} is corrupt ({problem(exc)}); {DAMAGED}"
        ) from exc


def parse_summaries(rows: Sequence[tuple[str, str]], where: str) -> list[RunSummary]:
    """The summaries of `(run_id, summary JSON)` rows; a corrupt one is left out with a warning (one damaged
    row must not hide every run: `load_state` reports the run itself)."""
    out = []
    for run_id, text in rows:
        try:
            out.append(RunSummary.model_validate_json(text))
        except ValueError as exc:
            logger.warning(
                "run %r%s: its summary is corrupt (%s); left out of the listing",
                run_id,
                _in(where),
                problem(exc),
            )
    return out


def problem(exc: Exception) -> str:
    """What is wrong with stored data, in a line: pydantic's first error without its type dump and link."""
    if isinstance(exc, ValidationError):
        errors = exc.errors(include_url=False)
        if errors:
            first = errors[0]
            loc = first["loc"][1:] if first["loc"] and isinstance(first["loc"][0], int) else first["loc"]
            path = ".".join(str(p) for p in loc)  # (a leading number is the row: said by the caller)
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            return f"{path + ': ' if path else ''}{first['msg']}{more}"
    return " ".join(str(exc).split())


def _in(where: str) -> str:
    return f" in {where}" if where else ""


# ================================================================================ text a store can hold


def clean_text(text: str) -> str:
    """`text` with lone surrogates (`"\\ud800"`: a JSON escape of half an emoji, a file name decoded with
    `surrogateescape`) replaced by U+FFFD: UTF-8, and so no file or database, can hold them."""
    return _json.valid_text(text)


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


# ====================================================== what a checkpoint writes: only what changed

LEDGER_FIELDS = tuple(f.name for f in dataclasses.fields(LedgerEntry))
_ledger_values = operator.attrgetter(*LEDGER_FIELDS)  # an entry's fields as a tuple, compared at C speed


@dataclass(frozen=True, slots=True)
class Saved:
    """What a store last saved (or loaded) of a run, to write only what changed at its next checkpoint:
    the `token` of that save, the message objects, and the ledger's keys and each entry's field values
    (`keys` None: the database holds no ledger rows of the run that can be trusted)."""

    token: str
    messages: list[Message]
    keys: list[str] | None
    values: list[tuple[Any, ...]]

    @classmethod
    def of(cls, token: str, state: RunState, *, ledger: bool = True) -> Saved:
        keys, values = (
            (list(state.ledger), list(map(_ledger_values, state.ledger.values()))) if ledger else (None, [])
        )
        return cls(token, list(state.messages), keys, values)


@dataclass(frozen=True, slots=True)
class Delta:
    """The messages and ledger entries a checkpoint writes, each part as rows of its own table.

    When the database still holds what this store saved last (the run's token there is `base`: nobody
    saved the run since) only the change is written: the messages after the `message_start` ones the
    database holds — when the state still holds those very message objects (`is`: messages are never
    changed in place, a changed one is a new object) — and the ledger entries that are new or whose fields
    changed (compared with their values at the last save; an entry's `arguments` are never changed in
    place either) — when the ledger still starts with the keys saved, in their order. Otherwise a part is
    written whole, replacing what the database holds: a run resumed from an older checkpoint (its history
    not an extension of what was saved), another process having saved the run, a store that does not know
    the run yet. The rows are made when the checkpoint is taken, from the state as it is then (a parallel
    tool call changing an entry afterwards is seen by the next checkpoint)."""

    token: str  # this save's token
    base: str | None  # the token the database must hold for the changes alone to be written
    messages: list[Message]  # the state's messages at the checkpoint
    message_start: int  # how many of them the database holds when it is at `base` (0: write them all)
    new_messages: list[tuple[int, str]]  # (index, JSON) of the messages from `message_start` on
    keys: list[str]  # the ledger's keys at the checkpoint, in order
    values: list[tuple[Any, ...]]  # each entry's field values at the checkpoint
    ledger_kept: bool  # the database, at `base`, holds the saved ledger, which `keys` extends
    changed: list[
        tuple[int, str, str]
    ]  # (index, key as JSON, JSON) of the entries new or changed since `base`

    @classmethod
    def of(cls, state: RunState, saved: Saved | None) -> Delta:
        messages = list(state.messages)
        keys, entries = list(state.ledger), list(state.ledger.values())
        values = list(map(_ledger_values, entries))
        start = _kept_messages(messages, saved)
        kept = saved is not None and saved.keys is not None and keys[: len(saved.keys)] == saved.keys
        if kept and saved is not None:
            old = len(saved.values)
            differ = itertools.compress(itertools.count(), map(operator.ne, values, saved.values))
            indices: Sequence[int] = [*differ, *range(old, len(keys))]
        else:
            indices = range(len(keys))
        return cls(
            token=os.urandom(12).hex(),
            base=saved.token if saved is not None and (start or kept) else None,
            messages=messages,
            message_start=start,
            new_messages=[(i, to_json(messages[i])) for i in range(start, len(messages))],
            keys=keys,
            values=values,
            ledger_kept=kept,
            changed=[(i, _key_json(keys[i]), to_json(entries[i])) for i in indices],
        )

    def message_rows(self, current: bool) -> tuple[bool, list[tuple[int, str]]]:
        """Whether the stored messages are replaced, and the rows to write; `current`: the database is at
        `base` (read in the checkpoint's transaction)."""
        if current and self.message_start:
            return False, self.new_messages
        earlier = [(i, to_json(self.messages[i])) for i in range(self.message_start)]
        return True, earlier + self.new_messages

    def ledger_rows(self, current: bool) -> tuple[bool, list[tuple[int, str, str]]]:
        """Whether the stored ledger is replaced, and the rows to write (see `message_rows`)."""
        if current and self.ledger_kept:
            return False, self.changed
        if len(self.changed) == len(self.keys):  # all of them made already
            return True, self.changed
        return True, [
            (i, _key_json(key), to_json(LedgerEntry(**dict(zip(LEDGER_FIELDS, values, strict=True)))))
            for i, (key, values) in enumerate(zip(self.keys, self.values, strict=True))
        ]

    def saved(self) -> Saved:
        """What the database holds of the run once this checkpoint is committed."""
        return Saved(self.token, self.messages, self.keys, self.values)


REMEMBERED_RUNS = 64  # runs whose last save a store remembers (to write only what changed)


class SavedRuns:
    """What a store last saved of each run (`Saved`), for at most `REMEMBERED_RUNS` runs, the least recently
    saved forgotten first (their next save rewrites their messages and ledger once); thread-safe."""

    def __init__(self) -> None:
        self._saved: dict[str, Saved] = {}
        self._lock = threading.Lock()

    def recall(self, run_id: str) -> Saved | None:
        with self._lock:
            return self._saved.get(run_id)

    def remember(self, run_id: str, saved: Saved | None) -> None:
        """Keep what was saved of the run (None: forget it; a finished run is not written again)."""
        with self._lock:
            self._saved.pop(run_id, None)
            if saved is not None:
                self._saved[run_id] = saved
            while len(self._saved) > REMEMBERED_RUNS:
                del self._saved[next(iter(self._saved))]


@dataclass(frozen=True, slots=True)
class CheckpointRows:
    """What a database store writes at a checkpoint: the events' rows, the run's row and the delta of its
    messages and ledger (`Delta`), with the event version the database must hold."""

    run_id: str
    expected: int
    events: Sequence[tuple[str, int, str, str]]
    run: tuple[Any, ...]  # run_id, head, summary, status, session, updated_at, messages, ledger, token, saves
    delta: Delta
    now: float
    saves: int  # the save count the database must hold (`check_saves`); the run's row gets the next

    @classmethod
    def of(cls, state: RunState, events: Sequence[Event], saved: Saved | None) -> CheckpointRows:
        """The rows of a checkpoint of `state`; once written, the store counts it (`state.saves += 1`)."""
        run_id = check_id(state.run_id)
        now = time.time()
        summary = RunSummary.from_state(state, updated_at=now)
        delta = Delta.of(state, saved)
        run = (
            run_id, head_json(state), to_json(summary), summary.status, state.session, now,
            len(delta.messages), len(delta.keys), delta.token, state.saves + 1,
        )  # fmt: skip
        rows = [(run_id, e.seq, e.type, to_json(e)) for e in events]
        return cls(run_id, base_version(state, events), rows, run, delta, now, state.saves)


def _key_json(key: str) -> str:
    """A ledger key as a JSON string: any key round-trips, as in the state's JSON (a NUL escaped, which
    PostgreSQL TEXT cannot hold; a lone surrogate, which UTF-8 cannot, as U+FFFD)."""
    return json.dumps(clean_text(key))


def _kept_messages(messages: list[Message], saved: Saved | None) -> int:
    """How many of `messages` are the very objects saved last (0 when the history is not an extension)."""
    if saved is None or len(saved.messages) > len(messages):
        return 0
    return len(saved.messages) if all(map(operator.is_, saved.messages, messages)) else 0


def stored_ledger(
    run_id: str, rows: Sequence[tuple[str, str]], count: int, where: str = ""
) -> dict[str, LedgerEntry]:
    """A ledger read from its rows (key as JSON, entry as JSON: `count` of them expected, in order);
    missing or corrupt rows raise a `StateError` naming the run and `where` it is stored."""
    texts = [row[1] for row in rows]
    run = f"run {run_id!r}{_in(where)}"
    _check_count(run, count, "ledger entries")
    if len(texts) != count:
        raise DamagedRunError(
            f"{run}: {count - len(texts)} of its {count} stored ledger entries are missing", _AGAIN
        )
    try:
        entries = _list_of(LedgerEntry).validate_json("[" + ",".join(texts) + "]")
        keys = _list_of(str).validate_json("[" + ",".join(row[0] for row in rows) + "]")
    except ValueError as exc:
        raise DamagedRunError(
            f"{run}: {_which(exc, 'ledger entry')} is corrupt ({problem(exc)})", _AGAIN
        ) from exc
    ledger = dict(zip(keys, entries, strict=True))
    if len(ledger) != count:
        raise DamagedRunError(f"{run}: its stored ledger names a tool call twice", _AGAIN)
    return ledger


def stored_messages(run_id: str, texts: list[str], count: int, where: str = "") -> list[Message]:
    """Messages read from their rows (`count` of them expected, in order); missing or corrupt rows raise a
    `StateError` naming the run and `where` it is stored."""
    run = f"run {run_id!r}{_in(where)}"
    _check_count(run, count, "messages")
    if len(texts) != count:
        raise DamagedRunError(
            f"{run}: {count - len(texts)} of its {count} stored messages are missing", _AGAIN
        )
    try:
        return _list_of(Message).validate_json("[" + ",".join(texts) + "]")
    except ValueError as exc:
        raise DamagedRunError(f"{run}: {_which(exc, 'message')} is corrupt ({problem(exc)})", _AGAIN) from exc


_AGAIN = f"{DAMAGED}, or start the run again"


def _check_count(run: str, count: object, what: str) -> None:
    """A stored count of rows that is no count (text, negative: an edited or damaged row) is damage too."""
    if type(count) is not int or count < 0:
        raise DamagedRunError(f"{run}: its stored number of {what} is {count!r}, not a count", _AGAIN)


def _which(exc: ValueError, what: str) -> str:
    """`its message 3` when the error says which row of the list (its first part) is at fault."""
    if isinstance(exc, ValidationError):
        errors = exc.errors(include_url=False)
        if errors and errors[0]["loc"] and isinstance(errors[0]["loc"][0], int):
            return f"its {what} {errors[0]['loc'][0] + 1}"
    return f"a stored {what}"


@functools.cache
def _list_of(kind: type[T]) -> TypeAdapter[list[T]]:
    from pydantic import TypeAdapter

    return TypeAdapter(list[kind])  # type: ignore[valid-type]


def head_json(state: RunState) -> str:
    """The state without its messages and ledger (kept in rows of their own), as JSON."""
    return to_json(state.model_copy(update={"messages": [], "ledger": {}, "saves": state.saves + 1}))
