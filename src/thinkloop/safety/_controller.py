"""The safety controller (SPEC §6.2): the gate every tool call passes before it runs.

For each call the controller applies its `SafetyPolicy`: a blocked call is refused without asking
anyone; a call that may run on its own runs; any other call is put to the approval function (a person
at a terminal, a web page, or code), which approves, denies (optionally telling the model why) or
approves always for the rest of the run. No answer in time, an error in the approval function, or no
approval function at all mean *deny*. A refused call is never executed: `_execute` only runs calls the
gate allowed. Every decision is recorded in `RunState.approvals` and on the `tool_call` event.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import math
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TextIO

from pydantic import BaseModel, ConfigDict, Field

from .._errors import ConfigurationError
from .._events import ApprovalRequested, Decision
from .._execute import GateDecision, _validated_unwrapped, arguments_from_text
from .._messages import ToolCall
from .._risk import RiskLevel
from .._state import ApprovalRecord, LedgerEntry, RunState
from .._tools import Tool, ToolArgumentsError, _safe_str, tool_threads
from ._policy import Evaluation, SafetyMode, SafetyPolicy, ShellCommandRisk

if TYPE_CHECKING:
    from rich.console import Console

    from .._loop import RunContext

__all__ = [
    "ApprovalDecision",
    "ApprovalFunction",
    "ApprovalRequest",
    "PendingApprovals",
    "SafetyController",
    "approval_key",
    "console_approval",
]


class ApprovalRequest(BaseModel):
    """What the approval function is asked about: one tool call, its risk, and why it needs approval."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    step: int
    call: ToolCall
    tool: str
    description: str = ""
    arguments: dict[str, Any] = Field(default_factory=dict)
    risk: RiskLevel
    reason: str  # why approval is needed, with the command classifier's findings
    command: str | None = None  # the shell command, for command tools


class ApprovalDecision(BaseModel):
    """The answer to an `ApprovalRequest`.

    `approve_always` approves this call and every later call with the same approval key in this run
    (see `approval_key`). `message` is passed to the model when the call is denied.
    """

    model_config = ConfigDict(extra="forbid")

    action: Literal["approve", "deny", "approve_always"]
    message: str = ""

    @classmethod
    def approve(cls) -> ApprovalDecision:
        return cls(action="approve")

    @classmethod
    def approve_always(cls) -> ApprovalDecision:
        return cls(action="approve_always")

    @classmethod
    def deny(cls, message: str = "") -> ApprovalDecision:
        return cls(action="deny", message=message)


ApprovalResult = ApprovalDecision | bool
ApprovalFunction = Callable[[ApprovalRequest], Awaitable[ApprovalResult] | ApprovalResult]


def approval_key(tool_name: str, command: str | None, others: Mapping[str, Any] | None = None) -> str:
    """What "approve always" remembers, in `RunState.approved_tools`.

    For command tools (`shell`, `ssh_execute` …) it is the tool *and the exact command*
    (`"shell:systemctl status nginx"`): approving one command never approves another. `others` are the
    call's other arguments (the SSH tool's `host`): they are part of the key too, as JSON between the
    tool and the command (`'ssh_execute{"host":"staging"}:systemctl restart nginx'`), so that approving a
    command on one host never approves it on another. A call without other arguments keeps the key it had
    before (`"shell:…"`); a key kept from then for a call with others (`"ssh_execute:…"`) matches none of
    them now. For other tools it is the tool's name: every later call of that tool in the run runs
    without asking.
    """
    if command is None:
        return tool_name
    if not others:
        return f"{tool_name}:{command.strip()}"
    place = json.dumps(others, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr)
    return f"{tool_name}{place}:{command.strip()}"


