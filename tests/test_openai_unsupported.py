"""Servers that refuse part of a request: tools (the run goes on in text ReAct) or an optional parameter (the
adapter sends the request again without it) — the real `openai` client against the loopback server, with
the servers' own error bodies."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from thinkloop import (
    Agent,
    Message,
    ModelError,
    ModelRequest,
    ModelSettings,
    StopReason,
    ToolsUnsupportedError,
)
from thinkloop._events import Done, Event, ModeSwitched, RunResult
from thinkloop.models import OpenAIModel, RouterModel
from thinkloop.models._unsupported import tools_unsupported, unsupported_param
from thinkloop.testing_server import Completion, Fault, OpenAICompatibleServer, RecordedRequest, tool_call
from thinkloop.tools import calculator


def error(status: int, message: str, **fields: Any) -> Fault:
    return Fault(status, body={"error": {"message": message, "type": "invalid_request_error", **fields}})


OLLAMA = error(400, "registry.ollama.ai/library/gemma:2b does not support tools", type="api_error")
VLLM = Fault(
    400,
    body={
        "object": "error",
        "message": '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    },
)
LLAMA_CPP = Fault(
    500, body={"error": {"code": 500, "message": "tools param requires --jinja flag", "type": "server_error"}}
)
OPENAI_TOOLS = error(400, "Unsupported parameter: 'tools' is not supported with this model.", param="tools")
PYDANTIC_SERVER = Fault(
    422,
    body={
        "detail": [
            {"type": "extra_forbidden", "loc": ["body", "tools"], "msg": "Extra inputs are not permitted"}
        ]
    },
)


# ===================================================================================== recognition


@pytest.mark.parametrize(
    ("text", "body"),
    [
        ("registry.ollama.ai/library/gemma:2b does not support tools", None),
        ('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set', None),
        ("tools param requires --jinja flag", None),
        ("Unsupported parameter: 'tools' is not supported with this model.", None),
        ("Unrecognized request argument supplied: tools", None),
        ("This model does not support function calling.", None),
        ("Function calling is not enabled for this model", None),
        ("Extra inputs are not permitted", {"detail": [{"loc": ["body", "tools"], "msg": "Extra inputs"}]}),
    ],
)
def test_a_refusal_of_tools_is_recognised(text: str, body: Any) -> None:
    assert tools_unsupported(text, body)


@pytest.mark.parametrize(
    ("text", "body"),
    [
        ("This model's maximum context length is 4096 tokens.", None),
        ("Invalid schema for function 'add': 'integer' is not valid under any of the given schemas.", None),
        ("Rate limit reached for requests", None),
        ("Invalid value", {"detail": [{"loc": ["body", "tools", 0, "function"], "msg": "Field required"}]}),
        ("Invalid 'messages[1].tool_calls': empty array.", None),
    ],
)
def test_other_errors_are_not_a_refusal_of_tools(text: str, body: Any) -> None:
    assert not tools_unsupported(text, body)


PARAMS = {
    "model": "m",
    "messages": [],
    "max_tokens": 10,
    "temperature": 0.3,
    "stop": ["x"],
    "parallel_tool_calls": True,
}


@pytest.mark.parametrize(
    ("text", "body", "param"),
    [
        ("Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.", None, "max_tokens"),
        ("Unsupported value: 'temperature' does not support 0.3 with this model. Only the default (1) value is supported.", None, "temperature"),
        ("Unsupported parameter: 'stop' is not supported with this model.", None, "stop"),
        ("Unrecognized request argument supplied: parallel_tool_calls", None, "parallel_tool_calls"),
        ("parallel_tool_calls is not supported", None, "parallel_tool_calls"),
        ("Extra inputs are not permitted", {"detail": [{"loc": ["body", "stop"], "msg": "Extra inputs"}]}, "stop"),
        ("This model's maximum context length is 4096 tokens.", None, None),
        ("Invalid 'messages[0].content': string too long.", None, None),
    ],
)  # fmt: skip
def test_a_refused_optional_parameter_is_named(text: str, body: Any, param: str | None) -> None:
    assert unsupported_param(text, PARAMS, body) == param


# ============================================================================== against the server


async def go(agent: Agent, goal: str, *, stream: bool, events: list[Event] | None = None) -> RunResult:
    """`agent.run(goal)`, or the result of `agent.stream(goal)` (the model then streams its replies)."""
    events = [] if events is None else events
    if not stream:
        return await agent.run(goal, on_event=events.append)
    async for event in agent.stream(goal):
        events.append(event)
    done = events[-1]
    assert isinstance(done, Done)
    return done.result


@pytest.fixture
async def server() -> AsyncIterator[OpenAICompatibleServer]:
    async with OpenAICompatibleServer() as srv:
        yield srv


def without_tools(
    refusal: Fault, then: str = 'Thought: compute\nAction: calculator\nAction Input: {"expression": "17*23"}'
):  # type: ignore[no-untyped-def]
    """A server that refuses every request carrying tools, and answers the others (ReAct) as `then` /
    with the final answer once it has seen the observation."""

    def answer(request: RecordedRequest) -> Any:
        body = request.json
        if "tools" in body:
            return refusal
        if "Observation: 391" in json.dumps(body["messages"]):
            return "Thought: done\nFinal Answer: 391"
        return then

    return answer


@pytest.mark.parametrize(
    "refusal",
    [OLLAMA, VLLM, LLAMA_CPP, OPENAI_TOOLS, PYDANTIC_SERVER],
    ids=["ollama", "vllm", "llama.cpp", "openai", "pydantic"],
)
@pytest.mark.parametrize("stream", [False, True], ids=["request", "stream"])
async def test_a_server_without_tools_gets_the_run_in_react(
    server: OpenAICompatibleServer, refusal: Fault, stream: bool
) -> None:
    server.fallback = without_tools(refusal)
    model = OpenAIModel("small", base_url=server.url, api_key="k", max_retries=0)
    agent = Agent(model, tools=[calculator])
    events: list[Event] = []
    try:
        result = await go(agent, "What is 17*23?", stream=stream, events=events)
        assert result.stop_reason is StopReason.FINAL_ANSWER and result.output == "391"
        assert [e.output for e in result.state.ledger.values()] == ["391"]
        assert result.state.mode == "react"
        switch = [e for e in events if isinstance(e, ModeSwitched)]
        assert len(switch) == 1 and "does not take tool definitions" in switch[0].reason
        assert ["tools" in r for r in server.chat_requests] == [True, False, False]  # refused once, no retry
        assert model.capabilities.tools is False

        second = await go(
            agent, "What is 17*23?", stream=stream
        )  # the agent now starts in ReAct: no refused request
        assert second.output == "391" and second.state.mode == "react"
        assert ["tools" in r for r in server.chat_requests[3:]] == [False, False]
    finally:
        await model.aclose()


async def test_the_refusal_is_a_tools_unsupported_error_for_callers_of_the_model(
    server: OpenAICompatibleServer,
) -> None:
    server.add(OLLAMA)
    model = OpenAIModel("small", base_url=server.url, api_key="k")
    try:
        request = ModelRequest(
            messages=[Message.user("Hi")], tools=list(Agent(model, tools=[calculator]).tools.definitions())
        )
        with pytest.raises(
            ToolsUnsupportedError,
            match=r"does not support tools.*text ReAct.*capabilities=\{'tools': False\}",
        ):
            await model.request(request)
    finally:
        await model.aclose()


@pytest.mark.parametrize(
    ("refusal", "sent", "then_sent"),
    [
        (
            error(400, "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.", param="max_tokens", code="unsupported_parameter"),
            "max_tokens",
            "max_completion_tokens",
        ),
        (error(400, "Unrecognized request argument supplied: parallel_tool_calls"), "parallel_tool_calls", None),
        (error(400, "Unsupported value: 'temperature' does not support 0.3 with this model. Only the default (1) value is supported.", param="temperature"), "temperature", None),
        (error(400, "Unsupported parameter: 'stop' is not supported with this model.", param="stop"), "stop", None),
    ],
)  # fmt: skip
@pytest.mark.parametrize("stream", [False, True], ids=["request", "stream"])
async def test_a_refused_optional_parameter_is_dropped_and_not_sent_again(
    server: OpenAICompatibleServer, refusal: Fault, sent: str, then_sent: str | None, stream: bool
) -> None:
    server.add(refusal, Completion(tool_calls=[tool_call("calculator", {"expression": "17*23"})]), "391")
    model = OpenAIModel("gpt-4o-mini", base_url=server.url, api_key="k")
    settings = ModelSettings(stop=["\nEND"])
    try:
        result = await go(
            Agent(model, tools=[calculator], settings=settings), "What is 17*23?", stream=stream
        )
        assert result.output == "391" and result.tool_calls == 1
        bodies = server.chat_requests
        assert len(bodies) == 3 and sent in bodies[0]
        assert all(sent not in b for b in bodies[1:])  # dropped for the retry and every later request
        if then_sent is not None:  # the same limit under the name the server takes
            assert all(b[then_sent] == bodies[0][sent] for b in bodies[1:])
    finally:
        await model.aclose()


async def test_an_optional_parameter_is_dropped_once_then_the_error_stands(
    server: OpenAICompatibleServer,
) -> None:
    refusal = error(400, "Unrecognized request argument supplied: parallel_tool_calls")
    server.add(refusal, refusal)  # a server that still refuses: no endless retries
    model = OpenAIModel("gpt-4o-mini", base_url=server.url, api_key="k")
    request = ModelRequest(
        messages=[Message.user("Hi")], tools=list(Agent(model, tools=[calculator]).tools.definitions())
    )
    try:
        with pytest.raises(ModelError, match="HTTP 400"):
            await model.request(request)
        assert len(server.chat_requests) == 2
    finally:
        await model.aclose()


async def test_a_router_falls_back_past_a_member_without_tools_and_goes_react_when_none_has_them() -> None:
    async with OpenAICompatibleServer() as plain, OpenAICompatibleServer() as capable:
        plain.fallback = without_tools(OLLAMA)
        capable.add(Completion(tool_calls=[tool_call("calculator", {"expression": "17*23"})]), "391")
        members = [
            OpenAIModel("small", base_url=plain.url, api_key="k", max_retries=0),
            OpenAIModel("big", base_url=capable.url, api_key="k", max_retries=0),
        ]
        try:
            result = await Agent(RouterModel(members), tools=[calculator]).run("What is 17*23?")
            assert result.output == "391" and result.state.mode == "native"  # the member with tools answered
            assert len(plain.chat_requests) == 1 and "tools" in plain.chat_requests[0]

            alone = OpenAIModel("small", base_url=plain.url, api_key="k", max_retries=0)
            other = OpenAIModel("small2", base_url=plain.url, api_key="k", max_retries=0)
            result = await Agent(RouterModel([alone, other]), tools=[calculator]).run("What is 17*23?")
            assert result.output == "391" and result.state.mode == "react"
            await alone.aclose()
            await other.aclose()
        finally:
            for m in members:
                await m.aclose()


# ======================================================================= message shapes servers refuse

# llama-cpp-python's server (0.3.x) validates each message with pydantic: an assistant message's content must
# be a string, and its answer to a null one is a 500 (older llama.cpp servers and Mistral's refuse it too)
LLAMA_CPP_PYTHON_NULL_CONTENT = Fault(
    500,
    body={
        "error": {
            "message": "[{'type': 'string_type', 'loc': ('body', 'messages', 2, "
            "'ChatCompletionRequestAssistantMessage', 'content'), 'msg': 'Input should be a valid string', "
            "'input': None}]",
            "type": "internal_server_error",
        }
    },
)


@pytest.mark.parametrize("stream", [False, True], ids=["request", "stream"])
async def test_an_assistant_message_with_tool_calls_and_no_text_is_sent_with_empty_content(
    server: OpenAICompatibleServer, stream: bool
) -> None:
    """Every step after the first carries an assistant message that only calls tools: its `content` is "",
    which every server takes (a null one made llama-cpp-python's server fail every such request)."""

    def strict(request: RecordedRequest) -> Any:
        messages = request.json["messages"]
        if any(m["role"] == "assistant" and not isinstance(m.get("content"), str) for m in messages):
            return LLAMA_CPP_PYTHON_NULL_CONTENT
        if any(m["role"] == "tool" for m in messages):
            return "391"
        return Completion(tool_calls=[tool_call("calculator", {"expression": "17*23"})])

    server.fallback = strict
    model = OpenAIModel("small", base_url=server.url, api_key="k", max_retries=0)
    try:
        result = await go(Agent(model, tools=[calculator]), "What is 17*23?", stream=stream)
        assert result.stop_reason is StopReason.FINAL_ANSWER and result.output == "391"
        sent = server.chat_requests[1]["messages"]
        assert [(m["role"], m.get("content")) for m in sent[2:4]] == [("assistant", ""), ("tool", "391")]
        assert sent[3]["tool_call_id"] == sent[2]["tool_calls"][0]["id"]
    finally:
        await model.aclose()


# ============================================================== servers that take tools but mishandle them


@pytest.mark.parametrize("stream", [False, True], ids=["request", "stream"])
async def test_llama_cpp_pythons_server_gets_the_run_in_react_from_its_first_step(stream: bool) -> None:
    """llama-cpp-python's server (every model of its listing `owned_by: "me"`) takes tools but hands calls
    back as text: no tools are sent to it, the run is in ReAct from its first request (and later runs too)."""

    def react(request: RecordedRequest) -> Any:
        assert "tools" not in request.json, "tools were sent to llama-cpp-python's server"
        if "Observation: 391" in request.json["messages"][-1]["content"]:
            return "Thought: done\nFinal Answer: 391"
        return 'Thought: compute\nAction: calculator\nAction Input: {"expression": "17*23"}'

    async with OpenAICompatibleServer(fallback=react, owned_by="me") as server:
        model = OpenAIModel("qwen", base_url=server.url, api_key="k", max_retries=0)
        agent = Agent(model, tools=[calculator])
        events: list[Event] = []
        try:
            result = await go(agent, "What is 17*23?", stream=stream, events=events)
            assert result.stop_reason is StopReason.FINAL_ANSWER and result.output == "391"
            switch = [e for e in events if isinstance(e, ModeSwitched)]
            assert len(switch) == 1 and "llama-cpp-python's server" in switch[0].reason
            assert model.capabilities.tools is False
            assert [r.path for r in server.requests].count("/v1/models") == 1  # looked at once
            bodies = server.chat_requests
            assert all(body.get("repeat_penalty") == 1.0 for body in bodies), "its 1.1 default garbles ReAct"

            again = await go(agent, "What is 17*23?", stream=stream)  # starts in ReAct: no switch, no listing
            assert again.output == "391" and again.state.mode == "react"
            assert "mode_switches" not in again.state.metadata
            assert [r.path for r in server.requests].count("/v1/models") == 1
        finally:
            await model.aclose()


async def test_other_servers_and_stated_capabilities_keep_native_tools() -> None:
    native = [Completion(tool_calls=[tool_call("calculator", {"expression": "17*23"})]), "391"]
    for owned_by, capabilities, listings in [("vllm", None, 1), ("me", {"tools": True}, 0)]:
        async with OpenAICompatibleServer(native, owned_by=owned_by) as server:
            model = OpenAIModel(
                "m", base_url=server.url, api_key="k", max_retries=0, capabilities=capabilities
            )
            try:
                result = await Agent(model, tools=[calculator]).run("What is 17*23?")
                assert result.output == "391" and result.state.mode == "native", owned_by
                assert all("tools" in body for body in server.chat_requests[:1])
                assert [r.path for r in server.requests].count("/v1/models") == listings
            finally:
                await model.aclose()


async def test_a_server_whose_listing_names_no_owner_gets_tools_as_usual() -> None:
    async with OpenAICompatibleServer(
        [Completion(tool_calls=[tool_call("calculator", {"expression": "2*3"})]), "6"], models=[]
    ) as server:
        model = OpenAIModel("m", base_url=server.url, api_key="k", max_retries=0)
        try:
            result = await Agent(model, tools=[calculator]).run("What is 2*3?")
            assert result.output == "6" and result.state.mode == "native"
        finally:
            await model.aclose()
