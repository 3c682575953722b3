"""RouterModel (SPEC §2.4): retries, Retry-After, fallback, circuit breakers, capability routing,
streaming fallback, attempt events, usage and cancellation."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from thinkloop import Agent, ConfigurationError, ModelError, ModelRetryableError, StopReason, tool
from thinkloop._events import ModelAttempt
from thinkloop._messages import (
    Message,
    ModelRequest,
    ModelResponse,
    StreamChunk,
    TextDelta,
    ToolCallDelta,
    ToolDefinition,
    Usage,
)
from thinkloop.models import OpenAIModel, resolve_model
from thinkloop.models._router import CircuitBreaker, RouterModel
from thinkloop.testing import FunctionModel, Reply, ScriptedModel
from thinkloop.testing_server import Completion, Fault, OpenAICompatibleServer, tool_call

REQUEST = ModelRequest(messages=[Message.user("hi")])
TOOL_REQUEST = ModelRequest(messages=[Message.user("hi")], tools=[ToolDefinition(name="add")])


def flaky(*outcomes: BaseException | Reply, name: str = "m", tools: bool = True) -> FunctionModel:
    """A model answering with the next outcome: an exception is raised, a reply is returned."""
    queue = list(outcomes)

    def reply(request: ModelRequest) -> Reply:
        item = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(item, BaseException):
            raise item
        return item

    return FunctionModel(reply, name=name, tools=tools)


def busy(retry_after: float | None = None) -> ModelRetryableError:
    return ModelRetryableError("HTTP 503 busy", provider="test", status_code=503, retry_after=retry_after)


def bad_request() -> ModelError:
    return ModelError("HTTP 400 bad request", provider="test", status_code=400)


class Recorder:
    """The injectable sleep, clock and attempt hook of a router under test."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []
        self.attempts: list[ModelAttempt] = []
        self.now = 1000.0

    async def sleep(self, delay: float) -> None:
        self.sleeps.append(delay)

    def clock(self) -> float:
        return self.now

    def router(self, *models: Any, **kwargs: Any) -> RouterModel:
        kwargs.setdefault("jitter", False)
        return RouterModel(
            list(models), sleep=self.sleep, clock=self.clock, on_attempt=self.attempts.append, **kwargs
        )

    @property
    def actions(self) -> list[tuple[str, int, str]]:
        return [(a.model, a.attempt, a.next_action) for a in self.attempts]


# --------------------------------------------------------------------------------- retries and delays


async def test_retryable_error_is_retried_with_exponential_backoff() -> None:
    rec = Recorder()
    model = flaky(busy(), busy(), "ok", name="a")
    router = rec.router(model, backoff=0.5)
    response = await router.request(REQUEST)
    assert response.text == "ok"
    assert response.model_name == "a"
    assert len(model.requests) == 3
    assert rec.sleeps == [0.5, 1.0]
    assert rec.actions == [("test:a", 1, "retry"), ("test:a", 2, "retry")]
    assert rec.attempts[0].delay == 0.5
    assert "HTTP 503 busy" in rec.attempts[0].error


async def test_retry_after_is_honoured_and_capped() -> None:
    rec = Recorder()
    router = rec.router(flaky(busy(retry_after=2.0), busy(retry_after=300.0), "ok"), max_backoff=7.0)
    assert (await router.request(REQUEST)).text == "ok"
    assert rec.sleeps == [2.0, 7.0]


async def test_backoff_is_capped_and_jittered() -> None:
    router = RouterModel([ScriptedModel([])], backoff=1.0, max_backoff=3.0, rng=random.Random(7))
    delays = [router.delay(attempt, None) for attempt in (1, 2, 3, 4)]
    assert 0.5 <= delays[0] <= 1.0
    assert 1.0 <= delays[1] <= 2.0
    assert 1.5 <= delays[2] <= 3.0 and 1.5 <= delays[3] <= 3.0
    plain = RouterModel([ScriptedModel([])], backoff=1.0, max_backoff=3.0, jitter=False)
    assert [plain.delay(a, None) for a in (1, 2, 3, 4)] == [1.0, 2.0, 3.0, 3.0]


# ---------------------------------------------------------------------------------------- fallback


async def test_falls_back_to_the_next_model_after_the_retries() -> None:
    rec = Recorder()
    first, second = flaky(busy(), name="a"), flaky("from b", name="b")
    router = rec.router(first, second, retries=2, breaker_threshold=10)
    response = await router.request(REQUEST)
    assert response.text == "from b"
    assert response.model_name == "b"
    assert len(first.requests) == 3
    assert rec.actions == [("test:a", 1, "retry"), ("test:a", 2, "retry"), ("test:a", 3, "fallback")]
    assert len(rec.sleeps) == 2


async def test_non_retryable_error_falls_back_at_once() -> None:
    rec = Recorder()
    first, second = flaky(bad_request(), name="a"), flaky("from b", name="b")
    response = await rec.router(first, second).request(REQUEST)
    assert response.text == "from b"
    assert len(first.requests) == 1
    assert rec.sleeps == []
    assert rec.actions == [("test:a", 1, "fallback")]


async def test_all_failing_raises_the_last_error_listing_every_model() -> None:
    rec = Recorder()
    router = rec.router(flaky(bad_request(), name="a"), flaky(busy(), name="b"), retries=1)
    with pytest.raises(ModelRetryableError) as caught:
        await router.request(REQUEST)
    message = str(caught.value)
    assert message.startswith("router: model request failed: all 2 models of the router failed")
    assert "test:a: test: model request failed: HTTP 400 bad request (after 1 attempt(s))" in message
    assert "test:b: test: model request failed: HTTP 503 busy (after 2 attempt(s))" in message
    assert caught.value.status_code == 503
    assert isinstance(caught.value.__cause__, ModelRetryableError)
    assert rec.actions[-1] == ("test:b", 2, "give_up")


async def test_last_error_not_retryable_gives_a_plain_model_error() -> None:
    router = Recorder().router(flaky(busy(), name="a"), flaky(bad_request(), name="b"), retries=0)
    with pytest.raises(ModelError) as caught:
        await router.request(REQUEST)
    assert type(caught.value) is ModelError
    assert caught.value.status_code == 400


# ------------------------------------------------------------------------------------ circuit breaker


async def test_breaker_opens_skips_the_dead_model_and_half_opens_after_cooldown() -> None:
    rec = Recorder()
    dead = flaky(busy(), busy(), busy(), "back", name="dead")
    spare = flaky("spare", name="spare")
    router = rec.router(dead, spare, retries=5, breaker_threshold=3, breaker_cooldown=30)

    assert (await router.request(REQUEST)).text == "spare"  # 3 failures open the breaker: no 4th try
    assert len(dead.requests) == 3
    assert rec.actions[-1] == ("test:dead", 3, "fallback")
    assert router.breakers[0].state(rec.now) == "open"

    rec.now += 10
    assert (await router.request(REQUEST)).text == "spare"
    assert len(dead.requests) == 3  # skipped while open

    rec.now += 25  # the cooldown is over: one probe goes to the dead model, which has recovered
    assert router.breakers[0].state(rec.now) == "half_open"
    assert (await router.request(REQUEST)).text == "back"
    assert router.breakers[0].state(rec.now) == "closed"
    assert len(dead.requests) == 4


