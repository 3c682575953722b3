"""Guards that keep a run on track (SPEC §4.5–4.7, §5.1).

- Loop detection: a call's signature is its tool name + canonical JSON of its arguments. Above
  `max_identical_calls` identical calls, the call is not executed and the model is told to change
  approach; A-B-A-B alternation is caught the same way. If the model keeps repeating blocked calls,
  the run stops as `dangerous_loop`.
- Consecutive failures: a failed observation is a tool error, a validation error, an unknown tool, a
  denied call, a timeout or a blocked repeat (`ToolOutcome.success is False`); any success resets it.
- No progress: a step is useful when it yields a successful result not seen before in the run (or what
  `is_useful` says); `no_progress_threshold + 2` steps in a row without one stop the run.
- Checkpoint hints: at rounds 4/8/12 of 16 (scaled to `max_steps`) a hint is added as a user message.

All counters live in `RunState.guards`, so a resumed run continues with the same counters.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._messages import ToolCall
from ._state import GuardState, RunState, StopReason

if TYPE_CHECKING:
    from ._execute import ToolOutcome

DEFAULT_HINTS: dict[str, str] = {
    "change_approach": (
        "Checkpoint: many of your recent tool calls repeated earlier calls or failed. Stop and change your "
        "approach: use different arguments or a different tool, or answer with what you already know."
    ),
    "summarise": (
        "Checkpoint: you are halfway through your step budget. Summarise what you have found so far. "
        "If you can already answer the task, give the final answer now."
    ),
    "answer_now": (
        "Checkpoint: only {remaining} step(s) left. Do not start new tool calls: give your final answer now "
        "from what you know."
    ),
    "repeat_note": (
        "Note: you already made this exact call and got this result. Do not repeat it: use the result, or "
        "give the final answer if it answers the task."
    ),
    "blocked": (
        "Blocked: {name} was already called {count} times with these same arguments; it was NOT run again. "
        "The earlier result stands. Change your approach, or give the final answer now."
    ),
    "alternating": (
        "Blocked: you are alternating between the same two calls ({a} and {b}); this call was NOT run. "
        "Change your approach, or give the final answer now."
    ),
}


@dataclass(frozen=True)
class GuardConfig:
    """Settings of the guards. Hint texts may use `{remaining}`; see `DEFAULT_HINTS` for the keys."""

    max_identical_calls: int = 3
    max_blocked_steps: int = 2
    no_progress_threshold: int = 3
    checkpoint_hints: bool = True
    max_heals: int = 3
    native_fallback_after: int = 2
    hints: dict[str, str] = field(default_factory=dict)
    is_useful: Callable[[ToolOutcome, GuardState], bool] | None = None

    def hint(self, key: str, **values: Any) -> str:
        return self.hints.get(key, DEFAULT_HINTS[key]).format(**values)


def signature(call: ToolCall) -> str:
    """Tool name + canonical JSON of the arguments: key order and whitespace do not matter."""
    args = call.raw_arguments if call.raw_arguments is not None else _canonical(call.arguments)
    return f"{call.name}:{args}"


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _digest(text: str) -> str:
    return hashlib.blake2b(text.strip().encode(), digest_size=8).hexdigest()


class Guards:
    """The guard logic; all state it reads and writes is `state.guards`."""

    def __init__(self, config: GuardConfig | None = None) -> None:
        self.config = config or GuardConfig()

    # -------------------------------------------------------------------------------- loop detection

    def screen(self, state: RunState, calls: list[ToolCall]) -> dict[str, str]:
        """Count the calls' signatures; return {call_id: message} for those that must not run."""
        g = state.guards
        blocked: dict[str, str] = {}
        for call in calls:
            sig = signature(call)
            count = g.signature_counts.get(sig, 0) + 1
            g.signature_counts[sig] = count
            g.total_calls += 1
            if count > 1:
                g.repeated_calls += 1
            reason = self._block_reason(g, call, sig, count)
            g.recent_signatures = [*g.recent_signatures[-7:], sig]
            if reason:
                blocked[call.id] = reason
                g.blocked_calls += 1
        g.consecutive_blocked = g.consecutive_blocked + 1 if blocked and len(blocked) == len(calls) else 0
        return blocked

    def _block_reason(self, g: GuardState, call: ToolCall, sig: str, count: int) -> str | None:
        if count > self.config.max_identical_calls:
            return self.config.hint("blocked", name=call.name, count=count - 1)
        recent = g.recent_signatures[-3:]
        if len(recent) == 3 and recent[0] == recent[2] == sig and recent[1] != sig:
            return self.config.hint("alternating", a=sig[:80], b=recent[1][:80])
        return None

    def is_repeat(self, state: RunState, call: ToolCall) -> bool:
        return state.guards.signature_counts.get(signature(call), 0) > 1

    # ------------------------------------------------------------------------------------ observing

    def observe(self, state: RunState, outcomes: list[ToolOutcome]) -> None:
        """Update failure, repeated-error and progress counters from one step's outcomes."""
        g = state.guards
        useful = False
        for outcome in outcomes:
            if outcome.success:
                g.consecutive_failures = 0
                g.recent_errors = []
            else:
                g.consecutive_failures += 1
                g.recent_errors = [*g.recent_errors[-4:], _digest(outcome.output)]
            useful = self._useful(outcome, g) or useful
        g.steps_without_progress = 0 if useful else g.steps_without_progress + 1

    def _useful(self, outcome: ToolOutcome, g: GuardState) -> bool:
        if self.config.is_useful is not None:
            return self.config.is_useful(outcome, g)
        if not outcome.success:
            return False
        digest = _digest(outcome.output)
        if digest in g.seen_results:
            return False
        g.seen_results = [*g.seen_results[-63:], digest]
        return True

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
        g = state.guards
        if g.consecutive_blocked >= self.config.max_blocked_steps:
            return StopReason.DANGEROUS_LOOP
        if len(g.recent_errors) >= 4 and len(set(g.recent_errors[-4:])) == 1:
            return StopReason.DANGEROUS_LOOP
        if g.steps_without_progress >= self.config.no_progress_threshold + 2:
            return StopReason.NO_PROGRESS
        return None

    def describe(self, reason: StopReason) -> str:
        if reason is StopReason.DANGEROUS_LOOP:
            return "The run was stopped because the model kept repeating the same action."
        return f"The run was stopped because {self.config.no_progress_threshold + 2} steps in a row produced nothing new."

    # ----------------------------------------------------------------------------------------- hints

    def hint(self, state: RunState, max_steps: int) -> tuple[str, str] | None:
        """The checkpoint hint due after step `state.step`, as (text, reason), or None."""
        if not self.config.checkpoint_hints:
            return None
        step, g = state.step, state.guards
        rounds = _hint_rounds(max_steps)
        if step in g.hints_given or step not in rounds.values():
            return None
        if step == rounds["change_approach"]:
            stuck = (g.total_calls and g.repeated_calls / g.total_calls > 0.5) or g.consecutive_failures >= 3
            if not stuck:
                return None
            key = "change_approach"
        else:
            key = "summarise" if step == rounds["summarise"] else "answer_now"
        g.hints_given.append(step)
        return self.config.hint(key, remaining=max(max_steps - step, 0)), key


def _hint_rounds(max_steps: int) -> dict[str, int]:
    """Rounds 4/8/12 of 16, scaled to `max_steps` (distinct and at least 1 apart where possible)."""
    scale = max_steps / 16
    return {
        "change_approach": max(1, round(4 * scale)),
        "summarise": max(2, round(8 * scale)),
        "answer_now": max(3, min(round(12 * scale), max_steps - 1)),
    }
