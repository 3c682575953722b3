"""Resume (SPEC §9.2), the tool-call ledger, conversation memory (§9.3) and the `runs` commands (§13.1)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from thinkloop import Agent, Budget, ConcurrencyError, Event, RunResult, RunState, StateError, UserError, tool
from thinkloop._events import RunStarted, ToolResultEvent
from thinkloop.stores import MemoryStore, SQLiteStore, Store
from thinkloop.testing import ScriptedModel


class Crash(BaseException):
    """Stands in for a process dying: nothing in thinkloop catches it."""


Predicate = Callable[[RunState, Sequence[Event]], bool]


def crashing(base: type[Store], when: Predicate, *, after: bool = False) -> type[Store]:
    """A store class that 'dies' before (or right after) writing the first checkpoint matching `when`."""

    class CrashingStore(base):  # type: ignore[valid-type,misc]
        armed = True

        async def checkpoint(self, state: RunState, events: Sequence[Event]) -> None:
            hit = self.armed and when(state, events)
            if hit and not after:
                self.armed = False
                raise Crash
            await super().checkpoint(state, events)
            if hit:
                self.armed = False
                raise Crash

    return CrashingStore


def observed(step: int) -> Predicate:
    """The checkpoint that saves a step's observations."""
    return lambda state, events: state.step == step and any(e.type == "tool_result" for e in events)


def ledger(call_id: str, status: str) -> Predicate:
    return lambda state, _: call_id in state.ledger and state.ledger[call_id].status == status


class Effects:
    """Tools whose every execution is counted: `send` (not idempotent) and `fetch` (idempotent)."""

    def __init__(self) -> None:
        self.runs: list[str] = []

        @tool
        def send(to: str) -> str:
            """Send a message (not idempotent)."""
            self.runs.append(f"send:{to}")
            return f"sent to {to}"

        @tool(idempotent=True)
        def fetch(key: str) -> str:
            """Fetch a value (idempotent)."""
            self.runs.append(f"fetch:{key}")
            return f"value of {key}"

        self.tools = [send, fetch]


SCRIPT: list[Any] = [
    {"tool_calls": [{"name": "fetch", "args": {"key": "k1"}}]},
    {"tool_calls": [{"name": "send", "args": {"to": "bob"}}]},
    {"tool_calls": [{"name": "fetch", "args": {"key": "k2"}}]},
    "all done",
]


def agent_for(store: Store, effects: Effects, **kwargs: Any) -> Agent:
    return Agent(ScriptedModel(SCRIPT, by_turn=True), tools=effects.tools, store=store, **kwargs)


async def crash_then_resume(when: Predicate, *, after: bool = False) -> tuple[Any, Effects, MemoryStore]:
    store = crashing(MemoryStore, when, after=after)()
    assert isinstance(store, MemoryStore)
    effects = Effects()
    with pytest.raises(Crash):
        await agent_for(store, effects).run("do the things", run_id="r")
    result = await agent_for(store, effects).resume("r")
    return result, effects, store


def observation(result: Any, call_id: str) -> str:
    return str(next(m.content for m in result.state.messages if m.tool_call_id == call_id))


# ============================================================================================== ledger


async def test_a_completed_call_is_never_executed_again() -> None:
    # dies just before the step's observation is saved: send() is done in the ledger, not yet observed
    result, effects, store = await crash_then_resume(observed(2))
    assert effects.runs == ["fetch:k1", "send:bob", "fetch:k2"]
    assert observation(result, "call_1_0") == "sent to bob"
    assert result.output == "all done" and result.steps == 4
    events = await store.read_events("r")
    replayed = [e for e in events if isinstance(e, ToolResultEvent) and e.call_id == "call_1_0"]
    assert len(replayed) == 1 and replayed[0].success


async def test_a_started_non_idempotent_call_is_not_run_again_and_the_model_is_told() -> None:
    # send() ran, then the process died before its result was saved
    result, effects, store = await crash_then_resume(ledger("call_1_0", "done"))
    assert effects.runs == ["fetch:k1", "send:bob", "fetch:k2"]  # not a second send
    assert observation(result, "call_1_0").startswith("Error: the outcome of send is unknown")
    assert result.state.ledger["call_1_0"].error_kind == "unknown_outcome"
    results = [e for e in await store.read_events("r") if isinstance(e, ToolResultEvent)]
    assert [(e.call_id, e.error_kind) for e in results if e.call_id == "call_1_0"] == [
        ("call_1_0", "unknown_outcome")
    ]
    assert result.output == "all done"


