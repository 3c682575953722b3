"""Built-in operations tools: shell, workspace files, analyze_output, builtin_tools (SPEC §3.7)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from thinkloop import Agent, Budget, ConfigurationError, ModelRequest, RiskLevel, Tool
from thinkloop.testing import FunctionModel, ScriptedModel
from thinkloop.tools import (
    BUILTIN_TOOL_NAMES,
    ShellCommandError,
    Workspace,
    WorkspaceError,
    analyze_output,
    analyze_text,
    builtin_tools,
    file_tools,
    load_hosts,
    shell_tool,
)


async def shell(tool: Tool, command: str) -> dict[str, Any]:
    result = await tool.invoke(tool.validate({"command": command}))
    assert isinstance(result, dict)
    return result


# -------------------------------------------------------------------------------------------- shell


@pytest.fixture
def real_tmp(tmp_path: Path) -> Path:
    """`tmp_path` with symlinks resolved (what `pwd` prints)."""
    return tmp_path.resolve()


async def test_shell_returns_exit_code_stdout_stderr_and_duration(real_tmp: Path) -> None:
    tool = shell_tool(cwd=real_tmp)
    ok = await shell(tool, "echo hello; echo oops >&2; pwd")
    assert ok["exit_code"] == 0
    assert ok["stdout"] == f"hello\n{real_tmp}\n"
    assert ok["stderr"] == "oops\n"
    assert ok["timed_out"] is False and ok["duration"] >= 0
    failed = await shell(tool, "exit 3")
    assert failed["exit_code"] == 3
    missing = await shell(tool, "no-such-command-xyz")
    assert missing["exit_code"] == 127 and "not found" in missing["stderr"]


async def test_shell_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    tool = shell_tool(cwd=tmp_path, timeout=0.5)
    # a background child that would outlive the shell: it must die with the process group
    result = await shell(tool, "sleep 60 & echo $!; sleep 60")
    assert result["timed_out"] is True
    assert result["exit_code"] is None
    assert "timed out after 0.5 s" in result["stderr"]
    child = int(result["stdout"].split()[0])  # output written before the timeout is kept
    assert not _alive(child)


async def test_shell_returns_when_the_command_detaches_a_background_job(tmp_path: Path) -> None:
    tool = shell_tool(cwd=tmp_path, timeout=20)
    result = await shell(tool, "sleep 60 >/dev/null 2>&1 & echo $!")
    child = int(result["stdout"])
    try:
        assert (result["exit_code"], result["timed_out"]) == (0, False)
        assert _alive(child, grace=0)  # a properly detached job is left running
    finally:
        os.kill(child, signal.SIGKILL)


async def test_shell_timeout_returns_while_the_command_floods_its_output(tmp_path: Path) -> None:
    # `yes` filled the PIPE transport, which was paused when the readers were cancelled at the timeout:
    # process.wait() then waited forever for a pipe nobody read (the call hung past any timeout)
    tool = shell_tool(cwd=tmp_path, timeout=0.5, output_limit=1_000)
    result = await asyncio.wait_for(shell(tool, "yes"), 60)  # hang guard only
    assert result["timed_out"] is True and result["exit_code"] is None
    assert result["stdout"].startswith("y\ny\n") and len(result["stdout"]) <= 1_000


async def test_shell_timeout_kills_background_children_after_the_shell_exited(tmp_path: Path) -> None:
    # the shell exits at once, its background child keeps stdout open: the group was not killed because
    # the shell (its leader) had already exited, so `sleep` outlived the call
    tool = shell_tool(cwd=tmp_path, timeout=0.5)
    result = await asyncio.wait_for(shell(tool, "sleep 60 & echo $!"), 60)
    child = int(result["stdout"])
    assert result["timed_out"] is True and result["exit_code"] is None
    assert "The shell had exited (code 0), but a background process kept its output open" in result["stderr"]
    assert "cmd >cmd.log 2>&1 &" in result["stderr"]  # what to do instead
    assert not _alive(child)


@pytest.mark.parametrize(
    ("command", "problem"),
    [
        ("", "the command is empty: give a shell command to run"),
        ("  \n\t", "the command is empty"),
        ("echo a\x00b", "contains a NUL character"),
        ("echo \ud800", "contains invalid Unicode"),
        ("echo " + "a" * 200_000, "the command is 200,005 bytes long, more than the 131,071 bytes"),
    ],
)
async def test_shell_commands_that_cannot_run_are_refused_with_a_reason(
    tmp_path: Path, command: str, problem: str
) -> None:
    with pytest.raises(ShellCommandError, match=re.escape(problem)):
        await shell(shell_tool(cwd=tmp_path), command)


async def test_a_refused_command_is_an_error_observation(tmp_path: Path) -> None:
    model = ScriptedModel([{"tool_calls": [{"name": "shell", "args": {"command": ""}}]}, "ok"])
    result = await Agent(model, tools=[shell_tool(cwd=tmp_path)]).run("run nothing")
    observation = [m for m in result.state.messages if m.role == "tool"][0].content
    assert observation == (
        "Error: shell raised ShellCommandError: the command is empty: give a shell command to run, e.g. 'ls -la'"
    )


async def test_shell_output_of_hundreds_of_megabytes_is_streamed_not_kept(tmp_path: Path) -> None:
    tool = shell_tool(cwd=tmp_path, timeout=120, output_limit=2_000)
    result = await shell(tool, "head -c 300000000 /dev/zero | tr '\\0' x; printf '\\377END'")
    assert result["exit_code"] == 0 and len(result["stdout"]) <= 2_000
    assert result["stdout"].startswith("xxx") and result["stdout"].endswith("\ufffdEND")  # invalid UTF-8 kept
    assert "bytes not kept" in result["stdout"]


def _alive(pid: int, grace: int = 200) -> bool:
    """True if `pid` runs (a killed process not yet reaped by init is a zombie: not running)."""
    for _ in range(grace + 1):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return False
        if state in ("Z", "X"):
            return False
        time.sleep(0.01)  # SIGKILL delivery is asynchronous
    return True


async def test_binary_output_is_described_not_shown(tmp_path: Path) -> None:
    # `cat image.png` gave the model 8,000 characters of replacement characters and control codes
    tool = shell_tool(cwd=tmp_path)
    (tmp_path / "image.png").write_bytes(bytes(range(256)) * 400)  # 102,400 bytes
    result = await shell(tool, "cat image.png; echo done >&2")
    assert result["stdout"] == (
        "[binary output: 102,400 bytes, not shown; to look into it, pipe it through 'xxd | head', "
        "'strings | head' or 'file -']"
    )
    assert result["stderr"] == "done\n" and result["exit_code"] == 0
    result = await shell(tool, "printf 'a.txt\\0b.txt\\0'; printf 'caf\\351 ok'")  # mostly text: kept
    assert result["stdout"] == "a.txt\x00b.txt\x00caf\ufffd ok"


async def test_a_command_killed_by_a_signal_says_so(tmp_path: Path) -> None:
    # exit_code -9 and an empty stderr: nothing told the model its command had been killed
    result = await shell(shell_tool(cwd=tmp_path), "echo started; kill -9 $$")
    assert (result["exit_code"], result["stdout"], result["timed_out"]) == (-9, "started\n", False)
    assert result["stderr"] == "[the shell was killed by signal 9 (SIGKILL)]"
    assert (await shell(shell_tool(cwd=tmp_path), "exit 3"))["stderr"] == ""
    result = await shell(shell_tool(cwd=tmp_path), "printf oops >&2; kill -TERM $$")
    assert result["stderr"] == "oops\n[the shell was killed by signal 15 (SIGTERM)]"


async def test_shell_passes_only_allow_listed_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("THINKLOOP_TEST_SECRET", "s3cr3t-token")
    monkeypatch.setenv("THINKLOOP_TEST_VISIBLE", "visible-value")
    tool = shell_tool(cwd=tmp_path, env_allowlist=("PATH", "THINKLOOP_TEST_VISIBLE"), env={"EXTRA": "x1"})
    result = await shell(tool, "env")
    assert "s3cr3t-token" not in result["stdout"]
    assert "THINKLOOP_TEST_VISIBLE=visible-value" in result["stdout"]
    assert "EXTRA=x1" in result["stdout"]
    default = await shell(shell_tool(cwd=tmp_path), "env")
    assert "s3cr3t-token" not in default["stdout"]
    assert "PATH=" in default["stdout"]


async def test_shell_output_is_truncated_keeping_head_and_tail(tmp_path: Path) -> None:
    tool = shell_tool(cwd=tmp_path, output_limit=1_000)
    result = await shell(tool, "echo FIRST; seq 1 200000; echo LAST")
    assert len(result["stdout"]) <= 1_000
    assert result["stdout"].startswith("FIRST\n")
    assert result["stdout"].rstrip().endswith("LAST")
    assert "truncated" in result["stdout"]
    assert result["exit_code"] == 0


def test_shell_risk_comes_from_the_classifier(tmp_path: Path) -> None:
    tool = shell_tool(cwd=tmp_path)
    assert tool.risk_for({"command": "ls -la"}) is RiskLevel.LOW
    assert tool.risk_for({"command": "rm -rf /"}) is RiskLevel.CRITICAL
    assert tool.idempotent is False


def test_shell_configuration_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="does not exist"):
        shell_tool(cwd=tmp_path / "missing")
    with pytest.raises(ConfigurationError, match="positive"):
        shell_tool(timeout=0)


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"env": {"COUNT": 3}}, "the value of COUNT must be a string without NUL characters, not 3"),
        ({"env": {"A=B": "x"}}, "invalid environment variable name 'A=B'"),
        ({"env": {"": "x"}}, "invalid environment variable name ''"),
        ({"env": {"A": "x\x00y"}}, "the value of A must be a string without NUL"),
        ({"env_allowlist": "PATH"}, "a list of variable names, not one string: write ['PATH']"),
        (
            {"timeout": float("nan")},
            "timeout must be a positive number of seconds",
        ),  # killed every command at once
        ({"output_limit": 1.5}, "output_limit a positive whole number"),
    ],
)
def test_shell_settings_of_the_wrong_type_are_refused_when_the_tool_is_made(
    settings: dict[str, Any], problem: str
) -> None:
    # they were accepted, and every call then failed with a bare TypeError or ValueError
    with pytest.raises(ConfigurationError, match=re.escape(problem)):
        shell_tool(**settings)


async def test_a_working_directory_removed_after_the_tool_was_made_is_named(tmp_path: Path) -> None:
    gone = tmp_path / "work"
    gone.mkdir()
    tool = shell_tool(cwd=gone)
    gone.rmdir()
    with pytest.raises(ShellCommandError) as info:  # was "could not start /bin/sh: No such file or directory"
        await tool.invoke({"command": "echo hi"})
    assert str(info.value).startswith(f"the working directory '{gone}' no longer exists")


async def test_shell_in_an_agent_run(tmp_path: Path) -> None:
    model = ScriptedModel(
        [{"tool_calls": [{"name": "shell", "args": {"command": "echo 42"}}]}, "It said 42."]
    )
    result = await Agent(model, tools=[shell_tool(cwd=tmp_path)]).run("run echo")
    observation = json.loads([m for m in result.state.messages if m.role == "tool"][0].content)
    assert observation["stdout"] == "42\n" and observation["exit_code"] == 0


# -------------------------------------------------------------------------------------------- files


@pytest.fixture
def workspace(tmp_path: Path) -> tuple[Path, Path, dict[str, Tool]]:
    root = tmp_path / "ws"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret")
    (root / "notes.txt").write_text("hello notes")
    (root / "sub").mkdir()
    (root / "sub" / "inner.txt").write_text("inner")
    return root, outside, {t.name: t for t in file_tools(root)}


async def invoke(tool: Tool, **args: Any) -> Any:
    return await tool.invoke(tool.validate(args))


async def test_file_tools_read_write_list(workspace: tuple[Path, Path, dict[str, Tool]]) -> None:
    root, _, tools = workspace
    assert await invoke(tools["read_file"], path="notes.txt") == "hello notes"
    assert await invoke(tools["read_file"], path="sub/../notes.txt") == "hello notes"
    assert (
        await invoke(tools["write_file"], path="new/dir/a.txt", content="abc")
        == "wrote 3 characters to new/dir/a.txt"
    )
    await invoke(tools["write_file"], path="new/dir/a.txt", content="def", append=True)
    assert (root / "new" / "dir" / "a.txt").read_text() == "abcdef"
    listing = await invoke(tools["list_dir"])
    assert listing.splitlines() == [".: 3 entries", "new/", "notes.txt  11 bytes", "sub/"]
    assert "inner.txt  5 bytes" in await invoke(tools["list_dir"], path="sub")


def test_file_tool_risks(workspace: tuple[Path, Path, dict[str, Tool]]) -> None:
    _, _, tools = workspace
    assert {name: t.risk for name, t in tools.items()} == {
        "read_file": RiskLevel.LOW,
        "write_file": RiskLevel.MEDIUM,
        "list_dir": RiskLevel.LOW,
    }


@pytest.mark.parametrize(
    "path",
    ["../outside/secret.txt", "sub/../../outside/secret.txt", "..", "/etc/passwd", "{outside}/secret.txt"],
)
async def test_paths_outside_the_workspace_are_refused(
    workspace: tuple[Path, Path, dict[str, Tool]], path: str
) -> None:
    root, outside, tools = workspace
    path = path.format(outside=outside)
    for name, args in [
        ("read_file", {"path": path}),
        ("list_dir", {"path": path}),
        ("write_file", {"path": path, "content": "pwned"}),
    ]:
        with pytest.raises(WorkspaceError, match="outside the workspace"):
            await invoke(tools[name], **args)
    assert (outside / "secret.txt").read_text() == "top secret"


@pytest.mark.parametrize("path", ["~", "~/notes.txt", "~/.ssh/authorized_keys", "~root/.bashrc"])
async def test_a_home_directory_path_is_refused_not_made_inside_the_workspace(
    workspace: tuple[Path, Path, dict[str, Tool]], path: str
) -> None:
    # '~/x' was written to a directory named '~' inside the workspace: the model meant its home
    root, _, tools = workspace
    for name, args in [
        ("read_file", {"path": path}),
        ("list_dir", {"path": path}),
        ("write_file", {"path": path, "content": "ssh-rsa AAA"}),
    ]:
        with pytest.raises(
            WorkspaceError, match=r"starts with '~'.*home directory.*relative to the workspace"
        ):
            await invoke(tools[name], **args)
    assert sorted(os.listdir(root)) == ["notes.txt", "sub"]
    await invoke(tools["write_file"], path="./~backup.txt", content="x")  # a name starting with '~'
    assert (root / "~backup.txt").read_text() == "x"


async def test_symlinks_escaping_the_root_are_refused_and_inner_ones_work(
    workspace: tuple[Path, Path, dict[str, Tool]],
) -> None:
    root, outside, tools = workspace
    (root / "escape").symlink_to(outside)
    (root / "leak.txt").symlink_to(outside / "secret.txt")
    (root / "dangling").symlink_to(outside / "not-yet.txt")
    (root / "alias.txt").symlink_to(root / "notes.txt")
    (root / "subalias").symlink_to(root / "sub")
    for path in ["escape/secret.txt", "leak.txt", "escape"]:
        with pytest.raises(WorkspaceError, match="outside the workspace"):
            await invoke(tools["read_file"], path=path)
    with pytest.raises(WorkspaceError, match="outside the workspace"):
        await invoke(tools["write_file"], path="dangling", content="x")
    with pytest.raises(WorkspaceError, match="outside the workspace"):
        await invoke(tools["write_file"], path="escape/new.txt", content="x")
    assert not (outside / "not-yet.txt").exists() and not (outside / "new.txt").exists()
    assert await invoke(tools["read_file"], path="alias.txt") == "hello notes"
    assert await invoke(tools["read_file"], path="subalias/inner.txt") == "inner"


async def test_file_errors_are_observations_for_the_model(
    workspace: tuple[Path, Path, dict[str, Tool]],
) -> None:
    root, _, tools = workspace
    model = ScriptedModel(
        [{"tool_calls": [{"name": "read_file", "args": {"path": "../outside/secret.txt"}}]}, "cannot"]
    )
    result = await Agent(model, tools=list(tools.values())).run("read it")
    observation = [m for m in result.state.messages if m.role == "tool"][0].content
    assert observation.startswith(
        "Error: read_file raised WorkspaceError: the path '../outside/secret.txt' is outside"
    )
    assert "top secret" not in observation
    with pytest.raises(WorkspaceError, match="no such file"):
        await invoke(tools["read_file"], path="nope.txt")
    with pytest.raises(WorkspaceError, match="is a directory"):
        await invoke(tools["read_file"], path="sub")
    with pytest.raises(WorkspaceError, match="is a directory"):
        await invoke(tools["write_file"], path="sub", content="x")


async def test_large_and_binary_files(tmp_path: Path) -> None:
    (tmp_path / "big.txt").write_text("x" * 500)
    (tmp_path / "bin.dat").write_bytes(b"\x00\x01\x02" * 10)
    tools = {t.name: t for t in file_tools(tmp_path, max_read=100)}
    big = await invoke(tools["read_file"], path="big.txt")
    assert big == "x" * 100 + (
        "\n… [file truncated: showing the first 100 characters of 500 bytes; "
        "call read_file with offset=100 to read on]"
    )
    assert "binary file of 30 bytes" in await invoke(tools["read_file"], path="bin.dat")


async def test_a_2_gb_file_is_not_loaded_whole(tmp_path: Path) -> None:
    # it was read whole (2.1 GB resident, 13 s) to show 100,000 characters of it
    (tmp_path / "huge.log").write_bytes(b"first line\n" * 1_000)
    os.truncate(tmp_path / "huge.log", 2 * 1024**3)  # sparse: costs no disk
    (tmp_path / "zeros.img").touch()
    os.truncate(tmp_path / "zeros.img", 2 * 1024**3)
    tools = {t.name: t for t in file_tools(tmp_path, max_read=50)}
    shown = await invoke(tools["read_file"], path="huge.log")
    assert shown == "first line\n" * 4 + "first " + (
        "\n… [file truncated: showing the first 50 characters of 2147483648 bytes; "
        "call read_file with offset=50 to read on]"
    )
    assert await invoke(tools["read_file"], path="zeros.img") == (
        "(zeros.img is a binary file of 2147483648 bytes; not shown)"
    )


def _next_offset(page: str) -> int | None:
    match = re.search(r"call read_file with offset=(\d+) to read on\]$", page)
    return int(match.group(1)) if match else None


def _page_text(page: str) -> str:
    return re.sub(r"\n… \[(file truncated|end of file): [^\]]*\]$", "", page)


# multi-byte characters across the 1 MiB chunks, bytes that are not UTF-8, an ASCII run to skip fast
_MIXED = ("a" * (1 << 20) + "é€😀\n") * 2 + "ü" * 700_000 + "tail"


@pytest.mark.parametrize(
    ("content", "max_read"),
    [
        ("".join(f"line {i}\n" for i in range(3_000)), 1_000),
        ("naïve 日本語 😀\n" * 500, 333),
        ("exactly ten", 10),
        ("short", 8_000),
    ],
)
async def test_read_file_pages_through_a_file_without_losing_or_repeating_text(
    tmp_path: Path, content: str, max_read: int
) -> None:
    (tmp_path / "f.txt").write_text(content, encoding="utf-8")
    tool = {t.name: t for t in file_tools(tmp_path, max_read=max_read)}["read_file"]
    pages, offset = [], 0
    while offset is not None:
        page = await invoke(tool, path="f.txt", offset=offset)
        pages.append(_page_text(page))
        offset = _next_offset(page)
    assert "".join(pages) == content
    assert len(pages) == max(1, -(-len(content) // max_read))


async def test_read_file_offsets_count_characters_across_chunks_and_bad_bytes(tmp_path: Path) -> None:
    data = _MIXED.encode("utf-8")
    data = data[:100] + b"\xff\xfe" + data[100:]  # two bytes that are not UTF-8: one U+FFFD each
    (tmp_path / "m.txt").write_bytes(data)
    text = data.decode("utf-8", errors="replace")
    tool = {t.name: t for t in file_tools(tmp_path, max_read=50)}["read_file"]
    for offset in (0, 99, 101, (1 << 20) + 100, (1 << 20) + 102, 2 * (1 << 20) + 5, len(text) - 3):
        page = await invoke(tool, path="m.txt", offset=offset, limit=7)
        assert _page_text(page) == text[offset : offset + 7], offset
        assert _next_offset(page) == (offset + 7 if offset + 7 < len(text) else None)


async def test_read_file_limit_is_capped_at_max_read_and_the_last_page_says_so(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("0123456789" * 3)
    tool = {t.name: t for t in file_tools(tmp_path, max_read=12)}["read_file"]
    assert await invoke(tool, path="f.txt", limit=5) == "01234" + (
        "\n… [file truncated: showing the first 5 characters of 30 bytes; call read_file with offset=5 to read on]"
    )
    assert await invoke(tool, path="f.txt", offset=5, limit=1_000) == "567890123456" + (
        "\n… [file truncated: showing characters 5 to 16 of 30 bytes; call read_file with offset=17 to read on]"
    )
    assert await invoke(tool, path="f.txt", offset=25) == "56789\n… [end of file: showed characters 25 to 29]"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            {"offset": 30},
            "offset 30 is at or past the end of 'f.txt', which has 30 characters: ask for an offset below 30",
        ),
        (
            {"offset": 10**12},
            "offset 1000000000000 is at or past the end of 'f.txt', which has 30 characters",
        ),
        ({"offset": -1}, "offset must be a whole number of characters, 0 or more (got -1)"),
        ({"limit": 0}, "limit must be a whole number of characters, 1 or more (got 0)"),
        ({"path": "empty.txt", "offset": 3}, "'empty.txt' is empty: there is nothing to read at offset 3"),
    ],
)
async def test_read_file_offsets_that_cannot_be_read_say_what_to_ask_for(
    tmp_path: Path, args: dict[str, Any], message: str
) -> None:
    (tmp_path / "f.txt").write_text("0123456789" * 3)
    (tmp_path / "empty.txt").touch()
    tool = {t.name: t for t in file_tools(tmp_path)}["read_file"]
    with pytest.raises(WorkspaceError, match=re.escape(message)):
        await invoke(tool, **{"path": "f.txt", **args})
    assert await invoke(tool, path="empty.txt") == ""


async def test_read_file_skips_to_a_large_offset_in_bounded_memory(tmp_path: Path) -> None:
    import tracemalloc

    size = 256 * 1024**2
    (tmp_path / "big.log").write_bytes(b"first line\n" * 1_000)
    os.truncate(tmp_path / "big.log", size)  # sparse: costs no disk
    with (tmp_path / "big.log").open("r+b") as handle:
        handle.seek(size - 5)
        handle.write(b"END\xc3\xa9")  # "ENDé" at the very end
    tool = {t.name: t for t in file_tools(tmp_path)}["read_file"]
    tracemalloc.start()
    try:
        page = await invoke(tool, path="big.log", offset=size - 6)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert page == f"\x00ENDé\n… [end of file: showed characters {size - 6} to {size - 2}]"
    assert peak < 16 * 1024**2, f"peak {peak} bytes: the file was held whole"


async def test_read_file_refuses_an_offset_past_the_size_without_reading_the_file(tmp_path: Path) -> None:
    # an offset past the end read through the whole file first (8 GiB: minutes, on after the call timed out)
    (tmp_path / "huge.log").write_bytes(b"log line\n" * 1_000)
    os.truncate(tmp_path / "huge.log", 2 * 1024**3)  # sparse: costs no disk
    (tmp_path / "accents.txt").write_text("é" * 600_000)  # 1,200,000 bytes, 600,000 characters
    tool = {t.name: t for t in file_tools(tmp_path)}["read_file"]
    started = time.perf_counter()
    for offset in (2 * 1024**3, 10**12):
        with pytest.raises(WorkspaceError) as caught:
            await invoke(tool, path="huge.log", offset=offset)
        assert str(caught.value) == (
            f"offset {offset} is at or past the end of 'huge.log', which has 2147483648 bytes (so at most "
            "2147483648 characters): ask for an offset below 2147483648 (offset=0 reads from the start)"
        )
    assert time.perf_counter() - started < 1.0
    with pytest.raises(WorkspaceError, match=r"which has 1200000 bytes \(so at most 1200000 characters\)"):
        await invoke(tool, path="accents.txt", offset=1_200_000)
    with pytest.raises(WorkspaceError, match="which has 600000 characters: ask for an offset below 600000"):
        await invoke(tool, path="accents.txt", offset=700_000)  # below the size: only reading tells
    assert await invoke(tool, path="accents.txt", offset=599_999) == (
        "é\n… [end of file: showed characters 599999 to 599999]"
    )


async def test_an_agent_pages_through_a_file_and_sees_every_page_whole(tmp_path: Path) -> None:
    content = "".join(f"{i:06d} some log text\n" for i in range(2_000))  # 44,000 characters
    (tmp_path / "app.log").write_text(content)

    def reader(request: ModelRequest) -> Any:
        last = request.messages[-1]
        offset = 0 if last.role != "tool" else _next_offset(last.content)
        if offset is None:
            return "read it all"
        return {"tool_calls": [{"name": "read_file", "args": {"path": "app.log", "offset": offset}}]}

    result = await Agent(FunctionModel(reader), tools=file_tools(tmp_path), budget=Budget(max_steps=20)).run(
        "read app.log"
    )
    pages = [m.content for m in result.state.messages if m.role == "tool"]
    assert "".join(_page_text(p) for p in pages) == content  # the agent's 10,000 limit cut no page
    assert len(pages) == 6 and result.output == "read it all"


async def test_non_utf8_text_is_shown_with_replacement_characters(tmp_path: Path) -> None:
    (tmp_path / "latin1.txt").write_bytes("café naïve".encode("latin-1"))
    (tmp_path / "日本語 ü.txt").write_text("unicode name")
    tools = {t.name: t for t in file_tools(tmp_path)}
    assert await invoke(tools["read_file"], path="latin1.txt") == "caf\ufffd na\ufffdve"
    assert await invoke(tools["read_file"], path="日本語 ü.txt") == "unicode name"
    await invoke(tools["write_file"], path="新しい/ü.txt", content="é")
    assert (tmp_path / "新しい" / "ü.txt").read_text() == "é"


async def test_fifos_are_refused_instead_of_blocking_forever(tmp_path: Path) -> None:
    # reading a FIFO with no writer blocked a worker thread forever (so did writing with no reader)
    os.mkfifo(tmp_path / "pipe")
    tools = {t.name: t for t in file_tools(tmp_path)}
    for name, args in [("read_file", {"path": "pipe"}), ("write_file", {"path": "pipe", "content": "x"})]:
        with pytest.raises(WorkspaceError, match=r"'pipe' is a named pipe \(FIFO\), not a regular file"):
            await asyncio.wait_for(invoke(tools[name], **args), 60)  # hang guard only


async def test_symlink_loops_and_bad_names_are_clear_errors(tmp_path: Path) -> None:
    # a loop raised RuntimeError('Symlink loop from ...'), a long name a raw OSError (errno 36)
    (tmp_path / "loop1").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop1")
    (tmp_path / "self").symlink_to("self")
    tools = {t.name: t for t in file_tools(tmp_path)}
    for name, args in [
        ("read_file", {"path": "loop1"}),
        ("read_file", {"path": "self/x"}),
        ("write_file", {"path": "loop2", "content": "x"}),
        ("list_dir", {"path": "self"}),
    ]:
        with pytest.raises(WorkspaceError, match="loop of symbolic links"):
            await invoke(tools[name], **args)
    for path in ["a" * 300, "/".join(["b" * 200] * 30)]:
        for name, args in [("read_file", {"path": path}), ("write_file", {"path": path, "content": "x"})]:
            with pytest.raises(WorkspaceError, match="the name is too long"):
                await invoke(tools[name], **args)
    with pytest.raises(WorkspaceError, match="a path cannot contain a NUL character"):
        await invoke(tools["read_file"], path="a\x00b")
    assert "loop1 -> loop2" in await invoke(tools["list_dir"])  # listing the links themselves works


async def test_write_errors_say_why_and_lose_nothing(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("keep me")
    tools = {t.name: t for t in file_tools(tmp_path)}
    with pytest.raises(WorkspaceError, match="cannot write 'afile/child.txt': a part of the path is a file"):
        await invoke(tools["write_file"], path="afile/child.txt", content="x")  # was FileExistsError
    with pytest.raises(WorkspaceError, match="invalid Unicode at character 3 .* nothing was written"):
        await invoke(tools["write_file"], path="afile", content="new\ud800")
    assert (tmp_path / "afile").read_text() == "keep me"  # it used to be truncated before the error
    with pytest.raises(WorkspaceError, match="'afile' is a file, not a directory: use read_file"):
        await invoke(tools["list_dir"], path="afile")
    with pytest.raises(WorkspaceError, match="no such directory: 'nope'"):
        await invoke(tools["list_dir"], path="nope")
    with pytest.raises(WorkspaceError, match="'' is a directory: use list_dir"):
        await invoke(tools["read_file"], path="")


def _failing_write(monkeypatch: pytest.MonkeyPatch, after: int, errno_: int = errno.ENOSPC) -> list[int]:
    """Make `os.write` write `after` bytes of what it is given, then fail with `errno_` (a full disk)."""
    written: list[int] = []
    real = os.write

    def write(fd: int, data: Any) -> int:
        if written:
            raise OSError(errno_, os.strerror(errno_))
        written.append(real(fd, bytes(data)[:after]))
        return written[-1]

    monkeypatch.setattr(os, "write", write)
    return written


async def test_a_write_that_fails_midway_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # write_file truncated the file first: a full disk halfway through left half of the new text, and
    # the old one was gone
    (tmp_path / "config.ini").write_text("[old]\nkeep = me\n")
    tools = {t.name: t for t in file_tools(tmp_path)}
    _failing_write(monkeypatch, after=4)
    with pytest.raises(
        WorkspaceError, match=r"cannot write 'config.ini': the disk is full; .*was not changed"
    ):
        await invoke(tools["write_file"], path="config.ini", content="[new]\n" * 1000)
    assert (tmp_path / "config.ini").read_text() == "[old]\nkeep = me\n"
    assert os.listdir(tmp_path) == ["config.ini"]  # no temporary file left behind
    with pytest.raises(WorkspaceError, match=r"the disk is full; .*was not changed"):
        await invoke(tools["write_file"], path="config.ini", content="more", append=True)
    assert (tmp_path / "config.ini").read_text() == "[old]\nkeep = me\n"  # no half-appended text


async def test_a_write_whose_flush_to_disk_fails_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a.txt").write_text("old")
    tools = {t.name: t for t in file_tools(tmp_path)}

    def fsync(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(WorkspaceError, match="cannot write 'a.txt'"):
        await invoke(tools["write_file"], path="a.txt", content="new")
    assert (tmp_path / "a.txt").read_text() == "old"
    assert os.listdir(tmp_path) == ["a.txt"]


async def test_a_failed_write_of_a_new_file_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = {t.name: t for t in file_tools(tmp_path)}
    _failing_write(monkeypatch, after=1)
    with pytest.raises(
        WorkspaceError, match=r"cannot write 'logs/2026/a.txt': the disk is full; nothing was written"
    ):
        await invoke(tools["write_file"], path="logs/2026/a.txt", content="abc")
    assert os.listdir(tmp_path) == []  # nor the directories made for it
    monkeypatch.undo()
    _failing_write(monkeypatch, after=1)
    with pytest.raises(WorkspaceError, match="nothing was written"):
        await invoke(tools["write_file"], path="b.txt", content="abc", append=True)
    assert os.listdir(tmp_path) == []


def test_a_process_killed_while_writing_leaves_the_old_file(tmp_path: Path) -> None:
    (tmp_path / "data.json").write_text('{"old": true}')
    code = (
        "import asyncio, os, signal\n"
        "from thinkloop.tools import file_tools\n"
        "real = os.write\n"
        "def write(fd, data):\n"
        "    real(fd, bytes(data)[:3])\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "os.write = write\n"
        f"tool = file_tools({str(tmp_path)!r})[1]\n"
        "asyncio.run(tool.invoke({'path': 'data.json', 'content': '{\"new\": true}'}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert (tmp_path / "data.json").read_text() == '{"old": true}'
    assert done.returncode == -signal.SIGKILL, done.stderr  # killed halfway through the new text


async def test_a_rewritten_file_keeps_its_permissions_owner_and_links(tmp_path: Path) -> None:
    target = tmp_path / "run.sh"
    target.write_text("echo old")
    target.chmod(0o750)
    (tmp_path / "link.sh").symlink_to("run.sh")
    if os.geteuid() == 0:
        os.chown(target, 65534, 65534)
    tools = {t.name: t for t in file_tools(tmp_path)}
    assert await invoke(tools["write_file"], path="link.sh", content="echo new") == (
        "wrote 8 characters to run.sh"
    )
    assert target.read_text() == "echo new" and (tmp_path / "link.sh").is_symlink()
    assert stat.S_IMODE(target.stat().st_mode) == 0o750
    if os.geteuid() == 0:
        assert (target.stat().st_uid, target.stat().st_gid) == (65534, 65534)
    await invoke(tools["write_file"], path="fresh.txt", content="x")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "fresh.txt").stat().st_mode) == 0o666 & ~umask
    assert sorted(os.listdir(tmp_path)) == ["fresh.txt", "link.sh", "run.sh"]


async def test_a_read_only_file_is_not_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a new file put in its place would not need the right to write the old one: it is asked for
    (tmp_path / "ro.txt").write_text("old")
    tools = {t.name: t for t in file_tools(tmp_path)}
    real = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode, **kw: False if str(p).endswith("ro.txt") else real(p, mode)
    )
    with pytest.raises(
        WorkspaceError, match="cannot write 'ro.txt': permission denied .*'ro.txt' was not changed"
    ):
        await invoke(tools["write_file"], path="ro.txt", content="new")
    assert (tmp_path / "ro.txt").read_text() == "old"


async def test_a_file_in_a_directory_that_takes_no_new_files_is_written_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # without the right to add a file to the directory no temporary file can be made there; the file
    # itself may still be writable, as it was before
    from thinkloop.tools import _files

    (tmp_path / "a.txt").write_text("old")
    tools = {t.name: t for t in file_tools(tmp_path)}

    def refused(folder: Path) -> tuple[int, Path]:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(_files, "_temporary_file", refused)
    assert await invoke(tools["write_file"], path="a.txt", content="new") == "wrote 3 characters to a.txt"
    assert (tmp_path / "a.txt").read_text() == "new"
    with pytest.raises(WorkspaceError, match="cannot write 'b.txt': permission denied"):
        await invoke(tools["write_file"], path="b.txt", content="new")


async def test_a_write_with_a_name_too_long_creates_no_directories(tmp_path: Path) -> None:
    # the parent directories were made first, then the file name failed: each such call left them behind
    tools = {t.name: t for t in file_tools(tmp_path)}
    for path in ["logs/2026/" + "a" * 300, "/".join(["b" * 200] * 30), "c/" * 2100 + "f"]:
        with pytest.raises(WorkspaceError, match="the name is too long"):
            await invoke(tools["write_file"], path=path, content="x")
    assert os.listdir(tmp_path) == []


async def test_a_path_with_a_lone_surrogate_is_a_clear_error(tmp_path: Path) -> None:
    # JSON's "\ud800" reaches the tool as a lone surrogate: a raw UnicodeEncodeError from the OS layer
    tools = {t.name: t for t in file_tools(tmp_path)}
    for name, args in [
        ("read_file", {"path": "notes\ud800.txt"}),
        ("write_file", {"path": "notes\ud800.txt", "content": "x"}),
        ("list_dir", {"path": "dir\ud800"}),
    ]:
        with pytest.raises(WorkspaceError, match=r"invalid Unicode at character \d+ \(a lone surrogate"):
            await invoke(tools[name], **args)


async def test_list_dir_shows_a_name_that_is_not_utf8_so_the_model_can_act_on_it(tmp_path: Path) -> None:
    # the name reached the model as 'bad?name.txt' (its byte replaced by the agent): reading that
    # failed with 'no such file', and nothing said why
    (tmp_path / os.fsdecode(b"bad\xffname.txt")).write_text("x")
    (tmp_path / "link").symlink_to(os.fsdecode(b"to\xfe"))
    tools = {t.name: t for t in file_tools(tmp_path)}
    listing = await invoke(tools["list_dir"])
    assert listing.splitlines() == [
        ".: 2 entries",
        "bad\\xffname.txt  1 bytes  (the name is not UTF-8, so the file tools cannot open it: rename it with "
        "the shell, e.g. mv ./bad*name.txt new-name)",
        "link -> to\\xfe",
    ]


_ESCAPED_NOTE = (
    "  (the name has control or text-direction characters, shown escaped as in a JSON string: "
    "give the file tools the name as shown)"
)


async def test_list_dir_shows_a_name_with_control_characters_escaped_on_one_line(tmp_path: Path) -> None:
    # a newline in a name made the listing show entries that do not exist ("secrets.env  1200 bytes"),
    # and a right-to-left override made "invoice\u202efdp.exe" read as "invoiceexe.pdf"
    names = {
        "a\nsecrets.env  1200 bytes\nb": "a\\nsecrets.env  1200 bytes\\nb  1 bytes",
        "tab\tand\rreturn": "tab\\tand\\rreturn  1 bytes",
        "esc\x1b[31mred\x7f": "esc\\u001b[31mred\\u007f  1 bytes",
        "next\x85line\u2028sep": "next\\u0085line\\u2028sep  1 bytes",
        "invoice\u202efdp.exe": "invoice\\u202efdp.exe  1 bytes",
        "back\\slash\n": "back\\\\slash\\n  1 bytes",  # a backslash of an escaped name is escaped
    }
    for name in names:
        (tmp_path / name).write_text("x")
    (tmp_path / "plain\\n.txt").write_text("y")  # no control character: shown as it is
    (tmp_path / "dir\x1b").mkdir()
    (tmp_path / "link").symlink_to("to\nthere")
    (tmp_path / os.fsdecode(b"bad\xff\nname")).write_text("z")
    tools = {t.name: t for t in file_tools(tmp_path)}
    listing = await invoke(tools["list_dir"])
    assert listing.splitlines() == [
        ".: 10 entries",
        names["a\nsecrets.env  1200 bytes\nb"] + _ESCAPED_NOTE,
        names["back\\slash\n"] + _ESCAPED_NOTE,
        "bad\\xff\\nname  1 bytes  (the name is not UTF-8, so the file tools cannot open it: rename it with "
        "the shell, e.g. mv ./bad*name new-name)",
        "dir\\u001b/" + _ESCAPED_NOTE,
        names["esc\x1b[31mred\x7f"] + _ESCAPED_NOTE,
        names["invoice\u202efdp.exe"] + _ESCAPED_NOTE,
        "link -> to\\nthere",
        names["next\x85line\u2028sep"] + _ESCAPED_NOTE,
        "plain\\n.txt  1 bytes",
        names["tab\tand\rreturn"] + _ESCAPED_NOTE,
    ]
    for name, line in names.items():
        shown = line.removesuffix("  1 bytes")
        assert await invoke(tools["read_file"], path=shown) == "x"  # the name as the listing showed it
        assert await invoke(tools["read_file"], path=name) == "x"  # and as it is
    assert await invoke(tools["read_file"], path="plain\\n.txt") == "y"
    with pytest.raises(WorkspaceError, match="no such file"):
        await invoke(tools["read_file"], path="secrets.env")
    assert await invoke(tools["write_file"], path="dir\\u001b/new.txt", content="in") == (
        "wrote 2 characters to dir\\u001b/new.txt"
    )
    assert (tmp_path / "dir\x1b" / "new.txt").read_text() == "in"
    assert await invoke(tools["list_dir"], path="dir\\u001b") == "dir\\u001b: 1 entries\nnew.txt  2 bytes"


async def test_list_dir_of_a_link_removed_while_listing_still_lists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "link").symlink_to("target")
    tools = {t.name: t for t in file_tools(tmp_path)}

    def gone(path: Any) -> str:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory")

    monkeypatch.setattr(os, "readlink", gone)  # a raw FileNotFoundError ended the call
    assert await invoke(tools["list_dir"]) == ".: 1 entries\nlink"


async def test_list_dir_of_a_huge_directory_shows_the_first_names_in_order(tmp_path: Path) -> None:
    for i in reversed(range(3_000)):
        (tmp_path / f"f{i:04}").touch()
    tools = {t.name: t for t in file_tools(tmp_path)}
    lines = (await invoke(tools["list_dir"])).splitlines()
    assert lines[0] == ".: 3000 entries"
    assert lines[1:501] == [f"f{i:04}  0 bytes" for i in range(500)]
    assert lines[501:] == ["… and 2500 more entries"]


def test_workspace_root_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="not a directory"):
        Workspace(tmp_path / "missing")


# ----------------------------------------------------------------------------------- analyze_output

BUILD_LOG = "\n".join(
    [
        "Collecting packages",
        *[f"step {i}: ok" for i in range(1, 300)],
        "warning: deprecated option --foo",
        "Traceback (most recent call last):",
        '  File "app.py", line 3, in <module>',
        "    main()",
        "ValueError: bad config value 'x'",
        "ERROR: build failed",
        "0 errors in module b",
        "Process exited with code 2",
    ]
)


def test_analyze_output_finds_errors_warnings_traces_and_exit_codes() -> None:
    summary = analyze_text(BUILD_LOG)
    lines = summary.splitlines()
    assert (
        lines[0]
        == f"308 lines, {len(BUILD_LOG)} characters; 3 error line(s), 1 warning line(s), 1 stack trace(s)."
    )
    assert "Exit status:" in lines and "  308: Process exited with code 2" in lines
    assert "  305: ValueError: bad config value 'x'" in lines  # the end of the trace
    assert "  306: ERROR: build failed" in lines
    assert "  301: warning: deprecated option --foo" in lines
    assert "  1: Collecting packages" in lines  # head
    assert not any("0 errors in module b" in line and "Errors" not in line for line in lines[:8])
    assert analyze_text(BUILD_LOG) == summary  # deterministic
    assert len(summary) < len(BUILD_LOG) / 5


def test_analyze_output_caps_long_lists_and_handles_small_inputs() -> None:
    many = "\n".join(f"error {i}" for i in range(100))
    summary = analyze_text(many, max_items=10)
    assert "  1: error 0" in summary and "  100: error 99" in summary
    assert "… 90 more not shown …" in summary
    assert analyze_text("") == "The output is empty."
    assert "All lines:" in analyze_text("one\ntwo")


async def test_analyze_output_tool() -> None:
    assert analyze_output.risk is RiskLevel.LOW and analyze_output.idempotent
    text = await analyze_output.invoke(analyze_output.validate({"output": BUILD_LOG}))
    assert text == analyze_text(BUILD_LOG)


# ------------------------------------------------------------------------------------ builtin_tools


def test_builtin_tools_by_name(tmp_path: Path) -> None:
    tools = builtin_tools(["shell", "files", "calculator", "analyze_output", "read_file"], root=tmp_path)
    assert [t.name for t in tools] == [
        "shell",
        "read_file",
        "write_file",
        "list_dir",
        "calculator",
        "analyze_output",
    ]
    ssh = builtin_tools(["ssh_execute"], hosts={"web1": {"hostname": "127.0.0.1", "port": 2222}})
    assert ssh[0].name == "ssh_execute"
    assert set(BUILTIN_TOOL_NAMES) >= {"shell", "ssh_execute", "files", "calculator", "analyze_output"}


def test_builtin_tools_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="unknown built-in tool"):
        builtin_tools(["shel"], root=tmp_path)
    with pytest.raises(ConfigurationError, match="ssh_execute needs hosts"):
        builtin_tools(["ssh_execute"], root=tmp_path)


async def test_builtin_shell_runs_in_the_root(real_tmp: Path) -> None:
    (tool,) = builtin_tools(["shell"], root=real_tmp)
    assert str(real_tmp) in tool.description
    assert (await shell(tool, "pwd"))["stdout"] == f"{real_tmp}\n"


# --------------------------------------------------------------------------------------- SSH hosts


def test_load_hosts_from_json_and_toml(tmp_path: Path) -> None:
    (tmp_path / "hosts.json").write_text(
        json.dumps({"web1": {"hostname": "10.0.0.11", "username": "deploy", "password": "pw-123"}})
    )
    (tmp_path / "hosts.toml").write_text('[db1]\nhostname = "db1.internal"\nport = 2222\n')
    hosts = load_hosts(tmp_path / "hosts.json")
    assert hosts["web1"].address == "deploy@10.0.0.11:22"
    assert "pw-123" not in repr(hosts) and "pw-123" not in hosts["web1"].model_dump_json()
    assert load_hosts(tmp_path / "hosts.toml")["db1"].port == 2222
    assert builtin_tools(["ssh_execute"], hosts=hosts)[0].parameters["properties"]["host"]["enum"] == ["web1"]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "is not valid"),
        ('["web1"]', "must map host names to settings"),
        ('{"web1": {"hostname": "x", "prot": 22}}', "has an invalid host"),
    ],
)
def test_load_hosts_errors(tmp_path: Path, content: str, problem: str) -> None:
    (tmp_path / "hosts.json").write_text(content)
    with pytest.raises(ConfigurationError, match=problem):
        load_hosts(tmp_path / "hosts.json")
    with pytest.raises(ConfigurationError, match="cannot read the hosts file"):
        load_hosts(tmp_path / "missing.json")


@pytest.mark.parametrize("steps", [0, 1, 2, 3, 4])
async def test_a_shell_call_cancelled_while_it_opens_its_pipes_closes_them_cleanly(steps: int) -> None:
    """Ctrl-C can land while the call sets up its pipes: no 'Bad file descriptor' from a pipe closed twice,
    no pipe left open."""
    from thinkloop.tools._shell import run_command

    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: errors.append(context))
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(10):
        task = asyncio.ensure_future(run_command("true", cwd=None, env={}, seconds=5, limit=100))
        for _ in range(steps):
            await asyncio.sleep(0)  # let it get that far into opening its pipes and starting the shell
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    for _ in range(5):
        await asyncio.sleep(0.01)  # closed transports finish closing in callbacks
    assert errors == []
    assert len(os.listdir("/proc/self/fd")) <= before
