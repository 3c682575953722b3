"""Experience (SPEC §11): lessons learned from past runs, recalled for new tasks.

After a run ends, the agent hands its record (task, tools used, success, stop reason) to a `Learner`
in the background — never delaying the answer, within 30 s, failures logged and swallowed. When a run
starts, the learner is asked for the lessons relevant to the new task; they go into the "Lessons from
earlier runs" layer of the system prompt (and into `state.metadata["lessons"]`, so a resumed run sees the
same prompt). Without a learner the agent works unchanged.

    book = LessonBook("lessons.jsonl")            # or LessonBook() in memory
    agent = Agent(model, tools=[...], experience=book)

`LessonBook` distills lessons with rules by default (which tools solved a similar task, which call
failed and how, a loop that was stopped); `model_distiller(model)` has a model write them instead. It
recalls them by BM25 relevance of the new task to the tasks the lessons came from.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import json
import logging
import math
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ._data import Data
from ._discovery import tokenize
from ._errors import ConfigurationError
from ._json import valid_text
from ._messages import Message, ModelRequest, ModelSettings
from ._state import RunState, StopReason

if TYPE_CHECKING:
    from .models import Model

__all__ = ["Learner", "Lesson", "LessonBook", "RunRecord", "ToolUse", "model_distiller", "rule_lessons"]

logger = logging.getLogger("thinkloop.experience")
LESSON_LIMIT = 1000  # characters of a lesson kept: every lesson recalled goes into a system prompt
TASK_LIMIT = 1000  # characters of a task kept with its lessons and matched at recall
_LINE_BUDGET = 32 * 1024  # bytes read from a lessons file per lesson kept (a lesson's line is ~2-10 kB)


# =============================================================================================== records


@dataclass(slots=True, kw_only=True)
class ToolUse(Data):
    """One tool call of a finished run, as a learner sees it."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    success: bool
    output: str = ""  # the start of the result (or of the error)


@dataclass(slots=True, kw_only=True)
class RunRecord(Data):
    """What a learner is told about a finished run."""

    run_id: str
    task: str
    answer: str
    stop_reason: StopReason
    success: bool  # the model gave its own final answer
    steps: int
    duration: float
    tools: list[ToolUse] = field(default_factory=list)
    error: str | None = None

    @classmethod
    def from_state(cls, state: RunState) -> RunRecord:
        uses = [
            ToolUse(
                name=e.name, arguments=e.arguments, success=bool(e.success), output=(e.output or "")[:300]
            )
            for e in state.ledger.values()
            if e.status == "done" and e.error_kind != "repeated_call"
        ]
        reason = state.stop_reason or StopReason.ERROR
        return cls(
            run_id=state.run_id,
            task=state.goal,
            answer=state.answer or "",
            stop_reason=reason,
            success=reason is StopReason.FINAL_ANSWER,
            steps=state.step,
            duration=state.elapsed,
            tools=uses,
            error=state.error,
        )


@dataclass(slots=True, kw_only=True)
class Lesson(Data):
    """A lesson: its text, and the task it was learnt from (what recall matches new tasks against)."""

    text: str
    task: str
    success: bool
    tools: list[str] = field(default_factory=list)
    run_id: str = ""
    created_at: float = field(default_factory=time.time)


@runtime_checkable
class Learner(Protocol):
    """Learns from finished runs and recalls lessons for new tasks (see `LessonBook`)."""

    async def learn(self, record: RunRecord) -> None: ...

    async def recall(self, task: str, *, limit: int = 3) -> list[str]: ...


Distiller = Callable[[RunRecord], Awaitable[Sequence[str]]]
"""Turns a run record into lesson texts (`rule_lessons`, or `model_distiller(model)`)."""


# ============================================================================================ distilling


def _clip(text: str, limit: int) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _shape(use: ToolUse) -> str:
    """`name(arg, arg)`: the call's shape without its values (values belong to the old task)."""
    return f"{use.name}({', '.join(use.arguments)})"


