"""Built-in tools (SPEC §3.7): shell, SSH, workspace files, output analysis and a safe calculator.

Each carries a risk level for the safety controller: `shell` and `ssh_execute` rate each command with the
classifier, `write_file` is MEDIUM, the others LOW. `builtin_tools(["shell", "files"], root=...)` builds
them by name (what the CLI's `--tools` does).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from .._errors import ConfigurationError
from .._tools import Tool
from ..safety._policy import command_risk as command_risk
from ._analyze import analyze_output as analyze_output
from ._analyze import analyze_output_tool as analyze_output_tool
from ._analyze import analyze_text as analyze_text
from ._files import Workspace as Workspace
from ._files import WorkspaceError as WorkspaceError
from ._files import file_tools as file_tools
from ._shell import DEFAULT_ENV_ALLOWLIST as DEFAULT_ENV_ALLOWLIST
from ._shell import ShellCommandError as ShellCommandError
from ._shell import shell_tool as shell_tool
from ._ssh import SSHExecutor as SSHExecutor
from ._ssh import SSHHost as SSHHost
from ._ssh import SSHToolError as SSHToolError
from ._ssh import load_hosts as load_hosts
from ._ssh import ssh_tool as ssh_tool
from .calculator import calculator as calculator

BUILTIN_TOOL_NAMES = (
    "shell",
    "ssh_execute",
    "files",
    "read_file",
    "write_file",
    "list_dir",
    "calculator",
    "analyze_output",
)


def builtin_tools(
    names: Iterable[str],
    *,
    root: str | os.PathLike[str] = ".",
    hosts: Mapping[str, SSHHost | Mapping[str, Any]] | None = None,
    shell_timeout: float = 60.0,
) -> list[Tool]:
    """The built-in tools named in `names` (see `BUILTIN_TOOL_NAMES`; `files` means all three file tools).

    Args:
        root: the workspace of the file tools and the working directory of `shell`.
        hosts: the hosts of `ssh_execute` (required when it is asked for).
        shell_timeout: seconds before a `shell` command is killed.
    """
    wanted = [n.strip() for n in names if n.strip()]
    unknown = [n for n in wanted if n not in BUILTIN_TOOL_NAMES and n != "ssh"]
    if unknown:
        raise ConfigurationError(
            f"unknown built-in tool(s) {', '.join(unknown)}: choose from {', '.join(BUILTIN_TOOL_NAMES)}"
        )
    tools: dict[str, Tool] = {}
    files = {t.name: t for t in file_tools(root)} if any(n in _FILE_NAMES for n in wanted) else {}
    for name in wanted:
        for item in _build(name, root=root, hosts=hosts, shell_timeout=shell_timeout, files=files):
            tools.setdefault(item.name, item)
    return list(tools.values())


_FILE_NAMES = ("files", "read_file", "write_file", "list_dir")


def _build(
    name: str,
    *,
    root: str | os.PathLike[str],
    hosts: Mapping[str, SSHHost | Mapping[str, Any]] | None,
    shell_timeout: float,
    files: dict[str, Tool],
) -> list[Tool]:
    if name == "shell":
        return [shell_tool(cwd=root, timeout=shell_timeout)]
    if name in ("ssh_execute", "ssh"):
        if not hosts:
            raise ConfigurationError(
                "ssh_execute needs hosts: pass hosts={'web1': SSHHost(hostname=..., username=...)} "
                "(or a hosts file to the CLI)"
            )
        return [ssh_tool(hosts)]
    if name == "files":
        return list(files.values())
    if name in files:
        return [files[name]]
    if name == "calculator":
        return [calculator]
    return [analyze_output]


__all__ = [
    "BUILTIN_TOOL_NAMES",
    "DEFAULT_ENV_ALLOWLIST",
    "SSHExecutor",
    "SSHHost",
    "SSHToolError",
    "ShellCommandError",
    "Workspace",
    "WorkspaceError",
    "analyze_output",
    "analyze_output_tool",
    "analyze_text",
    "builtin_tools",
    "calculator",
    "command_risk",
    "file_tools",
    "load_hosts",
    "shell_tool",
    "ssh_tool",
]
