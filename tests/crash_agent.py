"""Child process of the crash test (tests/test_crash.py): run or resume an agent, maybe SIGKILL itself.

    python tests/crash_agent.py start  DB EFFECTS RUN_ID
    python tests/crash_agent.py resume DB EFFECTS RUN_ID

DB is a SQLite file, or a PostgreSQL DSN (`postgresql://…`).

The agent's tools append a line to EFFECTS: `record` is not idempotent, `mark` is. Its model is a
by-turn script with parallel tool calls. One environment variable picks where the process kills
itself with SIGKILL (no cleanup, no flush — like a crash):
    KILL_BEFORE_CHECKPOINT=n   just before the n-th checkpoint is written
    KILL_AFTER_CHECKPOINT=n    just after the n-th checkpoint is committed (a step boundary)
    KILL_IN_TOOL=n:before      inside the n-th tool call, before its effect
    KILL_IN_TOOL=n:after       inside the n-th tool call, after its effect
On completion it prints the result as one JSON line.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from thinkloop import Agent, Event, RunState, tool
from thinkloop.stores import PostgresStore, SQLiteStore, Store
from thinkloop.testing import ScriptedModel

SCRIPT: list[object] = [
    {"tool_calls": [{"name": "record", "args": {"tag": "a"}}, {"name": "mark", "args": {"tag": "b"}}]},
    {"text": "Now c.", "tool_calls": [{"name": "record", "args": {"tag": "c"}}]},
    {
        "tool_calls": [
            {"name": "record", "args": {"tag": "d"}},
            {"name": "record", "args": {"tag": "e"}},
            {"name": "mark", "args": {"tag": "f"}},
        ]
    },
    {"tool_calls": [{"name": "mark", "args": {"tag": "g"}}]},
    "Recorded a, c, d and e; marked b, f and g.",
]
FINAL = str(SCRIPT[-1])

_checkpoints = itertools.count(1)
_tool_calls = itertools.count(1)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _env_int(name: str) -> int:
    return int(os.environ.get(name) or 0)


class _Killing:
    """Kills the process around the store's n-th checkpoint."""

    async def checkpoint(self, state: RunState, events: Sequence[Event]) -> None:
        n = next(_checkpoints)
        if n == _env_int("KILL_BEFORE_CHECKPOINT"):
            _die()
        saving: Any = super()
        await saving.checkpoint(state, events)
        if n == _env_int("KILL_AFTER_CHECKPOINT"):
            _die()


class KillingStore(_Killing, SQLiteStore):
    """A SQLite store that kills the process around its n-th checkpoint."""


class KillingPostgresStore(_Killing, PostgresStore):
    """A PostgreSQL store that kills the process around its n-th checkpoint."""


def _store(db: str) -> Store:
    return KillingPostgresStore(db) if db.startswith("postgresql://") else KillingStore(db)


def _effect(path: str, line: str) -> None:
    spec = os.environ.get("KILL_IN_TOOL", "")
    n = next(_tool_calls)
    target, _, when = spec.partition(":")
    kill_here = spec and int(target) == n
    if kill_here and when == "before":
        _die()
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
    if kill_here:
        _die()


def build_agent(db: str, effects: str) -> Agent:
    @tool
    async def record(tag: str) -> str:
        """Record a tag (not idempotent: every call appends a line)."""
        _effect(effects, f"record:{tag}")
        return f"recorded {tag}"

    @tool(idempotent=True)
    async def mark(tag: str) -> str:
        """Mark a tag (idempotent: marking twice is the same as once)."""
        _effect(effects, f"mark:{tag}")
        return f"marked {tag}"

    return Agent(ScriptedModel(SCRIPT, by_turn=True), tools=[record, mark], store=_store(db))


async def main(command: str, db: str, effects: str, run_id: str) -> None:
    agent = build_agent(db, effects)
    try:
        if command == "start":
            result = await agent.run("Record a, c, d, e and mark b, f, g.", run_id=run_id)
        else:
            result = await agent.resume(run_id)
    finally:
        assert agent.store is not None
        await agent.store.aclose()
    summary = {"output": result.output, "stop_reason": result.stop_reason.value, "steps": result.steps}
    print(json.dumps({**summary, "checkpoints": next(_checkpoints) - 1, "tool_calls": next(_tool_calls) - 1}))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
