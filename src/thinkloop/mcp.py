"""MCP (SPEC §3.6): the tools of any Model Context Protocol server, as thinkloop `Tool`s.

    server = MCPServerStdio("python", ["-m", "mcp_server_time"], name="time")
    agent = Agent(model, mcp_servers=[server])
    async with agent:                      # connects the servers; closes them on exit
        result = await agent.run("What time is it in Tokyo?")

An `MCPServer` is a connection handle, built on the official `mcp` SDK (the `mcp` extra). It is an
async context manager; `connect()` / `aclose()` do the same by hand. The connection is owned by one
background task per server, so it may be opened by one task (a run) and closed by another (the
application), and several runs can share it.

Its tools become ordinary `Tool`s: they go through the one tool-execution choke point, so argument
checks, timeouts, truncation, risk levels and the safety gate apply to them as to any other tool. A
tool result the server marks as an error, a protocol error, and a server that died are all failed
observations naming the server; the run goes on. The tool list is cached and fetched again after
the server announces `notifications/tools/list_changed` (taking effect at the next run).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import signal
import sys
import tempfile
import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO, cast

from ._errors import ConfigurationError, RunError
from ._risk import RiskLevel
from ._tools import RiskSpec, Tool, ToolRegistry

__all__ = [
    "MCPConnectionError",
    "MCPServer",
    "MCPServerHTTP",
    "MCPServerStdio",
    "MCPToolError",
    "registry_with_mcp",
]

_TOOL_NAME_RE = re.compile(r"[^A-Za-z0-9_-]")  # what every model API accepts (OpenAI rejects '.')
_STDERR_TAIL = 2_000


class MCPConnectionError(RunError):
    """An MCP server could not be started or reached; the message names it and says why."""


class MCPToolError(Exception):
    """An MCP tool call failed: an error result, a protocol error, or a server that went away.

    Raised inside a tool's invoke, so the agent's tool executor turns it into a failed observation.
    """


class MCPServer(ABC):
    """A connection to one MCP server, and its tools as thinkloop `Tool`s.

    Args:
        name: names the server in its tools' descriptions and in error messages.
        prefix: put before every tool name (`"git_"` → `git_git_status`) to avoid collisions.
        risk: the risk level of the server's tools (default MEDIUM: an MCP server is third-party code).
        tool_risk: per-tool risk levels (or risk functions of the arguments), by the server's tool name.
        trust_annotations: rate tools by the server's own hints: `readOnlyHint` → LOW,
            `destructiveHint` → HIGH, `idempotentHint` → idempotent. Off by default: the MCP spec
            says hints from an untrusted server must not drive decisions.
        allowed_tools: only these tools (server names) are offered; None offers all.
        timeout: seconds before a tool call is abandoned (None: the agent's tool timeout).
        connect_timeout: seconds allowed to start the server and complete the handshake.
    """

    def __init__(
        self,
        *,
        name: str,
        prefix: str = "",
        risk: RiskSpec = RiskLevel.MEDIUM,
        tool_risk: Mapping[str, RiskSpec] | None = None,
        trust_annotations: bool = False,
        allowed_tools: Collection[str] | None = None,
        timeout: float | None = None,
        connect_timeout: float = 30.0,
    ) -> None:
        if connect_timeout <= 0 or (timeout is not None and timeout <= 0):
            raise ConfigurationError(f"MCP server {name!r}: timeouts must be positive")
        self.name = name
        self.prefix = prefix
        self.risk = risk
        self.tool_risk = dict(tool_risk or {})
        self.trust_annotations = trust_annotations
        self.allowed_tools = None if allowed_tools is None else frozenset(allowed_tools)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._session: Any = None
        self._owner: asyncio.Task[None] | None = None
        self._closing: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tools: list[Tool] = []
        self._stale = True
        self._refresh: asyncio.Task[None] | None = None
        self.tools_version = 0
        """Counts the tool lists fetched: a run's registry rebuilds itself when it changes."""
        self._failure: str | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # ------------------------------------------------------------------------------- transport

    @abstractmethod
    def _transport(self, stack: AsyncExitStack) -> AbstractAsyncContextManager[tuple[Any, Any]]:
        """The SDK transport: an async context manager yielding the (read, write) streams."""

    def _describe(self) -> str:
        """How the server is reached, for error messages."""
        return self.name

    def _started(self) -> None:  # noqa: B027  # a hook: only stdio servers need it
        """The transport is open (stdio: note the server's process group)."""

    def _diagnostics(self) -> str:
        """What the server said before failing (stdio: the tail of its stderr)."""
        return ""

    # ------------------------------------------------------------------------------ lifetime

    @property
    def connected(self) -> bool:
        """True while the connection is open and usable."""
        return self._session is not None

    async def __aenter__(self) -> MCPServer:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def connect(self) -> None:
        """Start (or reach) the server and complete the MCP handshake; a no-op when connected.

        Raises:
            MCPConnectionError: the server could not be started or did not answer in time.
        """
        if self.connected:
            return
        async with self._get_lock():
            if self.connected:
                return
            await self._open()

    def _get_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._loop is not loop:  # a new event loop (e.g. another run_sync)
            self._lock, self._loop, self._owner, self._session = asyncio.Lock(), loop, None, None
        return self._lock

    async def _open(self) -> None:
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._closing = asyncio.Event()
        self._failure = None
        self._owner = asyncio.create_task(self._own(ready, self._closing), name=f"mcp-server:{self.name}")
        try:
            async with asyncio.timeout(self.connect_timeout):
                await asyncio.shield(ready)
        except TimeoutError:
            await self._abort()
            raise MCPConnectionError(
                f"MCP server {self._describe()} did not complete the handshake within "
                f"{self.connect_timeout:g} s{self._diagnostics()}; check that it speaks MCP, or raise connect_timeout"
            ) from None
        except Exception as exc:
            await self._abort()
            raise MCPConnectionError(
                f"cannot connect to MCP server {self._describe()}: {_describe_exception(exc)}{self._diagnostics()}"
            ) from exc

    async def _own(self, ready: asyncio.Future[None], closing: asyncio.Event) -> None:
        """The owner task: opens the transport and session, waits for `aclose()`, closes them."""
        try:
            from mcp import ClientSession, Implementation
        except ImportError as exc:
            ready.set_exception(
                ConfigurationError(f"MCP needs the mcp SDK: pip install 'thinkloop[mcp]' ({exc})")
            )
            return
        try:
            async with AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport(stack))
                self._started()
                session = await stack.enter_async_context(
                    ClientSession(
                        read,
                        write,
                        message_handler=self._on_message,
                        client_info=Implementation(name="thinkloop", version=_version()),
                    )
                )
                await session.initialize()
                self._session, self._stale = session, True
                ready.set_result(None)
                await closing.wait()
        except asyncio.CancelledError:
            if not ready.done():
                ready.cancel()
            raise
        except Exception as exc:  # reported to whoever waits for the connection, or kept for later calls
            if not ready.done():
                ready.set_exception(exc)
            else:
                self._failure = _describe_exception(exc)
        finally:
            self._session = None

    async def aclose(self) -> None:
        """Close the connection (stopping a stdio server's process). Safe to call twice."""
        owner, self._owner = self._owner, None
        if self._closing is not None:
            self._closing.set()
        self._session = None
        refresh, self._refresh = self._refresh, None
        if refresh is not None and not refresh.done():
            refresh.cancel()
            await asyncio.wait([refresh])
        if owner is not None and not owner.done():
            await asyncio.wait([owner])

    async def _abort(self) -> None:
        """Stop a connection attempt that failed or hangs: cancel the owner task (it stops the process)."""
        owner, self._owner = self._owner, None
        self._session = None
        if owner is not None and not owner.done():
            owner.cancel()
            await asyncio.wait([owner])

    async def _on_message(self, message: Any) -> None:
        """Server notifications: a changed tool list is fetched again; a transport fault is noted."""
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            self._stale = True
            if self._refresh is None or self._refresh.done():
                self._refresh = asyncio.create_task(self._refetch(), name=f"mcp-tools:{self.name}")
        elif isinstance(message, Exception):
            self._failure = _describe_exception(message)

    async def _refetch(self) -> None:
        """In the background (not in the SDK's notification handler, which must not wait on the session)."""
        while self._stale and self.connected:
            try:
                await self.list_tools()
            except MCPConnectionError:
                return  # the next run's list_tools() tries again

    async def _settle_refresh(self) -> None:
        """Let a tool list change announced during a call land before its result is returned."""
        refresh = self._refresh
        if refresh is not None and not refresh.done():
            await asyncio.wait([refresh], timeout=self.connect_timeout)

    # --------------------------------------------------------------------------------- tools

    async def list_tools(self, *, refresh: bool = False) -> list[Tool]:
        """The server's tools as thinkloop `Tool`s (cached until the server says they changed)."""
        if not (self._stale or refresh) and self.connected:
            return list(self._tools)
        await self.connect()
        self._stale = False  # a change announced while listing sets it again
        try:
            listed = await self._list_all(self._session)
        except Exception as exc:
            self._stale = True
            raise MCPConnectionError(
                f"MCP server {self._describe()} failed to list its tools: {_describe_exception(exc)}"
            ) from exc
        self._tools = _unique_names([self._to_tool(t) for t in listed if self._offered(t.name)])
        self.tools_version += 1
        return list(self._tools)

    @staticmethod
    async def _list_all(session: Any) -> list[Any]:
        listed: list[Any] = []
        cursor: str | None = None
        while True:
            page = await session.list_tools(params=_page(cursor))
            listed.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return listed

    @property
    def tools(self) -> list[Tool]:
        """The tools of the last listing (empty before the first `list_tools()`)."""
        return list(self._tools)

    def _offered(self, name: str) -> bool:
        return self.allowed_tools is None or name in self.allowed_tools

    def _to_tool(self, mcp_tool: Any) -> Tool:
        remote = str(mcp_tool.name)
        annotations = getattr(mcp_tool, "annotations", None)
        risk = self.tool_risk.get(remote, self._annotated_risk(annotations) or self.risk)
        idempotent = bool(self.trust_annotations and getattr(annotations, "idempotent_hint", False))
        description = mcp_tool.description or getattr(mcp_tool, "title", None) or remote

        async def call(**arguments: Any) -> str:
            return await self.call_tool(remote, arguments)

        return Tool(
            name=self._local_name(remote),
            description=f"{description} (MCP server {self.name})",
            parameters=_object_schema(mcp_tool.input_schema),
            function=call,
            risk=risk,
            timeout=self.timeout,
            idempotent=idempotent,
        )

    def _annotated_risk(self, annotations: Any) -> RiskLevel | None:
        if not self.trust_annotations or annotations is None:
            return None
        if getattr(annotations, "read_only_hint", None):
            return RiskLevel.LOW
        if getattr(annotations, "destructive_hint", None):
            return RiskLevel.HIGH
        return None

    def _local_name(self, remote: str) -> str:
        ascii_name = (
            unicodedata.normalize("NFKD", f"{self.prefix}{remote}").encode("ascii", "ignore").decode()
        )
        name = _TOOL_NAME_RE.sub("_", ascii_name)
        if not name or name[0].isdigit():
            name = f"_{name}"
        return name[:64]

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> str:
        """Call a tool by its server name; the result rendered as text.

        Raises:
            MCPToolError: the server returned an error result, the call failed, or the server is gone.
        """
        session = self._session
        if session is None:
            why = f" ({self._failure})" if self._failure else ""
            raise MCPToolError(
                f"MCP server {self.name!r} is not connected{why}; it may have exited{self._diagnostics()}"
            )
        try:
            result = await session.call_tool(name, dict(arguments))
        except Exception as exc:
            await self._check_alive(exc)
            raise MCPToolError(
                f"MCP server {self.name!r}: call of {name!r} failed: {_describe_exception(exc)}"
                f"{self._diagnostics() if not self.connected else ''}"
            ) from None
        await self._settle_refresh()
        text = render_result(result)
        if getattr(result, "is_error", False):
            raise MCPToolError(f"MCP server {self.name!r} reported an error: {text}")
        return text

    async def _check_alive(self, exc: Exception) -> None:
        """After a failed call: a closed connection marks the server gone (the next run reconnects)."""
        if _is_connection_loss(exc):
            self._failure = _describe_exception(exc)
            await self.aclose()


