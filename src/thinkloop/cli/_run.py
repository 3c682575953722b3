"""`thinkloop run GOAL`: the main job — an agent answering a goal, with a live view."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import typer
from rich.markup import escape

from .. import _aio
from .._agent import Agent
from .._budget import Budget
from .._errors import ConfigurationError, StateError, ThinkloopError, UserError
from .._events import Done, Event
from .._loop import EventSink
from ..models import Model, resolve_model
from ..stores._owner import this_process
from ._console import Console
from ._fail import describe_os_error
from ._interrupt import EXIT_CODE as INTERRUPTED
from ._interrupt import Interrupts
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
    check_limits,
    check_text,
    finite,
    read_goal,
)
from ._pipe import json_for_stdout, stdout_to_devnull
from ._view import LiveView, exit_code

T = TypeVar("T")
MODEL_VARIABLE = "THINKLOOP_MODEL"
STORE_VARIABLE = "THINKLOOP_STORE"


def run_command(
    goal: Annotated[str, typer.Argument(help="What the agent should do or answer; - reads it from stdin.")],
    model: ModelOption = None,
    max_steps: Annotated[int, typer.Option(help="Step budget.", min=1)] = 16,
    max_tokens: Annotated[int | None, typer.Option(help="Token budget (input + output).", min=1)] = None,
    max_cost: Annotated[
        float | None, typer.Option(help="Cost budget in US dollars.", callback=finite)
    ] = None,
    timeout: Annotated[float | None, typer.Option(help="Time budget in seconds.", callback=finite)] = None,
    tools: ToolsOption = DEFAULT_TOOLS,
    safety: Annotated[
        Literal["strict", "balanced", "permissive"],
        typer.Option(help="Safety mode: strict, balanced or permissive."),
    ] = "balanced",
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Approve risky calls without asking (never blacklisted ones).")
    ] = False,
    workspace: WorkspaceOption = Path("."),
    hosts: HostsOption = None,
    mcp: McpOption = None,
    mode: ModeOption = "auto",
    instructions: InstructionsOption = "",
    store: StoreOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the events as JSON lines instead of the live view.")
    ] = False,
    trace: Annotated[
        Path | None,
        typer.Option(help="Write an OpenTelemetry trace of the run (one span per JSON line) to this file."),
    ] = None,
    learn: Annotated[
        bool,
        typer.Option(
            "--learn",
            help="Recall lessons from earlier runs into the prompt, and learn from this one "
            "(kept in $THINKLOOP_LESSONS, else lessons.jsonl in the user data directory).",
        ),
    ] = False,
) -> None:
    """Run an agent on GOAL and print its answer."""
    console = Console(stderr=as_json)
    errors = Console(stderr=True)
    try:
        goal = read_goal(goal)
        check_text("--instructions", instructions)
        if trace is not None:
            check_trace_file(trace)
        check_limits(max_cost=max_cost, timeout=timeout)
        budget = Budget(max_steps=max_steps, max_tokens=max_tokens, max_cost=max_cost, timeout=timeout)
        options = dict(
            tools=tools, safety=safety, yes=yes, workspace=workspace, mcp=mcp or [], mode=mode, hosts=hosts,
            learn=learn, trace=trace,
        )  # fmt: skip
    except ThinkloopError as exc:
        raise typer.Exit(print_error(errors, exc)) from None
    code = drive(_run(goal, model, budget, options, instructions, store, as_json, console), errors)
    raise typer.Exit(code)


def check_trace_file(path: Path) -> None:
    """`--trace FILE` must be a file that can be appended to — checked before the run, since the trace is
    written span by span as it goes (a directory or a missing parent failed at each span, with a traceback)."""
    try:
        with path.open("a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise ConfigurationError(
            f"cannot write the trace file: {describe_os_error(exc)}; give --trace a file in a directory "
            "that exists and that you may write to"
        ) from None


def drive(main: Coroutine[Any, Any, int], errors: Console) -> int:
    """Run a command's coroutine with the CLI's Ctrl-C handling (see `Interrupts`, which handles SIGTERM
    and SIGHUP alike); returns its exit code — 130 (143 for SIGTERM), with `interrupted` or `cancelled`
    on stderr, when a signal stopped it."""
    with Interrupts() as interrupts:
        try:
            code = _aio.run(interrupts.run(main))
        except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C before the run started, or after
            code = INTERRUPTED
        except ThinkloopError as exc:
            code = print_error(errors, exc)
        finally:  # never started (a bad THINKLOOP_EVENT_LOOP …): no "never awaited" warning under the error
            main.close()
    if code == INTERRUPTED:
        code = interrupts.exit_code
        hint = interrupts.resume_hint
        by = "" if interrupts.signum == signal.SIGINT else f" ({interrupts.signum.name})"
        with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone
            errors.print(
                f"[yellow]interrupted[/]{by}: the run is saved; continue it with {hint}"
                if hint
                else f"[yellow]cancelled[/]{by}",
                soft_wrap=True,  # the command to copy is never split over two lines
            )
    return code


def resumable_on_ctrl_c(agent: Agent, store_url: str | None) -> None:
    """Ctrl-C interrupts the agent's run, saved unfinished (unless nothing outlives the process)."""
    from ..stores import MemoryStore

    current = Interrupts.current
    if current is None or agent.store is None or isinstance(agent.store, MemoryStore):
        return  # nothing would outlive the process: Ctrl-C cancels the run
    where = f" --store {store_url}" if store_url else ""
    current.resumable(agent.interrupt, lambda run_id: f"`thinkloop runs resume {run_id}{where}`")


