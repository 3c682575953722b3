"""Context management (SPEC §7): token counting, trimming, integrity, anti-drift, the view is a view."""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thinkloop import (
    Agent,
    Budget,
    ConfigurationError,
    ContextOverflowError,
    Message,
    ModelRequest,
    RunState,
    StopReason,
    ToolCall,
    _context,
    tool,
)
from thinkloop._context import NO_RESULT, ContextManager, InvalidHistoryError, validate_history
from thinkloop._tokens import (
    EstimateCounter,
    ModelTokenCounter,
    as_counter,
    estimate_message,
    estimate_tools,
    is_exact,
)
from thinkloop.testing import FunctionModel, ScriptedModel

# ================================================================================ an independent check


def openai_check(messages: Sequence[Message]) -> None:
    """The OpenAI chat rules, checked on the wire shape the adapter sends (independent of the code)."""
    wire: list[dict[str, Any]] = []
    for m in messages:
        item: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            item["tool_calls"] = [{"id": c.id, "function": {"name": c.name}} for c in m.tool_calls]
        if m.role == "tool":
            item["tool_call_id"] = m.tool_call_id
        wire.append(item)
    i = 0
    while i < len(wire):
        item = wire[i]
        assert item["role"] != "tool", f"message {i}: 'tool' must respond to a preceding 'tool_calls'"
        i += 1
        if item["role"] == "assistant" and item.get("tool_calls"):
            wanted = [c["id"] for c in item["tool_calls"]]
            answered = []
            while i < len(wire) and wire[i]["role"] == "tool":
                answered.append(wire[i]["tool_call_id"])
                i += 1
            assert sorted(answered) == sorted(wanted), f"calls {wanted} answered by {answered}"


def check(messages: Sequence[Message]) -> None:
    validate_history(messages)
    openai_check(messages)


# ============================================================================================ helpers


def task(goal: str = "Find the answer.") -> Message:
    return Message.user(goal)


def step(n: int, *results: str, text: str = "") -> list[Message]:
    calls = [
        ToolCall(id=f"c{n}_{i}", name="fetch", arguments={"page": n, "i": i}) for i in range(len(results))
    ]
    msgs = [Message.assistant(text, calls, step=n)]
    msgs += [Message.tool(c, r, step=n) for c, r in zip(calls, results, strict=True)]
    return msgs


def history(steps: int, size: int = 100, goal: str = "Find the answer.") -> RunState:
    state = RunState(goal=goal)
    state.messages.append(task(goal))
    for n in range(1, steps + 1):
        state.messages += step(n, f"result {n}: " + "x" * size)
    return state


def tokens(messages: Sequence[Message]) -> int:
    return EstimateCounter().count(messages)


# ========================================================================================= validation


def test_validate_history_accepts_valid_and_rejects_broken_histories() -> None:
    good = [task(), *step(1, "a", "b"), Message.user("hint", kind="hint"), *step(2, "c")]
    validate_history(good)
    orphan = [task(), Message.tool(ToolCall(id="x", name="f"), "r")]
    unanswered = [task(), *step(1, "a", "b")[:2]]
    interleaved = [task(), step(1, "a", "b")[0], Message.user("hi"), *step(1, "a", "b")[1:]]
    starts_with_tool = step(1, "a")[1:]
    dup = [Message.assistant("", [ToolCall(id="d", name="f"), ToolCall(id="d", name="f")])]
    for broken in (orphan, unanswered, interleaved, starts_with_tool, dup):
        with pytest.raises(InvalidHistoryError):
            validate_history(broken)


# ========================================================================================== the view


def test_a_small_history_is_returned_as_is() -> None:
    state = history(3)
    view = ContextManager().view(state, system="You are an agent.")
    assert view == state.messages
    assert all(a is b for a, b in zip(view, state.messages, strict=True))


def test_older_observations_are_truncated_and_the_last_five_steps_kept_whole() -> None:
    state = history(8, size=2000)
    view = ContextManager(100_000).view(state)
    check(view)
    tool_msgs = [m for m in view if m.role == "tool"]
    assert [len(m.content) <= 500 for m in tool_msgs] == [True] * 3 + [False] * 5
    assert "characters truncated" in tool_msgs[0].content
    assert tool_msgs[-1].content == state.messages[-1].content