async def test_failed_probe_opens_the_breaker_again() -> None:
    rec = Recorder()
    dead, spare = flaky(busy(), name="dead"), flaky("spare", name="spare")
    router = rec.router(dead, spare, retries=0, breaker_threshold=1, breaker_cooldown=5)
    await router.request(REQUEST)
    rec.now += 6
    await router.request(REQUEST)  # the probe fails: open again, at once, without retrying
    assert len(dead.requests) == 2
    assert router.breakers[0].state(rec.now) == "open"
    rec.now += 1
    await router.request(REQUEST)
    assert len(dead.requests) == 2


def test_half_open_breaker_lets_one_probe_through() -> None:
    breaker = CircuitBreaker(threshold=1, cooldown=5)
    breaker.failure(0.0)
    assert not breaker.allow(1.0)
    assert breaker.allow(6.0)
    assert not breaker.allow(6.0)  # a second concurrent request does not probe too
    breaker.release()
    assert breaker.allow(6.0)
    breaker.success()
    assert breaker.state(6.0) == "closed" and breaker.failures == 0


async def test_every_breaker_open_raises_a_retryable_error_saying_when() -> None:
    rec = Recorder()
    only = flaky(busy(), name="only")
    router = rec.router(only, retries=0, breaker_threshold=1, breaker_cooldown=30)
    with pytest.raises(ModelRetryableError):
        await router.request(REQUEST)
    rec.now += 10
    with pytest.raises(ModelRetryableError) as caught:
        await router.request(REQUEST)
    assert "test:only: skipped, circuit open for 20.0 s more" in str(caught.value)
    assert caught.value.retry_after == 20.0
    assert len(only.requests) == 1


# --------------------------------------------------------------------------------- capability routing


async def test_requests_with_tools_go_only_to_tool_capable_models() -> None:
    text_only = flaky("text", name="text", tools=False)
    native = flaky("native", name="native")
    router = Recorder().router(text_only, native)
    assert router.capabilities.tools
    assert (await router.request(TOOL_REQUEST)).text == "native"
    assert (await router.request(REQUEST)).text == "text"
    assert len(text_only.requests) == 1 and text_only.requests[0].tools == []


async def test_tool_request_without_healthy_tool_model_names_the_skipped_ones() -> None:
    router = Recorder().router(flaky("text", name="text", tools=False), flaky(bad_request(), name="native"))
    with pytest.raises(ModelError) as caught:
        await router.request(TOOL_REQUEST)
    assert "test:text: skipped, no native tool calling" in str(caught.value)
    assert "test:native: test: model request failed: HTTP 400" in str(caught.value)


async def test_tool_request_to_text_only_router_says_to_use_react() -> None:
    router = RouterModel([ScriptedModel(["a"], tools=False), ScriptedModel(["b"], tools=False)])
    assert not router.capabilities.tools
    with pytest.raises(
        ModelError, match="none of the models .* supports native tool calling: use mode='react'"
    ):
        await router.request(TOOL_REQUEST)


async def test_text_only_router_runs_the_agent_in_react_mode() -> None:
    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    replies = ['Thought: add\nAction: add\nAction Input: {"a": 2, "b": 3}', "Final Answer: 5"]
    router = RouterModel([ScriptedModel(replies, tools=False)])
    result = await Agent(router, tools=[add]).run("2+3?")
    assert result.output == "5"
    assert result.state.mode == "react"


# --------------------------------------------------------------------------------------- streaming