def print_error(console: Console, exc: BaseException) -> int:
    """One line on stderr: `error: <what happened and what to do>` (never a traceback); returns the exit
    code: 2 for a usage mistake (`UserError`), else 1."""
    console.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)
    return 2 if isinstance(exc, UserError) else 1


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
    view = LiveView(console)
    show = Printer(view, as_json)
    agent = build_agent(
        model,
        budget=budget,
        instructions=instructions,
        store_url=store_url,
        console=console,
        on_event=show,
        **options,
    )
    resumable_on_ctrl_c(agent, store_url)
    try:
        async for _ in agent.stream(goal, metadata={"cli": cli_metadata(options, instructions)}):
            pass  # `show` renders each event as it is emitted (see `Printer`)
        await agent.wait_for_learning()  # the process ends with the run: learn before it does
    except StateError as exc:
        raise with_resume_command(exc, store_url) from exc
    finally:
        view.close()
        await _close(agent)
    return show.exit_code(saved=kept(agent))


def with_resume_command(exc: StateError, store_url: str | None) -> StateError:
    """A store failure that stopped a run unfinished, with the command that resumes it (the run's error
    names `agent.resume()`, Python's). A run stopped so carries its state (`exc.state`): its first save was
    made. One that failed at its first save carries none — nothing to resume — and is left as it is, as is
    a run that ended (its final state not saved)."""
    state = exc.state
    if state is None or state.finished:
        return exc
    where = f" --store {store_url}" if store_url else ""
    return StateError(
        f"{exc}; from the command line: thinkloop runs resume {state.run_id}{where}", state=state
    )


def kept(agent: Agent) -> bool:
    """Whether the agent's runs outlive the process (a store that is not in memory)."""
    from ..stores import MemoryStore

    return agent.store is not None and not isinstance(agent.store, MemoryStore)


def cli_metadata(options: dict[str, Any], instructions: str) -> dict[str, Any]:
    """What `thinkloop runs resume` rebuilds the agent from (`state.metadata["cli"]`); paths are absolute."""
    hosts = options["hosts"]
    return {
        "tools": options["tools"],
        "instructions": instructions,
        "workspace": str(Path(options["workspace"]).resolve()),
        "safety": options["safety"],
        "mcp": list(options["mcp"]),
        "hosts": str(Path(hosts).resolve()) if hosts is not None else None,
        "learn": bool(options.get("learn")),
        **this_process(),  # the process running it: `runs resume` refuses to run it twice at once
    }


class Printer:
    """The agent's event sink: JSON lines or the live view.

    It is called as each event is emitted, inside the run, so an event is on screen before what follows
    it happens — the approval prompt comes after its `approval_requested` line, with the spinner stopped,
    and the `done` event of a run cancelled by Ctrl-C is still shown. It remembers the `done` event.
    """

    def __init__(self, view: LiveView, as_json: bool) -> None:
        self.view = view
        self.as_json = as_json
        self.done: Done | None = None
        self.broken = False
        self.failed: OSError | ValueError | None = None  # stdout could not be written (a full disk …)
        self.run_id = ""

    def __call__(self, event: Event) -> None:
        self.run_id = event.run_id
        if isinstance(event, Done):
            self.done = event
        if self.broken:
            return
        try:
            if self.as_json:
                sys.stdout.write(json_for_stdout(event.model_dump_json()) + "\n")
                sys.stdout.flush()
            else:
                self.view(event)
        except (BrokenPipeError, SystemExit):  # rich raises SystemExit(1) when stdout's reader is gone
            # `thinkloop run … | head`: stop printing and let the run finish (its exit code still counts)
            self.broken = True
            stdout_to_devnull()
        except (OSError, ValueError) as exc:  # `> /dev/full`, an I/O error, a closed stdout: never raise
            # into the run (its listener would be dropped, with a traceback, and `done` never seen here)
            self.broken = True
            self.failed = exc
            stdout_to_devnull()

    def exit_code(self, saved: bool) -> int:
        """The run's exit code (`exit_code`); if its output could not be written, says so on stderr and
        returns 1 (or the run's own code when that is not 0): what was printed is incomplete."""
        code = exit_code(self.done)
        if self.failed is None:
            return code
        reason = describe_os_error(self.failed) if isinstance(self.failed, OSError) else str(self.failed)
        ended = f"ended with {self.done.result.stop_reason.value}" if self.done else "stopped"
        where = f"`thinkloop runs show {self.run_id}` shows it" if saved else "nothing outlives the process"
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(
                f"error: could not write the output to stdout ({reason}): run {self.run_id} went on "
                f"and {ended}, but what was printed is incomplete; {where}\n"
            )
            sys.stderr.flush()
        return code or 1


