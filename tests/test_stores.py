"""The store suite (SPEC §9): the same behaviour from SQLite, PostgreSQL, memory and file stores."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import PG_DSN, private_schema
from thinkloop import Agent, ConcurrencyError, ConfigurationError, RunState, StateError, UserError, tool
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
        for table in (
            "thinkloop_runs",
            "thinkloop_events",
            "thinkloop_memory",
            "thinkloop_schema",
            "thinkloop_messages",
            "thinkloop_ledger",
        ):
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


async def test_of_two_copies_loaded_from_one_checkpoint_only_the_first_saved_is_written(store: Store) -> None:
    """Two processes resume the run from the same checkpoint. The first saves with no events (the start
    of a tool call it is about to run): the log's version does not move, yet the second copy's save — with
    events or without — is refused, so it never goes on to run that call too. A state that never loaded
    from the store (saves 0, no row yet) saves as before."""
    state = _state()
    await store.checkpoint(state, _emit(state, Status(text="one")))
    assert state.saves == 1
    first, second = await store.load_state("run-1"), await store.load_state("run-1")
    assert first is not None and second is not None and first.saves == second.saves == 1
    first.step = 1
    await store.checkpoint(first, [])
    assert first.saves == 2
    second.step = 2
    with pytest.raises(ConcurrencyError, match="saved by another writer") as info:
        await store.checkpoint(second, [])
    assert (info.value.saved_since, info.value.expected, info.value.actual) == (True, 1, 2)
    assert second.saves == 1  # not counted: nothing of it was written
    with pytest.raises(ConcurrencyError, match="saved by another writer"):
        await store.checkpoint(second, _emit(second, Status(text="second's")))
    loaded = await store.load_state("run-1")
    assert loaded is not None and (loaded.step, loaded.saves) == (1, 2)
    assert [getattr(e, "text", "") for e in await store.read_events("run-1")] == ["one"]
    first.step = 3
    await store.checkpoint(first, _emit(first, Status(text="two")))
    loaded = await store.load_state("run-1")
    assert loaded is not None and (loaded.step, loaded.saves, loaded.event_version) == (3, 3, 2)


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


@pytest.mark.parametrize("limit", [-1, 2.5, True, "10", None])
async def test_list_runs_refuses_a_limit_that_is_no_count_of_runs_in_every_store(store: Store, limit: Any) -> None:
    """`limit=-1` listed every run in SQLite, all but the oldest in memory and raised psycopg's error in
    PostgreSQL: every store now says what a limit must be."""
    state = _state("run-0")
    await store.checkpoint(state, _emit(state, Status(text="x")))
    with pytest.raises(ConfigurationError, match=r"limit must be a whole number, 0 or more, not"):
        await store.list_runs(limit=limit)
    assert await store.list_runs(limit=0) == []
    assert [r.run_id for r in await store.list_runs(limit=1)] == ["run-0"]


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
    model = ScriptedModel(["two"])
    with pytest.raises(
        UserError, match=r"a run with id 'same' already exists in the store: give the new run another"
    ):
        await Agent(model, store=store).run("second", run_id="same")
    saved = await store.load_state("same")
    assert saved is not None and saved.answer == "one" and saved.goal == "first"
    assert model.requests == []


async def test_the_default_store_refuses_a_second_run_with_the_same_id_too() -> None:
    # the in-process store wrote the second run over the first, and its session turn was never kept
    agent = Agent(ScriptedModel(["one", "two"]))
    await agent.run("first", run_id="same", session="s1")
    with pytest.raises(UserError, match=r"a run with id 'same' already exists in the store"):
        await agent.run("second", run_id="same", session="s1")
    saved = await agent.store.load_state("same")
    assert saved is not None and (saved.goal, saved.answer) == ("first", "one")
    second = await agent.run("second", run_id="other", session="s1")
    assert second.output == "two"
    memory = await agent.store.get_memory("s1")
    assert [(m.role, m.content) for m in memory] == [
        ("user", "first"), ("assistant", "one"), ("user", "second"), ("assistant", "two")
    ]  # fmt: skip


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


async def test_a_file_that_is_not_a_sqlite_database_is_a_clear_error_and_is_left_alone(
    tmp_path: Path,
) -> None:
    db = tmp_path / "notes.db"
    db.write_text("my notes, not a database\n" * 100)
    before = db.read_bytes()
    agent = Agent(ScriptedModel(["hi"]), store=SQLiteStore(db))
    with pytest.raises(
        StateError, match=r"notes\.db failed: file is not a database; the file is not a thinkloop"
    ):
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
    with pytest.raises(
        StateError, match=r"PostgreSQL store postgresql://bob:\*\*\*@127.0.0.1:1/runs failed"
    ) as info:
        await agent.run("x")
    assert "hunter2" not in str(info.value) and "check that the server is running" in str(info.value)


@pytest.mark.parametrize("kind", ["file", "postgres"])
async def test_a_store_failing_at_a_runs_first_save_says_there_is_nothing_to_resume(
    kind: str, tmp_path: Path
) -> None:
    """Nothing of the run is stored: it is to be started again, not resumed (SQLite: the lock test below)."""
    (tmp_path / "plain").write_text("a file where the store's directory should be")
    store = (
        FileStore(tmp_path / "plain") if kind == "file" else PostgresStore("postgresql://x@127.0.0.1:1/db")
    )
    with pytest.raises(StateError) as info:
        await Agent(ScriptedModel(["hi"]), store=store).run("x", run_id="first")
    assert str(info.value).endswith(
        "; nothing of run 'first' was saved (this was its first save), so there is nothing to resume: "
        "start it again"
    )
    assert info.value.state is None


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
    """A run must not die because a tool printed a NUL or a model wrote one: PostgreSQL TEXT cannot hold it,
    so the state, its messages, ledger rows (keys too) and events are stored as JSON (`\\u0000`) and kept
    exactly — across checkpoints that write only what changed; the session memory has U+FFFD there."""

    @tool
    def dump(path: str) -> str:
        """Print a file."""
        return f"{path}: \x00\x01binary\x00"

    calls = [
        {"tool_calls": [{"name": "dump", "args": {"path": f"a\x00{n}"}, "id": f"c\x00{n}"}]} for n in "12"
    ]
    agent = Agent(ScriptedModel([*calls, "an\x00swer"]), tools=[dump], store=store)
    result = await agent.run("go", session="nul-session")
    assert result.stop_reason is StopReason.FINAL_ANSWER and result.output == "an\x00swer"
    state = await store.load_state(result.run_id)
    assert state is not None and state.answer == "an\x00swer"
    printed = [f"a\x00{n}: \x00\x01binary\x00" for n in "12"]
    assert {k: e.output for k, e in state.ledger.items()} == {"c\x001": printed[0], "c\x002": printed[1]}
    assert [m.model_dump() for m in state.messages] == [m.model_dump() for m in result.state.messages]
    done = (await store.read_events(result.run_id))[-1]
    assert isinstance(done, Done) and done.result.output == "an\x00swer"
    memory = [m.content for m in await store.get_memory("nul-session")]
    nul = "\ufffd" if isinstance(store, PostgresStore) else "\x00"
    assert memory == ["go", f"an{nul}swer"]


# ============================================================================ faults underneath a store
# Real files, real processes and the real PostgreSQL server: what a store does when what is under it fails.

HOLD_LOCK = textwrap.dedent(
    """
    import sqlite3, sys, time
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    print("held", flush=True)
    sys.stdin.readline()  # held until the test says so (a fixed time could end before a slow test got there)
    conn.execute("COMMIT")
    """
)


async def _saved(store: Store, run_id: str = "run-1", text: str = "x") -> RunState:
    state = _state(run_id)
    await store.checkpoint(state, _emit(state, Status(text=text)))
    return state


async def test_sqlite_waits_for_another_processes_lock_then_fails_saying_what_to_do(tmp_path: Path) -> None:
    import asyncio

    db = tmp_path / "runs.db"
    async with SQLiteStore(db) as first:
        state = await _saved(first)
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HOLD_LOCK, str(db), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and await holder.stdout.readline() == b"held\n"
        async with SQLiteStore(db, busy_timeout=0.3) as store:
            # a store opened while another process writes can still read (no write lock needed to open)
            loaded = await store.load_state("run-1")
            assert loaded is not None and loaded.event_version == 1
            ticks = 0

            async def tick() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.01)

            ticker = asyncio.create_task(tick())
            events = _emit(state, Status(text="second"))
            with pytest.raises(StateError) as info:
                await store.checkpoint(state, events)
            ticker.cancel()
            message = str(info.value)
            assert "database is locked" in message and "another process held its write lock" in message
            assert f"fuser {db}" in message and "busy_timeout" in message and "then try again" in message
            assert ticks >= 10  # the event loop went on while the worker thread waited
            assert holder.stdin is not None
            holder.stdin.write(b"release\n")
            await holder.stdin.drain()
            await asyncio.wait_for(holder.wait(), 30)
            await store.checkpoint(state, events)  # once the lock is free, the same save succeeds
            assert [e.seq for e in await store.read_events("run-1")] == [1, 2]
    finally:
        if holder.returncode is None:
            holder.kill()
        await holder.communicate()


async def test_only_a_run_with_a_saved_checkpoint_is_told_to_resume_when_the_sqlite_store_is_locked(
    tmp_path: Path,
) -> None:
    """A run that failed at its first save was told "database is locked … then resume the run": nothing of
    it was stored, and a resume found no run. A run stopped by the lock later on is told how to resume it
    (`agent.resume`, and on the command line `thinkloop runs resume`)."""
    import asyncio

    from thinkloop.cli._run import with_resume_command

    db = tmp_path / "runs.db"
    async with SQLiteStore(db) as store:
        await store.list_runs()  # the tables are made
    holders: list[asyncio.subprocess.Process] = []

    async def hold_the_lock() -> None:
        holder = await asyncio.create_subprocess_exec(
            sys.executable, "-c", HOLD_LOCK, str(db), stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        holders.append(holder)
        assert holder.stdout is not None and await holder.stdout.readline() == b"held\n"

    async def release_the_lock() -> None:
        holder = holders.pop()
        await holder.communicate(b"release\n")

    @tool
    async def lock_the_store() -> str:
        """Take the store's write lock in another process."""
        await hold_the_lock()
        return "locked"

    locked = (
        f"the SQLite store {db} failed: database is locked; another process held its write lock for more "
        f"than busy_timeout (0.2 s) (`fuser {db}` shows which): end or wait for it, then try again, or give "
        "SQLiteStore a longer busy_timeout"
    )
    try:
        async with SQLiteStore(db, busy_timeout=0.2) as store:
            await hold_the_lock()
            with pytest.raises(StateError) as first:
                await Agent(ScriptedModel(["hi"]), store=store).run("go", run_id="never-saved")
            await release_the_lock()
            assert str(first.value) == (
                f"{locked}; nothing of run 'never-saved' was saved (this was its first save), so there is "
                "nothing to resume: start it again"
            )
            assert first.value.state is None and await store.load_state("never-saved") is None
            assert with_resume_command(first.value, "sqlite:///x.db") is first.value  # no command either

            model = ScriptedModel([{"tool_calls": [{"name": "lock_the_store", "args": {}}]}])
            with pytest.raises(StateError) as later:
                await Agent(model, tools=[lock_the_store], store=store).run("go", run_id="saved")
            await release_the_lock()
            message = str(later.value)
            assert message.startswith(f"{locked} — run saved stopped unfinished at step 1: ")
            assert "agent.resume('saved') continues it" in message
            saved = await store.load_state("saved")
            assert saved is not None and not saved.finished  # there is something to resume
            assert str(with_resume_command(later.value, f"sqlite://{db}")).endswith(
                f"; from the command line: thinkloop runs resume saved --store sqlite://{db}"
            )
    finally:
        for holder in holders:
            holder.kill()
            await holder.communicate()


