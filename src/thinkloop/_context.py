"""Context management (SPEC §7): the view of the history sent to the model.

The run state keeps the full history; `ContextManager.view()` returns what the model sees.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._messages import Message
from ._state import RunState

DEFAULT_MAX_CONTEXT_TOKENS = 8000


class ContextManager:
    """Builds the model's view of a run's history within `max_context_tokens`."""

    def __init__(self, max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS) -> None:
        self.max_context_tokens = max_context_tokens if max_context_tokens > 0 else DEFAULT_MAX_CONTEXT_TOKENS

    def view(self, state: RunState, messages: Sequence[Message] | None = None) -> list[Message]:
        return list(state.messages if messages is None else messages)
