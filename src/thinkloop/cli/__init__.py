"""The `thinkloop` command line: `run` a goal, inspect, resume and replay `runs`, `serve` a web page."""

from __future__ import annotations

import sys

import typer

from ._fail import report_unexpected
from ._run import run_command

app = typer.Typer(
    name="thinkloop",
    help='thinkloop — an engine for LLM agents. `thinkloop run "GOAL"` runs an agent on the embedded local model.',
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.command("run")(run_command)


@app.callback()
def _root() -> None:
    """thinkloop — an engine for LLM agents."""


def _add_runs() -> None:
    try:
        from ._runs import runs_app
    except ImportError:  # the store sub-package is optional at import time
        return
    app.add_typer(runs_app, name="runs", help="List, inspect, resume, replay and export saved runs.")


_add_runs()


def _add_workers() -> None:
    from ._worker import submit_command, worker_command

    app.command("worker")(worker_command)
    app.command("submit")(submit_command)


_add_workers()


def _add_serve() -> None:
    from ._serve import serve_command

    app.command("serve")(serve_command)


_add_serve()


def main() -> None:
    """Entry point of the `thinkloop` script: an error no command handled ends in one paragraph, exit 1."""
    try:
        app()
    except Exception as exc:  # the commands map thinkloop's errors; this is an OS error or a bug
        sys.exit(report_unexpected(exc))
