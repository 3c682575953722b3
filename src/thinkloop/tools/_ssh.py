"""The `ssh_execute` tool (SPEC §3.7): run a command on a configured host over SSH (asyncssh).

Hosts and credentials come from configuration (`SSHHost`), never from the model: the model only names
a host and a command. Host keys are checked against known_hosts unless a host explicitly opts out with
`verify_host_key=False`. Passwords and key passphrases are `SecretStr`s: they never appear in reprs,
dumps, results, events or error messages. The result has the shape of the `shell` tool's: `host`,
`exit_code`, `stdout`, `stderr`, `duration`, `timed_out`; as there, stdin is closed, output is streamed
and capped (head and tail), and bytes that are not UTF-8 become U+FFFD. Needs the `ops` extra (`asyncssh`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
import shlex
import time
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from .._aio import PerLoop, closed_with_the_loop
from .._errors import ConfigurationError
from .._tools import Tool
from ..safety._policy import command_risk
from ._shell import (
    _MAX_COMMAND_BYTES,
    DEFAULT_OUTPUT_LIMIT,
    ShellCommandError,
    _Capture,
    _check_command,
    _timeout_note,
)


class SSHHost(BaseModel):
    """How to reach one host.

    Args:
        hostname: the address (name or IP).
        port: the SSH port.
        username: the login (None: asyncssh's default, the local user).
        client_keys: paths of private keys to offer (empty: asyncssh's defaults, `~/.ssh/id_*`, and the agent).
        passphrase: the passphrase of encrypted keys.
        password: a password, if the host uses password authentication (prefer keys).
        known_hosts: the known_hosts file to check the host key against (None: `~/.ssh/known_hosts`).
        verify_host_key: set to False — explicitly — to skip host key checks (a trusted lab host only).
        connect_timeout: seconds to establish the connection.
    """

    model_config = ConfigDict(extra="forbid")

    hostname: str
    port: int = 22
    username: str | None = None
    client_keys: list[str] = Field(default_factory=list)
    passphrase: SecretStr | None = None
    password: SecretStr | None = None
    known_hosts: str | None = None
    verify_host_key: bool = True
    connect_timeout: float = 10.0

    @property
    def address(self) -> str:
        return f"{self.username + '@' if self.username else ''}{self.hostname}:{self.port}"

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments of `asyncssh.connect` (secrets revealed here only)."""
        options: dict[str, Any] = {"port": self.port, "connect_timeout": self.connect_timeout}
        if self.username is not None:
            options["username"] = self.username
        if self.client_keys:
            options["client_keys"] = [str(Path(k).expanduser()) for k in self.client_keys]
        if self.passphrase is not None:
            options["passphrase"] = self.passphrase.get_secret_value()
        if self.password is not None:
            options["password"] = self.password.get_secret_value()
        if not self.verify_host_key:
            options["known_hosts"] = None
        elif self.known_hosts is not None:
            options["known_hosts"] = str(Path(self.known_hosts).expanduser())
        return options


class SSHToolError(RuntimeError):
    """An SSH call that could not be made (unknown host, refused connection, bad host key …)."""


class SSHExecutor:
    """Runs commands on configured hosts; optionally keeps one connection per host open.

    Args:
        hosts: host name (as the model names it) → `SSHHost` (or a dict of its fields).
        timeout: seconds before a remote command is killed.
        output_limit: characters kept of stdout and of stderr each.
        reuse_connections: keep connections open between calls (close with `await executor.aclose()`).
    """

    def __init__(
        self,
        hosts: Mapping[str, SSHHost | Mapping[str, Any]],
        *,
        timeout: float = 60.0,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        reuse_connections: bool = False,
    ) -> None:
        if not hosts:
            raise ConfigurationError("ssh_execute needs at least one host: ssh_tool({'web1': SSHHost(...)})")
        self.hosts = {
            name: h if isinstance(h, SSHHost) else SSHHost.model_validate(h) for name, h in hosts.items()
        }
        self.timeout = timeout
        self.output_limit = output_limit
        self.reuse_connections = reuse_connections
        # pooled connections (and the locks of their opening) belong to the event loop that opened them:
        # agents in several threads (each `run_sync` with its own loop) have a pool each
        self._pools = PerLoop(_Pool)

    @property
    def _pool(self) -> dict[str, Any]:
        """The running event loop's pooled connections by host."""
        return self._pools.get().connections

    def __repr__(self) -> str:
        return f"SSHExecutor(hosts={sorted(self.hosts)})"

    async def execute(self, host: str, command: str) -> dict[str, Any]:
        """Run `command` on `host`; raises `SSHToolError` with an explanation when it cannot."""
        config = self.hosts.get(host)
        if config is None:
            raise SSHToolError(
                f"unknown host {host!r}: the configured hosts are {', '.join(sorted(self.hosts))}"
            )
        # checked before connecting: a NUL dropped the connection, a lone surrogate raised a raw
        # UnicodeEncodeError, 300 KB had the server reset the connection
        command = _wrapped(command)
        asyncssh = _asyncssh()
        started = time.perf_counter()
        try:
            if self.reuse_connections:
                connection = await self._pooled(host, config)
                return await self._run(connection, host, command, started)
            connection = await _connect(host, config)
            async with connection:
                return await self._run(connection, host, command, started)
        except (asyncssh.Error, OSError) as exc:  # the connection broke while the command ran
            self._pool.pop(host, None)
            raise SSHToolError(f"the SSH session with {host} ({config.address}) failed: {exc}") from None

    async def _run(self, connection: Any, host: str, command: str, started: float) -> dict[str, Any]:
        # The wrapper reports the remote shell's pid first on stderr: it leads the session's process
        # group (sshd starts each session with setsid), so a timed-out command dies with its children.
        # Output is read as bytes (not UTF-8 text: one invalid byte lost the whole result) and streamed
        # into captures keeping head and tail, never held whole (a command printing GBs is fine).
        process = await connection.create_process(command, encoding=None)
        process.stdin.write_eof()  # a command reading stdin gets end-of-file, as with `shell`, not a hang
        streams = _Streams(self.output_limit)
        timed_out = False
        try:
            async with asyncio.timeout(self.timeout):
                await streams.read(process)
                await process.wait_closed()
        except TimeoutError:
            timed_out = True
            await streams.late_pid(process.stderr)
        finally:
            process.close()
        note = ""
        if timed_out:
            note = await _kill_remote(connection, streams.pid, self.timeout, process.exit_status)
        return {
            "host": host,
            "exit_code": None if timed_out else process.exit_status,
            "stdout": streams.stdout.text(),
            "stderr": streams.stderr.text() + note,
            "duration": round(time.perf_counter() - started, 3),
            "timed_out": timed_out,
        }

    async def _pooled(self, host: str, config: SSHHost) -> Any:
        entry = self._pools.get()  # this loop's
        pool = entry.connections
        if entry.lifetime is None:  # its connections are closed when the loop shuts down (asyncio.run)
            entry.lifetime = await closed_with_the_loop(functools.partial(_close_all, pool))
        # one connection attempt per host at a time: parallel calls (a plan's tasks) each opened one,
        # and all but the last were dropped from the pool unclosed
        async with entry.connecting.setdefault(host, asyncio.Lock()):
            connection = pool.get(host)
            if connection is None or connection.is_closed():
                connection = pool[host] = await _connect(host, config)
        return connection

    async def aclose(self) -> None:
        """Close the pooled connections of the running event loop (other loops' close with their loop)."""
        await _close_all(self._pool)

    def as_tool(self, name: str = "ssh_execute") -> Tool:
        hosts = ", ".join(sorted(self.hosts))
        return Tool(
            name=name,
            description=(
                f"Run a shell command on a remote host over SSH. Hosts: {hosts}. Returns exit_code, stdout, "
                f"stderr and duration; the command is killed after {self.timeout:g} s."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "host": {
                        "type": "string",
                        "enum": sorted(self.hosts),
                        "description": "The host to run on.",
                    },
                    "command": {"type": "string", "description": "The shell command to run there."},
                },
                "required": ["host", "command"],
                "additionalProperties": False,
            },
            function=self.execute,
            risk=command_risk,
            timeout=self.timeout + max(h.connect_timeout for h in self.hosts.values()) + 10.0,
            idempotent=False,
        )


def ssh_tool(
    hosts: Mapping[str, SSHHost | Mapping[str, Any]],
    *,
    timeout: float = 60.0,
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
    name: str = "ssh_execute",
) -> Tool:
    """A `Tool` named `ssh_execute(host, command)` for the configured hosts (a new connection per call).

    For connections kept open between calls, use `SSHExecutor(hosts, reuse_connections=True).as_tool()`.
    """
    return SSHExecutor(hosts, timeout=timeout, output_limit=output_limit).as_tool(name)


def load_hosts(path: str | os.PathLike[str]) -> dict[str, SSHHost]:
    """Read `ssh_execute` hosts from a JSON, TOML or YAML file: `{name: {hostname, port, username, …}}`.

    YAML needs PyYAML installed. Errors name the file and the problem.
    """
    file = Path(path).expanduser()
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"cannot read the hosts file {str(file)!r}: {exc.strerror or exc}") from exc
    try:
        data = _parse_hosts_file(file.suffix.lower(), text)
    except ConfigurationError:
        raise
    except Exception as exc:
        raise ConfigurationError(f"the hosts file {str(file)!r} is not valid: {exc}") from exc
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ConfigurationError(
            f"the hosts file {str(file)!r} must map host names to settings, e.g. "
            '{"web1": {"hostname": "10.0.0.11", "username": "deploy"}}'
        )
    try:
        return {str(name): SSHHost.model_validate(fields) for name, fields in data.items()}
    except ValueError as exc:
        raise ConfigurationError(f"the hosts file {str(file)!r} has an invalid host: {exc}") from exc


