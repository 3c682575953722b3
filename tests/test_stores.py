"""The store suite (SPEC §9): the same behaviour from SQLite, PostgreSQL, memory and file stores."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import PG_DSN, private_schema
from thinkloop import Agent, ConcurrencyError, ConfigurationError, RunState, StateError, tool
from thinkloop._events import Done, Progress, RunResult, RunStarted, Status
from thinkloop._state import StopReason
from thinkloop.stores import (
    FileStore,
    MemoryStore,
    PostgresStore,
    SQLiteStore,
    Store,
    default_path,
    open_store,
)
from thinkloop.testing import ScriptedModel

# ============================================================================================ fixtures


@pytest.fixture(scope="session")
def pg_schema() -> Iterator[str]:
    """A private schema for this test session, so tests never see other data; dropped at the end."""
    yield from private_schema("tl_test")


@pytest.fixture
def pg_dsn(pg_schema: str) -> Iterator[str]:
    """An empty schema per test (its tables are dropped afterwards)."""
    import psycopg

    yield pg_schema
    with psycopg.connect(pg_schema, autocommit=True) as conn:
        for table in ("thinkloop_runs", "thinkloop_events", "thinkloop_memory", "thinkloop_schema"):
            conn.execute(f"DROP TABLE IF EXISTS {table}")


KINDS = ["memory", "file", "sqlite", "postgres"]


@pytest.fixture(params=KINDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    kind = request.param
    if kind == "memory":
        made: Store = MemoryStore()
    elif kind == "file":
        made = FileStore(tmp_path / "files")
    elif kind == "sqlite":
        made = SQLiteStore(tmp_path / "runs.db")
    else:
        made = PostgresStore(request.getfixturevalue("pg_dsn"))
    async with made:
        yield made


def _state(run_id: str = "run-1", **fields: Any) -> RunState:
    return RunState(run_id=run_id, goal="a goal", model="test:script", **fields)


def _emit(state: RunState, *events: Any) -> list[Any]:
    """Number events as the loop does."""
    for event in events:
        state.event_version += 1
        event.run_id, event.seq = state.run_id, state.event_version
    return list(events)


# ========================================================================================= runs and logs


async def test_checkpoint_saves_the_state_and_appends_the_events(store: Store) -> None:
    state = _state()
    await store.checkpoint(state, _emit(state, RunStarted(goal="a goal", model="m", mode="native")))
    state.step = 1
    await store.checkpoint(state, _emit(state, Progress(step=1, max_steps=5, usage=state.usage)))

    loaded = await store.load_state("run-1")
    assert loaded is not None and loaded.step == 1 and loaded.event_version == 2
    assert loaded.model_dump() == state.model_dump()
    events = await store.read_events("run-1")
    assert [(e.type, e.seq, e.run_id) for e in events] == [
        ("run_started", 1, "run-1"),
        ("progress", 2, "run-1"),
    ]
    assert [e.seq for e in await store.read_events("run-1", after=1)] == [2]
    assert await store.load_state("nope") is None
    assert await store.read_events("nope") == []


async def test_a_checkpoint_at_a_stale_version_fails_and_changes_nothing(store: Store) -> None:
    state = _state()
    await store.checkpoint(state, _emit(state, Status(text="one")))
    stale = state.model_copy(deep=True)
    await store.checkpoint(state, _emit(state, Status(text="two")))

    stale.step = 99
    with pytest.raises(ConcurrencyError, match="is at version 2, not the expected 1"):
        await store.checkpoint(stale, _emit(stale, Status(text="other writer")))
    loaded = await store.load_state("run-1")
    assert loaded is not None and loaded.step == 0
    assert [getattr(e, "text", "") for e in await store.read_events("run-1")] == ["one", "two"]


async def test_append_events_uses_optimistic_concurrency(store: Store) -> None:
    assert await store.append_events("log-1", [Status(text="a"), Status(text="b")], expected_version=0) == 2
    with pytest.raises(ConcurrencyError) as info:
        await store.append_events("log-1", [Status(text="late")], expected_version=1)
    assert (info.value.expected, info.value.actual) == (1, 2)
    with pytest.raises(ConcurrencyError):
        await store.append_events("log-1", [Status(text="ahead")], expected_version=5)
    assert await store.append_events("log-1", [Status(text="c")], expected_version=2) == 3
    events = await store.read_events("log-1")
    assert [(e.seq, e.run_id, getattr(e, "text", "")) for e in events] == [
        (1, "log-1", "a"),
        (2, "log-1", "b"),
        (3, "log-1", "c"),
    ]


async def test_list_runs_newest_first_with_filters(store: Store) -> None:
    for i in range(3):
        state = _state(f"run-{i}", session="s1" if i == 1 else None)
        await store.checkpoint(state, _emit(state, Status(text="x")))
    done = _state("run-1", session="s1", event_version=1, phase="done", stop_reason=StopReason.FINAL_ANSWER)
    await store.checkpoint(done, [])

    runs = await store.list_runs()
    assert [r.run_id for r in runs][0] == "run-1"
    assert sorted(r.run_id for r in runs) == ["run-0", "run-1", "run-2"]
    assert [r.run_id for r in await store.list_runs(status="done")] == ["run-1"]
    assert sorted(r.run_id for r in await store.list_runs(status="running")) == ["run-0", "run-2"]
    assert [r.run_id for r in await store.list_runs(session="s1")] == ["run-1"]
    assert len(await store.list_runs(limit=2)) == 2
    summary = (await store.list_runs(status="done"))[0]
    assert (summary.goal, summary.stop_reason, summary.status) == ("a goal", "final_answer", "done")


# ============================================================================================== memory


async def test_conversation_memory_per_session(store: Store) -> None:
    await store.add_memory("chat-1", "user", "hello")
    await store.add_memory("chat-1", "assistant", "hi there")
    await store.add_memory("chat-2", "user", "other")
    await store.add_memory("chat-1", "user", "again")

    assert [(m.role, m.content) for m in await store.get_memory("chat-1")] == [
        ("user", "hello"),
        ("assistant", "hi there"),
        ("user", "again"),
    ]
    assert [m.content for m in await store.get_memory("chat-1", limit=2)] == ["hi there", "again"]
    assert [m.content for m in await store.get_memory("chat-2")] == ["other"]
    assert await store.get_memory("empty") == []
    with pytest.raises(ConfigurationError, match="memory role"):
        await store.add_memory("chat-1", "robot", "x")  # type: ignore[arg-type]


async def test_the_done_checkpoint_adds_the_turn_to_the_session_memory(store: Store) -> None:
    state = _state(session="chat")
    await store.checkpoint(state, _emit(state, Status(text="working")))
    assert await store.get_memory("chat") == []
    state.answer, state.phase, state.stop_reason = "42", "done", StopReason.FINAL_ANSWER
    await store.checkpoint(state, _emit(state, Done(result=RunResult.from_state(state))))
    assert [(m.role, m.content) for m in await store.get_memory("chat")] == [
        ("user", "a goal"),
        ("assistant", "42"),
    ]


@pytest.mark.parametrize("bad", ["../etc", "a/b", "..", "", "x" * 201, "a\\b", "ok..no", "sp ace", "é"])
async def test_ids_that_could_escape_are_refused(store: Store, bad: str) -> None:
    with pytest.raises(ConfigurationError, match="invalid"):
        await store.load_state(bad)
    with pytest.raises(ConfigurationError, match="invalid session id"):
        await store.get_memory(bad)
    with pytest.raises(ConfigurationError):
        await store.checkpoint(_state(bad), [])


# ================================================================================== corrupt and newer


def _corrupt(store: Store, run_id: str, text: str) -> Callable[[], str]:
    """Overwrite a stored state with raw text; return a function reading the raw text back."""
    if isinstance(store, MemoryStore):
        summary = store._states[run_id][1]
        store._states[run_id] = (text, summary)
        return lambda: store._states[run_id][0]
    if isinstance(store, FileStore):
        path = store.root / "runs" / f"{run_id}.json"
        path.write_text(text)
        return path.read_text
    if isinstance(store, SQLiteStore):
        db = str(store.path)

        def sql(query: str, *params: str) -> str:
            with sqlite3.connect(db) as conn:
                row = conn.execute(query, params).fetchone()
            return row[0] if row else ""

        sql("UPDATE runs SET state = ? WHERE run_id = ?", text, run_id)
        return lambda: sql("SELECT state FROM runs WHERE run_id = ?", run_id)
    import psycopg

    assert isinstance(store, PostgresStore)
    dsn = store.dsn

    def pg(query: str, *params: str) -> str:
        with psycopg.connect(dsn, autocommit=True) as conn:
            cur = conn.execute(query, params)
            row = cur.fetchone() if cur.description else None
        return row[0] if row else ""

    pg("UPDATE thinkloop_runs SET state = %s WHERE run_id = %s", text, run_id)
    return lambda: pg("SELECT state FROM thinkloop_runs WHERE run_id = %s", run_id)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"run_id": "run-1", "step": "many"', "corrupt run state"),
        ('{"schema_version": 99, "run_id": "run-1", "future_field": 1}', "schema version 99, newer"),
        ('{"run_id": "run-1", "step": "x"}', "corrupt run state: 1 problem"),
    ],
)
async def test_a_corrupt_or_newer_state_raises_a_clear_error_and_changes_nothing(
    store: Store, text: str, message: str
) -> None:
    state = _state()
    await store.checkpoint(state, _emit(state, Status(text="x")))
    read_back = _corrupt(store, "run-1", text)
    with pytest.raises(StateError, match=message) as info:
        await store.load_state("run-1")
    assert "run 'run-1'" in str(info.value)
    assert read_back() == text
    agent = Agent(ScriptedModel(["unused"]), store=store)
    with pytest.raises(StateError, match=message):
        await agent.resume("run-1")
    assert read_back() == text


# ============================================================================================ agents


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def test_an_agent_run_is_recorded_with_a_gap_free_event_log(store: Store) -> None:
    model = ScriptedModel([{"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}]}, "5"])
    result = await Agent(model, tools=[add], store=store).run("2+3?", run_id="agent-run")

    assert result.output == "5"
    saved = await store.load_state("agent-run")
    assert saved is not None and saved.phase == "done" and saved.step == 2
    assert saved.ledger["call_0_0"].status == "done" and saved.ledger["call_0_0"].output == "5"
    events = await store.read_events("agent-run")
    assert [e.seq for e in events] == list(range(1, saved.event_version + 1))
    assert events[0].type == "run_started" and events[-1].type == "done"
    assert [r.run_id for r in await store.list_runs(status="done")] == ["agent-run"]


async def test_a_second_run_with_the_same_id_is_refused(store: Store) -> None:
    await Agent(ScriptedModel(["one"]), store=store).run("first", run_id="same")
    with pytest.raises(ConcurrencyError):
        await Agent(ScriptedModel(["two"]), store=store).run("second", run_id="same")
    saved = await store.load_state("same")
    assert saved is not None and saved.answer == "one"


# ============================================================================================ open_store


def test_open_store_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THINKLOOP_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("THINKLOOP_STORE", raising=False)
    assert default_path() == tmp_path / "home" / "thinkloop.db"
    default = open_store(None)
    assert isinstance(default, SQLiteStore) and default.path == tmp_path / "home" / "thinkloop.db"
    absolute = open_store(f"sqlite:///{tmp_path}/x.db")
    assert isinstance(absolute, SQLiteStore) and absolute.path == tmp_path / "x.db"
    assert isinstance(reopened := open_store(absolute.url), SQLiteStore) and reopened.path == absolute.path
    files = open_store(f"file://{tmp_path}/runs")
    assert isinstance(files, FileStore) and files.root == tmp_path / "runs"
    assert isinstance(open_store("memory:"), MemoryStore)
    pg = open_store(PG_DSN)
    assert isinstance(pg, PostgresStore) and pg.dsn == PG_DSN
    with pytest.raises(ConfigurationError, match="unknown store URL 'redis://x'"):
        open_store("redis://x")
    with pytest.raises(ConfigurationError, match="needs a directory"):
        open_store("file://")


async def test_sqlite_is_in_wal_mode_and_refuses_a_newer_database(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    async with SQLiteStore(db) as store:
        await store.add_memory("s", "user", "x")
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.execute("INSERT INTO schema_version (version) VALUES (99)")
    async with SQLiteStore(db) as store:
        with pytest.raises(StateError, match="schema version 99, newer"):
            await store.get_memory("s")


async def test_a_file_that_is_not_a_sqlite_database_is_a_clear_error_and_is_left_alone(tmp_path: Path) -> None:
    db = tmp_path / "notes.db"
    db.write_text("my notes, not a database\n" * 100)
    before = db.read_bytes()
    agent = Agent(ScriptedModel(["hi"]), store=SQLiteStore(db))
    with pytest.raises(StateError, match=r"notes\.db failed: file is not a database; the file is not a thinkloop"):
        await agent.run("x")
    assert db.read_bytes() == before


async def test_a_full_disk_is_a_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    async with SQLiteStore(db) as store:
        await store.add_memory("s", "user", "x")
        with sqlite3.connect(db) as conn:  # a database that may not grow (as on a full disk)
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count = {pages}")
        store_conn = store._fast if store._fast is not None else store._conn
        assert store_conn is not None
        store_conn.execute(f"PRAGMA max_page_count = {pages}")
        with pytest.raises(StateError, match="failed: database or disk is full; free some disk space"):
            await store.add_memory("s", "user", "y" * 200_000)


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("postgresql://bob:s3cr@t@db.example:5432/runs", "postgresql://bob:***@db.example:5432/runs"),
        ("postgresql://bob@db.example/runs", "postgresql://bob@db.example/runs"),
        ("host=h user=u password=secret dbname=d", "host=h user=u password=*** dbname=d"),
        ("password='a b' host=x", "password=*** host=x"),
        ("postgresql://db.example/runs?password=zzz", "postgresql://db.example/runs?password=***"),
    ],
)
def test_a_postgres_store_never_shows_its_password(dsn: str, shown: str) -> None:
    assert PostgresStore(dsn).url == shown


async def test_an_unreachable_postgres_server_is_a_clear_error_without_the_password() -> None:
    agent = Agent(ScriptedModel(["hi"]), store=PostgresStore("postgresql://bob:hunter2@127.0.0.1:1/runs"))
    with pytest.raises(StateError, match=r"PostgreSQL store postgresql://bob:\*\*\*@127.0.0.1:1/runs failed") as info:
        await agent.run("x")
    assert "hunter2" not in str(info.value) and "check that the server is running" in str(info.value)


# ========================================================================================= concurrency

WRITER = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from thinkloop import ConcurrencyError
    from thinkloop._events import Status
    from thinkloop.stores import open_store

    async def main(url, name, rounds, start_file):
        store = open_store(url)
        results = []
        while not __import__("os").path.exists(start_file):
            time.sleep(0.005)
        for version in range(rounds):
            try:
                await store.append_events("shared", [Status(text=name)], expected_version=version)
                results.append([version, "won"])
            except ConcurrencyError:
                results.append([version, "lost"])
        await store.aclose()
        print(json.dumps(results))

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
    """
)


