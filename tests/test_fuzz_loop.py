"""A seeded fuzzer: malformed, truncated, mixed and adversarial model outputs through the whole loop.

Every run must end with exactly one stop reason, no exception may escape, and every request the loop
sends must be a valid chat history. `benchmarks/fuzz.py` runs the same fuzzer longer.
"""

from __future__ import annotations

import asyncio
import json
import random
import string
from typing import Any

from thinkloop import (
    Agent,
    Budget,
    GuardConfig,
    ModelError,
    ModelRequest,
    ModelResponse,
    StopReason,
    ToolCall,
    tool,
)
from thinkloop._context import validate_history
from thinkloop._events import Done, Event
from thinkloop.testing import FunctionModel

TOOL_NAMES = ["echo", "add", "fail", "big"]


@tool
def echo(text: str) -> str:
    """Echo the text."""
    return text


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def fail(reason: str = "") -> str:
    """Always raises."""
    raise RuntimeError(f"failed: {reason[:20]}")


@tool
def big(n: int = 1) -> str:
    """A long output."""
    return "data " * min(abs(n), 50) * 200


TOOLS = [echo, add, fail, big]


# ============================================================================================ generators


def _junk(rng: random.Random, limit: int = 60) -> str:
    alphabet = string.printable + '{}[]":,“”…日本語🙂\x00\u200b'
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, limit)))


def _args(rng: random.Random) -> Any:
    return rng.choice(
        [
            {"text": _junk(rng)},
            {"a": rng.randint(-5, 5), "b": rng.randint(-5, 5)},
            {"a": "one", "b": None},
            {"n": rng.randint(-3, 60)},
            {},
            {"reason": _junk(rng, 10), "extra": [1, {"x": 2}]},
            {"text": "x" * rng.randint(0, 5000)},
        ]
    )


def _args_text(rng: random.Random) -> str:
    text = json.dumps(_args(rng), ensure_ascii=rng.random() < 0.5)
    kind = rng.randrange(6)
    if kind == 0:
        return text[: rng.randint(0, len(text))]  # truncated
    if kind == 1:
        return f"```json\n{text}\n```"
    if kind == 2:
        return text.replace('"', "'")
    if kind == 3:
        return rng.choice(["[1, 2]", "42", "null", "", "{{{", '"just a string"', "{'a': 1,}"])
    return text


def _name(rng: random.Random) -> str:
    return rng.choice(
        [*TOOL_NAMES, *TOOL_NAMES, "Echo", "calculator", "", " add ", "echo tool", _junk(rng, 8)]
    )


def react_text(rng: random.Random) -> str:
    """A ReAct-ish reply: labels in random order, case and decoration, some missing or duplicated."""
    parts = []
    for _ in range(rng.randint(0, 5)):
        label = rng.choice(
            [
                "Thought",
                "Action",
                "Action Input",
                "Final Answer",
                "Observation",
                "thought",
                "**Action**",
                "ACTION INPUT",
            ]
        )
        value = {
            "Action": _name,
            "**Action**": _name,
            "Action Input": _args_text,
            "ACTION INPUT": _args_text,
        }.get(label, lambda r: _junk(r, 80))(rng)
        parts.append(f"{label}:{rng.choice([' ', '', '  '])}{value}")
    text = rng.choice(["\n", "\n\n", " "]).join(parts)
    if rng.random() < 0.2:
        text = text[: rng.randint(0, len(text))]
    if rng.random() < 0.1:
        text = json.dumps({"name": _name(rng), "arguments": _args(rng)})
    return text


def native_reply(rng: random.Random, turn: int) -> Any:
    """A native reply: tool calls with odd names and arguments, text-written calls, or plain text."""
    kind = rng.randrange(8)
    if kind == 0:
        return _junk(rng, 200)
    if kind == 1:
        return react_text(rng)
    if kind == 2:  # a call written as text
        return f"Sure! {json.dumps({'name': _name(rng), 'arguments': _args(rng)})}"
    calls = []
    for i in range(rng.choice([1, 1, 1, 2, 3, 6])):
        raw: Any = _args(rng) if rng.random() < 0.6 else _args_text(rng)
        call_id = rng.choice([f"c{turn}_{i}", f"c{turn}_{i}", "dup", ""]) or f"id{turn}{i}"
        if isinstance(raw, dict):
            calls.append(ToolCall(id=call_id, name=_name(rng), arguments=raw))
        else:
            calls.append(ToolCall(id=call_id, name=_name(rng), raw_arguments=raw))
    text = _junk(rng, 40) if rng.random() < 0.3 else ""
    finish = rng.choice(["tool_calls", "length", "stop"])
    return ModelResponse(text=text, tool_calls=calls, finish_reason=finish)  # type: ignore[arg-type]


