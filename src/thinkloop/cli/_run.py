"""`thinkloop run GOAL`: the main job — an agent answering a goal, with a live view."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from .._agent import Agent
from .._budget import Budget
from .._errors import ThinkloopError, UserError
from .._events import Done, Event
from ..models import Model, resolve_model
from ._view import LiveView, exit_code

DEFAULT_TOOLS = "calculator"


def run_command(
    goal: Annotated[str, typer.Argument(help="What the agent should do or answer.")],
    model: Annotated[
        str | None,
        typer.Option("--model", "-m", help="local, local:0.5b, openai:MODEL, router:A,B or script:FILE."),
    ] = None,
    max_steps: Annotated[int, typer.Option(help="Step budget.", min=1)] = 16,
    max_tokens: Annotated[int | None, typer.Option(help="Token budget (input + output).", min=1)] = None,
    max_cost: Annotated[float | None, typer.Option(help="Cost budget in US dollars.")] = None,
    timeout: Annotated[float | None, typer.Option(help="Time budget in seconds.")] = None,
    tools: Annotated[
        str,
        typer.Option(
            help="Built-in tools, comma-separated: calculator,shell,ssh_execute,files,analyze_output."
        ),
    ] = DEFAULT_TOOLS,
    safety: Annotated[str, typer.Option(help="Safety mode: strict, balanced or permissive.")] = "balanced",
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Approve risky calls without asking (never blacklisted ones).")
    ] = False,
    workspace: Annotated[
        Path, typer.Option(help="Root directory of the file tools and the shell's working dir.")
    ] = Path("."),
    mcp: Annotated[
        list[str] | None, typer.Option(help="An MCP server command to add tools from (repeatable).")
    ] = None,
    mode: Annotated[str, typer.Option(help="auto, native or react.")] = "auto",
    instructions: Annotated[str, typer.Option(help="The agent's role / instructions.")] = "",
    store: Annotated[
        str | None,
        typer.Option(help="Where runs are saved: sqlite:///PATH, postgresql://…, file:///DIR, memory:."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the events as JSON lines instead of the live view.")
    ] = False,
) -> None:
    """Run an agent on GOAL and print its answer."""
    console = Console(stderr=as_json)
    try:
        budget = Budget(max_steps=max_steps, max_tokens=max_tokens, max_cost=max_cost, timeout=timeout)
        options = dict(tools=tools, safety=safety, yes=yes, workspace=workspace, mcp=mcp or [], mode=mode)
        code = asyncio.run(_run(goal, model, budget, options, instructions, store, as_json, console))
    except KeyboardInterrupt:
        console.print("[yellow]cancelled[/]")
        code = 130
    except ThinkloopError as exc:
        console.print(f"[bold red]error:[/] {exc}")
        code = 2 if isinstance(exc, UserError) else 1
    raise typer.Exit(code)


async def _run(
    goal: str,
    model_spec: str | None,
    budget: Budget,
    options: dict[str, Any],
    instructions: str,
    store_url: str | None,
    as_json: bool,
    console: Console,
) -> int:
    model = await load_model(model_spec, console)
    agent = build_agent(
        model, budget=budget, instructions=instructions, store_url=store_url, console=console, **options
    )
    view = LiveView(console)
    done: Done | None = None
    try:
        async for event in agent.stream(goal):
            _show(event, view, as_json)
            if isinstance(event, Done):
                done = event
    finally:
        view.close()
        await _close(agent)
    return exit_code(done)


def _show(event: Event, view: LiveView, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(event.model_dump_json() + "\n")
        sys.stdout.flush()
    else:
        view(event)


async def load_model(spec: str | None, console: Console) -> Model:
    """Resolve the model; a model that loads slowly (the local one) loads here, behind a progress spinner."""
    model = resolve_model(spec)
    load = getattr(model, "load", None)
    if load is not None:
        with console.status(f"Loading {model.spec} (first use assembles and maps the weights)…"):
            await load()
    return model


def build_agent(
    model: Model,
    *,
    budget: Budget,
    instructions: str,
    store_url: str | None,
    console: Console,
    tools: str,
    safety: str,
    yes: bool,
    workspace: Path,
    mcp: list[str],
    mode: str,
) -> Agent:
    """The agent the CLI runs: built-in tools, a safety controller asking at the terminal, a store, MCP."""
    from ..tools import builtin_tools

    names = [n.strip() for n in tools.split(",") if n.strip()]
    kwargs: dict[str, Any] = {}
    if mcp:
        from ..mcp import MCPServerStdio

        kwargs["mcp_servers"] = [MCPServerStdio.from_command_line(cmd) for cmd in mcp]
    return Agent(
        model,
        tools=builtin_tools(names, root=workspace),
        instructions=instructions,
        budget=budget,
        mode=mode,  # type: ignore[arg-type]
        safety=_safety(safety, yes, console),
        store=_store(store_url),
        **kwargs,
    )


def _safety(mode: str, yes: bool, console: Console) -> Any:
    from ..safety import SafetyController, SafetyPolicy, console_approval

    return SafetyController(SafetyPolicy(mode=mode), approval=console_approval(console, assume_yes=yes))  # type: ignore[arg-type]


def _store(url: str | None) -> Any:
    from ..stores import open_store

    return open_store(url)


async def _close(agent: Agent) -> None:
    aclose = getattr(agent, "aclose", None)
    if aclose is not None:
        await aclose()
    store = agent.store
    if store is not None and hasattr(store, "aclose"):
        await store.aclose()
