"""The run state (SPEC §9.1): everything a run is, as JSON-serialisable data.

The state is the single source of truth of a run: the loop reads and updates it, stores save it at every
step boundary, and `Agent.resume()` continues from it. It carries a schema version; loading a state of a
newer version, or a corrupt one, raises `StateError` and changes nothing.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

import pydantic_core
from pydantic import ValidationError

from . import _json
from ._data import Data, fast_constructor
from ._errors import StateError
from ._messages import Message, Usage
from ._risk import RiskLevel

SCHEMA_VERSION = 1


class StopReason(StrEnum):
    """Why a run ended (SPEC §5.1). Every run ends with exactly one."""

    FINAL_ANSWER = "final_answer"
    MAX_STEPS = "max_steps"
    MAX_TOKENS = "max_tokens"
    MAX_COST = "max_cost"
    TIMEOUT = "timeout"
    NO_PROGRESS = "no_progress"
    DANGEROUS_LOOP = "dangerous_loop"
    CANCELLED = "cancelled"
    ERROR = "error"

    @property
    def is_budget(self) -> bool:
        return self in _BUDGET_STOPS

    @property
    def gets_final_answer_call(self) -> bool:
        """Hard stops after which the agent asks once for a best-effort answer (SPEC §4.8)."""
        return self in _FORCED_FINAL_STOPS


_BUDGET_STOPS = frozenset(
    {StopReason.MAX_STEPS, StopReason.MAX_TOKENS, StopReason.MAX_COST, StopReason.TIMEOUT}
)
_FORCED_FINAL_STOPS = frozenset(
    {
        StopReason.MAX_STEPS,
        StopReason.MAX_TOKENS,
        StopReason.MAX_COST,
        StopReason.NO_PROGRESS,
        StopReason.DANGEROUS_LOOP,
    }
)

Phase = Literal["thinking", "acting", "done", "error"]
Mode = Literal["native", "react"]


@dataclass(slots=True, kw_only=True)
class GuardState(Data):
    """Counters of the guards (SPEC §4.5–4.7, §5.1). Kept in the state so a resumed run keeps them."""

    signature_counts: dict[str, int] = field(default_factory=dict)
    recent_signatures: list[str] = field(default_factory=list)
    recent_errors: list[str] = field(default_factory=list)
    total_calls: int = 0
    repeated_calls: int = 0
    blocked_calls: int = 0
    consecutive_blocked: int = 0
    consecutive_failures: int = 0
    heal_failures: int = 0
    malformed_native_replies: int = 0
    steps_without_progress: int = 0
    hints_given: list[int] = field(default_factory=list)
    seen_results: list[str] = field(default_factory=list)
    recent_thoughts: list[str] = field(default_factory=list)


LedgerStatus = Literal["planned", "started", "done"]


@dataclass(slots=True, kw_only=True)
class LedgerEntry(Data):
    """One tool call in the ledger: planned when the reply is screened, started before it runs, done with
    its result after (a call the guards blocked is done at once, with `error_kind` "repeated_call")."""

    call_id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    step: int
    status: LedgerStatus = "started"
    output: str | None = None
    success: bool | None = None
    error_kind: str | None = None


new_ledger_entry = fast_constructor(LedgerEntry)
"""`LedgerEntry(...)` for the loop's hot path (see `fast_constructor`)."""


@dataclass(slots=True, kw_only=True)
class ApprovalRecord(Data):
    """The safety gate's decision on one tool call (SPEC §6): what was decided, at what risk, and why."""

    step: int
    call_id: str
    tool: str
    risk: RiskLevel
    decision: str  # a `Decision` value: auto, approved, approved_always, denied, blocked, timeout
    reason: str = ""
    message: str = ""  # what the person (or the policy) told the model, for refused calls
    time: float = field(default_factory=time.time)