class _BreaksMidStream(FunctionModel):
    """A streaming model whose connection breaks after its first text chunk."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        self.requests.append(request)
        yield TextDelta(text="Hel")
        raise ModelRetryableError("connection lost mid-stream", provider="test")


async def _collect(router: RouterModel) -> list[StreamChunk]:
    return [chunk async for chunk in router.stream(REQUEST)]


async def test_stream_falls_back_before_the_first_chunk() -> None:
    rec = Recorder()
    first, second = flaky(busy(), name="a"), flaky("Hello there", name="b")
    chunks = await _collect(rec.router(first, second, retries=1))
    text = "".join(c.text for c in chunks if isinstance(c, TextDelta))
    assert text == "Hello there"
    final = chunks[-1]
    assert isinstance(final, ModelResponse) and final.model_name == "b"
    assert rec.actions == [("test:a", 1, "retry"), ("test:a", 2, "fallback")]


async def test_stream_error_after_the_first_chunk_surfaces() -> None:
    rec = Recorder()
    broken = _BreaksMidStream(lambda r: "unused", name="broken")
    spare = flaky("spare", name="spare")
    router = rec.router(broken, spare)
    seen: list[StreamChunk] = []
    with pytest.raises(ModelRetryableError, match="connection lost mid-stream"):
        async for chunk in router.stream(REQUEST):
            seen.append(chunk)
    assert seen == [TextDelta(text="Hel")]
    assert spare.requests == []
    assert rec.actions == [("test:broken", 1, "give_up")]
    assert router.breakers[0].failures == 1


async def test_stream_from_a_model_that_cannot_stream() -> None:
    model = ScriptedModel(["whole reply"], streaming=False)
    chunks = await _collect(RouterModel([model]))
    assert [type(c).__name__ for c in chunks] == ["TextDelta", "ModelResponse"]


# --------------------------------------------------------------------------------- runs and events


async def test_attempts_are_events_of_the_run_stream() -> None:
    rec = Recorder()
    router = RouterModel(
        [flaky(busy(retry_after=0.25), name="a"), flaky("the answer", name="b")],
        retries=1,
        sleep=rec.sleep,
    )
    events = [e async for e in Agent(router).stream("question")]
    attempts = [e for e in events if isinstance(e, ModelAttempt)]
    assert [(a.model, a.attempt, a.next_action, a.delay) for a in attempts] == [
        ("test:a", 1, "retry", 0.25),
        ("test:a", 2, "fallback", 0.0),
    ]
    run_id = events[0].run_id
    assert all(a.run_id == run_id and a.seq > 0 for a in attempts)
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    assert events[-1].type == "done"
    assert rec.sleeps == [0.25]


async def test_attempt_outside_a_run_goes_to_the_hook_only() -> None:
    rec = Recorder()
    await rec.router(flaky(busy(), "ok")).request(REQUEST)
    assert rec.actions == [("test:m", 1, "retry")]


async def test_run_fails_with_every_failure_in_its_error() -> None:
    router = Recorder().router(flaky(bad_request(), name="a"), flaky(bad_request(), name="b"))
    result = await Agent(router).run("question")
    assert result.stop_reason is StopReason.ERROR
    assert result.error is not None and "all 2 models of the router failed" in result.error
    assert "test:a:" in result.error and "test:b:" in result.error


async def test_tokens_of_failed_attempts_are_charged_to_the_run() -> None:
    error = busy()
    error.usage = Usage(input_tokens=100, output_tokens=7, requests=1)  # type: ignore[attr-defined]
    reply = ModelResponse(text="done", usage=Usage(input_tokens=50, output_tokens=5, requests=1))
    router = Recorder().router(flaky(error, reply))
    response = await router.request(REQUEST)
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.requests) == (
        150,
        12,
        1,
    )
    result = await Agent(Recorder().router(flaky(error, reply))).run("q")
    assert result.usage.input_tokens == 150 and result.usage.requests == 1


# ------------------------------------------------------------------------------------- cancellation


async def test_cancellation_is_never_retried() -> None:
    started = asyncio.Event()

    async def hang(request: ModelRequest) -> Reply:
        started.set()
        await asyncio.Event().wait()
        return "never"

    slow, spare = FunctionModel(hang, name="slow"), flaky("spare", name="spare")
    rec = Recorder()
    router = rec.router(slow, spare)
    task = asyncio.create_task(router.request(REQUEST))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(slow.requests) == 1 and spare.requests == []
    assert rec.attempts == []
    assert router.breakers[0].failures == 0


async def test_cancellation_during_backoff_passes_through() -> None:
    sleeping = asyncio.Event()

    async def slow_sleep(delay: float) -> None:
        sleeping.set()
        await asyncio.sleep(3600)

    model = flaky(busy(), "ok")
    router = RouterModel([model], sleep=slow_sleep, jitter=False)
    task = asyncio.create_task(router.request(REQUEST))
    await sleeping.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(model.requests) == 1


async def test_cancelled_probe_lets_the_next_request_probe() -> None:
    rec = Recorder()
    gate = asyncio.Event()
    calls: list[ModelRequest] = []

    async def reply(request: ModelRequest) -> Reply:
        calls.append(request)
        if len(calls) == 1:
            raise busy()
        gate.set()
        await asyncio.Event().wait()
        return "never"

    model = FunctionModel(reply, name="a")
    router = rec.router(
        model, flaky("spare", name="spare"), retries=0, breaker_threshold=1, breaker_cooldown=1
    )
    await router.request(REQUEST)
    rec.now += 2
    task = asyncio.create_task(router.request(REQUEST))
    await gate.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert router.breakers[0].allow(rec.now)  # the probe slot was released


# ----------------------------------------------------------------------------------- configuration


def test_router_model_strings(tmp_path: Path) -> None:
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text(json.dumps(["hi"]))
    spec = f"router:script:{tmp_path / 'a.json'}, script:{tmp_path / 'b.json'}"
    router = resolve_model(spec)
    assert isinstance(router, RouterModel)
    assert [m.spec for m in router.models] == [f"script:{tmp_path / name}" for name in ("a.json", "b.json")]
    assert router.spec == f"router:script:{tmp_path / 'a.json'},script:{tmp_path / 'b.json'}"


async def test_agent_accepts_a_list_of_models() -> None:
    agent = Agent([flaky(bad_request(), name="a"), ScriptedModel(["fine"])])
    assert isinstance(agent.model, RouterModel)
    result = await agent.run("q")
    assert result.output == "fine"


@pytest.mark.parametrize(
    ("models", "kwargs", "message"),
    [
        ([], {}, "needs a non-empty list of models"),
        ("openai:gpt-4o", {}, "needs a non-empty list of models"),
        (["x"], {"retries": -1}, "must be ≥ 0"),
        (["x"], {"breaker_threshold": 0}, "breaker_threshold must be ≥ 1"),
    ],
)
def test_bad_settings_are_configuration_errors(models: Any, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        RouterModel(models, **kwargs)


def test_capabilities_are_combined() -> None:
    router = RouterModel(
        [ScriptedModel([], tools=False, streaming=False, prefill=True), ScriptedModel([], prefill=True)]
    )
    caps = router.capabilities
    assert caps.tools and caps.streaming and caps.prefill
    assert not RouterModel([ScriptedModel([], prefill=True), ScriptedModel([])]).capabilities.prefill


# --------------------------------------------------------------------- loopback OpenAI-compatible servers


def openai_on(server: OpenAICompatibleServer, name: str, **kwargs: Any) -> OpenAIModel:
    return OpenAIModel(name, base_url=server.url, api_key="test", **kwargs)


async def test_loopback_429_retry_after_is_honoured() -> None:
    rec = Recorder()
    script = [Fault(status=429, headers={"Retry-After": "2"}), Completion(text="hello", usage=(12, 3))]
    async with OpenAICompatibleServer(script) as server:
        router = rec.router(openai_on(server, "primary"))
        response = await router.request(REQUEST)
    assert response.text == "hello"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (12, 3)
    assert rec.sleeps == [2.0]
    assert rec.actions == [("openai:primary", 1, "retry")]
    assert "429" in rec.attempts[0].error
    assert len(server.chat_requests) == 2


async def test_loopback_5xx_and_dropped_connection_fall_back_to_the_second_server() -> None:
    rec = Recorder()
    failing = [Fault(status=500), Fault(status=503), Fault(drop=True)]
    async with (
        OpenAICompatibleServer(failing) as first,
        OpenAICompatibleServer([Completion(text="from the spare")]) as second,
    ):
        router = rec.router(
            openai_on(first, "main"), openai_on(second, "spare"), retries=2, breaker_threshold=5
        )
        response = await router.request(REQUEST)
    assert response.text == "from the spare"
    assert len(first.requests) == 3 and len(second.requests) == 1
    assert [a.next_action for a in rec.attempts] == ["retry", "retry", "fallback"]
    assert "500" in rec.attempts[0].error and "503" in rec.attempts[1].error


async def test_loopback_timeout_is_retried() -> None:
    rec = Recorder()
    async with OpenAICompatibleServer([Fault(delay=5), Completion(text="in time")]) as server:
        # the retry must succeed within the same timeout: 0.3 s was close to a busy machine's request time
        router = rec.router(openai_on(server, "slow", timeout=1))
        response = await router.request(REQUEST)
    assert response.text == "in time"
    assert rec.actions == [("openai:slow", 1, "retry")]


async def test_loopback_bad_request_is_not_retried() -> None:
    rec = Recorder()
    async with (
        OpenAICompatibleServer([Fault(status=400, message="bad")]) as first,
        OpenAICompatibleServer(["spare"]) as second,
    ):
        response = await rec.router(openai_on(first, "a"), openai_on(second, "b")).request(REQUEST)
    assert response.text == "spare"
    assert len(first.requests) == 1
    assert rec.actions == [("openai:a", 1, "fallback")]


async def test_loopback_stream_falls_back_before_the_first_chunk() -> None:
    rec = Recorder()
    async with (
        OpenAICompatibleServer([Fault(status=503)]) as first,
        OpenAICompatibleServer([Completion(text="streamed from b")]) as second,
    ):
        router = rec.router(openai_on(first, "a"), openai_on(second, "b"), retries=0)
        chunks = await _collect(router)
    assert "".join(c.text for c in chunks if isinstance(c, TextDelta)) == "streamed from b"
    assert isinstance(chunks[-1], ModelResponse) and chunks[-1].text == "streamed from b"
    assert second.requests[0].json["stream"] is True


async def test_loopback_stream_broken_after_the_first_chunk_surfaces() -> None:
    rec = Recorder()
    broken = Completion(text="Hello there, world", text_chunk_size=3, drop_after_events=2)
    async with OpenAICompatibleServer([broken]) as first, OpenAICompatibleServer(["spare"]) as second:
        router = rec.router(openai_on(first, "a"), openai_on(second, "b"))
        seen: list[str] = []
        with pytest.raises(ModelError):
            async for chunk in router.stream(REQUEST):
                if isinstance(chunk, TextDelta):
                    seen.append(chunk.text)
    assert seen and "".join(seen) != "Hello there, world"
    assert second.requests == []
    assert rec.actions == [("openai:a", 1, "give_up")]


async def test_loopback_agent_stream_shows_attempts_and_answers() -> None:
    sleeps: list[float] = []

    async def sleep(delay: float) -> None:
        sleeps.append(delay)

    async with (
        OpenAICompatibleServer([Fault(status=429, headers={"Retry-After": "1"}), Fault(status=500)]) as first,
        OpenAICompatibleServer([Completion(text="The answer is 42.")]) as second,
    ):
        router = RouterModel([openai_on(first, "a"), openai_on(second, "b")], retries=1, sleep=sleep)
        events = [e async for e in Agent(router).stream("question")]
    attempts = [(e.model, e.attempt, e.next_action, e.delay) for e in events if isinstance(e, ModelAttempt)]
    assert attempts == [("openai:a", 1, "retry", 1.0), ("openai:a", 2, "fallback", 0.0)]
    done = events[-1]
    assert done.type == "done" and done.result.output == "The answer is 42."
    assert "".join(e.text for e in events if e.type == "answer_delta") == "The answer is 42."
    assert sleeps == [1.0]


async def test_the_current_run_is_unset_after_the_run() -> None:
    from thinkloop._loop import current_run

    seen: list[object] = []

    def reply(request: ModelRequest) -> Reply:
        seen.append(current_run.get())
        return "done"

    result = await Agent(FunctionModel(reply)).run("q")
    assert seen[0] is not None and seen[0].state is result.state  # type: ignore[attr-defined]
    assert current_run.get() is None


# ------------------------------------------------------------------------------------ fault audit


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def _stream_run(agent: Agent, goal: str) -> tuple[list[Any], Any]:
    events = [e async for e in agent.stream(goal)]
    return events, events[-1].result


async def test_loopback_stream_cut_in_a_tool_calls_arguments_falls_back() -> None:
    """Nothing of a tool call is shown to the user, so a connection lost in the middle of its arguments
    is a failure before anything was delivered: the router falls back and the run goes on."""
    cut = Completion(
        tool_calls=[tool_call("add", {"a": 12, "b": 30})], arguments_chunk_size=2, drop_after_events=5
    )
    rec = Recorder()
    async with (
        OpenAICompatibleServer([cut], fallback="It is 42.") as first,  # the next turn: a recovered
        OpenAICompatibleServer([Completion(tool_calls=[tool_call("add", {"a": 12, "b": 30})])]) as second,
    ):
        router = RouterModel(
            [openai_on(first, "a"), openai_on(second, "b")],
            retries=0,
            sleep=rec.sleep,
            on_attempt=rec.attempts.append,
        )
        events, result = await _stream_run(Agent(router, tools=[add]), "12+30?")
        await router.aclose()
    assert (result.stop_reason, result.output, result.tool_calls) == (StopReason.FINAL_ANSWER, "It is 42.", 1)
    assert rec.actions == [("openai:a", 1, "fallback")]
    assert "lost in the middle of it" in rec.attempts[0].error
    assert "".join(e.text for e in events if e.type == "answer_delta") == "It is 42."
    assert [len(first.chat_requests), len(second.chat_requests)] == [2, 1]


class _BreaksInToolCall(FunctionModel):
    """A streaming model whose connection breaks in the middle of a tool call's arguments."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        self.requests.append(request)
        yield ToolCallDelta(index=0, id="c1", name="add", arguments_delta='{"a": 1')
        raise ModelRetryableError("connection lost mid-call", provider="test")