async def load_model(spec: str | None, console: Console) -> Model:
    """Resolve the model; a model that loads slowly (the local one) loads here, behind a progress spinner.

    A file the spec names that cannot be read (`script:DIR`, `script:` with no name) is a usage error, and
    so is an empty `--model ""` (it would silently mean the default, the local model)."""
    if spec is not None and not spec.strip():
        raise ConfigurationError(
            f"--model is empty ({spec!r}): name a model — local, openai:MODEL, router:A,B, script:FILE — "
            "or leave the option out for $THINKLOOP_MODEL, else the local model"
        )
    variable = os.environ.get(MODEL_VARIABLE, "").strip() if spec is None else ""
    try:  # the variable passed as the spec: its errors are worded for the CLI below
        model = resolve_model(spec if spec is not None else variable or None)
    except OSError as exc:
        what = f"${MODEL_VARIABLE}={variable!r}" if variable else repr(spec)
        raise ConfigurationError(f"cannot read the model {what}: {describe_os_error(exc)}") from None
    except ConfigurationError as exc:
        if not variable:
            raise
        raise ConfigurationError(  # the user typed no model: say where this one came from
            f"{exc} (the model came from ${MODEL_VARIABLE}={variable!r}: fix or unset the variable, or "
            "give --model)"
        ) from None
    load = getattr(model, "load", None)
    if load is not None:
        await _load(model.spec, load, console)
    return model


class _LoadStopped(Exception):
    """Raised in the loading thread, at its next progress report, once the command was cancelled."""


async def _load(spec: str, load: Callable[..., Coroutine[Any, Any, None]], console: Console) -> None:
    """`await load(progress)` behind a spinner that shows the progress; Ctrl-C stops the loading itself.

    The load runs in a worker thread, which cancelling the command does not stop: the process waited for
    it at exit — a first use assembling a gigabyte of weights held a Ctrl-C for as long as that took. Its
    next progress report (every few megabytes) now ends it, and it removes what it had written.
    """
    stopped = threading.Event()
    title = f"Loading {spec} (first use assembles and maps the weights)"

    def progress(stage: str, done: int, total: int) -> None:
        if stopped.is_set():
            raise _LoadStopped
        if stage != "load" and total:
            status.update(f"{title}: {stage} {100 * done // total}%…")

    with console.status(f"{title}…") as status:
        try:
            await load(progress)
        except asyncio.CancelledError:
            stopped.set()
            raise


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
    hosts: Path | None = None,
    on_event: EventSink | None = None,
    learn: bool = False,
    trace: Path | None = None,
) -> Agent:
    """The agent the CLI runs: built-in tools, a safety controller asking at the terminal, a store, MCP."""
    from ..tools import builtin_tools

    _use_daemon_threads()
    names = [n.strip() for n in tools.split(",") if n.strip()]
    kwargs: dict[str, Any] = {}
    if mcp:
        from ..mcp import MCPServerStdio

        kwargs["mcp_servers"] = [MCPServerStdio.from_command_line(cmd) for cmd in mcp]
    if learn:
        from ..experience import LessonBook, default_lessons_path

        kwargs["experience"] = LessonBook(default_lessons_path())
    if trace is not None:
        on_event = _with_tracing(on_event, trace)
    return Agent(
        model,
        tools=builtin_tools(names, root=workspace, hosts=load_hosts(hosts)),
        instructions=instructions,
        budget=budget,
        mode=mode,  # type: ignore[arg-type]
        safety=_safety(safety, yes, console),
        store=_store(store_url),
        on_event=on_event,
        **kwargs,
    )