class SafetyController:
    """The safety gate: applies a `SafetyPolicy` to every tool call and asks for approval when needed.

    Args:
        policy: a `SafetyPolicy`, or just a mode (`"strict"`, `"balanced"`, `"permissive"`).
        approval: an async or sync function `ApprovalRequest -> ApprovalDecision` (or a bool). A sync
            one runs in a worker thread, so a slow one blocks no other run and the timeout applies.
            Without one, every call that needs approval is denied.
        approval_timeout: seconds to wait for an answer before denying (None waits forever); a positive
            number, else `ConfigurationError`.

    Use it as `Agent(..., safety=SafetyController("strict", approval=console_approval()))`.
    """

    def __init__(
        self,
        policy: SafetyPolicy | SafetyMode | str | None = None,
        *,
        approval: ApprovalFunction | None = None,
        approval_timeout: float | None = 300.0,
    ) -> None:
        if policy is None:
            policy = SafetyPolicy()
        elif not isinstance(policy, SafetyPolicy):
            try:
                policy = SafetyPolicy(mode=SafetyMode(policy))
            except ValueError:
                raise ConfigurationError(
                    f"the safety mode must be 'strict', 'balanced' or 'permissive', not {policy!r}"
                ) from None
        self.policy = policy
        self.approval = approval
        self.approval_timeout = _checked_timeout(approval_timeout)

    def __repr__(self) -> str:
        return f"SafetyController(mode={self.policy.mode.value!r})"

    async def check(self, call: ToolCall, tool: Tool, risk: RiskLevel, run: RunContext) -> GateDecision:
        """Decide one call: blocked → refused; allowed by the policy → runs; otherwise ask.

        A command is rated with the run's earlier commands of the same tool (from the ledger, read only
        when the command runs a file): running a file an earlier call downloaded is rated like
        downloading and running it in one command.
        """
        shell = tool.risk if isinstance(tool.risk, ShellCommandRisk) else None
        argument = shell.argument if shell is not None else None
        key = self.policy.command_tools.get(tool.name) or argument
        arguments = arguments_to_run(call, tool)
        evaluation = self.policy.evaluate(
            tool.name,
            arguments,
            risk,
            command_argument=argument,
            earlier=_earlier_commands(run, call, tool, key, arguments) if key is not None else (),
            cwd=shell.cwd if shell is not None else None,
        )
        if evaluation.verdict == "block":
            message = _blocked_message(tool.name, evaluation)
            return _record(run, call, evaluation, "blocked", message=message)
        if evaluation.verdict == "auto":
            return _record(run, call, evaluation, "auto")
        others = {k: v for k, v in arguments.items() if k != key}  # as for the earlier commands: the host
        key = approval_key(tool.name, evaluation.command, others)
        if key in run.state.approved_tools:
            return _record(
                run, call, evaluation, "approved_always", note="approved always earlier in this run"
            )
        return await self._ask(call, tool, evaluation, run, key, arguments)

    async def _ask(
        self,
        call: ToolCall,
        tool: Tool,
        evaluation: Evaluation,
        run: RunContext,
        key: str,
        arguments: dict[str, Any],
    ) -> GateDecision:
        reason = evaluation.explain()
        request = ApprovalRequest(
            run_id=run.state.run_id,
            step=run.state.step,
            call=call,
            tool=tool.name,
            description=tool.description,
            arguments=arguments,
            risk=evaluation.risk,
            reason=reason,
            command=evaluation.command,
        )
        run.emit(ApprovalRequested(step=run.state.step, call=call, risk=evaluation.risk, reason=reason))
        await run.checkpoint()  # the reply (its calls planned) and the request are saved before waiting
        answer = await self._answer(request)
        if answer.decision == "approved_always" and key not in run.state.approved_tools:
            run.state.approved_tools.append(key)
        if answer.decision in ("approved", "approved_always"):
            return _record(run, call, evaluation, answer.decision)
        note = f"{reason}; {answer.problem}" if answer.problem else reason
        message = _denied_message(tool.name, answer)
        return _record(run, call, evaluation, answer.decision, message=message, note=note)

    async def _answer(self, request: ApprovalRequest) -> _Answer:
        """Ask the approval function; no function, a timeout, an error or a strange answer mean deny.

        A sync function runs in a worker thread: one that blocks (a slow service, `input()`) must not
        stop the event loop, where the timeout could not fire. A `CancelledError` the function raises
        by itself (a task it awaited was cancelled) is its failure; the run's own cancellation passes."""
        if self.approval is None:
            return _Answer("denied", problem="no approval function is configured")
        window = asyncio.timeout(self.approval_timeout)
        try:
            async with window:
                answer = await _called(self.approval, request)
        except TimeoutError as exc:
            if window.expired():
                return _Answer("timeout", problem=f"no answer came within {self.approval_timeout:g} s")
            return _failed(exc)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is None or task.cancelling() > 0:
                raise
            return _failed(exc)
        except (Exception, SystemExit, GeneratorExit) as exc:  # sys.exit() in it does not end the process
            return _failed(exc)
        return _interpret(answer)


