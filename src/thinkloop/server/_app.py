"""`create_app()`: the FastAPI application of `thinkloop serve` (SPEC §13.2).

    POST /api/runs                            start a run: {goal, max_steps?, max_tokens?, max_cost?,
                                              timeout?, session?} → 202 {run_id}
    GET  /api/runs                            the store's runs, newest first (?limit, ?status, ?session)
    GET  /api/runs/{id}                       a run's summary, state and waiting approvals
    GET  /api/runs/{id}/events?after=N        its events with seq > N
    WS   /api/runs/{id}/events?after=N        the same, then the live ones, up to `done`
    POST /api/runs/{id}/cancel                stop a running run (it ends as `cancelled`)
    POST /api/runs/{id}/resume                resume a run the store has unfinished (e.g. after a crash);
                                              {force?}: even if a live process seems to run it still
    GET  /api/approvals                       the tool calls waiting for a person (?run_id)
    POST /api/runs/{id}/approvals/{call_id}   answer one: {decision: approve|deny|approve_always, message?}
    GET  /api/info                            the agent: model, tools, safety mode, limits
    GET  /                                    the web page

Errors are JSON: `{"error": "what went wrong and what to do", "details": [...]}` with a 4xx status.

With a token (`create_app(agent, token=...)`), every request but the page and its files needs
`Authorization: Bearer TOKEN` (else 401); a WebSocket may instead offer the subprotocols
`thinkloop.events.v1` and `thinkloop.token.BASE64URL(TOKEN)`, as browsers cannot set its headers.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import contextvars
import hashlib
import json
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from importlib import resources
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Query, Request, WebSocket, WebSocketDisconnect
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._agent import Agent
from .._budget import Budget
from .._errors import ConfigurationError, ThinkloopError, UserError
from ..safety import ApprovalDecision, PendingApprovals, SafetyController
from ..stores import RunSummary, Store, check_id
from ..stores._base import check_goal
from ._runs import (
    FollowerTooSlowError,
    LiveRun,
    NotResumableError,
    NotRunningError,
    RunFailedError,
    RunManager,
    ShuttingDownError,
    TooManyRunsError,
    UnknownRunError,
)

logger = logging.getLogger("thinkloop.server")

_STATIC = ("index.html", "app.js", "style.css")
_MEDIA = {"html": "text/html; charset=utf-8", "js": "text/javascript; charset=utf-8", "css": "text/css"}
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


EVENTS_PROTOCOL = "thinkloop.events.v1"  # the WebSocket subprotocol the server accepts when offered
TOKEN_PROTOCOL = "thinkloop.token."  # + the token in base64url without padding: a WebSocket's credential


class ApiError(Exception):
    """An error answered as `{"error": message}` with `status`; `extra` adds fields to that body."""

    def __init__(
        self,
        status: int,
        message: str,
        extra: Mapping[str, Any] | None = None,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.extra = dict(extra or {})
        self.headers = dict(headers or {})

    def response(self) -> JSONResponse:
        return JSONResponse(
            {"error": self.message, **self.extra}, status_code=self.status, headers=self.headers
        )


# ============================================================================================ bodies


class ResumeRequest(BaseModel):
    """The body of `POST /api/runs/{id}/resume` (optional)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    force: bool = False  # resume even if a live thinkloop process on this machine seems to run it still


class RunRequest(BaseModel):
    """The body of `POST /api/runs`. Limits left out are the agent's; given ones may not exceed them.

    Types are strict: `"3"` or `true` is not a number of steps, and limits are finite numbers.
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    goal: str = Field(max_length=100_000)
    max_steps: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_cost: float | None = Field(default=None, gt=0)
    timeout: float | None = Field(default=None, gt=0)
    session: str | None = None

    @field_validator("goal")
    @classmethod
    def _goal_not_blank(cls, goal: str) -> str:
        if not goal.strip():
            raise ValueError("the goal must not be empty")
        try:
            return check_goal(goal)  # no NUL: the goals `Agent.run` and the job queue take
        except UserError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("session")
    @classmethod
    def _session_id(cls, session: str | None) -> str | None:
        if session is None:
            return None
        try:
            return check_id(session, "session id")
        except ConfigurationError as exc:
            raise ValueError(str(exc)) from None


class ApprovalAnswer(BaseModel):
    """The body of `POST /api/runs/{id}/approvals/{call_id}`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    decision: Literal["approve", "deny", "approve_always"]
    message: str = Field(default="", max_length=2_000)


# =============================================================================================== app


