"""`thinkloop runs …`: list, show, resume, replay and export saved runs (SPEC §13.1)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.markup import escape
from rich.table import Table

from .. import _aio
from .._errors import ConfigurationError, StateError, ThinkloopError, UserError
from .._state import RunState
from ..stores import RunSummary, Store
from ..stores._owner import check_not_running, claim
from ._console import Console
from ._fail import describe_os_error
from ._pipe import Output, json_for_stdout, until_the_reader_leaves
from ._run import STORE_VARIABLE, drive, open_store_named, print_error

T = TypeVar("T")

runs_app = typer.Typer(
    help="List, inspect, resume, replay and export saved runs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        help="The store: sqlite:///PATH (default: the user data dir, or $THINKLOOP_HOME), "
        "postgresql://…, file:///DIR.",
    ),
]
RunId = Annotated[str, typer.Argument(help="The run's id (see `thinkloop runs list`).")]
MAX_LIMIT = 2**31 - 1  # what every store's LIMIT takes (SQLite's INTEGER overflowed at 2**63)


def _with_store(url: str | None, job: Callable[[Store], Awaitable[T]]) -> T:
    """Open the store, run `job` on it, close it; thinkloop errors end the command with a clear message
    on stderr (stdout holds only the command's output: with --json, only JSON lines)."""

    async def main() -> T:
        store = open_store_named(url)
        _check_exists(store)
        try:
            return await job(store)
        finally:
            await store.aclose()

    try:
        return _aio.run(main())
    except ThinkloopError as exc:
        raise typer.Exit(print_error(Console(stderr=True), exc)) from None


def _check_exists(store: Store) -> None:
    """These commands only read: a store file or directory that does not exist is a mistyped `--store`
    (it used to be created, empty, and the command said there were no runs) — except the default store,
    which the first run creates."""
    from ..stores import FileStore, SQLiteStore, default_path
    from ..stores._base import file_in_the_way

    where = (
        store.path if isinstance(store, SQLiteStore) else store.root if isinstance(store, FileStore) else None
    )
    if where is None or str(where) == ":memory:" or where.exists() or where == default_path():
        return
    blocking = file_in_the_way(where)
    why = f"{blocking} is a file, not a directory" if blocking is not None else "nothing was ever saved there"
    raise UserError(
        f"no store at {where}: {why}; check the path given with --store (or in ${STORE_VARIABLE}) — by "
        f"default runs are saved in {default_path()}"
    )


async def _state(store: Store, run_id: str) -> RunState:
    state = await store.load_state(run_id)
    if state is None:
        raise UserError(f"no run {run_id!r} in {store.url}: see `thinkloop runs list`")
    return state


# ================================================================================================ list


@runs_app.command("list")
def list_command(
    store: StoreOption = None,
    limit: Annotated[int, typer.Option(help="How many runs, newest first.", min=1)] = 20,
    status: Annotated[str | None, typer.Option(help="Only runs that are running, done or error.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per run.")] = False,
) -> None:
    """List saved runs, most recently updated first."""
    if status not in (None, "running", "done", "error"):
        error = UserError(f"--status must be running, done or error, not {status!r}")
        raise typer.Exit(print_error(Console(stderr=True), error))
    limit = min(limit, MAX_LIMIT)  # `--limit 99999999999999999999` means all: no store takes a bigger LIMIT
    runs = _with_store(store, lambda s: s.list_runs(limit, status=status))  # type: ignore[arg-type]
    with until_the_reader_leaves():
        _print_runs(Output(), runs, as_json)


def _print_runs(console: Console, runs: list[RunSummary], as_json: bool) -> None:
    if as_json:
        for run in runs:
            sys.stdout.write(json_for_stdout(run.model_dump_json()) + "\n")
        return
    if console.width >= TABLE_WIDTH:
        console.print(_runs_table(runs))
        return
    for r in runs:  # too narrow for the table: one line each, never cut (the run id is what you copy)
        console.print(
            f"{r.run_id}  [{_STATUS_STYLE.get(r.status, 'yellow')}]{r.status}[/] {r.stop_reason or ''}  "
            f"{r.step} steps  {_when(r.updated_at)}  {escape(_one_line(r.goal))}",
            soft_wrap=True,
        )


TABLE_WIDTH = 120
_STATUS_STYLE = {"done": "green", "error": "red"}


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def _runs_table(runs: list[RunSummary]) -> Table:
    table = Table(show_lines=False)
    table.add_column("run id", no_wrap=True, min_width=32)  # whole: it is what you copy
    for name in ("status", "stop reason", "steps", "tools", "tokens", "updated", "goal"):
        table.add_column(name, overflow="fold" if name == "goal" else "ellipsis")
    for r in runs:
        table.add_row(
            r.run_id,
            f"[{_STATUS_STYLE.get(r.status, 'yellow')}]{r.status}[/]",
            r.stop_reason or "",
            str(r.step),
            str(r.tool_calls),
            str(r.usage.total_tokens),
            _when(r.updated_at),
            escape(_one_line(r.goal)),
        )
    return table


def _one_line(text: str, limit: int = 80) -> str:
    return " ".join(text.split())[:limit]


# ================================================================================================ show


@runs_app.command("show")
def show_command(run_id: RunId, store: StoreOption = None) -> None:
    """Show a run: its state, steps, tool calls, stop reason and usage."""
    state = _with_store(store, lambda s: _state(s, run_id))
    with until_the_reader_leaves():
        _print_state(Output(), state, store)


def _print_state(console: Console, state: RunState, store_url: str | None = None) -> None:
    u = state.usage
    console.print(  # soft-wrapped: the run id is never split over two lines (narrow terminal)
        f"[bold]run[/] {state.run_id} · agent {escape(state.agent_name)} · model {escape(state.model)}",
        soft_wrap=True,
    )
    console.print(f"[bold]goal:[/] {escape(state.goal)}")
    status = state.stop_reason.value if state.stop_reason else f"unfinished ({state.phase})"
    console.print(
        f"[bold]status:[/] {status} · {state.step} steps · {state.tool_calls} tool calls · mode {state.mode} · "
        f"{u.input_tokens}+{u.output_tokens} tokens · ${u.cost:.4f} · {state.elapsed:.1f} s"
    )
    if state.session:
        console.print(f"[bold]session:[/] {state.session}")
    for message in state.messages:
        _print_message(console, message.role, message.kind, message.step, message.content, message.tool_calls)
    if state.answer:
        console.print(f"[bold green]answer:[/] {escape(state.answer)}")
    if state.error:
        console.print(f"[yellow]{escape(state.error)}[/]")
    if not state.finished:
        console.print(f"[dim]{escape(_unfinished(state, store_url))}[/]", soft_wrap=True)


def _unfinished(state: RunState, store_url: str | None) -> str:
    """How to continue an unfinished run — with the `--store` it was read from (`runs resume` without it
    looks in the default store) — or, when a live thinkloop process still runs it, which one."""
    try:
        check_not_running(state.run_id, state.metadata, force="--force")
    except UserError as exc:
        return f"not finished: {exc}"
    where = f" --store {store_url}" if store_url else ""
    return f"resume it with: thinkloop runs resume {state.run_id}{where}"


def _print_message(
    console: Console, role: str, kind: str, step: int | None, content: str, calls: Any
) -> None:
    where = f"step {step}" if step is not None else kind
    text = content.strip()
    if len(text) > 500:
        text = text[:480] + f" … [{len(text) - 480} more chars]"
    if text:
        console.print(f"[dim]{where:>8}[/] [bold]{role}[/]: {escape(text)}")
    for call in calls:
        args = json.dumps(call.arguments, ensure_ascii=False)[:200]
        console.print(
            f"[dim]{where:>8}[/] [bold blue]→ {escape(call.name)}[/]({escape(args)}) [dim]{call.id}[/]"
        )


# ============================================================================================== replay


@runs_app.command("replay")
def replay_command(
    run_id: RunId,
    store: StoreOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the events as JSON lines.")] = False,
) -> None:
    """Re-render a run's event log the way the live view showed it."""
    from ._view import render_event

    async def job(s: Store) -> tuple[RunState, list[Any]]:
        return await _state(s, run_id), await s.read_events(run_id)

    state, events = _with_store(store, job)
    console = Output()
    with until_the_reader_leaves():
        for event in events:
            if as_json:
                sys.stdout.write(json_for_stdout(event.model_dump_json()) + "\n")
            elif event.type not in ("answer_delta", "answer_reset"):  # the answer is shown whole by `done`
                render_event(console, event)
        if not as_json and not state.finished:  # the log stops short of a `done`: say why
            console.print(f"[dim]{escape(_unfinished(state, store))}[/]", soft_wrap=True)


# ============================================================================================== export


@runs_app.command("export")
def export_command(
    run_id: RunId,
    store: StoreOption = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write to this file, not stdout.")
    ] = None,
) -> None:
    """Export a run as JSON: {"state": …, "events": […]}."""
    console = Console(stderr=True)

    async def job(s: Store) -> str:
        state = await _state(s, run_id)
        events = await s.read_events(run_id)
        body = {
            "state": state.model_dump(mode="json"),
            "events": [e.model_dump(mode="json") for e in events],
        }
        return json.dumps(body, ensure_ascii=False, indent=2)

    text = _with_store(store, job)
    if output is None:
        with until_the_reader_leaves():
            sys.stdout.write(json_for_stdout(text) + "\n")
    else:
        try:
            output.write_text(text + "\n", encoding="utf-8")
        except OSError as exc:
            error = ConfigurationError(
                f"could not write run {run_id} to {str(output)!r}: {describe_os_error(exc)}; give -o a file "
                "in a directory that exists, that you may write to, on a disk with free space"
            )
            raise typer.Exit(print_error(console, error)) from None
        console.print(f"run {run_id} written to {output}", soft_wrap=True)