# ==================================================================================== transports


class MCPServerStdio(MCPServer):
    """An MCP server started as a subprocess and spoken to over its stdin/stdout.

    Args:
        command: the program (`"python"` or `"python3"` runs the interpreter running thinkloop).
        args: its arguments.
        env: environment variables added to the SDK's safe default environment.
        cwd: its working directory.
        name: names the server in errors (default: the command line).
        **options: see `MCPServer` (prefix, risk, tool_risk, timeout, …).

    The server's stderr is kept in a temporary file; its tail is quoted when the server fails.
    """

    def __init__(
        self,
        command: str,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        *,
        name: str | None = None,
        **options: Any,
    ) -> None:
        if not command:
            raise ConfigurationError(
                "MCPServerStdio needs a command, e.g. MCPServerStdio('uvx', ['mcp-server-time'])"
            )
        self.command = sys.executable if command in ("python", "python3") else command
        self.args = list(args)
        self.env = dict(env or {})
        self.cwd = cwd
        self._stderr: TextIO | None = None
        self._pid: int | None = None
        self._stderr_tail = ""
        super().__init__(name=name or shlex.join([command, *self.args]), **options)

    @classmethod
    def from_command_line(cls, command_line: str, **options: Any) -> MCPServerStdio:
        """A server from one shell-style command line: `"python -m mcp_server_time"`."""
        parts = shlex.split(command_line)
        if not parts:
            raise ConfigurationError(f"empty MCP server command line: {command_line!r}")
        return cls(parts[0], parts[1:], **options)

    def _describe(self) -> str:
        return f"{self.name!r} ({shlex.join([self.command, *self.args])})"

    def _transport(self, stack: AsyncExitStack) -> AbstractAsyncContextManager[tuple[Any, Any]]:
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        self._stderr = stack.enter_context(_temporary_text_file())
        self._stderr_tail = ""
        self._pid = None
        stack.callback(self._keep_stderr_tail)  # runs after the process stopped, before the file closes
        stack.callback(self._kill_leftovers)  # runs after the SDK stopped the server itself
        params = StdioServerParameters(
            command=self.command, args=self.args, env=self.env or None, cwd=self.cwd
        )
        return stdio_client(params, errlog=self._stderr)

    def _started(self) -> None:
        self._pid = _child_writing_to(self._stderr) if self._stderr is not None else None

    def _kill_leftovers(self) -> None:
        """Kill what the server left running in its process group (the SDK starts it in a session of its
        own). The SDK kills the group only when the server outlives its stdin; a server exiting cleanly
        left its children running (`npx`/`uvx` wrappers, helpers it spawned) after `aclose()`."""
        pid, self._pid = self._pid, None
        if pid is not None:
            with contextlib.suppress(OSError):  # none left (ESRCH), or not ours to kill (EPERM)
                os.killpg(pid, signal.SIGKILL)

    def _keep_stderr_tail(self) -> None:
        self._stderr_tail = self._read_stderr_tail()

    def _read_stderr_tail(self) -> str:
        file = self._stderr
        if file is None or file.closed:
            return self._stderr_tail
        try:
            file.flush()
            file.seek(0, 2)
            size = file.tell()
            file.seek(max(size - 4 * _STDERR_TAIL, 0))
            return file.read()[-_STDERR_TAIL:].strip()
        except (OSError, ValueError):
            return self._stderr_tail

    def _diagnostics(self) -> str:
        tail = self._read_stderr_tail()
        return f"; its stderr ends with: {tail}" if tail else ""


