"""`SQLiteStore`: the embedded default store (SPEC §9.4).

One file (by default `$THINKLOOP_HOME/thinkloop.db`, else the user data directory), in WAL mode with a
busy timeout, so several processes on one machine can share it. A checkpoint is one `BEGIN IMMEDIATE …
COMMIT` transaction with cached statements and `synchronous=NORMAL` (durable against process crashes;
a power cut may lose the last few commits, never corrupt the file). A run's messages are kept append-only
and its tool-call ledger in tables of their own, one row each, and the rest of its state in its `runs`
row: a checkpoint writes only the messages added and the ledger entries added or changed since this
store last saved the run, so the run's history does not make it grow (see `_base.Delta`). It runs
inline when the write lock is free at once (~0.1 ms, no thread hop); when another process holds the lock,
the store's worker thread waits for it (up to `busy_timeout`) so the event loop never blocks on another
process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from .._errors import ConcurrencyError, StateError
from .._events import Event
from .._state import RunState
from ._base import (
    CheckpointRows,
    Delta,
    MemoryEntry,
    MemoryRole,
    RunStatus,
    RunSummary,
    Saved,
    SavedRuns,
    Store,
    check_id,
    check_limit,
    check_role,
    check_saves,
    clean_text,
    file_in_the_way,
    first_save_failed,
    load_state_text,
    lost_events,
    memory_turn,
    numbered,
    parse_event,
    parse_summaries,
    stored_ledger,
    stored_messages,
    to_json,
)

T = TypeVar("T")

# 1: the whole state, messages included, in `runs.state`.
# 2: the messages in `messages`, one row each; `runs.state` holds the state without them, and
#    `runs.message_count` how many there are (NULL: a version-1 row, its messages inline, read as such);
#    `runs.token` changes at every save, so a store can tell whether the run was saved by someone else since.
# 3: the tool-call ledger in `ledger`, one row per entry (`key`: its key, a JSON string; `idx`: its place);
#    `runs.state` holds the state without it, and `runs.ledger_count` how many entries there are (NULL: an
#    older row, its ledger inline).
# 4: `runs.saves`, the run's checkpoint count (`RunState.saves`): a save must find the count it follows.
SCHEMA_VERSION = 4
WAL_CHECKPOINT_EVERY = 200  # writes between background WAL checkpoints

_MESSAGES_TABLE = """CREATE TABLE IF NOT EXISTS messages (
        run_id TEXT NOT NULL, idx INTEGER NOT NULL, data TEXT NOT NULL, PRIMARY KEY (run_id, idx))"""
_LEDGER_TABLE = """CREATE TABLE IF NOT EXISTS ledger (
        run_id TEXT NOT NULL, idx INTEGER NOT NULL, key TEXT NOT NULL, data TEXT NOT NULL,
        PRIMARY KEY (run_id, idx))"""
_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS runs (
        run_id TEXT PRIMARY KEY, state TEXT NOT NULL, summary TEXT NOT NULL, status TEXT NOT NULL,
        session TEXT, updated_at REAL NOT NULL, message_count INTEGER, token TEXT, ledger_count INTEGER,
        saves INTEGER)""",
    "CREATE INDEX IF NOT EXISTS runs_updated ON runs (updated_at)",
    """CREATE TABLE IF NOT EXISTS events (
        run_id TEXT NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL, data TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS memory (
        id INTEGER PRIMARY KEY AUTOINCREMENT, session TEXT NOT NULL, role TEXT NOT NULL,
        content TEXT NOT NULL, time REAL NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS memory_session ON memory (session, id)",
    _MESSAGES_TABLE,
    _LEDGER_TABLE,
]
# What brings a database of version N - 1 to version N (a new database gets `_SCHEMA` at once). Runs saved
# before keep their inline messages and ledger until their next checkpoint, which moves them (nothing is
# rewritten here, so the upgrade is instant however many runs the file holds).
_MIGRATIONS = {
    2: [
        "ALTER TABLE runs ADD COLUMN message_count INTEGER",
        "ALTER TABLE runs ADD COLUMN token TEXT",
        _MESSAGES_TABLE,
    ],
    3: ["ALTER TABLE runs ADD COLUMN ledger_count INTEGER", _LEDGER_TABLE],
    4: ["ALTER TABLE runs ADD COLUMN saves INTEGER"],
}

_VERSION_SQL = "SELECT coalesce(max(seq), 0) FROM events WHERE run_id = ?"
_EVENT_SQL = "INSERT INTO events (run_id, seq, type, data) VALUES (?, ?, ?, ?)"
_RUN_SQL = (
    "INSERT INTO runs (run_id, state, summary, status, session, updated_at, message_count, ledger_count, token, "
    "saves) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (run_id) DO UPDATE SET state = excluded.state, summary = excluded.summary, "
    "status = excluded.status, session = excluded.session, updated_at = excluded.updated_at, "
    "message_count = excluded.message_count, ledger_count = excluded.ledger_count, token = excluded.token, "
    "saves = excluded.saves"
)
_TOKEN_SQL = "SELECT token, saves FROM runs WHERE run_id = ?"
_MESSAGE_SQL = "INSERT OR REPLACE INTO messages (run_id, idx, data) VALUES (?, ?, ?)"
_DELETE_MESSAGES_SQL = "DELETE FROM messages WHERE run_id = ?"
_ENTRY_SQL = "INSERT OR REPLACE INTO ledger (run_id, idx, key, data) VALUES (?, ?, ?, ?)"
_DELETE_LEDGER_SQL = "DELETE FROM ledger WHERE run_id = ?"
_LOAD_RUN_SQL = "SELECT state, message_count, ledger_count, token FROM runs WHERE run_id = ?"
_LOAD_MESSAGES_SQL = "SELECT data FROM messages WHERE run_id = ? AND idx < ? ORDER BY idx"
_LOAD_LEDGER_SQL = "SELECT key, data FROM ledger WHERE run_id = ? AND idx < ? ORDER BY idx"
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
        self.path = default_path() if path is None else Path(path).expanduser()  # `~/runs.db`, as FileStore
        self.url = f"sqlite://{self.path}"
        self.busy_timeout = busy_timeout
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None  # the worker thread's: waits up to busy_timeout
        self._fast: sqlite3.Connection | None = None  # the caller's: never waits for a lock
        self._fast_lock = threading.Lock()
        self._fast_ok = str(self.path) != ":memory:"
        self._read_only = False  # opened read-only: SQLite cannot write the file (or beside it)
        self._writes = 0
        # per run: what this store last saved (or loaded) of it
        self._saved = SavedRuns()

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
            blocking = file_in_the_way(self.path)
            hint = (
                f"cannot create the directory {self.path.parent}: choose a path in a directory you can write"
                if blocking is None
                else f"{blocking} is a file, not a directory: check the path"
            )
        elif any(
            sign in text
            for sign in ("not a database", "malformed", "encrypted", "no such column", "no such table")
        ):
            hint = "the file is not a thinkloop SQLite database or is damaged: move it away, or use another store"
        elif "locked" in text or "busy" in text:
            hint = (
                f"another process held its write lock for more than busy_timeout ({self.busy_timeout:g} s) "
                f"(`fuser {self.path}` shows which): end or wait for it, then try again, "
                "or give SQLiteStore a longer busy_timeout"
            )
        elif "full" in text:
            hint = "free some disk space"
        elif "readonly" in text and self._read_only:
            hint = (
                f"it is read-only ({self._why_read_only()}): its runs can be listed and shown, not saved — "
                "make the file and its directory writable, or use a store in a writable place"
            )
        elif "readonly" in text:
            hint = (
                f"the file or its directory is read-only (in WAL mode SQLite also writes {self.path.name}-wal "
                f"and {self.path.name}-shm beside it): make both writable, or use a store in a writable place"
            )
        elif "unable to open" in text and not self.path.exists() and not os.access(self.path.parent, os.W_OK):
            hint = f"there is no such file, and it cannot be made: {self.path.parent} is read-only"
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
        """A connection in WAL mode, the schema created or upgraded — or, when SQLite cannot write the file
        or make its `-wal` and `-shm` beside it (a read-only file, directory or file system), a read-only
        one: its runs can be listed and shown, and a save fails saying why."""
        if str(self.path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            return self._checked(self._open(self.path, timeout), timeout)
        except sqlite3.OperationalError as exc:
            if not (_cannot_write(exc) and self.path.is_file()):
                raise
        conn = self._checked(self._open_read_only(timeout), timeout, read_only=True)
        self._read_only = True
        return conn

    @staticmethod
    def _open(target: str | Path, timeout: float, *, uri: bool = False) -> sqlite3.Connection:
        return sqlite3.connect(
            target, timeout=timeout, isolation_level=None, check_same_thread=False, uri=uri
        )

    def _open_read_only(self, timeout: float) -> sqlite3.Connection:
        """The file opened read-only (`mode=ro`: it reads what another process commits meanwhile, its WAL
        included); when SQLite cannot make the `-shm` file that needs, as unchanging (`immutable=1`) —
        unless a `-wal` file holds commits not yet in the database, which only that way are read."""
        url = "file:" + urllib.parse.quote(str(self.path.resolve()))
        conn = self._open(f"{url}?mode=ro", timeout, uri=True)
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return conn
        except sqlite3.OperationalError as exc:
            conn.close()
            if not _cannot_write(exc):
                raise
        wal = self.path.with_name(self.path.name + "-wal")
        if wal.exists() and wal.stat().st_size > 0:
            raise StateError(
                f"the SQLite store {self.path} cannot be read: {wal.name} beside it holds commits not yet in "
                f"the database, which SQLite reads only when it can also write {self.path.name}-shm there, "
                f"and {self.path.parent} is read-only: make it writable (or copy the three files to a "
                "directory that is), then read the runs again"
            )
        return self._open(f"{url}?immutable=1", timeout, uri=True)

    def _checked(
        self, conn: sqlite3.Connection, timeout: float, *, read_only: bool = False
    ) -> sqlite3.Connection:
        """`conn` set up (busy timeout; WAL mode and the schema when it may write), or closed on failure."""
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            if read_only:
                self._check_schema(conn)
            else:
                _wal(conn, timeout)
                conn.execute("PRAGMA synchronous = NORMAL")
                _migrate(conn)
        except _NewerSchema as newer:
            conn.close()
            raise StateError(
                f"the SQLite store {self.path} has schema version {newer.version}, newer than this thinkloop "
                f"supports ({SCHEMA_VERSION}): upgrade thinkloop to use it, or give this one another file "
                "(this one is left as it is)"
            ) from None
        except BaseException:
            conn.close()
            raise
        return conn

    def _check_schema(self, conn: sqlite3.Connection) -> None:
        """A read-only file must be at this thinkloop's schema version: it cannot be created or upgraded."""
        version = _schema_version(conn)
        if version != SCHEMA_VERSION:
            what = (
                "holds no thinkloop tables"
                if version == 0
                else f"has schema version {version}, older than this thinkloop's ({SCHEMA_VERSION})"
            )
            raise StateError(
                f"the SQLite store {self.path} {what} and is read-only ({self._why_read_only()}), so it "
                "cannot be set up or upgraded: open it once where it is writable, or use another store"
            )

    def _why_read_only(self) -> str:
        with contextlib.suppress(OSError):
            if os.statvfs(self.path.parent).f_flag & os.ST_RDONLY:
                return f"{self.path.parent} is on a read-only file system"
        if not os.access(self.path, os.W_OK):
            return "the file cannot be written"
        return f"SQLite cannot write {self.path.name}-wal and {self.path.name}-shm in {self.path.parent}"

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
        parts = CheckpointRows.of(state, events, self._saved.recall(state.run_id))
        memory = [
            (state.session, role, clean_text(content), parts.now)
            for role, content in memory_turn(state, events)
        ]
        try:
            await self._call(_checkpoint, parts, memory)
        except ConcurrencyError as exc:
            if exc.actual < exc.expected and not exc.saved_since:  # events lost, not a race
                raise lost_events(parts.run_id, str(self.path), exc.expected, exc.actual) from None
            raise
        except StateError as exc:
            if parts.expected:  # the run's last checkpoint is kept: a resume continues from it
                raise
            raise first_save_failed(exc, parts.run_id) from exc
        state.saves += 1
        self._saved.remember(parts.run_id, None if state.finished else parts.delta.saved())
        self._written()

    async def load_state(self, run_id: str) -> RunState | None:
        found = await self._call(_load, check_id(run_id))
        if found is None:
            return None
        text, (message_count, ledger_count), token, message_rows, ledger_rows = found
        where = str(self.path)
        state = load_state_text(run_id, text, where)
        if message_count is None or state.messages:  # saved by version 1: messages and ledger inline
            return state
        state.messages = stored_messages(run_id, message_rows, message_count, where)
        in_rows = ledger_count is not None and not state.ledger  # else saved by version 2: inline
        if ledger_count is not None and in_rows:
            state.ledger = stored_ledger(run_id, ledger_rows, ledger_count, where)
        if token is not None and not state.finished:  # a resume writes only what it changes
            saved = self._saved.recall(run_id)
            if saved is None or saved.token != token:  # same token: the live run's objects, kept
                self._saved.remember(run_id, Saved.of(token, state, ledger=in_rows))
        return state

    async def append_events(self, run_id: str, events: Sequence[Event], expected_version: int) -> int:
        check_id(run_id)
        rows = [(run_id, e.seq, e.type, to_json(e)) for e in numbered(run_id, events, expected_version)]
        await self._call(_append, run_id, expected_version, rows)
        self._written()
        return expected_version + len(rows)

    async def read_events(self, run_id: str, after: int = 0) -> list[Event]:
        rows = await self._call(
            _all,
            "SELECT seq, data FROM events WHERE run_id = ? AND seq > ? ORDER BY seq",
            (check_id(run_id), after),
        )
        return [parse_event(run_id, data, str(self.path), seq) for seq, data in rows]

    async def list_runs(
        self, limit: int = 50, *, status: RunStatus | None = None, session: str | None = None
    ) -> list[RunSummary]:
        where, params = _filters(status, session)
        rows = await self._call(
            _all,
            f"SELECT run_id, summary FROM runs{where} ORDER BY updated_at DESC LIMIT ?",
            (*params, check_limit(limit)),
        )
        return parse_summaries(rows, str(self.path))

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
    """The database's schema version (0: none yet); a newer one than this thinkloop's is `_NewerSchema`."""
    try:
        version = conn.execute("SELECT max(version) FROM schema_version").fetchone()[0] or 0
    except sqlite3.OperationalError as exc:
        if "no such table" not in str(exc):
            raise
        return 0
    if version > SCHEMA_VERSION:
        raise _NewerSchema(version)
    return int(version)


