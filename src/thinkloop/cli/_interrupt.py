"""Ctrl-C during a command that runs an agent (`run`, `runs resume`).

asyncio's own handling cancels the main task on the first SIGINT and raises `KeyboardInterrupt` wherever
the program is on the second — possibly in the middle of saving the cancelled run, ending the process by
the signal (exit status -2, a traceback at times). Instead:

1. the first SIGINT interrupts the run (`Agent.interrupt`): it stops at once and is saved unfinished, so
   `thinkloop runs resume` continues it — or, with an in-memory store (nothing outlives the process) or
   before the run started, cancels the command's task;
2. the second, while that is under way, only says so (the save takes a moment);
3. the third exits at once with 130 — the run keeps its last checkpoint.

SIGTERM (`kill`, a service manager, a container stopping) and SIGHUP (the terminal closed) are handled
the same way — the default action would kill the process with the run at its last checkpoint and leave a
running `shell` command behind — and the exit code is 128 + the first signal's number (143, 129).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from types import FrameType, TracebackType
from typing import Any, TypeVar

T = TypeVar("T")

EXIT_CODE = 130  # 128 + SIGINT
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupts:
    """Installs the SIGINT handler for the `with` block; `run(coro)` is the task the first Ctrl-C cancels,
    unless the command said how to interrupt its run (`resumable`)."""

    current: Interrupts | None = None  # the handler of the command being run

    def __init__(self) -> None:
        self.count = 0
        self.signum = signal.SIGINT  # the first signal received
        self._task: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._previous: dict[int, Any] = {}
        self._interrupt: Callable[[], list[str]] | None = None
        self.resume_hint = ""  # what to type to continue the interrupted run (empty: it was cancelled)
        self._hint: Callable[[str], str] = str

    def resumable(self, interrupt: Callable[[], list[str]], hint: Callable[[str], str]) -> None:
        """Ctrl-C calls `interrupt()` (e.g. `agent.interrupt`) instead of cancelling; `hint(run_id)` says
        how to continue the run."""
        self._interrupt, self._hint = interrupt, hint

    def __enter__(self) -> Interrupts:
        self._previous = {signum: signal.signal(signum, self._handle) for signum in SIGNALS}
        Interrupts.current = self
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # once interrupted, the command is ending with 130: a late Ctrl-C must not raise KeyboardInterrupt
        # in its last lines (a traceback, or death by the signal)
        for signum, previous in self._previous.items():
            signal.signal(signum, signal.SIG_IGN if self.count else previous)
        Interrupts.current = None

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self.count:  # Ctrl-C while the event loop was starting: nothing ran, nothing to save
            coro.close()
            raise asyncio.CancelledError
        self._task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        try:
            return await coro
        finally:
            self._task = None

    @property
    def exit_code(self) -> int:
        """130 after Ctrl-C; 128 + the signal's number after another signal (143 for SIGTERM)."""
        return 128 + int(self.signum)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.count == 1:
            self.signum = signal.Signals(signum)
            if self._task is None or self._loop is None:  # before the task started: `run` stops at once
                return  # (raising here could break the event loop being built, with a traceback)
            stopped = self._interrupt() if self._interrupt is not None else []
            if stopped:  # saved unfinished: resumable
                self.resume_hint = self._hint(stopped[0])
            else:
                self._task.cancel()  # as asyncio.Runner does: at once, then wake the loop up
            self._loop.call_soon_threadsafe(lambda: None)
        elif self.count == 2:
            _say(
                "stopping: the run is being saved (Ctrl-C once more quits at once, keeping its last checkpoint)"
            )
        else:
            _say("quit")
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
            os._exit(self.exit_code)


def _say(text: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
