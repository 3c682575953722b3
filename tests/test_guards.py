"""The guards (SPEC §4.5–4.8, §5.1): scripted scenarios for every guard, through the real loop."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from typing import Any

import pytest

from thinkloop import (
    Agent,
    Budget,
    ConfigurationError,
    GuardConfig,
    ModelRequest,
    RunState,
    StopReason,
    ToolCall,
    tool,
)
from thinkloop._events import Event, Hint, ModeSwitched, ToolCallEvent, ToolResultEvent
from thinkloop._execute import GateDecision, ToolOutcome
from thinkloop._guards import Guards, hint_rounds, signature
from thinkloop._loop import run_loop
from thinkloop.testing import FunctionModel, ScriptedModel


def call(name: str, **args: object) -> dict[str, object]:
    return {"tool_calls": [{"name": name, "args": args}]}


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    a, b = expression.replace(" ", "").split("*")
    return str(int(a) * int(b))


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


@tool
def broken(x: int) -> str:
    """Always fails the same way."""
    raise RuntimeError("the service is down")


def is_final(request: ModelRequest) -> bool:
    return request.messages[-1].kind == "final_prompt"


def run(agent: Agent, goal: str = "What is 17 * 23?") -> tuple[Any, list[Event]]:
    events: list[Event] = []
    result = asyncio.run(agent.run(goal, on_event=events.append))
    return result, events


# =========================================================================================== signatures


def test_signature_ignores_key_order_and_whitespace() -> None:
    a = ToolCall(id="1", name="f", arguments={"a": 1, "b": [1, 2]})
    b = ToolCall(id="2", name="f", arguments={"b": [1, 2], "a": 1})
    raw = ToolCall(id="3", name="f", raw_arguments="  {oops \n")
    raw2 = ToolCall(id="4", name="f", raw_arguments="{oops")
    assert signature(a) == signature(b) == 'f:{"a":1,"b":[1,2]}'
    assert signature(raw) == signature(raw2)
    assert signature(a) != signature(ToolCall(id="5", name="g", arguments={"a": 1, "b": [1, 2]}))
    long_a = ToolCall(id="6", name="write", arguments={"text": "x" * 5000, "path": "a"})
    long_b = ToolCall(id="7", name="write", arguments={"path": "a", "text": "x" * 5000})
    assert signature(long_a) == signature(long_b) and len(signature(long_a)) < 40
    assert signature(long_a) != signature(ToolCall(id="8", name="write", arguments={"text": "y" * 5000}))


# ============================================================================================ repeats


@pytest.mark.parametrize("native", [True, False])
def test_model_repeating_a_call_ten_times_stops_as_dangerous_loop_with_the_known_answer(
    native: bool,
) -> None:
    def reply(request: ModelRequest) -> object:
        if is_final(request):
            return "Final Answer: 17 * 23 = 391"
        if native:
            return call("calculator", expression="17*23")
        return 'Thought: compute it\nAction: calculator\nAction Input: {"expression": "17*23"}'

    model = FunctionModel(reply, tools=native)
    result, events = run(Agent(model, tools=[calculator]))

    assert result.stop_reason is StopReason.DANGEROUS_LOOP
    assert result.forced_final and result.output == "17 * 23 = 391"
    assert "repeating" in (result.error or "")
    assert result.steps == 5 and result.tool_calls == 3  # 3 ran, the 4th and 5th were blocked
    decisions = [e.decision for e in events if isinstance(e, ToolCallEvent)]
    assert decisions.count("blocked") == 2
    tool_texts = [m.content for m in result.state.messages if m.role == "tool"]
    assert tool_texts[0] == "391"
    assert all("already made this exact call" in t for t in tool_texts[1:3])
    assert all(t.startswith("Blocked: calculator was already called") for t in tool_texts[3:])
    assert result.state.guards.blocked_calls == 2
    assert result.state.messages[-2].kind == "final_prompt"


def test_forced_answer_that_is_another_tool_call_falls_back_to_the_last_result() -> None:
    def reply(request: ModelRequest) -> object:
        if is_final(request):  # a small model keeps "calling" even when told to answer
            return 'Action: calculator\nAction Input: {"expression": "17*23"}'
        return call("calculator", expression="17 * 23")

    result, _ = run(Agent(FunctionModel(reply), tools=[calculator]))
    assert result.stop_reason is StopReason.DANGEROUS_LOOP
    assert result.output == "391" and result.forced_final


def test_without_final_answer_call_the_last_successful_result_is_the_answer() -> None:
    model = FunctionModel(lambda r: call("calculator", expression="17*23"))
    result, _ = run(Agent(model, tools=[calculator], final_answer_on_stop=False))
    assert result.stop_reason is StopReason.DANGEROUS_LOOP
    assert result.output == "391" and not result.forced_final
    assert len(model.requests) == 5


def test_a_repeat_after_a_different_call_is_still_counted() -> None:
    script = [
        call("calculator", expression="2*3"),
        call("lookup", key="x"),
        call("calculator", expression="2*3"),
        call("calculator", expression="2*3"),
        call("calculator", expression="2*3"),
        "done",
    ]
    result, events = run(Agent(ScriptedModel(script), tools=[calculator, lookup]))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    blocked = [e for e in events if isinstance(e, ToolCallEvent) and e.decision == "blocked"]
    assert len(blocked) == 1 and blocked[0].step == 5
    assert result.state.guards.consecutive_blocked == 1


def test_max_identical_calls_is_configurable() -> None:
    model = FunctionModel(lambda r: "ok" if is_final(r) else call("lookup", key="k"))
    guards = GuardConfig(max_identical_calls=1, max_blocked_steps=1)
    result, _ = run(Agent(model, tools=[lookup], guards=guards))
    assert result.stop_reason is StopReason.DANGEROUS_LOOP
    assert result.steps == 2 and result.tool_calls == 1


# ========================================================================================= alternation


def test_alternating_two_calls_is_blocked_then_stopped() -> None:
    calls = itertools.cycle([call("lookup", key="a"), call("lookup", key="b")])
    model = FunctionModel(lambda r: "the values" if is_final(r) else next(calls))
    result, events = run(Agent(model, tools=[lookup]))

    assert result.stop_reason is StopReason.DANGEROUS_LOOP
    assert result.output == "the values"
    assert result.steps == 6 and result.tool_calls == 4  # a, b, a, b ran; a and b were then blocked
    tool_texts = [m.content for m in result.state.messages if m.role == "tool"]
    assert tool_texts[4].startswith("Blocked: you are alternating")
    assert [e.decision for e in events if isinstance(e, ToolCallEvent)][4:] == ["blocked", "blocked"]


def test_alternation_with_changing_results_is_polling_and_runs() -> None:
    ticks = itertools.count()

    @tool
    def status(job: str) -> str:
        """A job's status."""
        return f"running ({next(ticks)})"

    @tool
    def wait(seconds: int) -> str:
        """Wait."""
        return "waited"

    script = [call("status", job="j"), call("wait", seconds=1)] * 3 + ["finished"]
    result, events = run(Agent(ScriptedModel(script), tools=[status, wait]))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.tool_calls == 6
    assert not [e for e in events if isinstance(e, ToolCallEvent) and e.decision == "blocked"]
    notes = [m.name for m in result.state.messages if "already made this exact call" in m.content]
    assert notes == ["wait", "wait"]  # the status polls got new results: no "repeat" note


