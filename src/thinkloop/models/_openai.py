"""The OpenAI-compatible chat-completions adapter (SPEC §2.2): OpenAI, DeepSeek, Qwen, vLLM, Ollama, llama.cpp.

The chat-completions wire format lives in this module only: `_wire_*` functions turn thinkloop's
messages, tools and settings into request parameters, `_parse_*` functions and `_StreamAssembler` turn
completions and chunks back into `ModelResponse`s, and `_wrap_error` turns `openai` exceptions into
`ModelError` / `ModelRetryableError`. The `openai` package is imported when the first client is made,
so `import thinkloop` stays fast.
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import ipaddress
import json
import os
import threading
import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from .._errors import ConfigurationError, ModelError, ModelRetryableError
from .._messages import (
    FinishReason,
    Message,
    ModelRequest,
    ModelResponse,
    StreamChunk,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolDefinition,
    Usage,
)
from ._base import Model, ModelCapabilities

if TYPE_CHECKING:
    from openai import AsyncOpenAI
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

__all__ = ["OpenAIModel"]

MaxTokensParam = Literal["max_tokens", "max_completion_tokens"]

DEFAULT_TIMEOUT = 120.0
LOCAL_API_KEY = "not-needed"  # sent to local servers, which ignore the key
MAX_STOP_SEQUENCES = 4  # the chat-completions API accepts at most four
_REASONING_PREFIXES = (
    "o1",
    "o3",
    "o4",
    "gpt-5",
)  # OpenAI models that take max_completion_tokens, no temperature
_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "length",
    "content_filter": "content_filter",
}
_TRANSIENT_TYPES = ("server_error", "rate_limit_error", "rate_limit_exceeded", "overloaded_error", "timeout")
_HINTS = {
    401: "check the API key (api_key= or $OPENAI_API_KEY)",
    403: "the API key may not have access to this model",
    404: "check the model name and base_url",
}


class OpenAIModel(Model):
    """A model behind an OpenAI-compatible chat-completions API, through the official `openai` SDK.

    Args:
        name: the model name the server knows, e.g. `gpt-4o-mini`, `deepseek-chat`, `qwen2.5:7b`.
        base_url: the API root, e.g. `http://localhost:11434/v1`; defaults to `$OPENAI_BASE_URL`, then OpenAI.
        api_key: defaults to `$OPENAI_API_KEY`; may be omitted for servers on this machine or a private network.
        timeout: seconds to wait for a response.
        max_retries: retries by the SDK itself; 0 by default, since retries and fallback belong to the router.
        capabilities: a `ModelCapabilities`, or a mapping of fields to override (e.g. `{"tools": False}` for
            a server without tool calling, which makes the loop use text ReAct).
        extra_body: extra JSON fields sent with every request (server-specific options).
        provider: the name errors and model strings use (`"deepseek"`, `"vllm"` …).
        max_tokens_param: `"max_tokens"` or `"max_completion_tokens"`; by default the latter for OpenAI's
            reasoning models (o1, o3, o4, gpt-5), which also get no temperature.
    """

    def __init__(
        self,
        name: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_retries: int = 0,
        capabilities: ModelCapabilities | Mapping[str, Any] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        provider: str = "openai",
        max_tokens_param: MaxTokensParam | None = None,
    ) -> None:
        if not name:
            raise ConfigurationError("OpenAIModel needs a model name, e.g. OpenAIModel('gpt-4o-mini')")
        self.provider = provider
        self.name = name
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        self.api_key = _api_key(api_key, self.base_url, provider)
        self.timeout = timeout
        self.max_retries = max_retries
        self.capabilities = _capabilities(capabilities)
        self.extra_body = dict(extra_body or {})
        reasoning = name.startswith(_REASONING_PREFIXES)
        self.max_tokens_param: MaxTokensParam = max_tokens_param or (
            "max_completion_tokens" if reasoning else "max_tokens"
        )
        self.send_temperature = not reasoning
        self._clients: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[AsyncOpenAI, AsyncGenerator[None, None]]
        ] = weakref.WeakKeyDictionary()

    # ------------------------------------------------------------------------------------- client

    async def _get_client(self) -> AsyncOpenAI:
        """The SDK client of the running event loop, made on first use there.

        An SDK client's connections belong to one event loop, so each loop gets its own (e.g. every
        `agent.run_sync()`). It is closed by `aclose()`, or when its loop shuts down: a suspended async
        generator holds it, and `asyncio.run()` closes the async generators of its loop before the loop.
        """
        loop = asyncio.get_running_loop()
        entry = self._clients.get(loop)
        if entry is None:
            from openai import AsyncOpenAI

            client = AsyncOpenAI(
                api_key=self.api_key,
                base_url=self.base_url,
                timeout=self.timeout,
                max_retries=self.max_retries,
            )
            lifetime = self._client_lifetime(client)
            self._clients[loop] = (client, lifetime)
            await anext(lifetime)
            return client
        return entry[0]

    async def _client_lifetime(self, client: AsyncOpenAI) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            for loop, (known, _) in list(self._clients.items()):
                if known is client:
                    del self._clients[loop]
            await client.close()

    @property
    def _client(self) -> AsyncOpenAI | None:
        """The client of the running event loop, if one was made (for tests)."""
        entry = self._clients.get(asyncio.get_running_loop())
        return entry[0] if entry else None

    async def aclose(self) -> None:
        """Close the client of the running event loop (clients of other loops close with their loop)."""
        entry = self._clients.pop(asyncio.get_running_loop(), None)
        if entry is not None:
            await entry[1].aclose()

    # ----------------------------------------------------------------------------------- requests

    async def request(self, request: ModelRequest) -> ModelResponse:
        from openai import OpenAIError

        params = self._params(request)
        try:
            completion = await (await self._get_client()).chat.completions.create(**params)
        except OpenAIError as exc:
            raise self._wrap_error(exc, "chat completion") from exc
        if not completion.choices:
            raise self._no_choices_error(completion, "chat completion")
        return _parse_completion(completion, self.name)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        from openai import OpenAIError

        scope = "streaming chat completion"
        params = self._params(request)
        params.update(stream=True, stream_options={"include_usage": True})
        assembler = _StreamAssembler(self.name)
        try:
            stream = await (await self._get_client()).chat.completions.create(**params)
        except OpenAIError as exc:
            raise self._wrap_error(exc, scope) from exc
        async with stream:
            while True:
                try:
                    chunk = await anext(stream)
                except StopAsyncIteration:
                    break
                except OpenAIError as exc:
                    raise self._wrap_error(exc, scope) from exc
                except ValueError as exc:  # a chunk that is not JSON, or not a chat-completion chunk
                    message = f"the server sent a malformed stream chunk: {exc}"
                    raise ModelError(message, provider=self.provider, scope=scope) from exc
                for piece in assembler.feed(chunk):
                    yield piece
        yield assembler.response()

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of `chat.completions.create` for `request`."""
        settings = request.settings
        prefill = request.prefill if self.capabilities.prefill else ""
        params: dict[str, Any] = {
            "model": self.name,
            "messages": _wire_messages(request.messages, prefill),
            self.max_tokens_param: settings.max_output_tokens,
        }
        if self.send_temperature:
            params["temperature"] = settings.temperature
        if settings.stop:
            params["stop"] = settings.stop[:MAX_STOP_SEQUENCES]
        if request.tools and self.capabilities.tools:
            params["tools"] = _wire_tools(request.tools)
            params["parallel_tool_calls"] = self.capabilities.parallel_tool_calls
        if self.extra_body:
            params["extra_body"] = self.extra_body
        return params

    # ------------------------------------------------------------------------------------- errors

    def _wrap_error(self, exc: Exception, scope: str) -> ModelError:
        """The `ModelError` (retryable when transient) for an `openai` exception."""
        import openai

        where = self.base_url or "api.openai.com"
        if isinstance(exc, openai.APITimeoutError):
            message = f"no response from {where} within {self.timeout} s; retry later or raise `timeout`"
            return ModelRetryableError(message, provider=self.provider, scope=scope)
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ or exc.__context__
            detail = f" ({cause})" if cause and str(cause) else ""
            message = f"could not reach {where}{detail}; check base_url and that the server is running"
            return ModelRetryableError(message, provider=self.provider, scope=scope)
        if isinstance(exc, openai.APIStatusError):
            return self._status_error(exc, scope)
        if isinstance(exc, openai.APIError):  # an error event inside a stream
            message = f"the server reported an error: {_server_message(exc)}"
            transient = exc.type in _TRANSIENT_TYPES or exc.code in _TRANSIENT_TYPES
            kind = ModelRetryableError if transient else ModelError
            return kind(message, provider=self.provider, scope=scope)
        return ModelError(f"{type(exc).__name__}: {exc}", provider=self.provider, scope=scope)

    def _no_choices_error(self, completion: ChatCompletion, scope: str) -> ModelError:
        """A completion without choices: some proxies answer HTTP 200 with an error body."""
        error = getattr(completion, "error", None)
        if not isinstance(error, dict):
            message = "the server answered without any choice; check that base_url is a chat-completions API"
            return ModelError(message, provider=self.provider, scope=scope)
        code = error.get("code")
        message = f"the server answered HTTP 200 with an error: {error.get('message') or error}"
        transient = (isinstance(code, int) and (code == 429 or code >= 500)) or code in _TRANSIENT_TYPES
        kind = ModelRetryableError if transient else ModelError
        return kind(
            message, provider=self.provider, scope=scope, status_code=code if isinstance(code, int) else None
        )

    def _status_error(self, exc: Any, scope: str) -> ModelError:
        status: int = exc.status_code
        message = f"HTTP {status} from model {self.name!r}: {_server_message(exc)}"
        if status == 429 or status >= 500 or status == 408:
            retry_after = _retry_after(exc.response.headers)
            if retry_after is not None:
                message += f" (retry after {retry_after:g} s)"
            return ModelRetryableError(
                message, provider=self.provider, scope=scope, status_code=status, retry_after=retry_after
            )
        if status in _HINTS:
            message += f"; {_HINTS[status]}"
        return ModelError(message, provider=self.provider, scope=scope, status_code=status)

    # ------------------------------------------------------------------------------------- tokens

    def count_tokens(self, messages: Sequence[Message]) -> int | None:
        """Tokens by the model's `tiktoken` encoding (OpenAI's chat accounting), or None without one."""
        encoder = _encoder_for(self.name)
        if encoder is None:
            return None
        total = 3  # every reply is primed with <|start|>assistant<|message|>
        for message in messages:
            total += 3 + _count(encoder, message.role) + _count(encoder, message.content)
            for call in message.tool_calls:
                args = call.raw_arguments if call.raw_arguments is not None else json.dumps(call.arguments)
                total += 3 + _count(encoder, call.name) + _count(encoder, args)
        return total