async def test_a_started_idempotent_call_is_run_again() -> None:
    result, effects, _ = await crash_then_resume(ledger("call_2_0", "done"))
    assert effects.runs == ["fetch:k1", "send:bob", "fetch:k2", "fetch:k2"]
    assert observation(result, "call_2_0") == "value of k2"


async def test_a_planned_call_runs_normally_on_resume() -> None:
    # the process dies while a person is being asked about send(): the reply was saved (planned in the
    # ledger) before the wait, no tool had started; on resume the person is asked again and it runs
    from thinkloop.safety import ApprovalDecision, SafetyController, SafetyPolicy, ToolRule

    def dies(request: Any) -> ApprovalDecision:
        raise Crash

    policy = SafetyPolicy(tools={"send": ToolRule(ask="always")})
    store, effects = MemoryStore(), Effects()
    with pytest.raises(Crash):
        await agent_for(store, effects, safety=SafetyController(policy, approval=dies)).run("go", run_id="r")
    saved = await store.load_state("r")
    assert saved is not None and saved.ledger["call_1_0"].status == "planned"
    assert effects.runs == ["fetch:k1"]

    approve = SafetyController(policy, approval=lambda request: ApprovalDecision.approve())
    result = await agent_for(store, effects, safety=approve).resume("r")
    assert effects.runs == ["fetch:k1", "send:bob", "fetch:k2"]
    assert observation(result, "call_1_0") == "sent to bob"
    assert result.state.tool_calls == 3


# ========================================================================================= continuity


async def test_resume_continues_with_the_same_counters_budget_and_script() -> None:
    at_step_two = crashing(MemoryStore, observed(2), after=True)
    store = at_step_two()
    effects = Effects()
    with pytest.raises(Crash):
        await agent_for(store, effects).run("go", run_id="r", budget=Budget(max_steps=3))
    saved = await store.load_state("r")
    assert saved is not None and saved.step == 2 and saved.budget["max_steps"] == 3

    model = ScriptedModel(SCRIPT, by_turn=True)
    result = await Agent(model, tools=effects.tools, store=store).resume("r")  # no budget given
    assert [r.turn for r in model.requests][:1] == [2]  # the script continues at its third reply
    assert result.steps == 3 and result.stop_reason.value == "max_steps"  # the run's own budget
    assert result.state.guards.total_calls == 3  # guard counters carried on
    assert result.state.usage.requests == len(model.requests) + 2
    assert result.state.elapsed >= saved.elapsed

    events = await store.read_events("r")
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    starts = [e for e in events if isinstance(e, RunStarted)]
    assert [s.resumed for s in starts] == [False, True]


async def test_a_run_resumed_with_another_model_names_it_and_uses_react_if_it_takes_no_tools() -> None:
    store = crashing(MemoryStore, observed(1), after=True)()
    effects = Effects()
    with pytest.raises(Crash):
        await agent_for(store, effects).run("go", run_id="r")
    saved = await store.load_state("r")
    assert saved is not None and saved.mode == "native"

    text_only = ScriptedModel(["Thought: done.\nFinal Answer: all done"], name="plain", tools=False)
    result = await Agent(text_only, tools=effects.tools, store=store).resume("r")
    assert result.output == "all done"
    assert result.state.model == "test:plain" and result.state.metadata["models"] == [
        saved.model,
        "test:plain",
    ]
    assert result.state.mode == "react" and text_only.requests[0].tools == []  # tools described in the prompt
    starts = [e for e in await store.read_events("r") if isinstance(e, RunStarted)]
    assert [s.model for s in starts] == [saved.model, "test:plain"]


async def test_a_finished_or_unknown_run_is_not_resumed() -> None:
    store = MemoryStore()
    agent = Agent(ScriptedModel(["hello"]), store=store)
    await agent.run("hi", run_id="over")
    with pytest.raises(StateError, match=r"run 'over' already ended \(final_answer\) and cannot be resumed"):
        await agent.resume("over")
    with pytest.raises(StateError, match="no run 'missing' in the store 'memory:'"):
        await agent.resume("missing")


