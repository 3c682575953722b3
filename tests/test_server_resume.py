"""Resuming an interrupted run from the server (SPEC §13.2, §9.2): `POST /api/runs/{id}/resume`.

A run is interrupted as in test_resume.py — its store 'dies' (`Crash`) at a chosen checkpoint — and a new
app on the same store resumes it. The tool-call ledger decides what runs again: a completed call never.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from test_resume import SCRIPT, Crash, Effects, agent_for, crashing, ledger, observed
from test_server import api, eventually, finished, make_agent, read_until, serve, start, waiting_approval
from thinkloop import Agent, Event, RunState
from thinkloop.stores import MemoryStore, SQLiteStore, Store
from thinkloop.stores._owner import check_not_running
from thinkloop.testing import FunctionModel, Reply, ScriptedModel


async def interrupt(store: Store, effects: Effects, run_id: str = "r") -> None:
    """Run SCRIPT (fetch k1, send bob, fetch k2, answer) until the store 'dies'."""
    with pytest.raises(Crash):
        await Agent(ScriptedModel(SCRIPT, by_turn=True), tools=effects.tools, store=store).run(
            "do the things", run_id=run_id
        )


@pytest.fixture
def fast_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    import thinkloop.server._runs as runs_module

    monkeypatch.setattr(runs_module, "POLL_INTERVAL", 0.02)


async def test_resume_over_http_continues_on_the_same_websocket_and_runs_no_tool_twice(
    tmp_path: Path, fast_polling: None
) -> None:
    db = tmp_path / "runs.db"
    effects = Effects()
    dying = crashing(SQLiteStore, ledger("call_1_0", "done"))(db)  # send() ran; its end was never saved
    await interrupt(dying, effects)
    await dying.aclose()
    assert effects.runs == ["fetch:k1", "send:bob"]

    # a new server process on the same store
    async with SQLiteStore(db) as store:
        agent = Agent(ScriptedModel(SCRIPT, by_turn=True), tools=effects.tools, store=store)
        async with serve(_app(agent)) as served, httpx.AsyncClient(base_url=served.url) as client:
            listed = (await client.get("/api/runs")).json()["runs"]
            assert [(r["run_id"], r["status"], r["active"]) for r in listed] == [("r", "running", False)]
            logged = len(await store.read_events("r"))

            async with websockets.connect(f"{served.ws}/api/runs/r/events") as ws:
                before = [await _next(ws) for _ in range(logged)]  # the log so far; then the stream waits
                response = await client.post("/api/runs/r/resume", json={})
                assert response.status_code == 202 and response.json() == {"run_id": "r", "status": "running"}
                assert response.headers["location"] == "/api/runs/r"
                after = await read_until(ws, lambda e: e["type"] == "done")
            assert ws.close_code == 1000

            again = await client.post("/api/runs/r/resume", json={})
            assert again.status_code == 409
            assert again.json() == {  # no "forceable": {"force": true} cannot resume an ended run
                "error": "run 'r' already ended (final_answer) and cannot be resumed: start a new run instead"
            }
            unknown = await client.post("/api/runs/nope/resume", json={})
            assert unknown.status_code == 404 and unknown.json() == {"error": "no run 'nope'"}
            run = (await client.get("/api/runs/r")).json()["run"]
            assert run["status"] == "done" and run["active"] is False

        events = before + after
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))  # no gap, no duplicate
        assert [e["resumed"] for e in events if e["type"] == "run_started"] == [False, True]
        assert [e.model_dump(mode="json") for e in await store.read_events("r")] == events
    assert effects.runs == ["fetch:k1", "send:bob", "fetch:k2"]  # send() not again, nor the first fetch
    send_results = [e for e in events if e["type"] == "tool_result" and e["call_id"] == "call_1_0"]
    assert [e["error_kind"] for e in send_results] == ["unknown_outcome"]  # the model is told
    assert events[-1]["result"]["output"] == "all done"


async def test_a_resumed_run_is_followed_live_from_its_first_event_and_can_wait_for_approval() -> None:
    store = crashing(MemoryStore, observed(1), after=True)()  # dies once step 1 (purge a) is saved
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "purge", "args": {"target": "a"}, "id": "c0"}]},
            {"tool_calls": [{"name": "purge", "args": {"target": "b"}, "id": "c1"}]},
            "a and b purged",
        ],
        by_turn=True,
    )
    agent, purges = make_agent(model, store)
    async with api(_app(agent)) as client:  # before the crash: `purge a` approved over HTTP
        outcomes = await asyncio.gather(
            agent.run("purge a and b", run_id="r"), _approve_soon(client, "r", "c0"), return_exceptions=True
        )
    assert isinstance(outcomes[0], Crash) and outcomes[1] is None
    assert purges.done == ["a"]

    agent, resumed_purges = make_agent(model, store)  # a new server: its own PendingApprovals
    logged = len(await store.read_events("r"))
    async with serve(_app(agent)) as served, httpx.AsyncClient(base_url=served.url) as client:
        async with websockets.connect(f"{served.ws}/api/runs/r/events") as ws:  # follows the store's log
            so_far = [await _next(ws) for _ in range(logged)]
            assert (await client.post("/api/runs/r/resume", json={})).status_code == 202
            # the same stream goes on with the resumed run's events
            so_far += await read_until(ws, lambda e: e["type"] == "approval_requested")
            assert so_far[-1]["call"]["id"] == "c1"

            conflict = await client.post("/api/runs/r/resume", json={})
            assert conflict.status_code == 409
            assert conflict.json() == {"error": "run 'r' is running in this server already"}  # not forceable
            forced = await client.post("/api/runs/r/resume", json={"force": True})
            assert forced.status_code == 409 and forced.json() == conflict.json()  # indeed
            runs = (await client.get("/api/runs")).json()["runs"]
            assert [(r["run_id"], r["active"]) for r in runs] == [("r", True)]
            async with websockets.connect(f"{served.ws}/api/runs/r/events?after=0") as late:  # from seq 1
                assert await read_until(late, lambda e: e["seq"] == so_far[-1]["seq"]) == so_far

            await client.post("/api/runs/r/approvals/c1", json={"decision": "approve"})
            rest = await read_until(ws, lambda e: e["type"] == "done")
        polled = (await client.get("/api/runs/r/events", params={"after": 0})).json()["events"]
    events = so_far + rest
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert polled == events
    assert purges.done == ["a"] and resumed_purges.done == ["b"]  # `purge a` was not run again
    assert events[-1]["result"]["output"] == "a and b purged"


async def test_a_stream_following_an_interrupted_run_goes_live_when_it_is_resumed() -> None:
    store = crashing(MemoryStore, observed(1), after=True)()
    effects = Effects()
    await interrupt(store, effects)  # dies once step 1 (fetch k1) is saved
    gate = asyncio.Event()

    async def reply(request: Any) -> Reply:
        await gate.wait()
        return "all done"

    agent = Agent(FunctionModel(reply), tools=effects.tools, store=store)
    logged = len(await store.read_events("r"))
    async with (
        serve(_app(agent)) as served,
        httpx.AsyncClient(base_url=served.url) as client,
        websockets.connect(f"{served.ws}/api/runs/r/events") as ws,
    ):
        before = [await _next(ws) for _ in range(logged)]
        assert (await client.post("/api/runs/r/resume", json={})).status_code == 202
        # `progress` comes while the model call waits, before any checkpoint holds it
        live = await read_until(ws, lambda e: e["type"] == "progress")
        assert live[-1]["seq"] not in [e.seq for e in await store.read_events("r")]
        gate.set()
        rest = await read_until(ws, lambda e: e["type"] == "done")
    events = before + live + rest
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["result"]["output"] == "all done" and effects.runs == ["fetch:k1"]


async def test_resume_is_refused_when_the_server_is_full() -> None:
    store = crashing(MemoryStore, observed(1), after=True)()
    effects = Effects()
    await interrupt(store, effects, "old")
    busy = ScriptedModel([{"tool_calls": [{"name": "purge", "args": {"target": "x"}, "id": "c0"}]}, "ok"])
    agent, _ = make_agent(busy, store)
    async with api(_app(agent, max_active_runs=1)) as client:
        waiting = await start(client)
        await waiting_approval(client, waiting)
        full = await client.post("/api/runs/old/resume", json={})
        assert full.status_code == 429 and "its limit" in full.json()["error"]
        assert list(full.json()) == ["error"]
        await client.post(f"/api/runs/{waiting}/approvals/c0", json={"decision": "deny"})
        await finished(client, waiting)
        state = await store.load_state("old")
        assert state is not None and not state.finished  # refused: nothing was done to it


async def test_resume_is_refused_while_a_live_thinkloop_process_runs_the_run_unless_forced() -> None:
    """The server resumed a run that `thinkloop run` in a terminal was still running (`runs resume`
    refused it): two processes ran one run, the same tool calls, one failing at its next checkpoint."""
    other = await asyncio.create_subprocess_exec(  # stands in for that process: alive, a thinkloop command
        sys.executable, "-c", "import sys; sys.stdin.read()", "thinkloop", "run", stdin=subprocess.PIPE
    )
    try:
        store = crashing(MemoryStore, observed(1), after=True)()
        effects = Effects()
        owner = {"pid": other.pid, "host": socket.gethostname()}
        with pytest.raises(Crash):
            await agent_for(store, effects).run("do the things", run_id="r", metadata={"cli": owner})
        async with api(_app(agent_for(store, effects))) as client:
            refused = await client.post("/api/runs/r/resume", json={})
            assert refused.status_code == 409
            assert refused.json() == {  # the one 409 {"force": true} overrides, marked so for clients
                "error": (
                    f"run 'r' is still running in process {other.pid} on this machine: stop it first (Ctrl-C "
                    f"there, or kill {other.pid} — the run is saved resumable), then resume it; the body "
                    '{"force": true} resumes it anyway (only if that process is not thinkloop running it)'
                ),
                "forceable": True,
            }
            state = await store.load_state("r")
            assert state is not None and not state.finished and state.metadata["cli"] == owner  # untouched
            assert effects.runs == ["fetch:k1"]

            forced = await client.post("/api/runs/r/resume", json={"force": True})
            assert forced.status_code == 202
            assert (await finished(client, "r"))[-1]["result"]["output"] == "all done"
        state = await store.load_state("r")
        assert state is not None and state.metadata["cli"] == {"pid": os.getpid(), "host": owner["host"]}
    finally:
        await other.communicate(b"")


async def test_a_run_started_with_other_options_than_the_servers_is_refused_not_resumed_with_the_servers() -> (
    None
):
    """A strict `thinkloop run --tools shell --workspace sandbox` run, resumed from a balanced server's page,
    ran its next command unapproved in the server's directory."""
    store = crashing(MemoryStore, observed(1), after=True)()
    effects = Effects()
    setup = {"tools": "shell", "workspace": "/srv/sandbox", "safety": "strict", "mcp": [], "hosts": None}
    with pytest.raises(Crash):
        await agent_for(store, effects).run("do the things", run_id="r", metadata={"cli": setup})
    servers = {**setup, "safety": "balanced", "workspace": "/srv"}
    async with api(_app(agent_for(store, effects), run_metadata={"cli": servers})) as client:
        refused = await client.post("/api/runs/r/resume", json={"force": True})
        assert refused.status_code == 409
        error = refused.json()["error"]
        assert error.startswith(
            "run 'r' was started with --safety 'strict' (this server: 'balanced'), --workspace '/srv/sandbox' "
            "(this server: '/srv'): this server would resume it with its own tools and safety"
        )
        assert "thinkloop runs resume r --store" in error
    assert effects.runs == ["fetch:k1"]  # nothing ran again
    async with api(_app(agent_for(store, effects), run_metadata={"cli": dict(setup)})) as client:
        resumed = await client.post("/api/runs/r/resume", json={})  # a server of the run's own options
        assert resumed.status_code == 202
        assert (await finished(client, "r"))[-1]["result"]["output"] == "all done"