def test_polling_one_call_whose_result_changes_runs_until_it_is_done_then_up_to_max_polls() -> None:
    # the fourth identical poll was blocked ("the earlier result stands", though every result was new)
    # and the run stopped as dangerous_loop before the job finished
    progress = itertools.count(10, 10)

    @tool
    def job_status(job: str) -> str:
        """A job's status."""
        done = next(progress)
        return f"running: {done}% done" if done < 70 else "finished: result=42"

    script = [call("job_status", job="j1")] * 7 + ["The result is 42."]
    result, events = run(Agent(ScriptedModel(script), tools=[job_status], budget=Budget(max_steps=16)))
    assert (result.stop_reason, result.output, result.tool_calls) == (
        StopReason.FINAL_ANSWER,
        "The result is 42.",
        7,
    )
    assert not [e for e in events if isinstance(e, ToolCallEvent) and e.decision == "blocked"]

    ticks = itertools.count()

    @tool
    def clock(zone: str) -> str:
        """The time."""
        return f"12:00:{next(ticks):02d}"

    script = [call("clock", zone="UTC")] * 14 + ["noon"]
    result, events = run(Agent(ScriptedModel(script), tools=[clock], budget=Budget(max_steps=20)))
    blocked = [e for e in events if isinstance(e, ToolCallEvent) and e.decision == "blocked"]
    assert result.stop_reason is StopReason.DANGEROUS_LOOP and len(blocked) == 2  # then 2 were blocked
    assert result.tool_calls == 10
    told = [m.content for m in result.state.messages if m.role == "tool"][-2]  # the first one blocked
    assert "Its result kept changing, but waiting longer will not help" in told


