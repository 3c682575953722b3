"""`PostgresStore`: runs shared by several processes or machines (SPEC §9.4), on psycopg 3 (async).

Needs the `postgres` extra (`pip install 'thinkloop[postgres]'`). The tables (`thinkloop_runs`,
`thinkloop_events`, `thinkloop_memory`, `thinkloop_messages`, `thinkloop_ledger`) are created and migrated
by the library on first use, under an advisory lock, with their version in `thinkloop_schema`. Appends are
checked against the log's version and protected by the `(run_id, seq)` primary key, so of two writers at
the same version exactly one wins. A run's messages and tool-call ledger are kept one row each beside the
rest of its state: a checkpoint writes only the messages added and the entries added or changed since this
store last saved the run (see `_base.Delta`), so its cost does not grow with the run's length.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .._aio import PerLoop, closed_with_the_loop
from .._errors import ConcurrencyError, ConfigurationError, StateError
from .._events import Event
from .._state import RunState
from ._base import (
    CheckpointRows,
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

# 1: the whole state, messages and ledger included, in `thinkloop_runs.state`.
# 2: the messages in `thinkloop_messages` and the ledger in `thinkloop_ledger` (`key`: the entry's key, a
#    JSON string; `idx`: its place), one row each; `thinkloop_runs.state` holds the rest of the state, and
#    `message_count` / `ledger_count` how many rows are the run's (NULL: a version-1 row, all inline);
#    `token` changes at every save, so a store can tell whether the run was saved by someone else since.
# 3: `thinkloop_runs.saves`, the run's checkpoint count (`RunState.saves`): a save must find the count it
#    follows (NULL: saved by an older thinkloop, not checked).
SCHEMA_VERSION = 3
_LOCK_KEY = 0x7468696E6B  # "think": the advisory lock taken while migrating

_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS thinkloop_runs (
        run_id TEXT PRIMARY KEY, state TEXT NOT NULL, summary TEXT NOT NULL, status TEXT NOT NULL,
        session TEXT, updated_at DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS thinkloop_runs_updated ON thinkloop_runs (updated_at)",
    """CREATE TABLE IF NOT EXISTS thinkloop_events (
        run_id TEXT NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL, data TEXT NOT NULL,
        PRIMARY KEY (run_id, seq))""",
    """CREATE TABLE IF NOT EXISTS thinkloop_memory (
        id BIGSERIAL PRIMARY KEY, session TEXT NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL,
        time DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS thinkloop_memory_session ON thinkloop_memory (session, id)",
]
# What brings a database of version N - 1 to version N (a new one gets `_SCHEMA`, then all of them). Runs
# saved before keep their state inline until their next checkpoint, which moves their messages and ledger
# (nothing is rewritten here, so the upgrade is instant however many runs the tables hold).
_MIGRATIONS = {
    2: [
        "ALTER TABLE thinkloop_runs ADD COLUMN IF NOT EXISTS message_count INTEGER, "
        "ADD COLUMN IF NOT EXISTS ledger_count INTEGER, ADD COLUMN IF NOT EXISTS token TEXT",
        """CREATE TABLE IF NOT EXISTS thinkloop_messages (
            run_id TEXT NOT NULL, idx INTEGER NOT NULL, data TEXT NOT NULL, PRIMARY KEY (run_id, idx))""",
        """CREATE TABLE IF NOT EXISTS thinkloop_ledger (
            run_id TEXT NOT NULL, idx INTEGER NOT NULL, key TEXT NOT NULL, data TEXT NOT NULL,
            PRIMARY KEY (run_id, idx))""",
    ],
    3: ["ALTER TABLE thinkloop_runs ADD COLUMN IF NOT EXISTS saves INTEGER"],
}

