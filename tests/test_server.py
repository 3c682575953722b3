"""The server (SPEC §13.2): its HTTP API through httpx, and a real uvicorn server with a real WebSocket client.

Runs use test doubles (`ScriptedModel`, `FunctionModel`) and a `purge` tool of high risk, which the
balanced safety mode puts to a person: the tests answer over HTTP as the web page does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import websockets
from fastapi import FastAPI

from thinkloop import Agent, Budget, ConfigurationError, RiskLevel, tool
from thinkloop.safety import PendingApprovals, SafetyController
from thinkloop.server import create_app
from thinkloop.server._serving import uvicorn_config
from thinkloop.stores import MemoryStore, SQLiteStore, Store
from thinkloop.testing import FunctionModel, Reply, ScriptedModel

HOSTILE = '<img src=x onerror="document.title=\'pwned\'"><script>document.title="pwned"</script>'


class Purges:
    """A risky tool that records what it really did."""

    def __init__(self) -> None:
        self.done: list[str] = []

        @tool(risk=RiskLevel.HIGH)
        def purge(target: str) -> str:
            """Delete everything under a target."""
            self.done.append(target)
            return f"purged {target}"

        self.tool = purge


def purge_then_answer(*targets: str, answer: str = "all done") -> list[Reply]:
    return [
        *(
            {"tool_calls": [{"name": "purge", "args": {"target": t}, "id": f"c{i}"}]}
            for i, t in enumerate(targets)
        ),
        answer,
    ]


def make_agent(model: Any, store: Store | None = None, **kwargs: Any) -> tuple[Agent, Purges]:
    purges = Purges()
    agent = Agent(
        model,
        tools=[purges.tool],
        store=store if store is not None else MemoryStore(),
        safety=SafetyController("balanced", approval=PendingApprovals()),
        budget=kwargs.pop("budget", Budget(max_steps=8)),
        **kwargs,
    )
    return agent, purges


@contextlib.asynccontextmanager
async def api(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://testserver") as client:
        yield client


async def eventually(check: Callable[[], Any], within: float = 5.0) -> Any:
    """Poll `check` (sync or async) until it returns something truthy."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


async def start(client: httpx.AsyncClient, goal: str = "clean up", **body: Any) -> str:
    response = await client.post("/api/runs", json={"goal": goal, **body})
    assert response.status_code == 202, response.text
    run_id: str = response.json()["run_id"]
    assert response.headers["location"] == f"/api/runs/{run_id}"
    return run_id


async def finished(client: httpx.AsyncClient, run_id: str) -> list[dict[str, Any]]:
    """Wait for the run's `done` event; return all its events."""

    async def done() -> list[dict[str, Any]] | None:
        events: list[dict[str, Any]] = (await client.get(f"/api/runs/{run_id}/events")).json()["events"]
        return events if events and events[-1]["type"] == "done" else None

    result: list[dict[str, Any]] = await eventually(done)
    return result


async def waiting_approval(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    async def one() -> dict[str, Any] | None:
        waiting = (await client.get("/api/approvals", params={"run_id": run_id})).json()["approvals"]
        return waiting[0] if waiting else None

    result: dict[str, Any] = await eventually(one)
    return result


# ================================================================================ HTTP API (httpx)


async def test_a_run_started_over_http_ends_with_its_answer_and_every_message_is_stored() -> None:
    store = MemoryStore()
    agent, _ = make_agent(ScriptedModel(["The answer is 42."]), store)
    async with api(create_app(agent)) as client:
        run_id = await start(client, "What is 6*7?")
        events = await finished(client, run_id)
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        assert events[0]["type"] == "run_started" and events[-1]["result"]["output"] == "The answer is 42."

        run = (await client.get(f"/api/runs/{run_id}")).json()
        assert run["run"]["status"] == "done" and run["run"]["stop_reason"] == "final_answer"
        assert run["run"]["active"] is False and run["approvals"] == []
        messages = [(m["role"], m["content"]) for m in run["state"]["messages"]]
        assert messages == [("user", "What is 6*7?"), ("assistant", "The answer is 42.")]

        listed = (await client.get("/api/runs")).json()["runs"]
        assert [r["run_id"] for r in listed] == [run_id]
        assert (await client.get("/api/runs", params={"status": "running"})).json()["runs"] == []
        later = (await client.get(f"/api/runs/{run_id}/events", params={"after": 2})).json()
        assert [e["seq"] for e in later["events"]] == [e["seq"] for e in events[2:]]
        assert later["last_seq"] == events[-1]["seq"]
    stored = await store.read_events(run_id)
    assert [e.type for e in stored] == [e["type"] for e in events]


async def test_a_call_whose_id_holds_a_slash_can_be_approved() -> None:
    """Call ids are the model's: `call/1`, sent as `call%2F1` by the page, did not match the route (404) and
    the call waited out the approval timeout."""
    calls = iter([{"tool_calls": [{"id": "call/1", "name": "purge", "args": {"target": "x"}}]}, "purged"])
    agent, purges = make_agent(FunctionModel(lambda request: next(calls)))
    async with api(create_app(agent)) as client:
        run_id = await start(client)
        waiting = await waiting_approval(client, run_id)
        assert waiting["call"]["id"] == "call/1"
        answer = await client.post(f"/api/runs/{run_id}/approvals/call%2F1", json={"decision": "approve"})
        assert answer.status_code == 200, answer.text
        events = await finished(client, run_id)
    assert events[-1]["result"]["output"] == "purged" and purges.done == ["x"]


async def test_a_request_may_lower_the_agents_limits_and_use_a_session() -> None:
    store = MemoryStore()
    model = FunctionModel(lambda request: {"tool_calls": [{"name": "purge", "args": {"target": "x"}}]})
    agent, _ = make_agent(model, store, final_answer_on_stop=False)
    async with api(create_app(agent)) as client:
        run_id = await start(client, max_steps=1, session="alice")
        waiting = await waiting_approval(client, run_id)
        await client.post(f"/api/runs/{run_id}/approvals/{waiting['call']['id']}", json={"decision": "deny"})
        events = await finished(client, run_id)
        assert events[-1]["result"]["stop_reason"] == "max_steps"
        state = (await client.get(f"/api/runs/{run_id}")).json()["state"]
        assert state["budget"]["max_steps"] == 1 and state["session"] == "alice"
        assert (await client.get("/api/runs", params={"session": "alice"})).json()["runs"][0][
            "run_id"
        ] == run_id
        assert (await client.get("/api/runs", params={"session": "bob"})).json()["runs"] == []


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"goal": ""}, "goal: the goal must not be empty"),
        ({"goal": "   \n"}, "goal: the goal must not be empty"),
        ({}, "goal: Field required"),
        ({"goal": "x", "max_steps": 0}, "max_steps: Input should be greater than or equal to 1"),
        ({"goal": "x", "max_steps": 9}, "max_steps: 9 is above the server's limit of 8"),
        ({"goal": "x", "timeout": -1}, "timeout: Input should be greater than 0"),
        ({"goal": "x", "session": "../etc"}, "session: invalid session id '../etc'"),
        ({"goal": "x", "colour": "red"}, "colour: Extra inputs are not permitted"),
        ({"goal": 42}, "goal: Input should be a valid string"),
        ({"goal": "x", "max_steps": "3"}, "max_steps: Input should be a valid integer"),
        ({"goal": "x", "max_steps": True}, "max_steps: Input should be a valid integer"),
        ({"goal": "x", "max_steps": 2.5}, "max_steps: Input should be a valid integer"),
        ({"goal": "x", "max_cost": "0.5"}, "max_cost: Input should be a valid number"),
        ({"goal": "x", "session": 7}, "session: Input should be a valid string"),
        # PostgreSQL text cannot hold a NUL: refused here as by `thinkloop submit` (it was 202, then the run
        # had a goal no job queue could take)
        (
            {"goal": "go\x00al"},
            "goal: the goal holds a NUL character (\\x00) at character 3 of 5, which a goal cannot hold "
            "(PostgreSQL text cannot store it): remove it from the goal",
        ),
        ({"goal": "x", "session": "a\x00b"}, "session: invalid session id 'a\\x00b'"),
    ],
)
async def test_bad_run_requests_are_422_with_a_clear_message(body: dict[str, Any], problem: str) -> None:
    agent, _ = make_agent(ScriptedModel([]))
    app = create_app(agent)
    async with api(app) as client:
        response = await client.post("/api/runs", json=body)
        assert response.status_code == 422
        assert problem in response.json()["error"]
        assert (await client.get("/api/runs")).json()["runs"] == []
    assert app.state.manager.active() == []


