"""`FileStore`: runs as JSON files in a directory (seed 000), for development and inspection.

    ROOT/runs/RUN_ID.json             the run's last state (replaced atomically)
    ROOT/runs/RUN_ID.events.jsonl     its event log, one JSON event per line
    ROOT/sessions/SESSION.jsonl       a session's conversation memory

Ids are checked (`[A-Za-z0-9_.-]`, no `..`) so no id can reach outside ROOT. Writers take an exclusive
`flock` on ROOT/.lock, so several processes may share a root on one machine. A checkpoint appends the
events, then replaces the state file; if a crash falls between the two, the next checkpoint drops the
orphaned events (their state was never saved), so the log stays gap-free — all of them when it was the
run's first save (a log without a state file): its id is free again, for a new run.

A checkpoint is on disk when it returns, power loss included: what it appends is synced before the
state is replaced; the new state is written to a temporary file and synced, renamed over the old one,
and the directory synced (without the syncs a power loss after the rename could leave an empty or
truncated state file, or a state whose events never reached the log).
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from .._errors import ConcurrencyError, StateError
from .._events import Event
from .._state import RunState
from ._base import (
    MemoryEntry,
    MemoryRole,
    RunStatus,
    RunSummary,
    Store,
    as_saved,
    base_version,
    check_id,
    check_limit,
    check_role,
    check_saves,
    clean_text,
    file_in_the_way,
    first_save_failed,
    load_state_text,
    lost_events,
    memory_turn,
    newest_runs,
    numbered,
    parse_event,
    problem,
    to_json,
)

T = TypeVar("T")


_TAIL = 64 * 1024  # bytes of a state file read for its save count (more: large metadata, parsed whole)
_SAVES_RE = re.compile(rb'"event_version":\s*\d+,\s*"saves":\s*(\d+)')


class FileStore(Store):
    """A store of JSON files under `root` (created if missing)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser()
        self.url = f"file://{self.root.resolve()}"

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a thread; a failing file system (read-only, full, a file where a directory
        should be) is a `StateError` saying which file and what to do."""
        try:
            return await asyncio.to_thread(fn, *args)
        except OSError as exc:
            raise StateError(f"the file store {self.root} failed: {exc}; {self._hint(exc)}") from exc

    def _hint(self, exc: OSError) -> str:
        if exc.errno == errno.ENOSPC:
            return "free some disk space"
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return (
                f"make {self.root} writable (the store writes .lock, runs/ and sessions/ in it), "
                "or use a store in a writable place"
            )
        blocking = self.root if self.root.is_file() else file_in_the_way(self.root)
        if blocking is not None:
            return f"{blocking} is a file, not a directory: give the path of a directory"
        return f"check that {self.root} is a directory you can read and write"

    # ---------------------------------------------------------------------------------- paths

    def _state_path(self, run_id: str) -> Path:
        return self.root / "runs" / f"{check_id(run_id)}.json"

    def _log_path(self, run_id: str) -> Path:
        return self.root / "runs" / f"{check_id(run_id)}.events.jsonl"

    def _session_path(self, session: str) -> Path:
        return self.root / "sessions" / f"{check_id(session, 'session id')}.jsonl"

    @contextmanager
    def _locked(self) -> Iterator[None]:
        _make_dir(self.root / "runs")
        _make_dir(self.root / "sessions")
        with open(self.root / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # ------------------------------------------------------------------------------------ runs

    async def checkpoint(self, state: RunState, events: Sequence[Event]) -> None:
        expected = base_version(state, events)
        lines = [to_json(e) for e in events]
        memory = [(role, content) for role, content in memory_turn(state, events)]
        written = (to_json(as_saved(state)), state.saves)
        try:
            await self._call(self._checkpoint, state.run_id, expected, lines, written, state.session, memory)
        except StateError as exc:
            if expected:  # the run's last checkpoint is kept: a resume continues from it
                raise
            raise first_save_failed(exc, state.run_id) from exc
        state.saves += 1

    def _checkpoint(
        self,
        run_id: str,
        expected: int,
        lines: list[str],
        state: tuple[str, int] | None,
        session: str | None,
        memory: list[tuple[MemoryRole, str]],
    ) -> None:
        log = self._log_path(run_id)
        with self._locked():
            existing = _read_lines(log, whole=True)
            if len(existing) != expected:
                existing = self._repair(run_id, existing, expected)
            if state is not None:
                check_saves(run_id, state[1], self._saved_count(run_id))
            if lines:
                _append_synced(log, lines)
            if memory:  # before the state that commits the turn: a crash between the two loses nothing
                self._forget_run(session or "", run_id)  # what a crashed try of this save wrote
                for role, content in memory:
                    self._remember(session or "", role, content, run_id)
            if state is not None:
                _write_atomic(self._state_path(run_id), state[0])

    def _repair(self, run_id: str, existing: list[str], expected: int) -> list[str]:
        """Drop events a crashed checkpoint wrote without its state — after the saved state's version, or
        all of them when no state file was ever written (a first save that never completed). A log behind
        the state being saved lost events (cut, deleted, restored from an older backup): damage, not a
        race; a log ahead of it otherwise is a lost race."""
        if len(existing) < expected:
            raise lost_events(run_id, str(self._log_path(run_id)), expected, len(existing))
        first_save = expected == 0 and not self._state_path(run_id).exists()
        if first_save or self._saved_field(run_id, "event_version") == expected:
            kept = existing[:expected]
            _write_atomic(self._log_path(run_id), "".join(line + "\n" for line in kept))
            return kept
        raise ConcurrencyError(run_id, expected, len(existing))

    def _saved_count(self, run_id: str) -> int | None:
        """The save count of the run's saved state, read from the end of its file (the field follows
        `event_version`; only `metadata` and `budget` come after it), without parsing the whole state: a
        run of 300 steps of 10 kB results has a 3 MB file, and a checkpoint reads this every time."""
        path = self._state_path(run_id)
        try:
            with open(path, "rb") as file:
                size = file.seek(0, 2)
                file.seek(max(size - _TAIL, 0))
                tail = file.read()
        except FileNotFoundError:
            return None
        found = _SAVES_RE.findall(tail)
        if found:
            return int(found[-1])
        return self._saved_field(run_id, "saves") if size > _TAIL else None

    def _saved_field(self, run_id: str, name: str) -> int | None:
        """A number in the run's saved state (None: no state file, no such number, not JSON)."""
        path = self._state_path(run_id)
        if not path.exists():
            return None
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, RecursionError):
            return None
        value = raw.get(name) if isinstance(raw, dict) else None
        return value if isinstance(value, int) else None

    async def load_state(self, run_id: str) -> RunState | None:
        path = self._state_path(run_id)
        text = await self._call(_read_state, path)
        return None if text is None else load_state_text(run_id, text, str(path))

    async def append_events(self, run_id: str, events: Sequence[Event], expected_version: int) -> int:
        check_id(run_id)
        lines = [to_json(e) for e in numbered(run_id, events, expected_version)]
        await self._call(self._append, run_id, expected_version, lines)
        return expected_version + len(lines)

    def _append(self, run_id: str, expected: int, lines: list[str]) -> None:
        log = self._log_path(run_id)
        with self._locked():
            actual = len(_read_lines(log, whole=True))
            if actual != expected:
                raise ConcurrencyError(run_id, expected, actual)
            _append_synced(log, lines)

    async def read_events(self, run_id: str, after: int = 0) -> list[Event]:
        log = self._log_path(run_id)
        lines = await self._call(_read_whole_lines, log)
        start = max(after, 0)
        return [parse_event(run_id, line, str(log), start + i) for i, line in enumerate(lines[start:], 1)]

    async def list_runs(
        self, limit: int = 50, *, status: RunStatus | None = None, session: str | None = None
    ) -> list[RunSummary]:
        check_limit(limit)
        return newest_runs(await self._call(self._summaries), limit, status, session)

    def _summaries(self) -> list[RunSummary]:
        runs = self.root / "runs"
        if not runs.is_dir():
            if self.root.exists() and not self.root.is_dir():  # the error the other operations give
                raise NotADirectoryError(errno.ENOTDIR, "Not a directory", str(self.root))
            return []
        out = []
        for path in runs.glob("*.json"):
            try:
                state = RunState.from_json(path.read_bytes())
            except (OSError, ValueError, StateError):
                continue  # a corrupt or newer run is reported by load_state, not by a listing
            out.append(RunSummary.from_state(state, updated_at=path.stat().st_mtime))
        return out

    # ---------------------------------------------------------------------------------- memory

    async def add_memory(self, session: str, role: MemoryRole, content: str) -> None:
        check_id(session, "session id")
        check_role(role)
        await self._call(self._add_memory, session, role, content)

    def _add_memory(self, session: str, role: MemoryRole, content: str) -> None:
        with self._locked():
            self._remember(session, role, content)

    def _remember(self, session: str, role: MemoryRole, content: str, run_id: str | None = None) -> None:
        """Append a message to the session's file; one of a run's turn names the run (`"run"`), so that a
        finishing save that a crash cut before its state was written can take it back when it is made again."""
        entry = MemoryEntry(session=session, role=role, content=clean_text(content), time=time.time())
        line = entry.model_dump_json()
        if run_id is not None:
            line = f"{line[:-1]},{_RUN_KEY}{json.dumps(run_id)}}}"
        _append_synced(self._session_path(session), [line])

    def _forget_run(self, session: str, run_id: str) -> None:
        """Remove the session's messages of run `run_id`: only a save of its turn that a crash cut before the
        run's state was written leaves any (the run's answer then may differ on resume)."""
        path = self._session_path(session)
        mark = f"{_RUN_KEY}{json.dumps(run_id)}}}"
        lines = _read_lines(path, whole=True)
        kept = [line for line in lines if not line.endswith(mark)]
        if len(kept) != len(lines):
            _write_atomic(path, "".join(line + "\n" for line in kept))

    async def get_memory(self, session: str, limit: int | None = None) -> list[MemoryEntry]:
        path = self._session_path(session)
        lines = await self._call(_read_whole_lines, path)
        first = 0 if limit is None else max(len(lines) - limit, 0) if limit > 0 else len(lines)
        return [_memory_entry(session, path, first + i, line) for i, line in enumerate(lines[first:], 1)]