_VERSION_SQL = "SELECT coalesce(max(seq), 0) FROM thinkloop_events WHERE run_id = %s"
_EVENT_SQL = "INSERT INTO thinkloop_events (run_id, seq, type, data) VALUES (%s, %s, %s, %s)"
_RUN_SQL = (
    "INSERT INTO thinkloop_runs (run_id, state, summary, status, session, updated_at, message_count, "
    "ledger_count, token, saves) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (run_id) DO UPDATE "
    "SET state = excluded.state, summary = excluded.summary, status = excluded.status, "
    "session = excluded.session, updated_at = excluded.updated_at, message_count = excluded.message_count, "
    "ledger_count = excluded.ledger_count, token = excluded.token, saves = excluded.saves"
)
# the run's row locked for the rest of the transaction: another writer's checkpoint of the run waits for
# this one to commit, then reads its token (and so writes whole what it would have written as a change)
# and its save count (and so is refused: `check_saves`)
_TOKEN_SQL = "SELECT token, saves FROM thinkloop_runs WHERE run_id = %s FOR UPDATE"
_MESSAGE_SQL = (
    "INSERT INTO thinkloop_messages (run_id, idx, data) VALUES (%s, %s, %s) "
    "ON CONFLICT (run_id, idx) DO UPDATE SET data = excluded.data"
)
_ENTRY_SQL = (
    "INSERT INTO thinkloop_ledger (run_id, idx, key, data) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT (run_id, idx) DO UPDATE SET key = excluded.key, data = excluded.data"
)
# one statement, so one snapshot: the run's row, its messages and its ledger as of the same commit
_LOAD_SQL = """SELECT r.state, r.message_count, r.ledger_count, r.token,
    (SELECT array_agg(m.data ORDER BY m.idx) FROM thinkloop_messages m
        WHERE m.run_id = r.run_id AND m.idx < r.message_count),
    (SELECT array_agg(l.key ORDER BY l.idx) FROM thinkloop_ledger l
        WHERE l.run_id = r.run_id AND l.idx < r.ledger_count),
    (SELECT array_agg(l.data ORDER BY l.idx) FROM thinkloop_ledger l
        WHERE l.run_id = r.run_id AND l.idx < r.ledger_count)
    FROM thinkloop_runs r WHERE r.run_id = %s"""
_MEMORY_SQL = "INSERT INTO thinkloop_memory (session, role, content, time) VALUES (%s, %s, %s, %s)"