# ============================================================================================== resume


async def _model(spec: str | None, state: RunState, console: Console) -> Any:
    """The model given with --model, else the one recorded in the run."""
    from .._errors import ConfigurationError
    from ._run import load_model

    if spec is not None:
        return await load_model(spec, console)
    try:
        return await load_model(state.model or None, console)
    except ConfigurationError as exc:
        raise UserError(
            f"the run's model {state.model!r} cannot be loaded again ({exc}): give one with --model "
            "(e.g. --model script:FILE for a scripted run)"
        ) from None


def _recorded_safety(cli: dict[str, Any]) -> str:
    """The safety mode the run was started with (a resumed strict run was resumed balanced)."""
    mode = cli.get("safety")
    return mode if mode in ("strict", "balanced", "permissive") else "balanced"


def _recorded_list(cli: dict[str, Any], key: str) -> list[str]:
    value = cli.get(key)
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []


@runs_app.command("resume")
def resume_command(
    run_id: RunId,
    store: StoreOption = None,
    model: Annotated[
        str | None,
        typer.Option("--model", "-m", help="The model; default: the one the run was started with."),
    ] = None,
    tools: Annotated[
        str | None, typer.Option(help="Built-in tools (default: those the run was started with).")
    ] = None,
    safety: Annotated[
        str | None,
        typer.Option(help="Safety mode: strict, balanced or permissive (default: the run's, else balanced)."),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Approve risky calls without asking.")] = False,
    workspace: Annotated[
        Path | None, typer.Option(help="Root of the file tools and the shell (default: the run's).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the events as JSON lines.")] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Resume even if the process that ran the run seems to be running it still."
        ),
    ] = False,
) -> None:
    """Continue an interrupted run from its last checkpoint, with the live view."""
    console = Console(stderr=as_json)
    options = {"tools": tools, "safety": safety, "yes": yes, "workspace": workspace, "force": force}
    raise typer.Exit(drive(_resume(run_id, store, model, options, as_json, console), Console(stderr=True)))