def _checked_timeout(timeout: float | None) -> float | None:
    """`approval_timeout` checked: NaN never fired (a hung approval hung the run), 0 or less denied
    everything at once — or approved it, when a sync function answered before the first await."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise ConfigurationError(
            f"approval_timeout must be a positive number of seconds, or None to wait forever; got {timeout!r}"
        )
    return None if math.isinf(timeout) else float(timeout)


def _is_async(function: object) -> bool:
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
        getattr(function, "__call__", None)  # noqa: B004  (an object with an async __call__)
    )


async def _called(function: ApprovalFunction, request: ApprovalRequest) -> object:
    """The approval function's answer: an async one is awaited here, a sync one in a worker thread."""
    if _is_async(function):
        answer: object = function(request)
    else:
        call = functools.partial(contextvars.copy_context().run, function, request)
        answer = await asyncio.get_running_loop().run_in_executor(tool_threads(), call)
    if inspect.isawaitable(answer):
        answer = await answer
    return answer


def _failed(exc: BaseException) -> _Answer:
    return _Answer("denied", problem=f"the approval function failed ({type(exc).__name__}: {_safe_str(exc)})")


def arguments_to_run(call: ToolCall, tool: Tool) -> dict[str, Any]:
    """The arguments `call` will run with, read as the executor reads them — what the policy must rate.

    A model's call can hold its arguments where the executor still finds them: text that is not a JSON
    object for a tool of one parameter (`Action Input: rm -rf /` for `shell`), or the arguments wrapped
    in an object (`{"arguments": {"command": …}}`). Rating `call.arguments` as sent missed the command
    of both: a critical command was not blocked, the deny patterns did not apply, and the person was
    asked about a call without its command.
    """
    raw = call.raw_arguments
    given = call.arguments if raw is None else arguments_from_text(tool, raw)
    if given is None:
        return call.arguments  # the executor refuses it as invalid
    if len(given) == 1 and isinstance(inner := next(iter(given.values())), dict):
        try:
            tool.validate(given)
        except ToolArgumentsError:
            if _validated_unwrapped(tool, given) is not None:
                return inner
    return given


_REFUSED = frozenset({"denied", "blocked", "timeout"})
_ALLOWED = frozenset({"auto", "approved", "approved_always"})


def _earlier_commands(
    run: RunContext, call: ToolCall, tool: Tool, key: str, arguments: dict[str, Any]
) -> Iterator[str]:
    """The commands that ran (or run with this one) before `call` in this run, oldest first: calls of
    the same tool with the same other arguments (an SSH tool's host), from the ledger — which a resumed
    run has too — each read as it ran (`arguments_to_run`). Calls the gate refused never ran and are
    left out. Lazy: the ledger is read only when the classifier needs it (the command being rated runs
    a file)."""
    place = {k: v for k, v in arguments.items() if k != key}
    decisions = {record.call_id: record.decision for record in run.state.approvals}  # the last one counts
    sent = _calls_sent(run.state)
    for entry in list(run.state.ledger.values()):
        if entry.call_id == call.id or entry.name != call.name:
            continue
        earlier = sent.get(entry.call_id)
        ran_with = arguments_to_run(earlier, tool) if earlier is not None else entry.arguments
        command = ran_with.get(key)
        if not isinstance(command, str):
            continue
        if {k: v for k, v in ran_with.items() if k != key} == place and _ran(
            entry, decisions.get(entry.call_id), run.state.step
        ):
            yield command


