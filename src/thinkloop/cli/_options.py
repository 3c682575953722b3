"""Options shared by the commands that build an agent (`run`, `serve`, `worker`): one definition each."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Annotated, Literal

import typer

from .._errors import UserError

DEFAULT_TOOLS = "calculator"

ModelOption = Annotated[
    str | None,
    typer.Option("--model", "-m", help="local, local:0.5b, openai:MODEL, router:A,B or script:FILE."),
]
ToolsOption = Annotated[
    str,
    typer.Option(help="Built-in tools, comma-separated: calculator,shell,ssh_execute,files,analyze_output."),
]
WorkspaceOption = Annotated[
    Path, typer.Option(help="Root directory of the file tools and the shell's working dir.")
]
HostsOption = Annotated[
    Path | None,
    typer.Option(help='ssh_execute\'s hosts: a JSON file {"NAME": {"hostname": …, "username": …}, …}.'),
]
McpOption = Annotated[
    list[str] | None, typer.Option(help="An MCP server command to add tools from (repeatable).")
]
ModeOption = Annotated[
    Literal["auto", "native", "react"], typer.Option(help="Tool calling: auto, native or react.")
]
InstructionsOption = Annotated[str, typer.Option(help="The agent's role / instructions.")]
StoreOption = Annotated[
    str | None,
    typer.Option(help="Where runs are saved: sqlite:///PATH, postgresql://…, file:///DIR, memory:."),
]


def finite(value: float | None) -> float | None:
    """A typer callback: `nan` and `inf` are not limits (they silently meant none); leave the option out."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(
            f"{value} is not a limit: give a finite number, or leave the option out for none"
        )
    return value


def check_limits(**limits: float | None) -> None:
    """`--max-cost 0`, `--timeout -1`: a `UserError` in the option's terms (`Budget` said
    `Budget.max_cost must be … or None (no limit)`, in Python's)."""
    for name, value in limits.items():
        if value is not None and value <= 0:
            option = "--" + name.replace("_", "-")
            raise UserError(
                f"{option} must be above 0, got {value:g}: give a positive number, or leave {option} out "
                "for no limit"
            )


def positive_seconds(value: float) -> float:
    """A typer callback for a duration that must be finite and above zero."""
    if not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"{value} is not a positive, finite number of seconds")
    return value


def read_goal(goal: str, command: str = "run") -> str:
    """The goal argument, checked before anything loads: `-` reads it from stdin (a long goal, a file);
    it must be UTF-8 text, not blank, and without a NUL (as every entry point takes goals: `check_goal`).
    A `UserError` (exit code 2) says what is wrong."""
    from ..stores._base import check_goal

    if goal == "-":
        goal = _read_stdin()
    check_text("the goal", goal)
    if not goal.strip():
        raise UserError(f"the goal must be a non-empty string, got {goal[:40]!r}")
    try:
        return check_goal(goal)
    except UserError as exc:  # only stdin can carry a NUL (an argument cannot)
        raise UserError(f"{exc}, e.g. tr -d '\\000' < goal.txt | thinkloop {command} -") from None


def check_text(what: str, value: str) -> None:
    """A command-line argument Python decoded with `surrogateescape` held bytes that are not UTF-8."""
    bad = next((i for i, ch in enumerate(value) if "\udc80" <= ch <= "\udcff"), None)
    if bad is not None:
        byte = ord(value[bad]) - 0xDC00
        raise UserError(
            f"{what} is not UTF-8 text (byte 0x{byte:02x} at character {bad + 1}): pass it as UTF-8 — "
            "check the encoding of the terminal or of the file it comes from (e.g. iconv -f latin1 -t utf-8)"
        )


def _read_stdin() -> str:
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(
            f"the goal read from stdin is not UTF-8 text (byte 0x{data[exc.start]:02x} at byte {exc.start + 1}): "
            "convert it first, e.g. iconv -f latin1 -t utf-8"
        ) from None
