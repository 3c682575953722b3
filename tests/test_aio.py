"""The event loop of thinkloop's own entry points: uvloop when installed, asyncio's on request."""

from __future__ import annotations

import asyncio
import sys

import pytest

from thinkloop import Agent, ConfigurationError, tool
from thinkloop._aio import ENV, new_event_loop, run
from thinkloop.testing import ScriptedModel


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


@pytest.mark.parametrize(
    ("choice", "module"), [(None, "uvloop"), ("asyncio", "asyncio")], ids=["auto", "asyncio"]
)
def test_entry_points_run_on_uvloop_when_installed_else_on_request_asyncio(
    monkeypatch: pytest.MonkeyPatch, choice: str | None, module: str
) -> None:
    if choice is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, choice)
    assert run(_loop_module()).startswith(module)
    loop = new_event_loop()
    try:
        assert type(loop).__module__.startswith(module)
    finally:
        loop.close()


def test_an_unknown_choice_or_a_missing_uvloop_asked_for_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV, "trio")
    with pytest.raises(ConfigurationError, match="use auto .* uvloop or asyncio"):
        run(_loop_module())
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if it were not installed
    monkeypatch.setenv(ENV, "uvloop")
    with pytest.raises(
        ConfigurationError, match=r"uvloop is not installed: pip install \"thinkloop\[fast\]\""
    ):
        run(_loop_module())
    monkeypatch.setenv(ENV, "")  # auto without uvloop: asyncio's loop, no error
    assert run(_loop_module()).startswith("asyncio")


@tool
async def where() -> str:
    """Name the event loop the tool runs on."""
    return await _loop_module()


@tool
def add(a: int, b: int) -> int:
    """Add two integers (a sync tool: run in a worker thread)."""
    return a + b


@pytest.mark.parametrize("choice", ["uvloop", "asyncio"])
def test_run_sync_works_the_same_on_both_loops(monkeypatch: pytest.MonkeyPatch, choice: str) -> None:
    monkeypatch.setenv(ENV, choice)
    calls = [{"name": "where", "args": {}}, {"name": "add", "args": {"a": 2, "b": 3}}]
    model = ScriptedModel([{"tool_calls": calls}, "done"])
    result = Agent(model, tools=[where, add]).run_sync("which loop?")
    assert result.output == "done" and result.tool_calls == 2
    outputs = [m.content for m in result.state.messages if m.role == "tool"]
    assert outputs[0].startswith(choice) and outputs[1] == "5"
