"""Workspace file tools (SPEC §3.7): `read_file`, `write_file`, `list_dir` inside one root directory.

Every path is resolved (`..` collapsed, symlinks followed) and must stay inside the workspace root:
`../x`, absolute paths elsewhere and symlinks pointing out of the root are refused with an error the
model can act on. A symlink whose target is inside the root is fine.

Known limit: the check happens before the file is opened, so a process racing to swap a directory for
a symlink between the check and the open is not stopped; run untrusted workloads in a container.
"""

from __future__ import annotations

import os
from pathlib import Path

from .._errors import ConfigurationError
from .._risk import RiskLevel
from .._tools import Tool

DEFAULT_MAX_READ = 100_000
MAX_LIST_ENTRIES = 500


class WorkspaceError(ValueError):
    """A path outside the workspace, or a file operation that cannot be done; written for the model."""


class Workspace:
    """A directory the file tools are confined to."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        path = Path(root).expanduser().resolve()
        if not path.is_dir():
            raise ConfigurationError(f"the workspace root {str(path)!r} is not a directory: create it first")
        self.root = path

    def resolve(self, path: str) -> Path:
        """The real path of `path` (relative to the root), or `WorkspaceError` if it leaves the root."""
        if not isinstance(path, str) or "\x00" in path:
            raise WorkspaceError(f"invalid path {path!r}")
        target = (self.root / (path or ".")).resolve()
        if not target.is_relative_to(self.root):
            raise WorkspaceError(
                f"the path {path!r} is outside the workspace ({self.root}): it resolves to {target}. "
                "Use a path relative to the workspace, without '..' or links leading out of it."
            )
        return target

    def relative(self, path: Path) -> str:
        return str(path.relative_to(self.root)) if path != self.root else "."

    # ----------------------------------------------------------------------------------- operations

    def read(self, path: str, max_chars: int = DEFAULT_MAX_READ) -> str:
        target = self.resolve(path)
        if not target.exists():
            raise WorkspaceError(f"no such file: {path!r} (use list_dir to see what exists)")
        if target.is_dir():
            raise WorkspaceError(f"{path!r} is a directory: use list_dir to see its contents")
        data = target.read_bytes()
        if b"\x00" in data[:8192]:
            return f"({path} is a binary file of {len(data)} bytes; not shown)"
        text = data.decode("utf-8", errors="replace")
        if len(text) > max_chars:
            return text[:max_chars] + f"\n… [file truncated: showing {max_chars} of {len(text)} characters]"
        return text

    def write(self, path: str, content: str, append: bool = False) -> str:
        target = self.resolve(path)
        if target == self.root or target.is_dir():
            raise WorkspaceError(f"{path!r} is a directory: give a file path")
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a" if append else "w", encoding="utf-8") as handle:
            handle.write(content)
        verb = "appended" if append else "wrote"
        return f"{verb} {len(content)} characters to {self.relative(target)}"

    def list(self, path: str = ".") -> str:
        target = self.resolve(path)
        if not target.is_dir():
            raise WorkspaceError(f"{path!r} is not a directory")
        entries = sorted(target.iterdir(), key=lambda p: p.name)
        lines = [_describe(entry) for entry in entries[:MAX_LIST_ENTRIES]]
        if len(entries) > MAX_LIST_ENTRIES:
            lines.append(f"… and {len(entries) - MAX_LIST_ENTRIES} more entries")
        header = f"{self.relative(target)}: {len(entries)} entries"
        return "\n".join([header, *lines]) if lines else f"{header} (empty)"


def _describe(entry: Path) -> str:
    if entry.is_symlink():
        return f"{entry.name} -> {os.readlink(entry)}"
    if entry.is_dir():
        return f"{entry.name}/"
    try:
        size = entry.stat().st_size
    except OSError:
        return entry.name
    return f"{entry.name}  {size} bytes"


def file_tools(root: str | os.PathLike[str], *, max_read: int = DEFAULT_MAX_READ) -> list[Tool]:
    """`read_file` (LOW risk), `write_file` (MEDIUM) and `list_dir` (LOW), confined to `root`."""
    space = Workspace(root)

    def read_file(path: str) -> str:
        return space.read(path, max_read)

    def write_file(path: str, content: str, append: bool = False) -> str:
        return space.write(path, content, append)

    def list_dir(path: str = ".") -> str:
        return space.list(path)

    where = f"the workspace {space.root}"
    path_doc = {"type": "string", "description": f"A path relative to {where}."}
    return [
        Tool(
            "read_file",
            f"Read a text file in {where}.",
            _object({"path": path_doc}, ["path"]),
            read_file,
            risk=RiskLevel.LOW,
            idempotent=True,
        ),
        Tool(
            "write_file",
            f"Write (or with append=true, append) text to a file in {where}; parent directories are created.",
            _object(
                {
                    "path": path_doc,
                    "content": {"type": "string", "description": "The text to write."},
                    "append": {"type": "boolean", "description": "Append instead of replacing."},
                },
                ["path", "content"],
            ),
            write_file,
            risk=RiskLevel.MEDIUM,
            idempotent=False,
        ),
        Tool(
            "list_dir",
            f"List a directory in {where} (names, '/' for directories, sizes).",
            _object({"path": {**path_doc, "default": "."}}, []),
            list_dir,
            risk=RiskLevel.LOW,
            idempotent=True,
        ),
    ]


def _object(properties: dict[str, object], required: list[str]) -> dict[str, object]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
