"""OpenAIModel against a real HTTP server on 127.0.0.1, driven by the real `openai` client."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest

from thinkloop import (
    Agent,
    ConfigurationError,
    Message,
    ModelError,
    ModelRequest,
    ModelRetryableError,
    ModelSettings,
    ToolCall,
    ToolDefinition,
    Usage,
    tool,
)
from thinkloop._budget import DEFAULT_PRICES
from thinkloop._messages import ModelResponse, TextDelta, ToolCallDelta
from thinkloop.models import ModelCapabilities, OpenAIModel, _openai, resolve_model
from thinkloop.testing_server import Completion, Fault, OpenAICompatibleServer, RecordedRequest, tool_call

ADD = ToolDefinition(
    name="add",
    description="Add two integers.",
    parameters={
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
)


@pytest.fixture
async def server() -> AsyncIterator[OpenAICompatibleServer]:
    async with OpenAICompatibleServer() as srv:
        yield srv


@pytest.fixture
async def model(server: OpenAICompatibleServer) -> AsyncIterator[OpenAIModel]:
    m = OpenAIModel("gpt-4o-mini", base_url=server.url, api_key="test-key")
    yield m
    await m.aclose()


def ask(text: str = "Hi", **kwargs: Any) -> ModelRequest:
    return ModelRequest(messages=[Message.system("Be brief."), Message.user(text)], **kwargs)


async def collect(model: OpenAIModel, request: ModelRequest) -> list[Any]:
    return [chunk async for chunk in model.stream(request)]


# =========================================================================================== requests


async def test_text_reply_with_usage(server: OpenAICompatibleServer, model: OpenAIModel) -> None:
    server.add(Completion(text="Hello!", usage=(21, 7)))
    response = await model.request(ask(run_id="run-1", turn=3))

    assert response == ModelResponse(
        text="Hello!",
        usage=Usage(input_tokens=21, output_tokens=7, requests=1),
        model_name="gpt-4o-mini",
        finish_reason="stop",
    )
    [received] = server.requests
    assert received.path == "/v1/chat/completions"
    assert received.headers["authorization"] == "Bearer test-key"
    assert received.json == {
        "model": "gpt-4o-mini",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "max_tokens": 4096,
        "temperature": 0.3,
    }  # no run_id/turn, no tools when none are given


async def test_parallel_tool_calls_become_tool_calls_with_dict_arguments(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    server.add(
        Completion(
            tool_calls=[
                tool_call("add", {"a": 1, "b": 2}, id="call_a"),
                tool_call("add", '{"a": 3, "b": 4}', id="call_b"),
            ]
        )
    )
    response = await model.request(ask("add things", tools=[ADD]))

    assert response.tool_calls == [
        ToolCall(id="call_a", name="add", arguments={"a": 1, "b": 2}),
        ToolCall(id="call_b", name="add", arguments={"a": 3, "b": 4}),
    ]
    assert response.text == ""
    assert response.finish_reason == "tool_calls"
    sent = server.chat_requests[0]
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {"name": "add", "description": "Add two integers.", "parameters": ADD.parameters},
        }
    ]
    assert sent["parallel_tool_calls"] is True


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"a": 1,', ToolCall(id="c1", name="add", raw_arguments='{"a": 1,')),
        ("[1, 2]", ToolCall(id="c1", name="add", raw_arguments="[1, 2]")),
        ('"text"', ToolCall(id="c1", name="add", raw_arguments='"text"')),
        ("", ToolCall(id="c1", name="add")),
        (" null ", ToolCall(id="c1", name="add")),
    ],
)
async def test_arguments_that_are_not_a_json_object_are_kept_raw(
    server: OpenAICompatibleServer, model: OpenAIModel, raw: str, expected: ToolCall
) -> None:
    server.add(Completion(tool_calls=[tool_call("add", raw, id="c1")]))
    response = await model.request(ask(tools=[ADD]))
    assert response.tool_calls == [expected]


async def test_history_is_sent_in_the_chat_completions_wire_shape(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    good = ToolCall(id="call_1", name="add", arguments={"a": 1, "b": 2})
    bad = ToolCall(id="call_2", name="add", raw_arguments='{"a": 1,')
    messages = [
        Message.system("You add numbers."),
        Message.user("What is 1+2?"),
        Message.assistant("Let me add.", [good, bad], step=1),
        Message.tool(good, "3", step=1),
        Message.tool(bad, "Error: invalid JSON arguments", step=1),
        Message.assistant("", [ToolCall(id="call_3", name="add", arguments={})], step=2),
        Message.tool(ToolCall(id="call_3", name="add"), "0", step=2),
        Message.user("Summarise progress.", kind="hint", step=2),
    ]
    server.add("It is 3.")
    await model.request(ModelRequest(messages=messages, tools=[ADD]))

    assert server.chat_requests[0]["messages"] == [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": "What is 1+2?"},
        {
            "role": "assistant",
            "content": "Let me add.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
                },
                # not JSON: sent as {} (llama.cpp's server answers 500 to the rest of the run otherwise)
                {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
        {"role": "tool", "tool_call_id": "call_2", "content": "Error: invalid JSON arguments"},
        {
            "role": "assistant",
            "content": "",  # not null: servers such as llama-cpp-python's refuse it
            "tool_calls": [
                {"id": "call_3", "type": "function", "function": {"name": "add", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_3", "content": "0"},
        {"role": "user", "content": "Summarise progress."},
    ]


async def test_settings_stop_sequences_and_extra_body(server: OpenAICompatibleServer) -> None:
    model = OpenAIModel(
        "qwen2.5:7b", base_url=server.url, api_key="k", extra_body={"top_k": 20}, provider="ollama"
    )
    server.add("ok")
    settings = ModelSettings(temperature=0.0, max_output_tokens=128, stop=["a", "b", "c", "d", "e"])
    await model.request(ask(settings=settings))
    await model.aclose()

    sent = server.chat_requests[0]
    assert (sent["temperature"], sent["max_tokens"], sent["top_k"]) == (0.0, 128, 20)
    assert sent["stop"] == ["a", "b", "c", "d"]  # the API takes at most four


async def test_reasoning_models_get_max_completion_tokens_and_no_temperature(
    server: OpenAICompatibleServer,
) -> None:
    server.add("ok", "ok")
    for m in (
        OpenAIModel("o3-mini", base_url=server.url, api_key="k"),
        OpenAIModel("my-model", base_url=server.url, api_key="k", max_tokens_param="max_completion_tokens"),
    ):
        await m.request(ask())
        await m.aclose()
    first, second = server.chat_requests
    assert first["max_completion_tokens"] == 4096
    assert "max_tokens" not in first and "temperature" not in first
    assert second["max_completion_tokens"] == 4096 and second["temperature"] == 0.3


async def test_prefill_is_sent_only_when_the_model_supports_it(server: OpenAICompatibleServer) -> None:
    server.add(" I should add.", " I should add.")
    plain = OpenAIModel("m", base_url=server.url, api_key="k")
    prefilling = OpenAIModel("m", base_url=server.url, api_key="k", capabilities={"prefill": True})
    for m in (plain, prefilling):
        response = await m.request(ask(prefill="Thought:"))
        assert response.text == " I should add."
        await m.aclose()
    without, with_prefill = server.chat_requests
    assert without["messages"][-1] == {"role": "user", "content": "Hi"}
    assert with_prefill["messages"][-1] == {"role": "assistant", "content": "Thought:"}


async def test_capability_overrides(server: OpenAICompatibleServer) -> None:
    model = OpenAIModel("llama", base_url=server.url, api_key="k", capabilities={"tools": False})
    assert model.capabilities == ModelCapabilities(tools=False)
    server.add("Thought: I know.\nFinal Answer: 2")
    await model.request(ask(tools=[ADD]))
    await model.aclose()
    assert "tools" not in server.chat_requests[0]  # a server without tool support is never sent tools

    with pytest.raises(ConfigurationError, match=r"unknown capabilities \['tool'\]"):
        OpenAIModel("llama", base_url=server.url, capabilities={"tool": False})
    given = ModelCapabilities(streaming=False, context_window=8192)
    assert OpenAIModel("llama", base_url=server.url, capabilities=given).capabilities is given
    with pytest.raises(ConfigurationError, match="needs a model name"):
        OpenAIModel("", base_url=server.url)


async def test_finish_reasons_are_mapped(server: OpenAICompatibleServer, model: OpenAIModel) -> None:
    server.add(
        Completion(text="cut", finish_reason="length"),
        Completion(text="no", finish_reason="content_filter"),
        Completion(text="?", finish_reason="something_new"),
    )
    reasons = [(await model.request(ask())).finish_reason for _ in range(3)]
    assert reasons == ["length", "content_filter", "unknown"]


async def test_a_refusal_is_the_reply_text(server: OpenAICompatibleServer, model: OpenAIModel) -> None:
    message = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
    choice = {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
    body = {"id": "x", "object": "chat.completion", "created": 0, "model": "gpt-4o-mini", "choices": [choice]}
    server.add(Fault(200, body=body))  # a raw body, sent as is
    response = await model.request(ask())
    assert (response.text, response.usage.requests) == ("I can't help with that.", 0)


async def test_missing_usage_is_left_for_the_loop_to_estimate(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    server.add(Completion(text="hi", usage=None, model="gpt-4o-mini-2024-07-18"))
    response = await model.request(ask())
    assert response.usage == Usage()
    assert response.model_name == "gpt-4o-mini-2024-07-18"


# ========================================================================================== streaming


async def test_streaming_text(server: OpenAICompatibleServer, model: OpenAIModel) -> None:
    server.add(Completion(text="Hello, world!", text_chunk_size=5, usage=(30, 4)))
    chunks = await collect(model, ask())

    assert chunks == [
        TextDelta(text="Hello"),
        TextDelta(text=", wor"),
        TextDelta(text="ld!"),
        ModelResponse(
            text="Hello, world!",
            usage=Usage(input_tokens=30, output_tokens=4, requests=1),
            model_name="gpt-4o-mini",
            finish_reason="stop",
        ),
    ]
    sent = server.chat_requests[0]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


async def test_streaming_tool_calls_split_across_many_chunks(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    # chunk boundaries fall inside a JSON unicode escape (\u00fc), and (byte_chunk_size=1) inside
    # the UTF-8 bytes of ñ and 東京 on the wire
    first = '{"city": "M\\u00fcnchen", "note": "ñ"}'
    second = '{"city": "東京", "days": [1, 2]}'
    server.add(
        Completion(
            text="Checking.",
            tool_calls=[tool_call("weather", first, id="call_x"), tool_call("weather", second, id="call_y")],
            arguments_chunk_size=3,
            byte_chunk_size=1,
            usage=(50, 20),
        )
    )
    chunks = await collect(model, ask(tools=[ADD]))

    deltas = [c for c in chunks if isinstance(c, ToolCallDelta)]
    assert [(d.index, d.id, d.name) for d in deltas if d.id] == [
        (0, "call_x", "weather"),
        (1, "call_y", "weather"),
    ]
    assert "".join(d.arguments_delta for d in deltas if d.index == 0) == first
    assert "".join(d.arguments_delta for d in deltas if d.index == 1) == second
    assert [d.arguments_delta for d in deltas if d.index == 0][4:7] == [
        '"M\\',
        "u00",
        "fcn",
    ]  # inside \\u00fc
    assert len(deltas) == 2 + len(range(0, len(first), 3)) + len(range(0, len(second), 3))
    assert [c.text for c in chunks if isinstance(c, TextDelta)] == ["Chec", "king", "."]

    final = chunks[-1]
    assert final == ModelResponse(
        text="Checking.",
        tool_calls=[
            ToolCall(id="call_x", name="weather", arguments={"city": "München", "note": "ñ"}),
            ToolCall(id="call_y", name="weather", arguments={"city": "東京", "days": [1, 2]}),
        ],
        usage=Usage(input_tokens=50, output_tokens=20, requests=1),
        model_name="gpt-4o-mini",
        finish_reason="tool_calls",
    )


async def test_streamed_malformed_arguments_are_kept_raw(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    server.add(Completion(tool_calls=[tool_call("add", '{"a": 1, "b":', id="c")], arguments_chunk_size=2))
    final = (await collect(model, ask(tools=[ADD])))[-1]
    assert final.tool_calls == [ToolCall(id="c", name="add", raw_arguments='{"a": 1, "b":')]


def sse(*events: dict[str, Any] | str) -> Fault:
    """A hand-written SSE reply."""
    data = "".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events)
    return Fault(200, body=data.encode(), headers={"content-type": "text/event-stream"})


def delta(payload: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": payload, "finish_reason": finish}
    return {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [choice]}


async def test_stream_from_a_server_that_omits_indexes_and_repeats_names(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    server.add(
        sse(
            delta({"tool_calls": [{"id": "a", "function": {"name": "add", "arguments": '{"a": '}}]}),
            delta({"tool_calls": [{"function": {"name": "add", "arguments": "1}"}}]}),
            delta({"tool_calls": [{"id": "b", "function": {"name": "add", "arguments": "{}"}}]}),
            delta({}, "tool_calls"),
            "[DONE]",
        )
    )
    final = (await collect(model, ask(tools=[ADD])))[-1]
    assert final.tool_calls == [
        ToolCall(id="a", name="add", arguments={"a": 1}),
        ToolCall(id="b", name="add"),
    ]
    assert final.usage == Usage()  # no usage chunk: the loop estimates


async def test_stream_from_a_server_that_sends_a_name_growing_or_in_pieces(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    server.add(
        sse(
            delta({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "get", "arguments": ""}}]}),
            delta({"tool_calls": [{"index": 0, "function": {"name": "get_wea", "arguments": ""}}]}),
            delta({"tool_calls": [{"index": 0, "function": {"name": "get_weather", "arguments": "{}"}}]}),
            delta({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "ad", "arguments": ""}}]}),
            delta({"tool_calls": [{"index": 1, "function": {"name": "d", "arguments": "{}"}}]}),
            delta({}, "tool_calls"),
            "[DONE]",
        )
    )
    final = (await collect(model, ask(tools=[ADD])))[-1]
    assert [(c.id, c.name) for c in final.tool_calls] == [("a", "get_weather"), ("b", "add")]


async def test_a_malformed_stream_chunk_is_a_model_error(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    server.add(sse(delta({"content": "hi"}), "{not json"))
    with pytest.raises(
        ModelError, match="streaming chat completion failed: the server sent a malformed stream chunk"
    ):
        await collect(model, ask())


async def test_stream_without_usage_leaves_requests_zero(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    server.add(Completion(text="hi", usage=None))
    final = (await collect(model, ask()))[-1]
    assert isinstance(final, ModelResponse)
    assert final.text == "hi" and final.usage == Usage()


async def test_stream_closed_early_releases_the_connection(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    server.add(Completion(text="a long answer " * 20), "second")
    stream = model.stream(ask())
    assert await anext(stream) == TextDelta(text="a lo")
    await stream.aclose()
    assert (await model.request(ask())).text == "second"


# ============================================================================================= errors


async def test_429_is_retryable_with_retry_after(server: OpenAICompatibleServer, model: OpenAIModel) -> None:
    server.add(Fault(429, "Rate limit reached for gpt-4o-mini", headers={"Retry-After": "2"}))
    with pytest.raises(ModelRetryableError) as info:
        await model.request(ask())
    error = info.value
    assert (error.status_code, error.retry_after, error.provider, error.scope) == (
        429,
        2.0,
        "openai",
        "chat completion",
    )
    assert str(error) == (
        "openai: chat completion failed: HTTP 429 from model 'gpt-4o-mini': "
        "Rate limit reached for gpt-4o-mini (retry after 2 s)"
    )


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after-ms": "1500"}, 1.5),
        ({"Retry-After": "0.25"}, 0.25),
        ({"Retry-After": "soon"}, None),
        ({}, None),
        # not a time: ignored (an agent slept on nan forever)
        ({"Retry-After": "nan"}, None),
        ({"Retry-After": "inf"}, None),
        ({"Retry-After": "1e400"}, None),
        ({"retry-after-ms": "NaN", "Retry-After": "3"}, 3.0),
        ({"Retry-After": "-5"}, 0.0),
        ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0),  # a date in the past: at once
        ({"Retry-After": "Mon, 99 Foo"}, None),
    ],
)
async def test_retry_after_forms(
    server: OpenAICompatibleServer, model: OpenAIModel, headers: dict[str, str], expected: float | None
) -> None:
    server.add(Fault(429, headers=headers))
    with pytest.raises(ModelRetryableError) as info:
        await model.request(ask())
    assert info.value.retry_after == expected
    assert "nan" not in str(info.value) and "inf s" not in str(info.value)


async def test_retry_after_as_http_date(server: OpenAICompatibleServer, model: OpenAIModel) -> None:
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    server.add(Fault(503, headers={"Retry-After": when}))
    with pytest.raises(ModelRetryableError) as info:
        await model.request(ask())
    assert info.value.retry_after is not None and 25 < info.value.retry_after <= 30


@pytest.mark.parametrize("status", [500, 502, 503, 504, 408])
async def test_server_errors_are_retryable(
    server: OpenAICompatibleServer, model: OpenAIModel, status: int
) -> None:
    server.add(Fault(status, "upstream overloaded"))
    with pytest.raises(ModelRetryableError, match=f"HTTP {status} .*upstream overloaded") as info:
        await model.request(ask())
    assert info.value.status_code == status


@pytest.mark.parametrize(
    ("status", "hint"),
    [(400, "Invalid 'messages'"), (401, "check the API key"), (404, "check the model name"), (422, "")],
)
async def test_client_errors_are_not_retryable(
    server: OpenAICompatibleServer, model: OpenAIModel, status: int, hint: str
) -> None:
    server.add(Fault(status, "Invalid 'messages': empty"))
    with pytest.raises(ModelError) as info:
        await model.request(ask())
    assert not isinstance(info.value, ModelRetryableError)
    assert info.value.status_code == status
    assert str(info.value).startswith(
        f"openai: chat completion failed: HTTP {status} from model 'gpt-4o-mini'"
    )
    assert hint in str(info.value)
    assert "test-key" not in str(info.value)  # the key never shows up in errors


async def test_connection_refused_is_retryable_and_names_the_provider() -> None:
    with socket.socket() as probe:  # a port with nothing listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = OpenAIModel("deepseek-chat", base_url=f"http://127.0.0.1:{port}/v1", provider="deepseek")
    with pytest.raises(ModelRetryableError) as info:
        await model.request(ask())
    await model.aclose()
    assert info.value.provider == "deepseek"
    assert str(info.value).startswith(
        f"deepseek: chat completion failed: could not reach http://127.0.0.1:{port}/v1"
    )
    assert info.value.status_code is None


async def test_dropped_connection_is_retryable(server: OpenAICompatibleServer, model: OpenAIModel) -> None:
    """The server took the connection, then closed it: not "could not reach … check base_url" (that is for a
    server nobody answers at, above), but a connection lost on the way."""
    server.add(Fault(drop=True))
    with pytest.raises(
        ModelRetryableError,
        match=r"was lost before its reply was complete \(RemoteProtocolError: Server disc",
    ):
        await model.request(ask())


async def test_slow_server_times_out_as_retryable(server: OpenAICompatibleServer) -> None:
    model = OpenAIModel("gpt-4o-mini", base_url=server.url, api_key="k", timeout=0.2)
    server.add(Completion(text="late", delay=5))
    with pytest.raises(ModelRetryableError, match=r"no response from .* within 0.2 s"):
        await model.request(ask())
    await model.aclose()


async def test_stream_errors_name_the_streaming_scope(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    server.add(Fault(503, "overloaded"), Completion(text="partial answer here", drop_after_events=3))
    with pytest.raises(ModelRetryableError) as info:
        await collect(model, ask())
    assert str(info.value).startswith("openai: streaming chat completion failed: HTTP 503")

    seen: list[Any] = []
    with pytest.raises(ModelRetryableError, match="streaming chat completion failed: could not reach"):
        async for chunk in model.stream(ask()):
            seen.append(chunk)
    assert seen == [TextDelta(text="part"), TextDelta(text="ial ")]  # the drop came mid-stream


@pytest.mark.parametrize(
    ("error_type", "retryable"), [("server_error", True), ("invalid_request_error", False)]
)
async def test_an_error_event_inside_a_stream(
    server: OpenAICompatibleServer, model: OpenAIModel, error_type: str, retryable: bool
) -> None:
    server.add(Completion(text="partial answer", error_after_events=2, error_type=error_type))
    with pytest.raises(ModelError) as info:
        await collect(model, ask())
    assert isinstance(info.value, ModelRetryableError) is retryable
    assert str(info.value) == (
        "openai: streaming chat completion failed: the server reported an error: scripted stream error"
    )


async def test_http_200_with_an_error_body_is_an_error(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    server.add(
        Fault(200, body={"error": {"message": "upstream provider overloaded", "code": 502}}),
        Fault(200, body={"error": {"message": "model not allowed", "code": 403}}),
        Fault(200, body={"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": []}),
    )
    with pytest.raises(
        ModelRetryableError, match="HTTP 200 with an error: upstream provider overloaded"
    ) as info:
        await model.request(ask())
    assert info.value.status_code == 502
    with pytest.raises(ModelError, match="model not allowed") as denied:
        await model.request(ask())
    assert not isinstance(denied.value, ModelRetryableError)
    with pytest.raises(ModelError, match="answered without any choice"):
        await model.request(ask())


async def test_cancellation_passes_through_untouched(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    arrived = asyncio.Event()

    def slow(request: RecordedRequest) -> Completion:
        arrived.set()
        return Completion(text="late", delay=5)

    server.add(slow)
    task = asyncio.create_task(model.request(ask()))
    await arrived.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# ====================================================================================== configuration


def test_missing_api_key_is_a_clear_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ConfigurationError, match="set the OPENAI_API_KEY environment variable"):
        OpenAIModel("gpt-4o-mini")
    with pytest.raises(ConfigurationError, match="OPENAI_API_KEY"):
        resolve_model("openai:gpt-4o-mini")


@pytest.mark.parametrize(
    "url",
    [
        "http://localhost:11434/v1",
        "http://127.0.0.1:8000/v1",
        "http://[::1]:8080/v1",
        "http://192.168.1.20:8000/v1",
    ],
)
def test_local_servers_need_no_key(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert OpenAIModel("qwen2.5:7b", base_url=url).api_key == _openai.LOCAL_API_KEY


def test_environment_variables_and_model_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("OPENAI_BASE_URL", "https://api.deepseek.com/v1")
    model = resolve_model("openai:deepseek-chat")
    assert isinstance(model, OpenAIModel)
    assert (model.api_key, model.base_url, model.spec) == (
        "sk-env",
        "https://api.deepseek.com/v1",
        "openai:deepseek-chat",
    )
    assert OpenAIModel("x", api_key="explicit").api_key == "explicit"
    assert OpenAIModel("x", provider="deepseek").spec == "deepseek:x"


def test_importing_thinkloop_does_not_import_openai() -> None:
    code = "import sys, thinkloop, thinkloop.models._openai; print('openai' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


async def test_aclose_closes_the_client_and_a_later_request_reopens_it(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    server.add("one", "two")
    assert (await model.request(ask())).text == "one"
    client = model._client
    assert client is not None
    await model.aclose()
    assert client.is_closed() and model._client is None
    assert (await model.request(ask())).text == "two"


def test_one_model_serves_several_event_loops() -> None:
    """`run_sync()` twice makes two event loops; the SDK client must not leak from the first to the second."""
    with OpenAICompatibleServer(["first", "second"]) as srv:
        agent = Agent(OpenAIModel("gpt-4o-mini", base_url=srv.url, api_key="k"))
        assert agent.run_sync("one").output == "first"
        assert agent.run_sync("two").output == "second"
        assert isinstance(agent.model, OpenAIModel)
        clients = [
            entry.client for entry in agent.model._clients._by_loop.values()
        ]  # loops not collected yet
        assert all(client is not None and client.is_closed() for client in clients)  # closed with their loop


def test_one_model_serves_threads_each_with_its_own_event_loop() -> None:
    """Agents in several threads (`run_sync` in each: a loop each) share one model. Each loop, all running
    at once, gets a client of its own (an SDK client's connections belong to one loop), and each is
    closed when its loop ends."""
    threads = 4
    together = threading.Barrier(threads)
    with OpenAICompatibleServer(["ok"] * 2 * threads) as srv:
        model = OpenAIModel("gpt-4o-mini", base_url=srv.url, api_key="k")

        async def two_requests() -> Any:
            assert (await model.request(ask())).text == "ok"
            client = model._client
            await asyncio.to_thread(together.wait, 10)  # every thread's loop is running now
            assert (await model.request(ask())).text == "ok" and model._client is client
            return client

        clients: list[Any] = []
        failures: list[BaseException] = []

        def in_a_thread() -> None:
            try:
                clients.append(asyncio.run(two_requests()))
            except BaseException as exc:
                failures.append(exc)

        workers = [threading.Thread(target=in_a_thread) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(30)
        assert failures == [] and len(clients) == threads
        assert len({id(client) for client in clients}) == threads
        assert all(client.is_closed() for client in clients)  # closed with their loops
        assert len(srv.chat_requests) == 2 * threads


# ============================================================================================= tokens


class _ByteEncoder:
    """One token per UTF-8 byte: enough to check the message accounting."""

    def encode(self, text: str, disallowed_special: Any = "all") -> list[int]:
        return list(text.encode())


def test_count_tokens_follows_openai_chat_accounting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_openai, "_encoder_for", lambda name: _ByteEncoder())
    model = OpenAIModel("gpt-4o-mini", api_key="k")
    messages = [
        Message.system("abc"),
        Message.assistant("", [ToolCall(id="1", name="add", arguments={"a": 1})]),
    ]
    # 3 (reply priming) + [3 + 6 "system" + 3 "abc"] + [3 + 9 "assistant" + 0] + [3 + 3 "add" + 8 '{"a": 1}']
    assert model.count_tokens(messages) == 3 + 12 + 12 + 14


def test_count_tokens_is_none_without_an_encoding() -> None:
    _openai._reset_encoders()
    try:
        assert OpenAIModel("qwen2.5:7b", api_key="k").count_tokens([Message.user("hi")]) is None
        # gpt-4o's encoding file is not cached on this offline machine: no exception, no network, just None
        assert OpenAIModel("gpt-4o-mini", api_key="k").count_tokens([Message.user("hi")]) is None
    finally:
        _openai._reset_encoders()


def test_a_slow_tokenizer_load_does_not_block_counting(monkeypatch: pytest.MonkeyPatch) -> None:
    """tiktoken may download its file with no timeout: counting answers None until it is loaded."""
    release = threading.Event()

    def slow_find(name: str) -> _ByteEncoder:
        release.wait(30)
        return _ByteEncoder()

    _openai._reset_encoders()
    monkeypatch.setattr(_openai, "_find_encoding", slow_find)
    monkeypatch.setattr(_openai, "TOKENIZER_WAIT", 0.01)
    model = OpenAIModel("gpt-4o-mini", api_key="k")
    try:
        assert model.count_tokens([Message.user("hi")]) is None
        assert model.count_tokens([Message.user("hi")]) is None  # still loading: no second wait
        release.set()
        _openai._loading["gpt-4o-mini"].join(10)
        assert model.count_tokens([Message.user("hi")]) == 3 + 3 + 4 + 2
    finally:
        release.set()
        _openai._reset_encoders()


# ============================================================================================ agent


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def test_agent_run_end_to_end(server: OpenAICompatibleServer, model: OpenAIModel) -> None:
    server.add(
        Completion(tool_calls=[tool_call("add", {"a": 2, "b": 3})], usage=(120, 15)),
        Completion(text="The answer is 5.", usage=(160, 8)),
    )
    result = await Agent(model, tools=[add]).run("What is 2+3?")

    assert (result.output, result.stop_reason.value, result.tool_calls, result.steps) == (
        "The answer is 5.",
        "final_answer",
        1,
        2,
    )
    assert [m.content for m in result.state.messages if m.role == "tool"] == ["5"]
    price = DEFAULT_PRICES["gpt-4o-mini"]
    assert result.usage.model_dump() == {
        "input_tokens": 280,
        "output_tokens": 23,
        "cost": pytest.approx(price.cost(280, 23)),
        "requests": 2,
        "estimated": False,
    }
    second = server.chat_requests[1]["messages"]
    call_id = second[-2]["tool_calls"][0]["id"]
    assert second[-1] == {"role": "tool", "tool_call_id": call_id, "content": "5"}
    assert second[0]["role"] == "system"


async def test_agent_stream_yields_answer_deltas_from_sse(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    server.add(
        Completion(tool_calls=[tool_call("add", '{"a": 20, "b": 22}')], arguments_chunk_size=2),
        Completion(text="The sum is 42.", text_chunk_size=3),
    )
    events = [e async for e in Agent(model, tools=[add]).stream("What is 20+22?")]

    deltas = [e.text for e in events if e.type == "answer_delta"]
    assert deltas == ["The", " su", "m i", "s 4", "2."]
    assert [e.type for e in events if e.type in ("tool_call", "tool_result")] == ["tool_call", "tool_result"]
    done = events[-1]
    assert done.type == "done" and done.result.output == "The sum is 42."
    assert all(r["stream"] is True for r in server.chat_requests)


async def test_agent_without_native_tools_uses_react_over_the_same_server(
    server: OpenAICompatibleServer,
) -> None:
    model = OpenAIModel("llama3", base_url=server.url, api_key="k", capabilities={"tools": False})
    server.add(
        'Thought: add them\nAction: add\nAction Input: {"a": 2, "b": 2}',
        "Thought: done\nFinal Answer: 4",
    )
    result = await Agent(model, tools=[add]).run("2+2?")
    await model.aclose()
    assert result.output == "4"
    first = server.chat_requests[0]
    assert "tools" not in first and "Observation:" in first["stop"]


# ======================================================================================= fake server


async def test_server_script_exhaustion_and_function_items(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    def echo(request: RecordedRequest) -> str:
        return "echo: " + request.json["messages"][-1]["content"]

    server.add(echo)
    assert (await model.request(ask("ping"))).text == "echo: ping"
    with pytest.raises(ModelError, match="script exhausted"):
        await model.request(ask())
    assert server.remaining == 0 and len(server.requests) == 2


# ====================================================================================== network guard


def test_real_network_is_blocked_in_tests() -> None:
    with pytest.raises(ConnectionRefusedError, match="network access is blocked"):
        socket.create_connection(("203.0.113.7", 443), timeout=1)
    with pytest.raises(ConnectionRefusedError, match="network access is blocked"):
        socket.getaddrinfo("api.openai.com", 443)


async def test_the_openai_client_cannot_reach_the_internet_in_tests() -> None:
    model = OpenAIModel("gpt-4o-mini", base_url="https://api.openai.com/v1", api_key="sk-real-looking")
    with pytest.raises(ModelRetryableError, match="network access is blocked") as info:
        await model.request(ask())
    await model.aclose()
    assert "could not reach https://api.openai.com/v1" in str(info.value)
    assert info.value.provider == "openai"
