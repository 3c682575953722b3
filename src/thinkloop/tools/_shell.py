"""The `shell` tool (SPEC §3.7): run a command locally with `/bin/sh -c`.

The command runs in its own process group, in a fixed working directory, with only the allow-listed
environment variables; on timeout (or when the call is cancelled) the whole group is killed. The
result is a JSON object: `exit_code`, `stdout`, `stderr` (each cut to the output limit, head and tail
kept), `duration` and `timed_out`. Its risk comes from the command classifier.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .._errors import ConfigurationError
from .._tools import Tool, truncate_output
from ..safety._policy import command_risk

DEFAULT_ENV_ALLOWLIST = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TERM",
    "TZ",
    "USER",
    "LOGNAME",
    "TMPDIR",
)
DEFAULT_OUTPUT_LIMIT = 8_000

_PARAMETERS = {
    "type": "object",
    "properties": {"command": {"type": "string", "description": "The shell command to run (/bin/sh -c)."}},
    "required": ["command"],
    "additionalProperties": False,
}


def shell_tool(
    *,
    cwd: str | os.PathLike[str] | None = None,
    env_allowlist: Iterable[str] = DEFAULT_ENV_ALLOWLIST,
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
    name: str = "shell",
) -> Tool:
    """A `Tool` running shell commands on this machine.

    Args:
        cwd: the working directory (the current one by default); it must exist.
        env_allowlist: names of this process's environment variables passed to the command; nothing
            else is (API keys and other secrets stay out).
        env: extra variables to set for the command.
        timeout: seconds before the command's process group is killed.
        output_limit: characters kept of stdout and of stderr each.
        name: the tool's name.
    """
    workdir = Path(cwd).resolve() if cwd is not None else None
    if workdir is not None and not workdir.is_dir():
        raise ConfigurationError(f"shell_tool: the working directory {str(workdir)!r} does not exist")
    if timeout <= 0 or output_limit <= 0:
        raise ConfigurationError("shell_tool: timeout and output_limit must be positive")
    allowed = tuple(env_allowlist)
    extra = dict(env or {})

    async def run_shell(command: str) -> dict[str, Any]:
        environment = {k: v for k, v in os.environ.items() if k in allowed} | extra
        return await run_command(command, cwd=workdir, env=environment, seconds=timeout, limit=output_limit)

    return Tool(
        name=name,
        description=(
            f"Run a shell command on this machine (/bin/sh -c{f', in {workdir}' if workdir else ''}). "
            f"Returns exit_code, stdout, stderr and duration; the command is killed after {timeout:g} s."
        ),
        parameters=_PARAMETERS,
        function=run_shell,
        risk=command_risk,
        timeout=timeout + 10.0,  # our own timeout kills the process first and reports it
        idempotent=False,
    )


async def run_command(
    command: str, *, cwd: Path | None, env: dict[str, str], seconds: float, limit: int
) -> dict[str, Any]:
    """Run `command` with `/bin/sh -c`; kill its process group on timeout or cancellation."""
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        "/bin/sh",
        "-c",
        command,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
        env=env,
        start_new_session=True,
    )
    assert process.stdout is not None and process.stderr is not None
    stdout, stderr = _Capture(limit), _Capture(limit)
    timed_out = False
    try:
        async with asyncio.timeout(seconds):
            await asyncio.gather(stdout.drain(process.stdout), stderr.drain(process.stderr), process.wait())
    except TimeoutError:
        timed_out = True
    finally:
        if process.returncode is None:
            await _kill_group(process)
    return {
        "exit_code": None if timed_out else process.returncode,
        "stdout": stdout.text(),
        "stderr": stderr.text() + (f"\n[killed: timed out after {seconds:g} s]" if timed_out else ""),
        "duration": round(time.perf_counter() - started, 3),
        "timed_out": timed_out,
    }


async def _kill_group(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    await asyncio.shield(process.wait())


class _Capture:
    """Reads a stream to its end, keeping at most about `limit` characters (head and tail)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    async def drain(self, stream: asyncio.StreamReader) -> None:
        half = self.limit // 2 + 1
        while chunk := await stream.read(65_536):
            self.total += len(chunk)
            room = max(half - len(self.head), 0)
            self.head += chunk[:room]
            self.tail += chunk[room:]
            if len(self.tail) > 2 * half:
                del self.tail[: len(self.tail) - half]

    def text(self) -> str:
        head = self.head.decode(errors="replace")
        tail = self.tail.decode(errors="replace")
        if self.total <= len(self.head) + len(self.tail):
            text, _ = truncate_output(head + tail, self.limit)
            return text
        dropped = self.total - len(self.head) - len(self.tail)
        text, _ = truncate_output(f"{head}\n… [{dropped} bytes not kept] …\n{tail}", self.limit)
        return text