def _parse_hosts_file(suffix: str, text: str) -> Any:
    if suffix == ".toml":
        import tomllib

        return tomllib.loads(text)
    if suffix in (".yaml", ".yml"):
        try:
            import yaml  # type: ignore[import-untyped,import-not-found,unused-ignore]
        except ImportError as exc:
            raise ConfigurationError("reading a YAML hosts file needs PyYAML: pip install pyyaml") from exc
        return yaml.safe_load(text)
    return json.loads(text)


def _asyncssh() -> Any:
    try:
        import asyncssh
    except ImportError as exc:
        raise ConfigurationError("ssh_execute needs asyncssh: pip install 'thinkloop[ops]'") from exc
    return asyncssh


async def _connect(name: str, config: SSHHost) -> Any:
    """Open a connection, turning asyncssh's failures into explanations (never mentioning secrets)."""
    asyncssh = _asyncssh()
    where = f"{name} ({config.address})"
    try:
        return await asyncssh.connect(config.hostname, **config.connect_options())
    except asyncssh.HostKeyNotVerifiable as exc:
        known = config.known_hosts or "~/.ssh/known_hosts"
        raise SSHToolError(
            f"the host key of {where} is not trusted by known_hosts ({known}): it is missing there or does "
            f"not match ({exc.reason}); refusing to connect. Check the server, then add or update its key."
        ) from None
    except asyncssh.PermissionDenied:
        raise SSHToolError(
            f"authentication to {where} failed (permission denied): check the user name and keys"
        ) from None
    except asyncssh.Error as exc:
        raise SSHToolError(f"SSH connection to {where} failed: {exc.reason}") from None
    except TimeoutError:  # its message is empty: the error said "cannot connect to web1 (…): " and no more
        raise SSHToolError(
            f"cannot connect to {where}: no SSH handshake within {config.connect_timeout:g} s "
            "(the host is down or unreachable, or the port is not an SSH server); check the address and port"
        ) from None
    except OSError as exc:
        raise SSHToolError(f"cannot connect to {where}: {exc.strerror or exc}") from None


