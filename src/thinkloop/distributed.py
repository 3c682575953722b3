"""Scale-out (SPEC §13.4): many runs across processes and machines, on PostgreSQL.

A `JobQueue` holds the goals to run in a PostgreSQL table; any number of `Worker`s, in any number of
processes on any number of machines, take jobs from it with `SELECT … FOR UPDATE SKIP LOCKED` (each job
goes to exactly one worker) and run them with their `Agent`, whose store all workers share (a
`PostgresStore`, or a `SQLiteStore` for processes of one machine).

A worker holds a *lease* on each job it runs and renews it while the run goes on. When a worker dies —
killed, its machine gone — its leases expire and other workers take the jobs over: a run with a
checkpoint is *resumed* from it (`Agent.resume`: a tool call that had completed is never run again; one
that was interrupted is re-run only if its tool is idempotent), a run without one starts over. A worker
that finds it has lost a lease (it was too slow to renew it) stops that run, so a run is never driven by
two workers at once. A run that keeps killing its workers — a tool that crashes the process or runs it
out of memory — is abandoned after `max_attempts` (3): it ends for good with stop reason `error` and a
message saying so, instead of taking every worker down in turn.

    queue = JobQueue("postgresql://user@host/db")
    run_id = await queue.submit("Summarise yesterday's incidents")
    ...                                    # elsewhere, any number of times:
    await Worker(agent, queue).serve()     # agent = Agent(model, tools=..., store=PostgresStore(dsn))
    ...
    result = await queue.wait(run_id, store)

Needs the `postgres` extra (psycopg 3). The table is created on first use.

Errors: a `StateError` from a job's store is either the store failing (unreachable, no answer in time:
another try may pass) or a `CorruptRunError` (a `StateError` too): the run's state is there but cannot be
loaded, and no retry mends it. `Worker` fails such a job at once, and `thinkloop.celery` does not retry it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ._aio import PerLoop
from ._budget import Budget
from ._errors import ConfigurationError, StateError, ThinkloopError, UserError
from .stores._base import DamagedRunError, check_goal, check_id
from .stores._owner import check_not_running
from .stores._postgres import Link, pg_text

if TYPE_CHECKING:
    from ._agent import Agent
    from ._events import RunResult
    from ._state import RunState
    from .stores._base import Store

__all__ = ["Job", "JobQueue", "JobStatus", "Worker", "run_or_resume"]

DEFAULT_MAX_ATTEMPTS = 3
# Keys of `RunState.metadata` written by `run_or_resume`.
ATTEMPTS = "attempts"  # attempts made at the run so far, the current one included
ATTEMPT_STARTED = "attempt_started_at"  # when the current attempt began (time.time())
ABANDONED = "abandoned"  # {"attempts": n, "at": t}: the run was ended after too many attempts

logger = logging.getLogger("thinkloop.distributed")

_MAX_PAUSE = 5.0  # seconds at most between tries when the queue's database fails

JobState = Literal["queued", "running", "done", "failed"]

_NOW = "extract(epoch from clock_timestamp())"  # the database's clock: workers' clocks may disagree

_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS thinkloop_jobs (
        run_id TEXT PRIMARY KEY, goal TEXT NOT NULL, options TEXT NOT NULL, status TEXT NOT NULL,
        worker TEXT, lease_until DOUBLE PRECISION, attempts INTEGER NOT NULL DEFAULT 0,
        stop_reason TEXT, error TEXT, created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS thinkloop_jobs_waiting ON thinkloop_jobs (status, created_at)",
]
_LOCK_KEY = 0x746A6F6273  # "tjobs": the advisory lock taken while creating the table

_CLAIM_SQL = f"""
UPDATE thinkloop_jobs SET status = 'running', worker = %(worker)s, lease_until = {_NOW} + %(lease)s,
    attempts = attempts + 1, updated_at = {_NOW}
WHERE run_id = (
    SELECT run_id FROM thinkloop_jobs
    WHERE status = 'queued' OR (status = 'running' AND lease_until < {_NOW})
    ORDER BY created_at, run_id
    FOR UPDATE SKIP LOCKED
    LIMIT 1)
