"""MCP tools (SPEC §3.6) against real servers: `mcp-server-time` and `mcp-server-git` from PyPI over
stdio, a small SDK server of our own over stdio (crash, list_changed), and one over Streamable HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import socket
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp.server.mcpserver import Context

from thinkloop import Agent, ConfigurationError, RiskLevel, ToolCall
from thinkloop import tool as make_tool
from thinkloop._events import ToolResultEvent
from thinkloop._execute import GateDecision
from thinkloop._tools import ToolArgumentsError
from thinkloop.mcp import (
    MCPConnectionError,
    MCPServer,
    MCPServerHTTP,
    MCPServerStdio,
    MCPToolError,
    input_schema,
    registry_with_mcp,
)
from thinkloop.testing import FunctionModel, ScriptedModel

TEST_SERVER = textwrap.dedent(
    '''
    import os
    from mcp.server.mcpserver import Context, MCPServer

    server = MCPServer("thinkloop-test")

    @server.tool()
    def echo(text: str) -> str:
        """Echo the text back."""
        return f"echo: {text}"

    @server.tool()
    def crash() -> str:
        """Exit the server process at once."""
        os._exit(3)

    @server.tool()
    async def add_tool(ctx: Context) -> str:
        """Add a tool named 'extra' and announce the change."""
        def extra() -> str:
            """An extra tool."""
            return "extra!"
        server.add_tool(extra, name="extra")
        await ctx.session.send_tool_list_changed()
        return "added"

    if __name__ == "__main__":
        server.run()
    '''
)


@pytest.fixture
async def time_server() -> AsyncIterator[MCPServerStdio]:
    server = MCPServerStdio.from_command_line("python -m mcp_server_time", name="time", prefix="time_")
    async with server:
        yield server


@pytest.fixture
def git_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)

    git("init", "-q", "-b", "main")
    git("config", "user.email", "test@example.com")
    git("config", "user.name", "Test")
    (repo / "README.md").write_text("hello\n")
    git("add", "README.md")
    git("commit", "-q", "-m", "Initial commit of the throw-away repo")
    (repo / "notes.txt").write_text("untracked\n")
    return repo


@pytest.fixture
async def git_server(git_repo: Path) -> AsyncIterator[MCPServerStdio]:
    server = MCPServerStdio(
        sys.executable, ["-m", "mcp_server_git", "--repository", str(git_repo)], name="git"
    )
    async with server:
        yield server


@pytest.fixture
def test_server_script(tmp_path: Path) -> Path:
    path = tmp_path / "server.py"
    path.write_text(TEST_SERVER)
    return path


def _staged(repo: Path) -> list[str]:
    out = subprocess.run(
        ["git", "diff", "--cached", "--name-only"], cwd=repo, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def _results(events: list[Any]) -> list[ToolResultEvent]:
    return [e for e in events if isinstance(e, ToolResultEvent)]


# ------------------------------------------------------------------------------------ time server


async def test_lists_the_time_servers_tools_as_thinkloop_tools(time_server: MCPServerStdio) -> None:
    tools = {t.name: t for t in await time_server.list_tools()}

    assert set(tools) == {"time_get_current_time", "time_convert_time"}
    current = tools["time_get_current_time"]
    assert current.parameters["required"] == ["timezone"]
    assert current.parameters["properties"]["timezone"]["type"] == "string"
    assert "title" not in current.parameters
    assert current.risk is RiskLevel.MEDIUM
    assert current.description.endswith("(MCP server time)")


async def test_tool_list_is_cached(time_server: MCPServerStdio) -> None:
    first = await time_server.list_tools()
    second = await time_server.list_tools()
    assert [t.name for t in first] == [t.name for t in second]
    assert first[0] is second[0]  # the same Tool objects: no second tools/list round trip


async def test_calls_get_current_time_with_a_timezone(time_server: MCPServerStdio) -> None:
    tool = next(t for t in await time_server.list_tools() if t.name == "time_get_current_time")
    text = await tool.invoke(tool.validate({"timezone": "Asia/Tokyo"}))

    data = json.loads(text)
    assert data["timezone"] == "Asia/Tokyo"
    assert data["datetime"].endswith("+09:00")


async def test_an_error_result_raises_naming_the_server(time_server: MCPServerStdio) -> None:
    with pytest.raises(MCPToolError, match=r"MCP server 'time' reported an error: .*Invalid timezone"):
        await time_server.call_tool("get_current_time", {"timezone": "Nowhere/Atlantis"})


async def test_agent_calls_an_mcp_tool_and_answers_with_its_result() -> None:
    def reply(request: Any) -> Any:
        tool_messages = [m for m in request.messages if m.role == "tool"]
        if not tool_messages:
            return {"tool_calls": [{"name": "time_get_current_time", "args": {"timezone": "Europe/Paris"}}]}
        data = json.loads(tool_messages[-1].content)
        return f"In Paris it is {data['datetime']}."

    server = MCPServerStdio.from_command_line("python -m mcp_server_time", name="time", prefix="time_")
    events: list[Any] = []
    async with Agent(FunctionModel(reply), mcp_servers=[server], on_event=events.append) as agent:
        assert server.connected
        result = await agent.run("What time is it in Paris?")
    assert not server.connected  # `async with agent` closed it

    (tool_result,) = _results(events)
    assert tool_result.success and tool_result.name == "time_get_current_time"
    assert result.ok
    assert result.output == f"In Paris it is {json.loads(tool_result.output)['datetime']}."


async def test_an_mcp_error_becomes_a_failed_observation_and_the_run_goes_on() -> None:
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "time_get_current_time", "args": {"timezone": "Nowhere/Atlantis"}}]},
            "That timezone does not exist.",
        ]
    )
    server = MCPServerStdio.from_command_line("python -m mcp_server_time", name="time", prefix="time_")
    events: list[Any] = []
    agent = Agent(model, mcp_servers=[server], on_event=events.append)
    try:
        result = await agent.run("Time in Atlantis?")  # connects lazily
        assert server.connected  # …and stays open for the next run
    finally:
        await agent.aclose()
    assert not server.connected

    (tool_result,) = _results(events)
    assert not tool_result.success
    assert tool_result.error_kind == "exception"
    assert "MCP server 'time' reported an error" in tool_result.output
    assert "Invalid timezone" in tool_result.output
    assert result.ok and result.output == "That timezone does not exist."


class _DenyAtOrAbove:
    """A test safety gate: refuses calls at or above a risk level, recording what it saw."""

    def __init__(self, level: RiskLevel) -> None:
        self.level = level
        self.seen: list[tuple[str, RiskLevel]] = []

    async def check(self, call: ToolCall, tool: Any, risk: RiskLevel, run: Any) -> GateDecision:
        self.seen.append((call.name, risk))
        if risk >= self.level:
            return GateDecision(False, "denied", reason="test policy")
        return GateDecision(True, "auto")


# ------------------------------------------------------------------------------------- git server


async def test_git_status_and_log_on_a_throw_away_repository(
    git_server: MCPServerStdio, git_repo: Path
) -> None:
    tools = {t.name: t for t in await git_server.list_tools()}
    assert {"git_status", "git_log", "git_add", "git_commit"} <= set(tools)

    status = await tools["git_status"].invoke({"repo_path": str(git_repo)})
    assert "notes.txt" in status
    log = await tools["git_log"].invoke({"repo_path": str(git_repo)})
    assert "Initial commit of the throw-away repo" in log


async def test_risk_levels_per_tool_and_from_trusted_annotations(git_repo: Path) -> None:
    server = MCPServerStdio(
        sys.executable,
        ["-m", "mcp_server_git", "--repository", str(git_repo)],
        name="git",
        trust_annotations=True,
        tool_risk={"git_commit": RiskLevel.CRITICAL},
    )
    async with server:
        risks = {t.name: t.risk for t in await server.list_tools()}
        idempotent = {t.name: t.idempotent for t in server.tools}
    assert risks["git_status"] is RiskLevel.LOW  # readOnlyHint
    assert risks["git_reset"] is RiskLevel.HIGH  # destructiveHint
    assert risks["git_add"] is RiskLevel.MEDIUM  # neither: the server's default
    assert risks["git_commit"] is RiskLevel.CRITICAL  # the explicit mapping wins
    assert idempotent["git_add"] and not idempotent["git_commit"]


async def test_the_safety_gate_applies_to_mcp_tools(git_repo: Path) -> None:
    server = MCPServerStdio(
        sys.executable,
        ["-m", "mcp_server_git", "--repository", str(git_repo)],
        name="git",
        tool_risk={"git_add": RiskLevel.HIGH},
    )
    gate = _DenyAtOrAbove(RiskLevel.HIGH)
    model = ScriptedModel(
        [
            {
                "tool_calls": [
                    {"name": "git_add", "args": {"repo_path": str(git_repo), "files": ["notes.txt"]}}
                ]
            },
            "I was not allowed to stage the file.",
        ]
    )
    events: list[Any] = []
    async with Agent(model, mcp_servers=[server], safety=gate, on_event=events.append) as agent:
        result = await agent.run("Stage notes.txt")

    assert gate.seen == [("git_add", RiskLevel.HIGH)]
    (tool_result,) = _results(events)
    assert tool_result.error_kind == "denied" and not tool_result.success
    staged = _staged(git_repo)
    assert staged == []  # the MCP tool was never called
    assert result.output == "I was not allowed to stage the file."


async def test_an_allowed_mcp_call_has_its_real_effect(git_server: MCPServerStdio, git_repo: Path) -> None:
    agent = Agent(
        ScriptedModel(
            [
                {
                    "tool_calls": [
                        {"name": "git_add", "args": {"repo_path": str(git_repo), "files": ["notes.txt"]}}
                    ]
                },
                "Staged.",
            ]
        ),
        mcp_servers=[git_server],
        safety=_DenyAtOrAbove(RiskLevel.HIGH),
    )
    result = await agent.run("Stage notes.txt")
    staged = _staged(git_repo)
    assert staged == ["notes.txt"]
    assert result.output == "Staged."


# -------------------------------------------------------------------- our own server: crash, change


async def test_a_server_that_dies_mid_run_fails_the_call_and_the_run_goes_on(
    test_server_script: Path,
) -> None:
    server = MCPServerStdio(sys.executable, [str(test_server_script)], name="flaky")
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "echo", "args": {"text": "before"}}]},
            {"tool_calls": [{"name": "crash", "args": {}}]},
            {"tool_calls": [{"name": "echo", "args": {"text": "after"}}]},
            "The server went away.",
        ]
    )
    events: list[Any] = []
    agent = Agent(model, mcp_servers=[server], on_event=events.append)
    try:
        result = await agent.run("Use the flaky server")
        outcomes = [(r.name, r.success, r.output) for r in _results(events)]
        assert outcomes[0] == ("echo", True, "echo: before")
        assert outcomes[1][:2] == ("crash", False)
        assert "MCP server 'flaky' died during the call of 'crash'" in outcomes[1][2]
        assert "Connection closed" in outcomes[1][2] and "the next run reconnects it" in outcomes[1][2]
        assert outcomes[2][:2] == ("echo", False)
        assert "MCP server 'flaky' died earlier" in outcomes[2][2]
        assert result.ok and result.output == "The server went away."
        assert not server.connected

        # the next run connects a fresh server process
        second = Agent(
            ScriptedModel([{"tool_calls": [{"name": "echo", "args": {"text": "again"}}]}, "ok"]),
            mcp_servers=[server],
            on_event=events.append,
        )
        await second.run("again")
        assert _results(events)[-1].output == "echo: again"
    finally:
        await agent.aclose()


async def test_tool_list_refreshed_after_list_changed(test_server_script: Path) -> None:
    async with MCPServerStdio(sys.executable, [str(test_server_script)], name="changing") as server:
        assert [t.name for t in await server.list_tools()] == ["echo", "crash", "add_tool"]
        assert await server.call_tool("add_tool", {}) == "added"
        for _ in range(200):  # the notification may land just after the tool's result
            if "extra" in [t.name for t in await server.list_tools()]:
                break
            await asyncio.sleep(0.01)
        tools = {t.name: t for t in await server.list_tools()}
        assert "extra" in tools
        assert await tools["extra"].invoke({}) == "extra!"


STORM = Path(__file__).parent / "mcp_servers" / "storm.py"


def _mcp_tasks() -> list[asyncio.Task[Any]]:
    """This loop's background tasks of MCP servers (refreshes, pings)."""
    return [
        t
        for t in asyncio.all_tasks()
        if t.get_name().startswith(("mcp-tools:", "mcp-ping:")) and not t.done()
    ]


