"""The `shell` tool (SPEC §3.7): run a command locally with `/bin/sh -c`.

The command runs in its own process group, in a fixed working directory, with only the allow-listed
environment variables; on timeout (or when the call is cancelled) the whole group is killed, even if
the shell itself has exited and only a background child still holds its output — and so is, on Linux,
every other process of the command: one that left the group (`setsid`), whether it holds the output
or redirected it, and all their descendants, each stopped as soon as it is found so that a loop
forking new ones cannot outrun the kill; a daemon that detached itself (a double fork) is found by a
variable each command's environment carries (`THINKLOOP_SHELL_CALL`). An empty command, a NUL
character or a command over the system's argument limit is refused with `ShellCommandError`. The
result is a JSON object: `exit_code`, `stdout`, `stderr` (each cut to the output limit, head and tail
kept; binary data is described, not shown), `duration` and `timed_out`. Its risk comes from the
command classifier.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
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
    mark = secrets.token_hex(8)
    try:
        process = await _start(command, cwd, {**env, CALL_VARIABLE: mark}, stdout, stderr)
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
                await _kill_group(process, (stdout.inode, stderr.inode), f"{CALL_VARIABLE}={mark}")
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


# Set, to a value of its own, in the environment of each command: a process that carries it is the
# command's, even one that detached itself (a new session, its output redirected, its parent gone).
CALL_VARIABLE = "THINKLOOP_SHELL_CALL"


async def _kill_group(process: asyncio.subprocess.Process, pipes: tuple[int, int], mark: str) -> None:
    try:
        _kill_everything(process, pipes, mark)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # the group outlives its leader while a member lives
        with contextlib.suppress(ProcessLookupError):
            process.kill()
    await asyncio.shield(process.wait())


_SETTLE_SECONDS = 1.0  # how long to wait at most for every process found to stop (one in D state may not)
_MAX_SCANS = 1_000  # a bound on the scans of /proc, whatever happens


def _kill_everything(process: asyncio.subprocess.Process, pipes: tuple[int, int], mark: str) -> None:
    """SIGKILL every process of the command (Linux /proc; elsewhere the caller's group kill only).

    The command's processes are the shell, the members of its session and process group, the processes
    holding its output pipes, and every descendant of these: found through the parent links, so a child
    that left the session with `setsid` and redirected its output is found too. Each one is stopped
    (SIGSTOP) as soon as it is found, so it forks no more, and /proc is scanned again until a scan
    finds nothing new after every process found was seen stopped (a fork under way when the stop came
    shows its child in the next scan); then they are all killed. Synchronous, never awaiting: a second
    cancellation cannot leave the processes stopped but not killed.

    A daemon that detached itself on purpose (`setsid`, output redirected, a double fork: no link left)
    is found by the `mark` (`CALL_VARIABLE=…`) in its environment, which every process of the command
    inherits. Not found: a detached process that also cleared its environment (`env -i`).
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGSTOP)
    freezer = _Freezer(process.pid, shell_alive=process.returncode is None, mark=mark)
    try:
        freezer.scan(pipes)  # the holders' new children: the parent links find them
        deadline, quiet = time.monotonic() + _SETTLE_SECONDS, 0
        for _ in range(_MAX_SCANS):
            new = freezer.scan()
            if new or (freezer.stopped - freezer.frozen and time.monotonic() < deadline):
                quiet = 0
                if not new:
                    time.sleep(0.002)  # SIGSTOP is delivered asynchronously
            else:
                quiet += 1
                if quiet == 2:  # this scan began after every process found was seen stopped
                    break
    except OSError:  # no /proc
        pass
    finally:
        for pid in freezer.stopped:
            _signal(pid, signal.SIGKILL)


_Table = dict[int, tuple[str, int, int, int]]  # pid: (state, parent, process group, session)


