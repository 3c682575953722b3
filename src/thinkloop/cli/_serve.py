"""`thinkloop serve`: the server (SPEC §13.2) — an HTTP + WebSocket API and a web page for an agent's runs."""

from __future__ import annotations

import asyncio
import ipaddress
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.console import Console
from rich.markup import escape

from .._budget import Budget
from .._errors import ThinkloopError
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
)
from ._run import build_agent, cli_metadata, load_model, print_error

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


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
    max_cost: Annotated[float | None, typer.Option(help="Cost budget of each run in US dollars.")] = None,
    timeout: Annotated[float | None, typer.Option(help="Time budget of each run in seconds.")] = None,
    approval_timeout: Annotated[
        float, typer.Option(help="Seconds a risky call waits for an answer on the page before it is denied.")
    ] = 600.0,
    workspace: WorkspaceOption = Path("."),
    hosts: HostsOption = None,
    mcp: McpOption = None,
    mode: ModeOption = "auto",
    instructions: InstructionsOption = "",
    max_active_runs: Annotated[int, typer.Option(help="The most runs at once.", min=1)] = 8,
) -> None:
    """Serve an agent: start runs over HTTP, follow them over WebSocket, approve risky calls on a web page."""
    console = Console(stderr=True)
    try:
        budget = Budget(max_steps=max_steps, max_tokens=max_tokens, max_cost=max_cost, timeout=timeout)
        options = dict(
            tools=tools, safety=safety, workspace=workspace, mcp=mcp or [], mode=mode, hosts=hosts,
        )  # fmt: skip
        asyncio.run(
            _serve(
                host,
                port,
                model,
                budget,
                options,
                instructions,
                store,
                approval_timeout,
                max_active_runs,
                console,
            )
        )
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
    except OSError as exc:  # e.g. the port is taken
        console.print(f"[bold red]error:[/] cannot listen on {escape(host)}:{port}: {escape(str(exc))}")
        raise typer.Exit(1) from None


async def _serve(
    host: str,
    port: int,
    model_spec: str | None,
    budget: Budget,
    options: dict[str, Any],
    instructions: str,
    store_url: str | None,
    approval_timeout: float,
    max_active_runs: int,
    console: Console,
) -> None:
    import uvicorn

    from ..safety import PendingApprovals, SafetyController
    from ..server import create_app

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
        allowed_hosts=[*LOOPBACK_NAMES, "[::1]"] if loopback else None,
        run_metadata={"cli": cli_metadata({**options, "learn": False}, instructions)},
        close_agent=True,
    )
    if not loopback:
        console.print(
            "[yellow]warning:[/] the server has no authentication and its tools act on this machine: "
            "put it behind a proxy that checks who is asking"
        )
    where = f"[{host}]" if ":" in host else host
    console.print(
        f"thinkloop serving {escape(model.spec)} at [bold]http://{escape(where)}:{port}/[/] (Ctrl-C stops)"
    )
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    await uvicorn.Server(config).serve()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