_RUN_KEY = '"run":'  # the last key of a session line of a run's turn (`FileStore._remember`)


def _memory_entry(session: str, path: Path, number: int, line: str) -> MemoryEntry:
    try:
        if _RUN_KEY in line:
            line = re.sub(r',"run":"(?:[^"\\]|\\.)*"}$', "}", line)
        return MemoryEntry.model_validate_json(line)
    except ValueError as exc:
        raise StateError(
            f"session {session!r} in {path}: line {number} is corrupt ({problem(exc)}): remove or repair "
            "that line (the file is left as it is)"
        ) from exc


def _read_lines(path: Path, *, whole: bool = False) -> list[str]:
    """The file's lines; `whole`: without a last one cut off before its line break (a writer killed while
    it appended — the next save under the lock repairs the file)."""
    try:  # a damaged byte is U+FFFD: the line still counts, and the rest of the file reads
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    if whole:
        text = text[: text.rfind("\n") + 1]
    return [line for line in text.split("\n") if line.strip()]


def _read_whole_lines(path: Path) -> list[str]:
    return _read_lines(path, whole=True)


def _read_state(path: Path) -> bytes | None:
    try:
        return path.read_bytes()  # invalid UTF-8 is a corrupt state (StateError), not a UnicodeDecodeError
    except FileNotFoundError:
        return None