def test_a_call_failing_again_and_again_with_changing_errors_is_blocked_as_before() -> None:
    attempts = itertools.count(1)

    @tool
    def fetch(url: str) -> str:
        """Fetch a page."""
        raise ConnectionError(f"connection refused (attempt {next(attempts)})")

    script = [call("fetch", url="http://x")] * 8 + ["gave up"]
    result, events = run(Agent(ScriptedModel(script), tools=[fetch]))
    blocked = [e for e in events if isinstance(e, ToolCallEvent) and e.decision == "blocked"]
    assert result.tool_calls == 3 and len(blocked) == 2  # three ran, the fourth and fifth were blocked


# ==================================================================================== repeated errors


def test_same_error_repeated_gets_a_hint_then_stops() -> None:
    args = itertools.count()
    model = FunctionModel(lambda r: "I could not" if is_final(r) else call("broken", x=next(args)))
    result, events = run(Agent(model, tools=[broken]))

    assert result.stop_reason is StopReason.DANGEROUS_LOOP
    assert "same error" in (result.error or "")
    assert result.steps == 4 and result.tool_calls == 4
    hints = [e for e in events if isinstance(e, Hint)]
    assert [(h.step, h.reason) for h in hints] == [(2, "repeated_error"), (4, "change_approach")]
    assert "last 2 steps failed with the same error" in hints[0].text
    assert result.state.guards.consecutive_failures == 4


def test_different_errors_each_time_end_as_no_progress() -> None:
    @tool
    def flaky(x: int) -> str:
        """Fails differently every time."""
        raise ValueError(f"bad input {x}")

    args = itertools.count()
    model = FunctionModel(lambda r: "gave up" if is_final(r) else call("flaky", x=next(args)))
    result, _ = run(Agent(model, tools=[flaky]))
    assert result.stop_reason is StopReason.NO_PROGRESS
    assert result.steps == 5 and result.output == "gave up" and result.forced_final
    assert "no new useful result" in (result.error or "")


def test_errors_differing_only_in_values_get_their_own_hint_but_do_not_stop_the_run() -> None:
    @tool
    def section(number: int, title: str = "x") -> str:
        """A handbook section."""
        raise LookupError(f"section {number} ({title!r}) is not available; available: 7")

    args = itertools.count(8)
    model = FunctionModel(
        lambda r: (
            "no such section" if is_final(r) else call("section", number=next(args), title=f"s{next(args)}")
        )
    )
    result, events = run(Agent(model, tools=[section]))

    assert result.stop_reason is StopReason.NO_PROGRESS  # not dangerous_loop: each call tried another value
    hints = [e for e in events if isinstance(e, Hint)]
    # the third guess gets the hint; at round 4 the "change approach" checkpoint is due: it says what goes wrong
    assert [(h.step, h.reason) for h in hints] == [(3, "similar_errors"), (4, "similar_errors")]
    assert "each time for another value" in hints[0].text and "which values exist" in hints[0].text
    assert "Tools not called yet" not in hints[0].text  # the only tool was called


