"""SQLite and PostgreSQL stores write only what changed: a checkpoint saves the messages added and the
tool-call ledger entries added or changed since the store last saved the run — and the whole history when
what the database holds is not what this store saved (another writer, a resume from an older checkpoint,
a failed save) — while every load is the state as its JSON gives it back."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import private_schema
from thinkloop import Agent, Message, RunState, StateError, ToolCall, tool
from thinkloop._events import Status
from thinkloop._state import LedgerEntry
from thinkloop.stores import PostgresStore, SQLiteStore, Store
from thinkloop.stores._base import to_json

KINDS = ["sqlite", "postgres"]
_TABLES = ("runs", "events", "memory", "schema", "messages", "ledger")


@pytest.fixture(scope="module")
def pg_schema() -> Iterator[str]:
    yield from private_schema("tl_delta")


@pytest.fixture
def pg_dsn(pg_schema: str) -> Iterator[str]:
    import psycopg

    yield pg_schema
    with psycopg.connect(pg_schema, autocommit=True) as conn:
        for table in _TABLES:
            conn.execute(f"DROP TABLE IF EXISTS thinkloop_{table}")


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Store]:
    """A factory of stores on one database (several stores: several processes)."""
    if kind == "sqlite":
        return lambda: SQLiteStore(tmp_path / "runs.db")
    dsn = request.getfixturevalue("pg_dsn")
    return lambda: PostgresStore(dsn)


@pytest.fixture
async def store(make: Callable[[], Store]) -> AsyncIterator[Store]:
    async with make() as made:
        yield made


def sql(store: Store, query: str, *params: Any) -> list[Any]:
    """Run `query` on the store's database from outside (another connection); `{t}` prefixes table names."""
    if isinstance(store, SQLiteStore):
        with sqlite3.connect(store.path) as conn:
            return conn.execute(query.replace("{t}", ""), params).fetchall()
    import psycopg

    assert isinstance(store, PostgresStore)
    with psycopg.connect(store.dsn, autocommit=True) as conn:
        cur = conn.execute(query.replace("{t}", "thinkloop_").replace("?", "%s"), params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def _state(**fields: Any) -> RunState:
    return RunState(run_id="run-1", goal="a goal", model="test:script", **fields)


def _stored(state: RunState) -> RunState:
    """What a store gives back for `state`: the state through JSON, lone surrogates as U+FFFD."""
    return RunState.from_json(to_json(state))


async def _save(store: Store, state: RunState) -> None:
    state.event_version += 1
    event = Status(text=f"step {state.step}")
    event.run_id, event.seq = state.run_id, state.event_version
    await store.checkpoint(state, [event])


def _step(state: RunState, step: int, size: int = 200) -> LedgerEntry:
    """A tool step as the loop makes it: the reply calling the tool, its ledger entry (done, with its
    output) and the tool message."""
    call = ToolCall(id=f"c{step}", name="fetch", arguments={"key": f"k{step}", "ünï": ["😀", step]})
    state.messages.append(Message.assistant(f"step {step} ✓", [call], step=step))
    entry = LedgerEntry(call_id=call.id, name=call.name, arguments=call.arguments, step=step)
    state.ledger[call.id] = entry
    output = f"item {step} — " + "x" * size
    entry.status, entry.output, entry.success = "done", output, True
    state.messages.append(Message.tool(call, output, step=step))
    state.step = step
    return entry


def _rows(store: Store, table: str) -> list[Any]:
    return sql(store, f"SELECT idx, data FROM {{t}}{table} WHERE run_id = ? ORDER BY idx", "run-1")


@pytest.fixture
def written(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ledger entries (their call ids) and messages (their first 7 characters) serialised by stores."""
    from thinkloop.stores import _base

    out: list[str] = []
    real = _base.to_json

    def counting(model: Any) -> str:
        if isinstance(model, LedgerEntry):
            out.append(model.call_id)
        elif isinstance(model, Message):
            out.append(model.content[:7])
        return real(model)

    monkeypatch.setattr(_base, "to_json", counting)
    return out


# ==================================================================================== only what changed


async def test_a_checkpoint_writes_only_the_ledger_entries_added_or_changed(
    store: Store, written: list[str]
) -> None:
    state = _state(messages=[Message.user("a goal")])
    for step in range(1, 51):
        _step(state, step, size=10_000)
    await _save(store, state)
    assert len([w for w in written if w.startswith("c")]) == 50
    written.clear()
    await _save(store, state)  # nothing changed
    assert written == []
    call = ToolCall(id="c51", name="fetch", arguments={"key": "k51"})
    state.ledger["c51"] = LedgerEntry(call_id="c51", name="fetch", arguments=call.arguments, step=51)
    await _save(store, state)  # tool started: its entry only
    assert written == ["c51"]
    assert await store.load_state("run-1") == _stored(state)
    written.clear()
    entry = state.ledger["c51"]
    entry.status, entry.output, entry.success = "done", "item 51", True
    await _save(store, state)  # tool done: that entry again
    assert written == ["c51"]
    written.clear()
    state.ledger["c7"].error_kind = "changed later"  # an old entry changed in place
    state.messages.append(Message.tool(call, "item 51", step=51))
    await _save(store, state)
    assert sorted(written) == ["c7", "item 51"]
    assert await store.load_state("run-1") == _stored(state)
    assert len(_rows(store, "ledger")) == 51


async def test_states_saved_step_by_step_load_exactly(store: Store) -> None:
    """Entries added, changed, replaced by new objects, removed, added again (at the end, as a dict does),
    keys that are not the call's id, unicode, NUL, a lone surrogate (U+FFFD, as the JSON of a state has
    it): every load is the state as JSON gives it back, and no row of a longer past is left behind."""
    state = _state(messages=[Message.user("a goal ½")])
    for step in range(1, 6):
        _step(state, step)
        await _save(store, state)
        assert await store.load_state("run-1") == _stored(state) == state
    state.ledger["c2"].output = "nul \x00 and half an emoji \ud83d"
    state.ledger["c3"] = LedgerEntry(call_id="c3", name="fetch", step=3, status="planned")
    state.ledger["odd key \x00 ☃"] = LedgerEntry(call_id="c9", name="other", step=5, status="started")
    await _save(store, state)
    loaded = await store.load_state("run-1")
    assert loaded == _stored(state) and loaded is not None
    assert loaded.ledger["c2"].output == "nul \x00 and half an emoji \ufffd"
    assert list(loaded.ledger) == list(state.ledger)
    del state.ledger["c1"]
    state.ledger["c1"] = LedgerEntry(call_id="c1", name="fetch", step=6)  # now the last
    await _save(store, state)
    loaded = await store.load_state("run-1")
    assert loaded == _stored(state) and loaded is not None
    assert list(loaded.ledger) == list(state.ledger) == ["c2", "c3", "c4", "c5", "odd key \x00 ☃", "c1"]
    for key in ("c4", "c5", "odd key \x00 ☃"):
        del state.ledger[key]
    await _save(store, state)
    loaded = await store.load_state("run-1")
    assert loaded == _stored(state) and loaded is not None and list(loaded.ledger) == ["c2", "c3", "c1"]
    assert [r[0] for r in _rows(store, "ledger")] == [0, 1, 2]
    head = json.loads(sql(store, "SELECT state FROM {t}runs")[0][0])
    assert head["messages"] == [] and head["ledger"] == {}


async def test_a_run_resumed_from_an_older_checkpoint_is_saved_whole(
    make: Callable[[], Store], written: list[str]
) -> None:
    """A store that saved 6 steps; the run is resumed (by this store) from a copy of step 3: its messages
    are not an extension of the ones saved, its ledger lost entries — both are written whole."""
    async with make() as store:
        state = _state(messages=[Message.user("a goal")])
        for step in range(1, 4):
            _step(state, step)
        older = RunState.from_json(state.to_json())
        for step in range(4, 7):
            _step(state, step)
        await _save(store, state)
        older.event_version, older.saves = state.event_version, state.saves  # as a resume would find them
        _step(older, 4, size=5)
        written.clear()
        await _save(store, older)
        assert sorted(w for w in written if w.startswith("c")) == ["c1", "c2", "c3", "c4"]
        assert await store.load_state("run-1") == _stored(older)
        assert len(_rows(store, "messages")) == len(older.messages) == 9
        assert len(_rows(store, "ledger")) == 4


async def test_two_stores_taking_turns_on_one_run_save_it_whole(make: Callable[[], Store]) -> None:
    """A saves; B (another process) loads, changes entries and saves; A, saving again from its own
    state, must not trust its memory of what it saved: every load is the last saved state, whole."""
    async with make() as a, make() as b:
        mine = _state(messages=[Message.user("a goal")])
        for step in range(1, 4):
            _step(mine, step)
        await _save(a, mine)
        theirs = await b.load_state("run-1")
        assert theirs == _stored(mine) and theirs is not None
        theirs.ledger["c2"].output = "B's output"
        theirs.ledger["c1"].status = "started"
        _step(theirs, 4)
        await _save(b, theirs)
        assert await a.load_state("run-1") == _stored(theirs)
        # A goes on from its own state (a resumer that lost a race but carries the log's version and
        # save count: without them it is refused, see test_stores)
        mine.ledger["c3"].output = "A's output"
        mine.event_version, mine.saves = theirs.event_version, theirs.saves
        await _save(a, mine)
        assert await b.load_state("run-1") == _stored(mine)
        assert len(_rows(a, "ledger")) == 3
        # and B, whose memory is stale now too, takes over again from what it loads
        theirs = await b.load_state("run-1")
        assert theirs is not None
        theirs.ledger["c1"].output = "B again"
        await _save(b, theirs)
        async with make() as reader:
            assert await reader.load_state("run-1") == _stored(theirs)


async def test_a_failed_checkpoint_leaves_the_previous_state_whole(store: Store) -> None:
    """A failure as the run's row is updated, after the new and changed rows were written, rolls them back:
    the previous state loads, and the next checkpoint of the same state saves everything it changed."""
    state = _state(messages=[Message.user("a goal")])
    for step in range(1, 3):
        _step(state, step)
    await _save(store, state)
    before = _stored(state)
    _fail_run_updates(store, True)
    state.ledger["c1"].output = "changed"
    _step(state, 3)
    with pytest.raises(StateError, match="injected failure"):
        await _save(store, state)
    assert await store.load_state("run-1") == before
    assert len(_rows(store, "ledger")) == 2 and len(_rows(store, "messages")) == 5
    _fail_run_updates(store, False)
    state.event_version -= 1  # the loop saves the same state again with the same events
    await _save(store, state)
    assert await store.load_state("run-1") == _stored(state)


def _fail_run_updates(store: Store, fail: bool) -> None:
    if isinstance(store, SQLiteStore):
        sql(
            store,
            "CREATE TRIGGER fail BEFORE UPDATE ON runs BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
            if fail
            else "DROP TRIGGER fail",
        )
        return
    if fail:
        sql(
            store,
            "CREATE FUNCTION {t}fail() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION 'injected failure'; END $$ "
            "LANGUAGE plpgsql",
        )
        sql(store, "CREATE TRIGGER fail BEFORE UPDATE ON {t}runs FOR EACH ROW EXECUTE FUNCTION {t}fail()")
    else:
        sql(store, "DROP TRIGGER fail ON {t}runs")
        sql(store, "DROP FUNCTION {t}fail()")


async def test_a_damaged_or_missing_ledger_row_is_a_clear_error(store: Store) -> None:
    state = _state(messages=[Message.user("a goal")])
    for step in range(1, 4):
        _step(state, step)
    await _save(store, state)
    sql(store, 'UPDATE {t}ledger SET data = \'{"status": "gone"}\' WHERE idx = 1')
    with pytest.raises(StateError, match=r"run 'run-1' in .*: its ledger entry \d+ is corrupt"):
        await store.load_state("run-1")
    sql(store, "UPDATE {t}ledger SET key = ? WHERE idx = 2", '"c1"')
    sql(store, "UPDATE {t}ledger SET data = ? WHERE idx = 1", to_json(state.ledger["c2"]))
    with pytest.raises(StateError, match=r"run 'run-1' in .*: its stored ledger names a tool call twice"):
        await store.load_state("run-1")
    sql(store, "DELETE FROM {t}ledger WHERE idx = 2")
    with pytest.raises(StateError, match=r"run 'run-1' in .*: 1 of its 3 stored ledger entries are missing"):
        await store.load_state("run-1")


# ============================================================================================ agents


async def test_a_run_resumed_by_another_store_is_saved_as_the_agent_ended_it(
    make: Callable[[], Store],
) -> None:
    """A run dies after three steps; another store resumes it: the ledger settles the call that was
    running, its checkpoints write what changed, and the finished run loads as the agent ended it."""
    from thinkloop.testing import FunctionModel

    class Died(BaseException):
        """Stands in for the process dying."""

    turns: list[int] = []

    def reply(request: Any) -> Any:
        turns.append(1)
        if len(turns) == 4:
            raise Died
        if len(turns) > 7:
            return "all fetched"
        return {"tool_calls": [{"name": "fetch", "args": {"i": len(turns)}}]}

    @tool
    def fetch(i: int) -> str:
        """Fetch item i."""
        return f"item {i} ✓ " + "y" * 1000

    async with make() as first:
        with pytest.raises(Died):
            await Agent(FunctionModel(reply), tools=[fetch], store=first).run("fetch them", run_id="r")
    async with make() as second:
        result = await Agent(FunctionModel(reply), tools=[fetch], store=second).resume("r")
    assert result.output == "all fetched" and result.steps == 7
    async with make() as third:
        loaded = await third.load_state("r")
        assert loaded == _stored(result.state) and loaded is not None
        assert [e.output[:6] for e in loaded.ledger.values() if e.output] == [
            f"item {i}" for i in (1, 2, 3, 5, 6, 7)
        ]
        assert len(sql(third, "SELECT idx FROM {t}ledger WHERE run_id = 'r'")) == len(loaded.ledger) == 6


# ========================================================================================== upgrades


async def test_a_sqlite_database_of_version_2_loads_and_is_upgraded(tmp_path: Path) -> None:
    """A file whose runs keep their messages in rows and their ledger inline: they load as they were;
    their next checkpoint moves the ledger; the version is 4."""
    db = tmp_path / "v2.db"
    state = _state(messages=[Message.user("a goal ☃")])
    for step in range(1, 4):
        _step(state, step)
    state.event_version = 1
    with sqlite3.connect(db) as conn:  # the version-2 schema, as thinkloop made it
        conn.executescript(
            """CREATE TABLE schema_version (version INTEGER NOT NULL);
            INSERT INTO schema_version VALUES (1);
            INSERT INTO schema_version VALUES (2);
            CREATE TABLE runs (run_id TEXT PRIMARY KEY, state TEXT NOT NULL, summary TEXT NOT NULL,
                status TEXT NOT NULL, session TEXT, updated_at REAL NOT NULL, message_count INTEGER,
                token TEXT);
            CREATE INDEX runs_updated ON runs (updated_at);
            CREATE TABLE events (run_id TEXT NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL,
                data TEXT NOT NULL, PRIMARY KEY (run_id, seq)) WITHOUT ROWID;
            CREATE TABLE memory (id INTEGER PRIMARY KEY AUTOINCREMENT, session TEXT NOT NULL,
                role TEXT NOT NULL, content TEXT NOT NULL, time REAL NOT NULL);
            CREATE INDEX memory_session ON memory (session, id);
            CREATE TABLE messages (run_id TEXT NOT NULL, idx INTEGER NOT NULL, data TEXT NOT NULL,
                PRIMARY KEY (run_id, idx));"""
        )
        head = state.model_copy(update={"messages": []}).to_json()
        summary = '{"run_id": "run-1", "goal": "a goal", "step": 3, "event_version": 1}'
        conn.execute(
            "INSERT INTO runs VALUES ('run-1', ?, ?, 'running', NULL, 1.0, ?, 'v2token')",
            (head, summary, len(state.messages)),
        )
        conn.executemany(
            "INSERT INTO messages VALUES ('run-1', ?, ?)",
            [(i, m.model_dump_json()) for i, m in enumerate(state.messages)],
        )
        conn.execute(
            "INSERT INTO events VALUES ('run-1', 1, 'status', ?)", (Status(text="x").model_dump_json(),)
        )
    async with SQLiteStore(db) as store:
        loaded = await store.load_state("run-1")
        assert loaded == state and loaded is not None
        loaded.ledger["c2"].output = "changed"
        _step(loaded, 4)
        await _save(store, loaded)
        assert await store.load_state("run-1") == loaded
        assert len(_rows(store, "ledger")) == 4
        assert sql(store, "SELECT max(version) FROM schema_version") == [(4,)]
        assert json.loads(sql(store, "SELECT state FROM runs")[0][0])["ledger"] == {}
    async with SQLiteStore(db) as again:
        assert await again.load_state("run-1") == loaded


async def test_a_postgres_table_written_by_version_1_loads_and_is_upgraded(pg_dsn: str) -> None:
    """Tables made and written as thinkloop did before (the whole state in `thinkloop_runs.state`): they
    are upgraded in place when a store first connects, the old runs load as they were, and their next
    checkpoint moves their messages and ledger into rows."""
    import psycopg

    state = _state(messages=[Message.user("a goal ☃")], session="s1")
    for step in range(1, 4):
        _step(state, step)
    state.event_version = 1
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the version-1 schema, as thinkloop made it
        for query in (
            "CREATE TABLE thinkloop_schema (version INTEGER NOT NULL)",
            "INSERT INTO thinkloop_schema (version) VALUES (1)",
            """CREATE TABLE thinkloop_runs (run_id TEXT PRIMARY KEY, state TEXT NOT NULL, summary TEXT NOT NULL,
                status TEXT NOT NULL, session TEXT, updated_at DOUBLE PRECISION NOT NULL)""",
            "CREATE INDEX thinkloop_runs_updated ON thinkloop_runs (updated_at)",
            """CREATE TABLE thinkloop_events (run_id TEXT NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL,
                data TEXT NOT NULL, PRIMARY KEY (run_id, seq))""",
            """CREATE TABLE thinkloop_memory (id BIGSERIAL PRIMARY KEY, session TEXT NOT NULL,
                role TEXT NOT NULL, content TEXT NOT NULL, time DOUBLE PRECISION NOT NULL)""",
        ):
            conn.execute(query)  # type: ignore[arg-type]
        summary = '{"run_id": "run-1", "goal": "a goal", "session": "s1", "step": 3, "event_version": 1}'
        conn.execute(
            "INSERT INTO thinkloop_runs VALUES ('run-1', %s, %s, 'running', 's1', 1.0)",
            (state.to_json(), summary),
        )
        conn.execute(
            "INSERT INTO thinkloop_events VALUES ('run-1', 1, 'status', %s)",
            (Status(text="x").model_dump_json(),),
        )
    async with PostgresStore(pg_dsn) as store:
        loaded = await store.load_state("run-1")
        assert loaded == state and loaded is not None
        assert [(r.run_id, r.step, r.session) for r in await store.list_runs()] == [("run-1", 3, "s1")]
        loaded.ledger["c2"].output = "changed"
        _step(loaded, 4)
        await _save(store, loaded)
        assert await store.load_state("run-1") == loaded
        assert len(_rows(store, "ledger")) == 4 and len(_rows(store, "messages")) == 9
        assert sql(store, "SELECT max(version) FROM {t}schema") == [(3,)]
        head = json.loads(sql(store, "SELECT state FROM {t}runs")[0][0])
        assert head["messages"] == [] and head["ledger"] == {}
        _step(loaded, 5)
        await _save(store, loaded)
    async with PostgresStore(pg_dsn) as again:
        assert await again.load_state("run-1") == loaded