async def test_two_resumers_of_one_run_cannot_both_continue(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    store = crashing(SQLiteStore, ledger("call_0_0", "done"), after=True)(db)
    effects = Effects()
    with pytest.raises(Crash):
        await agent_for(store, effects).run("go", run_id="r")
    await store.aclose()
    async with SQLiteStore(db) as one, SQLiteStore(db) as two:
        outcomes = await asyncio.gather(
            agent_for(one, effects).resume("r"), agent_for(two, effects).resume("r"), return_exceptions=True
        )
    finished = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, ConcurrencyError | StateError)]
    assert len(finished) == 1 and len(refused) == 1, outcomes
    assert effects.runs.count("send:bob") == 1


def test_resume_sync_and_the_default_in_memory_store() -> None:
    effects = Effects()
    agent = Agent(ScriptedModel(SCRIPT, by_turn=True), tools=effects.tools)  # no store: a MemoryStore
    assert isinstance(agent.store, MemoryStore)
    agent.store = crashing(MemoryStore, ledger("call_1_0", "started"), after=True)()
    with pytest.raises(Crash):
        agent.run_sync("go", run_id="r")
    assert agent.resume_sync("r").output == "all done"

    async def inside_a_loop() -> None:
        with pytest.raises(UserError, match="await agent.resume"):
            agent.resume_sync("r")

    asyncio.run(inside_a_loop())


# ============================================================================================= memory


async def test_a_session_carries_the_conversation_across_runs() -> None:
    store = MemoryStore()
    model = ScriptedModel(["Nice to meet you, Ada.", "Your name is Ada."])
    agent = Agent(model, store=store)
    await agent.run("My name is Ada.", session="chat-1")
    second = await agent.run("What is my name?", session="chat-1")

    seen = [(m.role, m.content, m.kind) for m in model.requests[1].messages if m.role != "system"]
    assert seen == [
        ("user", "My name is Ada.", "memory"),
        ("assistant", "Nice to meet you, Ada.", "memory"),
        ("user", "What is my name?", "task"),
    ]
    assert second.state.session == "chat-1"
    assert [m.content for m in await store.get_memory("chat-1")] == [
        "My name is Ada.",
        "Nice to meet you, Ada.",
        "What is my name?",
        "Your name is Ada.",
    ]
    other = await Agent(ScriptedModel(["?"]), store=store).run("Who am I?", session="chat-2")
    assert [m.kind for m in other.state.messages] == ["task", "reply"]


async def test_session_ids_are_checked_and_need_a_store() -> None:
    agent = Agent(ScriptedModel(["x"]))
    with pytest.raises(UserError, match="invalid session id '../../etc'"):
        await agent.run("hi", session="../../etc")

    class JustCheckpoints:
        async def checkpoint(self, state: RunState, events: list[Event]) -> None:
            pass

    with pytest.raises(UserError, match="needs a `Store`"):
        await Agent(ScriptedModel(["x"]), store=JustCheckpoints()).run("hi", session="s")


# =========================================================================================== the CLI


@pytest.fixture
def interrupted(tmp_path: Path) -> tuple[str, Path]:
    """An interrupted run in a SQLite file, made with a `script:FILE` model and the calculator."""
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps([{"tool_calls": [{"name": "calculator", "args": {"expression": "6*7"}}]}, "It is 42."])
    )
    db = tmp_path / "runs.db"
    from thinkloop.testing import load_script
    from thinkloop.tools import calculator

    async def make() -> None:
        store = crashing(SQLiteStore, ledger("call_0_0", "done"), after=True)(db)
        agent = Agent(load_script(script), tools=[calculator], store=store)
        with pytest.raises(Crash):
            await agent.run("What is 6*7?", run_id="cli-run", metadata={"cli": {"tools": "calculator"}})
        await store.aclose()

    asyncio.run(make())
    return f"sqlite://{db}", script


def _cli(*args: str) -> Any:
    from thinkloop.cli import app

    return CliRunner().invoke(app, ["runs", *args])


