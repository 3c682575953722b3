"""Test doubles for agents: models that need no network, shared by thinkloop's tests and yours.

- `ScriptedModel(replies)` answers each request with the next reply of a fixed list, records the
  requests it saw, and `assert_used_up()` checks every reply was consumed.
- `FunctionModel(fn)` lets a Python function decide each reply from the request.

A reply is a `ModelResponse`, a string (a text reply), or a dict
`{"text": "...", "tool_calls": [{"name": "add", "args": {"a": 1}}]}` (the format of `--model script:FILE`).
"""

from __future__ import annotations

import asyncio
import json
from abc import abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from ._errors import ConfigurationError, ModelError
from ._messages import ModelRequest, ModelResponse, StreamChunk, TextDelta, ToolCall, ToolCallDelta, Usage
from .models._base import Model, ModelCapabilities, estimated_usage

Reply = ModelResponse | str | dict[str, Any]

__all__ = ["FunctionModel", "Reply", "ScriptedModel", "load_script", "to_response"]


def to_response(reply: Reply, *, turn: int = 0, model_name: str = "script") -> ModelResponse:
    """Normalise a reply to a `ModelResponse`; tool calls without ids get `call_<turn>_<index>`."""
    if isinstance(reply, ModelResponse):
        return reply
    if isinstance(reply, str):
        return ModelResponse(text=reply, model_name=model_name)
    if not isinstance(reply, dict):
        raise ConfigurationError(
            f"a scripted reply must be a string, a dict or a ModelResponse, not {reply!r}"
        )
    unknown = set(reply) - {"text", "tool_calls", "finish_reason", "usage"}
    if unknown:
        raise ConfigurationError(
            f"scripted reply has unknown key(s) {sorted(unknown)}; use 'text' and 'tool_calls'"
        )
    raw_calls = reply.get("tool_calls") or []
    if not isinstance(raw_calls, list | tuple):
        raise ConfigurationError(
            f"a scripted reply's tool_calls must be a list of calls, not {raw_calls!r}: "
            '{"tool_calls": [{"name": "add", "args": {"a": 1}}]}'
        )
    calls = [_to_call(raw, turn, i) for i, raw in enumerate(raw_calls)]
    finish = reply.get("finish_reason")
    return ModelResponse(
        text=str(reply.get("text") or ""),
        tool_calls=calls,
        usage=_to_usage(reply.get("usage")),
        model_name=model_name,
        finish_reason="tool_calls" if calls else finish if isinstance(finish, str) else "stop",  # type: ignore[arg-type]
    )


def _to_usage(raw: Any) -> Usage:
    """A scripted reply's `usage`: `{"input_tokens": 10, "output_tokens": 5, "cost": 0.01}` (reported, so
    not estimated); none, the model's estimate."""
    if raw is None:
        return Usage()
    if not isinstance(raw, dict) or set(raw) - {"input_tokens", "output_tokens", "cost"}:
        raise ConfigurationError(
            f"a scripted reply's usage must be a dict of input_tokens, output_tokens and cost, not {raw!r}"
        )
    tokens = [raw.get(name, 0) for name in ("input_tokens", "output_tokens")]
    cost = raw.get("cost", 0.0)
    if not all(type(n) is int and n >= 0 for n in tokens) or not (
        type(cost) in (int, float) and 0 <= cost < float("inf")
    ):
        raise ConfigurationError(
            f"a scripted reply's usage needs whole token counts >= 0 and a cost >= 0: {raw!r}"
        )
    return Usage(input_tokens=tokens[0], output_tokens=tokens[1], cost=float(cost), requests=1)


def _to_call(raw: Any, turn: int, index: int) -> ToolCall:
    if isinstance(raw, ToolCall):
        return raw
    if not isinstance(raw, dict) or "name" not in raw:
        raise ConfigurationError(f"a scripted tool call needs a 'name': {raw!r}")
    args = raw.get("args", raw.get("arguments", {}))
    call_id = str(raw.get("id") or f"call_{turn}_{index}")
    if isinstance(args, str):  # raw argument text, possibly malformed on purpose
        try:
            parsed = json.loads(args)
        except (ValueError, RecursionError):  # not JSON, or nested past Python's recursion limit
            return ToolCall(id=call_id, name=str(raw["name"]), raw_arguments=args)
        if isinstance(parsed, dict):
            return ToolCall(id=call_id, name=str(raw["name"]), arguments=parsed)
        return ToolCall(id=call_id, name=str(raw["name"]), raw_arguments=args)
    if args is None:  # no arguments, as models send them for a tool without any
        return ToolCall(id=call_id, name=str(raw["name"]))
    if not isinstance(args, dict):
        return ToolCall(id=call_id, name=str(raw["name"]), raw_arguments=json.dumps(args))
    return ToolCall(id=call_id, name=str(raw["name"]), arguments=args)


