"""Context-window overflow (SPEC §7 extension): the provider rejects a prompt as too long, the run's
context is shrunk and the step goes on — with test doubles, the loopback server and the real `openai` client."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_context import check, histories
from thinkloop import (
    Agent,
    ContextManager,
    ContextOverflowError,
    Event,
    Message,
    ModelRequest,
    ModelSettings,
    RunState,
    StopReason,
    ToolCall,
    tool,
)
from thinkloop._events import ModelAttempt
from thinkloop.models import ModelCapabilities, OpenAIModel, RouterModel
from thinkloop.models._base import estimate_request_tokens
from thinkloop.models._overflow import overflow_error
from thinkloop.testing import FunctionModel, ScriptedModel
from thinkloop.testing_server import (
    Completion,
    OpenAICompatibleServer,
    context_overflow,
    prompt_tokens,
    tool_call,
)

# ======================================================================= recognising the provider's words

CASES = [
    (  # OpenAI, prompt only
        "This model's maximum context length is 8192 tokens. However, your messages resulted in 8227 tokens. "
        "Please reduce the length of the messages.",
        (8192, 8227, None),
    ),
    (  # OpenAI / vLLM, with the reply room
        "This model's maximum context length is 4097 tokens. However, you requested 4120 tokens (3120 in the "
        "messages, 1000 in the completion). Please reduce the length of the messages or completion.",
        (4097, 3120, 1000),
    ),
    (  # OpenAI with functions: the total prompt counts
        "This model's maximum context length is 8192 tokens. However, your messages resulted in 10061 tokens "
        "(7911 in the messages, 2150 in the functions). Please reduce the length of the messages or functions.",
        (8192, 10061, None),
    ),
    (  # newer vLLM
        "'max_tokens' or 'max_completion_tokens' is too large: 4000. This model's maximum context length is "
        "4096 tokens and your request has 1000 input tokens (4000 > 4096 - 1000).",
        (4096, 1000, 4000),
    ),
    (
        "The prompt (total length 25938) is too long to fit into the model (context length 4096). Make sure "
        "that `max_model_len` is no smaller than the number of text tokens plus multimodal tokens.",
        (4096, 25938, None),
    ),
    ("Requested tokens (2285) exceed context window of 2048", (2048, 2285, None)),  # llama-cpp-python
    ("prompt is too long: 208000 tokens > 200000 maximum", (200000, 208000, None)),  # Anthropic-style
    (
        "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).",
        (1048576, 1200000, None),
    ),
    (
        "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum context length",
        (32768, 40000, None),
    ),
    (
        "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4097. Given: 4000 `inputs` "
        "tokens and 1000 `max_new_tokens`",
        (4097, 4000, 1000),
    ),
    ("the input length exceeds the context length", (None, None, None)),  # Ollama
    ("Range of input length should be [1, 30720]", (30720, None, None)),  # DashScope
    (
        "local: the prompt has 9,000 tokens, more than the context window of 8,192: lower max_context_tokens",
        (8192, 9000, None),
    ),
]


@pytest.mark.parametrize(("message", "numbers"), CASES)
def test_overflow_errors_are_recognised_with_their_numbers(
    message: str, numbers: tuple[int | None, int | None, int | None]
) -> None:
    error = overflow_error(message, provider="p", scope="chat completion", status_code=400)
    assert isinstance(error, ContextOverflowError)
    assert (error.limit, error.prompt_tokens, error.completion_tokens) == numbers
    assert str(error).startswith(
        "p: chat completion failed: the prompt is longer than the model's context window"
    )


def test_llama_cpp_fields_and_codes_are_recognised_without_the_words() -> None:
    body = {
        "code": 500,
        "message": "whatever",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 1407,
        "n_ctx": 256,
    }
    error = overflow_error("whatever", provider="p", scope="s", status_code=500, body=body)
    assert error is not None and (error.limit, error.prompt_tokens) == (256, 1407)
    coded = overflow_error("too long", provider="p", scope="s", code="context_length_exceeded")
    assert coded is not None and coded.limit is None


@pytest.mark.parametrize(
    ("message", "status"),
    [
        ("Rate limit reached for gpt-4o on tokens per min (TPM): Limit 30000, Requested 36000.", 429),
        (  # a 429 about a request bigger than the rate limit is still a rate limit
            "Request too large for gpt-4 on tokens per min (TPM): Limit 10000, Requested 12000. "
            "The input or output tokens must be reduced in order to run successfully.",
            429,
        ),
        (
            "Invalid 'messages[1].content': string too long. Expected a string with maximum length 10485760",
            400,
        ),
        ("The model `gpt-5-nano` does not exist or you do not have access to it.", 404),
        ("max_tokens is too large: 100000. This model supports at most 16384 completion tokens", 400),
    ],
)
def test_other_errors_are_not_overflows(message: str, status: int) -> None:
    assert overflow_error(message, provider="p", scope="s", status_code=status) is None


# =============================================================================== ContextManager.shrink


def long_history(steps: int, size: int = 3000) -> RunState:
    state = RunState(goal="Find the answer.")
    state.messages.append(Message.user("Find the answer.", kind="task"))
    for n in range(1, steps + 1):
        call = ToolCall(id=f"c{n}", name="fetch", arguments={"page": n})
        state.messages.append(Message.assistant("", [call], step=n))
        state.messages.append(Message.tool(call, f"page {n}: " + "x" * size, step=n))
    return state


def test_shrink_lowers_the_budget_and_the_next_view_fits_it() -> None:
    state = long_history(8)
    manager = ContextManager(20_000)
    first = manager.view(state, system="system")
    assert len(first) == len(state.messages)  # everything fits 20,000 tokens
    assert manager.shrink(3000) == 3000
    view = manager.view(state, system="system")
    check(view)
    assert manager.last_tokens * manager.scale <= manager.budget == 2700
    assert view[0].kind == "task" and any(m.kind == "summary" for m in view)
    assert view[-1] == state.messages[-1]  # the newest result is kept


def test_shrink_recalibrates_from_the_provider_count_and_never_rises() -> None:
    state = long_history(3, size=600)
    manager = ContextManager(8000)
    manager.view(state, system="system")
    sent = manager.last_tokens
    assert manager.shrink(6000, prompt_tokens=sent * 3) == 6000  # the provider counts 3x our estimate
    assert manager.scale == pytest.approx(3.0)
    manager.view(state, system="system")
    assert manager.last_tokens * manager.scale <= manager.budget
    now = int(manager.last_tokens * manager.scale)
    assert manager.shrink(10_000, prompt_tokens=now) == 6000  # a limit never rises
    assert manager.shrink(10) == 256  # nor goes below 256 tokens


def test_shrink_without_numbers_cuts_what_was_sent() -> None:
    state = long_history(6, size=900)
    manager = ContextManager(8000)
    manager.view(state, system="system")
    sent = manager.last_tokens
    assert manager.shrink() == int(sent * 0.6)
    assert manager.shrink(to_tokens=7000) == int(sent * 0.6)  # not more than before, and below what was sent
    view = manager.view(state, system="system")
    check(view)
    assert manager.last_tokens < sent


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=histories(),
    max_tokens=st.integers(500, 20_000),
    cuts=st.lists(st.floats(0.05, 0.95), min_size=1, max_size=3),
    reported=st.one_of(st.none(), st.floats(0.5, 4.0)),
)
def test_every_view_after_a_shrink_is_a_valid_chat_history(
    messages: list[Message], max_tokens: int, cuts: list[float], reported: float | None
) -> None:
    state = RunState(goal="the goal")
    state.messages = messages
    manager = ContextManager(max_tokens)
    manager.view(state, system="system prompt")
    for cut in cuts:
        limit = manager.max_context_tokens
        prompt = int(manager.last_tokens * reported) if reported else None
        new = manager.shrink(int(limit * cut), prompt_tokens=prompt)
        assert 256 <= new <= limit
        view = manager.view(state, system="system prompt")
        check(view)  # no tool result without its call, no call without its result (SPEC §7.3)
        assert any(m.kind == "task" for m in view)


# ============================================================================== the loop, with doubles


@tool
def fetch(page: int) -> str:
    """Fetch a page of the report."""
    return f"page {page}: " + "lorem ipsum " * 250  # about 1,000 tokens


def reader(pages: int, window: int, *, ratio: float = 1.0, numbers: bool = True) -> FunctionModel:
    """A model with a context window of `window` tokens (counted as the estimate x `ratio`): it reads
    `pages` pages, one a step, then answers; a longer prompt raises `ContextOverflowError`."""

    def reply(request: ModelRequest) -> Any:
        size = int(estimate_request_tokens(request) * ratio)
        if size > window:
            raise ContextOverflowError(
                f"the prompt has {size} tokens, more than the context window of {window}",
                provider="test",
                limit=window if numbers else None,
                prompt_tokens=size if numbers else None,
            )
        read = sum(1 for m in request.messages if m.role == "tool")
        if request.turn < pages:
            return {"tool_calls": [{"name": "fetch", "args": {"page": request.turn + 1}}]}
        return f"read {read} pages in view"

    return FunctionModel(reply)


def collecting() -> tuple[list[Event], Callable[[Event], None]]:
    events: list[Event] = []
    return events, events.append


@pytest.mark.parametrize(("ratio", "numbers"), [(1.0, True), (1.6, True), (1.0, False)])
async def test_an_overflowing_step_is_retried_with_a_smaller_context(ratio: float, numbers: bool) -> None:
    model = reader(pages=8, window=3000, ratio=ratio, numbers=numbers)
    events, sink = collecting()
    agent = Agent(model, tools=[fetch], max_context_tokens=30_000, on_event=sink)
    result = await agent.run("Read the report")
    assert result.stop_reason is StopReason.FINAL_ANSWER, result.error
    assert result.output.startswith("read ")
    shrinks = result.state.metadata["context_shrinks"]
    assert shrinks and shrinks[0]["from"] == 30_000 and shrinks[0]["to"] < 30_000
    assert all(s["to"] < s["from"] for s in shrinks)
    assert all(sum(1 for s in shrinks if s["step"] == n) <= 2 for n in range(1, result.steps + 1))
    retries = [e for e in events if isinstance(e, ModelAttempt)]
    assert len(retries) == len(shrinks) and all(e.next_action == "retry" for e in retries)
    assert "the run's context was shrunk from 30,000 to" in retries[0].error
    answered = [r for r in model.requests if int(estimate_request_tokens(r) * ratio) <= 3000]
    assert len(answered) == result.usage.requests == 9  # every step was answered in the end
    for request in model.requests:
        check(request.messages[1:])
    assert len(model.requests) == 9 + len(shrinks)


async def test_a_shrink_lasts_for_the_run_and_only_for_that_run() -> None:
    agent = Agent(reader(pages=8, window=3000), tools=[fetch], max_context_tokens=30_000)
    small = Agent(reader(pages=2, window=3000), tools=[fetch], max_context_tokens=30_000)
    first = await agent.run("Read the report")
    second, untouched = await asyncio.gather(agent.run("Read the report"), small.run("Read two pages"))
    one, two = first.state.metadata["context_shrinks"], second.state.metadata["context_shrinks"]
    assert [s["from"] for s in one] == [s["from"] for s in two]  # the second run started from the full budget
    assert len({s["step"] for s in one}) == 1  # once shrunk, later steps of the run fit
    assert "context_shrinks" not in untouched.state.metadata
    assert untouched.output == "read 2 pages in view"


async def test_an_overflow_that_shrinking_cannot_fix_ends_the_run_with_a_clear_error() -> None:
    def always(request: ModelRequest) -> str:
        raise ContextOverflowError("prompt too long", provider="test", limit=100, prompt_tokens=5000)

    model = FunctionModel(always)
    events, sink = collecting()
    result = await Agent(model, max_context_tokens=8000, on_event=sink).run("Hello")
    assert result.stop_reason is StopReason.ERROR
    assert result.error is not None and result.error.startswith(
        "test: model request failed: the prompt does not fit the model's context window of 100 tokens "
        "(the prompt had 5,000 tokens), even after shrinking the run's context once, to 256 tokens"
    )
    assert "use a model with a larger context window" in result.error
    assert len(model.requests) == 2  # at the floor and calibrated: a third try could not be smaller
    assert [e.next_action for e in events if isinstance(e, ModelAttempt)] == ["retry"]
    assert result.steps == 1


async def test_at_most_two_shrinks_a_step() -> None:
    def halving_window(request: ModelRequest) -> Any:  # from step 5 on, the window is half of any prompt
        if request.turn < 4:
            return {"tool_calls": [{"name": "fetch", "args": {"page": request.turn + 1}}]}
        size = estimate_request_tokens(request)
        raise ContextOverflowError("too long", provider="test", limit=size // 2, prompt_tokens=size)

    model = FunctionModel(halving_window)
    result = await Agent(model, tools=[fetch], max_context_tokens=100_000).run("Read the report")
    assert result.stop_reason is StopReason.ERROR and result.error is not None
    assert "even after shrinking the run's context twice" in result.error
    assert len(model.requests) == 4 + 3 and result.steps == 5
    shrinks = result.state.metadata["context_shrinks"]
    assert [s["step"] for s in shrinks] == [5, 5] and shrinks[1]["to"] < shrinks[0]["to"]
    sizes = [estimate_request_tokens(r) for r in model.requests[4:]]
    assert sizes[0] > sizes[1] > sizes[2]  # each retry sent a smaller view


async def test_a_system_prompt_larger_than_the_window_stops_without_pointless_retries() -> None:
    def small_window(request: ModelRequest) -> str:
        size = estimate_request_tokens(request)
        raise ContextOverflowError("too long", provider="test", limit=600, prompt_tokens=size)

    model = FunctionModel(small_window)
    result = await Agent(model, instructions="Rules. " * 2000).run("Hello")
    assert result.stop_reason is StopReason.ERROR and result.error is not None
    assert "context window of 600 tokens" in result.error
    assert len(model.requests) <= 3


@pytest.mark.parametrize("mode", ["native", "react"])
async def test_streamed_and_react_runs_shrink_too(mode: str) -> None:
    base = reader(pages=6, window=2600)
    model = FunctionModel(base.function, tools=mode == "native")
    agent = Agent(model, tools=[fetch], max_context_tokens=30_000, mode=mode)  # type: ignore[arg-type]
    done = [e async for e in agent.stream("Read the report")][-1]
    result = done.result  # type: ignore[attr-defined]
    assert result.stop_reason is StopReason.FINAL_ANSWER, result.error
    assert result.state.metadata["context_shrinks"]


# ====================================================================== the router: fallback or shrink


def overflow_member(window: int | None, name: str) -> FunctionModel:
    def reply(request: ModelRequest) -> str:
        raise ContextOverflowError("too long", provider=name, limit=window, prompt_tokens=(window or 0) + 10)

    model = FunctionModel(reply, name=name)
    model.capabilities = ModelCapabilities(context_window=window)
    return model


async def test_the_router_falls_back_to_a_larger_window_without_retrying_or_tripping_the_breaker() -> None:
    small = overflow_member(4096, "small")
    medium = ScriptedModel(["from medium"], name="medium")
    large = ScriptedModel(["from large"], name="large")
    large.capabilities = ModelCapabilities(context_window=128_000)
    attempts: list[ModelAttempt] = []
    router = RouterModel(
        [small, medium, large], on_attempt=attempts.append, breaker_threshold=1, sleep=_no_sleep
    )
    response = await router.request(ModelRequest(messages=[Message.user("hi")]))
    assert response.text == "from large"
    assert len(small.requests) == 1 and not medium.requests  # not retried; no declared window: skipped
    assert [a.next_action for a in attempts] == ["fallback"]
    assert router.breakers[0].state(0.0) == "closed"  # an overflow is not the member's failure


async def test_a_router_overflow_with_no_larger_member_reaches_the_loop_as_an_overflow() -> None:
    router = RouterModel([overflow_member(4096, "a"), overflow_member(2048, "b")], sleep=_no_sleep)
    with pytest.raises(ContextOverflowError) as info:
        await router.request(ModelRequest(messages=[Message.user("hi")]))
    assert (info.value.limit, info.value.provider) == (4096, "router")  # the first member's window
    assert "b: skipped, its context window (2,048 tokens) is not larger" in str(info.value)
    anywhere = RouterModel([overflow_member(4096, "a"), ScriptedModel(["ok"])], overflow_fallback="any")
    assert (await anywhere.request(ModelRequest(messages=[Message.user("hi")]))).text == "ok"


async def test_an_agent_on_a_router_shrinks_when_no_member_can_take_the_prompt() -> None:
    router = RouterModel([reader(pages=6, window=2600), overflow_member(None, "unknown")], sleep=_no_sleep)
    result = await Agent(router, tools=[fetch], max_context_tokens=30_000).run("Read the report")
    assert result.stop_reason is StopReason.FINAL_ANSWER, result.error
    assert result.state.metadata["context_shrinks"]


async def _no_sleep(delay: float) -> None:
    return None


# ============================================================ the loopback server and the real openai client


async def test_an_agent_on_the_openai_adapter_recovers_from_the_real_400() -> None:
    pages = [Completion(tool_calls=[tool_call("fetch", {"page": n})]) for n in range(1, 8)]
    async with OpenAICompatibleServer([*pages, "All pages read."], context_window=3000) as server:
        model = OpenAIModel("gpt-4o-mini", base_url=server.url, api_key="k")
        events, sink = collecting()
        result = await Agent(model, tools=[fetch], max_context_tokens=30_000, on_event=sink).run("Read it")
        await model.aclose()
    assert result.stop_reason is StopReason.FINAL_ANSWER, result.error
    assert result.output == "All pages read."
    assert server.overflows >= 1 and server.remaining == 0
    shrinks = result.state.metadata["context_shrinks"]
    assert len(shrinks) == server.overflows and shrinks[0]["limit"] == 3000
    bodies = server.chat_requests
    assert len(bodies) == 8 + server.overflows
    answered = [b for b in bodies if prompt_tokens(b) <= 3000]
    assert len(answered) == 8
    attempt = next(e for e in events if isinstance(e, ModelAttempt))
    assert "maximum context length is 3000 tokens" in attempt.error and attempt.next_action == "retry"


async def test_a_llama_cpp_overflow_with_http_500_is_shrunk_not_retried_as_a_server_error() -> None:
    pages = [Completion(tool_calls=[tool_call("fetch", {"page": n})]) for n in range(1, 6)]
    async with OpenAICompatibleServer(
        [*pages, "done"], context_window=2500, overflow_style="llama.cpp"
    ) as server:
        model = OpenAIModel("qwen", base_url=server.url)
        result = await Agent(model, tools=[fetch], max_context_tokens=30_000, model_retries=0).run("Read")
        await model.aclose()
    assert result.stop_reason is StopReason.FINAL_ANSWER, result.error
    assert result.state.metadata["context_shrinks"][0]["limit"] == 2500
    assert server.overflows == len(result.state.metadata["context_shrinks"])


async def test_vllm_counting_the_reply_room_gets_a_resend_with_less_room() -> None:
    async with OpenAICompatibleServer(["Hello!"], context_window=4096, overflow_style="vllm") as server:
        model = OpenAIModel("qwen", base_url=server.url)
        agent = Agent(model, settings=ModelSettings(max_output_tokens=4096))
        result = await agent.run("Hi")
        await model.aclose()
    assert result.output == "Hello!" and server.overflows == 1
    first, second = server.chat_requests
    assert first["max_tokens"] == 4096
    assert second["max_tokens"] == 4096 - prompt_tokens(second)  # exactly the room the server said is left
    assert "context_shrinks" not in result.state.metadata  # the prompt was fine: nothing was shrunk


async def test_the_overflow_error_of_the_adapter_carries_the_numbers() -> None:
    async with OpenAICompatibleServer(
        [context_overflow(8192, 9000), context_overflow(4096, 500, completion=4000, style="vllm")]
    ) as server:
        model = OpenAIModel("gpt-4o-mini", base_url=server.url, api_key="k")
        request = ModelRequest(messages=[Message.user("hi")], settings=ModelSettings(max_output_tokens=100))
        with pytest.raises(ContextOverflowError) as info:
            await model.request(request)
        assert (info.value.limit, info.value.prompt_tokens, info.value.status_code) == (8192, 9000, 400)
        with pytest.raises(ContextOverflowError) as streamed:  # 100 tokens of room asked: no resend helps
            [c async for c in model.stream(request)]
        assert (streamed.value.limit, streamed.value.prompt_tokens, streamed.value.completion_tokens) == (
            4096,
            500,
            4000,
        )
        assert streamed.value.scope == "streaming chat completion"
        await model.aclose()
    assert len(server.chat_requests) == 2


async def test_a_resumed_run_keeps_the_context_it_shrank_to() -> None:
    agent = Agent(reader(pages=8, window=3000), tools=[fetch], max_context_tokens=30_000)
    first = await agent.run("Read the report")
    shrunk_to = first.state.metadata["context_shrinks"][-1]["to"]
    state = first.state.model_copy(deep=True)
    state.stop_reason, state.phase, state.run_id = (
        None,
        "acting",
        "resumed-run",
    )  # as if it had been interrupted
    run = agent._context(state, budget=None, sinks=[], stream=False)
    assert run.context.max_context_tokens == shrunk_to < 30_000
    fresh = agent._context(RunState(goal="other"), budget=None, sinks=[], stream=False)
    assert fresh.context.max_context_tokens == 30_000
