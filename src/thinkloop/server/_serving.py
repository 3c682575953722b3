"""How `thinkloop serve` runs the application on uvicorn: bounded waits for clients that never finish.

uvicorn has no timeout for a request's head: a client that opens a connection and sends nothing, or
sends headers that never end (a "slowloris"), holds that connection for ever — its keep-alive timer runs
only between two requests of a connection, and any byte received stops it. So the HTTP protocol here is
uvicorn's own (h11's, or httptools' when installed) with a *head timer*, as hypercorn does with its idle
timer and Node.js with `headersTimeout`: armed when the connection opens and again when a response has
been sent, stopped when a request's head has been read (the request goes to the application, or the
connection is upgraded to a WebSocket). When it fires, the connection is closed — with a 408 if part of a
head had arrived. A body that stalls is the application's (`BODY_TIMEOUT`, 408 as well).

On Ctrl-C or SIGTERM uvicorn stops accepting connections, asks the open ones to close (WebSockets get
1012) and waits for their requests to end — for ever if a client does not read its answer, or a request
does not end. `timeout_graceful_shutdown` bounds that wait: the requests still open then are cancelled,
and the application's shutdown follows all the same (the runs are interrupted and saved resumable).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import socket
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import uvicorn
    from starlette.types import ASGIApp
    from uvicorn.protocols.http.h11_impl import H11Protocol as _HTTPProtocol
else:
    _HTTPProtocol = object  # the real base is chosen at run time: uvicorn's "auto" HTTP protocol

HEAD_TIMEOUT = 30.0  # seconds a connection has to send a request's head (from opening, or the last response)
GRACEFUL_TIMEOUT = 10  # seconds of uvicorn's graceful shutdown before the requests still open are cancelled

logger = logging.getLogger("thinkloop.server")


def uvicorn_config(
    app: ASGIApp,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    head_timeout: float = HEAD_TIMEOUT,
    graceful_timeout: int = GRACEFUL_TIMEOUT,
) -> uvicorn.Config:
    """The uvicorn configuration `thinkloop serve` runs `app` with (module docstring): a connection whose
    request head has not arrived `head_timeout` seconds after it opened (or after its last response) is
    closed, and a graceful shutdown waits at most `graceful_timeout` seconds for open requests."""
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    if not (math.isfinite(head_timeout) and head_timeout > 0):
        from .._errors import ConfigurationError

        raise ConfigurationError(f"head_timeout must be a positive number of seconds, not {head_timeout!r}")
    protocol = type("HeadTimeoutProtocol", (_HeadTimeout, AutoHTTPProtocol), {"head_timeout": head_timeout})
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=graceful_timeout,
    )


def bind(host: str, port: int) -> list[socket.socket]:
    """Sockets bound to every address `host` names, as asyncio's `create_server` binds them, for
    `uvicorn.Server.serve(sockets=...)`: binding first, `thinkloop serve` knows it can listen before it says
    it serves (uvicorn bound them itself and, when it could not, logged its own line and exited with 3).
    Raises the `OSError` of the address that failed (`socket.gaierror` for a name that is not known)."""
    bound: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        ):
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio does: an IPv6 socket takes no IPv4 connections
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError:
        for sock in bound:
            sock.close()
        raise
    return bound


class _HeadTimeout(_HTTPProtocol):
    """Mixed into uvicorn's HTTP protocol class: the head timer (module docstring)."""

    head_timeout: float = HEAD_TIMEOUT
    _head_timer: asyncio.TimerHandle | None = None
    _head_started = False  # bytes of the next request's head have arrived

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        waiting = self._head_timer is not None
        super().data_received(data)
        if self._in_request():
            self._stop_head_timer()
        elif waiting:
            self._head_started = True

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self._in_request():  # else a pipelined request's head was read already
            self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def _in_request(self) -> bool:
        """Whether a request's head has been read and its response is not complete (or the connection
        has become a WebSocket's)."""
        if self.transport.get_protocol() is not self:
            return True
        cycle: Any = self.cycle
        return cycle is not None and not cycle.response_complete

    def _arm_head_timer(self) -> None:
        self._stop_head_timer()
        if not self.transport.is_closing():
            self._head_started = False
            self._head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self._in_request():
            return
        if self._head_started:
            logger.info(
                "closed the connection of %s: its request's head did not arrive within %g s",
                _address(self.client),
                self.head_timeout,
            )
            self.transport.write(_timeout_response(self.head_timeout))
        self.transport.close()


def _address(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "a client"


def _timeout_response(timeout: float) -> bytes:
    """A 408 that closes the connection, saying what went wrong (as the server's other errors, JSON)."""
    message = f"the request's headers did not arrive within {timeout:g} s: send the whole request at once"
    body = json.dumps({"error": message}).encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: close\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body
