"""Workspace file tools (SPEC §3.7): `read_file`, `write_file`, `list_dir` inside one root directory.

Every path is resolved (`..` collapsed, symlinks followed) and must stay inside the workspace root:
`../x`, absolute paths elsewhere, symlinks pointing out of the root and `~/x` (a home directory, which
would have been a folder named `~` in the root) are refused with an error the model can act on. A symlink whose target is inside the root is fine. Only regular files are read or
written (a FIFO would block forever, a device never end). `read_file` pages through a long file by
character `offset` and `limit`: it skips to the offset in 1 MiB chunks and then reads at most 4 bytes per
character it shows, so a 2 GB file is never loaded whole, and an offset at or past the file's size in
bytes (a character is at least one byte) is refused without reading; every `OSError` becomes a
`WorkspaceError` saying why. `list_dir` shows each entry on one line: a name holding control or
text-direction characters is shown escaped as in a JSON string (`a\\nb`), and the file tools accept
that form as the name. `write_file` replaces a file in one step (a temporary file in the same
directory, flushed to disk, then `os.replace`): a write that fails or is cut short by a crash leaves
the old file as it was.

Known limit: the check happens before the file is opened, so a process racing to swap a directory for
a symlink between the check and the open is not stopped; run untrusted workloads in a container.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import heapq
import os
import re
import secrets
import shlex
import stat
from collections.abc import Iterator
from pathlib import Path

from .._errors import ConfigurationError
from .._risk import RiskLevel
from .._tools import Tool

DEFAULT_MAX_READ = 8_000  # one page fits the agent's default output limit (10,000) with its note
_NOTE_ROOM = 200  # the paging note after a page: the agent must not cut it off
MAX_LIST_ENTRIES = 500
_NAME_MAX, _PATH_MAX = 255, 4096  # bytes, Linux's limits for a name and a whole path (with its NUL)


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
        """The real path of `path` (relative to the root), or `WorkspaceError` if it leaves the root.

        A name that `list_dir` showed escaped (`a\\nb` for a name holding a newline) is found under that
        form too, when nothing has the name as written."""
        target = self._resolve(path)
        if "\\" in path and not os.path.lexists(target):
            named = _unescaped(path)
            if named != path:
                with contextlib.suppress(WorkspaceError):
                    other = self._resolve(named)
                    if os.path.lexists(other) or (other.parent.is_dir() and not target.parent.is_dir()):
                        return other  # the file, or a new file in a directory that was shown escaped
        return target

    def _resolve(self, path: str) -> Path:
        if not isinstance(path, str) or "\x00" in path:
            raise WorkspaceError(f"invalid path {path!r}: a path cannot contain a NUL character")
        try:
            os.fsencode(path)
        except UnicodeEncodeError as exc:  # JSON's "\ud800": it was a raw UnicodeEncodeError
            raise WorkspaceError(
                f"invalid path {path!r}: it has invalid Unicode at character {exc.start} (a lone surrogate "
                "such as \\ud800); write the name as plain text"
            ) from None
        if path.startswith("~"):  # the shell's home directory, which Python never expands
            raise WorkspaceError(
                f"the path {path!r} starts with '~': the file tools do not expand it to a home directory, "
                f"which is outside the workspace ({self.root}). Use a path relative to the workspace "
                f"(write './{path}' for a name that starts with '~')."
            )
        try:
            target = (self.root / (path or ".")).resolve()
        except RuntimeError:  # a symlink loop (Python 3.11 and 3.12; 3.13 raises OSError ELOOP)
            raise WorkspaceError(f"cannot use {path!r}: {_REASONS[errno.ELOOP]}") from None
        except OSError as exc:
            raise _os_error("use", path, exc) from None
        if not target.is_relative_to(self.root):
            raise WorkspaceError(
                f"the path {path!r} is outside the workspace ({self.root}): it resolves to {target}. "
                "Use a path relative to the workspace, without '..' or links leading out of it."
            )
        return target

    def relative(self, path: Path) -> str:
        return str(path.relative_to(self.root)) if path != self.root else "."

    # ----------------------------------------------------------------------------------- operations

    def read(
        self, path: str, max_chars: int = DEFAULT_MAX_READ, offset: int = 0, limit: int | None = None
    ) -> str:
        """At most `limit` (capped at `max_chars`) characters of a regular file, from character `offset`.

        The characters before `offset` are skipped in 1 MiB chunks, never held together; after it, at
        most 4 bytes per character shown are read. When more follows, a last line says which offset to
        ask for next.
        """
        count = _check_paging(offset, limit, max_chars)
        target = self.resolve(path)
        try:
            fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not block
        except FileNotFoundError:
            raise WorkspaceError(f"no such file: {path!r} (use list_dir to see what exists)") from None
        except OSError as exc:
            raise _os_error("read", path, exc) from None
        try:
            size = _regular_size(os.fstat(fd), path, "read_file reads")
            if b"\x00" in os.pread(fd, 8192, 0):
                return f"({path} is a binary file of {size} bytes; not shown)"
            if offset >= size > _CHUNK:  # a character is at least one byte: counting them would read it all
                raise WorkspaceError(_past_end_of_bytes(path, offset, size))
            reader = _CharReader(fd)
            start = reader.skip(offset)
            shown, more = reader.take(count)
        except OSError as exc:
            raise _os_error("read", path, exc) from None
        finally:
            os.close(fd)
        if start < offset or (offset and not shown):
            raise WorkspaceError(_past_end(path, offset, start))
        return shown + _paging_note(offset, len(shown), size, more)

    def write(self, path: str, content: str, append: bool = False) -> str:
        """Write (or append) `content`; a write that fails leaves the file as it was.

        The new text goes to a temporary file in the same directory, flushed to disk, which then
        replaces the file in one step (`os.replace`) with its permission bits and owner: a full disk or
        a crash halfway never leaves half a file, nor no file. An append that fails is cut back to the
        file's old length. A write that fails removes what it made: the temporary file, a new file,
        the directories made for it."""
        target = self.resolve(path)
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise WorkspaceError(
                f"the content has invalid Unicode at character {exc.start} (a lone surrogate such as "
                "\\ud800): nothing was written; send valid text"
            ) from None
        info: os.stat_result | None = None
        try:
            if target == self.root or target.is_dir():
                raise WorkspaceError(f"{path!r} is a directory: give a file path")
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                info = os.stat(target)
                _regular_size(info, path, "write_file writes")
            if info is not None and not os.access(target, os.W_OK):  # replacing it would not need the right
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
            self._check_length(target, path)  # before mkdir: a failed write left directories behind
            made = _make_directories(target.parent)
            try:
                if append:
                    _append(target, data, info)
                else:
                    _replace(target, data, info)
            except BaseException:
                _remove_directories(made)
                raise
        except OSError as exc:
            kept = "nothing was written" if info is None else f"{path!r} was not changed"
            raise WorkspaceError(f"{_os_error('write', path, exc)}; {kept}") from None
        verb = "appended" if append else "wrote"
        return f"{verb} {len(content)} characters to {_shown_name(self.relative(target))}"

    def _check_length(self, target: Path, path: str) -> None:
        names = target.relative_to(self.root).parts
        if len(os.fsencode(target)) >= _PATH_MAX or any(len(os.fsencode(n)) > _NAME_MAX for n in names):
            raise WorkspaceError(
                f"cannot write {path!r}: {_REASONS[errno.ENAMETOOLONG]}; nothing was written"
            )

    def list(self, path: str = ".") -> str:
        target = self.resolve(path)
        try:
            if not target.is_dir():
                if target.exists():
                    raise WorkspaceError(f"{path!r} is a file, not a directory: use read_file to read it")
                raise WorkspaceError(f"no such directory: {path!r} (use list_dir('.') to see what exists)")
            names, count = _first_names(target, MAX_LIST_ENTRIES)
        except OSError as exc:
            raise _os_error("list", path, exc) from None
        lines = [_describe(target / name) for name in names]
        if count > MAX_LIST_ENTRIES:
            lines.append(f"… and {count - MAX_LIST_ENTRIES} more entries")
        header = f"{_shown_name(self.relative(target))}: {count} entries"
        return "\n".join([header, *lines]) if lines else f"{header} (empty)"


def _make_directories(folder: Path) -> list[Path]:
    """Make `folder` and its missing parents; the ones made, deepest first (to remove after a failure)."""
    missing: list[Path] = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory)
        except FileExistsError:
            if not directory.is_dir():
                raise
            missing.remove(directory)  # made meanwhile by someone else: not ours to remove
    return missing


def _remove_directories(made: list[Path]) -> None:
    for directory in made:
        with contextlib.suppress(OSError):  # not empty any more: someone else is using it
            os.rmdir(directory)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _temporary_file(folder: Path) -> tuple[int, Path]:
    """A new file in `folder` for the text that will replace a file there (created with mode 0o666 less
    the umask, as a new file would be)."""
    while True:
        temp = folder / f".thinkloop-{secrets.token_hex(6)}.tmp"  # short: any file name leaves room for it
        try:
            return os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), temp
        except FileExistsError:
            continue


def _replace(target: Path, data: bytes, info: os.stat_result | None) -> None:
    """Replace `target` with `data` in one step, keeping its permission bits and owner."""
    try:
        fd, temp = _temporary_file(target.parent)
    except PermissionError:  # no right to add a file to the directory: the file may still be writable
        if info is None:
            raise
        _overwrite(target, data)
        return
    try:
        try:
            if info is not None:
                if (info.st_uid, info.st_gid) != (os.geteuid(), os.getegid()):
                    with contextlib.suppress(PermissionError):  # only root may give a file away
                        os.fchown(fd, info.st_uid, info.st_gid)
                os.fchmod(fd, stat.S_IMODE(info.st_mode))  # after chown, which clears set-id bits
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    _sync_directory(target.parent)


def _overwrite(target: Path, data: bytes) -> None:
    """Write `data` over `target` in place (not atomic: only where no temporary file can be made)."""
    fd = os.open(target, os.O_WRONLY | os.O_TRUNC | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _append(target: Path, data: bytes, info: os.stat_result | None) -> None:
    """Append `data` to `target`; cut it back to its old length (or remove it, if new) when that fails."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO must not block
    fd = os.open(target, flags, 0o666)
    try:
        size = os.fstat(fd).st_size
        _write_all(fd, data)
        os.fsync(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            if info is None:
                os.unlink(target)
            else:
                os.ftruncate(fd, size)
        raise
    finally:
        os.close(fd)


def _sync_directory(folder: Path) -> None:
    """Flush the directory entry of a replaced file to disk (best effort: not every system allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


_REASONS = {
    errno.EACCES: "permission denied (this process may not access it)",
    errno.EPERM: "operation not permitted",
    errno.ENAMETOOLONG: "the name is too long (at most 255 bytes per name, 4,096 for the whole path)",
    errno.ELOOP: "it is a loop of symbolic links (a link that leads back to itself)",
    errno.ENOTDIR: "a part of the path is a file, not a directory",
    errno.EEXIST: "a part of the path is a file, not a directory",
    errno.EISDIR: "it is a directory: give a file path",
    errno.ENOSPC: "the disk is full",
    errno.EROFS: "the file system is read-only",
    errno.ENXIO: "it is a special file with nothing connected to it",
}
_KINDS = {
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
}


def _os_error(action: str, path: str, exc: OSError) -> WorkspaceError:
    reason = _REASONS.get(exc.errno or 0) or exc.strerror or str(exc)
    return WorkspaceError(f"cannot {action} {path!r}: {reason}")


def _regular_size(info: os.stat_result, path: str, what: str) -> int:
    """The size of a regular file; for anything else a `WorkspaceError` naming what it is."""
    mode = info.st_mode
    if stat.S_ISREG(mode):
        return info.st_size
    kind = _KINDS.get(stat.S_IFMT(mode), "a special file")
    hint = (
        ": use list_dir to see its contents"
        if stat.S_ISDIR(mode)
        else f", not a regular file: {what} regular files only"
    )
    raise WorkspaceError(f"{path!r} is {kind}{hint}")


_CHUNK = 1 << 20


class _CharReader:
    """A file's UTF-8 text read in chunks; a byte that is not UTF-8 counts as one character (U+FFFD)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.eof = False
        self.pending = ""  # text decoded past the position reached by `skip`

    def _read(self, max_bytes: int) -> str:
        data = os.read(self.fd, max_bytes)
        self.eof = not data
        return self.decoder.decode(data, final=self.eof)

    def skip(self, count: int) -> int:
        """Skip `count` characters (fewer at the end of the file); return how many were skipped."""
        skipped = 0
        while skipped < count and not self.eof:
            if self.decoder.getstate()[0] == b"":  # nothing half-decoded: ASCII needs no decoding
                data = os.read(self.fd, _CHUNK)
                self.eof = not data
                if data.isascii() and len(data) <= count - skipped:
                    skipped += len(data)
                    continue
                text = self.decoder.decode(data, final=self.eof)
            else:
                text = self._read(_CHUNK)
            if skipped + len(text) >= count:
                self.pending = text[count - skipped :]
                return count
            skipped += len(text)
        return skipped

    def take(self, count: int) -> tuple[str, bool]:
        """The next `count` characters, and whether any follow."""
        parts, have = [self.pending], len(self.pending)
        while have <= count and not self.eof:
            text = self._read(min(_CHUNK, 4 * (count + 1 - have) + 4))
            parts.append(text)
            have += len(text)
        text = "".join(parts)
        return text[:count], len(text) > count


def _check_paging(offset: object, limit: object, max_chars: int) -> int:
    """How many characters to show; a `WorkspaceError` for an offset or limit that is not usable."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise WorkspaceError(f"offset must be a whole number of characters, 0 or more (got {offset!r})")
    if limit is None:
        return max_chars
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise WorkspaceError(f"limit must be a whole number of characters, 1 or more (got {limit!r})")
    return min(limit, max_chars)


def _past_end(path: str, offset: int, total: int) -> str:
    if total == 0:
        return f"{path!r} is empty: there is nothing to read at offset {offset}"
    return (
        f"offset {offset} is at or past the end of {path!r}, which has {total} characters: "
        f"ask for an offset below {total} (offset=0 reads from the start)"
    )


def _past_end_of_bytes(path: str, offset: int, size: int) -> str:
    return (
        f"offset {offset} is at or past the end of {path!r}, which has {size} bytes (so at most {size} "
        f"characters): ask for an offset below {size} (offset=0 reads from the start)"
    )


def _paging_note(offset: int, shown: int, size: int, more: bool) -> str:
    if not more:
        return f"\n… [end of file: showed characters {offset} to {offset + shown - 1}]" if offset else ""
    where = f"the first {shown} characters" if offset == 0 else f"characters {offset} to {offset + shown - 1}"
    return (
        f"\n… [file truncated: showing {where} of {size} bytes; "
        f"call read_file with offset={offset + shown} to read on]"
    )


def _first_names(directory: Path, limit: int) -> tuple[list[str], int]:
    """The first `limit` names of `directory` in sorted order and how many it has, in O(limit) memory."""
    count = 0

    def names() -> Iterator[str]:
        nonlocal count
        with os.scandir(directory) as entries:
            for entry in entries:
                count += 1
                yield entry.name

    return heapq.nsmallest(limit, names()), count


def _describe(entry: Path) -> str:
    name = _shown_name(entry.name)
    note = _name_note(entry.name)
    if entry.is_symlink():
        try:
            return f"{name} -> {_shown_name(os.readlink(entry))}{note}"
        except OSError:  # removed since it was listed
            return name + note
    if entry.is_dir():
        return f"{name}/{note}"
    try:
        size = entry.stat().st_size
    except OSError:
        return name + note
    return f"{name}  {size} bytes{note}"


_UNDECODED = r"\udc80-\udcff"  # the bytes of a file name that are not UTF-8 (a regular expression's range)
# control characters (C0, DEL, C1), line and paragraph separators, and the invisible marks and
# overrides of the text direction, which make a name read as another ("invoice\u202efdp.exe")
_CONTROLS = r"\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_UNDECODED_RE = re.compile(f"[{_UNDECODED}]+")
_CONTROLS_RE = re.compile(f"[{_CONTROLS}]")
_UNREADABLE_RE = re.compile(f"[{_UNDECODED}{_CONTROLS}]+")
_ESCAPED_RE = re.compile(rf"[\\{_UNDECODED}{_CONTROLS}]")
_SHORT_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
_UNESCAPE_RE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|([\\ntr]))")
_NOT_UTF8 = (
    "  (the name is not UTF-8, so the file tools cannot open it: rename it with the shell, e.g. "
    "mv ./{glob} new-name)"
)
_ESCAPED = (
    "  (the name has control or text-direction characters, shown escaped as in a JSON string: "
    "give the file tools the name as shown)"
)


def _shown_name(name: str) -> str:
    """A file name as one line of text the model can read: bytes that are not UTF-8 as `\\xff` (they
    reached it as `?`, a name it could not use and was not told why), control and text-direction
    characters as JSON escapes (`\\n`, `\\u202e`: a newline made one name look like several entries),
    and then a backslash as `\\\\`."""
    if not _UNREADABLE_RE.search(name):
        return name
    return _ESCAPED_RE.sub(_escape, name)


def _escape(match: re.Match[str]) -> str:
    char = match[0]
    if "\udc80" <= char <= "\udcff":
        return f"\\x{ord(char) - 0xDC00:02x}"
    return _SHORT_ESCAPES.get(char) or f"\\u{ord(char):04x}"


def _unescaped(path: str) -> str:
    """`path` with the escapes of `_shown_name` undone (`\\n`, `\\t`, `\\r`, `\\\\`, `\\uXXXX`, not a
    surrogate: a name that is not UTF-8 stays for the shell to rename)."""

    def undo(match: re.Match[str]) -> str:
        if match[2]:
            return {"n": "\n", "t": "\t", "r": "\r"}.get(match[2], match[2])
        char = chr(int(match[1], 16))
        return match[0] if "\ud800" <= char <= "\udfff" else char

    return _UNESCAPE_RE.sub(undo, path)


def _name_note(name: str) -> str:
    if _UNDECODED_RE.search(name):
        return _NOT_UTF8.format(glob=_glob(name))
    return _ESCAPED if _CONTROLS_RE.search(name) else ""


def _glob(name: str) -> str:
    """A shell pattern for `name` on one line: `*` for its bytes that are not UTF-8 and its controls."""
    parts = _UNREADABLE_RE.split(name)
    return "*".join(shlex.quote(part) if part else "" for part in parts)


def file_tools(root: str | os.PathLike[str], *, max_read: int = DEFAULT_MAX_READ) -> list[Tool]:
    """`read_file` (LOW risk), `write_file` (MEDIUM) and `list_dir` (LOW), confined to `root`.

    `read_file` shows at most `max_read` characters per call (a page); its output limit is set to hold a
    whole page and its paging note, so an agent's output limit never cuts out the middle of a page.
    """
    if isinstance(max_read, bool) or not isinstance(max_read, int) or max_read < 1:
        raise ConfigurationError(
            f"max_read must be a whole number of characters, 1 or more (got {max_read!r})"
        )
    space = Workspace(root)

    def read_file(path: str, offset: int = 0, limit: int | None = None) -> str:
        return space.read(path, max_read, offset, limit)

    def write_file(path: str, content: str, append: bool = False) -> str:
        return space.write(path, content, append)

    def list_dir(path: str = ".") -> str:
        return space.list(path)

    where = f"the workspace {space.root}"
    path_doc = {"type": "string", "description": f"A path relative to {where}."}
    return [
        Tool(
            "read_file",
            f"Read a text file in {where}: at most {max_read} characters per call. When a file is longer, "
            "the output ends with the offset to pass to read the next part.",
            _object(
                {
                    "path": path_doc,
                    "offset": {
                        "type": "integer",
                        "minimum": 0,
                        "default": 0,
                        "description": "The character to start at (0 is the start of the file).",
                    },
                    "limit": {
                        "type": "integer",
                        "minimum": 1,
                        "description": f"At most this many characters (at most {max_read}, the default).",
                    },
                },
                ["path"],
            ),
            read_file,
            risk=RiskLevel.LOW,
            idempotent=True,
            output_max_length=max_read + _NOTE_ROOM,
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
