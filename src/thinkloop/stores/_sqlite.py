"""`SQLiteStore`: the embedded default store (SPEC §9.4).

One file (by default `$THINKLOOP_HOME/thinkloop.db`, else the user data directory), in WAL mode with a
busy timeout, so several processes on one machine can share it. A checkpoint is one `BEGIN IMMEDIATE …
COMMIT` transaction with cached statements and `synchronous=NORMAL` (durable against process crashes;
a power cut may lose the last few commits, never corrupt the file). A run's messages are kept append-only
in their own table, one row each, and the rest of its state in its `runs` row: a checkpoint writes only
the messages added since this store last saved the run, so the history's messages do not make it grow
(see `_MessageWrite`). It runs inline when the write lock
is free at once (~0.1 ms, no thread hop); when another process holds the lock, the store's worker
thread waits for it (up to `busy_timeout`) so the event loop never blocks on another process.
"""

from __future__ import annotations

import asyncio
import contextlib
import operator
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .._errors import ConcurrencyError, StateError
from .._events import Event
from .._messages import Message
from .._state import RunState
from ._base import (
    MemoryEntry,
    MemoryRole,
    RunStatus,
    RunSummary,
    Store,
    base_version,
    check_id,
    check_role,
    clean_text,
    load_state_text,
    memory_turn,
    numbered,
    parse_event,
    to_json,
)

if TYPE_CHECKING:
    from pydantic import TypeAdapter

T = TypeVar("T")

# 1: the whole state, messages included, in `runs.state`.
# 2: the messages in `messages`, one row each; `runs.state` holds the state without them, and
#    `runs.message_count` how many there are (NULL: a version-1 row, its messages inline, read as such);
#    `runs.token` changes at every save, so a store can tell whether the run was saved by someone else since.
SCHEMA_VERSION = 2
WAL_CHECKPOINT_EVERY = 200  # writes between background WAL checkpoints
REMEMBERED_RUNS = 64  # runs whose saved messages a store remembers (to append only the new ones)

_MESSAGES_TABLE = """CREATE TABLE IF NOT EXISTS messages (
        run_id TEXT NOT NULL, idx INTEGER NOT NULL, data TEXT NOT NULL, PRIMARY KEY (run_id, idx))"""