RETURNING run_id, goal, options, attempts"""


@dataclass(frozen=True, slots=True)
class Job:
    """A job a worker holds: the run to drive and how many times it was taken (1 = the first time)."""

    run_id: str
    goal: str
    attempt: int
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class JobStatus:
    """Where a job is: queued, running (on `worker`), done (with its stop reason) or failed (with `error`)."""

    run_id: str
    status: JobState
    attempts: int
    worker: str | None = None
    stop_reason: str | None = None
    error: str | None = None


class JobQueue:
    """Jobs (goals to run) in a PostgreSQL table, shared by every process that opens the same database.

    Args:
        dsn: a libpq connection string or URL, e.g. `postgresql://user@host:5432/db`.
        lease: seconds a worker holds a job without renewing its lease; after that the job is taken over.
        max_attempts: times a job's run may be started or resumed; a run that ended that many times
            without finishing (its worker died or lost it) is abandoned — ended with stop reason `error`
            — and its job marked failed, so a run that kills its workers cannot kill them all.
        timeout: seconds connecting or one statement may take (a lease renewal: at most a third of the
            lease); past it the connection is shut and the statement fails (a database that does not
            answer never hangs a worker).
    """

    def __init__(
        self,
        dsn: str,
        *,
        lease: float = 30.0,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float = 30.0,
    ) -> None:
        for what, value in (("lease", lease), ("timeout", timeout)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
                meaning = (
                    "how long a worker holds a job without renewing it"
                    if what == "lease"
                    else ("how long connecting or one statement may take")
                )
                raise ConfigurationError(
                    f"{what} must be a positive number of seconds ({meaning}), got {value!r}"
                )
        from .stores._postgres import redacted_dsn

        self.dsn = dsn
        self.url = redacted_dsn(dsn)  # shown in messages: without the password
        self.lease = float(lease)
        self.timeout = float(timeout)
        self.max_attempts = check_max_attempts(max_attempts)
        # a connection per event loop (threads, each with its own, may share a queue)
        self._links = PerLoop(Link)

    async def __aenter__(self) -> JobQueue:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def _conn(self) -> Any:
        """The running event loop's connection, if open (None outside a loop)."""
        link = self._links.current()
        return None if link is None else link.conn

    async def aclose(self) -> None:
        """Close the running event loop's connection (other loops' close with their loop)."""
        await self._links.get().drop()

    async def _execute(
        self, sql: str, params: Any = None, *, seconds: float | None = None
    ) -> list[tuple[Any, ...]]:
        """One statement, within `seconds` (default: the queue's `timeout`; waiting for this process's other
        statements included). A connection kept from earlier that turns out lost (the server restarted, an
        administrator ended it, the network dropped it) is opened again and the statement retried once;
        any other failure is a `ThinkloopError` saying which database failed and what to check."""
        import psycopg

        limit = self.timeout if seconds is None else seconds
        link = self._links.get()
        try:
            async with asyncio.timeout(limit):
                await link.lock.acquire()
        except TimeoutError:
            raise self._no_answer(limit) from None
        try:
            kept = link.conn is not None and not link.conn.closed
            try:
                return await self._statement(link, sql, params, limit)
            except psycopg.OperationalError as exc:
                if isinstance(exc, psycopg.errors.QueryCanceled) or not (kept and link.lost()):
                    raise
                logger.warning("the job queue's connection to %s was lost: connecting again", self.url)
            return await self._statement(link, sql, params, limit)
        except psycopg.errors.QueryCanceled:  # the server gave up at `statement_timeout`: nothing applied
            raise self._no_answer(limit) from None
        except TimeoutError:
            await link.drop()  # shut by `bounded`: the next statement connects again
            raise self._no_answer(limit) from None
        except psycopg.Error as exc:
            link.lost()  # the next statement connects again
            reason = " ".join(str(exc).split())
            raise ThinkloopError(
                f"the job queue's database {self.url} failed: {reason}; check that the server is "
                "running and reachable and that the database and user in the DSN exist"
            ) from exc
        finally:
            link.lock.release()

    def _no_answer(self, seconds: float) -> ThinkloopError:
        return ThinkloopError(
            f"the job queue's database {self.url} did not answer within {seconds:g} s; check that the "
            "server is running and reachable (and not blocked by a lock), or raise JobQueue(timeout=)"
        )

    async def _statement(self, link: Link, sql: str, params: Any, seconds: float) -> list[tuple[Any, ...]]:
        from .stores._postgres import bounded

        limit = max(1, int(seconds * 1000))

        async def statement(conn: Any) -> list[tuple[Any, ...]]:
            if link.limit != limit:  # the server gives up too: a statement cut off here is not
                await conn.execute("SELECT set_config('statement_timeout', %s, false)", (str(limit),))
                link.limit = limit  # applied later, when the lock it waited for is released
            cursor = await conn.execute(sql, params)
            return list(await cursor.fetchall()) if cursor.description is not None else []

        async with asyncio.timeout(seconds):
            conn = await self._connection(link)
        return await bounded(conn, statement, seconds)

    async def _connection(self, link: Link) -> Any:
        if link.conn is None or link.conn.closed:
            try:
                import psycopg
            except ImportError:
                raise ConfigurationError(
                    "JobQueue needs psycopg 3: pip install 'thinkloop[postgres]'"
                ) from None
            conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
                for statement in _SCHEMA:
                    await conn.execute(statement)
            await link.keep(conn)
        return link.conn

    # -------------------------------------------------------------------------------- submitting

    async def submit(
        self,
        goal: str,
        *,
        run_id: str | None = None,
        budget: Budget | None = None,
        metadata: dict[str, Any] | None = None,
        session: str | None = None,
    ) -> str:
        """Queue a goal; returns its run id (the id the run will have in the store)."""
        check_goal(goal)  # the table keeps it as PostgreSQL text: a NUL failed as if the server were down
        run_id = check_id(run_id) if run_id is not None else uuid.uuid4().hex
        if session is not None:
            check_id(session, "session id")  # else the job failed later, on a worker
        options = {
            "budget": budget.as_dict() if budget else None,
            "metadata": metadata or {},
            "session": session,
        }
        rows = await self._execute(
            "INSERT INTO thinkloop_jobs (run_id, goal, options, status, created_at, updated_at) "
            f"VALUES (%s, %s, %s, 'queued', {_NOW}, {_NOW}) ON CONFLICT (run_id) DO NOTHING RETURNING run_id",
            (run_id, goal, json.dumps(options)),
        )
        if not rows:
            raise UserError(f"a job with run id {run_id!r} already exists: pick another id")
        return run_id

    async def status(self, run_id: str) -> JobStatus | None:
        """The job's status, or None if there is no such job."""
        rows = await self._execute(
            "SELECT run_id, status, attempts, worker, stop_reason, error FROM thinkloop_jobs WHERE run_id = %s",
            (run_id,),
        )
        return JobStatus(*rows[0]) if rows else None

    async def jobs(self, status: JobState | None = None, *, limit: int = 100) -> list[JobStatus]:
        """Jobs, the newest first (of one status, or all)."""
        where = "WHERE status = %s" if status else ""
        rows = await self._execute(
            "SELECT run_id, status, attempts, worker, stop_reason, error FROM thinkloop_jobs "
            f"{where} ORDER BY created_at DESC LIMIT %s",
            (status, limit) if status else (limit,),
        )
        return [JobStatus(*row) for row in rows]

    async def wait(self, run_id: str, store: Store, *, poll: float = 0.2) -> RunResult:
        """Wait until the job is done (its result, from `store`) or failed (`ThinkloopError`); bound the
        wait with `async with asyncio.timeout(...)` around it."""
        from ._events import RunResult

        while True:
            status = await self.status(run_id)
            if status is None:
                raise UserError(f"there is no job with run id {run_id!r}")
            if status.status == "failed":
                raise ThinkloopError(f"job {run_id} failed: {status.error}")
            if status.status == "done":
                state = await store.load_state(run_id)
                if state is None:
                    raise ThinkloopError(f"job {run_id} is done but its run is not in {store.url}")
                return RunResult.from_state(state)
            await asyncio.sleep(poll)

    # ------------------------------------------------------------------------------------ workers

    async def claim(self, worker: str) -> Job | None:
        """Take the oldest waiting job — queued, or running on a worker whose lease expired — or None.

        A job taken `max_attempts` times already comes back once more (`attempt == max_attempts + 1`):
        its worker does not run it but ends its run with an error (`run_or_resume` does). If that worker
        dies too, the next claim marks the job failed (and tries the next one).
        """
        while True:
            rows = await self._execute(_CLAIM_SQL, {"worker": worker, "lease": self.lease})
            if not rows:
                return None
            run_id, goal, options, attempts = rows[0]
            if attempts > self.max_attempts + 1:
                error = (
                    f"run {run_id} abandoned: it was taken {attempts - 1} time(s) (max_attempts="
                    f"{self.max_attempts}) without finishing — its workers died or lost it, the last "
                    "one while ending it — and its run may be left unfinished in the store: inspect it "
                    f"with `thinkloop runs show {run_id} --store STORE`, fix the cause, and submit the "
                    "goal again under a new run id"
                )
                await self._fail(run_id, error)
                continue
            job = _job(run_id, goal, options, attempts)
            if isinstance(job, str):  # a row no worker can run: failed now, never handed out again
                logger.error("%s", job)
                await self._fail(run_id, job)
                continue
            return job

    async def _fail(self, run_id: str, error: str) -> None:
        await self._execute(
            f"UPDATE thinkloop_jobs SET status = 'failed', worker = NULL, lease_until = NULL, "
            f"stop_reason = 'error', error = %s, updated_at = {_NOW} WHERE run_id = %s",
            (pg_text(error), run_id),  # an error may quote a tool's output, NULs and all
        )

    async def renew(self, job: Job, worker: str) -> bool:
        """Extend the lease; False when the job is no longer this worker's (another one took it over)."""
        rows = await self._execute(
            f"UPDATE thinkloop_jobs SET lease_until = {_NOW} + %s, updated_at = {_NOW} "
            "WHERE run_id = %s AND worker = %s AND status = 'running' RETURNING 1",
            (self.lease, job.run_id, worker),
            seconds=min(self.timeout, self.lease / 3),
        )
        return bool(rows)

    async def finish(
        self, job: Job, worker: str, *, stop_reason: str | None = None, error: str | None = None
    ) -> bool:
        """Mark the job done (a run ended, with `stop_reason`) or failed (`error`); False if it was not ours."""
        status = "failed" if error is not None else "done"
        rows = await self._execute(
            f"UPDATE thinkloop_jobs SET status = %s, stop_reason = %s, error = %s, worker = NULL, "
            f"lease_until = NULL, updated_at = {_NOW} WHERE run_id = %s AND worker = %s RETURNING 1",
            (status, stop_reason, None if error is None else pg_text(error), job.run_id, worker),
        )
        return bool(rows)

    async def release(self, job: Job, worker: str) -> None:
        """Give a job back to the queue (a worker shutting down before it could finish it)."""
        await self._execute(
            f"UPDATE thinkloop_jobs SET status = 'queued', worker = NULL, lease_until = NULL, "
            f"attempts = greatest(attempts - 1, 0), updated_at = {_NOW} WHERE run_id = %s AND worker = %s",
            (job.run_id, worker),
        )


