"""Stores: where runs, their event logs and conversation memory are kept (SPEC §9).

    SQLiteStore(path=None)   the embedded default: one file, several processes on one machine
    PostgresStore(dsn)       several processes or machines (the `postgres` extra)
    MemoryStore()            this process only, with copies and the event log (tests)
    InProcessStore()         the default of `Agent()`: live states and session memory, no event log
    FileStore(root)          JSON files in a directory

`open_store(url)` builds one from a URL: `sqlite:///path/to.db`, `sqlite://` (the default file),
`postgresql://user@host/db`, `file:///some/dir`, `memory:`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError
from ._base import MemoryEntry as MemoryEntry
from ._base import RunStatus as RunStatus
from ._base import RunSummary as RunSummary
from ._base import Store as Store
from ._base import check_id as check_id
from ._memory import InProcessStore as InProcessStore
from ._memory import MemoryStore as MemoryStore

if TYPE_CHECKING:
    from ._file import FileStore as FileStore
    from ._postgres import PostgresStore as PostgresStore
    from ._sqlite import SQLiteStore as SQLiteStore
    from ._sqlite import default_path as default_path

_LAZY = {  # imported on first use, so `import thinkloop` stays fast
    "FileStore": "._file",
    "PostgresStore": "._postgres",
    "SQLiteStore": "._sqlite",
    "default_path": "._sqlite",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "FileStore",
    "MemoryEntry",
    "InProcessStore",
    "MemoryStore",
    "PostgresStore",
    "RunStatus",
    "RunSummary",
    "SQLiteStore",
    "Store",
    "check_id",
    "default_path",
    "open_store",
]


def open_store(url: str | None = None) -> Store:
    """A store from a URL; None or `""` means the default SQLite file (`$THINKLOOP_STORE` if set)."""
    import os

    text = (url or os.environ.get("THINKLOOP_STORE") or "sqlite://").strip()
    scheme, sep, rest = text.partition(":")
    scheme = scheme.lower()
    if scheme == "memory":
        if rest.strip():
            raise ConfigurationError(f"store URL {text!r}: memory: takes nothing after the colon")
        return MemoryStore()
    if scheme in ("postgres", "postgresql"):
        from ._postgres import PostgresStore

        return PostgresStore(text)
    if scheme == "sqlite" and sep:
        from ._sqlite import SQLiteStore

        path = _path_of(rest)
        if path in (":memory:", "/:memory:"):  # `sqlite:///:memory:`, as SQLAlchemy writes it: no file
            return SQLiteStore(":memory:")
        return SQLiteStore(path or None)
    if scheme == "file" and sep:
        path = _path_of(rest)
        if not path:
            raise ConfigurationError(f"store URL {text!r} needs a directory: file:///path/to/dir")
        from ._file import FileStore

        return FileStore(path)
    raise ConfigurationError(
        f"unknown store URL {text!r}: use sqlite:///path.db, postgresql://user@host/db, "
        "file:///path/to/dir or memory:"
    )


def _path_of(rest: str) -> str:
    """`///abs/path` and `////abs/path` → `/abs/path`; `//` → ``; `//rel/path` and `rel/path` → `rel/path`."""
    if rest.startswith("//"):
        rest = rest[2:]
    while rest.startswith("//"):
        rest = rest[1:]
    return str(Path(rest)) if rest else ""