def test_runs_list_show_resume_replay_export(interrupted: tuple[str, Path]) -> None:
    url, script = interrupted
    listed = _cli("list", "--store", url, "--json")
    assert listed.exit_code == 0, listed.output
    rows = [json.loads(line) for line in listed.output.splitlines()]
    assert [(r["run_id"], r["status"]) for r in rows] == [("cli-run", "running")]

    shown = _cli("show", "cli-run", "--store", url)
    assert shown.exit_code == 0 and "unfinished (acting)" in shown.output
    assert "thinkloop runs resume cli-run" in shown.output

    resumed = _cli("resume", "cli-run", "--store", url)  # the recorded model, script:PATH, loads again
    assert resumed.exit_code == 0, resumed.output
    assert "(resumed)" in resumed.output and "It is 42." in resumed.output

    assert (
        _cli("resume", "cli-run", "--store", url).exit_code == 2
    )  # it ended: not resumed again (a usage error)
    replay = _cli("replay", "cli-run", "--store", url)
    assert replay.exit_code == 0
    assert (
        replay.output.count("run cli-run") >= 2
        and "calculator" in replay.output
        and "It is 42." in replay.output
    )

    exported = _cli("export", "cli-run", "--store", url)
    body = json.loads(exported.output)
    assert body["state"]["answer"] == "It is 42."
    assert [e["seq"] for e in body["events"]] == list(range(1, len(body["events"]) + 1))
    assert _cli("show", "nope", "--store", url).exit_code == 2


async def test_approvals_given_before_the_crash_are_not_asked_again() -> None:
    from thinkloop import RiskLevel
    from thinkloop.safety import ApprovalDecision, ApprovalRequest, SafetyController

    @tool(risk=RiskLevel.HIGH)
    def deploy(version: str) -> str:
        """Deploy a version (high risk: needs approval)."""
        return f"deployed {version}"

    asked: list[str] = []

    def approve_always(request: ApprovalRequest) -> ApprovalDecision:
        asked.append(request.arguments["version"])
        return ApprovalDecision(action="approve_always")

    script = [
        {"tool_calls": [{"name": "deploy", "args": {"version": "1.0"}}]},
        {"tool_calls": [{"name": "deploy", "args": {"version": "1.1"}}]},
        "deployed 1.0 then 1.1",
    ]

    def make(store: Store) -> Agent:
        gate = SafetyController("balanced", approval=approve_always)
        return Agent(ScriptedModel(script, by_turn=True), tools=[deploy], store=store, safety=gate)

    store = crashing(MemoryStore, observed(1), after=True)()
    with pytest.raises(Crash):
        await make(store).run("Deploy 1.0 then 1.1.", run_id="r")
    assert asked == ["1.0"]
    result = await make(store).resume("r")
    assert asked == ["1.0"]  # "approve always" was remembered in the run: 1.1 ran without asking
    assert result.output == "deployed 1.0 then 1.1"
    assert [a.decision for a in result.state.approvals] == ["approved_always", "approved_always"]


# ------------------------------------------------------------------------------------------ interrupt


def _call(name: str, **args: object) -> dict[str, object]:
    return {"tool_calls": [{"name": name, "args": args}]}