class _DoubleModel(Model):
    """Shared behaviour of the test doubles: request recording, estimated usage, chunked streaming."""

    def __init__(
        self,
        *,
        name: str,
        capabilities: ModelCapabilities,
        latency: float,
        stream_chunk: int,
        record: bool = True,
    ) -> None:
        self.provider = "test"
        self.name = name
        self.capabilities = capabilities
        self.latency = latency
        self.stream_chunk = stream_chunk
        self.record = record
        self.requests: list[ModelRequest] = []

    @abstractmethod
    def _reply(self, request: ModelRequest) -> ModelResponse | Awaitable[ModelResponse]:
        """The reply to `request` (without usage: `request()` estimates it when absent); an awaitable
        of it when it must wait (a plain value saves a coroutine per call: doubles run in benchmarks)."""

    async def request(self, request: ModelRequest) -> ModelResponse:
        if self.record:
            self.requests.append(request)
        if self.latency:
            await asyncio.sleep(self.latency)
        response = self._reply(request)
        if not isinstance(response, ModelResponse):
            response = await response
        if response.usage.requests == 0:
            response = response.model_copy(update={"usage": estimated_usage(request, response)})
        return response

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        response = await self.request(request)
        text = response.text
        for start in range(0, len(text), self.stream_chunk):
            yield TextDelta(text=text[start : start + self.stream_chunk])
        for index, call in enumerate(response.tool_calls):
            args = call.raw_arguments if call.raw_arguments is not None else json.dumps(call.arguments)
            yield ToolCallDelta(index=index, id=call.id, name=call.name, arguments_delta=args)
        yield response


class ScriptedModel(_DoubleModel):
    """Answers with the next reply of a fixed list.

    Args:
        replies: the replies, in order.
        by_turn: pick the reply by `request.turn` (the number of model calls the run already made)
            instead of by call order — so a resumed run continues its script where it left off.
        tools, streaming, prefill: the capabilities to declare (`tools=False` makes the loop use ReAct).
        latency: seconds to wait before each reply.
        record: keep every request in `requests` (turn off for long or many runs, e.g. benchmarks).
    """

    def __init__(
        self,
        replies: Sequence[Reply],
        *,
        by_turn: bool = False,
        tools: bool = True,
        streaming: bool = True,
        prefill: bool = False,
        latency: float = 0.0,
        name: str = "script",
        stream_chunk: int = 8,
        record: bool = True,
    ) -> None:
        caps = ModelCapabilities(tools=tools, streaming=streaming, prefill=prefill)
        super().__init__(
            name=name, capabilities=caps, latency=latency, stream_chunk=stream_chunk, record=record
        )
        self.replies = list(replies)
        for i, reply in enumerate(self.replies):
            to_response(reply, turn=i)  # fail fast on a bad script
        self.by_turn = by_turn
        self._next = 0

    @property
    def remaining(self) -> int:
        return len(self.replies) - self._next

    def _reply(self, request: ModelRequest) -> ModelResponse:
        index = request.turn if self.by_turn else self._next
        if index >= len(self.replies):
            raise ModelError(
                f"the script has {len(self.replies)} replies and reply {index + 1} was asked for",
                provider="test",
                scope="scripted reply",
            )
        self._next = index + 1
        return to_response(self.replies[index], turn=index, model_name=self.name)

    def assert_used_up(self) -> None:
        """Fail unless every scripted reply was used."""
        if self._next < len(self.replies):
            raise AssertionError(f"{self.remaining} of {len(self.replies)} scripted replies were not used")


FunctionReply = Callable[[ModelRequest], Reply | Awaitable[Reply]]


class FunctionModel(_DoubleModel):
    """A Python function decides each reply: `FunctionModel(lambda request: "42")`.

    The function gets the `ModelRequest` and returns a reply (a string, a dict like a scripted reply, or
    a `ModelResponse`), or an awaitable of one. The other arguments are those of `ScriptedModel`.
    """

    def __init__(
        self,
        function: FunctionReply,
        *,
        tools: bool = True,
        streaming: bool = True,
        prefill: bool = False,
        latency: float = 0.0,
        name: str = "function",
        stream_chunk: int = 8,
        record: bool = True,
    ) -> None:
        caps = ModelCapabilities(tools=tools, streaming=streaming, prefill=prefill)
        super().__init__(
            name=name, capabilities=caps, latency=latency, stream_chunk=stream_chunk, record=record
        )
        self.function = function

    def _reply(self, request: ModelRequest) -> ModelResponse | Awaitable[ModelResponse]:
        reply = self.function(request)
        if type(reply) is ModelResponse:
            return reply
        if asyncio.iscoroutine(reply) or isinstance(reply, Awaitable):
            return self._awaited(reply, request)
        return to_response(reply, turn=request.turn, model_name=self.name)

    async def _awaited(self, reply: Awaitable[Reply], request: ModelRequest) -> ModelResponse:
        return to_response(await reply, turn=request.turn, model_name=self.name)


def load_script(path: str | Path) -> ScriptedModel:
    """A `ScriptedModel` (by turn) from a JSON file holding a list of replies (`--model script:FILE`)."""
    file = Path(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigurationError(f"script file {str(file)!r} does not exist") from None
    except ValueError as exc:
        raise ConfigurationError(f"script file {str(file)!r} is not valid JSON: {exc}") from None
    except RecursionError:  # `[[[[…]]]]`: json raises it, not a ValueError, past Python's recursion limit
        raise ConfigurationError(
            f"script file {str(file)!r} is nested too deeply to read: it must hold a JSON list of replies"
        ) from None
    if not isinstance(data, list):
        raise ConfigurationError(f"script file {str(file)!r} must hold a JSON list of replies")
    model = ScriptedModel(data, by_turn=True, name=str(file.resolve()))
    model.provider = (
        "script"  # its spec, `script:/abs/path`, is recorded in the run and resolves again on resume
    )
    return model
