"""The Celery app of tests/test_celery.py: imported by its `celery worker` subprocesses (`-A celery_agent`)
and by the tests themselves (to submit runs).

Configured by the environment: TL_BROKER (broker URL), TL_QUEUE (the test's own queue), TL_DSN (the
PostgreSQL store), TL_EFFECTS (a file the tools append their effects to), TL_SLOW (seconds the first
`slow` call of a run sleeps), TL_VISIBILITY (Redis visibility timeout, seconds), TL_KILL (a goal whose
`slow` call kills its process with SIGKILL, every time: a poison run), TL_MAX_ATTEMPTS (the task's
`max_attempts`), TL_KILL_MAKE (when set, `make_agent()` kills its process with SIGKILL), TL_STORE_TIMEOUT
(the store's `timeout`, seconds), TL_STORE_RETRY_DELAY (the task's `store_retry_delay`), TL_SLOW_UNTIL (a
file: the first `slow` call of a run waits until it exists, instead of sleeping TL_SLOW seconds).

Each run's model (by turn): call `record` (not idempotent) with the goal as tag, then `slow` (idempotent),
then answer `done <goal>`. Effects are lines `tool:tag:pid`; `slow` writes `slow-start:tag:pid` first,
and sleeps TL_SLOW seconds only the first time it is called for a tag (so a resumed run goes on at once).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

from celery import Celery

from thinkloop import Agent, tool
from thinkloop.celery import AgentTask, agent_task
from thinkloop.stores import PostgresStore
from thinkloop.testing import FunctionModel

BACKEND = "redis://127.0.0.1:6379/0"


def effect(name: str, tag: str) -> None:
    with open(os.environ["TL_EFFECTS"], "a", encoding="utf-8") as f:
        f.write(f"{name}:{tag}:{os.getpid()}\n")
        f.flush()
        os.fsync(f.fileno())


@tool
def record(tag: str) -> str:
    """Record a tag (a side effect: never twice)."""
    effect("record", tag)
    return f"recorded {tag}"


def called_before(name: str, tag: str) -> bool:
    path = Path(os.environ["TL_EFFECTS"])
    return path.exists() and f"{name}:{tag}:" in path.read_text()


@tool(idempotent=True)
async def slow(tag: str) -> str:
    """Take a while (safe to repeat)."""
    first = not called_before("slow-start", tag)
    effect("slow-start", tag)
    if os.environ.get("TL_KILL") == tag:
        os.kill(os.getpid(), signal.SIGKILL)
    if first and os.environ.get("TL_SLOW_UNTIL"):
        await asyncio.to_thread(appears, Path(os.environ["TL_SLOW_UNTIL"]))
    elif first:
        await asyncio.sleep(float(os.environ.get("TL_SLOW", "0")))
    effect("slow", tag)
    return f"slept on {tag}"


def appears(path: Path, timeout: float = 120) -> None:
    """Wait until the test creates `path` (its signal to go on)."""
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def reply(request: Any) -> Any:
    goal = request.messages[1].content
    if request.turn == 0:
        return {"tool_calls": [{"name": "record", "args": {"tag": goal}}]}
    if request.turn == 1:
        return {"tool_calls": [{"name": "slow", "args": {"tag": goal}}]}
    return f"done {goal}"


def make_agent() -> Agent:
    if os.environ.get("TL_KILL_MAKE"):  # a worker that dies before any run is saved: every time
        effect("make", os.environ["TL_KILL_MAKE"])
        os.kill(os.getpid(), signal.SIGKILL)
    store = PostgresStore(os.environ["TL_DSN"], timeout=float(os.environ.get("TL_STORE_TIMEOUT", "30")))
    return Agent(FunctionModel(reply), tools=[record, slow], store=store)


def make_app(broker: str, queue: str, visibility: float | None = None) -> tuple[Celery, AgentTask]:
    app = Celery("thinkloop_tests", broker=broker, backend=BACKEND)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    if visibility is not None:
        app.conf.broker_transport_options = {"visibility_timeout": visibility}
    attempts = int(os.environ.get("TL_MAX_ATTEMPTS", "3"))
    delay = float(os.environ.get("TL_STORE_RETRY_DELAY", "2"))
    return app, agent_task(app, make_agent, name="tests.run", max_attempts=attempts, store_retry_delay=delay)


if "TL_QUEUE" in os.environ:  # a worker process
    _visibility = os.environ.get("TL_VISIBILITY")
    app, run_agent = make_app(
        os.environ["TL_BROKER"], os.environ["TL_QUEUE"], float(_visibility) if _visibility else None
    )