def _calls_sent(state: RunState) -> dict[str, ToolCall]:
    """The run's tool calls as the model sent them, by id (the ledger keeps only `arguments`)."""
    return {c.id: c for m in state.messages if m.role == "assistant" for c in m.tool_calls}


def _ran(entry: LedgerEntry, decision: str | None, step: int) -> bool:
    """Whether a call in the ledger ran, runs, or may run alongside the call being checked."""
    if decision in _REFUSED or entry.error_kind in ("denied", "repeated_call"):
        return False
    if entry.status != "planned":
        return True
    # planned: allowed earlier in this reply, or not checked yet (a later call of the same reply)
    return decision in _ALLOWED or (decision is None and entry.step == step)


@dataclass(frozen=True, slots=True)
class _Answer:
    decision: Decision
    message: str = ""  # the person's message to the model
    problem: str = ""  # why the call was denied without a person's answer


def _interpret(answer: object) -> _Answer:
    if answer is True:
        return _Answer("approved")
    if answer is False:
        return _Answer("denied")
    if isinstance(answer, ApprovalDecision):
        kinds: dict[str, Decision] = {"approve": "approved", "approve_always": "approved_always"}
        return _Answer(kinds.get(answer.action, "denied"), message=answer.message)
    return _Answer("denied", problem=f"the approval function returned {answer!r}, not an ApprovalDecision")


def _record(
    run: RunContext,
    call: ToolCall,
    evaluation: Evaluation,
    decision: Decision,
    *,
    message: str = "",
    note: str = "",
) -> GateDecision:
    """Record the decision in the run state and turn it into the gate's verdict."""
    reason = note or evaluation.explain()
    run.state.approvals.append(
        ApprovalRecord(
            step=run.state.step,
            call_id=call.id,
            tool=call.name,
            risk=evaluation.risk,
            decision=decision,
            reason=reason,
            message=message,
        )
    )
    allowed = decision in ("auto", "approved", "approved_always")
    return GateDecision(allowed, decision, reason=reason, message=message, risk=evaluation.risk)


def _blocked_message(tool_name: str, evaluation: Evaluation) -> str:
    return (
        f"Blocked by the safety policy: this call of {tool_name} is never allowed ({evaluation.explain()}). "
        "It was not run. Do not retry it or work around it; find a safe way, or answer with what you know."
    )


def _denied_message(tool_name: str, answer: _Answer) -> str:
    if answer.problem:
        text = f"Denied: the call of {tool_name} needed approval and was not run: {answer.problem}."
    else:
        text = f"Denied: the call of {tool_name} was not approved, so it was not run."
    if answer.message:
        text += f" The approver said: {answer.message.rstrip('.')}."
    return text + " Do not retry the same call; find another way, or answer with what you know."


# ============================================================================ pending approvals


