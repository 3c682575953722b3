"""The server's web page in a real browser: Debian's Chromium, headless, driven by Playwright.

CI installs Chromium (`.ci/run`); the tests are skipped only where /usr/bin/chromium is absent.
Playwright's own browser download is never used (`executable_path`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from test_server import HOSTILE, serve
from thinkloop import Agent, Budget, RiskLevel, tool
from thinkloop.safety import PendingApprovals, SafetyController
from thinkloop.server import create_app
from thinkloop.stores import MemoryStore
from thinkloop.testing import FunctionModel, Reply

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


@pytest.fixture
async def page() -> AsyncIterator[tuple[Any, list[str]]]:
    purged: list[str] = []

    @tool(risk=RiskLevel.HIGH)
    def purge(target: str) -> str:
        """Delete everything under a target."""
        purged.append(target)
        return f"purged {target} {HOSTILE}"

    agent = Agent(
        FunctionModel(decide),
        tools=[purge],
        store=MemoryStore(),
        safety=SafetyController("balanced", approval=PendingApprovals()),
        budget=Budget(max_steps=6),
    )
    async with serve(create_app(agent)) as served, async_api.async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            tab = await browser.new_page()
            errors: list[str] = []
            tab.on("pageerror", lambda exc: errors.append(str(exc)))
            tab.on("dialog", lambda dialog: errors.append(f"dialog: {dialog.message}"))
            await tab.goto(served.url + "/")
            yield tab, purged
            assert errors == []
            assert await tab.title() == "thinkloop"  # no injected script ever ran
        finally:
            await browser.close()


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
