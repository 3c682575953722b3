"""Resume (SPEC §9.2): continue a run from its last checkpoint as if it had never stopped.

The state already holds the step counter, usage, elapsed time, guard counters, approvals and mode, so
resuming is: load the state, refuse a run that ended, then settle the tool calls of the last reply that
have no result yet — using the tool-call ledger so that nothing with side effects runs twice:

    ledger says done           → its recorded result is the observation (never executed again)
    started, no result, tool
      declared idempotent      → executed again
    started, no result,
      not idempotent           → not executed again; the model is told the outcome is unknown
    planned (never started)    → executed normally (safety gate included)

Then the loop continues from step `state.step`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from ._errors import StateError
from ._events import Decision, ErrorKind
from ._execute import ToolOutcome, execute_calls
from ._loop import observe
from ._messages import Message, Role, ToolCall
from ._state import LedgerEntry, RunState

if TYPE_CHECKING:
    from ._loop import RunContext
    from .stores import Store


async def load_resumable(store: Store, run_id: str) -> RunState:
    """The run's last state; `StateError` when there is none or the run already ended."""
    state = await store.load_state(run_id)
    if state is None:
        raise StateError(
            f"no run {run_id!r} in the store {store.url or store!r}: check the id with `thinkloop runs list`"
        )
    if state.finished:
        reason = state.stop_reason.value if state.stop_reason else state.phase
        raise StateError(
            f"run {run_id!r} already ended ({reason}) and cannot be resumed: start a new run instead",
            state=state,
        )
    return state


def pending_calls(state: RunState) -> list[ToolCall]:
    """The tool calls of the last reply that have no result message yet (the run stopped while acting)."""
    for index in range(len(state.messages) - 1, -1, -1):
        message = state.messages[index]
        if message.role == "assistant":
            answered = {m.tool_call_id for m in state.messages[index + 1 :] if m.role == "tool"}
            return [c for c in message.tool_calls if c.id not in answered]
    return []


async def resume_pending(run: RunContext) -> None:
    """Settle the last reply's unanswered tool calls with the ledger, then observe them like a step."""
    calls = pending_calls(run.state)
    if not calls:
        return
    run.state.phase = "acting"
    outcomes: dict[str, ToolOutcome] = {}
    to_run: list[ToolCall] = []
    for call in calls:
        settled = await _settle(run, call)
        if settled is None:
            to_run.append(call)
        else:
            outcomes[call.id] = settled
    if to_run:
        outcomes.update((o.call.id, o) for o in await execute_calls(run, to_run))
    run.state.tool_calls += sum(1 for o in outcomes.values() if o.error_kind != "repeated_call")
    observe(run, [outcomes[c.id] for c in calls])
    if run.step_saves:
        await run.checkpoint()


async def _settle(run: RunContext, call: ToolCall) -> ToolOutcome | None:
    """The outcome of a call the ledger already knows; None when the call must be executed."""
    entry = run.state.ledger.get(call.id)
    if entry is None or entry.status == "planned":
        return None
    if entry.status == "done":
        return _recorded(call, entry)
    tool = run.tools.resolve(call.name)
    if tool is not None and tool.idempotent:
        return None
    text = unknown_outcome_message(call)
    await run.ledger_done(call.id, text, False, error_kind="unknown_outcome")
    return ToolOutcome(call, text, False, error_kind="unknown_outcome")


def _recorded(call: ToolCall, entry: LedgerEntry) -> ToolOutcome:
    kind = cast(ErrorKind | None, entry.error_kind)
    decision: Decision | None = "blocked" if kind == "repeated_call" else None
    return ToolOutcome(call, entry.output or "", bool(entry.success), error_kind=kind, decision=decision)


def unknown_outcome_message(call: ToolCall) -> str:
    return (
        f"Error: the outcome of {call.name} is unknown: the run was interrupted while this call was "
        "running, and it was not run again because the tool is not idempotent (running it twice could "
        "repeat its effect). Check whether it took effect before calling it again."
    )


def memory_messages(entries: list[tuple[Role, str]]) -> list[Message]:
    """A session's memory as messages placed before the new goal."""
    return [Message(role=role, content=content, kind="memory") for role, content in entries]
