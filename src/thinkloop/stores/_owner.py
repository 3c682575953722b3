"""Which process runs a saved run, so that nobody resumes it while that process still runs it.

`thinkloop run`, `thinkloop runs resume` and `thinkloop serve` record the process running a run in its
metadata (`metadata["cli"]`: `pid` and `host`). Resuming a run that process still runs would run it twice
at once — the same tool calls, and one of the two failing at its next checkpoint — so `runs resume` and
the server's `POST /api/runs/{id}/resume` refuse it (`check_not_running`) unless forced. A process on
another machine cannot be checked.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._errors import UserError

KEY = "cli"  # the metadata entry that names the process (with how the CLI built the agent)


class StillRunningError(UserError):
    """The process that last ran the run is still alive on this machine."""


def check_not_running(run_id: str, metadata: Mapping[str, Any], force: str) -> None:
    """Raise `StillRunningError` when another live thinkloop process on this machine runs the run;
    `force` says how to resume it anyway (`--force`)."""
    raw = metadata.get(KEY)
    owner: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    pid = owner.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or pid == os.getpid():
        return
    if owner.get("host") != socket.gethostname() or not _is_thinkloop(pid):
        return
    raise StillRunningError(
        f"run {run_id!r} is still running in process {pid} on this machine: stop it first (Ctrl-C there, "
        f"or kill {pid} — the run is saved resumable), then resume it; {force} resumes it anyway (only if "
        "that process is not thinkloop running it)"
    )


def claim(metadata: dict[str, Any]) -> None:
    """Record this process as the one running the run (in `metadata`, to be saved with it)."""
    raw = metadata.get(KEY)
    metadata[KEY] = {**(raw if isinstance(raw, dict) else {}), **this_process()}


def this_process() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname()}


def _is_thinkloop(pid: int) -> bool:
    """Whether process `pid` is alive and (where /proc tells) a thinkloop command — not a reused pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    try:
        return b"thinkloop" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # no /proc (macOS …): alive is all that is known
        return True