class PostgresStore(Store):
    """A store in a PostgreSQL database.

    Args:
        dsn: a libpq connection string or URL, e.g. `postgresql://user@host:5432/db`; a malformed one
            raises `ConfigurationError` at once.
        timeout: seconds one operation (connecting included) may take; a server that does not answer
            in time is a `StateError`, never a hang.

    One connection per store and event loop, opened on first use and closed when that loop shuts down
    (agents in several threads, each `run_sync` with its own loop, may share a store); operations on one
    loop are serialised on its connection. A connection lost between two operations (a server restart, a
    dropped connection) is opened again.
    """

    def __init__(self, dsn: str, *, timeout: float = 30.0) -> None:
        self.dsn = dsn
        self.url = redacted_dsn(dsn)  # shown in messages: without the password
        self.timeout = timeout
        self._links = PerLoop(Link)  # a connection per event loop, closed with it
        _check_dsn(dsn, self.url)
        # per run: what this store last saved (or loaded) of it, to write only what changed
        self._saved = SavedRuns()

    def _link(self) -> Link:
        return self._links.get()

    @property
    def _conn(self) -> Any:
        """The running loop's connection, if open (None outside a loop)."""
        link = self._links.current()
        return None if link is None else link.conn

    async def _connection(self) -> Any:
        link = self._link()
        if link.conn is None or link.conn.closed:
            try:
                import psycopg
            except ImportError:
                raise ConfigurationError(
                    "PostgresStore needs psycopg 3: pip install 'thinkloop[postgres]'"
                ) from None
            async with asyncio.timeout(self.timeout):
                conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
                # a writer frozen inside a transaction (SIGSTOP, a debugger) must not hold the run's rows
                # past half the timeout: the server ends its session, and the process that took over goes on
                await conn.execute(
                    "SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
                    (str(max(1000, int(self.timeout * 500))),),
                )
            try:
                await self._bounded(conn, _migrate)
            except _NewerSchema as newer:
                await conn.close()
                raise StateError(
                    f"the PostgreSQL store {self.url} has thinkloop schema version {newer.version}, newer "
                    f"than this thinkloop supports ({SCHEMA_VERSION}): upgrade thinkloop to use it, or give "
                    "this one another database (this one is left as it is)"
                ) from None
            except BaseException:
                await conn.close()
                raise
            await link.keep(conn)
        return link.conn

    async def _run(self, op: Callable[[Any], Awaitable[T]], *, retry: Callable[[], bool] = lambda: True) -> T:
        """`op(conn)`, one operation at a time, within `timeout`. When a connection kept from an earlier
        operation turns out to be lost, it is opened again and `op` retried once if `retry()` says that
        nothing of it was committed. Any other failure of the server or the connection is a `StateError`
        saying where and what to check (the next operation connects again)."""
        import psycopg

        link = self._link()
        async with link.lock:
            reused = link.conn is not None and not link.conn.closed
            connected = False  # a timeout after the connection was made: the server is there, but waits
            try:
                try:
                    conn = await self._connection()
                    connected = True
                    return await self._bounded(conn, op)
                except psycopg.OperationalError:
                    if not (reused and self._lost() and retry()):
                        raise
                connected = False
                conn = await self._connection()
                connected = True
                return await self._bounded(conn, op)
            except psycopg.Error as exc:  # refused, lost, out of space, no permission …
                self._lost()
                raise self._failure(" ".join(str(exc).split())) from exc
            except TimeoutError:
                await self._drop()
                waiting = (
                    "the server took the connection but did not finish the operation: it is probably waiting "
                    "for a lock another session holds on thinkloop's tables (`SELECT pid, state, query FROM "
                    "pg_stat_activity` shows which): end that session or wait for it, or raise the timeout"
                )
                reason = f"no answer within timeout ({self.timeout:g} s)"
                raise self._failure(reason, hint=waiting if connected else None) from None

    async def _bounded(self, conn: Any, op: Callable[[Any], Awaitable[T]]) -> T:
        return await bounded(conn, op, self.timeout)

    def _lost(self) -> bool:
        """Forget a connection that is closed (the next operation opens a new one); True if it was."""
        return self._link().lost()

    async def _drop(self) -> None:
        await self._link().drop()

    def _failure(self, reason: str, hint: str | None = None) -> StateError:
        hint = (
            hint
            or "check that the server is running and reachable and that the database and user in the DSN exist"
        )
        return StateError(f"the PostgreSQL store {self.url} failed: {reason}; {hint}")

    async def aclose(self) -> None:
        await self._drop()

    # -------------------------------------------------------------------------------------- runs

    async def checkpoint(self, state: RunState, events: Sequence[Event]) -> None:
        parts = CheckpointRows.of(state, events, self._saved.recall(state.run_id))
        memory = [
            (state.session, role, pg_text(content), parts.now) for role, content in memory_turn(state, events)
        ]
        try:
            await self._write(parts.run_id, parts.expected, parts.events, parts, memory)
        except ConcurrencyError as exc:
            if exc.actual < exc.expected and not exc.saved_since:  # events lost, not a race
                raise lost_events(parts.run_id, self.url, exc.expected, exc.actual) from None
            raise
        except StateError as exc:
            if parts.expected:  # the run's last checkpoint is kept: a resume continues from it
                raise
            raise first_save_failed(exc, parts.run_id) from exc
        state.saves += 1
        self._saved.remember(parts.run_id, None if state.finished else parts.delta.saved())

    async def append_events(self, run_id: str, events: Sequence[Event], expected_version: int) -> int:
        check_id(run_id)
        rows = [(run_id, e.seq, e.type, to_json(e)) for e in numbered(run_id, events, expected_version)]
        await self._write(run_id, expected_version, rows, None, [])
        return expected_version + len(rows)

    async def _write(
        self,
        run_id: str,
        expected: int,
        rows: Sequence[tuple[str, int, str, str]],
        run: CheckpointRows | None,
        memory: list[tuple[Any, ...]],
    ) -> None:
        import psycopg

        committing = False  # set when COMMIT is sent: from then on a lost connection is an unknown outcome

        async def write(conn: Any) -> None:
            nonlocal committing
            committing = False
            try:
                async with conn.transaction():
                    async with conn.cursor() as cur:
                        await cur.execute(_VERSION_SQL, (run_id,))
                        actual = (await cur.fetchone())[0]
                        if actual != expected:
                            raise ConcurrencyError(run_id, expected, actual)
                        if rows:
                            await cur.executemany(_EVENT_SQL, rows)
                        if run is not None:
                            await _write_run(cur, run)
                        if memory:
                            await cur.executemany(_MEMORY_SQL, memory)
                    committing = True
            except psycopg.errors.UniqueViolation:  # another writer committed the same seq first
                cur = await conn.execute(_VERSION_SQL, (run_id,))
                raise ConcurrencyError(run_id, expected, (await cur.fetchone())[0]) from None

        await self._run(write, retry=lambda: not committing)

    async def load_state(self, run_id: str) -> RunState | None:
        row = await self._fetchone(_LOAD_SQL, (check_id(run_id),))
        if row is None:
            return None
        text, message_count, ledger_count, token, messages, keys, entries = row
        state = load_state_text(run_id, text, self.url)
        if message_count is None or state.messages:  # saved by version 1: messages and ledger inline
            return state
        state.messages = stored_messages(run_id, messages or [], message_count, self.url)
        in_rows = ledger_count is not None and not state.ledger
        if in_rows:
            state.ledger = stored_ledger(
                run_id, list(zip(keys or [], entries or [], strict=True)), ledger_count, self.url
            )
        if token is not None and not state.finished:  # a resume writes only what it changes
            saved = self._saved.recall(run_id)
            if saved is None or saved.token != token:  # same token: the live run's objects, kept
                self._saved.remember(run_id, Saved.of(token, state, ledger=in_rows))
        return state

    async def read_events(self, run_id: str, after: int = 0) -> list[Event]:
        rows = await self._fetchall(
            "SELECT seq, data FROM thinkloop_events WHERE run_id = %s AND seq > %s ORDER BY seq",
            (check_id(run_id), after),
        )
        return [parse_event(run_id, data, self.url, seq) for seq, data in rows]

    async def list_runs(
        self, limit: int = 50, *, status: RunStatus | None = None, session: str | None = None
    ) -> list[RunSummary]:
        clauses: list[str] = ["TRUE"]
        params: list[Any] = []
        if status is not None:
            clauses.append("status = %s")
            params.append(status)
        if session is not None:
            clauses.append("session = %s")
            params.append(session)
        rows = await self._fetchall(
            f"SELECT run_id, summary FROM thinkloop_runs WHERE {' AND '.join(clauses)} "
            "ORDER BY updated_at DESC LIMIT %s",
            (*params, check_limit(limit)),
        )
        return parse_summaries(rows, self.url)

    # ------------------------------------------------------------------------------------ memory

    async def add_memory(self, session: str, role: MemoryRole, content: str) -> None:
        row = (check_id(session, "session id"), check_role(role), pg_text(content), time.time())

        committing = False  # a lost connection before COMMIT: nothing stored, so retried on a new one

        async def add(conn: Any) -> None:
            nonlocal committing
            committing = False
            async with conn.transaction():
                await conn.execute(_MEMORY_SQL, row)
                committing = True

        await self._run(add, retry=lambda: not committing)

    async def get_memory(self, session: str, limit: int | None = None) -> list[MemoryEntry]:
        check_id(session, "session id")
        sql = "SELECT role, content, time FROM thinkloop_memory WHERE session = %s ORDER BY id DESC"
        params: tuple[Any, ...] = (session,)
        if limit is not None:
            sql, params = sql + " LIMIT %s", (session, max(limit, 0))
        rows = await self._fetchall(sql, params)
        return [MemoryEntry(session=session, role=r[0], content=r[1], time=r[2]) for r in reversed(rows)]

    # ----------------------------------------------------------------------------------- helpers

    async def _fetchone(self, sql: str, params: tuple[Any, ...]) -> Any:
        async def fetch(conn: Any) -> Any:
            cur = await conn.execute(sql, params)
            return await cur.fetchone()

        return await self._run(fetch)

    async def _fetchall(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        async def fetch(conn: Any) -> list[Any]:
            cur = await conn.execute(sql, params)
            return list(await cur.fetchall())

        return await self._run(fetch)


@dataclass
class Link:
    """A connection on one event loop (a psycopg connection waits on the loop it serves), the lock that
    serialises its statements, and what closes it when the loop shuts down."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    conn: Any = None
    limit: int | None = None  # the connection's statement_timeout (ms) as last set, for who sets one
    lifetime: AsyncGenerator[None, None] | None = None

    async def keep(self, conn: Any) -> None:
        """Use `conn` from now on; the first time, arrange for it to be closed with the loop."""
        self.conn, self.limit = conn, None
        if self.lifetime is None:
            self.lifetime = await closed_with_the_loop(self.drop)

    async def drop(self) -> None:
        """Close the connection (the next statement opens a new one)."""
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    def lost(self) -> bool:
        """Forget a connection that is closed (the next statement opens a new one); True if it was."""
        if self.conn is not None and self.conn.closed:
            self.conn = None
            return True
        return False


async def _write_run(cur: Any, parts: CheckpointRows) -> None:
    """Write the run's row and the messages and ledger entries that changed — all of them when the database
    does not hold the run as this store saved it last (its token is not `delta.base`) — if the run's save
    count is the one the checkpoint follows (`check_saves`)."""
    run_id, delta = parts.run_id, parts.delta
    await cur.execute(_TOKEN_SQL, (run_id,))
    row = await cur.fetchone()
    token, saves = (None, None) if row is None else row
    check_saves(run_id, parts.saves, saves)
    current = delta.base is not None and token == delta.base
    replace, messages = delta.message_rows(current)
    if replace:
        await cur.execute("DELETE FROM thinkloop_messages WHERE run_id = %s", (run_id,))
    if messages:
        await cur.executemany(_MESSAGE_SQL, [(run_id, index, data) for index, data in messages])
    replace, entries = delta.ledger_rows(current)
    if replace:
        await cur.execute("DELETE FROM thinkloop_ledger WHERE run_id = %s", (run_id,))
    if entries:
        await cur.executemany(_ENTRY_SQL, [(run_id, index, key, data) for index, key, data in entries])
    await cur.execute(_RUN_SQL, parts.run)


class _NewerSchema(Exception):
    """The tables were made by a newer thinkloop (said with the store's URL by `PostgresStore`)."""

    def __init__(self, version: int) -> None:
        super().__init__(version)
        self.version = version


async def _migrate(conn: Any) -> None:
    """Create or upgrade the tables, once, under an advisory lock (several processes may start at once)."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        await conn.execute("CREATE TABLE IF NOT EXISTS thinkloop_schema (version INTEGER NOT NULL)")
        cur = await conn.execute("SELECT max(version) FROM thinkloop_schema")
        version = (await cur.fetchone())[0] or 0
        if version > SCHEMA_VERSION:
            raise _NewerSchema(version)
        if version < SCHEMA_VERSION:
            steps = [s for v in range(max(version, 1) + 1, SCHEMA_VERSION + 1) for s in _MIGRATIONS[v]]
            for sql in (_SCHEMA if version == 0 else []) + steps:
                await conn.execute(sql)
            await conn.execute("INSERT INTO thinkloop_schema (version) VALUES (%s)", (SCHEMA_VERSION,))


def _check_dsn(dsn: str, shown: str) -> None:
    """A malformed DSN is the developer's mistake: `ConfigurationError` now, not a failure at first use."""
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:  # said at first use
        return
    try:
        conninfo_to_dict(dsn)
    except Exception as exc:
        reason = " ".join(str(exc).split())
        for secret in _passwords(dsn):
            reason = reason.replace(secret, "***")
        raise ConfigurationError(
            f"malformed PostgreSQL DSN {shown!r}: {reason}; use postgresql://user:password@host:5432/dbname "
            "or 'host=... port=5432 dbname=... user=...'"
        ) from None


def _passwords(dsn: str) -> list[str]:
    found = re.findall(r"://[^/@:]*:([^/]*)@", dsn) + re.findall(r"password\s*=\s*'?([^'\s]+)", dsn, re.I)
    return [p for p in found if p]


async def bounded(conn: Any, op: Callable[[Any], Awaitable[T]], seconds: float) -> T:
    """`op(conn)`; past `seconds`, the connection is shut so the operation fails at once (cancelling a
    query waits for a server that does not answer) and `TimeoutError` raised."""
    task = asyncio.ensure_future(op(conn))
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except BaseException:
        task.cancel()
        raise
    if not done:
        _shut(conn)
        await asyncio.wait({task}, timeout=5.0)  # on a shut socket it fails at once
        if task.done():
            task.cancelled() or task.exception()  # retrieved: never logged as unhandled
        else:
            task.cancel()
        raise TimeoutError
    return task.result()


def _shut(conn: Any) -> None:
    """Shut a connection's socket, so a query waiting for a server that does not answer fails at once."""
    with contextlib.suppress(Exception):
        sock = socket.socket(fileno=os.dup(conn.pgconn.socket))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()


def redacted_dsn(dsn: str) -> str:
    """A PostgreSQL DSN (URL or key=value form) with its password replaced by `***`."""
    dsn = re.sub(r"(://[^/@:]*:)[^/]*@", r"\1***@", dsn)  # to the last `@` of the authority
    return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", dsn, flags=re.IGNORECASE)


def pg_text(content: str) -> str:
    """Text for a PostgreSQL `TEXT` column, which cannot hold NUL (nor, as UTF-8, lone surrogates): U+FFFD
    takes its place (the run state, stored as JSON, keeps the NUL as `\\u0000` and round-trips exactly)."""
    content = clean_text(content)
    return content.replace("\x00", "\ufffd") if "\x00" in content else content