@pytest.mark.parametrize("body", [b'{"goal": "x", "max_cost": Infinity}', b'{"goal": "x", "timeout": NaN}'])
async def test_limits_must_be_finite_numbers(body: bytes) -> None:
    agent, _ = make_agent(ScriptedModel([]))
    app = create_app(agent)
    async with api(app) as client:
        response = await client.post("/api/runs", content=body, headers={"content-type": "application/json"})
        assert response.status_code == 422 and "Input should be a finite number" in response.json()["error"]
    assert app.state.manager.active() == []


async def test_non_json_bodies_are_refused() -> None:
    agent, _ = make_agent(ScriptedModel([]))
    async with api(create_app(agent)) as client:
        no_type = await client.post("/api/runs", content=b'{"goal": "x"}')
        assert no_type.status_code == 415 and "application/json" in no_type.json()["error"]
        form = await client.post("/api/runs", data={"goal": "x"})
        assert form.status_code == 415
        text = await client.post(
            "/api/runs/r/approvals/c", content=b"{}", headers={"content-type": "text/plain"}
        )
        assert text.status_code == 415
        assert (await client.get("/api/runs")).json()["runs"] == []


@pytest.mark.parametrize(
    ("body", "status", "problem"),
    [
        (b'{"goal": ', 400, "the body is not valid JSON: Expecting value at line 1, column 10 (char 9)"),
        (b'{"goal": "caf\xe9"}', 400, "the body is not UTF-8: byte 0xe9 at position 13"),
        (b"[" * 100_000 + b"]" * 100_000, 400, "nested too deeply"),
        (b'["clean up"]', 422, "body: the body must be a JSON object"),
        (b"", 422, "body: the body is missing"),
        (json.dumps({"goal": "x" * 10_000_000}).encode(), 413, "larger than 2097152 bytes"),
        (b'{"goal": "x", "max_steps": ' + b"9" * 5000 + b"}", 400, "the body has a number too long to read"),
    ],
)
async def test_bodies_that_are_not_a_json_object_get_a_clear_4xx(
    body: bytes, status: int, problem: str
) -> None:
    agent, _ = make_agent(ScriptedModel([]))
    app = create_app(agent)
    async with api(app) as client:
        response = await client.post("/api/runs", content=body, headers={"content-type": "application/json"})
        assert response.status_code == status and problem in response.json()["error"], response.text
    assert app.state.manager.active() == []


async def test_an_endless_chunked_body_is_cut_at_the_limit_and_the_longest_goal_still_fits() -> None:
    agent, _ = make_agent(ScriptedModel(["ok"] * 2))
    sent: list[int] = []

    async def endless() -> AsyncIterator[bytes]:
        while True:
            sent.append(1)
            yield b"x" * 65_536

    async with api(create_app(agent)) as client:
        async with asyncio.timeout(30):  # reading it to its end would never return
            cut = await client.post(
                "/api/runs", content=endless(), headers={"content-type": "application/json"}
            )
        assert cut.status_code == 413 and len(sent) <= 2_097_152 // 65_536 + 2  # not read to the end
        longest = json.dumps({"goal": "\U0001f600" * 100_000})  # 12 bytes a character, \u-escaped
        assert len(longest) > 1_000_000
        response = await client.post(
            "/api/runs", content=longest, headers={"content-type": "application/json"}
        )
        assert response.status_code == 202, response.text
        await finished(client, response.json()["run_id"])


async def test_unknown_runs_are_404() -> None:
    agent, _ = make_agent(ScriptedModel([]))
    async with api(create_app(agent)) as client:
        for method, path, body in [
            ("GET", "/api/runs/nope", None),
            ("GET", "/api/runs/nope/events", None),
            ("GET", "/api/runs/..%2F..%2Fetc/events", None),
            ("POST", "/api/runs/nope/cancel", {}),
            ("POST", "/api/runs/nope/approvals/c0", {"decision": "approve"}),
            ("GET", "/api/nothing-here", None),
            ("GET", "/static/../_app.py", None),
        ]:
            response = await client.request(method, path, json=body)
            assert response.status_code == 404, (path, response.text)
            assert isinstance(response.json()["error"], str)
        bad = await client.post("/api/runs/nope/approvals/c0", json={"decision": "maybe"})
        assert bad.status_code == 422 and "decision" in bad.json()["error"]


async def test_a_long_id_in_a_path_is_not_echoed_whole() -> None:
    agent, _ = make_agent(ScriptedModel(purge_then_answer("x")))
    async with api(create_app(agent)) as client:
        run_id = await start(client)
        await waiting_approval(client, run_id)
        for method, path in [
            ("GET", f"/api/runs/{'a' * 10_000}"),
            ("POST", f"/api/runs/{'a' * 10_000}/cancel"),
            ("POST", f"/api/runs/{run_id}/approvals/{'c' * 10_000}"),
            ("GET", f"/static/{'s' * 10_000}"),
        ]:
            response = await client.request(method, path, json={"decision": "approve"})
            assert response.status_code == 404, response.text
            error = response.json()["error"]
            assert len(error) < 300 and "… (10000 characters)" in error, error
        await client.post(f"/api/runs/{run_id}/cancel", json={})
        await finished(client, run_id)


