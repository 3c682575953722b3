"""Scale-out on Celery (SPEC §13.4): thinkloop runs as Celery tasks on real `celery worker` processes,
with the real Redis and RabbitMQ brokers and PostgreSQL store of this machine; workers SIGKILLed mid-run
and shut down warm, their runs redelivered by the broker and resumed without repeating a side effect."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from conftest import private_schema
from thinkloop import Agent, ConfigurationError, RunState, StateError, StopReason, UserError, tool
from thinkloop.celery import agent_task, task_result
from thinkloop.events import Event
from thinkloop.stores import PostgresStore, SQLiteStore
from thinkloop.testing import FunctionModel

pytestmark = pytest.mark.postgres

TESTS = Path(__file__).resolve().parent
BROKERS = {"redis": "redis://127.0.0.1:6379/0", "amqp": "amqp://guest:guest@127.0.0.1:5672//"}


def reachable(url: str) -> None:
    """Skip (with the reason) when the broker is not listening; CI has both."""
    port = 6379 if url.startswith("redis") else 5672
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except (
        OSError
    ) as exc:  # CI starts both brokers (they run on every machine of this kind): never skipped there
        pytest.skip(f"no broker at {url} ({exc}): start Redis / RabbitMQ on loopback to run this test")


class Cluster:
    """Celery workers (subprocesses, each in its own process group) sharing a queue, a store, an effects file."""

    def __init__(self, broker: str, dsn: str, tmp: Path, **env: str) -> None:
        self.broker, self.dsn, self.tmp = broker, dsn, tmp
        self.tag = uuid.uuid4().hex[:10]
        self.queue = f"tl_celery_{self.tag}"
        self.effects = tmp / "effects.txt"
        self.env = {**os.environ, "TL_BROKER": broker, "TL_QUEUE": self.queue, "TL_DSN": dsn,
                    "TL_EFFECTS": str(self.effects), **env}  # fmt: skip
        self.workers: list[subprocess.Popen[bytes]] = []
        import celery_agent

        self.app, self.run_agent = celery_agent.make_app(broker, self.queue)

    def worker(
        self, name: str, *, pool: str = "prefork", concurrency: int = 1, **env: str
    ) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - the worker writes it until it ends
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "celery_agent", "worker", "--pool", pool, "-c", str(concurrency),
             "-n", f"{name}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO"],
            cwd=TESTS, env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        log.close()
        self.workers.append(proc)
        return proc

    def id(self, name: str) -> str:
        """A run id of this test alone (the result backend outlives the test)."""
        return f"{name}-{self.tag}"

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def lines(self) -> list[str]:
        return self.effects.read_text().splitlines() if self.effects.exists() else []

    def wait_for(self, prefix: str, timeout: float = 20) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [line for line in self.lines() if line.startswith(prefix)]
            if found:
                return found[0]
            time.sleep(0.05)
        raise AssertionError(f"no effect {prefix!r} within {timeout} s: {self.lines()}")

    def close(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        with self.app.connection_for_write() as conn:  # the test's queue goes with it
            conn.default_channel.queue_delete(self.queue)


@pytest.fixture
def dsn() -> Iterator[str]:
    yield from private_schema("tl_celery")


@pytest.fixture
def cluster(dsn: str, tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    made: list[Cluster] = []

    def make(broker: str = "redis", **env: str) -> Cluster:
        reachable(BROKERS[broker])
        reachable(BROKERS["redis"])  # the result backend
        made.append(Cluster(BROKERS[broker], dsn, tmp_path, **env))
        return made[-1]

    yield make
    for each in made:
        each.close()


def load(dsn: str, run_id: str) -> Any:
    import asyncio

    async def get() -> Any:
        async with PostgresStore(dsn) as store:
            return await store.load_state(run_id)

    return asyncio.run(get())


# ================================================================================ real workers


def test_workers_run_submitted_runs_and_a_finished_run_is_not_run_again(
    cluster: Callable[..., Cluster],
) -> None:
    c = cluster("redis")
    jobs = [c.run_agent.submit(f"goal-{n}", run_id=c.id(f"job{n}"), metadata={"n": n}) for n in range(3)]
    c.worker("w1", concurrency=2)
    results = [job.get(timeout=30) for job in jobs]
    assert [r["output"] for r in results] == ["done goal-0", "done goal-1", "done goal-2"]
    assert (
        [r["run_id"] for r in results]
        == [c.id("job0"), c.id("job1"), c.id("job2")]
        == [job.id for job in jobs]
    )
    assert all(
        r["stop_reason"] == "final_answer" and r["ok"] and r["steps"] == 3 and r["tool_calls"] == 2
        for r in results
    )
    assert json.loads(json.dumps(results)) == results  # what the result backend carries is plain JSON
    assert sorted(line.rsplit(":", 1)[0] for line in c.lines() if line.startswith("record")) == [
        "record:goal-0", "record:goal-1", "record:goal-2",
    ]  # fmt: skip
    state = load(c.dsn, c.id("job1"))  # the full run is in the thinkloop store
    assert state.finished and state.metadata["n"] == 1 and state.answer == "done goal-1"

    again = c.run_agent.submit("goal-0", run_id=c.id("job0")).get(
        timeout=30
    )  # delivered twice: not run twice
    assert again == results[0]
    assert len([line for line in c.lines() if line.startswith("record:goal-0:")]) == 1
    assert c.run_agent.result(c.id("job2")).get(timeout=5)["output"] == "done goal-2"


@pytest.mark.parametrize("broker", ["redis", "amqp"])
def test_a_killed_workers_run_is_redelivered_and_resumed_without_repeating_its_side_effect(
    broker: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(broker, TL_SLOW="60", TL_VISIBILITY="1")
    job = c.run_agent.submit("doomed", run_id=c.id("doomed"))
    first = c.worker("w1")
    started = c.wait_for("slow-start:doomed:")  # in the slow tool, after `record` completed
    os.killpg(first.pid, signal.SIGKILL)  # the whole worker: main process and pool
    assert first.wait(10) == -signal.SIGKILL
    if broker == "redis":
        time.sleep(1.2)  # the message becomes visible again after the visibility timeout (1 s here)
    c.worker("w2")  # RabbitMQ redelivers at once: the dead worker's connection closed
    result = job.get(timeout=30)
    assert result["output"] == "done doomed" and result["stop_reason"] == "final_answer", c.log("w2")
    lines = c.lines()
    pid1 = started.rsplit(":", 1)[1]
    assert [line for line in lines if line.startswith("record:")] == [f"record:doomed:{pid1}"]  # never again
    restarted = [line for line in lines if line.startswith("slow-start:")]
    assert len(restarted) == 2 and restarted[1] != started  # the interrupted idempotent call re-ran on w2
    state = load(c.dsn, c.id("doomed"))
    assert (
        state.finished and state.step == 3 and [e.name for e in state.ledger.values()] == ["record", "slow"]
    )
    assert f"resuming run {c.id('doomed')}" in c.log("w2")


def test_a_dead_pool_process_hands_its_run_back_to_its_worker(cluster: Callable[..., Cluster]) -> None:
    c = cluster("redis", TL_SLOW="60")
    job = c.run_agent.submit("orphan", run_id=c.id("orphan"))
    worker = c.worker("w1", concurrency=1)
    started = c.wait_for("slow-start:orphan:")
    os.kill(int(started.rsplit(":", 1)[1]), signal.SIGKILL)  # only the pool process running the task
    result = job.get(
        timeout=30
    )  # reject_on_worker_lost: the worker requeued it, a new pool process resumed it
    assert result["output"] == "done orphan", c.log("w1")
    assert worker.poll() is None  # the worker itself lives on
    assert len([line for line in c.lines() if line.startswith("record:")]) == 1
    pids = {line.rsplit(":", 1)[1] for line in c.lines() if line.startswith("slow-start:")}
    assert len(pids) == 2  # two pool processes


@pytest.mark.parametrize("pool", ["threads", "solo"])
def test_a_warm_shutdown_interrupts_the_runs_and_hands_them_back(
    pool: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster("redis", TL_SLOW="60")
    job = c.run_agent.submit("paused", run_id=c.id("paused"))
    first = c.worker("w1", pool=pool, concurrency=2 if pool == "threads" else 1)
    c.wait_for("slow-start:paused:")
    began = time.monotonic()
    first.send_signal(signal.SIGTERM)  # warm shutdown
    assert first.wait(20) == 0, c.log("w1")
    assert time.monotonic() - began < 15  # not after the 60 s tool
    assert f"interrupted run(s) {c.id('paused')}" in c.log("w1")
    state = load(c.dsn, c.id("paused"))
    assert state is not None and not state.finished and state.metadata["interrupted"]["step"] == 2
    assert job.state != "SUCCESS"

    c.worker("w2", pool=pool)  # the message was put back: another worker resumes the run
    assert job.get(timeout=30)["output"] == "done paused", c.log("w2")
    assert len([line for line in c.lines() if line.startswith("record:")]) == 1
    assert (
        len([line for line in c.lines() if line.startswith("slow:")]) == 1
    )  # the interrupted one never ended


def queued(c: Cluster, expected: int) -> int:
    """Messages waiting in the test's (RabbitMQ) queue once it holds `expected` (or after 20 s: a busy
    machine's broker may take a while; only a wrong count waits that long): a message not acknowledged
    goes back to it when the connection of the worker holding it closes."""
    deadline = time.monotonic() + 20
    while True:
        with c.app.connection_for_write() as conn:
            count = int(conn.default_channel.queue_declare(c.queue, passive=True).message_count)
        if count == expected or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


def stopped(c: Cluster, name: str, worker: subprocess.Popen[bytes]) -> None:
    """Stop a worker warm (SIGTERM): it finishes handling what it ran (the acknowledgement included; a
    fixed sleep before a SIGKILL could end first on a busy machine) and closes its connection, so
    RabbitMQ requeues whatever it still held unacknowledged."""
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0, c.log(name)


def test_a_run_that_kills_every_worker_is_abandoned_after_max_attempts(
    cluster: Callable[..., Cluster],
) -> None:
    c = cluster("amqp", TL_KILL="poison", TL_MAX_ATTEMPTS="2")  # `slow` SIGKILLs its worker, every time
    job = c.run_agent.submit("poison", run_id=c.id("poison"))
    for attempt in (1, 2):
        worker = c.worker(f"w{attempt}", pool="solo")
        assert worker.wait(30) == -signal.SIGKILL, c.log(f"w{attempt}")
        assert queued(c, 1) == 1  # RabbitMQ requeued the unacknowledged message
        state = load(c.dsn, c.id("poison"))  # counted before the attempt ran: the count survived the process
        assert not state.finished and state.metadata["attempts"] == attempt
    last = c.worker("w3", pool="solo")  # RabbitMQ redelivered it: this worker ends the run instead
    result = job.get(timeout=30)
    assert (result["stop_reason"], result["ok"], result["output"]) == ("error", False, ""), c.log("w3")
    assert (result["error"] or "").startswith(
        f"run {c.id('poison')} abandoned after 2 attempt(s) (max_attempts=2)"
    )
    assert f"thinkloop runs show {c.id('poison')} --store " in (result["error"] or "")
    lines = c.lines()
    assert len([line for line in lines if line.startswith("record:")]) == 1
    assert len([line for line in lines if line.startswith("slow-start:")]) == 2  # not a third time
    state = load(c.dsn, c.id("poison"))
    assert state.finished and state.error == result["error"] and state.metadata["abandoned"]["attempts"] == 2
    stopped(c, "w3", last)
    time.sleep(0.5)  # a message it still held would be back in the queue by now (see above)
    assert queued(c, 0) == 0  # acknowledged: never delivered again


def test_a_run_whose_worker_dies_before_its_first_save_every_time_is_failed_after_max_attempts(
    cluster: Callable[..., Cluster],
) -> None:
    c = cluster("amqp", TL_KILL_MAKE="1", TL_MAX_ATTEMPTS="2")  # make_agent() SIGKILLs its worker, every time
    job = c.run_agent.submit("early", run_id=c.id("early"))
    for attempt in (1, 2, 3):  # 3: the delivery meant to end the run dies as well (in make_agent())
        worker = c.worker(f"w{attempt}", pool="solo")
        assert worker.wait(60) == -signal.SIGKILL, c.log(f"w{attempt}")
        assert queued(c, 1) == 1  # RabbitMQ requeued the unacknowledged message
        assert load(c.dsn, c.id("early")) is None  # nothing in the store counted it
    c.worker("w4", pool="solo", TL_KILL_MAKE="")  # the fourth fails the task without building an agent
    with pytest.raises(
        Exception, match=r"abandoned: its message was delivered 3 time\(s\) \(max_attempts=2\)"
    ):
        job.get(timeout=60)
    made = c.lines()
    assert len(made) == 3 and all(line.startswith("make:1:") for line in made)  # w4 built no agent
    assert queued(c, 0) == 0  # acknowledged: never delivered again


def test_only_a_store_failing_is_worth_another_delivery_not_a_corrupt_state() -> None:
    """A corrupt state is told from a store failure by distributed's `CorruptRunError` (both StateErrors)."""
    from thinkloop.celery import _StoreRetries
    from thinkloop.distributed import CorruptRunError

    assert _StoreRetries.transient(StateError("the store did not answer within 30 s"))
    assert not _StoreRetries.transient(CorruptRunError("run 'r': corrupt run state: …"))
    assert not _StoreRetries.transient(UserError("a bad goal")) and not _StoreRetries.transient(OSError())


