"""`thinkloop worker` and `thinkloop submit`: runs spread over processes and machines (SPEC §13.4)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.markup import escape

from .. import _aio
from .._budget import Budget
from .._errors import ThinkloopError, UserError
from .._events import Done, Event
from ._console import Console
from ._options import (
    DEFAULT_TOOLS,
    InstructionsOption,
    ModelOption,
    ModeOption,
    ToolsOption,
    WorkspaceOption,
    read_goal,
)
from ._run import build_agent, load_model, print_error
from ._view import result_exit_code

QueueOption = Annotated[
    str | None, typer.Option(help="The job queue: a PostgreSQL URL (default $THINKLOOP_QUEUE).")
]


def _queue_url(queue: str | None) -> str:
    """The queue's PostgreSQL URL, checked before anything runs: one that is not a PostgreSQL URL or is
    malformed is a usage error (it failed at the first query, as if the server were down)."""
    from ..stores._postgres import PostgresStore, redacted_dsn

    url = queue or os.environ.get("THINKLOOP_QUEUE") or ""
    if not url.strip():
        raise UserError("no job queue: pass --queue postgresql://user@host/db or set THINKLOOP_QUEUE")
    if not (url.lower().startswith(("postgresql:", "postgres:")) or "=" in url):
        raise UserError(
            f"the job queue {redacted_dsn(url)!r} is not a PostgreSQL URL: give --queue "
            "postgresql://user@host/db (or set THINKLOOP_QUEUE to one)"
        )
    PostgresStore(url)  # parses the URL (connects at first use): a malformed one is a ConfigurationError
    return url


def worker_command(
    queue: QueueOption = None,
    store: Annotated[
        str | None,
        typer.Option(help="Where runs are saved, shared by all workers (default: the queue's database)."),
    ] = None,
    model: ModelOption = None,
    tools: ToolsOption = DEFAULT_TOOLS,
    safety: Annotated[
        Literal["strict", "balanced", "permissive"],
        typer.Option(help="Safety mode (no one is asked: refused unless --yes)."),
    ] = "balanced",
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Approve risky calls (never blacklisted ones).")
    ] = False,
    workspace: WorkspaceOption = Path("."),
    mode: ModeOption = "auto",
    instructions: InstructionsOption = "",
    max_steps: Annotated[int, typer.Option(help="Step budget of jobs submitted without one.", min=1)] = 16,
    concurrency: Annotated[int, typer.Option(help="Jobs run at once by this worker.", min=1)] = 4,
    lease: Annotated[
        float, typer.Option(help="Seconds before a silent worker's jobs are taken over.")
    ] = 30.0,
    until_idle: Annotated[bool, typer.Option("--until-idle", help="Stop when the queue is empty.")] = False,
) -> None:
    """Take jobs from the queue and run them (resuming the runs of workers that died) until stopped."""
    console = Console(stderr=True)
    try:
        url = _queue_url(queue)
        options = dict(tools=tools, safety=safety, yes=yes, workspace=workspace, mcp=[], mode=mode)
        code = _aio.run(
            _serve(
                url,
                store or url,
                model,
                options,
                instructions,
                Budget(max_steps=max_steps),
                concurrency,
                lease,
                until_idle,
                console,
            )
        )
    except ThinkloopError as exc:
        code = print_error(console, exc)
    raise typer.Exit(code)


async def _serve(
    queue_url: str,
    store_url: str,
    model_spec: str | None,
    options: dict[str, object],
    instructions: str,
    budget: Budget,
    concurrency: int,
    lease: float,
    until_idle: bool,
    console: Console,
) -> int:
    from ..distributed import JobQueue, Worker

    def report(event: Event) -> None:
        if isinstance(event, Done):
            r = event.result
            console.print(
                f"run {r.run_id} · {r.stop_reason.value} · {r.steps} steps · {escape(r.output[:120])}"
            )

    model = await load_model(model_spec, console)
    agent = build_agent(
        model, budget=budget, instructions=instructions, store_url=store_url, console=console, on_event=report,
        **options,  # type: ignore[arg-type]
    )  # fmt: skip
    async with JobQueue(queue_url, lease=lease) as jobs:
        worker = Worker(agent, jobs, concurrency=concurrency)
        loop = asyncio.get_running_loop()

        def on_signal(sig: signal.Signals) -> None:
            # SIGTERM (a service manager stopping us, SIGKILL to follow): hand the runs back at once.
            # Ctrl-C: the first finishes the running jobs and takes no new ones; the second interrupts them
            if worker.stopping or sig is signal.SIGTERM:
                console.print("interrupting the running jobs: they go back to the queue, resumable")
                worker.stop(interrupt=True)
            else:
                console.print("stopping: finishing the running jobs (Ctrl-C again to interrupt them)")
                worker.stop()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        console.print(f"worker {worker.name} · queue {jobs.url} · {concurrency} at a time")  # no password
        try:
            await worker.serve(until_idle=until_idle)
        finally:
            await agent.aclose()
            if agent.store is not None and hasattr(agent.store, "aclose"):
                await agent.store.aclose()
    return 0


def submit_command(
    goal: Annotated[str, typer.Argument(help="What the agent should do or answer; - reads it from stdin.")],
    queue: QueueOption = None,
    run_id: Annotated[str | None, typer.Option(help="The run's id (default: a new one).")] = None,
    max_steps: Annotated[int | None, typer.Option(help="Step budget (default: the worker's).", min=1)] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the answer and print it.")] = False,
    store: Annotated[
        str | None,
        typer.Option(help="Where the workers save runs (for --wait; default: the queue's database)."),
    ] = None,
) -> None:
    """Queue a goal for the workers; prints its run id (with --wait, the answer once it is done)."""
    console = Console()
    errors = Console(stderr=True)
    try:
        goal = read_goal(goal, "submit")
        url = _queue_url(queue)
        code = _aio.run(_submit(url, goal, run_id, max_steps, wait, store or url, console))
    except ThinkloopError as exc:
        code = print_error(errors, exc)
    raise typer.Exit(code)


async def _submit(
    url: str,
    goal: str,
    run_id: str | None,
    max_steps: int | None,
    wait: bool,
    store_url: str,
    console: Console,
) -> int:
    from ..distributed import JobQueue
    from ..stores import open_store

    # the store --wait reads is opened first: a bad --store must not fail after the job was queued
    async with open_store(store_url if wait else "memory:") as store, JobQueue(url) as jobs:
        budget = Budget(max_steps=max_steps) if max_steps else None
        submitted = await jobs.submit(goal, run_id=run_id, budget=budget)
        console.print(submitted, soft_wrap=True)
        if not wait:
            return 0
        result = await jobs.wait(submitted, store)
        console.print(escape(result.output), soft_wrap=True)
        return result_exit_code(result.stop_reason)  # as `thinkloop run`'s