async def test_a_server_announcing_a_change_at_every_listing_is_not_listed_without_end() -> None:
    """Before, each listing's announcement started the next listing: thousands of them, every call waited
    `connect_timeout` for a refresh that never settled, and the refresh ran on until the server closed."""
    server = MCPServerStdio("python", [str(STORM), "echo"], name="storm", connect_timeout=20)
    model = ScriptedModel([{"tool_calls": [{"name": "listings", "args": {}}]} for _ in range(3)] + ["done"])
    events: list[Any] = []
    loop = asyncio.get_running_loop()
    async with Agent(model, mcp_servers=[server], on_event=events.append) as agent:
        start = loop.time()
        result = await agent.run("how often were you listed?")
        took = loop.time() - start
        await asyncio.sleep(0.5)  # a storm would go on meanwhile
        listed = int(await server.call_tool("listings", {}))
    assert result.output == "done" and all(r.success for r in _results(events))
    assert took < 15  # before: each of the 3 calls waited connect_timeout (20 s) for the refresh
    assert listed <= 8  # the run's listing, and a few back to back (before: thousands)
    assert not _mcp_tasks()  # nothing left running after the connection closed


async def test_a_call_waits_briefly_for_a_refresh_that_does_not_come() -> None:
    """Before, a call announcing a change waited `connect_timeout` for the refresh to land."""
    async with MCPServerStdio("python", [str(STORM), "hang"], name="stalled", connect_timeout=30) as server:
        await server.list_tools()
        assert await asyncio.wait_for(server.call_tool("announce", {}), 10) == "announced"
        assert [t.get_name() for t in _mcp_tasks()] == ["mcp-tools:stalled"]  # still waiting for tools/list
        assert await asyncio.wait_for(server.call_tool("listings", {}), 10) == "2"
    assert not _mcp_tasks()  # the refresh waiting for an answer ends with the connection


