"""The OpenAI-compatible chat-completions adapter (SPEC §2.2): OpenAI, DeepSeek, Qwen, vLLM, Ollama, llama.cpp.

The chat-completions wire format lives in this module only: `_wire_*` functions turn thinkloop's
messages, tools and settings into request parameters, `_parse_*` functions and `_StreamAssembler` turn
completions and chunks back into `ModelResponse`s, and `_wrap_error` turns `openai` exceptions into
`ModelError` / `ModelRetryableError`. The `openai` package is imported when the first client is made,
so `import thinkloop` stays fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import datetime
import email.utils
import ipaddress
import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from .. import _json
from .._aio import PerLoop, closed_with_the_loop
from .._errors import (
    ConfigurationError,
    ContextOverflowError,
    ModelError,
    ModelRetryableError,
    ToolsUnsupportedError,
)
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
from ._overflow import overflow_error, reply_room_after_overflow
from ._unsupported import tools_mishandled, tools_unsupported, unsupported_param

if TYPE_CHECKING:
    from openai import AsyncOpenAI
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

__all__ = ["OpenAIModel"]

MaxTokensParam = Literal["max_tokens", "max_completion_tokens"]

DEFAULT_TIMEOUT = 120.0
CONNECT_TIMEOUT = 10.0  # seconds to open a connection (at most `timeout`): a host that drops it fails fast
# bytes of a reply body (JSON or event stream) read beyond 16 per character of the reply asked for
BODY_SLACK = 16 * 1024 * 1024
# seconds a stream may stay silent after its finish_reason before it is closed: the usage chunk follows the
# finish at once; a server that sends no [DONE] and keeps the connection open held a complete reply for 5 s,
# past a shorter deadline, which threw it away
AFTER_FINISH_WAIT = 1.0
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
    401: "check the API key (api_key= or $OPENAI_API_KEY) and that it belongs to {where}",
    403: "the API key may not have access to model {name!r} (or the account or region is not allowed)",
    404: "check the model name ({name!r}) and base_url ({where}; it usually ends in /v1)",
}


logger = logging.getLogger("thinkloop.models")


@dataclass
class _LoopClient:
    """One event loop's SDK client, and what closes it when the loop shuts down."""

    client: AsyncOpenAI | None = None
    lifetime: AsyncGenerator[None, None] | None = None