_STOPS = {
    StopReason.MAX_STEPS: "ran out of steps",
    StopReason.MAX_TOKENS: "ran out of tokens",
    StopReason.MAX_COST: "ran out of budget",
    StopReason.TIMEOUT: "ran out of time",
    StopReason.NO_PROGRESS: "stopped making progress",
    StopReason.DANGEROUS_LOOP: "was stopped for repeating itself",
    StopReason.ERROR: "failed",
    StopReason.CANCELLED: "was cancelled",
}


async def rule_lessons(record: RunRecord) -> list[str]:
    """Lessons by rule (no model call): what solved the task, or what went wrong.

    - solved with tools: the tools in the order they first succeeded, as shapes (`name(args)`);
    - a failing call: the tool, its error, and "do not repeat it" — also when the run was solved;
    - not solved: how the run ended, and the advice that follows from it.
    """
    task = _clip(record.task, 120)
    lessons: list[str] = []
    worked: list[str] = []
    for use in record.tools:
        shape = _shape(use)
        if use.success and shape not in worked:
            worked.append(shape)
    if record.success and worked:
        lessons.append(f'For a task like "{task}", calling {" then ".join(worked[:4])} led to the answer.')
    failed = next((u for u in record.tools if not u.success), None)
    if failed is not None:
        lessons.append(
            f'For a task like "{task}", {_shape(failed)} failed with: {_clip(failed.output, 160)} '
            "Check the arguments before calling it, and do not repeat a failing call."
        )
    if not record.success and record.stop_reason is not StopReason.CANCELLED:
        how = _STOPS.get(record.stop_reason, "did not finish")
        advice = {
            StopReason.DANGEROUS_LOOP: "once a tool has given the result, give the final answer instead of calling it again",
            StopReason.NO_PROGRESS: "when calls stop giving new results, answer with what you have or try another tool",
            StopReason.MAX_STEPS: "plan the fewest calls that answer it and give the final answer as soon as you can",
        }.get(record.stop_reason, "try a different approach")
        lessons.append(f'A run on a task like "{task}" {how}: {advice}.')
    return lessons


DISTILL_PROMPT = (
    "You review a finished run of an AI agent that uses tools. Write at most {limit} short lessons (one per "
    "line, each under 200 characters) that would help the agent do a SIMILAR task better next time: which "
    "tools to use and in what order, which mistakes to avoid. Be general: no values that only fit this "
    "run. If there is nothing worth remembering, write NONE."
)


def model_distiller(model: Model, *, limit: int = 3) -> Distiller:
    """A distiller that asks `model` to write the lessons (one extra model call per run, not counted in the
    run's usage). Falls back to `rule_lessons` when the model fails or writes nothing usable."""

    async def distill(record: RunRecord) -> list[str]:
        calls = "\n".join(
            f"- {u.name}({_clip(json.dumps(u.arguments, ensure_ascii=False, default=str), 120)}) -> "
            f"{'ok' if u.success else 'FAILED'}: {_clip(u.output, 160)}"
            for u in record.tools[:20]
        )
        report = (
            f"Task: {_clip(record.task, 400)}\nOutcome: {record.stop_reason.value} after {record.steps} step(s)"
            f"{' (error: ' + _clip(record.error, 200) + ')' if record.error else ''}\n"
            f"Tool calls:\n{calls or '(none)'}\nFinal answer: {_clip(record.answer, 300)}"
        )
        request = ModelRequest(
            messages=[Message.system(DISTILL_PROMPT.format(limit=limit)), Message.user(report)],
            settings=ModelSettings(temperature=0.0, max_output_tokens=300),
        )
        try:
            text = (await model.request(request)).text
        except Exception as exc:
            logger.warning("the lesson model failed (%s); using rule lessons", exc)
            return await rule_lessons(record)
        lines = [line.strip(" -*•\t") for line in text.splitlines()]
        lessons = [_clip(line, 240) for line in lines if line and line.upper() != "NONE"][:limit]
        return lessons or await rule_lessons(record)

    return distill


# ============================================================================================ the book


