"""`thinkloop serve` against clients that never finish or ask too much: request heads that never end, a
shutdown with requests that never end, more connections than the server takes, heads too long to read.
Real sockets on 127.0.0.1 against a real uvicorn server, with short timeouts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from test_server import _free_port, eventually, make_agent, purge_then_answer, read_until, serve, start
from thinkloop import ConfigurationError
from thinkloop.server import create_app
from thinkloop.server._serving import MAX_CONNECTIONS, uvicorn_config
from thinkloop.stores import SQLiteStore
from thinkloop.testing import ScriptedModel


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def answer_of(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    """All the server sends until it closes the connection (15 s at most: a server that holds the
    connection for ever fails the test)."""
    try:
        return await asyncio.wait_for(reader.read(), 15)
    finally:
        writer.close()
        await writer.wait_closed()


async def test_a_request_head_that_never_ends_is_408_and_closed_after_the_head_timeout() -> None:
    """uvicorn has no timeout for a request's head: a client that sent headers and never the blank line
    after them (a slowloris) held its connection, and its place among the server's connections, for ever."""
    agent, _ = make_agent(ScriptedModel([]))
    async with serve(create_app(agent), head_timeout=1) as served:
        reader, writer = await connect(served.port)
        writer.write(b"GET /api/info HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: 1\r\n")  # no end of head
        await writer.drain()
        answer = await answer_of(reader, writer)
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        head, _, body = answer.partition(b"\r\n\r\n")
        assert b"connection: close" in head.lower()
        assert json.loads(body) == {
            "error": "the request's headers did not arrive within 1 s: send the whole request at once"
        }
        assert served.server.server_state.connections == set()


async def test_a_connection_that_sends_nothing_is_closed_after_the_head_timeout() -> None:
    agent, _ = make_agent(ScriptedModel([]))
    async with serve(create_app(agent), head_timeout=1) as served:
        reader, writer = await connect(served.port)
        assert await answer_of(reader, writer) == b""  # closed without a word: nothing was asked


async def test_the_head_timer_starts_again_after_each_answer_of_a_kept_alive_connection() -> None:
    agent, _ = make_agent(ScriptedModel([]))
    async with serve(create_app(agent), head_timeout=1) as served:
        reader, writer = await connect(served.port)
        for _ in range(2):  # a whole request is answered, and the connection kept
            writer.write(b"GET /api/info HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200 "), head
            length = next(
                int(v)
                for k, _, v in (line.partition(b":") for line in head.split(b"\r\n"))
                if k.lower() == b"content-length"
            )
            await asyncio.wait_for(reader.readexactly(length), 5)
        writer.write(b"GET /api/info HTTP/1.1\r\nHost: 1")  # then a head that stops half-way
        await writer.drain()
        assert (await answer_of(reader, writer)).startswith(b"HTTP/1.1 408 ")