async def test_router_stream_holds_tool_call_deltas_until_the_reply_is_complete() -> None:
    rec = Recorder()
    spare = flaky({"text": "Adding.", "tool_calls": [{"name": "add", "args": {"a": 1, "b": 2}}]}, name="b")
    router = rec.router(_BreaksInToolCall(lambda r: "unused", name="a"), spare, retries=0)
    chunks = await _collect(router)
    assert [type(c).__name__ for c in chunks] == ["TextDelta", "ToolCallDelta", "ModelResponse"]
    assert all(getattr(c, "arguments_delta", "") != '{"a": 1' for c in chunks)  # nothing of a's call
    final = chunks[-1]
    assert isinstance(final, ModelResponse) and final.tool_calls[0].arguments == {"a": 1, "b": 2}
    assert rec.actions == [("test:a", 1, "fallback")]


async def test_loopback_partial_answer_then_drop_is_neither_repeated_nor_replaced() -> None:
    """Text already shown as `answer_delta` cannot be taken back: the run ends with an error saying the
    reply broke off; the spare is not asked (its answer would follow the shown text) and nothing repeats."""
    broken = Completion(text="The answer is forty-two.", text_chunk_size=5, drop_after_events=3)
    async with OpenAICompatibleServer([broken]) as first, OpenAICompatibleServer(["spare"]) as second:
        router = RouterModel([openai_on(first, "a"), openai_on(second, "b")], sleep=Recorder().sleep)
        events, result = await _stream_run(Agent(router), "question")
        await router.aclose()
    shown = "".join(e.text for e in events if e.type == "answer_delta")
    assert shown == "The answer"  # the two text chunks that came, once each
    assert result.stop_reason is StopReason.ERROR and result.output == ""
    assert "was lost in the middle of it, after 3 chunk(s)" in (result.error or "")
    assert second.requests == []
    assert [(e.model, e.next_action) for e in events if isinstance(e, ModelAttempt)] == [
        ("openai:a", "give_up")
    ]


async def test_loopback_stream_stalled_by_keepalives_falls_back_without_hanging() -> None:
    stalled = Completion(text="never finished", stall_after_events=0, keepalive_every=0.1)
    async with (
        OpenAICompatibleServer([stalled]) as first,
        OpenAICompatibleServer([Completion(text="From the spare.")]) as second,
    ):
        router = RouterModel(
            [openai_on(first, "a", timeout=0.3), openai_on(second, "b")], retries=0, sleep=Recorder().sleep
        )
        events, result = await asyncio.wait_for(_stream_run(Agent(router), "question"), 5)
        await router.aclose()
    assert result.output == "From the spare."
    attempts = [e for e in events if isinstance(e, ModelAttempt)]
    assert [(a.model, a.next_action) for a in attempts] == [("openai:a", "fallback")]
    assert "no event came" in attempts[0].error


@pytest.mark.parametrize(
    "fault",
    [Fault(400, "bad request"), Fault(401, "Incorrect API key"), Fault(404, "The model `a` does not exist")],
    ids=["400", "401", "404"],
)
async def test_loopback_non_retryable_errors_fall_back_without_a_retry(fault: Fault) -> None:
    rec = Recorder()
    async with OpenAICompatibleServer([fault, "never"]) as first, OpenAICompatibleServer(["spare"]) as second:
        router = rec.router(openai_on(first, "a"), openai_on(second, "b"), retries=3)
        assert (await router.request(REQUEST)).text == "spare"
        await router.aclose()
    assert len(first.requests) == 1 and rec.sleeps == []
    assert rec.actions == [("openai:a", 1, "fallback")]


