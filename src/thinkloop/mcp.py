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
observations naming the server; the run goes on. A server that exited while idle, or stopped answering
after a call timed out (it is pinged then), is started again for the next call. The tool list is cached
and fetched again in the background after the server announces `notifications/tools/list_changed` (the
runs using the server follow it; a server announcing a change at every listing is listed ever less often).

Servers publish input schemas that model APIs refuse (not an object, `$ref`s, `required` naming
nothing, 5,000-character descriptions): each is normalised into a valid object schema for the model
(`input_schema`), and the arguments are still checked against the server's own schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import json
import logging
import math
import os
import re
import shlex
import signal
import sys
import tempfile
import time
import unicodedata
import urllib.parse
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO, cast

from ._errors import ConfigurationError, RunError
from ._risk import RiskLevel
from ._tools import RiskSpec, Tool, ToolArgumentsError, ToolRegistry

__all__ = [
    "MCPConnectionError",
    "MCPServer",
    "MCPServerHTTP",
    "MCPServerStdio",
    "MCPToolError",
    "input_schema",
    "registry_with_mcp",
]

PING_TIMEOUT = 10.0  # seconds to answer a ping after a call timed out (at most connect_timeout)
REFRESH_WAIT = 1.0  # seconds a call's result waits for the tool list it changed (at most connect_timeout)
_RELIST_BURST = 3  # tool listings in the background back to back; then they pause (`_announced`)
_RELIST_PAUSE = 1.0, 30.0  # seconds of the first pause, and of the longest (each twice the one before)
_QUIET = 1.0  # seconds after a listing ended: a change announced before is no news (it may be its echo)
_TOOL_NAME_RE = re.compile(r"[^A-Za-z0-9_-]")  # what every model API accepts (OpenAI rejects '.')
_STDERR_TAIL = 2_000
logger = logging.getLogger("thinkloop.mcp")


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
        if not connect_timeout > 0 or (timeout is not None and not timeout > 0):  # NaN too: it fires at once
            raise ConfigurationError(
                f"MCP server {name!r}: timeouts must be positive numbers of seconds, not timeout={timeout!r}, "
                f"connect_timeout={connect_timeout!r}"
            )
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
        self._refresh: asyncio.Task[None] | None = None  # fetching a changed tool list in the background
        self._resume: asyncio.TimerHandle | None = None  # starting `_refresh` again after a pause
        self._relists = 0  # background listings since a change was announced while the server was quiet
        self._changes = 0  # tool list changes announced
        self._listing = 0  # listings on their way
        self._listed_at = -math.inf  # when the last listing ended (time.monotonic())
        self._announced_at = -math.inf  # when the last change was announced
        self.tools_version = 0
        """Counts the tool lists fetched: a run's registry rebuilds itself when it changes."""
        self._failure: str | None = None
        self._lost: str | None = None  # how the connection ended while no call ran: the next call restarts it
        self._in_flight = 0  # calls on their way
        self._probe: asyncio.Task[None] | None = None  # a ping after an abandoned call
        self._died: tuple[Any, str] | None = None  # (the owner task of a connection that died mid-call, why)
        self._notes = 0  # what an HTTP server's transport noted (an error status, a failed connection)
        self._listed_schemas: dict[str, Any] = {}  # the input schemas as the server sent them, by tool

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
        self._check_loop()
        if self.connected:
            return
        async with self._get_lock():
            if self.connected:
                return
            await self._open()

    def _check_loop(self) -> None:
        """A connection serves the event loop it was opened in: while that loop still runs (another thread's
        `run_sync`), another loop cannot use it — nor open its own, which would cut the first one off."""
        loop, mine = asyncio.get_running_loop(), self._loop
        if mine is not None and mine is not loop and mine.is_running() and self.connected:
            raise MCPConnectionError(
                f"MCP server {self._describe()} is connected in another event loop that is still running "
                f"(another thread's run_sync or asyncio.run), and its connection serves that loop only: give "
                f"each thread its own {type(self).__name__} (and agent), or run the agents in one event loop"
            )

    def _get_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._loop is not loop:  # a new event loop (e.g. another run_sync)
            self._lock, self._loop, self._owner, self._session = asyncio.Lock(), loop, None, None
            self._refresh = self._resume = None  # the old loop's
        return self._lock

    async def _open(self) -> None:
        previous = self._owner  # a connection that ended by itself (`_ended`) may be stopping its process
        if previous is not None and not previous.done():
            await asyncio.wait([previous])
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._closing = asyncio.Event()
        self._failure, self._lost = None, None
        self._pause_refresh(None)  # a pause for the previous connection
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
                read, write = _ListingRepair(self).streams(read, write, ended=lambda: self._ended(closing))
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
                self._session, self._stale, self._relists = session, True, 0
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
        self._session, self._failure, self._lost = None, None, None
        self._pause_refresh(None)
        for task in (self._refresh, self._probe):
            if task is not None and not task.done() and task is not asyncio.current_task():
                task.cancel()
                await asyncio.wait([task])
        self._refresh = self._probe = None
        if owner is not None and not owner.done():
            await asyncio.wait([owner])

    def _ended(self, closing: asyncio.Event) -> None:
        """The transport's read stream ended without `aclose()`: the server exited or went away. With no call
        running, the next call (or run) starts it again; a call running fails, saying it died during it."""
        if closing.is_set() or closing is not self._closing or self._session is None:
            return  # our own close, an earlier connection's end, or a handshake that fails by itself
        if not self._in_flight:
            self._lost, self._session = self._loss_while_idle(), None
        closing.set()  # the owner task closes the session and the transport

    _AGAIN = "reconnected"  # what `_restart` does: a stdio server is started again
    _KEEP_TRYING = True  # after a failed restart the next call tries again (an HTTP server being redeployed)

    def _loss_while_idle(self) -> str:
        return "closed its connection while no call was running (the server stopped or went away)"

    def _kill(self) -> None:  # noqa: B027  # a hook: only stdio servers have a process to kill
        """Stop the server at once (a stdio server's process group), for one that no longer answers."""

    def _refusal_since(self, count: int) -> str:
        """The HTTP error status an HTTP server answered since `_notes` was `count`, or ""."""
        return ""

    def _unreached_since(self, count: int) -> str:
        """Why an HTTP server could not be connected to since `_notes` was `count`, or ""."""
        return ""

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
            self._announced()
        elif isinstance(message, Exception):
            self._failure = _describe_exception(message)

    def _announced(self) -> None:
        """The server says its tool list changed: it is fetched again in the background, once for all the
        announcements that arrive while a listing is on its way.

        Some servers announce a change whenever they are listed (or all the time), which would have them
        listed without end: after `_RELIST_BURST` background listings, each waits twice as long as the one
        before (1 s, 2 s, … 30 s), until a change is announced after a quiet while (no listing on its way,
        and no listing or announcement in the last `_QUIET` s), which is fetched at once again. A list
        still stale is also fetched by the next `list_tools()` (the next run).
        """
        now, last = time.monotonic(), max(self._listed_at, self._announced_at)
        self._stale, self._announced_at = True, now
        self._changes += 1
        if not self._listing and now - last >= _QUIET:
            self._relists = 0
            self._pause_refresh(None)
        if self._resume is None:
            self._start_refresh()

    def _start_refresh(self, *, paused: bool = False) -> None:
        if paused:
            self._resume = None
        if self.connected and (self._refresh is None or self._refresh.done()):
            self._refresh = asyncio.create_task(self._refetch(paused=paused), name=f"mcp-tools:{self.name}")

    def _pause_refresh(self, seconds: float | None) -> None:
        """Start the background refresh again in `seconds` (None: cancel a pause)."""
        if self._resume is not None:
            self._resume.cancel()
        self._resume = None
        if seconds is not None:
            resume = functools.partial(self._start_refresh, paused=True)
            self._resume = asyncio.get_running_loop().call_later(seconds, resume)

    async def _refetch(self, *, paused: bool = False) -> None:
        """In the background (not in the SDK's notification handler, which must not wait on the session)."""
        while self._stale and self.connected:
            if self._relists >= _RELIST_BURST and not paused:
                first, longest = _RELIST_PAUSE
                self._pause_refresh(min(first * 2 ** min(self._relists - _RELIST_BURST, 16), longest))
                return
            paused = False
            self._relists += 1
            try:
                await self.list_tools()
            except MCPConnectionError:
                return  # the next run's list_tools() tries again

    async def _settle_refresh(self, changes: int) -> None:
        """Let a tool list change announced during a call (`_changes` was `changes` before it) land before
        its result is returned, so that the model's next step sees it, waiting at most `REFRESH_WAIT` s."""
        refresh = self._refresh
        if self._changes == changes or refresh is None or refresh.done() or refresh is asyncio.current_task():
            return
        await asyncio.wait([refresh], timeout=min(self.connect_timeout, REFRESH_WAIT))

    # --------------------------------------------------------------------------------- tools

    async def list_tools(self, *, refresh: bool = False) -> list[Tool]:
        """The server's tools as thinkloop `Tool`s (cached until the server says they changed)."""
        self._check_loop()
        if not (self._stale or refresh) and self.connected:
            return list(self._tools)
        await self.connect()
        self._stale = False  # a change announced while listing sets it again
        self._listing += 1
        try:
            async with asyncio.timeout(self.connect_timeout):
                listed = await self._list_all(self._session)
        except Exception as exc:
            self._stale = True
            raise self._listing_error(exc) from exc
        finally:
            self._listing -= 1
            self._listed_at = time.monotonic()
        listed = [t for t in listed if self._offered(t.name)]
        names = _unique_names([self._local_name(t.name) for t in listed])
        self._tools = [self._to_tool(t, name) for t, name in zip(listed, names, strict=True)]
        self.tools_version += 1
        return list(self._tools)

    def _listing_error(self, exc: Exception) -> MCPConnectionError:
        """Why `tools/list` failed, and what to do about it."""
        if isinstance(exc, TimeoutError):
            why = f"it did not answer tools/list within {self.connect_timeout:g} s"
            if self._failure:
                why += f" (its connection reported: {self._failure})"
            hint = "check that the server works when started by hand, or raise connect_timeout"
        elif _is_validation_error(exc):
            why = f"its tools/list answer is not valid MCP ({_describe_exception(exc)})"
            hint = (
                "the server is broken or speaks another MCP version: update it, or report it to its authors"
            )
        else:
            why = f"its tools/list failed: {_describe_exception(exc)}"
            hint = "check the server's configuration and log"
        return MCPConnectionError(
            f"MCP server {self._describe()} cannot be used: {why}; {hint}{self._diagnostics()}"
        )

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

    def _to_tool(self, mcp_tool: Any, name: str) -> Tool:
        remote = str(mcp_tool.name)
        annotations = getattr(mcp_tool, "annotations", None)
        risk = self.tool_risk.get(remote, self._annotated_risk(annotations) or self.risk)
        idempotent = bool(self.trust_annotations and getattr(annotations, "idempotent_hint", False))
        suffix = f" (MCP server {self.name})"
        description = mcp_tool.description or getattr(mcp_tool, "title", None) or remote
        description = _shortened(str(description).strip(), max(_MAX_DESCRIPTION - len(suffix), 80))
        parameters = input_schema(mcp_tool.input_schema)  # mended on the wire; again for what was not
        original = self._listed_schemas.get(remote, mcp_tool.input_schema)

        async def call(**arguments: Any) -> str:
            return await self.call_tool(remote, arguments)

        return _MCPTool(
            name,
            description + suffix,
            parameters,
            call,
            risk=risk,
            timeout=self.timeout,
            idempotent=idempotent,
            check=_ArgumentCheck(original),
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

        A server whose connection ended while no call was running (it exited, or was stopped for not
        answering a ping after a call timed out) is started again first: the call never reached it.

        Raises:
            MCPToolError: the server returned an error result, the call failed, or the server is gone.
        """
        try:
            self._check_loop()
        except MCPConnectionError as exc:
            raise MCPToolError(str(exc)) from None
        await self._settle_probe()
        if self._session is None and self._lost is not None:
            await self._restart(name)
        session, owner = self._session, self._owner
        if session is None:
            raise MCPToolError(self._not_connected())
        self._in_flight += 1
        notes, changes = self._notes, self._changes
        try:
            result = await session.call_tool(name, dict(arguments))
        except asyncio.CancelledError:  # abandoned (timed out): is the server still answering?
            self._start_probe(name, session)
            raise
        except Exception as exc:
            why = await self._call_failed(name, exc, owner, notes)
            raise MCPToolError(why + self._refusal_since(notes)) from None
        finally:
            self._in_flight -= 1
        await self._settle_refresh(changes)
        text = render_result(result)
        if getattr(result, "is_error", False):
            said = text if text != "(no output)" else "(an error result without any content)"
            raise MCPToolError(f"MCP server {self.name!r} reported an error: {said}")
        return text

    async def _restart(self, name: str) -> None:
        """Start the server again for the call of `name`, after its connection ended while idle."""
        lost = self._lost
        tail = self._diagnostics()  # what the stopped server said last
        try:
            await self.connect()
        except MCPConnectionError as exc:
            if self._KEEP_TRYING:
                self._lost = lost
                raise MCPToolError(
                    f"MCP server {self.name!r} {lost}, and could not be {self._AGAIN} for the call of {name!r}: "
                    f"{exc}; the next call tries again"
                ) from None
            self._failure = f"it {lost}, and could not be {self._AGAIN}: {exc}"
            raise MCPToolError(
                f"MCP server {self.name!r} {lost}, and could not be {self._AGAIN} for the call of {name!r}: "
                f"{exc}; this run cannot use it any more, the next run tries again"
            ) from None
        logger.warning("MCP server %r %s%s; %s for the call of %r", self.name, lost, tail, self._AGAIN, name)
        self._start_refresh()  # the new process may offer other tools

    def _start_probe(self, name: str, session: Any) -> None:
        """After an abandoned call, ping the server in the background: one that does not answer (wedged, its
        event loop blocked) is stopped, and the next call starts it again instead of waiting in vain."""
        if self._session is session and (self._probe is None or self._probe.done()):
            self._probe = asyncio.create_task(self._ping(name, session), name=f"mcp-ping:{self.name}")

    async def _ping(self, name: str, session: Any) -> None:
        seconds = min(self.connect_timeout, PING_TIMEOUT)
        try:
            async with asyncio.timeout(seconds):
                await session.send_ping()
            return
        except TimeoutError:
            pass
        except Exception:  # an error answer is an answer; a lost connection is `_ended`'s business
            return
        if self._session is not session or self._closing is None:
            return  # closed or replaced meanwhile
        self._lost = (
            f"did not answer a ping within {seconds:g} s after the call of {name!r} was abandoned, "
            "so it was stopped"
        )
        self._session = None
        self._kill()
        self._closing.set()  # the owner task closes the session and the transport

    async def _settle_probe(self) -> None:
        """Let a ping after an abandoned call settle whether the server answers, before the next call."""
        probe = self._probe
        if probe is not None and not probe.done() and probe is not asyncio.current_task():
            await asyncio.wait([probe])

    def _not_connected(self) -> str:
        if self._failure:
            return (
                f"MCP server {self.name!r} died earlier ({self._failure}); this run cannot use it any more, "
                f"the next run reconnects it{self._diagnostics()}"
            )
        return f"MCP server {self.name!r} is not connected: connect it first (`async with server:`, or give it to an Agent)"

    async def _call_failed(self, name: str, exc: Exception, owner: Any, notes: int) -> str:
        """Why a call failed. A lost connection marks the server gone (the next run reconnects), unless the
        call could not reach it (an HTTP server that refused the connection): the next call reconnects."""
        what = _describe_exception(exc)
        if not _is_connection_loss(exc):
            return f"MCP server {self.name!r}: call of {name!r} failed: {what}"
        if owner is not self._owner:  # `aclose()` ran while the call was in flight: ours, after a death?
            if self._died is not None and self._died[0] is owner:
                return self._died_during(name, self._died[1])
            return f"MCP server {self.name!r} was closed during the call of {name!r}"
        unreached = self._unreached_since(notes)
        if unreached and self._lost is None:
            self._lost, self._session = f"could not be reached ({unreached})", None
            return (
                f"MCP server {self.name!r} could not be reached for the call of {name!r} ({unreached}): the "
                "call did not reach it; the next call tries to reconnect"
            )
        if self._lost is not None:  # stopped by a ping that went unanswered: the next call restarts it
            return f"MCP server {self.name!r} {self._lost}, which cut the call of {name!r}; the next call retries it"
        self._died = (owner, what)  # for the other calls in flight on it, which `aclose()` ends too
        await self.aclose()
        self._failure = what
        return self._died_during(name, what)

    def _died_during(self, name: str, what: str) -> str:
        return (
            f"MCP server {self.name!r} died during the call of {name!r} (its connection closed: {what}); "
            f"this run cannot use it any more, the next run reconnects it{self._diagnostics()}"
        )


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

    _AGAIN = "started again"
    _KEEP_TRYING = False  # a process that cannot start now will not start at the next call either

    def _loss_while_idle(self) -> str:
        return "exited while no call was running"

    def _kill(self) -> None:
        self._kill_leftovers()  # its whole process group: the SDK then finds it gone at once

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
        self._refused = ""  # the last HTTP error status a POST got, and what to do about it
        self._unreached = ""  # the last failure to connect to it
        super().__init__(name=name or url, **options)

    def _describe(self) -> str:
        return f"{self.name!r} ({self.url})" if self.name != self.url else repr(self.url)

    def _transport(self, stack: AsyncExitStack) -> AbstractAsyncContextManager[tuple[Any, Any]]:
        import httpx2  # the SDK's HTTP client
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT

        client = httpx2.AsyncClient(  # as the SDK's create_mcp_http_client, with a transport taking notes
            headers=self.headers or None,
            timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT),
            transport=cast(
                httpx2.AsyncBaseTransport, _NotingTransport(httpx2.AsyncHTTPTransport(), self._note_unreached)
            ),
            event_hooks={"response": [self._note_refusal]},
        )
        self._refused = self._unreached = ""
        stack.push_async_callback(client.aclose)
        return streamable_http_client(self.url, http_client=client)

    def _note_unreached(self, exc: Exception) -> None:
        self._unreached = _describe_exception(exc)
        self._notes += 1

    async def _note_refusal(self, response: Any) -> None:
        """An HTTP error status the server answered a message with: the SDK says only 'Server returned an
        error response'."""
        status = int(response.status_code)
        if status < 400 or response.request.method != "POST":  # a GET stream the server does not offer: fine
            return
        kind = str(response.headers.get("content-type") or "no content type").split(";")[0].strip()
        self._refused = f"HTTP {status} {response.reason_phrase} ({kind}){_http_hint(status)}"
        self._notes += 1

    def _diagnostics(self) -> str:
        return f"; it answered {self._refused}" if self._refused else ""

    def _refusal_since(self, count: int) -> str:
        return f" (it answered {self._refused})" if self._notes != count and self._refused else ""

    def _unreached_since(self, count: int) -> str:
        return self._unreached if self._notes != count else ""


class _NotingTransport:
    """An httpx transport reporting the requests it could not connect for: they never reached the server."""

    def __init__(self, inner: Any, note: Callable[[Exception], None]) -> None:
        self._inner, self._note = inner, note

    async def handle_async_request(self, request: Any) -> Any:
        import httpx2

        try:
            return await self._inner.handle_async_request(request)
        except httpx2.ConnectError as exc:
            self._note(exc)
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()


def _http_hint(status: int) -> str:
    if status in (401, 403):
        return ": check its credentials (headers={'Authorization': 'Bearer …'})"
    if status in (404, 405):
        return ": check the URL (the server's MCP endpoint, often ending in /mcp)"
    if status >= 500:
        return ": the server failed; see its log"
    return ""


class _ListingRepair:
    """Sits between the transport and the SDK session, mending `tools/list` answers before the SDK
    validates them: the SDK refuses a whole listing for one tool whose schema is not an object schema,
    and every call of a tool whose `outputSchema` the result does not match.

    Each tool's input schema is normalised (`input_schema`), its original kept for argument checks;
    `outputSchema` is dropped (thinkloop renders results as text, structured content included);
    entries without a name, or the SDK still refuses, are left out and logged.
    """

    def __init__(self, server: MCPServer) -> None:
        self.server = server
        self.pending: set[Any] = set()  # ids of the tools/list requests on their way

    def streams(self, read: Any, write: Any, *, ended: Callable[[], None]) -> tuple[Any, Any]:
        """The streams, watched; `ended` is called when the read stream ends (the server closed it)."""
        return _Watched(read, self._received, ended), _Watched(write, self._sent)

    def _sent(self, item: Any) -> Any:
        message = _jsonrpc(item)
        if getattr(message, "method", None) == "tools/list":
            self.pending.add(message.id)
        return item

    def _received(self, item: Any) -> Any:
        message = _jsonrpc(item)
        request_id = getattr(message, "id", None)
        if request_id in self.pending:
            self.pending.discard(request_id)
            result = getattr(message, "result", None)
            if isinstance(result, dict) and isinstance(result.get("tools"), list):
                try:
                    message.result = {**result, "tools": self._mended(result["tools"])}
                except Exception:  # never lose the connection over this: the SDK judges the listing
                    logger.exception("MCP server %r: cannot mend its tool listing", self.server.name)
        return item

    def _mended(self, entries: list[Any]) -> list[dict[str, Any]]:
        from mcp.types import Tool as SDKTool

        mended = []
        for entry in entries:
            name = entry.get("name") if isinstance(entry, dict) else None
            if not isinstance(name, str) or not name:
                logger.warning(
                    "MCP server %r listed a tool without a name; left out: %.200r", self.server.name, entry
                )
                continue
            original = entry.get("inputSchema")
            tool = {k: v for k, v in entry.items() if k not in ("inputSchema", "outputSchema")}
            tool["inputSchema"] = input_schema(original)
            for candidate in (tool, {"name": name, "inputSchema": tool["inputSchema"]}):
                try:
                    SDKTool.model_validate(candidate)
                except Exception:
                    continue
                self.server._listed_schemas[name] = original
                mended.append(candidate)
                break
        return mended


def _jsonrpc(item: Any) -> Any:
    """The JSON-RPC message of a transport item (SDK 1.x wraps it in a `root`)."""
    message = getattr(item, "message", None)
    return getattr(message, "root", message)


class _Watched:
    """A transport stream whose items pass through `see` (see `ReadStream`/`WriteStream` in the SDK); `ended`
    is called when receiving finds the stream ended or closed."""

    def __init__(
        self, inner: Any, see: Callable[[Any], Any], ended: Callable[[], None] | None = None
    ) -> None:
        self._inner, self._see, self._ended = inner, see, ended

    async def send(self, item: Any, /) -> None:
        await self._inner.send(self._see(item))

    async def receive(self) -> Any:
        try:
            item = await self._inner.receive()
        except Exception:  # EndOfStream, ClosedResourceError, BrokenResourceError
            self._end()
            raise
        return self._see(item)

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> Any:
        try:
            item = await self._inner.__anext__()
        except Exception:  # StopAsyncIteration, ClosedResourceError, BrokenResourceError
            self._end()
            raise
        return self._see(item)

    def _end(self) -> None:
        if self._ended is not None:
            self._ended()

    async def __aenter__(self) -> _Watched:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._inner.__aexit__(*exc)

    def __getattr__(self, name: str) -> Any:  # aclose, close, last_context, …
        return getattr(self._inner, name)


# ================================================================================ input schemas

_MAX_DESCRIPTION = 1024  # OpenAI refuses a longer tool description ("string_above_max_length")
_MAX_DEPTH = 32  # nesting kept; deeper sub-schemas accept any value
_MAX_NODES = 5_000  # sub-schemas kept per tool (inlined `$ref`s can multiply them)
_MAX_REFS = 16  # `$ref`s expanded inside one another
_JSON_TYPE_NAMES = frozenset({"string", "number", "integer", "boolean", "array", "object", "null"})
_ROOT_KEYS = ("type", "properties", "required", "additionalProperties", "description")
_DROPPED_KEYS = frozenset({"$schema", "$id", "$anchor", "$comment", "$defs", "definitions"})
_ONE_SCHEMA_KEYS = frozenset(
    {"items", "additionalProperties", "additionalItems", "unevaluatedProperties", "unevaluatedItems",
     "contains", "propertyNames", "not", "if", "then", "else"}
)  # fmt: skip
_SCHEMA_LIST_KEYS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
_SCHEMA_MAP_KEYS = frozenset({"properties", "patternProperties", "dependentSchemas"})
_DROP = object()


def input_schema(raw: Any) -> dict[str, Any]:
    """A tool's input schema, as a server may send it (any JSON value), made a valid object schema.

    What is valid is kept. Local `$ref`s are inlined (`$defs`/`definitions` dropped; a recursive or
    dangling reference accepts any value); a root that is not an object schema (`{"type": "string"}`,
    `[]`, `null`) becomes one without properties; `properties` is always an object, each property a
    schema (`true` and garbage: any value; `false`: dropped); `required` names only properties that
    exist; a malformed `type`, `enum` or `description` is dropped; descriptions longer than 1,024
    characters are cut; combinators at the root (`anyOf`…) lend their properties and are dropped.
    Whatever is dropped that a model could break is still checked on the arguments (`_ArgumentCheck`).
    """
    cleaner = _SchemaCleaner(raw)
    root = cleaner.schema(raw, 0)
    if not isinstance(root, dict) or not _names_object(root.get("type", "object")):
        root = {}
    properties = dict(root.get("properties") or {})
    for branch in _root_branches(root):
        for name, sub in branch.get("properties", {}).items():
            properties.setdefault(name, sub)
    result: dict[str, Any] = {"type": "object", "properties": properties}
    result.update((k, root[k]) for k in _ROOT_KEYS if k in root and k not in result)
    required = [n for n in root.get("required", []) if n in properties]
    required += [
        n for b in _root_branches(root, ("allOf",)) for n in b.get("required", []) if n in properties
    ]
    if required:
        result["required"] = list(dict.fromkeys(required))
    else:
        result.pop("required", None)
    return result


def _names_object(kind: Any) -> bool:
    return kind == "object" or (isinstance(kind, list) and "object" in kind)


def _root_branches(
    root: dict[str, Any], keys: tuple[str, ...] = ("allOf", "anyOf", "oneOf")
) -> list[dict[str, Any]]:
    """The object schemas a root combines (`allOf`, `anyOf`, `oneOf`): it offers their properties."""
    return [b for key in keys for b in root.get(key, []) if isinstance(b, dict)]


class _SchemaCleaner:
    """Cleans one schema document, inlining its local `$ref`s (see `input_schema`)."""

    def __init__(self, root: Any, *, keep_forbidden: bool = False) -> None:
        self.root = root
        self.keep_forbidden = keep_forbidden  # keep `false` properties (for checking, not for a model)
        self.expanding: list[str] = []
        self.nodes = 0

    def schema(self, node: Any, depth: int) -> Any:
        """A sub-schema cleaned: a dict, a boolean schema as is, or `_DROP` for what is no schema."""
        if isinstance(node, bool):
            return node
        if not isinstance(node, dict):
            return _DROP
        self.nodes += 1
        if depth > _MAX_DEPTH or self.nodes > _MAX_NODES:
            return {}
        if "$ref" in node:
            return self._inlined(node, depth)
        cleaned: dict[str, Any] = {}
        for key, value in node.items():
            if key not in _DROPPED_KEYS:
                kept = self._keyword(key, value, depth + 1)
                if kept is not _DROP:
                    cleaned[key] = kept
        if isinstance(cleaned.get("required"), list):
            names = cleaned.get("properties", {})
            cleaned["required"] = [n for n in cleaned["required"] if n in names]
            if not cleaned["required"]:
                del cleaned["required"]
        return cleaned

    def _inlined(self, node: dict[str, Any], depth: int) -> Any:
        """`{"$ref": "#/$defs/X", ...}`: X with the node's other keywords (which win)."""
        ref = node["$ref"]
        rest = {k: v for k, v in node.items() if k != "$ref"}
        target = self._resolve(ref)
        if target is None or ref in self.expanding or len(self.expanding) >= _MAX_REFS:
            return self.schema(rest, depth)  # dangling or recursive: the rest (any value)
        self.expanding.append(ref)
        try:
            merged = {**target, **rest} if isinstance(target, dict) else rest
            return self.schema(merged, depth + 1)
        finally:
            self.expanding.pop()

    def _resolve(self, ref: Any) -> Any:
        """The target of a local JSON pointer (`#/$defs/Point`), or None."""
        if not isinstance(ref, str) or not ref.startswith("#"):
            return None
        node = self.root
        for part in filter(None, urllib.parse.unquote(ref[1:]).split("/")):
            key = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and key in node:
                node = node[key]
            elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            else:
                return None
        return node if isinstance(node, dict | bool) else None

    def _keyword(self, key: str, value: Any, depth: int) -> Any:
        if key in _SCHEMA_MAP_KEYS:
            return self._schema_map(value, depth) if isinstance(value, dict) else _DROP
        if key in _ONE_SCHEMA_KEYS:
            return self.schema(value, depth)
        if key in _SCHEMA_LIST_KEYS:
            items = [self.schema(v, depth) for v in value] if isinstance(value, list) else []
            items = [{} if v is True else v for v in items if v is not _DROP]
            return items or _DROP
        return _plain_keyword(key, value)

    def _schema_map(self, value: dict[str, Any], depth: int) -> dict[str, Any]:
        """`properties` and alike: names are kept as they are (a property may be called `type`)."""
        cleaned = {}
        for name, sub in value.items():
            kept = self.schema(sub, depth)
            if kept is False and self.keep_forbidden:
                cleaned[name] = False
            elif kept is not False:  # `false`: the property must not be given
                cleaned[name] = {} if kept is True or kept is _DROP else kept
        return cleaned


def _plain_keyword(key: str, value: Any) -> Any:
    """A keyword that holds no schema: kept when well-formed."""
    if key == "type":
        kinds = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        valid = list(dict.fromkeys(k for k in kinds if isinstance(k, str) and k in _JSON_TYPE_NAMES))
        return _DROP if not valid else valid[0] if isinstance(value, str) else valid
    if key == "required":
        names = value if isinstance(value, list) else []
        return list(dict.fromkeys(n for n in names if isinstance(n, str))) or _DROP
    if key in ("description", "title"):
        return _shortened(value) if isinstance(value, str) else _DROP
    if key == "enum":
        return value if isinstance(value, list) and value else _DROP
    return value


def _shortened(text: str, limit: int = _MAX_DESCRIPTION) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


class _ArgumentCheck:
    """Checks a call's arguments against the server's own schema (jsonschema, the SDK's dependency).

    The original schema where it is a valid object schema (`required` names that have no property
    aside: the model cannot see them), else the original cleaned as for the model, but keeping its
    root combinators and forbidden (`false`) properties. A reference that does not resolve in the
    original falls back to the cleaned schema; a check that cannot run passes.

    The check runs on the event loop, so the server's regular expressions (`pattern`, `patternProperties`,
    `propertyNames`) are matched with a time limit (`_search`): one that backtracks without end leaves
    that pattern to the server, which checks its own schema anyway, instead of freezing the agent.
    """

    def __init__(self, original: Any) -> None:
        cleaned = _SchemaCleaner(original, keep_forbidden=True).schema(original, 0)
        candidates = (_checkable(original), _checkable(cleaned))
        self._validators = [v for v in map(_validator, candidates) if v is not None]
        properties = cleaned.get("properties", {}) if isinstance(cleaned, dict) else {}
        self._forbidden = {name for name, sub in properties.items() if sub is False}

    def errors(self, arguments: dict[str, Any]) -> str | None:
        """What is wrong with the arguments, or None."""
        forbidden = sorted(self._forbidden.intersection(arguments))
        if forbidden:  # jsonschema says where a `false` schema failed without saying which property
            return f"{', '.join(forbidden)}: not accepted (the server's schema forbids it)"
        from jsonschema.exceptions import best_match  # the SDK's dependency: there whenever a server is

        deadline = _pattern_deadline.set(time.monotonic() + _PATTERN_SECONDS)  # for all the patterns
        try:
            for validator in self._validators:
                try:
                    error = best_match(validator.iter_errors(arguments))
                except Exception:  # an unresolvable `$ref`, …: the next schema
                    continue
                if error is None:
                    return None
                where = ".".join(str(p) for p in error.absolute_path) or "arguments"
                return _shortened(f"{where}: {error.message}", 500)
            return None
        finally:
            _pattern_deadline.reset(deadline)


def _checkable(schema: Any) -> Any:
    if not isinstance(schema, dict) or not _names_object(schema.get("type", "object")):
        return None
    properties, required = schema.get("properties"), schema.get("required")
    if isinstance(required, list):
        names = properties if isinstance(properties, dict) else {}
        schema = {**schema, "required": [n for n in required if n in names]}
    return schema


def _validator(schema: Any) -> Any:
    """A jsonschema validator of the schema (its `$schema` draft, else 2020-12), or None."""
    if schema is None:
        return None
    try:
        import jsonschema
        from referencing import Registry

        registry: Registry[Any] = Registry()  # no remote references fetched
        with warnings.catch_warnings():  # an unknown `$schema` warns
            warnings.simplefilter("ignore")
            cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
            cls.check_schema(schema)
            cls = _time_limited(cls, patterned_keys=_mentions(schema, "patternProperties"))
            return cls(schema, registry=registry)
    except Exception:  # no jsonschema, or not a valid schema
        return None


# A call's arguments are checked on the event loop: jsonschema matches `pattern`s with `re`, which has no
# time limit, and a pattern that backtracks (`^([a-z0-9]+-?)+$` against 30 letters and a `_`) takes
# minutes. The patterns are matched with `regex` and its time limit instead, within a budget per check.
_PATTERN_SECONDS = 0.1  # of pattern matching per argument check; what does not fit is left to the server
_pattern_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "thinkloop_mcp_pattern_deadline", default=None
)


