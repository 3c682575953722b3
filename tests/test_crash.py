"""Crash safety (SPEC §9.2): a real process is SIGKILLed at every step boundary and inside tool calls,
then resumed in a new process; nothing with side effects runs twice and the event log has no gaps."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from thinkloop import Event, Message, RunState
from thinkloop._events import RunStarted
from thinkloop.stores import SQLiteStore

CHILD = Path(__file__).with_name("crash_agent.py")
RECORDS = ["a", "c", "d", "e"]  # not idempotent
MARKS = ["b", "f", "g"]  # idempotent
FINAL = "Recorded a, c, d and e; marked b, f and g."
RUN_ID = "crash-run"


def _child(command: str, tmp: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHILD), command, str(tmp / "runs.db"), str(tmp / "effects.txt"), RUN_ID],
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


def _crash_and_resume(base: Path, index: int, var: str, value: str) -> str | None:
    """One kill point; returns a description of what went wrong, or None."""
    tmp = base / f"p{index}"
    tmp.mkdir()
    crashed = _child("start", tmp, {var: value})
    if crashed.returncode != -signal.SIGKILL:
        return f"{var}={value}: the child was not killed (rc {crashed.returncode}): {crashed.stderr[-500:]}"
    resumed = _child("resume", tmp, {})
    if resumed.returncode != 0:
        return f"{var}={value}: resume failed: {resumed.stderr[-800:]}"
    result = json.loads(resumed.stdout)
    problems = asyncio.run(_check_run(tmp))
    if result["output"] != FINAL or result["stop_reason"] != "final_answer":
        problems.append(f"wrong result {result}")
    return f"{var}={value}: " + "; ".join(problems) if problems else None


async def _check_run(tmp: Path) -> list[str]:
    async with SQLiteStore(tmp / "runs.db") as store:
        events = await store.read_events(RUN_ID)
        state = await store.load_state(RUN_ID)
    assert state is not None
    observed = {m.tool_call_id: m.content for m in state.messages if m.role == "tool"}
    return _check_effects(tmp, state.messages, observed) + _check_log(events, state)


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


def _check_log(events: list[Event], state: RunState) -> list[str]:
    problems = []
    seqs = [e.seq for e in events]
    if seqs != list(range(1, len(events) + 1)):
        problems.append(f"event log has gaps: {seqs}")
    starts = [e for e in events if isinstance(e, RunStarted)]
    if len(starts) < 2 or starts[0].resumed or not starts[-1].resumed:
        problems.append(f"expected a first and a resumed run_started, got {len(starts)}")
    if events[-1].type != "done" or sum(e.type == "done" for e in events) != 1:
        problems.append("the log does not end with exactly one done event")
    if state.event_version != len(events) or state.phase != "done":
        problems.append("the saved state does not match the log")
    return problems


def test_sigkill_at_every_step_boundary_and_inside_tool_calls(tmp_path: Path, counts: dict[str, int]) -> None:
    points = _kill_points(counts)
    assert len(points) >= 20
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda ip: _crash_and_resume(tmp_path, ip[0], *ip[1]), enumerate(points)))
    failures = [r for r in results if r is not None]
    assert not failures, "\n".join(failures)


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
