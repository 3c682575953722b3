"""The server's web page in a real browser: Debian's Chromium, headless, driven by Playwright.

CI installs Chromium (`.ci/run`); the tests are skipped only where /usr/bin/chromium is absent.
Playwright's own browser download is never used (`executable_path`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

import thinkloop.server._runs as runs_module
from test_resume import SCRIPT, Crash, Effects, agent_for, crashing, observed
from test_server import HOSTILE, finished, serve
from test_server_resume import interrupt
from thinkloop import Agent, Budget, RiskLevel, tool
from thinkloop.safety import PendingApprovals, SafetyController
from thinkloop.server import create_app
from thinkloop.stores import MemoryStore, SQLiteStore, Store
from thinkloop.stores._owner import StillRunningError, check_not_running
from thinkloop.testing import FunctionModel, Reply, ScriptedModel

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (/usr/bin/chromium)")

async_api = pytest.importorskip("playwright.async_api")


def decide(request: Any) -> Reply:
    """Purge goals call the risky tool, then report its result; other goals get a hostile answer."""
    last = request.messages[-1]
    goal = next(m.content for m in request.messages if m.role == "user")
    if last.role == "tool":
        return f"Done: {last.content}"
    if goal.startswith("purge"):
        return {"tool_calls": [{"name": "purge", "args": {"target": goal.split()[-1]}}]}
    return f"The answer is 42. {HOSTILE}"


@contextlib.asynccontextmanager
async def open_page(app: FastAPI) -> AsyncIterator[Any]:
    """The app on uvicorn, its page open in headless Chromium; no script error, no dialog, no injection."""
    async with serve(app) as served, browser_tab() as tab:
        await tab.goto(served.url + "/")
        yield tab


@contextlib.asynccontextmanager
async def browser_tab() -> AsyncIterator[Any]:
    """A tab of headless Chromium; at the end, no script error, no dialog, and no injected script ran."""
    async with async_api.async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            tab = await browser.new_page()
            errors: list[str] = []
            tab.on("pageerror", lambda exc: errors.append(str(exc)))
            tab.on("dialog", lambda dialog: errors.append(f"dialog: {dialog.message}"))
            yield tab
            assert errors == []
            assert await tab.title() == "thinkloop"  # no injected script ever ran
        finally:
            await browser.close()


def purging_agent(purged: list[str], store: Store | None = None) -> Agent:
    @tool(risk=RiskLevel.HIGH)
    def purge(target: str) -> str:
        """Delete everything under a target."""
        purged.append(target)
        return f"purged {target} {HOSTILE}"

    return Agent(
        FunctionModel(decide),
        tools=[purge],
        store=store if store is not None else MemoryStore(),
        safety=SafetyController("balanced", approval=PendingApprovals()),
        budget=Budget(max_steps=6),
    )


@pytest.fixture
async def page() -> AsyncIterator[tuple[Any, list[str]]]:
    purged: list[str] = []
    async with open_page(create_app(purging_agent(purged))) as tab:
        yield tab, purged


async def test_start_a_run_and_see_its_answer_as_text(page: tuple[Any, list[str]]) -> None:
    tab, _ = page
    expect = async_api.expect
    await expect(tab.locator("#agent-info")).to_contain_text("tools: purge")
    await tab.fill("#goal", "What is 6*7?")
    await tab.click("#start")
    await expect(tab.locator("#answer")).to_have_text(f"The answer is 42. {HOSTILE}")
    await expect(tab.locator("#stop-reason")).to_contain_text("final_answer")
    assert await tab.locator("#answer img, #answer script, #events img, #events script").count() == 0
    await expect(tab.locator("#events li.model_call")).to_have_count(1)
    await expect(tab.locator("#runs li")).to_have_count(1)
    await expect(tab.locator("#runs li .badge")).to_have_text("final_answer")


async def test_approve_a_risky_call_by_clicking(page: tuple[Any, list[str]]) -> None:
    tab, purged = page
    expect = async_api.expect
    await tab.fill("#goal", "purge /tmp/cache")
    await tab.click("#start")
    card = tab.locator(".approval")
    await expect(card).to_contain_text("purge")
    await expect(card.locator(".risk")).to_have_text("high")
    assert json.loads(await card.locator("pre").text_content() or "") == {"target": "/tmp/cache"}
    assert purged == []
    await card.get_by_role("button", name="Approve", exact=True).click()
    await expect(tab.locator("#answer")).to_have_text(f"Done: purged /tmp/cache {HOSTILE}")
    assert purged == ["/tmp/cache"]
    await expect(card).to_have_class("approval answered")
    await expect(card.locator(".state")).to_have_text("approved")
    await expect(card.get_by_role("button", name="Approve", exact=True)).to_be_hidden()
    await expect(tab.locator("#events li.tool_call")).to_contain_text("approved")
    await expect(tab.locator("#events li.tool_result pre")).to_have_text(f"purged /tmp/cache {HOSTILE}")


async def test_an_approval_answered_over_http_and_on_the_page_at_once_runs_by_the_first_answer(
    page: tuple[Any, list[str]],
) -> None:
    """The page's answer arrives second: the card says what the first one was, and the call does not run."""
    tab, purged = page
    expect = async_api.expect

    async def denied_over_http_first(route: Any) -> None:
        path = route.request.url.split("/api/runs/")[1]  # RUN_ID/approvals/CALL_ID
        async with httpx.AsyncClient(base_url=tab.url) as client:
            answer = {"decision": "deny", "message": "not today"}
            assert (await client.post(f"/api/runs/{path}", json=answer)).status_code == 200
            run_id = path.split("/")[0]
            await finished(client, run_id)
        await route.continue_()

    await tab.route("**/approvals/*", denied_over_http_first)
    await tab.fill("#goal", "purge /srv")
    await tab.click("#start")
    card = tab.locator(".approval")
    await card.get_by_role("button", name="Approve", exact=True).click()
    await expect(card.locator(".error")).to_have_text(
        re.compile(
            r"tool call '\S+' of run '\w+' is not waiting for an answer: it was answered already \(denied\)"
        )
    )
    await expect(card.locator(".state")).to_have_text("denied")
    await expect(tab.locator("#stop-reason")).to_contain_text("final_answer")
    assert purged == []