def _job(run_id: str, goal: object, options: object, attempts: int) -> Job | str:
    """The job of a claimed row, or what is wrong with the row (written to it by something else than
    `submit`: a bad run id, goal or options) — that job fails with the reason instead of crashing workers."""
    parsed = _options(options)
    problem = parsed if isinstance(parsed, str) else None
    try:
        check_id(run_id)
    except UserError as exc:
        problem = str(exc)
    if not (isinstance(goal, str) and goal.strip()):
        problem = f"its goal must be a non-empty string, got {goal!r:.200}"
    if problem is not None or isinstance(parsed, str) or not isinstance(goal, str):
        return (
            f"job {run_id!r} cannot be run: {problem}. Submit the goal again with `JobQueue.submit` "
            "(or `thinkloop submit`)"
        )
    return Job(run_id=run_id, goal=goal, attempt=attempts, options=parsed)


def _options(options: object) -> dict[str, Any] | str:
    """A row's options as `submit` writes them, or what is wrong with them."""
    try:
        parsed = json.loads(options) if isinstance(options, str) else None
    except ValueError as exc:
        return f"its options are not JSON ({exc}): {options!r:.200}"
    except RecursionError:  # `[[[[…]]]]`: every worker that took the job raised it
        return f"its options are not JSON (they nest too deeply to read): {options!r:.200}"
    if not isinstance(parsed, dict):
        return f"its options must be a JSON object (as `JobQueue.submit` writes them), got {options!r:.200}"
    for key, kind in (("budget", dict), ("metadata", dict), ("session", str)):
        if not isinstance(parsed.get(key), kind | None):
            return f"its option {key!r} must be a {kind.__name__} or null, got {parsed.get(key)!r:.200}"
    return parsed