# ============================================================================================ settings


def _api_key(api_key: str | None, base_url: str | None, provider: str) -> str:
    key = api_key or os.environ.get("OPENAI_API_KEY")
    if key:
        return key
    if base_url and _is_local_url(base_url):
        return LOCAL_API_KEY
    raise ConfigurationError(
        f"{provider}: no API key: set the OPENAI_API_KEY environment variable or pass "
        "OpenAIModel(..., api_key=...); for a server on this machine, set base_url (or OPENAI_BASE_URL), "
        "e.g. http://localhost:11434/v1"
    )


def _is_local_url(url: str) -> bool:
    """True for servers on this machine or a private network, which usually need no key."""
    host = (urlsplit(url).hostname or "").lower()
    if host in ("localhost", "host.docker.internal") or host.endswith((".localhost", ".local")):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_private or address.is_unspecified


def _capabilities(value: ModelCapabilities | Mapping[str, Any] | None) -> ModelCapabilities:
    if value is None:
        return ModelCapabilities()
    if isinstance(value, ModelCapabilities):
        return value
    known = {f.name for f in dataclasses.fields(ModelCapabilities)}
    unknown = set(value) - known
    if unknown:
        raise ConfigurationError(f"unknown capabilities {sorted(unknown)}; known: {sorted(known)}")
    return dataclasses.replace(ModelCapabilities(), **value)


