"""Child process of tests/test_distributed.py: a `Worker` taking jobs until the queue is empty.

    python tests/worker_agent.py DSN EFFECTS LEASE NAME

Each job's model (by turn): call `record` (not idempotent) with the goal as tag, then `mark` (idempotent),
then answer. Tools append `name:tag:worker` to EFFECTS. With KILL_IN_RECORD=GOAL the process kills
itself with SIGKILL inside `record` for that goal, after its effect (a crash mid-run); with
KILL_IN_MARK=GOAL, inside `mark` — which, being idempotent, is re-run on every resume: it kills every
worker that takes the job (a poison run). With KILL_BEFORE_SAVE=GOAL, the process kills itself before
that goal's run is first saved (in the agent's learner, which it asks for lessons first): every time.
With SLOW_MARK=SECONDS, `mark` writes `mark-start:tag:worker` and sleeps that long first. MAX_ATTEMPTS sets the queue's `max_attempts`.
With START_BARRIER=DIR:N the worker creates DIR/NAME once its queue and store are open, then waits (up to
60 s) until N workers have done so before it takes a job: processes that start at different speeds on a
busy machine then share the work.
SIGTERM stops the worker the way `thinkloop worker`'s second signal does: its runs are interrupted and
their jobs handed back at once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from thinkloop import Agent, tool
from thinkloop.distributed import JobQueue, Worker
from thinkloop.stores import PostgresStore
from thinkloop.testing import FunctionModel

DSN, EFFECTS, LEASE, NAME = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]


def effect(line: str) -> None:
    with open(EFFECTS, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


@tool
def record(tag: str) -> str:
    """Record a tag (a side effect: never twice)."""
    effect(f"record:{tag}:{NAME}")
    if os.environ.get("KILL_IN_RECORD") == tag:
        os.kill(os.getpid(), signal.SIGKILL)
    return f"recorded {tag}"


@tool(idempotent=True)
async def mark(tag: str) -> str:
    """Mark a tag (idempotent)."""
    slow = float(os.environ.get("SLOW_MARK", "0"))
    if slow:
        effect(f"mark-start:{tag}:{NAME}")
    await asyncio.sleep(slow)
    effect(f"mark:{tag}:{NAME}")
    if os.environ.get("KILL_IN_MARK") == tag:
        os.kill(os.getpid(), signal.SIGKILL)
    return f"marked {tag}"


class Learner:
    """Gives no lessons; kills the process when asked about KILL_BEFORE_SAVE's goal."""

    async def recall(self, task: str, *, limit: int = 3) -> list[str]:
        if os.environ.get("KILL_BEFORE_SAVE") == task:
            effect(f"recall:{task}:{NAME}")
            os.kill(os.getpid(), signal.SIGKILL)
        return []

    async def learn(self, record: object) -> None:
        return None


def reply(request):  # type: ignore[no-untyped-def]
    goal = request.messages[1].content
    if request.turn == 0:
        return {"tool_calls": [{"name": "record", "args": {"tag": goal}}]}
    if request.turn == 1:
        return {"tool_calls": [{"name": "mark", "args": {"tag": goal}}]}
    return f"done {goal}"


def _barrier(spec: str | None) -> None:
    if not spec:
        return
    where, count = spec.rsplit(":", 1)
    folder = Path(where)
    (folder / NAME).touch()
    for _ in range(600):
        if len(list(folder.iterdir())) >= int(count):
            return
        time.sleep(0.1)
    raise SystemExit(f"worker {NAME}: the other workers never started")


async def main() -> None:
    attempts = int(os.environ.get("MAX_ATTEMPTS", "3"))
    async with JobQueue(DSN, lease=LEASE, max_attempts=attempts) as queue, PostgresStore(DSN) as store:
        agent = Agent(FunctionModel(reply), tools=[record, mark], store=store, experience=Learner())
        worker = Worker(agent, queue, name=NAME, concurrency=2, poll_interval=0.05)
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: worker.stop(interrupt=True))
        await asyncio.to_thread(_barrier, os.environ.get("START_BARRIER"))
        await worker.serve(until_idle=True)
        print(",".join(worker.completed))


asyncio.run(main())