class Worker:
    """Takes jobs from a `JobQueue` and runs them with `agent`, `concurrency` at a time.

    The agent must have a store that every worker shares (so another worker can resume a run this one
    started). `serve()` runs until `stop()` (or, with `until_idle=True`, until the queue is empty).

    Args:
        agent: the agent that runs the jobs (its model, tools, guards, store …).
        queue: where the jobs come from.
        name: this worker's name in the queue (default: host, process id and a random suffix).
        concurrency: jobs run at once by this worker.
        poll_interval: seconds between looks at an empty queue.
    """

    def __init__(
        self,
        agent: Agent,
        queue: JobQueue,
        *,
        name: str | None = None,
        concurrency: int = 4,
        poll_interval: float = 0.5,
    ) -> None:
        if concurrency < 1:
            raise ConfigurationError(f"concurrency must be at least 1, got {concurrency}")
        self.agent = agent
        self.store: Store = shared_store(agent, "a Worker's agent")
        self.queue = queue
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.completed: list[str] = []  # run ids this worker finished
        self._stopping = asyncio.Event()
        self._running: dict[str, asyncio.Task[None]] = {}
        self._runs: dict[str, asyncio.Task[RunResult]] = {}  # each job's run (loading, set up, or running)
        self._reached = False  # whether a claim ever reached the queue's database

    @property
    def stopping(self) -> bool:
        """Whether `stop()` was called."""
        return self._stopping.is_set()

    def stop(self, *, interrupt: bool = False) -> None:
        """Stop taking jobs; `serve()` returns once the running ones end. With `interrupt`, the running
        runs are interrupted instead (saved unfinished) and their jobs go back to the queue at once, for
        another worker to resume."""
        self._stopping.set()
        if interrupt:
            for run_id in list(self._running):
                run = self._runs.get(run_id)
                if not self.agent.interrupt(run_id) and run is not None:
                    run.cancel()  # still loading its state or setting up: nothing of it ran, nothing to save

    async def serve(self, *, until_idle: bool = False) -> None:
        """Take and run jobs until `stop()` (or until nothing is left, with `until_idle`)."""
        pause = self.poll_interval
        try:
            while not self._stopping.is_set():
                try:
                    job = await self._claim()
                except ThinkloopError as exc:
                    if not self._reached:  # never reached: a wrong DSN, no server — say so at once
                        raise
                    # reached before: a restart or a dropped connection; its jobs wait in the database
                    pause = min(max(pause * 2, 0.5), _MAX_PAUSE)
                    logger.warning("%s — taking jobs again in %.1f s", exc, pause)
                    await self._pause(pause)
                    continue
                pause = self.poll_interval
                if job is not None:
                    task = asyncio.create_task(self._drive(job), name=f"thinkloop-job-{job.run_id}")
                    self._running[job.run_id] = task
                    task.add_done_callback(self._forget)
                    continue
                if until_idle and not self._running:
                    return
                await self._pause(self.poll_interval)
        finally:
            if self._running:
                await asyncio.gather(*self._running.values(), return_exceptions=True)

    async def _claim(self) -> Job | None:
        """The next job, if this worker has room for one."""
        if len(self._running) >= self.concurrency:
            return None
        job = await self.queue.claim(self.name)
        self._reached = True
        return job

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stopping.wait()

    def _forget(self, task: asyncio.Task[None]) -> None:
        for run_id, running in list(self._running.items()):
            if running is task:
                del self._running[run_id]

    async def _drive(self, job: Job) -> None:
        """Run (or resume) one job under a renewed lease; the job ends done or failed, or goes back."""
        run = self._runs[job.run_id] = asyncio.create_task(self._run(job))
        run.add_done_callback(lambda _: self._runs.pop(job.run_id, None))
        lease = asyncio.create_task(self._keep_lease(job, run))
        try:
            result = await asyncio.shield(
                run
            )  # a cancelled worker interrupts its runs (below), never ends them
        except asyncio.CancelledError:
            if not run.done():  # this worker is being cancelled: leave the run resumable by another one
                self.agent.interrupt(job.run_id)
                with contextlib.suppress(asyncio.CancelledError):
                    await run
            if not lease.done() or not lease.result():  # interrupted here, not lost to another worker
                await self._settle(self.queue.release(job, self.name))
            raise
        except Exception as exc:  # a failure of the engine, not of the run (those end with a stop reason)
            await self._failed(job, exc)
            return
        finally:
            lease.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await lease
        error = result.error if ABANDONED in result.state.metadata else None  # then the job failed
        stop_reason = result.stop_reason.value
        finished = await self._settle(self.queue.finish(job, self.name, stop_reason=stop_reason, error=error))
        if finished and error is None:
            self.completed.append(job.run_id)

    async def _failed(self, job: Job, exc: Exception) -> None:
        """A job's own fault (a bad option, a corrupt run state) fails it: no attempt could do better.
        Anything else — the store timing out or unreachable, a run row locked by a frozen worker, a bug —
        may pass: the job is left to its lease, and taken again when that runs out, as if this worker had
        died (an attempt counted toward `max_attempts`)."""
        if isinstance(exc, UserError | CorruptRunError):
            logger.error("job %s failed on %s: %s", job.run_id, self.name, exc)
            await self._settle(self.queue.finish(job, self.name, error=f"{type(exc).__name__}: {exc}"))
            return
        logger.error(
            "job %s failed on %s (attempt %d of %d): it will be taken again when its lease runs out",
            job.run_id, self.name, job.attempt, self.queue.max_attempts, exc_info=exc,
        )  # fmt: skip

    async def _run(self, job: Job) -> RunResult:
        options = job.options
        if job.attempt > 1:
            logger.info("job %s taken by %s (attempt %d)", job.run_id, self.name, job.attempt)
        return await run_or_resume(
            self.agent, job.run_id, job.goal, budget=options.get("budget"),
            metadata=options.get("metadata") or None, session=options.get("session"),
            max_attempts=self.queue.max_attempts, attempt=job.attempt,
        )  # fmt: skip

    async def _keep_lease(self, job: Job, run: asyncio.Task[RunResult]) -> bool:
        """Renew the lease every third of it; when it is lost — taken over, or not renewed for a whole
        lease (the database unreachable: another worker may have it by now) — stop the run (True)."""
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(self.queue.lease / 3)
            try:
                ours = await self.queue.renew(job, self.name)
            except Exception as exc:  # the database is unreachable: keep running while the lease lasts
                if time.monotonic() - renewed < self.queue.lease:
                    logger.warning("renewing the lease of job %s failed: %s", job.run_id, exc)
                    continue
                logger.warning(
                    "job %s: its lease could not be renewed for %g s (%s); another worker may have it, "
                    "stopping it here", job.run_id, self.queue.lease, exc,
                )  # fmt: skip
                ours = False
            if not ours:
                if time.monotonic() - renewed < self.queue.lease:
                    logger.warning("job %s was taken over by another worker; stopping it here", job.run_id)
                if not self.agent.interrupt(job.run_id, save=False):  # writes nothing: the run is not ours
                    run.cancel()  # not started yet (loading its state)
                return True
            renewed = time.monotonic()

    async def _settle(self, update: Any) -> bool:
        """A queue update that must not be lost to a cancellation of the worker."""
        try:
            return bool(await asyncio.shield(update))
        except Exception as exc:
            logger.warning("updating the job queue failed: %s", exc)
            return False


