"""Context management (SPEC §7): the view of a run's history that is sent to the model.

The run state keeps the full history (for persistence, replay and the user); `ContextManager.view()`
returns what the model sees at each step:

- **Step groups.** The history is cut into groups: the head (the messages before the first assistant
  message), one group per assistant message with its tool results and the hints or corrections that
  follow it, and the task message (kind "task"), which starts a group of its own when a session's
  memory comes before it. Groups are kept or dropped whole, so an assistant tool call is
  never separated from its results (SPEC §7.3) — by construction. Each group is also repaired when
  needed (orphan tool results dropped, missing results answered by a placeholder), and
  `validate_history()` checks the result in tests.
- **Anti-drift (SPEC §7.4).** The task message is always kept. The last `keep_steps` steps are kept
  whole; in older steps, observations are truncated to `old_observation_chars`. When steps have to
  be dropped, they are replaced by one summary message (kind "summary") — written by a deterministic
  compressor (tool names, arguments, result snippets) or by an optional `summarizer` — which ends by
  restating the task.
- **Trimming (SPEC §7.2).** Before each call the view is kept within `trim_ratio` (90 %) of
  `max_context_tokens`, counting the system prompt and the tool definitions too. When it is over, the
  oldest steps are dropped down to `trim_to` (75 %), so the kept window (and the provider's prompt cache)
  stays stable for several steps. The newest groups holding at least the last `min_messages` messages
  are never dropped; if what is kept is still too big, texts are shortened (head and tail, with a marker):
  the longest observations first, then remembered turns, the summary and older assistant texts, then
  observations again, evenly, down to a few dozen characters each (so many parallel results fit, and a
  shrink after an overflow always sends less while anything can still be cut). The task message is never
  cut, and no message is dropped by it, so calls and results stay paired. The summary takes at most
  `summary_max_chars`, and at most about a fifth of a small window.

Work per step is small: the grouping is extended incrementally, token counts are cached per message,
and a history far below the limit is returned as is.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ._errors import ThinkloopError
from ._messages import Message, ModelRequest, ModelSettings, ToolDefinition
from ._state import RunState
from ._tokens import (
    EstimateCounter,
    ModelTokenCounter,
    TokenCounter,
    estimate_message,
    estimate_tools,
    is_exact,
)
from ._tools import truncate_output

if TYPE_CHECKING:
    from .models import Model

logger = logging.getLogger("thinkloop.context")

DEFAULT_MAX_CONTEXT_TOKENS = 8000
_FAST_PATH = True  # False: every view is assembled from the step groups (tests compare the two)
_ESTIMATING = (EstimateCounter, ModelTokenCounter)  # counters that estimate unless `exact`

Summarizer = Callable[[list[Message], str], Awaitable[str]]
"""A model-written summary: `(messages to summarise, the previous summary or "") -> summary text`."""

_SQUEEZE_FLOOR = 300  # the length (marker included) texts are first shortened to, at most, when over budget
_MIN_KEPT = 40  # the characters of its own a text keeps at the very least (plus the marker)

NO_RESULT = "Error: no result was recorded for this call (the run was interrupted). Call it again if needed."


class InvalidHistoryError(ThinkloopError, ValueError):
    """A message list that a chat provider would reject (a tool result without its call, or the reverse)."""


SUMMARY_PROMPT = (
    "You compress the earlier steps of an AI agent's work so it can continue without them. Write at most "
    "{limit} characters of plain notes: the facts found, the tool results that matter (with their key "
    "values), what failed and why, and what is still open. Do not invent anything."
)


def model_summarizer(model: Model, *, max_chars: int = 1200) -> Summarizer:
    """A `summarizer` that asks `model` to summarise dropped steps (one extra call per trim).

    The call is not counted in the run's usage. Failures fall back to the deterministic summary.
    """

    async def summarize(messages: list[Message], previous: str) -> str:
        lines = [f"Previous summary: {previous}"] if previous else []
        for msg in messages:
            calls = "; ".join(f"{c.name}({_json(c.arguments)})" for c in msg.tool_calls)
            text = _clip(msg.content, 600)
            lines.append(f"{msg.role}: {text} {('calls ' + calls) if calls else ''}".rstrip())
        request = ModelRequest(
            messages=[Message.system(SUMMARY_PROMPT.format(limit=max_chars)), Message.user("\n".join(lines))],
            settings=ModelSettings(temperature=0.0, max_output_tokens=max(max_chars // 3, 64)),
        )
        response = await model.request(request)
        return response.text.strip()[:max_chars]

    return summarize


# ============================================================================================ validation


def validate_history(messages: Sequence[Message]) -> None:
    """Raise `InvalidHistoryError` unless `messages` is valid for the OpenAI chat format.

    Every `tool` message answers a call of the assistant message just before its block of tool
    messages; every call of an assistant message is answered, once, in the block right after it; so no
    window starts with a tool message.
    """
    pending: dict[str, str] = {}  # call id -> tool name, of the open assistant message
    for index, msg in enumerate(messages):
        if msg.role == "tool":
            if msg.tool_call_id is None or msg.tool_call_id not in pending:
                raise InvalidHistoryError(
                    f"message {index} is a tool result for call {msg.tool_call_id!r}, which is not an "
                    "unanswered call of the assistant message right before it"
                )
            del pending[msg.tool_call_id]
            continue
        if pending:
            raise InvalidHistoryError(
                f"message {index} ({msg.role}) comes before the result of call(s) {sorted(pending)}: every "
                "assistant tool call must be answered right after it"
            )
        if msg.role == "assistant" and msg.tool_calls:
            ids = [c.id for c in msg.tool_calls]
            if len(set(ids)) != len(ids):
                raise InvalidHistoryError(f"message {index} has duplicate tool call ids: {ids}")
            pending = {c.id: c.name for c in msg.tool_calls}
    if pending:
        raise InvalidHistoryError(f"the history ends before the result of call(s) {sorted(pending)}")


# ================================================================================================ groups


@dataclass(slots=True)
class _Group:
    """A head or a step: messages that are kept or dropped together."""

    messages: list[Message] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    tokens: int = 0
    is_step: bool = False
    pinned: bool = False
    has_task: bool = False
    _clean: tuple[int, list[Message], int] | None = None  # (len when built, messages, tokens)
    _compact: tuple[int, list[Message], int] | None = None
    _lines: tuple[int, list[str]] | None = None

    def add(self, msg: Message, tokens: int) -> None:
        self.messages.append(msg)
        self.counts.append(tokens)
        self.tokens += tokens
        if msg.kind == "task":
            self.pinned = self.has_task = True


@dataclass(slots=True)
class _Prefix:
    """The settled start of the view (see `ContextManager._settled`)."""

    key: tuple[int, int, int, int]  # (dropped, summarised, head messages, max_context_tokens)
    messages: list[Message] = field(default_factory=list)
    tokens: int = 0
    upto: int = 1  # groups before this index are in the prefix (or dropped)

    def add(self, messages: list[Message], tokens: int) -> None:
        self.messages.extend(messages)
        self.tokens += tokens


def _repaired(group: _Group) -> list[Message] | None:
    """The group's messages made valid (results right after their call), or None when already valid."""
    msgs = group.messages
    if not group.is_step:
        return [m for m in msgs if m.role != "tool"] if any(m.role == "tool" for m in msgs) else None
    ids = [c.id for c in msgs[0].tool_calls]
    body = msgs[1:]
    in_order = len(body) >= len(ids) and all(
        m.role == "tool" and m.tool_call_id == i for m, i in zip(body, ids, strict=False)
    )
    if in_order and len(set(ids)) == len(ids) and not any(m.role == "tool" for m in body[len(ids) :]):
        return None
    results = {m.tool_call_id: m for m in body if m.role == "tool" and m.tool_call_id in ids}
    head = msgs[0]
    if len(set(ids)) != len(ids):  # duplicate ids cannot be answered unambiguously: keep the text only
        head, ids = head.model_copy(update={"tool_calls": []}), []
    answers = [results.get(i) or _placeholder(head, i) for i in ids]
    return [head, *answers, *(m for m in body if m.role != "tool")]


