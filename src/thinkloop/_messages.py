"""thinkloop's own message, tool-call and usage types.

Provider wire formats never leave the model adapters: the loop, the state, the stores and the events
only ever see these types. They are slotted dataclasses (`thinkloop._data.Data`): cheap to create on the hot
path, validated by pydantic when loaded from outside, and they round-trip through JSON exactly.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import AfterValidator

from ._data import Data, fast_constructor

Role = Literal["system", "user", "assistant", "tool"]

# What a message is for, beyond its role. The context manager and the UI use it; providers never see it.
MessageKind = Literal[
    "task",  # the user's goal
    "instructions",  # the system prompt
    "reply",  # an ordinary model reply or tool result
    "hint",  # a checkpoint hint injected by the guards
    "correction",  # a self-healing correction request
    "final_prompt",  # the request for a best-effort final answer
    "summary",  # a compressed summary of older steps
    "memory",  # a message carried over from an earlier turn of the session
]


@dataclass(slots=True, kw_only=True)
class ToolCall(Data):
    """A call of one tool, as the model asked for it.

    `arguments` is always a JSON object. When the model sent arguments that are not a JSON object,
    `arguments` is empty and `raw_arguments` holds what was sent, so the loop can explain the error.
    """

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw_arguments: str | None = None

    @property
    def malformed(self) -> bool:
        return self.raw_arguments is not None


def _make_canonical() -> Callable[[Any], str]:
    """Canonical JSON (sorted keys, no spaces, non-ASCII kept): the C encoder built once when available
    (it is rebuilt by every `json.dumps` call otherwise), else `json.dumps`."""
    encoder = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return encoder.encode
    fast = make(None, str, json.encoder.encode_basestring, None, ":", ",", True, False, True)

    def canonical(value: Any) -> str:
        try:
            return "".join(fast(value, 0))
        except (TypeError, ValueError, RecursionError):  # e.g. a non-string key: the full encoder decides
            return encoder.encode(value)

    return canonical


_canonical = _make_canonical()
_last_arguments: tuple[object, str] = (None, "")


def arguments_json(arguments: dict[str, Any]) -> str:
    """A call's arguments as canonical JSON (sorted keys, no spaces, non-ASCII kept; values JSON cannot
    hold as their `str`). The last dict's text is remembered: the loop's text check, the guards' call
    signature and the token estimate all read the same call, so it is encoded once. The loop never
    changes a call's arguments in place (nor may anyone: the text would be stale)."""
    global _last_arguments
    last = _last_arguments  # read once: other threads may replace it
    if last[0] is arguments:
        return last[1]
    text = _canonical(arguments)
    _last_arguments = (arguments, text)
    return text


def _shared_empty(calls: Sequence[ToolCall]) -> Sequence[ToolCall]:
    return calls or ()


_Calls = Annotated[Sequence["ToolCall"], AfterValidator(_shared_empty)]


@dataclass(slots=True, kw_only=True)
class Message(Data):
    """One message of a conversation, in thinkloop's own provider-neutral shape.

    `tool_calls` is read-only: a list of the calls, or the empty tuple for a message without calls (so
    the many messages without calls share one object). Build a new message rather than change one.
    """

    role: Role
    content: str = ""
    tool_calls: _Calls = ()
    tool_call_id: str | None = None  # for role == "tool": the call this answers
    name: str | None = None  # for role == "tool": the tool's name
    kind: MessageKind = "reply"
    step: int | None = None  # the loop step that produced it (None for the task and instructions)

    @staticmethod
    def system(content: str, *, kind: MessageKind = "instructions") -> Message:
        return new_message(role="system", content=content, kind=kind)

    @staticmethod
    def user(content: str, *, kind: MessageKind = "task", step: int | None = None) -> Message:
        return new_message(role="user", content=content, kind=kind, step=step)

    @staticmethod
    def assistant(
        content: str = "", tool_calls: Sequence[ToolCall] | None = None, *, step: int | None = None
    ) -> Message:
        return new_message(role="assistant", content=content, tool_calls=tool_calls or (), step=step)

    @staticmethod
    def tool(call: ToolCall, content: str, *, step: int | None = None) -> Message:
        return new_message(role="tool", content=content, tool_call_id=call.id, name=call.name, step=step)


new_message = fast_constructor(Message)
"""`Message(...)` for the loop's hot path (see `fast_constructor`)."""


@dataclass(slots=True, kw_only=True)
class Usage(Data):
    """Tokens and cost. `estimated` is True when any part was estimated rather than reported."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    requests: int = 0
    estimated: bool = False

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def copy(self) -> Usage:
        return _new_usage(
            input_tokens=self.input_tokens, output_tokens=self.output_tokens, cost=self.cost,
            requests=self.requests, estimated=self.estimated,
        )  # fmt: skip

    def add(self, other: Usage) -> None:
        """Accumulate `other` into this usage (in place)."""
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cost += other.cost
        self.requests += other.requests
        self.estimated = self.estimated or other.estimated


_new_usage = fast_constructor(Usage)


@dataclass(slots=True, kw_only=True)
class ToolDefinition(Data):
    """What a model is told about a tool: a name, a description and a JSON Schema of its parameters."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})


@dataclass(slots=True, kw_only=True)
class ModelSettings(Data):
    """Sampling settings of a model request (defaults from SPEC §5.3)."""

    temperature: float = 0.3
    max_output_tokens: int = 4096
    stop: list[str] = field(default_factory=list)


@dataclass(slots=True, kw_only=True)
class ModelRequest(Data):
    """Everything a model needs for one turn.

    `run_id` and `turn` (the number of model calls the run already made) are for bookkeeping and test
    doubles; adapters never send them to a provider. `prefill` is text the reply should start with:
    adapters whose capabilities say `prefill` continue from it (and return the text after it).
    """

    messages: list[Message]
    tools: list[ToolDefinition] = field(default_factory=list)
    settings: ModelSettings = field(default_factory=ModelSettings)
    run_id: str = ""
    turn: int = 0
    prefill: str = ""


new_request = fast_constructor(ModelRequest)
"""`ModelRequest(...)` for the loop's hot path (see `fast_constructor`)."""

FinishReason = Literal["stop", "tool_calls", "length", "content_filter", "error", "unknown"]


@dataclass(slots=True, kw_only=True)
class ModelResponse(Data):
    """One model turn: text and/or tool calls, with the tokens it cost."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    model_name: str = ""
    finish_reason: FinishReason = "stop"


@dataclass(slots=True, kw_only=True)
class TextDelta(Data):
    """A piece of streamed text."""

    type: Literal["text_delta"] = "text_delta"
    text: str


@dataclass(slots=True, kw_only=True)
class ToolCallDelta(Data):
    """A piece of a streamed tool call; pieces with the same `index` belong to one call."""

    type: Literal["tool_call_delta"] = "tool_call_delta"
    index: int
    id: str | None = None
    name: str | None = None
    arguments_delta: str = ""


StreamChunk = TextDelta | ToolCallDelta | ModelResponse