def test_a_hint_to_a_model_guessing_values_names_the_tools_it_has_not_called() -> None:
    """The 1.5B model guessed 'Project X', 'Project Y' … for get_project, never calling get_ticket, the
    first step of the chain."""

    @tool
    def get_project(project: str) -> str:
        """A project's owner."""
        raise LookupError(f"no project named {project!r}")

    @tool
    def get_ticket(ticket_id: str) -> str:
        """A ticket's project."""
        return "T-88: project Borealis"

    @tool
    def get_contact(name: str) -> str:
        """A person's phone number."""
        return "+44 20 7946 0321"

    names = iter("XYZABCDEFG")
    model = FunctionModel(
        lambda r: "gave up" if is_final(r) else call("get_project", project=f"Project {next(names)}")
    )
    result, events = run(Agent(model, tools=[get_project, get_ticket, get_contact]))
    hints = [e for e in events if isinstance(e, Hint) and e.reason == "similar_errors"]
    assert hints and hints[0].text.endswith(" Tools not called yet: get_ticket, get_contact.")
    shown = [m.content for m in result.state.messages if m.kind == "hint"]
    assert hints[0].text in shown  # what the model sees, too


def test_error_fingerprints_keep_exact_errors_apart_and_group_similar_ones() -> None:
    from thinkloop._guards import _error_fingerprint, _similar_streak, _streak

    a = _error_fingerprint("section:section 8 is not available; available: 7")
    b = _error_fingerprint("section:section 9 is not available; available: 7")
    c = _error_fingerprint("get_project:no project named 'Project X'")
    d = _error_fingerprint('get_project:no project named "Project Y\'s"')
    e = _error_fingerprint("get_contact:no contact named 'Project X'")
    assert a != b and a.split("/")[1] == b.split("/")[1]
    assert c.split("/")[1] == d.split("/")[1] != e.split("/")[1]
    assert _streak([a, b]) == 1 and _similar_streak([a, b]) == 2
    assert _similar_streak(["0f1e", "0f1e"]) == 2  # a state saved before: the exact digests alone


# ==================================================================================== failure counting


def _outcome(success: bool, kind: str | None = None, output: str = "x") -> ToolOutcome:
    return ToolOutcome(ToolCall(id="c", name="t"), output, success, error_kind=kind)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["exception", "invalid_arguments", "unknown_tool", "denied", "timeout"])
def test_every_kind_of_failed_observation_counts_and_a_success_resets(kind: str) -> None:
    guards, state = Guards(), RunState()
    guards.observe(state, [_outcome(False, kind, "Error: 1")])
    guards.observe(state, [_outcome(False, kind, "Error: 2")])
    assert state.guards.consecutive_failures == 2
    guards.observe(state, [_outcome(True, None, "Error: this text does not make it a failure")])
    assert state.guards.consecutive_failures == 0
    assert state.guards.steps_without_progress == 0  # a new successful result is progress


def test_blocked_repeats_are_not_counted_as_failures() -> None:
    guards, state = Guards(), RunState()
    guards.observe(state, [_outcome(False, "exception")])
    guards.observe(state, [_outcome(False, "repeated_call", "Blocked: ...")])
    assert state.guards.consecutive_failures == 1
    assert state.guards.recent_errors and len(state.guards.recent_errors) == 1


def test_denied_calls_count_as_failures_in_a_run() -> None:
    class DenyAll:
        async def check(self, call: ToolCall, tool: object, risk: object, run: object) -> GateDecision:
            return GateDecision(False, "denied", reason="policy")

    args = itertools.count()
    model = FunctionModel(lambda r: "no" if is_final(r) else call("lookup", key=str(next(args))))
    result, _ = run(Agent(model, tools=[lookup], safety=DenyAll()))  # type: ignore[arg-type]
    assert result.stop_reason is StopReason.DANGEROUS_LOOP  # the same "Denied" answer four times
    assert result.state.guards.consecutive_failures == 4
    assert not any(entry.success for entry in result.state.ledger.values())  # nothing ran


# ======================================================================================== no progress


def test_new_calls_that_return_nothing_new_stop_as_no_progress() -> None:
    @tool
    def search(query: str) -> str:
        """Search."""
        return "no results"

    queries = itertools.count()
    model = FunctionModel(
        lambda r: "nothing found" if is_final(r) else call("search", query=f"q{next(queries)}")
    )
    result, events = run(Agent(model, tools=[search]))
    assert result.stop_reason is StopReason.NO_PROGRESS
    assert result.steps == 6  # step 1 found something new; steps 2-6 did not
    assert result.output == "nothing found" and result.forced_final
    assert [e.step for e in events if isinstance(e, Hint)] == []


