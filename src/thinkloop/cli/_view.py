"""The live view of a run in the terminal: thoughts, tool calls, results, progress, the answer."""

from __future__ import annotations

import json
from typing import Any

from rich.markup import escape
from rich.panel import Panel
from rich.status import Status

from .._events import Done, Event
from .._state import StopReason
from ._console import Console, printable

_RISK_STYLE = {"low": "green", "medium": "yellow", "high": "red", "critical": "bold red"}
_MAX_SHOWN = 600


def _short(text: str, limit: int = _MAX_SHOWN) -> str:
    text = text.strip()
    return text if len(text) <= limit else f"{text[: limit - 20]} … [{len(text) - limit + 20} more chars]"


def _args(arguments: dict[str, Any]) -> str:
    return _short(json.dumps(arguments, ensure_ascii=False), 200)


def render_event(console: Console, event: Event) -> None:
    """Print one event the way the live view does (also used by `thinkloop runs replay`)."""
    handler = _HANDLERS.get(event.type)
    if handler is not None:
        handler(console, event)


def _run_started(console: Console, e: Any) -> None:
    resumed = " (resumed)" if e.resumed else ""
    console.print(  # soft-wrapped: the run id is never split over two lines (narrow terminal, log file)
        f"[bold]run[/] {e.run_id}{resumed} · model [cyan]{escape(e.model)}[/] · mode {e.mode}", soft_wrap=True
    )


def _thought(console: Console, e: Any) -> None:
    console.print(f"[dim italic]💭 {escape(_short(e.text, 400))}[/]")


def _tool_call(console: Console, e: Any) -> None:
    risk = str(e.risk)
    style = _RISK_STYLE.get(risk, "white")
    decision = "" if e.decision == "auto" else f" · [bold]{e.decision}[/]"
    console.print(
        f"[bold blue]→ {escape(e.call.name)}[/]({escape(_args(e.call.arguments))}) [{style}]{risk}[/]{decision}"
    )


def _tool_result(console: Console, e: Any) -> None:
    mark = "[green]✓[/]" if e.success else "[red]✗[/]"
    console.print(f"  {mark} {escape(_short(e.output, 300))} [dim]({e.duration * 1000:.0f} ms)[/]")


def _hint(console: Console, e: Any) -> None:
    console.print(f"[magenta]⚑ hint ({e.reason}):[/] {escape(_short(e.text, 200))}")


def _approval(console: Console, e: Any) -> None:
    console.print(f"[bold yellow]? approval requested[/] for {escape(e.call.name)}: {escape(e.reason)}")


def _mode(console: Console, e: Any) -> None:
    console.print(f"[yellow]mode switched {e.from_mode} → {e.to_mode}: {escape(e.reason)}[/]")


def _attempt(console: Console, e: Any) -> None:
    console.print(
        f"[yellow]model {escape(e.model)} attempt {e.attempt} failed ({escape(_short(e.error, 200))}); {e.next_action}[/]"
    )


def _status(console: Console, e: Any) -> None:
    console.print(f"[dim]{escape(e.text)}[/]")


def _error(console: Console, e: Any) -> None:
    console.print(f"[bold red]error:[/] {escape(e.message)}")


def _done(console: Console, e: Any) -> None:
    r = e.result
    ok = r.stop_reason is StopReason.FINAL_ANSWER
    title = (
        "answer"
        if ok
        else f"stopped: {r.stop_reason.value}" + (" (best-effort answer)" if r.forced_final else "")
    )
    body = escape(r.output) if r.output else "[dim](empty answer)[/]"
    console.print(Panel(body, title=title, border_style="green" if ok else "yellow", expand=False))
    if r.error and not ok and r.stop_reason is not StopReason.ERROR:  # an error was shown by its own event
        console.print(f"[yellow]{escape(r.error)}[/]")
    u = r.usage
    cost = f" · ${u.cost:.4f}" if u.cost else ""
    console.print(
        f"[dim]stop reason {r.stop_reason.value} · {r.steps} steps · {r.tool_calls} tool calls · "
        f"{u.input_tokens}+{u.output_tokens} tokens{cost} · {r.duration:.1f} s · run {r.state.run_id}[/]",
        soft_wrap=True,
    )


def _model_call(console: Console, e: Any) -> None:
    tokens = f"{e.input_tokens}+{e.output_tokens} tokens{' (estimated)' if e.estimated else ''}"
    console.print(f"[dim]  model {e.duration:.1f} s · {tokens}[/]")


_HANDLERS = {
    "run_started": _run_started,
    "model_call": _model_call,
    "thought": _thought,
    "tool_call": _tool_call,
    "tool_result": _tool_result,
    "hint": _hint,
    "approval_requested": _approval,
    "mode_switched": _mode,
    "model_attempt": _attempt,
    "status": _status,
    "error": _error,
    "done": _done,
}


class LiveView:
    """Renders a run's events as they arrive, with a spinner while the model thinks.

    Streamed text (`answer_delta`) is shown live in the spinner line only: until the step ends it is not
    known whether it is the answer (then the `done` panel shows it) or the thought of a step that calls
    tools (then the `thought` line shows it), so it is never printed twice.
    """

    def __init__(self, console: Console) -> None:
        self.console = console
        self.status: Status | None = None
        self.streamed = ""

    def __call__(self, event: Event) -> None:
        if event.type == "answer_delta":
            self._answer_delta(event.text)
            return
        self._end_stream()
        if event.type == "progress":
            u = event.usage
            self._spin(f"step {event.step}/{event.max_steps} · thinking… · {u.total_tokens} tokens so far")
            return
        if event.type in ("approval_requested", "done"):
            self._stop_spinner()
        render_event(self.console, event)

    def _answer_delta(self, text: str) -> None:
        width = max(20, self.console.width - 10)
        self.streamed = (self.streamed + text)[
            -8 * width :
        ]  # the tail it shows: a long answer costs linear time
        tail = " ".join(self.streamed.split())[-width:]
        self._spin(f"[green]▌[/] {escape(printable(tail))}")  # a spinner's text is not `render_str`'s

    def _end_stream(self) -> None:
        self.streamed = ""

    def _spin(self, text: str) -> None:
        if not self.console.is_terminal:
            return
        if self.status is None:
            self.status = self.console.status(text)
            self.status.start()
        else:
            self.status.update(text)

    def _stop_spinner(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None

    def close(self) -> None:
        self._end_stream()
        self._stop_spinner()


def exit_code(event: Done | None) -> int:
    """0 final answer, 3 stopped by a limit (budget, loop, no progress), 1 error, 130 cancelled."""
    return 1 if event is None else result_exit_code(event.result.stop_reason)


def result_exit_code(reason: StopReason) -> int:
    """`exit_code` of a run that ended for `reason`."""
    if reason is StopReason.FINAL_ANSWER:
        return 0
    if reason is StopReason.CANCELLED:
        return 130
    if reason is StopReason.ERROR:
        return 1
    return 3