def _write_atomic(path: Path, text: str) -> None:
    """Replace `path` by `text`: after a crash or a power loss it holds the old text or the new, whole.
    The directory is synced too, which also puts on disk the names of files newly created in it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        _sync(f.fileno())
    os.replace(tmp, path)
    _sync_dir(path.parent)


def _append_synced(path: Path, lines: list[str]) -> None:
    """Append the lines to `path` and sync them (and the name of a new file) to disk. A last line cut off
    before its line break (its writer was killed: writers hold the lock, so nobody finishes it) is dropped
    first — the first line appended would be glued to it, and lost with it."""
    new = not path.exists()
    if not new:
        _drop_cut_end(path)
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
        f.flush()
        _sync(f.fileno())
    if new:
        _sync_dir(path.parent)


def _drop_cut_end(path: Path, chunk: int = 65536) -> None:
    """Truncate `path` after its last line break (nothing to do when it ends with one)."""
    with open(path, "rb+") as f:
        end = f.seek(0, os.SEEK_END)
        position = end
        while position > 0:
            start = max(position - chunk, 0)
            f.seek(start)
            data = f.read(position - start)
            if position == end and data.endswith(b"\n"):
                return
            newline = data.rfind(b"\n")
            if newline >= 0:
                f.truncate(start + newline + 1)
                return
            position = start
        f.truncate(0)


def _sync(fd: int) -> None:
    """Sync a file's data and size to disk (not its access times, where the system can tell them apart)."""
    getattr(os, "fdatasync", os.fsync)(fd)


def _sync_dir(path: Path) -> None:
    """fsync a directory: the names created, renamed or removed in it are then on disk (POSIX)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:  # a file system that cannot sync a directory (some network ones) just won't
        if exc.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)


def _make_dir(path: Path) -> None:
    """`mkdir -p path`, each directory it creates synced into its parent."""
    if path.is_dir():
        return
    if not path.parent.is_dir():
        _make_dir(path.parent)
    path.mkdir(exist_ok=True)
    _sync_dir(path.parent)
