"""Scale-out (SPEC §13.4): a job queue on the real PostgreSQL server, workers in several processes,
a worker killed mid-run and its run resumed by another without running a side effect twice."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import private_schema
from thinkloop import Agent, ConfigurationError, StopReason, ThinkloopError, UserError, tool
from thinkloop.distributed import JobQueue, Worker
from thinkloop.stores import PostgresStore
from thinkloop.testing import FunctionModel

pytestmark = pytest.mark.postgres

WORKER = str(Path(__file__).with_name("worker_agent.py"))


@pytest.fixture
def dsn() -> Iterator[str]:
    """A private schema per test (dropped afterwards), so workers of one test see only its jobs."""
    yield from private_schema("tl_jobs")


@pytest.fixture
async def queue(dsn: str) -> AsyncIterator[JobQueue]:
    async with JobQueue(dsn, lease=1.0) as q:
        yield q


def workers(
    dsn: str, effects: Path, names: list[str], *, lease: float = 1.0, env: dict[str, str] | None = None
) -> list[subprocess.Popen[str]]:
    import os

    return [
        subprocess.Popen(
            [sys.executable, WORKER, dsn, str(effects), str(lease), name],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )  # fmt: skip
        for name in names
    ]


def one_slow_call(seconds: float) -> FunctionModel:
    """A model that calls the test's `slow` tool once, for `seconds`, then answers "done"."""
    return FunctionModel(
        lambda r: {"tool_calls": [{"name": "slow", "args": {"seconds": seconds}}]} if r.turn == 0 else "done"
    )


def submit_one(dsn: str, goal: str, **options: Any) -> None:
    """Queue one job from a test that drives worker processes (no event loop of its own)."""

    async def submit() -> None:
        async with JobQueue(dsn) as q:
            await q.submit(goal, **options)

    asyncio.run(submit())


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# ============================================================================================ the queue


async def test_submit_checks_its_input_and_reports_status(queue: JobQueue) -> None:
    run_id = await queue.submit("Count the apples", run_id="job-1")
    assert run_id == "job-1"
    status = await queue.status("job-1")
    assert status is not None and (status.status, status.attempts, status.worker) == ("queued", 0, None)
    with pytest.raises(UserError, match="already exists"):
        await queue.submit("Again", run_id="job-1")
    with pytest.raises(UserError, match="non-empty"):
        await queue.submit("  ")
    with pytest.raises(UserError, match="run id"):
        await queue.submit("x", run_id="../etc")
    assert await queue.status("nope") is None
    assert [j.run_id for j in await queue.jobs("queued")] == ["job-1"]


async def test_submit_refuses_a_nul_in_the_goal_and_a_bad_session_before_the_database(
    queue: JobQueue,
) -> None:
    """The table keeps the goal as PostgreSQL text, which cannot hold a NUL: submit failed with "the job
    queue's database failed … check that the server is running"; a bad session id was queued, and the job
    failed later on a worker."""
    with pytest.raises(UserError) as nul:
        await queue.submit("go\x00al")
    assert str(nul.value) == (
        "the goal holds a NUL character (\\x00) at character 3 of 5, which a goal cannot hold "
        "(PostgreSQL text cannot store it): remove it from the goal"
    )
    with pytest.raises(UserError, match=r"invalid session id '\.\./etc'"):
        await queue.submit("x", session="../etc")
    assert await queue.jobs() == []


async def test_a_job_fails_or_ends_with_an_error_holding_a_nul(queue: JobQueue) -> None:
    """An error may quote what a tool printed, NULs included: PostgreSQL text cannot hold them, so marking
    the job failed raised "the job queue's database failed" and the job stayed running until its lease ran
    out. The NUL is stored as U+FFFD."""
    for run_id in ("a", "b"):
        await queue.submit("x", run_id=run_id)
    first, second = await queue.claim("w"), await queue.claim("w")
    assert first is not None and second is not None
    assert await queue.finish(first, "w", error="ToolExecutionError: it printed a\x00b")
    await queue._fail(second.run_id, "job b cannot be run: c\x00d")
    statuses = {s.run_id: (s.status, s.error) for s in await queue.jobs()}
    assert statuses == {
        "a": ("failed", "ToolExecutionError: it printed a\ufffdb"),
        "b": ("failed", "job b cannot be run: c\ufffdd"),
    }


async def test_each_job_goes_to_one_worker_and_an_expired_lease_lets_another_take_it(queue: JobQueue) -> None:
    await queue.submit("first", run_id="a")
    await queue.submit("second", run_id="b")
    claims = await asyncio.gather(queue.claim("w1"), queue.claim("w2"), queue.claim("w3"))
    taken = sorted(c.run_id for c in claims if c is not None)
    assert taken == ["a", "b"] and sum(c is None for c in claims) == 1
    job = next(c for c in claims if c is not None and c.run_id == "a")
    owner = next(n for n, c in zip(["w1", "w2", "w3"], claims, strict=True) if c is job)
    assert await queue.renew(job, owner) and not await queue.renew(job, "someone-else")
    await asyncio.sleep(1.2)  # the lease (1 s) runs out without renewal
    again = await queue.claim("w4")
    assert again is not None and again.run_id in ("a", "b") and again.attempt == 2
    assert not await queue.finish(job, "nobody")  # only the holder can finish a job


async def test_a_job_that_keeps_losing_its_worker_fails_after_max_attempts(dsn: str) -> None:
    async with JobQueue(dsn, lease=0.2, max_attempts=2) as q:
        await q.submit("poison", run_id="p")
        for attempt in (1, 2, 3):  # 3: taken once more, for its worker to end the run with an error
            job = await q.claim(f"w{attempt}")
            assert job is not None and job.attempt == attempt
            await asyncio.sleep(0.3)  # the worker "died": no renewal, no finish
        assert await q.claim("w4") is None
        status = await q.status("p")
        assert status is not None and (status.status, status.stop_reason) == ("failed", "error")
        assert "taken 3 time(s) (max_attempts=2)" in (status.error or "")
        async with PostgresStore(dsn) as store:
            with pytest.raises(
                ThinkloopError, match="job p failed: run p abandoned: it was taken 3 time"
            ) as failed:
                await q.wait("p", store)
            assert "inspect it with `thinkloop runs show p --store STORE`" in str(failed.value)