class _NewerSchema(Exception):
    """The database was made by a newer thinkloop (said with the file's name by `SQLiteStore._connect`)."""

    def __init__(self, version: int) -> None:
        super().__init__(version)
        self.version = version


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back the open transaction, if SQLite has not already (it does after some errors, e.g. a full
    disk: a ROLLBACK then would fail and hide the real error)."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _checkpoint(conn: sqlite3.Connection, parts: CheckpointRows, memory: list[tuple[Any, ...]]) -> None:
    run_id = parts.run_id
    conn.execute("BEGIN IMMEDIATE")
    try:
        _check_version(conn, run_id, parts.expected)
        row = conn.execute(_TOKEN_SQL, (run_id,)).fetchone()
        token, saves = (None, None) if row is None else row
        check_saves(run_id, parts.saves, saves)
        if parts.events:
            conn.executemany(_EVENT_SQL, parts.events)
        _write_delta(conn, run_id, parts.delta, token)
        conn.execute(_RUN_SQL, parts.run)
        if memory:
            conn.executemany(_MEMORY_SQL, memory)
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise


def _append(
    conn: sqlite3.Connection, run_id: str, expected: int, rows: Sequence[tuple[str, int, str, str]]
) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        _check_version(conn, run_id, expected)
        conn.executemany(_EVENT_SQL, rows)
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise


