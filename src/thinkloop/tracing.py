"""Traces of runs, model calls and tool calls (SPEC §13.3) with OpenTelemetry.

`OpenTelemetryTracing()` is an event sink: pass it as `on_event` and every run becomes a trace —

    invoke_agent agent            the run (stop reason, steps, tokens, cost)
    ├── chat gpt-4o-mini          each model call (duration, tokens, cost, finish reason)
    ├── execute_tool calculator   each tool call (duration, success, error type, risk, decision)
    └── chat gpt-4o-mini

named and attributed after the OpenTelemetry GenAI semantic conventions (`gen_ai.*`). A run started
inside a span of yours is traced under it. Spans are built from the run's events, with their real start
and end times, so tracing costs nothing when it is off and changes nothing in the loop when it is on.
Arguments, results and answers are left out unless `capture_content=True` (they may hold personal data).

It needs `opentelemetry-api` (the `otel` extra: `pip install 'thinkloop[otel]'`, which also brings the
SDK); the spans go wherever the tracer provider sends them (an OTLP exporter, the console, …).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._errors import ConfigurationError
from ._state import StopReason

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from ._events import Event

__all__ = ["OpenTelemetryTracing", "json_lines_provider"]

_CONTENT_LIMIT = 4000  # characters of an argument, result or answer kept in an attribute
_NAME_LIMIT = 200  # characters of a name or id (a tool name or call id a model sent) in a span
logger = logging.getLogger("thinkloop.tracing")


def _name(text: str) -> str:
    """A tool name, call id or model name as a span shows it: a model may send one of any length."""
    return text if len(text) <= _NAME_LIMIT else text[: _NAME_LIMIT - 1] + "…"


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class OpenTelemetryTracing:
    """An event sink that turns each run's events into OpenTelemetry spans (one trace per run).

    Args:
        tracer_provider: where spans go; None uses the global one (`opentelemetry.trace.set_tracer_provider`).
        capture_content: also record tool arguments and results and the final answer (off by default).
    """

    def __init__(
        self, tracer_provider: TracerProvider | None = None, *, capture_content: bool = False
    ) -> None:
        try:
            from opentelemetry import trace
        except ImportError as exc:  # pragma: no cover - the extra is installed in the test environment
            raise ConfigurationError("tracing needs OpenTelemetry: pip install 'thinkloop[otel]'") from exc
        from . import __version__

        self._trace = trace
        self._tracer: Tracer = trace.get_tracer("thinkloop", __version__, tracer_provider=tracer_provider)
        self.capture_content = capture_content
        self._runs: dict[str, Span] = {}  # run id -> its open span
        self._arguments: dict[tuple[str, str], dict[str, Any]] = {}  # (run id, call id) -> arguments
        self._last: dict[str, float] = {}  # run id -> the time of its latest event

    def __call__(self, event: Event) -> None:
        handler = getattr(self, f"_on_{event.type}", None)
        if handler is not None:
            handler(event)
        if event.run_id in self._runs:
            self._last[event.run_id] = event.time

    def _end_interrupted(self, run_id: str) -> None:
        """End the span of a run that stopped without `done` (`Agent.interrupt`) and is now resumed.

        That span was never ended, so it was never exported and the spans of its calls had no parent.
        """
        span = self._runs.pop(run_id, None)
        last = self._last.pop(run_id, None)
        if span is not None:
            span.set_attribute("thinkloop.interrupted", True)
            span.end(end_time=None if last is None else _ns(last))

    # ------------------------------------------------------------------------------------ the run

    def _on_run_started(self, e: Any) -> None:
        self._end_interrupted(e.run_id)
        span = self._tracer.start_span(
            "invoke_agent agent",
            start_time=_ns(e.time),
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.request.model": _name(e.model),
                "thinkloop.run_id": e.run_id,
                "thinkloop.mode": e.mode,
                "thinkloop.resumed": e.resumed,
            },
        )  # parented by the caller's current span, when there is one
        if self.capture_content:
            span.set_attribute("thinkloop.goal", e.goal[:_CONTENT_LIMIT])
        self._runs[e.run_id] = span

    def _on_done(self, e: Any) -> None:
        span = self._runs.pop(e.run_id, None)
        self._last.pop(e.run_id, None)
        if span is None:
            return
        result = e.result
        state = result.state
        span.update_name(f"invoke_agent {_name(state.agent_name)}")
        span.set_attributes(
            {
                "gen_ai.agent.name": _name(state.agent_name),
                "thinkloop.stop_reason": result.stop_reason.value,
                "thinkloop.steps": result.steps,
                "thinkloop.tool_calls": result.tool_calls,
                "thinkloop.forced_final": result.forced_final,
                "gen_ai.usage.input_tokens": result.usage.input_tokens,
                "gen_ai.usage.output_tokens": result.usage.output_tokens,
                "thinkloop.cost": result.usage.cost,
            }
        )
        if self.capture_content:
            span.set_attribute("thinkloop.answer", result.output[:_CONTENT_LIMIT])
        if result.stop_reason in (StopReason.ERROR, StopReason.CANCELLED):
            self._fail(span, result.stop_reason.value, result.error or result.stop_reason.value)
        for key in [k for k in self._arguments if k[0] == e.run_id]:
            del self._arguments[key]
        span.end(end_time=_ns(e.time))

    def _on_error(self, e: Any) -> None:
        span = self._runs.get(e.run_id)
        if span is None:
            return
        span.add_event("error", {"message": e.message[:_CONTENT_LIMIT]}, timestamp=_ns(e.time))
        if e.stopped:  # no `done` will come: the span ends here (a resume starts a span of its own)
            del self._runs[e.run_id]
            self._last.pop(e.run_id, None)
            for key in [k for k in self._arguments if k[0] == e.run_id]:
                del self._arguments[key]
            self._fail(span, "stopped", e.message)
            span.end(end_time=_ns(e.time))

    def _on_hint(self, e: Any) -> None:
        self._note(e, "hint", {"thinkloop.step": e.step, "thinkloop.reason": e.reason})

    def _on_mode_switched(self, e: Any) -> None:
        self._note(e, "mode_switched", {"thinkloop.to_mode": e.to_mode, "thinkloop.reason": e.reason})

    def _on_model_attempt(self, e: Any) -> None:
        attributes = {
            "thinkloop.model": _name(e.model),
            "thinkloop.attempt": e.attempt,
            "error.type": e.next_action,
        }
        self._note(e, "model_attempt", {**attributes, "thinkloop.error": e.error[:_CONTENT_LIMIT]})

    def _note(self, e: Any, name: str, attributes: dict[str, Any]) -> None:
        span = self._runs.get(e.run_id)
        if span is not None:
            span.add_event(name, attributes, timestamp=_ns(e.time))

    # ---------------------------------------------------------------------------------- its calls

    def _on_model_call(self, e: Any) -> None:
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": _name(e.provider),
            "gen_ai.request.model": _name(e.model),
            "gen_ai.response.model": _name(e.model),
            "gen_ai.usage.input_tokens": e.input_tokens,
            "gen_ai.usage.output_tokens": e.output_tokens,
            "gen_ai.response.finish_reasons": [_name(e.finish_reason)],
            "thinkloop.step": e.step,
            "thinkloop.cost": e.cost,
            "thinkloop.usage_estimated": e.estimated,
            "thinkloop.tool_calls": e.tool_calls,
            "thinkloop.final_answer_call": e.final,
        }
        self._child(e, f"chat {_name(e.model)}", attributes, kind_client=True).end(end_time=_ns(e.time))

    def _on_tool_call(self, e: Any) -> None:
        if self.capture_content:
            self._arguments[(e.run_id, e.call.id)] = e.call.arguments

    def _on_tool_result(self, e: Any) -> None:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": _name(e.name),
            "gen_ai.tool.call.id": _name(e.call_id),
            "gen_ai.tool.type": "function",
            "thinkloop.step": e.step,
            "thinkloop.success": e.success,
            "thinkloop.truncated": e.truncated,
        }
        if e.decision is not None:
            attributes["thinkloop.decision"] = e.decision
        if self.capture_content:
            arguments = self._arguments.pop((e.run_id, e.call_id), None)
            if arguments is not None:
                text = json.dumps(arguments, ensure_ascii=False, default=str)
                attributes["gen_ai.tool.call.arguments"] = text[:_CONTENT_LIMIT]
            attributes["gen_ai.tool.call.result"] = e.output[:_CONTENT_LIMIT]
        span = self._child(e, f"execute_tool {_name(e.name)}", attributes)
        if not e.success:
            self._fail(span, e.error_kind or "tool_error", e.output[:300])
        span.end(end_time=_ns(e.time))

    def _child(self, e: Any, name: str, attributes: dict[str, Any], *, kind_client: bool = False) -> Span:
        """A span under the run's span, that ended at the event and lasted its `duration`."""
        parent = self._runs.get(e.run_id)
        context = self._trace.set_span_in_context(parent) if parent is not None else None
        kind = self._trace.SpanKind.CLIENT if kind_client else self._trace.SpanKind.INTERNAL
        start = e.time - max(float(e.duration), 0.0)
        return self._tracer.start_span(
            name, context=context, kind=kind, start_time=_ns(start), attributes=attributes
        )

    def _fail(self, span: Span, kind: str, message: str) -> None:
        span.set_attribute("error.type", kind)
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, message))


