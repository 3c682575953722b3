"""The event loop of thinkloop's own entry points (`run_sync`, the CLI, `thinkloop serve`, workers).

uvloop when it is installed (`pip install "thinkloop[fast]"`): with a thousand concurrent runs a step
executes ~9 % fewer instructions than on asyncio's loop (`benchmarks/overhead.py`, benchmarks/README.md).
`THINKLOOP_EVENT_LOOP=asyncio` keeps asyncio's loop. Code that runs its own loop (`await agent.run(...)`
in an application) runs on whatever loop that is: thinkloop works the same on both.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

ENV = "THINKLOOP_EVENT_LOOP"


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
    """`asyncio.run(main)` on the entry points' loop (see the module's docstring)."""
    try:
        factory = loop_factory()
    except BaseException:
        main.close()  # never started: closed, so that it is not reported as never awaited
        raise
    if factory is None:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new loop of the entry points' kind (for a loop driven from its own thread)."""
    factory = loop_factory()
    return asyncio.new_event_loop() if factory is None else factory()
