"""Lessons files and learners under faults: a torn last line, a byte-order mark, a huge file, empty
lessons, a distiller returning one text or nothing."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from thinkloop import StopReason
from thinkloop.experience import Lesson, LessonBook, RunRecord, ToolUse

TOOLS = [ToolUse(name="unit_price", arguments={"item": "apple"}, success=True, output="0.5")]


def record(task: str) -> RunRecord:
    return RunRecord(
        run_id="r1",
        task=task,
        answer="1.5",
        stop_reason=StopReason.FINAL_ANSWER,
        success=True,
        steps=2,
        duration=1.0,
        tools=TOOLS,
    )


def lesson_line(text: str, task: str) -> str:
    return Lesson(text=text, task=task, success=True).model_dump_json() + "\n"


@pytest.mark.parametrize(
    "torn", [b'{"text": "half a wri', lesson_line("kept", "price of pears").encode()[:-1]]
)
async def test_a_lesson_appended_after_a_torn_last_line_is_kept(
    tmp_path: Path, torn: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    # A writer that died mid-line (or an editor that saved the file without its last line break) left
    # no newline at the end: the next lesson was glued to that line, and lost with it on the next load.
    path = tmp_path / "lessons.jsonl"
    path.write_bytes(torn)
    await LessonBook(path).learn(record("What do 3 apples cost?"))
    with caplog.at_level(logging.WARNING, logger="thinkloop.experience"):
        tasks = [lesson.task for lesson in LessonBook(path).lessons()]
    assert tasks[-1] == "What do 3 apples cost?"
    assert ("price of pears" in tasks) is torn.startswith(b'{"text":"kept"')  # a whole line stays whole


async def test_a_file_starting_with_a_byte_order_mark_keeps_its_first_lesson(tmp_path: Path) -> None:
    path = tmp_path / "lessons.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + lesson_line("Use unit_price first.", "price of apples").encode())
    book = LessonBook(path)
    assert [lesson.text for lesson in book.lessons()] == ["Use unit_price first."]
    assert await book.recall("price of apples") == ["Use unit_price first."]


async def test_an_empty_lesson_in_a_file_is_not_recalled(tmp_path: Path) -> None:
    path = tmp_path / "lessons.jsonl"
    path.write_text(lesson_line("   ", "price of apples") + lesson_line("Real lesson.", "price of apples"))
    assert await LessonBook(path).recall("price of apples") == ["Real lesson."]  # was ['', 'Real lesson.']


async def test_a_distiller_returning_one_text_keeps_it_as_one_lesson() -> None:
    async def one(run: RunRecord) -> Any:
        return "Check the price before multiplying."

    book = LessonBook(distill=one)
    await book.learn(record("price of apples"))
    assert [lesson.text for lesson in book.lessons()] == [
        "Check the price before multiplying."
    ]  # not 'C', 'h'…


async def test_a_distiller_returning_nothing_is_a_clear_error() -> None:
    async def forgot_return(run: RunRecord) -> Any:
        return None

    with pytest.raises(TypeError, match=r"returned NoneType None: it must return a list of lesson texts"):
        await LessonBook(distill=forgot_return).learn(record("price of apples"))


async def test_a_huge_file_is_read_from_its_end_only(tmp_path: Path) -> None:
    # The whole file was read into memory at the first recall, however big it had grown (another tool
    # appending to it, a file that is not a lessons file): only the end that can hold `max_lessons`
    # lessons is read now, and the newest lessons are there.
    path = tmp_path / "lessons.jsonl"
    filler = lesson_line("old " + "x" * 900, "an old task")
    with path.open("w") as f:
        for _ in range(3000):  # ~3 MB
            f.write(filler)
        f.write(lesson_line("The newest lesson.", "price of apples"))
    book = LessonBook(path, max_lessons=20)
    lessons = book.lessons()
    assert len(lessons) == 20 and lessons[-1].text == "The newest lesson."
    assert await book.recall("price of apples") == ["The newest lesson."]
    read: list[int] = []
    original = Path.open

    def counting_open(self: Path, *args: Any, **kwargs: Any) -> Any:
        handle = original(self, *args, **kwargs)
        real_read = handle.read

        def read_some(*a: Any) -> Any:
            data = real_read(*a)
            read.append(len(data))
            return data

        handle.read = read_some
        return handle

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Path, "open", counting_open)
        assert LessonBook(path, max_lessons=20).lessons()[-1].text == "The newest lesson."
    assert sum(read) < path.stat().st_size // 4


def test_lessons_written_with_json_escapes_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "lessons.jsonl"
    line = json.dumps({"text": "Use \u00e9t\u00e9 \ud83d\ude00", "task": "summer", "success": True}) + "\n"
    path.write_text(line)
    assert LessonBook(path).lessons()[0].text == "Use été 😀"


async def answer_lesson(run: RunRecord) -> list[str]:
    return [run.answer]


def answered(text: str) -> RunRecord:
    return RunRecord(
        run_id="r", task=f"task {text}", answer=text, stop_reason=StopReason.FINAL_ANSWER, success=True,
        steps=1, duration=0.1,
    )  # fmt: skip


async def test_trimming_keeps_the_lessons_another_process_appended_since_this_one_read_the_file(
    tmp_path: Path,
) -> None:
    # Each process keeps the book in memory, read once: forgetting the oldest lesson rewrote the file from
    # that copy, and a lesson another process had appended since was lost (two books on one file are two
    # processes here).
    path = tmp_path / "lessons.jsonl"
    mine, theirs = (LessonBook(path, max_lessons=3, distill=answer_lesson) for _ in range(2))
    for text in ("a1", "a2", "a3"):
        await mine.learn(answered(text))
    await theirs.learn(answered("b1"))  # a full book: theirs trims a1
    await mine.learn(answered("a4"))  # a full book: mine trims, from its copy [a1, a2, a3]
    assert [lesson.text for lesson in LessonBook(path).lessons()] == ["a3", "b1", "a4"]  # was a2, a3, a4
    assert [lesson.text for lesson in mine.lessons()] == ["a3", "b1", "a4"]


async def test_a_lesson_another_process_learnt_is_not_kept_twice(tmp_path: Path) -> None:
    path = tmp_path / "lessons.jsonl"
    mine, theirs = (LessonBook(path, distill=answer_lesson) for _ in range(2))
    await mine.learn(answered("a1"))
    await theirs.learn(answered("same"))
    await mine.learn(answered("same"))
    assert [lesson.text for lesson in LessonBook(path).lessons()] == ["a1", "same"]


LEARNER = """
import asyncio, sys, time
from pathlib import Path
from thinkloop import StopReason
from thinkloop.experience import LessonBook, RunRecord