class _Freezer:
    """Finds the command's processes in /proc and stops each one (SIGSTOP) as soon as it is found."""

    def __init__(self, leader: int, *, shell_alive: bool, mark: str = "") -> None:
        self.leader = leader
        self.mark = b"\0" + mark.encode() + b"\0" if mark else b""  # as /proc/PID/environ holds it
        self.shell_alive = shell_alive  # while the shell is not reaped, its pid is still its own
        self.table: _Table = {}
        self.ours: set[int] = set()  # the command's processes found
        self.stopped: set[int] = set()  # the ones sent SIGSTOP (a set-user-ID program is not ours to stop)
        self.frozen: set[int] = set()  # the ones since seen stopped, or gone: they fork no more
        self.me = os.getpid()

    def scan(self, pipes: tuple[int, int] | None = None) -> int:
        """Read /proc again, stopping the command's processes found; how many were new.

        With `pipes`, a process holding one of them is the command's too. Only the command's processes
        not yet seen stopped, and the pids new since the last scan, are read again: a process that was
        not the command's cannot become one (it cannot join the command's session, and an orphan goes
        to init, not to one of ours), and pids are handed out in a cycle, so none is used again within
        the milliseconds between two scans.
        """
        wanted = {f"pipe:[{inode}]" for inode in pipes or () if inode}
        found, previous, table = len(self.ours), self.table, {}
        for pid in sorted(int(name) for name in os.listdir("/proc") if name.isdigit()):  # parents first
            entry = previous.get(pid)
            new = entry is None
            if entry is None or (pid in self.ours and pid not in self.frozen):
                entry = _stat(pid)
                if entry is None:  # gone meanwhile
                    continue
            table[pid] = entry
            state, parent, group, session = entry
            if pid in self.ours:
                if pid in self.stopped and state in "TtZX":
                    self.frozen.add(pid)
            elif (
                parent in self.ours
                or self.leader in (group, session)
                or (self.shell_alive and pid == self.leader)
                or (wanted and pid != self.me and _holds(pid, wanted))
                or (new and self.mark and pid != self.me and _carries(pid, self.mark))
            ):
                self._own(pid)
        self.table = table
        self.frozen |= self.stopped - table.keys()
        self._descendants()  # the children listed before their parent was found (pids wrap around)
        return len(self.ours) - found

    def _descendants(self) -> None:
        """Stop every descendant in the table of the processes found."""
        children: dict[int, list[int]] = {}
        for pid, (_, parent, _, _) in self.table.items():
            children.setdefault(parent, []).append(pid)
        todo = [child for pid in self.ours for child in children.get(pid, ()) if child not in self.ours]
        while todo:
            pid = todo.pop()
            if pid not in self.ours and pid != self.me:
                self._own(pid)
                todo.extend(children.get(pid, ()))

    def _own(self, pid: int) -> None:
        if pid not in self.ours and pid != self.me:
            self.ours.add(pid)
            if _signal(pid, signal.SIGSTOP):
                self.stopped.add(pid)


def _signal(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):  # gone, or not ours to stop (a set-user-ID program)
        return False
    return True


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """The state, parent, process group and session of `pid` (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            line = handle.read()
    except OSError:
        return None
    fields = line.rpartition(b")")[2].split()  # after "pid (name)": the name may hold ") "
    try:
        return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3])
    except (IndexError, ValueError):  # not the format of Linux's /proc
        return None


def _holds(pid: int, wanted: set[str]) -> bool:
    """Whether `pid` has one of the `wanted` pipes open."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # gone, or not ours to look at (nor to kill)
        return False
    return any(_link(f"/proc/{pid}/fd/{fd}") in wanted for fd in fds)


def _carries(pid: int, mark: bytes) -> bool:
    """Whether the environment `pid` started with holds `mark` (NUL-framed `NAME=value`)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return mark in b"\0" + handle.read() + b"\0"
    except OSError:  # gone, or not ours to look at (nor to kill)
        return False


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