async def test_a_run_another_process_saved_meanwhile_is_refused_and_not_forceable() -> None:
    """Another writer saves the run between the server's read and its claim: 409, which forcing cannot change."""

    class RacedStore(crashing(MemoryStore, observed(1), after=True)):  # type: ignore[misc]
        race = False  # armed: the next checkpoint without events (the server's claim) is raced

        async def checkpoint(self, state: RunState, events: Sequence[Event]) -> None:
            if self.race and not events:  # another process appends first
                self.race = False
                logged = await self.read_events(state.run_id)
                await self.append_events(state.run_id, logged[-1:], len(logged))
            await super().checkpoint(state, events)

    store = RacedStore()
    effects = Effects()
    owner = {"pid": os.getpid(), "host": socket.gethostname()}  # recorded, so the server claims the run
    with pytest.raises(Crash):
        await agent_for(store, effects).run("do the things", run_id="r", metadata={"cli": owner})
    logged = len(await store.read_events("r"))
    async with api(_app(agent_for(store, effects))) as client:
        for body in ({}, {"force": True}):
            store.race = True
            refused = await client.post("/api/runs/r/resume", json=body)
            assert refused.status_code == 409
            assert list(refused.json()) == ["error"]  # no "forceable"
            assert "another writer appended first" in refused.json()["error"]
            assert not store.race and len(await store.read_events("r")) > logged
            logged = len(await store.read_events("r"))
        assert (await client.get("/api/runs")).json()["runs"][0]["active"] is False
    assert effects.runs == ["fetch:k1"]