# =========================================================================================== workers


@tool
def note(text: str) -> str:
    """Note something."""
    return f"noted {text}"


async def test_a_worker_runs_jobs_and_wait_returns_their_results(dsn: str, queue: JobQueue) -> None:
    def reply(request: Any) -> Any:
        goal = request.messages[1].content
        return (
            {"tool_calls": [{"name": "note", "args": {"text": goal}}]} if request.turn == 0 else f"ok: {goal}"
        )

    async with PostgresStore(dsn) as store:
        ids = [await queue.submit(f"task {n}") for n in range(5)]
        worker = Worker(
            Agent(FunctionModel(reply), tools=[note], store=store), queue, concurrency=3, poll_interval=0.05
        )
        await worker.serve(until_idle=True)
        assert sorted(worker.completed) == sorted(ids)
        results = [await queue.wait(i, store) for i in ids]
        assert [r.output for r in results] == [f"ok: task {n}" for n in range(5)]
        assert all(r.stop_reason is StopReason.FINAL_ANSWER and r.tool_calls == 1 for r in results)
        assert {s.status for s in await queue.jobs()} == {"done"}


async def test_a_worker_that_lost_its_lease_stops_the_run(dsn: str, queue: JobQueue) -> None:
    import psycopg

    started = asyncio.Event()

    @tool
    async def slow(seconds: float) -> str:
        """Wait."""
        started.set()
        await asyncio.sleep(seconds)
        return "waited"

    model = one_slow_call(30)
    async with PostgresStore(dsn) as store:
        await queue.submit("wait a long time", run_id="slowjob")
        worker = Worker(Agent(model, tools=[slow], store=store), queue, name="w1", poll_interval=0.05)
        serving = asyncio.create_task(worker.serve(until_idle=True))
        await asyncio.wait_for(started.wait(), 10)
        with psycopg.connect(dsn, autocommit=True) as conn:  # another worker took the job over
            conn.execute("UPDATE thinkloop_jobs SET worker = 'w2' WHERE run_id = 'slowjob'")
        await asyncio.wait_for(serving, 10)  # the run was stopped within a renewal period, not after 30 s
        assert worker.completed == []
        status = await queue.status("slowjob")
        assert status is not None and status.worker == "w2" and status.status == "running"
        state = await store.load_state("slowjob")  # w1 wrote nothing after losing it: w2 resumes it as it was
        assert state is not None and not state.finished and "interrupted" not in state.metadata


async def test_a_worker_stopped_with_interrupt_hands_its_runs_back_resumable(
    dsn: str, queue: JobQueue
) -> None:
    started = asyncio.Event()
    effects: list[str] = []

    @tool(idempotent=True)
    async def fetch(key: str) -> str:
        """Fetch a value (safe to repeat)."""
        effects.append(key)
        if len(effects) == 1:
            started.set()
            await asyncio.sleep(30)
        return f"value of {key}"

    model = FunctionModel(
        lambda r: {"tool_calls": [{"name": "fetch", "args": {"key": "k"}}]} if r.turn == 0 else "got it"
    )
    async with PostgresStore(dsn) as store:
        await queue.submit("fetch k", run_id="handback")
        first = Worker(Agent(model, tools=[fetch], store=store), queue, name="w1", poll_interval=0.05)
        serving = asyncio.create_task(first.serve())
        await asyncio.wait_for(started.wait(), 10)
        first.stop(interrupt=True)
        await asyncio.wait_for(serving, 10)  # at once, not after the 30 s tool
        status = await queue.status("handback")
        assert status is not None and status.status == "queued" and first.completed == []
        state = await store.load_state("handback")
        assert state is not None and not state.finished and state.metadata["interrupted"]["step"] == 1

        second = Worker(Agent(model, tools=[fetch], store=store), queue, name="w2", poll_interval=0.05)
        await second.serve(until_idle=True)
        result = await queue.wait("handback", store)
        assert result.output == "got it" and second.completed == ["handback"]
        assert effects == ["k", "k"]  # idempotent: the interrupted call was run again on resume


async def test_a_worker_stopped_with_interrupt_while_a_run_loads_hands_it_back_at_once(
    dsn: str, queue: JobQueue
) -> None:
    """`stop(interrupt=True)` interrupts the agent's runs — but a job still loading its state (or setting
    its run up) had no run in the agent yet: the worker then waited for that run to end, whatever it took."""
    loading, release = asyncio.Event(), asyncio.Event()

    class SlowStore(PostgresStore):
        async def load_state(self, run_id: str) -> Any:
            loading.set()
            await release.wait()  # a store slow to answer
            return await super().load_state(run_id)

    model = FunctionModel(lambda r: "done")
    async with SlowStore(dsn) as store:
        await queue.submit("anything", run_id="loading")
        worker = Worker(Agent(model, store=store), queue, name="w1", poll_interval=0.05)
        serving = asyncio.create_task(worker.serve())
        try:
            await asyncio.wait_for(loading.wait(), 10)
            worker.stop(interrupt=True)
            await asyncio.wait({serving}, timeout=10)
            assert serving.done(), "the worker waited for a run that was still loading"  # not at once
        finally:
            release.set()
            await serving
        status = await queue.status("loading")
        assert status is not None and status.status == "queued" and worker.completed == []
        second = Worker(Agent(model, store=store), queue, name="w2", poll_interval=0.05)
        await second.serve(until_idle=True)
        assert (await queue.wait("loading", store)).output == "done" and second.completed == ["loading"]