def _with_tracing(sink: EventSink | None, path: Path) -> EventSink:
    """`sink`, plus an OpenTelemetry trace of the run written to `path` as JSON lines."""
    from ..tracing import OpenTelemetryTracing, json_lines_provider

    tracing = OpenTelemetryTracing(json_lines_provider(str(path)))

    def both(event: Event) -> None:
        tracing(event)
        if sink is not None:
            sink(event)

    return both


class _DaemonThreads(concurrent.futures.ThreadPoolExecutor):
    """An executor running each job in its own daemon thread, and not waiting for them on shutdown.

    The approval prompt reads the terminal in a worker thread (`asyncio.to_thread`); after Ctrl-C at the
    prompt that read never returns, and the default executor would keep the process alive until Enter.
    """

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def work() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                future.set_exception(exc)

        threading.Thread(target=work, name="thinkloop-cli-worker", daemon=True).start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        pass


def _use_daemon_threads() -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # called outside the CLI's event loop: nothing to do
        return
    loop.set_default_executor(_DaemonThreads())


def load_hosts(path: Path | None) -> dict[str, Any] | None:
    """The `--hosts` file: a JSON object mapping host names to `SSHHost` fields."""
    if path is None:
        return None
    from pydantic import ValidationError

    from ..tools import SSHHost

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigurationError(f"cannot read the hosts file {str(path)!r}: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigurationError(f"hosts file {str(path)!r} is not valid JSON: {exc}") from None
    except RecursionError:  # `[[[[…]]]]`: json raises it, not a ValueError, past Python's recursion limit
        raise ConfigurationError(f"hosts file {str(path)!r} is nested too deeply to read as JSON") from None
    if not isinstance(data, dict) or not data:
        raise ConfigurationError(
            f'hosts file {str(path)!r} must hold a JSON object: {{"web1": {{"hostname": "10.0.0.5"}}}}'
        )
    hosts: dict[str, Any] = {}
    for name, fields in data.items():
        try:
            hosts[str(name)] = SSHHost.model_validate(fields)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join([str(name), *(str(p) for p in err["loc"])])
            raise ConfigurationError(f"hosts file {str(path)!r}: {where}: {err['msg']}") from None
    return hosts


def _safety(mode: str, yes: bool, console: Console) -> Any:
    from ..safety import SafetyController, SafetyMode, SafetyPolicy

    try:
        policy = SafetyPolicy(mode=SafetyMode(mode))
    except ValueError:
        raise ConfigurationError(
            f"the safety mode must be strict, balanced or permissive, not {mode!r}"
        ) from None
    return SafetyController(policy, approval=_terminal_approval(console, yes))


UNSEEN = (
    "nobody could be asked: stdout and stderr are not a terminal, so the question would not have been "
    "seen (the user can pass --yes to approve such calls)"
)


def _terminal_approval(console: Console, yes: bool) -> Any:
    """The approval prompt, asked where the person at the terminal sees it: with the live view (`console`)
    when that is a terminal, else on stderr — `thinkloop run … > out.txt` (or `| tee`, `| head`) wrote the
    question into the file and waited for an answer nobody could give. With neither a terminal, a call
    needing approval is denied, as without a terminal at all."""
    from ..safety import ApprovalDecision, ApprovalRequest, console_approval

    if yes:
        return console_approval(assume_yes=True)
    if not _is_tty(console):
        console = Console(stderr=True)
    if _is_tty(console) or not _is_tty(sys.stdin):  # no terminal at all: console_approval denies
        return console_approval(console)

    async def unseen(request: ApprovalRequest) -> ApprovalDecision:
        return ApprovalDecision.deny(UNSEEN)

    return unseen


def _is_tty(stream: Console | Any) -> bool:
    """Whether the stream (a console's file) is a terminal."""
    try:
        return bool((stream.file if isinstance(stream, Console) else stream).isatty())
    except (AttributeError, OSError, ValueError):  # a closed stream
        return False


def _store(url: str | None) -> Any:
    return open_store_named(url)


def open_store_named(url: str | None) -> Any:
    """`open_store(url)`; a bad URL that came from `$THINKLOOP_STORE` (no `--store`) says so."""
    from ..stores import open_store

    variable = os.environ.get(STORE_VARIABLE, "") if not url else ""
    try:
        return open_store(url)
    except ConfigurationError as exc:
        if not variable.strip():
            raise
        raise ConfigurationError(
            f"{exc} (the store came from ${STORE_VARIABLE}={variable!r}: fix or unset the variable, or "
            "give --store)"
        ) from None


async def _close(agent: Agent) -> None:
    aclose = getattr(agent, "aclose", None)
    if aclose is not None:
        await aclose()
    store = agent.store
    if store is not None and hasattr(store, "aclose"):
        await store.aclose()
