"""Stores holding damaged data: a corrupt state, event, message or summary, a torn session file, a database
of a newer thinkloop. Each is a `StateError` naming the run, where it is stored and what to do — not a raw
pydantic or sqlite3 error — and what is stored is left as it is. And two processes resuming one run at once,
on SQLite and PostgreSQL: exactly one goes on."""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from conftest import private_schema
from thinkloop import Agent, ConcurrencyError, RunState, StateError
from thinkloop._events import Status
from thinkloop.stores import FileStore, MemoryStore, PostgresStore, SQLiteStore, Store
from thinkloop.stores._base import DamagedRunError
from thinkloop.testing import ScriptedModel

KINDS = ["memory", "file", "sqlite", "postgres"]


@pytest.fixture
def pg_dsn() -> Iterator[str]:
    yield from private_schema("tl_faults")


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


def _where(store: Store, part: str) -> str:
    """Where the store says the damaged data is."""
    if isinstance(store, FileStore):
        return str(store.root / "runs" / ("run-1.json" if part == "state" else "run-1.events.jsonl"))
    if isinstance(store, SQLiteStore):
        return str(store.path)
    if isinstance(store, PostgresStore):
        return store.url
    return "the memory store"


async def _saved(store: Store) -> RunState:
    state = RunState(run_id="run-1", goal="a goal", model="test:script")
    events = [Status(text="one"), Status(text="two")]
    for event in events:
        state.event_version += 1
        event.run_id, event.seq = state.run_id, state.event_version
    await store.checkpoint(state, events)
    return state


def _sql(store: Store) -> Callable[..., Any]:
    """Run one statement on the store's database (with ? placeholders); the first row's first value."""
    if isinstance(store, SQLiteStore):
        db = str(store.path)

        def lite(query: str, *params: Any) -> Any:
            with sqlite3.connect(db) as conn:
                row = conn.execute(query, params).fetchone()
            return row[0] if row else None

        return lite
    import psycopg

    assert isinstance(store, PostgresStore)
    dsn = store.dsn

    def pg(query: str, *params: Any) -> Any:
        query = query.replace("?", "%s").replace("FROM runs", "FROM thinkloop_runs")
        query = query.replace("UPDATE runs", "UPDATE thinkloop_runs").replace(
            " events ", " thinkloop_events "
        )
        with psycopg.connect(dsn, autocommit=True) as conn:
            cur = conn.execute(query, params)
            row = cur.fetchone() if cur.description else None
        return row[0] if row else None

    return pg


def _damage_event(store: Store, text: str) -> Callable[[], Any]:
    """Overwrite the run's second event with `text`; a function reading it back."""
    if isinstance(store, MemoryStore):
        store._events["run-1"][1] = text
        return lambda: store._events["run-1"][1]
    if isinstance(store, FileStore):
        log = store.root / "runs" / "run-1.events.jsonl"
        first = log.read_text().splitlines()[0]
        log.write_text(f"{first}\n{text}\n")
        return lambda: log.read_text().splitlines()[1]
    sql = _sql(store)
    sql("UPDATE events SET data = ? WHERE run_id = ? AND seq = 2", text, "run-1")
    return lambda: sql("SELECT data FROM events WHERE run_id = ? AND seq = 2", "run-1")


def _damage_state(store: Store, text: str) -> Callable[[], Any]:
    if isinstance(store, MemoryStore):
        store._states["run-1"] = (text, store._states["run-1"][1])
        return lambda: store._states["run-1"][0]
    if isinstance(store, FileStore):
        path = store.root / "runs" / "run-1.json"
        path.write_text(text)
        return path.read_text
    sql = _sql(store)
    sql("UPDATE runs SET state = ? WHERE run_id = ?", text, "run-1")
    return lambda: sql("SELECT state FROM runs WHERE run_id = ?", "run-1")


DEEP = "[" * 100_000 + "]" * 100_000  # nested past Python's recursion limit: json.loads raised RecursionError


