"""Options shared by the commands that build an agent (`run`, `serve`, `worker`): one definition each."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

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