async def _interrupted_run_of_a_dead_process(store: Store, effects: Effects) -> dict[str, Any]:
    """Interrupt run "r" recorded as a thinkloop process's that has exited since: the server may resume it,
    and `thinkloop runs resume` too — until one of them claims it. Returns the recorded owner."""
    gone = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await gone.wait()
    owner = {"pid": gone.pid, "host": socket.gethostname()}
    with pytest.raises(Crash):
        await agent_for(store, effects).run("do the things", run_id="r", metadata={"cli": owner})
    return owner


async def _owner_of(store: Store) -> Any:
    state = await store.load_state("r")
    assert state is not None and not state.finished
    check_not_running("r", state.metadata, force="--force")  # `thinkloop runs resume` would take it
    return state.metadata["cli"]


async def test_a_resume_refused_because_the_server_is_full_leaves_the_run_to_other_processes() -> None:
    """Refused with 429, the run was still recorded as this server's: `thinkloop runs resume` elsewhere
    then refused it as if the server were running it."""
    store = crashing(MemoryStore, observed(1), after=True)()
    effects = Effects()
    owner = await _interrupted_run_of_a_dead_process(store, effects)
    busy = ScriptedModel([{"tool_calls": [{"name": "purge", "args": {"target": "x"}, "id": "c0"}]}, "ok"])
    agent, _ = make_agent(busy, store)
    async with api(_app(agent, max_active_runs=1)) as client:
        waiting = await start(client)
        await waiting_approval(client, waiting)
        for body in ({}, {"force": True}):
            full = await client.post("/api/runs/r/resume", json=body)
            assert full.status_code == 429, full.text
            assert await _owner_of(store) == owner  # not claimed
        await client.post(f"/api/runs/{waiting}/approvals/c0", json={"decision": "deny"})
        await finished(client, waiting)
    async with api(_app(agent_for(store, effects))) as client:  # with room, the server claims it
        assert (await client.post("/api/runs/r/resume", json={})).status_code == 202
        assert (await finished(client, "r"))[-1]["result"]["output"] == "all done"
    state = await store.load_state("r")
    assert state is not None and state.metadata["cli"]["pid"] == os.getpid()