def test_what_counts_as_useful_is_configurable() -> None:
    seen: list[str] = []

    def useful(outcome: ToolOutcome, _: object) -> bool:
        seen.append(outcome.output)
        return "found" in outcome.output

    keys = itertools.count()
    model = FunctionModel(lambda r: "done" if is_final(r) else call("lookup", key=str(next(keys))))
    guards = GuardConfig(is_useful=useful, no_progress_threshold=1)
    result, _ = run(Agent(model, tools=[lookup], guards=guards))
    assert result.stop_reason is StopReason.NO_PROGRESS
    assert result.steps == 3 and seen == ["value of 0", "value of 1", "value of 2"]


# ============================================================================================== hints


def test_hint_rounds_scale_with_max_steps() -> None:
    assert hint_rounds(16) == {"change_approach": 4, "summarise": 8, "answer_now": 12}
    assert hint_rounds(8) == {"change_approach": 2, "summarise": 4, "answer_now": 6}
    assert hint_rounds(32) == {"change_approach": 8, "summarise": 16, "answer_now": 24}
    assert hint_rounds(4)["answer_now"] == 3


def test_checkpoint_hints_are_user_messages_and_events() -> None:
    keys = itertools.count()
    model = FunctionModel(lambda r: "done" if is_final(r) else call("lookup", key=str(next(keys))))
    result, events = run(Agent(model, tools=[lookup]))

    assert result.stop_reason is StopReason.MAX_STEPS
    hints = [e for e in events if isinstance(e, Hint)]
    assert [(h.step, h.reason) for h in hints] == [(8, "summarise"), (12, "answer_now")]
    assert "only 4 step(s) left" in hints[1].text
    goal = result.state.goal
    assert f"The task: {goal} If the results so far answer it" in hints[0].text  # the task restated halfway
    hint_messages = [m for m in result.state.messages if m.kind == "hint"]
    assert [(m.role, m.step, m.content) for m in hint_messages] == [("user", h.step, h.text) for h in hints]


def test_change_approach_hint_at_round_four_when_calls_repeat() -> None:
    script = [call("lookup", key="a")] * 4 + ["done"]  # 3 of 4 calls are repeats
    result, events = run(Agent(ScriptedModel(script), tools=[lookup]))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert [(e.step, e.reason) for e in events if isinstance(e, Hint)] == [(4, "change_approach")]


def test_hint_texts_are_configurable_and_scaled_to_max_steps() -> None:
    keys = itertools.count()
    model = FunctionModel(lambda r: "done" if is_final(r) else call("lookup", key=str(next(keys))))
    guards = GuardConfig(hints={"answer_now": "Wrap up: {remaining} left."})
    agent = Agent(model, tools=[lookup], guards=guards, budget=Budget(max_steps=8))
    result, events = run(agent)
    assert [(e.step, e.text) for e in events if isinstance(e, Hint)][-1] == (6, "Wrap up: 2 left.")


def test_a_replacement_hint_keeps_placeholders_it_is_not_given() -> None:
    plain = GuardConfig(hints={"answer_now": "Only {remaining} left, {name}."})
    assert plain.hint("answer_now", remaining=2) == "Only 2 left, {name}."
    assert plain.hint("answer_now", remaining=2, name="x") == "Only 2 left, x."


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            'Summarise, as {"answer": "..."}.',
            r'\{"answer": "..."\} is no placeholder \(its placeholders: \{goal\}',
        ),
        ("Summarise {goal", "expected '}' before end of string"),
        ("Summarise {0}", r"\{0\} is no placeholder"),
        ("Summarise {goal!r}", r"\{goal!r\} is no placeholder"),
    ],
)
def test_a_replacement_hint_that_cannot_be_filled_in_is_refused_when_it_is_given(
    text: str, says: str
) -> None:
    """It raised at the step of the hint, after the run's tool calls, and left the run unfinished."""
    with pytest.raises(
        ConfigurationError, match=rf"GuardConfig hints\['summarise'\] cannot be filled in: {says}"
    ):
        GuardConfig(hints={"summarise": text})
    assert GuardConfig(hints={"summarise": "As {{'answer': ...}}: {goal}"}).hint("summarise", goal="g") == (
        "As {'answer': ...}: g"
    )