def test_two_processes_running_agents_on_one_new_sqlite_file_both_succeed(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import asyncio, os, sys, time
        from thinkloop import Agent, tool
        from thinkloop.stores import SQLiteStore
        from thinkloop.testing import ScriptedModel

        @tool
        def add(a: int, b: int) -> int:
            "Add."
            return a + b

        async def main(db, name, go):
            while not os.path.exists(go):
                time.sleep(0.001)
            store = SQLiteStore(db, busy_timeout=5)
            for i in range(25):
                model = ScriptedModel([{"tool_calls": [{"name": "add", "args": {"a": 1, "b": i}}]}, "done"])
                await Agent(model, tools=[add], store=store).run("go", run_id=f"{name}-{i}")
            await store.aclose()

        asyncio.run(main(*sys.argv[1:]))
        """
    )
    db, go = tmp_path / "new" / "shared.db", tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(db), name, str(go)], stderr=subprocess.PIPE, text=True
        )
        for name in ("p1", "p2")
    ]
    go.touch()
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors

    async def check() -> None:
        async with SQLiteStore(db) as store:
            runs = await store.list_runs(limit=100, status="done")
            assert sorted(r.run_id for r in runs) == sorted(
                f"{n}-{i}" for n in ("p1", "p2") for i in range(25)
            )
            events = await store.read_events("p2-24")
            assert [e.seq for e in events] == list(range(1, len(events) + 1)) and events[-1].type == "done"

    import asyncio

    asyncio.run(check())


async def test_sqlite_a_full_disk_during_a_checkpoint_is_reported_as_such(tmp_path: Path) -> None:
    """SQLite rolls a transaction back itself on a full disk: the store's own ROLLBACK must not hide why."""
    async with SQLiteStore(tmp_path / "runs.db") as store:
        state = await _saved(store)
        conn = store._fast if store._fast is not None else store._conn
        assert conn is not None
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")  # the database may not grow: a full disk
        events = _emit(state, Status(text="y" * 300_000))
        with pytest.raises(StateError, match="database or disk is full; free some disk space"):
            await store.checkpoint(state, events)
        conn.execute("PRAGMA max_page_count = 1073741823")
        await store.checkpoint(state, events)  # space again: the same save goes through
        assert [e.seq for e in await store.read_events("run-1")] == [1, 2]


def _damaged_copies(tmp_path: Path) -> dict[str, Path]:
    good = tmp_path / "good.db"
    with sqlite3.connect(good) as conn:
        conn.execute("CREATE TABLE t (x TEXT)")
        conn.executemany("INSERT INTO t VALUES (?)", [("z" * 3000,)] * 100)
    data = good.read_bytes()
    scrambled = bytearray(data)
    scrambled[100:4096] = bytes(i * 7 % 256 for i in range(100, 4096))  # the schema page
    paths = {"truncated": data[:4096], "scrambled": bytes(scrambled), "not a database": b"hello\n" * 999}
    for name, content in paths.items():
        (tmp_path / f"{name}.db").write_bytes(content)
    return {name: tmp_path / f"{name}.db" for name in paths}


@pytest.mark.parametrize("kind", ["truncated", "scrambled", "not a database"])
async def test_a_damaged_sqlite_file_is_a_clear_error_and_is_left_alone(tmp_path: Path, kind: str) -> None:
    db = _damaged_copies(tmp_path)[kind]
    before = db.read_bytes()
    async with SQLiteStore(db) as store:
        for attempt in (store.load_state("run-1"), store.list_runs(), _saved(store)):
            with pytest.raises(
                StateError, match=r"is not a thinkloop SQLite database or is damaged: move it away"
            ):
                await attempt
    assert db.read_bytes() == before


async def test_a_sqlite_path_that_is_a_directory_or_under_a_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "runs.db").mkdir()
    with pytest.raises(
        StateError, match=r"runs\.db failed: .*that path is a directory: give the path of a database"
    ):
        await SQLiteStore(tmp_path / "runs.db").list_runs()
    (tmp_path / "plain").write_text("a file, not a directory")
    with pytest.raises(
        StateError, match=r"runs\.db failed: .*plain is a file, not a directory: check the path"
    ):
        await SQLiteStore(tmp_path / "plain" / "runs.db").list_runs()
    async with SQLiteStore(tmp_path / "new" / "deeper" / "runs.db") as store:  # a missing directory is made
        await _saved(store)
    assert (tmp_path / "new" / "deeper" / "runs.db").is_file()


