"""What an OpenAI-compatible server can get wrong, against the loopback server with the real `openai` client:
every fault ends in a clear `ModelError` (retryable only when transient) or a healed reply — never a raw
exception out of the adapter or `agent.run`, never a hang."""

from __future__ import annotations

import asyncio
import json
import math
import re
import socket
import sys
import tracemalloc
import zlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from thinkloop import (
    Agent,
    ConfigurationError,
    ContextOverflowError,
    Message,
    ModelError,
    ModelRequest,
    ModelRetryableError,
    ModelSettings,
    StopReason,
    ToolCall,
    ToolDefinition,
    tool,
)
from thinkloop._messages import ModelResponse, TextDelta
from thinkloop.models import OpenAIModel, _openai
from thinkloop.testing import FunctionModel
from thinkloop.testing_server import Completion, Fault, OpenAICompatibleServer, ScriptItem, tool_call

ADD = ToolDefinition(
    name="add",
    description="Add two integers.",
    parameters={"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
)
NGINX_502 = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>"
    b"\r\n<hr><center>nginx/1.25.3</center>\r\n</body>\r\n</html>\r\n" + b"<!-- padding -->" * 200
)
HTML = {"content-type": "text/html"}


@pytest.fixture
async def server() -> AsyncIterator[OpenAICompatibleServer]:
    async with OpenAICompatibleServer() as srv:
        yield srv


@pytest.fixture
async def model(server: OpenAICompatibleServer) -> AsyncIterator[OpenAIModel]:
    m = OpenAIModel("gpt-4o-mini", base_url=server.url, api_key="sk-secret-key", timeout=2.0)
    yield m
    await m.aclose()


def ask(**settings: Any) -> ModelRequest:
    return ModelRequest(messages=[Message.user("Hi")], tools=[ADD], settings=ModelSettings(**settings))


async def answer(model: OpenAIModel, streaming: bool, **settings: Any) -> ModelResponse:
    if not streaming:
        return await model.request(ask(**settings))
    chunks = [chunk async for chunk in model.stream(ask(**settings))]
    final = chunks[-1]
    assert isinstance(final, ModelResponse)
    return final


BOTH = pytest.mark.parametrize("streaming", [False, True], ids=["request", "stream"])

# ========================================================================================= bad bodies


@BOTH
@pytest.mark.parametrize(
    ("fault", "says"),
    [
        (Fault(200, body=b"{not json"), r"(not valid JSON|with the text '\{not json')"),
        (Fault(200, body=b""), r"(not valid JSON|an empty body)"),
        (Fault(200, body=b"[1, 2]"), "a JSON list"),
        (Fault(200, body=b"<html><body>Please log in</body></html>", headers=HTML), "an HTML page"),
        (
            Fault(
                200, body={"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": []}
            ),
            "answered without any choice",
        ),
        (
            Fault(200, body={"object": "chat.completion", "model": "m", "choices": [{"index": 0}]}),
            "malformed chat completion",
        ),
    ],
    ids=["malformed-json", "empty-body", "json-list", "html-200", "no-choices", "choice-without-message"],
)
async def test_a_body_that_is_not_a_chat_completion_is_a_clear_model_error(
    server: OpenAICompatibleServer, model: OpenAIModel, streaming: bool, fault: Fault, says: str
) -> None:
    server.add(fault)
    with pytest.raises(ModelError, match=says) as info:
        await answer(model, streaming)
    assert not isinstance(info.value, ModelRetryableError)  # a misconfigured server: retrying will not help
    assert "check" in str(info.value) and "sk-secret-key" not in str(info.value)


@BOTH
async def test_a_proxy_error_page_is_summarised_by_its_title(
    server: OpenAICompatibleServer, model: OpenAIModel, streaming: bool
) -> None:
    server.add(Fault(502, body=NGINX_502, headers=HTML), Fault(404, body=b"<h1>Not Found</h1>", headers=HTML))
    with pytest.raises(ModelRetryableError) as bad_gateway:
        await answer(model, streaming)
    assert str(bad_gateway.value).endswith(
        "HTTP 502 from model 'gpt-4o-mini': the server answered with an HTML page ('502 Bad Gateway'), "
        "probably from a proxy or gateway"
    )
    with pytest.raises(ModelError, match=r"an HTML page \('Not Found'\).*check the model name") as missing:
        await answer(model, streaming)
    assert not isinstance(missing.value, ModelRetryableError) and len(str(missing.value)) < 400


# ================================================================================ statuses, with hints


@BOTH
@pytest.mark.parametrize(
    ("status", "hint"),
    [
        (401, "check the API key (api_key= or $OPENAI_API_KEY) and that it belongs to http://127.0.0.1:"),
        (403, "the API key may not have access to model 'gpt-4o-mini'"),
        (404, "check the model name ('gpt-4o-mini') and base_url (http://127.0.0.1:"),
    ],
)
async def test_auth_and_not_found_errors_say_what_to_check_and_are_not_retried(
    server: OpenAICompatibleServer, model: OpenAIModel, streaming: bool, status: int, hint: str
) -> None:
    server.add(Fault(status, "nope"))
    with pytest.raises(ModelError) as info:
        await answer(model, streaming)
    assert not isinstance(info.value, ModelRetryableError) and info.value.status_code == status
    assert hint in str(info.value) and "sk-secret-key" not in str(info.value)


async def test_an_agent_does_not_retry_a_401(server: OpenAICompatibleServer, model: OpenAIModel) -> None:
    server.add(Fault(401, "Incorrect API key provided"), "never reached")
    result = await Agent(model).run("Hi")
    assert result.stop_reason is StopReason.ERROR and "check the API key" in (result.error or "")
    assert len(server.chat_requests) == 1


# =========================================================================== replies that are not right


@BOTH
async def test_a_content_filtered_empty_reply_is_an_error_but_a_partial_one_is_kept(
    server: OpenAICompatibleServer, model: OpenAIModel, streaming: bool
) -> None:
    server.add(
        Completion(finish_reason="content_filter"),
        Completion(text="Part of it", finish_reason="content_filter"),
    )
    with pytest.raises(ModelError, match="content filter withheld the reply") as info:
        await answer(model, streaming)
    assert not isinstance(info.value, ModelRetryableError)
    partial = await answer(model, streaming)
    assert (partial.text, partial.finish_reason) == ("Part of it", "content_filter")


@BOTH
async def test_odd_but_valid_replies_come_back_as_they_are_for_the_loop_to_heal(
    server: OpenAICompatibleServer, model: OpenAIModel, streaming: bool
) -> None:
    server.add(
        Completion(text=""),  # null content, no tool call
        Completion(tool_calls=[tool_call("", {"a": 1})]),  # an empty tool name
        Completion(tool_calls=[tool_call("add", '{"a": 1, "b')], finish_reason="length"),  # cut off
    )
    empty = await answer(model, streaming)
    assert (empty.text, empty.tool_calls, empty.finish_reason) == ("", [], "stop")
    nameless = await answer(model, streaming)
    assert [(c.name, c.arguments) for c in nameless.tool_calls] == [("", {"a": 1})]
    cut = await answer(model, streaming)
    assert cut.finish_reason == "length" and cut.tool_calls[0].raw_arguments == '{"a": 1, "b'


# ================================================================================================ streams