class PendingApprovals:
    """An approval function for a UI: each request waits until someone calls `resolve()`.

    A web server gives one to its agents (`SafetyController(approval=pending)`), lists `pending()` (or
    listens for `approval_requested` events), and answers with `resolve(run_id, call_id, decision)` from
    a request handler. Unanswered requests end with the controller's `approval_timeout` (a deny).
    """

    def __init__(self) -> None:
        self._waiting: dict[tuple[str, str], tuple[ApprovalRequest, asyncio.Future[ApprovalDecision]]] = {}

    async def __call__(self, request: ApprovalRequest) -> ApprovalDecision:
        key = (request.run_id, request.call.id)
        future: asyncio.Future[ApprovalDecision] = asyncio.get_running_loop().create_future()
        self._waiting[key] = (request, future)
        try:
            return await future
        finally:  # only our own entry: a request with the same ids that came since is still waiting
            if key in self._waiting and self._waiting[key][1] is future:
                del self._waiting[key]

    def pending(self, run_id: str | None = None) -> list[ApprovalRequest]:
        """The requests waiting for an answer (of one run, or of all)."""
        return [r for (rid, _), (r, _) in self._waiting.items() if run_id is None or rid == run_id]

    def resolve(self, run_id: str, call_id: str, decision: ApprovalDecision | bool) -> bool:
        """Answer a waiting request; False if there is none (already answered, timed out, unknown)."""
        entry = self._waiting.pop((run_id, call_id), None)  # safe to call from another thread
        if entry is None or entry[1].done():
            return False
        if isinstance(decision, bool):
            decision = ApprovalDecision.approve() if decision else ApprovalDecision.deny()
        entry[1].get_loop().call_soon_threadsafe(_set_result, entry[1], decision)
        return True


def _set_result(future: asyncio.Future[ApprovalDecision], decision: ApprovalDecision) -> None:
    if not future.done():
        future.set_result(decision)


# ============================================================================== console approval


def console_approval(
    console: Console | None = None, *, assume_yes: bool = False, stdin: TextIO | None = None
) -> Callable[[ApprovalRequest], Awaitable[ApprovalDecision]]:
    """An approval function asking the person at the terminal; the CLI uses it.

    It shows the tool, its arguments or command, the risk and the reasons, and reads one line:
    `y` approves, `a` approves always for this run, anything else — including just Enter — denies
    (`n some text` denies and tells the model "some text"). With no terminal (stdin is not a TTY)
    it denies, unless `assume_yes` is set, which approves without asking. Blacklisted calls never get
    here: the controller refuses them before asking, so `assume_yes` cannot approve them.

    The blocking `input()` runs in a worker thread; prompts of concurrent calls are asked one at a time.
    """
    lock = threading.Lock()

    async def approve(request: ApprovalRequest) -> ApprovalDecision:
        if assume_yes:
            return ApprovalDecision.approve()
        stream = stdin if stdin is not None else sys.stdin
        if stream is None or not stream.isatty():
            return ApprovalDecision.deny(
                "nobody could be asked: there is no terminal (the user can pass --yes to approve such calls)"
            )
        return await asyncio.to_thread(_ask_at_terminal, console, request, stream, lock)

    return approve


def _ask_at_terminal(
    console: Console | None, request: ApprovalRequest, stream: TextIO, lock: threading.Lock
) -> ApprovalDecision:
    from rich.console import Console
    from rich.markup import escape

    out = console or Console(stderr=True)
    with lock:
        out.print(
            f"\n[bold yellow]Approval needed[/] — tool [bold]{escape(request.tool)}[/], risk [bold]{request.risk.value}[/]"
        )
        if request.command is not None:
            out.print(f"  command: [cyan]{escape(request.command)}[/]")
        else:
            out.print(f"  arguments: {escape(json.dumps(request.arguments, ensure_ascii=False)[:2000])}")
        out.print(f"  why: {escape(request.reason)}")
        out.print(
            escape("Run it? [y]es / [a]lways in this run / [N]o (n <message> tells the model why) "), end=""
        )
        try:
            line = stream.readline()
        except (OSError, ValueError):
            line = ""
        if not line.endswith("\n"):  # Ctrl-D (end of input): no newline was echoed to end the prompt's line
            out.print()
    return _parse_answer(line)


def _parse_answer(line: str) -> ApprovalDecision:
    answer = line.strip()
    word, _, rest = answer.partition(" ")
    word = word.lower()
    if word in ("y", "yes"):
        return ApprovalDecision.approve()
    if word in ("a", "always"):
        return ApprovalDecision.approve_always()
    return ApprovalDecision.deny(rest.strip() if word in ("n", "no") else "")