_PID_MARK = "thinkloop-pid:"


def _wrapped(command: str) -> str:
    """The command as sent: it reports the remote shell's pid first. Refused (`ShellCommandError`) when
    empty, with a NUL or invalid Unicode, or — quoted — longer than the remote shell takes as one argument."""
    _check_command(command)
    wrapped = f"echo {_PID_MARK}$$ >&2; exec /bin/sh -c {shlex.quote(command)}"
    size = len(wrapped.encode("utf-8", errors="surrogateescape"))
    if size > _MAX_COMMAND_BYTES:
        raise ShellCommandError(
            f"the command is {size:,} bytes long once quoted for the remote shell, more than the "
            f"{_MAX_COMMAND_BYTES:,} bytes it accepts: copy long data to a file on the host first"
        )
    return wrapped


_PID_LINE_RE = re.compile(rb"thinkloop-pid:(\d+)\r?\n?")
_MAX_PRELUDE_LINES = 100  # lines a login script may print on stderr before the wrapper's pid line
_CHUNK = 1 << 16


class _Streams:
    """A remote command's stdout and stderr, captured (head and tail) as they arrive; the pid line
    the wrapper prints first on stderr is taken out and kept as `pid`."""

    def __init__(self, limit: int) -> None:
        self.stdout = _Capture(limit)
        self.stderr = _Capture(limit)
        self.pid: int | None = None
        self.looked_for_pid = False

    async def read(self, process: Any) -> None:
        """Read both streams to their end, together (they share the channel's flow control)."""
        await asyncio.gather(_drain(process.stdout, self.stdout), self._read_stderr(process.stderr))

    async def _read_stderr(self, stream: Any) -> None:
        await self._find_pid(stream)
        await _drain(stream, self.stderr)

    async def _find_pid(self, stream: Any) -> None:
        for _ in range(_MAX_PRELUDE_LINES):
            line = await stream.readline()
            if not line:
                break
            match = _PID_LINE_RE.fullmatch(line)
            if match is not None:
                self.pid = int(match.group(1))
                break
            self.stderr.add(line)  # printed by a login script before the wrapper ran: the user's stderr
        self.looked_for_pid = True

    async def late_pid(self, stream: Any, grace: float = 5.0) -> None:
        """The pid line of a command that timed out before it was read (a slow session start)."""
        if self.looked_for_pid:
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(grace):
                await self._find_pid(stream)


async def _drain(stream: Any, capture: _Capture) -> None:
    while chunk := await stream.read(_CHUNK):
        capture.add(chunk)


async def _kill_remote(connection: Any, pid: int | None, seconds: float, shell_exit: int | None) -> str:
    """Kill a timed-out remote command's process group over a second channel; say what happened."""
    if pid is None:
        return f"\n[timed out after {seconds:g} s; the remote command could not be identified to kill it]"
    with contextlib.suppress(Exception):
        async with asyncio.timeout(10):
            await connection.run(f"kill -KILL -- -{pid} 2>/dev/null || kill -KILL {pid}", check=False)
    return _timeout_note(seconds, shell_exit)


@dataclass
class _Pool:
    """One event loop's pooled connections, the locks of their opening, and what closes them with the loop."""

    connections: dict[str, Any] = field(default_factory=dict)
    connecting: dict[str, asyncio.Lock] = field(default_factory=dict)
    lifetime: AsyncGenerator[None, None] | None = None


async def _close_all(connections: dict[str, Any]) -> None:
    opened = list(connections.values())
    connections.clear()
    for connection in opened:
        connection.close()
        with contextlib.suppress(Exception):
            await connection.wait_closed()