def test_one_queue_used_from_several_threads_each_with_its_event_loop(dsn: str) -> None:
    """A threaded web application submitting through one `JobQueue` (`asyncio.run` per request): its one
    connection and asyncio lock belonged to the first loop, and the other threads' statements failed or hung
    ("bound to a different event loop"); each loop now has its own connection, closed with it."""
    import threading

    queue = JobQueue(dsn)
    together = threading.Barrier(4, timeout=60)
    errors: list[BaseException] = []

    async def submit(n: int) -> None:
        await queue.submit("warm up", run_id=f"warm-{n}")  # this loop's connection is open
        await asyncio.to_thread(together.wait)  # every thread's loop holds a connection at once
        await queue.submit(f"goal {n}", run_id=f"t{n}")

    def thread(n: int) -> None:
        try:
            asyncio.run(submit(n))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=thread, args=(n,), daemon=True) for n in range(4)]
    for each in threads:
        each.start()
    for each in threads:
        each.join(120)
    assert errors == [] and not any(each.is_alive() for each in threads)

    async def statuses() -> list[str | None]:
        async with JobQueue(dsn) as fresh:
            found = [await fresh.status(f"t{n}") for n in range(4)]
        return [s.status if s is not None else None for s in found]

    assert asyncio.run(statuses()) == ["queued"] * 4


def test_workers_in_several_processes_run_every_job_exactly_once(dsn: str, tmp_path: Path) -> None:
    async def submit() -> list[str]:
        async with JobQueue(dsn) as q:
            return [await q.submit(f"goal-{n}", run_id=f"r{n}") for n in range(8)]

    ids = asyncio.run(submit())
    effects = tmp_path / "effects.txt"
    (tmp_path / "started").mkdir()
    procs = workers(dsn, effects, ["A", "B", "C"], env={"START_BARRIER": f"{tmp_path / 'started'}:3"})
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    completed = [rid for out, _ in outputs for rid in out.strip().split(",") if rid]
    assert sorted(completed) == sorted(ids)  # each job finished by exactly one worker
    done = lines(effects)
    for n in range(8):  # each side effect once, by the worker that ran the job
        records = [line for line in done if line.startswith(f"record:goal-{n}:")]
        assert len(records) == 1, done
    assert len({line.split(":")[2] for line in done}) >= 2  # the work was shared


def test_a_killed_workers_run_is_resumed_by_another_without_repeating_its_side_effect(
    dsn: str, tmp_path: Path
) -> None:
    submit_one(dsn, "doomed", run_id="d1")
    effects = tmp_path / "effects.txt"
    (killed,) = workers(dsn, effects, ["A"], env={"KILL_IN_RECORD": "doomed"})
    killed.communicate(timeout=60)
    assert killed.returncode == -9  # SIGKILL inside `record`, after its effect
    assert lines(effects) == ["record:doomed:A"]
    time.sleep(1.1)  # A's lease (1 s) runs out
    (rescuer,) = workers(dsn, effects, ["B"])
    out, err = rescuer.communicate(timeout=60)
    assert rescuer.returncode == 0, err
    assert out.strip() == "d1"
    assert lines(effects) == ["record:doomed:A", "mark:doomed:B"]  # `record` never ran again

    async def check() -> None:
        async with JobQueue(dsn) as q, PostgresStore(dsn) as store:
            result = await q.wait("d1", store)
            assert result.output == "done doomed" and result.stop_reason is StopReason.FINAL_ANSWER
            entry = next(e for e in result.state.ledger.values() if e.name == "record")
            assert entry.error_kind == "unknown_outcome"  # told to the model, not re-run
            status = await q.status("d1")
            assert status is not None and status.attempts == 2 and status.stop_reason == "final_answer"

    asyncio.run(check())


def test_worker_settings_are_checked(dsn: str) -> None:
    from thinkloop import ConfigurationError

    with pytest.raises(ConfigurationError, match="shared store"):
        Worker(Agent(FunctionModel(lambda r: "x")), JobQueue(dsn))
    for lease in (0, -1, float("nan"), float("inf"), "30", True):
        with pytest.raises(ConfigurationError, match="lease must be a positive number of seconds"):
            JobQueue(dsn, lease=lease)  # type: ignore[arg-type]
    for bad in (0, -2, 2.5, "3", True, None):
        with pytest.raises(
            ConfigurationError, match=r"max_attempts must be a whole number ≥ 1 .*default 3\), got"
        ):
            JobQueue(dsn, max_attempts=bad)  # type: ignore[arg-type]
    assert JobQueue(dsn).max_attempts == 3


# ======================================================================================= poison runs