class MCPServerHTTP(MCPServer):
    """An MCP server reached over Streamable HTTP.

    Args:
        url: the MCP endpoint, e.g. `"http://127.0.0.1:8000/mcp"`.
        headers: HTTP headers sent with every request (e.g. `Authorization`).
        name: names the server in errors (default: the URL).
        **options: see `MCPServer` (prefix, risk, tool_risk, timeout, …).
    """

    def __init__(
        self, url: str, headers: Mapping[str, str] | None = None, *, name: str | None = None, **options: Any
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigurationError(f"MCPServerHTTP needs an http(s) URL, not {url!r}")
        self.url = url
        self.headers = dict(headers or {})
        super().__init__(name=name or url, **options)

    def _describe(self) -> str:
        return f"{self.name!r} ({self.url})" if self.name != self.url else repr(self.url)

    def _transport(self, stack: AsyncExitStack) -> AbstractAsyncContextManager[tuple[Any, Any]]:
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        client = create_mcp_http_client(headers=self.headers or None)
        stack.push_async_callback(client.aclose)
        return streamable_http_client(self.url, http_client=client)


# ======================================================================================= helpers


async def registry_with_mcp(base: Iterable[Tool], servers: Sequence[MCPServer]) -> ToolRegistry:
    """A run's registry: `base` plus every server's tools (connecting as needed); names must be unique.

    The registry follows the servers: when one announces a changed tool list during the run, its new
    tools replace the old ones (a new tool whose name is taken is left out).

    Raises:
        ConfigurationError: two tools of one name, naming both owners.
        MCPConnectionError: a server could not be reached.
    """
    for server in servers:
        await server.list_tools()
    return _LiveRegistry(list(base), list(servers))


class _LiveRegistry(ToolRegistry):
    """Base tools plus the servers' current tools, rebuilt when a server's tool list changes."""

    def __init__(self, base: list[Tool], servers: list[MCPServer]) -> None:
        self._base, self._servers = base, servers
        self._current: dict[str, Tool] = {}
        self._versions = tuple(s.tools_version for s in servers)
        super().__init__()
        self._current = self._build(strict=True)

    @property
    def _tools(self) -> dict[str, Tool]:
        versions = tuple(s.tools_version for s in self._servers)
        if versions != self._versions:
            self._versions, self._current = versions, self._build(strict=False)
        return self._current

    @_tools.setter
    def _tools(self, value: dict[str, Tool]) -> None:
        self._current = value

    def _build(self, *, strict: bool) -> dict[str, Tool]:
        tools = {t.name: t for t in ToolRegistry(self._base)}
        owners = dict.fromkeys(tools, "the agent's tools")
        for server in self._servers:
            for mcp_tool in server.tools:
                if mcp_tool.name not in owners:
                    tools[mcp_tool.name], owners[mcp_tool.name] = mcp_tool, f"MCP server {server.name!r}"
                elif strict:
                    raise ConfigurationError(
                        f"tool name {mcp_tool.name!r} of MCP server {server.name!r} is already taken by "
                        f"{owners[mcp_tool.name]}; give the server a prefix, e.g. prefix='{_slug(server.name)}_'"
                    )
        return tools


def _unique_names(tools: list[Tool]) -> list[Tool]:
    """Names made valid for a model may coincide (`get weather!`, `get weather?`): number the later ones."""
    taken: set[str] = set()
    unique = []
    for tool in tools:
        name, n = tool.name, 1
        while name in taken:
            n += 1
            name = f"{tool.name[: 64 - len(str(n)) - 1]}_{n}"
        taken.add(name)
        unique.append(tool if name == tool.name else _renamed(tool, name))
    return unique


def _renamed(tool: Tool, name: str) -> Tool:
    return Tool(
        name, tool.description, tool.parameters, tool.function, risk=tool.risk, timeout=tool.timeout,
        idempotent=tool.idempotent,
    )  # fmt: skip


def render_result(result: Any) -> str:
    """An MCP `CallToolResult` as observation text: its content blocks, or its structured content."""
    parts = [_render_block(block) for block in getattr(result, "content", None) or []]
    text = "\n".join(p for p in parts if p)
    if not text and getattr(result, "structured_content", None) is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False, default=str)
    return text or "(no output)"