async def test_after_a_storm_listings_pause_but_a_change_announced_later_is_fetched_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("thinkloop.mcp._RELIST_PAUSE", (60.0, 60.0))
    monkeypatch.setattr("thinkloop.mcp._QUIET", 0.5)
    async with MCPServerStdio("python", [str(STORM), "echo"], name="storm") as server:
        await server.list_tools()
        for _ in range(500):  # the listing and its echoes, 3 of them back to back
            if not _mcp_tasks():
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.7)  # quiet
        versions = server.tools_version
        assert await server.call_tool("listings", {}) == "4"  # paused, for 60 s
        assert await server.call_tool("announce", {}) == "announced"  # fetched before the result returns
        assert server.tools_version > versions
        assert await server.call_tool("listings", {}) == "7"  # and its echoes: 3 back to back, then a pause


async def test_a_tool_added_during_a_run_can_be_called_in_that_run(test_server_script: Path) -> None:
    server = MCPServerStdio(sys.executable, [str(test_server_script)], name="changing")
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "add_tool", "args": {}}]},
            {"tool_calls": [{"name": "extra", "args": {}}]},
            "done",
        ]
    )
    events: list[Any] = []
    async with Agent(model, mcp_servers=[server], on_event=events.append) as agent:
        result = await agent.run("add a tool, then use it")
    assert [(r.name, r.success, r.output) for r in _results(events)] == [
        ("add_tool", True, "added"),
        ("extra", True, "extra!"),
    ]
    assert "extra" in [t.name for t in model.requests[1].tools]  # shown to the model in the next step
    assert result.output == "done"


async def test_a_tool_added_during_a_run_under_a_taken_name_is_left_out_with_a_warning(
    test_server_script: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, the server's new `extra` was dropped without a word: the developer never learnt why the
    model could not reach it."""

    @make_tool
    def extra() -> str:
        """The agent's own extra tool."""
        return "the agent's extra"

    server = MCPServerStdio(sys.executable, [str(test_server_script)], name="changing")
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "add_tool", "args": {}}]},
            {"tool_calls": [{"name": "extra", "args": {}}]},
            "done",
        ]
    )
    events: list[Any] = []
    async with Agent(model, tools=[extra], mcp_servers=[server], on_event=events.append) as agent:
        await agent.run("add a tool, then use it")
    assert [r.output for r in _results(events)] == ["added", "the agent's extra"]
    assert (
        "tool name 'extra' of MCP server 'changing' is already taken by the agent's tools; give the server a "
        "prefix, e.g. prefix='changing_' (its changed tool list offers it: left out)" in caplog.text
    )


async def test_a_result_that_is_not_a_tool_result_is_a_failed_call_and_the_server_stays_usable() -> None:
    async with _faulty() as server:
        await server.list_tools()
        with pytest.raises(MCPToolError) as info:
            await asyncio.wait_for(server.call_tool("bad_result", {}), 30)
        assert str(info.value) == (
            "MCP server 'faulty': call of 'bad_result' failed: content: Input should be a valid list; "
            "isError: Input should be a valid boolean, unable to interpret input"
        )
        assert await asyncio.wait_for(server.call_tool("echo", {"text": "x"}), 30) == "echo: x"


async def test_allowed_tools_filter(test_server_script: Path) -> None:
    async with MCPServerStdio(
        sys.executable, [str(test_server_script)], name="s", allowed_tools={"echo"}
    ) as server:
        assert [t.name for t in await server.list_tools()] == ["echo"]


async def test_duplicate_tool_names_are_a_clear_error(test_server_script: Path) -> None:
    first = MCPServerStdio(sys.executable, [str(test_server_script)], name="one")
    second = MCPServerStdio(sys.executable, [str(test_server_script)], name="Two Server")
    try:
        with pytest.raises(
            ConfigurationError,
            match=r"'echo' of MCP server 'Two Server' is already taken by MCP server 'one'.*prefix='two_server_'",
        ):
            await registry_with_mcp([], [first, second])
        registry = await registry_with_mcp(
            [], [first, MCPServerStdio(sys.executable, [str(test_server_script)], name="t", prefix="t_")]
        )
        assert "t_echo" in registry and "echo" in registry
    finally:
        await first.aclose()
        await second.aclose()


async def test_an_mcp_tool_clashing_with_an_agent_tool_is_rejected(test_server_script: Path) -> None:
    def echo(text: str) -> str:
        """A local echo."""
        return text

    server = MCPServerStdio(sys.executable, [str(test_server_script)], name="srv")
    agent = Agent(ScriptedModel(["unused"]), tools=[echo], mcp_servers=[server])
    try:
        with pytest.raises(ConfigurationError, match="already taken by the agent's tools"):
            await agent.run("hi")
    finally:
        await agent.aclose()


# ------------------------------------------------------------------------------- connection errors


async def test_a_server_that_exits_at_start_is_a_connection_error_quoting_its_stderr() -> None:
    server = MCPServerStdio(
        sys.executable, ["-c", "import sys; sys.stderr.write('no such database'); sys.exit(3)"], name="broken"
    )
    with pytest.raises(MCPConnectionError, match=r"cannot connect to MCP server 'broken'.*no such database"):
        await server.connect()
    assert not server.connected


async def test_a_missing_command_is_a_connection_error() -> None:
    server = MCPServerStdio("/nonexistent/mcp-server", name="ghost")
    with pytest.raises(MCPConnectionError, match=r"MCP server 'ghost' \(/nonexistent/mcp-server\)"):
        await server.connect()


async def test_a_silent_server_times_out_the_handshake() -> None:
    server = MCPServerStdio(
        sys.executable, ["-c", "import time; time.sleep(60)"], name="mute", connect_timeout=0.5
    )
    with pytest.raises(MCPConnectionError, match="did not complete the handshake within 0.5 s"):
        await server.connect()
    assert not server.connected


async def test_a_failing_server_fails_the_agent_before_the_run() -> None:
    server = MCPServerStdio(sys.executable, ["-c", "raise SystemExit(1)"], name="dead")
    model = ScriptedModel(["unused"])
    with pytest.raises(MCPConnectionError):
        async with Agent(model, mcp_servers=[server]):
            pass
    assert model.requests == []


def test_from_command_line_splits_like_a_shell() -> None:
    server = MCPServerStdio.from_command_line("python -m mcp_server_git --repository '/tmp/a repo'")
    assert server.command == sys.executable
    assert server.args == ["-m", "mcp_server_git", "--repository", "/tmp/a repo"]
    assert server.name == "python -m mcp_server_git --repository '/tmp/a repo'"
    with pytest.raises(ConfigurationError):
        MCPServerStdio.from_command_line("   ")


def test_bad_settings_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError):
        MCPServerHTTP("localhost:8000/mcp")
    with pytest.raises(ConfigurationError):
        MCPServerStdio("x", connect_timeout=0)


@pytest.mark.parametrize("setting", [{"connect_timeout": math.nan}, {"timeout": math.nan}, {"timeout": -1}])
def test_a_timeout_that_is_not_a_positive_number_is_a_configuration_error(setting: dict[str, float]) -> None:
    """Before, NaN was accepted: asyncio.timeout(nan) fires at once, so every connection (or call) of the
    server failed as timed out 'within nan s'."""
    with pytest.raises(
        ConfigurationError, match=r"MCP server 'x': timeouts must be positive numbers of seconds"
    ):
        MCPServerStdio("x", name="x", **setting)


def test_run_sync_twice_reconnects_in_each_event_loop() -> None:
    server = MCPServerStdio.from_command_line("python -m mcp_server_time", name="time")
    script = [{"tool_calls": [{"name": "get_current_time", "args": {"timezone": "Etc/UTC"}}]}, "done"]
    for _ in range(2):
        events: list[Any] = []
        agent = Agent(ScriptedModel(script), mcp_servers=[server], on_event=events.append)
        assert agent.run_sync("time?").output == "done"
        assert _results(events)[0].success