def test_checkpoint_hints_can_be_turned_off() -> None:
    keys = itertools.count()
    model = FunctionModel(lambda r: "done" if is_final(r) else call("lookup", key=str(next(keys))))
    result, events = run(Agent(model, tools=[lookup], guards=GuardConfig(checkpoint_hints=False)))
    assert not [e for e in events if isinstance(e, Hint)]
    assert not [m for m in result.state.messages if m.kind == "hint"]


# ========================================================================================== mode fallback


def test_malformed_native_tool_calls_switch_the_run_to_react() -> None:
    def reply(request: ModelRequest) -> object:
        if request.tools:  # native: broken argument JSON
            return {"tool_calls": [{"name": "calculator", "args": '{"expression": "17*23"'}]}
        if "Observation: 391" in request.messages[-1].content:
            return "Thought: I know it\nFinal Answer: 391"
        return 'Thought: compute\nAction: calculator\nAction Input: {"expression": "17*23"}'

    model = FunctionModel(reply)
    result, events = run(Agent(model, tools=[calculator]))

    assert result.stop_reason is StopReason.FINAL_ANSWER and result.output == "391"
    assert result.state.mode == "react"
    switches = [e for e in events if isinstance(e, ModeSwitched)]
    assert len(switches) == 1 and (switches[0].from_mode, switches[0].to_mode) == ("native", "react")
    assert result.state.metadata["mode_switches"] == [
        {"step": 2, "to": "react", "reason": "the model kept producing malformed tool calls"}
    ]
    assert [bool(r.tools) for r in model.requests] == [True, True, False, False]
    results = [e for e in events if isinstance(e, ToolResultEvent)]
    assert [e.error_kind for e in results] == ["invalid_arguments", "invalid_arguments", None]


def test_tool_calls_written_as_text_are_run_and_switch_to_react() -> None:
    def reply(request: ModelRequest) -> object:
        if request.messages[-1].role == "tool" or "Observation:" in request.messages[-1].content:
            return "Final Answer: 391"
        return '```json\n{"name": "calculator", "arguments": {"expression": "17*23"}}\n```'

    model = FunctionModel(reply)
    result, events = run(Agent(model, tools=[calculator]))
    assert result.stop_reason is StopReason.FINAL_ANSWER and result.output == "391"
    assert [(e.name, e.output) for e in result.state.ledger.values()] == [("calculator", "391")]
    # the first call written as text switches the run: the server does not parse the model's calls
    assert [(e.step, e.to_mode) for e in events if isinstance(e, ModeSwitched)] == [(1, "react")]
    assert [bool(r.tools) for r in model.requests] == [True, False]  # the result came back as an Observation
    assert "Observation: 391" in model.requests[1].messages[-1].content
    assert result.state.guards.malformed_native_replies == 0  # not a malformed call: no count

    events.clear()
    result, events = run(Agent(model, tools=[calculator], mode="react"))  # already in ReAct: no switch
    assert result.output == "391" and not [e for e in events if isinstance(e, ModeSwitched)]


@pytest.mark.parametrize(
    "written",
    [
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17*23"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2*2"}}\n</tool_call>',
        'Thought: two sums\n{"name": "calculator", "arguments": {"expression": "17*23"}}\n'
        '{"name": "calculator", "arguments": {"expression": "2*2"}}',
    ],
)
def test_several_calls_written_as_text_by_a_native_model_all_run(written: str) -> None:
    """A server without a tool-call parser hands back the model's calls as text: each one runs."""

    def reply(request: ModelRequest) -> object:
        if request.messages[-1].role == "tool" or "Observation:" in request.messages[-1].content:
            return "Final Answer: 391 and 4"
        return written

    model = FunctionModel(reply)
    result, _ = run(Agent(model, tools=[calculator], mode="native"))
    assert result.stop_reason is StopReason.FINAL_ANSWER and result.output == "391 and 4"
    assert [(e.name, e.arguments, e.output) for e in result.state.ledger.values()] == [
        ("calculator", {"expression": "17*23"}, "391"),
        ("calculator", {"expression": "2*2"}, "4"),
    ]
    assistant, *answers = result.state.messages[1:4]
    assert [m.tool_call_id for m in answers] == [c.id for c in assistant.tool_calls]  # each answered by id