async def test_requests_and_streams_that_last_longer_than_the_head_timeout_are_not_cut() -> None:
    """The timer stops when a head has arrived: a WebSocket following a run, and a request whose body
    comes later than the head timeout (within `BODY_TIMEOUT`), go on."""
    agent, purges = make_agent(ScriptedModel(purge_then_answer("x")))
    async with (
        serve(create_app(agent), head_timeout=0.5) as served,
        httpx.AsyncClient(base_url=served.url) as client,
    ):
        run_id = await start(client)
        async with websockets.connect(f"{served.ws}/api/runs/{run_id}/events") as ws:
            events = await read_until(ws, lambda e: e["type"] == "approval_requested")
            call_id = events[-1]["call"]["id"]
            await asyncio.sleep(1.5)  # three head timeouts: neither this stream nor the run is touched
            reader, writer = await connect(served.port)
            body = json.dumps({"decision": "approve"}).encode()
            writer.write(
                f"POST /api/runs/{run_id}/approvals/{call_id} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            )
            await writer.drain()
            await asyncio.sleep(1.5)  # the head is in: the body may take its time
            writer.write(body)
            assert (await answer_of(reader, writer)).startswith(b"HTTP/1.1 200 ")
            events = await read_until(ws, lambda e: e["type"] == "done")
        assert events[-1]["result"]["output"] == "all done"
    assert purges.done == ["x"]


async def test_a_request_that_never_ends_does_not_hold_up_shutdown_and_runs_are_still_saved(
    tmp_path: Path,
) -> None:
    """uvicorn's graceful shutdown waited for open requests without limit — a client not reading its answer,
    a request that never ends — so Ctrl-C never stopped the server, nor interrupted and saved its runs."""
    store = SQLiteStore(tmp_path / "runs.db")
    agent, purges = make_agent(ScriptedModel(purge_then_answer("x")), store)
    app = create_app(agent)
    entered = asyncio.Event()

    async def holding(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/held":
            entered.set()
            await asyncio.Event().wait()  # never answers
        await app(scope, receive, send)

    async with serve(holding, graceful_timeout=1) as served, httpx.AsyncClient(base_url=served.url) as client:
        run_id = await start(client)
        ws = await websockets.connect(f"{served.ws}/api/runs/{run_id}/events")
        await read_until(ws, lambda e: e["type"] == "approval_requested")
        reader, writer = await connect(served.port)
        writer.write(b"GET /held HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        await writer.drain()
        await asyncio.wait_for(entered.wait(), 5)
    # `serve` stopped the server (it waits 15 s at most) although the request never ended
    assert not (await answer_of(reader, writer)).startswith(b"HTTP/1.1 200")
    with pytest.raises(websockets.ConnectionClosed):
        await asyncio.wait_for(ws.recv(), 5)
    state = await store.load_state(run_id)
    assert state is not None and not state.finished and "interrupted" in state.metadata  # resumable
    assert purges.done == []
    await store.aclose()


def full(limit: int) -> str:
    return (
        f"the server has as many connections open as it takes ({limit}: thinkloop serve --max-connections): "
        "try again in a moment, or close connections you no longer need (streams of runs you do not follow, "
        "other tabs of the page)"
    )


async def test_connections_beyond_max_connections_are_refused_with_a_json_503_websockets_included() -> None:
    """uvicorn's `limit_concurrency` was not set, and it does not count a WebSocket handshake anyway: any
    number of streams could be opened. The connection beyond the cap gets a JSON 503 — a WebSocket's
    handshake too — and is closed; once one closes, the next is served."""
    agent, _ = make_agent(ScriptedModel(purge_then_answer("x")))
    once = {"Connection": "close"}  # each request on a connection of its own, closed after its answer
    async with (
        serve(create_app(agent), max_connections=3) as served,
        httpx.AsyncClient(base_url=served.url, headers=once) as client,
    ):
        open_now = served.server.server_state.connections
        run_id = await start(client)  # waits for approval: its streams stay open
        url = f"{served.ws}/api/runs/{run_id}/events"
        streams = [await websockets.connect(url) for _ in range(3)]
        for ws in streams:
            await read_until(ws, lambda e: e["type"] == "approval_requested")
        await eventually(lambda: len(open_now) == 3)  # the streams (the request's connection has closed)
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(url)
        response = refused.value.response
        assert response.status_code == 503 and response.headers["Retry-After"] == "1"
        assert json.loads(response.body) == {"error": full(3)}
        reader, writer = await connect(served.port)
        writer.write(b"GET /api/info HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = await answer_of(reader, writer)  # closed after the answer
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 ") and b"connection: close" in head.lower(), head
        assert json.loads(body) == {"error": full(3)}
        await streams.pop().close()
        await eventually(lambda: len(open_now) == 2)
        async with websockets.connect(url) as again:  # room again
            assert (await read_until(again, lambda e: e["type"] == "approval_requested"))[0]["seq"] == 1
        await eventually(lambda: len(open_now) == 2)
        assert (await client.get("/api/info")).status_code == 200
        for ws in streams:
            await ws.close()


@pytest.mark.parametrize(
    ("head", "status", "error"),
    [
        (
            b"GET /" + b"a" * 20_000,
            414,
            "the request line is longer than 16 KiB, the most this server reads: send a shorter URL (put "
            "long data in a POST body)",
        ),
        (
            b"GET /api/info HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"b" * 20_000,
            431,
            "the request's headers are longer than 16 KiB in all, the most this server reads: send fewer or "
            "shorter headers",
        ),
        (
            b"GET /api/info HTTP/1.1\r\nNo colon here\r\n\r\n",
            400,
            "the request is not valid HTTP/1.1 (a malformed request line or header): send HTTP/1.1",
        ),
    ],
)
async def test_a_request_head_that_cannot_be_read_is_answered_in_the_servers_json_format(
    head: bytes, status: int, error: str
) -> None:
    """uvicorn answered these with a plain-text 400 "Invalid HTTP request received.", unlike every other
    error of the server."""
    agent, _ = make_agent(ScriptedModel([]))
    async with serve(create_app(agent)) as served:
        reader, writer = await connect(served.port)
        writer.write(head)
        answer = await answer_of(reader, writer)
        response, _, body = answer.partition(b"\r\n\r\n")
        assert response.startswith(f"HTTP/1.1 {status} ".encode()), answer[:200]
        assert b"content-type: application/json" in response.lower()
        assert json.loads(body) == {"error": error}


@pytest.mark.parametrize("connections", [0, -1, 2.5, True])
def test_max_connections_must_be_a_whole_number_of_at_least_one(connections: Any) -> None:
    agent, _ = make_agent(ScriptedModel([]))
    with pytest.raises(ConfigurationError, match="max_connections must be a whole number of at least 1"):
        uvicorn_config(create_app(agent), max_connections=connections)
    assert uvicorn_config(create_app(agent)).http.max_connections == MAX_CONNECTIONS


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf")])
def test_the_head_timeout_must_be_a_positive_number_of_seconds(timeout: float) -> None:
    agent, _ = make_agent(ScriptedModel([]))
    with pytest.raises(ConfigurationError, match="head_timeout must be a positive number of seconds"):
        uvicorn_config(create_app(agent), head_timeout=timeout)


@contextlib.contextmanager
def thinkloop_serve(tmp_path: Path, *options: str) -> Iterator[int]:
    """`thinkloop serve` in a subprocess with a scripted model, answering on the port given; it must stop
    cleanly on SIGINT at the end."""
    (tmp_path / "script.json").write_text('["hi"]')
    port = _free_port()
    command = [
        sys.executable, "-m", "thinkloop.cli", "serve", "--port", str(port), "--model", "script:script.json",
        *options,
    ]  # fmt: skip
    env = {**os.environ, "THINKLOOP_HOME": str(tmp_path / "home")}
    process = subprocess.Popen(command, env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/api/info").status_code == 200
                break
            except httpx.TransportError:
                assert process.poll() is None and time.monotonic() < deadline, "the server did not start"
                time.sleep(0.1)
        yield port
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 0, stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def test_thinkloop_serve_closes_a_connection_whose_head_never_ends(tmp_path: Path) -> None:
    with thinkloop_serve(tmp_path, "--header-timeout", "1") as port:

        async def slow_client() -> bytes:
            reader, writer = await connect(port)
            writer.write(b"GET /api/info HTTP/1.1\r\n")
            await writer.drain()
            return await answer_of(reader, writer)

        assert asyncio.run(slow_client()).startswith(b"HTTP/1.1 408 ")


def test_thinkloop_serve_refuses_connections_beyond_max_connections(tmp_path: Path) -> None:
    with thinkloop_serve(tmp_path, "--max-connections", "1") as port:

        async def second_client() -> bytes:
            first = await connect(port)  # open, silent: the one connection the server takes
            try:
                reader, writer = await connect(port)
                writer.write(b"GET /api/info HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                return await answer_of(reader, writer)
            finally:
                first[1].close()
                await first[1].wait_closed()

        head, _, body = asyncio.run(second_client()).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 "), head
        assert json.loads(body) == {"error": full(1)}


@pytest.mark.parametrize("option", ["--header-timeout", "--max-connections"])
def test_thinkloop_serve_refuses_a_limit_that_is_not_positive(tmp_path: Path, option: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "thinkloop.cli", "serve", "--model", "script:x.json", option, "0"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert out.returncode == 2 and f"Invalid value for '{option}'" in out.stderr, out.stderr