async def test_every_member_failing_lists_each_and_says_what_to_do() -> None:
    async with (
        OpenAICompatibleServer([Fault(503, "overloaded")] * 2) as first,
        OpenAICompatibleServer([Fault(401, "Incorrect API key")]) as second,
        OpenAICompatibleServer([Fault(404, "The model `c` does not exist")]) as third,
    ):
        router = Recorder().router(
            openai_on(first, "a"), openai_on(second, "b"), openai_on(third, "c"), retries=1
        )
        result = await Agent(router).run("question")
        await router.aclose()
    error = result.error or ""
    assert result.stop_reason is StopReason.ERROR
    assert error.startswith("router: chat completion failed: all 3 models of the router failed: ")
    assert (
        "openai:a: openai: chat completion failed: HTTP 503 from model 'a': overloaded (after 2 attempt(s))"
        in error
    )
    assert (
        "openai:b: openai: chat completion failed: HTTP 401 from model 'b': Incorrect API key; check the API key"
        in error
    )
    assert (
        "openai:c: openai: chat completion failed: HTTP 404 from model 'c': The model `c` does not exist; check the model name"
        in error
    )
    assert error.endswith(
        "The last failure is not transient: fix what its error says to check (the API key, the model name, "
        "base_url, the request), or add another model"
    )


async def test_every_member_busy_says_to_try_again_later() -> None:
    router = Recorder().router(flaky(busy(), name="a"), flaky(busy(), name="b"), retries=0)
    with pytest.raises(ModelRetryableError) as caught:
        await router.request(REQUEST)
    assert str(caught.value).endswith(
        "The last failure is transient (overloaded, rate-limited or unreachable): try again later, raise retries "
        "or max_backoff to wait longer, or add a model from another provider"
    )


async def test_a_retry_after_longer_than_max_backoff_falls_back_at_once() -> None:
    rec = Recorder()
    first, spare = flaky(busy(retry_after=3600), "later", name="a"), flaky("from b", name="b")
    router = rec.router(first, spare, max_backoff=20)
    assert (await router.request(REQUEST)).text == "from b"
    assert rec.sleeps == [] and len(first.requests) == 1
    assert rec.actions == [("test:a", 1, "fallback")]


async def test_a_long_retry_after_is_waited_for_capped_when_no_other_member_can_answer() -> None:
    rec = Recorder()
    router = rec.router(
        flaky(busy(retry_after=3600), "ok", name="a"), flaky(busy(), name="b"), max_backoff=20
    )
    router.breakers[1].failure(rec.now)
    router.breakers[1].opened_at = rec.now  # b is known to be down
    assert (await router.request(REQUEST)).text == "ok"
    assert rec.sleeps == [20.0]
    alone = Recorder()
    assert (
        await alone.router(flaky(busy(retry_after=3600), "ok"), max_backoff=7).request(REQUEST)
    ).text == "ok"
    assert alone.sleeps == [7.0]


async def test_a_member_that_asked_to_wait_is_passed_over_until_then_while_another_can_answer() -> None:
    """A 429 saying `Retry-After: 3600`: the next requests go straight to the spare, without asking the
    rate-limited member again for another 429, until the hour is over."""
    rec = Recorder()
    limited, spare = flaky(busy(retry_after=3600), "back", name="a"), flaky("from b", name="b")
    router = rec.router(limited, spare, max_backoff=20, breaker_threshold=10)
    assert (await router.request(REQUEST)).text == "from b"
    rec.now += 60
    assert (await router.request(REQUEST)).text == "from b"
    assert len(limited.requests) == 1  # not asked again within its hour
    assert router.breakers[0].retry_in(rec.now) == 3540.0
    rec.now += 3540
    assert (await router.request(REQUEST)).text == "back"
    assert len(limited.requests) == 2 and router.breakers[0].held_until is None


async def test_a_member_that_asked_to_wait_is_still_asked_when_nobody_else_can_answer() -> None:
    rec = Recorder()
    limited = flaky(busy(retry_after=3600), "ok", name="a")
    router = rec.router(limited, flaky(bad_request(), name="b"), max_backoff=20, breaker_threshold=1)
    with pytest.raises(ModelError):
        await router.request(REQUEST)  # a: 429 for an hour, b: 400 — both breakers open
    assert router.breakers[0].state(rec.now + 60) == "open"  # the hour, not the 30 s cooldown
    assert router.breakers[0].state(rec.now + 3600) == "half_open"
    rec.now += 3600
    assert (await router.request(REQUEST)).text == "ok"
    alone = Recorder()
    single = alone.router(flaky(busy(retry_after=3600), "ok"), max_backoff=7, breaker_threshold=10)
    assert (await single.request(REQUEST)).text == "ok"  # the only member: waited for, capped
    assert alone.sleeps == [7.0]


def test_a_breaker_opened_by_a_long_retry_after_stays_open_that_long_and_says_so() -> None:
    breaker = CircuitBreaker(threshold=1, cooldown=30)
    breaker.failure(0.0, retry_after=120.0)
    assert breaker.state(31.0) == "open" and breaker.retry_in(31.0) == 89.0
    assert breaker.state(120.0) == "half_open"
    short = CircuitBreaker(threshold=1, cooldown=30)
    short.failure(0.0, retry_after=1.0)
    assert short.retry_in(0.0) == 30.0  # the cooldown when it is longer
    unset = CircuitBreaker(threshold=3, cooldown=30)
    unset.failure(0.0, retry_after=float("nan"))
    assert unset.held_until is None and unset.retry_in(0.0) == 0.0


def test_a_retry_after_that_is_not_a_number_uses_the_backoff() -> None:
    router = RouterModel([ScriptedModel([])], backoff=0.5, jitter=False)
    assert router.delay(1, float("nan")) == 0.5
    assert router.delay(1, float("inf")) == router.max_backoff


async def test_a_member_slower_than_the_router_timeout_is_retried_then_replaced() -> None:
    calls = 0

    async def slow(request: ModelRequest) -> Reply:
        nonlocal calls
        calls += 1
        await asyncio.sleep(3600)
        return "never"

    rec = Recorder()
    router = rec.router(
        FunctionModel(slow, name="slow"), flaky("quick", name="quick"), retries=1, timeout=0.05
    )
    started = asyncio.get_running_loop().time()
    assert (await router.request(REQUEST)).text == "quick"
    assert asyncio.get_running_loop().time() - started < 1
    assert calls == 2 and rec.actions == [("test:slow", 1, "retry"), ("test:slow", 2, "fallback")]
    assert "no answer within the router's timeout of 0.05 s" in rec.attempts[0].error