def _placeholder(assistant: Message, call_id: str) -> Message:
    call = next(c for c in assistant.tool_calls if c.id == call_id)
    return Message.tool(call, NO_RESULT, step=assistant.step)


# ========================================================================================= the manager


class ContextManager:
    """Builds the model's view of one run's history within `max_context_tokens` (one per run).

    Args:
        max_context_tokens: the context window to stay within (≤ 0 means 8,000).
        counter: how tokens are counted (the estimate by default; see `thinkloop._tokens`).
        keep_steps: the newest steps kept whole (older observations are truncated).
        min_messages: the newest messages never dropped.
        trim_ratio: the share of `max_context_tokens` the view (with system prompt and tools) must fit.
        trim_to: when trimming, drop old steps until the view fits this share (hysteresis).
        old_observation_chars: observations of older steps are cut to this length (None: never).
        summary_max_chars: the longest summary of dropped steps (in a small window, at most about a fifth
            of it).
        summarizer: an async function writing the summary of dropped steps (a model call); the
            deterministic summary is used until it answers, and whenever it fails.
    """

    # slotted: a run reads these every step, and past 30 attributes an instance's dict is no longer
    # shared-key, so every read would be a dictionary lookup
    __slots__ = (
        "max_context_tokens", "counter", "keep_steps", "min_messages", "trim_ratio", "trim_to",
        "old_observation_chars", "summary_max_chars", "summarizer", "_calibrated", "scale", "last_tokens",
        "_exact", "_estimating", "_source", "_seen", "_grouped", "_counts", "_last", "_group_count",
        "_last_group_size", "_groups", "_pinned", "_dropped", "_dropped_count", "_tokens", "_open_calls",
        "_valid", "_first_long", "_prefix", "_model_summary", "_summary_cache", "_reserve_key",
        "reserve_cache", "_reserve_for_system", "_reserve_for_tools", "_reserve", "_last_reserve",
        "_summarizer_failed_at", "_fits",
    )  # fmt: skip

    def __init__(
        self,
        max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS,
        *,
        counter: TokenCounter | None = None,
        keep_steps: int = 5,
        min_messages: int = 4,
        trim_ratio: float = 0.9,
        trim_to: float = 0.75,
        old_observation_chars: int | None = 500,
        summary_max_chars: int = 2000,
        summarizer: Summarizer | None = None,
    ) -> None:
        self.max_context_tokens = max_context_tokens if max_context_tokens > 0 else DEFAULT_MAX_CONTEXT_TOKENS
        self.counter: TokenCounter = counter or EstimateCounter()
        self.keep_steps = max(keep_steps, 1)
        self.min_messages = max(min_messages, 1)
        self.trim_ratio = trim_ratio
        self.trim_to = min(trim_to, trim_ratio)
        self.old_observation_chars = old_observation_chars
        self.summary_max_chars = summary_max_chars
        self.summarizer = summarizer
        self._calibrated = False
        self.scale = 1.0  # reported / counted tokens, learnt from provider usage (estimates only)
        self.last_tokens = 0  # tokens of the last view, with the reserve
        self._reset(None)
        self._reserve_key: tuple[str, tuple[str, ...]] | None = None
        self.reserve_cache: dict[
            tuple[str, tuple[str, ...]], int
        ] = {}  # an agent shares one between its runs
        self._reserve_for_system: str | None = None
        self._reserve_for_tools: Sequence[ToolDefinition] | None = None
        self._reserve = 0
        self._last_reserve = 0
        self._summary_cache: tuple[tuple[int, int, int], Message, int] | None = None
        self._model_summary: tuple[int, str] | None = None  # (groups covered, text)
        self._summarizer_failed_at = -1
        self._fits: tuple[int, float, int] = (0, 0.0, 0)  # (max_context_tokens, trim_ratio, their budget)

    # ------------------------------------------------------------------------------------ public

    @property
    def budget(self) -> int:
        return int(self.max_context_tokens * self.trim_ratio)

    @property
    def dropped_steps(self) -> int:
        """How many step groups the view currently replaces by the summary."""
        return self._dropped_count

    def view(
        self,
        state: RunState,
        messages: Sequence[Message] | None = None,
        *,
        system: str | None = None,
        tools: Sequence[ToolDefinition] = (),
        reserve: int = 0,
    ) -> list[Message]:
        """The messages to send (without the system message, which the caller adds).

        `system` and `tools` are what the request will also carry: their tokens are reserved, as is
        `reserve`. The returned list is new; `state.messages` is never changed.
        """
        source = state.messages if messages is None else messages
        if system is self._reserve_for_system and tools is self._reserve_for_tools:
            reserve += self._reserve  # the same objects as last time (the loop caches them)
        else:
            reserve += self._reserve_for(system, tools)
        self._last_reserve = reserve
        self._scan(source)
        if (  # the common case: a history that fits as it is (valid, every call answered, no old long result)
            _FAST_PATH
            and self._dropped == 1
            and self._valid
            and not self._open_calls
            and not (0 <= self._first_long < self._group_count - self.keep_steps)
        ):
            total = self._tokens + reserve  # the common case: the history fits as it is
            fits = self._fits  # `budget`, computed again only when the window or the ratio changed
            if fits[0] != self.max_context_tokens or fits[1] != self.trim_ratio:
                fits = self._fits = (self.max_context_tokens, self.trim_ratio, self.budget)
            if total * self.scale <= fits[2]:
                self.last_tokens = total
                return list(source)
        out, tokens = self._plan(state, source, self._last_reserve)
        total = tokens + self._last_reserve
        if total * self.scale > self.budget:
            out, total = self._squeeze(out)
        self.last_tokens = total
        return out

    async def prepare(self, state: RunState) -> None:
        """Before a step: plan the trim and, with a `summarizer`, have newly dropped steps summarised."""
        if self.summarizer is None:
            return
        self._plan(state, state.messages, self._last_reserve)
        covered = self._model_summary[0] if self._model_summary else 1
        if self._dropped <= covered or self._dropped == self._summarizer_failed_at:
            return
        new = [m for g in self._groups[covered : self._dropped] if not g.pinned for m in self._clean(g)[0]]
        previous = self._model_summary[1] if self._model_summary else ""
        try:
            text = await self.summarizer(new, previous)
        except Exception as exc:  # a summary is an optimisation: fall back to the deterministic one
            logger.warning("the context summarizer failed (%s); using the deterministic summary", exc)
            self._summarizer_failed_at = self._dropped
            return
        self._model_summary = (self._dropped, str(text).strip())

    def record_usage(self, reported_input_tokens: int) -> None:
        """Calibrate an estimating counter with the input tokens the provider reported for the last view."""
        last = self.last_tokens
        if reported_input_tokens <= 0 or last <= 0 or self._exact:
            return
        ratio = reported_input_tokens / last  # kept within [0.5, 2] (without min/max: this runs every step)
        if ratio < 0.5:
            ratio = 0.5
        elif ratio > 2.0:
            ratio = 2.0
        self.scale = ratio if not self._calibrated else 0.7 * self.scale + 0.3 * ratio
        self._calibrated = True

    # ------------------------------------------------------------------------------- grouping

    def _reset(self, source: Sequence[Message] | None) -> None:
        self._exact = is_exact(self.counter)  # a tokenizer: never calibrated by reported usage
        self._estimating = type(self.counter) in _ESTIMATING and not self._exact  # the estimate, one by one
        self._source = source
        self._seen = 0  # messages scanned (counted, order checked)
        self._grouped = 0  # messages put in groups (done only when the view is more than the history)
        self._counts: list[int] = []  # tokens of each scanned message
        self._last: Message | None = None
        self._group_count = 1  # groups the scanned messages make
        self._last_group_size = 0
        self._groups: list[_Group] = [_Group(pinned=True)]
        self._pinned: list[int] = []  # indexes of pinned groups after the head
        self._dropped = 1  # groups[1:_dropped] that are not pinned are dropped
        self._dropped_count = 0
        self._tokens = 0  # of all messages seen
        self._open_calls: tuple[str, ...] = ()  # calls of the last assistant message not yet answered
        self._valid = True  # every message so far is where a provider expects it (no repair needed)
        self._first_long = -1  # the first group with an observation longer than `old_observation_chars`
        self._prefix: _Prefix | None = None
        self._model_summary = None
        self._summary_cache = None

    def _scan(self, source: Sequence[Message]) -> None:
        """Count and check the messages added since the last call (start over if the history changed)."""
        seen, end = self._seen, len(source)
        if source is not self._source or end < seen or (seen and source[seen - 1] is not self._last):
            if seen == 0 and self._source is None:
                self._source = source  # the first view: nothing to start over
            else:
                self._reset(source)
                seen = 0
        if end == seen:
            return
        estimate = self._estimating  # the estimate message by message: no list, no sum
        limit = self.old_observation_chars
        counts, open_calls, valid = self._counts, self._open_calls, self._valid
        groups, size, tokens = self._group_count, self._last_group_size, self._tokens
        for msg in source[seen:]:
            role = msg.role
            if role == "assistant" or (msg.kind == "task" and size):
                groups += 1  # a step, or the task, which starts its own (pinned) group
                size = 0
            size += 1
            n = estimate_message(msg) if estimate else self.counter.count([msg])
            counts.append(n)
            tokens += n
            if not valid:
                pass
            elif role == "tool":  # the call/result order, as `validate_history` checks it
                if msg.tool_call_id in open_calls:
                    answered = msg.tool_call_id
                    open_calls = tuple(c for c in open_calls if c != answered) if len(open_calls) > 1 else ()
                    if limit is not None and len(msg.content) > limit and self._first_long < 0:
                        self._first_long = groups - 1
                else:
                    valid = False
            elif open_calls:
                valid = False
            elif msg.tool_calls:
                calls = msg.tool_calls
                open_calls = (calls[0].id,) if len(calls) == 1 else tuple(c.id for c in calls)
                valid = len(calls) == 1 or len(set(open_calls)) == len(calls)
        self._open_calls, self._valid = open_calls, valid
        self._group_count, self._last_group_size, self._tokens = groups, size, tokens
        self._seen = end
        self._last = source[-1]

    def _sync(self, source: Sequence[Message]) -> None:
        """Scan the new messages, then put them in their groups."""
        self._scan(source)
        if self._grouped == self._seen:
            return
        for index in range(self._grouped, self._seen):
            msg = source[index]
            if msg.role == "assistant":
                self._groups.append(_Group(is_step=True))
            elif msg.kind == "task" and self._groups[-1].messages:
                self._groups.append(_Group())  # the task starts its own (pinned) group
            group = self._groups[-1]
            group.add(msg, self._counts[index])
            position = len(self._groups) - 1
            if position and group.pinned and (not self._pinned or self._pinned[-1] != position):
                self._pinned.append(position)
        self._grouped = self._seen

    def _clean(self, group: _Group) -> tuple[list[Message], int]:
        size = len(group.messages)
        if group._clean is None or group._clean[0] != size:
            fixed = _repaired(group)
            if fixed is None:
                group._clean = (size, group.messages, group.tokens)
            else:
                group._clean = (size, fixed, self._count(fixed))
        return group._clean[1], group._clean[2]

    def _compact(self, group: _Group) -> tuple[list[Message], int]:
        """The group with long observations cut (for steps older than `keep_steps`)."""
        limit = self.old_observation_chars
        size = len(group.messages)
        if limit is None:
            return self._clean(group)
        if group._compact is None or group._compact[0] != size:
            msgs = self._clean(group)[0]
            cut = [
                m.model_copy(update={"content": truncate_output(m.content, limit)[0]})
                if m.role == "tool" and len(m.content) > limit
                else m
                for m in msgs
            ]
            group._compact = (size, cut, self._count(cut))
        return group._compact[1], group._compact[2]

    def _form(self, index: int, old_before: int) -> tuple[list[Message], int]:
        group = self._groups[index]
        if group.is_step and index < old_before:
            return self._compact(group)
        return self._clean(group)

    def _count(self, messages: Sequence[Message]) -> int:
        count = self.counter.count
        return sum(count([m]) for m in messages)

    def _reserve_for(self, system: str | None, tools: Sequence[ToolDefinition]) -> int:
        if system is self._reserve_for_system and tools is self._reserve_for_tools:
            return self._reserve  # the same objects as last time (the loop caches them)
        self._reserve_for_system, self._reserve_for_tools = system, tools
        key = (system or "", tuple(t.name for t in tools))
        if key != self._reserve_key:
            self._reserve_key = key
            known = self.reserve_cache.get(key)
            if known is None:
                sys_tokens = self.counter.count([Message.system(system)]) if system else 0
                known = self.reserve_cache[key] = sys_tokens + estimate_tools(tools)
            self._reserve = known
        return self._reserve

    # -------------------------------------------------------------------------------- planning

    def _plan(self, state: RunState, source: Sequence[Message], reserve: int) -> tuple[list[Message], int]:
        """Decide which old steps the view drops (monotonic: a dropped step stays dropped), and return
        the view with its tokens.

        Steps are dropped only when the view with the summary in their place is smaller: a few short
        steps (remembered turns, say) can cost less than the summary note that would replace them.
        """
        self._sync(source)
        assembled = self._assemble(state)
        if (assembled[1] + reserve) * self.scale <= self.budget:
            return assembled
        groups = self._groups
        old_before = len(groups) - self.keep_steps
        kept = sum(self._form(i, old_before)[1] for i in self._kept_indexes())
        protected = self._protected_from()
        target = self.max_context_tokens * self.trim_to
        summary = self._summary_reserve()
        index = self._dropped
        while (kept + summary + reserve) * self.scale > target and index < protected:
            if not groups[index].pinned:
                kept -= self._form(index, old_before)[1]
            index += 1
        for candidate in (index, protected):  # the drop must pay for its summary; else drop more, or none
            if candidate <= self._dropped:
                continue
            was = self._dropped, self._dropped_count
            self._dropped = candidate
            self._dropped_count = candidate - 1 - sum(1 for p in self._pinned if p < candidate)
            trimmed = self._assemble(state)
            if trimmed[1] < assembled[1]:
                return trimmed
            self._dropped, self._dropped_count = was
        return assembled

    def _kept_indexes(self) -> list[int]:
        dropped = self._dropped
        return [0, *(p for p in self._pinned if p < dropped), *range(dropped, len(self._groups))]

    def _protected_from(self) -> int:
        """Index of the first group of the newest groups that hold at least `min_messages` messages."""
        messages = 0
        index = len(self._groups)
        while index > 1 and messages < self.min_messages:
            index -= 1
            messages += len(self._groups[index].messages)
        return max(index, 1)

    # -------------------------------------------------------------------------------- assembling

    def _assemble(self, state: RunState) -> tuple[list[Message], int]:
        """The view and its tokens: the settled prefix (cached), then the newest `keep_steps` groups."""
        groups = self._groups
        old_before = len(groups) - self.keep_steps
        prefix = self._settled(state, old_before)
        out = list(prefix.messages)
        tokens = prefix.tokens
        for index in range(prefix.upto, len(groups)):
            msgs, count = self._form(index, old_before)
            out.extend(msgs)
            tokens += count
        return out, tokens

    def _settled(self, state: RunState, old_before: int) -> _Prefix:
        """The start of the view that no longer changes: head, pinned groups, summary, old steps.

        Steps older than the newest `keep_steps` are closed and already in their compact form, so the
        prefix is only extended as steps age, and rebuilt only when the trim or the summary changes.
        """
        covered = self._model_summary[0] if self._model_summary else 0
        key = (self._dropped, covered, len(self._groups[0].messages), self.max_context_tokens)
        prefix = self._prefix
        if prefix is None or prefix.key != key:
            prefix = self._prefix = _Prefix(key)
            for index in (0, *(p for p in self._pinned if p < self._dropped)):
                msgs, count = self._form(index, old_before)
                prefix.add(msgs, count)
            if self._dropped_count:
                message, count = self._summary_message(state)
                prefix.add([message], count)
            prefix.upto = self._dropped
        while prefix.upto < old_before:
            msgs, count = self._form(prefix.upto, old_before)
            prefix.add(msgs, count)
            prefix.upto += 1
        return prefix

    def _squeeze(self, view: list[Message]) -> tuple[list[Message], int]:
        """Last resort when even the kept messages do not fit: shorten them, in passes, until they do.

        1. observations (tool results) down to `_SQUEEZE_FLOOR` characters;
        2. remembered turns (kind "memory"), the summary and the older assistant texts, as far;
        3. observations again, evenly, down to `_MIN_KEPT` characters each (the newest group's too:
           many parallel results must fit);
        4. the texts of pass 2 again, as far.

        Each pass cuts the longest texts first to a common length (head and tail, with a marker saying
        how much was cut), only as much as the excess needs. Only contents change: no message is
        dropped, so no call loses its result, and the task message is never cut (the system prompt is
        not in the view). Runs only over budget; the view that fits is never squeezed.
        """
        out = list(view)
        count = self.counter.count
        counts = [count([m]) for m in out]
        allowed = self.budget / self.scale - self._last_reserve  # the tokens the messages may take
        if sum(counts) <= allowed:
            return out, sum(counts) + self._last_reserve
        newest = max((i for i, m in enumerate(out) if m.role == "assistant"), default=len(out))
        tools = [i for i, m in enumerate(out) if m.role == "tool" and m.content != NO_RESULT]  # short: kept
        texts = [  # never the task, nor the newest assistant message (nor the system prompt: not in the view)
            i
            for i, m in enumerate(out)
            if (m.kind in ("memory", "summary") and m.role != "system")
            or (m.role == "assistant" and i < newest)
        ]
        passes = [(tools, None), (texts, None), (tools, _MIN_KEPT), (texts, _MIN_KEPT)]
        room = sum(max(len(out[i].content) - _SQUEEZE_FLOOR, 0) for i in (*tools, *texts))
        if room < (sum(counts) - allowed) * 3:  # passes 1-2 cannot do: pass 3 cuts the observations anyway
            del passes[0]  # (from the originals, to the same length: pass 1 would only be done twice)
        for indexes, keep in passes:
            for _ in range(3):  # the estimate is 3 characters a token; a tokenizer may need another round
                excess = sum(counts) - allowed
                if excess <= 0 or not indexes:
                    break
                changed = _cut_evenly(view, out, indexes, int(excess * 3) + 3 * len(indexes) + 16, keep)
                if not changed:
                    break
                for i in changed:
                    counts[i] = count([out[i]])
        return out, sum(counts) + self._last_reserve

    # ---------------------------------------------------------------------------------- summary

    @property
    def _summary_chars(self) -> int:
        """The longest summary: `summary_max_chars`, within a fifth of a small window."""
        return min(self.summary_max_chars, max(self.max_context_tokens * 3 // 5, 300))

    @property
    def _goal_chars(self) -> int:
        """How much of the task the summary restates."""
        return min(400, self._summary_chars // 4)

    @property
    def _body_chars(self) -> int:
        """The summary's body length (the rest of the summary is its header and the task)."""
        chars = self._summary_chars
        return max(chars - 160 - self._goal_chars, min(200, chars // 3))

    def _summary_reserve(self) -> int:
        return self._summary_chars // 3 + 16

    def _summary_tokens(self) -> int:
        return self._summary_cache[2] if self._summary_cache else self._summary_reserve()

    def _summary_message(self, state: RunState) -> tuple[Message, int]:
        key = (self._dropped, self._model_summary[0] if self._model_summary else 0, self.max_context_tokens)
        if self._summary_cache is None or self._summary_cache[0] != key:
            message = Message.user(self._summary_text(state), kind="summary")
            self._summary_cache = (key, message, self.counter.count([message]))
        return self._summary_cache[1], self._summary_cache[2]

    def _summary_text(self, state: RunState) -> str:
        dropped = [g for g in self._groups[1 : self._dropped] if not g.pinned]
        head = f"[Context summary: {len(dropped)} earlier step(s) were removed to save space.]"
        if self._model_summary is not None and self._model_summary[0] == self._dropped:
            body = _clip_lines(self._model_summary[1], self._body_chars)
        else:
            body = self._deterministic_summary(state, dropped)
        goal = state.goal or next((m.content for m in self._groups[0].messages if m.role == "user"), "")
        task_before = any(g.has_task for g in self._groups[: self._dropped])
        reminder = f"\nThe task is still: {_clip(goal, self._goal_chars)}" if goal and task_before else ""
        return f"{head}\n{body}{reminder}".strip()

    def _deterministic_summary(self, state: RunState, dropped: list[_Group]) -> str:
        """One line per tool call of the dropped steps (newest kept when too long)."""
        lines: list[str] = []
        for group in dropped:
            lines.extend(self._lines(state, group))
        budget = self._body_chars
        kept: list[str] = []
        for line in reversed(lines):
            if budget - len(line) - 1 < 0:
                kept.append(f"- ({len(lines) - len(kept)} older line(s) omitted)")
                break
            budget -= len(line) + 1
            kept.append(line)
        return "\n".join(reversed(kept))

    def _lines(self, state: RunState, group: _Group) -> list[str]:
        size = len(group.messages)
        if group._lines is None or group._lines[0] != size:
            group._lines = (size, _summarise_group(state, self._clean(group)[0]))
        return group._lines[1]

    # ---------------------------------------------------------------------------------- overflow

    def shrink(self, to_tokens: int | None = None, *, prompt_tokens: int | None = None) -> int:
        """Lower this run's context budget after the provider rejected the last view as too long (SPEC §7
        extension); return the new `max_context_tokens`.

        `to_tokens` is the new limit (the model's window minus the reply room), or None when the provider did
        not say: then the view that was sent is cut by 40 %. `prompt_tokens`, the rejected prompt's size as
        the provider counted it, recalibrates the token estimate (which counted `last_tokens` for it);
        without it the limit also goes 25 % below what was sent, so the next view is surely smaller. The
        limit never goes below 256 tokens and never rises. Steps already dropped stay dropped; the next
        `view()` drops older steps (whole, so no tool result loses its call) until the view fits.

        Only this manager changes: an agent gives each run its own, sharing only the token counter and the
        reserve cache (tokens of system prompts and tool lists), which do not depend on the limit.
        """
        if prompt_tokens and self.last_tokens > 0:
            self.scale = max(self.scale, prompt_tokens / self.last_tokens)
            self._calibrated = True
        sent = int(self.last_tokens * self.scale) or self.max_context_tokens
        target = to_tokens if to_tokens is not None else int(sent * 0.6)
        if not prompt_tokens:
            target = min(target, int(sent * 0.75))
        self.max_context_tokens = min(max(target, 256), self.max_context_tokens)  # a window under 256 stays
        return self.max_context_tokens


def _summarise_group(state: RunState, messages: list[Message]) -> list[str]:
    head = messages[0]
    step = f"step {head.step}" if head.step is not None else "a step"
    if head.kind == "memory":
        step = "an earlier turn"
    if not head.tool_calls:
        return [f"- {step}: said: {_clip(head.content, 160)}"] if head.content.strip() else []
    results = {m.tool_call_id: m for m in messages if m.role == "tool"}
    lines = []
    for call in head.tool_calls:
        args = call.raw_arguments if call.raw_arguments is not None else _json(call.arguments)
        result = results.get(call.id)
        entry = state.ledger.get(call.id)
        failed = entry is not None and entry.success is False
        outcome = _clip(result.content, 120) if result is not None else "(no result)"
        verb = "failed" if failed else "→"
        lines.append(f"- {step}: {call.name}({_clip(args, 100)}) {verb} {outcome}")
    return lines


def _cut_evenly(
    originals: Sequence[Message], out: list[Message], indexes: list[int], excess: int, keep: int | None
) -> list[int]:
    """Shorten the texts of `out[indexes]` longer than a common length, the longest that saves `excess`
    characters, not below a floor (`_SQUEEZE_FLOOR`, or `keep` characters plus the marker); return the
    indexes changed. Texts are cut from `originals`, so the marker counts all that is missing."""
    lengths = [len(out[i].content) for i in indexes]
    floor = _SQUEEZE_FLOOR
    if keep is not None:
        longest = max(len(originals[i].content) for i in indexes)
        floor = keep + len(f"\n… [{longest} characters truncated of {longest}] …\n")
    cap = _common_length(lengths, excess, floor)
    if cap is None:
        return []
    changed = []
    for i, length in zip(indexes, lengths, strict=True):
        if length > cap:
            text = originals[i].content
            out[i] = originals[i].model_copy(update={"content": truncate_output(text, cap)[0]})
            changed.append(i)
    return changed


def _common_length(lengths: list[int], excess: int, floor: int) -> int | None:
    """The longest length L ≥ `floor` such that cutting every text longer than L to L saves `excess`
    characters (`floor` when even that does not); None when no text is longer than `floor`."""
    over = sorted((n for n in lengths if n > floor), reverse=True)
    total = 0
    for k, length in enumerate(over, 1):
        total += length
        below = over[k] if k < len(over) else floor  # the next length: L may not go under it with k cut
        cap = (total - excess) // k
        if cap >= below:
            return cap
    return floor if over else None


def _clip_lines(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def _clip(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