@pytest.mark.parametrize(
    "damaged", ['{"run_id": "run-1", "step": ', '{"run_id": "run-1", "step": ' + DEEP + "}"]
)
async def test_a_corrupt_state_names_the_run_where_it_is_stored_and_what_to_do(
    store: Store, damaged: str
) -> None:
    await _saved(store)
    read_back = _damage_state(store, damaged)
    for attempt in (store.load_state("run-1"), Agent(ScriptedModel(["unused"]), store=store).resume("run-1")):
        with pytest.raises(StateError) as info:
            await attempt
        message = str(info.value)
        assert message.startswith(
            f"run 'run-1' in {_where(store, 'state')}: corrupt run state: 1 problem(s): "
        )
        assert message.endswith(
            "; the store is left as it is: restore it from a backup, or start the run again under another id"
        )
    assert read_back() == damaged


async def test_a_state_of_a_newer_thinkloop_says_to_upgrade(store: Store) -> None:
    await _saved(store)
    read_back = _damage_state(store, '{"schema_version": 99, "run_id": "run-1", "future_field": 1}')
    with pytest.raises(StateError) as info:
        await store.load_state("run-1")
    assert str(info.value) == (
        f"run 'run-1' in {_where(store, 'state')}: run state has schema version 99, newer than this "
        "thinkloop supports (1): upgrade thinkloop to load it"
    )
    assert read_back() == '{"schema_version": 99, "run_id": "run-1", "future_field": 1}'


async def test_a_corrupt_event_names_its_number_and_store_without_pydantic_s_dump(store: Store) -> None:
    # It was "run 'run-1': a stored event is corrupt: 1 validation error for tagged-union[RunStarted,
    # Thought, … 18 event types …] Invalid JSON … For further information visit https://errors.pydantic.dev…"
    await _saved(store)
    read_back = _damage_event(store, '{"type": "sta')
    with pytest.raises(StateError) as info:
        await store.read_events("run-1")
    where = _where(store, "events")
    assert str(info.value) == (
        f"run 'run-1' in {where}: its event 2 is corrupt (Invalid JSON: EOF while parsing a string at line 1 "
        "column 13); the store is left as it is: restore it from a backup"
    )
    assert read_back() == '{"type": "sta'
    assert [e.seq for e in await store.read_events("run-1", after=2)] == []


async def test_an_event_of_an_unknown_type_says_which(store: Store) -> None:
    await _saved(store)
    _damage_event(store, '{"type": "teleported", "run_id": "run-1", "seq": 2}')
    with pytest.raises(StateError, match=r"its event 2 is corrupt \(.*'teleported'") as info:
        await store.read_events("run-1")
    assert "errors.pydantic.dev" not in str(info.value) and "tagged-union" not in str(info.value)


async def test_a_state_with_no_run_id_is_damaged_not_another_run_s(store: Store) -> None:
    # A state of `{}` was "the state stored under that id is run '07f7…''s (a file copied or renamed?)",
    # another id each time: the missing run_id took its random default.
    await _saved(store)
    read_back = _damage_state(store, "{}")
    agent = Agent(ScriptedModel(["unused"]), store=store)
    for attempt in (lambda: store.load_state("run-1"), lambda: agent.resume("run-1")):
        with pytest.raises(DamagedRunError) as info:
            await attempt()
        assert str(info.value) == (
            f"run 'run-1' in {_where(store, 'state')}: the state stored under that id has no run id; the "
            "store is left as it is: restore it from a backup, or start the run again under another id"
        )
    assert read_back() == "{}"