async def test_deny_with_a_message_and_cancel(page: tuple[Any, list[str]]) -> None:
    tab, purged = page
    expect = async_api.expect
    await tab.fill("#goal", "purge /")
    await tab.click("#start")
    card = tab.locator(".approval")
    await card.get_by_role("textbox").fill("never the root")
    await card.get_by_role("button", name="Deny").click()
    await expect(tab.locator("#events li.tool_result")).to_contain_text("never the root")
    await expect(tab.locator("#stop-reason")).to_contain_text("final_answer")
    assert purged == []

    await tab.fill("#goal", "purge /var")  # a second run, cancelled while it waits for approval
    await tab.click("#start")
    await expect(tab.locator(".approval")).to_contain_text("purge")
    await tab.click("#cancel")
    await expect(tab.locator("#stop-reason")).to_contain_text("cancelled")
    await expect(tab.locator(".approval .state")).to_have_text("no answer needed any more")
    assert purged == []


async def test_bad_input_shows_the_servers_error(page: tuple[Any, list[str]]) -> None:
    tab, _ = page
    await tab.fill("#goal", "hi")
    await tab.fill("#max-steps", "99")
    await tab.click("#start")
    await async_api.expect(tab.locator("#start-error")).to_contain_text("above the server's limit of 6")


async def test_a_server_that_cannot_be_reached_is_said_so(page: tuple[Any, list[str]]) -> None:
    """Start while the server is down (here, the request fails on the way) said only 'Failed to fetch'."""
    tab, _ = page
    await tab.route("**/api/runs", lambda route: route.abort("connectionrefused"))
    await tab.fill("#goal", "hi")
    await tab.click("#start")
    await async_api.expect(tab.locator("#start-error")).to_have_text(
        re.compile(r"^cannot reach the server \(.+\): is it running\? Try again when it is back$")
    )
    await async_api.expect(tab.locator("#goal")).to_have_value("hi")  # kept, to start it again