@pytest.mark.parametrize(
    "written",
    [
        'Thought: compute\nAction: calculator\nAction Input: {"expression": "17*23"}',
        'calculator(expression="17*23")',
    ],
)
def test_a_react_step_or_a_code_call_written_by_a_native_model_runs(written: str) -> None:
    def reply(request: ModelRequest) -> str:
        last = request.messages[-1]
        return "Final Answer: 391" if last.role == "tool" or "Observation:" in last.content else written

    model = FunctionModel(reply)
    result, _ = run(Agent(model, tools=[calculator], mode="native"))
    assert result.output == "391" and result.tool_calls == 1
    assert [e.output for e in result.state.ledger.values()] == ["391"]


# ============================================================================================== resume


async def test_guard_counters_survive_serialisation_mid_run() -> None:
    model = FunctionModel(lambda r: "391" if is_final(r) else call("calculator", expression="17*23"))
    agent = Agent(model, tools=[calculator])
    first = await agent.run("What is 17 * 23?", budget=Budget(max_steps=3))
    assert first.stop_reason is StopReason.MAX_STEPS

    state = RunState.from_json(first.state.to_json())
    assert state.guards == first.state.guards
    assert state.guards.signature_counts == {'calculator:{"expression":"17*23"}': 3}
    state.phase, state.stop_reason, state.answer = "thinking", None, None  # continue the run
    state.messages = [m for m in state.messages if m.kind != "final_prompt"][:-1]
    run_ctx = agent._context(state, budget=Budget(max_steps=16), sinks=[], stream=False)
    result = await run_loop(run_ctx)

    assert result.stop_reason is StopReason.DANGEROUS_LOOP
    assert result.steps == 5 and result.tool_calls == 3  # steps 4 and 5 were blocked at once
    assert state.guards.blocked_calls == 2


async def test_a_run_resumed_after_a_crash_keeps_its_guard_counters() -> None:
    class Crash(BaseException):
        pass

    crashed: list[int] = []

    def reply(request: ModelRequest) -> object:
        if request.turn == 3 and not crashed:
            crashed.append(request.turn)
            raise Crash  # the process dies during step 4; the checkpoint of step 3 remains
        if is_final(request):
            return "391"
        return call("calculator", expression="17*23")

    agent = Agent(FunctionModel(reply), tools=[calculator])
    with pytest.raises(Crash):
        await agent.run("What is 17 * 23?", run_id="crashy")
    result = await agent.resume("crashy")

    assert result.stop_reason is StopReason.DANGEROUS_LOOP and result.output == "391"
    assert result.tool_calls == 3  # the 3 calls made before the crash; both calls after it were blocked
    assert result.state.guards.signature_counts == {'calculator:{"expression":"17*23"}': 5}


async def test_the_same_reasoning_repeated_with_varying_calls_is_a_loop() -> None:
    """A small model going in circles: the same thought each step, arguments that keep changing, results
    that bring nothing new."""
    forms = ["17*23", "23*17", "(17*23)", "17 * 23", "(23)*17", "17*(23)", "23 * 17", "(17)*(23)"]

    def reply(request: ModelRequest) -> object:
        if is_final(request):
            return "17 * 23 = 391"
        expression = forms[request.turn]  # a different call each step: no repeated-call guard fires
        thought = "The calculator may be wrong, so I will try the multiplication again."
        return {"text": thought, "tool_calls": [{"name": "calculator", "args": {"expression": expression}}]}

    events: list[Event] = []
    result = await Agent(FunctionModel(reply), tools=[calculator]).run(
        "What is 17 * 23?", on_event=events.append
    )
    assert result.stop_reason is StopReason.DANGEROUS_LOOP
    assert result.steps == 5 and result.output == "17 * 23 = 391"  # the first 391 was new
    assert [e.reason for e in events if e.type == "hint"] == ["repeated_thought"]  # type: ignore[union-attr]
    assert "same reasoning" in (result.error or "")