def test_trimming_keeps_task_newest_and_budget_and_summarises_dropped_steps() -> None:
    state = history(30, size=600, goal="Count the pages.")
    manager = ContextManager(4000)
    system = "You are an agent. " * 20
    view = manager.view(state, system=system)

    check(view)
    assert view[0] is state.messages[0]  # the task is kept, first
    assert view[1].kind == "summary" and view[1].role == "user"
    assert "earlier step(s) were removed" in view[1].content
    assert "fetch(" in view[1].content and "The task is still: Count the pages." in view[1].content
    assert view[-4:] == state.messages[-4:]  # the newest messages are kept whole
    assert tokens(view) + tokens([Message.system(system)]) <= 4000 * 0.9
    assert manager.dropped_steps > 0


def test_the_view_never_changes_the_state() -> None:
    state = history(40, size=900)
    before = copy.deepcopy(state.messages)
    manager = ContextManager(3000)
    for _ in range(3):
        manager.view(state)
    assert state.messages == before and len(state.messages) == 81


def test_trim_has_hysteresis_so_the_window_is_stable() -> None:
    state = history(12, size=300)
    manager = ContextManager(2500)
    first = manager.view(state)
    dropped = manager.dropped_steps
    state.messages += step(13, "small")
    second = manager.view(state)
    assert manager.dropped_steps == dropped  # one more small step does not trigger a new trim
    assert second[: len(first) - 10][:2] == first[:2]


def test_oversized_newest_messages_are_shortened_as_a_last_resort() -> None:
    state = history(2, size=30_000)
    view = ContextManager(2000).view(state)
    check(view)
    assert tokens(view) <= 2000 * 0.9
    assert view[0].kind == "task"
    assert len(view[-1].content) < 30_000 and "characters truncated" in view[-1].content


def test_broken_histories_are_repaired_in_the_view() -> None:
    call = ToolCall(id="lost", name="fetch", arguments={})
    state = RunState(goal="g")
    state.messages = [
        Message.tool(ToolCall(id="orphan", name="fetch"), "stray"),
        task("g"),
        Message.assistant("", [call], step=1),  # interrupted: no result recorded
        Message.user("a hint", kind="hint", step=1),
    ]
    view = ContextManager().view(state)
    check(view)
    assert [m.content for m in view] == ["g", "", NO_RESULT, "a hint"]


def test_memory_before_the_task_is_dropped_first_and_the_task_pinned() -> None:
    state = RunState(goal="new goal")
    for i in range(20):
        state.messages += [
            Message(role="user", content=f"old question {i} " + "q" * 300, kind="memory"),
            Message(role="assistant", content=f"old answer {i} " + "a" * 300, kind="memory"),
        ]
    state.messages.append(task("new goal"))
    state.messages += step(1, "fresh result")
    view = ContextManager(1500).view(state)
    check(view)
    kinds = [m.kind for m in view]
    assert "task" in kinds and view[-2:] == state.messages[-2:]
    assert kinds.index("summary") < kinds.index("task")  # in order: the summary covers older turns
    summary = next(m.content for m in view if m.kind == "summary")
    assert "an earlier turn" in summary and "The task is still" not in summary


def test_history_rewritten_in_place_is_regrouped() -> None:
    state = history(10, size=2000)
    manager = ContextManager(3000)
    manager.view(state)
    state.messages = state.messages[:3]
    assert manager.view(state) == state.messages


# ===================================================================================== summaries


def test_a_model_written_summary_replaces_the_deterministic_one() -> None:
    seen: list[tuple[int, str]] = []

    async def summarizer(messages: list[Message], previous: str) -> str:
        seen.append((len(messages), previous))
        return f"MODEL SUMMARY of {len(messages)} messages"

    state = history(30, size=600)
    manager = ContextManager(4000, summarizer=summarizer)
    manager.view(state)  # plans the trim
    asyncio.run(manager.prepare(state))
    view = manager.view(state)
    check(view)
    summary = next(m for m in view if m.kind == "summary")
    assert "MODEL SUMMARY" in summary.content and "The task is still" in summary.content
    assert seen and seen[0][1] == ""


