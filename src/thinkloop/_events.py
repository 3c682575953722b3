"""Typed, JSON-serialisable events of a run (SPEC §8.1).

Event `type` names are API: they are stored in event logs and sent over WebSockets, so they never change.
Every event carries the `run_id` it belongs to and its `seq`uence number in the run's event log.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from ._data import Data, fast_constructor
from ._messages import ToolCall, Usage
from ._risk import RiskLevel
from ._state import Mode, RunState, StopReason

# How the safety gate decided on a tool call.
Decision = Literal["auto", "approved", "approved_always", "denied", "blocked", "timeout"]
# Why a tool call failed, when it did.
ErrorKind = Literal[
    "unknown_tool", "invalid_arguments", "exception", "timeout", "denied", "repeated_call", "unknown_outcome"
]


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)

    run_id: str = ""
    seq: int = 0
    time: float = Field(default_factory=time.time)


class RunStarted(_Event):
    type: Literal["run_started"] = "run_started"
    goal: str
    model: str
    mode: Mode
    resumed: bool = False


class Thought(_Event):
    """The model's reasoning text of a step that also calls tools."""

    type: Literal["thought"] = "thought"
    step: int
    text: str


class ToolCallEvent(_Event):
    type: Literal["tool_call"] = "tool_call"
    step: int
    call: ToolCall
    risk: RiskLevel = RiskLevel.LOW
    decision: Decision = "auto"


class ToolResultEvent(_Event):
    type: Literal["tool_result"] = "tool_result"
    step: int
    call_id: str
    name: str
    output: str
    success: bool
    duration: float
    error_kind: ErrorKind | None = None
    truncated: bool = False
    decision: Decision | None = None


class AnswerDelta(_Event):
    """A streamed piece of the final answer. With `agent.stream()`, the pieces since the last `answer_reset`
    join to the run's `result.output` by the time `done` comes."""

    type: Literal["answer_delta"] = "answer_delta"
    text: str


ResetReason = Literal["tool_calls", "correction", "answer"]


class AnswerReset(_Event):
    """The `answer_delta` text streamed since the last reset was not the final answer: discard it.

    `reason`: `tool_calls` — the reply went on to call tools (its text was a thought); `correction` — the
    reply was sent back to the model (unreadable, a number no result gives, an answer that did not match the
    output type); `answer` — the final answer differs from the streamed text (labels or reasoning removed, a
    best-effort final answer); the `answer_delta` events that follow it carry the answer."""

    type: Literal["answer_reset"] = "answer_reset"
    step: int
    reason: ResetReason


class Progress(_Event):
    type: Literal["progress"] = "progress"
    step: int
    max_steps: int
    usage: Usage


class Hint(_Event):
    """A checkpoint hint injected into the conversation by the guards."""

    type: Literal["hint"] = "hint"
    step: int
    text: str
    reason: str


class ApprovalRequested(_Event):
    type: Literal["approval_requested"] = "approval_requested"
    step: int
    call: ToolCall
    risk: RiskLevel
    reason: str


class ModeSwitched(_Event):
    type: Literal["mode_switched"] = "mode_switched"
    step: int
    from_mode: Mode
    to_mode: Mode
    reason: str


class ModelAttempt(_Event):
    """One attempt of a model call that failed (a router retries or falls back after it)."""

    type: Literal["model_attempt"] = "model_attempt"
    model: str
    attempt: int
    error: str
    next_action: Literal["retry", "fallback", "give_up"]
    delay: float = 0.0


class ModelCalled(_Event):
    """A model call that answered: how long it took (retries included), its tokens and cost.

    `final` marks the last call for a best-effort answer after a hard stop (SPEC §4.8).
    """

    type: Literal["model_call"] = "model_call"
    step: int
    model: str
    provider: str = ""
    duration: float
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    estimated: bool = False
    tool_calls: int = 0
    finish_reason: str = "stop"
    final: bool = False


class Status(_Event):
    """A long-running step outside the loop proper (e.g. loading the local model)."""

    type: Literal["status"] = "status"
    text: str


