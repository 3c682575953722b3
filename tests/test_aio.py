"""The event loop of thinkloop's own entry points: uvloop when installed, asyncio's on request."""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
from collections.abc import Iterator

import pytest

from thinkloop import Agent, ConfigurationError, tool
from thinkloop._aio import ENV, GC_ENV, PYTHON_THRESHOLDS, YOUNG_THRESHOLD, new_event_loop, run
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


# ------------------------------------------------------------------------- the collector's thresholds


async def _threshold() -> tuple[int, int, int]:
    return gc.get_threshold()


@pytest.fixture
def python_thresholds() -> Iterator[None]:
    """Python's default collector thresholds around the test, whatever the test did."""
    before = gc.get_threshold()
    gc.set_threshold(*PYTHON_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)


@pytest.mark.usefixtures("python_thresholds")
def test_entry_points_raise_the_young_threshold_while_they_run_and_put_it_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(GC_ENV, raising=False)
    assert run(_threshold()) == (YOUNG_THRESHOLD, 10, 10)
    assert gc.get_threshold() == PYTHON_THRESHOLDS
    with pytest.raises(ZeroDivisionError):  # put back however the loop ends
        run(_divide_by_zero())
    assert gc.get_threshold() == PYTHON_THRESHOLDS
    model = ScriptedModel([{"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}]}, "5"])
    assert Agent(model, tools=[add]).run_sync("2+3?").output == "5"
    assert gc.get_threshold() == PYTHON_THRESHOLDS


async def _divide_by_zero() -> None:
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD
    1 / 0  # noqa: B018


@pytest.mark.usefixtures("python_thresholds")
def test_an_applications_own_thresholds_or_thinkloop_gc_python_are_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(GC_ENV, raising=False)
    gc.set_threshold(5000, 20, 20)
    assert run(_threshold()) == (5000, 20, 20)
    assert gc.get_threshold() == (5000, 20, 20)
    gc.set_threshold(*PYTHON_THRESHOLDS)
    monkeypatch.setenv(GC_ENV, "python")
    assert run(_threshold()) == PYTHON_THRESHOLDS
    monkeypatch.setenv(GC_ENV, "fast")
    with pytest.raises(ConfigurationError, match=r"THINKLOOP_GC='fast': use auto .* or python"):
        run(_threshold())
    assert gc.get_threshold() == PYTHON_THRESHOLDS


@pytest.mark.usefixtures("python_thresholds")
def test_overlapping_loops_in_threads_put_python_s_thresholds_back_when_the_last_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(GC_ENV, raising=False)
    first_in, release = threading.Event(), threading.Event()
    seen: dict[str, tuple[int, int, int]] = {}

    async def first() -> None:
        first_in.set()
        await asyncio.to_thread(release.wait, 30)
        seen["first, after the second ended"] = gc.get_threshold()

    async def second() -> None:
        seen["second"] = gc.get_threshold()

    thread = threading.Thread(target=run, args=(first(),))
    thread.start()
    assert first_in.wait(30)
    run(second())
    seen["between"] = gc.get_threshold()
    release.set()
    thread.join(30)
    assert not thread.is_alive()
    raised = (YOUNG_THRESHOLD, 10, 10)
    assert seen == {"second": raised, "between": raised, "first, after the second ended": raised}
    assert gc.get_threshold() == PYTHON_THRESHOLDS


@pytest.mark.usefixtures("python_thresholds")
def test_thresholds_changed_while_a_loop_runs_are_the_applications_and_stay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(GC_ENV, raising=False)

    async def retune() -> None:
        gc.set_threshold(3000, 10, 10)

    run(retune())
    assert gc.get_threshold() == (3000, 10, 10)
