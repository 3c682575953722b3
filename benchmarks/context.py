"""Context management: prompt tokens of a 40-step run with long observations, full history vs managed.

One scripted run: the model reads 40 sections of a document (one tool call per step, ~4,000
characters per observation), then answers. For every model call of that same run, two sizes are
computed with the same estimate (chars/3 + 1 per text, as thinkloop's usage estimate):

- managed: the request the loop actually sent (the context manager's view);
- full: the same request with the whole history up to that step (what an engine without context
  management sends).

It is done for the default window (`max_context_tokens=8000`) and for a large one (128,000: no
trimming; only the anti-drift truncation of observations older than 5 steps applies).

Then the cost of `ContextManager.view()` per step at 10 to 2,000 steps of history.

Run: .venv/bin/python benchmarks/context.py
"""

from __future__ import annotations

import asyncio
import statistics
import time

from thinkloop import Agent, Budget, Message, ModelRequest, RunState, ToolCall, tool
from thinkloop._context import ContextManager, validate_history
from thinkloop.models._base import estimate_request_tokens
from thinkloop.testing import FunctionModel

STEPS = 40
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
    "pi",
    "rho",
]


@tool
def read_section(n: int) -> str:
    """Read section n of the report."""
    body = " ".join(WORDS[(n * 7 + i) % len(WORDS)] for i in range(620))
    return f"Section {n}: {body}"[:4000]


def reply(request: ModelRequest) -> object:
    if request.messages[-1].kind == "final_prompt":
        return "The report has 40 sections."
    n = request.turn + 1
    if n > STEPS:
        return f"I read all {STEPS} sections; the report is about Greek letters."
    return {"text": f"Reading section {n}.", "tool_calls": [{"name": "read_section", "args": {"n": n}}]}


async def one_run(max_context_tokens: int) -> tuple[int, int, int]:
    """(full, managed, model calls) prompt tokens over one run."""
    model = FunctionModel(reply)
    agent = Agent(
        model, tools=[read_section], budget=Budget(max_steps=STEPS + 5), max_context_tokens=max_context_tokens
    )
    result = await agent.run("Read every section of the report, then say what it is about.")
    messages = result.state.messages
    full = managed = 0
    for request in model.requests:
        validate_history(request.messages[1:])
        managed += estimate_request_tokens(request)
        history = _history_at(messages, request.turn + 1)
        full += estimate_request_tokens(
            request.model_copy(update={"messages": [request.messages[0], *history]})
        )
    return full, managed, len(model.requests)


def _history_at(messages: list[Message], step: int) -> list[Message]:
    """The full history as it was when the model was called for `step` (the state only grows)."""
    for index, msg in enumerate(messages):
        if msg.role == "assistant" and msg.step == step:
            return messages[:index]
    return messages


def view_cost(steps: int, repeats: int = 25) -> float:
    """Microseconds per `view()` on a history of `steps` steps, as the loop calls it (one new step each time)."""
    state = RunState(goal="Read the report.")
    state.messages.append(Message.user("Read the report."))

    def add_step(n: int) -> None:
        call = ToolCall(id=f"c{n}", name="read_section", arguments={"n": n})
        state.messages.append(Message.assistant("", [call], step=n))
        state.messages.append(Message.tool(call, f"Section {n}: " + "text " * 80, step=n))

    for n in range(1, steps + 1):
        add_step(n)
    manager = ContextManager(8000)
    manager.view(state, system="You are an agent.")
    times = []
    for n in range(steps + 1, steps + 1 + repeats):
        add_step(n)
        start = time.perf_counter()
        manager.view(state, system="You are an agent.")
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    print(f"{STEPS}-step scripted run, ~4,000-character observations, estimated prompt tokens (chars/3)")
    print(
        f"{'max_context_tokens':>18} | {'calls':>5} | {'full history':>12} | {'managed':>9} | {'fewer':>6} | ratio"
    )
    for window in (8000, 128_000):
        full, managed, calls = asyncio.run(one_run(window))
        fewer, ratio = 1 - managed / full, full / managed
        print(f"{window:>18,} | {calls:>5} | {full:>12,} | {managed:>9,} | {fewer:>6.0%} | {ratio:.2f}x")
    print("\nContextManager.view() per step (median of 25 new steps, 8,000-token window):")
    for steps in (10, 100, 500, 2000):
        print(f"  {steps:>5} steps of history: {view_cost(steps):7.1f} µs")


if __name__ == "__main__":
    main()
