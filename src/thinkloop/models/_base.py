"""The `Model` interface (SPEC §2.1) and model-string resolution."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from .._errors import ModelError
from .._messages import (
    Message,
    ModelRequest,
    ModelResponse,
    StreamChunk,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
)


@dataclass(frozen=True, slots=True)
class ModelCapabilities:
    """What a model can do; the loop picks native tool calling or text ReAct from `tools`."""

    tools: bool = True
    streaming: bool = True
    parallel_tool_calls: bool = True
    prefill: bool = False
    context_window: int | None = None


class Model(ABC):
    """A language model: one request in, one response out (or a stream of chunks ending in one).

    Subclasses set `provider`, `name` and `capabilities`, implement `request()`, and may override
    `stream()` (the default streams the whole text of `request()` as one delta) and `count_tokens()`.
    Failures raise `ModelError` (or `ModelRetryableError` for transient ones) naming the provider;
    `asyncio.CancelledError` always passes through untouched.
    """

    provider: str = "model"
    name: str = ""
    capabilities: ModelCapabilities = ModelCapabilities()

    @property
    def spec(self) -> str:
        """The model string that names this model, e.g. `openai:gpt-4o-mini`."""
        return f"{self.provider}:{self.name}" if self.name else self.provider

    @abstractmethod
    async def request(self, request: ModelRequest) -> ModelResponse:
        """Answer one request."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        """Yield text and tool-call deltas, then the complete `ModelResponse` as the last chunk."""
        response = await self.request(request)
        if response.text:
            yield TextDelta(text=response.text)
        for index, call in enumerate(response.tool_calls):
            yield ToolCallDelta(index=index, id=call.id, name=call.name, arguments_delta="")
        yield response

    def count_tokens(self, messages: Sequence[Message]) -> int | None:
        """Tokens of `messages` by this model's own tokenizer, or None when it has none."""
        return None

    async def aclose(self) -> None:
        """Release connections or memory held by the model."""
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.spec}>"


def estimate_tokens(text: str) -> int:
    """The fallback token estimate of SPEC §7.1: characters / 3 + 1."""
    return len(text) // 3 + 1


def estimate_request_tokens(request: ModelRequest) -> int:
    total = sum(estimate_tokens(m.content) + 4 for m in request.messages)
    total += sum(
        estimate_tokens(c.name) + estimate_tokens(str(c.arguments))
        for m in request.messages
        for c in m.tool_calls
    )
    total += sum(estimate_tokens(t.description) + estimate_tokens(str(t.parameters)) for t in request.tools)
    return total


def _call_tokens(call: ToolCall) -> int:
    try:
        return estimate_tokens(str(call.arguments)) + 4
    except (ValueError, RecursionError):  # an integer of over 4,300 digits, nesting past recursion
        return estimate_tokens(call.raw_arguments or "") + 4


def estimated_usage(request: ModelRequest, response: ModelResponse) -> Usage:
    """Usage estimated from characters, for models that report none."""
    out = estimate_tokens(response.text) + sum(_call_tokens(c) for c in response.tool_calls)
    return Usage(input_tokens=estimate_request_tokens(request), output_tokens=out, requests=1, estimated=True)


def bad_response(response: object, provider: str) -> ModelError:
    """The error for a reply that is not a `ModelResponse` with text (a model of the user's making)."""
    if isinstance(response, ModelResponse):
        what = f"a ModelResponse whose text is a {type(response.text).__name__}"
    else:
        what = f"a {type(response).__name__}"
    return ModelError(f"the model returned {what}, not a ModelResponse with text", provider=provider)
