"""A fake OpenAI-compatible chat-completions server on 127.0.0.1, for tests.

It speaks the real protocol (JSON replies, and SSE when the client asks `stream=True`), so the real
`openai` client and `OpenAIModel` can be tested end to end without a network:

    async with OpenAICompatibleServer(["Hello!"]) as server:
        model = OpenAIModel("gpt-4o-mini", base_url=server.url, api_key="test")
        response = await model.request(ModelRequest(messages=[Message.user("Hi")]))
        assert server.requests[0].json["messages"][0] == {"role": "user", "content": "Hi"}

The script is a list answered in order, one item per chat-completion request:

- a string: a text reply;
- `Completion(text=..., tool_calls=[tool_call("add", {"a": 1})], usage=(12, 3))`: a full reply, streamed
  in small pieces (`text_chunk_size`, `arguments_chunk_size`, `byte_chunk_size`) when asked to stream;
- `Fault(status=429, headers={"Retry-After": "2"})`, `Fault(status=500)`, `Fault(drop=True)` (close the
  connection without answering), `Fault(delay=5)` (a slow reply), `Fault(hang=True)` (accept the request and
  never answer), `Fault(stall_body=True)` (headers, then never the body), `Fault(trickle=0.1)` (the body a byte
  at a time), `Fault(502, body=b"<html>…", headers={"content-type": "text/html"})` (a proxy's error page),
  `Fault(200, body=b"{not json")` (a malformed body): a failure;
- `context_overflow(limit=4096, prompt=5000)`: the real "prompt too long" error of OpenAI (HTTP 400,
  `code: "context_length_exceeded"`), or of vLLM or llama.cpp's server with `style=`;
- a function of the `RecordedRequest` returning one of the above.

Streams can also break: `Completion(drop_after_bytes=N)` cuts the connection in the middle of an SSE event,
`Completion(send_done=False)` ends the stream without `data: [DONE]`, `Completion(stall_after_events=N)`
stops sending after N events but keeps the connection open (with `keepalive_every=S`, sending an SSE comment
every S seconds meanwhile), `Completion(send_finish=False)` never sends a `finish_reason`. A reply can be huge:
`Completion(padding=N)` sends N bytes of blank space in it, made as they are sent (`server.padding_sent`).

With `context_window=N` the server itself answers the overflow error (in `overflow_style`) to every request
whose prompt is longer than N tokens — counted as the characters of the messages and tools / 4 + 1, or by
`count_tokens` — before it looks at the script; `server.overflows` counts those answers.

`server.requests` records every request (path, headers, JSON body). With the script used up the server
answers `fallback` if set, else HTTP 400 "script exhausted" (a non-retryable error, so tests fail fast).

`async with` runs the server on the current event loop; a plain `with` runs it on a background thread
(for synchronous code such as `agent.run_sync()`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

__all__ = [
    "Completion",
    "Fault",
    "OpenAICompatibleServer",
    "OverflowStyle",
    "RecordedRequest",
    "ScriptItem",
    "context_overflow",
    "prompt_tokens",
    "tool_call",
]

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    413: "Payload Too Large",
    408: "Request Timeout",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}
_ERROR_TYPES = {
    429: "rate_limit_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
}
OverflowStyle = Literal["openai", "vllm", "llama.cpp"]


def tool_call(name: str, arguments: dict[str, Any] | str, *, id: str | None = None) -> dict[str, Any]:
    """A scripted tool call; `arguments` as a dict (sent as JSON) or as the exact text to send."""
    return {"id": id, "name": name, "arguments": arguments}


@dataclass
class Completion:
    """A scripted chat completion: text and/or tool calls, with the usage to report.

    Args:
        text: the reply's text.
        tool_calls: `tool_call(...)` dicts; ids default to `call_<request>_<index>`.
        usage: (prompt_tokens, completion_tokens) to report, or None to report none.
        finish_reason: defaults to "tool_calls" when there are tool calls, else "stop".
        model: the model name to report (defaults to the requested one).
        delay: seconds to wait before answering.
        text_chunk_size, arguments_chunk_size: characters per SSE delta when streaming.
        byte_chunk_size: when set, the SSE body is written in HTTP chunks of this many bytes, so
            multi-byte characters and SSE events straddle chunk boundaries.
        drop_after_events: when streaming, close the connection after this many SSE events.
        error_after_events: when streaming, send an `{"error": ...}` event (of `error_type`) after this
            many SSE events, then end the stream, as OpenAI does when a stream fails on its side.
        drop_after_bytes: when streaming, close the connection after this many bytes of the SSE body (in the
            middle of an event).
        send_done: when streaming, end with `data: [DONE]` (False: the stream just ends).
        stall_after_events: when streaming, send this many SSE events, then nothing more while keeping the
            connection open (a stalled upstream; with `send_done=False` and every event sent, a server that
            never ends its stream).
        keepalive_every: while stalled, send an SSE comment (`: keep-alive`) every this many seconds, as
            proxies such as OpenRouter do while they wait for their upstream: bytes keep coming, events not.
        trickle: when not streaming, send the reply one byte every this many seconds (a server or proxy
            that trickles its body: no read ever waits long, the whole reply takes long).
        padding: bytes of blank space sent in the reply, made as they are sent (a misbehaving server's huge
            body, which the server never holds): when not streaming, JSON whitespace after the body's `{`;
            when streaming, an SSE comment line before the first event. `server.padding_sent` counts the
            bytes of it written.
        chunked: when not streaming, send the body in HTTP chunks, without a content-length.
        send_finish: when streaming, False sends no `finish_reason` (null in every chunk, as some servers do).
    """

    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    usage: tuple[int, int] | None = (10, 5)
    finish_reason: str | None = None
    model: str | None = None
    delay: float = 0.0
    text_chunk_size: int = 4
    arguments_chunk_size: int = 4
    byte_chunk_size: int | None = None
    drop_after_events: int | None = None
    error_after_events: int | None = None
    error_type: str = "server_error"
    drop_after_bytes: int | None = None
    send_done: bool = True
    stall_after_events: int | None = None
    keepalive_every: float | None = None
    trickle: float | None = None
    padding: int = 0
    chunked: bool = False
    send_finish: bool = True


@dataclass
class Fault:
    """A scripted failure: an HTTP error status (with headers such as Retry-After), or a dropped connection.

    `body` defaults to an OpenAI-style `{"error": {"message": ..., "type": ...}}`; bytes are sent as they
    are (with `headers={"content-type": "text/event-stream"}`, a hand-written SSE stream). `hang=True` reads
    the request and never answers (until the client gives up or the server stops); `stall_body=True` sends
    the status line and headers, then never the body; `trickle=S` sends the body one byte every S seconds.
    """

    status: int = 500
    message: str = "scripted failure"
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    delay: float = 0.0
    drop: bool = False
    hang: bool = False
    stall_body: bool = False
    trickle: float | None = None


def context_overflow(
    limit: int = 4096, prompt: int = 5000, *, completion: int = 0, style: OverflowStyle = "openai"
) -> Fault:
    """The error a server answers when the prompt (`prompt` tokens, plus `completion` tokens of reply room
    where the server counts it) does not fit its context window of `limit` tokens, in the server's words:

    - `"openai"`: HTTP 400, `code: "context_length_exceeded"`, "This model's maximum context length is …";
    - `"vllm"`: HTTP 400, "… However, you requested N tokens (P in the messages, C in the completion) …";
    - `"llama.cpp"`: HTTP 500, `type: "exceed_context_size_error"` with `n_prompt_tokens` and `n_ctx`.
    """
    if style == "llama.cpp":
        error = {
            "code": 500,
            "message": "the request exceeds the available context size. try increasing the context size or "
            "enable context shift",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": prompt,
            "n_ctx": limit,
        }
        return Fault(500, body={"error": error})
    if style == "vllm":
        message = (
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt + completion} tokens ({prompt} in the messages, {completion} in the completion). "
            "Please reduce the length of the messages or completion."
        )
        return Fault(
            400, body={"object": "error", "message": message, "type": "BadRequestError", "code": 400}
        )
    if completion:
        detail = f"you requested {prompt + completion} tokens ({prompt} in the messages, {completion} in the completion)"
    else:
        detail = f"your messages resulted in {prompt} tokens"
    message = f"This model's maximum context length is {limit} tokens. However, {detail}. Please reduce the length of the messages."
    error = {
        "message": message,
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
    return Fault(400, body={"error": error})


@dataclass
class RecordedRequest:
    """One HTTP request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        """The body decoded as JSON (None when empty)."""
        return json.loads(self.body) if self.body else None


