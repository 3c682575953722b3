"""`thinkloop serve`: the server (SPEC §13.2) — an HTTP + WebSocket API and a web page for an agent's runs."""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import stat
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.markup import escape

from .. import _aio
from .._budget import Budget
from .._errors import ThinkloopError, UserError
from ._console import Console
from ._fail import describe_os_error
from ._options import (
    DEFAULT_TOOLS,
    HostsOption,
    InstructionsOption,
    McpOption,
    ModelOption,
    ModeOption,
    StoreOption,
    ToolsOption,
    WorkspaceOption,
    finite,
    positive_seconds,
)
from ._run import build_agent, cli_metadata, load_model, print_error

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
TOKEN_VARIABLE = "THINKLOOP_SERVER_TOKEN"
MAKE_TOKEN = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"


def serve_command(
    host: Annotated[
        str, typer.Option(help="Address to listen on (127.0.0.1: this machine only).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", min=1, max=65535)] = 8765,
    model: ModelOption = None,
    tools: ToolsOption = DEFAULT_TOOLS,
    safety: Annotated[
        Literal["strict", "balanced", "permissive"],
        typer.Option(help="Safety mode: strict, balanced or permissive. Risky calls wait for the page."),
    ] = "balanced",
    store: StoreOption = None,
    max_steps: Annotated[
        int, typer.Option(help="Step budget of each run (the most a request may ask).", min=1)
    ] = 16,
    max_tokens: Annotated[int | None, typer.Option(help="Token budget of each run.", min=1)] = None,
    max_cost: Annotated[
        float | None, typer.Option(help="Cost budget of each run in US dollars.", callback=finite)
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(help="Time budget of each run in seconds.", callback=finite)
    ] = None,
    approval_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds a risky call waits for an answer on the page before it is denied.",
            callback=positive_seconds,
        ),
    ] = 600.0,
    workspace: WorkspaceOption = Path("."),
    hosts: HostsOption = None,
    mcp: McpOption = None,
    mode: ModeOption = "auto",
    instructions: InstructionsOption = "",
    max_active_runs: Annotated[int, typer.Option(help="The most runs at once.", min=1)] = 8,
    max_connections: Annotated[
        int,
        typer.Option(
            help="The most connections open at once, HTTP and WebSocket (a page's stream is one); more "
            "are refused with 503.",
            min=1,
        ),
    ] = 100,  # server._serving.MAX_CONNECTIONS (not imported here: it would load FastAPI for every command)
    header_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds a connection has to send a request's headers (from opening, or from its last "
            "answer) before it is closed.",
            callback=positive_seconds,
        ),
    ] = 30.0,  # server._serving.HEAD_TIMEOUT (not imported here: it would load FastAPI for every command)
    token: Annotated[
        str | None,
        typer.Option(
            help=f"The token every request must carry (Authorization: Bearer TOKEN). Default: "
            f"${TOKEN_VARIABLE}. Prefer that or --token-file: other users can see a command line.",
            show_default=False,
        ),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(help="Read the token from this file (its first line).", dir_okay=False),
    ] = None,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="Allow a non-loopback --host without a token (only behind a proxy that authenticates).",
        ),
    ] = False,
) -> None:
    """Serve an agent: start runs over HTTP, follow them over WebSocket, approve risky calls on a web page."""
    console = Console(stderr=True)
    try:
        secret = _token(token, token_file, host, insecure, console)
        budget = Budget(max_steps=max_steps, max_tokens=max_tokens, max_cost=max_cost, timeout=timeout)
        options = dict(
            tools=tools, safety=safety, workspace=workspace, mcp=mcp or [], mode=mode, hosts=hosts,
        )  # fmt: skip
        sockets = _bind(host, port)  # before the model loads (minutes, the first time) and says it serves
        try:
            _aio.run(
                _serve(
                    sockets,
                    host,
                    port,
                    model,
                    budget,
                    options,
                    instructions,
                    store,
                    approval_timeout,
                    max_active_runs,
                    secret,
                    header_timeout,
                    max_connections,
                    console,
                )
            )
        finally:
            for sock in sockets:
                sock.close()
    except KeyboardInterrupt:
        pass
    except ImportError as exc:
        if exc.name not in ("fastapi", "starlette", "uvicorn", "websockets"):
            raise
        console.print(
            "[bold red]error:[/] `thinkloop serve` needs the server extra: pip install 'thinkloop[server]'"
        )
        raise typer.Exit(2) from None
    except ThinkloopError as exc:
        raise typer.Exit(print_error(console, exc)) from None
    except _CannotListen as exc:
        problem = f"cannot listen on {host}:{port}: {_listen_problem(exc.error, host)}"
        console.print(f"[bold red]error:[/] {escape(problem)}", soft_wrap=True)
        raise typer.Exit(1) from None


