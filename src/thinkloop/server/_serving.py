"""How `thinkloop serve` runs the application on uvicorn: bounded waits for clients that never finish.

uvicorn has no timeout for a request's head: a client that opens a connection and sends nothing, or
sends headers that never end (a "slowloris"), holds that connection for ever — its keep-alive timer runs
only between two requests of a connection, and any byte received stops it. So the HTTP protocol here is
uvicorn's own (h11's, or httptools' when installed) with a *head timer*, as hypercorn does with its idle
timer and Node.js with `headersTimeout`: armed when the connection opens and again when a response has
been sent, stopped when a request's head has been read (the request goes to the application, or the
connection is upgraded to a WebSocket). When it fires, the connection is closed — with a 408 if part of a
head had arrived. A body that stalls is the application's (`BODY_TIMEOUT`, 408 as well).

The number of connections open at once is capped (`max_connections`, `thinkloop serve --max-connections`):
uvicorn's own cap, `limit_concurrency`, answers a plain-text 503 and does not count a WebSocket handshake
(the upgrade happens before its check), so thousands of streams could be opened. Here a connection opened
beyond the cap has its first request answered, whatever it is (a WebSocket handshake included), with a
JSON 503 saying so, and is closed. A request head uvicorn cannot parse — malformed, or a request line or
headers longer than h11 buffers (16 KiB) — is answered in the server's JSON error format too (uvicorn
sends a plain-text 400): 414 for a request line, 431 for headers, 400 otherwise.

On Ctrl-C or SIGTERM uvicorn stops accepting connections, asks the open ones to close (WebSockets get
1012) and waits for their requests to end — for ever if a client does not read its answer, or a request
does not end. `timeout_graceful_shutdown` bounds that wait: the requests still open then are cancelled,
and the application's shutdown follows all the same (the runs are interrupted and saved resumable).
"""

from __future__ import annotations

import asyncio
import http
import json
import logging
import math
import socket
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import uvicorn
    from starlette.types import ASGIApp, Receive, Scope, Send
    from uvicorn.protocols.http.h11_impl import H11Protocol as _HTTPProtocol
else:
    _HTTPProtocol = object  # the real base is chosen at run time: uvicorn's "auto" HTTP protocol

HEAD_TIMEOUT = 30.0  # seconds a connection has to send a request's head (from opening, or the last response)
MAX_CONNECTIONS = 100  # connections open at once (HTTP and WebSocket); more are refused with 503
MAX_HEAD = 16 * 1024  # bytes of a request's head h11 buffers while waiting for its end (its default)
GRACEFUL_TIMEOUT = 10  # seconds of uvicorn's graceful shutdown before the requests still open are cancelled

logger = logging.getLogger("thinkloop.server")


def uvicorn_config(
    app: ASGIApp,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    head_timeout: float = HEAD_TIMEOUT,
    graceful_timeout: int = GRACEFUL_TIMEOUT,
    max_connections: int = MAX_CONNECTIONS,
) -> uvicorn.Config:
    """The uvicorn configuration `thinkloop serve` runs `app` with (module docstring): a connection whose
    request head has not arrived `head_timeout` seconds after it opened (or after its last response) is
    closed, a graceful shutdown waits at most `graceful_timeout` seconds for open requests, and a
    connection opened while `max_connections` are open is refused with a 503."""
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    from .._errors import ConfigurationError

    if not (math.isfinite(head_timeout) and head_timeout > 0):
        raise ConfigurationError(f"head_timeout must be a positive number of seconds, not {head_timeout!r}")
    if isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1:
        raise ConfigurationError(
            f"max_connections must be a whole number of at least 1, not {max_connections!r}"
        )
    protocol = type(
        "ThinkloopHTTPProtocol",
        (_HeadTimeout, AutoHTTPProtocol),
        {"head_timeout": head_timeout, "max_connections": max_connections},
    )
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
    """Mixed into uvicorn's HTTP protocol class: the head timer, the cap on connections, and JSON answers to
    request heads that cannot be read (module docstring)."""

    head_timeout: float = HEAD_TIMEOUT
    max_connections: int = MAX_CONNECTIONS
    _head_timer: asyncio.TimerHandle | None = None
    _head_started = False  # bytes of the next request's head have arrived
    _refused = False  # opened beyond `max_connections`: its request is answered 503, and it is closed

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            self._refused = True
            self.app = _full(self.max_connections)
            logger.warning(
                "refusing the connection of %s: %d connections are open, the most this server takes "
                "(--max-connections %d)",
                _address(self.client),
                len(self.connections) - 1,
                self.max_connections,
            )
        self._arm_head_timer()

    def _should_upgrade(self) -> bool:
        """A refused connection's WebSocket handshake is answered as an HTTP request: with the 503."""
        return not self._refused and bool(super()._should_upgrade())

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a head it cannot parse (a plain-text 400), in the server's JSON format."""
        status, message = self._unreadable_head()
        logger.info("refused the request of %s: %s", _address(self.client), message)
        self.transport.write(_json_response(status, message))
        self.transport.close()

    def _unreadable_head(self) -> tuple[int, str]:
        """The status and message for a head h11 refused: too long (a request line without its end, or
        headers), else malformed."""
        trailing = getattr(getattr(self, "conn", None), "trailing_data", None)
        buffered = trailing[0] if isinstance(trailing, tuple) and trailing else b""
        limit = getattr(self.config, "h11_max_incomplete_event_size", None) or MAX_HEAD
        if len(buffered) > limit and b"\n" not in buffered:
            return 414, (
                f"the request line is longer than {limit // 1024} KiB, the most this server reads: send a "
                "shorter URL (put long data in a POST body)"
            )
        if len(buffered) > limit:
            return 431, (
                f"the request's headers are longer than {limit // 1024} KiB in all, the most this server "
                "reads: send fewer or shorter headers"
            )
        return 400, "the request is not valid HTTP/1.1 (a malformed request line or header): send HTTP/1.1"

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
    return _json_response(408, message)


def _json_response(status: int, message: str) -> bytes:
    """A whole HTTP response `{"error": message}` that closes the connection (as the server's errors)."""
    body = json.dumps({"error": message}).encode()
    head = (
        f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
        f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


def _full(limit: int) -> ASGIApp:
    """The application of a connection opened beyond the cap: a 503 saying so, and the connection closed."""
    message = (
        f"the server has as many connections open as it takes ({limit}: thinkloop serve --max-connections): "
        "try again in a moment, or close connections you no longer need (streams of runs you do not "
        "follow, other tabs of the page)"
    )
    body = json.dumps({"error": message}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        (b"retry-after", b"1"),
    ]

    async def refuse(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return refuse
