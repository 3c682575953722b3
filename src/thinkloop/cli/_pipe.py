"""Output to a reader that went away: `thinkloop runs list | head -1`.

A closed pipe is how a reader says it has read enough. A command that only prints (`runs list`, `show`,
`replay`, `export`) then ends quietly with exit 0, as `git log | head -1` does — before, click turned the
`BrokenPipeError` into exit 1, and rich's console into `SystemExit(1)`. A command that runs an agent
(`run`, `runs resume`) stops printing and lets its run finish (`Printer` in `_run.py`).
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import io
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import typer

from ._console import Console
from ._fail import describe_os_error


def stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush does not fail on the closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


class Output(Console):
    """A console on stdout whose closed pipe raises `BrokenPipeError` (rich exits with 1 instead)."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError(errno.EPIPE, "the reader of stdout went away")


@contextmanager
def until_the_reader_leaves() -> Iterator[None]:
    """Print in the block; a reader that closed stdout ends the command at once with exit 0."""
    try:
        yield
        sys.stdout.flush()  # what is still buffered: its broken pipe is caught here, not at exit
    except BrokenPipeError:
        stdout_to_devnull()
        raise typer.Exit(0) from None
    except OSError as exc:  # `> /dev/full`, an I/O error: the output is incomplete, and that is an error
        stdout_to_devnull()  # (the interpreter's last flush would fail again)
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(
                f"error: could not write the output to stdout ({describe_os_error(exc)}): what was printed "
                "is incomplete; write it to another place (a disk with free space, a file with -o for export)\n"
            )
            sys.stderr.flush()
        raise typer.Exit(1) from None


# ============================================================================== unbuffered output


def whole_writes() -> None:
    """Under `python -u` or `PYTHONUNBUFFERED=1` (set in many container images) stdout and stderr write
    straight to the raw file, and when the system takes only part of a write (a pipe whose reader is
    slower, a socket) the text layer drops the rest: `thinkloop runs list --json | jq` read a JSON line cut
    in the middle, with exit code 0. Such a stream gets a buffered layer, which writes everything, flushed
    at each line and each `flush()` — the output still comes as it is printed."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, io.TextIOWrapper) and isinstance(stream.buffer, io.RawIOBase):
            try:  # a file of its own on the descriptor: closing the old stream (sys.__stdout__) leaves it open
                raw: io.RawIOBase = io.FileIO(stream.fileno(), "w", closefd=False)
            except OSError:  # no descriptor: the same raw stream
                raw = stream.buffer
            whole = io.TextIOWrapper(
                io.BufferedWriter(raw), encoding=stream.encoding, errors=stream.errors, line_buffering=True
            )
            setattr(sys, name, whole)


# ====================================================================== stdout in another encoding

_NON_ASCII = re.compile(r"[^\x00-\x7f]")


def is_utf8(stream: object) -> bool:
    """Whether a text stream encodes UTF-8 (one without an encoding is taken to)."""
    encoding = getattr(stream, "encoding", None)
    try:
        return not encoding or codecs.lookup(encoding).name == "utf-8"
    except LookupError:
        return False


def replace_what_stdout_cannot_encode() -> None:
    """On a stdout whose encoding is not UTF-8 (a latin-1 locale, `PYTHONIOENCODING=ascii`), a character the
    encoding lacks is printed as `?`: the live view's first `·` failed the output ("could not write the
    output to stdout (… codec can't encode …)", exit 1 for a run that answered). JSON lines escape such
    characters instead (`json_for_stdout`); stderr has Python's `backslashreplace` already."""
    stream = sys.stdout
    if isinstance(stream, io.TextIOWrapper) and not is_utf8(stream):
        stream.reconfigure(errors="replace")


def json_for_stdout(text: str) -> str:
    """JSON text as stdout can carry it: unchanged on a UTF-8 stdout; on another, every non-ASCII character
    as a `\\uXXXX` escape — the same JSON value for any reader, where printing it failed (or would turn it
    into `?`)."""
    if is_utf8(sys.stdout):
        return text
    return _NON_ASCII.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # outside the BMP: a UTF-16 surrogate pair, as JSON writes it
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