class _CannotListen(Exception):
    """The server's address or port cannot be bound (`error`: why)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def _bind(host: str, port: int) -> list[socket.socket]:
    from ..server._serving import bind

    try:
        return bind(host, port)
    except OSError as exc:
        raise _CannotListen(exc) from None


def _listen_problem(exc: OSError, host: str) -> str:
    """Why the server cannot listen, and what to do (uvicorn logged `[Errno 98] error while attempting to
    bind …` and exited with 3, after `thinkloop serving … at` had been printed)."""
    if isinstance(exc, socket.gaierror):
        return (
            f"{host} is not a known host name ({exc.strerror}): give an address of this machine, e.g. "
            "127.0.0.1 (this machine only) or 0.0.0.0 (every network)"
        )
    reason = describe_os_error(exc)
    if exc.errno == errno.EADDRINUSE:
        return f"{reason}; another program listens there: stop it, or choose another --port"
    if exc.errno == errno.EADDRNOTAVAIL:
        return (
            f"{reason}; {host} is no address of this machine: give one of its addresses, 127.0.0.1 (this "
            "machine only) or 0.0.0.0 (every network)"
        )
    if exc.errno == errno.EACCES:
        return f"{reason}; a port below 1024 needs privileges: choose a --port above 1023"
    return reason


async def _serve(
    sockets: list[socket.socket],
    host: str,
    port: int,
    model_spec: str | None,
    budget: Budget,
    options: dict[str, Any],
    instructions: str,
    store_url: str | None,
    approval_timeout: float,
    max_active_runs: int,
    token: str | None,
    header_timeout: float,
    max_connections: int,
    console: Console,
) -> None:
    import uvicorn

    from ..safety import PendingApprovals, SafetyController
    from ..server import create_app
    from ..server._serving import uvicorn_config

    model = await load_model(model_spec, console)
    agent = build_agent(
        model,
        budget=budget,
        instructions=instructions,
        store_url=store_url,
        console=console,
        yes=False,
        **options,
    )
    agent.safety = SafetyController(
        options["safety"], approval=PendingApprovals(), approval_timeout=approval_timeout
    )
    loopback = _is_loopback(host)
    app = create_app(
        agent,
        max_active_runs=max_active_runs,
        allowed_hosts=allowed_hosts(host) if loopback else None,
        run_metadata={"cli": cli_metadata({**options, "learn": False}, instructions)},
        close_agent=True,
        token=token,
    )
    if not loopback and token is None:
        console.print(
            "[yellow]warning:[/] --insecure: the server has no authentication and its tools act on this "
            "machine; only a proxy in front of it that authenticates every request protects it"
        )
    elif not loopback:
        console.print(
            "[yellow]note:[/] over http:// the token crosses the network in clear text: put an HTTPS "
            "proxy in front of the server unless the network is yours"
        )
    where = f"[{host}]" if ":" in host else host
    access = "the token required" if token is not None else "no token"
    console.print(
        f"thinkloop serving {escape(model.spec)} at [bold]http://{escape(where)}:{port}/[/] "
        f"({access}; Ctrl-C stops)"
    )
    config = uvicorn_config(
        app, host=host, port=port, head_timeout=header_timeout, max_connections=max_connections
    )
    await uvicorn.Server(config).serve(sockets=sockets)


def allowed_hosts(host: str) -> list[str]:
    """The `Host` headers a server listening on the loopback address `host` answers to: the loopback names,
    and `host` itself as the URL it prints names it — `127.0.0.2`, or an IPv6 address in brackets, as given
    and in its short form (`[0:0:0:0:0:0:0:1]`, `[::1]`). Any other name is refused (DNS rebinding)."""
    allowed = [*LOOPBACK_NAMES, "[::1]"]
    given = host.strip("[]")
    try:
        address = ipaddress.ip_address(given)
    except ValueError:  # a name (localhost): as given
        forms = [host]
    else:
        forms = [f"[{given}]", f"[{address.compressed}]"] if address.version == 6 else [given]
    for form in forms:
        if form not in allowed:
            allowed.append(form)
    return allowed


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _token(given: str | None, path: Path | None, host: str, insecure: bool, console: Console) -> str | None:
    """The server's token: `--token`, else `--token-file`, else `$THINKLOOP_SERVER_TOKEN`; without one,
    a non-loopback `--host` is refused unless `--insecure`. The token is never printed."""
    from ..server._app import check_token

    if given is not None and path is not None:
        raise UserError("give the token with --token or --token-file, not both")
    token = given
    if path is not None:
        token = _read_token(path, console)
    if token is None:
        token = os.environ.get(TOKEN_VARIABLE) or None
        where = f"${TOKEN_VARIABLE}"
    else:
        where = "--token-file" if path is not None else "--token"
    if token is None:
        if not _is_loopback(host) and not insecure:
            raise UserError(
                f"refusing to serve on {host} without a token: anyone who can reach it could run the "
                f"agent's tools. Set one: export {TOKEN_VARIABLE}=$({MAKE_TOKEN}) (or --token-file FILE), "
                "then give it to the page when it asks; or pass --insecure if a proxy in front of the "
                "server authenticates every request"
            )
        return None
    try:
        check_token(token)
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None
    if len(token) < 16:
        console.print(
            f"[yellow]warning:[/] a token of {len(token)} characters can be guessed: use a long random one, "
            f"e.g. $({MAKE_TOKEN})"
        )
    return token


def _read_token(path: Path, console: Console) -> str:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read the token file {path}: {exc}") from None
    token = lines[0].strip() if lines else ""
    if not token:
        raise UserError(f"the token file {path} is empty: put the token on its first line")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        console.print(
            f"[yellow]warning:[/] other users may read the token file {escape(str(path))}: chmod 600 it"
        )
    return token