# ------------------------------------------------------------------------ shared by every engine's worker


def shared_store(agent: Agent, who: str) -> Store:
    """The agent's store, if every worker can share it (not this process's memory); else a clear error."""
    from .stores._base import Store

    if not isinstance(agent.store, Store) or agent.store.url.startswith("memory:"):
        raise ConfigurationError(f"{who} needs a shared store, e.g. Agent(store=PostgresStore(dsn))")
    return agent.store


def check_max_attempts(value: object) -> int:
    """`max_attempts` if it is a whole number ≥ 1; else a `ConfigurationError` saying what it must be."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(
            f"max_attempts must be a whole number ≥ 1 (how many times a run may be started or resumed "
            f"before it is abandoned; default {DEFAULT_MAX_ATTEMPTS}), got {value!r}"
        )
    return value


async def run_or_resume(
    agent: Agent,
    run_id: str,
    goal: str,
    *,
    budget: Budget | dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    session: str | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    attempt: int | None = None,
) -> RunResult:
    """Drive run `run_id` to its end, whatever became of it before — the body of a job on any queue that
    may deliver a job twice (a worker died, a message was redelivered).

    A run the agent's store has finished is not run again: its result is returned. A run the store has
    unfinished is resumed from its checkpoint (`Agent.resume`: a completed tool call is never re-run).
    A run the store does not have starts (`Agent.run` with this `run_id`, `budget`, `metadata`, `session`).

    Each start or resume is an *attempt*, counted in the run's `metadata["attempts"]` and saved before the
    run goes on, so an attempt whose process dies still counts (one interrupted by its worker's shutdown,
    `Agent.interrupt`, does not). When `max_attempts` attempts have ended without finishing the run, the
    next one does not run it: the run is *abandoned* — ended with stop reason `error` and a message saying
    so — and its result returned. `attempt` is the job system's own count of this delivery, if it keeps
    one (`JobQueue` does): the larger count decides. A state the store cannot load raises `StateError`.
    """
    from ._events import RunResult

    max_attempts = check_max_attempts(max_attempts)
    if attempt is not None and (isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1):
        raise ConfigurationError(f"attempt must be None or a whole number ≥ 1, got {attempt!r}")
    store = shared_store(agent, "running a job: the agent")
    state = await _load(store, check_id(run_id))
    if state is not None and state.finished:
        return RunResult.from_state(state)
    if state is not None:  # a live `thinkloop run` (or serve) on this machine drives it: not twice at once
        check_not_running(run_id, state.metadata, force="`thinkloop runs resume --force`")
    number = max(_next_attempt(state), attempt or 0)
    if number > max_attempts:
        if state is None:  # every attempt died before the run's first checkpoint
            state = _blank_state(agent, run_id, goal, metadata=metadata, session=session)
        return await _abandon(store, state, attempts=number - 1, max_attempts=max_attempts)
    if state is not None:
        state.metadata.update({ATTEMPTS: number, ATTEMPT_STARTED: time.time()})
        await store.checkpoint(state, [])  # counted before it runs: a crash during it still counts
        logger.info("resuming run %s from its checkpoint (step %d, attempt %d)", run_id, state.step, number)
        return await agent.resume(run_id)
    if isinstance(budget, dict):
        try:
            budget = Budget(**budget)
        except TypeError as exc:
            raise ConfigurationError(
                f"run {run_id}: the job's budget {budget!r:.200} is not a budget: {exc}"
            ) from None
    metadata = {**(metadata or {}), ATTEMPTS: number, ATTEMPT_STARTED: time.time()}
    return await agent.run(goal, run_id=run_id, budget=budget, metadata=metadata, session=session)


class CorruptRunError(StateError):
    """The run's state in the store cannot be loaded (the store answered, refusing what it holds): a job
    cannot run it, however often it tries — unlike a `StateError` of the store failing, which may pass.
    Its message says what is wrong and to repair or delete the run, or submit the goal again."""


async def _load(store: Store, run_id: str) -> RunState | None:
    try:
        return await store.load_state(run_id)
    except StateError as exc:
        # the store holds the state but cannot load it (a store of one's own may say so in words only)
        held = isinstance(exc, DamagedRunError) or str(exc).startswith(f"run {run_id!r}")
        if not held:
            raise  # the store failed (unreachable, no answer in time), not the state: that may pass
        what = exc.what if isinstance(exc, DamagedRunError) else str(exc)
        raise CorruptRunError(
            f"{what} — so this job cannot run it: repair or delete the run in {store.url or 'the store'}, "
            "or submit the goal again under a new run id",
            state=exc.state,
        ) from exc


def _next_attempt(state: RunState | None) -> int:
    """The number of the attempt about to start: one more than those made, unless the last one was
    interrupted by its worker (saved unfinished after it began: it handed the run back, it did not die)."""
    if state is None:
        return 1
    made, started = state.metadata.get(ATTEMPTS), state.metadata.get(ATTEMPT_STARTED)
    if isinstance(made, bool) or not isinstance(made, int) or made < 0:
        return 1  # not counted yet (a run started some other way), or not our key
    interrupted = state.metadata.get("interrupted")
    at = interrupted.get("at") if isinstance(interrupted, dict) else None
    if made and isinstance(at, int | float) and isinstance(started, int | float) and at >= started:
        return made
    return made + 1


def _blank_state(
    agent: Agent, run_id: str, goal: str, *, metadata: dict[str, Any] | None, session: str | None
) -> RunState:
    """The state of a run that never reached its first checkpoint (its goal, nothing else)."""
    from ._messages import Message
    from ._state import RunState

    return RunState(
        run_id=run_id, agent_name=agent.name, goal=goal, session=session,
        messages=[Message.user(goal)], metadata=dict(metadata or {}),
    )  # fmt: skip


async def _abandon(store: Store, state: RunState, *, attempts: int, max_attempts: int) -> RunResult:
    """End the run for good with stop reason `error` (and the `error` and `done` events), and save it."""
    from ._events import Done, ErrorEvent, Event, RunResult
    from ._state import StopReason

    where = f" --store {store.url}" if store.url else ""
    message = (
        f"run {state.run_id} abandoned after {attempts} attempt(s) (max_attempts={max_attempts}): each one "
        "ended without finishing — its worker process died (killed, out of memory, a crash in a tool or "
        "a library), lost the run, or could not save it (the store failing: see the workers' logs). Inspect "
        "where it stopped with "
        f"`thinkloop runs show {state.run_id}{where}`, fix the cause, and submit the goal again under a "
        "new run id."
    )
    logger.error("%s", message)
    state.stop_reason, state.answer, state.error, state.phase = StopReason.ERROR, "", message, "error"
    state.ended_at = time.time()
    state.metadata[ABANDONED] = {"attempts": attempts, "at": state.ended_at}
    first = state.event_version + 1
    state.event_version += 2
    result = RunResult.from_state(state)
    events: list[Event] = [
        ErrorEvent(message=message, run_id=state.run_id, seq=first),
        Done(result=result, run_id=state.run_id, seq=first + 1),
    ]
    await store.checkpoint(state, events)
    return result