class OpenAIModel(Model):
    """A model behind an OpenAI-compatible chat-completions API, through the official `openai` SDK.

    Args:
        name: the model name the server knows, e.g. `gpt-4o-mini`, `deepseek-chat`, `qwen2.5:7b`.
        base_url: the API root, e.g. `http://localhost:11434/v1`; defaults to `$OPENAI_BASE_URL`, then OpenAI.
        api_key: defaults to `$OPENAI_API_KEY`; may be omitted for servers on this machine or a private network.
        timeout: seconds to wait for a response (a whole reply; when streaming, its headers and then each of
            its events); opening the connection may take at most `CONNECT_TIMEOUT` (10 s) of them. A positive
            number (`math.inf`: no limit); anything else is a `ConfigurationError`.
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
        if not timeout > 0:  # NaN too: asyncio.timeout(nan) fires at once, and every request would fail
            raise ConfigurationError(
                f"OpenAIModel timeout must be a positive number of seconds (inf: no limit), not {timeout!r}"
            )
        self.provider = provider
        self.name = name
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        self.api_key = _api_key(api_key, self.base_url, provider)
        self.timeout = timeout
        self.max_retries = max_retries
        self.capabilities = _capabilities(capabilities)
        # a server of our own (not OpenAI's) whose tool support nobody stated: looked at before sending tools
        own = self.base_url is not None and "api.openai.com" not in self.base_url
        self._check_server = own and not _states_tools(capabilities)
        self.extra_body = dict(extra_body or {})
        reasoning = name.startswith(_REASONING_PREFIXES)
        self.max_tokens_param: MaxTokensParam = max_tokens_param or (
            "max_completion_tokens" if reasoning else "max_tokens"
        )
        self.send_temperature = not reasoning
        self.unsupported_params: set[str] = set()  # optional parameters the server refused (never sent again)
        self._clients = PerLoop(_LoopClient)  # each event loop's SDK client

    # ------------------------------------------------------------------------------------- client

    async def _get_client(self) -> AsyncOpenAI:
        """The SDK client of the running event loop, made on first use there.

        An SDK client's connections belong to one event loop, so each loop gets its own (e.g. every
        `agent.run_sync()`, in any thread). It is closed by `aclose()`, or when its loop shuts down
        (`_aio.closed_with_the_loop`).
        """
        entry = self._clients.get()
        if entry.client is None:
            from openai import AsyncOpenAI, DefaultAsyncHttpxClient, Timeout

            timeout = Timeout(self.timeout, connect=min(self.timeout, CONNECT_TIMEOUT))
            client = entry.client = AsyncOpenAI(
                api_key=self.api_key,
                base_url=self.base_url,
                timeout=timeout,
                max_retries=self.max_retries,
                # the SDK reads a whole (non-streamed) body into memory: bounded by `_bound_body` as it arrives
                http_client=DefaultAsyncHttpxClient(timeout=timeout, event_hooks={"response": [_bound_body]}),
            )
            entry.lifetime = await closed_with_the_loop(client.close)
        return entry.client

    @property
    def _client(self) -> AsyncOpenAI | None:
        """The client of the running event loop, if one was made (for tests)."""
        entry = self._clients.current()
        return entry.client if entry else None

    async def aclose(self) -> None:
        """Close the client of the running event loop (clients of other loops close with their loop)."""
        entry = self._clients.current()
        if entry is not None and entry.lifetime is not None:
            lifetime, entry.client, entry.lifetime = entry.lifetime, None, None
            await lifetime.aclose()  # closes the client

    # ----------------------------------------------------------------------------------- requests

    async def request(self, request: ModelRequest) -> ModelResponse:
        scope = "chat completion"
        params = self._params(request)
        most = _reply_chars(params[self.max_tokens_param])
        completion = await self._create(params, scope)
        return self._response(completion, scope, most)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        scope = "streaming chat completion"
        params = self._params(request)
        params.update(stream=True, stream_options={"include_usage": True})
        most = _reply_chars(params[self.max_tokens_param])
        stream = await self._create(params, scope)
        content_type = str(
            getattr(stream, "response", None) and stream.response.headers.get("content-type") or ""
        )
        if content_type and "event-stream" not in content_type.lower():  # one JSON reply (or an error page)
            for piece in await self._unstreamed(stream, scope, most):
                yield piece
            return
        assembler = _StreamAssembler(self.name)
        async with stream:
            while assembler.chars <= most and assembler.events <= most:
                chunk = await self._next_chunk(stream, assembler, scope)
                if chunk is None:
                    break
                for piece in self._feed(assembler, chunk, scope):
                    yield piece
        done = bool(getattr(stream, "response", None) and stream.response.extensions.get(_DONE_SEEN))
        yield self._checked(self._streamed_response(assembler, scope, most, done), scope)

    async def _next_chunk(self, stream: Any, assembler: _StreamAssembler, scope: str) -> Any:
        """The next chunk of `stream`, or None when it has ended; failures as `ModelError`s saying where in
        the reply they happened. Waits at most `timeout` s for an event — keep-alive comments do not count,
        so a proxy that keeps a stalled stream open cannot hang the run — and `AFTER_FINISH_WAIT` s once the
        reply is complete (for the usage chunk, not for a lost `[DONE]`)."""
        from openai import APIConnectionError, APITimeoutError, OpenAIError

        finished = assembler.finish is not None
        try:
            async with asyncio.timeout(AFTER_FINISH_WAIT if finished else self.timeout):
                return await anext(stream)
        except StopAsyncIteration:
            return None
        except (TimeoutError, APITimeoutError) as exc:
            if finished:
                return None
            raise self._stalled(assembler, scope) from exc
        except APIConnectionError as exc:  # the server was reached: it is the reply that broke off
            raise self._cut(exc, assembler, scope) from exc
        except OpenAIError as exc:  # an error event inside the stream
            raise self._wrap_error(exc, scope) from exc
        except ValueError as exc:  # a chunk that is not JSON, or not a chat-completion chunk
            message = (
                f"the server sent a malformed stream chunk, not JSON ({exc}); check that base_url is an "
                "OpenAI-compatible API and that no proxy in between rewrites the event stream"
            )
            raise ModelError(message, provider=self.provider, scope=scope) from exc
        except RecursionError:  # the SDK's json.loads of a chunk nested deeper than the recursion limit
            raise self._too_deep("a stream chunk", scope) from None

    def _feed(self, assembler: _StreamAssembler, chunk: Any, scope: str) -> list[StreamChunk]:
        """The deltas of one chunk; a chunk that is an error report, or of the wrong shape, raises."""
        reported = _error_in_chunk(chunk)
        if reported is not None:
            text, kind, code = reported
            raise self._reported_error(text, kind, code, scope)
        try:
            return assembler.feed(chunk)
        except (
            AttributeError,
            TypeError,
            IndexError,
            KeyError,
            ValueError,
        ) as exc:  # a chunk of the wrong shape
            message = (
                f"the server sent a malformed stream chunk ({type(exc).__name__}: {exc}): {_shown(chunk)}; check "
                "that base_url is an OpenAI-compatible API"
            )
            raise ModelError(message, provider=self.provider, scope=scope) from exc

    def _stalled(self, assembler: _StreamAssembler, scope: str) -> ModelRetryableError:
        where = self.base_url or "api.openai.com"
        if not assembler.events:
            message = (
                f"no response from {where} within {self.timeout} s: the stream was opened but no event came; "
                "retry later or raise `timeout`"
            )
        else:
            message = (
                f"{where} stopped sending in the middle of the reply: no event within {self.timeout} s after "
                f"{_chunks(assembler)}; retry later or raise `timeout`"
            )
        return ModelRetryableError(message, provider=self.provider, scope=scope)

    def _cut(self, exc: Exception, assembler: _StreamAssembler, scope: str) -> ModelRetryableError:
        where = self.base_url or "api.openai.com"
        cause = exc.__cause__ or exc.__context__
        detail = f": {cause}" if cause and str(cause) else ""
        when = f"after {_chunks(assembler)}" if assembler.events else "before its first event"
        message = (
            f"could not reach the end of the reply: the connection to {where} was lost in the middle of it, "
            f"{when}{detail}; retry the request"
        )
        return ModelRetryableError(message, provider=self.provider, scope=scope)

    def _streamed_response(
        self, assembler: _StreamAssembler, scope: str, most: int, done: bool
    ) -> ModelResponse:
        """The assembled reply of a stream that ended: cut at `most` characters (as if the model had hit
        its token limit), or an error when the stream was empty or ended before the model finished. A stream
        that ended with `data: [DONE]` (`done`) is complete even without a `finish_reason` or usage, which
        some servers and proxies never send: its finish is "stop", or "tool_calls" with calls."""
        response = assembler.response()
        if assembler.chars > most:
            return response.model_copy(update={"text": response.text[:most], "finish_reason": "length"})
        if not assembler.events:
            message = (
                "the server ended the stream without sending anything; check that base_url is an "
                "OpenAI-compatible API that streams (or set capabilities={'streaming': False})"
            )
            raise ModelError(message, provider=self.provider, scope=scope)
        if not assembler.shaped:  # no chat-completion chunk at all: retrying the same server will not help
            message = (
                f"the server streamed {assembler.events} event(s) but no chat-completion chunk (the first: "
                f"{assembler.shapeless}); check that base_url is an OpenAI-compatible chat-completions API"
            )
            raise ModelError(message, provider=self.provider, scope=scope)
        if assembler.finish is None and not assembler.usage_seen and not done:  # the usage chunk comes last
            message = (
                "the stream ended before the reply was complete (no finish_reason, no [DONE]): the connection "
                "was cut; retry the request"
            )
            raise ModelRetryableError(message, provider=self.provider, scope=scope)
        return response

    async def _unstreamed(self, stream: Any, scope: str, most: int) -> list[StreamChunk]:
        """The chunks of a streaming request answered with a whole JSON body (a server that ignores `stream`,
        or an error body with HTTP 200): the reply as one delta, or the error it holds."""
        from openai.types.chat import ChatCompletion

        body = await self._whole_body(stream, scope, most)
        if _SSE_START.match(body):  # an event stream sent as text/plain (some proxies relabel it)
            return await self._labelled_wrongly(body, scope, most)
        try:
            data = json.loads(body)
        except ValueError:
            raise self._not_a_completion(body, scope) from None
        except RecursionError:
            raise self._too_deep("a reply", scope) from None
        response = self._response(
            ChatCompletion.construct(**data) if isinstance(data, dict) else data, scope, most
        )
        chunks: list[StreamChunk] = [TextDelta(text=response.text)] if response.text else []
        chunks += [ToolCallDelta(index=i, id=c.id, name=c.name) for i, c in enumerate(response.tool_calls)]
        return [*chunks, response]

    async def _labelled_wrongly(self, body: str, scope: str, most: int) -> list[StreamChunk]:
        """The chunks of an event stream read whole because the server labelled it as something else: its
        events are assembled as a stream's would be."""
        from openai.types.chat import ChatCompletionChunk

        assembler = _StreamAssembler(self.name)
        chunks: list[StreamChunk] = []
        done = False
        for event, data in _sse_events(body):
            if data.strip() == "[DONE]":
                done = True
                break
            try:
                value = json.loads(data)
            except ValueError as exc:
                message = (
                    f"the server sent a malformed stream chunk, not JSON ({exc}); check that base_url is an "
                    "OpenAI-compatible API and that no proxy in between rewrites the event stream"
                )
                raise ModelError(message, provider=self.provider, scope=scope) from None
            except RecursionError:
                raise self._too_deep("a stream chunk", scope) from None
            if not isinstance(value, dict):
                raise self._not_a_completion(value, scope)
            error = value.get("error")
            if isinstance(error, dict) or event == "error":  # what the SDK raises for a real event stream
                said = error if isinstance(error, dict) else value
                value = {**said, "object": "error", "message": str(said.get("message") or said)}
            chunks += self._feed(assembler, ChatCompletionChunk.construct(**value), scope)
        return [*chunks, self._checked(self._streamed_response(assembler, scope, most, done), scope)]

    async def _whole_body(self, stream: Any, scope: str, most: int) -> str:
        """The body of a reply that is not an event stream, read within `timeout` (a trickled or stalled body
        does not hang the run) and up to a size no reply of `most` characters needs (`_bound_body`: an endless
        one does not fill the memory)."""
        pieces: list[bytes] = []
        try:
            async with asyncio.timeout(self.timeout):
                async for piece in stream.response.aiter_bytes():
                    pieces.append(piece)
        except TimeoutError:
            raise self._no_response(scope) from None
        except ModelError:
            raise
        except Exception as exc:
            raise self._transport_error(exc, scope) from exc
        finally:
            await stream.close()
        return b"".join(pieces).decode("utf-8", "replace")

    def _response(self, completion: Any, scope: str, most: int) -> ModelResponse:
        """The `ModelResponse` of a whole (not streamed) reply, or a `ModelError` saying what is wrong with it."""
        if not hasattr(completion, "model_dump"):  # the SDK hands back a body that is not a JSON object as is
            raise self._not_a_completion(completion, scope)
        if not getattr(completion, "choices", None):
            raise self._no_choices_error(completion, scope)
        try:
            response = _parse_completion(completion, self.name)
        except (AttributeError, TypeError, KeyError, IndexError, ValueError) as exc:
            message = (
                f"the server sent a malformed chat completion ({type(exc).__name__}: {exc}), its choices: "
                f"{_shown(getattr(completion, 'choices', None))}; check base_url"
            )
            raise ModelError(message, provider=self.provider, scope=scope) from exc
        if len(response.text) > most:
            response = response.model_copy(update={"text": response.text[:most], "finish_reason": "length"})
        return self._checked(response, scope)

    def _checked(self, response: ModelResponse, scope: str) -> ModelResponse:
        """`response`, unless the provider's content filter withheld all of it."""
        if (
            response.finish_reason == "content_filter"
            and not response.text.strip()
            and not response.tool_calls
        ):
            message = (
                "the provider's content filter withheld the reply (finish_reason 'content_filter'); "
                "rephrase the task or the instructions, or check the provider's content policy"
            )
            raise ModelError(message, provider=self.provider, scope=scope)
        return response

    def _not_a_completion(self, body: Any, scope: str) -> ModelError:
        """A reply that is not a chat completion at all: an HTML page, plain text, a JSON list …"""
        what = _describe_body(body) if isinstance(body, str) else f"a JSON {type(body).__name__}"
        where = self.base_url or "api.openai.com"
        message = (
            f"{where} did not answer with a chat completion but with {what}; check that base_url is the root "
            "of an OpenAI-compatible API (it usually ends in /v1)"
        )
        return ModelError(message, provider=self.provider, scope=scope)

    async def _create(self, params: dict[str, Any], scope: str) -> Any:
        """`chat.completions.create(**params)`, errors wrapped. A request the server refuses for one of its
        parts is adapted (in `params`) and sent again, once per part: a reply room that does not fit the
        window (vLLM counts `max_tokens` against it), an optional parameter the server does not take (see
        `_unsupported`). Tools the server does not take raise `ToolsUnsupportedError`."""
        client = await self._get_client()
        if "tools" in params and self._check_server:
            await self._refuse_tools_if_mishandled(client, scope)
        most = _reply_chars(params[self.max_tokens_param])
        # what `_bound_body` bounds the reply's body by, as it arrives (in this task, streamed or not)
        sending = _sending.set(_Sending(most, scope, self.provider, self.base_url or "api.openai.com"))
        try:
            return await self._send(client, params, scope)
        finally:
            _sending.reset(sending)

    async def _send(self, client: AsyncOpenAI, params: dict[str, Any], scope: str) -> Any:
        from openai import APIStatusError, OpenAIError

        adapted: set[str] = set()
        while True:
            try:
                # a reply trickled byte by byte never ends a read timeout; a stream's call ends with its headers
                # (its events have their own limit), or with the body of an error status, which could trickle too
                async with asyncio.timeout(self.timeout):
                    return await client.chat.completions.create(**params)
            except TimeoutError:
                raise self._no_response(scope) from None
            except ModelError:  # a body too large (`_bound_body`), as the SDK lets it through
                raise
            except OpenAIError as exc:
                if isinstance(exc.__cause__, ModelError):  # …or as older SDKs wrap it (APIConnectionError)
                    raise exc.__cause__ from None
                error = self._wrap_error(exc, scope)
                if not isinstance(exc, APIStatusError) or not self._adapt(params, exc, error, adapted):
                    raise error from exc
            except ValueError as exc:  # a body that is not valid JSON (the SDK's json.loads)
                raise self._not_json(exc, scope) from exc
            except RecursionError:  # …or one nested deeper than the recursion limit
                raise self._too_deep("a reply", scope) from None
            except (
                Exception
            ) as exc:  # the HTTP library's own, which the SDK lets through (an error body's read)
                raise self._transport_error(exc, scope) from exc

    async def _refuse_tools_if_mishandled(self, client: AsyncOpenAI, scope: str) -> None:
        """Once per model, before tools are first sent: a server known to mishandle them (from its model
        listing, `GET /models`) gets none — `ToolsUnsupportedError`, and the run goes on in text ReAct. A
        listing that fails or does not come within 5 s is no answer: tools are sent."""
        self._check_server = False
        try:
            listing = await client.with_options(timeout=min(self.timeout, 5.0), max_retries=0).models.list()
            owners = [getattr(m, "owned_by", None) for m in listing.data]
        except Exception as exc:  # a server without /models, a proxy's page, a timeout: not our business
            logger.debug("%s: listing the models of %s failed (%s)", self.provider, self.base_url, exc)
            return
        server = tools_mishandled(owners)
        if server is None:
            return
        self.capabilities = dataclasses.replace(self.capabilities, tools=False)  # later runs: ReAct
        # its sampling default repeat_penalty=1.1 penalises the tokens a ReAct step must repeat (`Action:`,
        # quotes, braces, the tool's name); llama-cpp-python's own default, as the embedded model runs, is 1.0
        self.extra_body.setdefault("repeat_penalty", 1.0)
        raise ToolsUnsupportedError(
            f"{server} at {self.base_url} takes tool definitions but hands the model's calls back as text and "
            "garbles its tool results, so the run goes on in text ReAct (tools described in the prompt); to "
            "send tools anyway, pass capabilities={'tools': True}",
            provider=self.provider,
            scope=scope,
        )

    def _adapt(self, params: dict[str, Any], exc: Any, error: ModelError, adapted: set[str]) -> bool:
        """Change `params` after the server refused them with `exc`; False when nothing can be changed.
        Raises `ToolsUnsupportedError` when the refused part is the tool definitions."""
        if isinstance(error, ContextOverflowError):
            room = reply_room_after_overflow(error, int(params[self.max_tokens_param]))
            if room is None or "room" in adapted:
                return False
            adapted.add("room")
            params[self.max_tokens_param] = room
            return True
        if isinstance(error, ModelRetryableError) and exc.status_code != 500:  # llama.cpp: 500 for --jinja
            return False
        text = _server_message(exc)
        if "tools" in params and tools_unsupported(text, exc.body):
            self.capabilities = dataclasses.replace(self.capabilities, tools=False)  # later runs: ReAct
            raise ToolsUnsupportedError(
                f"{error} — the run goes on in text ReAct (tools described in the prompt); to start there, "
                "pass capabilities={'tools': False} or mode='react'",
                provider=self.provider,
                scope=error.scope,
                status_code=error.status_code,
            ) from exc
        name = unsupported_param(text, params, exc.body)
        if name is None or name in adapted or exc.status_code >= 500:
            return False
        adapted.add(name)
        value = params.pop(name)
        if name in ("max_tokens", "max_completion_tokens"):  # the same limit under the other name
            other: MaxTokensParam = "max_completion_tokens" if name == "max_tokens" else "max_tokens"
            params[other] = value
            self.max_tokens_param = other
        else:
            self.unsupported_params.add(name)
        logger.warning(
            "%s: %s refused %r (%s); sending requests without it", self.provider, self.name, name, text
        )
        return True

    def _no_response(self, scope: str) -> ModelRetryableError:
        where = self.base_url or "api.openai.com"
        message = f"no response from {where} within {self.timeout} s; retry later or raise `timeout`"
        return ModelRetryableError(message, provider=self.provider, scope=scope)

    def _no_connection(self, scope: str) -> ModelRetryableError:
        where = self.base_url or "api.openai.com"
        seconds = min(self.timeout, CONNECT_TIMEOUT)
        message = (
            f"could not connect to {where} within {seconds:g} s (nothing accepted the connection: a wrong host "
            "or port, a firewall dropping it, or the server is down); check base_url and that the server is running"
        )
        return ModelRetryableError(message, provider=self.provider, scope=scope)

    def _transport_error(self, exc: Exception, scope: str) -> ModelError:
        """A failure of the HTTP library (httpx) that the SDK did not wrap: a timeout or a lost connection
        while a body was read (retryable); anything else is unexpected (not retryable)."""
        kinds = {cls.__name__ for cls in type(exc).__mro__}
        if "TimeoutException" in kinds:
            return self._no_response(scope)
        if "RequestError" in kinds:  # the connection broke, or the server spoke something other than HTTP
            where = self.base_url or "api.openai.com"
            detail = f": {exc}" if str(exc) else ""
            message = f"the connection to {where} was lost while its reply was read ({type(exc).__name__}{detail}); retry the request"
            return ModelRetryableError(message, provider=self.provider, scope=scope)
        return ModelError(f"{type(exc).__name__}: {exc}", provider=self.provider, scope=scope)

    def _too_deep(self, what: str, scope: str) -> ModelError:
        where = self.base_url or "api.openai.com"
        message = (
            f"{where} sent {what} nested too deeply to read (JSON deeper than Python's recursion limit); "
            "check that base_url is an OpenAI-compatible API"
        )
        return ModelError(message, provider=self.provider, scope=scope)

    def _not_json(self, exc: ValueError, scope: str) -> ModelError:
        where = self.base_url or "api.openai.com"
        message = f"{where} sent a reply that is not valid JSON ({exc}); check that base_url is an OpenAI-compatible API"
        return ModelError(message, provider=self.provider, scope=scope)

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of `chat.completions.create` for `request`."""
        settings = request.settings
        prefill = request.prefill if self.capabilities.prefill else ""
        params: dict[str, Any] = {
            "model": self.name,
            "messages": _wire_messages(request.messages, prefill),
            self.max_tokens_param: settings.max_output_tokens,
        }
        if self.send_temperature and "temperature" not in self.unsupported_params:
            params["temperature"] = settings.temperature
        if settings.stop and "stop" not in self.unsupported_params:
            params["stop"] = settings.stop[:MAX_STOP_SEQUENCES]
        if request.tools and self.capabilities.tools:
            params["tools"] = _wire_tools(request.tools)
            if "parallel_tool_calls" not in self.unsupported_params:
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
            connecting = type(exc.__cause__).__name__ == "ConnectTimeout"
            return self._no_connection(scope) if connecting else self._no_response(scope)
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ or exc.__context__
            detail = f" ({cause})" if cause and str(cause) else ""
            message = f"could not reach {where}{detail}; check base_url and that the server is running"
            kinds = {cls.__name__ for cls in type(cause).__mro__} if cause is not None else set()
            if kinds & {"ReadError", "RemoteProtocolError", "WriteError"}:  # connected: lost on the way
                said = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
                message = f"the connection to {where} was lost before its reply was complete ({said}); retry the request"
            return ModelRetryableError(message, provider=self.provider, scope=scope)
        if isinstance(exc, openai.APIStatusError):
            return self._status_error(exc, scope)
        if isinstance(exc, openai.APIResponseValidationError):
            message = f"the server sent a reply that is not a chat completion ({exc.message}); check base_url"
            return ModelError(message, provider=self.provider, scope=scope, status_code=exc.status_code)
        if isinstance(exc, openai.APIError):  # an error event inside a stream
            return self._reported_error(_server_message(exc), exc.type, exc.code, scope, exc.body)
        return ModelError(f"{type(exc).__name__}: {exc}", provider=self.provider, scope=scope)

    def _reported_error(
        self,
        text: str,
        kind: Any,
        code: Any,
        scope: str,
        body: Any = None,
    ) -> ModelError:
        """The error a server reported inside a stream: an overflow, a transient failure (retryable) or not."""
        overflow = overflow_error(text, provider=self.provider, scope=scope, code=code, body=body)
        if overflow is not None:
            return overflow
        message = f"the server reported an error: {text}"
        transient = kind in _TRANSIENT_TYPES or code in _TRANSIENT_TYPES
        transient = transient or (
            isinstance(code, int) and not isinstance(code, bool) and (code == 429 or code >= 500)
        )
        kind_ = ModelRetryableError if transient else ModelError
        return kind_(message, provider=self.provider, scope=scope)

    def _no_choices_error(self, completion: ChatCompletion, scope: str) -> ModelError:
        """A completion without choices: some proxies answer HTTP 200 with an error body."""
        error = getattr(completion, "error", None)
        if not isinstance(error, dict):
            message = "the server answered without any choice; check that base_url is a chat-completions API"
            return ModelError(message, provider=self.provider, scope=scope)
        code = error.get("code")
        text = str(error.get("message") or error)
        overflow = overflow_error(
            text,
            provider=self.provider,
            scope=scope,
            status_code=code if isinstance(code, int) else None,
            body=error,
        )
        if overflow is not None:
            return overflow
        message = f"the server answered HTTP 200 with an error: {text}"
        transient = (isinstance(code, int) and (code == 429 or code >= 500)) or code in _TRANSIENT_TYPES
        kind = ModelRetryableError if transient else ModelError
        return kind(
            message, provider=self.provider, scope=scope, status_code=code if isinstance(code, int) else None
        )

    def _status_error(self, exc: Any, scope: str) -> ModelError:
        status: int = exc.status_code
        text = _server_message(exc)
        overflow = overflow_error(
            text, provider=self.provider, scope=scope, status_code=status, code=exc.code, body=exc.body
        )
        if overflow is None and status == 413:  # a proxy's "Payload Too Large": a smaller prompt gets through
            overflow = ContextOverflowError(
                f"the request is too large for the server (HTTP 413): {text}",
                provider=self.provider,
                scope=scope,
                status_code=status,
            )
        if overflow is not None:  # checked first: llama.cpp servers answer it with HTTP 500
            return overflow
        message = f"HTTP {status} from model {self.name!r}: {text}"
        if status == 429 or status >= 500 or status == 408:
            retry_after = _retry_after(exc.response.headers)
            if retry_after is not None:
                message += f" (retry after {retry_after:g} s)"
            return ModelRetryableError(
                message, provider=self.provider, scope=scope, status_code=status, retry_after=retry_after
            )
        if status in _HINTS:
            message += "; " + _HINTS[status].format(name=self.name, where=self.base_url or "api.openai.com")
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


def _states_tools(value: ModelCapabilities | Mapping[str, Any] | None) -> bool:
    """Whether capabilities given by the user say whether the model takes tools."""
    return isinstance(value, ModelCapabilities) or (value is not None and "tools" in value)


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
            # "" rather than null: llama-cpp-python's server, older llama.cpp servers and Mistral's refuse
            # null next to tool calls (a 500 or 400 on every step after the first); OpenAI takes both
            "content": message.content,
            "tool_calls": [_wire_call(c) for c in message.tool_calls],
        }
    return {"role": message.role, "content": message.content}


def _wire_call(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": _wire_arguments(call)},
    }


def _wire_arguments(call: ToolCall) -> str:
    """The arguments of a call in the history as JSON text. Arguments the model sent that are not JSON (cut
    off by the token limit, holding NaN or an infinity, nested too deeply to read) go back as `{}` — the
    tool's error result quotes them — since llama.cpp's server answers HTTP 500 "Failed to parse tool call
    arguments as JSON" to every later request of the run, and vLLM and strict proxies refuse them with 400."""
    try:
        if call.raw_arguments is None:
            return json.dumps(call.arguments, allow_nan=False)
        _json.loads(call.raw_arguments)
    except (ValueError, RecursionError):
        return "{}"
    return call.raw_arguments


