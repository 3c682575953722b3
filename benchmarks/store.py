"""Cost of durable runs: checkpoint + event append per step, and the overhead on a whole scripted run.

    .venv/bin/python benchmarks/store.py [--checkpoints 2000] [--runs 40] [--steps 10] [--history-only]
        [--history-stores sqlite,postgres,file] [--history-steps 300]

1. Micro: `store.checkpoint(state, events)` on a realistic mid-run state (10 steps of history, 3 events
   per checkpoint) — what the loop pays at every step boundary: one transaction saving the state and
   appending the events.
2. Macro: the same scripted run (one tool call per step, then the answer) with no store at all, and
   with each store, interleaved in the same process; overhead per step = (run time with the store −
   run time without) / steps. A tool step makes 4 checkpoints (reply screened, tool started, tool done,
   observations saved).

3. History: what one checkpoint costs after 10 and after 300 steps whose tool returned 10 kB, and the
   ratio (1.0: independent of the history's length). The run is built step by step as the loop does (3
   checkpoints a step: tool started — its ledger entry added —, tool done — the entry holds the 10 kB
   output —, observation saved — the tool message added), then the checkpoints of 10 more steps are
   timed. Every store that is available is measured (`--history-stores` picks some).

PostgreSQL is measured when it answers at $THINKLOOP_BENCH_PG (default postgresql://postgres@127.0.0.1:5432/test),
in a private schema dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from thinkloop import Agent, Budget, Message, RunState, ToolCall, tool
from thinkloop._events import Progress, ToolCallEvent, ToolResultEvent
from thinkloop._state import LedgerEntry
from thinkloop.stores import FileStore, MemoryStore, PostgresStore, SQLiteStore, Store
from thinkloop.testing import ScriptedModel

PG = os.environ.get("THINKLOOP_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")


# ================================================================================================ micro


def mid_run_state() -> RunState:
    state = RunState(
        run_id=uuid.uuid4().hex, goal="Check the disk usage of every host and report.", model="x"
    )
    state.messages.append(Message.user(state.goal))
    for step in range(1, 11):
        call = ToolCall(id=f"call_{step}", name="shell", arguments={"command": f"df -h /srv/{step}"})
        state.messages.append(Message.assistant("Let me look at the next volume.", [call], step=step))
        state.messages.append(Message.tool(call, "Filesystem Size Used Avail Use%\n" + "x" * 400, step=step))
    state.step = 10
    return state


def step_events(state: RunState, step: int) -> list[Any]:
    call = ToolCall(id=f"c{step}", name="shell", arguments={"command": "df -h"})
    events = [
        Progress(step=step, max_steps=16, usage=state.usage),
        ToolCallEvent(step=step, call=call),
        ToolResultEvent(
            step=step, call_id=call.id, name="shell", output="ok " * 50, success=True, duration=0.01
        ),
    ]
    for event in events:
        state.event_version += 1
        event.run_id, event.seq = state.run_id, state.event_version
    return events


async def micro(store: Store, n: int) -> list[float]:
    state = mid_run_state()
    times = []
    for i in range(n):
        events = step_events(state, i)
        started = time.perf_counter()
        await store.checkpoint(state, events)
        times.append(time.perf_counter() - started)
    return times


# ================================================================================================ macro


@tool
def probe(n: int) -> str:
    """Probe item n."""
    return f"item {n}: ok " + "." * 200


def script(steps: int) -> list[Any]:
    calls: list[Any] = [{"tool_calls": [{"name": "probe", "args": {"n": i}}]} for i in range(steps)]
    return [*calls, "All items are ok."]


async def one_run(store: Store | None, steps: int) -> float:
    agent = Agent(ScriptedModel(script(steps)), tools=[probe], budget=Budget(max_steps=steps + 2))
    agent.store = store  # type: ignore[assignment]  # None: no checkpoints at all (the baseline)
    started = time.perf_counter()
    result = await agent.run("Probe every item.")
    elapsed = time.perf_counter() - started
    assert result.output == "All items are ok.", result.output
    return elapsed


# ============================================================================================== history


async def history_step(store: Store, state: RunState, step: int) -> None:
    """One tool step of 10 kB output and its 3 checkpoints, as the loop makes them: tool started (its
    ledger entry added), tool done (the entry holds the output), observation saved (the tool message)."""
    call = ToolCall(id=f"h{step}", name="fetch", arguments={"item": step})
    state.step = step
    state.messages.append(Message.assistant("", [call], step=step))
    output = f"item {step}\n" + "x" * 10_000
    state.ledger[call.id] = LedgerEntry(call_id=call.id, name=call.name, arguments=call.arguments, step=step)
    entry = state.ledger[call.id]
    for event in (
        ToolCallEvent(step=step, call=call),
        ToolResultEvent(step=step, call_id=call.id, name="fetch", output="ok", success=True, duration=0.01),
        Progress(step=step, max_steps=1000, usage=state.usage),
    ):
        if isinstance(event, ToolResultEvent):
            entry.status, entry.output, entry.success = "done", output, True
        if isinstance(event, Progress):
            state.messages.append(Message.tool(call, output, step=step))
        state.event_version += 1
        event.run_id, event.seq = state.run_id, state.event_version
        await store.checkpoint(state, [event])


async def history_cost(store: Store, steps: int, timed: int = 10) -> float:
    """Median seconds per checkpoint over the `timed` steps that follow `steps` steps of history."""
    state = RunState(run_id=uuid.uuid4().hex, goal="Fetch every item.", model="x")
    state.messages.append(Message.user(state.goal))
    times = []
    for step in range(1, steps + timed + 1):
        started = time.perf_counter()
        await history_step(store, state, step)
        if step > steps:
            times.append((time.perf_counter() - started) / 3)
    return statistics.median(times)


async def history(tmp: Path, names: list[str], steps: int) -> None:
    print("\n3. one checkpoint after N steps of 10 kB tool output (median of the next 10 steps' checkpoints)")
    for name in names:
        made = await history_store(name, tmp)
        if made is None:
            print(f"  {name:9} not available")
            continue
        store, drop = made
        async with store:
            await history_cost(store, 5)  # warm up
            short = await history_cost(store, 10)
            long = await history_cost(store, steps)
        await drop()
        print(
            f"  {name:9} 10 steps {short * 1e3:.3f} ms · {steps} steps {long * 1e3:.3f} ms · "
            f"ratio x{long / short:.2f}"
        )


async def history_store(name: str, tmp: Path) -> tuple[Store, Callable[[], Awaitable[None]]] | None:
    async def nothing() -> None:
        return None

    if name == "sqlite":
        return SQLiteStore(tmp / "history.db"), nothing
    if name == "file":
        return FileStore(tmp / "history-files"), nothing
    if name == "postgres":
        return await pg_store()
    raise SystemExit(f"unknown store {name!r} (sqlite, postgres, file)")


# ================================================================================================= main


async def pg_store() -> tuple[PostgresStore, Callable[[], Awaitable[None]]] | None:
    try:
        import psycopg
    except ImportError:
        return None
    schema = f"tl_bench_{uuid.uuid4().hex[:8]}"
    try:
        async with await psycopg.AsyncConnection.connect(PG, autocommit=True, connect_timeout=3) as conn:
            await conn.execute(f"CREATE SCHEMA {schema}")
    except psycopg.OperationalError:
        return None

    async def drop() -> None:
        async with await psycopg.AsyncConnection.connect(PG, autocommit=True) as conn:
            await conn.execute(f"DROP SCHEMA {schema} CASCADE")

    return PostgresStore(f"{PG}?options=-csearch_path%3D{schema}"), drop


def ms(values: list[float]) -> str:
    values = sorted(values)
    p95 = values[int(len(values) * 0.95) - 1]
    return f"mean {statistics.mean(values) * 1e3:.3f} ms · p50 {statistics.median(values) * 1e3:.3f} ms · p95 {p95 * 1e3:.3f} ms"


async def main(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="tl-bench-"))
    history_stores = [name.strip() for name in args.history_stores.split(",") if name.strip()]
    if args.history_only:
        await history(tmp, history_stores, args.history_steps)
        return
    stores: dict[str, Store] = {
        "memory": MemoryStore(),
        "sqlite": SQLiteStore(tmp / "bench.db"),
        "file": FileStore(tmp / "files"),
    }
    pg = await pg_store()
    if pg is not None:
        stores["postgres"] = pg[0]
    print(f"state: {len(mid_run_state().to_json()):,} bytes of JSON; 3 events per checkpoint")
    print("\n1. checkpoint (state + events, one transaction)")
    for name, store in stores.items():
        await micro(store, 50)  # warm up: connection, schema, statement cache
        print(f"  {name:9} {ms(await micro(store, args.checkpoints))}")

    print(f"\n2. a scripted run of {args.steps} tool steps + the answer, {args.runs} runs each, interleaved")
    timings: dict[str, list[float]] = {"none": [], **{k: [] for k in stores}}
    for _ in range(3):  # warm up
        for name in timings:
            await one_run(stores.get(name), args.steps)
    for _ in range(args.runs):
        for name in timings:
            timings[name].append(await one_run(stores.get(name), args.steps))
    base = statistics.median(timings["none"])
    steps = args.steps + 1
    print(f"  {'none':9} {base * 1e3:8.2f} ms per run ({base / steps * 1e3:.3f} ms per step)")
    for name in stores:
        t = statistics.median(timings[name])
        print(
            f"  {name:9} {t * 1e3:8.2f} ms per run · x{t / base:.2f} · "
            f"overhead {(t - base) / steps * 1e3:.3f} ms per step"
        )
    for store in stores.values():
        await store.aclose()
    if pg is not None:
        await pg[1]()
    await history(tmp, history_stores, args.history_steps)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoints", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--history-only", action="store_true", help="only scenario 3 (history length)")
    parser.add_argument("--history-stores", default="sqlite,postgres,file", help="stores of scenario 3")
    parser.add_argument("--history-steps", type=int, default=300, help="the long history of scenario 3")
    asyncio.run(main(parser.parse_args()))
