"""`RouterModel` (SPEC §2.4): several models behind one `Model`, with retries, fallback and breakers.

For each request the router walks its members in order:

1. Members that cannot serve the request are left out: a request with native `tools` only goes to
   members whose capabilities say `tools`.
2. A member whose circuit breaker is open (it failed `breaker_threshold` times in a row, less than
   `breaker_cooldown` seconds ago) is skipped. After the cooldown one request probes it (half-open):
   success closes the breaker, failure opens it again.
3. A `ModelRetryableError` (429, 5xx, timeout, lost connection, no answer within the router's `timeout`)
   is retried on the same member after an exponential backoff with jitter, or after the provider's
   `Retry-After` (capped at `max_backoff`), up to `retries` times — unless the provider asked for a longer
   wait than `max_backoff` and a later member can be asked now: then the request falls back at once.
   A member that is itself a router is never retried (it retried its own members). Any other
   `ModelError` goes straight to the next member.
4. A `ContextOverflowError` (the prompt does not fit the member's window) is not a failure of the member:
   it is not retried and does not count against its breaker. By default (`overflow_fallback="larger"`) the
   request goes on to the next member whose declared `context_window` is larger than the window that
   overflowed; members with a smaller or unknown window are skipped. If none answers, the router raises
   a `ContextOverflowError` with the first member's numbers, and the loop shrinks the run's context.
5. When every member has failed, the last error is raised with a message listing each member's failure
   and what to do, and the tokens the failed attempts consumed as its `usage`.

When streaming, text is delivered as it comes and a member's tool-call deltas with its complete reply, so
a failure in the middle of a tool call falls back unseen; a failure after text was delivered surfaces. A
stream that ends without its final response is such a failure (a `ModelRetryableError`).

`asyncio.CancelledError` (and the run's deadline) always pass through: nothing is retried after them.
Each failed attempt is reported as a `ModelAttempt` event of the current run and to `on_attempt`.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from .._errors import (
    ConfigurationError,
    ContextOverflowError,
    DeadlineExceeded,
    ModelError,
    ModelRetryableError,
    ToolsUnsupportedError,
    UserError,
    as_model_error,
)
from .._events import ModelAttempt
from .._messages import Message, ModelRequest, ModelResponse, StreamChunk, ToolCallDelta, Usage
from ._base import Model, ModelCapabilities, bad_response, estimated_usage

NextAction = Literal["retry", "fallback", "give_up"]
OverflowFallback = Literal["larger", "any", "never"]
AttemptHook = Callable[[ModelAttempt], None]
Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]
_T = TypeVar("_T")


@dataclass(slots=True)
class CircuitBreaker:
    """Consecutive failures of one member; open for `cooldown` s after `threshold` of them.

    States: closed (requests go through), open (requests are skipped), half-open (the cooldown is over:
    one probe request goes through; its success closes the breaker, its failure opens it again).

    A provider's `Retry-After` is kept as `held_until`: an open breaker stays open until then if that is
    later than the cooldown, and a request passes over a member that asked to wait while a later member can
    answer (`held`) — rather than earn another 429 from it.
    """

    threshold: int
    cooldown: float
    failures: int = 0
    opened_at: float | None = None
    probing: bool = False
    held_until: float | None = None

    def state(self, now: float) -> Literal["closed", "open", "half_open"]:
        if self.opened_at is None:
            return "closed"
        return "half_open" if now >= self._reopens_at(self.opened_at) else "open"

    def _reopens_at(self, opened_at: float) -> float:
        reopens = opened_at + self.cooldown
        return reopens if self.held_until is None else max(reopens, self.held_until)

    def held(self, now: float) -> bool:
        """Did the member ask (`Retry-After`) not to be called again before a time still to come?"""
        return self.held_until is not None and now < self.held_until

    def allow(self, now: float) -> bool:
        """May a request go to this member now? In half-open, only one probe at a time."""
        state = self.state(now)
        if state == "closed":
            return True
        if state == "open" or self.probing:
            return False
        self.probing = True
        return True

    def retry_in(self, now: float) -> float:
        """Seconds until the member may be asked again: the rest of the cooldown, or of its `Retry-After`."""
        if self.opened_at is not None:
            return max(self._reopens_at(self.opened_at) - now, 0.0)
        return 0.0 if self.held_until is None else max(self.held_until - now, 0.0)

    def success(self) -> None:
        self.failures, self.opened_at, self.probing, self.held_until = 0, None, False, None

    def failure(self, now: float, retry_after: float | None = None) -> None:
        self.failures += 1
        if retry_after is not None and 0 < retry_after < math.inf:  # NaN compares false: not a wait
            self.held_until = max(self.held_until or now, now + retry_after)
        if self.probing or self.failures >= self.threshold:
            self.opened_at = now
        self.probing = False

    def release(self) -> None:
        """The probe ended without a verdict (cancelled): let another request probe."""
        self.probing = False


@dataclass
class _Attempt:
    """The bookkeeping of one routed request: which member is tried, and what failed so far."""

    router: RouterModel
    candidates: list[int]
    skipped: list[str]
    index: int = 0
    attempt: int = 1
    failures: list[str] = field(default_factory=list)
    last_error: ModelError | None = None
    spent: Usage = field(default_factory=Usage)
    current: int | None = None
    overflow: ContextOverflowError | None = None  # the first member's "prompt too long"
    no_tools: bool = False  # a member refused the tool definitions (the loop can go on in ReAct)

    def next_member(self) -> Model | None:
        """The member to try now, skipping those whose breaker is open; None when all are used up."""
        router = self.router
        while self.index < len(self.candidates):
            slot = self.candidates[self.index]
            breaker = router.breakers[slot]
            now = router.clock()
            member = router.models[slot].spec
            if self.attempt == 1 and breaker.held(now) and self._can_fall_back():  # not a retry it waited for
                wait = breaker.retry_in(now)
                self.failures.append(f"{member}: skipped, it asked (Retry-After) to wait {wait:.1f} s more")
            elif breaker.allow(now):
                self.current = slot
                return router.models[slot]
            else:
                self.failures.append(
                    f"{member}: skipped, circuit open for {breaker.retry_in(now):.1f} s more"
                )
            self.index, self.attempt = self.index + 1, 1
        self.current = None
        return None

    async def failed(self, member: Model, exc: ModelError) -> None:
        """Record a failed attempt, then wait to retry the member or move on to the next one."""
        router = self.router
        breaker = router.breakers[self.candidates[self.index]]
        if isinstance(exc, ContextOverflowError | ToolsUnsupportedError):
            breaker.release()  # the member answered: the request did not suit it, the member is not unwell
            if isinstance(exc, ContextOverflowError):
                self.overflow = self.overflow or exc
            else:
                self.no_tools = True
        else:
            breaker.failure(router.clock(), exc.retry_after)
        self.last_error = exc
        self.spent.add(_spent_usage(exc))
        action, delay = self._next_action(exc, breaker)
        router.report(
            ModelAttempt(
                model=member.spec, attempt=self.attempt, error=str(exc), next_action=action, delay=delay
            )
        )
        if action == "retry":
            self.attempt += 1
            await router.sleep(delay)
            return
        self.failures.append(f"{member.spec}: {exc} (after {self.attempt} attempt(s))")
        self.index, self.attempt = self.index + 1, 1
        if isinstance(exc, ContextOverflowError):
            self._skip_smaller_windows(exc, member)

    def _fits(self, slot: int, exc: ContextOverflowError, member: Model) -> bool:
        """Whether member `slot` may take a prompt that overflowed `member` (see `overflow_fallback`)."""
        policy = self.router.overflow_fallback
        if policy != "larger":
            return policy == "any"
        window = self.router.models[slot].capabilities.context_window
        needed = exc.limit or member.capabilities.context_window
        return window is not None and (needed is None or window > needed)

    def _skip_smaller_windows(self, exc: ContextOverflowError, member: Model) -> None:
        while self.index < len(self.candidates) and not self._fits(self.candidates[self.index], exc, member):
            skipped = self.router.models[self.candidates[self.index]]
            window = skipped.capabilities.context_window
            size = f"{window:,} tokens" if window else "unknown"
            self.failures.append(f"{skipped.spec}: skipped, its context window ({size}) is not larger")
            self.index += 1

    def _next_action(self, exc: ModelError, breaker: CircuitBreaker) -> tuple[NextAction, float]:
        router = self.router
        if isinstance(exc, ContextOverflowError):  # never retried: the same prompt would not fit again
            later = self.candidates[self.index + 1 :]
            member = router.models[self.candidates[self.index]]
            fits = any(self._fits(slot, exc, member) for slot in later)
            return ("fallback" if fits else "give_up"), 0.0
        member = router.models[self.candidates[self.index]]
        retry = (
            isinstance(exc, ModelRetryableError)
            and not exc.retried  # an inner router retried its own members: not again, multiplied
            and self.attempt <= router.retries
            and breaker.state(router.clock()) == "closed"
        )
        if retry and not (_longer_than(exc.retry_after, router.max_backoff) and self._can_fall_back()):
            return "retry", router.delay(self.attempt, exc.retry_after)
        return ("fallback" if self.index + 1 < len(self.candidates) else "give_up"), 0.0

    def _can_fall_back(self) -> bool:
        """Whether a later member can be asked now (its breaker is not open, it did not ask to wait)."""
        now = self.router.clock()
        later = [self.router.breakers[slot] for slot in self.candidates[self.index + 1 :]]
        return any(b.state(now) != "open" and not b.held(now) for b in later)

    def succeeded(self, response: ModelResponse, member: Model, request: ModelRequest) -> ModelResponse:
        """Close the member's breaker; charge tokens that failed attempts consumed to the response."""
        self.router.breakers[self.candidates[self.index]].success()
        update: dict[str, object] = {}
        if not response.model_name:
            update["model_name"] = member.name
        if self.spent.total_tokens or self.spent.cost:
            usage = response.usage if response.usage.requests else estimated_usage(request, response)
            usage = usage.copy()
            usage.add(self.spent)
            update["usage"] = usage
        return response.model_copy(update=update) if update else response

    def release(self) -> None:
        if self.current is not None:
            self.router.breakers[self.current].release()

    def misconfigured(self, member: Model, exc: UserError) -> UserError | None:
        """A member's usage error (the developer's to fix: not a failure to fall back from) saying what failed
        before it — else it looked as though the router had chosen that member first; None: raise it as is."""
        if not self.failures or type(exc) not in (UserError, ConfigurationError):
            return None
        return type(exc)(f"{exc} (the router asked {member.spec} after {'; '.join(self.failures)})")

    def exhausted(self) -> ModelError:
        """The error raised when no member answered: the last one, saying what happened to each."""
        lines = "; ".join([*self.failures, *self.skipped]) or "no member could be tried"
        message = f"all {len(self.router.models)} models of the router failed: {lines}"
        last = self.last_error
        if last is None and self.skipped:  # the tool-less fallbacks can still answer, in text ReAct
            return self._charged(ToolsUnsupportedError(message, provider="router"))
        if last is None:
            unasked = ModelRetryableError(
                f"{message}. Try again later or add another model to the router.",
                provider="router",
                retry_after=self._soonest_retry(),
            )
            unasked.retried = True
            return unasked
        if self.overflow is not None:  # the loop shrinks the context to the first member's window
            first = self.overflow
            overflow = ContextOverflowError(
                message,
                provider="router",
                scope=first.scope,
                status_code=first.status_code,
                limit=first.limit,
                prompt_tokens=first.prompt_tokens,
                completion_tokens=first.completion_tokens,
            )
            overflow.__cause__ = first
            return self._charged(overflow)
        cls = type(last) if isinstance(last, ModelRetryableError) else ModelError
        if isinstance(last, ModelRetryableError):
            message += (
                ". The last failure is transient (overloaded, rate-limited or unreachable): try again later, "
                "raise retries or max_backoff to wait longer, or add a model from another provider"
            )
        else:
            message += (
                ". The last failure is not transient: fix what its error says to check (the API key, the model "
                "name, base_url, the request), or add another model"
            )
        if self.no_tools or self.skipped:  # the loop switches the run to ReAct and asks the members again,
            cls = ToolsUnsupportedError  # without tools: a tool-less fallback (the local model) takes it then
        error = cls(
            message,
            provider="router",
            scope=last.scope,
            status_code=last.status_code,
            retry_after=last.retry_after,
        )
        error.__cause__ = last
        error.retried = True
        return self._charged(error)

    def _charged(self, error: ModelError) -> ModelError:
        """`error` carrying the tokens the failed attempts consumed (an outer router charges them)."""
        if self.spent.total_tokens or self.spent.cost:
            error.usage = self.spent.copy()
        return error

    def _soonest_retry(self) -> float | None:
        now = self.router.clock()
        waits = [self.router.breakers[i].retry_in(now) for i in self.candidates]
        return min(waits) if waits else None