def poison_workers(dsn: str, effects: Path, name: str) -> tuple[int, str, str]:
    """One worker process (lease 0.5 s, max_attempts 2) on a queue whose `poison` job kills its worker
    inside `mark` — idempotent, so re-run by every resume; returns its exit code, stdout and stderr."""
    (proc,) = workers(dsn, effects, [name], lease=0.5, env={"KILL_IN_MARK": "poison", "MAX_ATTEMPTS": "2"})
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def test_a_run_that_kills_every_worker_is_abandoned_after_max_attempts(dsn: str, tmp_path: Path) -> None:
    import os

    submit_one(dsn, "poison", run_id="p1")
    effects = tmp_path / "effects.txt"
    for attempt, name in enumerate("AB", start=1):
        code, _, err = poison_workers(dsn, effects, name)
        assert code == -9, err  # SIGKILLed inside `mark`
        saved = asyncio.run(
            stored(dsn, "p1")
        )  # counted before the attempt ran: the count survived the process
        assert not saved.finished and saved.metadata["attempts"] == attempt
        time.sleep(0.6)  # its lease (0.5 s) runs out
    assert lines(effects) == ["record:poison:A", "mark:poison:A", "mark:poison:B"]

    code, out, err = poison_workers(dsn, effects, "C")  # the third worker does not run it: it ends it
    assert code == 0 and out.strip() == "", err
    assert lines(effects) == ["record:poison:A", "mark:poison:A", "mark:poison:B"]  # nothing ran again
    assert "run p1 abandoned after 2 attempt(s)" in err

    async def check() -> None:
        async with JobQueue(dsn) as q, PostgresStore(dsn) as store:
            status = await q.status("p1")
            assert status is not None and (status.status, status.stop_reason, status.attempts) == (
                "failed",
                "error",
                3,
            )
            saved = await store.load_state("p1")
            assert saved is not None and saved.stop_reason is StopReason.ERROR and saved.phase == "error"
            assert saved.error == status.error
            assert saved.error.startswith(
                "run p1 abandoned after 2 attempt(s) (max_attempts=2): each one ended without finishing"
            )
            assert f"`thinkloop runs show p1 --store {store.url}`" in saved.error
            assert saved.metadata["attempts"] == 2 and saved.metadata["abandoned"]["attempts"] == 2
            events = await store.read_events("p1")
            assert [e.type for e in events[-2:]] == ["error", "done"] and events[
                -1
            ].seq == saved.event_version
            with pytest.raises(ThinkloopError, match="job p1 failed: run p1 abandoned after 2 attempt"):
                await q.wait("p1", store)

    asyncio.run(check())
    shown = subprocess.run(  # the command the message names works, and shows why
        [sys.executable, "-m", "thinkloop.cli", "runs", "show", "p1", "--store", dsn],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "300"},
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "status: error" in shown.stdout and "abandoned after 2 attempt(s)" in shown.stdout
    assert "→ mark" in shown.stdout  # where it kept dying


def hanging_agent(store: PostgresStore) -> tuple[Agent, asyncio.Event]:
    """An agent whose run calls `hang` (idempotent: re-run on resume), and the event `hang` sets."""
    hanging = asyncio.Event()

    @tool(idempotent=True)
    async def hang(key: str) -> str:
        """Wait for a long time (safe to repeat)."""
        hanging.set()
        await asyncio.sleep(30)
        return "never"

    model = FunctionModel(
        lambda r: {"tool_calls": [{"name": "hang", "args": {"key": "k"}}]} if r.turn == 0 else "done"
    )
    return Agent(model, tools=[hang], store=store), hanging


async def crash_once(
    agent: Agent, hanging: asyncio.Event, run_id: str, *, save: bool = False, **options: Any
) -> None:
    """One attempt of `run_or_resume` that stops inside `hang`: with `save=False` as if its process died
    there (nothing more is written), with `save=True` interrupted by its worker's shutdown."""
    from thinkloop.distributed import run_or_resume

    hanging.clear()
    attempt = asyncio.create_task(run_or_resume(agent, run_id, "hang around", **options))
    await asyncio.wait_for(hanging.wait(), 10)
    assert agent.interrupt(run_id, save=save) == [run_id]
    with pytest.raises(asyncio.CancelledError):
        await attempt


async def test_by_default_a_run_gets_three_attempts_and_a_shutdown_does_not_count(dsn: str) -> None:
    from thinkloop.distributed import run_or_resume

    async with PostgresStore(dsn) as store:
        agent, hanging = hanging_agent(store)
        counts = []
        for save in (True, False, False, False):  # handed back by a shutdown, died, died, died
            await crash_once(agent, hanging, "r1", save=save)
            state = await store.load_state("r1")
            assert state is not None and not state.finished
            counts.append(state.metadata["attempts"])
        assert counts == [1, 1, 2, 3]  # the attempt after the shutdown took its number again
        assert "interrupted" in state.metadata
        result = await run_or_resume(agent, "r1", "hang around")
        assert result.stop_reason is StopReason.ERROR and not result.ok and result.output == ""
        assert result.error is not None and "abandoned after 3 attempt(s) (max_attempts=3)" in result.error
        again = await run_or_resume(agent, "r1", "hang around", max_attempts=10)  # ended for good
        assert again.error == result.error and again.state.event_version == result.state.event_version
        with pytest.raises(ThinkloopError, match="already ended"):
            await agent.resume("r1")

        await crash_once(agent, hanging, "r2", max_attempts=1)
        assert (
            await run_or_resume(agent, "r2", "hang around", max_attempts=1)
        ).stop_reason is StopReason.ERROR


async def test_a_finished_run_is_never_run_again_and_settings_are_checked(dsn: str) -> None:
    from thinkloop import ConfigurationError
    from thinkloop.distributed import run_or_resume

    calls: list[str] = []

    @tool
    def once(text: str) -> str:
        """A side effect."""
        calls.append(text)
        return "ok"

    model = FunctionModel(
        lambda r: {"tool_calls": [{"name": "once", "args": {"text": "x"}}]} if r.turn == 0 else "finished"
    )
    async with PostgresStore(dsn) as store:
        agent = Agent(model, tools=[once], store=store)
        first = await run_or_resume(agent, "f1", "do it once")
        assert first.output == "finished" and calls == ["x"] and first.state.metadata["attempts"] == 1
        again = await run_or_resume(agent, "f1", "do it once", attempt=9, max_attempts=1)  # delivered again
        assert again.output == "finished" and again.stop_reason is StopReason.FINAL_ANSWER and calls == ["x"]
        for bad in (0, "2", 1.0, False):
            with pytest.raises(ConfigurationError, match="max_attempts must be a whole number ≥ 1"):
                await run_or_resume(agent, "f2", "x", max_attempts=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="attempt must be None or a whole number"):
            await run_or_resume(agent, "f2", "x", attempt=0)
        assert await store.load_state("f2") is None  # nothing started

        # A job whose every attempt died before the run's first checkpoint: ended all the same.
        lost = await run_or_resume(agent, "f3", "never saved", attempt=4, max_attempts=3, metadata={"n": 1})
        assert lost.stop_reason is StopReason.ERROR and "abandoned after 3 attempt(s)" in (lost.error or "")
        saved = await store.load_state("f3")
        assert (
            saved is not None and saved.finished and saved.goal == "never saved" and saved.metadata["n"] == 1
        )
        assert calls == ["x"]