async def test_a_run_that_fails_shows_its_error_and_long_unicode_output_as_text() -> None:
    expect = async_api.expect
    long_output = "Grüße aus 東京 ✓ " * 400 + HOSTILE

    @tool
    def fetch(url: str) -> str:
        """Fetch a page."""
        return long_output

    def reply(request: Any) -> Reply:
        goal = next(m.content for m in request.messages if m.role == "user")
        if goal == "fail":
            raise RuntimeError(f"the provider refused: {HOSTILE}")
        if request.messages[-1].role == "tool":
            return f"Fetched: {request.messages[-1].content[:40]}"
        return {"tool_calls": [{"name": "fetch", "args": {"url": HOSTILE}}]}

    agent = Agent(FunctionModel(reply), tools=[fetch], store=MemoryStore(), budget=Budget(max_steps=4))
    async with open_page(create_app(agent)) as tab:
        await tab.fill("#goal", "fail")
        await tab.click("#start")
        await expect(tab.locator("#stop-reason")).to_contain_text("Stopped: error")
        await expect(tab.locator("#stop-reason")).to_contain_text(f"the provider refused: {HOSTILE}")
        await expect(tab.locator("#events li.error pre")).to_contain_text(
            f"RuntimeError: the provider refused: {HOSTILE}"
        )
        await expect(tab.locator("#answer")).to_have_text("(no answer)")
        await expect(tab.locator("#cancel")).to_be_hidden()

        await tab.fill("#goal", f"fetch {HOSTILE}")
        await tab.click("#start")
        await expect(tab.locator("#stop-reason")).to_contain_text("final_answer")
        await expect(tab.locator("#run-goal")).to_have_text(f"fetch {HOSTILE}")
        assert json.loads(await tab.locator("#events li.tool_call pre").text_content() or "") == {
            "url": HOSTILE
        }
        shown = await tab.locator("#events li.tool_result pre").text_content() or ""
        assert shown.startswith("Grüße aus 東京 ✓ Grüße")  # text, as it came (cut by the loop's output limit)
        await expect(tab.locator("#answer")).to_have_text(f"Fetched: {long_output[:40]}")
        assert await tab.locator("#run-view img, #run-view script").count() == 0
        width = await tab.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1]  # long lines wrap: the page does not scroll sideways


async def test_after_the_server_restarted_the_page_shows_the_run_unfinished_and_resumes_it(
    tmp_path: Path,
) -> None:
    """The server stopped while a call waited for approval (the run saved unfinished): the page said
    nothing, and once the server was back it still showed the run running — Cancel (refused: 'not running
    in this server'), an approval card whose buttons answered nothing, and no Resume."""
    expect = async_api.expect
    purged: list[str] = []
    async with SQLiteStore(tmp_path / "runs.db") as store, browser_tab() as tab:
        async with serve(create_app(purging_agent(purged, store))) as first:
            await tab.goto(first.url + "/")
            await tab.fill("#goal", "purge /tmp/cache")
            await tab.click("#start")
            card = tab.locator(".approval")
            await expect(card.locator(".state")).to_have_text("waiting")
        await expect(tab.locator("#run-status")).to_contain_text("Lost the connection to the server")

        async with serve(create_app(purging_agent(purged, store)), port=first.port):  # back, as new
            await expect(tab.locator("#resume")).to_be_visible()
            await expect(tab.locator("#cancel")).to_be_hidden()
            await expect(tab.locator("#run-note")).to_contain_text("did not finish")
            await expect(card.locator(".state")).to_have_text(
                "not waiting any more: the run is not running in this server"
            )
            await expect(card.get_by_role("button", name="Approve", exact=True)).to_be_hidden()
            await expect(tab.locator("#runs li .badge")).to_have_text("unfinished")
            assert purged == []

            await tab.click("#resume")  # the call is asked again, on a card of its own
            asked_again = tab.locator(".approval").nth(1)
            await expect(asked_again.locator(".state")).to_have_text("waiting")
            await expect(tab.locator("#cancel")).to_be_visible()
            await asked_again.get_by_role("button", name="Approve", exact=True).click()
            await expect(tab.locator("#answer")).to_have_text(f"Done: purged /tmp/cache {HOSTILE}")
            await expect(tab.locator("#stop-reason")).to_contain_text("final_answer")
            await expect(tab.locator("#runs li .badge")).to_have_text("final_answer")
            seqs = await tab.locator("#events li").evaluate_all("(items) => items.map((i) => +i.dataset.seq)")
    assert seqs == list(range(1, len(seqs) + 1))  # one sequence across both servers: no gap, no duplicate
    assert purged == ["/tmp/cache"]