def _without_root_powers(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a new process for which file permissions hold: as root, without the capabilities that
    let root read and write past them (so a chmod means what it says, as for any user)."""
    import os

    prefix: list[str] = []
    if os.geteuid() == 0:
        caps = "-dac_override,-dac_read_search"
        prefix = ["setpriv", "--bounding-set", caps, "--inh-caps", caps]
    return subprocess.run(
        [*prefix, sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60, check=False
    )


PROBE_STORE = textwrap.dedent(
    """
    import asyncio, sys
    from thinkloop import RunState, StateError
    from thinkloop.stores import open_store

    async def main(url):
        store = open_store(url)
        for name, attempt in [
            ("load", lambda: store.load_state("run-1")),
            ("save", lambda: store.checkpoint(RunState(run_id="run-2", goal="g", model="m"), [])),
        ]:
            try:
                await attempt()
                print(name, "ok")
            except StateError as exc:
                print(name, "StateError", exc)
        await store.aclose()

    asyncio.run(main(sys.argv[1]))
    """
)


async def test_unreadable_and_read_only_sqlite_files_are_clear_errors(tmp_path: Path) -> None:
    for name in ("unreadable", "read-only-dir"):
        async with SQLiteStore(tmp_path / name / "runs.db") as store:
            await _saved(store)
    (tmp_path / "unreadable" / "runs.db").chmod(0o000)
    (tmp_path / "read-only-dir").chmod(0o555)  # WAL needs runs.db-wal and runs.db-shm beside the file
    try:
        unreadable = _without_root_powers(PROBE_STORE, f"sqlite://{tmp_path}/unreadable/runs.db")
        read_only = _without_root_powers(PROBE_STORE, f"sqlite://{tmp_path}/read-only-dir/runs.db")
    finally:
        (tmp_path / "unreadable" / "runs.db").chmod(0o644)
        (tmp_path / "read-only-dir").chmod(0o755)
    assert unreadable.stderr == "" and read_only.stderr == ""
    lines = unreadable.stdout.splitlines()
    assert len(lines) == 2 and all(
        "StateError" in line and "unable to open database file" in line for line in lines
    )
    assert "check that the file and its directory exist and are readable and writable" in lines[0]
    load, save = read_only.stdout.splitlines()
    assert load == "load ok"  # read-only: SQLite cannot make runs.db-wal and runs.db-shm there (it failed)
    assert save == (
        f"save StateError the SQLite store {tmp_path}/read-only-dir/runs.db failed: attempt to write a "
        "readonly database; it is read-only (SQLite cannot write runs.db-wal and runs.db-shm in "
        f"{tmp_path}/read-only-dir): its runs can be listed and shown, not saved — make the file and its "
        "directory writable, or use a store in a writable place; nothing of run 'run-2' was saved (this was its "
        "first save), so there is nothing to resume: start it again"
    )


def _on_a_read_only_file_system(directory: Path, *command: str) -> subprocess.CompletedProcess[str]:
    """Run `command` in a new process that sees `directory` on a read-only file system: a read-only bind
    mount of it over itself, in a mount namespace of the process's own (nothing else sees it)."""
    import os

    mount = 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" && exec "$@"'
    prefix = ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "--map-root-user", "--mount"]
    return subprocess.run(
        [*prefix, "sh", "-c", mount, str(directory), *command],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


LIST_LOAD_SAVE = textwrap.dedent(
    """
    import asyncio, sys
    from thinkloop import RunState, StateError
    from thinkloop.stores import SQLiteStore

    async def main(path):
        store = SQLiteStore(path)
        for name, attempt in [
            ("list", lambda: store.list_runs()),
            ("load", lambda: store.load_state("run-1")),
            ("save", lambda: store.checkpoint(RunState(run_id="run-2", goal="g", model="m"), [])),
        ]:
            try:
                got = await attempt()
                print(name, "ok", [r.run_id for r in got] if name == "list" else getattr(got, "event_version", ""))
            except StateError as exc:
                print(name, "StateError", exc)
        await store.aclose()

    asyncio.run(main(sys.argv[1]))
    """
)


async def test_a_sqlite_store_on_a_read_only_file_system_is_read_and_a_save_says_why_it_fails(
    tmp_path: Path,
) -> None:
    """`thinkloop runs list` and `runs show` could not read a store on a read-only file system ("unable to
    open database file"): in WAL mode SQLite makes runs.db-wal and runs.db-shm beside the file to read it."""
    async with SQLiteStore(tmp_path / "runs.db") as store:
        await _saved(store)
    assert _names(tmp_path) == ["runs.db"]  # no runs.db-wal nor -shm: reading needs them, or none made
    db = str(tmp_path / "runs.db")
    probe = _on_a_read_only_file_system(tmp_path, sys.executable, "-c", LIST_LOAD_SAVE, db)
    assert probe.stderr == "", probe.stderr
    listed, loaded, saved = probe.stdout.splitlines()
    assert (listed, loaded) == ("list ok ['run-1']", "load ok 1")
    assert saved == (
        f"save StateError the SQLite store {db} failed: attempt to write a readonly database; it is "
        f"read-only ({tmp_path} is on a read-only file system): its runs can be listed and shown, not saved — "
        "make the file and its directory writable, or use a store in a writable place; nothing of run 'run-2' "
        "was saved (this was its first save), so there is nothing to resume: start it again"
    )
    url = f"sqlite://{db}"
    cli = [sys.executable, "-m", "thinkloop.cli", "runs"]
    listing = _on_a_read_only_file_system(tmp_path, *cli, "list", "--json", "--store", url)
    assert listing.returncode == 0, listing.stderr
    assert [json.loads(line)["run_id"] for line in listing.stdout.splitlines()] == ["run-1"]
    shown = _on_a_read_only_file_system(tmp_path, *cli, "show", "run-1", "--store", url)
    assert shown.returncode == 0 and "run run-1" in shown.stdout, shown.stderr
    (tmp_path.parent / "hi.json").write_text('["hi"]')
    model = f"script:{tmp_path.parent / 'hi.json'}"
    run = _on_a_read_only_file_system(tmp_path, *cli[:-1], "run", "x", "--model", model, "--store", url)
    assert run.returncode == 1 and "runs resume" not in run.stderr, (
        run.stderr
    )  # never saved: nothing to resume
    assert run.stderr.startswith(f"error: the SQLite store {db} failed: attempt to write a readonly database")
    assert run.stderr.rstrip().endswith(
        "(this was its first save), so there is nothing to resume: start it again"
    )


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


CRASH_AFTER_SAVE = textwrap.dedent(
    """
    import asyncio, os, sys
    from thinkloop import RunState
    from thinkloop._events import Status
    from thinkloop.stores import SQLiteStore

    async def main(path):
        store = SQLiteStore(path)
        state = await store.load_state("run-1")
        state.event_version += 1
        await store.checkpoint(state, [Status(text="second", run_id="run-1", seq=state.event_version)])
        os._exit(0)  # killed: the commit is in runs.db-wal only, beside runs.db-shm

    asyncio.run(main(sys.argv[1]))
    """
)


async def test_a_read_only_sqlite_store_whose_last_commits_are_in_its_wal_reads_them_or_says_why_not(
    tmp_path: Path,
) -> None:
    async with SQLiteStore(tmp_path / "runs.db") as store:
        await _saved(store)
    db = str(tmp_path / "runs.db")
    crashed = _without_root_powers(CRASH_AFTER_SAVE, db)
    assert crashed.returncode == 0, crashed.stderr
    assert _names(tmp_path) == ["runs.db", "runs.db-shm", "runs.db-wal"]
    probe = _on_a_read_only_file_system(tmp_path, sys.executable, "-c", LIST_LOAD_SAVE, db)
    assert probe.stdout.splitlines()[:2] == ["list ok ['run-1']", "load ok 2"], probe.stdout + probe.stderr
    (tmp_path / "runs.db-shm").unlink()  # without it, SQLite must write one to read the WAL
    probe = _on_a_read_only_file_system(tmp_path, sys.executable, "-c", LIST_LOAD_SAVE, db)
    lines = probe.stdout.splitlines()
    assert len(lines) == 3 and all(" StateError " in line for line in lines), probe.stdout + probe.stderr
    assert lines[1] == (
        f"load StateError the SQLite store {db} cannot be read: runs.db-wal beside it holds commits not yet "
        f"in the database, which SQLite reads only when it can also write runs.db-shm there, and {tmp_path} "
        "is read-only: make it writable (or copy the three files to a directory that is), then read the "
        "runs again"
    )
    async with SQLiteStore(db) as store:  # writable again: nothing was lost
        loaded = await store.load_state("run-1")
        assert loaded is not None and loaded.event_version == 2


async def test_a_read_only_sqlite_store_of_an_older_schema_or_none_says_it_cannot_be_upgraded(
    tmp_path: Path,
) -> None:
    (tmp_path / "empty.db").write_bytes(b"")
    with sqlite3.connect(tmp_path / "old.db") as conn:
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO schema_version VALUES (2)")
    for name, what in [
        ("empty.db", "holds no thinkloop tables"),
        ("old.db", "has schema version 2, older than this thinkloop's (4)"),
    ]:
        db = str(tmp_path / name)
        probe = _on_a_read_only_file_system(tmp_path, sys.executable, "-c", LIST_LOAD_SAVE, db)
        listed = probe.stdout.splitlines()[0]
        assert listed == (
            f"list StateError the SQLite store {db} {what} and is read-only ({tmp_path} is on a read-only "
            "file system), so it cannot be set up or upgraded: open it once where it is writable, or use "
            "another store"
        ), probe.stdout + probe.stderr


async def test_a_read_only_file_store_is_a_clear_error(tmp_path: Path) -> None:
    async with FileStore(tmp_path / "files") as store:
        await _saved(store)
    for path in [tmp_path / "files", *(tmp_path / "files").rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    try:
        probe = _without_root_powers(PROBE_STORE, f"file://{tmp_path}/files")
    finally:
        for path in [tmp_path / "files", *(tmp_path / "files").rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    assert probe.stderr == ""
    load, save = probe.stdout.splitlines()
    assert load == "load ok"  # reading needs no write access
    assert save.startswith(
        f"save StateError the file store {tmp_path}/files failed: [Errno 13] Permission denied"
    )
    assert save.endswith(
        f"make {tmp_path}/files writable (the store writes .lock, runs/ and sessions/ in it), "
        "or use a store in a writable place; nothing of run 'run-2' was saved (this was its first save), so "
        "there is nothing to resume: start it again"
    )


async def test_a_file_store_lists_its_runs_past_damaged_foreign_and_newer_files(tmp_path: Path) -> None:
    async with FileStore(tmp_path / "files") as store:
        await _saved(store, "good")
        runs = tmp_path / "files" / "runs"
        (runs / "corrupt.json").write_text('{"run_id": "corrupt", "step": "x"}')
        (runs / "newer.json").write_text('{"schema_version": 99, "run_id": "newer"}')
        (runs / "binary.json").write_bytes(b"\xff\xfe\x00{")
        (runs / "folder.json").mkdir()
        (runs / "notes.txt").write_text("a note someone left here")
        (runs / ".good.json.123.tmp").write_text('{"half": ')  # a write that a crash cut short
        assert [r.run_id for r in await store.list_runs()] == ["good"]
        with pytest.raises(
            StateError, match=r"run 'newer' in .*newer\.json: run state has schema version 99, newer"
        ):
            await store.load_state("newer")
        with pytest.raises(StateError, match=r"run 'binary' in .*binary\.json: corrupt run state"):
            await store.load_state("binary")
        loaded = await store.load_state("good")
        assert loaded is not None and loaded.event_version == 1


CRASHING_WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from thinkloop import RunState
    from thinkloop._events import Status
    from thinkloop.stores import FileStore

    async def main(root):
        store = FileStore(root)
        state = await store.load_state("big") or RunState(run_id="big", goal="g", model="m")
        while True:  # killed from outside, in the middle of some write
            state.step += 1
            state.answer = str(state.step) * 400_000
            state.event_version += 1
            await store.checkpoint(state, [Status(run_id="big", seq=state.event_version, text="x" * 100_000)])
            print(state.step, flush=True)

    asyncio.run(main(sys.argv[1]))
    """
)


async def test_a_file_store_killed_in_the_middle_of_writes_always_loads(tmp_path: Path) -> None:
    """Each state is written to a temporary file and renamed over the old one: a process killed at any
    moment leaves the previous state or the new one, never half of one; the log is repaired on the next save."""
    import asyncio
    import random
    import signal

    root = tmp_path / "files"
    for kill in range(4):
        writer = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CRASHING_WRITER, str(root), stdout=subprocess.PIPE
        )
        assert writer.stdout is not None
        await writer.stdout.readline()  # one save at least
        await asyncio.sleep(random.uniform(0.0, 0.2))
        writer.send_signal(signal.SIGKILL)
        await writer.communicate()
        async with FileStore(root) as store:
            state = await store.load_state("big")
            assert state is not None and state.answer == str(state.step) * 400_000, kill
            events = await store.read_events("big", after=state.event_version - 1)
            assert events[0].seq == state.event_version
            # the next save (a resumed run) goes on from the saved state; orphaned events are dropped
            await store.checkpoint(state, [])
            assert len(await store.read_events("big")) == state.event_version


KILLED_IN_FIRST_SAVE = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from thinkloop import Agent
    from thinkloop.stores import FileStore, PostgresStore, SQLiteStore, _file, _postgres, _sqlite
    from thinkloop.testing import ScriptedModel

    kind, where = sys.argv[1:3]

    def die(*args):
        os.kill(os.getpid(), signal.SIGKILL)

    async def die_async(*args):
        die()

    if kind == "file":  # the events appended and synced, the state file not written yet
        write = _file._write_atomic
        _file._write_atomic = lambda path, text: die() if path.name == "r1.json" else write(path, text)
        store = FileStore(where)
    elif kind == "sqlite":  # the events inserted, the run's row not yet (in the checkpoint's transaction)
        _sqlite._write_delta = die
        store = SQLiteStore(where)
    else:
        _postgres._write_run = die_async
        store = PostgresStore(where)
    asyncio.run(Agent(ScriptedModel(["done"]), store=store).run("go", run_id="r1"))
    """
)


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres"])
async def test_a_process_killed_in_a_run_s_first_save_leaves_the_run_id_free(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A FileStore left the events of the first save without its state: resume said "no run 'r1'" and a
    new run "a run with id 'r1' already exists" — the id could never be used again. Those events are
    orphans of a save that never completed, dropped by the next save (the databases never commit them)."""
    import asyncio
    import signal

    where = {"file": str(tmp_path / "files"), "sqlite": str(tmp_path / "runs.db")}.get(kind)
    where = where or request.getfixturevalue("pg_dsn")
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", KILLED_IN_FIRST_SAVE, kind, where, stderr=subprocess.PIPE
    )
    _, stderr = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == -signal.SIGKILL, stderr.decode()
    if kind == "file":  # the situation: events on disk, no state
        assert (tmp_path / "files" / "runs" / "r1.events.jsonl").read_text().count("\n") >= 1
        assert not (tmp_path / "files" / "runs" / "r1.json").exists()
    made = {"file": FileStore, "sqlite": SQLiteStore}.get(kind, PostgresStore)(where)
    async with made as store:
        assert await store.load_state("r1") is None
        with pytest.raises(StateError, match="no run 'r1' in the store"):
            await Agent(ScriptedModel(["unused"]), store=store).resume("r1")
        result = await Agent(ScriptedModel(["done"]), store=store).run("go", run_id="r1")
        assert result.output == "done" and result.state.error is None
        events = await store.read_events("r1")
        assert [e.seq for e in events] == list(range(1, result.state.event_version + 1))
        assert [e.type for e in events].count("run_started") == 1
        loaded = await store.load_state("r1")
        assert loaded is not None and loaded.event_version == result.state.event_version


async def test_a_file_store_keeps_a_log_whose_state_is_there_but_unreadable(tmp_path: Path) -> None:
    # Only a log without a state file is a first save's orphans: beside a corrupt state it is the run's.
    async with FileStore(tmp_path / "files") as store:
        await _saved(store, "r1")
        runs = tmp_path / "files" / "runs"
        (runs / "r1.json").write_text('{"run_id": "r1", "step": ')
        log = (runs / "r1.events.jsonl").read_text()
        with pytest.raises(UserError, match="a run with id 'r1' already exists"):
            await Agent(ScriptedModel(["done"]), store=store).run("go", run_id="r1")
        assert (runs / "r1.events.jsonl").read_text() == log


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names a file descriptor through /proc")
async def test_a_file_store_checkpoint_is_synced_to_disk_before_and_after_its_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing was synced: a power loss after the rename could leave an empty or truncated state file, or
    a state whose events never reached the log (a run that could not be saved again)."""
    import os

    done: list[tuple[str, ...]] = []
    real = {name: getattr(os, name) for name in ("fsync", "fdatasync", "replace")}

    def syncing(name: str) -> Callable[[int], None]:
        def sync(fd: int) -> None:
            done.append(("sync", os.readlink(f"/proc/self/fd/{fd}")))
            real[name](fd)

        return sync

    def replace(source: Any, target: Any) -> None:
        done.append(("replace", str(source), str(target)))
        real["replace"](source, target)

    monkeypatch.setattr(os, "fsync", syncing("fsync"))
    monkeypatch.setattr(os, "fdatasync", syncing("fdatasync"))
    monkeypatch.setattr(os, "replace", replace)
    root = (tmp_path / "files").resolve()
    runs, store, state = root / "runs", FileStore(root), _state()
    await store.checkpoint(state, _emit(state, RunStarted(goal="a goal", model="m", mode="native")))
    assert {("sync", str(tmp_path)), ("sync", str(root))} <= set(done)  # the new directories' names
    done.clear()
    state.step = 1
    await store.checkpoint(state, _emit(state, Progress(step=1, max_steps=5, usage=state.usage)))
    tmp = runs / f".run-1.json.{os.getpid()}.tmp"
    assert done == [
        ("sync", str(runs / "run-1.events.jsonl")),  # the events first: the state must not be ahead of them
        ("sync", str(tmp)),  # the new state, whole, before it takes the old one's name
        ("replace", str(tmp), str(runs / "run-1.json")),
        ("sync", str(runs)),  # the rename itself
    ]
    loaded = await store.load_state("run-1")
    assert loaded is not None and loaded.step == 1


async def test_lone_surrogates_in_a_run_are_saved_as_u_fffd(store: Store) -> None:
    """Text with half a surrogate pair (a model's `"\\ud83d"` escape, a file name decoded with
    surrogateescape) cannot be encoded as UTF-8: it is saved with U+FFFD there instead of failing the run."""
    model = ScriptedModel(["an\ud83dswer"])
    result = await Agent(model, store=store).run("go\udcffal", session="sur-session", run_id="surrogates")
    assert result.stop_reason is StopReason.FINAL_ANSWER
    state = await store.load_state("surrogates")
    assert state is not None and (state.goal, state.answer) == ("go\ufffdal", "an\ufffdswer")
    events = await store.read_events("surrogates")
    assert events[0].type == "run_started" and getattr(events[0], "goal", "") == "go\ufffdal"
    assert [r.goal for r in await store.list_runs()] == ["go\ufffdal"]
    assert [m.content for m in await store.get_memory("sur-session")] == ["go\ufffdal", "an\ufffdswer"]
    await store.add_memory("sur-session", "user", "\ud800")
    assert (await store.get_memory("sur-session", limit=1))[0].content == "\ufffd"


@pytest.mark.parametrize("kind", KINDS)
async def test_big_runs_and_many_runs_save_load_and_list_quickly(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str
) -> None:
    import time

    from thinkloop._messages import Message

    made: Store = {
        "memory": lambda: MemoryStore(),
        "file": lambda: FileStore(tmp_path / "files"),
        "sqlite": lambda: SQLiteStore(tmp_path / "runs.db"),
        "postgres": lambda: PostgresStore(request.getfixturevalue("pg_dsn")),
    }[kind]()
    async with made as store:
        big = _state("big")
        big.messages = [Message(role="user", content=f"message {i} " * 20) for i in range(5000)]
        big.messages.append(Message(role="tool", content="o" * 5_000_000, tool_call_id="c1", name="cat"))
        started = time.perf_counter()
        await store.checkpoint(big, _emit(big, Status(text="s" * 1_000_000)))
        loaded = await store.load_state("big")
        assert time.perf_counter() - started < 3.0
        assert loaded is not None and loaded.messages[-1].content == "o" * 5_000_000
        assert len(loaded.messages) == 5001

        for i in range(1000):
            await store.checkpoint(_state(f"run-{i:04}", created_at=float(i)), [])
        started = time.perf_counter()
        runs = await store.list_runs(limit=2000)
        assert time.perf_counter() - started < 2.0
        assert len(runs) == 1001 and runs[0].run_id == "run-0999"
        assert [r.run_id for r in await store.list_runs(limit=3, status="running")] == [
            "run-0999",
            "run-0998",
            "run-0997",
        ]


# ========================================================================== PostgreSQL under failure


@pytest.mark.parametrize(
    ("dsn", "reason"),
    [
        ("host=127.0.0.1 colour=blue", 'invalid connection option "colour"'),
        ("not a dsn at all", 'missing "=" after "not"'),
        ("postgresql://bob:hunter2@127.0.0.1:5432/test?sslmode", "***"),
    ],
)
def test_a_malformed_postgres_dsn_is_a_configuration_error_at_once(dsn: str, reason: str) -> None:
    with pytest.raises(ConfigurationError, match="malformed PostgreSQL DSN") as info:
        PostgresStore(dsn)
    message = str(info.value)
    assert reason in message and "use postgresql://user:password@host:5432/dbname" in message
    assert "hunter2" not in message
    with pytest.raises(ConfigurationError, match="malformed PostgreSQL DSN"):
        open_store(dsn if "://" in dsn else f"postgresql://x/y?{dsn.replace(' ', '&')}")


async def test_a_postgres_server_that_does_not_answer_is_a_state_error_not_a_hang() -> None:
    import asyncio
    import socket
    import time

    with socket.socket() as silent:  # accepts connections (the kernel does) and never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        store = PostgresStore(f"postgresql://postgres:pw@127.0.0.1:{port}/test", timeout=0.5)
        started = time.perf_counter()
        with pytest.raises(
            StateError, match=r"failed: no answer within timeout \(0.5 s\); check that the server"
        ):
            await asyncio.wait_for(store.load_state("run-1"), 10)
        assert time.perf_counter() - started < 3
        await store.aclose()


async def test_a_postgres_lock_held_past_the_timeout_fails_the_save_and_the_next_one_works(
    pg_dsn: str,
) -> None:
    import time

    import psycopg

    async with PostgresStore(pg_dsn) as store:
        state = await _saved(store)  # connecting and the first save may be slow on a busy machine
        store.timeout = 0.5  # what is tested: a save blocked by another session's lock
        events = _emit(state, Status(text="second"))
        with psycopg.connect(pg_dsn) as other:  # a session that locks the log and keeps it
            other.execute("LOCK TABLE thinkloop_events IN ACCESS EXCLUSIVE MODE")
            started = time.perf_counter()
            with pytest.raises(
                StateError,
                match=r"no answer within timeout \(0.5 s\); the server took the connection but .* lock",
            ):
                await store.checkpoint(state, events)
            assert time.perf_counter() - started < 3
        await store.checkpoint(state, events)  # lock released: a new connection, the same save
        assert [e.seq for e in await store.read_events("run-1")] == [1, 2]


async def _terminate(store: PostgresStore, dsn: str) -> None:
    """End the store's server process, as a server restart or a dropped connection would."""
    import psycopg

    assert store._conn is not None
    pid = store._conn.info.backend_pid
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
        await admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))


async def test_a_postgres_connection_dropped_between_two_saves_is_opened_again(pg_dsn: str) -> None:
    async with PostgresStore(pg_dsn) as store:
        state = await _saved(store)
        await _terminate(store, pg_dsn)
        await store.checkpoint(state, _emit(state, Status(text="after the drop")))
        await _terminate(store, pg_dsn)
        assert [e.seq for e in await store.read_events("run-1")] == [1, 2]
        await _terminate(store, pg_dsn)
        await store.add_memory("s", "user", "hello")
        assert [m.content for m in await store.get_memory("s")] == ["hello"]


async def test_an_agent_run_survives_its_postgres_connection_being_dropped(pg_dsn: str) -> None:
    store = PostgresStore(pg_dsn)

    @tool
    async def restart_database() -> str:
        """Drop the store's connection in the middle of the run."""
        await _terminate(store, pg_dsn)
        return "restarted"

    model = ScriptedModel([{"tool_calls": [{"name": "restart_database", "args": {}}]}, "done"])
    async with store:
        result = await Agent(model, tools=[restart_database], store=store).run("go", run_id="dropped")
        assert result.output == "done"
        saved = await store.load_state("dropped")
        assert saved is not None and saved.phase == "done" and saved.ledger["call_0_0"].output == "restarted"
        events = await store.read_events("dropped")
        assert [e.seq for e in events] == list(range(1, saved.event_version + 1))


async def test_postgres_refuses_a_database_with_a_newer_schema(pg_dsn: str) -> None:
    import psycopg

    async with PostgresStore(pg_dsn) as store:
        await _saved(store)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO thinkloop_schema (version) VALUES (99)")
    async with PostgresStore(pg_dsn) as store:
        with pytest.raises(
            StateError, match="thinkloop schema version 99, newer than this thinkloop supports"
        ):
            await store.load_state("run-1")


async def test_a_state_file_copied_under_another_run_id_is_a_clear_error(tmp_path: Path) -> None:
    """`runs/b.json` holding run a's state (a file copied or renamed by hand) is not loaded as run b."""
    async with FileStore(tmp_path / "files") as store:
        await store.checkpoint(_state("a"), [])
        runs = tmp_path / "files" / "runs"
        (runs / "b.json").write_text((runs / "a.json").read_text())
        with pytest.raises(
            StateError, match=r"run 'b' in .*b\.json: the state stored under that id is run 'a'"
        ):
            await store.load_state("b")
        loaded = await store.load_state("a")
        assert loaded is not None and loaded.run_id == "a"


async def test_a_postgres_writer_frozen_inside_a_transaction_does_not_block_the_next_owner(
    pg_dsn: str,
) -> None:
    """A worker stopped (SIGSTOP) mid-write holds its transaction's locks; the server ends its session after
    half the store's timeout, so the worker that took the run over saves within its own timeout."""
    async with PostgresStore(pg_dsn, timeout=8) as frozen, PostgresStore(pg_dsn, timeout=8) as next_owner:
        state = _state()
        await frozen.checkpoint(state, [])
        conn = await frozen._connection()
        await conn.execute("BEGIN")
        await conn.execute("LOCK TABLE thinkloop_events IN ACCESS EXCLUSIVE MODE")  # then it "freezes"
        loaded = await next_owner.load_state("run-1")
        assert loaded is not None
        await next_owner.checkpoint(
            loaded, _emit(loaded, RunStarted(goal="a goal", model="m", mode="native"))
        )
        assert [e.type for e in await next_owner.read_events("run-1")] == ["run_started"]


def test_one_postgres_store_serves_agents_in_several_threads_and_closes_what_it_opened(pg_dsn: str) -> None:
    """`run_sync` in three threads at once, one `PostgresStore`: each thread runs its own event loop. The
    store's one connection and asyncio lock belonged to the first loop, and the others' saves failed
    ("… is bound to a different event loop"); now each loop has its own connection, closed with its loop."""
    import threading
    import uuid

    import psycopg

    name = f"tl-{uuid.uuid4().hex[:12]}"
    dsn = f"{pg_dsn}&application_name={name}"
    store = PostgresStore(dsn)
    together = threading.Barrier(3, timeout=60)

    @tool
    def meet(who: str) -> str:
        """Wait until the three runs are all in the middle of their run."""
        together.wait()
        return f"met {who}"

    results: dict[str, str] = {}

    def run(who: str) -> None:
        calls = [{"name": "meet", "args": {"who": who}}]
        model = ScriptedModel([{"tool_calls": calls}, f"done {who}"])
        try:
            result = Agent(model, tools=[meet], store=store).run_sync(f"meet {who}")
            results[who] = f"{result.stop_reason.value}: {result.output}"
        except Exception as exc:
            results[who] = repr(exc)

    threads = [threading.Thread(target=run, args=(who,), daemon=True) for who in ("ann", "bob", "cy")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert results == {who: f"final_answer: done {who}" for who in ("ann", "bob", "cy")}
    with psycopg.connect(PG_DSN, autocommit=True) as admin:  # each loop's connection closed with its loop
        sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
        deadline = time.monotonic() + 30  # a server process ends a moment after its client said goodbye
        while (left := admin.execute(sql, (name,)).fetchone()) != (0,) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert left == (0,)


async def test_listing_a_file_store_whose_root_is_a_file_is_the_same_error_as_reading_it(
    tmp_path: Path,
) -> None:
    """`runs list` said there were no runs (exit 0) where `runs show` said what was wrong."""
    root = tmp_path / "notes.txt"
    root.write_text("not a directory")
    store = FileStore(root)
    with pytest.raises(
        StateError, match=r"notes\.txt failed: .*Not a directory.*notes\.txt is a file, not a directory"
    ):
        await store.load_state("run-1")
    with pytest.raises(
        StateError, match=r"notes\.txt failed: .*Not a directory.*notes\.txt is a file, not a directory"
    ):
        await store.list_runs()


async def test_a_sqlite_file_of_another_program_with_a_runs_table_is_named_as_not_thinkloop(
    tmp_path: Path,
) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, name TEXT)")
    with pytest.raises(StateError, match="no such column.*not a thinkloop SQLite database"):
        await SQLiteStore(path).list_runs()


# ==================================================================== SQLite: messages saved append-only


def _history(state: RunState, steps: range, size: int = 200) -> None:
    """Tool steps as the loop adds them: a reply calling a tool, then its output."""
    from thinkloop import Message, ToolCall

    for step in steps:
        call = ToolCall(id=f"c{step}", name="fetch", arguments={"key": f"k{step}", "ünï": ["😀", step]})
        state.messages.append(Message.assistant(f"step {step} ✓", [call], step=step))
        state.messages.append(Message.tool(call, f"item {step} — " + "x" * size, step=step))
        state.step = step


def _stored(state: RunState) -> RunState:
    """What a store gives back for `state`: the state through JSON, lone surrogates as U+FFFD."""
    from thinkloop.stores._base import to_json

    return RunState.from_json(to_json(state))


def _message_rows(db: Path, run_id: str = "run-1") -> list[tuple[int, str]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(
            "SELECT idx, data FROM messages WHERE run_id = ? ORDER BY idx", (run_id,)
        ).fetchall()


async def _save(store: Store, state: RunState) -> None:
    await store.checkpoint(state, _emit(state, Status(text=f"step {state.step}")))


async def test_sqlite_round_trips_states_saved_step_by_step(tmp_path: Path) -> None:
    """Tool calls, unicode, a lone surrogate (saved as U+FFFD, as before), a message replaced in the middle
    and messages put in front (session memory): every load is the state as JSON gives it back."""
    from thinkloop import Message

    db = tmp_path / "runs.db"
    async with SQLiteStore(db) as store:
        state = _state(messages=[Message.user("a goal ½")])
        for step in range(1, 6):
            _history(state, range(step, step + 1))
            await _save(store, state)
            assert await store.load_state("run-1") == RunState.from_json(state.to_json()) == state
        state.messages.append(Message.user("half an emoji \ud83d", kind="hint", step=5))
        await _save(store, state)
        loaded = await store.load_state("run-1")
        assert loaded == _stored(state) and loaded is not None
        assert loaded.messages[-1].content == "half an emoji \ufffd"
        state.messages[4] = Message.tool(state.messages[3].tool_calls[0], "rewritten", step=2)
        await _save(store, state)
        assert await store.load_state("run-1") == _stored(state)
        state.messages[:0] = [Message.user("earlier turn", kind="memory")]
        _history(state, range(6, 7))
        await _save(store, state)
        assert await store.load_state("run-1") == _stored(state)
        del state.messages[-3:]
        await _save(store, state)
        loaded = await store.load_state("run-1")
        assert loaded == _stored(state) and loaded is not None and len(loaded.messages) == 12
    assert [i for i, _ in _message_rows(db)] == list(range(12))  # no row of a longer past left behind
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT state, message_count FROM runs").fetchone()
    assert json.loads(row[0])["messages"] == [] and row[1] == 12


async def test_a_sqlite_checkpoint_writes_only_the_messages_added_since_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from thinkloop import Message
    from thinkloop.stores import _base

    written: list[str] = []
    real = _base.to_json

    def counting(model: Any) -> str:
        if isinstance(model, Message):
            written.append(model.content)
        return real(model)

    monkeypatch.setattr(_base, "to_json", counting)
    async with SQLiteStore(tmp_path / "runs.db") as store:
        state = _state(messages=[Message.user("a goal")])
        _history(state, range(1, 51), size=10_000)
        await _save(store, state)
        assert len(written) == 101
        written.clear()
        await _save(store, state)  # tool started: no new message
        assert written == []
        _history(state, range(51, 52), size=10_000)
        await _save(store, state)
        assert [w[:7] for w in written] == ["step 51", "item 51"]
        assert await store.load_state("run-1") == _stored(state)  # a server showing the live run
        written.clear()
        _history(state, range(52, 53), size=10_000)
        await _save(store, state)
        assert [w[:7] for w in written] == ["step 52", "item 52"]
        assert await store.load_state("run-1") == _stored(state)


async def test_a_sqlite_database_of_version_1_loads_and_is_migrated(tmp_path: Path) -> None:
    """A file written before messages had their own table: its runs load as they were; their next
    checkpoint moves their messages; the version is 2 and a newer thinkloop's file is still refused."""
    from thinkloop import Message

    db = tmp_path / "old.db"
    state = _state(messages=[Message.user("a goal ☃")], session="s1")
    _history(state, range(1, 4))
    state.event_version = 1
    with sqlite3.connect(db) as conn:  # the version-1 schema, as thinkloop 1 made it
        conn.executescript(
            """CREATE TABLE schema_version (version INTEGER NOT NULL);
            INSERT INTO schema_version VALUES (1);
            CREATE TABLE runs (run_id TEXT PRIMARY KEY, state TEXT NOT NULL, summary TEXT NOT NULL,
                status TEXT NOT NULL, session TEXT, updated_at REAL NOT NULL);
            CREATE INDEX runs_updated ON runs (updated_at);
            CREATE TABLE events (run_id TEXT NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL,
                data TEXT NOT NULL, PRIMARY KEY (run_id, seq)) WITHOUT ROWID;
            CREATE TABLE memory (id INTEGER PRIMARY KEY AUTOINCREMENT, session TEXT NOT NULL,
                role TEXT NOT NULL, content TEXT NOT NULL, time REAL NOT NULL);
            CREATE INDEX memory_session ON memory (session, id);"""
        )
        summary = '{"run_id": "run-1", "goal": "a goal", "session": "s1", "step": 3, "event_version": 1}'
        conn.execute(
            "INSERT INTO runs VALUES (?, ?, ?, 'running', 's1', 1.0)", ("run-1", state.to_json(), summary)
        )
        conn.execute(
            "INSERT INTO events VALUES ('run-1', 1, 'status', ?)", (Status(text="x").model_dump_json(),)
        )
    async with SQLiteStore(db) as store:
        assert await store.load_state("run-1") == state
        assert [(r.run_id, r.step, r.session) for r in await store.list_runs()] == [("run-1", 3, "s1")]
        _history(state, range(4, 5))
        await _save(store, state)
        assert await store.load_state("run-1") == state
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT max(version) FROM schema_version").fetchone()[0] == 4
        assert json.loads(conn.execute("SELECT state FROM runs").fetchone()[0])["messages"] == []
    assert len(_message_rows(db)) == len(state.messages) == 9
    async with SQLiteStore(db) as again:
        assert await again.load_state("run-1") == state


async def test_two_sqlite_stores_on_one_file_taking_turns_save_every_message(tmp_path: Path) -> None:
    """A saves, B loads the whole state and saves more; A, saving again, must not trust its memory of what
    it saved (the file holds B's messages now): every load is the last saved state, whole."""
    from thinkloop import Message

    db = tmp_path / "runs.db"
    async with SQLiteStore(db) as a, SQLiteStore(db) as b:
        mine = _state(messages=[Message.user("a goal")])
        _history(mine, range(1, 3))
        await _save(a, mine)
        theirs = await b.load_state("run-1")
        assert theirs == _stored(mine)
        assert theirs is not None
        _history(theirs, range(3, 5))
        await _save(b, theirs)
        async with SQLiteStore(db) as reader:
            assert await reader.load_state("run-1") == theirs
        # A goes on from its own state (as a resumer that lost a race but carries the log's version and
        # save count): its messages are its first ones plus one, fewer than B saved
        mine.messages.append(Message.user("A's own", kind="hint", step=2))
        mine.event_version, mine.saves = theirs.event_version, theirs.saves
        await _save(a, mine)
        assert await b.load_state("run-1") == _stored(mine)
        assert len(_message_rows(db)) == len(mine.messages) == 6
        # and B, whose memory is stale now too, takes over again from what it loads
        theirs = await b.load_state("run-1")
        assert theirs is not None
        _history(theirs, range(5, 6))
        await _save(b, theirs)
        assert await a.load_state("run-1") == theirs


async def test_a_failed_sqlite_checkpoint_leaves_the_previous_state_whole(tmp_path: Path) -> None:
    """A failure after the new messages are inserted, as the run's row is updated, rolls them back with
    the events: the previous state loads, and the next checkpoint saves everything."""
    from thinkloop import Message

    db = tmp_path / "runs.db"
    async with SQLiteStore(db) as store:
        state = _state(messages=[Message.user("a goal")])
        _history(state, range(1, 3))
        await _save(store, state)
        before = _stored(state)
        with sqlite3.connect(db) as conn:
            conn.execute(
                "CREATE TRIGGER fail BEFORE UPDATE ON runs BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
            )
        _history(state, range(3, 5))
        with pytest.raises(StateError, match="injected failure"):
            await _save(store, state)
        assert await store.load_state("run-1") == before
        assert len(_message_rows(db)) == 5
        assert [e.seq for e in await store.read_events("run-1")] == [1]
        with sqlite3.connect(db) as conn:
            conn.execute("DROP TRIGGER fail")
        state.event_version -= 1  # the loop saves the same state again with the same events
        await _save(store, state)
        assert await store.load_state("run-1") == _stored(state)
        assert len(_message_rows(db)) == 9


async def test_a_run_resumed_from_a_sqlite_file_by_another_store_is_saved_whole(tmp_path: Path) -> None:
    """A run dies after three steps; another store (another process) on the file resumes it: its
    checkpoints append to the messages it loaded, and the finished run loads as the agent ended it."""
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

    db = tmp_path / "runs.db"
    async with SQLiteStore(db) as first:
        with pytest.raises(Died):
            await Agent(FunctionModel(reply), tools=[fetch], store=first).run("fetch them", run_id="r")
    async with SQLiteStore(db) as second:
        result = await Agent(FunctionModel(reply), tools=[fetch], store=second).resume("r")
    assert result.output == "all fetched" and result.steps == 7
    async with SQLiteStore(db) as third:
        loaded = await third.load_state("r")
    assert loaded == _stored(result.state)
    assert [m.content[:6] for m in loaded.messages if m.role == "tool"] == [
        f"item {i}" for i in (1, 2, 3, 5, 6, 7)
    ]
    assert len(_message_rows(db, "r")) == len(result.state.messages)


async def test_a_damaged_or_missing_sqlite_message_row_is_a_clear_error(tmp_path: Path) -> None:
    from thinkloop import Message

    db = tmp_path / "runs.db"
    async with SQLiteStore(db) as store:
        state = _state(messages=[Message.user("a goal")])
        _history(state, range(1, 3))
        await _save(store, state)
        with sqlite3.connect(db) as conn:
            conn.execute('UPDATE messages SET data = \'{"role": "nobody"}\' WHERE idx = 2')
        with pytest.raises(StateError, match=r"run 'run-1' in .*runs\.db: its message \d+ is corrupt"):
            await store.load_state("run-1")
        with sqlite3.connect(db) as conn:
            conn.execute("DELETE FROM messages WHERE idx = 2")
        with pytest.raises(StateError, match=r"run 'run-1' in .*: 1 of its 5 stored messages are missing"):
            await store.load_state("run-1")


@pytest.mark.parametrize(
    ("column", "value"), [("message_count", "abc"), ("message_count", -1), ("ledger_count", 2.5)]
)
async def test_a_stored_row_count_that_is_no_count_is_a_clear_error(
    tmp_path: Path, column: str, value: Any
) -> None:
    """An edited or damaged `runs` row whose message or ledger count is text, negative or a fraction: the
    store says the run is damaged (before: `TypeError: unsupported operand type(s)`, or "-1 of its -1
    stored messages are missing")."""
    from thinkloop import Message

    db = tmp_path / "runs.db"
    async with SQLiteStore(db) as store:
        state = _state(messages=[Message.user("a goal")])
        _history(state, range(1, 3))
        await _save(store, state)
        with sqlite3.connect(db) as conn:
            conn.execute(f"UPDATE runs SET {column} = ?", (value,))
        what = "messages" if column == "message_count" else "ledger entries"
        with pytest.raises(
            StateError, match=rf"run 'run-1' in .*: its stored number of {what} is {value!r}, not a count"
        ):
            await store.load_state("run-1")


async def test_a_file_store_reads_the_save_count_of_a_large_state_too(tmp_path: Path) -> None:
    """The count is read from the end of the state file; metadata of more than 64 kB after it is parsed
    whole: a copy loaded before another save is refused either way."""
    async with FileStore(tmp_path / "files") as store:
        for size in (10, 100_000):
            state = _state(f"run-{size}", metadata={"notes": "x" * size, "saves": 99})
            await store.checkpoint(state, _emit(state, Status(text="one")))
            first, second = await store.load_state(state.run_id), await store.load_state(state.run_id)
            assert first is not None and second is not None
            await store.checkpoint(first, [])
            with pytest.raises(ConcurrencyError, match="saved by another writer"):
                await store.checkpoint(second, [])
            again = await store.load_state(state.run_id)
            assert again is not None and again.saves == 2


def test_a_sqlite_path_under_home_is_expanded_as_a_file_store_path_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sqlite://~/runs.db` made a directory named `~` in the working directory."""
    from thinkloop.stores import open_store

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    store = open_store("sqlite://~/runs.db")
    assert store.path == tmp_path / "home" / "runs.db"  # type: ignore[attr-defined]
    assert not (tmp_path / "~").exists()