async def test_a_stream_cut_in_the_middle_of_an_event_is_retryable(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    server.add(Completion(text="hello world " * 10, drop_after_bytes=300))
    with pytest.raises(
        ModelRetryableError, match="streaming chat completion failed: could not reach"
    ) as info:
        await answer(model, True)
    assert "the connection to http://127.0.0.1:" in str(info.value)
    assert "was lost in the middle of it, after " in str(info.value)


@pytest.mark.parametrize(
    "cut",
    [
        Completion(text="The answer is forty-two, as computed.", drop_after_events=4),
        Completion(
            tool_calls=[tool_call("add", {"a": 12, "b": 30})], arguments_chunk_size=2, drop_after_events=5
        ),
    ],
    ids=["mid-answer", "mid-tool-call-arguments"],
)
async def test_a_dropped_stream_says_the_reply_broke_off_not_that_the_server_is_unreachable(
    server: OpenAICompatibleServer, model: OpenAIModel, cut: Completion
) -> None:
    server.add(cut)
    seen = []
    with pytest.raises(ModelRetryableError) as info:
        async for chunk in model.stream(ask()):
            seen.append(chunk)
    message = str(info.value)
    assert seen and not isinstance(seen[-1], ModelResponse)  # part of the reply came, the end did not
    assert re.search(
        r"was lost in the middle of it, after \d chunk\(s\) \(\d+ characters\): peer closed", message
    )
    assert message.endswith("; retry the request")
    assert "check base_url and that the server is running" not in message  # it was running: it answered


@pytest.mark.parametrize("after", [0, 2], ids=["before-the-first-event", "mid-answer"])
async def test_a_stream_kept_open_by_keepalives_alone_times_out(
    server: OpenAICompatibleServer, after: int
) -> None:
    """A proxy that sends `: keep-alive` comments while its upstream is stuck: bytes keep coming, so the
    HTTP read timeout never fires; the adapter's wait for the next event must."""
    model = OpenAIModel("m", base_url=server.url, timeout=1)
    # the client is made and warm before the clock starts: a first request on a busy machine took longer
    # than the timeout to send the events that must come
    server.add("warm", Completion(text="hello there", stall_after_events=after, keepalive_every=0.1))
    await answer(model, True)
    started = asyncio.get_running_loop().time()
    with pytest.raises(ModelRetryableError) as info:
        await asyncio.wait_for(answer(model, True), 10)
    assert asyncio.get_running_loop().time() - started < 5  # not held open by the keep-alives
    if after:
        assert "stopped sending in the middle of the reply: no event within 1 s after 2 chunk(s)" in str(
            info.value
        )
    else:
        assert "no response from http://127.0.0.1:" in str(info.value) and "no event came" in str(info.value)
    assert "retry later or raise `timeout`" in str(info.value)
    await model.aclose()


def _event_stream(*events: str) -> Fault:
    body = "".join(events) + "data: [DONE]\n\n"
    return Fault(200, body=body.encode(), headers={"content-type": "text/event-stream"})


_HELLO = 'data: {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": null}]}\n\n'


@pytest.mark.parametrize(
    ("event", "retryable"),
    [
        ('data: {"object": "error", "message": "CUDA out of memory", "type": "InternalServerError", "code": 500}\n\n', True),
        ('event: error\ndata: {"message": "CUDA out of memory", "type": "invalid_request_error"}\n\n', False),
    ],
    ids=["vllm-error-object", "error-event-without-error-key"],
)  # fmt: skip
async def test_an_error_sent_as_a_stream_chunk_keeps_the_servers_words(
    server: OpenAICompatibleServer, model: OpenAIModel, event: str, retryable: bool
) -> None:
    server.add(_event_stream(_HELLO, event))
    with pytest.raises(ModelError) as info:
        await answer(model, True)
    assert (
        str(info.value)
        == "openai: streaming chat completion failed: the server reported an error: CUDA out of memory"
    )
    assert isinstance(info.value, ModelRetryableError) is retryable


async def test_a_stream_without_done_is_complete_when_it_finished(
    server: OpenAICompatibleServer, model: OpenAIModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_openai, "AFTER_FINISH_WAIT", 0.2)
    server.add(
        Completion(text="hello", send_done=False),  # ends without [DONE]
        Completion(text="hi", send_done=False, stall_after_events=4),  # …and never closes the connection
    )
    assert (await answer(model, True)).text == "hello"
    held = await answer(model, True)  # returned after 0.2 s of silence following finish_reason, not 2 s
    assert (held.text, held.finish_reason, held.usage.input_tokens) == ("hi", "stop", 10)


@pytest.mark.parametrize("usage", [(10, 5), None], ids=["with-usage", "no-usage"])
async def test_a_stream_that_reached_done_without_a_finish_reason_is_complete(
    server: OpenAICompatibleServer, model: OpenAIModel, usage: tuple[int, int] | None
) -> None:
    """vLLM, llama.cpp, Ollama, LM Studio and proxies in front of other APIs sometimes send no finish_reason
    (null in every chunk); a stream that ended with `data: [DONE]` is complete all the same — "stop", or
    "tool_calls" with calls — rather than retried as cut (the same reply again, every time)."""
    server.add(
        Completion(text="The answer is 42.", send_finish=False, usage=usage),
        Completion(tool_calls=[tool_call("add", {"a": 1, "b": 2})], send_finish=False, usage=usage),
    )
    text = await answer(model, True)
    assert (text.text, text.finish_reason) == ("The answer is 42.", "stop")
    calls = await answer(model, True)
    assert calls.finish_reason == "tool_calls"
    assert [(c.name, c.arguments) for c in calls.tool_calls] == [("add", {"a": 1, "b": 2})]
    assert calls.usage.requests == (0 if usage is None else 1)


@pytest.mark.parametrize("done", ["data: [DONE]\n\n", "data:[DONE]\r\n\r\n", "data: [DONE]"])
async def test_a_hand_written_stream_ending_in_done_without_a_finish_reason_is_complete(
    server: OpenAICompatibleServer, model: OpenAIModel, done: str
) -> None:
    """The same with the `[DONE]` line as servers write it: with or without the space, CRLF line ends, or
    the body ending right after it (the SDK reads the event then). Before: "the stream ended before the
    reply was complete", retried."""
    body = (_HELLO + done).encode()
    server.add(Fault(200, body=body, headers={"content-type": "text/event-stream"}))
    response = await answer(model, True)
    assert (response.text, response.finish_reason) == ("Hel", "stop")


async def test_a_stream_without_finish_reason_or_done_is_a_retryable_cut(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    """The same streams without `[DONE]` (a clean end of the HTTP body, so no connection error) stay cut:
    nothing says the model finished."""
    server.add(Completion(text="The answer is", send_finish=False, send_done=False, usage=None))
    with pytest.raises(ModelRetryableError, match=r"the stream ended before the reply was complete"):
        await answer(model, True)


@pytest.mark.parametrize(
    ("tool_calls", "said"),
    [
        (
            {"id": "c1", "function": {"name": "add", "arguments": "{}"}},
            "its tool_calls are a dict, not a list",
        ),
        ([None], "its tool call 0 is None, without a function"),
        ([{"id": "c1", "type": "function", "function": None}], "its tool call 0 is .*, without a function"),
    ],
    ids=["an object", "null", "no function"],
)
async def test_malformed_tool_calls_are_a_clear_error_not_an_empty_answer(
    server: OpenAICompatibleServer, model: OpenAIModel, tool_calls: Any, said: str
) -> None:
    """Tool calls of the wrong shape were dropped without a word: the run ended with an empty final answer."""
    message = {"role": "assistant", "content": None, "tool_calls": tool_calls}
    body = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}  # fmt: skip
    server.add(Fault(200, body=body))
    with pytest.raises(ModelError, match=f"malformed chat completion \\(ValueError: {said}\\)"):
        await answer(model, False)


async def test_usage_beside_choices_in_every_chunk_does_not_make_a_cut_stream_complete(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    """vLLM's `continuous_usage_stats` (and some proxies) put usage in every chunk: only the usage chunk
    without choices is the server's last, so a stream cut after such chunks is still cut. Before, the
    truncated text ('The capital of Australia is') was taken as the complete answer."""
    chunks = [
        {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
         "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}],
         "usage": {"prompt_tokens": 20, "completion_tokens": i + 1, "total_tokens": 21 + i}}
        for i, piece in enumerate(["The capital", " of Austral", "ia is"])
    ]  # fmt: skip
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode()
    server.add(Fault(200, body=body, headers={"content-type": "text/event-stream"}))
    with pytest.raises(ModelRetryableError, match=r"the stream ended before the reply was complete"):
        await answer(model, True)
    usage_last = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [],
                  "usage": {"prompt_tokens": 20, "completion_tokens": 3, "total_tokens": 23}}  # fmt: skip
    body += f"data: {json.dumps(usage_last)}\n\n".encode()  # the usage chunk: the end, even without [DONE]
    server.add(Fault(200, body=body, headers={"content-type": "text/event-stream"}))
    response = await answer(model, True)
    assert (response.text, response.usage.output_tokens) == ("The capital of Australia is", 3)


async def test_done_inside_a_reply_is_not_the_end_of_the_stream(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    """`[DONE]` is only the end as an event of its own: a reply whose text says `data: [DONE]` on a line of
    its own (in one event's JSON, its newlines escaped) and then breaks off is still cut."""
    server.add(
        Completion(
            text="say\ndata: [DONE]\nnow", text_chunk_size=100, send_finish=False, send_done=False, usage=None
        )
    )
    with pytest.raises(ModelRetryableError, match=r"the stream ended before the reply was complete"):
        await answer(model, True)


async def test_a_stream_that_ends_before_finishing_or_stalls_is_retryable(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    no_finish = [
        {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [
            {"index": 0, "delta": {"content": "The answer is"}, "finish_reason": None}]},
    ]  # fmt: skip
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in no_finish).encode()
    server.add(
        Fault(200, body=body, headers={"content-type": "text/event-stream"}),
        Fault(200, body=b": keep-alive\n\n", headers={"content-type": "text/event-stream"}),
        Completion(text="hello there", stall_after_events=2),
    )
    with pytest.raises(ModelRetryableError, match="the stream ended before the reply was complete"):
        await answer(model, True)
    with pytest.raises(ModelError, match="ended the stream without sending anything") as empty:
        await answer(model, True)
    assert not isinstance(empty.value, ModelRetryableError)
    with pytest.raises(
        ModelRetryableError, match="stopped sending in the middle of the reply: no event within 2.0 s"
    ):
        await answer(model, True)


async def test_a_server_that_ignores_stream_and_sends_json_is_healed(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    completion = {
        "id": "x", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Plain JSON"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9},
    }  # fmt: skip
    server.add(Fault(200, body=completion))
    chunks = [chunk async for chunk in model.stream(ask())]
    assert chunks[0] == TextDelta(text="Plain JSON")
    final = chunks[-1]
    assert isinstance(final, ModelResponse) and final.usage.input_tokens == 7


_CALL = (
    'data: {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [{"index": 0, '
    '"delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "add", '
    '"arguments": "{\\"a\\": 2, \\"b\\": 3}"}}]}, "finish_reason": "tool_calls"}]}\n\n'
)


@pytest.mark.parametrize("content_type", ["text/plain; charset=utf-8", "application/json", "application/octet-stream"])
async def test_an_event_stream_labelled_as_something_else_is_read_as_a_stream(
    server: OpenAICompatibleServer, model: OpenAIModel, content_type: str
) -> None:
    """Some proxies relabel an event stream: its events are assembled as a stream's would be; before, the
    whole reply was refused as "not a chat completion"."""
    usage = 'data: {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}\n\n'  # fmt: skip
    body = ": keep-alive\n\n" + _HELLO.replace("Hel", "Hello") + _CALL + usage + "data: [DONE]\n\n"
    server.add(Fault(200, body=body.encode(), headers={"content-type": content_type}))
    chunks = [chunk async for chunk in model.stream(ask())]
    final = chunks[-1]
    assert isinstance(final, ModelResponse)
    assert (final.text, final.finish_reason, final.usage.input_tokens, final.usage.output_tokens) == ("Hello", "tool_calls", 5, 3)
    assert [(c.name, c.arguments) for c in final.tool_calls] == [("add", {"a": 2, "b": 3})]
    assert chunks[0] == TextDelta(text="Hello")


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ('data: {"error": {"message": "CUDA out of memory", "type": "server_error"}}\n\n', "CUDA out of memory"),
        ("data: not json\n\n", "malformed stream chunk, not JSON"),
        ("data: [1, 2]\n\n", "did not answer with a chat completion but with a JSON list"),
        (_HELLO, "ended"),  # cut before the model finished
    ],
    ids=["error", "not-json", "list", "cut"],
)
async def test_a_relabelled_event_stream_that_is_broken_says_why(
    server: OpenAICompatibleServer, model: OpenAIModel, body: str, error: str
) -> None:
    server.add(Fault(200, body=body.encode(), headers={"content-type": "text/plain"}))
    with pytest.raises(ModelError, match=error):
        _ = [chunk async for chunk in model.stream(ask())]


@BOTH
async def test_a_huge_reply_is_cut_at_32_characters_per_token_asked_for(
    server: OpenAICompatibleServer, model: OpenAIModel, streaming: bool
) -> None:
    server.add(Completion(text="x" * 3_000_000, text_chunk_size=8192))
    cut = await answer(model, streaming, max_output_tokens=4096)
    assert (len(cut.text), cut.finish_reason) == (4096 * 32, "length")


# ===================================================================================== the connection


@BOTH
async def test_connection_refused_is_retryable(streaming: bool) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = OpenAIModel("m", base_url=f"http://127.0.0.1:{port}/v1")
    with pytest.raises(
        ModelRetryableError, match="could not reach .* check base_url and that the server is running"
    ):
        await answer(model, streaming)
    await model.aclose()


@BOTH
async def test_a_server_that_never_answers_times_out(server: OpenAICompatibleServer, streaming: bool) -> None:
    model = OpenAIModel("m", base_url=server.url, timeout=0.3)
    server.add(Fault(hang=True))
    started = asyncio.get_running_loop().time()
    with pytest.raises(ModelRetryableError, match="no response from .* within 0.3 s"):
        await answer(model, streaming)
    assert asyncio.get_running_loop().time() - started < 5
    await model.aclose()


# ===================================================================================== through agent.run


@tool
def add(a: int, b: int = 0) -> int:
    """Add two integers."""
    return a + b


FAULTS: dict[str, tuple[ScriptItem, StopReason]] = {
    "malformed-json": (Fault(200, body=b"{not json"), StopReason.ERROR),
    "no-choices": (Fault(200, body={"object": "chat.completion", "choices": []}), StopReason.ERROR),
    "html-502": (Fault(502, body=NGINX_502, headers=HTML), StopReason.FINAL_ANSWER),  # transient: retried
    "401": (Fault(401, "bad key"), StopReason.ERROR),
    "content-filter": (Completion(finish_reason="content_filter"), StopReason.ERROR),
    "hang": (Fault(hang=True), StopReason.FINAL_ANSWER),  # timed out, then retried
    "overflow": (Fault(400, body={"error": {"message": "maximum context length is 100 tokens", "code": "context_length_exceeded"}}), StopReason.FINAL_ANSWER),
    "empty-name": (Completion(tool_calls=[tool_call("", {"a": 1})]), StopReason.FINAL_ANSWER),
    "cut-arguments": (Completion(tool_calls=[tool_call("add", '{"a": 1, "b')], finish_reason="length"), StopReason.FINAL_ANSWER),
    "null-content": (Completion(text=""), StopReason.FINAL_ANSWER),
}  # fmt: skip


@pytest.mark.parametrize("streaming", [False, True], ids=["run", "stream"])
@pytest.mark.parametrize("name", list(FAULTS))
async def test_agent_run_never_raises_on_a_faulty_server(name: str, streaming: bool) -> None:
    fault, stop = FAULTS[name]
    async with OpenAICompatibleServer([fault], fallback="The answer.") as server:
        # a short timeout only where it is what is tested: replies that must come get the default (a fresh
        # client's first request on a busy machine took more than 0.5 s)
        timeout = 0.5 if name == "hang" else 30.0
        model = OpenAIModel("gpt-4o-mini", base_url=server.url, api_key="k", timeout=timeout)
        agent = Agent(model, tools=[add], model_retries=1)
        if streaming:
            events = [e async for e in agent.stream("Add 1 and 2")]
            result = events[-1].result  # type: ignore[attr-defined]
        else:
            result = await asyncio.wait_for(agent.run("Add 1 and 2"), 30)
        await model.aclose()
    assert result.stop_reason is stop, result.error
    one = stop is StopReason.ERROR or name == "null-content"  # errors are not retried; an empty reply ends
    assert len(server.chat_requests) == (1 if one else 2)
    if stop is StopReason.ERROR:
        assert result.error and result.error.startswith(
            ("openai: chat completion failed", "openai: streaming")
        )
    elif name == "null-content":
        assert result.output == ""  # SPEC §4.2: neither text nor tool call ends the run with an empty answer
    else:
        assert result.output == "The answer."


async def test_an_overflow_error_says_so_through_a_stream(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    error = {
        "error": {
            "message": "This model's maximum context length is 100 tokens.",
            "type": "invalid_request_error",
        }
    }
    server.add(Fault(200, body=error))  # a proxy that wraps the error in a 200
    with pytest.raises(ContextOverflowError) as info:
        await answer(model, True)
    assert info.value.limit == 100


# ====================================================================== wire shapes other servers send


def completion_body(message: dict[str, Any], finish: object = "stop") -> Fault:
    body = {
        "id": "x", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }  # fmt: skip
    return Fault(200, body=body)


def sse(*deltas: dict[str, Any], finish: str = "stop") -> Fault:
    chunks = [
        {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
         "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        for delta in deltas
    ]  # fmt: skip
    chunks.append({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
                   "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})  # fmt: skip
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    return Fault(200, body=body.encode(), headers={"content-type": "text/event-stream"})


CALL = {"name": "add", "arguments": '{"a": 2, "b": 3}'}


@pytest.mark.parametrize(
    ("reply", "text", "calls"),
    [
        (completion_body({"role": "assistant", "content": [{"type": "text", "text": "It is "}, {"type": "text", "text": "5."}]}), "It is 5.", []),
        (completion_body({"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]}, "tool_calls"), "", [("add", {"a": 2, "b": 3})]),
        (completion_body({"role": "assistant", "content": None, "function_call": CALL}, "function_call"), "", [("add", {"a": 2, "b": 3})]),
        (completion_body({"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "add", "arguments": "{}"}}]}, "tool_calls"), "", [("add", {})]),
        (completion_body({"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": None, "arguments": "{}"}}]}, "tool_calls"), "", [("", {})]),
        (sse({"content": [{"type": "text", "text": "It is 5."}]}), "It is 5.", []),
        (sse({"function_call": {"name": "add", "arguments": '{"a": 2,'}}, {"function_call": {"arguments": ' "b": 3}'}}, finish="function_call"), "", [("add", {"a": 2, "b": 3})]),
        (sse({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]}, finish="tool_calls"), "", [("add", {"a": 2, "b": 3})]),
    ],
    ids=["content-parts", "arguments-object", "legacy-function-call", "no-id-no-type", "no-name",
         "stream-content-parts", "stream-legacy-function-call", "stream-arguments-object"],
)  # fmt: skip
async def test_other_servers_wire_shapes_are_read(
    server: OpenAICompatibleServer, model: OpenAIModel, reply: Fault, text: str, calls: list[Any]
) -> None:
    server.add(reply)
    streaming = reply.headers.get("content-type") == "text/event-stream"
    response = await answer(model, streaming)
    assert response.text == text
    assert [(c.name, c.arguments) for c in response.tool_calls] == calls
    assert all(c.id for c in response.tool_calls)


async def test_a_model_returning_something_else_than_a_response_ends_the_run_with_an_error() -> None:
    class Odd(FunctionModel):
        async def request(self, request: ModelRequest) -> Any:
            return ModelResponse(text=["not", "text"])  # type: ignore[arg-type]

    result = await Agent(Odd(lambda r: "x"), tools=[add]).run("Add 2 and 3.")
    assert result.stop_reason is StopReason.ERROR
    assert "the model returned a ModelResponse whose text is a list" in (result.error or "")


# ================================================================================ Retry-After and usage


async def test_a_retry_after_in_utc_without_a_zone_is_read_as_utc(
    server: OpenAICompatibleServer, model: OpenAIModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time
    from datetime import UTC, datetime, timedelta
    from email.utils import format_datetime

    monkeypatch.setenv("TZ", "America/New_York")  # a naive date read as local time would be hours off
    time.tzset()

    when = format_datetime(datetime.now(UTC).replace(tzinfo=None) + timedelta(seconds=30))  # "… -0000"
    assert when.endswith("-0000")
    server.add(Fault(503, headers={"Retry-After": when}))
    try:
        with pytest.raises(ModelRetryableError) as info:
            await model.request(ask())
    finally:
        monkeypatch.undo()
        time.tzset()
    assert info.value.retry_after is not None and 25 < info.value.retry_after <= 30


async def test_an_agent_retries_after_a_nan_retry_after_instead_of_hanging() -> None:
    async with OpenAICompatibleServer([Fault(429, headers={"Retry-After": "nan"}), "Done."]) as server:
        model = OpenAIModel("gpt-4o-mini", base_url=server.url, api_key="k")
        result = await asyncio.wait_for(Agent(model, model_retries=1).run("Hi"), 5)
        await model.aclose()
    assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "Done.")
    assert len(server.chat_requests) == 2


def _usage_reply(usage: Any, streaming: bool) -> Fault:
    if not streaming:
        reply = completion_body({"role": "assistant", "content": "Hi there."})
        reply.body["usage"] = usage
        return reply
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    events = [
        {**chunk, "choices": [{"index": 0, "delta": {"content": "Hi there."}, "finish_reason": "stop"}]},
        {**chunk, "choices": [], "usage": usage},
    ]
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    return Fault(200, body=body.encode(), headers={"content-type": "text/event-stream"})


IMPOSSIBLE_USAGE = {
    "negative": {"prompt_tokens": -100, "completion_tokens": -5},
    "huge": {"prompt_tokens": 10**18, "completion_tokens": 10**18},
    "text": {"prompt_tokens": "many", "completion_tokens": 3},
    "fraction": {"prompt_tokens": 1.5, "completion_tokens": 2},
    "boolean": {"prompt_tokens": True, "completion_tokens": 2},
    "not-an-object": "12 tokens",
    "zeros": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},  # a server that does not count
}


@pytest.mark.parametrize("streaming", [False, True], ids=["run", "stream"])
@pytest.mark.parametrize("name", list(IMPOSSIBLE_USAGE))
async def test_impossible_token_counts_are_estimated_not_charged(name: str, streaming: bool) -> None:
    """A server's bogus usage must neither crash the run, nor lower its totals (negative counts would let it
    run past `max_tokens`), nor end it by a budget it did not spend."""
    async with OpenAICompatibleServer([_usage_reply(IMPOSSIBLE_USAGE[name], streaming)]) as server:
        model = OpenAIModel("gpt-4o-mini", base_url=server.url, api_key="k")
        agent = Agent(model)
        if streaming:
            result = [e async for e in agent.stream("Hi")][-1].result  # type: ignore[attr-defined]
        else:
            result = await agent.run("Hi")
        await model.aclose()
    assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "Hi there."), result.error
    usage = result.usage
    assert usage.estimated and usage.requests == 1
    assert 0 < usage.input_tokens < 10_000 and 0 < usage.output_tokens < 100
    assert type(usage.input_tokens) is int and type(usage.output_tokens) is int


@BOTH
async def test_token_counts_sent_as_integral_numbers_are_read(
    server: OpenAICompatibleServer, model: OpenAIModel, streaming: bool
) -> None:
    server.add(_usage_reply({"prompt_tokens": "12", "completion_tokens": 3.0}, streaming))
    usage = (await answer(model, streaming)).usage
    assert (usage.input_tokens, usage.output_tokens, usage.requests, usage.estimated) == (12, 3, 1, False)
    assert type(usage.output_tokens) is int


@BOTH
async def test_unknown_roles_extra_fields_and_finish_reasons_are_read(
    server: OpenAICompatibleServer, model: OpenAIModel, streaming: bool
) -> None:
    if streaming:
        chunk = {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "x_trace": {"a": 1},
        }
        events = [
            {**chunk, "choices": [{"index": 0, "delta": {"role": "model", "content": "Hi", "reasoning": "…"}, "finish_reason": None}]},
            {**chunk, "choices": [{"index": 0, "delta": {"content": " there."}, "finish_reason": "eos_token", "stop_reason": 151645}]},
        ]  # fmt: skip
        body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        server.add(Fault(200, body=body.encode(), headers={"content-type": "text/event-stream"}))
    else:
        reply = completion_body(
            {"role": "model", "content": "Hi there.", "reasoning_content": "…"}, "eos_token"
        )
        reply.body |= {"x_trace": {"a": 1}, "system_fingerprint": None}
        server.add(reply)
    response = await answer(model, streaming)
    assert (response.text, response.finish_reason, response.tool_calls) == ("Hi there.", "unknown", [])


async def test_a_reply_trickled_byte_by_byte_ends_after_the_timeout_and_the_agent_retries() -> None:
    """A server (or proxy) that sends its non-streamed reply a byte at a time never lets one read wait long:
    `timeout` bounds the whole reply, and the run retries it instead of waiting for hours."""
    trickled = Completion(text="slow " * 40, trickle=0.05)  # ~1,000 bytes: ~50 s
    async with OpenAICompatibleServer([trickled]) as server:
        model = OpenAIModel("m", base_url=server.url, api_key="k", timeout=0.5, max_retries=0)
        try:
            started = asyncio.get_running_loop().time()
            with pytest.raises(ModelRetryableError, match=r"no response from .* within 0.5 s"):
                await model.request(ModelRequest(messages=[Message.user("hi")]))
            assert asyncio.get_running_loop().time() - started < 5

            server.add(Completion(text="slow " * 40, trickle=0.05), "fast")
            result = await Agent(model).run("hi")  # retried after the 1 s backoff
            assert result.output == "fast" and result.stop_reason is StopReason.FINAL_ANSWER
            assert len(server.chat_requests) == 3  # the trickled reply was given up, then asked again
        finally:
            await model.aclose()


# ======================================================================= dialects of tool calls and streams


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **fields: Any) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": choices,
        **fields,
    }


def events(*chunks: dict[str, Any]) -> Fault:
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    return Fault(200, body=body.encode(), headers={"content-type": "text/event-stream"})


def call(index: int | None = None, id: str | None = None, name: str | None = None, args: str = "") -> Any:
    entry: dict[str, Any] = {"function": {"arguments": args} | ({"name": name} if name is not None else {})}
    return entry | ({"index": index} if index is not None else {}) | ({"id": id} if id is not None else {})


TWO = [("c1", "add", {"a": 2, "b": 3}), ("c2", "add", {"a": 1})]
STREAMED_CALLS = {
    # Ollama: every call of a reply at index 0, whole, each with its own id
    "ollama-index-0": (
        [
            chunk({"tool_calls": [call(0, "c1", "add", '{"a": 2, "b": 3}')]}),
            chunk({"tool_calls": [call(0, "c2", "add", '{"a": 1}')]}),
        ],
        TWO,
    ),
    "two-at-one-index-in-one-chunk": (
        [chunk({"tool_calls": [call(0, "c1", "add", '{"a": 2, "b": 3}'), call(0, "c2", "add", '{"a": 1}')]})],
        TWO,
    ),
    "two-without-index-or-id-in-one-chunk": (
        [
            chunk(
                {
                    "tool_calls": [
                        call(None, None, "add", '{"a": 2, "b": 3}'),
                        call(None, None, "add", '{"a": 1}'),
                    ]
                }
            )
        ],
        [("call_0", "add", {"a": 2, "b": 3}), ("call_1", "add", {"a": 1})],
    ),
    # LiteLLM: the id in every chunk, then the whole call again in a last chunk
    "litellm-id-repeated-and-summary": (
        [
            chunk({"tool_calls": [call(0, "c1", "add", '{"a": 2,')]}),
            chunk({"tool_calls": [call(0, "c1", None, ' "b": 3}')]}),
            chunk({"tool_calls": [call(0, "c1", "add", '{"a": 2, "b": 3}')]}),
        ],
        TWO[:1],
    ),
    # LM Studio: an empty id and name in the chunks after the first
    "lm-studio-empty-id-and-name": (
        [
            chunk({"tool_calls": [call(0, "c1", "add", '{"a": 2,')]}),
            chunk({"tool_calls": [call(0, "", "", ' "b": 3}')]}),
        ],
        TWO[:1],
    ),
}


@pytest.mark.parametrize("name", list(STREAMED_CALLS))
async def test_streamed_tool_calls_of_each_servers_dialect_are_neither_merged_nor_split(
    server: OpenAICompatibleServer, model: OpenAIModel, name: str
) -> None:
    chunks, expected = STREAMED_CALLS[name]
    server.add(events(*chunks, chunk({}, "tool_calls")))
    response = await answer(model, streaming=True)
    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == expected
    assert all(c.raw_arguments is None for c in response.tool_calls)


async def test_an_agent_runs_every_call_ollama_streams_at_index_0() -> None:
    seen: list[tuple[int, int]] = []

    @tool
    def add(a: int, b: int = 0) -> int:
        """Add two integers."""
        seen.append((a, b))
        return a + b

    chunks = STREAMED_CALLS["ollama-index-0"][0]
    script: list[ScriptItem] = [events(*chunks, chunk({}, "tool_calls")), "5 and 1."]
    async with OpenAICompatibleServer(script) as server:
        model = OpenAIModel("qwen2.5:7b", base_url=server.url, api_key="k", capabilities={"tools": True})
        result = [e async for e in Agent(model, tools=[add]).stream("Add 2 and 3, and 1.")][-1].result  # type: ignore[attr-defined]
        await model.aclose()
    assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "5 and 1."), result.error
    assert seen == [(2, 3), (1, 0)]
    sent = server.chat_requests[1]["messages"]
    assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == ["c1", "c2"]


ARGUMENTS = '{"a": 2, "b": 3}'


@BOTH
@pytest.mark.parametrize(
    "raw",
    [
        ARGUMENTS + "<|im_end|>",  # a chat template's end token left in (llama.cpp, vLLM's hermes parser)
        ARGUMENTS + "\n</tool_call>",
        ARGUMENTS + "<|call|>",  # gpt-oss's harmony token
        ARGUMENTS + "\n\nI'll now add them.",  # a thinking model's commentary (Ollama)
        ARGUMENTS + ARGUMENTS,  # the call repeated whole (LiteLLM's last chunk, some proxies)
        json.dumps(ARGUMENTS),  # encoded twice
        "```json\n" + ARGUMENTS + "\n```",
    ],
    ids=["im-end", "tool-call-tag", "harmony-call", "commentary", "repeated", "encoded-twice", "fenced"],
)
async def test_arguments_a_server_wraps_or_repeats_are_read(
    server: OpenAICompatibleServer, model: OpenAIModel, streaming: bool, raw: str
) -> None:
    server.add(Completion(tool_calls=[tool_call("add", raw, id="c1")]))
    response = await answer(model, streaming)
    assert [(c.name, c.arguments, c.raw_arguments) for c in response.tool_calls] == [
        ("add", {"a": 2, "b": 3}, None)
    ]


@pytest.mark.parametrize(
    "raw",
    ['{"a": 2}{"a": 3}', '{"a": 2, "b', '{"a": 2}{"a": 3', '["a", 2]'],
    ids=["two-objects", "cut", "cut-second", "list"],
)
async def test_arguments_that_may_hide_a_call_or_are_cut_stay_an_error_for_the_loop(
    server: OpenAICompatibleServer, model: OpenAIModel, raw: str
) -> None:
    server.add(Completion(tool_calls=[tool_call("add", raw, id="c1")]))
    response = await answer(model, streaming=False)
    assert [(c.arguments, c.raw_arguments) for c in response.tool_calls] == [({}, raw)]


def _llama_cpp(reply: ScriptItem) -> ScriptItem:
    """llama.cpp's server: a history with tool-call arguments that are not JSON is answered with HTTP 500."""

    def answer(request: Any) -> Any:
        for message in request.json["messages"]:
            for call in message.get("tool_calls") or []:
                try:
                    json.loads(call["function"]["arguments"])
                except ValueError:
                    error = {
                        "code": 500,
                        "message": "Failed to parse tool call arguments as JSON: [json.exception.parse_error.101] "
                        "parse error at line 1, column 9: syntax error while parsing object key",
                        "type": "server_error",
                    }
                    return Fault(500, body={"error": error})
        return reply

    return answer


async def test_a_malformed_call_in_the_history_does_not_make_llama_cpp_fail_the_rest_of_the_run() -> None:
    script = [
        _llama_cpp(Completion(tool_calls=[tool_call("add", '{"a": 2, "b', id="c1")])),  # cut off
        _llama_cpp(Completion(tool_calls=[tool_call("add", {"a": 2, "b": 3}, id="c2")])),
        _llama_cpp("It is 5."),
    ]
    async with OpenAICompatibleServer(script) as server:
        model = OpenAIModel("qwen", base_url=server.url, api_key="k", capabilities={"tools": True})
        result = await Agent(model, tools=[add], model_retries=1).run("Add 2 and 3.")
        await model.aclose()
    assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "It is 5."), result.error
    second = server.chat_requests[1]["messages"]
    sent = [c["function"]["arguments"] for m in second for c in m.get("tool_calls") or []]
    assert sent == ["{}"]
    results = [m["content"] for m in second if m["role"] == "tool"]
    assert len(results) == 1 and '{"a": 2, "b' in results[0]  # the model still sees what it sent


async def test_a_stream_whose_usage_chunk_came_is_complete_without_a_finish_reason(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    server.add(events(chunk({"content": "Hi"}), chunk(None, usage=usage)))
    response = await answer(model, streaming=True)
    assert (response.text, response.finish_reason, response.usage.output_tokens) == ("Hi", "stop", 2)


def _reasoning_only(streaming: bool, key: str, finish: str = "stop") -> Fault:
    """vLLM's reasoning parser with Qwen3 and thinking off: the answer in the reasoning, content null."""
    answer = "The capital of France is Paris."
    if streaming:
        return events(
            chunk({"role": "assistant", key: answer[:12]}), chunk({key: answer[12:]}), chunk({}, finish)
        )
    return completion_body({"role": "assistant", "content": None, key: answer, "tool_calls": []}, finish)


@pytest.mark.parametrize("streaming", [False, True], ids=["run", "stream"])
@pytest.mark.parametrize("key", ["reasoning_content", "reasoning"])
async def test_an_answer_the_server_put_in_the_reasoning_is_not_lost(streaming: bool, key: str) -> None:
    async with OpenAICompatibleServer([_reasoning_only(streaming, key)]) as server:
        model = OpenAIModel("qwen3", base_url=server.url, api_key="k", capabilities={"tools": True})
        agent = Agent(model, tools=[add])
        if streaming:
            result = [e async for e in agent.stream("Capital of France?")][-1].result  # type: ignore[attr-defined]
        else:
            result = await agent.run("Capital of France?")
        await model.aclose()
    assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "The capital of France is Paris.")


@BOTH
async def test_reasoning_cut_off_by_the_token_limit_is_not_taken_for_the_reply(
    server: OpenAICompatibleServer, model: OpenAIModel, streaming: bool
) -> None:
    server.add(_reasoning_only(streaming, "reasoning_content", finish="length"))
    response = await answer(model, streaming)
    assert (response.text, response.finish_reason) == ("", "length")


# ============================================================= bodies that stall, trickle or never end; odd types


_COMPLETION = {
    "id": "x", "object": "chat.completion", "created": 0, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there"}, "finish_reason": "stop"}],
}  # fmt: skip


@BOTH
@pytest.mark.parametrize(
    "fault",
    [
        Fault(200, body=_COMPLETION, stall_body=True),
        Fault(200, body=_COMPLETION, trickle=0.2),
        Fault(503, "overloaded", stall_body=True),
        Fault(503, "overloaded", trickle=0.2),
    ],
    ids=["json-stalled", "json-trickled", "error-stalled", "error-trickled"],
)
async def test_a_body_that_stalls_or_trickles_ends_in_a_retryable_timeout(
    server: OpenAICompatibleServer, streaming: bool, fault: Fault
) -> None:
    """Headers come, the body does not (or a byte at a time): for a streaming request too, whose reply is a
    whole JSON body (a server ignoring `stream`) or an error status (the SDK reads its body before raising).
    Before, a stalled body escaped as httpx's raw ReadTimeout (not retried) and a trickled one hung."""
    model = OpenAIModel("m", base_url=server.url, timeout=0.5)
    server.add(fault)
    with pytest.raises(
        ModelRetryableError, match=r"no response from http://127\.0\.0\.1:\d+/v1 within 0\.5 s"
    ):
        await asyncio.wait_for(answer(model, streaming), 15)
    await model.aclose()


async def test_a_huge_body_in_place_of_a_stream_is_refused_before_it_is_all_read(
    server: OpenAICompatibleServer, model: OpenAIModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_openai, "BODY_SLACK", 0)  # the limit is then 16 bytes per character of the reply
    server.add(Fault(200, body=b"<html><title>Mirror</title>" + b"x" * 3_000_000, headers=HTML))
    with pytest.raises(ModelError, match=r"the server's reply is larger than 1,048,576 bytes") as info:
        await answer(model, True, max_output_tokens=1024)  # 65,536 characters at most
    assert not isinstance(info.value, ModelRetryableError)


HUGE = 200_000_000  # bytes of blank space in a reply: a misbehaving server's body


@pytest.mark.parametrize(
    "reply",
    [Completion(text="hi", padding=HUGE, chunked=True), Completion(text="hi", padding=HUGE)],
    ids=["request-chunked", "request-announced"],
)
async def test_a_huge_json_reply_is_refused_as_it_arrives_and_memory_stays_bounded(
    server: OpenAICompatibleServer, model: OpenAIModel, monkeypatch: pytest.MonkeyPatch, reply: Completion
) -> None:
    """A (non-streamed) chat completion with 200 MB of whitespace in it — valid JSON, which the SDK read
    whole into memory before. Now reading stops at the limit (16 bytes per character of the reply asked
    for, plus BODY_SLACK), or before it starts when the body announces its size: a clear ModelError, not
    retried, and neither the client nor the server got anywhere near the 200 MB."""
    monkeypatch.setattr(_openai, "BODY_SLACK", 0)  # the limit is then 1,048,576 bytes
    server.add(reply)
    tracemalloc.start()
    try:
        with pytest.raises(ModelError) as info:
            await asyncio.wait_for(model.request(ask(max_output_tokens=1024)), 60)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not isinstance(info.value, ModelRetryableError)
    message = str(info.value)
    assert message.startswith(
        "openai: chat completion failed: the server's reply is larger than 1,048,576 bytes ("
    )
    assert "far more than a reply of at most 65,536 characters needs" in message
    assert "raise max_output_tokens if its replies are meant to be this large" in message
    if reply.chunked:
        assert re.search(r"\(reading it stopped at 1,0[0-9,]+ bytes\)", message), message
    else:
        assert re.search(r"\(it announced 200,000,\d{3} bytes\)", message), message
    assert peak < 40_000_000, (
        f"{peak:,} bytes held while the reply came"
    )  # 200 MB before (400 MB at its peak)
    assert server.padding_sent < 50_000_000, f"the server sent {server.padding_sent:,} bytes"
    server.add("after")
    assert (await model.request(ask())).text == "after"  # the model (and its client) still work


async def test_a_compressed_body_is_bounded_as_it_is_decompressed(
    server: OpenAICompatibleServer, model: OpenAIModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gzip body of 200 KB that inflates to 200 MB (httpx decompresses what the server says it sent): it
    is the inflated body that is held, so it is the inflated bytes that are counted."""
    monkeypatch.setattr(_openai, "BODY_SLACK", 0)
    packer = zlib.compressobj(wbits=31)  # gzip
    spaces = b" " * 1_000_000
    parts = [packer.compress(b"{")] + [packer.compress(spaces) for _ in range(HUGE // len(spaces))]
    parts.append(packer.compress(json.dumps(_COMPLETION)[1:].encode()) + packer.flush())
    body = b"".join(parts)
    assert len(body) < 1_048_576  # under the limit as sent
    server.add(Fault(200, body=body, headers={"content-encoding": "gzip"}))
    tracemalloc.start()
    try:
        with pytest.raises(ModelError, match=r"larger than 1,048,576 bytes \(reading it stopped at ") as info:
            await asyncio.wait_for(model.request(ask(max_output_tokens=1024)), 60)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not isinstance(info.value, ModelRetryableError)
    assert peak < 40_000_000, f"{peak:,} bytes held while the reply came"


async def test_a_huge_line_in_an_event_stream_is_refused_as_it_arrives(
    server: OpenAICompatibleServer, model: OpenAIModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event stream whose first line (an SSE comment) is 200 MB long: the SDK's event decoder buffers a
    line until its end, so a stream is bounded by bytes too, not only by the reply's characters."""
    monkeypatch.setattr(_openai, "BODY_SLACK", 0)
    server.add(Completion(text="hi", padding=HUGE))
    with pytest.raises(ModelError) as info:
        await asyncio.wait_for(answer(model, True, max_output_tokens=1024), 60)
    assert not isinstance(info.value, ModelRetryableError)
    assert str(info.value).startswith(
        "openai: streaming chat completion failed: the server's reply is larger than 1,048,576 bytes "
        "(reading it stopped at "
    )
    assert server.padding_sent < 50_000_000, f"the server sent {server.padding_sent:,} bytes"


async def test_a_reply_within_the_limit_is_read_whole(
    server: OpenAICompatibleServer, model: OpenAIModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limit is on the body, not a guess: just under it, chunked or announced, streamed or not, the reply
    is read (padding counts; the envelope of a reply of 2 characters is a few hundred bytes)."""
    monkeypatch.setattr(_openai, "BODY_SLACK", 0)
    server.add(
        Completion(text="ok", padding=1_000_000, chunked=True),
        Completion(text="ok", padding=1_000_000),
        Completion(text="ok", padding=1_000_000),
    )
    assert (await model.request(ask(max_output_tokens=1024))).text == "ok"
    assert (await model.request(ask(max_output_tokens=1024))).text == "ok"
    assert (await answer(model, True, max_output_tokens=1024)).text == "ok"


def _numbered(streaming: bool) -> Fault:
    """A reply whose tool call's id and model name are numbers."""
    arguments = json.dumps({"a": 1, "b": 2})
    if not streaming:
        body = {
            **_COMPLETION, "model": 456,
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None,
                "tool_calls": [{"id": 7, "type": "function", "function": {"name": "add", "arguments": arguments}}]}}],
        }  # fmt: skip
        return Fault(200, body=body)
    delta = {
        "tool_calls": [
            {"index": 0, "id": 7, "type": "function", "function": {"name": "add", "arguments": arguments}}
        ]
    }
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": 456,
             "choices": [{"index": 0, "delta": delta, "finish_reason": "tool_calls"}]}  # fmt: skip
    return _event_stream(f"data: {json.dumps(chunk)}\n\n")