_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS runs (
        run_id TEXT PRIMARY KEY, state TEXT NOT NULL, summary TEXT NOT NULL, status TEXT NOT NULL,
        session TEXT, updated_at REAL NOT NULL, message_count INTEGER, token TEXT)""",
    "CREATE INDEX IF NOT EXISTS runs_updated ON runs (updated_at)",
    """CREATE TABLE IF NOT EXISTS events (
        run_id TEXT NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL, data TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS memory (
        id INTEGER PRIMARY KEY AUTOINCREMENT, session TEXT NOT NULL, role TEXT NOT NULL,
        content TEXT NOT NULL, time REAL NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS memory_session ON memory (session, id)",
    _MESSAGES_TABLE,
]
# What brings a database of version N - 1 to version N (a new database gets `_SCHEMA` at once). Runs saved
# before keep their inline messages until their next checkpoint, which moves them (nothing is rewritten here,
# so the upgrade is instant however many runs the file holds).
_MIGRATIONS = {
    2: [
        "ALTER TABLE runs ADD COLUMN message_count INTEGER",
        "ALTER TABLE runs ADD COLUMN token TEXT",
        _MESSAGES_TABLE,
    ],
}

_VERSION_SQL = "SELECT coalesce(max(seq), 0) FROM events WHERE run_id = ?"
_EVENT_SQL = "INSERT INTO events (run_id, seq, type, data) VALUES (?, ?, ?, ?)"
_RUN_SQL = (
    "INSERT INTO runs (run_id, state, summary, status, session, updated_at, message_count, token) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (run_id) DO UPDATE SET state = excluded.state, summary = excluded.summary, "
    "status = excluded.status, session = excluded.session, updated_at = excluded.updated_at, "
    "message_count = excluded.message_count, token = excluded.token"
)
_TOKEN_SQL = "SELECT token FROM runs WHERE run_id = ?"
_MESSAGE_SQL = "INSERT INTO messages (run_id, idx, data) VALUES (?, ?, ?)"
_DELETE_MESSAGES_SQL = "DELETE FROM messages WHERE run_id = ?"
_LOAD_RUN_SQL = "SELECT state, message_count, token FROM runs WHERE run_id = ?"
_LOAD_MESSAGES_SQL = "SELECT data FROM messages WHERE run_id = ? AND idx < ? ORDER BY idx"
_MEMORY_SQL = "INSERT INTO memory (session, role, content, time) VALUES (?, ?, ?, ?)"


def default_path() -> Path:
    """`$THINKLOOP_HOME/thinkloop.db`, else `thinkloop.db` in the user data directory."""
    home = os.environ.get("THINKLOOP_HOME")
    if home:
        return Path(home).expanduser() / "thinkloop.db"
    import platformdirs

    return Path(platformdirs.user_data_dir("thinkloop", appauthor=False)) / "thinkloop.db"


class SQLiteStore(Store):
    """A store in one SQLite file, safe for several processes on one machine.

    Args:
        path: the database file (created with its directory); None means `default_path()`;
            `":memory:"` keeps it in memory.
        busy_timeout: seconds to wait for another process's write lock before failing.
    """

    def __init__(self, path: str | Path | None = None, *, busy_timeout: float = 10.0) -> None:
        self.path = default_path() if path is None else Path(path)
        self.url = f"sqlite://{self.path}"
        self.busy_timeout = busy_timeout
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None  # the worker thread's: waits up to busy_timeout
        self._fast: sqlite3.Connection | None = None  # the caller's: never waits for a lock
        self._fast_lock = threading.Lock()
        self._fast_ok = str(self.path) != ":memory:"
        self._writes = 0
        # per run: the token of its last save (or load) by this store and the message objects it held
        self._saved: dict[str, _Saved] = {}
        self._saved_lock = threading.Lock()

    # ------------------------------------------------------------------------- connections, threads

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(conn, *args)`: inline when the database is free (no thread hop: a checkpoint costs
        ~0.1 ms), else in the worker thread, which waits for other processes' locks. A failure of SQLite
        itself (a corrupt or foreign file, a full disk, a lock held too long, a directory that cannot be
        made) is a `StateError` saying so and what to do."""
        try:
            return await self._call_sqlite(fn, *args)
        except (sqlite3.Error, OSError) as exc:
            raise self._failure(exc) from exc

    def _failure(self, exc: sqlite3.Error | OSError) -> StateError:
        text = str(exc)
        if isinstance(exc, OSError):
            hint = (
                f"cannot create the directory {self.path.parent}: choose a path in a directory you can write"
            )
        elif any(sign in text for sign in ("not a database", "malformed", "encrypted", "no such column")):
            hint = "the file is not a thinkloop SQLite database or is damaged: move it away, or use another store"
        elif "locked" in text or "busy" in text:
            hint = (
                f"another process held its write lock for more than busy_timeout ({self.busy_timeout:g} s) "
                f"(`fuser {self.path}` shows which): end or wait for it, then resume the run, "
                "or give SQLiteStore a longer busy_timeout"
            )
        elif "full" in text:
            hint = "free some disk space"
        elif "readonly" in text:
            hint = (
                f"the file or its directory is read-only (in WAL mode SQLite also writes {self.path.name}-wal "
                f"and {self.path.name}-shm beside it): make both writable, or use a store in a writable place"
            )
        elif self.path.is_dir():
            hint = "that path is a directory: give the path of a database file, e.g. DIR/thinkloop.db"
        else:
            hint = "check that the file and its directory exist and are readable and writable"
        return StateError(f"the SQLite store {self.path} failed: {text}; {hint}")

    async def _call_sqlite(self, fn: Callable[..., T], *args: Any) -> T:
        if self._fast_ok and self._fast_lock.acquire(blocking=False):
            try:
                if self._fast is None:
                    self._fast = self._connect(timeout=0.0)
                    self._fast.execute("PRAGMA wal_autocheckpoint = 0")  # done by the worker: see _written
                return fn(self._fast, *args)
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise
            finally:
                self._fast_lock.release()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="thinkloop-sqlite")
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._run, fn, args)

    def _written(self) -> None:
        """Every `WAL_CHECKPOINT_EVERY` writes, copy the WAL into the database in the worker thread.

        SQLite's automatic WAL checkpoint would run inside a commit — on the event loop, with an fsync —
        so the inline connection turns it off and the worker does it in the background instead.
        """
        self._writes += 1
        if self._writes % WAL_CHECKPOINT_EVERY == 0 and self._fast_ok:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="thinkloop-sqlite")
            self._executor.submit(self._run, _wal_checkpoint, ())

    def _run(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        if self._conn is None:
            self._conn = self._connect(timeout=self.busy_timeout)
        return fn(self._conn, *args)

    def _connect(self, timeout: float) -> sqlite3.Connection:
        if str(self.path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=timeout, isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            _wal(conn, timeout)
            conn.execute("PRAGMA synchronous = NORMAL")
            _migrate(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    async def aclose(self) -> None:
        with self._fast_lock:
            if self._fast is not None:
                self._fast.close()
                self._fast = None
        if self._executor is not None:
            if self._conn is not None:
                await asyncio.get_running_loop().run_in_executor(self._executor, self._conn.close)
                self._conn = None
            self._executor.shutdown(wait=True)
            self._executor = None

    # -------------------------------------------------------------------------------------- runs

    async def checkpoint(self, state: RunState, events: Sequence[Event]) -> None:
        run_id = check_id(state.run_id)
        expected = base_version(state, events)
        rows = [(run_id, e.seq, e.type, to_json(e)) for e in events]
        now = time.time()
        summary = RunSummary.from_state(state, updated_at=now)
        messages = _MessageWrite.of(run_id, state.messages, self._recall(run_id))
        head = to_json(state.model_copy(update={"messages": []}))
        run_row = (
            run_id,
            head,
            to_json(summary),
            summary.status,
            state.session,
            now,
            messages.count,
            messages.token,
        )
        memory = [
            (state.session, role, clean_text(content), now) for role, content in memory_turn(state, events)
        ]
        await self._call(_checkpoint, run_id, expected, rows, run_row, memory, messages)
        self._remember(run_id, None if state.finished else _Saved(messages.token, messages.snapshot))
        self._written()

    async def load_state(self, run_id: str) -> RunState | None:
        found = await self._call(_load, check_id(run_id))
        if found is None:
            return None
        text, count, token, rows = found
        state = load_state_text(run_id, text)
        if count is None or state.messages:  # saved by version 1 (or a version-1 thinkloop since): inline
            return state
        state.messages = _parse_messages(run_id, rows, count)
        if token is not None and not state.finished:  # a resume appends to what is in the database
            saved = self._recall(run_id)
            if saved is None or saved.token != token:  # same token: the live run's objects, kept
                self._remember(run_id, _Saved(token, list(state.messages)))
        return state

    def _recall(self, run_id: str) -> _Saved | None:
        with self._saved_lock:
            return self._saved.get(run_id)

    def _remember(self, run_id: str, saved: _Saved | None) -> None:
        """Keep what was saved of the run (None: forget it; a finished run is not written again), for at
        most `REMEMBERED_RUNS` runs, the least recently saved forgotten first (their next save rewrites
        their messages once)."""
        with self._saved_lock:
            self._saved.pop(run_id, None)
            if saved is not None:
                self._saved[run_id] = saved
            while len(self._saved) > REMEMBERED_RUNS:
                del self._saved[next(iter(self._saved))]

    async def append_events(self, run_id: str, events: Sequence[Event], expected_version: int) -> int:
        check_id(run_id)
        rows = [(run_id, e.seq, e.type, to_json(e)) for e in numbered(run_id, events, expected_version)]
        await self._call(_checkpoint, run_id, expected_version, rows, None, [], None)
        self._written()
        return expected_version + len(rows)

    async def read_events(self, run_id: str, after: int = 0) -> list[Event]:
        rows = await self._call(
            _all,
            "SELECT data FROM events WHERE run_id = ? AND seq > ? ORDER BY seq",
            (check_id(run_id), after),
        )
        return [parse_event(run_id, r[0]) for r in rows]

    async def list_runs(
        self, limit: int = 50, *, status: RunStatus | None = None, session: str | None = None
    ) -> list[RunSummary]:
        where, params = _filters(status, session)
        rows = await self._call(
            _all, f"SELECT summary FROM runs{where} ORDER BY updated_at DESC LIMIT ?", (*params, limit)
        )
        return [RunSummary.model_validate_json(r[0]) for r in rows]

    # ------------------------------------------------------------------------------------ memory

    async def add_memory(self, session: str, role: MemoryRole, content: str) -> None:
        row = (check_id(session, "session id"), check_role(role), clean_text(content), time.time())
        await self._call(_execute, _MEMORY_SQL, row)

    async def get_memory(self, session: str, limit: int | None = None) -> list[MemoryEntry]:
        check_id(session, "session id")
        sql = "SELECT role, content, time FROM memory WHERE session = ? ORDER BY id DESC"
        params: tuple[Any, ...] = (session,)
        if limit is not None:
            sql, params = sql + " LIMIT ?", (session, max(limit, 0))
        rows = await self._call(_all, sql, params)
        return [MemoryEntry(session=session, role=r[0], content=r[1], time=r[2]) for r in reversed(rows)]


# ============================================================================================ messages


@dataclass(frozen=True, slots=True)
class _Saved:
    """What a store last saved (or loaded) of a run: the token of that save and the message objects."""

    token: str
    messages: list[Message]


@dataclass(frozen=True, slots=True)
class _MessageWrite:
    """The messages a checkpoint writes: only the new ones (`start` on) when the database still holds what
    this store saved last (its `token` is unchanged: no other store or process saved the run since) and
    the state still holds those very message objects (`is`: messages are never changed in place, a changed
    one is a new object); otherwise all of them, replacing the stored ones."""

    run_id: str
    snapshot: list[Message]  # the state's messages at the checkpoint
    start: int  # how many of them the database holds when `expected_token` is still the run's token
    expected_token: str | None
    new: list[tuple[str, int, str]]  # rows of the messages from `start` on
    token: str  # the token of this save

    @property
    def count(self) -> int:
        return len(self.snapshot)

    @classmethod
    def of(cls, run_id: str, messages: list[Message], saved: _Saved | None) -> _MessageWrite:
        snapshot = list(messages)
        start, expected = 0, None
        if (
            saved is not None
            and len(saved.messages) <= len(snapshot)
            and all(map(operator.is_, saved.messages, snapshot))  # stops at the end of saved.messages
        ):
            start, expected = len(saved.messages), saved.token
        new = _rows(run_id, snapshot, start)
        return cls(run_id, snapshot, start, expected, new, os.urandom(12).hex())

    def rows(self, conn: sqlite3.Connection) -> list[tuple[str, int, str]]:
        """The rows to insert, in the checkpoint's transaction (after deleting the stored ones when they
        are not the run's as this store saved them)."""
        if self.expected_token is not None:
            row = conn.execute(_TOKEN_SQL, (self.run_id,)).fetchone()
            if row is not None and row[0] == self.expected_token:
                return self.new
        conn.execute(_DELETE_MESSAGES_SQL, (self.run_id,))
        return _rows(self.run_id, self.snapshot[: self.start], 0) + self.new if self.start else self.new


def _rows(run_id: str, messages: list[Message], start: int) -> list[tuple[str, int, str]]:
    return [(run_id, index, to_json(messages[index])) for index in range(start, len(messages))]


_messages_adapter: TypeAdapter[list[Message]] | None = None


def _parse_messages(run_id: str, rows: list[str], count: int) -> list[Message]:
    global _messages_adapter
    if len(rows) != count:
        raise StateError(
            f"run {run_id!r}: {count - len(rows)} of its {count} stored messages are missing: "
            "the database is damaged; restore it from a backup, or start the run again"
        )
    if _messages_adapter is None:
        from pydantic import TypeAdapter

        _messages_adapter = TypeAdapter(list[Message])
    try:
        return _messages_adapter.validate_json("[" + ",".join(rows) + "]")
    except ValueError as exc:
        raise StateError(f"run {run_id!r}: a stored message is corrupt: {exc}") from exc


# ========================================================================= run in the worker thread


def _migrate(conn: sqlite3.Connection) -> None:
    """Create or upgrade the tables; a database already at this version is only read (no write lock, so
    a store opens while another process is writing)."""
    if _schema_version(conn) == SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")  # may raise "database is locked": nothing to roll back then
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        version = _schema_version(conn)
        if version < SCHEMA_VERSION:
            steps = (
                _SCHEMA
                if version == 0
                else [s for v in range(version + 1, SCHEMA_VERSION + 1) for s in _MIGRATIONS[v]]
            )
            for sql in steps:
                conn.execute(sql)
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise


def _schema_version(conn: sqlite3.Connection) -> int:
    """The database's schema version (0: none yet); a newer one than this thinkloop's is a `StateError`."""
    try:
        version = conn.execute("SELECT max(version) FROM schema_version").fetchone()[0] or 0
    except sqlite3.OperationalError as exc:
        if "no such table" not in str(exc):
            raise
        return 0
    if version > SCHEMA_VERSION:
        raise StateError(
            f"the database has schema version {version}, newer than this thinkloop supports "
            f"({SCHEMA_VERSION}): upgrade thinkloop"
        )
    return int(version)


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back the open transaction, if SQLite has not already (it does after some errors, e.g. a full
    disk: a ROLLBACK then would fail and hide the real error)."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _checkpoint(
    conn: sqlite3.Connection,
    run_id: str,
    expected: int,
    rows: Sequence[tuple[str, int, str, str]],
    run_row: tuple[Any, ...] | None,
    memory: list[tuple[Any, ...]],
    messages: _MessageWrite | None,
) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        actual = conn.execute(_VERSION_SQL, (run_id,)).fetchone()[0]
        if actual != expected:
            raise ConcurrencyError(run_id, expected, actual)
        if rows:
            conn.executemany(_EVENT_SQL, rows)
        if messages is not None:
            conn.executemany(_MESSAGE_SQL, messages.rows(conn))
        if run_row is not None:
            conn.execute(_RUN_SQL, run_row)
        if memory:
            conn.executemany(_MEMORY_SQL, memory)
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise


def _load(conn: sqlite3.Connection, run_id: str) -> tuple[str, int | None, str | None, list[str]] | None:
    """The run's row and its messages, read in one transaction (a consistent snapshot however other
    processes write meanwhile)."""
    conn.execute("BEGIN")
    try:
        row = conn.execute(_LOAD_RUN_SQL, (run_id,)).fetchone()
        if row is None:
            return None
        text, count, token = row
        rows = [] if count is None else [r[0] for r in conn.execute(_LOAD_MESSAGES_SQL, (run_id, count))]
        return text, count, token, rows
    finally:
        _rollback(conn)


def _all(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...]) -> list[Any]:
    return conn.execute(sql, params).fetchall()


def _execute(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...]) -> None:
    conn.execute(sql, params)


def _wal_checkpoint(conn: sqlite3.Connection) -> None:
    with contextlib.suppress(sqlite3.Error):  # best effort: the next one, or any connection, catches up
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()


def _wal(conn: sqlite3.Connection, timeout: float) -> None:
    """Put the database in WAL mode. Switching a new file needs it to itself, and SQLite answers "database
    is locked" at once, without its busy handler, while another process opens it: tried until `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.005)


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc)
    return "locked" in text or "busy" in text


def _filters(status: str | None, session: str | None) -> tuple[str, tuple[Any, ...]]:
    clauses: list[str] = []
    params: list[Any] = []
    if status is not None:
        clauses.append("status = ?")
        params.append(status)
    if session is not None:
        clauses.append("session = ?")
        params.append(session)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), tuple(params)