def _render_block(block: Any) -> str:
    kind = getattr(block, "type", None)
    if kind == "text":
        return str(block.text)
    if kind in ("image", "audio"):
        data = str(block.data).rstrip()
        size = len(data) * 3 // 4 - (len(data) - len(data.rstrip("=")))  # base64 padding is no data
        return f"[{kind}: {block.mime_type}, {size} bytes]"
    if kind == "resource_link":
        return f"[resource: {block.uri}]"
    if kind == "resource":
        resource = block.resource
        text = getattr(resource, "text", None)
        return (
            str(text) if text is not None else f"[resource: {resource.uri}, {resource.mime_type or 'binary'}]"
        )
    return str(block)


def _child_writing_to(file: TextIO) -> int | None:
    """The pid of our child process whose stderr is `file` (Linux /proc; None elsewhere or not found)."""
    try:
        target = os.fstat(file.fileno())
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except (OSError, ValueError):
        return None
    me = os.getpid()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            if parent == me:
                fd = os.stat(f"/proc/{pid}/fd/2")
                if (fd.st_dev, fd.st_ino) == (target.st_dev, target.st_ino):
                    return pid
        except (OSError, ValueError, IndexError):
            continue
    return None


@contextlib.contextmanager
def _temporary_text_file() -> Iterator[TextIO]:
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as file:
        yield cast(TextIO, file)


def _object_schema(schema: Any) -> dict[str, Any]:
    result = dict(schema or {})
    result.pop("title", None)
    result.setdefault("type", "object")
    result.setdefault("properties", {})
    return result


def _page(cursor: str | None) -> Any:
    if cursor is None:
        return None
    from mcp.types import PaginatedRequestParams

    return PaginatedRequestParams(cursor=cursor)


def _is_connection_loss(exc: BaseException) -> bool:
    try:
        import anyio
        from mcp.types import CONNECTION_CLOSED
    except ImportError:  # pragma: no cover - the SDK is installed when a session exists
        return False
    if isinstance(exc, anyio.ClosedResourceError | anyio.BrokenResourceError | anyio.EndOfStream | OSError):
        return True
    return getattr(getattr(exc, "error", None), "code", None) == CONNECTION_CLOSED


def _describe_exception(exc: BaseException) -> str:
    """One line for an exception, unwrapping the exception groups of the SDK's task groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _slug(name: str) -> str:
    return (re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "server")[:20]


def _version() -> str:
    from . import __version__

    return __version__
