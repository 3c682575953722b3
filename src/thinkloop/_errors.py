"""thinkloop's exceptions.

    ThinkloopError                  the root: catch this to catch everything thinkloop raises
    ├── UserError                   a usage mistake by the application developer (fix the code)
    │   └── ConfigurationError      a bad setting, model string, tool definition …
    └── RunError                    something that happened during a run; carries the run state
        ├── ModelError              a model provider failed (scope + provider name)
        │   ├── ModelRetryableError a transient failure (429, 5xx, timeout, connection) a router may retry
        │   └── ContextOverflowError the prompt is longer than the model's context window (the loop shrinks it)
        ├── ToolExecutionError      a tool failed in a way that cannot be told to the model
        ├── StateError              a run state that cannot be loaded or resumed
        └── ConcurrencyError        an event-log append lost the race (`expected_version` mismatch)

Exceptions never log by themselves. Messages say what happened, with what value, and what to do.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._messages import Usage
    from ._state import RunState


class ThinkloopError(Exception):
    """Root of every exception raised by thinkloop."""


class UserError(ThinkloopError):
    """A usage mistake by the application developer: the code calling thinkloop must change."""


class ConfigurationError(UserError):
    """A bad setting: a model string, a tool definition, a budget, a store URL …"""


class RunError(ThinkloopError):
    """Something went wrong during a run. `state` holds the run so far, so no work is lost."""

    def __init__(self, message: str, *, state: RunState | None = None) -> None:
        super().__init__(message)
        self.state = state


class ModelError(RunError):
    """A model provider failed. `provider` names it, `scope` says what was being done.

    `usage` holds the tokens the failed request(s) consumed when the adapter knows them (a `RouterModel`
    charges them to the response that follows, and sets them on the error it raises when all failed).
    """

    usage: Usage | None = None
    retried: bool = False
    """The failure went through retries and fallbacks already (a `RouterModel` sets it on the error it
    raises when every member failed): whoever catches it — the loop, a model wrapping the router, an outer
    router — does not retry it again, which would multiply the attempts and the waits."""

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        scope: str = "model request",
        status_code: int | None = None,
        retry_after: float | None = None,
        state: RunState | None = None,
    ) -> None:
        super().__init__(f"{provider}: {scope} failed: {message}", state=state)
        self.provider = provider
        self.scope = scope
        self.status_code = status_code
        self.retry_after = _wait(retry_after)


def _wait(seconds: float | None) -> float | None:
    """A `retry_after` that is a wait: NaN and infinity say no time (None), a negative one means now (0)."""
    if seconds is None or not math.isfinite(seconds):
        return None
    return max(float(seconds), 0.0)


class ModelRetryableError(ModelError):
    """A transient model failure (rate limit, server error, timeout, lost connection)."""


class ContextOverflowError(ModelError):
    """The provider rejected the request because the prompt does not fit the model's context window.

    Not transient (the same request fails again), but recoverable: the loop lowers the run's context
    budget and rebuilds the request (at most twice per step). `limit` is the context window in tokens,
    `prompt_tokens` the size of the rejected prompt and `completion_tokens` the reply room the request
    asked for, each when the provider stated it (else None).
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        scope: str = "model request",
        status_code: int | None = None,
        limit: int | None = None,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        state: RunState | None = None,
    ) -> None:
        super().__init__(message, provider=provider, scope=scope, status_code=status_code, state=state)
        self.limit = limit
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens


class ToolsUnsupportedError(ModelError):
    """The model (or the server in front of it) does not take tool definitions: Ollama's "does not support
    tools", vLLM without `--enable-auto-tool-choice`, a llama.cpp server without `--jinja` …

    Recoverable: the loop switches the run to text ReAct (the tools are described in the prompt) and sends
    the request again; the OpenAI adapter then marks the model as without native tools, so later runs start
    in ReAct.
    """


class ToolExecutionError(RunError):
    """A tool failed in a way that cannot be reported to the model as an observation."""


class StateError(RunError):
    """A run state cannot be loaded, saved or resumed (corrupt, too new, already finished …)."""


class ConcurrencyError(RunError):
    """An append to an event log used an `expected_version` that is no longer current — or a checkpoint
    found the run saved by another writer since its state was loaded (`saved_since`: `expected` and
    `actual` are then save counts, `RunState.saves`).

    A checkpoint that finds the log *behind* the state being saved raises the store's `DamagedRunError`
    instead (events the store had are gone: no writer raced it, and trying again cannot help)."""

    def __init__(self, run_id: str, expected: int, actual: int, *, saved_since: bool = False) -> None:
        if saved_since:
            message = (
                f"run {run_id!r} was saved by another writer since this copy of it was loaded (the store "
                f"holds save {actual}, this copy follows save {expected}): is another process running it? Nothing "
                "of this save was written; load the run again to see where it is"
            )
        else:
            why = (
                "another writer appended first; reload and retry"
                if actual > expected
                else "the log is behind that version (no writer appended to it): give the version it is at"
            )
            message = (
                f"event log of run {run_id!r} is at version {actual}, not the expected {expected}: {why}"
            )
        super().__init__(message)
        self.run_id = run_id
        self.expected = expected
        self.actual = actual
        self.saved_since = saved_since


class DeadlineExceeded(TimeoutError):
    """Internal: an await cut at the run's or a call's deadline by `Deadlines` — not a `TimeoutError` the
    awaited code raised itself (`asyncio.wait_for` inside a tool or a model), which is that call's failure,
    not the run's timeout."""


def as_model_error(exc: Exception, provider: str) -> ModelError:
    """What an exception other than thinkloop's that a model (one of the user's making) raised counts as:
    its own `TimeoutError` (an `asyncio.wait_for` inside it, a socket timeout) a transient failure, retried
    and fallen back from, never the run's time limit; anything else a model failure naming the exception."""
    if isinstance(exc, TimeoutError):
        error: ModelError = ModelRetryableError(
            f"the model call timed out ({type(exc).__name__}{f': {exc}' if str(exc) else ''})",
            provider=provider,
            scope="model request",
        )
    else:
        error = ModelError(
            f"the model raised {type(exc).__name__}: {exc}", provider=provider, scope="model request"
        )
    error.__cause__ = exc
    return error