async def test_a_job_whose_state_is_corrupt_fails_with_a_clear_error_and_the_worker_goes_on(
    dsn: str, queue: JobQueue
) -> None:
    import psycopg

    from thinkloop.distributed import run_or_resume

    model = FunctionModel(lambda r: "fine")
    async with PostgresStore(dsn) as store:
        agent = Agent(model, store=store)
        await queue.submit("corrupt me", run_id="bad")
        await queue.submit("a healthy job", run_id="good")
        await run_or_resume(agent, "bad", "corrupt me")  # a state in the store …
        with psycopg.connect(dsn, autocommit=True) as conn:  # … then broken, and unfinished again
            conn.execute(
                'UPDATE thinkloop_runs SET state = \'{"run_id": "bad", "step": "three"}\' WHERE run_id = \'bad\''
            )
        worker = Worker(agent, queue, name="w1", poll_interval=0.05)
        await asyncio.wait_for(worker.serve(until_idle=True), 20)
        assert worker.completed == ["good"]
        status = await queue.status("bad")
        assert status is not None and status.status == "failed" and status.attempts == 1
        assert (status.error or "").startswith(
            f"CorruptRunError: run 'bad' in {store.url}: corrupt run state: 1 problem(s): step:"
        )
        assert "so this job cannot run it: repair or delete the run in" in (status.error or "")
        assert "submit the goal again under a new run id" in (status.error or "")
        assert (await queue.wait("good", store)).output == "fine"


# ============================================================================================ the CLI


def test_cli_submit_and_worker(dsn: str, tmp_path: Path) -> None:
    import json
    import os
    import signal

    script = tmp_path / "script.json"
    script.write_text(
        json.dumps([{"tool_calls": [{"name": "calculator", "args": {"expression": "6*7"}}]}, {"text": "42"}])
    )
    env = {**os.environ, "THINKLOOP_QUEUE": dsn, "THINKLOOP_HOME": str(tmp_path / "home")}
    cli = [sys.executable, "-m", "thinkloop.cli"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cli, *args], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
        )

    first = run("submit", "What is 6*7?", "--run-id", "cli-1")
    assert first.returncode == 0 and first.stdout.strip() == "cli-1", first.stderr
    done = run("worker", "--model", f"script:{script}", "--until-idle", "--concurrency", "2")
    assert done.returncode == 0, done.stderr
    assert "run cli-1 · final_answer · 2 steps · 42" in done.stderr
    worker = subprocess.Popen([*cli, "worker", "--model", f"script:{script}"], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        waited = run("submit", "What is 6*7 again?", "--wait")
        assert waited.returncode == 0, waited.stderr
        assert waited.stdout.splitlines()[-1] == "42"
    finally:
        worker.send_signal(signal.SIGTERM)  # graceful: running jobs finish, no new ones start
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    missing = subprocess.run([*cli, "submit", "x"], env={k: v for k, v in env.items() if k != "THINKLOOP_QUEUE"},
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert missing.returncode == 2 and "no job queue" in missing.stderr


# ================================================================================ faults of the queue


async def test_rows_no_worker_can_run_fail_with_a_clear_error_and_the_worker_goes_on(
    dsn: str, queue: JobQueue
) -> None:
    import psycopg

    await queue.submit("a first healthy job", run_id="good-1")  # creates the table
    bad = {  # rows written by something else than `submit`
        "not-json": ("x", "{not json"),
        "too-deep": (
            "x",
            "[" * 100_000 + "]" * 100_000,
        ),  # json raised RecursionError: it crashed every worker
        "not-object": ("x", "[1, 2]"),
        "bad-metadata": ("x", '{"budget": null, "metadata": "m", "session": null}'),
        "bad-budget": ("x", '{"budget": {"speed": 3}, "metadata": {}, "session": null}'),
        "blank-goal": ("  ", '{"budget": null, "metadata": {}, "session": null}'),
        "../escape": ("x", '{"budget": null, "metadata": {}, "session": null}'),
    }
    with psycopg.connect(dsn, autocommit=True) as conn:
        for n, (run_id, (goal, options)) in enumerate(bad.items()):
            conn.execute(
                "INSERT INTO thinkloop_jobs (run_id, goal, options, status, created_at, updated_at) "
                "VALUES (%s, %s, %s, 'queued', %s, %s)", (run_id, goal, options, n, n),
            )  # fmt: skip
    await queue.submit("a second healthy job", run_id="good-2")
    async with PostgresStore(dsn) as store:
        worker = Worker(
            Agent(FunctionModel(lambda r: "fine"), store=store), queue, name="w1", poll_interval=0.05
        )
        await asyncio.wait_for(worker.serve(until_idle=True), 60)  # did not crash on the first bad row
        assert sorted(worker.completed) == ["good-1", "good-2"]
        expected = {
            "not-json": "its options are not JSON (",
            "too-deep": "its options are not JSON (they nest too deeply to read)",
            "not-object": "its options must be a JSON object (as `JobQueue.submit` writes them), got '[1, 2]'",
            "bad-metadata": "its option 'metadata' must be a dict or null, got 'm'",
            "bad-budget": "the job's budget {'speed': 3} is not a budget",
            "blank-goal": "its goal must be a non-empty string, got '  '",
            "../escape": "run id",
        }
        for run_id, words in expected.items():
            status = await queue.status(run_id)
            assert status is not None and status.status == "failed", status
            assert words in (status.error or ""), status.error
            with pytest.raises(ThinkloopError, match=f"job {re.escape(run_id)} failed"):
                await queue.wait(run_id, store)
            if run_id != "../escape":
                assert await store.load_state(run_id) is None  # nothing ran
        assert (await queue.status("good-2")).status == "done"  # type: ignore[union-attr]


def backend_pid(conn: Any) -> int:
    return int(conn.pgconn.backend_pid)


def terminate(dsn: str, *pids: int) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        for pid in pids:
            assert conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)


async def test_a_worker_whose_database_connections_are_dropped_reconnects_and_loses_no_job(dsn: str) -> None:
    release = asyncio.Event()
    started = asyncio.Event()

    @tool
    async def step(n: int) -> str:
        """Do a step (waits for the test)."""
        started.set()
        await release.wait()
        return f"step {n} done"

    model = FunctionModel(
        lambda r: {"tool_calls": [{"name": "step", "args": {"n": 1}}]} if r.turn == 0 else "finished"
    )
    async with JobQueue(dsn, lease=1.0) as queue, PostgresStore(dsn) as store:
        await queue.submit("first", run_id="j1")
        worker = Worker(Agent(model, tools=[step], store=store), queue, name="w1", poll_interval=0.05)
        serving = asyncio.create_task(worker.serve())
        try:
            await asyncio.wait_for(started.wait(), 30)
            terminate(dsn, backend_pid(queue._conn), backend_pid(store._conn))  # mid-run: both connections
            release.set()
            async with asyncio.timeout(60):
                result = await queue.wait("j1", store)
            assert result.output == "finished" and worker.completed == ["j1"]

            terminate(dsn, backend_pid(queue._conn))  # while idle, between claims
            started.clear()
            await queue.submit("second", run_id="j2")
            async with asyncio.timeout(60):
                second = await queue.wait("j2", store)
            assert second.output == "finished" and not serving.done()
            assert worker.completed == ["j1", "j2"]
            assert [s.status for s in await queue.jobs()] == ["done", "done"]
        finally:
            worker.stop()
            await asyncio.wait_for(serving, 30)


async def test_a_worker_that_cannot_reach_its_queue_at_all_says_so(dsn: str) -> None:
    async with (
        PostgresStore(dsn) as store,
        JobQueue("postgresql://postgres@127.0.0.1:1/test", lease=1.0) as queue,
    ):
        worker = Worker(Agent(FunctionModel(lambda r: "x"), store=store), queue)
        with pytest.raises(
            ThinkloopError,
            match=r"the job queue's database postgresql://postgres@127.0.0.1:1/test failed: .*check that the server is running",
        ):
            await asyncio.wait_for(worker.serve(until_idle=True), 30)


# ==================================================================== worker processes: death, stall, stop


def lease_expired(dsn: str, run_id: str, timeout: float = 60) -> None:
    """Wait until the job's lease has run out (on the database's clock), so another worker may take it."""
    import psycopg

    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT lease_until < extract(epoch from clock_timestamp()) FROM thinkloop_jobs WHERE run_id = %s",
                (run_id,),
            ).fetchone()
            if row is not None and row[0]:
                return
            time.sleep(0.05)
    raise AssertionError(f"the lease of job {run_id} did not run out within {timeout} s")


