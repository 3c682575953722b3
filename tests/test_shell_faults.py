"""The shell tool's clean-up: nothing a command started may outlive a call that timed out."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from pathlib import Path

import pytest

from thinkloop.tools._shell import run_command


def _processes_with(marker: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(name))
    return found


async def test_a_child_that_left_the_process_group_but_holds_the_output_is_killed_on_timeout() -> None:
    # `setsid` puts the child in a session of its own: killing the command's process group missed it,
    # and it lived on (sleeping 300 s here) after the call had reported the timeout
    marker = f"300.{uuid.uuid4().int % 10**12:012d}"  # a sleep of ~300 s whose command line is ours alone
    command = f"setsid sleep {marker} & echo started; sleep 300"
    try:
        result = await run_command(
            command, cwd=None, env={"PATH": os.environ["PATH"]}, seconds=0.5, limit=1000
        )
        assert result["timed_out"] is True and result["stdout"] == "started\n"
        for _ in range(200):  # SIGKILL is sent; the process is gone a moment later, not at once (≤ 10 s)
            if not _processes_with(marker):
                break
            await asyncio.sleep(0.05)
        assert _processes_with(marker) == []
    finally:
        for pid in _processes_with(marker):
            os.kill(pid, signal.SIGKILL)


def _marker() -> str:
    return f"300.{uuid.uuid4().int % 10**12:012d}"  # a sleep of ~300 s whose command line is ours alone


def _kill_all(marker: str) -> None:
    for _ in range(100):  # a loop left running may fork more while we kill
        found = _processes_with(marker)
        if not found:
            return
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def _survivors(command: str, marker: str) -> list[int]:
    """Run `command` until it times out; the processes of `marker` still running a moment later."""
    result = await run_command(command, cwd=None, env={"PATH": os.environ["PATH"]}, seconds=0.5, limit=1000)
    assert result["timed_out"] is True
    for _ in range(100):  # SIGKILL is sent; the processes are gone a moment later, not at once (≤ 5 s)
        if not _processes_with(marker):
            break
        await asyncio.sleep(0.05)
    return _processes_with(marker)


# each forking loop stops after 2,000 children (about two seconds here): still forking when the call
# times out, without flooding the machine should the kill miss it
_LOOP = "i=0; while [ $i -lt 2000 ]; do {child} & i=$((i+1)); done; exec sleep {m}"


@pytest.mark.parametrize(
    "command",
    [
        # the scan for the processes holding the output missed it: it had redirected its output
        pytest.param("setsid sleep {m} </dev/null >/dev/null 2>&1 & sleep 300", id="setsid-redirected"),
        pytest.param(
            "setsid sh -c 'setsid sleep {m} </dev/null >/dev/null 2>&1 & exec sleep {m}' </dev/null "
            ">/dev/null 2>&1 & sleep 300",
            id="setsid-grandchild",
        ),
        # one scan, then the kill: the children forked in between lived on (hundreds of sleeps)
        pytest.param(
            "setsid sh -c '" + _LOOP.format(child="sleep {m}", m="{m}") + "' & sleep 300",
            id="setsid-loop-holding-the-output",
        ),
        pytest.param(
            "setsid sh -c '"
            + _LOOP.format(child="setsid sleep {m} </dev/null >/dev/null 2>&1", m="{m}")
            + "' &",
            id="setsid-loop-of-detached-children-after-the-shell-exited",
        ),
        # a daemon: a new session, its output redirected, its parent gone (no link left to it)
        pytest.param(
            "setsid sh -c 'sleep {m} </dev/null >/dev/null 2>&1 &' </dev/null >/dev/null 2>&1; sleep 300",
            id="double-forked-daemon",
        ),
        pytest.param(
            "nohup setsid sh -c '(sleep {m} &) ; exit 0' </dev/null >/dev/null 2>&1 & sleep 300",
            id="nohup-subshell-daemon",
        ),
    ],
)
async def test_no_process_of_a_command_that_left_the_session_outlives_a_timeout(command: str) -> None:
    marker = _marker()
    try:
        assert await _survivors(command.format(m=marker), marker) == []
    finally:
        _kill_all(marker)


async def test_a_timeout_leaves_other_processes_alone() -> None:
    # the scan stops and kills the command's processes only: not our own other children (another
    # command running at the same time, a process started here) nor anything else on the machine
    marker, killed = _marker(), _marker()
    ours = await asyncio.create_subprocess_exec("sleep", marker)
    try:
        env = {"PATH": os.environ["PATH"]}
        timed_out, other = await asyncio.gather(
            run_command(f"setsid sleep {killed} & sleep 300", cwd=None, env=env, seconds=0.3, limit=1000),
            run_command("sleep 1.5; echo done", cwd=None, env=env, seconds=30, limit=1000),
        )
        assert timed_out["timed_out"] is True
        assert (other["exit_code"], other["stdout"], other["timed_out"]) == (0, "done\n", False)
        assert ours.returncode is None and _processes_with(marker) == [ours.pid]
    finally:
        ours.kill()
        await ours.wait()
        _kill_all(killed)


async def test_a_daemon_of_a_finished_call_outlives_another_calls_timeout() -> None:
    # each call marks its processes with a value of its own: the daemon an earlier call started on
    # purpose (and that call finished) is not the timed-out call's to kill
    kept, killed = _marker(), _marker()
    env = {"PATH": os.environ["PATH"]}
    daemon = f"setsid sh -c 'sleep {kept} </dev/null >/dev/null 2>&1 &' </dev/null >/dev/null 2>&1"
    try:
        started = await run_command(daemon, cwd=None, env=env, seconds=30, limit=1000)
        assert started["timed_out"] is False and len(_processes_with(kept)) == 1
        assert (
            await _survivors(
                f"setsid sh -c 'sleep {killed} </dev/null >/dev/null 2>&1 &' </dev/null >/dev/null 2>&1; sleep 300",
                killed,
            )
            == []
        )
        assert len(_processes_with(kept)) == 1
    finally:
        _kill_all(kept)
        _kill_all(killed)
