"""The `shell` tool (SPEC §3.7): run a command locally with `/bin/sh -c`.

The command runs in its own process group, in a fixed working directory, with only the allow-listed
environment variables; on timeout (or when the call is cancelled) the whole group is killed, even if
the shell itself has exited and only a background child still holds its output — and so is a child
that left the group (`setsid`) but still holds the output. An empty command, a NUL
character or a command over the system's argument limit is refused with `ShellCommandError`. The
result is a JSON object: `exit_code`, `stdout`, `stderr` (each cut to the output limit, head and tail
kept; binary data is described, not shown), `duration` and `timed_out`. Its risk comes from the
command classifier.
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
from ..safety._policy import ShellCommandRisk, command_risk

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
    if (
        not timeout > 0
        or isinstance(output_limit, bool)
        or not isinstance(output_limit, int)
        or output_limit <= 0
    ):
        raise ConfigurationError(
            f"shell_tool: timeout must be a positive number of seconds and output_limit a positive whole "
            f"number of characters (got timeout={timeout!r}, output_limit={output_limit!r})"
        )
    allowed = _names(env_allowlist)
    extra = _environment(env)

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
        # with a fixed working directory, the safety layer compares paths across a run's commands exactly
        risk=ShellCommandRisk("command", cwd=str(workdir)) if workdir is not None else command_risk,
        timeout=timeout + 10.0,  # our own timeout kills the process first and reports it
        idempotent=False,
    )


def _names(env_allowlist: Iterable[str]) -> tuple[str, ...]:
    if isinstance(env_allowlist, str):  # "PATH" would allow the variables P, A, T and H
        raise ConfigurationError(
            f"shell_tool: env_allowlist is a list of variable names, not one string: write [{env_allowlist!r}]"
        )
    return tuple(env_allowlist)


def _environment(env: Mapping[str, str] | None) -> dict[str, str]:
    """`env` checked now: a bad entry failed every call with a bare TypeError or ValueError."""
    extra = dict(env or {})
    for key, value in extra.items():
        if not isinstance(key, str) or not key or "=" in key or "\x00" in key:
            raise ConfigurationError(
                f"shell_tool: invalid environment variable name {key!r}: a non-empty string without '=' or NUL"
            )
        if not isinstance(value, str) or "\x00" in value:
            raise ConfigurationError(
                f"shell_tool: the value of {key} must be a string without NUL characters, not {value!r} "
                f"(write env={{{key!r}: str(value)}})"
            )
    return extra


async def run_command(
    command: str, *, cwd: Path | None, env: dict[str, str], seconds: float, limit: int
) -> dict[str, Any]:
    """Run `command` with `/bin/sh -c`; kill its process group on timeout or cancellation.

    The call ends when the shell has exited and its stdout and stderr are closed — by the shell and by
    every background child that inherited them — or after `seconds`, when the whole process group is
    killed, even if the shell itself had already exited.
    """
    _check_command(command)
    started = time.perf_counter()
    stdout = await _PipeReader.open(limit)
    try:
        stderr = await _PipeReader.open(limit)
    except BaseException:  # cancelled in between: the first pipe is ours to close
        stdout.close()
        raise
    finished = False
    try:
        process = await _start(command, cwd, env, stdout, stderr)
        try:
            async with asyncio.timeout(seconds):
                await process.wait()
                await asyncio.gather(stdout.closed, stderr.closed)
            finished = True
        except TimeoutError:
            pass
        finally:
            if not finished:  # timed out or cancelled: nothing of the command may outlive the call
                shell_exit = process.returncode
                await _kill_group(process, (stdout.inode, stderr.inode))
    finally:
        stdout.close()
        stderr.close()
    errors = stderr.capture.text()
    note = _signal_note(process.returncode, errors) if finished else _timeout_note(seconds, shell_exit)
    return {
        "exit_code": process.returncode if finished else None,
        "stdout": stdout.capture.text(),
        "stderr": errors + note,
        "duration": round(time.perf_counter() - started, 3),
        "timed_out": not finished,
    }


class ShellCommandError(ValueError):
    """A command that cannot be run at all (empty, a NUL byte, too long); the message says what to do."""


_MAX_COMMAND_BYTES = 131_071  # Linux's limit for one argument (MAX_ARG_STRLEN, 128 KiB with the NUL)


def _check_command(command: str) -> None:
    if not command.strip():
        raise ShellCommandError("the command is empty: give a shell command to run, e.g. 'ls -la'")
    if "\x00" in command:
        raise ShellCommandError(
            "the command contains a NUL character (\\x00), which a command cannot hold: remove it"
        )
    try:
        size = len(command.encode("utf-8", errors="surrogateescape"))
    except UnicodeEncodeError:
        raise ShellCommandError(
            "the command contains invalid Unicode (a lone surrogate such as \\ud800): write the text as UTF-8"
        ) from None
    if size > _MAX_COMMAND_BYTES:
        raise ShellCommandError(
            f"the command is {size:,} bytes long, more than the {_MAX_COMMAND_BYTES:,} bytes the system accepts: "
            "write long data to a file first (write_file) and refer to the file in the command"
        )


async def _start(
    command: str, cwd: Path | None, env: dict[str, str], stdout: _PipeReader, stderr: _PipeReader
) -> asyncio.subprocess.Process:
    """Start the shell in a new session (its own process group) writing into our two pipes."""
    try:
        return await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=stdout.write_fd,
            stderr=stderr.write_fd,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
    except OSError as exc:  # E2BIG when the environment plus the command exceed the system's limit …
        if cwd is not None and exc.filename is not None and str(exc.filename) == str(cwd):
            raise ShellCommandError(_cwd_problem(cwd, exc)) from None  # it read as if /bin/sh were missing
        raise ShellCommandError(f"could not start /bin/sh: {exc.strerror or exc}") from None
    finally:
        stdout.close_write_end()  # the child has its copies: the pipes close when it (and its children) do
        stderr.close_write_end()


def _cwd_problem(cwd: Path, exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError):
        return (
            f"the working directory {str(cwd)!r} no longer exists (it was removed after the tool was made): "
            "nothing ran; recreate it, or make the tool again with an existing cwd"
        )
    return f"cannot enter the working directory {str(cwd)!r}: {exc.strerror or exc}; nothing ran"


def _signal_note(returncode: int | None, errors: str) -> str:
    """A negative exit code is a signal that ended the shell (-9: SIGKILL, e.g. the OOM killer)."""
    if returncode is None or returncode >= 0:
        return ""
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = "an unknown signal"
    apart = "\n" if errors and not errors.endswith("\n") else ""
    return f"{apart}[the shell was killed by signal {-returncode} ({name})]"


def _timeout_note(seconds: float, shell_exit: int | None) -> str:
    note = f"\n[killed: timed out after {seconds:g} s]"
    if shell_exit is not None:
        note += (
            f" The shell had exited (code {shell_exit}), but a background process kept its output open; "
            "redirect a background job's output (cmd >cmd.log 2>&1 &) so the call can return."
        )
    return note


async def _kill_group(process: asyncio.subprocess.Process, pipes: tuple[int, int]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # the group outlives its leader while a member lives
    for pid in _holding(pipes):  # a child that left the group (`setsid`) but still writes our output
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    await asyncio.shield(process.wait())


def _holding(pipes: tuple[int, int]) -> list[int]:
    """The other processes that hold one of our output pipes open (Linux /proc; [] elsewhere)."""
    wanted = {f"pipe:[{inode}]" for inode in pipes if inode}
    me, found = os.getpid(), []
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []
    for pid in pids:
        if pid == me:
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone, or not ours to look at (nor to kill)
            continue
        if any(_link(f"/proc/{pid}/fd/{fd}") in wanted for fd in fds):
            found.append(pid)
    return found


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


class _PipeReader(asyncio.Protocol):
    """The read end of a pipe given to the command as stdout or stderr, captured as it arrives.

    Our own pipe rather than `asyncio.subprocess.PIPE`: the call can close it whenever it wants, and
    nothing pauses reading (an abandoned paused `PIPE` transport made `process.wait()` hang forever
    after a timeout with a command like `yes`).
    """

    def __init__(self, limit: int) -> None:
        self.capture = _Capture(limit)
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.write_fd = -1
        self.inode = 0  # the pipe's, to find the processes writing to it
        self.transport: asyncio.BaseTransport | None = None

    @classmethod
    async def open(cls, limit: int) -> _PipeReader:
        reader = cls(limit)
        read_fd, reader.write_fd = os.pipe()
        reader.inode = os.fstat(read_fd).st_ino
        pipe = os.fdopen(read_fd, "rb", buffering=0)
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_read_pipe(lambda: reader, pipe)
        except asyncio.CancelledError:  # asyncio closed the transport it had made, and the pipe with it
            reader.close_write_end()
            raise
        except BaseException:  # no transport was made: the pipe is still ours
            pipe.close()
            reader.close_write_end()
            raise
        return reader

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.capture.add(data)

    def eof_received(self) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof_received()

    def close_write_end(self) -> None:
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def close(self) -> None:
        self.close_write_end()
        if self.transport is not None:
            self.transport.close()


class _Capture:
    """Keeps at most about `limit` characters of a stream (head and tail), however much arrives."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        half = self.limit // 2 + 1
        self.total += len(chunk)
        room = max(half - len(self.head), 0)
        self.head += chunk[:room]
        self.tail += chunk[room:]
        if len(self.tail) > 2 * half:
            del self.tail[: len(self.tail) - half]

    def text(self) -> str:
        head = self.head.decode(errors="replace")
        tail = self.tail.decode(errors="replace")
        if _looks_binary(head + tail):
            return (
                f"[binary output: {self.total:,} bytes, not shown; to look into it, pipe it through "
                "'xxd | head', 'strings | head' or 'file -']"
            )
        if self.total <= len(self.head) + len(self.tail):
            text, _ = truncate_output(head + tail, self.limit)
            return text
        dropped = self.total - len(self.head) - len(self.tail)
        text, _ = truncate_output(f"{head}\n… [{dropped} bytes not kept] …\n{tail}", self.limit)
        return text


_TEXT_CONTROLS = frozenset("\t\n\r\x1b\x0c")  # and ESC: colours are text


def _looks_binary(text: str) -> bool:
    """Whether captured output is binary data (an image, a compressed file) rather than text: over 30%
    of it bytes that are not UTF-8 or control characters. Text with a few of them (a NUL-separated list,
    a Latin-1 word) is shown as it is."""
    if len(text) < 16:
        return False
    odd = sum(1 for char in text if char == "\ufffd" or (char < " " and char not in _TEXT_CONTROLS))
    return odd > 0.3 * len(text)