# -------------------------------------------------------------------------------- Streamable HTTP


@pytest.fixture
async def http_url() -> AsyncIterator[str]:
    uvicorn = pytest.importorskip("uvicorn")
    from mcp.server.mcpserver import MCPServer as SDKServer

    app_server = SDKServer("http-test")

    @app_server.tool()
    def shout(text: str) -> str:
        """Upper-case the text."""
        return text.upper()

    @app_server.tool()
    def header(name: str, ctx: Context) -> str:
        """Return a request header."""
        return (ctx.headers or {}).get(name, "(absent)")

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    http = uvicorn.Server(uvicorn.Config(app_server.streamable_http_app(), log_level="error"))
    task = asyncio.create_task(http.serve(sockets=[sock]))
    for _ in range(1000):
        if http.started:
            break
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        http.should_exit = True
        await task
        sock.close()


async def test_streamable_http_server(http_url: str) -> None:
    server = MCPServerHTTP(
        http_url, headers={"X-Tenant": "acme"}, name="web", prefix="web_", risk=RiskLevel.LOW
    )
    model = ScriptedModel(
        [
            {
                "tool_calls": [
                    {"name": "web_shout", "args": {"text": "hello"}},
                    {"name": "web_header", "args": {"name": "x-tenant"}},
                ]
            },
            "HELLO acme",
        ]
    )
    events: list[Any] = []
    async with Agent(model, mcp_servers=[server], on_event=events.append) as agent:
        result = await agent.run("shout")
        assert {t.name: t.risk for t in server.tools} == {
            "web_shout": RiskLevel.LOW,
            "web_header": RiskLevel.LOW,
        }
    assert [(r.name, r.output) for r in _results(events)] == [("web_shout", "HELLO"), ("web_header", "acme")]
    assert result.output == "HELLO acme"


async def test_an_unreachable_http_server_is_a_connection_error() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    server = MCPServerHTTP(f"http://127.0.0.1:{port}/mcp", name="nobody", connect_timeout=5)
    with pytest.raises(MCPConnectionError, match="MCP server 'nobody'"):
        await server.connect()


@contextlib.asynccontextmanager
async def _serving(app: Any, port: int = 0) -> AsyncIterator[int]:
    """`app` (ASGI) served by uvicorn on 127.0.0.1 (`port`, or a free one); yields the port."""
    uvicorn = pytest.importorskip("uvicorn")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the same port again after a stop
    sock.bind(("127.0.0.1", port))
    http = uvicorn.Server(uvicorn.Config(app, log_level="critical"))
    task = asyncio.create_task(http.serve(sockets=[sock]))
    for _ in range(1000):
        if http.started:
            break
        await asyncio.sleep(0.01)
    try:
        yield sock.getsockname()[1]
    finally:
        http.should_exit = True
        await task
        sock.close()


def _answering(status: int, *, unless: Callable[[bytes], bool] = lambda body: False, app: Any = None) -> Any:
    """An ASGI app answering every POST with an HTML error page of `status` — except those whose body
    `unless` accepts, which `app` answers."""

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            if app is not None:
                await app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        if app is not None and unless(body):
            sent = False

            async def replay() -> Any:
                nonlocal sent
                if sent:
                    return await receive()
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}

            await app(scope, replay, send)
            return
        await send(
            {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"text/html")]}
        )
        await send({"type": "http.response.body", "body": b"<html><title>Error</title></html>"})

    return asgi


@pytest.mark.parametrize(
    ("status", "says"),
    [
        (500, "HTTP 500 Internal Server Error (text/html): the server failed; see its log"),
        (
            401,
            "HTTP 401 Unauthorized (text/html): check its credentials (headers={'Authorization': 'Bearer …'})",
        ),
        (
            404,
            "HTTP 404 Not Found (text/html): check the URL (the server's MCP endpoint, often ending in /mcp)",
        ),
    ],
)
async def test_an_http_server_answering_an_error_status_is_a_connection_error_naming_it(
    status: int, says: str
) -> None:
    """Before: 'cannot connect to MCP server …: MCPError: Server returned an error response' (or 'Not
    Found'), saying neither the status nor what to check."""
    async with _serving(_answering(status)) as port:
        server = MCPServerHTTP(f"http://127.0.0.1:{port}/mcp", name="web", connect_timeout=10)
        with pytest.raises(MCPConnectionError) as info:
            await server.connect()
    message = str(info.value)
    assert message.startswith(f"cannot connect to MCP server 'web' (http://127.0.0.1:{port}/mcp): ")
    assert message.endswith(f"; it answered {says}")


def _sdk_http_app() -> Any:
    from mcp.server.mcpserver import MCPServer as SDKServer

    app_server = SDKServer("http-test")

    @app_server.tool()
    def shout(text: str) -> str:
        """Upper-case the text."""
        return text.upper()

    return app_server.streamable_http_app()


async def test_an_http_error_status_on_a_call_is_a_failed_observation_naming_it() -> None:
    app = _answering(500, unless=lambda body: b'"boom"' not in body, app=_sdk_http_app())
    async with _serving(app) as port:
        server = MCPServerHTTP(f"http://127.0.0.1:{port}/mcp", name="web", connect_timeout=10)
        model = ScriptedModel(
            [
                {"tool_calls": [{"name": "shout", "args": {"text": "boom"}}]},
                {"tool_calls": [{"name": "shout", "args": {"text": "fine"}}]},
                "done",
            ]
        )
        events: list[Any] = []
        async with Agent(model, mcp_servers=[server], on_event=events.append) as agent:
            result = await agent.run("shout twice")
    assert [(r.success, r.output) for r in _results(events)] == [
        (
            False,
            "Error: shout raised MCPToolError: MCP server 'web': call of 'shout' failed: MCPError: Server "
            "returned an error response (it answered HTTP 500 Internal Server Error (text/html): the server "
            "failed; see its log)",
        ),
        (True, "FINE"),  # the session stays usable
    ]
    assert result.output == "done"


async def test_an_http_server_that_went_away_is_reconnected_once_it_is_back() -> None:
    """A remote server being restarted (a deploy): before, the first call after it went away failed as 'died
    during the call' (the call never reached it: the connection was refused) and the rest of the run went
    without the server, even once it was back."""
    events: list[Any] = []

    @make_tool
    async def restart_the_server() -> str:
        """Stop the web server, or start it again."""
        if stopped.is_set():
            started.set()
            await _until(lambda: serving.is_set())
            return "started"
        stopped.set()
        await _until(lambda: served.done())
        return "stopped"

    stopped, started, serving = asyncio.Event(), asyncio.Event(), asyncio.Event()
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def serve() -> None:
        async with _serving(_sdk_http_app()) as port:
            bound.set_result(port)
            serving.set()
            await stopped.wait()
        serving.clear()
        await started.wait()
        async with _serving(_sdk_http_app(), port):
            serving.set()
            await asyncio.sleep(3600)

    served = asyncio.ensure_future(serve())
    try:
        server = MCPServerHTTP(f"http://127.0.0.1:{await bound}/mcp", name="web", connect_timeout=10)
        model = ScriptedModel(
            [
                {"tool_calls": [{"name": "shout", "args": {"text": "a"}}]},
                {"tool_calls": [{"name": "restart_the_server", "args": {}}]},  # stops it
                {"tool_calls": [{"name": "shout", "args": {"text": "b"}}]},
                {"tool_calls": [{"name": "shout", "args": {"text": "c"}}]},
                {"tool_calls": [{"name": "restart_the_server", "args": {}}]},  # starts it on the same port
                {"tool_calls": [{"name": "shout", "args": {"text": "d"}}]},
                "back",
            ]
        )
        async with Agent(
            model, tools=[restart_the_server], mcp_servers=[server], on_event=events.append
        ) as agent:
            result = await agent.run("shout, with the server going away and coming back")
    finally:
        served.cancel()
        await asyncio.wait([served])
    outputs = [r.output for r in _results(events)]
    assert outputs[:2] == ["A", "stopped"]
    assert outputs[2] == (
        "Error: shout raised MCPToolError: MCP server 'web' could not be reached for the call of 'shout' "
        "(ConnectError: All connection attempts failed): the call did not reach it; the next call tries to "
        "reconnect"
    )
    assert outputs[3].startswith(
        "Error: shout raised MCPToolError: MCP server 'web' could not be reached (ConnectError: All connection "
        "attempts failed), and could not be reconnected for the call of 'shout': cannot connect to MCP server "
        f"'web' ({server.url}): "
    )
    assert outputs[3].endswith("; the next call tries again")
    assert outputs[4:] == ["started", "D"]
    assert result.output == "back"