ScriptItem = str | Completion | Fault | Callable[[RecordedRequest], "str | Completion | Fault"]


class _Dropped(Exception):
    """The scripted reply closes the connection."""


class OpenAICompatibleServer:
    """A chat-completions server on 127.0.0.1 with a random port, answering from a script.

    Args:
        script: the replies, in order (see the module docstring).
        fallback: what to answer once the script is used up (default: HTTP 400 "script exhausted").
        models: the model names listed by `GET /v1/models`.
        context_window: when set, a request whose prompt has more tokens than this is answered with the
            overflow error of `overflow_style` (see `context_overflow`), before the script is consulted.
        count_tokens: how the server counts a request's prompt tokens (default: characters of the messages
            and tools / 4 + 1).
        overflow_style: `"openai"`, `"vllm"` (the reply room `max_tokens` counts against the window, as
            vLLM does) or `"llama.cpp"`.
    """

    def __init__(
        self,
        script: Iterable[ScriptItem] = (),
        *,
        fallback: ScriptItem | None = None,
        models: Iterable[str] = ("fake-model",),
        owned_by: str = "thinkloop",
        context_window: int | None = None,
        count_tokens: Callable[[dict[str, Any]], int] | None = None,
        overflow_style: OverflowStyle = "openai",
    ) -> None:
        self._script: deque[ScriptItem] = deque(script)
        self.fallback = fallback
        self.models = list(models)
        self.owned_by = owned_by  # of every model of `GET /models` ("me": as llama-cpp-python's server)
        self.context_window = context_window
        self.count_tokens = count_tokens or prompt_tokens
        self.overflow_style: OverflowStyle = overflow_style
        self.overflows = 0
        self.padding_sent = 0  # bytes of `Completion(padding=N)` written
        self.requests: list[RecordedRequest] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._stopping = False
        self._ids = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._thread_loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------------------------- script

    def add(self, *items: ScriptItem) -> None:
        """Append replies to the script."""
        self._script.extend(items)

    @property
    def remaining(self) -> int:
        """Script items not yet used."""
        return len(self._script)

    @property
    def url(self) -> str:
        """The base URL to give a client, e.g. `http://127.0.0.1:54321/v1`."""
        if not self.port:
            raise RuntimeError("the server is not started: use `async with server` or `with server`")
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        """The JSON bodies of the chat-completion requests received, in order."""
        return [r.json for r in self.requests if r.path.endswith("/chat/completions")]

    # ---------------------------------------------------------------------------- start and stop

    async def start(self) -> None:
        """Listen on 127.0.0.1 with a random free port (on the running event loop)."""
        self._server = await asyncio.start_server(self._serve_connection, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and close every open connection."""
        if self._server is None:
            return
        self._server.close()
        self._stopping = True
        for writer in list(self._writers):
            writer.transport.abort()
        for handler in list(self._handlers):  # a handler may be sleeping in a scripted delay: end it now
            handler.cancel()
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=5)
        await self._server.wait_closed()
        self._server, self._stopping = None, False

    async def __aenter__(self) -> OpenAICompatibleServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def __enter__(self) -> OpenAICompatibleServer:
        """Run the server on a background thread with its own event loop."""
        loop = asyncio.new_event_loop()
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self.start())
            started.set()
            loop.run_forever()

        self._thread_loop = loop
        self._thread = threading.Thread(target=run, name="openai-compatible-server", daemon=True)
        self._thread.start()
        started.wait(10)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        loop, thread = self._thread_loop, self._thread
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(self.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        self._thread_loop = self._thread = None

    # ------------------------------------------------------------------------------------ serving

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        handler = asyncio.current_task()
        if handler is not None:
            self._handlers.add(handler)
        try:
            while (request := await _read_request(reader)) is not None:
                self.requests.append(request)
                await self._answer(request, writer, reader)
        except (_Dropped, ConnectionError, asyncio.IncompleteReadError):
            writer.transport.abort()
        except asyncio.CancelledError:  # by stop(), which ends a handler sleeping in a scripted delay
            writer.transport.abort()
            if not self._stopping:
                raise
        finally:
            self._writers.discard(writer)
            if handler is not None:
                self._handlers.discard(handler)
            with contextlib.suppress(Exception):
                writer.close()

    async def _answer(
        self, request: RecordedRequest, writer: asyncio.StreamWriter, reader: asyncio.StreamReader
    ) -> None:
        if request.method == "GET" and request.path.rstrip("/").endswith("/models"):
            data = [
                {"id": m, "object": "model", "created": 0, "owned_by": self.owned_by} for m in self.models
            ]
            await _send_json(writer, 200, {"object": "list", "data": data})
            return
        if request.method != "POST" or not request.path.rstrip("/").endswith("/chat/completions"):
            await _send_json(writer, 404, _error_body(f"no route {request.method} {request.path}", 404))
            return
        try:
            body = request.json
        except ValueError:
            body = None
        if not isinstance(body, dict):
            await _send_json(writer, 400, _error_body("the request body is not a JSON object", 400))
            return
        overflow = self._overflow(body)
        item = overflow or self._next_item(request)
        if isinstance(item, Fault) and (item.hang or item.stall_body):
            if item.stall_body:
                await _send_json(writer, item.status, b"", item.headers, length=1_000)
            await reader.read()  # never answer: wait until the client hangs up (or the server stops)
            raise _Dropped
        if isinstance(item, Fault):
            await _send_fault(writer, item)
        elif body.get("stream"):
            await self._send_stream(writer, item, body, reader)
        else:
            await self._send_completion(writer, item, body)

    def _overflow(self, body: dict[str, Any]) -> Fault | None:
        """The overflow error when the request does not fit `context_window`, else None."""
        if self.context_window is None:
            return None
        prompt = self.count_tokens(body)
        completion = 0
        if self.overflow_style == "vllm":
            completion = int(body.get("max_tokens") or body.get("max_completion_tokens") or 0)
        if prompt + completion <= self.context_window:
            return None
        self.overflows += 1
        return context_overflow(self.context_window, prompt, completion=completion, style=self.overflow_style)

    def _next_item(self, request: RecordedRequest) -> Completion | Fault:
        item = self._script.popleft() if self._script else self.fallback
        if item is None:
            n = len(self.chat_requests)
            return Fault(status=400, message=f"script exhausted: no scripted reply left for request #{n}")
        if callable(item):
            item = item(request)
        return Completion(text=item) if isinstance(item, str) else item

    def _calls(self, item: Completion) -> list[dict[str, Any]]:
        number = next(self._ids)
        calls = []
        for index, call in enumerate(item.tool_calls):
            args = call["arguments"]
            calls.append(
                {
                    "id": call.get("id") or f"call_{number}_{index}",
                    "name": call["name"],
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                }
            )
        return calls

    async def _send_completion(self, writer: asyncio.StreamWriter, item: Completion, body: Any) -> None:
        if item.delay:
            await asyncio.sleep(item.delay)
        calls = self._calls(item)
        message: dict[str, Any] = {"role": "assistant", "content": item.text or None}
        if calls:
            message["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in calls
            ]
        payload = _envelope(item, body, "chat.completion")
        payload["choices"] = [
            {"index": 0, "message": message, "finish_reason": _finish(item, calls), "logprobs": None}
        ]
        if item.usage is not None:
            payload["usage"] = _usage(item.usage)
        if item.padding or item.chunked:
            await self._send_padded(writer, json.dumps(payload).encode(), item)
            return
        await _send_json(writer, 200, payload, trickle=item.trickle)

    async def _send_padded(self, writer: asyncio.StreamWriter, data: bytes, item: Completion) -> None:
        """`data`, a JSON object, with `item.padding` spaces after its `{`, as it is written."""
        framing = (
            "transfer-encoding: chunked" if item.chunked else f"content-length: {len(data) + item.padding}"
        )
        writer.write(f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{framing}\r\n\r\n".encode())
        write = _write_chunks if item.chunked else _write_plain
        await write(writer, data[:1], None)
        await self._pad(writer, item.padding, write)
        await write(writer, data[1:], None)
        if item.chunked:
            writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def _pad(self, writer: asyncio.StreamWriter, size: int, write: _Writer) -> None:
        """`size` spaces, 64 KiB at a time, each written once the client has read enough of the ones before."""
        while size > 0:
            piece = _SPACES[: min(size, len(_SPACES))]
            await write(writer, piece, None)
            self.padding_sent += len(piece)
            size -= len(piece)

    async def _send_stream(
        self, writer: asyncio.StreamWriter, item: Completion, body: Any, reader: asyncio.StreamReader
    ) -> None:
        if item.delay:
            await asyncio.sleep(item.delay)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        events = [json.dumps(e, ensure_ascii=False) for e in self._stream_events(item, body, include_usage)]
        if item.error_after_events is not None:
            error = {"error": {"message": "scripted stream error", "type": item.error_type, "code": None}}
            events[item.error_after_events :] = [json.dumps(error)]
        if item.send_done:
            events.append("[DONE]")
        head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        writer.write(head.encode())
        if item.padding:  # one SSE comment line, `:` and the spaces
            await _write_chunks(writer, b":", None)
            await self._pad(writer, item.padding, _write_chunks)
            await _write_chunks(writer, b"\n\n", None)
        sent = 0
        for count, event in enumerate(events):
            if item.stall_after_events is not None and count >= item.stall_after_events:
                await _stall(writer, reader, item.keepalive_every)
            if item.drop_after_events is not None and count >= item.drop_after_events:
                await writer.drain()
                raise _Dropped
            data = f"data: {event}\n\n".encode()
            if item.drop_after_bytes is not None and sent + len(data) > item.drop_after_bytes:
                await _write_chunks(writer, data[: item.drop_after_bytes - sent], item.byte_chunk_size)
                await writer.drain()
                raise _Dropped
            await _write_chunks(writer, data, item.byte_chunk_size)
            sent += len(data)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    def _stream_events(self, item: Completion, body: Any, include_usage: bool) -> Iterator[dict[str, Any]]:
        base = _envelope(item, body, "chat.completion.chunk")

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {
                **base,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
            }

        yield chunk({"role": "assistant", "content": ""})
        for piece in _pieces(item.text, item.text_chunk_size):
            yield chunk({"content": piece})
        calls = self._calls(item)
        for index, call in enumerate(calls):
            head = {"index": index, "id": call["id"], "type": "function"}
            yield chunk({"tool_calls": [{**head, "function": {"name": call["name"], "arguments": ""}}]})
            for piece in _pieces(call["arguments"], item.arguments_chunk_size):
                yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
        yield chunk({}, _finish(item, calls) if item.send_finish else None)
        if include_usage and item.usage is not None:
            yield {**base, "choices": [], "usage": _usage(item.usage)}


# ============================================================================================= helpers


async def _read_request(reader: asyncio.StreamReader) -> RecordedRequest | None:
    line = await reader.readline()
    if not line.strip():
        return None
    method, path, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while (raw := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = await reader.readexactly(length) if length else b""
    return RecordedRequest(method=method, path=path, headers=headers, body=body)


def prompt_tokens(body: dict[str, Any]) -> int:
    """The default token count of a request's prompt: characters of its messages and tools / 4 + 1."""
    text = json.dumps(body.get("messages") or [], ensure_ascii=False) + json.dumps(body.get("tools") or [])
    return len(text) // 4 + 1


def _envelope(item: Completion, body: Any, kind: str) -> dict[str, Any]:
    model = item.model or (body.get("model") if isinstance(body, dict) else None) or "fake-model"
    return {
        "id": f"chatcmpl-{time.monotonic_ns()}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
    }


def _finish(item: Completion, calls: list[dict[str, Any]]) -> str:
    return item.finish_reason or ("tool_calls" if calls else "stop")


def _usage(usage: tuple[int, int]) -> dict[str, int]:
    return {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}


def _pieces(text: str, size: int) -> Iterator[str]:
    size = max(size, 1)
    for start in range(0, len(text), size):
        yield text[start : start + size]


def _error_body(message: str, status: int) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


async def _send_fault(writer: asyncio.StreamWriter, fault: Fault) -> None:
    if fault.delay:
        await asyncio.sleep(fault.delay)
    if fault.drop:
        raise _Dropped
    body = fault.body if fault.body is not None else _error_body(fault.message, fault.status)
    await _send_json(writer, fault.status, body, fault.headers, trickle=fault.trickle)


async def _send_json(
    writer: asyncio.StreamWriter,
    status: int,
    payload: Any,
    headers: dict[str, str] | None = None,
    *,
    trickle: float | None = None,
    length: int | None = None,
) -> None:
    """Send a JSON (or bytes) reply; `length` overrides its content-length (a body that never comes)."""
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    headers = {"content-type": "application/json"} | {k.lower(): v for k, v in (headers or {}).items()}
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines.append(f"content-length: {len(data) if length is None else length}")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + (b"" if trickle else data))
    await writer.drain()
    for byte in data if trickle else b"":
        await asyncio.sleep(trickle or 0)
        writer.write(bytes([byte]))
        await writer.drain()


async def _stall(writer: asyncio.StreamWriter, reader: asyncio.StreamReader, keepalive: float | None) -> None:
    """Send no more events, keeping the connection open (with SSE comments every `keepalive` s) until the
    client hangs up; then drop the connection."""
    await writer.drain()
    if keepalive is None:
        await reader.read()
        raise _Dropped
    hung_up = asyncio.ensure_future(reader.read())
    try:
        while not hung_up.done():
            await _write_chunks(writer, b": keep-alive\n\n", None)
            await asyncio.wait([hung_up], timeout=keepalive)
    finally:
        hung_up.cancel()
    raise _Dropped


_SPACES = b" " * 65_536
_Writer = Callable[[asyncio.StreamWriter, bytes, int | None], Awaitable[None]]


async def _write_plain(writer: asyncio.StreamWriter, data: bytes, size: int | None) -> None:
    writer.write(data)
    await writer.drain()


async def _write_chunks(writer: asyncio.StreamWriter, data: bytes, size: int | None) -> None:
    step = size or len(data)
    for start in range(0, len(data), step):
        piece = data[start : start + step]
        writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        await writer.drain()