def _spent_usage(exc: ModelError) -> Usage:
    """Tokens a failed attempt consumed, when the adapter attached them to the error as `usage`."""
    usage = exc.usage
    if not isinstance(usage, Usage):
        return Usage()
    return usage.model_copy(update={"requests": 0})


class RouterModel(Model):
    """Several models behind one `Model` interface: retries, fallback, circuit breakers, capability routing.

    Args:
        models: the members, in order of preference (`Model`s or model strings).
        retries: how many times a retryable failure is retried on the same member before falling back.
        backoff: the first retry delay in seconds; it doubles at each retry (exponential backoff).
        max_backoff: the cap of every delay, including the provider's `Retry-After`.
        jitter: randomise each backoff delay between 50 % and 100 % of its value (spreads retries).
        breaker_threshold: consecutive failed attempts after which a member is skipped …
        breaker_cooldown: … for this many seconds; then one request probes it.
        overflow_fallback: where a request goes when its prompt overflows a member's context window:
            `"larger"` (default) to the next member whose declared `context_window` is larger, `"any"` to
            the next member, `"never"` nowhere (the loop then shrinks the run's context).
        timeout: seconds a member may take to answer (when streaming: to send its first chunk, and each
            next one); a member that takes longer fails with a `ModelRetryableError`, retried and fallen back
            from like a 503. None (the default): only the member's own timeout applies.
        on_attempt: called with a `ModelAttempt` for every failed attempt (also emitted to the run).
        sleep, clock, rng: injectable for tests (default `asyncio.sleep`, `time.monotonic`, `random`).

    Usage: the response carries its member's usage plus the tokens that failed attempts reported
    consuming (an adapter attaches them to the error as `usage`), so the run budget is charged for all.
    """

    provider = "router"

    def __init__(
        self,
        models: Sequence[Model | str],
        *,
        retries: int = 2,
        backoff: float = 0.5,
        max_backoff: float = 20.0,
        jitter: bool = True,
        breaker_threshold: int = 3,
        breaker_cooldown: float = 30.0,
        overflow_fallback: OverflowFallback = "larger",
        timeout: float | None = None,
        on_attempt: AttemptHook | None = None,
        sleep: Sleep = asyncio.sleep,
        clock: Clock = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        _check_settings(models, retries, backoff, max_backoff, breaker_threshold, breaker_cooldown)
        if timeout is not None and not timeout > 0:
            raise ConfigurationError(f"timeout must be None or a number of seconds > 0, not {timeout!r}")
        self.timeout = timeout
        from . import resolve_model

        self.models: list[Model] = [resolve_model(m) for m in models]
        self.name = ",".join(m.spec for m in self.models)
        self._union: tuple[list[ModelCapabilities], ModelCapabilities] | None = None
        self._stated: ModelCapabilities | None = None
        self.retries, self.backoff, self.max_backoff, self.jitter = retries, backoff, max_backoff, jitter
        self.breakers = [CircuitBreaker(breaker_threshold, breaker_cooldown) for _ in self.models]
        self.on_attempt = on_attempt
        if overflow_fallback not in ("larger", "any", "never"):
            raise ConfigurationError(
                f"overflow_fallback must be 'larger', 'any' or 'never', not {overflow_fallback!r}"
            )
        self.overflow_fallback: OverflowFallback = overflow_fallback
        self.sleep, self.clock = sleep, clock
        self.rng = rng or random.Random()

    @property
    def capabilities(self) -> ModelCapabilities:
        """The members' capabilities combined (see `_union_capabilities`), as they are now: a member that
        learnt it takes no tools (the OpenAI adapter, after a server refused them) no longer counts for them."""
        if self._stated is not None:
            return self._stated
        members = [m.capabilities for m in self.models]
        union = self._union
        if union is None or any(a is not b for a, b in zip(union[0], members, strict=True)):
            union = self._union = (members, _union_capabilities(self.models))
        return union[1]

    @capabilities.setter
    def capabilities(self, value: ModelCapabilities) -> None:
        self._stated = value  # stated by the user: kept as it is

    # ------------------------------------------------------------------------------------ routing

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before retry number `attempt`: `Retry-After` if given, else backoff; capped."""
        if retry_after is not None and not math.isnan(retry_after):
            return min(max(retry_after, 0.0), self.max_backoff)
        delay = min(self.backoff * 2.0 ** (attempt - 1), self.max_backoff)
        return delay * self.rng.uniform(0.5, 1.0) if self.jitter else delay

    def report(self, event: ModelAttempt) -> None:
        from .._loop import emit_current

        emit_current(event)
        if self.on_attempt is not None:
            self.on_attempt(event.model_copy())

    def _plan(self, request: ModelRequest) -> _Attempt:
        if not request.tools:
            return _Attempt(self, list(range(len(self.models))), [])
        able = [i for i, m in enumerate(self.models) if m.capabilities.tools]
        skipped = [
            f"{m.spec}: skipped, no native tool calling" for m in self.models if not m.capabilities.tools
        ]
        if not able:  # the loop goes on in text ReAct, where the tools are described in the prompt
            raise ToolsUnsupportedError(
                f"the request has {len(request.tools)} tool(s) but none of the models "
                f"({self.name}) supports native tool calling: use mode='react'",
                provider="router",
            )
        return _Attempt(self, able, skipped)

    # ------------------------------------------------------------------------------ Model interface

    async def request(self, request: ModelRequest) -> ModelResponse:
        plan = self._plan(request)
        while (member := plan.next_member()) is not None:
            try:
                response = await self._within(member, member.request(request))
            except ModelError as exc:
                await plan.failed(member, exc)
                continue
            except UserError as exc:
                plan.release()
                if (error := plan.misconfigured(member, exc)) is None:
                    raise
                raise error from exc
            except DeadlineExceeded:
                plan.release()
                raise
            except Exception as exc:  # a member of the user's making raised something else: its failure
                await plan.failed(member, as_model_error(exc, member.provider))
                continue
            except BaseException:
                plan.release()
                raise
            if not isinstance(response, ModelResponse) or type(response.text) is not str:
                await plan.failed(member, bad_response(response, member.provider))
                continue  # a member of the user's making answered nonsense: its failure, fallen back from
            return plan.succeeded(response, member, request)
        raise plan.exhausted()

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        """Stream from the first member that starts answering; a failure after a chunk was delivered surfaces.

        Text is delivered as it comes. A member's tool-call deltas (and everything after the first) are held
        until its reply is complete: nothing of a tool call is shown to the user, so a connection lost in the
        middle of a call's arguments is retried or falls back like a failure before the first chunk."""
        plan = self._plan(request)
        while (member := plan.next_member()) is not None:
            delivered = False
            try:
                async for chunk in self._member_chunks(member, request, plan):
                    delivered = True
                    yield chunk
            except ModelError as exc:
                if delivered:
                    self._surface(plan, member, exc)
                    raise
                await plan.failed(member, exc)
                continue
            except UserError as exc:
                plan.release()
                if (error := plan.misconfigured(member, exc)) is None:
                    raise
                raise error from exc
            except DeadlineExceeded:
                plan.release()
                raise
            except Exception as exc:
                failure = as_model_error(exc, member.provider)
                if delivered:
                    self._surface(plan, member, failure)
                    raise failure from exc
                await plan.failed(member, failure)
                continue
            except BaseException:
                plan.release()
                raise
            return
        raise plan.exhausted()

    async def _member_chunks(
        self, member: Model, request: ModelRequest, plan: _Attempt
    ) -> AsyncIterator[StreamChunk]:
        """The chunks of `member`'s stream the router delivers: text at once, tool-call deltas with the
        complete reply (see `stream`); each chunk within `timeout`."""
        held: list[StreamChunk] = []
        count = 0
        chunks = _member_stream(member, request)
        try:
            while (chunk := await self._within(member, _next_chunk(chunks))) is not None:
                count += 1
                if isinstance(chunk, ModelResponse):
                    for piece in [*held, plan.succeeded(chunk, member, request)]:
                        yield piece
                    return
                if held or isinstance(chunk, ToolCallDelta):
                    held.append(chunk)
                else:
                    yield chunk
        finally:
            await chunks.aclose()
        raise ModelRetryableError(  # cut off like a dropped connection (its held tool-call deltas with it)
            f"the stream of {member.spec} ended without its final response, after {count} chunk(s)",
            provider=member.provider,
            scope="streaming",
        )

    async def _within(self, member: Model, step: Awaitable[_T]) -> _T:
        """`await step`, failing with a `ModelRetryableError` when it takes longer than `timeout`."""
        if self.timeout is None:
            return await step
        try:
            async with asyncio.timeout(self.timeout) as scope:
                return await step
        except TimeoutError:
            if not scope.expired():  # not ours: the member's own (`request` counts it as its failure)
                raise
            raise ModelRetryableError(
                f"no answer within the router's timeout of {self.timeout:g} s; raise RouterModel(timeout=...) "
                "if the model is only slow",
                provider=member.provider,
                scope="model request",
            ) from None

    def _surface(self, plan: _Attempt, member: Model, exc: ModelError) -> None:
        """A failure after the first chunk: counted against the member, reported, not retried."""
        self.breakers[plan.candidates[plan.index]].failure(self.clock(), exc.retry_after)
        self.report(
            ModelAttempt(model=member.spec, attempt=plan.attempt, error=str(exc), next_action="give_up")
        )

    def count_tokens(self, messages: Sequence[Message]) -> int | None:
        return self.models[0].count_tokens(messages)

    async def aclose(self) -> None:
        for member in self.models:
            await member.aclose()


async def _next_chunk(chunks: AsyncIterator[StreamChunk]) -> StreamChunk | None:
    try:
        return await anext(chunks)
    except StopAsyncIteration:
        return None


def _longer_than(retry_after: float | None, cap: float) -> bool:
    """Whether the provider asked for a longer wait than the router allows (`max_backoff`)."""
    return retry_after is not None and retry_after > cap


async def _member_stream(member: Model, request: ModelRequest) -> AsyncGenerator[StreamChunk, None]:
    """A member's stream, or its whole reply as chunks when it cannot stream."""
    stream = member.stream(request) if member.capabilities.streaming else Model.stream(member, request)
    async for chunk in stream:
        yield chunk


def _union_capabilities(models: Sequence[Model]) -> ModelCapabilities:
    """Tools/streaming if any member has them (requests are routed); prefill and parallel calls if all do."""
    windows = [m.capabilities.context_window for m in models if m.capabilities.context_window]
    return ModelCapabilities(
        tools=any(m.capabilities.tools for m in models),
        streaming=any(m.capabilities.streaming for m in models),
        parallel_tool_calls=all(m.capabilities.parallel_tool_calls for m in models),
        prefill=all(m.capabilities.prefill for m in models),
        context_window=min(windows) if windows else None,
    )


def _check_settings(
    models: Sequence[Model | str],
    retries: int,
    backoff: float,
    max_backoff: float,
    threshold: int,
    cooldown: float,
) -> None:
    if isinstance(models, str) or not models:
        raise ConfigurationError(
            f"RouterModel needs a non-empty list of models, got {models!r}; "
            "e.g. RouterModel(['openai:gpt-4o-mini', 'openai:gpt-4o'])"
        )
    if retries < 0 or backoff < 0 or max_backoff < 0:
        raise ConfigurationError(
            f"retries, backoff and max_backoff must be ≥ 0 (got {retries}, {backoff}, {max_backoff})"
        )
    if threshold < 1 or cooldown < 0:
        raise ConfigurationError(
            f"breaker_threshold must be ≥ 1 and breaker_cooldown ≥ 0 (got {threshold}, {cooldown})"
        )