@pytest.fixture(params=["file", "sqlite", "postgres"])
async def damageable(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """A store whose event log can be damaged from outside (a file, a database)."""
    made: Store = (
        FileStore(tmp_path / "files")
        if request.param == "file"
        else SQLiteStore(tmp_path / "runs.db")
        if request.param == "sqlite"
        else PostgresStore(request.getfixturevalue("pg_dsn"))
    )
    async with made:
        yield made


def _lose_events(store: Store, keep: int) -> None:
    """Cut the run's event log to its first `keep` events; 0: delete it (the file, the rows)."""
    if isinstance(store, FileStore):
        log = store.root / "runs" / "run-1.events.jsonl"
        if keep:
            log.write_text("".join(log.read_text().splitlines(keepends=True)[:keep]))
        else:
            log.unlink()
    else:
        _sql(store)("DELETE FROM events WHERE run_id = ? AND seq > ?", "run-1", keep)


@pytest.mark.parametrize(
    ("keep", "what"),
    [
        (3, "ends at event 3, but its state was saved at event 4: event 4 is lost"),
        (1, "ends at event 1, but its state was saved at event 4: events 2-4 are lost"),
        (0, "holds no events, but its state was saved at event 4: all 4 are lost"),
    ],
    ids=["one-trimmed", "trimmed", "deleted"],
)
async def test_an_event_log_behind_its_saved_state_is_damage_not_a_race(
    damageable: Store, keep: int, what: str
) -> None:
    # It was a ConcurrencyError, "another writer appended first; reload and retry": a retry never helped.
    store = damageable
    state = RunState(run_id="run-1", goal="a goal", model="test:script")
    events = [Status(text=text, run_id="run-1", seq=seq) for seq, text in enumerate("abcd", 1)]
    state.event_version = 4
    await store.checkpoint(state, events)
    _lose_events(store, keep)
    where = _where(store, "events")
    message = (
        f"run 'run-1' in {where}: its event log {what} (deleted, or the log trimmed or restored from an "
        "older backup) — not a race with another writer: trying again cannot help; its state is intact "
        "(`thinkloop runs export run-1` writes it and the events left); the store is left as it is: "
        "restore it from a backup, or start the run again"
    )
    agent = Agent(ScriptedModel(["unused"]), store=store)
    for attempt in range(2):
        saved = await store.load_state("run-1")
        assert saved is not None and saved.event_version == 4  # the state is intact
        saved.step, saved.event_version = 99, 5
        with pytest.raises(DamagedRunError) as info:
            await store.checkpoint(saved, [Status(text="e", run_id="run-1", seq=5)])
        assert str(info.value) == message, attempt
        with pytest.raises(DamagedRunError) as info:
            await agent.resume("run-1")
        assert str(info.value) == message, attempt
    loaded = await store.load_state("run-1")
    assert loaded is not None and loaded.step == 0  # the store is left as it is
    assert [e.seq for e in await store.read_events("run-1")] == list(range(1, keep + 1))


async def test_a_log_ahead_of_a_checkpoint_is_still_a_race(damageable: Store) -> None:
    # (and so is a log behind the version an `append_events` caller gives: no saved state says it is more)
    store = damageable
    state = await _saved(store)
    stale = state.model_copy(deep=True)
    state.event_version = 3
    await store.checkpoint(state, [Status(text="another writer", run_id="run-1", seq=3)])
    stale.event_version = 3
    with pytest.raises(ConcurrencyError, match="is at version 3, not the expected 2: another writer"):
        await store.checkpoint(stale, [Status(text="late", run_id="run-1", seq=3)])
    with pytest.raises(ConcurrencyError, match="is at version 3, not the expected 5: ") as info:
        await store.append_events("run-1", [Status(text="ahead")], expected_version=5)
    assert "another writer" not in str(info.value)


async def test_a_file_store_lists_its_runs_past_one_whose_state_is_nested_too_deeply(tmp_path: Path) -> None:
    # `thinkloop runs list` ended in "unexpected RecursionError … a bug in thinkloop" for every run
    async with FileStore(tmp_path / "files") as store:
        await _saved(store)
        await store.checkpoint(RunState(run_id="run-2", goal="another", model="test:script"), [])
        _damage_state(store, '{"run_id": "run-1", "step": ' + DEEP + "}")
        assert [s.run_id for s in await store.list_runs()] == ["run-2"]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_run_whose_summary_is_corrupt_is_left_out_of_the_listing_with_a_warning(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    # list_runs raised pydantic's ValidationError: one damaged row hid every run (`thinkloop runs list`)
    made: Store = (
        SQLiteStore(tmp_path / "runs.db")
        if kind == "sqlite"
        else PostgresStore(request.getfixturevalue("pg_dsn"))
    )
    async with made as store:
        await _saved(store)
        other = RunState(run_id="run-2", goal="another", model="test:script")
        await store.checkpoint(other, [])
        _sql(store)("UPDATE runs SET summary = ? WHERE run_id = ?", '{"run_id": ', "run-1")
        with caplog.at_level(logging.WARNING, logger="thinkloop.stores"):
            listed = await store.list_runs()
        assert [s.run_id for s in listed] == ["run-2"]
        (warning,) = [r.getMessage() for r in caplog.records if r.name == "thinkloop.stores"]
        assert warning.startswith(f"run 'run-1' in {_where(store, 'summary')}: its summary is corrupt (")
        assert (await store.load_state("run-1")) is not None  # the run itself still loads


async def test_a_damaged_message_row_names_the_store(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "runs.db") as store:
        model = ScriptedModel(["hi"])
        result = await Agent(model, store=store).run("x", run_id="run-1")
        assert result.output == "hi"
    with sqlite3.connect(tmp_path / "runs.db") as conn:
        conn.execute("UPDATE messages SET data = '{\"role\": 3}' WHERE run_id = 'run-1' AND idx = 0")
    async with SQLiteStore(tmp_path / "runs.db") as store:
        with pytest.raises(StateError) as info:
            await store.load_state("run-1")
    message = str(info.value)
    assert message.startswith(f"run 'run-1' in {tmp_path / 'runs.db'}: its message 1 is corrupt (")
    assert message.endswith("; the store is left as it is: restore it from a backup, or start the run again")
    assert "errors.pydantic.dev" not in message


async def test_a_torn_line_in_a_session_file_names_the_file_and_line(tmp_path: Path) -> None:
    # The session memory of a FileStore raised pydantic's ValidationError: every later run of the session
    # failed with it, saying neither which file nor what to do.
    async with FileStore(tmp_path / "files") as store:
        await store.add_memory("chat", "user", "hello")
        path = tmp_path / "files" / "sessions" / "chat.jsonl"
        path.write_text(path.read_text() + '{"session": "chat", "ro\n')
        before = path.read_text()
        for attempt in (
            store.get_memory("chat"),
            Agent(ScriptedModel(["hi"]), store=store).run("x", session="chat"),
        ):
            with pytest.raises(StateError) as info:
                await attempt
            assert str(info.value).startswith(f"session 'chat' in {path}: line 2 is corrupt (Invalid JSON: ")
            assert str(info.value).endswith(": remove or repair that line (the file is left as it is)")
        assert path.read_text() == before


async def test_a_sqlite_database_of_a_newer_thinkloop_names_the_file_and_is_left_alone(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    async with SQLiteStore(db) as store:
        await _saved(store)
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO schema_version (version) VALUES (99)")
    async with SQLiteStore(db) as store:
        with pytest.raises(StateError) as info:
            await store.load_state("run-1")
    assert str(info.value) == (
        f"the SQLite store {db} has schema version 99, newer than this thinkloop supports (4): upgrade "
        "thinkloop to use it, or give this one another file (this one is left as it is)"
    )
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT max(version) FROM schema_version").fetchone()[0] == 99
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 1


async def test_a_postgres_database_of_a_newer_thinkloop_names_the_store(pg_dsn: str) -> None:
    import psycopg

    async with PostgresStore(pg_dsn) as store:
        await _saved(store)
        url = store.url
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO thinkloop_schema (version) VALUES (99)")
    async with PostgresStore(pg_dsn) as store:
        with pytest.raises(StateError) as info:
            await store.load_state("run-1")
    assert str(info.value) == (
        f"the PostgreSQL store {url} has thinkloop schema version 99, newer than this thinkloop supports "
        "(3): upgrade thinkloop to use it, or give this one another database (this one is left as it is)"
    )


async def test_a_file_store_log_and_session_cut_mid_line_by_a_crash_read_their_whole_lines(
    tmp_path: Path,
) -> None:
    # A process killed while it appended left half a line at the end: reading the log (the server does,
    # to resume a run) or the session failed on it until the next save repaired the file.
    async with FileStore(tmp_path / "files") as store:
        state = await _saved(store)
        await store.add_memory("chat", "user", "hello")
        log = tmp_path / "files" / "runs" / "run-1.events.jsonl"
        session = tmp_path / "files" / "sessions" / "chat.jsonl"
        with log.open("a") as f:
            f.write('{"run_id": "run-1", "seq": 3, "type": "sta')
        with session.open("a") as f:
            f.write('{"session": "chat", "ro')
        assert [e.seq for e in await store.read_events("run-1")] == [1, 2]
        assert [m.content for m in await store.get_memory("chat")] == ["hello"]
        await store.checkpoint(state, [])
        assert [e.seq for e in await store.read_events("run-1")] == [1, 2]


async def test_what_a_file_store_appends_after_a_cut_line_is_kept(tmp_path: Path) -> None:
    # The next line was glued to the cut one and lost with it (a session's next turn, a run's next events).
    async with FileStore(tmp_path / "files") as store:
        await store.add_memory("chat", "user", "hello")
        session = tmp_path / "files" / "sessions" / "chat.jsonl"
        with session.open("a") as f:
            f.write('{"session": "chat", "role": "assistant", "content": "half an ans')
        await store.add_memory("chat", "user", "again")
        assert [m.content for m in await store.get_memory("chat")] == ["hello", "again"]
        state = await _saved(store)
        log = tmp_path / "files" / "runs" / "run-1.events.jsonl"
        with log.open("a") as f:
            f.write('{"run_id": "run-1", "seq": 3, "ty')
        state.event_version += 1
        event = Status(text="three")
        event.run_id, event.seq = "run-1", 3
        await store.checkpoint(state, [event])
        assert [e.seq for e in await store.read_events("run-1")] == [1, 2, 3]


async def test_a_run_with_parallel_tool_calls_saved_to_postgres_finishes(pg_dsn: str) -> None:
    from thinkloop import tool

    @tool
    async def tag(name: str) -> str:
        """Tag something."""
        return name

    script: list[Any] = [
        {"tool_calls": [{"name": "tag", "args": {"name": "a"}}, {"name": "tag", "args": {"name": "b"}}]},
        "done",
    ]
    async with PostgresStore(pg_dsn) as store:
        result = await Agent(ScriptedModel(script), tools=[tag], store=store).run("tag a and b")
        assert result.state.error is None and result.output == "done"
        events = await store.read_events(result.run_id)
    assert [e.seq for e in events] == list(range(1, result.state.event_version + 1))


RESUMER = """
import asyncio, json, os, signal, sys
from thinkloop import Agent, tool
from thinkloop.stores import open_store
from thinkloop.testing import ScriptedModel

url, effects, command = sys.argv[1:4]

@tool
def record(tag: str) -> str:
    "Record a tag (not idempotent)."
    with open(effects, "a") as f:
        f.write(f"{os.getpid()}:{tag}\\n")
        f.flush()
        os.fsync(f.fileno())
    if tag == "b" and os.environ.get("KILL"):
        os.kill(os.getpid(), signal.SIGKILL)
    return "recorded " + tag

script = [{"tool_calls": [{"name": "record", "args": {"tag": t}}]} for t in "abcd"] + ["recorded a-d"]

async def main():
    store = open_store(url)
    agent = Agent(ScriptedModel(script, by_turn=True), tools=[record], store=store)
    try:
        if command == "start":
            result = await agent.run("record a to d", run_id="shared-run")
        else:
            result = await agent.resume("shared-run")
    finally:
        await store.aclose()
    print(json.dumps({"output": result.output}))

asyncio.run(main())
"""


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_of_two_processes_resuming_one_run_at_once_exactly_one_goes_on(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # The stores' promise: a checkpoint is written only at the version its process loaded, so of two
    # resumers one loses its first save (ConcurrencyError) or finds the run ended — before it runs a tool.
    url = f"sqlite:///{tmp_path}/runs.db" if kind == "sqlite" else request.getfixturevalue("pg_dsn")
    effects = tmp_path / "effects.txt"

    def child(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", RESUMER, url, str(effects), command],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )

    assert child("start", {"KILL": "1"}).returncode == -signal.SIGKILL
    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(lambda _: child("resume", {}), range(2)))
    finished = [o for o in outcomes if o.returncode == 0]
    refused = [o for o in outcomes if o.returncode != 0]
    assert len(finished) == 1 and len(refused) == 1, [o.stderr[-400:] for o in outcomes]
    assert json.loads(finished[0].stdout)["output"] == "recorded a-d"
    assert "ConcurrencyError" in refused[0].stderr or "already ended" in refused[0].stderr
    tags = [line.split(":")[1] for line in effects.read_text().split()]
    assert tags == ["a", "b", "c", "d"]  # b ran once (its outcome unknown after the kill), nothing twice
    assert len({line.split(":")[0] for line in effects.read_text().split()[2:]}) == 1  # one resumer ran


async def test_a_state_holding_an_object_json_cannot_write_says_so_not_that_the_store_failed(
    tmp_path: Path,
) -> None:
    from thinkloop import tool
    from thinkloop._execute import GateDecision

    @tool
    def note(text: str) -> str:
        """Note a text."""
        return text

    class MeddlingGate:  # user code with the run in its hands: it puts an object in the run's state
        async def check(self, call: Any, tool: Any, risk: Any, run: Any) -> GateDecision:
            run.state.metadata["client"] = object()
            return GateDecision(True, "auto")

    store = SQLiteStore(tmp_path / "runs.db")
    script = [{"tool_calls": [{"name": "note", "args": {"text": "hi"}}]}, "done"]
    agent = Agent(ScriptedModel(script), tools=[note], safety=MeddlingGate(), store=store)
    with pytest.raises(StateError) as caught:
        await agent.run("go", run_id="meddled")
    message = str(caught.value)
    assert "its state holds a value that cannot be written as JSON" in message
    assert "once the store works" not in message  # the store works: resuming would not help it
    saved = await store.load_state("meddled")  # the last checkpoint, before the object went in
    assert saved is not None and not saved.finished and "client" not in saved.metadata


class _Killed(BaseException):
    """A process killed at this point of a save (nothing after it runs, as with SIGKILL)."""


@pytest.mark.parametrize("at", ["session", "state"])
async def test_a_file_store_killed_in_the_final_save_keeps_the_session_turn_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: str
) -> None:
    """The final save wrote the run's state, then its session turn: killed between the two, the run was done
    and its turn lost for good (a done run is not resumed). Now the turn is written first, and a save made
    again after a kill replaces what the killed one wrote: the turn is kept once."""
    from thinkloop.stores import _file

    root = tmp_path / "files"
    write_atomic, append = _file._write_atomic, _file._append_synced

    def killing_write(path: Path, text: str) -> None:
        if at == "state" and path.name == "run-1.json" and '"phase":"done"' in text.replace(" ", ""):
            raise _Killed
        write_atomic(path, text)

    def killing_append(path: Path, lines: list[str]) -> None:
        append(path, lines)
        if at == "session" and path.parent.name == "sessions":
            raise _Killed  # after the first line of the turn

    monkeypatch.setattr(_file, "_write_atomic", killing_write)
    monkeypatch.setattr(_file, "_append_synced", killing_append)
    agent = Agent(ScriptedModel(["The answer is 42."] * 2), store=FileStore(root))
    with pytest.raises(_Killed):
        await agent.run("What is the answer?", session="chat", run_id="run-1")
    monkeypatch.setattr(_file, "_write_atomic", write_atomic)
    monkeypatch.setattr(_file, "_append_synced", append)

    store = FileStore(root)
    assert (await store.load_state("run-1")).phase != "done"  # type: ignore[union-attr]
    result = await Agent(ScriptedModel(["The answer is 42."]), store=store).resume("run-1")
    assert result.output == "The answer is 42."
    turns = [(m.role, m.content) for m in await store.get_memory("chat")]
    assert turns == [("user", "What is the answer?"), ("assistant", "The answer is 42.")]
    text = (root / "sessions" / "chat.jsonl").read_text()
    assert text.count('"run":"run-1"') == 2