async def test_a_stream_silent_past_the_router_timeout_falls_back() -> None:
    class Silent(FunctionModel):
        async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
            await asyncio.sleep(3600)
            yield TextDelta(text="never")

    rec = Recorder()
    router = rec.router(
        Silent(lambda r: "x", name="silent"), flaky("Hello", name="b"), retries=0, timeout=0.05
    )
    chunks = await asyncio.wait_for(_collect(router), 2)
    assert "".join(c.text for c in chunks if isinstance(c, TextDelta)) == "Hello"
    assert rec.actions == [("test:silent", 1, "fallback")]


async def test_the_router_timeout_is_not_confused_with_the_members_own() -> None:
    """A member's own TimeoutError (its asyncio.wait_for, a socket timeout) is that member's transient
    failure: retried, then fallen back from — not the router's timeout, and not the run's deadline."""

    def raises(request: ModelRequest) -> Reply:
        raise TimeoutError("the member's own")

    rec = Recorder()
    router = rec.router(FunctionModel(raises, name="a"), flaky("spare", name="b"), timeout=5, retries=1)
    response = await router.request(REQUEST)
    assert response.text == "spare"
    assert rec.actions == [("test:a", 1, "retry"), ("test:a", 2, "fallback")]
    assert "the model call timed out (TimeoutError: the member's own)" in rec.attempts[0].error
    assert "router's timeout" not in rec.attempts[0].error

    alone = Recorder().router(FunctionModel(raises), timeout=5, retries=0)
    with pytest.raises(ModelRetryableError, match=r"timed out \(TimeoutError: the member's own\)") as caught:
        await alone.request(REQUEST)
    assert caught.value.retried


@pytest.mark.parametrize("stream", [False, True])
async def test_a_member_raising_an_exception_of_its_own_is_fallen_back_from_and_counted(stream: bool) -> None:
    """A member of the user's making that raises a plain exception (a bug, a KeyError from a parsed reply)
    is that member's failure: the router falls back to the next one, reports the attempt, and the member's
    breaker counts it — so later requests skip it once the breaker opens."""

    def broken(request: ModelRequest) -> Reply:
        raise KeyError("choices")

    rec = Recorder()
    router = rec.router(
        FunctionModel(broken, name="broken"), flaky("spare", name="b"), retries=0, breaker_threshold=2
    )
    for _ in range(3):
        if stream:
            chunks = await _collect(router)
            assert "".join(c.text for c in chunks if isinstance(c, TextDelta)) == "spare"
        else:
            assert (await router.request(REQUEST)).text == "spare"
    assert rec.actions == [("test:broken", 1, "fallback"), ("test:broken", 1, "fallback")]  # then skipped
    assert "the model raised KeyError: 'choices'" in rec.attempts[0].error
    assert router.breakers[0].state(rec.now) == "open"


async def test_a_members_exception_after_text_was_streamed_surfaces_as_a_model_error() -> None:
    class Breaks(FunctionModel):
        async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
            yield TextDelta(text="Hel")
            raise RuntimeError("socket gone")

    rec = Recorder()
    router = rec.router(Breaks(lambda r: "x", name="a"), flaky("spare", name="b"), retries=0)
    with pytest.raises(ModelError, match="the model raised RuntimeError: socket gone"):
        await _collect(router)
    assert rec.actions == [("test:a", 1, "give_up")]


def test_a_timeout_that_is_not_positive_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="timeout must be None or a number of seconds > 0, not 0"):
        RouterModel([ScriptedModel([])], timeout=0)


async def test_the_runs_deadline_ends_a_backoff_wait_at_once() -> None:
    """A provider asking for a 20 s wait must not hold a run whose timeout is 1 s: the deadline cancels the
    router's (real) backoff sleep, and the run stops on its timeout with the attempt recorded."""
    from thinkloop import Budget

    async with OpenAICompatibleServer(["warm", Fault(429, headers={"Retry-After": "20"})]) as server:
        router = RouterModel([openai_on(server, "a")], max_backoff=20)
        await router.request(REQUEST)  # the client is made (and openai imported) before the clock starts
        started = asyncio.get_running_loop().time()
        events, result = await asyncio.wait_for(  # 1 s: the 429 must come back before the deadline
            _stream_run(Agent(router, budget=Budget(timeout=1)), "q"), 15
        )
        await router.aclose()
    assert asyncio.get_running_loop().time() - started < 10  # not after the 20 s backoff
    assert result.stop_reason is StopReason.TIMEOUT
    assert [(e.next_action, e.delay) for e in events if isinstance(e, ModelAttempt)] == [("retry", 20.0)]
    assert len(server.chat_requests) == 2


async def test_a_react_stream_cut_before_its_final_answer_is_retried_by_the_loop_behind_a_router() -> None:
    """In ReAct, a reply's tokens reach the user only after `Final Answer:`: a stream cut before that showed
    nothing, so the loop tries again even behind a router (which cannot fall back once tokens flowed)."""
    answer = "Thought: I know it.\nFinal Answer: Paris is the capital of France."
    async with OpenAICompatibleServer(
        [Completion(text=answer, drop_after_bytes=700), answer], models=["small"]
    ) as server:
        member = OpenAIModel(
            "small", base_url=server.url, api_key="k", max_retries=0, capabilities={"tools": False}
        )
        router = RouterModel([member], retries=0)
        events: list[Any] = []
        async for event in Agent(router, mode="react").stream("What is the capital of France?"):
            events.append(event)
        result = events[-1].result
        assert result.stop_reason is StopReason.FINAL_ANSWER, result.error
        assert result.output == "Paris is the capital of France."
        assert "".join(e.text for e in events if e.type == "answer_delta") == result.output  # shown once
        assert len(server.chat_requests) == 2
        await member.aclose()


# -------------------------------------------------------------- a member's stream without its response


class _EndsWithoutResponse(FunctionModel):
    """A streaming model whose stream ends (cleanly) before its final `ModelResponse`, after `chunks`."""

    def __init__(self, *chunks: StreamChunk, name: str) -> None:
        super().__init__(lambda r: "unused", name=name)
        self.chunks = list(chunks)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        self.requests.append(request)
        for chunk in self.chunks:
            yield chunk


@pytest.mark.parametrize(
    "chunks",
    [(), (ToolCallDelta(index=0, id="c1", name="add", arguments_delta='{"a": 1'),)],
    ids=["nothing", "half-a-tool-call"],
)
async def test_a_stream_that_ends_without_its_response_is_retried_then_falls_back(
    chunks: tuple[StreamChunk, ...],
) -> None:
    rec = Recorder()
    cut = _EndsWithoutResponse(*chunks, name="cut")
    router = rec.router(cut, flaky("From b.", name="b"), retries=1)
    got = await _collect(router)
    assert "".join(c.text for c in got if isinstance(c, TextDelta)) == "From b."
    assert not any(isinstance(c, ToolCallDelta) and c.name == "add" for c in got)  # nothing of the cut call
    assert isinstance(got[-1], ModelResponse) and got[-1].model_name == "b"
    assert rec.actions == [("test:cut", 1, "retry"), ("test:cut", 2, "fallback")]
    assert "the stream of test:cut ended without its final response" in rec.attempts[0].error
    assert len(cut.requests) == 2