def test_public_surface() -> None:
    assert issubclass(MCPServerStdio, MCPServer) and issubclass(MCPServerHTTP, MCPServer)


# ------------------------------------------------------------------ a misbehaving server (faulty.py)

FAULTY = Path(__file__).parent / "mcp_servers" / "faulty.py"


def _faulty(*flags: str, **options: Any) -> MCPServerStdio:
    return MCPServerStdio("python", [str(FAULTY), *flags], name="faulty", **options)


async def test_tool_names_are_made_valid_for_every_model_api_and_unique() -> None:
    async with _faulty("--tool-names") as server:
        names = [t.name for t in await server.list_tools()]
        assert names[-6:] == ["get_weather_", "get_weather__2", "ns_tool_v2", "_9lives", "x" * 64, "echelle"]
        assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]{0,63}", n) for n in names)  # OpenAI rejects '.'
        model = ScriptedModel(
            [
                {
                    "tool_calls": [
                        {"name": "ns_tool_v2", "args": {"text": "hi"}},
                        {"name": "get_weather__2", "args": {"text": "?"}},
                    ]
                },
                "done",
            ]
        )
        events: list[Any] = []
        await Agent(model, mcp_servers=[server], on_event=events.append).run("go")
        assert [r.output for r in _results(events)] == [
            "ns/tool.v2: hi",
            "get weather?: ?",
        ]  # the server's own names


def _alive(pid: int) -> bool:
    """Whether a process runs (a zombie waiting for its parent to reap it does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


async def _dies(pid: int) -> bool:
    """Whether the process is gone within 10 s (a signal takes a moment to land on a busy machine)."""
    for _ in range(200):
        if not _alive(pid):
            return True
        await asyncio.sleep(0.05)
    return False


def _our_children() -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid()
            ):
                children.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return [pid for pid in children if _alive(pid)]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
async def test_closing_kills_what_the_server_left_running() -> None:
    async with _faulty() as server:
        await server.list_tools()
        helper = int(await server.call_tool("spawn", {}))
        assert _alive(helper)
    # the server exits cleanly when its stdin closes, so the SDK never killed its process group
    assert await _dies(helper)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
async def test_closing_the_agent_with_a_call_in_flight_leaves_no_process() -> None:
    before = set(_our_children())
    calling = asyncio.Event()
    model = ScriptedModel([{"tool_calls": [{"name": "hang", "args": {}}]}, "gave up"])
    agent = Agent(
        model, mcp_servers=[_faulty()], on_event=lambda e: calling.set() if e.type == "tool_call" else None
    )
    run = asyncio.create_task(agent.run("hang"))
    await calling.wait()
    assert set(_our_children()) - before  # the server runs, the call is on its way
    await agent.aclose()
    result = await asyncio.wait_for(run, 30)
    assert result.output == "gave up"  # the call in flight became a failed observation
    assert (
        "MCP server 'faulty' was closed during the call of 'hang'" in model.requests[1].messages[-1].content
    )
    assert set(_our_children()) - before == set()


async def test_a_hanging_call_times_out_and_the_connection_stays_usable() -> None:
    async with _faulty(timeout=0.5) as server:
        model = ScriptedModel([{"tool_calls": [{"name": "hang", "args": {}}]}, "done"])
        events: list[Any] = []
        await Agent(model, mcp_servers=[server], on_event=events.append).run("go")
        assert [r.output for r in _results(events)] == [
            "Error: hang was abandoned: it timed out after 0.5 s."
        ]
        # the same connection answers the next call (not bounded by the 0.5 s meant for `hang`: a busy
        # machine may take that long to answer a call that succeeds)
        assert server.connected
        assert (
            await asyncio.wait_for(server.call_tool("echo", {"text": "still here"}), 30) == "echo: still here"
        )


async def test_content_kinds_and_error_results_from_a_real_server() -> None:
    async with _faulty() as server:
        await server.list_tools()
        assert await server.call_tool("image", {}) == "[image: image/png, 100 bytes, not shown]"  # not 102
        assert (
            await server.call_tool("resource", {}) == "[resource: file:///notes.txt, text/plain]\nthe notes"
        )
        assert await server.call_tool("blob", {}) == "[resource: file:///a.bin, binary, 2 bytes, not shown]"
        assert (
            await server.call_tool("link", {})
            == "[resource link: file:///report.pdf (report, application/pdf)] the quarterly report"
        )
        assert await server.call_tool("mixed", {}) == "a recording:\n[audio: audio/wav, 4 bytes, not shown]"
        assert await server.call_tool("empty", {}) == "(no output)"
        assert len(await server.call_tool("huge", {"size": 2_000_000})) == 2_000_000  # truncated by the agent
        with pytest.raises(MCPToolError, match="MCP server 'faulty' reported an error: no such city"):
            await server.call_tool("fail", {})
        with pytest.raises(MCPToolError) as empty:
            await server.call_tool("fail_empty", {})
        assert (
            str(empty.value) == "MCP server 'faulty' reported an error: (an error result without any content)"
        )


async def test_garbage_on_stdout_does_not_break_the_connection() -> None:
    async with _faulty("--banner") as server:  # prints a banner line before speaking MCP
        await server.list_tools()
        assert await server.call_tool("garbage", {}) == "after garbage"  # a non-JSON line mid-session
        assert await server.call_tool("echo", {"text": "x"}) == "echo: x"


async def test_a_server_that_never_answers_the_handshake_times_out_and_is_stopped() -> None:
    before = set(_our_children())
    server = _faulty("--no-handshake", connect_timeout=1)
    with pytest.raises(MCPConnectionError, match="did not complete the handshake within 1 s"):
        await server.connect()
    assert set(_our_children()) - before == set()


async def test_a_server_dying_with_several_calls_in_flight_fails_each_saying_so() -> None:
    """Before, only the first call to fail said the server died; the others said it 'was closed during the
    call' — as though the application had closed it."""
    model = ScriptedModel(
        [
            {
                "tool_calls": [
                    {"name": "hang", "args": {}},
                    {"name": "hang", "args": {}},
                    {"name": "crash", "args": {}},
                ]
            },
            "done",
        ]
    )
    events: list[Any] = []
    async with Agent(model, mcp_servers=[_faulty()], on_event=events.append) as agent:
        result = await asyncio.wait_for(agent.run("three at once"), 60)
    outputs = [r.output for r in _results(events)]
    assert len(outputs) == 3 and result.output == "done"
    for output, name in zip(outputs, ["hang", "hang", "crash"], strict=True):
        assert f"MCP server 'faulty' died during the call of '{name}' (its connection closed: " in output