async def test_a_resume_refused_because_the_server_shuts_down_leaves_the_run_unclaimed() -> None:
    store = crashing(MemoryStore, observed(1), after=True)()
    effects = Effects()
    owner = await _interrupted_run_of_a_dead_process(store, effects)
    app = _app(agent_for(store, effects))
    await app.state.manager.shutdown(0)
    async with api(app) as client:
        refused = await client.post("/api/runs/r/resume", json={})
    assert refused.status_code == 503 and "shutting down" in refused.json()["error"]
    assert await _owner_of(store) == owner
    assert effects.runs == ["fetch:k1"]


async def test_a_claim_saved_just_before_the_server_began_to_shut_down_is_taken_back() -> None:
    """The server starts shutting down while it saves its claim on the run: the resume is refused with 503,
    and the claim it saved is taken back."""
    app: Any = None

    class ShutsDownWhileClaimed(crashing(MemoryStore, observed(1), after=True)):  # type: ignore[misc]
        async def checkpoint(self, state: RunState, events: Sequence[Event]) -> None:
            await super().checkpoint(state, events)
            if app is not None and not events and state.metadata["cli"]["pid"] == os.getpid():
                assert (await self.load_state("r")).metadata["cli"]["pid"] == os.getpid()  # type: ignore[union-attr]
                await app.state.manager.shutdown(0)

    store = ShutsDownWhileClaimed()
    effects = Effects()
    owner = await _interrupted_run_of_a_dead_process(store, effects)
    app = _app(agent_for(store, effects))
    async with api(app) as client:
        refused = await client.post("/api/runs/r/resume", json={})
        assert refused.status_code == 503, refused.text
        assert (await client.get("/api/runs")).json()["runs"][0]["active"] is False
    assert await _owner_of(store) == owner
    assert effects.runs == ["fetch:k1"]


async def test_a_resume_whose_run_fails_before_it_starts_takes_its_claim_back() -> None:
    """202, then the resumed run could not start (its MCP server would not): the run stays unfinished, and
    not recorded as the server's (it was, and only `--force` could resume it elsewhere)."""
    from thinkloop.mcp import MCPServerStdio

    store = crashing(MemoryStore, observed(1), after=True)()
    effects = Effects()
    owner = await _interrupted_run_of_a_dead_process(store, effects)
    broken = MCPServerStdio("/nonexistent/mcp-server-of-this-test", [], name="broken")
    app = _app(agent_for(store, effects, mcp_servers=[broken]))
    async with api(app) as client:
        assert (await client.post("/api/runs/r/resume", json={})).status_code == 202
        await eventually(lambda: app.state.manager.active() == [])
        assert app.state.manager.failure("r") is not None
    assert await _owner_of(store) == owner
    assert effects.runs == ["fetch:k1"]


# ============================================================================================ helpers


def _app(agent: Agent, **kwargs: Any) -> Any:
    from thinkloop.server import create_app

    return create_app(agent, **kwargs)


async def _next(ws: Any) -> dict[str, Any]:
    return (await read_until(ws, lambda _: True))[0]


async def _approve_soon(client: httpx.AsyncClient, run_id: str, call_id: str) -> None:
    """Approve a call of a run driven outside the app (its approvals go through the same PendingApprovals)."""
    await waiting_approval(client, run_id)
    await client.post(f"/api/runs/{run_id}/approvals/{call_id}", json={"decision": "approve"})