# ============================================================================ the token and resume


TOKEN = "page-Token_0123456789abcdefXYZ"


async def test_the_page_asks_for_the_token_once_and_sends_it_on_every_request() -> None:
    expect = async_api.expect
    async with open_page(create_app(purging_agent([]), token=TOKEN)) as tab:
        await expect(tab.locator("#login")).to_be_visible()
        await expect(tab.locator("#app")).to_be_hidden()
        await tab.fill("#token", "not-the-token")
        await tab.click("#token-submit")
        await expect(tab.locator("#token-error")).to_have_text(
            "The server refused this token: check it and enter it again."
        )
        await expect(tab.locator("#app")).to_be_hidden()

        await tab.fill("#token", TOKEN)
        await tab.click("#token-submit")
        await expect(tab.locator("#login")).to_be_hidden()
        await expect(tab.locator("#agent-info")).to_contain_text("tools: purge")
        await tab.fill("#goal", "What is 6*7?")
        await tab.click("#start")  # over HTTP with the header, then the events over the WebSocket
        await expect(tab.locator("#answer")).to_have_text(f"The answer is 42. {HOSTILE}")
        await expect(tab.locator("#stop-reason")).to_contain_text("final_answer")
        await expect(tab.locator("#events li.run_started")).to_have_count(1)
        assert await tab.evaluate("sessionStorage.getItem('thinkloop.token')") == TOKEN

        await tab.reload()  # the tab keeps the token: no second question
        await expect(tab.locator("#runs li")).to_have_count(1)
        await expect(tab.locator("#login")).to_be_hidden()

        await tab.evaluate("sessionStorage.setItem('thinkloop.token', 'changed-since')")
        await tab.reload()  # e.g. the server restarted with another token
        await expect(tab.locator("#token-error")).to_contain_text("refused this token")
        await expect(tab.locator("#app")).to_be_hidden()
        assert await tab.evaluate("sessionStorage.getItem('thinkloop.token')") is None


async def test_resume_an_interrupted_run_with_the_button() -> None:
    expect = async_api.expect
    store = crashing(MemoryStore, observed(1), after=True)()
    effects = Effects()
    await interrupt(store, effects)  # the process 'died' after step 1: fetch k1 done and saved
    logged = len(await store.read_events("r"))
    agent = Agent(ScriptedModel(SCRIPT, by_turn=True), tools=effects.tools, store=store)
    async with open_page(create_app(agent, token=TOKEN)) as tab:
        await tab.fill("#token", TOKEN)
        await tab.click("#token-submit")
        run = tab.locator("#runs li")
        await expect(run.locator(".badge")).to_have_text("unfinished")
        await run.click()
        await expect(tab.locator("#events li")).to_have_count(logged)
        await expect(tab.locator("#run-note")).to_contain_text("did not finish")
        await expect(tab.locator("#cancel")).to_be_hidden()

        await tab.click("#resume")
        await expect(tab.locator("#answer")).to_have_text("all done")
        await expect(tab.locator("#stop-reason")).to_contain_text("final_answer")
        await expect(tab.locator("#resume")).to_be_hidden()
        await expect(run.locator(".badge")).to_have_text("final_answer")
        seqs = [
            int(s)
            for s in await tab.locator("#events li").evaluate_all(
                "(items) => items.map((i) => i.dataset.seq)"
            )
        ]
        resumed = await tab.locator("#events li.run_started").all_text_contents()
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) > logged  # no gap, no duplicate
    assert [text.endswith("(resumed)") for text in resumed] == [False, True]
    assert effects.runs == ["fetch:k1", "send:bob", "fetch:k2"]  # fetch k1 not again