class PlanCreated(_Event):
    """A plan about to run (SPEC §10): its tasks and their levels; `attempt` counts repairs from 1."""

    type: Literal["plan_created"] = "plan_created"
    tasks: list[dict[str, Any]]
    levels: list[list[str]]
    attempt: int = 1


class TaskStarted(_Event):
    """A task of a plan started (its arguments with earlier results filled in)."""

    type: Literal["task_started"] = "task_started"
    task_id: str
    tool: str
    arguments: dict[str, Any]
    level: int


class TaskFinished(_Event):
    """A task of a plan that started (`task_started`) ended: done, failed, or cancelled (`cancelled`: a
    sibling failed, or the run was cancelled, while it ran)."""

    type: Literal["task_finished"] = "task_finished"
    task_id: str
    tool: str
    success: bool
    output: str
    duration: float = 0.0
    error_kind: ErrorKind | None = None
    cancelled: bool = False


class TaskSkipped(_Event):
    """A task of a plan that never started, so it has no `task_started` and no `task_finished`: `reason`
    "cancelled" (a task of its level failed, or the run was cancelled, while it waited for its turn) or
    "not_run" (a task of an earlier level failed); `failed_task` names the task whose failure stopped it.
    Every task of a plan ends with exactly one `task_finished` (after its `task_started`) or `task_skipped`."""

    type: Literal["task_skipped"] = "task_skipped"
    task_id: str
    tool: str
    reason: Literal["cancelled", "not_run"]
    failed_task: str | None = None


class ErrorEvent(_Event):
    """What went wrong. Before `done` on a run that ends with `error`; with `stopped`, the run stops here,
    unfinished and without `done`: its store failed (resume it once the store works) or, at its first
    save, the run could not start."""

    type: Literal["error"] = "error"
    message: str
    stopped: bool = False


class Done(_Event):
    """The last event of every run; carries the result."""

    type: Literal["done"] = "done"
    result: RunResult


Event = Annotated[
    RunStarted
    | Thought
    | ToolCallEvent
    | ToolResultEvent
    | AnswerDelta
    | AnswerReset
    | Progress
    | Hint
    | ApprovalRequested
    | ModeSwitched
    | ModelAttempt
    | ModelCalled
    | Status
    | PlanCreated
    | TaskStarted
    | TaskFinished
    | TaskSkipped
    | ErrorEvent
    | Done,
    Field(discriminator="type"),
]


@functools.cache
def event_adapter() -> TypeAdapter[Event]:
    """The pydantic adapter of the `Event` union (built on first use, to keep `import thinkloop` fast)."""
    return TypeAdapter(Event)


def event_from_json(data: str | bytes | dict[str, Any]) -> Event:
    """Parse an event from JSON text or a decoded dict."""
    if isinstance(data, dict):
        return event_adapter().validate_python(data)
    return event_adapter().validate_json(data)


@dataclass(slots=True, kw_only=True)
class RunResult(Data):
    """What a run produced, on every stop reason — including the full state, so nothing is lost."""

    output: str
    stop_reason: StopReason
    usage: Usage
    steps: int
    tool_calls: int
    duration: float
    forced_final: bool = False
    error: str | None = None
    parsed: Any = None  # with `Agent(output_type=T)`: the final answer as a validated T (else None)
    state: RunState

    @property
    def run_id(self) -> str:
        return self.state.run_id

    @property
    def ok(self) -> bool:
        """True when the model gave its own final answer."""
        return self.stop_reason is StopReason.FINAL_ANSWER

    @classmethod
    def from_state(cls, state: RunState) -> RunResult:
        assert state.stop_reason is not None, "a result needs a finished state"
        return (cls if cls is not RunResult else _new_result)(
            output=state.answer or "",
            stop_reason=state.stop_reason,
            usage=state.usage.copy(),
            steps=state.step,
            tool_calls=state.tool_calls,
            duration=state.elapsed,
            forced_final=state.forced_final,
            error=state.error,
            state=state,
        )


_new_result = fast_constructor(RunResult)