async def distill(run):
    return [run.answer]

def wait_for(paths):
    deadline = time.monotonic() + 60
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline:
            sys.exit("the other processes never came")
        time.sleep(0.001)

async def main(path, name, names, rounds, sync):
    book = LessonBook(path, max_lessons=20, distill=distill)
    sync = Path(sync)
    for i in range(rounds):  # in rounds: every process learns its lesson i at the same time
        (sync / f"{name}.start.{i}").touch()
        wait_for([sync / f"{n}.start.{i}" for n in names])
        text = f"{name}-{i:03d}"
        run = RunRecord(run_id=text, task="task " + text, answer=text,
                        stop_reason=StopReason.FINAL_ANSWER, success=True, steps=1, duration=0.1)
        await book.learn(run)
        (sync / f"{name}.done.{i}").touch()
        wait_for([sync / f"{n}.done.{i}" for n in names])

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3].split(","), int(sys.argv[4]), sys.argv[5]))
"""


def test_processes_learning_while_the_book_is_trimmed_lose_no_lesson_that_should_be_kept(
    tmp_path: Path,
) -> None:
    # Four processes learn a lesson each per round, at the same time, into a book of 20: from the sixth
    # round on every learn trims the file while the others append. A trim rewrote the file from the
    # process's own copy, losing what the others had appended meanwhile. The book must end with the
    # last 20 lessons learnt: the last 5 rounds, every process's last 5.
    import subprocess
    import sys

    path, sync = tmp_path / "lessons.jsonl", tmp_path / "sync"
    sync.mkdir()
    names, rounds = ["p0", "p1", "p2", "p3"], 30
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", LEARNER, str(path), name, ",".join(names), str(rounds), str(sync)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in names
    ]
    outputs = [p.communicate(timeout=240) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    kept = sorted(json.loads(line)["text"] for line in path.read_text().splitlines())
    assert kept == sorted(f"{n}-{i:03d}" for n in names for i in range(rounds - 5, rounds))


async def test_a_process_recalls_the_lessons_another_process_learnt_since_it_read_the_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "lessons.jsonl"
    mine, theirs = (LessonBook(path, distill=answer_lesson) for _ in range(2))
    assert await mine.recall("task shared") == []  # read once, empty
    await theirs.learn(answered("shared"))
    assert await mine.recall("task shared") == ["shared"]  # was [] until this process learnt itself


async def test_a_lock_held_too_long_by_another_process_is_a_clear_error_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    from thinkloop import experience

    path = tmp_path / "lessons.jsonl"
    book = LessonBook(path, distill=answer_lesson)
    await book.learn(answered("a1"))
    monkeypatch.setattr(experience, "LOCK_TIMEOUT", 0.2)
    held = os.open(f"{path}.lock", os.O_RDWR)  # another open file: flock treats it as another process
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(TimeoutError, match=rf"another process has held the lock {path}\.lock for 0\.2 s"):
            await book.learn(answered("a2"))
    finally:
        os.close(held)
    await book.learn(answered("a3"))
    assert [lesson.text for lesson in LessonBook(path).lessons()] == ["a1", "a3"]


async def test_where_files_cannot_be_locked_the_book_warns_once_and_still_learns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from thinkloop import experience

    def refused(fd: int) -> bool:
        raise OSError(38, "Function not implemented")  # ENOSYS: a file system without locks

    monkeypatch.setattr(experience, "_try_lock", refused)
    path = tmp_path / "lessons.jsonl"
    book = LessonBook(path, distill=answer_lesson)
    with caplog.at_level(logging.WARNING, logger="thinkloop.experience"):
        await book.learn(answered("a1"))
        await book.learn(answered("a2"))
    warnings = [r.getMessage() for r in caplog.records if "cannot lock" in r.getMessage()]
    assert len(warnings) == 1 and "the file system refuses locks" in warnings[0]
    assert [lesson.text for lesson in LessonBook(path).lessons()] == ["a1", "a2"]