def _check_version(conn: sqlite3.Connection, run_id: str, expected: int) -> None:
    actual = conn.execute(_VERSION_SQL, (run_id,)).fetchone()[0]
    if actual != expected:
        raise ConcurrencyError(run_id, expected, actual)


def _write_delta(conn: sqlite3.Connection, run_id: str, delta: Delta, token: str | None) -> None:
    """Write the run's messages and ledger entries that changed — all of them when the database does not
    hold the run as this store saved it last (its `token` is not `delta.base`)."""
    current = delta.base is not None and token == delta.base
    replace, messages = delta.message_rows(current)
    if replace:
        conn.execute(_DELETE_MESSAGES_SQL, (run_id,))
    conn.executemany(_MESSAGE_SQL, [(run_id, index, data) for index, data in messages])
    replace, entries = delta.ledger_rows(current)
    if replace:
        conn.execute(_DELETE_LEDGER_SQL, (run_id,))
    conn.executemany(_ENTRY_SQL, [(run_id, index, key, data) for index, key, data in entries])


_Counts = tuple[int | None, int | None]  # how many messages and ledger entries the run has in rows


def _load(
    conn: sqlite3.Connection, run_id: str
) -> tuple[str, _Counts, str | None, list[str], list[tuple[str, str]]] | None:
    """The run's row, its messages and its ledger, read in one transaction (a consistent snapshot however
    other processes write meanwhile)."""
    conn.execute("BEGIN")
    try:
        row = conn.execute(_LOAD_RUN_SQL, (run_id,)).fetchone()
        if row is None:
            return None
        text, count, entries, token = row
        messages = [] if count is None else [r[0] for r in conn.execute(_LOAD_MESSAGES_SQL, (run_id, count))]
        ledger = [] if entries is None else conn.execute(_LOAD_LEDGER_SQL, (run_id, entries)).fetchall()
        return text, (count, entries), token, messages, ledger
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


def _cannot_write(exc: sqlite3.OperationalError) -> bool:
    """SQLite could not open the file for writing, or make its `-wal`/`-shm` files (read-only)."""
    text = str(exc)
    return "unable to open database file" in text or "readonly" in text


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