async def _until(condition: Any) -> bool:
    """Whether `condition()` holds within 10 s (a process's exit takes a moment to be noticed)."""
    for _ in range(200):
        if condition():
            return True
        await asyncio.sleep(0.05)
    return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
async def test_a_server_that_exits_between_runs_is_started_again_by_the_next_run() -> None:
    """A service's agent (`async with agent:`) whose server exited while idle: before, the next run kept the
    dead connection — its first call failed as 'died during the call of echo' (it had died long before) and
    the whole run went without the server, though the docs promise that the next run reconnects it."""
    server = _faulty()
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "exit_soon", "args": {}}]},
            "it said bye",
            {"tool_calls": [{"name": "echo", "args": {"text": "anyone?"}}]},
            "back",
        ]
    )
    events: list[Any] = []
    before = set(_our_children())
    async with Agent(model, mcp_servers=[server], on_event=events.append) as agent:
        (process,) = set(_our_children()) - before
        assert (await agent.run("first")).output == "it said bye"
        assert await _dies(process)  # it exits while idle, 0.2 s after answering
        assert await _until(lambda: not server.connected)
        result = await agent.run("again")
        (restarted,) = set(_our_children()) - before
    assert [(r.success, r.output) for r in _results(events)] == [(True, "bye"), (True, "echo: anyone?")]
    assert result.output == "back" and restarted != process


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
async def test_a_server_that_exits_between_calls_is_started_again_for_the_next_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Within one run: the call after the exit never reached the dead server, so it is safe to make it on a
    new one (before: 'died during the call of echo', and the rest of the run without the server)."""
    server = _faulty()

    @make_tool
    async def wait_for_the_exit() -> str:
        """Wait until the server's exit is noticed."""
        return "gone" if await _until(lambda: not server.connected) else "still there"

    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "exit_soon", "args": {}}]},
            {"tool_calls": [{"name": "wait_for_the_exit", "args": {}}]},
            {"tool_calls": [{"name": "echo", "args": {"text": "anyone?"}}]},
            "back",
        ]
    )
    events: list[Any] = []
    async with Agent(model, tools=[wait_for_the_exit], mcp_servers=[server], on_event=events.append) as agent:
        result = await agent.run("exit, then echo")
    assert [r.output for r in _results(events)] == ["bye", "gone", "echo: anyone?"]
    assert result.output == "back"
    assert "MCP server 'faulty' exited while no call was running" in caplog.text
    assert "; started again for the call of 'echo'" in caplog.text


async def test_a_server_that_exits_and_cannot_be_started_again_fails_the_call_clearly(tmp_path: Path) -> None:
    server = _faulty("--once", str(tmp_path / "started"))
    async with server:
        await server.list_tools()
        assert await server.call_tool("exit_soon", {}) == "bye"
        assert await _until(lambda: not server.connected)
        with pytest.raises(MCPToolError) as info:
            await asyncio.wait_for(server.call_tool("echo", {"text": "anyone?"}), 30)
        message = str(info.value)
        assert message.startswith(
            "MCP server 'faulty' exited while no call was running, and could not be started again for the "
            "call of 'echo': cannot connect to MCP server 'faulty' ("
        )
        assert "this server starts only once" in message  # what its stderr said
        assert message.endswith("; this run cannot use it any more, the next run tries again")
        with pytest.raises(MCPToolError, match=r"MCP server 'faulty' died earlier \(it exited while no call"):
            await server.call_tool("echo", {"text": "still?"})  # not started a third time in this run


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
async def test_a_server_that_stops_answering_after_a_timed_out_call_is_started_again() -> None:
    """`block` blocks the server's event loop: it answers nothing any more. Before, every later call of the
    run waited its whole timeout in vain; now a ping after the abandoned call finds it wedged, it is stopped,
    and the next call starts it again."""
    before = set(_our_children())
    server = _faulty(timeout=0.5)
    try:
        await server.connect()  # the handshake may be slow on a loaded machine; only the ping is timed
        server.connect_timeout = 1  # the ping's limit: min(connect_timeout, PING_TIMEOUT)
        (process,) = set(_our_children()) - before
        model = ScriptedModel([{"tool_calls": [{"name": "block", "args": {}}]}, "gave up"])
        events: list[Any] = []
        await Agent(model, mcp_servers=[server], on_event=events.append).run("go")
        assert [r.output for r in _results(events)] == [
            "Error: block was abandoned: it timed out after 0.5 s."
        ]
        server.connect_timeout = 30
        pid = await asyncio.wait_for(server.call_tool("pid", {}), 60)  # waits for the ping, then restarts
        assert int(pid) != process and await _dies(process)
        assert set(_our_children()) - before == {int(pid)}
    finally:
        await server.aclose()


async def test_a_server_still_answering_after_a_timed_out_call_keeps_its_process() -> None:
    async with _faulty(timeout=0.5) as server:
        pid = await server.call_tool("pid", {})
        model = ScriptedModel([{"tool_calls": [{"name": "hang", "args": {}}]}, "done"])
        events: list[Any] = []
        await Agent(model, mcp_servers=[server], on_event=events.append).run("go")
        assert [r.success for r in _results(events)] == [False]
        assert await asyncio.wait_for(server.call_tool("pid", {}), 30) == pid  # the ping was answered


# ------------------------------------------------------------------- tool input schemas from the wild

LISTING = Path(__file__).parent / "mcp_servers" / "listing.py"


def _listing(result: Any, **options: Any) -> MCPServerStdio:
    """A server whose tools/list answer is `result` (any JSON value), exactly as given."""
    return MCPServerStdio("python", [str(LISTING), json.dumps(result)], name="wild", **options)


def _assert_valid_object_schema(schema: dict[str, Any]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["type"] == "object" and isinstance(schema["properties"], dict)
    assert set(schema.get("required", [])) <= set(schema["properties"])
    assert all(isinstance(p, dict) for p in schema["properties"].values())
    assert "$ref" not in json.dumps(schema) and "$defs" not in schema


WILD_TOOLS = [
    {"name": "string_root", "inputSchema": {"type": "string"}},
    {"name": "no_type", "inputSchema": {"properties": {"q": {"type": "string"}}, "required": ["q"]}},
    {"name": "no_schema"},
    {"name": "schema_is_text", "inputSchema": "object"},
    {
        "name": "odd_properties",
        "inputSchema": {
            "type": "object",
            "properties": {
                "any": True,
                "text": "a string",
                "gone": False,
                "nothing": None,
                "n": {"type": "integer"},
            },
            "required": ["n", "ghost", 3, "n"],
        },
    },
    {"name": "properties_list", "inputSchema": {"type": "object", "properties": ["a", "b"], "required": "a"}},
    {
        "name": "refs",
        "inputSchema": {
            "type": "object",
            "properties": {
                "point": {"$ref": "#/$defs/Point", "description": "where"},
                "tree": {"$ref": "#/$defs/Tree"},
                "lost": {"$ref": "#/$defs/Missing"},
                "far": {"$ref": "https://example.com/schema.json"},
            },
            "required": ["point"],
            "$defs": {
                "Point": {
                    "type": "object",
                    "properties": {"x": {"type": "integer", "minimum": 0}, "y": {"type": "integer"}},
                    "required": ["x", "y"],
                },
                "Tree": {
                    "type": "object",
                    "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Tree"}}},
                },
            },
        },
    },
    {
        "name": "root_union",
        "inputSchema": {
            "anyOf": [
                {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                {
                    "type": "object",
                    "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                    "required": ["lat", "lon"],
                },
            ]
        },
    },
    {
        "name": "verbose",
        "description": "word " * 2_000,
        "inputSchema": {
            "type": "object",
            "properties": {"q": {"type": "string", "description": "q" * 5_000}},
        },
    },
    {"name": "bad_output_schema", "inputSchema": {"type": "object"}, "outputSchema": {"type": "array"}},
    {"inputSchema": {"type": "object"}},  # no name: left out
    "not a tool at all",
]


