"""The `thinkloop` command line: `run` a goal, inspect, resume and replay `runs`, `serve` a web page."""

from __future__ import annotations

import io
import os
import sys

import typer

from ._fail import report_unexpected
from ._pipe import replace_what_stdout_cannot_encode, whole_writes
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
    _standard_streams()
    whole_writes()
    replace_what_stdout_cannot_encode()
    _sane_columns()
    try:
        app()
    except Exception as exc:  # the commands map thinkloop's errors; this is an OS error or a bug
        sys.exit(report_unexpected(exc))


def _standard_streams() -> None:
    """Closed standard streams (`thinkloop run … >&-`, a daemon's closed stdin) are /dev/null instead.

    Left closed, the next file or socket the process opens takes their number: uvloop then aborted the
    process (exit status 134) on an assertion, and every print raised on a `None` `sys.stdout`."""
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:  # closed: /dev/null takes its number (the lowest free one)
            devnull = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)
            mode = "r" if fd == 0 else "w"
            stream = open(fd, mode + "b", closefd=False)  # noqa: SIM115 (the process's own, kept open)
            setattr(sys, name, io.TextIOWrapper(stream, errors="replace"))


def _sane_columns() -> None:
    """`COLUMNS=0` (or a width that is not a number) made rich print nothing at all — not the answer, not
    an error, not `--help`; such a value is ignored (the terminal's width, else 80, is used)."""
    columns = os.environ.get("COLUMNS")
    if columns is not None and not (columns.strip().isdigit() and int(columns) > 0):
        del os.environ["COLUMNS"]
