"""The shell tool's clean-up: nothing a command started may outlive a call that timed out."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from pathlib import Path

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