async def test_wild_input_schemas_become_valid_object_schemas(caplog: pytest.LogCaptureFixture) -> None:
    async with _listing({"tools": WILD_TOOLS}) as server:
        tools = {t.name: t for t in await server.list_tools()}

    assert list(tools) == [t["name"] for t in WILD_TOOLS if isinstance(t, dict) and "name" in t]
    for tool in tools.values():
        _assert_valid_object_schema(tool.parameters)
    for name in ("string_root", "no_schema", "schema_is_text", "properties_list", "bad_output_schema"):
        assert tools[name].parameters == {"type": "object", "properties": {}}
    assert tools["no_type"].parameters == {
        "type": "object",
        "properties": {"q": {"type": "string"}},
        "required": ["q"],
    }
    assert tools["odd_properties"].parameters == {
        "type": "object",
        "properties": {"any": {}, "text": {}, "nothing": {}, "n": {"type": "integer"}},
        "required": ["n"],
    }
    refs = tools["refs"].parameters["properties"]
    assert refs["point"] == {
        "type": "object",
        "properties": {"x": {"type": "integer", "minimum": 0}, "y": {"type": "integer"}},
        "required": ["x", "y"],
        "description": "where",
    }
    assert refs["tree"]["properties"]["children"] == {"type": "array", "items": {}}  # recursion cut
    assert refs["lost"] == {} and refs["far"] == {}
    assert set(tools["root_union"].parameters["properties"]) == {"city", "lat", "lon"}
    assert "anyOf" not in tools["root_union"].parameters
    assert len(tools["verbose"].description) <= 1024
    assert tools["verbose"].description.endswith("… (MCP server wild)")
    assert len(tools["verbose"].parameters["properties"]["q"]["description"]) == 1024
    assert "listed a tool without a name" in caplog.text


async def test_arguments_are_checked_against_the_servers_own_schema() -> None:
    model = ScriptedModel(
        [
            {
                "tool_calls": [
                    {"name": "refs", "args": {"point": {"x": -1, "y": 2}}},  # minimum, inside a $ref
                    {"name": "refs", "args": {"point": {"x": 1}}},  # y required, inside a $ref
                    {"name": "root_union", "args": {"lat": 1.5}},  # the root anyOf: city, or lat and lon
                    {"name": "odd_properties", "args": {"n": 1, "gone": 2}},  # a `false` property
                ]
            },
            {
                "tool_calls": [
                    {
                        "name": "refs",
                        "args": {"point": {"x": 1, "y": 2}, "tree": {"children": [{"children": []}]}},
                    },
                    {"name": "root_union", "args": {"city": "Oslo"}},
                    {"name": "odd_properties", "args": {"n": 1, "any": [1, "x"]}},  # `ghost` is not required
                    {"name": "string_root", "args": {"whatever": 1}},
                ]
            },
            "done",
        ]
    )
    events: list[Any] = []
    async with Agent(model, mcp_servers=[_listing({"tools": WILD_TOOLS})], on_event=events.append) as agent:
        result = await agent.run("use the wild tools")
    refused, accepted = _results(events)[:4], _results(events)[4:]
    assert [r.error_kind for r in refused] == ["invalid_arguments"] * 4
    assert "point.x: -1 is less than the minimum of 0" in refused[0].output
    assert "point: 'y' is a required property" in refused[1].output
    assert "root_union" in refused[2].output
    assert "gone" in refused[3].output
    assert [json.loads(r.output) for r in accepted] == [
        {"tool": "refs", "arguments": {"point": {"x": 1, "y": 2}, "tree": {"children": [{"children": []}]}}},
        {"tool": "root_union", "arguments": {"city": "Oslo"}},
        {"tool": "odd_properties", "arguments": {"any": [1, "x"], "n": 1}},
        {"tool": "string_root", "arguments": {"whatever": 1}},
    ]
    assert result.output == "done"


SLUG = "^([a-z0-9]+-?)+$"  # a plausible hand-written pattern: exponential backtracking in `re`
EVIL = "^(a|a)*$"  # exponential in `regex` too
BACKTRACKING_TOOLS: list[Any] = [
    {
        "name": "slug",
        "inputSchema": {"type": "object", "properties": {"name": {"type": "string", "pattern": SLUG}}},
    },
    {
        "name": "evil",
        "inputSchema": {
            "type": "object",
            "properties": {"q": {"type": "string", "pattern": EVIL}, "n": {"type": "integer", "minimum": 0}},
        },
    },
    {
        "name": "keys",
        "inputSchema": {
            "type": "object",
            "properties": {
                "labels": {
                    "type": "object",
                    "patternProperties": {EVIL: {"type": "integer"}},
                    "additionalProperties": False,
                },
                "tags": {"type": "object", "propertyNames": {"pattern": EVIL}},
            },
        },
    },
]


async def test_a_backtracking_pattern_in_a_servers_schema_does_not_block_the_event_loop() -> None:
    """Before, `pattern` was checked with `re` on the event loop: 28 letters and a `_` against the server's
    `^([a-z0-9]+-?)+$` stalled the whole agent for seconds (doubling with each letter), past any timeout."""
    hostile = "a" * 28 + "_"
    evil = "a" * 40 + "!"
    model = ScriptedModel(
        [
            {
                "tool_calls": [
                    {"name": "slug", "args": {"name": hostile}},  # refused, quickly
                    {"name": "slug", "args": {"name": "a-good-slug"}},
                    {"name": "evil", "args": {"q": evil, "n": -1}},  # the rest is still checked
                    {"name": "evil", "args": {"q": evil, "n": 1}},  # the pattern: left to the server
                    {"name": "keys", "args": {"labels": {evil: "x"}, "tags": {evil: 1}}},
                ]
            },
            "done",
        ]
    )
    gaps: list[float] = []
    loop = asyncio.get_running_loop()

    async def ticker() -> None:
        last = loop.time()
        while True:
            await asyncio.sleep(0.02)
            now = loop.time()
            gaps.append(now - last)
            last = now

    events: list[Any] = []
    async with Agent(
        model, mcp_servers=[_listing({"tools": BACKTRACKING_TOOLS})], on_event=events.append
    ) as agent:
        ticking = asyncio.create_task(ticker())
        try:
            result = await agent.run("use the tools")
        finally:
            ticking.cancel()
    assert result.output == "done"
    outcomes = [(r.success, r.error_kind, r.output) for r in _results(events)]
    assert outcomes[0][:2] == (False, "invalid_arguments")
    assert f"name: '{hostile}' does not match '{SLUG}'" in outcomes[0][2]
    assert (
        outcomes[2][:2] == (False, "invalid_arguments")
        and "n: -1 is less than the minimum of 0" in outcomes[2][2]
    )
    assert [json.loads(o[2]) for o in outcomes if o[0]] == [
        {"tool": "slug", "arguments": {"name": "a-good-slug"}},
        {"tool": "evil", "arguments": {"q": evil, "n": 1}},
        {"tool": "keys", "arguments": {"labels": {evil: "x"}, "tags": {evil: 1}}},
    ]
    assert max(gaps) < 2  # the loop kept turning (before: stalled ~12 s for the slug, minutes for the rest)