def test_a_failing_summarizer_falls_back_to_the_deterministic_summary(caplog: Any) -> None:
    async def summarizer(messages: list[Message], previous: str) -> str:
        raise RuntimeError("model down")

    state = history(30, size=600)
    manager = ContextManager(4000, summarizer=summarizer)
    manager.view(state)
    asyncio.run(manager.prepare(state))
    summary = next(m for m in manager.view(state) if m.kind == "summary")
    assert "fetch(" in summary.content
    assert "summarizer failed" in caplog.text


# ==================================================================================== token counting


def test_estimate_counter_counts_text_calls_and_overhead() -> None:
    msg = Message.assistant("abcdef", [ToolCall(id="1", name="fn", arguments={"a": 1})])
    assert estimate_message(msg) == (6 // 3 + 1) + 4 + (2 // 3 + 1) + (len('{"a":1}') // 3 + 1) + 8
    assert EstimateCounter().count([msg, msg]) == 2 * estimate_message(msg)


def test_model_tokenizer_is_used_when_the_model_has_one() -> None:
    class Words(ScriptedModel):
        def count_tokens(self, messages: Sequence[Message]) -> int | None:
            return sum(len(m.content.split()) + 1 for m in messages)

    counter = as_counter(None, Words([]))
    assert isinstance(counter, ModelTokenCounter) and counter.exact
    assert counter.count([Message.user("one two three")]) == 4
    fallback = as_counter(None, ScriptedModel([]))
    assert not is_exact(fallback) and fallback.count([Message.user("abc")]) == 6
    assert as_counter(lambda ms: 7).count([]) == 7
    with pytest.raises(ConfigurationError, match="token_counter"):
        as_counter(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("counted", "says"),
    [
        (RuntimeError("counter bug"), "raised RuntimeError: counter bug"),
        (TimeoutError("slow"), "raised TimeoutError: slow"),  # was the run's `timeout`, with none set
        ("lots", "returned 'lots', not a number of tokens"),
        (-3, "returned -3, not a number of tokens"),
    ],
)
def test_a_token_counter_that_fails_is_replaced_by_the_estimate(
    counted: object, says: str, caplog: pytest.LogCaptureFixture
) -> None:
    # a counter that raised crashed run() (no result, no `done`); only sizing the view, it must not
    def counter(messages: Sequence[Message]) -> Any:
        if isinstance(counted, Exception):
            raise counted
        return counted

    result = Agent(ScriptedModel(["the answer"]), token_counter=counter).run_sync("go")
    assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "the answer")
    warnings = [r.getMessage() for r in caplog.records if r.name == "thinkloop.context"]
    assert warnings == [f"the token_counter {says}; counting with the estimate (chars/3 + 1) instead"]


def test_agent_token_counter_drives_trimming() -> None:
    calls: list[int] = []

    def counter(messages: Sequence[Message]) -> int:
        calls.append(len(messages))
        return 1000 if any(m.role == "tool" for m in messages) else 1

    @tool
    def fetch(page: int) -> str:
        """Fetch a page."""
        return f"page {page}"

    script = [{"tool_calls": [{"name": "fetch", "args": {"page": i}}]} for i in range(6)] + ["done"]
    model = ScriptedModel(script)
    result = asyncio.run(
        Agent(model, tools=[fetch], token_counter=counter, max_context_tokens=3500).run("go")
    )
    assert result.stop_reason is StopReason.FINAL_ANSWER and calls
    last = model.requests[-1].messages
    assert sum(1 for m in last if m.role == "tool") <= 3  # 1000 "tokens" each: only a few fit
    assert any(m.kind == "summary" for m in last)
    check(last[1:])


def test_reported_usage_calibrates_an_estimating_counter() -> None:
    state = history(10, size=900)
    manager = ContextManager(4000)
    manager.view(state)
    assert manager.dropped_steps == 0
    manager.record_usage(manager.last_tokens * 3)  # the provider counts many more tokens
    assert manager.scale == 2.0
    manager.view(state)
    assert manager.dropped_steps > 0
    exact = ContextManager(4000, counter=as_counter(lambda ms: 10))
    exact.view(state)
    exact.record_usage(10_000)
    assert exact.scale == 1.0  # a real tokenizer is not second-guessed