@dataclass(slots=True, kw_only=True)
class RunState(Data):
    """Everything a run is. Serialise with `to_json()`, load with `RunState.from_json()`."""

    schema_version: int = SCHEMA_VERSION
    run_id: str = field(default_factory=lambda: os.urandom(16).hex())  # 128 random bits, as uuid4().hex
    agent_name: str = "agent"
    model: str = ""
    goal: str = ""
    session: str | None = None
    messages: list[Message] = field(default_factory=list)
    step: int = 0
    phase: Phase = "thinking"
    mode: Mode = "native"
    answer: str | None = None
    stop_reason: StopReason | None = None
    forced_final: bool = False
    error: str | None = None
    usage: Usage = field(default_factory=Usage)
    tool_calls: int = 0
    guards: GuardState = field(default_factory=GuardState)
    ledger: dict[str, LedgerEntry] = field(default_factory=dict)
    approved_tools: list[str] = field(default_factory=list)  # approve-always keys (see thinkloop.safety)
    approvals: list[ApprovalRecord] = field(default_factory=list)  # every safety decision of the run
    discovered_tools: list[str] = field(default_factory=list)
    created_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    elapsed: float = 0.0  # seconds of run time, accumulated across resumes
    event_version: int = 0  # number of events emitted so far (the event log's version)
    # checkpoints written of this run: a database store refuses a save unless it holds `saves` (so of two
    # processes that loaded the same checkpoint only the first to save goes on, events or none)
    saves: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)
    budget: dict[str, Any] = field(default_factory=dict)  # the run's limits, so a resume keeps them

    @property
    def finished(self) -> bool:
        return self.phase in ("done", "error")

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, data: str | bytes) -> RunState:
        """Load a state, refusing newer schema versions and corrupt data with a clear `StateError`."""
        try:
            state = cls.model_validate_json(data)
        except ValidationError as exc:
            version = _peek_version(data)
            if version is not None and version > SCHEMA_VERSION:
                raise _too_new(version) from exc
            raise StateError(
                f"corrupt run state: {exc.error_count()} problem(s): {_first_error(exc)}"
            ) from exc
        if state.schema_version > SCHEMA_VERSION:
            raise _too_new(state.schema_version)
        return state


new_run_state = fast_constructor(RunState)
"""`RunState(...)` for the start of every run (see `fast_constructor`)."""


def _peek_version(data: str | bytes) -> int | None:
    import json

    try:
        raw = json.loads(data)
    except (ValueError, RecursionError):  # nested past Python's recursion limit: corrupt all the same
        return None
    version = raw.get("schema_version") if isinstance(raw, dict) else None
    return version if isinstance(version, int) else None


def _too_new(version: int) -> StateError:
    return StateError(
        f"run state has schema version {version}, newer than this thinkloop supports ({SCHEMA_VERSION}): "
        "upgrade thinkloop to load it"
    )


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(root)"
    return f"{where}: {err['msg']}"


def unsaved_metadata(metadata: dict[str, Any]) -> list[str]:
    """The keys of `metadata` whose values a saved run state cannot hold: values pydantic cannot write as
    JSON (an arbitrary object, a lambda …), nesting too deep to be read back, or numbers that would not
    read back as written (NaN and infinities, saved as null; integers of 4,300 digits or more, which
    Python refuses to read: the run could never be resumed). [] for the usual metadata, checked with one
    serialisation and one parse."""
    if _saves(metadata):
        return []
    return [key for key, value in metadata.items() if not _saves(value)]


def _saves(value: Any) -> bool:
    """Whether `value` is written as JSON and read back from it as it is."""
    try:
        text = pydantic_core.to_json(value, inf_nan_mode="constants")  # NaN, not null: refused below
        if _json.text_too_deep(text.decode()):
            return False
        pydantic_core.from_json(text, allow_inf_nan=False)
    except (pydantic_core.PydanticSerializationError, ValueError, RecursionError):
        return False
    return True


def record_list(metadata: dict[str, Any], key: str) -> list[Any]:
    """The list thinkloop keeps its records of `key` in (`models`, `mode_switches`, `context_shrinks`),
    in the run's metadata. A value of the user's under that key that is no list is replaced (with a
    warning): appended to, it crashed the run."""
    value = metadata.get(key)
    if isinstance(value, list):
        return value
    if value is not None:
        logging.getLogger("thinkloop.agent").warning(
            "metadata[%r] is thinkloop's (a list of its records), not a %s: the value given was replaced",
            key, type(value).__name__,
        )  # fmt: skip
    records: list[Any] = []
    metadata[key] = records
    return records