async def test_ref_schemas_from_an_sdk_server_are_inlined_and_still_enforced() -> None:
    async with _faulty("--bad-schemas") as server:
        tools = {t.name: t for t in await server.list_tools()}
        point = tools["with_ref"].parameters["properties"]["point"]
        assert point["properties"] == {"x": {"type": "integer"}, "y": {"type": "integer"}}
        assert tools["broken"].parameters["properties"] == {"n": {}}  # "no-such-type" dropped
        assert tools["dangling_ref"].parameters["properties"] == {"p": {}}
        for tool in tools.values():
            _assert_valid_object_schema(tool.parameters)
        with pytest.raises(ToolArgumentsError, match=r"point.y: 'two' is not of type 'integer'"):
            tools["with_ref"].validate({"point": {"x": 1, "y": "two"}})
        assert tools["dangling_ref"].validate({"p": 1}) == {"p": 1}  # nothing to check it against
        assert (
            await tools["with_ref"].invoke({"point": {"x": 1, "y": 2}})
            == "with_ref: {'point': {'x': 1, 'y': 2}}"
        )


WILD_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -1.5,
    "",
    "object",
    [],
    [{}],
    {},
    {"type": None},
    {"type": ["object", 3]},
    {"type": "object", "properties": None},
    {"type": "object", "properties": {"a": {"type": "strnig"}}},
    {"properties": {"a": {"properties": {"type": {"type": "string"}}}}},  # a property named `type`
    {"$ref": "#"},
    {"$ref": "#/definitions/A", "definitions": {"A": {"$ref": "#/definitions/A"}}},
    {"$ref": 7},
    {"$ref": "#/properties/0"},
    {"properties": {"a": {"$ref": "#/properties/a"}}},
    {"properties": {"a": {"anyOf": [True, False, 3, {"type": "string"}]}}},
    {"properties": {"a": {"items": [1, 2], "enum": [], "description": 5, "required": [1]}}},
    {"required": None, "additionalProperties": "no"},
    {"allOf": [{"required": ["x"]}, False]},
]


@pytest.mark.parametrize("raw", WILD_VALUES, ids=lambda v: json.dumps(v)[:40])
def test_input_schema_makes_any_json_value_a_valid_object_schema(raw: Any) -> None:
    schema = input_schema(raw)
    _assert_valid_object_schema(schema)
    json.dumps(schema)  # plain JSON


def test_input_schema_survives_deep_nesting_and_exponential_references() -> None:
    deep: Any = {"type": "string"}
    for _ in range(5_000):
        deep = {"type": "object", "properties": {"a": deep}}
    _assert_valid_object_schema(input_schema(deep))
    defs = {
        f"D{i}": {
            "type": "object",
            "properties": {"l": {"$ref": f"#/$defs/D{i + 1}"}, "r": {"$ref": f"#/$defs/D{i + 1}"}},
        }
        for i in range(40)
    }
    bomb = input_schema({"$ref": "#/$defs/D0", "$defs": defs})  # 2**40 nodes if inlined naively
    _assert_valid_object_schema(bomb)
    assert len(json.dumps(bomb)) < 1_000_000


def test_input_schema_keeps_a_valid_schema_as_it_is() -> None:
    schema = {
        "type": "object",
        "properties": {
            "timezone": {"type": "string", "description": "IANA name", "enum": ["UTC", "Europe/Oslo"]},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
            "opts": {
                "type": "object",
                "properties": {"type": {"type": "string"}},
                "additionalProperties": False,
            },
        },
        "required": ["timezone"],
        "additionalProperties": False,
    }
    assert input_schema(schema) == schema
    assert (
        input_schema({**schema, "title": "Args", "$schema": "http://json-schema.org/draft-07/schema#"})
        == schema
    )


# ------------------------------------------------------------------------- tools/list that fails


async def test_a_tools_list_that_is_not_mcp_is_a_clear_error() -> None:
    with pytest.raises(
        MCPConnectionError,
        match=r"MCP server 'wild' .* cannot be used: its tools/list answer is not valid MCP "
        r"\(tools: Input should be a valid list\); the server is broken or speaks another MCP version",
    ):
        async with _listing({"tools": "nope"}) as server:
            await server.list_tools()


async def test_a_failing_tools_list_is_a_clear_error_before_the_run() -> None:
    server = MCPServerStdio("python", [str(LISTING), "error"], name="locked")
    model = ScriptedModel(["unused"])
    with pytest.raises(
        MCPConnectionError,
        match=r"MCP server 'locked' .* its tools/list failed: MCPError: database of tools is locked; check",
    ):
        async with Agent(model, mcp_servers=[server]) as agent:
            await agent.run("hi")
    assert model.requests == [] and not server.connected


async def test_a_tools_list_answer_that_never_comes_is_bounded_by_connect_timeout() -> None:
    server = _listing("not even an object")  # unreadable: no answer ever arrives
    try:
        await server.connect()  # the handshake may be slow on a loaded machine; only tools/list is timed
        server.connect_timeout = 1
        with pytest.raises(
            MCPConnectionError,
            match=r"did not answer tools/list within 1 s \(its connection reported: .*"
            r"JSONRPCResponse.result: Input should be an object.*raise connect_timeout",
        ):
            await asyncio.wait_for(server.list_tools(), 20)
    finally:
        await server.aclose()


def test_a_server_connected_in_a_running_loop_refuses_another_threads_loop_clearly() -> None:
    """Two threads, each `run_sync` (its own event loop), one server object: the second used the first
    loop's connection from its own loop (or, reconnecting, cut the first one off mid-run)."""
    import threading

    server = MCPServerStdio.from_command_line("python -m mcp_server_time", name="time")
    inside, release = threading.Event(), threading.Event()

    @make_tool
    def hold() -> str:
        """Wait until the test lets go."""
        inside.set()
        assert release.wait(60)
        return "held"

    script = [
        {"tool_calls": [{"name": "hold", "args": {}}]},
        {"tool_calls": [{"name": "get_current_time", "args": {"timezone": "Etc/UTC"}}]},
        "done",
    ]
    outcome: dict[str, Any] = {}

    def first() -> None:
        events: list[Any] = []
        agent = Agent(ScriptedModel(script), tools=[hold], mcp_servers=[server], on_event=events.append)
        outcome["first"] = (
            agent.run_sync("hold, then the time").output,
            [r.success for r in _results(events)],
        )

    thread = threading.Thread(target=first, daemon=True)
    thread.start()
    try:
        assert inside.wait(60)
        other = Agent(ScriptedModel(["unused"]), mcp_servers=[server])
        with pytest.raises(
            MCPConnectionError, match=r"connected in another event loop .* give each thread its own"
        ):
            other.run_sync("the time?")
    finally:
        release.set()
        thread.join(60)
    assert outcome["first"] == ("done", [True, True])  # the first run's connection was left alone