# ================================================================================== to the wire format


def _wire_messages(messages: Sequence[Message], prefill: str = "") -> list[dict[str, Any]]:
    wire = [_wire_message(m) for m in messages]
    if prefill:
        wire.append({"role": "assistant", "content": prefill})
    return wire


def _wire_message(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id or "", "content": message.content}
    if message.role == "assistant" and message.tool_calls:
        return {
            "role": "assistant",
            "content": message.content or None,
            "tool_calls": [_wire_call(c) for c in message.tool_calls],
        }
    return {"role": message.role, "content": message.content}


def _wire_call(call: ToolCall) -> dict[str, Any]:
    arguments = call.raw_arguments if call.raw_arguments is not None else json.dumps(call.arguments)
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}}


def _wire_tools(tools: Sequence[ToolDefinition]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


# ================================================================================ from the wire format


def _parse_arguments(call_id: str, name: str, raw: str | None) -> ToolCall:
    """A tool call; arguments that are not a JSON object are kept as `raw_arguments`, never raised."""
    text = raw or ""
    if not text.strip():
        return ToolCall(id=call_id, name=name)
    try:
        arguments = json.loads(text)
    except ValueError:
        return ToolCall(id=call_id, name=name, raw_arguments=text)
    if not isinstance(arguments, dict):
        return ToolCall(id=call_id, name=name, raw_arguments=text)
    return ToolCall(id=call_id, name=name, arguments=arguments)


def _parse_usage(usage: Any) -> Usage:
    """Reported usage (one request), or an empty `Usage` (requests=0) so the loop estimates it."""
    if usage is None:
        return Usage()
    return Usage(
        input_tokens=usage.prompt_tokens or 0, output_tokens=usage.completion_tokens or 0, requests=1
    )


def _finish_reason(reason: str | None, has_calls: bool) -> FinishReason:
    if reason is None:
        return "tool_calls" if has_calls else "stop"
    return _FINISH.get(reason, "unknown")


def _parse_completion(completion: ChatCompletion, name: str) -> ModelResponse:
    choice = completion.choices[0]
    calls = []
    for index, call in enumerate(choice.message.tool_calls or []):
        function = getattr(call, "function", None)
        if function is None:  # a non-function ("custom") tool call: not something thinkloop sends
            continue
        calls.append(_parse_arguments(call.id or f"call_{index}", function.name, function.arguments))
    return ModelResponse(
        text=choice.message.content or getattr(choice.message, "refusal", None) or "",
        tool_calls=calls,
        usage=_parse_usage(completion.usage),
        model_name=completion.model or name,
        finish_reason=_finish_reason(choice.finish_reason, bool(calls)),
    )


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class _StreamAssembler:
    """Turns stream chunks into deltas, and reassembles the complete response at the end."""

    def __init__(self, name: str) -> None:
        self.model_name = name
        self.text: list[str] = []
        self.calls: dict[int, _PartialCall] = {}
        self.finish: str | None = None
        self.usage = Usage()

    def feed(self, chunk: ChatCompletionChunk) -> list[StreamChunk]:
        if chunk.model:
            self.model_name = chunk.model
        if chunk.usage is not None:
            self.usage = _parse_usage(chunk.usage)
        if not chunk.choices:
            return []
        choice = chunk.choices[0]
        self.finish = choice.finish_reason or self.finish
        out: list[StreamChunk] = []
        if choice.delta.content:
            self.text.append(choice.delta.content)
            out.append(TextDelta(text=choice.delta.content))
        for call in choice.delta.tool_calls or []:
            out.append(self._feed_call(call))
        return out

    def _feed_call(self, call: Any) -> ToolCallDelta:
        index = call.index if call.index is not None else self._index_for(call.id)
        partial = self.calls.setdefault(index, _PartialCall())
        function = call.function
        name = function.name if function is not None else None
        arguments = (function.arguments if function is not None else None) or ""
        if call.id:
            partial.id = call.id
        if name and name != partial.name:  # some servers repeat the whole name in every delta
            partial.name += name
        partial.arguments.append(arguments)
        return ToolCallDelta(index=index, id=call.id or None, name=name or None, arguments_delta=arguments)

    def _index_for(self, call_id: str | None) -> int:
        """The index of a delta from a server that sends none: a new id starts a new call."""
        if call_id and all(p.id != call_id for p in self.calls.values()):
            return len(self.calls)
        return max(self.calls, default=0)

    def response(self) -> ModelResponse:
        calls = [
            _parse_arguments(p.id or f"call_{i}", p.name, "".join(p.arguments))
            for i, p in sorted(self.calls.items())
        ]
        return ModelResponse(
            text="".join(self.text),
            tool_calls=calls,
            usage=self.usage,
            model_name=self.model_name,
            finish_reason=_finish_reason(self.finish, bool(calls)),
        )


# ============================================================================================== errors


def _server_message(exc: Any) -> str:
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return str(getattr(exc, "message", "") or exc)


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from `retry-after-ms` or `Retry-After` (seconds or an HTTP date)."""
    value = headers.get("retry-after-ms")
    if value:
        try:
            return max(float(value) / 1000, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


# ============================================================================================== tokens


TOKENIZER_WAIT = 5.0  # seconds the first count waits for tiktoken to load (it may download its file)
_encoders: dict[str, Any] = {}  # model name -> encoding, or None when it has none
_loading: dict[str, threading.Thread] = {}
_loading_lock = threading.Lock()


def _encoder_for(name: str) -> Any:
    """The `tiktoken` encoding of a model, or None (tiktoken missing, model unknown, not loaded yet).

    tiktoken downloads an encoding's file on first use, with no timeout; it is loaded on a thread and
    the first call waits at most `TOKENIZER_WAIT` seconds, so a blocked network never stalls a run.
    Until it is loaded the model counts no tokens (the loop estimates them).
    """
    if name in _encoders:
        return _encoders[name]
    with _loading_lock:
        thread = _loading.get(name)
        first = thread is None
        if thread is None:
            thread = _loading[name] = threading.Thread(
                target=_load_encoder, args=(name,), name=f"tiktoken-{name}", daemon=True
            )
            thread.start()
    if first:
        thread.join(TOKENIZER_WAIT)
    return _encoders.get(name)


def _load_encoder(name: str) -> None:
    _encoders[name] = _find_encoding(name)


def _find_encoding(name: str) -> Any:
    try:
        import tiktoken
    except ImportError:
        return None
    try:
        return tiktoken.encoding_for_model(name)
    except KeyError:
        if not name.startswith(("gpt-4o", "gpt-4.1", "gpt-5", "o1", "o3", "o4", "chatgpt-4o")):
            return None
    except Exception:  # the encoding file could not be downloaded (offline)
        return None
    try:
        return tiktoken.get_encoding("o200k_base")
    except Exception:
        return None


def _reset_encoders() -> None:
    """Forget loaded encodings (for tests)."""
    with _loading_lock:
        _encoders.clear()
        _loading.clear()


def _count(encoder: Any, text: str) -> int:
    return len(encoder.encode(text, disallowed_special=())) if text else 0