def _race(url: str, tmp_path: Path, rounds: int = 60) -> None:
    """Two processes append at every version 0..rounds-1: per version exactly one wins."""
    start = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, url, name, str(rounds), str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("p1", "p2")
    ]
    start.touch()
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    results = [dict(json.loads(out)) for out, _ in outputs]
    for version in range(rounds):
        assert sorted([results[0][version], results[1][version]]) == ["lost", "won"], version


async def _read_shared(store: Store) -> list[Any]:
    async with store:
        return await store.read_events("shared")


def test_two_processes_appending_to_sqlite_exactly_one_wins_per_version(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/race.db"
    _race(url, tmp_path)
    import asyncio

    events = asyncio.run(_read_shared(open_store(url)))
    assert [e.seq for e in events] == list(range(1, 61))


def test_two_processes_appending_to_postgres_exactly_one_wins_per_version(
    pg_dsn: str, tmp_path: Path
) -> None:
    import asyncio

    asyncio.run(_read_shared(PostgresStore(pg_dsn)))  # create the tables before the race
    _race(pg_dsn, tmp_path)
    events = asyncio.run(_read_shared(PostgresStore(pg_dsn)))
    assert [e.seq for e in events] == list(range(1, 61))


async def test_a_bounded_memory_store_forgets_the_oldest_finished_runs() -> None:
    store = MemoryStore(max_runs=2)
    running = _state("running")
    await store.checkpoint(running, _emit(running, Status(text="x")))
    for name in ("old", "new", "newest"):
        await Agent(ScriptedModel(["ok"]), store=store).run("go", run_id=name)
    assert sorted(r.run_id for r in await store.list_runs()) == ["newest", "running"]
    assert await store.load_state("old") is None and await store.read_events("new") == []
    assert isinstance(Agent(ScriptedModel(["x"])).store, MemoryStore)


async def test_nul_characters_in_a_run_and_its_session_memory_are_kept_by_every_store(store: Store) -> None:
    """PostgreSQL TEXT cannot hold NUL: the state (JSON) keeps it exactly, the memory has U+FFFD there."""
    result = await Agent(ScriptedModel(["an\x00swer"]), store=store).run("go\x00al", session="nul-session")
    assert result.stop_reason is StopReason.FINAL_ANSWER and result.output == "an\x00swer"
    state = await store.load_state(result.run_id)
    assert state is not None and state.goal == "go\x00al" and state.answer == "an\x00swer"
    memory = [m.content for m in await store.get_memory("nul-session")]
    nul = "\ufffd" if isinstance(store, PostgresStore) else "\x00"
    assert memory == [f"go{nul}al", f"an{nul}swer"]
