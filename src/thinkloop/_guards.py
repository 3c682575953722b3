"""Guards that keep a run on track (SPEC §4.5–4.7, §5.1).

- **Loop detection.** A call's signature is its tool name + the canonical JSON of its arguments (key
  order and whitespace do not matter). The second and third identical calls run, and their results
  carry a note saying so; above `max_identical_calls` identical calls the call is not run and the
  model is told to change approach — unless the last two results differed: a poll of something that
  changes (a job's status) runs up to `max_polls` times. Alternation is blocked the same way: after A, B, A, B with
  unchanged results, a fifth A does not run (a poll whose result changes is not a loop). When the model keeps going — `max_blocked_steps` steps in a row
  whose calls were all blocked — the run stops as `dangerous_loop`.
- **Repeated errors.** A step whose executed calls all failed has an error fingerprint; the same
  fingerprint twice in a row gets a "change approach" hint, `max_repeated_errors` in a row stop the
  run as `dangerous_loop`. Errors that differ only in their numbers and quoted values ("section 8 is
  not available", "section 9 is not available": a model guessing values) get a hint of their own after
  three in a row, but never stop the run: trying other values may be legitimate exploration.
- **Consecutive failures.** A failed observation is an executed call whose `ToolOutcome.success` is
  False: a tool error or exception, invalid arguments, an unknown tool, a denied call, a timeout.
  Blocked repeats are counted by the loop detector instead. Any success resets the counter.
- **No progress.** A step is useful when one of its calls succeeded with a result not seen before in
  the run (or when `GuardConfig.is_useful` says so); `no_progress_threshold + 2` steps in a row
  without a useful one stop the run as `no_progress`.
- **Checkpoint hints** (zero extra model calls): at rounds 4/8/12 of 16, scaled to `max_steps`, a user
  message: "change approach" at round 4 when stuck (over half the calls were repeats, ≥ 3 failures in
  a row, or a repeated error), "summarise; answer if you can" at round 8, "N steps left, answer now"
  at round 12.

All counters live in `RunState.guards`, so a saved and resumed run continues with the same counters.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._errors import ConfigurationError
from ._messages import ToolCall, arguments_json
from ._prompt import placeholders, template_problem
from ._state import GuardState, RunState, StopReason

if TYPE_CHECKING:
    from ._execute import ToolOutcome

DEFAULT_HINTS: dict[str, str] = {
    "change_approach": (
        "Checkpoint: many of your recent tool calls repeated earlier calls or failed. Stop and change your "
        "approach: use different arguments or a different tool, or answer with what you already know."
    ),
    "repeated_thought": (
        "Checkpoint: you have written the same reasoning {count} times in a row, so you are going in "
        "circles. Look at the results you already have: if they answer the task, give the final answer now; "
        "otherwise try something different."
    ),
    "repeated_error": (
        "Checkpoint: your last {count} steps failed with the same error. Repeating the call will not help: "
        "read the error, then change the arguments or the tool, or answer with what you already know."
    ),
    "similar_errors": (
        "Checkpoint: your last {count} steps failed with the same error, each time for another value. "
        "Guessing more values will not help: read the error (it may say which values exist), then use a value "
        "it names or a different tool, or answer with what you already know."
    ),
    "summarise": (  # restates the task: asked to "summarise", small models gave the summary as the answer
        "Checkpoint: you are halfway through your step budget. The task: {goal} "
        "If the results so far answer it, give the final answer now; otherwise go on with the next step."
    ),
    "answer_now": (
        "Checkpoint: only {remaining} step(s) left. Do not start new tool calls: give your final answer now "
        "from what you know."
    ),
    "repeat_note": (
        "Note: you already made this exact call and got this result. Do not repeat it: use the result, or "
        "give the final answer if it answers the task."
    ),
    "made_up_numbers": (  # after a calculator call none of whose numbers the task or a result gives
        "Note: none of {numbers} is in the task or an observation. If the task needs values looked up "
        "(prices, rates, counts …), look them up with a tool first ({tools}) and compute with those; a "
        "result computed from made-up values is no answer."
    ),
    "blocked": (
        "Blocked: {name} was already called {count} times with these same arguments; it was NOT run again. "
        "The earlier result stands. Change your approach, or give the final answer now."
    ),
    "poll_limit": (
        "Blocked: {name} was already called {count} times with these same arguments; it was NOT run again. "
        "Its result kept changing, but waiting longer will not help: give the final answer now from the latest "
        "result, or change your approach."
    ),
    "alternating": (
        "Blocked: you are alternating between the same two steps and getting the same results; this call "
        "({name}) was NOT run. Change your approach, or give the final answer now."
    ),
}

_MALFORMED = frozenset({"unknown_tool", "invalid_arguments"})  # calls that need a correction (a heal)

_STOP_TEXTS = {
    "blocked": "The run was stopped because the model kept repeating tool calls that had already been made.",
    "errors": "The run was stopped because the model kept making calls that failed with the same error.",
    "thoughts": "The run was stopped because the model kept repeating the same reasoning.",
}


@dataclass(frozen=True)
class GuardConfig:
    """Settings of the guards.

    Args:
        max_identical_calls: identical calls (same tool, same arguments) that run; the next is blocked —
            unless the last two gave different results (a poll of something that changes: a job's status).
        max_polls: identical calls that run while their results keep changing; the next is blocked.
        max_blocked_steps: steps in a row whose calls were all blocked before `dangerous_loop`.
        max_repeated_errors: steps in a row failing with the same error before `dangerous_loop`.
        max_repeated_thoughts: steps in a row with the same reasoning text that bring no new result
            before `dangerous_loop` — a small model going in circles with varying arguments; one step
            earlier it gets a hint. A step with a new result ends the streak: the same words for each
            of several items (a lookup per city) are a routine, not a circle.
        no_progress_threshold: `no_progress` after this + 2 steps without a useful result.
        checkpoint_hints: inject the checkpoint hints at rounds 4/8/12 of 16 (scaled to `max_steps`).
        max_heals: unreadable replies in a row that are corrected before the run stops with `error`.
        native_fallback_after: malformed native tool calls before the run switches to text ReAct (the
            first call written as text switches it at once: the server does not parse calls).
        hints: replacement texts by key (see `DEFAULT_HINTS`; `{remaining}`, `{count}`, `{name}` are
            filled in).
        is_useful: `(outcome, guard_state) -> bool`, what counts as progress (default: a successful
            call whose result was not seen before in the run).
        answer_checks: check a final answer given after tool calls against their results — arithmetic
            written out wrong is put right, numbers no result gives and a "most"/"cheapest" its own
            figures contradict are asked about once, the answer is cut to the form the task asks for
            ("answer with just the number"). `None` (the default): in text ReAct, where small models
            work; `True`: with native tool calling too (a small model behind an OpenAI-compatible
            server); `False`: never (a strong model, whose rare false alarm would cost a model call).
    """

    max_identical_calls: int = 3
    max_polls: int = 10
    max_blocked_steps: int = 2
    max_repeated_errors: int = 4
    max_repeated_thoughts: int = 4
    no_progress_threshold: int = 3
    checkpoint_hints: bool = True
    max_heals: int = 3
    native_fallback_after: int = 2
    hints: dict[str, str] = field(default_factory=dict)
    is_useful: Callable[[ToolOutcome, GuardState], bool] | None = None
    answer_checks: bool | None = None

    def __post_init__(self) -> None:
        if not (self.answer_checks is None or isinstance(self.answer_checks, bool)):
            raise ConfigurationError(
                f"GuardConfig answer_checks must be None, True or False, got {self.answer_checks!r}"
            )
        for name in ("max_identical_calls", "max_polls", "max_blocked_steps", "max_repeated_errors",
                     "max_repeated_thoughts", "no_progress_threshold", "max_heals", "native_fallback_after"):  # fmt: skip
            value, least = getattr(self, name), 0 if name in ("no_progress_threshold", "max_heals") else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigurationError(
                    f"GuardConfig {name} must be a whole number of at least {least}, got {value!r}"
                )
        unknown = sorted(set(self.hints) - set(DEFAULT_HINTS)) if isinstance(self.hints, dict) else None
        if unknown is None or unknown or not all(isinstance(v, str) for v in self.hints.values()):
            raise ConfigurationError(
                f"GuardConfig hints must map keys of {sorted(DEFAULT_HINTS)} to texts, got {self.hints!r}"[
                    :400
                ]
            )
        for key, text in self.hints.items():
            problem = template_problem(text, placeholders(DEFAULT_HINTS[key]), unknown_ok=True)
            if problem is not None:
                raise ConfigurationError(f"GuardConfig hints[{key!r}] cannot be filled in: {problem}")

    def hint(self, key: str, **values: Any) -> str:
        template = self.hints.get(key, DEFAULT_HINTS[key])
        try:
            return template.format_map(values)
        except KeyError:  # a placeholder of a replacement text that is not filled in here stays as it is
            return template.format_map(_Defaults(values))


class _Defaults(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def signature(call: ToolCall) -> str:
    """Tool name + canonical JSON of the arguments: key order and whitespace do not matter.

    Arguments longer than 200 characters are kept as a digest, so the run state stays small.
    """
    args = call.raw_arguments.strip() if call.raw_arguments is not None else arguments_json(call.arguments)
    if len(args) > 200:
        args = f"#{hashlib.blake2b(args.encode(errors='replace'), digest_size=12).hexdigest()}"
    return f"{call.name}:{args}"


_last_digest: tuple[str, str] = ("", "")


_SHORT = 24


def _digest(text: str) -> str:
    """A short fingerprint of a text; the last one is remembered (a result is fingerprinted twice a step).

    A text of up to 24 characters is its own fingerprint, marked with `=` (hex digests never start so):
    hashing costs more than the short results it would shorten (a number, "ok", "not found")."""
    global _last_digest
    last = _last_digest  # read once: other threads may replace it
    if text is last[0]:
        return last[1]
    stripped = text.strip()
    if len(stripped) <= _SHORT:
        digest = f"={stripped}"
    else:
        digest = hashlib.blake2b(stripped.encode(errors="replace"), digest_size=8).hexdigest()
    _last_digest = (text, digest)
    return digest


_VALUES_RE = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"|\d+(?:[.,:/-]\d+)*")


def _error_fingerprint(text: str) -> str:
    """`exact/similar`: the digest of an error, and of the error with its numbers and quoted values
    blanked (errors of one call tried with other values share the second part)."""
    similar = hashlib.blake2b(_VALUES_RE.sub("#", text).strip().encode(errors="replace"), digest_size=8)
    return f"{_digest(text)}/{similar.hexdigest()}"


# Errors differing only in their values, in a row, that get the "similar_errors" hint: at two, a model
# trying another date after a failure was told to stop guessing and wandered off to unrelated tools
# (benchmarks/README.md, eighth session); three is guessing.
_GUESSES = 3


def _similar_streak(errors: list[str]) -> int:
    """How many error fingerprints at the end of `errors` share their `similar` part (states saved before
    it existed hold the exact digest alone)."""
    return _streak([e.rpartition("/")[2] for e in errors[-8:]])


def _push(items: list[str], item: str, keep: int) -> None:
    """Append `item`, keeping the last `keep` items (in place)."""
    items.append(item)
    if len(items) > keep:
        del items[: len(items) - keep]


def _streak(items: list[str]) -> int:
    """How many items at the end of `items` are equal to the last one."""
    if not items:
        return 0
    count = 0
    for item in reversed(items):
        if item != items[-1]:
            break
        count += 1
    return count


class Guards:
    """The guard logic of one run; all state it reads and writes is `state.guards`."""

    def __init__(self, config: GuardConfig | None = None) -> None:
        self.config = config or GuardConfig()
        self._signatures: dict[str, str] = {}  # call id -> signature, of the calls of the current step
        self._rounds: tuple[int, frozenset[int]] = (-1, frozenset())  # (max_steps, its hint rounds)

    def signature(self, call: ToolCall) -> str:
        """The call's signature (computed once per call of the current step)."""
        sig = self._signatures.get(call.id)
        return sig if sig is not None else signature(call)

    # -------------------------------------------------------------------------------- loop detection

    def screen(self, state: RunState, calls: list[ToolCall]) -> dict[str, str]:
        """Count the calls' signatures; return {call_id: message} for the calls that must not run."""
        g = state.guards
        if len(calls) != 1:
            return self._screen_many(g, calls)
        call = calls[0]  # the common case, one call: without the lists and loops of `_screen_many`
        sig = signature(call)
        self._signatures = {call.id: sig}
        recent = g.recent_signatures
        # A, B, A, B and now A: the step two back must start with this signature (a cheap test first)
        alternating = len(recent) >= 4 and recent[-2].startswith(sig) and _alternates(recent, sig)
        counts = g.signature_counts
        count = counts[sig] = counts.get(sig, 0) + 1
        g.total_calls += 1
        if count > 1:
            g.repeated_calls += 1
        message = None
        if count > self.config.max_identical_calls:
            message = self._repeated(g, call, sig, count)
        elif alternating:
            message = self.config.hint("alternating", name=call.name)
        recent.append(sig)
        if len(recent) > 8:
            del recent[0]
        if message is None:
            g.consecutive_blocked = 0
            return {}
        g.blocked_calls += 1
        g.consecutive_blocked += 1
        return {call.id: message}

    def _screen_many(self, g: GuardState, calls: list[ToolCall]) -> dict[str, str]:
        """`screen` of a step with several calls, or none (the same rules)."""
        sigs = [signature(c) for c in calls]
        self._signatures = {c.id: sig for c, sig in zip(calls, sigs, strict=True)}
        step_sig = "|".join(sorted(sigs))
        alternating = _alternates(g.recent_signatures, step_sig)
        blocked: dict[str, str] = {}
        counts, most = g.signature_counts, self.config.max_identical_calls
        for call, sig in zip(calls, sigs, strict=True):
            count = counts[sig] = counts.get(sig, 0) + 1
            if count > 1:
                g.repeated_calls += 1
            if count > most:
                message = self._repeated(g, call, sig, count)
                if message is not None:
                    blocked[call.id] = message
            elif alternating:
                blocked[call.id] = self.config.hint("alternating", name=call.name)
        g.total_calls += len(calls)
        _push(g.recent_signatures, step_sig, 8)
        g.blocked_calls += len(blocked)
        all_blocked = bool(calls) and len(blocked) == len(calls)
        g.consecutive_blocked = g.consecutive_blocked + 1 if all_blocked else 0
        return blocked

    def _repeated(self, g: GuardState, call: ToolCall, sig: str, count: int) -> str | None:
        """Why a call made more than `max_identical_calls` times is blocked; None for a poll whose last two
        results differed, the last call a success (up to `max_polls` calls)."""
        # failing again (with another message each time) is no poll
        if g.consecutive_failures or not _polling(g.recent_signatures, sig):
            return self.config.hint("blocked", name=call.name, count=count - 1)
        if count > self.config.max_polls:
            return self.config.hint("poll_limit", name=call.name, count=count - 1)
        return None

    def is_repeat(self, state: RunState, call: ToolCall, output: str | None = None) -> bool:
        """True when this exact call was made before in the run (and, given `output`, gave it before).

        The loop then adds the "you already made this exact call" note to the result; a repeated call
        whose result changed (a poll) gets no note.
        """
        if state.guards.signature_counts.get(self.signature(call), 0) <= 1:
            return False
        return output is None or _digest(output) in state.guards.seen_results

    # ------------------------------------------------------------------------------------ observing

    def observe(self, state: RunState, outcomes: list[ToolOutcome]) -> frozenset[str]:
        """Update the failure, repeated-error and progress counters from one step's outcomes, and the heal
        count: a step whose calls were all malformed (an unknown tool, invalid arguments) is a failed heal,
        any other resets it (`note_heal`). Returns the ids of the successful calls that repeat an earlier
        call exactly, result included (`is_repeat`, as it was before this step): the loop notes it to the
        model."""
        g = state.guards
        if len(outcomes) != 1:
            return self._observe_many(state, outcomes)
        outcome = outcomes[0]  # the common case, one call: its result's digest taken once
        kind, success = outcome.error_kind, outcome.success
        g.heal_failures = g.heal_failures + 1 if kind in _MALFORMED else 0
        executed = kind != "repeated_call"
        digest = _digest(outcome.output)
        call = outcome.call
        repeat = (  # `is_repeat`, written out
            success
            and g.signature_counts.get(self._signatures.get(call.id) or signature(call), 0) > 1
            and digest in g.seen_results
        )
        if executed:
            if success:
                g.consecutive_failures = 0
                if g.recent_errors:
                    g.recent_errors.clear()
            else:
                g.consecutive_failures += 1
                _push(g.recent_errors, _error_fingerprint(f"{call.name}:{outcome.output}"), 8)
        seen = g.seen_results
        new = success and digest not in seen  # `_useful`, written out
        if new:
            seen.append(digest)
            if len(seen) > 64:
                del seen[0]
        useful = new if self.config.is_useful is None else bool(self.config.is_useful(outcome, g))
        g.steps_without_progress = 0 if useful else g.steps_without_progress + 1
        if useful and g.recent_thoughts:  # a routine, not a circle (`_observe_many`)
            g.recent_thoughts.clear()
        recent = g.recent_signatures
        if recent:  # `_note_results` of one outcome
            last = recent[-1]  # this step's signature, without a result yet
            sig = last if "#" not in last else last.split("#", 1)[0]
            recent[-1] = f"{sig}#{digest if executed else _earlier_result(recent, sig, digest)}"
        return frozenset((call.id,)) if repeat else _NONE

    def _observe_many(self, state: RunState, outcomes: list[ToolOutcome]) -> frozenset[str]:
        """`observe` of a step with several calls, or none (the same rules)."""
        g = state.guards
        repeats = frozenset(
            o.call.id for o in outcomes if o.success and self.is_repeat(state, o.call, o.output)
        )
        g.heal_failures = g.heal_failures + 1 if all(o.error_kind in _MALFORMED for o in outcomes) else 0
        executed = [o for o in outcomes if o.error_kind != "repeated_call"]
        succeeded = False
        for outcome in executed:
            succeeded = succeeded or outcome.success
            g.consecutive_failures = 0 if outcome.success else g.consecutive_failures + 1
        if succeeded:
            if g.recent_errors:
                g.recent_errors.clear()
        elif executed:
            errors = "\n".join(sorted(f"{o.call.name}:{o.output}" for o in executed))
            _push(g.recent_errors, _error_fingerprint(errors), 8)
        useful = False
        for outcome in outcomes:  # every outcome is looked at (it may be a result not seen before)
            useful = self._useful(outcome, g) or useful
        g.steps_without_progress = 0 if useful else g.steps_without_progress + 1
        if useful and g.recent_thoughts:  # reasoning repeated while new results come in is a routine
            g.recent_thoughts.clear()  # (the next of several items), not a circle
        if g.recent_signatures:
            _note_results(g.recent_signatures, outcomes, blocked=not executed)
        return repeats

    def _useful(self, outcome: ToolOutcome, g: GuardState) -> bool:
        new = False
        if outcome.success:
            digest = _digest(outcome.output)
            new = digest not in g.seen_results
            if new:
                _push(g.seen_results, digest, 64)
        if self.config.is_useful is not None:
            return bool(self.config.is_useful(outcome, g))
        return new

    def note_thought(self, state: RunState, text: str) -> None:
        """Remember the reasoning of a step that calls tools (whitespace and case ignored)."""
        normal = " ".join(text.lower().split())
        if len(normal) >= 12:
            _push(state.guards.recent_thoughts, _digest(normal), 8)

    def note_heal(self, state: RunState, malformed: bool) -> bool:
        """Count a reply that needed a correction (or reset on a good one); True when healing has failed."""
        g = state.guards
        g.heal_failures = g.heal_failures + 1 if malformed else 0
        return g.heal_failures > self.config.max_heals

    def note_malformed_native(self, state: RunState) -> bool:
        """Count a malformed native tool call; True when the run should switch to text ReAct."""
        g = state.guards
        g.malformed_native_replies += 1
        return g.malformed_native_replies >= self.config.native_fallback_after

    # -------------------------------------------------------------------------------------- stopping

    def stop_reason(self, state: RunState) -> StopReason | None:
        """`dangerous_loop` or `no_progress` when the run must stop, else None."""
        g, config = state.guards, self.config
        if (  # the common case: no counter near its limit
            g.consecutive_blocked < config.max_blocked_steps
            and g.steps_without_progress < config.no_progress_threshold + 2
            and len(g.recent_errors) < config.max_repeated_errors
            and len(g.recent_thoughts) < config.max_repeated_thoughts
        ):
            return None
        if g.consecutive_blocked >= self.config.max_blocked_steps:
            state.metadata["guard_stop"] = "blocked"
            return StopReason.DANGEROUS_LOOP
        errors, thoughts = g.recent_errors, g.recent_thoughts  # a streak is never longer than its list
        if (
            len(errors) >= self.config.max_repeated_errors
            and _streak(errors) >= self.config.max_repeated_errors
        ):
            state.metadata["guard_stop"] = "errors"
            return StopReason.DANGEROUS_LOOP
        if (
            len(thoughts) >= self.config.max_repeated_thoughts
            and _streak(thoughts) >= self.config.max_repeated_thoughts
        ):
            state.metadata["guard_stop"] = "thoughts"
            return StopReason.DANGEROUS_LOOP
        if g.steps_without_progress >= self.config.no_progress_threshold + 2:
            state.metadata["guard_stop"] = "no_progress"
            return StopReason.NO_PROGRESS
        return None

    def describe(self, reason: StopReason, state: RunState | None = None) -> str:
        """A sentence saying why the guards stopped the run (told to the model and the user)."""
        if reason is StopReason.DANGEROUS_LOOP:
            cause = state.metadata.get("guard_stop") if state is not None else None
            return _STOP_TEXTS.get(str(cause), _STOP_TEXTS["blocked"])
        steps = self.config.no_progress_threshold + 2
        return f"The run was stopped because {steps} steps in a row produced no new useful result."

    # ----------------------------------------------------------------------------------------- hints

    def hint(self, state: RunState, max_steps: int) -> tuple[str, str] | None:
        """The hint due after step `state.step`, as (text, reason), or None; each step gets one at most."""
        g = state.guards
        if not self.config.checkpoint_hints or state.step in g.hints_given:
            return None
        if not (
            g.recent_errors or g.recent_thoughts
        ):  # the common case: no streak, and not a checkpoint round
            rounds = self._rounds
            if rounds[0] != max_steps:
                rounds = self._rounds = (max_steps, frozenset(hint_rounds(max_steps).values()))
            if state.step not in rounds[1]:
                return None
        key = self._checkpoint_key(state, max_steps)
        recent_errors = g.recent_errors
        errors, similar = (
            (_streak(recent_errors), _similar_streak(recent_errors)) if recent_errors else (0, 0)
        )
        guessing = similar >= _GUESSES and errors < 2
        if key is None and errors == 2:
            key = "repeated_error"
        elif key is None and guessing and similar == _GUESSES:
            key, errors = "similar_errors", similar
        elif key == "change_approach" and guessing:
            key, errors = (
                "similar_errors",
                similar,
            )  # the same advice, saying what goes wrong: guessing values
        thoughts = _streak(g.recent_thoughts)
        if key is None and thoughts == self.config.max_repeated_thoughts - 1:
            key, errors = "repeated_thought", thoughts
        if key is None:
            return None
        g.hints_given.append(state.step)
        text = self.config.hint(key, remaining=max(max_steps - state.step, 0), count=errors, goal=state.goal)
        return text, key

    def _checkpoint_key(self, state: RunState, max_steps: int) -> str | None:
        step, g = state.step, state.guards
        rounds = hint_rounds(max_steps)
        if step == rounds["change_approach"]:
            repeats = g.total_calls > 0 and g.repeated_calls / g.total_calls > 0.5
            stuck = repeats or g.consecutive_failures >= 3 or _streak(g.recent_errors) >= 2
            return "change_approach" if stuck else None
        if step == rounds["summarise"]:
            return "summarise"
        if step == rounds["answer_now"]:
            return "answer_now"
        return None


def _note_results(recent: list[str], outcomes: list[ToolOutcome], *, blocked: bool) -> None:
    """Add the step's result fingerprint to its signature (a blocked step keeps the earlier result)."""
    sig = recent[-1].split("#", 1)[0]
    results = _digest(outcomes[0].output if len(outcomes) == 1 else "\n".join(o.output for o in outcomes))
    recent[-1] = f"{sig}#{_earlier_result(recent, sig, results) if blocked else results}"


def _earlier_result(recent: list[str], sig: str, default: str) -> str:
    """The result fingerprint of the latest earlier step with signature `sig` (`default` if none)."""
    earlier = next((r for r in reversed(recent[:-1]) if r.split("#", 1)[0] == sig and "#" in r), None)
    return earlier.split("#", 1)[1] if earlier else default


_NONE: frozenset[str] = frozenset()


def _polling(recent: list[str], sig: str) -> bool:
    """True when the last two steps of signature `sig` (in the last 8 steps) ran and gave different results."""
    results = [r.split("#", 1)[1] for r in reversed(recent) if "#" in r and r.split("#", 1)[0] == sig][:2]
    return len(results) == 2 and results[0] != results[1]


def _alternates(recent: list[str], step_sig: str) -> bool:
    """True when the last steps were A, B, A, B — each time with the same result — and this one is A."""
    if len(recent) < 4:
        return False
    a1, b1, a2, b2 = recent[-4:]
    same_a = a1 == a2 and "#" in a2 and a2.split("#", 1)[0] == step_sig
    return same_a and b1 == b2 and "#" in b2 and b2.split("#", 1)[0] != step_sig


@functools.lru_cache(maxsize=64)
def hint_rounds(max_steps: int) -> dict[str, int]:
    """Rounds 4/8/12 of 16, scaled to `max_steps` (the last one at least a step before the end)."""
    scale = max_steps / 16
    return {
        "change_approach": max(1, round(4 * scale)),
        "summarise": max(2, round(8 * scale)),
        "answer_now": max(3, min(round(12 * scale), max_steps - 1)),
    }