async def test_the_same_reasoning_for_each_of_several_items_is_not_a_loop() -> None:
    """A small model writes the same words before each lookup of a list (seen with the 0.5B and 1.5B
    models): every step brings a new result, so the run goes on to its answer."""
    cities = ["Paris", "Rome", "Oslo", "Lima", "Cairo", "Tokyo"]

    @tool
    def population(city: str) -> str:
        """The population of a city."""
        return f"{city}: {len(city)} million"

    def reply(request: ModelRequest) -> object:
        if request.turn < len(cities):
            thought = "I need to look up the population of the next city in the list."
            return {
                "text": thought,
                "tool_calls": [{"name": "population", "args": {"city": cities[request.turn]}}],
            }
        return "Done: " + ", ".join(f"{c} {len(c)} million" for c in cities)

    events: list[Event] = []
    result = await Agent(FunctionModel(reply), tools=[population]).run(
        "The population of " + ", ".join(cities), on_event=events.append
    )
    assert result.stop_reason is StopReason.FINAL_ANSWER, result.error
    assert result.tool_calls == 6 and result.output.startswith("Done: Paris 5 million")
    assert "repeated_thought" not in [getattr(e, "reason", None) for e in events]


def test_the_forced_final_prompt_lists_what_failed_and_what_worked() -> None:
    """After a hard stop the model is told which calls failed (so it says what could not be found instead
    of inventing it) and which worked; a call that failed and later worked is not listed as failed."""
    script = [
        call("broken", x=1),
        call("lookup", key="alpha"),
        call("broken", x=2),
        call("broken", x=1),
        "Alpha is known; the rest could not be found.",
    ]
    model = ScriptedModel(script)
    result = Agent(model, tools=[broken, lookup], budget=Budget(max_steps=4)).run_sync("Find alpha, 1 and 2")
    assert result.stop_reason is StopReason.MAX_STEPS and result.forced_final
    prompt = model.requests[-1].messages[-1].content
    failed = prompt.index("The tool calls that failed, with their errors:")
    worked = prompt.index("The tool calls that worked, with their results:")
    assert failed < worked < prompt.index("The task: Find alpha, 1 and 2")
    assert 'broken({"x": 2}) failed: Error: broken raised' in prompt
    assert prompt.count('broken({"x": 1}) failed') == 1  # listed once, at its latest failure
    assert 'lookup({"key": "alpha"}) -> ' in prompt


def test_the_forced_final_prompt_shows_json_results_with_their_characters() -> None:
    """The results listed for the forced answer are written as the model saw them in the run (`Kovač`, not
    `Kova\\u010d`, which small models copy into their answers)."""

    @tool
    def profile(user: str) -> str:
        """A user's profile, as JSON."""
        return json.dumps({"name": "Marta Kovač", "user": user})  # ensure_ascii: "Kova\\u010d"

    script = [call("profile", user="mk"), call("profile", user="mk2"), "Marta Kovač; no phone was found."]
    model = ScriptedModel(script)
    result = Agent(model, tools=[profile], budget=Budget(max_steps=2)).run_sync("What is mk's phone number?")
    assert result.forced_final
    prompt = model.requests[-1].messages[-1].content
    assert 'profile({"user": "mk"}) -> {"name": "Marta Kovač", "user": "mk"}' in prompt
    assert prompt.endswith("say what could not be found: never make up a value.")


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"max_identical_calls": 0}, "max_identical_calls must be a whole number of at least 1, got 0"),
        ({"max_polls": 2.5}, "max_polls must be a whole number of at least 1, got 2.5"),
        ({"max_heals": -1}, "max_heals must be a whole number of at least 0, got -1"),
        ({"max_blocked_steps": True}, "max_blocked_steps must be a whole number of at least 1, got True"),
        ({"hints": {"answer_soon": "hurry"}}, "GuardConfig hints must map keys of ["),
        ({"hints": {"answer_now": 3}}, "GuardConfig hints must map keys of ["),
    ],
)
def test_guard_settings_are_checked_when_made(settings: dict[str, Any], problem: str) -> None:
    # max_identical_calls=0 blocked every call, a first one too; a misspelt hint key was silently unused
    from thinkloop import ConfigurationError

    with pytest.raises(ConfigurationError, match=re.escape(problem)):
        GuardConfig(**settings)