def test_a_run_whose_state_is_corrupt_fails_with_a_clear_error_and_is_not_redelivered(
    cluster: Callable[..., Cluster],
) -> None:
    import asyncio

    import psycopg

    from thinkloop import RunState

    c = cluster("amqp")
    run_id = c.id("broken")

    async def save() -> None:
        async with PostgresStore(c.dsn) as store:
            await store.checkpoint(RunState(run_id=run_id, goal="broken"), [])

    asyncio.run(save())
    with psycopg.connect(c.dsn, autocommit=True) as conn:
        conn.execute("UPDATE thinkloop_runs SET state = %s WHERE run_id = %s", ('{"step": "three"}', run_id))
    job = c.run_agent.submit("broken", run_id=run_id)
    worker = c.worker("w1", pool="solo")
    with pytest.raises(
        Exception, match=f"run '{run_id}' in .*: corrupt run state: .* so this job cannot run it"
    ) as failed:
        job.get(timeout=30)
    assert "submit the goal again under a new run id" in str(failed.value)
    assert job.state == "FAILURE" and worker.poll() is None  # the worker lives on
    stopped(c, "w1", worker)
    time.sleep(0.5)  # a message it still held would be back in the queue by now
    assert queued(c, 0) == 0  # acknowledged: not delivered again and again
    assert c.lines() == []


