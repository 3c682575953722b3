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
    Message,
    ModelRequest,
    RunState,
    StopReason,
    ToolCall,
    _context,
    tool,
)
from thinkloop._context import NO_RESULT, ContextManager, InvalidHistoryError, validate_history
from thinkloop._tokens import EstimateCounter, ModelTokenCounter, as_counter, estimate_message, is_exact
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