def _search(pattern: str, text: str, *, otherwise: bool) -> bool:
    """Whether `pattern` matches somewhere in `text` (JSON Schema's `pattern`, as jsonschema's `re.search`).

    Matched by `regex` with the time left of the check's budget: a search that does not end in time (or a
    pattern `regex` refuses) is `otherwise`, the answer that lets the arguments through, for the server
    to judge.
    """
    import regex  # a dependency of thinkloop

    deadline = _pattern_deadline.get()
    left = _PATTERN_SECONDS if deadline is None else deadline - time.monotonic()
    if left > 0:
        try:
            return regex.search(pattern, text, timeout=left) is not None
        except Exception:  # TimeoutError, regex.error
            pass
    logger.debug("MCP argument check: pattern %.200r left to the server (no answer in time)", pattern)
    return otherwise


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "string") and not _search(pattern, instance, otherwise=True):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key, otherwise=False):  # not known to match: its schema is not applied
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(original: Any) -> Any:
    """jsonschema's `additionalProperties`, matching `patternProperties` with `_search`."""

    def additional_properties(validator: Any, allowed: Any, instance: Any, schema: Any) -> Iterator[Any]:
        from jsonschema.exceptions import ValidationError

        patterns = schema.get("patternProperties")
        if not isinstance(patterns, dict) or not patterns or not validator.is_type(instance, "object"):
            yield from original(validator, allowed, instance, schema)  # no pattern to match
            return
        properties = schema.get("properties", {})
        extras = [
            key
            for key in instance
            if key not in properties and not any(_search(p, key, otherwise=True) for p in patterns)
        ]
        if validator.is_type(allowed, "object"):
            for extra in extras:
                yield from validator.descend(instance[extra], allowed, path=extra)
        elif not allowed and extras:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            regexes = ", ".join(repr(each) for each in sorted(patterns))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {regexes}")

    return additional_properties