async def test_a_probe_whose_stream_ends_without_its_response_does_not_keep_the_member_skipped() -> None:
    """The half-open probe slot was never given back: the member was skipped for good, 'circuit open for
    0.0 s more'."""
    rec = Recorder()
    cut = _EndsWithoutResponse(name="cut")
    router = rec.router(cut, flaky("spare", name="spare"), retries=0, breaker_threshold=1, breaker_cooldown=5)
    router.breakers[0].failure(rec.now)
    rec.now += 6  # half-open: the next request probes `cut`
    await _collect(router)
    assert len(cut.requests) == 1 and router.breakers[0].state(rec.now) == "open"  # the probe failed
    rec.now += 6
    await _collect(router)
    assert len(cut.requests) == 2  # probed again after the next cooldown


async def test_a_stream_ending_without_its_response_after_text_was_shown_surfaces() -> None:
    rec = Recorder()
    cut = _EndsWithoutResponse(TextDelta(text="The answer is"), name="cut")
    spare = flaky("spare", name="spare")
    router = rec.router(cut, spare)
    seen: list[StreamChunk] = []
    with pytest.raises(ModelRetryableError, match="ended without its final response, after 1 chunk"):
        async for chunk in router.stream(REQUEST):
            seen.append(chunk)
    assert seen == [TextDelta(text="The answer is")] and spare.requests == []
    assert rec.actions == [("test:cut", 1, "give_up")] and router.breakers[0].failures == 1


# --------------------------------------------------------------------------------- a router of routers


async def test_an_inner_router_that_failed_is_not_retried_by_the_outer_one() -> None:
    """An inner router has retried its own members already: retrying it multiplied the attempts and the
    waits (3 x 3 per member, with the defaults) and found its breakers open."""
    rec = Recorder()
    a, b = flaky(busy(), name="a"), flaky(busy(), name="b")
    inner = rec.router(a, b, retries=2, breaker_threshold=100)
    outer = rec.router(inner, flaky("from c", name="c"), retries=2)
    assert (await outer.request(REQUEST)).text == "from c"
    assert len(a.requests) == 3 and len(b.requests) == 3
    assert rec.sleeps == [0.5, 1.0, 0.5, 1.0]  # the inner router's backoff only
    assert rec.actions[-1] == ("router:test:a,test:b", 1, "fallback")


async def test_an_inner_router_alone_is_not_retried_either() -> None:
    rec = Recorder()
    a = flaky(busy(), name="a")
    outer = rec.router(rec.router(a, retries=1, breaker_threshold=100), retries=3)
    with pytest.raises(ModelRetryableError, match="all 1 models of the router failed: router:test:a: "):
        await outer.request(REQUEST)
    assert len(a.requests) == 2 and rec.sleeps == [0.5]


async def test_a_run_does_not_retry_a_router_again_even_behind_a_model_wrapping_it() -> None:
    """A user's wrapper (logging, caching …) around a router: the router's error says it was retried
    already, so the loop's own `model_retries` do not multiply its attempts and waits."""
    from thinkloop.models import Model

    class Logged(Model):
        def __init__(self, inner: Model) -> None:
            self.inner, self.provider, self.name = inner, "logged", inner.name
            self.capabilities = inner.capabilities

        async def request(self, request: ModelRequest) -> ModelResponse:
            return await self.inner.request(request)

    rec = Recorder()
    a = flaky(busy(), name="a")
    router = rec.router(a, retries=2, breaker_threshold=100)
    result = await Agent(Logged(router), model_retries=3).run("q")
    assert result.stop_reason is StopReason.ERROR
    assert "all 1 models of the router failed" in (result.error or "")
    assert len(a.requests) == 3 and rec.sleeps == [0.5, 1.0]  # the router's tries only, not 4 x 3
    plain = flaky(busy(retry_after=0.001), "ok", name="p")  # a model of the user's own: retried by the loop
    assert (await Agent(Logged(plain), model_retries=3).run("q")).output == "ok"
    assert len(plain.requests) == 2


async def test_tokens_of_an_inner_routers_failed_attempts_are_charged_once() -> None:
    error = busy()
    error.usage = Usage(input_tokens=100, output_tokens=7, requests=1)  # type: ignore[attr-defined]
    rec = Recorder()
    inner = rec.router(flaky(error, name="a"), retries=1)  # two failed attempts of 107 tokens
    reply = ModelResponse(text="done", usage=Usage(input_tokens=50, output_tokens=5, requests=1))
    outer = rec.router(inner, flaky(reply, name="b"))
    response = await outer.request(REQUEST)
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.requests) == (250, 19, 1)


# ------------------------------------------------------------------------ Retry-After that is no time


@pytest.mark.parametrize(
    ("given", "kept"),
    [(2.5, 2.5), (0.0, 0.0), (-3.0, 0.0), (float("nan"), None), (float("inf"), None), (None, None)],
)
def test_a_retry_after_that_is_no_wait_is_none_or_zero(given: float | None, kept: float | None) -> None:
    assert ModelRetryableError("busy", provider="test", retry_after=given).retry_after == kept


async def test_a_models_nan_retry_after_does_not_corrupt_the_stored_run(tmp_path: Path) -> None:
    """A model of the user's making said retry_after=nan: the agent's `model_attempt` event had delay NaN,
    stored as null, and the run's event log could not be read again ('its event 3 is corrupt')."""
    from thinkloop.stores import open_store

    replies: list[BaseException | Reply] = [
        ModelRetryableError("busy", provider="test", retry_after=float("nan")),
        ModelRetryableError("busy", provider="test", retry_after=-3),
        "done",
    ]
    store = open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    result = await Agent(flaky(*replies), store=store).run("q")
    assert result.output == "done"
    events = await store.read_events(result.state.run_id)
    assert [e.delay for e in events if isinstance(e, ModelAttempt)] == [1.0, 0.0]  # the backoff, then at once


# ------------------------------------------------------------------------------------------ a 429 storm


async def test_a_429_storm_is_waited_out_a_bounded_time_then_failed_fast_until_the_breakers_close() -> None:
    """Every request of both servers is rate-limited: each member is asked `retries + 1` times with the
    provider's Retry-After between, the run ends naming both, and the next run within the cooldown fails at
    once without a request, saying when to come back — no request storm, no unbounded wait."""
    storm = Fault(429, "Rate limit reached", headers={"Retry-After": "1"})
    rec = Recorder()
    async with (
        OpenAICompatibleServer(fallback=storm) as first,
        OpenAICompatibleServer(fallback=storm) as second,
    ):
        router = rec.router(openai_on(first, "a"), openai_on(second, "b"), retries=2, breaker_cooldown=30)
        result = await Agent(router).run("question")
        assert (len(first.chat_requests), len(second.chat_requests)) == (3, 3)
        assert rec.sleeps == [1.0, 1.0, 1.0, 1.0]  # Retry-After, twice a member: 4 s in all
        assert result.stop_reason is StopReason.ERROR
        assert "openai:a: " in (result.error or "") and "openai:b: " in (result.error or "")
        rec.now += 10
        again = await Agent(router).run("question")
        assert (len(first.chat_requests), len(second.chat_requests)) == (3, 3)  # not asked
        assert "skipped, circuit open for 20.0 s more" in (again.error or "")
        await router.aclose()


