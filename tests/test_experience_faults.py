"""Lessons files and learners under faults: a torn last line, a byte-order mark, a huge file, empty
lessons, a distiller returning one text or nothing."""

from __future__ import annotations

import json
import logging
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