def _unchecked(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
    return iter(())


@functools.cache
def _time_limited(cls: Any, *, patterned_keys: bool) -> Any:
    """The validator class `cls` matching its patterns with `_search`. `unevaluatedProperties` matches
    `patternProperties` deep inside jsonschema: in a schema that has them, it is left to the server."""
    import jsonschema

    keywords = {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties(cls.VALIDATORS.get("additionalProperties")),
    }
    if patterned_keys:
        keywords["unevaluatedProperties"] = _unchecked
    overrides = {k: v for k, v in keywords.items() if k in cls.VALIDATORS}  # the draft's keywords only
    return jsonschema.validators.extend(cls, overrides)


def _mentions(schema: Any, key: str) -> bool:
    """Whether `key` is a key of an object anywhere in the JSON document `schema`."""
    nodes = [schema]
    while nodes:
        node = nodes.pop()
        if isinstance(node, dict):
            if key in node:
                return True
            nodes.extend(node.values())
        elif isinstance(node, list):
            nodes.extend(node)
    return False


class _MCPTool(Tool):
    """An MCP server's tool: its arguments are also checked against the server's own schema."""

    def __init__(self, *args: Any, check: _ArgumentCheck, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.check = check

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        arguments = super().validate(arguments)
        problem = self.check.errors(arguments)
        if problem is not None:
            raise ToolArgumentsError(problem)
        return arguments


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
                    continue
                clash = (
                    f"tool name {mcp_tool.name!r} of MCP server {server.name!r} is already taken by "
                    f"{owners[mcp_tool.name]}; give the server a prefix, e.g. prefix='{_slug(server.name)}_'"
                )
                if strict:
                    raise ConfigurationError(clash)
                logger.warning("%s (its changed tool list offers it: left out)", clash)
        return tools


def _unique_names(names: list[str]) -> list[str]:
    """Names made valid for a model may coincide (`get weather!`, `get weather?`): number the later ones."""
    taken: set[str] = set()
    unique = []
    for wanted in names:
        name, n = wanted, 1
        while name in taken:
            n += 1
            name = f"{wanted[: 64 - len(str(n)) - 1]}_{n}"
        taken.add(name)
        unique.append(name)
    return unique


def render_result(result: Any) -> str:
    """An MCP `CallToolResult` as observation text: its content blocks, or its structured content."""
    parts = [_render_block(block) for block in getattr(result, "content", None) or []]
    text = "\n".join(p for p in parts if p)
    if not text and getattr(result, "structured_content", None) is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False, default=str)
    return text or "(no output)"


def _render_block(block: Any) -> str:
    """One content block as text: text as is, other kinds as a line saying what they are."""
    kind = getattr(block, "type", None)
    if kind == "text":
        return str(block.text)
    if kind in ("image", "audio"):
        return f"[{kind}: {block.mime_type}, {_base64_size(block.data)} bytes, not shown]"
    if kind == "resource_link":
        about = ", ".join(str(v) for v in (block.name, getattr(block, "mime_type", None)) if v)
        note = getattr(block, "description", None)
        return f"[resource link: {block.uri} ({about})]" + (f" {note}" if note else "")
    if kind == "resource":
        resource = block.resource
        text = getattr(resource, "text", None)
        kind_of = resource.mime_type or "binary"
        if text is not None:
            return f"[resource: {resource.uri}, {kind_of}]\n{text}"
        return f"[resource: {resource.uri}, {kind_of}, {_base64_size(getattr(resource, 'blob', ''))} bytes, not shown]"
    return _shortened(f"[{kind or 'unknown'} content: {block!r}]", 500)


def _base64_size(data: Any) -> int:
    """The size of base64 data (its padding is no data)."""
    text = str(data).rstrip()
    return len(text) * 3 // 4 - (len(text) - len(text.rstrip("=")))


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
    if _is_validation_error(exc):  # pydantic's text spans lines, with a URL per error
        errors = cast(Any, exc).errors(include_url=False)
        text = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'result'}: {e['msg']}" for e in errors[:3])
        return _shortened(text, 500)
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _is_validation_error(exc: BaseException) -> bool:
    return type(exc).__name__ == "ValidationError" and callable(getattr(exc, "errors", None))


def _slug(name: str) -> str:
    return (re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "server")[:20]


def _version() -> str:
    from . import __version__

    return __version__