@pytest.mark.parametrize("streaming", [False, True], ids=["run", "stream"])
async def test_ids_and_model_names_sent_as_numbers_are_read_as_text(streaming: bool, tmp_path: Any) -> None:
    """Before, `"id": 7` became a ToolCall whose id was an int: the run state could not be saved (a
    StateError out of agent.run), and a model name 456 broke the price lookup (a raw AttributeError)."""
    from thinkloop.stores import SQLiteStore

    async with OpenAICompatibleServer([_numbered(streaming), "It is 3."]) as server:
        model = OpenAIModel("m", base_url=server.url, timeout=5)
        async with SQLiteStore(tmp_path / "runs.db") as store:
            agent = Agent(model, tools=[add], store=store)
            if streaming:
                result = [e async for e in agent.stream("Add 1 and 2", run_id="r")][-1].result  # type: ignore[attr-defined]
            else:
                result = await agent.run("Add 1 and 2", run_id="r")
            saved = await store.load_state("r")
        await model.aclose()
    assert (result.stop_reason, result.output, result.tool_calls) == (StopReason.FINAL_ANSWER, "It is 3.", 1)
    assert saved is not None and [c.id for m in saved.messages for c in m.tool_calls] == ["7"]
    assert [m.tool_call_id for m in saved.messages if m.role == "tool"] == ["7"]