def json_lines_provider(path: str | Path) -> TracerProvider:
    """A tracer provider writing each finished span as one JSON line to `path` (needs the SDK).

    The file is checked here: one that cannot be appended to (a directory, a missing directory, no
    permission) is a `ConfigurationError` now, not a failure at every span. A write that fails later (a
    full disk) is logged once (logger `thinkloop.tracing`) and those spans are dropped; the run goes on.
    """
    try:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
    except ImportError as exc:  # pragma: no cover - the extra is installed in the test environment
        raise ConfigurationError(
            "writing traces needs the OpenTelemetry SDK: pip install 'thinkloop[otel]'"
        ) from exc
    file = Path(path).expanduser()
    _check_appendable(file)

    class JsonLines(SpanExporter):
        failed = False

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            try:
                with open(file, "a", encoding="utf-8") as out:
                    out.writelines(span.to_json(indent=None) + "\n" for span in spans)
            except OSError as exc:
                if not self.failed:  # once: a span per step would repeat it all run long
                    self.failed = True
                    logger.error("cannot write the trace file (%s); spans are dropped until it can", exc)
                return SpanExportResult.FAILURE
            self.failed = False
            return SpanExportResult.SUCCESS

    provider = SDKTracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLines()))
    return provider


def _check_appendable(file: Path) -> None:
    try:
        with open(file, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigurationError(
            f"cannot write the trace file {str(file)!r}: {reason}; give a file in a directory that exists "
            "and that you may write to"
        ) from None
