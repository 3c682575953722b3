"""Token counting (SPEC §7.1): pluggable counters for the context manager.

Three sources, best first:

1. The provider's reported usage: the loop accumulates it into `RunState.usage`, and the context
   manager uses it to calibrate an estimating counter (`ContextManager.record_usage`).
2. The model's own tokenizer: `Model.count_tokens(messages)` when it returns a number (tiktoken for
   OpenAI models, the GGUF's tokenizer for the local model) — `ModelTokenCounter`.
3. The estimate `characters / 3 + 1` per text — `EstimateCounter`.

A counter is anything with `count(messages) -> int`; a plain function `(messages) -> int` works too
(`as_counter` wraps it). Counters are asked about one message at a time and their answers are cached
per run, so a slow tokenizer costs once per message, not once per step.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ._errors import ConfigurationError
from ._messages import Message, ToolDefinition, arguments_json
from .models._base import estimate_tokens

if TYPE_CHECKING:
    from .models import Model

MESSAGE_OVERHEAD = 4
"""Tokens a chat format adds around each message (role and separators) in the estimate."""

CALL_OVERHEAD = 8
"""Tokens a tool call adds beyond its name and arguments (its JSON frame, or `Action:`/`Action Input:`)."""

RESULT_OVERHEAD = 4
"""Tokens a tool result adds beyond its text (its call id, or `Observation:`)."""


@runtime_checkable
class TokenCounter(Protocol):
    """Counts the tokens of messages as the model will see them."""

    def count(self, messages: Sequence[Message]) -> int: ...


class EstimateCounter:
    """The fallback estimate: `chars/3 + 1` per text, plus a small overhead per message and call."""

    exact = False

    def count(self, messages: Sequence[Message]) -> int:
        return sum(estimate_message(m) for m in messages)


class ModelTokenCounter:
    """The model's own tokenizer (`Model.count_tokens`), falling back to the estimate when it has none.

    Whether the model has a tokenizer is asked once, with a tiny message; a model that answers None is
    never asked again.
    """

    def __init__(self, model: Model) -> None:
        self.model = model
        probe = model.count_tokens([Message.user("hi")])
        self.exact = isinstance(probe, int)

    def count(self, messages: Sequence[Message]) -> int:
        if self.exact:
            counted = self.model.count_tokens(messages)
            if isinstance(counted, int):
                return counted
        return sum(estimate_message(m) for m in messages)


logger = logging.getLogger("thinkloop.context")


class _UsersCounter:
    """A counter of the user's (a `TokenCounter` or a function): one that raises or returns something
    other than a count is replaced by the estimate, with one warning — counting only sizes the context
    view, so a bug in it must not end (or crash) the run."""

    def __init__(self, count: Callable[[Sequence[Message]], Any], exact: bool) -> None:
        self._count = count
        self.exact = exact
        self._failed = False

    def count(self, messages: Sequence[Message]) -> int:
        if not self._failed:
            try:
                counted = self._count(messages)
                if (
                    not isinstance(counted, bool)
                    and isinstance(counted, int | float)
                    and 0 <= counted < math.inf
                ):
                    return int(counted)
                problem = f"returned {counted!r}, not a number of tokens"
            except Exception as exc:
                problem = f"raised {type(exc).__name__}: {exc}"
            self._failed, self.exact = True, False
            logger.warning("the token_counter %s; counting with the estimate (chars/3 + 1) instead", problem)
        return sum(estimate_message(m) for m in messages)


TokenCounterLike = TokenCounter | Callable[[Sequence[Message]], int]


def as_counter(counter: TokenCounterLike | None, model: Model | None = None) -> TokenCounter:
    """The counter to use: the one given (a counter or a function), else the model's, else the estimate."""
    if counter is None:
        return ModelTokenCounter(model) if model is not None else EstimateCounter()
    if isinstance(counter, EstimateCounter | ModelTokenCounter):
        return counter
    if isinstance(counter, TokenCounter):
        return _UsersCounter(counter.count, is_exact(counter))
    if callable(counter):
        return _UsersCounter(counter, True)
    raise ConfigurationError(
        f"token_counter must have a count(messages) method or be a function (messages) -> int, "
        f"not {counter!r}"
    )


def is_exact(counter: TokenCounter) -> bool:
    """True when the counter is a real tokenizer (an estimate gets calibrated by reported usage)."""
    return bool(getattr(counter, "exact", True))


def estimate_message(message: Message) -> int:
    """The estimate of one message: its text, its tool calls, and the per-message overhead."""
    # estimate_tokens(text) is len(text) // 3 + 1, written out: this runs for every new message
    total = len(message.content) // 3 + 1 + MESSAGE_OVERHEAD
    if message.role == "tool":
        total += RESULT_OVERHEAD
    for call in message.tool_calls:
        args = call.raw_arguments if call.raw_arguments is not None else arguments_json(call.arguments)
        total += len(call.name) // 3 + len(args) // 3 + 2 + CALL_OVERHEAD
    return total


def estimate_tools(tools: Sequence[ToolDefinition]) -> int:
    """The estimate of the tool definitions sent with a request."""
    return sum(estimate_tokens(t.description) + estimate_tokens(str(t.parameters)) for t in tools)