async def test_tokens_a_failed_member_consumed_are_charged_once_through_a_streamed_run() -> None:
    error = busy()
    error.usage = Usage(input_tokens=100, output_tokens=7, requests=1)
    reply = ModelResponse(text="The answer.", usage=Usage(input_tokens=50, output_tokens=5, requests=1))
    router = Recorder().router(flaky(error, name="a"), flaky(reply, name="b"), retries=0)
    events = [e async for e in Agent(router).stream("q")]
    usage = events[-1].result.usage
    assert (usage.input_tokens, usage.output_tokens, usage.requests) == (150, 12, 1)
    called = [e for e in events if e.type == "model_call"]
    assert [(c.input_tokens, c.output_tokens) for c in called] == [(150, 12)]


async def test_tokens_of_a_model_call_that_failed_for_good_are_in_the_runs_usage() -> None:
    """Every member failed: the router's error carries what they consumed; the run's usage counts it."""
    error = busy()
    error.usage = Usage(input_tokens=100, output_tokens=7, requests=1)
    router = Recorder().router(flaky(error, name="a"), retries=0)
    result = await Agent(router, model_retries=0).run("q")
    assert result.stop_reason is StopReason.ERROR
    assert (result.usage.input_tokens, result.usage.output_tokens) == (100, 7)


async def test_a_run_cancelled_in_a_real_backoff_leaves_no_task_behind() -> None:
    waiting = asyncio.Event()

    async def sleep(delay: float) -> None:  # asyncio's own sleep, told about
        waiting.set()
        await asyncio.sleep(delay)

    async with OpenAICompatibleServer(fallback=Fault(503, headers={"Retry-After": "3600"})) as server:
        router = RouterModel([openai_on(server, "a")], max_backoff=3600, sleep=sleep)
        run = asyncio.create_task(Agent(router).run("q"))
        await waiting.wait()  # the first request failed: the router waits an hour
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        left = [t for t in asyncio.all_tasks() if t.get_coro().__name__ != "_serve_connection"]
        assert left == [asyncio.current_task()]
        assert len(server.chat_requests) == 1
        await router.aclose()


# ------------------------------------------------------------------- members that learn they lack tools


async def test_a_router_whose_members_turned_out_to_lack_tools_starts_the_next_run_in_react() -> None:
    """The OpenAI adapter marks a model that refused tools as without them; the router's capabilities were
    computed once, so the agent's second run started native again and failed: 'none of the models supports
    native tool calling: use mode='react''."""
    from test_openai_unsupported import OLLAMA, without_tools
    from thinkloop.tools import calculator

    async with OpenAICompatibleServer() as plain:
        plain.fallback = without_tools(OLLAMA)
        members = [OpenAIModel(n, base_url=plain.url, api_key="k") for n in ("small", "small2")]
        router = RouterModel(members, sleep=Recorder().sleep)
        agent = Agent(router, tools=[calculator])
        assert router.capabilities.tools
        first = await agent.run("What is 17*23?")
        assert (first.output, first.state.mode) == ("391", "react")
        assert not router.capabilities.tools  # what the members learnt
        refused = len(plain.chat_requests)
        second = await agent.run("What is 17*23?")
        assert (second.stop_reason, second.output, second.state.mode) == (
            StopReason.FINAL_ANSWER,
            "391",
            "react",
        )
        assert all(
            "tools" not in body for body in plain.chat_requests[refused:]
        )  # no refusal asked for again
        await router.aclose()


async def test_a_tool_request_no_member_can_take_is_a_tools_unsupported_error_the_loop_recovers_from() -> (
    None
):
    from thinkloop import ToolsUnsupportedError

    router = RouterModel([ScriptedModel(["a"], tools=False)])
    with pytest.raises(ToolsUnsupportedError, match="none of the models .* supports native tool calling"):
        await router.request(TOOL_REQUEST)
    replies = ['Thought: add\nAction: add_numbers\nAction Input: {"a": 2, "b": 3}', "Final Answer: 5"]
    result = await Agent(
        RouterModel([ScriptedModel(replies, tools=False)]), tools=[add_numbers], mode="native"
    ).run("2+3?")
    assert (result.output, result.state.mode) == ("5", "react")


async def test_a_tool_less_fallback_answers_a_tool_run_when_the_native_members_fail() -> None:
    """An API model first and the local model (no native tool calling) as its fallback: every tool request
    skipped the local model, so when the API failed the run ended with its error, the fallback never asked."""
    from thinkloop import ToolsUnsupportedError

    replies = ['Thought: add\nAction: add_numbers\nAction Input: {"a": 2, "b": 3}', "Final Answer: 5"]
    local = ScriptedModel(replies, tools=False, name="local")
    router = RouterModel([flaky(busy(), name="api"), local], retries=0)
    with pytest.raises(ToolsUnsupportedError, match="test:local: skipped, no native tool calling"):
        await router.request(TOOL_REQUEST)  # the loop's cue to go on in ReAct
    result = await Agent(router, tools=[add_numbers], model_retries=0).run("2+3?")
    assert (result.stop_reason, result.output, result.state.mode) == (StopReason.FINAL_ANSWER, "5", "react")
    assert [r.tools for r in local.requests] == [[], []]  # asked in ReAct, with the tools in the prompt


@tool
def add_numbers(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


# ------------------------------------------------------------------------------- a misconfigured member


async def test_a_misconfigured_member_after_failures_says_what_failed_before_it() -> None:
    """A ConfigurationError (the local model without llama-cpp-python, say) ends the request as the
    developer's mistake it is — but said alone, it hid that the members before it had failed."""

    def unconfigured(request: ModelRequest) -> Reply:
        raise ConfigurationError("the local model needs llama-cpp-python: pip install 'thinkloop[local]'")

    rec = Recorder()
    router = rec.router(flaky(busy(), name="a"), FunctionModel(unconfigured, name="local"), retries=0)
    with pytest.raises(ConfigurationError) as info:
        await router.request(REQUEST)
    assert str(info.value) == (
        "the local model needs llama-cpp-python: pip install 'thinkloop[local]' (the router asked test:local "
        "after test:a: test: model request failed: HTTP 503 busy (after 1 attempt(s)))"
    )
    alone = rec.router(FunctionModel(unconfigured, name="local"))
    with pytest.raises(ConfigurationError) as info:
        await alone.request(REQUEST)
    assert str(info.value) == "the local model needs llama-cpp-python: pip install 'thinkloop[local]'"


@pytest.mark.parametrize("reply", [None, "a plain string", {"text": "a dict"}])
async def test_a_member_answering_something_other_than_a_response_is_fallen_back_from(reply: Any) -> None:
    # The router passed it on as a success (closing the member's breaker) and crashed reading it.
    from thinkloop.models._base import Model, ModelCapabilities

    class Broken(Model):
        provider = "custom"
        name = "broken"
        capabilities = ModelCapabilities(tools=True, streaming=False)

        async def request(self, request: ModelRequest) -> Any:
            return reply

    router = RouterModel([Broken(), ScriptedModel(["good answer"], name="good")], retries=0, jitter=False)
    result = await Agent(router).run("hi")
    assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "good answer")
    assert router.breakers[0].failures == 1