# ================================================================================== through the loop


def test_every_request_of_a_long_run_is_valid_and_within_budget() -> None:
    @tool
    def read(n: int) -> str:
        """Read chunk n."""
        return f"chunk {n}: " + "lorem ipsum " * 400

    steps = itertools.count(1)

    def reply(request: ModelRequest) -> object:
        n = next(steps)
        if n > 25:
            return "done"
        return {"tool_calls": [{"name": "read", "args": {"n": n}}, {"name": "read", "args": {"n": -n}}]}

    model = FunctionModel(reply)
    agent = Agent(model, tools=[read], max_context_tokens=6000, budget=Budget(max_steps=40))
    result = asyncio.run(agent.run("Read everything."))
    assert result.stop_reason is StopReason.FINAL_ANSWER and result.tool_calls == 50
    for request in model.requests:
        check(request.messages[1:])
        assert request.messages[1].content == "Read everything."
        total = tokens(request.messages)
        assert total <= 6000 * 0.9 + 200  # the tool definitions are estimated separately
    assert len(result.state.messages) > len(model.requests[-1].messages)


# =================================================================================== property-based


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    msgs: list[Message] = []
    if draw(st.booleans()):
        for i in range(draw(st.integers(0, 3))):
            msgs.append(Message(role="user", content=f"memory q{i}", kind="memory"))
            msgs.append(Message(role="assistant", content=f"memory a{i}", kind="memory"))
    msgs.append(task("the goal " * draw(st.integers(1, 50))))
    for n in range(1, draw(st.integers(0, 30)) + 1):
        width = draw(st.integers(0, 4))
        text = "t" * draw(st.integers(0, 300))
        calls = [ToolCall(id=f"s{n}c{i}", name=f"tool{i}", arguments={"n": n}) for i in range(width)]
        msgs.append(Message.assistant(text, calls, step=n))
        for call in calls:
            msgs.append(Message.tool(call, "r" * draw(st.integers(0, 3000)), step=n))
        extra = draw(st.sampled_from(["none", "hint", "correction", "both"]))
        if extra in ("hint", "both"):
            msgs.append(Message.user("hint " * 10, kind="hint", step=n))
        if extra in ("correction", "both"):
            msgs.append(Message.user("fix your reply", kind="correction", step=n))
    return msgs


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=histories(),
    max_tokens=st.integers(50, 20_000),
    keep_steps=st.integers(1, 8),
    grow=st.integers(0, 5),
)
def test_every_trimmed_view_is_a_valid_chat_history(
    messages: list[Message], max_tokens: int, keep_steps: int, grow: int
) -> None:
    state = RunState(goal="the goal")
    task_at = next(i for i, m in enumerate(messages) if m.kind == "task")
    cut = max(len(messages) - grow * 3, task_at + 1)
    state.messages = messages[:cut]
    manager = ContextManager(max_tokens, keep_steps=keep_steps)
    for _ in range(2):  # the view is incremental: growing the history keeps it valid
        view = manager.view(state, system="system prompt")
        check(view)
        assert any(m.kind == "task" for m in view)
        originals = [m for m in view if m.kind != "summary" and m.content != NO_RESULT]
        by_identity = {(m.role, m.tool_call_id, m.step, m.kind) for m in state.messages}
        assert all((m.role, m.tool_call_id, m.step, m.kind) in by_identity for m in originals)
        if view and state.messages[-1].role != "tool":
            assert view[-1].content == state.messages[-1].content or view[-1].role == "tool"
        state.messages = messages


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=histories(), max_tokens=st.integers(50, 20_000), keep_steps=st.integers(1, 8))
def test_the_fast_path_gives_the_same_view_as_the_full_assembly(
    messages: list[Message], max_tokens: int, keep_steps: int
) -> None:
    """A history that fits as it is is returned without grouping work; it must be exactly the full view."""
    fast = ContextManager(max_tokens, keep_steps=keep_steps)
    full = ContextManager(max_tokens, keep_steps=keep_steps)
    state = RunState(goal="the goal")
    for message in messages:  # the history grows one message at a time, like a run's
        state.messages.append(message)
        seen = fast.view(state, system="system prompt")
        _context._FAST_PATH = False
        try:
            assembled = full.view(state, system="system prompt")
        finally:
            _context._FAST_PATH = True
        assert seen == assembled
        assert fast.last_tokens == full.last_tokens