@pytest.mark.parametrize(
    ("events", "says", "retryable"),
    [
        (['data: {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": {"0": {}}}\n\n'],
         r"malformed stream chunk \(KeyError", False),
        (['data: {"status": "queued"}\n\n', 'data: {"status": "done"}\n\n'],
         r"streamed 2 event\(s\) but no chat-completion chunk \(the first: \{\"status\": \"queued\"\}\)", False),
    ],
    ids=["choices-an-object", "other-events-only"],
)  # fmt: skip
async def test_stream_chunks_of_another_shape_are_a_clear_error(
    server: OpenAICompatibleServer, model: OpenAIModel, events: list[str], says: str, retryable: bool
) -> None:
    """Before, `choices` as an object escaped as a raw KeyError, and a stream of events that are not chat
    completion chunks was called a cut connection (retried, to the same answer)."""
    server.add(_event_stream(*events))
    with pytest.raises(ModelError, match=says) as info:
        await answer(model, True)
    assert isinstance(info.value, ModelRetryableError) is retryable


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a full listen backlog drops SYNs on Linux")
@BOTH
async def test_a_host_that_never_accepts_the_connection_fails_in_the_connect_timeout(
    streaming: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host that drops connection requests (a firewall, a wrong address) waited the whole `timeout`
    (120 s by default, then retried): opening the connection has its own, shorter limit."""
    monkeypatch.setattr(_openai, "CONNECT_TIMEOUT", 0.5)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)  # never accepted: once its backlog is full, the kernel drops new connections
        port = listener.getsockname()[1]
        fillers = [socket.socket() for _ in range(3)]
        for filler in fillers:
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
        model = OpenAIModel("m", base_url=f"http://127.0.0.1:{port}/v1", timeout=60)
        try:
            with pytest.raises(
                ModelRetryableError, match=r"could not connect to http://127\.0\.0\.1:\d+/v1 within 0\.5 s"
            ):
                await asyncio.wait_for(answer(model, streaming), 30)
        finally:
            await model.aclose()
            for filler in fillers:
                filler.close()


# ============================================================= numbers JSON does not have; nesting too deep

NON_FINITE = ['{"a": NaN}', '{"a": Infinity}', '{"a": -Infinity}', '{"a": 1e999}', '{"a": 2, "b": [1, NaN]}']


@BOTH
@pytest.mark.parametrize(
    "raw",
    [
        *NON_FINITE,
        '{"a": NaN}<|im_end|>',
        json.dumps('{"a": NaN}'),
        "```json\n" + '{"a": Infinity}' + "\n```",
    ],
    ids=[
        "nan",
        "infinity",
        "minus-infinity",
        "1e999",
        "nested-nan",
        "nan-im-end",
        "nan-encoded-twice",
        "fenced",
    ],
)
async def test_arguments_holding_nan_or_infinity_are_malformed_and_kept_raw(
    server: OpenAICompatibleServer, model: OpenAIModel, streaming: bool, raw: str
) -> None:
    """`json.loads` reads `NaN`, `Infinity` and `1e999` as floats that JSON does not have: the adapter took
    `{"a": NaN}` as the arguments {'a': nan}. They are malformed arguments, kept as sent, so that the loop
    asks the model for valid JSON (and no strict server gets them back in the history)."""
    server.add(Completion(tool_calls=[tool_call("add", raw, id="c1")]))
    response = await answer(model, streaming)
    assert [(c.name, c.arguments, c.raw_arguments) for c in response.tool_calls] == [("add", {}, raw)]


async def test_an_arguments_object_holding_nan_is_malformed_and_kept_raw(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    """Arguments sent as a JSON object rather than text (which the SDK's own json.loads reads, NaN too)."""
    call = '{"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": NaN, "b": 1}}}'
    body = (
        '{"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [{"index": 0, '
        f'"message": {{"role": "assistant", "content": null, "tool_calls": [{call}]}}, '
        '"finish_reason": "tool_calls"}]}'
    )
    server.add(Fault(200, body=body.encode()))
    response = await model.request(ask())
    assert [(c.arguments, c.raw_arguments) for c in response.tool_calls] == [({}, '{"a": NaN, "b": 1}')]


def _strict_server(reply: ScriptItem) -> ScriptItem:
    """A server whose JSON parser is strict (llama.cpp's nlohmann::json, vLLM's): tool-call arguments in the
    history holding NaN or an infinity are answered with HTTP 500, as llama.cpp does."""

    def refuse(constant: str) -> Any:
        raise ValueError(constant)

    def answer(request: Any) -> Any:
        for message in request.json["messages"]:
            for call in message.get("tool_calls") or []:
                try:
                    json.loads(call["function"]["arguments"], parse_constant=refuse)
                except ValueError:
                    error = {
                        "code": 500,
                        "message": "Failed to parse tool call arguments as JSON",
                        "type": "server_error",
                    }
                    return Fault(500, body={"error": error})
        return reply

    return answer


@pytest.mark.parametrize("streaming", [False, True], ids=["run", "stream"])
async def test_a_model_sending_nan_is_asked_for_valid_json_and_the_history_stays_json(
    streaming: bool,
) -> None:
    """Before, the loop caught the NaN later and the history sent the call back as `{"a": NaN}`: a strict
    server answered HTTP 500 to every later request of the run."""
    script = [
        _strict_server(Completion(tool_calls=[tool_call("add", '{"a": NaN, "b": 1}', id="c1")])),
        _strict_server(Completion(tool_calls=[tool_call("add", {"a": 2, "b": 3}, id="c2")])),
        _strict_server("It is 5."),
    ]
    async with OpenAICompatibleServer(script) as server:
        model = OpenAIModel("qwen", base_url=server.url, api_key="k", capabilities={"tools": True})
        agent = Agent(model, tools=[add], model_retries=0)
        if streaming:
            result = [e async for e in agent.stream("Add 2 and 3.")][-1].result  # type: ignore[attr-defined]
        else:
            result = await agent.run("Add 2 and 3.")
        await model.aclose()
    assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "It is 5."), result.error
    second = server.chat_requests[1]["messages"]
    assert [c["function"]["arguments"] for m in second for c in m.get("tool_calls") or []] == ["{}"]
    (told,) = [m["content"] for m in second if m["role"] == "tool"]
    assert told.startswith('Error: the arguments of add were not a JSON object: \'{"a": NaN, "b": 1}\'')


DEEP = "[" * 100_000 + "]" * 100_000  # 200 kB: nested far deeper than Python's recursion limit


@BOTH
async def test_arguments_nested_too_deeply_are_malformed_not_a_recursion_error(
    server: OpenAICompatibleServer, model: OpenAIModel, streaming: bool
) -> None:
    """Before, json.loads raised RecursionError out of the adapter, and the run ended in 'the model raised
    RecursionError' instead of the model being told that its arguments are not JSON."""
    raw = '{"a": ' + DEEP + "}"
    server.add(Completion(tool_calls=[tool_call("add", raw, id="c1")], arguments_chunk_size=50_000))
    response = await answer(model, streaming, max_output_tokens=8192)
    assert [(c.name, c.arguments, c.raw_arguments) for c in response.tool_calls] == [("add", {}, raw)]


async def test_a_call_nested_too_deeply_in_the_history_is_sent_back_as_an_empty_object(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    raw = '{"a": ' + DEEP + "}"
    server.add("ok")
    history = [
        Message.user("Hi"),
        Message(role="assistant", content="", tool_calls=[ToolCall(id="c1", name="add", raw_arguments=raw)]),
        Message(role="tool", content="Error: not a JSON object", tool_call_id="c1"),
    ]
    assert (await model.request(ModelRequest(messages=history, tools=[ADD]))).text == "ok"
    sent = server.chat_requests[0]["messages"][1]["tool_calls"][0]["function"]["arguments"]
    assert sent == "{}"


@pytest.mark.parametrize(
    "fault",
    [
        _event_stream(
            'data: {"id": "c", "object": "chat.completion.chunk", "model": "m", "x": ' + DEEP + "}\n\n"
        ),
        Fault(200, body=('{"id": "x", "x": ' + DEEP + "}").encode()),
    ],
    ids=["stream-chunk", "json-in-place-of-a-stream"],
)
async def test_a_stream_reply_nested_too_deeply_is_a_clear_model_error(
    server: OpenAICompatibleServer, model: OpenAIModel, fault: Fault
) -> None:
    server.add(fault)
    with pytest.raises(ModelError, match="nested too deeply to read") as info:
        await answer(model, True, max_output_tokens=8192)
    assert not isinstance(info.value, ModelRetryableError)
    assert "check that base_url is an OpenAI-compatible API" in str(info.value)


async def test_a_reply_body_nested_too_deeply_is_a_clear_model_error(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    server.add(Fault(200, body=('{"id": "x", "x": ' + DEEP + "}").encode()))
    with pytest.raises(ModelError, match="nested too deeply to read") as info:
        await model.request(ask(max_output_tokens=8192))
    assert not isinstance(info.value, ModelRetryableError)
    assert "check that base_url is an OpenAI-compatible API" in str(info.value)


_CHUNK = '{"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": '


@pytest.mark.parametrize(
    ("choices", "shown"),
    [
        ("[null]", '"choices": [null]'),
        ('[{"index": 0, "delta": "hello"}]', '"delta": "hello"'),
        ('[{"index": 0, "delta": {"tool_calls": [null]}}]', '"tool_calls": [null]'),
        ('[{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": "add"}]}}]', '"function": "add"'),
    ],
    ids=["choice-null", "delta-text", "tool-call-null", "function-text"],
)
async def test_a_malformed_stream_chunk_is_quoted_in_the_error(
    server: OpenAICompatibleServer, model: OpenAIModel, choices: str, shown: str
) -> None:
    """Before, the error gave only Python's complaint ('NoneType' object has no attribute 'finish_reason'),
    not what the server sent."""
    server.add(_event_stream(f"data: {_CHUNK}{choices}}}\n\n"))
    with pytest.raises(ModelError, match="malformed stream chunk") as info:
        await answer(model, True)
    assert shown in str(info.value) and str(info.value).endswith(
        "; check that base_url is an OpenAI-compatible API"
    )


@pytest.mark.parametrize(
    ("message", "shown"),
    [
        ("null", '"message": null'),
        ('{"role": "assistant", "tool_calls": [{"id": "c", "function": "add"}]}', '"function": "add"'),
    ],
    ids=["message-null", "function-text"],
)
async def test_a_malformed_chat_completion_is_quoted_in_the_error(
    server: OpenAICompatibleServer, model: OpenAIModel, message: str, shown: str
) -> None:
    body = f'{{"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [{{"index": 0, "message": {message}, "finish_reason": "stop"}}]}}'
    server.add(Fault(200, body=body.encode()))
    with pytest.raises(
        ModelError, match=r"malformed chat completion \(AttributeError: .*\), its choices: \["
    ) as info:
        await model.request(ask())
    assert shown in str(info.value) and not isinstance(info.value, ModelRetryableError)


@pytest.mark.parametrize("timeout", [math.nan, 0, -1.0])
def test_a_timeout_that_is_not_a_positive_number_is_a_configuration_error(timeout: float) -> None:
    """Before, it was accepted and every request failed: 'no response from … within nan s', retried."""
    with pytest.raises(ConfigurationError, match=r"OpenAIModel timeout must be a positive number of seconds"):
        OpenAIModel("m", base_url="http://127.0.0.1:1/v1", timeout=timeout)


def _sse(*chunks: dict[str, Any]) -> bytes:
    return ("".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n").encode()


def _chunk(delta: dict[str, Any], finish: object = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [choice]}


async def test_a_streamed_finish_reason_that_is_no_text_is_unknown_not_a_crash(
    server: OpenAICompatibleServer, model: OpenAIModel
) -> None:
    """`"finish_reason": {"type": "stop"}` raised TypeError (unhashable dict) and lost the streamed answer."""
    body = _sse(_chunk({"content": "Hi there"}), _chunk({}, {"type": "stop"}))
    server.add(Fault(200, body=body, headers={"content-type": "text/event-stream"}))
    response = await answer(model, True)
    assert (response.text, response.finish_reason) == ("Hi there", "unknown")


@pytest.mark.parametrize(
    ("usage", "counted"),
    [
        ({"prompt_tokens": 20, "total_tokens": 4020}, (20, 4000)),  # the output was counted as 0 tokens
        ({"completion_tokens": 7, "total_tokens": 30}, (23, 7)),
        ({"prompt_tokens": 20}, (0, 0)),  # no total: both estimated by the loop (requests=0)
        ({"prompt_tokens": 20, "total_tokens": 5}, (0, 0)),  # a total below a part: no count to trust
    ],
)
async def test_usage_missing_one_count_takes_it_from_the_total_or_is_estimated(
    server: OpenAICompatibleServer, model: OpenAIModel, usage: dict[str, int], counted: tuple[int, int]
) -> None:
    message = {"role": "assistant", "content": "x" * 2000}
    choice = {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
    body = {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [choice],
        "usage": usage,
    }
    server.add(Fault(200, body=body))
    response = await answer(model, False)
    assert (response.usage.input_tokens, response.usage.output_tokens) == counted
    assert response.usage.requests == (1 if counted != (0, 0) else 0)


@pytest.mark.parametrize(
    ("reply", "text", "reason"),
    [
        (completion_body({"role": "assistant", "content": "Hi there"}, {"type": "stop"}), "Hi there", "unknown"),
        (completion_body({"role": "assistant", "content": "Hi there"}, ["stop"]), "Hi there", "unknown"),
        (completion_body({"role": "assistant", "content": 5}), "5", "stop"),
        (completion_body({"role": "assistant", "content": 2.5}), "2.5", "stop"),
        (sse({"content": 5}), "5", "stop"),
    ],
    ids=["finish-object", "finish-list", "content-int", "content-float", "stream-content-int"],
)  # fmt: skip
async def test_a_reply_of_odd_types_keeps_its_answer(
    server: OpenAICompatibleServer, model: OpenAIModel, reply: Fault, text: str, reason: str
) -> None:
    """A whole reply's `"finish_reason": {"type": "stop"}` raised TypeError (unhashable) and ended the run with
    an error, losing the text; `"content": 5` (a server that sends the answer as a JSON number) was no text,
    so the run ended with an empty answer."""
    server.add(reply)
    response = await answer(model, reply.headers.get("content-type") == "text/event-stream")
    assert (response.text, response.finish_reason) == (text, reason)
