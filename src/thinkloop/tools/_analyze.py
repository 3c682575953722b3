"""The `analyze_output` tool (SPEC §3.7): a deterministic summary of a long command output.

A model reading 5,000 lines of build log wastes its context and misses the one line that matters. This
tool condenses an output into: its size, the exit status if it is mentioned, the error and warning lines
with their line numbers, the last line of each stack trace, and the first and last lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .._risk import RiskLevel
from .._tools import Tool

_ERROR_RE = re.compile(
    r"\b(?:error|errors|fatal|failed|failure|exception|panic|critical|denied|refused|segmentation fault|"
    r"cannot|can't|could not|unable to|no such file|not found|traceback|killed|oom)\b",
    re.IGNORECASE,
)
_EXCEPTION_NAME_RE = re.compile(r"[a-z0-9](?:Error|Exception)\b")  # ValueError, IOException …
_WARNING_RE = re.compile(r"\b(warn|warning|warnings|deprecated|deprecation)\b", re.IGNORECASE)
_NOT_AN_ERROR_RE = re.compile(r"\b(0|no) (errors?|failures?|failed)\b", re.IGNORECASE)
_EXIT_RE = re.compile(
    r"(exit(?:ed)?(?: with)? (?:code|status)|exit_code|returncode|return code)\W{0,3}(-?\d+)", re.IGNORECASE
)
_TRACE_START_RE = re.compile(
    r"^(Traceback \(most recent call last\)|panic:|Exception in thread|\s+at [\w$.]+\()"
)


@dataclass
class _Findings:
    errors: list[tuple[int, str]] = field(default_factory=list)
    warnings: list[tuple[int, str]] = field(default_factory=list)
    exits: list[tuple[int, str]] = field(default_factory=list)
    traces: list[tuple[int, str]] = field(default_factory=list)


def analyze_text(output: str, *, max_items: int = 20, context_lines: int = 5, width: int = 200) -> str:
    """Summarise `output`: size, exit codes, error and warning lines, stack traces, head and tail."""
    lines = output.splitlines()
    if not lines:
        return "The output is empty."
    found = _scan(lines)
    parts = [
        f"{len(lines)} lines, {len(output)} characters; {len(found.errors)} error line(s), "
        f"{len(found.warnings)} warning line(s), {len(found.traces)} stack trace(s)."
    ]
    parts += _section("Exit status", found.exits, max_items, width)
    parts += _section("Stack traces (last line of each)", found.traces, max_items, width)
    parts += _section("Errors", found.errors, max_items, width)
    parts += _section("Warnings", found.warnings, max_items, width)
    if len(lines) <= 2 * context_lines:
        parts += _section("All lines", list(enumerate(lines, 1)), 2 * context_lines, width)
    else:
        parts += _section("First lines", list(enumerate(lines[:context_lines], 1)), context_lines, width)
        tail_start = len(lines) - context_lines + 1
        parts += _section(
            "Last lines", list(enumerate(lines[-context_lines:], tail_start)), context_lines, width
        )
    return "\n".join(parts)


def _scan(lines: list[str]) -> _Findings:
    found = _Findings()
    in_trace = False
    for number, line in enumerate(lines, 1):
        if _TRACE_START_RE.match(line):
            in_trace = True
        elif in_trace and line and not line[0].isspace():
            found.traces.append((number, line))  # the first unindented line after a trace: its error
            in_trace = False
        if _EXIT_RE.search(line):
            found.exits.append((number, line))
        if (_ERROR_RE.search(line) or _EXCEPTION_NAME_RE.search(line)) and not _NOT_AN_ERROR_RE.search(line):
            found.errors.append((number, line))
        elif _WARNING_RE.search(line):
            found.warnings.append((number, line))
    return found


def _section(title: str, items: list[tuple[int, str]], limit: int, width: int) -> list[str]:
    if not items:
        return []
    out = [f"{title}:"]
    if len(items) <= limit:
        return out + [_item(number, line, width) for number, line in items]
    head, tail = items[: limit // 2], items[len(items) - (limit - limit // 2) :]
    out += [_item(number, line, width) for number, line in head]
    out.append(f"  … {len(items) - limit} more not shown …")
    return out + [_item(number, line, width) for number, line in tail]


def _item(number: int, line: str, width: int) -> str:
    return f"  {number}: {_clip(line, width)}"


def _clip(line: str, width: int) -> str:
    line = line.rstrip()
    return line if len(line) <= width else line[: width - 1] + "…"


def analyze_output_tool(*, max_items: int = 20, context_lines: int = 5) -> Tool:
    """A `Tool` named `analyze_output` (LOW risk) summarising a text the model passes to it."""

    def analyze_output(output: str) -> str:
        return analyze_text(output, max_items=max_items, context_lines=context_lines)

    return Tool(
        "analyze_output",
        "Summarise a long command output: line counts, exit status, error and warning lines with their "
        "line numbers, stack traces, and the first and last lines.",
        {
            "type": "object",
            "properties": {"output": {"type": "string", "description": "The output text to analyse."}},
            "required": ["output"],
            "additionalProperties": False,
        },
        analyze_output,
        risk=RiskLevel.LOW,
        idempotent=True,
    )


analyze_output = analyze_output_tool()