async def _resume(
    run_id: str,
    store_url: str | None,
    model_spec: str | None,
    options: dict[str, Any],
    as_json: bool,
    console: Console,
) -> int:
    from .._budget import Budget
    from ._options import DEFAULT_TOOLS
    from ._run import Printer, build_agent, kept, resumable_on_ctrl_c, with_resume_command
    from ._view import LiveView

    store = open_store_named(store_url)
    try:  # refuses an unknown or finished run before loading a model: the user named the wrong run (exit 2);
        # a store that fails or holds a corrupt state is an error (exit 1), as for `runs show`
        state = await _state(store, run_id)
        if state.finished:
            reason = state.stop_reason.value if state.stop_reason else state.phase
            raise UserError(
                f"run {run_id!r} already ended ({reason}) and cannot be resumed: start a new run instead"
            )
        raw = state.metadata.get("cli")
        cli: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if not options["force"]:
            check_not_running(run_id, state.metadata, force="--force")  # a UserError
        claim(state.metadata)
        await store.checkpoint(state, [])  # this process runs it now
    finally:
        await store.aclose()
    model = await _model(model_spec, state, console)
    view = LiveView(console)
    show = Printer(view, as_json)
    agent = build_agent(
        model,
        budget=Budget(**state.budget) if state.budget else Budget(),
        instructions=str(cli.get("instructions", "")),
        store_url=store.url,
        console=console,
        tools=options["tools"] or str(cli.get("tools", DEFAULT_TOOLS)),
        safety=options["safety"] or _recorded_safety(cli),
        yes=options["yes"],
        workspace=options["workspace"] or Path(str(cli.get("workspace", "."))),
        mcp=_recorded_list(cli, "mcp"),  # the run's MCP servers: its tools (and their risks) as they were
        hosts=Path(cli["hosts"]) if isinstance(cli.get("hosts"), str) else None,
        mode=state.mode,
        on_event=show,
        learn=bool(cli.get("learn", False)),
    )
    resumable_on_ctrl_c(agent, store_url)
    try:
        await agent.resume(run_id)
        await agent.wait_for_learning()
    except StateError as exc:
        raise with_resume_command(exc, store_url) from exc
    finally:
        view.close()
        aclose = getattr(agent, "aclose", None)  # closes MCP servers, when the agent has them
        if aclose is not None:
            await aclose()
        if isinstance(agent.store, Store):
            await agent.store.aclose()
    return show.exit_code(saved=kept(agent))