def test_model_summarizer_asks_a_model_for_the_summary() -> None:
    from thinkloop._context import model_summarizer

    summary_model = ScriptedModel(["Pages 1-20 read; nothing failed."])
    state = history(30, size=600)
    manager = ContextManager(4000, summarizer=model_summarizer(summary_model, max_chars=300))
    manager.view(state)
    asyncio.run(manager.prepare(state))
    view = manager.view(state)
    check(view)
    assert "Pages 1-20 read; nothing failed." in next(m.content for m in view if m.kind == "summary")
    request = summary_model.requests[0]
    assert request.tools == [] and "at most 300 characters" in request.messages[0].content
    assert "fetch(" in request.messages[1].content and request.settings.temperature == 0.0


def test_react_runs_get_the_same_managed_view_as_a_transcript() -> None:
    @tool
    def read(n: int) -> str:
        """Read chunk n."""
        return f"chunk {n}: " + "words " * 300

    steps = itertools.count(1)

    def reply(request: ModelRequest) -> str:
        n = next(steps)
        if n > 20:
            return "Thought: done\nFinal Answer: all read"
        return f'Thought: next\nAction: read\nAction Input: {{"n": {n}}}'

    model = FunctionModel(reply, tools=False)
    result = asyncio.run(
        Agent(model, tools=[read], max_context_tokens=3000, budget=Budget(max_steps=30)).run("Read it all.")
    )
    assert result.stop_reason is StopReason.FINAL_ANSWER and result.output == "all read"
    last = model.requests[-1].messages
    assert [m.role for m in last[:3]] == ["system", "user", "user"]
    assert last[1].content == "Read it all." and last[2].kind == "summary"
    assert not any(m.role == "tool" for m in last)
    assert last[-1].content.startswith("Observation: chunk 20:")
    assert tokens(last) <= 3000 * 0.9


# ============================================================ when even the kept messages do not fit


def request_tokens(request: ModelRequest) -> int:
    return tokens(request.messages) + estimate_tools(request.tools or [])


def parallel(results: int, size: int, goal: str = "Fetch them all.") -> RunState:
    state = RunState(goal=goal)
    state.messages = [task(goal), *step(1, *(f"r{i} " + "x" * size for i in range(results)))]
    return state


def cut_marker(text: str) -> bool:
    return "characters truncated of" in text


FLOOR = _context._MIN_KEPT + len("\n… [99999 characters truncated of 99999] …\n")  # the shortest cut


def test_many_parallel_results_are_cut_evenly_to_fit_the_budget() -> None:
    state = parallel(20, 2000)  # the newest group alone, at 300 characters a result, is over the budget
    system = "You are an agent."
    manager = ContextManager(2000)
    view = manager.view(state, system=system)
    check(view)
    assert view[0] == state.messages[0] and view[1] == state.messages[1]  # the task, the call: whole
    results = [m for m in view if m.role == "tool"]
    assert [m.tool_call_id for m in results] == [m.tool_call_id for m in state.messages[2:]]
    assert all(cut_marker(m.content) and m.content.startswith(f"r{i} ") for i, m in enumerate(results))
    assert max(len(m.content) for m in results) - min(len(m.content) for m in results) <= 1  # evenly
    assert tokens(view) + tokens([Message.system(system)]) <= manager.budget == 1800
    assert manager.last_tokens <= manager.budget


def test_a_shrink_after_an_overflow_always_sends_a_smaller_view() -> None:
    state = parallel(30, 2000)
    manager = ContextManager(4000)
    view = manager.view(state, system="system")
    shrinks = 0
    while any(len(m.content) > FLOOR for m in view if m.role == "tool"):  # while a result can be cut
        sent = manager.last_tokens * manager.scale
        manager.shrink(int(sent * 0.8), prompt_tokens=int(manager.last_tokens * 1.1))
        view = manager.view(state, system="system")
        check(view)
        assert manager.last_tokens * manager.scale < sent  # the retry is smaller: it can succeed
        at_floor = all(len(m.content) <= FLOOR for m in view if m.role == "tool")
        assert manager.last_tokens * manager.scale <= manager.budget or at_floor  # it fits, or cannot
        assert view[0].kind == "task" and sum(m.role == "tool" for m in view) == 30
        shrinks += 1
        assert shrinks <= 5
    assert shrinks >= 2  # 3,562 tokens at first; at the shortest cuts, 1,582 (the 30 calls take 400)


