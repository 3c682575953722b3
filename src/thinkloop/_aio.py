"""The event loop of thinkloop's own entry points (`run_sync`, the CLI, `thinkloop serve`, workers).

uvloop when it is installed (`pip install "thinkloop[fast]"`): with a thousand concurrent runs a step
executes ~9 % fewer instructions than on asyncio's loop (`benchmarks/overhead.py`, benchmarks/README.md).
`THINKLOOP_EVENT_LOOP=asyncio` keeps asyncio's loop. Code that runs its own loop (`await agent.run(...)`
in an application) runs on whatever loop that is: thinkloop works the same on both.

While an entry point's loop runs, the garbage collector's young generation is collected every
`YOUNG_THRESHOLD` new container objects instead of Python's 700 — unless the application set its own
thresholds (`gc.set_threshold`), or `THINKLOOP_GC=python` keeps Python's. With a thousand runs in flight
every run's history is live, and each collection walks what survived the last ones: at 700 the collector
took 12-20 % of the time of 1,000 concurrent runs (benchmarks/README.md). Only cycles of garbage wait
longer for it (everything else is freed when its last reference goes); Python's thresholds are back when
the last entry point's loop ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import threading
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")

ENV = "THINKLOOP_EVENT_LOOP"
GC_ENV = "THINKLOOP_GC"
YOUNG_THRESHOLD = 50_000  # a young pass over 50,000 objects takes ~1.5 ms here
PYTHON_THRESHOLDS = (700, 10, 10)  # CPython's defaults: anything else was the application's choice


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's `new_event_loop` when installed and not declined; None means asyncio's loop."""
    choice = os.environ.get(ENV, "").strip().lower() or "auto"
    if choice == "asyncio":
        return None
    if choice not in ("auto", "uvloop"):
        from ._errors import ConfigurationError

        raise ConfigurationError(f"{ENV}={choice!r}: use auto (uvloop when installed), uvloop or asyncio")
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            from ._errors import ConfigurationError

            raise ConfigurationError(
                f'{ENV}=uvloop but uvloop is not installed: pip install "thinkloop[fast]"'
            ) from None
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on the entry points' loop, with their collector thresholds (module docstring)."""
    try:
        factory = loop_factory()
        tune = _tunes_collector()
    except BaseException:
        main.close()  # never started: closed, so that it is not reported as never awaited
        raise
    with _collector(tune):
        if factory is None:
            return asyncio.run(main)
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(main)


def _tunes_collector() -> bool:
    choice = os.environ.get(GC_ENV, "").strip().lower() or "auto"
    if choice not in ("auto", "python"):
        from ._errors import ConfigurationError

        raise ConfigurationError(
            f"{GC_ENV}={choice!r}: use auto (a young-generation threshold of {YOUNG_THRESHOLD:,} while "
            "thinkloop's loop runs) or python (Python's garbage collector thresholds, untouched)"
        )
    return choice == "auto"


_lock = threading.Lock()
_active = 0  # entry-point loops running now (run_sync may run in several threads at once)
_raised = False  # whether the first of them raised the threshold (so the last one puts it back)


@contextlib.contextmanager
def _collector(tune: bool) -> Iterator[None]:
    """The young-generation threshold raised while the first to the last overlapping loop run (when
    Python's defaults are in place: an application's own thresholds are left as they are)."""
    global _active, _raised
    with _lock:
        if _active == 0:
            _raised = tune and gc.get_threshold() == PYTHON_THRESHOLDS
            if _raised:
                gc.set_threshold(YOUNG_THRESHOLD, *PYTHON_THRESHOLDS[1:])
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0 and _raised:
                _raised = False
                if gc.get_threshold() == (YOUNG_THRESHOLD, *PYTHON_THRESHOLDS[1:]):  # else changed since
                    gc.set_threshold(*PYTHON_THRESHOLDS)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new loop of the entry points' kind (for a loop driven from its own thread)."""
    factory = loop_factory()
    return asyncio.new_event_loop() if factory is None else factory()


# ---------------------------------------------------------------------- what belongs to one event loop


class PerLoop(Generic[T]):
    """One `T` per running event loop, made by `make()` on first use there: connections, pools and their
    locks belong to the loop that made them (agents in several threads, each `run_sync` with its own loop,
    may share the object holding them). Forgotten with the loop."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = weakref.WeakKeyDictionary()

    def get(self) -> T:
        """The running event loop's `T` (made now if it has none)."""
        loop = asyncio.get_running_loop()
        found = self._by_loop.get(loop)
        if found is None:
            found = self._by_loop[loop] = self._make()
        return found

    def current(self) -> T | None:
        """The running event loop's `T` if it has one (None outside a loop)."""
        try:
            return self._by_loop.get(asyncio.get_running_loop())
        except RuntimeError:
            return None


async def closed_with_the_loop(close: Callable[[], Awaitable[None]]) -> AsyncGenerator[None, None]:
    """A started async generator that awaits `close()` when the running event loop shuts down (`asyncio.run`
    and `asyncio.Runner` finalise their loop's async generators before closing it). Keep it referenced:
    collected early, it would close at once."""

    async def held() -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            await close()

    lifetime = held()
    await anext(lifetime)
    return lifetime


# ===================================================================================== abandoning


CANCEL_GRACE = 1.0  # seconds a cancelled tool invocation gets to clean up before it is abandoned