def plausible_call(rng: random.Random, *, native: bool) -> Any:
    """A well-formed call of a real tool (arguments may still be wrong for it)."""
    name, args = rng.choice(TOOL_NAMES), _args(rng)
    if native:
        return {"tool_calls": [{"name": name, "args": args}]}
    return f"Thought: {_junk(rng, 20)}\nAction: {name}\nAction Input: {json.dumps(args)}"


def fuzz_model(seed: int, native: bool) -> FunctionModel:
    rng = random.Random(seed)
    sticky = rng.random() < 0.5  # a model that tends to repeat itself
    last: list[Any] = []

    def reply(request: ModelRequest) -> Any:
        if request.messages[1:]:
            validate_history(request.messages[1:])  # every request the loop sends is valid
        if sticky and last and rng.random() < 0.6:
            return last[-1]
        answer = fresh_reply(request)
        last.append(answer)
        return answer

    def fresh_reply(request: ModelRequest) -> Any:
        if rng.random() < 0.02:
            raise ModelError("fuzzed provider failure", provider="test", scope="fuzz")
        if rng.random() < 0.05:
            return "Final Answer: " + _junk(rng, 30)
        if rng.random() < 0.4:
            return plausible_call(rng, native=bool(request.tools))
        if request.tools or (native and rng.random() < 0.5):
            return native_reply(rng, request.turn)
        return react_text(rng)

    return FunctionModel(reply, tools=native)


# =============================================================================================== runner


async def fuzz_run(seed: int) -> StopReason:
    """One fuzzed run; returns its stop reason, raising if anything escaped or the result is inconsistent."""
    rng = random.Random(seed * 7919)
    native = seed % 2 == 0
    agent = Agent(
        fuzz_model(seed, native),
        tools=TOOLS,
        budget=Budget(max_steps=rng.randint(1, 14)),
        max_context_tokens=rng.choice([600, 2000, 8000]),
        guards=GuardConfig(native_fallback_after=rng.randint(1, 3)),
        output_max_length=rng.choice([200, 10_000]),
    )
    if rng.random() < 0.25:
        events: list[Event] = [e async for e in agent.stream("Fuzz the loop.")]
        done = events[-1]
        assert isinstance(done, Done)
        result = done.result
    else:
        result = await agent.run("Fuzz the loop.")
    assert isinstance(result.stop_reason, StopReason)
    assert result.state.finished and result.state.stop_reason is result.stop_reason
    assert result.steps <= agent.budget.max_steps
    return result.stop_reason


async def fuzz(seeds: range) -> dict[StopReason, int]:
    counts: dict[StopReason, int] = {}
    for seed in seeds:
        reason = await fuzz_run(seed)
        counts[reason] = counts.get(reason, 0) + 1
    return counts


def test_fuzzed_model_outputs_always_end_with_a_stop_reason() -> None:
    counts = asyncio.run(fuzz(range(400)))
    assert sum(counts.values()) == 400
    # the fuzzer reaches the interesting endings, not just one
    for reason in (StopReason.FINAL_ANSWER, StopReason.MAX_STEPS, StopReason.ERROR):
        assert counts.get(reason, 0) > 0, counts
    assert counts.get(StopReason.DANGEROUS_LOOP, 0) + counts.get(StopReason.NO_PROGRESS, 0) > 0, counts


def test_fuzzer_is_deterministic() -> None:
    first = asyncio.run(fuzz(range(1000, 1030)))
    second = asyncio.run(fuzz(range(1000, 1030)))
    assert first == second


# ========================================================================= what the fuzzer found, pinned


def test_duplicate_and_empty_call_ids_get_unique_ids_and_each_call_its_own_result() -> None:
    calls = [
        ToolCall(id="x", name="add", arguments={"a": 1, "b": 1}),
        ToolCall(id="x", name="add", arguments={"a": 2, "b": 2}),
        ToolCall(id="", name="echo", arguments={"text": "hi"}),
    ]
    model = FunctionModel(lambda r: "done" if r.turn else ModelResponse(tool_calls=calls))
    result = asyncio.run(Agent(model, tools=TOOLS).run("go"))
    assistant = result.state.messages[1]
    ids = [c.id for c in assistant.tool_calls]
    assert ids[0] == "x" and len(set(ids)) == 3 and "" not in ids
    answers = {m.tool_call_id: m.content for m in result.state.messages if m.role == "tool"}
    assert [answers[i] for i in ids] == ["2", "4", "hi"]


def test_lone_surrogates_from_truncated_json_escapes_do_not_break_the_state() -> None:
    broken = '{"text": "smile \\ud83d"}'  # an escaped emoji cut in half
    model = FunctionModel(
        lambda r: "ok \ud83d" if r.turn else {"tool_calls": [{"name": "echo", "args": broken}]}
    )
    result = asyncio.run(Agent(model, tools=TOOLS).run("go"))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.output == "ok \ufffd"
    assert "smile \ufffd" in result.state.to_json()