def test_an_overflow_with_many_parallel_results_is_recovered_by_the_shrink() -> None:
    @tool
    def fetch(n: int) -> str:
        """Fetch n."""
        return f"r{n} " + "x" * 2000

    window = 2000
    sizes: list[int] = []

    def reply(request: ModelRequest) -> object:
        size = request_tokens(request)
        sizes.append(size)
        if size > window:
            raise ContextOverflowError("too long", provider="test", limit=window, prompt_tokens=size)
        if request.turn == 0:
            return {"tool_calls": [{"name": "fetch", "args": {"n": i}} for i in range(20)]}
        return "done"

    model = FunctionModel(reply)
    result = asyncio.run(Agent(model, tools=[fetch], max_context_tokens=window).run("Go."))
    assert result.stop_reason is StopReason.FINAL_ANSWER, result.error
    assert max(sizes) <= window * 0.9
    for request in model.requests:
        check(request.messages[1:])


def memory_state(turns: int, answer: int, goal: str = "the last question") -> RunState:
    state = RunState(goal=goal)
    for i in range(turns):
        state.messages += [
            Message(role="user", content=f"question {i}", kind="memory"),
            Message(role="assistant", content=f"answer {i} " + "z" * answer, kind="memory"),
        ]
    state.messages.append(task(goal))
    return state


def test_long_remembered_turns_are_shortened_to_fit_and_the_task_is_kept() -> None:
    state = memory_state(3, 3000)
    manager = ContextManager(2000)
    system = "You are an agent. " * 20
    view = manager.view(state, system=system)
    check(view)
    assert view[-1] is state.messages[-1]  # the task, whole
    assert tokens(view) + tokens([Message.system(system)]) <= manager.budget
    answers = [m for m in view if m.kind == "memory" and m.role == "assistant"]
    assert answers and all(cut_marker(m.content) and m.content.startswith("answer ") for m in answers)
    sent = manager.last_tokens
    manager.shrink(1500, prompt_tokens=sent)
    smaller = manager.view(state, system=system)
    check(smaller)
    assert manager.last_tokens < sent and manager.last_tokens * manager.scale <= manager.budget
    assert smaller[-1] is state.messages[-1]


def test_a_session_with_long_answers_recovers_from_an_overflow() -> None:
    window = 2000
    strict = False

    def reply(request: ModelRequest) -> str:
        size = request_tokens(request)
        if strict and size > window:
            raise ContextOverflowError("too long", provider="test", limit=window, prompt_tokens=size)
        return "answer " + "z" * 3000  # a long answer, remembered by the session

    model = FunctionModel(reply)
    agent = Agent(model, max_context_tokens=window)

    async def main() -> Any:
        nonlocal strict
        for i in range(3):
            await agent.run(f"question {i}", session="s1")
        strict, model.requests[:] = True, []
        return await agent.run("the last question", session="s1")

    result = asyncio.run(main())
    assert result.stop_reason is StopReason.FINAL_ANSWER, result.error
    last = model.requests[-1].messages
    assert last[-1].kind == "task" and last[-1].content == "the last question"
    assert request_tokens(model.requests[-1]) <= window * 0.9
    check(last[1:])


def test_older_long_assistant_texts_are_shortened_but_not_the_newest() -> None:
    state = RunState(goal="g")
    state.messages = [task("g"), *step(1, "ok", text="t" * 2400), *step(2, "ok", text="n" * 2400)]
    manager = ContextManager(1300)
    view = manager.view(state, system="system")
    check(view)
    assert tokens(view) + tokens([Message.system("system")]) <= manager.budget
    assert cut_marker(view[1].content) and view[1].tool_calls == state.messages[1].tool_calls
    assert view[3] is state.messages[3]  # the newest assistant message, whole