def _wire_tools(tools: Sequence[ToolDefinition]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


# ================================================================================ from the wire format


def _parse_arguments(call_id: str, name: str | None, raw: Any) -> ToolCall:
    """A tool call; arguments that are not a JSON object are kept as `raw_arguments`, never raised. Some
    servers send the arguments as an object rather than JSON text: taken as they are. Text that holds one
    object is read as it (see `_salvaged`). JSON is read strictly (`_json`): `{"x": NaN}`, `1e999` and
    nesting too deep to read are malformed arguments, for the loop to ask the model to send valid JSON."""
    name = name if isinstance(name, str) else ""  # no name: answered as an unknown tool
    if isinstance(raw, dict) and not _json.non_finite(raw):
        return ToolCall(id=call_id, name=name, arguments=raw)
    if raw is not None and not isinstance(raw, str):
        return ToolCall(id=call_id, name=name, raw_arguments=json.dumps(raw, ensure_ascii=False, default=str))
    text = raw or ""
    if not text.strip() or text.strip() == "null":  # no arguments (models send `null` for a tool without any)
        return ToolCall(id=call_id, name=name)
    try:
        arguments = _json.loads(text)
    except ValueError:
        arguments = _salvaged(text)
    if isinstance(arguments, str):  # encoded twice: a JSON string holding the JSON object
        arguments = _salvaged(arguments)
    if not isinstance(arguments, dict):
        return ToolCall(id=call_id, name=name, raw_arguments=text)
    return ToolCall(id=call_id, name=name, arguments=arguments)


_FENCE = re.compile(r"^```[a-zA-Z]*\s*")


def _salvaged(text: str) -> dict[str, Any] | None:
    """The arguments object at the start of `text`, which is not JSON as a whole, or None.

    What follows a complete object is dropped when it is not another call: a chat template's end token
    (`<|im_end|>`, `<|call|>`, `</tool_call>`) or a thinking model's commentary left in by the server's
    parser (Ollama, llama.cpp, vLLM), a Markdown fence's end, the same object again (LiteLLM's proxy repeats
    a streamed call whole in a last chunk). A different object after it stays an error: one of two calls
    would be lost. Text in a Markdown fence is read inside it."""
    rest = _FENCE.sub("", text.strip())
    try:
        value, end = _json.raw_decode(rest)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    rest = rest[end:].lstrip()
    while rest.startswith("{"):
        try:
            again, end = _json.raw_decode(rest)
        except ValueError:
            return None
        if again != value:
            return None
        rest = rest[end:].lstrip()
    return value


MAX_REPORTED_TOKENS = 100_000_000  # more than any model's window: a count above it is a server's bug


def _parse_usage(usage: Any) -> Usage:
    """Reported usage (one request), or an empty `Usage` (requests=0) so the loop estimates it: when the
    server reports none, or counts that cannot be right (negative, fractional, not numbers, absurdly large;
    zero for both, as servers that do not count send), which would otherwise corrupt the run's budget."""
    if usage is None:
        return Usage()
    prompt = _token_count(getattr(usage, "prompt_tokens", None))
    completion = _token_count(getattr(usage, "completion_tokens", None))
    if prompt is None or completion is None:
        logger.warning("the server reported impossible token counts (%r); they are estimated instead", usage)
        return Usage()
    if prompt <= 0 and completion <= 0:  # neither reported, or zeros from a server that does not count
        return Usage()
    if prompt < 0 or completion < 0:  # one side missing: from the total, else both estimated
        total = _token_count(getattr(usage, "total_tokens", None))
        known = max(prompt, completion)
        if total is None or total < known:
            return Usage()  # the output of a reply counted as 0 tokens escaped max_tokens and max_cost
        prompt, completion = (total - known, completion) if prompt < 0 else (prompt, total - known)
    return Usage(input_tokens=prompt, output_tokens=completion, requests=1)


def _token_count(value: Any) -> int | None:
    """A reported token count: -1 when missing, None when it cannot be a count of tokens."""
    if value is None:
        return -1
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_REPORTED_TOKENS:
        return None
    return value


def _finish_reason(reason: object, has_calls: bool) -> FinishReason:
    if reason is None:
        return "tool_calls" if has_calls else "stop"
    return _FINISH.get(reason, "unknown") if isinstance(reason, str) else "unknown"  # `{"type": "stop"}` too


def _content_text(content: Any) -> str:
    """Message content as text: a string, or a list of content parts (`[{"type": "text", "text": …}]`,
    which some servers send) joined, or a number (`"content": 5`: the answer as a JSON number); anything
    else is no text."""
    if isinstance(content, str):
        return content
    if isinstance(content, int | float) and not isinstance(content, bool):
        return repr(content)
    if isinstance(content, list):
        texts = [
            part.get("text") if isinstance(part, dict) else getattr(part, "text", None) for part in content
        ]
        return "".join(t for t in texts if isinstance(t, str))
    return ""


def _parse_completion(completion: ChatCompletion, name: str) -> ModelResponse:
    choice = completion.choices[0]
    message = choice.message
    calls = []
    raw_calls = message.tool_calls
    if raw_calls is not None and not isinstance(raw_calls, list):
        raise ValueError(f"its tool_calls are a {type(raw_calls).__name__}, not a list")
    for index, call in enumerate(raw_calls or []):
        function = getattr(call, "function", None)
        if function is None:
            if getattr(call, "type", None) not in (None, "function"):
                continue  # a non-function ("custom") tool call: not something thinkloop sends
            raise ValueError(f"its tool call {index} is {_clip(repr(call), 120)}, without a function")
        calls.append(
            _parse_arguments(_text_id(call.id) or f"call_{index}", function.name, function.arguments)
        )
    legacy = getattr(
        message, "function_call", None
    )  # the pre-tools `functions` API, still sent by some servers
    if not calls and legacy is not None and getattr(legacy, "name", None):
        calls.append(_parse_arguments("call_0", legacy.name, getattr(legacy, "arguments", None)))
    text = _content_text(message.content) or _content_text(getattr(message, "refusal", None))
    return ModelResponse(
        text=_reply_text(text, _reasoning_text(message), calls, choice.finish_reason),
        tool_calls=calls,
        usage=_parse_usage(completion.usage),
        model_name=_text_id(completion.model) or name,
        finish_reason=_finish_reason(choice.finish_reason, bool(calls)),
    )


def _reasoning_text(message: Any) -> str:
    """The reasoning a server put beside the content (`reasoning_content`: vLLM, llama.cpp, DeepSeek;
    `reasoning`: Ollama, OpenRouter, newer vLLM)."""
    extra = getattr(message, "model_extra", None) or {}
    for key in ("reasoning_content", "reasoning"):
        value = extra.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def _reply_text(text: str, reasoning: str, calls: list[ToolCall], finish: str | None) -> str:
    """The reply's text; when it has neither text nor calls but the server put reasoning beside it, that
    reasoning in `<think>` tags — vLLM's reasoning parser puts Qwen3's whole answer there when thinking is
    off (content null), and the loop takes a reply that is all reasoning as the answer, or finds the calls
    written in it. Not for a reply cut off while reasoning (finish_reason 'length')."""
    if text.strip() or calls or not reasoning.strip() or finish == "length":
        return text
    return f"<think>{reasoning}</think>"


@dataclass
class _LegacyDelta:
    """A streamed `function_call` delta, shaped like a tool-call delta (index 0, no id)."""

    function: Any
    index: int = 0
    id: str | None = None


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


def _text_id(value: Any) -> str:
    """An id or a model name as text: some servers send numbers (`"id": 0`), which the run state, its events
    and its stores could not hold; anything else that is not text is none ("")."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return ""


def _index_number(index: Any) -> int | None:
    """A tool-call delta's `index` as a number (some servers send it as text), or None without one."""
    if isinstance(index, int) and not isinstance(index, bool):
        return index
    if isinstance(index, str) and index.strip().isdigit():
        return int(index)
    return None


class _StreamAssembler:
    """Turns stream chunks into deltas, and reassembles the complete response at the end."""

    def __init__(self, name: str) -> None:
        self.model_name = name
        self.text: list[str] = []
        self.reasoning: list[str] = []  # kept for a reply whose answer the server put there (`_reply_text`)
        self.calls: dict[int, _PartialCall] = {}
        self.slots: dict[int, int] = {}  # the server's tool-call index -> the call of ours it is feeding
        self.finish: str | None = None
        self.usage = Usage()
        self.usage_seen = False  # the usage chunk (usage, no choices) came: the server's last
        self.events = 0  # chunks received
        self.shapeless: str | None = (
            None  # the first chunk of another shape, while no chat-completion chunk came
        )
        self.shaped = False  # a chat-completion chunk (with its `choices` list, or the usage) came
        self.chars = 0  # characters of text and arguments received

    def feed(self, chunk: ChatCompletionChunk) -> list[StreamChunk]:
        self.events += 1
        self._check_shape(chunk)
        model = _text_id(chunk.model)
        if model:
            self.model_name = model
        if chunk.usage is not None:
            self.usage = _parse_usage(chunk.usage)
        if not chunk.choices:
            # the usage chunk without choices is the server's last; usage beside choices (vLLM's
            # `continuous_usage_stats`, some proxies: in every chunk) says nothing about the end
            self.usage_seen = self.usage_seen or chunk.usage is not None
            return []
        choice = chunk.choices[0]
        reason = choice.finish_reason
        if reason is not None and not isinstance(reason, str):  # `{"type": "stop"}`: crashed the lookup
            reason = "unknown"
        self.finish = reason or self.finish
        delta = choice.delta
        if delta is None:
            return []
        out: list[StreamChunk] = []
        content = _content_text(delta.content)
        if content:
            self.text.append(content)
            self.chars += len(content)
            out.append(TextDelta(text=content))
        reasoning = _reasoning_text(delta)
        if reasoning:
            self.reasoning.append(reasoning)
            self.chars += len(reasoning)
        fed: set[int] = set()  # the calls this chunk fed
        for call in delta.tool_calls or []:
            out.append(self._feed_call(call, fed))
        legacy = getattr(delta, "function_call", None)  # the pre-tools `functions` API: one call, index 0
        if legacy is not None and not delta.tool_calls:
            out.append(self._feed_call(_LegacyDelta(function=legacy), fed))
        return out

    def _check_shape(self, chunk: Any) -> None:
        if isinstance(getattr(chunk, "choices", None), list) or getattr(chunk, "usage", None) is not None:
            self.shaped = True
        elif self.shapeless is None:
            extra = getattr(chunk, "model_extra", None) or {}
            self.shapeless = _clip(json.dumps(extra, ensure_ascii=False, default=str), 200)

    def _feed_call(self, call: Any, fed: set[int]) -> ToolCallDelta:
        index = self._slot(call, fed)
        fed.add(index)
        partial = self.calls.setdefault(index, _PartialCall())
        function = call.function
        name = function.name if function is not None and isinstance(function.name, str) else None
        arguments = (function.arguments if function is not None else None) or ""
        if not isinstance(arguments, str):  # an object where a piece of JSON text belongs
            arguments = json.dumps(arguments, ensure_ascii=False, default=str)
        call_id = _text_id(call.id)
        if call_id:
            partial.id = call_id
        if name and name != partial.name:  # some servers repeat the whole name in every delta
            # others send it growing ("get", "get_wea", "get_weather"): the longer one stands; else a piece
            grown = partial.name and name.startswith(partial.name)
            partial.name = name if grown else partial.name + name
        partial.arguments.append(arguments)
        self.chars += len(arguments)
        return ToolCallDelta(index=index, id=call_id or None, name=name or None, arguments_delta=arguments)

    def _slot(self, call: Any, fed: set[int]) -> int:
        """The call of ours a tool-call delta feeds. By the server's `index`, unless the delta starts another
        call there: one with a new id (Ollama sends every call of a reply at index 0, each with its id), or a
        second entry for the same call in one chunk. Without an index (older Ollama, some proxies): the call
        of its id, a new one for a new id, else the last call."""
        call_id = _text_id(call.id) or None
        server = _index_number(call.index)
        slot: int | None
        if server is None:
            known = [i for i, p in self.calls.items() if call_id and p.id == call_id]
            slot = known[-1] if known else None if call_id else max(self.calls, default=None)
        else:
            slot = self.slots.get(server)
            if slot is not None and call_id and self.calls[slot].id not in ("", call_id):
                slot = None
        if slot is None or slot in fed:
            slot = max(self.calls, default=-1) + 1
        if server is not None:
            self.slots[server] = slot
        return slot

    def response(self) -> ModelResponse:
        calls = [
            _parse_arguments(p.id or f"call_{i}", p.name, "".join(p.arguments))
            for i, p in sorted(self.calls.items())
        ]
        return ModelResponse(
            text=_reply_text("".join(self.text), "".join(self.reasoning), calls, self.finish),
            tool_calls=calls,
            usage=self.usage,
            model_name=self.model_name,
            finish_reason=_finish_reason(self.finish, bool(calls)),
        )


# ========================================================================================= reply bodies


@dataclass(frozen=True)
class _Sending:
    """The request `_create` is sending, for `_bound_body` to bound its reply by."""

    most: int  # characters of the reply asked for (`_reply_chars`)
    scope: str
    provider: str
    where: str  # the server


_sending: contextvars.ContextVar[_Sending | None] = contextvars.ContextVar("thinkloop_sending", default=None)
_DONE_SEEN = "thinkloop.done"  # in a streamed reply's `extensions` once its `data: [DONE]` came
_DONE_LINE = re.compile(rb"[\r\n]data: ?\[DONE\]")


def _body_limit(most: int) -> int:
    """The most bytes read of a reply body of at most `most` characters: 16 a character, plus `BODY_SLACK`."""
    return most * 16 + BODY_SLACK


async def _bound_body(response: Any) -> None:
    """The HTTP client's response hook, run when the headers have come, before the body is read: a body that
    would be larger than `_body_limit` fails with a `ModelError` (not retried) — announced so, before it is
    read; else as soon as that many bytes have come (the SDK reads a whole JSON body into memory, and an
    event stream's line until its end). The body is counted as decoded, as it is held. A stream's
    `data: [DONE]` is noted in `response.extensions`."""
    sending = _sending.get() or _Sending(0, "request", "openai", "the server")  # a model listing
    limit = _body_limit(sending.most)
    announced = str(response.headers.get("content-length") or "")
    if announced.isdigit() and int(announced) > limit:
        raise _too_large(sending, limit, f"it announced {int(announced):,} bytes")
    stream = "event-stream" in str(response.headers.get("content-type") or "").lower()
    response.aiter_bytes = _BoundedBody(response, limit, sending, stream)


class _BoundedBody:
    """`response.aiter_bytes`, counting what it yields (see `_bound_body`)."""

    def __init__(self, response: Any, limit: int, sending: _Sending, stream: bool) -> None:
        self.response = response
        self.read = response.aiter_bytes  # the method of the response's class
        self.limit = limit
        self.sending = sending
        self.stream = stream

    async def __call__(self, chunk_size: int | None = None) -> AsyncIterator[bytes]:
        size = 0
        before = b"\n"  # the end of the previous piece: a `data: [DONE]` line may straddle two
        async with contextlib.aclosing(self.read(chunk_size)) as pieces:
            async for piece in pieces:
                size += len(piece)
                if size > self.limit:
                    raise _too_large(self.sending, self.limit, f"reading it stopped at {size:,} bytes")
                if self.stream and _DONE_LINE.search(before[-16:] + piece):
                    self.response.extensions[_DONE_SEEN] = True
                before = piece
                yield piece


def _too_large(sending: _Sending, limit: int, size: str) -> ModelError:
    message = (
        f"the server's reply is larger than {limit:,} bytes ({size}), far more than a reply of at most "
        f"{sending.most:,} characters needs (16 bytes a character, plus {BODY_SLACK:,} bytes); check that "
        f"{sending.where} is an OpenAI-compatible API (not a proxy's or another service's page), or raise "
        "max_output_tokens if its replies are meant to be this large"
    )
    return ModelError(message, provider=sending.provider, scope=sending.scope)


# ============================================================================================== errors


def _chunks(assembler: _StreamAssembler) -> str:
    """How much of the reply had come: `3 chunk(s) (12 characters)`."""
    return f"{assembler.events} chunk(s) ({assembler.chars} characters)"


def _error_in_chunk(chunk: Any) -> tuple[str, Any, Any] | None:
    """(message, type, code) of an error a server sent as a stream chunk in place of the reply — vLLM's
    `{"object": "error", "message": …}`, an `event: error` whose data has no `error` key (those with one the
    SDK raises itself) — or None for an ordinary chunk."""
    if getattr(chunk, "choices", None) or getattr(chunk, "usage", None) is not None:
        return None
    extra = getattr(chunk, "model_extra", None) or {}
    said = extra.get("message") or extra.get("detail")
    if getattr(chunk, "object", None) != "error" and not isinstance(said, str):
        return None
    text = _clip(str(said or extra or "the server sent an error chunk without a message"), 2000)
    return text, extra.get("type"), extra.get("code")


def _server_message(exc: Any) -> str:
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return _clip(str(error["message"]), 2000)
        if isinstance(error, str):
            return _clip(error, 2000)
        detail = body.get("detail")
        if isinstance(detail, list) and detail:  # a FastAPI/pydantic server's validation errors
            return _clip("; ".join(_validation_issue(d) for d in detail[:10]), 2000)
        if isinstance(detail, str):
            return _clip(detail, 2000)
    if isinstance(body, str) and body.strip():  # not JSON: a proxy's error page, plain text
        page = _describe_body(body)
        return f"the server answered with {page}" + (
            ", probably from a proxy or gateway" if "HTML" in page else ""
        )
    return str(getattr(exc, "message", "") or exc)


def _validation_issue(item: Any) -> str:
    """`body.tools: Extra inputs are not permitted` from `{"loc": ["body", "tools"], "msg": "Extra …"}`."""
    if not isinstance(item, dict):
        return str(item)
    where = ".".join(str(part) for part in item.get("loc") or ())
    message = str(item.get("msg") or item.get("message") or item)
    return f"{where}: {message}" if where else message


_TITLE = re.compile(r"<title[^>]*>(.*?)</title>|<h1[^>]*>(.*?)</h1>", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<[^>]+>")


# the start of a body that is an event stream: a field line, or a comment line and then one
_SSE_START = re.compile(r"\s*(data|event|id|retry):|\s*:[^\n]*\n\s*(data|event):")


def _sse_events(body: str) -> Iterator[tuple[str, str]]:
    """(event name, data) of each event of an event-stream body (the WHATWG format: `field: value` lines,
    events ended by a blank line, comment lines starting with `:`)."""
    event, data = "", list[str]()
    for line in [*body.splitlines(), ""]:
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "", list[str]()
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                data.append(value)
            elif name == "event":
                event = value


def _describe_body(text: str) -> str:
    """A short description of a body that is not JSON: an HTML page (by its title), or the start of the text."""
    head = text.lstrip()[:2000]
    if not head:
        return "an empty body"
    if head.startswith("<") or "<html" in head.lower():
        match = _TITLE.search(text[:20_000])
        title = " ".join(_TAG.sub(" ", match.group(1) or match.group(2)).split()) if match else ""
        return f"an HTML page ({_clip(title, 120)!r})" if title else "an HTML page"
    return f"the text {_clip(' '.join(head.split()), 200)!r}"


def _shown(value: Any, limit: int = 300) -> str:
    """What the server sent, as JSON and clipped, for an error message: the SDK builds its objects without
    checking them (`construct`), so they hold whatever shapes the server sent."""
    return _clip(json.dumps(_as_sent(value), ensure_ascii=False, default=repr), limit)


def _as_sent(value: Any, depth: int = 0) -> Any:
    """An SDK object of a reply as the plain data it was built from: the fields it was given and extras."""
    if depth > 16:
        return "…"
    if isinstance(value, dict):
        return {str(k): _as_sent(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_as_sent(v, depth + 1) for v in value]
    given = getattr(value, "model_fields_set", None)
    if isinstance(given, set) and hasattr(value, "__dict__"):
        data = {k: v for k, v in vars(value).items() if k in given}
        data.update(getattr(value, "__pydantic_extra__", None) or {})
        return _as_sent(data, depth + 1)
    return value


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _reply_chars(max_tokens: Any) -> int:
    """The most characters read of one reply: 32 per token asked for (a token is about 4), at least 64 Ki."""
    return max(int(max_tokens or 0) * 32, 65_536)


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from `retry-after-ms` or `Retry-After` (seconds or an HTTP date); None when absent or
    not a time (garbage, `nan`, `inf`: the caller's own backoff applies)."""
    value = headers.get("retry-after-ms")
    if value:
        seconds = _seconds(value)
        if seconds is not None:
            return seconds / 1000
    value = headers.get("retry-after")
    if not value:
        return None
    seconds = _seconds(value)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000": a date in UTC without a stated zone
        when = when.replace(tzinfo=datetime.UTC)
    return max(when.timestamp() - time.time(), 0.0)


def _seconds(value: str) -> float | None:
    try:
        seconds = float(value)
    except ValueError:
        return None
    return max(seconds, 0.0) if math.isfinite(seconds) else None


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
