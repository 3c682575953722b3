"""Crash safety (SPEC §9.2): a real process is SIGKILLed at every step boundary and inside tool calls,
then resumed in a new process; nothing with side effects runs twice and the event log has no gaps."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import private_schema
from thinkloop import Event, Message, RunState
from thinkloop._events import RunStarted
from thinkloop.stores import PostgresStore, SQLiteStore

CHILD = Path(__file__).with_name("crash_agent.py")
RECORDS = ["a", "c", "d", "e"]  # not idempotent
MARKS = ["b", "f", "g"]  # idempotent
FINAL = "Recorded a, c, d and e; marked b, f and g."
RUN_ID = "crash-run"


def _child(
    command: str, tmp: Path, env: dict[str, str], db: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHILD), command, db or str(tmp / "runs.db"), str(tmp / "effects.txt"), RUN_ID],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _clean_run(tmp: Path) -> dict[str, int]:
    done = _child("start", tmp, {})
    assert done.returncode == 0, done.stderr
    result: dict[str, int] = json.loads(done.stdout)
    return result


@pytest.fixture(scope="module")
def counts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    """How many checkpoints and tool calls an uninterrupted run makes."""
    result = _clean_run(tmp_path_factory.mktemp("clean"))
    assert result["stop_reason"] == "final_answer" and result["output"] == FINAL
    assert result["tool_calls"] == len(RECORDS) + len(MARKS)
    return result


def _kill_points(counts: dict[str, int]) -> list[tuple[str, str]]:
    """After every checkpoint but the last (step boundaries, ledger writes), before a few, and inside
    every tool call (after its effect; before it for some)."""
    n, tools = counts["checkpoints"], counts["tool_calls"]
    points = [("KILL_AFTER_CHECKPOINT", str(i)) for i in range(1, n)]
    points += [("KILL_BEFORE_CHECKPOINT", str(i)) for i in range(2, n + 1, 6)]
    points += [("KILL_IN_TOOL", f"{i}:after") for i in range(1, tools + 1)]
    points += [("KILL_IN_TOOL", f"{i}:before") for i in range(1, tools + 1, 2)]
    return points


def _crash_and_resume(base: Path, index: int, chain: list[tuple[str, str]]) -> tuple[str | None, int]:
    """Start a run, kill it at the chain's first point; resume it in a new process killed at the next
    point (counted in that process) …; then resume it to completion. Returns (problem or None, kills)."""
    tmp = base / f"p{index}"
    tmp.mkdir()
    where, kills, finished = f"chain {chain}", 0, None
    for n, (var, value) in enumerate(chain):
        proc = _child("start" if n == 0 else "resume", tmp, {var: value})
        if proc.returncode == -signal.SIGKILL:
            kills += 1
        elif proc.returncode == 0:
            finished = proc  # the kill point lay beyond what was left of the run
            break
        else:
            return f"{where}: process {n} failed (rc {proc.returncode}): {proc.stderr[-800:]}", kills
    if finished is None:
        finished = _child("resume", tmp, {})
        if finished.returncode != 0:
            return f"{where}: the final resume failed: {finished.stderr[-800:]}", kills
    result = json.loads(finished.stdout)
    problems = asyncio.run(_check_run(tmp, kills))
    if result["output"] != FINAL or result["stop_reason"] != "final_answer":
        problems.append(f"wrong result {result}")
    return (f"{where}: " + "; ".join(problems) if problems else None), kills


async def _check_run(tmp: Path, kills: int, db: str | None = None) -> list[str]:
    async with PostgresStore(db) if db else SQLiteStore(tmp / "runs.db") as store:
        events = await store.read_events(RUN_ID)
        state = await store.load_state(RUN_ID)
    assert state is not None
    observed = {m.tool_call_id: m.content for m in state.messages if m.role == "tool"}
    return _check_effects(tmp, state.messages, observed) + _check_log(events, state, kills)


def _check_effects(tmp: Path, messages: list[Message], observed: dict[str | None, str]) -> list[str]:
    """A record ran at most once: once if the model saw its result, 0 or 1 times if told "unknown"."""
    lines = Counter((tmp / "effects.txt").read_text().split())
    calls = [c for m in messages for c in m.tool_calls]
    problems = []
    for call in calls:
        seen, effect = observed.get(call.id, ""), f"{call.name}:{call.arguments['tag']}"
        if call.name == "record" and lines[effect] > 1:
            problems.append(f"{effect} ran {lines[effect]} times")
        elif seen.startswith(("recorded", "marked")) and lines[effect] < 1:
            problems.append(f"{effect} reported done but never ran")
        elif seen.startswith("Error") and not (call.name == "record" and "unknown" in seen):
            problems.append(f"{effect}: unexpected observation {seen[:80]!r}")
    if sorted(f"{c.name}:{c.arguments['tag']}" for c in calls) != sorted(
        [f"record:{t}" for t in RECORDS] + [f"mark:{t}" for t in MARKS]
    ):
        problems.append(f"unexpected calls {[c.arguments for c in calls]}")
    return problems


def _check_log(events: list[Event], state: RunState, kills: int) -> list[str]:
    problems = []
    seqs = [e.seq for e in events]
    if seqs != list(range(1, len(events) + 1)):
        problems.append(f"event log has gaps: {seqs}")
    starts = [e for e in events if isinstance(e, RunStarted)]
    if len(starts) != kills + 1 or starts[0].resumed or not all(s.resumed for s in starts[1:]):
        problems.append(f"expected one run_started and {kills} resumed ones, got {len(starts)}")
    if events[-1].type != "done" or sum(e.type == "done" for e in events) != 1:
        problems.append("the log does not end with exactly one done event")
    if state.event_version != len(events) or state.phase != "done":
        problems.append("the saved state does not match the log")
    return problems


def test_sigkill_at_every_step_boundary_and_inside_tool_calls(tmp_path: Path, counts: dict[str, int]) -> None:
    points = _kill_points(counts)
    chains = [points[i : i + 2] for i in range(0, len(points), 2)]  # the resumed process is killed too
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda ic: _crash_and_resume(tmp_path, *ic), enumerate(chains)))
    failures = [problem for problem, _ in results if problem is not None]
    assert not failures, "\n".join(failures)
    assert sum(kills for _, kills in results) >= 20


def test_a_run_killed_after_its_last_checkpoint_is_not_resumed(
    tmp_path: Path, counts: dict[str, int]
) -> None:
    crashed = _child("start", tmp_path, {"KILL_AFTER_CHECKPOINT": str(counts["checkpoints"])})
    assert crashed.returncode == -signal.SIGKILL
    resumed = _child("resume", tmp_path, {})
    assert resumed.returncode != 0
    assert "already ended (final_answer) and cannot be resumed" in resumed.stderr
    assert Counter((tmp_path / "effects.txt").read_text().split()) == Counter(
        [f"record:{t}" for t in RECORDS] + [f"mark:{t}" for t in MARKS]
    )


def test_a_non_idempotent_call_killed_mid_flight_is_reported_as_unknown(tmp_path: Path) -> None:
    crashed = _child("start", tmp_path, {"KILL_IN_TOOL": "3:after"})  # record(c), after its effect
    assert crashed.returncode == -signal.SIGKILL
    assert _child("resume", tmp_path, {}).returncode == 0
    assert (tmp_path / "effects.txt").read_text().split().count("record:c") == 1

    async def observation() -> str:
        async with SQLiteStore(tmp_path / "runs.db") as store:
            state = await store.load_state(RUN_ID)
        assert state is not None
        return next(m.content for m in state.messages if m.role == "tool" and m.tool_call_id == "call_1_0")

    text = asyncio.run(observation())
    assert text.startswith("Error: the outcome of record is unknown")


def test_the_cli_run_killed_inside_a_shell_call_resumes_without_running_it_again(tmp_path: Path) -> None:
    """Black-box: `thinkloop run --model script:FILE` is SIGKILLed while its shell call runs, then
    `thinkloop runs resume` finishes the run; the shell command is not run a second time."""
    command = "echo $$ > pid.txt; echo started >> effects.txt; exec sleep 30"
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps([{"tool_calls": [{"name": "shell", "args": {"command": command}}]}, "It was interrupted."])
    )
    store = f"sqlite://{tmp_path}/runs.db"
    cli = ["--model", f"script:{script}", "--store", store]
    options = ["--tools", "shell", "--yes", "--json", "--workspace", str(tmp_path)]
    run = subprocess.Popen(
        [sys.executable, "-c", "from thinkloop.cli import main; main()", "run", "Run it.", *cli, *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert run.stdout is not None
        first = json.loads(run.stdout.readline())  # the run id is known from the first event
        assert first["type"] == "run_started"
        deadline = time.monotonic() + 60
        effects = tmp_path / "effects.txt"
        # its effect written, not only its file opened (killed in between, the shell left it empty)
        while not (effects.exists() and effects.read_text() == "started\n"):
            assert time.monotonic() < deadline, "the shell call did not start within 60 s"
            time.sleep(0.05)
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=10)
    finally:
        run.kill()
        run.communicate()
        if (tmp_path / "pid.txt").exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int((tmp_path / "pid.txt").read_text()), signal.SIGKILL)  # the orphaned sleep

    resumed = subprocess.run(
        [sys.executable, "-c", "from thinkloop.cli import main; main()", "runs", "resume", first["run_id"]]
        + cli
        + options,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr
    events = [json.loads(line) for line in resumed.stdout.splitlines()]
    assert events[0]["type"] == "run_started" and events[0]["resumed"] is True
    result = next(e for e in events if e["type"] == "tool_result")
    assert result["error_kind"] == "unknown_outcome"
    assert events[-1]["type"] == "done" and events[-1]["result"]["output"] == "It was interrupted."
    assert (tmp_path / "effects.txt").read_text().split() == ["started"]


@pytest.fixture
def crash_pg_dsn() -> Iterator[str]:
    yield from private_schema("tl_crash")


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_two_processes_resuming_one_run_at_once_run_nothing_twice(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """Killed inside record(c) after its effect, the run is resumed by two processes at the same time: one
    finishes it, the other is refused (it lost the race to write the log, or found the run ended) before
    running anything; no record runs twice and the log has one `done`. The same on SQLite and PostgreSQL."""
    db = request.getfixturevalue("crash_pg_dsn") if kind == "postgres" else None
    crashed = _child("start", tmp_path, {"KILL_IN_TOOL": "3:after"}, db)
    assert crashed.returncode == -signal.SIGKILL
    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(lambda _: _child("resume", tmp_path, {}, db), range(2)))
    finished = [o for o in outcomes if o.returncode == 0]
    refused = [o for o in outcomes if o.returncode != 0]
    assert len(finished) == 1 and len(refused) == 1, [o.stderr[-400:] for o in outcomes]
    assert json.loads(finished[0].stdout)["output"] == FINAL
    assert ("ConcurrencyError" in refused[0].stderr) or ("already ended" in refused[0].stderr)
    lines = Counter((tmp_path / "effects.txt").read_text().split())
    assert all(lines[f"record:{t}"] == 1 for t in RECORDS), lines
    problems = asyncio.run(_check_run(tmp_path, kills=1, db=db))
    assert not [p for p in problems if "run_started" not in p], problems  # the loser may have logged nothing