def create_app(
    agent: Agent,
    *,
    max_active_runs: int = 32,
    allowed_hosts: Sequence[str] | None = None,
    run_metadata: Mapping[str, Any] | None = None,
    shutdown_timeout: float = 10.0,
    close_agent: bool = False,
    token: str | None = None,
) -> FastAPI:
    """The server of an agent: an HTTP + WebSocket API for its runs, and a web page.

    Args:
        agent: the agent every run uses. Its `store` must be a `Store` keeping an event log
            (`SQLiteStore`, `PostgresStore`, `FileStore`, `MemoryStore`): runs are listed and replayed
            from it. For approvals from the page, its `safety` is a `SafetyController` whose approval
            function is a `PendingApprovals` (without one, calls that need approval are denied).
        max_active_runs: the most runs at once (more are refused with 429).
        allowed_hosts: the `Host` header values accepted (e.g. `["127.0.0.1", "localhost"]`, which
            stops DNS-rebinding attacks on a local server); None accepts any.
        run_metadata: added to every run's `state.metadata`.
        shutdown_timeout: seconds to wait for running runs to save themselves (interrupted, resumable) on
            shutdown.
        close_agent: on shutdown, also close the agent's MCP servers and its store.
        token: when given, every request except the page and its files needs it, as
            `Authorization: Bearer TOKEN` (else 401); a WebSocket may offer it as the subprotocol
            `thinkloop.token.BASE64URL(TOKEN)` instead. Use a long random one, e.g.
            `secrets.token_urlsafe(32)`. None: no authentication (only for a loopback address or
            behind a proxy that authenticates).
    """
    store = agent.store
    if not isinstance(store, Store) or not getattr(store, "keeps_events", True):
        raise ConfigurationError(
            "the server needs an agent whose store keeps an event log, e.g. "
            f"`Agent(store=SQLiteStore('runs.db'))`, not {type(store).__name__}"
        )
    if max_active_runs < 1:
        raise ConfigurationError(f"max_active_runs must be at least 1, not {max_active_runs}")
    secret = None if token is None else check_token(token).encode()
    manager = RunManager(agent, max_active_runs=max_active_runs, metadata=run_metadata)
    approvals = _approvals_of(agent)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await manager.shutdown(shutdown_timeout)
        if close_agent:
            await agent.aclose()
            await store.aclose()

    app = FastAPI(title="thinkloop", lifespan=lifespan, docs_url=None, redoc_url=None)  # no CDN scripts
    app.state.manager = manager
    app.state.approvals = approvals
    app.add_middleware(_JsonBodies)
    if secret is not None:
        app.add_middleware(_TokenAuth, token=secret)
    _install_log_filters(hide_credentials=secret is not None)
    if allowed_hosts is not None:
        app.add_middleware(_HostCheck, allowed_hosts=list(allowed_hosts))
    _add_error_handlers(app)
    _add_run_routes(app, manager)
    _add_control_routes(app, manager)
    _add_approval_routes(app, manager, approvals)
    _add_stream_route(app, manager)
    _add_page_routes(app, agent, approvals)
    return app


def _approvals_of(agent: Agent) -> PendingApprovals | None:
    safety = agent.safety
    if isinstance(safety, SafetyController):
        if isinstance(safety.approval, PendingApprovals):
            return safety.approval
        if safety.approval is not None:
            logger.warning(
                "the agent's approval function is not a PendingApprovals: the web page cannot answer "
                "approval requests (use SafetyController(..., approval=PendingApprovals()))"
            )
    return None