class LessonBook:
    """Lessons kept in a JSON-lines file (or in memory), recalled by relevance to the new task.

    Args:
        path: the file (created on the first lesson); None keeps the lessons in memory only.
        distill: how a run record becomes lessons (`rule_lessons` by default; `model_distiller(model)`).
        max_lessons: the newest lessons kept; older ones are forgotten.
        min_relevance: the share (0–1) of the new task's terms, weighted by rarity, that a lesson's task
            must share to be recalled.

    Several processes may share the file: a lesson is added (and the oldest forgotten) under an OS lock on
    a lock file beside it (`PATH.lock`), from the file as it is then, so no process loses another's lesson.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        distill: Distiller = rule_lessons,
        max_lessons: int = 500,
        min_relevance: float = 0.5,
    ) -> None:
        if max_lessons < 1:
            raise ConfigurationError(f"max_lessons must be at least 1, got {max_lessons}")
        if not 0 <= min_relevance <= 1:
            raise ConfigurationError(f"min_relevance must be between 0 and 1, got {min_relevance}")
        self.path = Path(path).expanduser() if path is not None else None
        if self.path is not None and self.path.is_dir():
            raise ConfigurationError(
                f"the lessons file {str(self.path)!r} is a directory: give the path of a file in it, "
                f"e.g. {str(self.path / 'lessons.jsonl')!r}"
            )
        self.distill = distill
        self.max_lessons = max_lessons
        self.min_relevance = min_relevance
        self._lessons: list[Lesson] | None = None  # loaded on first use
        self._seen: _Signature | None = None  # the file as it was when `_lessons` were read from it
        # one book may serve agents in several threads, each with its own event loop (`run_sync` in
        # threads): a thread lock, held in a worker thread, never an asyncio one bound to one loop
        self._lock = threading.Lock()

    # ----------------------------------------------------------------------------------- learning

    async def learn(self, record: RunRecord) -> None:
        """Distill the record into lessons and keep the new ones.

        Raises:
            TypeError: the distiller returned something other than lesson texts (one text is taken as
                one lesson: it was kept a character at a time).
        """
        distilled: Any = await self.distill(record)
        if isinstance(distilled, str):
            distilled = [distilled]
        elif not isinstance(distilled, Iterable) or isinstance(
            distilled, bytes | Mapping
        ):  # None: no `return`
            raise TypeError(
                f"the distiller {getattr(self.distill, '__name__', self.distill)!r} returned "
                f"{type(distilled).__name__} {_clip(repr(distilled), 80)}: it must return a list of lesson texts"
            )
        texts = [_clip_lesson(t) for t in distilled if isinstance(t, str) and t.strip()]
        if not texts:
            return
        await asyncio.to_thread(self._keep, texts, record)

    def _keep(self, texts: list[str], record: RunRecord) -> None:
        """Add the lessons not known yet, in memory and in the file (in a worker thread, under the lock)."""
        tools = sorted({u.name for u in record.tools})
        with self._lock, self._file_lock():
            # the file as it is now: other processes may have added (or forgotten) lessons since it was read
            lessons = self._all() if self.path is None else self._reload()
            known = {lesson.text for lesson in lessons}
            new = [
                Lesson(
                    text=t,
                    task=valid_text(record.task[:TASK_LIMIT]),
                    success=record.success,
                    tools=tools,
                    run_id=record.run_id,
                )
                for t in dict.fromkeys(texts)
                if t not in known
            ]
            if not new:
                return
            if len(lessons) + len(new) > self.max_lessons:
                kept = [*lessons, *new][-self.max_lessons :]
                self._rewrite(kept)
            else:
                kept = [*lessons, *new]
                self._append(new)
            self._lessons = kept  # a new list: a recall reading the old one meanwhile is not disturbed
            self._seen = self._signature()

    def lessons(self) -> list[Lesson]:
        """Every lesson kept, oldest first."""
        return list(self._all())

    def clear(self) -> None:
        """Forget every lesson (the file is emptied)."""
        with self._lock, self._file_lock():
            self._lessons = []
            if self.path is not None and self.path.exists():
                self._rewrite([])
            self._seen = self._signature()

    # ------------------------------------------------------------------------------------ recalling

    async def recall(self, task: str, *, limit: int = 3) -> list[str]:
        """The texts of the lessons most relevant to `task`, best first (at most `limit`)."""
        lessons = await self._loaded()
        query = _terms(str(task)[:TASK_LIMIT])
        if not lessons or not query or limit < 1:
            return []
        documents = [_terms(lesson.task) for lesson in lessons]
        frequency: Counter[str] = Counter()
        for document in documents:
            frequency.update(document.keys())
        count = len(documents)
        known = {t: math.log(1 + (count - n + 0.5) / (n + 0.5)) for t, n in frequency.items()}  # BM25's IDF
        typical = sum(known.values()) / len(known) if known else 1.0
        # a term no lesson has counts as a typical one: with few lessons it would otherwise outweigh all
        idf = {term: known.get(term, typical) for term in query}
        best = sum(idf.values()) or 1.0  # a task sharing every term of the new one
        scored = []
        for index, document in enumerate(documents):
            shared = sum(idf[term] for term in query if term in document)
            relevance = shared / best
            if relevance >= self.min_relevance:
                # more relevant first; among equals, successes (what worked) and then the newest
                scored.append((-round(relevance, 6), not lessons[index].success, -index))
        out: list[str] = []
        for _, _, neg_index in sorted(scored):
            text = lessons[-neg_index].text
            if text not in out:
                out.append(text)
            if len(out) == limit:
                break
        return out

    # ---------------------------------------------------------------------------------------- files

    def _all(self) -> list[Lesson]:
        """The lessons, read again when the file changed since they were (another process learnt)."""
        if self._lessons is None or (self.path is not None and self._signature() != self._seen):
            self._reload()
        assert self._lessons is not None
        return self._lessons

    def _reload(self) -> list[Lesson]:
        seen = self._signature()  # before reading: a change made meanwhile is read at the next look
        self._lessons, self._seen = self._load(), seen
        return self._lessons

    async def _loaded(self) -> list[Lesson]:
        """`_all()`, in a thread when there is a file: a big or slow file must not block the event loop
        (the agent's time limit on recalling cannot stop code that never yields)."""
        if self.path is None:
            return self._all()
        return await asyncio.to_thread(self._all)

    def _signature(self) -> _Signature | None:
        """What tells that the file changed: its inode (a trim replaces it), size and modification time."""
        if self.path is None:
            return None
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return None
        return stat.st_ino, stat.st_size, stat.st_mtime_ns

    def _file_lock(self) -> contextlib.AbstractContextManager[None]:
        """The lock that processes sharing the file take to change it (none for a book in memory)."""
        if self.path is None:
            return contextlib.nullcontext()
        return file_lock(self.path.with_name(self.path.name + ".lock"))

    def _load(self) -> list[Lesson]:
        if self.path is None or not self.path.exists():
            return []
        lessons: list[Lesson] = []
        data, skipped_start = self._tail()
        for number, line in enumerate(data.splitlines(), 1):
            if number == 1 and not skipped_start:
                line = line.removeprefix(b"\xef\xbb\xbf")  # a byte-order mark (a file saved by an editor)
            if not line.strip():
                continue
            try:  # a torn, foreign or non-UTF-8 line loses itself, not the book
                lesson = Lesson.model_validate_json(line.decode("utf-8"))
            except ValueError:
                where = f"line {number}" + (" of its last part" if skipped_start else "")
                logger.warning("%s %s is not a lesson; skipped", self.path, where)
                continue
            lesson.text, lesson.task = _clip_lesson(lesson.text), lesson.task[:TASK_LIMIT]
            if lesson.text:  # an empty lesson would be an empty line of a prompt
                lessons.append(lesson)
        return lessons[-self.max_lessons :]

    def _tail(self) -> tuple[bytes, bool]:
        """The file's bytes, or only its end when it is bigger than `max_lessons` lessons can be (a file
        of a gigabyte must not be read whole for 500 lessons); whether its start was skipped."""
        assert self.path is not None
        budget = self.max_lessons * _LINE_BUDGET
        with self.path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            if size <= budget:
                f.seek(0)
                return f.read(), False
            f.seek(size - budget)
            data = f.read()
        return data[data.find(b"\n") + 1 :] if b"\n" in data else b"", True

    def _append(self, lessons: list[Lesson]) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = "".join(lesson.model_dump_json() + "\n" for lesson in lessons).encode("utf-8")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            size = os.fstat(fd).st_size
            if size and os.lseek(fd, size - 1, os.SEEK_SET) >= 0 and os.read(fd, 1) != b"\n":
                # the last line is torn (a writer died mid-line) or was saved without its line break: our
                # first line would be glued to it, and lost with it
                data = b"\n" + data
            os.write(fd, data)  # one write of whole lines: appends from several processes do not interleave
        finally:
            os.close(fd)

    def _rewrite(self, lessons: list[Lesson]) -> None:
        if self.path is None:
            return
        import tempfile

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".lessons-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.writelines(lesson.model_dump_json() + "\n" for lesson in lessons)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


_Signature = tuple[int, int, int]
LOCK_TIMEOUT = 30.0  # seconds to wait for another process to finish changing the lessons file
_unlocked_warned: set[str] = set()  # lock files this process could not lock (warned once each)


@contextlib.contextmanager
def file_lock(path: Path, timeout: float | None = None) -> Iterator[None]:
    """Hold an exclusive lock on the file `path` (created if missing) against other processes.

    `fcntl.flock` on POSIX, `msvcrt.locking` on Windows. Where neither exists, or the file system refuses
    locks (some network ones), a warning is logged once and the work goes on unlocked: appends stay whole
    lines, but a trim may then lose a lesson another process adds at that moment.

    Raises:
        TimeoutError: another process held the lock for `timeout` seconds (`LOCK_TIMEOUT` by default;
            the message names the file).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        locked = _lock(fd, path, LOCK_TIMEOUT if timeout is None else timeout)
        try:
            yield
        finally:
            if locked:
                _unlock(fd)
    finally:
        os.close(fd)


def _lock(fd: int, path: Path, timeout: float) -> bool:
    """Take the lock, polling (a blocking lock could not be given up after `timeout`); whether it is held."""
    deadline, pause = time.monotonic() + timeout, 0.001
    while True:
        try:
            if not _try_lock(fd):
                _warn_unlocked(path, "this system has no file locks")
                return False
            return True
        except BlockingIOError:
            pass
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
            _warn_unlocked(path, f"the file system refuses locks ({exc.strerror})")
            return False
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"another process has held the lock {path} for {timeout:g} s: it may be frozen; "
                "end it or wait for it (the lock goes with the process that holds it)"
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _try_lock(fd: int) -> bool:
    """Lock without waiting: True when locked, False when the system has no locks; BlockingIOError when
    another process holds it."""
    if sys.platform == "win32":
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except PermissionError as exc:  # Windows' "held by another process"
            raise BlockingIOError(str(exc)) from exc
        return True
    try:
        import fcntl
    except ImportError:  # pragma: no cover - every POSIX Python has it
        return False
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return True


def _unlock(fd: int) -> None:
    if sys.platform == "win32":
        import msvcrt

        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
    else:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_UN)


def _warn_unlocked(path: Path, why: str) -> None:
    if str(path) not in _unlocked_warned:
        _unlocked_warned.add(str(path))
        logger.warning(
            "cannot lock %s (%s): processes sharing the lessons file may lose a lesson when it is trimmed; "
            "give each process a book of its own",
            path,
            why,
        )


def _clip_lesson(text: str) -> str:
    text = valid_text(text.strip())  # half an emoji (a reply cut in one) cannot be saved as UTF-8
    return text if len(text) <= LESSON_LIMIT else text[: LESSON_LIMIT - 1] + "…"


@functools.lru_cache(maxsize=4096)  # a lesson's task is matched at every recall (tasks are cut: TASK_LIMIT)
def _terms(text: str) -> Counter[str]:
    """The search terms of a task, without numbers (they are the task's values, not its kind)."""
    return Counter(term for term in tokenize(text) if not term.replace(".", "").isdigit())


def default_lessons_path() -> Path:
    """Where `thinkloop run --learn` keeps its lessons: `$THINKLOOP_LESSONS`, else
    `$THINKLOOP_HOME/lessons.jsonl`, else `lessons.jsonl` in the user data directory."""
    env = os.environ.get("THINKLOOP_LESSONS")
    if env:
        return Path(env).expanduser()
    home = os.environ.get("THINKLOOP_HOME")
    if home:
        return Path(home).expanduser() / "lessons.jsonl"
    import platformdirs

    return Path(platformdirs.user_data_dir("thinkloop", appauthor=False)) / "lessons.jsonl"