class SlowSecondTurn(ScriptedModel):
    """A scripted model whose second turn sets `thinking` and then waits (for an interrupt to come)."""

    def __init__(self, thinking: asyncio.Event, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.thinking = thinking

    async def request(self, request: Any) -> Any:
        if request.turn == 1 and not self.thinking.is_set():
            self.thinking.set()
            await asyncio.sleep(30)
        return await super().request(request)


class Asked(ScriptedModel):
    """A scripted model a test can await being asked for the n-th time (rather than sleep a guess)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._asked: dict[int, asyncio.Event] = {}

    def asked(self, n: int) -> asyncio.Event:
        return self._asked.setdefault(n, asyncio.Event())

    async def request(self, request: Any) -> Any:
        self.asked(len(self.requests) + 1).set()
        return await super().request(request)


async def _interrupt_when(agent: Agent, run_id: str, started: asyncio.Event, goal: str = "go") -> None:
    task = asyncio.create_task(agent.run(goal, run_id=run_id))
    await asyncio.wait_for(started.wait(), 5)
    assert agent.interrupt(run_id) == [run_id]
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_interrupted_run_is_saved_unfinished_and_resumes_where_it_stopped(tmp_path: Path) -> None:
    """Interrupted while the model thinks: the step that had no reply is taken again on resume."""
    calls: list[int] = []
    thinking = asyncio.Event()

    @tool
    def count(n: int) -> int:
        """Count a call."""
        calls.append(n)
        return n

    store = SQLiteStore(tmp_path / "runs.db")
    model = SlowSecondTurn(thinking, [_call("count", n=1), _call("count", n=2), "done"], by_turn=True)
    agent = Agent(model, tools=[count], store=store)
    await _interrupt_when(agent, "r1", thinking)
    state = await store.load_state("r1")
    assert state is not None and not state.finished and state.stop_reason is None
    assert state.step == 1 and state.metadata["interrupted"]["step"] == 1 and calls == [1]
    assert agent.interrupt("r1") == [] and agent.interrupt() == []  # nothing running any more

    result = await Agent(model, tools=[count], store=store).resume("r1")
    assert result.output == "done" and result.steps == 3 and result.tool_calls == 2 and calls == [1, 2]


async def test_a_tool_running_when_interrupted_is_settled_by_the_ledger(tmp_path: Path) -> None:
    running = asyncio.Event()
    effects: list[str] = []

    @tool
    async def transfer(amount: int) -> str:
        """Move money (not idempotent)."""
        effects.append(f"transfer {amount}")
        running.set()
        await asyncio.sleep(30)
        return "sent"

    store = SQLiteStore(tmp_path / "runs.db")
    script = [_call("transfer", amount=5), "checked"]
    agent = Agent(ScriptedModel(script, by_turn=True), tools=[transfer], store=store)
    await _interrupt_when(agent, "r2", running)
    state = await store.load_state("r2")
    assert state is not None and not state.finished
    assert [e.status for e in state.ledger.values()] == ["started"]

    result = await Agent(ScriptedModel(script, by_turn=True), tools=[transfer], store=store).resume("r2")
    assert effects == ["transfer 5"]  # never run twice
    observation = next(m.content for m in result.state.messages if m.role == "tool")
    assert "outcome of transfer is unknown" in observation and result.output == "checked"


async def test_interrupt_without_an_id_stops_every_run_of_the_agent_and_cancel_still_ends_them() -> None:
    model = Asked(["never"] * 4, latency=30)
    agent = Agent(model)
    tasks = [asyncio.create_task(agent.run("wait", run_id=f"run{i}")) for i in range(3)]
    await asyncio.wait_for(model.asked(3).wait(), 30)  # all three wait in the model
    assert sorted(agent.interrupt()) == ["run0", "run1", "run2"]
    for task in tasks:
        with pytest.raises(asyncio.CancelledError):
            await task
    for i in range(3):
        state = await agent.store.load_state(f"run{i}")  # type: ignore[attr-defined]
        assert state is not None and not state.finished and state.step == 0

    cancelled = asyncio.create_task(agent.run("wait", run_id="run9"))
    await asyncio.wait_for(model.asked(4).wait(), 30)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    state = await agent.store.load_state("run9")  # type: ignore[attr-defined]
    assert state is not None and state.finished and state.stop_reason == "cancelled"


async def test_a_resumed_run_interrupted_or_cancelled_while_it_reruns_a_pending_call(tmp_path: Path) -> None:
    """The calls a resumed run settles first are inside the loop's handlers: an interrupt there saves the
    run unfinished (and it resumes again), a cancellation ends it as cancelled (both escaped before)."""
    running = asyncio.Event()
    release = asyncio.Event()
    fetches: list[str] = []

    @tool(idempotent=True)
    async def fetch(key: str) -> str:
        """Fetch a value (idempotent: re-run on resume)."""
        fetches.append(key)
        running.set()
        await release.wait()
        return f"value of {key}"

    store = SQLiteStore(tmp_path / "runs.db")
    script = [_call("fetch", key="k"), "got it"]

    def agent() -> Agent:
        return Agent(ScriptedModel(script, by_turn=True), tools=[fetch], store=store)

    await _interrupt_when(agent(), "r3", running)  # interrupted in the run's own call
    assert fetches == ["k"]
    first = await store.load_state("r3")
    assert first is not None

    for how in ("interrupt", "cancel"):
        running.clear()
        resumer = agent()
        task = asyncio.create_task(resumer.resume("r3"))
        await asyncio.wait_for(running.wait(), 5)  # the pending call is being run again
        if how == "interrupt":
            assert resumer.interrupt("r3") == ["r3"]
        else:
            task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        state = await store.load_state("r3")
        assert state is not None
        if how == "interrupt":
            assert not state.finished and state.metadata["interrupted"]["step"] == 1
            assert state.metadata["interrupted"]["at"] > first.metadata["interrupted"]["at"]  # saved again
            assert state.ledger[next(iter(state.ledger))].status == "started"
        else:
            assert state.finished and state.stop_reason == "cancelled"
    assert fetches == ["k", "k", "k"]

    with pytest.raises(StateError, match="already ended"):
        await agent().resume("r3")


async def test_a_run_interrupted_while_it_is_set_up_is_saved_unfinished_and_resumes(tmp_path: Path) -> None:
    """`interrupt()` before the run's loop (its store slow to take the first save, MCP servers connecting,
    lessons recalled): the agent did not know the run yet, returned [] and the run went on."""
    saving = asyncio.Event()

    class SlowFirstSave(SQLiteStore):
        saves = 0

        async def checkpoint(self, state: RunState, events: Sequence[Event]) -> None:
            self.saves += 1
            if self.saves == 1:
                saving.set()
                await asyncio.sleep(60)  # a store slow to answer: the interruption comes meanwhile
            await super().checkpoint(state, events)

    @tool
    def count(n: int) -> int:
        """Count a call."""
        return n

    store = SlowFirstSave(tmp_path / "runs.db")
    model = ScriptedModel([_call("count", n=1), "done"], by_turn=True)
    agent = Agent(model, tools=[count], store=store)
    await _interrupt_when(agent, "r1", saving, goal="count")
    state = await store.load_state("r1")
    assert state is not None and not state.finished and state.step == 0
    assert state.metadata["interrupted"]["step"] == 0 and model.requests == []
    result = await Agent(model, tools=[count], store=store).resume("r1")
    assert result.output == "done" and result.steps == 2 and result.tool_calls == 1


async def test_a_call_a_person_denied_is_not_asked_about_again_on_resume(tmp_path: Path) -> None:
    # One reply: delete_db (high risk, denied) and note, which was running when the process died. The
    # denied call stayed "planned" in the ledger, so the resumed run asked again — and, approved, ran it.
    from thinkloop import RiskLevel
    from thinkloop.safety import ApprovalDecision, SafetyController

    effects: list[str] = []
    asked: list[str] = []
    crashing = [True]

    @tool(risk=RiskLevel.HIGH)
    async def delete_db(name: str) -> str:
        """Delete a database."""
        effects.append(f"deleted {name}")
        return f"deleted {name}"

    @tool
    async def note(text: str) -> str:
        """Take a note."""
        if crashing[0]:
            await asyncio.sleep(0.01)
            raise Crash
        return f"noted {text}"

    def answering(action: str) -> Callable[[Any], ApprovalDecision]:
        def approval(request: Any) -> ApprovalDecision:
            asked.append(f"{request.tool}: {action}")
            return ApprovalDecision(action=action)  # type: ignore[arg-type]

        return approval

    calls = [{"name": "delete_db", "args": {"name": "prod"}}, {"name": "note", "args": {"text": "x"}}]
    script = [{"tool_calls": calls}, "done"]

    def agent(action: str) -> Agent:
        safety = SafetyController("balanced", approval=answering(action))
        store = SQLiteStore(tmp_path / "runs.db")
        return Agent(ScriptedModel(script, by_turn=True), tools=[delete_db, note], store=store, safety=safety)

    with pytest.raises(Crash):
        await agent("deny").run("go", run_id="r")
    crashing[0] = False
    result = await agent("approve").resume("r")
    assert asked == ["delete_db: deny"] and effects == []
    assert [(a.tool, a.decision) for a in result.state.approvals] == [
        ("delete_db", "denied"),
        ("note", "auto"),
    ]
    outputs = [m.content for m in result.state.messages if m.role == "tool"]
    assert outputs[0].startswith("Denied: the call of delete_db was not approved")
    assert outputs[1].startswith("Error: the outcome of note is unknown")  # it was running: not run again


async def test_two_resumes_of_one_run_at_once_on_the_default_store_run_its_tools_once() -> None:
    # The default in-process store has no version check: both resumes went ahead and paid twice.
    effects: list[int] = []
    crashing = [True]

    @tool
    async def pay(amount: int) -> str:
        """Pay an amount."""
        if crashing[0]:
            raise Crash
        await asyncio.sleep(0.05)
        effects.append(amount)
        return f"paid {amount}"

    script = [{"tool_calls": [{"name": "pay", "args": {"amount": n}}]} for n in (1, 2)] + ["done"]
    agent = Agent(ScriptedModel(script, by_turn=True, latency=0.01), tools=[pay])
    with pytest.raises(Crash):
        await agent.run("go", run_id="r")
    crashing[0] = False
    first, second = await asyncio.gather(agent.resume("r"), agent.resume("r"), return_exceptions=True)
    assert isinstance(first, RunResult) and first.output == "done"
    assert isinstance(second, UserError) and "run 'r' is being run by this agent right now" in str(second)
    assert effects == [2]


async def test_when_a_save_fails_mid_batch_the_other_calls_are_stopped_before_the_run_raises(
    tmp_path: Path,
) -> None:
    # Two calls at once; the store fails as the second starts. run() raised "stopped unfinished", while the
    # first call went on, took effect and saved itself "done" afterwards — behind the caller's back.
    effects: list[str] = []
    saves = [0]

    class Flaky(SQLiteStore):
        async def checkpoint(self, state: RunState, events: Sequence[Event]) -> None:
            saves[0] += 1
            if saves[0] == 3:
                raise OSError("disk hiccup")
            await super().checkpoint(state, events)

    @tool
    async def slow(tag: str) -> str:
        """Do something slowly."""
        await asyncio.sleep(0.3)
        effects.append(tag)
        return f"slow {tag}"

    calls = [{"name": "slow", "args": {"tag": "a"}}, {"name": "slow", "args": {"tag": "b"}}]
    agent = Agent(
        ScriptedModel([{"tool_calls": calls}, "done"]), tools=[slow], store=Flaky(tmp_path / "r.db")
    )
    with pytest.raises(StateError, match="disk hiccup"):
        await agent.run("go", run_id="r")
    attempts = saves[0]
    await asyncio.sleep(0.5)
    assert effects == [] and saves[0] == attempts  # nothing ran on, nothing was saved after the raise
    saved = await SQLiteStore(tmp_path / "r.db").load_state("r")
    assert saved is not None and sorted(e.status for e in saved.ledger.values()) == ["planned", "started"]


@pytest.mark.parametrize("value", ["ensemble-v2", 7, {"a": 1}])
async def test_a_user_metadata_key_thinkloop_records_under_does_not_crash_a_resume(value: Any) -> None:
    # `metadata={"models": "ensemble-v2"}`, then a resume with another model: 'str' has no 'append'.
    from thinkloop.testing import FunctionModel

    store = MemoryStore()

    def crashing(_: Any) -> str:
        raise Crash

    with pytest.raises(Crash):
        await Agent(FunctionModel(crashing, name="one"), store=store).run(
            "go", run_id="r", metadata={"models": value, "mode_switches": value, "context_shrinks": value}
        )
    result = await Agent(ScriptedModel(["done"]), store=store).resume("r")
    assert result.output == "done" and result.state.metadata["models"] == ["test:one", "test:script"]


async def test_a_run_interrupted_in_its_forced_final_call_asks_for_the_answer_once_on_resume(
    tmp_path: Path,
) -> None:
    from thinkloop.testing import FunctionModel

    hang = [True]
    waiting = asyncio.Event()

    async def reply(request: Any) -> Any:
        if not request.tools:  # the forced final-answer call (no tools)
            if hang[0]:
                hang[0] = False
                waiting.set()
                await asyncio.sleep(30)
            return "best effort"
        return {"tool_calls": [{"name": "rec", "args": {"tag": f"t{request.turn}"}}]}

    @tool
    async def rec(tag: str) -> str:
        """Record a tag."""
        return f"rec {tag}"

    def agent() -> Agent:
        return Agent(
            FunctionModel(reply),
            tools=[rec],
            store=SQLiteStore(tmp_path / "r.db"),
            budget=Budget(max_steps=2),
        )

    first = agent()
    task = asyncio.create_task(first.run("go", run_id="r"))
    await asyncio.wait_for(waiting.wait(), 10)
    assert first.interrupt("r")
    with pytest.raises(asyncio.CancelledError):
        await task
    again = agent()
    result = await again.resume("r")
    assert result.output == "best effort"
    assert sum(m.kind == "final_prompt" for m in result.state.messages) == 1
    final_request = again.model.requests[-1]  # type: ignore[attr-defined]
    assert [m.role for m in final_request.messages] == ["system", "user", "user"]