async def test_an_after_too_large_for_the_store_is_422_not_a_500(tmp_path: Path) -> None:
    """SQLite holds 64-bit integers: `?after=` with 30 digits overflowed in the store (500)."""
    agent, _ = make_agent(ScriptedModel(["ok"]), store=SQLiteStore(tmp_path / "runs.db"))
    async with api(create_app(agent)) as client:
        run_id = await start(client)
        await finished(client, run_id)
        for path in (f"/api/runs/{run_id}/events", "/api/runs/nope/events"):
            response = await client.get(path, params={"after": "9" * 30})
            assert response.status_code == 422, response.text
            assert "after" in response.json()["error"]
        largest = await client.get(f"/api/runs/{run_id}/events", params={"after": 10**18 - 1})
        assert largest.status_code == 200 and largest.json()["events"] == []
    await agent.store.aclose()


@pytest.fixture
def pg_dsn() -> Iterator[str]:
    from conftest import private_schema

    yield from private_schema("tl_server")


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_a_bad_id_in_a_query_is_422_whatever_the_store(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """`?session=%00` went to the store as it came: a PostgresStore failed on the NUL (500, "check that the
    server is running"), SQLite answered 200."""
    from thinkloop.stores import PostgresStore

    store: Store = {
        "memory": lambda: MemoryStore(),
        "sqlite": lambda: SQLiteStore(tmp_path / "runs.db"),
        "postgres": lambda: PostgresStore(request.getfixturevalue("pg_dsn")),
    }[kind]()
    agent, _ = make_agent(ScriptedModel(["ok"]), store)
    try:
        async with api(create_app(agent)) as client:
            run_id = await start(client, session="alice")
            await finished(client, run_id)
            for path, where, what in [
                ("/api/runs?session=%00", "query.session", "invalid session id '\\x00'"),
                ("/api/runs?session=a%00b", "query.session", "invalid session id 'a\\x00b'"),
                ("/api/runs?session=%FF", "query.session", "invalid session id '\ufffd'"),
                ("/api/runs?session=..", "query.session", "invalid session id '..'"),
                ("/api/runs?session=", "query.session", "invalid session id ''"),
                ("/api/runs?session=" + "a" * 5000, "query.session", "… (5,000 characters)"),
                ("/api/approvals?run_id=%00", "query.run_id", "invalid run id '\\x00'"),
                ("/api/approvals?run_id=..%2Fx", "query.run_id", "invalid run id '../x'"),
            ]:
                response = await client.get(path)
                assert response.status_code == 422, (path, response.text)
                body = response.json()
                assert [d["where"] for d in body["details"]] == [where], path
                assert what in body["error"] and len(body["error"]) < 400, body["error"]
            listed = (await client.get("/api/runs", params={"session": "alice"})).json()["runs"]
            assert [r["run_id"] for r in listed] == [run_id]
            assert (await client.get("/api/approvals", params={"run_id": run_id})).json() == {"approvals": []}
    finally:
        await store.aclose()


async def test_a_body_of_many_unknown_fields_is_refused_with_a_short_answer() -> None:
    """2 MB of distinct unknown keys (238,000 of them) was answered with a 422 of 23 MB naming each one,
    built while the event loop served nothing else."""
    max_fields, max_problems = 32, 10  # the most fields a body may have; the most problems a 422 shows
    agent, _ = make_agent(ScriptedModel([]))
    app = create_app(agent)
    headers = {"content-type": "application/json"}
    keys = [f"k{i}" for i in range(150_000)]
    body = ("{" + ",".join(f'"{k}":0' for k in keys) + "}").encode()
    assert 1_000_000 < len(body) < 2_097_152
    async with api(app) as client:
        for path in ("/api/runs", "/api/runs/r/resume", "/api/runs/r/approvals/c0"):
            response = await client.post(path, content=body, headers=headers)
            assert response.status_code == 422, response.text[:300]
            assert len(response.content) < 1_000
            assert response.json() == {
                "error": "invalid request: body: the body has 150,000 fields, more than the 32 any request of "
                "this server takes: send only the fields of the request (GET /openapi.json describes them)",
                "details": [
                    {
                        "where": "",
                        "problem": "the body has 150,000 fields, more than the 32 any request of this server "
                        "takes: send only the fields of the request (GET /openapi.json describes them)",
                    }
                ],
            }

        # as many as a body may have: each unknown one an error, of which the first 10 are shown
        fields = {"goal": "x", **{f"colour{i}": i for i in range(max_fields - 1)}}
        response = await client.post("/api/runs", json=fields)
        assert response.status_code == 422
        answer = response.json()
        assert len(answer["details"]) == max_problems
        assert answer["details"][0] == {"where": "colour0", "problem": "Extra inputs are not permitted"}
        assert answer["error"].endswith(
            f"colour9: Extra inputs are not permitted; and {max_fields - 11} more"
        )
        assert answer["error"].count("Extra inputs are not permitted") == max_problems
        assert (await client.post("/api/runs", json={**fields, "one_more": 1})).json()["details"] == [
            {
                "where": "",
                "problem": f"the body has {max_fields + 1} fields, more than the 32 any request of this server "
                "takes: send only the fields of the request (GET /openapi.json describes them)",
            }
        ]

        # a name of a megabyte, or a limit of 4,000 digits, is not echoed whole
        long_key = await client.post("/api/runs", json={"goal": "x", "k" * 1_000_000: 0})
        assert long_key.status_code == 422 and len(long_key.content) < 1_000
        assert long_key.json()["details"] == [
            {"where": "k" * 80 + "… (1000000 characters)", "problem": "Extra inputs are not permitted"}
        ]
        big = await client.post(
            "/api/runs", content=b'{"goal": "x", "max_steps": ' + b"9" * 4000 + b"}", headers=headers
        )
        assert big.status_code == 422 and len(big.content) < 500, big.text[:300]
        assert "max_steps: 9999" in big.json()["error"] and "(4000 characters)" in big.json()["error"]
    assert app.state.manager.active() == []


async def test_unknown_paths_and_methods_say_what_exists() -> None:
    agent, _ = make_agent(ScriptedModel([]))
    async with api(create_app(agent)) as client:
        missing = await client.get("/api/nothing-here")
        assert missing.status_code == 404
        assert missing.json()["error"] == (
            "no such path: GET /api/nothing-here (the API is under /api/, described by GET /openapi.json)"
        )
        wrong = await client.delete("/api/runs")
        assert wrong.status_code == 405 and wrong.headers["allow"] == "GET, POST"
        assert wrong.json()["error"] == "DELETE /api/runs is not allowed: this path takes GET, POST"
        assert (await client.get("/api/runs/r/cancel")).json()["error"].endswith("this path takes POST")
        head = await client.head("/")
        assert head.status_code == 200 and head.headers["content-type"].startswith("text/html")


async def test_approve_over_http_runs_the_call() -> None:
    agent, purges = make_agent(ScriptedModel(purge_then_answer("/tmp/cache")))
    async with api(create_app(agent)) as client:
        run_id = await start(client)
        waiting = await waiting_approval(client, run_id)
        assert (
            waiting["tool"] == "purge"
            and waiting["risk"] == "high"
            and waiting["arguments"] == {"target": "/tmp/cache"}
        )
        assert purges.done == []
        run = (await client.get(f"/api/runs/{run_id}")).json()
        assert run["run"]["active"] is True and [a["call"]["id"] for a in run["approvals"]] == ["c0"]

        answer = await client.post(f"/api/runs/{run_id}/approvals/c0", json={"decision": "approve"})
        assert answer.status_code == 200 and answer.json()["decision"] == "approve"
        events = await finished(client, run_id)
    assert purges.done == ["/tmp/cache"]
    call = next(e for e in events if e["type"] == "tool_call")
    assert call["decision"] == "approved" and call["risk"] == "high"
    assert events[-1]["result"]["output"] == "all done"


async def test_deny_over_http_tells_the_model_and_runs_nothing() -> None:
    agent, purges = make_agent(ScriptedModel(purge_then_answer("/", answer="I did not purge.")))
    async with api(create_app(agent)) as client:
        run_id = await start(client)
        await waiting_approval(client, run_id)
        body = {"decision": "deny", "message": "never the root"}
        assert (await client.post(f"/api/runs/{run_id}/approvals/c0", json=body)).status_code == 200
        again = await client.post(f"/api/runs/{run_id}/approvals/c0", json={"decision": "approve"})
        assert again.status_code == 409 and "is not waiting for an answer" in again.json()["error"]
        events = await finished(client, run_id)
    assert purges.done == []
    result = next(e for e in events if e["type"] == "tool_result")
    assert (
        result["success"] is False and result["decision"] == "denied" and "never the root" in result["output"]
    )


async def answer(client: httpx.AsyncClient, run_id: str, call_id: str, decision: str) -> httpx.Response:
    return await client.post(f"/api/runs/{run_id}/approvals/{call_id}", json={"decision": decision})


async def test_an_answer_to_a_call_that_is_not_waiting_says_what_became_of_it() -> None:
    """Answered twice, for a call that never asked, after the run stopped: each was 404 'has no tool call
    waiting for approval (answered already?)' — the client could not tell a typo from a late answer."""
    agent, purges = make_agent(ScriptedModel(purge_then_answer("a", "b")))
    app = create_app(agent)
    async with api(app) as client:
        run_id = await start(client)
        await waiting_approval(client, run_id)
        assert (await answer(client, run_id, "c0", "approve")).status_code == 200
        await eventually(lambda: purges.done == ["a"])
        twice = await answer(client, run_id, "c0", "deny")
        assert twice.status_code == 409
        assert twice.json()["error"] == (
            f"tool call 'c0' of run '{run_id}' is not waiting for an answer: it was answered already (approved)"
        )
        unknown = await answer(client, run_id, "nope", "approve")
        assert unknown.status_code == 404
        assert unknown.json()["error"] == (
            f"run '{run_id}' has no tool call 'nope' that asked for approval: GET /api/approvals?run_id="
            f"{run_id} lists the calls waiting for an answer"
        )
        await waiting_approval(client, run_id)
        assert (await client.post(f"/api/runs/{run_id}/cancel", json={})).status_code == 202
        await finished(client, run_id)
        await eventually(lambda: app.state.manager.active() == [])
        late = await answer(client, run_id, "c1", "approve")
        assert late.status_code == 409
        assert late.json()["error"] == (
            f"tool call 'c1' of run '{run_id}' is not waiting for an answer: the run ended (cancelled) before "
            "it was answered"
        )
        assert (await answer(client, "no-such-run", "c0", "approve")).json()[
            "error"
        ] == "no run 'no-such-run'"
    assert purges.done == ["a"]


async def test_an_answer_after_the_approval_timed_out_says_so() -> None:
    agent, purges = make_agent(ScriptedModel(purge_then_answer("a")))
    agent.safety = SafetyController("balanced", approval=PendingApprovals(), approval_timeout=0.01)
    async with api(create_app(agent)) as client:
        run_id = await start(client)
        events = await finished(client, run_id)
        assert [e["decision"] for e in events if e["type"] == "tool_call"] == ["timeout"]
        late = await answer(client, run_id, "c0", "approve")
    assert late.status_code == 409
    assert late.json()["error"] == (
        f"tool call 'c0' of run '{run_id}' is not waiting for an answer: no answer came within the approval "
        "timeout, so it was denied (it did not run)"
    )
    assert purges.done == []


async def test_an_answer_to_a_call_of_an_interrupted_run_says_to_resume_it(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    agent, purges = make_agent(ScriptedModel(purge_then_answer("a")), store)
    async with serve(create_app(agent)) as served, httpx.AsyncClient(base_url=served.url) as client:
        run_id = await start(client)
        await waiting_approval(client, run_id)
    # the server stopped while the call waited (the run interrupted, saved); a new one answers for it
    agent, purges = make_agent(ScriptedModel(purge_then_answer("a")), store)
    async with api(create_app(agent)) as client:
        late = await answer(client, run_id, "c0", "approve")
    assert late.status_code == 409
    assert late.json()["error"] == (
        f"tool call 'c0' of run '{run_id}' is not waiting for an answer: the run is not running in this "
        f"server (it stopped while the call waited): resume it (POST /api/runs/{run_id}/resume), and the call "
        "is asked again"
    )
    assert purges.done == []
    await store.aclose()


async def test_approve_always_covers_the_rest_of_the_run() -> None:
    agent, purges = make_agent(ScriptedModel(purge_then_answer("a", "b")))
    async with api(create_app(agent)) as client:
        run_id = await start(client)
        await waiting_approval(client, run_id)
        await client.post(f"/api/runs/{run_id}/approvals/c0", json={"decision": "approve_always"})
        events = await finished(client, run_id)
    assert purges.done == ["a", "b"]
    assert [e["decision"] for e in events if e["type"] == "tool_call"] == [
        "approved_always",
        "approved_always",
    ]


async def test_cancel_a_run_waiting_for_approval() -> None:
    store = MemoryStore()
    agent, purges = make_agent(ScriptedModel(purge_then_answer("x")), store)
    app = create_app(agent)
    async with api(app) as client:
        run_id = await start(client)
        await waiting_approval(client, run_id)
        response = await client.post(f"/api/runs/{run_id}/cancel", json={})
        assert response.status_code == 202 and response.json() == {"run_id": run_id, "status": "cancelling"}
        events = await finished(client, run_id)
        assert events[-1]["result"]["stop_reason"] == "cancelled"
        await eventually(lambda: app.state.manager.active() == [])
        assert (await client.get("/api/approvals")).json()["approvals"] == []
        again = await client.post(f"/api/runs/{run_id}/cancel", json={})
        assert again.status_code == 409 and "not running" in again.json()["error"]
    state = await store.load_state(run_id)
    assert state is not None and state.stop_reason is not None and state.stop_reason.value == "cancelled"
    assert purges.done == []


async def test_cancel_right_after_start_still_saves_a_cancelled_run() -> None:
    store = MemoryStore()
    agent, _ = make_agent(ScriptedModel(["never said"], latency=0.5), store)
    async with api(create_app(agent)) as client:
        response = await client.post("/api/runs", json={"goal": "x"})
        run_id = response.json()["run_id"]
        assert (
            await client.post(f"/api/runs/{run_id}/cancel", json={})
        ).status_code == 202  # before its task ran
        events = await finished(client, run_id)
    assert events[-1]["result"]["stop_reason"] == "cancelled"
    assert (await store.load_state(run_id)).phase == "error"  # type: ignore[union-attr]
    assert [e.type for e in await store.read_events(run_id)][-1] == "done"


async def test_too_many_runs_are_429() -> None:
    agent, _ = make_agent(ScriptedModel(purge_then_answer("x")))
    app = create_app(agent, max_active_runs=1)
    async with api(app) as client:
        run_id = await start(client)
        busy = await client.post("/api/runs", json={"goal": "another"})
        assert busy.status_code == 429 and "limit" in busy.json()["error"]
        await client.post(f"/api/runs/{run_id}/cancel", json={})
        await finished(client, run_id)


async def test_a_run_just_started_is_listed_before_the_store_has_it() -> None:
    agent, _ = make_agent(ScriptedModel(["hi"]))
    async with api(create_app(agent)) as client:
        run_id = await start(client, "greet")  # its task has not run yet: nothing is stored
        listed = (await client.get("/api/runs")).json()["runs"]
        assert [(r["run_id"], r["goal"], r["active"]) for r in listed] == [(run_id, "greet", True)]
        run = (await client.get(f"/api/runs/{run_id}")).json()
        assert run["run"]["status"] == "running" and run["state"] is None
        await finished(client, run_id)


async def test_shutdown_interrupts_running_runs_and_leaves_them_resumable() -> None:
    store = MemoryStore()
    agent, _ = make_agent(ScriptedModel(purge_then_answer("x")), store)
    app = create_app(agent)
    async with api(app) as client:
        run_id = await start(client)
        await waiting_approval(client, run_id)
    await app.state.manager.shutdown()
    state = await store.load_state(run_id)
    assert state is not None and not state.finished and state.stop_reason is None
    assert state.metadata["interrupted"]["step"] == 1  # saved while its call waited for approval
    assert [e.status for e in state.ledger.values()] == ["planned"]  # never ran: asked again on resume
    assert app.state.manager.active() == []


async def test_a_run_accepted_just_before_shutdown_is_saved_resumable_and_no_more_runs_start() -> None:
    store = MemoryStore()
    agent, purges = make_agent(ScriptedModel(purge_then_answer("x"), by_turn=True), store)
    app = create_app(agent)
    async with api(app) as client:
        run_id = await start(client)  # its task has not run yet: it cannot be interrupted so far
        await app.state.manager.shutdown()
        refused = await client.post("/api/runs", json={"goal": "another"})
        assert refused.status_code == 503 and "shutting down" in refused.json()["error"]
        assert (await client.post(f"/api/runs/{run_id}/resume", json={})).status_code == 503
    state = await store.load_state(run_id)
    assert state is not None and not state.finished and "interrupted" in state.metadata  # not lost
    async with api(create_app(agent)) as client:  # the next server resumes it
        assert (await client.post(f"/api/runs/{run_id}/resume", json={})).status_code == 202
        call = await waiting_approval(client, run_id)
        await client.post(f"/api/runs/{run_id}/approvals/{call['call']['id']}", json={"decision": "approve"})
        assert (await finished(client, run_id))[-1]["result"]["output"] == "all done"
    assert purges.done == ["x"]


async def test_a_run_failing_outside_its_loop_ends_its_followers() -> None:
    class BrokenStore(MemoryStore):
        async def checkpoint(self, state: Any, events: Any) -> None:
            raise OSError("disk full")

    agent, _ = make_agent(ScriptedModel(["hi"]), BrokenStore())
    app = create_app(agent)
    manager = app.state.manager
    live = manager.start("x")
    with pytest.raises(Exception, match="disk full"):
        async for _ in manager.follow(live.run_id):
            pass
    assert manager.active() == []


async def test_a_follower_that_falls_behind_is_dropped_and_the_run_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import thinkloop.server._runs as runs_module

    monkeypatch.setattr(runs_module, "MAX_QUEUED", 3)
    agent, purges = make_agent(ScriptedModel(purge_then_answer("x")))
    app = create_app(agent)
    manager = app.state.manager
    live = manager.start("x")
    stream = manager.follow(live.run_id)
    assert (await anext(stream)).type == "run_started"  # then it reads nothing while the run goes on
    await eventually(lambda: app.state.approvals.pending(live.run_id))
    app.state.approvals.resolve(live.run_id, "c0", True)
    await eventually(lambda: manager.active() == [])
    received = []
    with pytest.raises(runs_module.FollowerTooSlowError):
        async for event in stream:
            received.append(event.type)
    assert received == ["progress", "model_call"]  # 3 events queued with run_started: the 4th dropped it
    assert purges.done == ["x"]
    assert (await agent.store.read_events(live.run_id))[-1].type == "done"  # type: ignore[union-attr]


async def test_info_page_and_security_headers() -> None:
    agent, _ = make_agent(ScriptedModel([]))
    async with api(create_app(agent)) as client:
        info = (await client.get("/api/info")).json()
        assert info["tools"] == ["purge"] and info["safety"] == "balanced" and info["approvals"] is True
        assert info["budget"]["max_steps"] == 8
        page = await client.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert '<script src="/static/app.js"' in page.text and "<script>" not in page.text
        script = await client.get("/static/app.js")
        assert script.headers["content-type"].startswith("text/javascript")
    # run text reaches the page only as text nodes: no HTML parsing sink anywhere in the script
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in script.text


async def test_hostile_tool_output_is_served_as_json_text() -> None:
    @tool
    def fetch_page() -> str:
        """Fetch a page."""
        return HOSTILE

    model = ScriptedModel([{"tool_calls": [{"name": "fetch_page", "args": {}}]}, HOSTILE])
    agent = Agent(model, tools=[fetch_page], store=MemoryStore())
    async with api(create_app(agent)) as client:
        run_id = await start(client)
        events = await finished(client, run_id)
        response = await client.get(f"/api/runs/{run_id}/events")
    assert response.headers["content-type"] == "application/json"
    assert next(e for e in events if e["type"] == "tool_result")["output"] == HOSTILE
    assert events[-1]["result"]["output"] == HOSTILE


async def test_allowed_hosts_stop_dns_rebinding() -> None:
    agent, _ = make_agent(ScriptedModel([]))
    app = create_app(agent, allowed_hosts=["127.0.0.1", "localhost", "[::1]", "*.example.org"])
    async with api(app) as client:
        refused = await client.get("/api/info", headers={"host": "evil.example"})
        assert refused.status_code == 400 and refused.headers["content-type"] == "application/json"
        assert refused.json() == {
            "error": "the Host header 'evil.example' is not one this server answers to: use one of 127.0.0.1, "
            "localhost, [::1], *.example.org (`create_app(allowed_hosts=…)`; `thinkloop serve` allows the host "
            "it listens on)"
        }
        for host in ("localhost:8765", "[::1]:8765", "[::1]", "api.example.org", "127.0.0.1"):
            assert (await client.get("/api/info", headers={"host": host})).status_code == 200, host
        for host in ("example.org.evil", "[::2]:8765", "localhost.evil:80"):
            assert (await client.get("/api/info", headers={"host": host})).status_code == 400, host


def test_the_server_needs_a_store_with_an_event_log() -> None:
    with pytest.raises(ConfigurationError, match="event log"):
        create_app(Agent(ScriptedModel([])))  # the default in-process store keeps no events
    with pytest.raises(ConfigurationError, match="max_active_runs"):
        create_app(Agent(ScriptedModel([]), store=MemoryStore()), max_active_runs=0)


# ======================================================================== a real server (uvicorn)


class Served:
    def __init__(self, app: FastAPI, server: uvicorn.Server, port: int) -> None:
        self.app = app
        self.server = server
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.ws = f"ws://127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def serve(app: Any, port: int = 0, **config: Any) -> AsyncIterator[Served]:
    """Run `app` on uvicorn on 127.0.0.1 (`port`, else a free one) in this event loop, configured as
    `thinkloop serve` runs it (`config`: `uvicorn_config`'s timeouts); stop it gracefully at the end."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    server = uvicorn.Server(uvicorn_config(app, **config))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await eventually(lambda: server.started or task.done())
        if task.done():
            task.result()
        yield Served(app, server, sock.getsockname()[1])
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 15)
        sock.close()


async def read_until(socket_: Any, stop: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    events = []
    while True:
        event = json.loads(await asyncio.wait_for(socket_.recv(), 5))
        events.append(event)
        if stop(event):
            return events


async def test_websocket_streams_a_run_to_done_and_approvals_are_answered_over_http() -> None:
    store = MemoryStore()
    agent, purges = make_agent(ScriptedModel(purge_then_answer("a", "b", answer="a purged, b kept")), store)
    async with serve(create_app(agent)) as served, httpx.AsyncClient(base_url=served.url) as client:
        run_id = await start(client)
        async with websockets.connect(f"{served.ws}/api/runs/{run_id}/events") as ws:
            first = await read_until(ws, lambda e: e["type"] == "approval_requested")
            await client.post(f"/api/runs/{run_id}/approvals/c0", json={"decision": "approve"})
            second = await read_until(ws, lambda e: e["type"] == "approval_requested")
            await client.post(f"/api/runs/{run_id}/approvals/c1", json={"decision": "deny"})
            rest = await read_until(ws, lambda e: e["type"] == "done")
            with pytest.raises(websockets.ConnectionClosedOK):
                await asyncio.wait_for(ws.recv(), 5)  # the stream ends after `done`
            assert ws.close_code == 1000
    events = first + second + rest
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["result"]["output"] == "a purged, b kept"
    assert purges.done == ["a"]
    assert [e["decision"] for e in events if e["type"] == "tool_call"] == ["approved", "denied"]
    assert [e.model_dump(mode="json") for e in await store.read_events(run_id)] == events


async def test_reconnecting_with_after_gives_no_gaps_or_duplicates() -> None:
    agent, _ = make_agent(ScriptedModel(purge_then_answer("a", "b", "c")))
    async with serve(create_app(agent)) as served, httpx.AsyncClient(base_url=served.url) as client:
        run_id = await start(client)
        seen: list[dict[str, Any]] = []
        for call_id in ("c0", "c1", "c2"):
            after = seen[-1]["seq"] if seen else 0
            async with websockets.connect(f"{served.ws}/api/runs/{run_id}/events?after={after}") as ws:
                seen += await read_until(ws, lambda e: e["type"] == "approval_requested")
            # the client is gone: the run goes on, and events happen while nobody listens
            await client.post(f"/api/runs/{run_id}/approvals/{call_id}", json={"decision": "approve"})
        async with websockets.connect(f"{served.ws}/api/runs/{run_id}/events?after={seen[-1]['seq']}") as ws:
            seen += await read_until(ws, lambda e: e["type"] == "done")
        # after the run ended, a late follower replays it from the store
        async with websockets.connect(f"{served.ws}/api/runs/{run_id}/events?after=5") as ws:
            replay = await read_until(ws, lambda e: e["type"] == "done")
    assert [e["seq"] for e in seen] == list(range(1, len(seen) + 1))
    assert replay == seen[5:]


async def test_many_followers_see_the_same_events_live() -> None:
    async def slow(request: Any) -> Reply:
        await asyncio.sleep(0.05)
        return (
            "done"
            if request.turn >= 3
            else {"tool_calls": [{"name": "note", "args": {"text": str(request.turn)}}]}
        )

    @tool
    def note(text: str) -> str:
        """Note something."""
        return f"noted {text}"

    agent = Agent(FunctionModel(slow), tools=[note], store=MemoryStore())
    async with serve(create_app(agent)) as served, httpx.AsyncClient(base_url=served.url) as client:
        run_id = await start(client)

        async def follow(after: int) -> list[dict[str, Any]]:
            async with websockets.connect(f"{served.ws}/api/runs/{run_id}/events?after={after}") as ws:
                return await read_until(ws, lambda e: e["type"] == "done")

        streams = await asyncio.gather(follow(0), follow(0), follow(3))
    assert streams[0] == streams[1] and streams[2] == streams[0][3:]
    assert [e["seq"] for e in streams[0]] == list(range(1, len(streams[0]) + 1))


async def test_websocket_refuses_unknown_runs_and_other_sites() -> None:
    agent, _ = make_agent(ScriptedModel(["ok"]))
    async with serve(create_app(agent)) as served, httpx.AsyncClient(base_url=served.url) as client:
        for unknown in ("nope", "..%2Fnope", "a%2Fb%2Fc"):  # a slash in the id: still "no such run"
            async with websockets.connect(f"{served.ws}/api/runs/{unknown}/events") as ws:
                with pytest.raises(websockets.ConnectionClosed):
                    await asyncio.wait_for(ws.recv(), 5)
                assert ws.close_code == 4404 and ws.close_reason == "no such run", unknown
        run_id = await start(client)
        with pytest.raises(websockets.InvalidStatus):
            await websockets.connect(
                f"{served.ws}/api/runs/{run_id}/events", origin=websockets.Origin("http://evil.example")
            )
        same = websockets.Origin(served.url)
        async with websockets.connect(f"{served.ws}/api/runs/{run_id}/events", origin=same) as ws:
            assert (await read_until(ws, lambda e: e["type"] == "done"))[-1]["result"]["output"] == "ok"


class FailingStore(MemoryStore):
    """A store whose reads fail as a broken database would."""

    async def load_state(self, run_id: str) -> Any:
        raise OSError("database disk image is malformed")

    async def list_runs(self, *args: Any, **kwargs: Any) -> Any:
        raise OSError("database disk image is malformed")


async def test_a_failing_store_is_a_json_500_over_http_and_a_1011_close_on_the_websocket() -> None:
    agent, _ = make_agent(ScriptedModel([]), FailingStore())
    async with serve(create_app(agent)) as served, httpx.AsyncClient(base_url=served.url) as client:
        for method, path in [("GET", "/api/runs"), ("GET", "/api/runs/r1"), ("POST", "/api/runs/r1/resume")]:
            response = await client.request(method, path, json={} if method == "POST" else None)
            assert response.status_code == 500 and response.headers["content-type"] == "application/json"
            error = response.json()["error"]
            assert "OSError: database disk image is malformed" in error and "log" in error
            assert "Traceback" not in response.text
        async with websockets.connect(f"{served.ws}/api/runs/r1/events") as ws:
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 5)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1011


@pytest.mark.parametrize("after", ["-1", "abc", "1e3", "9" * 5000])
async def test_a_stream_with_a_bad_after_is_closed_with_4400_saying_what_after_is(after: str) -> None:
    agent, _ = make_agent(ScriptedModel(["ok"]))
    async with serve(create_app(agent)) as served, httpx.AsyncClient(base_url=served.url) as client:
        run_id = await start(client)
        async with websockets.connect(f"{served.ws}/api/runs/{run_id}/events?after={after}") as ws:
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 5)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4400
        assert "after must be a whole number" in closed.value.rcvd.reason
        await finished(client, run_id)


async def test_stopping_the_server_interrupts_runs_and_closes_streams(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    agent, purges = make_agent(ScriptedModel(purge_then_answer("x")), store)
    async with serve(create_app(agent)) as served, httpx.AsyncClient(base_url=served.url) as client:
        run_id = await start(client)
        ws = await websockets.connect(f"{served.ws}/api/runs/{run_id}/events")
        await read_until(ws, lambda e: e["type"] == "approval_requested")
    with pytest.raises(websockets.ConnectionClosed):  # the server closed it while stopping
        while True:
            await asyncio.wait_for(ws.recv(), 5)
    state = await store.load_state(run_id)
    assert state is not None and not state.finished  # interrupted: the next server can resume it
    assert [e.type for e in await store.read_events(run_id)][-1] == "approval_requested"
    assert purges.done == []
    await store.aclose()


async def test_a_body_that_never_arrives_is_408_and_does_not_hold_up_shutdown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client sending its body byte by byte (or stalling) held its request open for ever — and uvicorn's
    graceful shutdown waits for open requests, so Ctrl-C never stopped the server nor saved its runs."""
    import thinkloop.server._app as app_module

    monkeypatch.setattr(app_module, "BODY_TIMEOUT", 1.0)
    agent, _ = make_agent(ScriptedModel([]))
    async with serve(create_app(agent)) as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", int(served.url.rsplit(":", 1)[1]))
        head = (
            "POST /api/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n"
        )
        writer.write(f"{head}\r\n{{".encode())  # 1 byte of 100, and no more
        await writer.drain()
        await eventually(lambda: served.server.server_state.tasks)  # the request is in the application
    # the server stopped (within `serve`'s 15 s) although the body never came; the client got told why
    answer = await asyncio.wait_for(reader.read(), 15)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"the body did not arrive within 1 s: send the whole request at once" in answer
    assert await agent.store.list_runs(10) == []  # type: ignore[union-attr]


async def test_a_run_failing_with_a_long_non_ascii_error_closes_its_stream_with_1011_and_a_reason() -> None:
    """A close reason may hold 123 bytes: a run's failure cut to 120 *characters*, some not ASCII, failed
    the close itself ("control frame too long"), so the client got no code and no reason."""

    class Flaky(MemoryStore):  # a short name: the reason reaches the error's own text
        saved = 0

        async def checkpoint(self, state: Any, events: Any) -> None:
            self.saved += 1
            if self.saved > 1:
                raise OSError("é" * 300)
            await super().checkpoint(state, events)

    @tool
    def note(text: str) -> str:
        """Note something."""
        return text

    go = asyncio.Event()

    async def reply(request: Any) -> Reply:
        await go.wait()
        return {"tool_calls": [{"name": "note", "args": {"text": "x"}}]}

    agent = Agent(FunctionModel(reply), tools=[note], store=Flaky())
    async with serve(create_app(agent)) as served, httpx.AsyncClient(base_url=served.url) as client:
        run_id = await start(client)
        async with websockets.connect(f"{served.ws}/api/runs/{run_id}/events") as ws:
            assert json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "run_started"
            go.set()
            with pytest.raises(websockets.ConnectionClosed) as closed:
                while True:
                    await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1011
    reason = closed.value.rcvd.reason
    assert reason.startswith("the run failed: ") and "éé…" in reason
    assert len(reason.encode()) <= 123


# ======================================================================== thinkloop serve (CLI)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_thinkloop_serve_runs_goals_and_stops_cleanly_on_sigint(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps([{"tool_calls": [{"name": "calculator", "args": {"expression": "6*7"}}]}, "42"])
    )
    port = _free_port()
    env = {**os.environ, "THINKLOOP_HOME": str(tmp_path / "home")}
    command = [
        sys.executable, "-m", "thinkloop.cli", "serve", "--port", str(port), "--model", f"script:{script}",
        "--store", f"sqlite:///{tmp_path / 'runs.db'}",
    ]  # fmt: skip
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            deadline = time.monotonic() + 20
            while True:
                try:
                    info = client.get("/api/info").json()
                    break
                except httpx.TransportError:
                    assert process.poll() is None and time.monotonic() < deadline, "the server did not start"
                    time.sleep(0.1)
            assert info["tools"] == ["calculator"] and info["safety"] == "balanced"
            assert client.get("/api/info", headers={"host": "evil.example"}).status_code == 400
            run_id = client.post("/api/runs", json={"goal": "What is 6*7?"}).json()["run_id"]
            for _ in range(100):
                events = client.get(f"/api/runs/{run_id}/events").json()["events"]
                if events and events[-1]["type"] == "done":
                    break
                time.sleep(0.05)
            assert events[-1]["result"]["output"] == "42"
            state = client.get(f"/api/runs/{run_id}").json()["state"]
            assert state["metadata"]["cli"]["tools"] == "calculator"  # `thinkloop runs resume` can rebuild it
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=20)
        assert process.returncode == 0, stderr
        assert f"127.0.0.1:{port}" in stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def test_thinkloop_serve_reports_a_bad_store_url(tmp_path: Path) -> None:
    (tmp_path / "script.json").write_text('["hi"]')
    out = subprocess.run(
        [sys.executable, "-m", "thinkloop.cli", "serve", "--model", "script:script.json", "--store", "nope://x"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 2 and "unknown store URL 'nope://x'" in out.stderr


@pytest.mark.parametrize(
    ("host", "problem"),
    [
        (
            "127.0.0.1",
            "Address already in use; another program listens there: stop it, or choose another --port",
        ),
        (
            "192.0.2.1",
            "Cannot assign requested address; 192.0.2.1 is no address of this machine: give one of its "
            "addresses, 127.0.0.1 (this machine only) or 0.0.0.0 (every network)",
        ),
    ],
)
def test_thinkloop_serve_that_cannot_listen_says_why_in_one_line_and_exits_1(
    tmp_path: Path, host: str, problem: str
) -> None:
    """A port in use: 'thinkloop serving … at http://127.0.0.1:PORT/' was printed (it was not), then
    uvicorn's own 'ERROR: [Errno 98] error while attempting to bind …', and the exit code was 3 (a run
    stopped by a limit, in the CLI's codes)."""
    (tmp_path / "script.json").write_text('["hi"]')
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["--host", host, "--port", str(port), "--model", "script:script.json", "--insecure"]
        out = subprocess.run(
            [sys.executable, "-m", "thinkloop.cli", "serve", *args], capture_output=True, text=True,
            timeout=60, cwd=tmp_path, env={**os.environ, "COLUMNS": "300", "THINKLOOP_HOME": str(tmp_path)},
        )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert out.stderr.splitlines() == [f"error: cannot listen on {host}:{port}: {problem}"]


@pytest.mark.parametrize(
    ("option", "value"), [("--timeout", "nan"), ("--max-cost", "inf"), ("--approval-timeout", "-1")]
)
def test_thinkloop_serve_refuses_limits_that_are_not_finite_positive_numbers(
    tmp_path: Path, option: str, value: str
) -> None:
    """`--timeout nan` silently meant no limit (and `--approval-timeout -1` denied every call at once)."""
    (tmp_path / "script.json").write_text('["hi"]')
    out = subprocess.run(
        [sys.executable, "-m", "thinkloop.cli", "serve", "--model", "script:script.json", option, value],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert f"Invalid value for '{option}'" in out.stderr and "thinkloop serving" not in out.stderr


async def test_a_run_of_another_process_is_followed_from_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    import thinkloop.server._runs as runs_module

    monkeypatch.setattr(runs_module, "POLL_INTERVAL", 0.02)
    store = MemoryStore()

    @tool
    def note(text: str) -> str:
        """Note something."""
        return f"noted {text}"

    def reply(request: Any) -> Reply:
        return "finished" if request.turn >= 3 else {"tool_calls": [{"name": "note", "args": {"text": "x"}}]}

    elsewhere = Agent(FunctionModel(reply, latency=0.05), tools=[note], store=store)  # e.g. `thinkloop run`
    task = asyncio.create_task(elsewhere.run("work", run_id="elsewhere"))
    await eventually(lambda: store.load_state("elsewhere"))
    agent, _ = make_agent(ScriptedModel([]), store)
    async with (
        serve(create_app(agent)) as served,
        websockets.connect(f"{served.ws}/api/runs/elsewhere/events") as ws,
    ):
        events = await read_until(ws, lambda e: e["type"] == "done")
    result = await task
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["result"]["output"] == result.output == "finished"


async def test_a_run_whose_first_save_fails_is_answered_with_why_not_a_bare_no_run() -> None:
    """202, then the store failed at once: the run had nothing saved, and GET, its events and its stream
    said only "no run" — the client never learnt why."""

    class Down(MemoryStore):
        async def checkpoint(self, state: Any, events: Any) -> None:
            raise OSError("disk full")

    agent, _ = make_agent(ScriptedModel(["hi"]), Down())
    async with serve(create_app(agent)) as served, httpx.AsyncClient(base_url=served.url) as client:
        run_id = await start(client)
        await eventually(lambda: served.app.state.manager.active() == [])
        why = f"no run {run_id!r}: it failed before anything of it was saved (StateError: the store Down"
        for path in (f"/api/runs/{run_id}", f"/api/runs/{run_id}/events"):
            response = await client.get(path)
            assert response.status_code == 404 and response.json()["error"].startswith(why), path
        async with websockets.connect(f"{served.ws}/api/runs/{run_id}/events") as ws:
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4404
        assert "failed before anything of it was saved" in closed.value.rcvd.reason
        unknown = await client.get("/api/runs/never-started")
        assert unknown.status_code == 404 and unknown.json()["error"] == "no run 'never-started'"


def test_a_request_cancelled_at_shutdown_is_logged_as_one_warning_line() -> None:
    """uvicorn logs a request its graceful shutdown cancelled (a client stalled mid-body) as "Exception in
    ASGI application" with a traceback: the server's filter turns that into one warning; other errors stay."""
    import logging
    import sys

    from thinkloop.server._app import _QuietShutdown

    try:
        raise asyncio.CancelledError("Task cancelled, timeout graceful shutdown exceeded")
    except asyncio.CancelledError:
        cancelled = sys.exc_info()
    try:
        raise ValueError("a real bug")
    except ValueError:
        bug = sys.exc_info()
    quiet = _QuietShutdown()
    record = logging.LogRecord(
        "uvicorn.error", logging.ERROR, "x", 1, "Exception in ASGI application\n", (), cancelled
    )
    assert quiet.filter(record) and record.exc_info is None and record.levelname == "WARNING"
    assert record.getMessage() == (
        "a request still open at shutdown was cancelled (Task cancelled, timeout graceful shutdown exceeded)"
    )
    other = logging.LogRecord(
        "uvicorn.error", logging.ERROR, "x", 1, "Exception in ASGI application\n", (), bug
    )
    assert quiet.filter(other) and other.exc_info is bug and other.levelname == "ERROR"