# ============================================================================================ errors


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _invalid(exc.errors())

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail)
        where = f"{request.method} {request.url.path}"
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such path: {where} (the API is under /api/, described by GET /openapi.json)"
        headers = exc.headers
        if exc.status_code == 405:
            allowed = ", ".join(_methods_of(app, request.url.path)) or "other methods"
            message = f"{where} is not allowed: this path takes {allowed}"
            headers = {**(headers or {}), "Allow": allowed}
        return JSONResponse({"error": message}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(ThinkloopError)
    async def thinkloop_error(request: Request, exc: ThinkloopError) -> JSONResponse:
        logger.warning("request %s %s failed: %s", request.method, request.url.path, exc)
        return JSONResponse({"error": str(exc)}, status_code=500)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # the ASGI server logs the traceback (this answer is sent first); the client gets one line
        return JSONResponse({"error": _internal_error(exc)}, status_code=500)


def _methods_of(app: FastAPI, path: str) -> list[str]:
    """The methods of every route matching `path` (Starlette's 405 names only the first route's)."""
    methods: set[str] = set()
    for route in app.router.routes:
        if isinstance(route, APIRoute) and route.path_regex.match(path):
            methods |= route.methods or set()
    return sorted(methods)


def _internal_error(exc: BaseException) -> str:
    what = f"{type(exc).__name__}: {exc}"
    return f"the server failed ({what[:200]}); its log has the details: try again, or report it"


MAX_PROBLEMS = 10  # validation errors a 422 shows (the error text says how many more there were)
MAX_WHERE = 80  # characters of a field's name shown in a 422: an unknown key may be a megabyte long
MAX_PROBLEM = 500  # characters of one problem's text


def _invalid(errors: Sequence[Mapping[str, Any]]) -> JSONResponse:
    """The 422 answer to validation errors: the first `MAX_PROBLEMS`, each cut to a sane size (a body of
    2 MB of unknown keys was answered with 23 MB naming every one)."""
    details = [_problem(err) for err in errors[:MAX_PROBLEMS]]
    text = "; ".join(f"{d['where'] or 'body'}: {d['problem']}" for d in details)
    if len(errors) > MAX_PROBLEMS:
        text += f"; and {len(errors) - MAX_PROBLEMS} more"
    return JSONResponse({"error": f"invalid request: {text}", "details": details}, status_code=422)


def _problem(error: Mapping[str, Any]) -> dict[str, str]:
    """One validation error as `{where, problem}`; the body itself must be a JSON object."""
    where = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
    problem = str(error.get("msg", "")).removeprefix("Value error, ")
    if not where and error.get("loc", ())[:1] == ("body",):
        problem = (
            "the body must be a JSON object, e.g. {}"
            if error.get("type") != "missing"
            else ("the body is missing: send a JSON object")
        )
    return {"where": _cut(where, MAX_WHERE), "problem": _cut(problem, MAX_PROBLEM)}


def _cut(text: str, most: int) -> str:
    """`text`, or its first `most` characters and how long it was."""
    if len(text) <= most:
        return text
    return f"{text[:most]}… ({len(text)} characters)"


MAX_SEQ = 10**18 - 1  # the largest `after=`: a store's integer column holds 64 bits, not any Python int


def _id_query(what: str) -> Callable[[str | None], str | None]:
    """A validator of an id given as a query parameter: a bad one is a 422 like any invalid input (it was
    handed to the store as it came, and `?session=%00` was a 500 from a PostgresStore)."""

    def check(value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return check_id(value, what)
        except ConfigurationError as exc:
            raise ValueError(str(exc)) from None

    return check


SessionQuery = Annotated[str | None, Query(), AfterValidator(_id_query("session id"))]
RunIdQuery = Annotated[str | None, Query(), AfterValidator(_id_query("run id"))]


def _run_id(run_id: str) -> str:
    try:
        return check_id(run_id)
    except ConfigurationError:
        raise ApiError(404, f"no run {_shown(run_id)}") from None


def _shown(value: str, most: int = 80) -> str:
    """`value` quoted for an error message, cut if long: a 100 KB id in a URL is not echoed whole."""
    if len(value) <= most:
        return repr(value)
    return f"{value[:most]!r}… ({len(value)} characters)"


MAX_BODY = 2 * 1024 * 1024  # bytes: room for the longest goal (100,000 characters) even \u-escaped
MAX_FIELDS = 32  # fields a body may have (the API's bodies take at most 6): each unknown one is an error
BODY_TIMEOUT = 30.0  # seconds from a POST's headers until its whole body must have arrived (else 408)


class _JsonBodies:
    """POST bodies must be JSON (415 otherwise): a page of another site cannot send that without a
    CORS preflight, which this server never grants — so it cannot start runs or answer approvals.

    The body is read here, at most `MAX_BODY` bytes (413 beyond, before the rest is read), and must be
    UTF-8 JSON (400 with where it breaks otherwise); the application then gets it as it was sent.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        kind = headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            message = "send the body as JSON (Content-Type: application/json)"
            await JSONResponse({"error": message}, status_code=415)(scope, receive, send)
            return
        try:
            body = await _read_body(headers, receive)
            _check_json(body)
        except ApiError as exc:
            await exc.response()(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)


async def _read_body(headers: Headers, receive: Receive) -> bytes:
    """The request's body: `ApiError(413)` as soon as it is longer than `MAX_BODY` bytes, `ApiError(408)` if
    it has not all arrived `BODY_TIMEOUT` seconds after the request's headers (a client trickling it in
    would hold the request open for ever, and with it the server's graceful shutdown)."""
    length = headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_BODY:
        raise _too_big()
    try:
        async with asyncio.timeout(BODY_TIMEOUT):
            return await _receive_body(receive)
    except TimeoutError:
        raise ApiError(
            408,
            f"the body did not arrive within {BODY_TIMEOUT:g} s: send the whole request at once",
            headers={"Connection": "close"},
        ) from None


def _too_big() -> ApiError:
    return ApiError(
        413, f"the body is larger than {MAX_BODY} bytes, the most this server takes: send a shorter goal"
    )


async def _receive_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ApiError(400, "the client went away before sending the whole body")
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise _too_big()
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _check_json(body: bytes) -> None:
    """`ApiError(400)` saying where the body stops being UTF-8 JSON (an empty body is left to the route);
    `ApiError(422)` for an object of more than `MAX_FIELDS` fields, before it is validated — validating
    one error per unknown field of 2 MB of them held the event loop for a second and more."""
    if not body.strip():
        return
    try:
        value = json.loads(body.decode("utf-8-sig"), object_pairs_hook=_Fields)  # no dicts built
    except UnicodeDecodeError as exc:
        raise ApiError(
            400,
            f"the body is not UTF-8: byte {body[exc.start]:#04x} at position {exc.start}; send JSON in UTF-8",
        ) from None
    except json.JSONDecodeError as exc:
        raise ApiError(
            400,
            f"the body is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno} (char {exc.pos})",
        ) from None
    except RecursionError:
        raise ApiError(400, "the body's JSON is nested too deeply: send a flat JSON object") from None
    except ValueError as exc:  # an integer of more than 4,300 digits (Python's limit for converting one)
        raise ApiError(
            400, f"the body has a number too long to read ({exc}): send numbers of sane size"
        ) from None
    if isinstance(value, _Fields) and value.count > MAX_FIELDS:
        problem = (
            f"the body has {value.count:,} fields, more than the {MAX_FIELDS} any request of this server "
            "takes: send only the fields of the request (GET /openapi.json describes them)"
        )
        raise ApiError(
            422, f"invalid request: body: {problem}", {"details": [{"where": "", "problem": problem}]}
        )


class _Fields:
    """What `_check_json` makes of a JSON object: how many fields it has (the route parses the body again)."""

    __slots__ = ("count",)

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.count = len(pairs)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` giving the body read already, then what the client sends next (its going away)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


# ============================================================================================== auth


def check_token(token: str) -> str:
    """The token if it can be the server's (`ConfigurationError`, never quoting it, if not)."""
    if not isinstance(token, str) or not token or not all("!" <= c <= "~" for c in token):
        raise ConfigurationError(
            "the server token must be a non-empty string of printable ASCII characters without spaces "
            "(it travels in an HTTP header), e.g. secrets.token_urlsafe(32)"
        )
    return token


class _TokenAuth:
    """Every request except the page and its files needs the token, compared in constant time: HTTP
    requests in `Authorization: Bearer`, WebSockets there or in a subprotocol (browsers cannot set a
    WebSocket's headers; a URL's query string would end up in logs and the browser history)."""

    def __init__(self, app: ASGIApp, token: bytes) -> None:
        self.app = app
        self._digest = hashlib.sha256(token).digest()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or _public(scope):
            await self.app(scope, receive, send)
            return
        given = _presented_token(scope)
        # digests of equal length: the time taken reveals neither a matching prefix nor the token's length
        if given is not None and secrets.compare_digest(hashlib.sha256(given).digest(), self._digest):
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        logger.info(
            "refused %s %s from %s: %s token",
            scope.get("method", "WebSocket"),
            scope["path"],
            client[0] if client else "?",
            "no" if given is None else "a wrong",
        )
        problem = "this server needs its access token" if given is None else "the access token is wrong"
        message = (
            f"{problem}: send the header `Authorization: Bearer TOKEN` with the token the server was "
            f"started with (`thinkloop serve --token`); on a WebSocket, the header or the subprotocols "
            f"`{EVENTS_PROTOCOL}` and `{TOKEN_PROTOCOL}BASE64URL(TOKEN)`"
        )
        response = JSONResponse(
            {"error": message}, status_code=401, headers={"WWW-Authenticate": 'Bearer realm="thinkloop"'}
        )
        await _refuse(scope, receive, send, response, "the access token is missing or wrong")


async def _refuse(scope: Scope, receive: Receive, send: Send, response: Response, reason: str) -> None:
    """Answer a refused request with `response`; a WebSocket's handshake fails with it (or, where the server
    cannot send a response to a handshake, the socket closes with policy violation, 1008)."""
    if scope["type"] == "http":
        await response(scope, receive, send)
        return
    websocket = WebSocket(scope, receive, send)
    if "websocket.http.response" in scope.get("extensions", {}):
        await websocket.send_denial_response(response)  # the handshake fails with the response's status
        _denied.set(True)  # uvicorn would log this refusal as an error of the application
    else:
        await websocket.close(code=1008, reason=reason)


class _HostCheck:
    """Requests whose `Host` header is not one of `allowed_hosts` (exact, or `*.example.com`; `*` is any)
    are refused with a JSON 400 that says which hosts are — a defence against DNS rebinding."""

    def __init__(self, app: ASGIApp, allowed_hosts: Sequence[str]) -> None:
        self.app = app
        self.allowed = list(allowed_hosts)
        self.any = "*" in self.allowed

    def accepts(self, host: str) -> bool:
        return any(
            host == pattern or (pattern.startswith("*.") and host.endswith(pattern[1:]))
            for pattern in self.allowed
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.any or scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        given = Headers(scope=scope).get("host", "")
        host = given.split("]", 1)[0] + "]" if given.startswith("[") else given.split(":", 1)[0]  # `[::1]:80`
        if self.accepts(host):
            await self.app(scope, receive, send)
            return
        shown = given[:100] or "(none)"
        message = (
            f"the Host header {shown!r} is not one this server answers to: use one of "
            f"{', '.join(self.allowed)} (`create_app(allowed_hosts=…)`; `thinkloop serve` allows the host it "
            "listens on)"
        )
        await _refuse(
            scope, receive, send, JSONResponse({"error": message}, status_code=400), "host not allowed"
        )


class _HideCredentials(logging.Filter):
    """At debug level, `websockets` (under uvicorn: the `uvicorn.error` logger) logs each handshake's
    headers: the ones carrying a token are logged as `[hidden]`."""

    HIDDEN = frozenset({"authorization", "sec-websocket-protocol", "cookie", "proxy-authorization"})

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if (
            record.msg == "< %s: %s"
            and isinstance(args, tuple)
            and len(args) == 2
            and str(args[0]).lower() in self.HIDDEN
        ):
            record.args = (args[0], "[hidden]")
        return True


_denied: contextvars.ContextVar[bool] = contextvars.ContextVar("thinkloop_ws_denied", default=False)


class _QuietDenials(logging.Filter):
    """uvicorn logs "ASGI callable returned without completing handshake." at ERROR after a WebSocket
    handshake the application refused with a denial response (401, 400): an expected refusal, not a fault.
    The record is logged in the connection's task, whose context `_refuse` marked."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_denied.get() and record.msg == "ASGI callable returned without completing handshake.")


class _QuietShutdown(logging.Filter):
    """A request still open when the server's graceful shutdown ran out (a client sending its body slowly,
    or not at all) is cancelled, and uvicorn logs that as "Exception in ASGI application" with a traceback
    through the body read: it becomes one warning line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, asyncio.CancelledError) and str(record.msg).startswith(
            "Exception in ASGI application"
        ):
            record.msg, record.args = (
                "a request still open at shutdown was cancelled (%s)",
                (str(exc) or "cancelled",),
            )
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def _install_log_filters(*, hide_credentials: bool) -> None:
    names = ("uvicorn.error", "websockets.server", "websockets") if hide_credentials else ()
    for name in names:
        log = logging.getLogger(name)
        if not any(isinstance(f, _HideCredentials) for f in log.filters):
            log.addFilter(_HideCredentials())
    uvicorn_log = logging.getLogger("uvicorn.error")
    for kind in (_QuietDenials, _QuietShutdown):
        if not any(isinstance(f, kind) for f in uvicorn_log.filters):
            uvicorn_log.addFilter(kind())


def _public(scope: Scope) -> bool:
    """The page and its files load without the token (they hold no data; the page then asks for it)."""
    path: str = scope["path"]
    return (
        scope["type"] == "http"
        and scope["method"] in ("GET", "HEAD")
        and (path == "/" or path.startswith("/static/"))
    )


def _presented_token(scope: Scope) -> bytes | None:
    """The token a request carries: `Authorization: Bearer T`, or a WebSocket's `thinkloop.token.` subprotocol."""
    scheme, _, value = Headers(scope=scope).get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip().encode("latin-1")
    if scope["type"] == "websocket":
        for protocol in scope.get("subprotocols", ()):
            if protocol.startswith(TOKEN_PROTOCOL):
                encoded = protocol[len(TOKEN_PROTOCOL) :]
                try:
                    return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
                except (binascii.Error, ValueError):
                    return b""  # present but not base64url: a wrong token
    return None


# ============================================================================================== runs


def _add_run_routes(app: FastAPI, manager: RunManager) -> None:
    agent = manager.agent

    @app.post("/api/runs", status_code=202)
    async def start_run(body: RunRequest, response: Response) -> dict[str, Any]:
        budget = _budget(agent.budget, body)
        try:
            live = manager.start(body.goal, budget=budget, session=body.session)
        except TooManyRunsError as exc:
            raise ApiError(429, str(exc)) from None
        except ShuttingDownError as exc:
            raise ApiError(503, str(exc)) from None
        response.headers["Location"] = f"/api/runs/{live.run_id}"
        return {"run_id": live.run_id, "status": "running"}

    @app.get("/api/runs")
    async def list_runs(
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
        status: Literal["running", "done", "error"] | None = None,
        session: SessionQuery = None,
    ) -> dict[str, Any]:
        runs = await manager.store.list_runs(limit, status=status, session=session)
        rows = [_summary_row(s.model_dump(mode="json"), manager) for s in runs]
        listed = {s.run_id for s in runs}
        starting = [
            _starting_row(live)
            for live in manager.active()
            if live.run_id not in listed and status in (None, "running") and session in (None, live.session)
        ]
        return {"runs": (starting + rows)[:limit]}

    @app.get("/api/runs/{run_id}")
    async def get_run(run_id: str) -> dict[str, Any]:
        run_id = _run_id(run_id)
        state = await manager.store.load_state(run_id)
        live = manager.live(run_id)
        if state is None and live is None:
            raise ApiError(404, manager.no_run(run_id))
        approvals = app.state.approvals
        waiting = [] if approvals is None else approvals.pending(run_id)
        if state is None:
            assert live is not None
            return {"run": _starting_row(live), "state": None, "approvals": []}
        summary = _summary_row(RunSummary.from_state(state).model_dump(mode="json"), manager)
        return {
            "run": summary,
            "state": state.model_dump(mode="json"),
            "approvals": [r.model_dump(mode="json") for r in waiting],
        }

    @app.get("/api/runs/{run_id}/events")
    async def get_events(run_id: str, after: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0) -> dict[str, Any]:
        run_id = _run_id(run_id)
        try:
            events = await manager.events_after(run_id, after)
        except UnknownRunError as exc:
            raise ApiError(404, str(exc)) from None
        return {
            "events": [e.model_dump(mode="json") for e in events],
            "last_seq": events[-1].seq if events else after,
        }


def _add_control_routes(app: FastAPI, manager: RunManager) -> None:
    @app.post("/api/runs/{run_id}/cancel", status_code=202)
    async def cancel_run(run_id: str) -> dict[str, Any]:
        run_id = _run_id(run_id)
        try:
            manager.cancel(run_id)
        except NotRunningError:
            if not await manager.exists(run_id):
                raise ApiError(404, manager.no_run(run_id)) from None
            raise ApiError(409, f"run {run_id!r} is not running in this server") from None
        return {"run_id": run_id, "status": "cancelling"}

    @app.post("/api/runs/{run_id}/resume", status_code=202)
    async def resume_run(
        run_id: str, response: Response, body: ResumeRequest | None = None
    ) -> dict[str, Any]:
        run_id = _run_id(run_id)
        try:
            await manager.resume(run_id, force=body is not None and body.force)
        except UnknownRunError as exc:
            raise ApiError(404, str(exc)) from None
        except NotResumableError as exc:  # only a forceable one says so: `{"force": true}` resumes it
            raise ApiError(409, str(exc), {"forceable": True} if exc.forceable else None) from None
        except TooManyRunsError as exc:
            raise ApiError(429, str(exc)) from None
        except ShuttingDownError as exc:
            raise ApiError(503, str(exc)) from None
        response.headers["Location"] = f"/api/runs/{run_id}"
        return {"run_id": run_id, "status": "running"}


def _budget(limits: Budget, body: RunRequest) -> Budget:
    """The agent's budget with the request's limits, which may lower but not raise the agent's."""
    values: dict[str, Any] = limits.as_dict()
    for name in ("max_steps", "max_tokens", "max_cost", "timeout"):
        asked = getattr(body, name)
        if asked is None:
            continue
        limit = values[name]
        if limit is not None and asked > limit:
            shown = _cut(str(asked), MAX_WHERE)  # a number of 4,000 digits is not echoed whole
            raise ApiError(422, f"invalid request: {name}: {shown} is above the server's limit of {limit}")
        values[name] = asked
    return Budget(**values)


def _summary_row(row: dict[str, Any], manager: RunManager) -> dict[str, Any]:
    row["active"] = manager.live(row["run_id"]) is not None
    return row


def _starting_row(live: LiveRun) -> dict[str, Any]:
    """A run started a moment ago that the store has not seen yet."""
    return {
        "run_id": live.run_id, "goal": live.goal, "session": live.session, "status": "running",
        "phase": "thinking", "stop_reason": None, "step": 0, "tool_calls": 0, "created_at": live.created_at,
        "updated_at": live.created_at, "ended_at": None, "active": True,
    }  # fmt: skip


# ========================================================================================= approvals


def _add_approval_routes(app: FastAPI, manager: RunManager, approvals: PendingApprovals | None) -> None:
    @app.get("/api/approvals")
    async def list_approvals(run_id: RunIdQuery = None) -> dict[str, Any]:
        waiting = [] if approvals is None else approvals.pending(run_id)
        return {"approvals": [r.model_dump(mode="json") for r in waiting]}

    @app.post("/api/runs/{run_id}/approvals/{call_id:path}")  # ids are the model's: `call/1`
    async def answer_approval(
        request: Request, run_id: str, call_id: str, body: ApprovalAnswer
    ) -> dict[str, Any]:
        run_id = _run_id(run_id)
        decision = ApprovalDecision(action=body.decision, message=body.message)
        if approvals is None or not approvals.resolve(run_id, call_id, decision):
            raise await _not_waiting(manager, run_id, call_id)
        return {"run_id": run_id, "call_id": call_id, "decision": body.decision}


async def _not_waiting(manager: RunManager, run_id: str, call_id: str) -> ApiError:
    """Why a call cannot be answered: 404 when the run has no such call that asked for approval, 409 when
    it asked and waits no more — answered (twice, or from the page and over HTTP at once), timed out, or
    its run stopped — saying which, from the run's events."""
    try:
        events = await manager.events_after(run_id)
    except UnknownRunError:
        return ApiError(404, manager.no_run(run_id))
    asked = False
    decided: str | None = None
    for event in events:  # the last word counts: a resumed run asks again
        if event.type == "approval_requested" and event.call.id == call_id:
            asked, decided = True, None
        elif event.type == "tool_call" and event.call.id == call_id and asked:
            decided = event.decision
    if not asked:
        return ApiError(
            404,
            f"run {run_id!r} has no tool call {_shown(call_id)} that asked for approval: GET "
            f"/api/approvals?run_id={run_id} lists the calls waiting for an answer",
        )
    return ApiError(
        409,
        f"tool call {call_id!r} of run {run_id!r} is not waiting for an answer: "
        + await _became(manager, run_id, decided),
    )


async def _became(manager: RunManager, run_id: str, decided: str | None) -> str:
    """What became of a call that asked for approval and waits no more (`decided`: its tool_call's decision)."""
    if decided == "timeout":
        return "no answer came within the approval timeout, so it was denied (it did not run)"
    if decided is not None:
        return f"it was answered already ({decided})"
    if manager.live(run_id) is not None:
        return "it was answered a moment ago: the run is acting on that answer"
    state = await manager.store.load_state(run_id)
    if state is not None and state.finished:
        reason = state.stop_reason.value if state.stop_reason else state.phase
        return f"the run ended ({reason}) before it was answered"
    return (
        "the run is not running in this server (it stopped while the call waited): resume it "
        f"(POST /api/runs/{run_id}/resume), and the call is asked again"
    )


# ========================================================================================= websocket


def _add_stream_route(app: FastAPI, manager: RunManager) -> None:
    @app.websocket("/api/runs/{run_id}/events")
    async def stream_events(websocket: WebSocket, run_id: str, after: str = "0") -> None:
        if not _same_origin(websocket):
            await websocket.close(code=1008, reason="cross-origin WebSocket refused")
            return
        offered = websocket.scope.get("subprotocols", ())
        await websocket.accept(subprotocol=EVENTS_PROTOCOL if EVENTS_PROTOCOL in offered else None)
        code, reason = await _check_stream(manager, run_id, after)
        if code == 1000:
            code, reason = await _pump(websocket, manager, run_id, int(after))
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await websocket.close(code=code, reason=_close_reason(reason))

    # an id holding a slash (`..%2Fx`, decoded) names no run: answered 4404 like any unknown id, not with
    # the bare 403 of a WebSocket to a path no route matches
    app.add_api_websocket_route("/api/runs/{run_id:path}/events", stream_events)


async def _check_stream(manager: RunManager, run_id: str, after: str) -> tuple[int, str]:
    """(1000, "") if the run can be followed from `after`, else the close code and reason to answer."""
    if not (after.isascii() and after.isdigit() and len(after) <= len(str(MAX_SEQ))):
        return 4400, "after must be a whole number >= 0: the last seq you saw, or 0"
    try:
        if await manager.exists(check_id(run_id)):
            return 1000, ""
    except ConfigurationError:
        pass
    except Exception as exc:  # e.g. the store failed: say so instead of dropping the connection
        logger.warning("looking up run %r for a stream failed: %r", run_id, exc)
        return 1011, f"the server failed ({type(exc).__name__}); try again"
    return 4404, "no such run" if manager.failure(run_id) is None else manager.no_run(run_id)


async def _pump(websocket: WebSocket, manager: RunManager, run_id: str, after: int) -> tuple[int, str]:
    """Send the run's events until `done`; stop early if the client goes away (the run goes on)."""

    async def send_all() -> tuple[int, str]:
        try:
            async for event in manager.follow(run_id, after):
                await websocket.send_text(event.model_dump_json())
        except FollowerTooSlowError as exc:
            return 1013, _close_reason(str(exc))
        except RunFailedError as exc:
            return 1011, _close_reason(f"the run failed: {exc}")
        return 1000, "done"

    async def until_disconnect() -> tuple[int, str]:
        with contextlib.suppress(WebSocketDisconnect):
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
        return 1000, "client left"

    sender = asyncio.create_task(send_all())
    watcher = asyncio.create_task(until_disconnect())
    try:
        done, _ = await asyncio.wait({sender, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (sender, watcher):
            task.cancel()
        await asyncio.gather(sender, watcher, return_exceptions=True)
    if sender in done and sender.exception() is None:
        return sender.result()
    if sender in done:
        exc = sender.exception()
        logger.warning("streaming the events of run %s failed: %r", run_id, exc)
        return 1011, "internal error"
    return 1000, "client left"


MAX_CLOSE_REASON = 123  # bytes of UTF-8: a close frame's reason may not be longer (RFC 6455 §5.5)


def _close_reason(text: str) -> str:
    """`text` cut to what a close frame can carry, at a character boundary: a longer reason (120
    characters of which some are not ASCII) fails the close, and the client gets no code and no reason."""
    data = text.encode("utf-8")
    if len(data) <= MAX_CLOSE_REASON:
        return text
    return data[: MAX_CLOSE_REASON - 3].decode("utf-8", "ignore") + "…"


def _same_origin(websocket: WebSocket) -> bool:
    """Browsers send `Origin`: a page of another site may not read the runs (non-browser clients send none)."""
    origin = websocket.headers.get("origin")
    if origin is None:
        return True
    host = websocket.headers.get("host", "")
    return origin.split("://", 1)[-1].rstrip("/") == host


# ============================================================================================== page


def _add_page_routes(app: FastAPI, agent: Agent, approvals: PendingApprovals | None) -> None:
    files = {name: resources.files(__package__).joinpath("static", name).read_bytes() for name in _STATIC}

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def page() -> Response:
        return Response(files["index.html"], media_type=_MEDIA["html"], headers=_SECURITY_HEADERS)

    @app.api_route("/static/{name}", methods=["GET", "HEAD"], include_in_schema=False)
    async def static(name: str) -> Response:
        if name not in files:
            raise ApiError(404, f"no file {_shown(name)}")
        media = _MEDIA[name.rsplit(".", 1)[-1]]
        return Response(files[name], media_type=media, headers=_SECURITY_HEADERS)

    @app.get("/api/info")
    async def info() -> dict[str, Any]:
        safety = agent.safety
        return {
            "agent": agent.name,
            "model": agent.model.spec,
            "tools": agent.tools.names,
            "safety": safety.policy.mode.value if isinstance(safety, SafetyController) else None,
            "approvals": approvals is not None,
            "budget": agent.budget.as_dict(),
        }
