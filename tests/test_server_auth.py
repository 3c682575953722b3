"""The server's token (SPEC §13.2): every API request and WebSocket needs it; the page and its files do not.

HTTP through httpx on the ASGI app; WebSockets against a real uvicorn server with the real `websockets`
client; `thinkloop serve` as a subprocess.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from test_server import _free_port, api, finished, make_agent, purge_then_answer, read_until, serve, start
from thinkloop import ConfigurationError
from thinkloop.server import create_app
from thinkloop.stores import MemoryStore
from thinkloop.testing import ScriptedModel

TOKEN = "s3cret-Token_0123456789abcdefXYZ"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
EVENTS = "thinkloop.events.v1"


def token_protocol(token: str) -> str:
    return "thinkloop.token." + base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


# ================================================================================================ HTTP


async def test_every_api_request_needs_the_token_and_the_page_does_not() -> None:
    agent, _ = make_agent(ScriptedModel(["The answer is 42."]))
    async with api(create_app(agent, token=TOKEN)) as client:
        for path in ("/", "/static/app.js", "/static/style.css"):  # the page loads, then asks for the token
            assert (await client.get(path)).status_code == 200, path

        for method, path in [
            ("GET", "/api/info"), ("GET", "/api/runs"), ("GET", "/api/runs/x"), ("GET", "/api/runs/x/events"),
            ("GET", "/api/approvals"), ("POST", "/api/runs"), ("POST", "/api/runs/x/cancel"),
            ("POST", "/api/runs/x/resume"), ("POST", "/api/runs/x/approvals/c1"), ("GET", "/openapi.json"),
            ("GET", "/api/nothing-here"), ("DELETE", "/"), ("POST", "/static/app.js"),
        ]:  # fmt: skip
            response = await client.request(method, path, json={"goal": "hi"})
            assert response.status_code == 401, (method, path)
            assert response.headers["www-authenticate"] == 'Bearer realm="thinkloop"'
            error = response.json()["error"]
            assert error.startswith("this server needs its access token: send the header")
            assert "`Authorization: Bearer TOKEN`" in error

        # a body that is not JSON is refused for its missing token first (nothing about the API leaks)
        plain = await client.post("/api/runs", content=b"goal", headers={"content-type": "text/plain"})
        assert plain.status_code == 401

        for wrong in ("Bearer nope", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", f"Basic {TOKEN}", "Bearer"):
            response = await client.get("/api/info", headers={"Authorization": wrong})
            assert response.status_code == 401, wrong
            assert "nope" not in response.text and TOKEN[:8] not in response.text  # never echoed

        assert (await client.get("/api/info", headers=BEARER)).status_code == 200
        assert (
            await client.get("/api/info", headers={"authorization": f"bearer {TOKEN}"})
        ).status_code == 200
        response = await client.post("/api/runs", json={"goal": "What is 6*7?"}, headers=BEARER)
        assert response.status_code == 202
        client.headers.update(BEARER)
        events = await finished(client, response.json()["run_id"])
    assert events[-1]["result"]["output"] == "The answer is 42."


async def test_without_a_token_the_api_is_open() -> None:
    agent, _ = make_agent(ScriptedModel([]))
    async with api(create_app(agent)) as client:
        assert (await client.get("/api/info")).status_code == 200
        assert (
            await client.get("/api/info", headers={"Authorization": "Bearer anything"})
        ).status_code == 200


@pytest.mark.parametrize("token", ["", "two words", "tab\there", "naïve-token", "new\nline"])
def test_a_token_that_cannot_travel_in_a_header_is_refused_without_being_quoted(token: str) -> None:
    agent, _ = make_agent(ScriptedModel([]))
    with pytest.raises(ConfigurationError, match="printable ASCII") as caught:
        create_app(agent, token=token)
    assert token == "" or token not in str(caught.value)


async def test_the_token_never_reaches_logs_events_or_the_run_state(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    store = MemoryStore()
    agent, purges = make_agent(ScriptedModel(purge_then_answer("a")), store)
    async with serve(create_app(agent, token=TOKEN)) as served:
        uvicorn_logs = [logging.getLogger(name) for name in ("uvicorn.access", "uvicorn.error")]
        levels = [log.level for log in uvicorn_logs]
        for log in uvicorn_logs:  # `serve` quiets them, and they do not propagate: as `--log-level debug`
            log.setLevel(logging.DEBUG)
            log.addHandler(caplog.handler)
        async with httpx.AsyncClient(base_url=served.url, headers=BEARER) as client:
            run_id = await start(client)
            async with websockets.connect(
                f"{served.ws}/api/runs/{run_id}/events", subprotocols=[EVENTS, token_protocol(TOKEN)]
            ) as ws:
                await read_until(ws, lambda e: e["type"] == "approval_requested")
                await client.post(f"/api/runs/{run_id}/approvals/c0", json={"decision": "approve"})
                events = await read_until(ws, lambda e: e["type"] == "done")
            listed = (await client.get("/api/runs")).text
        async with websockets.connect(
            f"{served.ws}/api/runs/{run_id}/events", additional_headers=BEARER
        ) as ws:
            assert (await read_until(ws, lambda e: e["type"] == "done"))[-1] == events[-1]
        async with httpx.AsyncClient(base_url=served.url) as anonymous:  # refusals are logged, not the token
            await anonymous.get("/api/info", headers={"Authorization": f"Bearer {TOKEN}-wrong"})
    assert purges.done == ["a"] and events[-1]["result"]["output"] == "all done"
    state = await store.load_state(run_id)
    assert state is not None
    stored = state.to_json() + "".join(e.model_dump_json() for e in await store.read_events(run_id))
    assert "refused GET /api/info from 127.0.0.1: a wrong token" in caplog.text
    client_side = ("websockets.client", "httpx", "httpcore")  # the test's own clients log what they send
    server_logs = "\n".join(r.getMessage() for r in caplog.records if not r.name.startswith(client_side))
    for log, level in zip(uvicorn_logs, levels, strict=True):
        log.removeHandler(caplog.handler)
        log.setLevel(level)
    assert f"/api/runs/{run_id}/events" in server_logs  # the WebSocket's request was logged, not its token
    assert "< sec-websocket-protocol: [hidden]" in server_logs.lower()  # websockets logs handshake headers
    assert "< authorization: [hidden]" in server_logs.lower()
    for text in (stored, server_logs, listed, json.dumps(events)):
        assert TOKEN not in text and token_protocol(TOKEN) not in text


# =========================================================================================== WebSocket


async def test_the_websocket_is_refused_without_the_token_and_accepted_with_it() -> None:
    agent, _ = make_agent(ScriptedModel(["ok"]))
    async with serve(create_app(agent, token=TOKEN)) as served:
        async with httpx.AsyncClient(base_url=served.url, headers=BEARER) as client:
            run_id = await start(client)
            await finished(client, run_id)
        url = f"{served.ws}/api/runs/{run_id}/events"

        refused: list[dict[str, Any]] = [
            {},
            {"subprotocols": [EVENTS]},
            {"subprotocols": [EVENTS, token_protocol("wrong")]},
            {"subprotocols": [EVENTS, "thinkloop.token.%%%"]},  # not base64url
            {"additional_headers": {"Authorization": "Bearer wrong"}},
        ]
        for options in refused:
            with pytest.raises(websockets.InvalidStatus) as caught:
                await websockets.connect(url, **options)
            assert caught.value.response.status_code == 401, options
            body = json.loads(caught.value.response.body or b"{}")
            assert "thinkloop.token.BASE64URL(TOKEN)" in body["error"]

        # as the page does: the token in a subprotocol, and only the events protocol is echoed back
        async with websockets.connect(url, subprotocols=[EVENTS, token_protocol(TOKEN)]) as ws:
            assert ws.subprotocol == EVENTS
            assert TOKEN not in str(ws.response.headers) and "token" not in str(ws.response.headers).lower()
            assert (await read_until(ws, lambda e: e["type"] == "done"))[-1]["result"]["output"] == "ok"
        async with websockets.connect(url, additional_headers=BEARER) as ws:  # as a program may
            assert ws.subprotocol is None
            assert (await read_until(ws, lambda e: e["type"] == "done"))[0]["seq"] == 1
        # the origin check still applies to a client with the token
        with pytest.raises(websockets.InvalidStatus):
            await websockets.connect(
                url, additional_headers=BEARER, origin=websockets.Origin("http://evil.example")
            )


async def test_refused_websockets_are_not_logged_as_errors_and_wrong_tokens_all_look_alike(
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent, _ = make_agent(ScriptedModel([]))
    async with serve(create_app(agent, token=TOKEN)) as served:
        uvicorn_log = logging.getLogger("uvicorn.error")  # it does not propagate: listen to it directly
        uvicorn_log.addHandler(caplog.handler)
        try:
            for token in ("wrong", TOKEN[:-1], TOKEN + "x", TOKEN[::-1]):  # shorter, longer, same length
                with pytest.raises(websockets.InvalidStatus) as caught:
                    await websockets.connect(
                        f"{served.ws}/api/runs/r/events",
                        additional_headers={"Authorization": f"Bearer {token}"},
                    )
                assert caught.value.response.status_code == 401
                error = json.loads(caught.value.response.body or b"{}")["error"]
                assert error.startswith("the access token is wrong: send the header")
                async with api(served.app) as client:
                    response = await client.get("/api/info", headers={"Authorization": f"Bearer {token}"})
                assert response.status_code == 401 and response.json()["error"] == error
        finally:
            uvicorn_log.removeHandler(caplog.handler)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


# ======================================================================================= thinkloop serve


def _serve(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "THINKLOOP_SERVER_TOKEN"}
    environment.update(THINKLOOP_HOME=str(cwd / "home"), **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "thinkloop.cli", "serve", *args],
        capture_output=True, text=True, timeout=60, cwd=cwd, env=environment,
    )  # fmt: skip


def test_thinkloop_serve_refuses_a_public_address_without_a_token(tmp_path: Path) -> None:
    (tmp_path / "script.json").write_text('["hi"]')
    out = _serve("--host", "0.0.0.0", "--model", "script:script.json", cwd=tmp_path)
    assert out.returncode == 2
    assert "refusing to serve on 0.0.0.0 without a token" in out.stderr
    assert "THINKLOOP_SERVER_TOKEN" in out.stderr and "--token-file" in out.stderr
    assert "--insecure" in out.stderr and "thinkloop serving" not in out.stderr

    # --insecure lets it past the check: it then stops at the missing script, before listening
    out = _serve("--host", "0.0.0.0", "--insecure", "--model", "script:missing.json", cwd=tmp_path)
    assert out.returncode == 2 and "refusing" not in out.stderr and "missing.json" in out.stderr


def test_thinkloop_serve_reports_bad_token_options_without_printing_them(tmp_path: Path) -> None:
    (tmp_path / "script.json").write_text('["hi"]')
    (tmp_path / "empty").write_text("\n")
    model = ("--model", "script:script.json")
    out = _serve("--token", TOKEN, "--token-file", "empty", *model, cwd=tmp_path)
    assert out.returncode == 2 and "not both" in out.stderr
    out = _serve("--token-file", "empty", *model, cwd=tmp_path)
    assert out.returncode == 2 and "the token file empty is empty" in out.stderr
    out = _serve("--token-file", "absent", *model, cwd=tmp_path)
    assert out.returncode == 2 and "absent" in out.stderr
    out = _serve(*model, cwd=tmp_path, env={"THINKLOOP_SERVER_TOKEN": "secret with spaces"})
    assert out.returncode == 2 and "$THINKLOOP_SERVER_TOKEN: the server token must be" in out.stderr
    assert "secret with spaces" not in out.stderr


@pytest.mark.parametrize("how", ["env", "file"])
def test_thinkloop_serve_with_a_token(tmp_path: Path, how: str) -> None:
    (tmp_path / "script.json").write_text('["42"]')
    port = _free_port()
    args = ["--port", str(port), "--model", "script:script.json", "--store", f"sqlite:///{tmp_path / 'r.db'}"]
    env = {}
    if how == "file":
        (tmp_path / "token").write_text(TOKEN + "\n")
        (tmp_path / "token").chmod(0o600)
        args += ["--token-file", "token"]
    else:
        env["THINKLOOP_SERVER_TOKEN"] = TOKEN
    environment = {k: v for k, v in os.environ.items() if k != "THINKLOOP_SERVER_TOKEN"}
    environment.update(THINKLOOP_HOME=str(tmp_path / "home"), **env)
    command = [sys.executable, "-m", "thinkloop.cli", "serve", *args]
    process = subprocess.Popen(command, env=environment, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            deadline = time.monotonic() + 20
            while True:
                try:
                    refused = client.get("/api/info")
                    break
                except httpx.TransportError:
                    assert process.poll() is None and time.monotonic() < deadline, "the server did not start"
                    time.sleep(0.1)
            assert refused.status_code == 401
            assert client.get("/").status_code == 200
            assert client.get("/api/info", headers=BEARER).json()["tools"] == ["calculator"]
            run_id = client.post("/api/runs", json={"goal": "6*7?"}, headers=BEARER).json()["run_id"]
            for _ in range(100):
                events = client.get(f"/api/runs/{run_id}/events", headers=BEARER).json()["events"]
                if events and events[-1]["type"] == "done":
                    break
                time.sleep(0.05)
            assert events[-1]["result"]["output"] == "42"
            state = client.get(f"/api/runs/{run_id}", headers=BEARER).json()["state"]
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=20)
        assert process.returncode == 0, stderr
        assert "the token required" in stderr and "warning" not in stderr
        assert TOKEN not in stderr and TOKEN not in json.dumps(state)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


@pytest.mark.parametrize(
    ("host", "url_host"), [("127.0.0.2", "127.0.0.2"), ("0:0:0:0:0:0:0:1", "[0:0:0:0:0:0:0:1]")]
)
def test_thinkloop_serve_on_any_loopback_address_answers_at_the_url_it_prints(
    tmp_path: Path, host: str, url_host: str
) -> None:
    """`--host 127.0.0.2` (a loopback address, so no token is needed) allowed only the Host headers
    127.0.0.1, localhost and [::1]: every request to the URL it printed was refused with 400."""
    (tmp_path / "script.json").write_text('["hi"]')
    port = _free_port()
    args = ["--host", host, "--port", str(port), "--model", "script:script.json"]
    environment = {k: v for k, v in os.environ.items() if k != "THINKLOOP_SERVER_TOKEN"}
    environment.update(THINKLOOP_HOME=str(tmp_path / "home"), COLUMNS="300")
    command = [sys.executable, "-m", "thinkloop.cli", "serve", *args]
    process = subprocess.Popen(command, env=environment, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    url = f"http://{url_host}:{port}"
    try:
        with httpx.Client(base_url=url) as client:
            deadline = time.monotonic() + 20
            while True:
                try:
                    info = client.get("/api/info")
                    break
                except httpx.TransportError:
                    assert process.poll() is None and time.monotonic() < deadline, "the server did not start"
                    time.sleep(0.1)
            assert info.status_code == 200, info.text
            assert info.json()["model"].endswith("script.json")
            assert client.get("/").status_code == 200
            for other in ("localhost", "127.0.0.1", "[::1]"):  # the loopback names too
                assert client.get("/api/info", headers={"host": f"{other}:{port}"}).status_code == 200
            refused = client.get("/api/info", headers={"host": f"evil.example:{port}"})  # DNS rebinding
            assert refused.status_code == 400 and url_host in refused.json()["error"]
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=20)
        assert process.returncode == 0, stderr
        assert f"at {url}/ (no token" in stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def test_the_hosts_thinkloop_serve_allows_on_loopback() -> None:
    from thinkloop.cli._serve import allowed_hosts

    names = ["127.0.0.1", "localhost", "::1", "[::1]"]
    assert allowed_hosts("127.0.0.1") == allowed_hosts("localhost") == allowed_hosts("::1") == names
    assert allowed_hosts("127.0.0.2") == [*names, "127.0.0.2"]
    assert allowed_hosts("0:0:0:0:0:0:0:1") == [*names, "[0:0:0:0:0:0:0:1]"]  # and its short form, [::1]
    assert allowed_hosts("0:0:0:0:0:0:0:0001") == [*names, "[0:0:0:0:0:0:0:0001]"]


def test_a_token_file_others_may_read_is_warned_about(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("short\n")
    (tmp_path / "token").chmod(0o644)
    out = _serve("--token-file", "token", "--model", "script:missing.json", cwd=tmp_path)
    assert "other users may read the token file token: chmod 600 it" in out.stderr
    assert "a token of 5 characters can be guessed" in out.stderr
    assert "short" not in out.stderr


async def test_resume_needs_the_token_too() -> None:
    agent, _ = make_agent(ScriptedModel([]))
    async with api(create_app(agent, token=TOKEN)) as client:
        assert (await client.post("/api/runs/x/resume", json={})).status_code == 401
        response = await client.post("/api/runs/x/resume", json={}, headers=BEARER)
    assert response.status_code == 404 and response.json() == {"error": "no run 'x'"}