def test_the_summary_is_scaled_to_a_small_window() -> None:
    assert ContextManager(8000)._summary_reserve() == 2000 // 3 + 16  # the default window: as before
    state = history(30, size=600, goal="Count the pages. " * 40)
    for window in (1000, 1500, 3000):
        manager = ContextManager(window)
        view = manager.view(state, system="system")
        check(view)
        summary = next(m for m in view if m.kind == "summary")
        assert tokens([summary]) <= window // 5 + 40
        assert "The task is still: Count the pages." in summary.content or cut_marker(summary.content)
        assert view[0] is state.messages[0]
        assert manager.last_tokens <= manager.budget


def test_react_requests_stay_within_a_small_window() -> None:
    @tool
    def fetch(n: int) -> str:
        """Fetch n."""
        return f"r{n} " + "x" * 8000

    def reply(request: ModelRequest) -> str:
        if request.turn > 6:
            return "Thought: ok\nFinal Answer: done"
        return f'Thought: go\nAction: fetch\nAction Input: {{"n": {request.turn}}}'

    model = FunctionModel(reply, tools=False)
    result = asyncio.run(
        Agent(model, tools=[fetch], max_context_tokens=1000, budget=Budget(max_steps=10)).run("Go.")
    )
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert all(request_tokens(r) <= 1000 * 0.9 for r in model.requests)
    assert all(r.messages[1].content == "Go." for r in model.requests)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=histories(),
    max_tokens=st.integers(50, 6_000),
    keep_steps=st.integers(1, 8),
    cut=st.floats(0.3, 0.95),
)
def test_a_view_over_budget_has_nothing_left_to_cut_and_a_shrink_never_grows_it(
    messages: list[Message], max_tokens: int, keep_steps: int, cut: float
) -> None:
    state = RunState(goal="the goal")
    state.messages = messages
    manager = ContextManager(max_tokens, keep_steps=keep_steps)
    for _ in range(2):
        view = manager.view(state, system="system prompt")
        check(view)
        task_message = next(m for m in messages if m.kind == "task")
        assert any(m is task_message for m in view)  # the task, never cut
        if manager.last_tokens * manager.scale > manager.budget:  # only when nothing can be cut any more
            newest = max((i for i, m in enumerate(view) if m.role == "assistant"), default=len(view))
            for i, m in enumerate(view):
                if (
                    m.role == "tool"
                    or m.kind in ("memory", "summary")
                    or (m.role == "assistant" and i < newest)
                ):
                    assert len(m.content) <= FLOOR
        sent = manager.last_tokens
        manager.shrink(int(manager.max_context_tokens * cut), prompt_tokens=sent)
        manager.view(state, system="system prompt")
        assert manager.last_tokens <= sent


def test_short_steps_are_not_dropped_for_a_summary_that_costs_more_than_they_do() -> None:
    # the example a random seed found: dropping two 9-character remembered turns put a 77-character
    # summary note in their place, so the first view, and the view after a shrink, grew
    messages: list[Message] = []
    for i in range(3):
        messages.append(Message(role="user", content=f"memory q{i}", kind="memory"))
        messages.append(Message(role="assistant", content=f"memory a{i}", kind="memory"))
    messages += [task("the goal " * 30), Message.assistant("t" * 230, step=1)]
    state = RunState(goal="the goal", messages=messages)
    manager = ContextManager(257, keep_steps=1)
    first = manager.view(state, system="system prompt")
    assert first == messages  # over budget, but nothing dropped: the summary would cost more
    assert manager.dropped_steps == 0
    sent = manager.last_tokens
    manager.shrink(128, prompt_tokens=sent)
    assert manager.view(state, system="system prompt") == messages
    assert manager.last_tokens <= sent


def test_steps_are_still_dropped_when_the_summary_costs_less() -> None:
    messages = [task(), *(m for n in range(1, 13) for m in step(n, "r" * 400, text="t" * 100))]
    state = RunState(goal="Find the answer.", messages=messages)
    manager = ContextManager(1000, keep_steps=1)
    view = manager.view(state)
    check(view)
    assert manager.dropped_steps >= 1
    assert any(m.kind == "summary" for m in view)
    assert manager.last_tokens * manager.scale <= manager.budget