@contextlib.asynccontextmanager
async def live_thinkloop_process() -> AsyncIterator[dict[str, Any]]:
    """A live process whose command line names thinkloop (as `thinkloop run` in a terminal): its owner record."""
    other = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import sys; sys.stdin.read()", "thinkloop", "run", stdin=subprocess.PIPE
    )
    try:
        yield {"pid": other.pid, "host": socket.gethostname()}
    finally:
        await other.communicate(b"")


async def test_a_run_a_live_process_still_runs_is_resumed_only_with_resume_anyway(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The page showed the 409 of such a run with no way to force it: `{"force": true}` was API-only.

    The page knows that refusal by the answer's `"forceable": true`, not by its message (which it only
    shows): here the server words it without mentioning `{"force": true}`, and the button is offered all
    the same.
    """
    expect = async_api.expect

    def reworded(run_id: str, metadata: Mapping[str, Any], force: str) -> None:
        try:
            check_not_running(run_id, metadata, force)
        except StillRunningError:
            raise StillRunningError(f"process {owner['pid']} may be running run {run_id!r} still") from None

    monkeypatch.setattr(runs_module, "check_not_running", reworded)
    async with live_thinkloop_process() as owner:
        store = crashing(MemoryStore, observed(1), after=True)()
        effects = Effects()
        with pytest.raises(Crash):  # stopped after step 1 (fetch k1), still owned by that process
            await agent_for(store, effects).run("do the things", run_id="r", metadata={"cli": owner})
        async with open_page(create_app(agent_for(store, effects))) as tab:
            anyway = tab.get_by_role("button", name="Resume anyway")
            run = tab.locator("#runs li")
            await expect(run.locator(".badge")).to_have_text("unfinished")
            await run.click()
            await expect(tab.locator("#run-note")).to_contain_text("did not finish")
            await expect(anyway).to_be_hidden()

            await tab.click("#resume")  # refused: the page says why, and offers to force it
            await expect(tab.locator("#run-note")).to_have_text(
                f"process {owner['pid']} may be running run 'r' still"
            )
            await expect(anyway).to_be_visible()
            await expect(tab.locator("#force-resume")).to_contain_text("may still be running this run")
            await expect(tab.locator("#force-resume")).to_contain_text("a tool call could run twice")
            await expect(tab.locator("#resume")).to_be_enabled()
            state = await store.load_state("r")
            assert state is not None and not state.finished and state.metadata["cli"] == owner  # untouched
            assert effects.runs == ["fetch:k1"]

            await anyway.click()
            await expect(tab.locator("#answer")).to_have_text("all done", timeout=30_000)
            await expect(tab.locator("#stop-reason")).to_contain_text("final_answer")
            await expect(anyway).to_be_hidden()
            await expect(tab.locator("#resume")).to_be_hidden()
            await expect(run.locator(".badge")).to_have_text("final_answer")
            resumed = await tab.locator("#events li.run_started").all_text_contents()
        state = await store.load_state("r")
        assert state is not None and state.finished
        assert state.metadata["cli"] == {"pid": os.getpid(), "host": owner["host"]}  # the server's now
    assert [text.endswith("(resumed)") for text in resumed] == [False, True]
    assert effects.runs == ["fetch:k1", "send:bob", "fetch:k2"]  # fetch k1 not again


async def test_resume_anyway_is_offered_for_no_other_refusal() -> None:
    """A 409 that forcing cannot change (the run runs in this server already) and a 429 are only shown."""
    expect = async_api.expect
    store = crashing(MemoryStore, observed(1), after=True)()
    effects = Effects()
    await interrupt(store, effects, "r")
    store.armed = True  # type: ignore[attr-defined]  # dies again, in a second run
    await interrupt(store, effects, "late")
    gate = asyncio.Event()

    async def reply(request: Any) -> Reply:
        await gate.wait()  # a resumed run stays running until the test lets it answer
        return "all done"

    agent = Agent(FunctionModel(reply), tools=effects.tools, store=store)
    async with open_page(create_app(agent, max_active_runs=1)) as tab:
        anyway = tab.get_by_role("button", name="Resume anyway")
        await tab.locator('#runs li[data-run-id="r"]').click()
        await expect(tab.locator("#resume")).to_be_visible()
        async with httpx.AsyncClient(base_url=tab.url) as client:  # resumed elsewhere (another tab)
            assert (await client.post("/api/runs/r/resume", json={})).status_code == 202
        await expect(tab.locator("#events li.run_started")).to_have_count(2)
        await expect(tab.locator("#resume")).to_be_hidden()  # the page saw it go on: it runs here now
        await expect(tab.locator("#cancel")).to_be_visible()

        looks: list[str] = []

        async def looked_before(route: Any) -> None:  # the page's look at the run came just before
            await as_not_active(route)
            looks.append(route.request.url)

        await tab.route("**/api/runs/r", looked_before)
        await tab.locator('#runs li[data-run-id="r"]').click()
        await expect(tab.locator("#resume")).to_be_visible()
        # the replayed log's resumed `run_started` makes the page look again: let it have looked, else its
        # answer can come after the refusal below and put the note of an unfinished run back over it
        await expect(tab.locator("#events li.run_started")).to_have_count(2)
        for _ in range(500):
            if len(looks) >= 2:
                break
            await asyncio.sleep(0.01)
        assert len(looks) == 2, looks
        await expect(tab.locator("#run-note")).to_have_text(UNFINISHED_NOTE)
        await tab.route("**/api/runs/r/resume", offer_force_in_words)
        await tab.click("#resume")  # a message offering {"force": true} is no offer without "forceable"
        await expect(tab.locator("#run-note")).to_have_text(
            "run 'r' is running in this server already (the body {\"force\": true} cannot change that)"
        )
        await expect(tab.locator("#resume")).to_be_enabled()
        await expect(anyway).to_be_hidden()
        await tab.unroute("**/api/runs/r/resume")
        await tab.unroute("**/api/runs/r")

        await tab.locator('#runs li[data-run-id="late"]').click()  # the server's only slot is taken
        await tab.click("#resume")
        await expect(tab.locator("#run-note")).to_have_text(
            "the server is running 1 runs, its limit: try again when one has ended"
        )
        await expect(tab.locator("#resume")).to_be_enabled()
        await expect(anyway).to_be_hidden()

        gate.set()
        async with httpx.AsyncClient(base_url=tab.url) as client:
            await finished(client, "r")
        await tab.click("#resume")  # room again: resumed as usual
        await expect(tab.locator("#answer")).to_have_text("all done", timeout=30_000)
        await expect(anyway).to_be_hidden()
    assert effects.runs == ["fetch:k1", "fetch:k1"]  # one per run, before each stopped


UNFINISHED_NOTE = (
    "This run did not finish and is not running in this server (its process stopped?). Resume continues it "
    "from its last checkpoint; no finished tool call runs again."
)


async def as_not_active(route: Any) -> None:
    """The run's summary as it was before it was resumed: not running in this server."""
    response = await route.fetch()
    body = await response.json()
    body["run"]["active"] = False
    await route.fulfill(response=response, json=body)


async def offer_force_in_words(route: Any) -> None:
    """The server's answer with its message mentioning {"force": true}: the page must not take it for an offer."""
    response = await route.fetch()
    body = await response.json()
    assert response.status == 409 and list(body) == ["error"]
    body["error"] += ' (the body {"force": true} cannot change that)'
    await route.fulfill(response=response, json=body)