def wait_for_line(path: Path, line: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while line not in lines(path):
        assert time.monotonic() < deadline, f"{line!r} never came: {lines(path)}"
        time.sleep(0.02)


def job_status(dsn: str, run_id: str) -> Any:
    async def get() -> Any:
        async with JobQueue(dsn) as q:
            return await q.status(run_id)

    return asyncio.run(get())


def test_a_run_that_kills_its_worker_before_its_first_save_is_abandoned_after_max_attempts(
    dsn: str, tmp_path: Path
) -> None:
    submit_one(dsn, "early", run_id="e1", metadata={"team": "ops"})
    effects = tmp_path / "effects.txt"
    env = {"KILL_BEFORE_SAVE": "early", "MAX_ATTEMPTS": "2"}
    for name in "AB":  # each dies before the run is first saved: nothing in the store counts it
        (proc,) = workers(dsn, effects, [name], lease=0.5, env=env)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == -9, err
        assert asyncio.run(stored(dsn, "e1")) is None
        lease_expired(dsn, "e1")
    (proc,) = workers(dsn, effects, ["C"], lease=0.5, env=env)
    out, err = proc.communicate(timeout=60)  # the queue counted the claims: C ends the run, not runs it
    assert proc.returncode == 0 and out.strip() == "", err
    assert lines(effects) == ["recall:early:A", "recall:early:B"]
    status = job_status(dsn, "e1")
    assert (status.status, status.stop_reason, status.attempts) == ("failed", "error", 3)
    assert status.error.startswith("run e1 abandoned after 2 attempt(s) (max_attempts=2)")
    saved = asyncio.run(stored(dsn, "e1"))
    assert saved.finished and saved.stop_reason is StopReason.ERROR and saved.goal == "early"
    assert saved.metadata["team"] == "ops" and saved.metadata["abandoned"]["attempts"] == 2


async def stored(dsn: str, run_id: str) -> Any:
    async with PostgresStore(dsn) as store:
        return await store.load_state(run_id)


def test_a_worker_stopped_by_sigterm_hands_its_run_back_at_once_for_another_to_resume(
    dsn: str, tmp_path: Path
) -> None:
    import signal

    submit_one(dsn, "handover", run_id="h1")
    effects = tmp_path / "effects.txt"
    (first,) = workers(dsn, effects, ["A"], lease=60, env={"SLOW_MARK": "600"})  # a 60 s lease, a 10 min tool
    wait_for_line(effects, "mark-start:handover:A")
    first.send_signal(signal.SIGTERM)
    out, err = first.communicate(timeout=60)  # at once: neither the tool nor the lease is waited for
    assert first.returncode == 0 and out.strip() == "", err
    status = job_status(dsn, "h1")
    assert (status.status, status.worker, status.attempts) == ("queued", None, 0)  # released, not counted
    saved = asyncio.run(stored(dsn, "h1"))
    assert saved is not None and not saved.finished

    (second,) = workers(dsn, effects, ["B"], lease=60)
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0 and out.strip() == "h1", err
    assert lines(effects) == [
        "record:handover:A",
        "mark-start:handover:A",
        "mark:handover:B",
    ]  # record ran once
    status = job_status(dsn, "h1")
    assert (status.status, status.stop_reason, status.attempts) == ("done", "final_answer", 1)


def test_a_worker_frozen_past_its_lease_stops_its_run_when_it_wakes(dsn: str, tmp_path: Path) -> None:
    import signal

    submit_one(dsn, "frozen", run_id="z1")
    effects = tmp_path / "effects.txt"
    (stale,) = workers(dsn, effects, ["A"], lease=1.0, env={"SLOW_MARK": "3"})
    wait_for_line(effects, "mark-start:frozen:A")
    stale.send_signal(signal.SIGSTOP)  # frozen inside `mark` (outside any store transaction) …
    try:
        lease_expired(dsn, "z1")  # … past its lease: B takes the run over and finishes it
        (rescuer,) = workers(dsn, effects, ["B"], lease=1.0)
        out, err = rescuer.communicate(timeout=120)
        assert rescuer.returncode == 0 and out.strip() == "z1", err
        finished = asyncio.run(stored(dsn, "z1"))
    finally:
        stale.send_signal(signal.SIGCONT)  # … then it wakes
    out, err = stale.communicate(timeout=60)
    assert stale.returncode == 0 and out.strip() == "", err  # it completed nothing
    done = lines(effects)
    assert done.count("record:frozen:A") == 1 and "record:frozen:B" not in done
    assert "mark:frozen:B" in done and set(done) <= {
        "record:frozen:A",
        "mark-start:frozen:A",
        "mark:frozen:A",
        "mark:frozen:B",
    }
    after = asyncio.run(stored(dsn, "z1"))  # A wrote nothing over B's result
    assert after.model_dump() == finished.model_dump() and after.answer == "done frozen"
    status = job_status(dsn, "z1")
    assert (status.status, status.stop_reason, status.attempts) == ("done", "final_answer", 2)


async def test_a_store_failure_mid_job_leaves_the_job_to_be_taken_again_not_failed(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A store that does not answer in time (here: its event table locked, as by a worker frozen inside a
    checkpoint) is a passing failure: the job is taken again once its lease runs out, not failed for good."""
    import logging

    import psycopg

    failed = asyncio.Event()
    loop = asyncio.get_running_loop()

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "job t1 failed on w1" in record.getMessage():
                loop.call_soon_threadsafe(failed.set)

    watch = Watch()
    logging.getLogger("thinkloop.distributed").addHandler(watch)
    async with JobQueue(dsn, lease=1.0) as queue, PostgresStore(dsn, timeout=1.0) as store:
        assert await store.load_state("warm-up") is None  # connected, tables made
        await queue.submit("hello", run_id="t1")
        worker = Worker(
            Agent(FunctionModel(lambda r: "fine"), store=store), queue, name="w1", poll_interval=0.05
        )
        with psycopg.connect(dsn) as blocker:
            blocker.execute("LOCK TABLE thinkloop_events IN EXCLUSIVE MODE")  # held until the block ends
            serving = asyncio.create_task(worker.serve())
            await asyncio.wait_for(failed.wait(), 60)
            blocker.rollback()
        try:
            async with asyncio.timeout(60):
                result = await queue.wait("t1", store)
            assert result.output == "fine" and worker.completed == ["t1"]
            status = await queue.status("t1")
            assert status is not None and (status.status, status.attempts) == ("done", 2)
        finally:
            worker.stop()
            await asyncio.wait_for(serving, 30)
            logging.getLogger("thinkloop.distributed").removeHandler(watch)


async def test_sigterm_to_the_cli_worker_hands_its_running_jobs_back_at_once(
    dsn: str, tmp_path: Path
) -> None:
    """A service manager's SIGTERM (SIGKILL follows within seconds) interrupts the running runs and requeues
    their jobs, resumable — it used to wait for them to finish (here a 10-minute shell command)."""
    import json
    import os
    import signal

    script = tmp_path / "script.json"
    script.write_text(
        json.dumps([{"tool_calls": [{"name": "shell", "args": {"command": "sleep 600"}}]}, "done"])
    )
    env = {**os.environ, "THINKLOOP_QUEUE": dsn, "THINKLOOP_HOME": str(tmp_path / "home")}
    async with JobQueue(dsn) as jobs:
        await jobs.submit("Wait a long time", run_id="long-1")
        worker = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "thinkloop.cli", "worker", "--model", f"script:{script}", "--tools", "shell",
            "--yes", "--workspace", str(tmp_path),
            env=env, cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            async with PostgresStore(dsn) as store:
                for _ in range(600):  # up to 60 s for the worker to start and the shell command to run
                    state = await store.load_state("long-1")
                    if state is not None and any(e.status == "started" for e in state.ledger.values()):
                        break
                    await asyncio.sleep(0.1)
                else:
                    raise AssertionError("the worker never started the shell command")
            worker.send_signal(signal.SIGTERM)
            _, stderr = await asyncio.wait_for(worker.communicate(), 60)
        finally:
            if worker.returncode is None:
                worker.kill()
                await worker.communicate()
        err = stderr.decode()
        assert worker.returncode == 0, err
        assert "interrupting the running jobs" in err
        status = await jobs.status("long-1")
        assert status is not None and status.status == "queued" and status.worker is None
    async with PostgresStore(dsn) as store:
        saved = await store.load_state("long-1")
        assert saved is not None and not saved.finished


async def test_a_statement_the_database_does_not_answer_fails_within_timeout_and_the_next_works(
    dsn: str,
) -> None:
    import psycopg

    async with JobQueue(dsn) as queue:
        await queue.submit(
            "first", run_id="t1"
        )  # creates the table; connecting may be slow on a busy machine
        queue.timeout = 1.0
        with psycopg.connect(dsn) as other:  # a session that locks the queue and keeps it
            other.execute("LOCK TABLE thinkloop_jobs IN ACCESS EXCLUSIVE MODE")
            started = time.monotonic()
            with pytest.raises(
                ThinkloopError, match=r"did not answer within 1 s; check that the server is running"
            ):
                await queue.submit("second", run_id="t2")
            assert time.monotonic() - started < 10
        queue.timeout = 30.0
        await queue.submit("third", run_id="t3")  # lock released: a new connection
        await asyncio.sleep(0.5)  # (what the server applied, it applied when the lock went: long done)
        # the server gave the statement up too: it was not applied once the lock was released
        assert sorted(j.run_id for j in await queue.jobs("queued")) == ["t1", "t3"]
        await queue.submit("second", run_id="t2")
    with pytest.raises(ConfigurationError, match="timeout must be a positive number of seconds"):
        JobQueue(dsn, timeout=0)


async def test_a_worker_that_cannot_renew_its_lease_for_a_whole_lease_stops_the_run(
    dsn: str, queue: JobQueue
) -> None:
    """The database stops answering the worker (here: a lock on the queue): once its lease (1 s) has gone
    unrenewed, another worker may have the job, so the run is stopped without writing anything more."""
    import psycopg

    started, stopped = asyncio.Event(), asyncio.Event()

    @tool
    async def slow(seconds: float) -> str:
        """Wait."""
        started.set()
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            stopped.set()
            raise
        return "waited"

    model = one_slow_call(60)
    async with PostgresStore(dsn) as store:
        await queue.submit("wait a long time", run_id="cut")
        worker = Worker(Agent(model, tools=[slow], store=store), queue, name="w1", poll_interval=0.05)
        serving = asyncio.create_task(worker.serve(until_idle=True))
        await asyncio.wait_for(started.wait(), 30)
        with psycopg.connect(dsn) as other:
            other.execute("LOCK TABLE thinkloop_jobs IN ACCESS EXCLUSIVE MODE")
            locked = time.monotonic()
            await asyncio.wait_for(stopped.wait(), 30)  # not after the tool's 60 s
            assert time.monotonic() - locked >= 0.6  # not before its lease could have run out
        await asyncio.wait_for(serving, 60)  # the lock gone, the job (lease expired) is taken again: resumed
        status = await queue.status("cut")
        assert status is not None and status.status == "done" and status.attempts == 2


def test_cli_worker_hides_the_queue_password_and_submit_wait_exits_like_run(dsn: str, tmp_path: Path) -> None:
    # The worker printed `password=hunter2` of a key=value or ?password= DSN; `submit --wait` exited 3
    # ("a limit stopped the run") for a run that ended with an error, where `thinkloop run` exits 1.
    import os
    import signal

    (tmp_path / "empty.json").write_text("[]")  # a model with no replies: every run ends with an error
    secret = f"{dsn}{'&' if '?' in dsn else '?'}password=hunter2"
    env = {**os.environ, "THINKLOOP_QUEUE": secret, "THINKLOOP_HOME": str(tmp_path / "home")}
    cli = [sys.executable, "-m", "thinkloop.cli"]
    worker = subprocess.Popen([*cli, "worker", "--model", "script:empty.json"], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        waited = subprocess.run([*cli, "submit", "What is 6*7?", "--wait"], env=env, cwd=tmp_path,
                                capture_output=True, text=True, timeout=120)  # fmt: skip
        assert waited.returncode == 1, waited.stderr
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
    assert "worker " in err and " · queue " in err and "hunter2" not in err, err


def test_a_worker_does_not_resume_a_run_a_live_thinkloop_run_is_driving(dsn: str, tmp_path: Path) -> None:
    # `runs resume` and the server refuse a run whose process is alive on this machine; a worker resumed
    # it at once, and two processes drove one run (the first then failed on the event log).
    import json
    import os

    (tmp_path / "ws").mkdir()
    command = f"echo ran >> effects.txt; sleep 20.{os.getpid()}"
    script = [{"tool_calls": [{"name": "shell", "args": {"command": command}}]}, "finished"]
    (tmp_path / "s.json").write_text(json.dumps(script))
    env = {**os.environ, "THINKLOOP_QUEUE": dsn, "THINKLOOP_HOME": str(tmp_path / "home")}
    cli = [sys.executable, "-m", "thinkloop.cli"]
    store = f"sqlite://{tmp_path}/r.db"
    common = ["--model", "script:s.json", "--tools", "shell", "--yes", "--workspace", "ws", "--store", store]
    live = subprocess.Popen([*cli, "run", "append and wait", *common, "--json"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert live.stdout is not None
        run_id = json.loads(live.stdout.readline())["run_id"]
        while not (tmp_path / "ws" / "effects.txt").exists():
            assert live.poll() is None, live.stderr.read() if live.stderr else ""
            time.sleep(0.05)
        queued = subprocess.run([*cli, "submit", "append and wait", "--run-id", run_id], env=env, cwd=tmp_path,
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert queued.returncode == 0, queued.stderr
        worker = subprocess.run([*cli, "worker", *common, "--until-idle"], env=env, cwd=tmp_path,
                                capture_output=True, text=True, timeout=120)  # fmt: skip
        assert "is still running in process" in worker.stderr, worker.stderr
        assert (tmp_path / "ws" / "effects.txt").read_text() == "ran\n"  # the worker did not run it again
    finally:
        live.terminate()
        live.communicate(timeout=60)