def logged(c: Cluster, name: str, text: str, timeout: float = 60) -> None:
    """Wait until the worker `name` has logged `text` (its log only grows)."""
    deadline = time.monotonic() + timeout
    while text not in c.log(name):
        assert time.monotonic() < deadline, f"{name} did not log {text!r} within {timeout} s: {c.log(name)}"
        time.sleep(0.05)


def test_a_store_that_fails_mid_run_retries_the_task_and_the_retry_resumes_the_run(
    cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    """The real PostgreSQL store fails — its runs table locked past the store's timeout — when the run's
    `slow` call ends, after `record`: the task is retried through the broker, and the retry resumes the
    run once the store is back, without running `record` again."""
    import psycopg

    go = tmp_path / "go"
    c = cluster("redis", TL_SLOW_UNTIL=str(go), TL_STORE_TIMEOUT="2", TL_STORE_RETRY_DELAY="0.5")
    job = c.run_agent.submit("flaky", run_id=c.id("flaky"))
    c.worker("w1", pool="solo")
    c.wait_for("slow-start:flaky:", timeout=60)
    with psycopg.connect(c.dsn) as locker:  # a transaction: the lock holds until it ends
        locker.execute("LOCK TABLE thinkloop_runs IN ACCESS EXCLUSIVE MODE")
        go.touch()  # `slow` ends; saving its result (and then the run's end) waits past the timeout
        logged(c, "w1", f"run {c.id('flaky')}: its store failed (the PostgreSQL store")
        logged(c, "w1", "s (retry 1 of 5)")  # retried through the broker, after a delay
    result = job.get(timeout=60)  # the lock is released: the retry goes on from the last checkpoint
    assert (result["output"], result["stop_reason"]) == ("done flaky", "final_answer"), c.log("w1")
    lines = c.lines()
    assert len([line for line in lines if line.startswith("record:")]) == 1  # never again
    assert len([line for line in lines if line.startswith("slow-start:")]) == 2  # idempotent: run again
    state = load(c.dsn, c.id("flaky"))
    assert state.finished and state.metadata["attempts"] >= 2  # resumed (a busy machine may retry again)
    assert f"resuming run {c.id('flaky')}" in c.log("w1")


# =============================================================================== in this process


@tool
def write(note: str) -> str:
    """Write a note (a side effect)."""
    WRITTEN.append(note)
    return f"wrote {note}"


WRITTEN: list[str] = []


def _model() -> FunctionModel:
    return FunctionModel(
        lambda r: (
            {"tool_calls": [{"name": "write", "args": {"note": r.messages[1].content}}]}
            if r.turn == 0
            else "written"
        )
    )


def test_the_task_starts_a_new_run_resumes_an_unfinished_one_and_returns_a_finished_one(
    tmp_path: Path,
) -> None:
    import asyncio

    db = tmp_path / "runs.db"
    app = Celery("local", broker="memory://", backend="cache+memory://")
    app.conf.task_store_eager_result = True
    run_agent = agent_task(
        app, lambda: Agent(_model(), tools=[write], store=SQLiteStore(db)), name="local.run"
    )
    WRITTEN.clear()
    try:
        fresh = run_agent.task.apply(args=("one",), task_id="r1").get()
        assert fresh["output"] == "written" and WRITTEN == ["one"]
        assert run_agent.task.apply(args=("one",), task_id="r1").get() == fresh and WRITTEN == ["one"]

        async def leave_unfinished() -> None:  # a run whose worker stopped after its tool call
            thinking = asyncio.Event()

            async def stall() -> str:
                thinking.set()
                await asyncio.sleep(60)
                return "never"

            stopper = FunctionModel(
                lambda r: (
                    {"tool_calls": [{"name": "write", "args": {"note": "two"}}]} if r.turn == 0 else stall()
                )
            )
            async with SQLiteStore(db) as store:
                agent = Agent(stopper, tools=[write], store=store)
                task = asyncio.create_task(agent.run("two", run_id="r2"))
                await asyncio.wait_for(thinking.wait(), 10)
                assert agent.interrupt("r2") == ["r2"]
                with pytest.raises(asyncio.CancelledError):
                    await task

        asyncio.run(leave_unfinished())
        resumed = run_agent.task.apply(args=("two",), task_id="r2").get()
        assert resumed["output"] == "written" and resumed["steps"] == 2 and WRITTEN == ["one", "two"]
    finally:
        run_agent.host.close()


def test_agent_task_configures_redelivery_and_checks_its_input(tmp_path: Path) -> None:
    app = Celery("cfg", broker="memory://")
    run_agent = agent_task(app, lambda: Agent(_model(), tools=[write]), name="cfg.run", rate_limit="10/s")
    task = run_agent.task
    # not `track_started`: the task writes STARTED itself, with its delivery count
    assert (task.acks_late, task.reject_on_worker_lost, task.track_started, task.rate_limit) == (
        True,
        True,
        False,
        "10/s",
    )
    assert (
        app.conf.worker_prefetch_multiplier == 1
        and app.conf.worker_cancel_long_running_tasks_on_connection_loss
    )
    mine = Celery("mine", broker="memory://")
    mine.conf.worker_prefetch_multiplier = 4
    assert agent_task(mine, lambda: Agent(_model()), acks_late=False).task.acks_late is False
    assert mine.conf.worker_prefetch_multiplier == 4  # the user's own setting is kept
    with pytest.raises(UserError, match="non-empty"):
        run_agent.submit("  ")
    with pytest.raises(ConfigurationError, match="run id"):
        run_agent.submit("x", run_id="../etc")
    with pytest.raises(
        ConfigurationError, match="shared store"
    ):  # the default store is this process's memory
        run_agent.task.apply(args=("x",), task_id="m1").get()
    run_agent.host.close()
    wrong = agent_task(Celery("wrong", broker="memory://"), lambda: "an agent", name="wrong.run")
    with pytest.raises(ConfigurationError, match="must return an Agent"):
        wrong.task.apply(args=("x",), task_id="w1").get()
    for bad in (0, -1, "3", 2.5, True):
        with pytest.raises(ConfigurationError, match=r"max_attempts must be a whole number ≥ 1 .*, got"):
            agent_task(Celery("bad", broker="memory://"), lambda: Agent(_model()), max_attempts=bad)
    for bad in (-1, "5", 2.5, True):
        with pytest.raises(ConfigurationError, match=r"store_retries must be a whole number ≥ 0 .*, got"):
            agent_task(Celery("bad", broker="memory://"), lambda: Agent(_model()), store_retries=bad)
    for bad in (0, -1.0, float("inf"), "2", False):
        with pytest.raises(ConfigurationError, match=r"store_retry_delay must be a positive number"):
            agent_task(Celery("bad", broker="memory://"), lambda: Agent(_model()), store_retry_delay=bad)


def test_by_default_the_task_abandons_a_run_after_three_attempts_that_died(tmp_path: Path) -> None:
    import asyncio

    from thinkloop.distributed import run_or_resume

    db = tmp_path / "runs.db"

    async def die_three_times() -> (
        None
    ):  # three attempts whose process "died" inside a tool (nothing saved after)
        hanging = asyncio.Event()

        @tool(idempotent=True)
        async def hang() -> str:
            """Wait."""
            hanging.set()
            await asyncio.sleep(30)
            return "never"

        model = FunctionModel(
            lambda r: {"tool_calls": [{"name": "hang", "args": {}}]} if r.turn == 0 else "done"
        )
        async with SQLiteStore(db) as store:
            agent = Agent(model, tools=[hang], store=store)
            for _ in range(3):
                hanging.clear()
                attempt = asyncio.create_task(run_or_resume(agent, "p1", "hang"))
                await asyncio.wait_for(hanging.wait(), 10)
                agent.interrupt("p1", save=False)
                with pytest.raises(asyncio.CancelledError):
                    await attempt

    asyncio.run(die_three_times())
    app = Celery("poison", broker="memory://", backend="cache+memory://")
    app.conf.task_store_eager_result = True
    run_agent = agent_task(
        app, lambda: Agent(_model(), tools=[write], store=SQLiteStore(db)), name="poison.run"
    )
    WRITTEN.clear()
    try:
        summary = run_agent.task.apply(args=("hang",), task_id="p1").get()
        assert (summary["stop_reason"], summary["ok"], summary["steps"]) == ("error", False, 1)
        assert (summary["error"] or "").startswith("run p1 abandoned after 3 attempt(s) (max_attempts=3)")
        assert WRITTEN == []  # nothing ran
        assert run_agent.task.apply(args=("hang",), task_id="p1").get() == summary  # ended for good
    finally:
        run_agent.host.close()


def test_the_task_result_is_the_json_summary_of_the_run_result(tmp_path: Path) -> None:
    result = Agent(_model(), tools=[write]).run_sync("three")
    summary = task_result(result)
    assert json.loads(json.dumps(summary)) == summary
    assert summary["output"] == "written" and summary["stop_reason"] == StopReason.FINAL_ANSWER.value
    assert summary["run_id"] == result.run_id and summary["usage"]["requests"] == result.usage.requests == 2


def test_deliveries_that_died_before_the_run_was_saved_count_as_attempts(tmp_path: Path) -> None:
    """Deliveries are counted in the result backend (the STARTED state): those whose process died before
    the run's first save — nothing in the store counts them — still lead to the run's end."""
    db = tmp_path / "runs.db"
    app = Celery("early", broker="memory://", backend="cache+memory://")
    app.conf.task_store_eager_result = True
    built: list[int] = []

    def make_agent() -> Agent:
        built.append(1)
        return Agent(_model(), tools=[write], store=SQLiteStore(db))

    run_agent = agent_task(app, make_agent, name="early.run", max_attempts=2)
    WRITTEN.clear()

    def died_after(run_id: str, deliveries: int) -> None:  # as the deliveries that died left it
        app.backend.store_result(
            run_id, {"pid": 1, "hostname": "w@h", "thinkloop_deliveries": deliveries}, "STARTED"
        )

    try:
        first = run_agent.task.apply(args=("fine",), task_id="ok1").get()  # counted, then finished
        assert first["output"] == "written" and WRITTEN == ["fine"]

        died_after("e1", 2)  # two deliveries died: the third ends the run instead of running it
        ended = run_agent.task.apply(args=("early",), task_id="e1").get()
        assert (ended["stop_reason"], ended["ok"]) == ("error", False) and WRITTEN == ["fine"]
        assert (ended["error"] or "").startswith("run e1 abandoned after 2 attempt(s) (max_attempts=2)")
        assert run_agent.task.apply(args=("early",), task_id="e1").get() == ended  # ended for good

        died_after("e2", 3)  # the one meant to end it died too (make_agent() itself may kill it)
        failed = run_agent.task.apply(args=("early",), task_id="e2")
        assert failed.state == "FAILURE"
        assert str(failed.result).startswith(
            "run e2 abandoned: its message was delivered 3 time(s) (max_attempts=2)"
        )
        assert WRITTEN == ["fine"]
    finally:
        run_agent.host.close()


class FlakyStore(SQLiteStore):
    """A real SQLite store that fails as an unreachable one does (the `StateError` the stores raise): its
    first `reads` reads of a run, and its first `saves` saves made once a tool call has ended."""

    def __init__(self, path: Path, *, reads: int = 0, saves: int = 0) -> None:
        super().__init__(path)
        self.failing_reads, self.failing_saves = reads, saves
        self.reads = 0
        self.failed: list[str] = []

    def _down(self, what: str) -> StateError:
        self.failed.append(what)
        return StateError(f"the SQLite store {self.path} failed: disk I/O error; check the disk")

    async def load_state(self, run_id: str) -> RunState | None:
        self.reads += 1
        if self.failing_reads > 0:
            self.failing_reads -= 1
            raise self._down("read")
        return await super().load_state(run_id)

    async def checkpoint(self, state: RunState, events: Sequence[Event]) -> None:
        if self.failing_saves > 0 and any(e.status == "done" for e in state.ledger.values()):
            self.failing_saves -= 1  # the tool ran, and its result cannot be saved
            raise self._down("save")
        await super().checkpoint(state, events)


def flaky_task(db: Path, store: FlakyStore, model: FunctionModel | None = None, **options: Any) -> Any:
    app = Celery("flaky", broker="memory://", backend="cache+memory://")
    app.conf.task_store_eager_result = True
    return agent_task(
        app, lambda: Agent(model or _model(), tools=[write], store=store), name="flaky.run", **options
    )


@pytest.mark.parametrize(
    ("fails", "failed", "attempts", "options"),
    [
        ({"reads": 4}, ["read"] * 4, 1, {}),  # the store cannot be read when the task starts
        ({"reads": 4}, ["read"] * 4, 1, {"ignore_result": True}),  # no RETRY state resets the count
        ({"saves": 2}, ["save"] * 2, 2, {}),  # nor written after the tool ran (nor the run's end after)
        ({"reads": 2, "saves": 2}, ["read", "read", "save", "save"], 2, {}),
    ],
    ids=["at-start", "at-start-results-ignored", "after-a-tool-call", "both"],
)
def test_a_store_that_fails_for_a_while_retries_the_task_and_the_run_finishes_once(
    fails: dict[str, int], failed: list[str], attempts: int, options: dict[str, Any], tmp_path: Path
) -> None:
    """Store failures retry the delivery (those before the run is saved are not attempts: 4 of them
    with `max_attempts=2` here); the retry resumes the run, and the tool that ran is not run again."""
    import asyncio

    db = tmp_path / "runs.db"
    store = FlakyStore(db, **fails)
    run_agent = flaky_task(db, store, store_retries=4, max_attempts=2, **options)
    WRITTEN.clear()
    try:
        job = run_agent.task.apply(args=("one",), task_id="f1")
        assert job.state == "SUCCESS", job.result
        summary = job.get()
        assert (summary["output"], summary["stop_reason"], summary["ok"]) == ("written", "final_answer", True)
        assert WRITTEN == ["one"]  # the side effect happened once
        assert store.failed == failed  # every failure was met, each by a delivery of its own
    finally:
        run_agent.host.close()

    async def saved() -> RunState | None:
        async with SQLiteStore(db) as plain:
            return await plain.load_state("f1")

    state = asyncio.run(saved())
    assert state is not None and state.finished and state.answer == "written"
    assert state.metadata["attempts"] == attempts  # resumed after the failure mid-run, not started again
    assert [e.name for e in state.ledger.values()] == ["write"]


def test_a_store_that_keeps_failing_fails_the_task_after_its_retries_with_the_stores_error(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    store = FlakyStore(db, reads=1_000)
    run_agent = flaky_task(db, store, store_retries=2)
    WRITTEN.clear()
    try:
        job = run_agent.task.apply(args=("one",), task_id="down1")
        assert job.state == "FAILURE"
        assert isinstance(job.result, StateError)
        assert str(job.result).startswith(
            f"run down1: its store failed on 3 deliveries (store_retries=2), the last time with: "
            f"the SQLite store {db} failed: disk I/O error"
        )
        assert "submit the goal again with the same run id" in str(job.result)
        assert store.reads == 3 and WRITTEN == []  # one try per delivery: the first and two retries

        store.failing_reads = 0  # the store is back: submitting the run id again runs it
        assert run_agent.task.apply(args=("one",), task_id="down1").get()["output"] == "written"
        assert WRITTEN == ["one"]
    finally:
        run_agent.host.close()


def test_a_runs_own_errors_end_it_at_once_and_are_not_retried(tmp_path: Path) -> None:
    def broken(request: Any) -> str:
        raise RuntimeError("the model is down")

    db = tmp_path / "runs.db"
    store = FlakyStore(db)
    run_agent = flaky_task(db, store, FunctionModel(broken), store_retries=3)
    try:
        ended = run_agent.task.apply(args=("one",), task_id="own1")
        assert ended.state == "SUCCESS"  # the run ended (with an error); the task did its job
        summary = ended.get()
        assert (summary["stop_reason"], summary["ok"]) == ("error", False)
        assert "the model is down" in (summary["error"] or "")
        assert store.reads == 1  # one delivery

        bad = run_agent.task.apply(args=("two",), kwargs={"budget": {"max_stepz": 3}}, task_id="own2")
        assert bad.state == "FAILURE" and "is not a budget" in str(bad.result)
        assert store.reads == 2 and store.failed == []  # one delivery each, none retried
    finally:
        run_agent.host.close()
