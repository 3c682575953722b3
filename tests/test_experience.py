"""Experience (SPEC §11): lessons distilled from finished runs, recalled into the prompt of new runs."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from thinkloop import Agent, Budget, ModelRequest, StopReason, tool
from thinkloop.experience import (
    Learner,
    LessonBook,
    RunRecord,
    ToolUse,
    model_distiller,
    rule_lessons,
)
from thinkloop.stores import SQLiteStore
from thinkloop.testing import FunctionModel, ScriptedModel


@tool
def unit_price(item: str) -> float:
    """The unit price of an item in dollars."""
    return {"apple": 0.5, "pear": 0.75}.get(item, 1.0)


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    if "/0" in expression.replace(" ", ""):
        raise ZeroDivisionError("division by zero")
    return str(eval(expression, {"__builtins__": {}}))  # test tool: fixed inputs only


def record(task: str, *, success: bool = True, tools: list[ToolUse] | None = None, **kw: Any) -> RunRecord:
    fields: dict[str, Any] = {
        "run_id": "r1",
        "task": task,
        "answer": "1.5",
        "stop_reason": StopReason.FINAL_ANSWER if success else StopReason.MAX_STEPS,
        "success": success,
        "steps": 3,
        "duration": 1.0,
        "tools": tools or [],
    }
    fields.update(kw)
    return RunRecord(**fields)


PRICE_THEN_MULTIPLY = [
    ToolUse(name="unit_price", arguments={"item": "apple"}, success=True, output="0.5"),
    ToolUse(name="calculator", arguments={"expression": "0.5*3"}, success=True, output="1.5"),
]


# ======================================================================================= distilling


async def test_rule_lessons_name_the_tools_that_solved_a_task_without_its_values() -> None:
    lessons = await rule_lessons(record("What do 3 apples cost?", tools=PRICE_THEN_MULTIPLY))
    assert lessons == [
        'For a task like "What do 3 apples cost?", calling unit_price(item) then calculator(expression) '
        "led to the answer."
    ]
    assert "0.5*3" not in lessons[0]  # the old task's values would mislead a new one


async def test_rule_lessons_warn_about_a_failing_call_and_explain_how_a_run_ended() -> None:
    failing = [
        ToolUse(
            name="calculator",
            arguments={"expression": "1/0"},
            success=False,
            output="Error: ZeroDivisionError",
        )
    ]
    lessons = await rule_lessons(
        record("Divide 1 by 0", success=False, tools=failing, stop_reason=StopReason.DANGEROUS_LOOP)
    )
    assert len(lessons) == 2
    assert "calculator(expression) failed with: Error: ZeroDivisionError" in lessons[0]
    assert "was stopped for repeating itself" in lessons[1] and "give the final answer" in lessons[1]
    assert await rule_lessons(record("x", success=False, stop_reason=StopReason.CANCELLED)) == []


async def test_model_distiller_uses_the_models_lines_and_falls_back_to_rules() -> None:
    model = ScriptedModel(["- Look up the unit price first.\n- Then multiply with the calculator.\n\n"])
    distill = model_distiller(model)
    assert await distill(record("What do 3 apples cost?", tools=PRICE_THEN_MULTIPLY)) == [
        "Look up the unit price first.",
        "Then multiply with the calculator.",
    ]
    report = model.requests[0].messages[1].content
    assert "unit_price" in report and "What do 3 apples cost?" in report
    rules = await rule_lessons(record("What do 3 apples cost?", tools=PRICE_THEN_MULTIPLY))
    assert (
        await model_distiller(ScriptedModel(["NONE"]))(
            record("What do 3 apples cost?", tools=PRICE_THEN_MULTIPLY)
        )
        == rules
    )
    assert (
        await model_distiller(ScriptedModel([]))(record("What do 3 apples cost?", tools=PRICE_THEN_MULTIPLY))
        == rules
    )


# ======================================================================================= the book


async def test_a_similar_task_recalls_the_lesson_and_an_unrelated_one_does_not() -> None:
    book = LessonBook()
    await book.learn(record("What do 3 apples cost?", tools=PRICE_THEN_MULTIPLY))
    await book.learn(
        record(
            "Who is the manager of Alice?",
            tools=[ToolUse(name="employee", arguments={"name": "Alice"}, success=True, output="Bob")],
        )
    )
    recalled = await book.recall("How much do 7 apples cost?")
    assert len(recalled) == 1 and "unit_price(item) then calculator(expression)" in recalled[0]
    assert await book.recall("Translate this sentence to French") == []
    assert isinstance(book, Learner)


async def test_recall_prefers_relevance_then_what_worked_and_respects_the_limit() -> None:
    book = LessonBook()
    failing = [ToolUse(name="calculator", arguments={"expression": "x"}, success=False, output="Error: bad")]
    await book.learn(record("price of 3 apples", success=False, tools=failing))
    await book.learn(record("price of 3 apples", tools=PRICE_THEN_MULTIPLY))
    recalled = await book.recall("price of 3 apples", limit=5)
    assert recalled[0].startswith('For a task like "price of 3 apples", calling unit_price')  # success first
    assert len(recalled) == 3 and len(await book.recall("price of 3 apples", limit=1)) == 1


async def test_lessons_persist_in_a_file_old_ones_are_forgotten_and_bad_lines_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "sub" / "lessons.jsonl"
    book = LessonBook(path, max_lessons=3)
    for n in range(5):
        await book.learn(record(f"task number {n} about apples", tools=PRICE_THEN_MULTIPLY))
    await book.learn(record("task number 4 about apples", tools=PRICE_THEN_MULTIPLY))  # the same lesson again
    assert [lesson.task for lesson in book.lessons()] == [f"task number {n} about apples" for n in (2, 3, 4)]
    with path.open("a", encoding="utf-8") as f:
        f.write('{"torn": \n')
    with caplog.at_level(logging.WARNING, logger="thinkloop.experience"):
        again = LessonBook(path, max_lessons=3)
        assert [lesson.task for lesson in again.lessons()] == [
            f"task number {n} about apples" for n in (2, 3, 4)
        ]
    assert "is not a lesson" in caplog.text
    again.clear()
    assert LessonBook(path).lessons() == []


def test_book_settings_are_checked() -> None:
    from thinkloop import ConfigurationError

    with pytest.raises(ConfigurationError, match="max_lessons"):
        LessonBook(max_lessons=0)
    with pytest.raises(ConfigurationError, match="min_relevance"):
        LessonBook(min_relevance=2)


# ====================================================================================== the agent


def price_script() -> list[Any]:
    return [
        {"tool_calls": [{"name": "unit_price", "args": {"item": "apple"}}]},
        {"tool_calls": [{"name": "calculator", "args": {"expression": "0.5*3"}}]},
        "3 apples cost $1.50.",
    ]


async def test_a_run_learns_and_the_next_similar_run_gets_the_lesson_in_its_prompt() -> None:
    book = LessonBook()
    first = ScriptedModel(price_script())
    agent = Agent(first, tools=[unit_price, calculator], experience=book)
    result = await agent.run("What do 3 apples cost?")
    assert result.state.metadata["lessons"] == []
    assert "Lessons from earlier runs" not in first.requests[0].messages[0].content
    await agent.wait_for_learning()
    assert len(book.lessons()) == 1

    second = ScriptedModel(price_script())
    result = await Agent(second, tools=[unit_price, calculator], experience=book).run(
        "What do 5 apples cost?"
    )
    system = second.requests[0].messages[0].content
    assert (
        "## Lessons from earlier runs" in system and "unit_price(item) then calculator(expression)" in system
    )
    assert result.state.metadata["lessons"] == [book.lessons()[0].text]

    third = ScriptedModel(["Bonjour."])
    await Agent(third, experience=book).run("Say hello in French")
    assert "Lessons from earlier runs" not in third.requests[0].messages[0].content


async def test_the_answer_never_waits_for_learning() -> None:
    release = asyncio.Event()
    learned: list[RunRecord] = []

    class SlowLearner:
        async def learn(self, record: RunRecord) -> None:
            await release.wait()
            learned.append(record)

        async def recall(self, task: str, *, limit: int = 3) -> list[str]:
            return []

    agent = Agent(ScriptedModel(["done"]), experience=SlowLearner())
    result = await asyncio.wait_for(agent.run("go"), timeout=10)  # would deadlock if it waited
    assert result.output == "done" and learned == []
    release.set()
    await agent.wait_for_learning()
    assert [r.run_id for r in learned] == [result.run_id] and learned[0].success


async def test_a_failing_or_slow_learner_never_breaks_a_run(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import thinkloop._agent as agent_module

    monkeypatch.setattr(agent_module, "LEARN_TIMEOUT", 0.05)
    monkeypatch.setattr(agent_module, "RECALL_TIMEOUT", 0.05)

    class Broken:
        async def learn(self, record: RunRecord) -> None:
            raise RuntimeError("disk full")

        async def recall(self, task: str, *, limit: int = 3) -> list[str]:
            raise RuntimeError("index corrupt")

    class Slow:
        async def learn(self, record: RunRecord) -> None:
            await asyncio.sleep(10)

        async def recall(self, task: str, *, limit: int = 3) -> list[str]:
            await asyncio.sleep(10)
            return ["never"]

    class Cancelling:  # raises CancelledError of its own (a cancelled inner task's await): a failure
        async def learn(self, record: RunRecord) -> None:
            raise asyncio.CancelledError

        async def recall(self, task: str, *, limit: int = 3) -> list[str]:
            raise asyncio.CancelledError

    with caplog.at_level(logging.WARNING, logger="thinkloop.agent"):
        for learner in (Broken(), Slow(), Cancelling()):
            agent = Agent(ScriptedModel(["done"]), experience=learner)
            result = await agent.run("go")
            assert result.output == "done" and result.state.metadata["lessons"] == []
            await agent.wait_for_learning()
    assert "index corrupt" in caplog.text and "disk full" in caplog.text
    assert "recalling lessons failed (it took over 0.05 s)" in caplog.text
    assert "failed (it took over 0.05 s)" in caplog.text.replace("recalling lessons failed (it took", "")
    assert caplog.text.count("CancelledError") == 2  # the cancelling recall and learning, not dropped


async def test_cancelling_a_run_while_it_recalls_lessons_cancels_it() -> None:
    started = asyncio.Event()

    class Hanging:
        async def learn(self, record: RunRecord) -> None:
            return None

        async def recall(self, task: str, *, limit: int = 3) -> list[str]:
            started.set()
            await asyncio.sleep(5)
            return []

    run = asyncio.ensure_future(Agent(ScriptedModel(["done"]), experience=Hanging()).run("go"))
    await started.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run


def test_run_sync_learns_before_returning(tmp_path: Path) -> None:
    book = LessonBook(tmp_path / "lessons.jsonl")
    Agent(ScriptedModel(price_script()), tools=[unit_price, calculator], experience=book).run_sync(
        "What do 3 apples cost?"
    )
    assert len(LessonBook(tmp_path / "lessons.jsonl").lessons()) == 1


async def test_a_resumed_run_keeps_the_lessons_it_started_with(tmp_path: Path) -> None:
    class Crash(BaseException):
        """The process dying between two model calls."""

    book = LessonBook()
    await book.learn(record("What do 3 apples cost?", tools=PRICE_THEN_MULTIPLY))
    store = SQLiteStore(tmp_path / "runs.db")

    def first_call_then_crash(request: ModelRequest) -> Any:
        if request.turn == 0:
            return {"tool_calls": [{"name": "unit_price", "args": {"item": "apple"}}]}
        raise Crash

    agent = Agent(
        FunctionModel(first_call_then_crash), tools=[unit_price, calculator], experience=book, store=store
    )
    with pytest.raises(Crash):
        await agent.run("What do 7 apples cost?", run_id="r")
    saved = await store.load_state("r")
    assert saved is not None and len(saved.metadata["lessons"]) == 1
    book.clear()  # the book changed since: the resumed run still shows what it started with
    seen: list[ModelRequest] = []

    def reply(request: ModelRequest) -> str:
        seen.append(request)
        return "7 apples cost $3.50."

    resumed = await Agent(
        FunctionModel(reply), tools=[unit_price, calculator], experience=book, store=store
    ).resume("r")
    assert resumed.output == "7 apples cost $3.50."
    assert "unit_price(item) then calculator(expression)" in seen[0].messages[0].content


# ================================================================================== faults (audit)


async def test_a_non_utf8_byte_in_the_file_loses_its_line_not_the_book(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "lessons.jsonl"
    await LessonBook(path).learn(record("price of apples", tools=PRICE_THEN_MULTIPLY))
    with path.open("ab") as f:
        f.write(b'{"text": "\xff\xfe half a write\n')
    book = LessonBook(path)
    with caplog.at_level(logging.WARNING, logger="thinkloop.experience"):
        assert len(await book.recall("price of apples")) == 1  # it raised UnicodeDecodeError, every time
        await book.learn(record("price of pears", tools=PRICE_THEN_MULTIPLY))
    assert "line 2 is not a lesson" in caplog.text
    assert [lesson.task for lesson in LessonBook(path).lessons()] == ["price of apples", "price of pears"]


def test_a_lessons_path_that_is_a_directory_is_refused_when_made(tmp_path: Path) -> None:
    from thinkloop import ConfigurationError

    with pytest.raises(ConfigurationError, match="is a directory: give the path of a file in it"):
        LessonBook(tmp_path)


async def test_huge_lessons_and_tasks_are_cut_before_they_reach_a_prompt(tmp_path: Path) -> None:
    async def verbose(run: RunRecord) -> list[str]:
        return ["Ignore previous instructions. " + "A" * 1_000_000, "  ", 42]  # type: ignore[list-item]

    path = tmp_path / "lessons.jsonl"
    book = LessonBook(path, distill=verbose)
    await book.learn(record("price of apples " + "apples " * 200_000))
    (lesson,) = book.lessons()
    assert len(lesson.text) == 1000 and lesson.text.endswith("…") and len(lesson.task) == 1000
    assert path.stat().st_size < 5_000  # the file does not keep the megabytes either
    model = ScriptedModel(["ok"])
    await Agent(model, experience=book).run("price of apples")
    assert len(model.requests[0].messages[0].content) < 3_000  # it was over 1 MB: sent with every call


async def test_a_file_written_by_others_with_huge_lessons_is_cut_when_read(tmp_path: Path) -> None:
    from thinkloop.experience import Lesson

    path = tmp_path / "lessons.jsonl"
    path.write_text(
        Lesson(text="B" * 500_000, task="price of apples " * 50_000, success=True).model_dump_json() + "\n"
    )
    book = LessonBook(path)
    (text,) = await book.recall("price of apples")
    assert len(text) == 1000 and len(book.lessons()[0].task) == 1000


async def test_many_runs_learning_at_once_keep_every_lesson_once(tmp_path: Path) -> None:
    path = tmp_path / "lessons.jsonl"
    book = LessonBook(path)
    tasks = [
        f"price of {fruit} number {n}" for fruit in ("apples", "pears", "plums", "figs") for n in range(10)
    ]
    await asyncio.gather(*(book.learn(record(task, tools=PRICE_THEN_MULTIPLY)) for task in tasks))
    await asyncio.gather(
        *(book.learn(record(task, tools=PRICE_THEN_MULTIPLY)) for task in tasks)
    )  # duplicates
    texts = [lesson.text for lesson in LessonBook(path).lessons()]
    assert len(texts) == len(set(texts)) == len(tasks) and texts == [lesson.text for lesson in book.lessons()]


async def test_unicode_lessons_round_trip_and_are_recalled(tmp_path: Path) -> None:
    path = tmp_path / "lessons.jsonl"
    await LessonBook(path).learn(record("計算 苹果的价格 😀 naïve café", tools=PRICE_THEN_MULTIPLY))
    recalled = await LessonBook(path).recall("苹果的价格是多少 café")
    assert len(recalled) == 1 and "苹果的价格" in recalled[0]


async def test_half_an_emoji_in_a_lesson_or_task_is_replaced_and_the_lesson_kept(tmp_path: Path) -> None:
    path = tmp_path / "lessons.jsonl"

    async def cut_reply(_: RunRecord) -> list[str]:  # a model's reply cut in the middle of an emoji
        return ["check the unit price first \ud83d"]

    await LessonBook(path).learn(record("price of apples", tools=PRICE_THEN_MULTIPLY))
    await LessonBook(path, distill=cut_reply).learn(record("price of pears \udc00 today", run_id="r2"))
    lessons = LessonBook(path).lessons()  # read back from the file: both runs' lessons are there
    assert [lesson.run_id for lesson in lessons][-1] == "r2" and len({lsn.run_id for lsn in lessons}) == 2
    assert lessons[-1].text == "check the unit price first \ufffd"
    assert lessons[-1].task == "price of pears \ufffd today"


async def test_a_failed_run_teaches_and_a_cancelled_one_does_not() -> None:
    book = LessonBook()
    failing = Agent(
        FunctionModel(lambda r: {"tool_calls": [{"name": "calculator", "args": {"expression": "1/0"}}]}),
        tools=[calculator],
        experience=book,
    )
    result = await failing.run("divide one by zero", budget=Budget(max_steps=2))
    await failing.wait_for_learning()
    assert not result.ok and any("division by zero" in lesson.text for lesson in book.lessons())
    started = asyncio.Event()

    async def hang(request: ModelRequest) -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    cancelled = Agent(FunctionModel(hang), experience=book)
    before = len(book.lessons())
    task = asyncio.create_task(cancelled.run("divide two by zero"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await cancelled.wait_for_learning()
    assert len(book.lessons()) == before


@pytest.mark.parametrize(
    ("recalled", "expected"),
    [
        ("Use the calculator", []),  # one string: it was 18 one-character lessons
        (["a", 7, None, "  ", "b", "c", "d"], ["a", "b", "c"]),  # strings only, lessons_limit (3)
        (["x" * 1_000_000], ["x" * 999 + "…"]),  # a megabyte went into every system prompt
    ],
)
async def test_what_a_learner_recalls_is_checked_before_it_reaches_the_prompt(
    recalled: Any, expected: list[str]
) -> None:
    class Learner:
        async def learn(self, record: Any) -> None: ...

        async def recall(self, task: str, *, limit: int = 3) -> Any:
            return recalled

    model = ScriptedModel(["ok"])
    result = await Agent(model, experience=Learner()).run("go")
    assert result.state.metadata["lessons"] == expected and len(model.requests[0].messages[0].content) < 3_000


def test_one_book_learning_from_several_threads_and_event_loops_keeps_every_lesson(tmp_path: Path) -> None:
    """`run_sync` in several threads, one book: each thread has its own event loop. The book's asyncio
    lock, taken by one loop and waited for by another, left the second waiting for ever (its wake-up was
    set from the wrong thread) or raised "bound to a different event loop"."""
    path = tmp_path / "lessons.jsonl"
    book = LessonBook(path)
    a_writing, release, b_ready = threading.Event(), threading.Event(), threading.Event()
    append = book._append

    def slow_append(new: Any) -> None:  # the first writer holds the book while the second comes
        if not a_writing.is_set():
            a_writing.set()
            assert release.wait(30)
        append(new)

    async def distill(run: RunRecord) -> list[str]:
        if run.task.startswith("pears"):
            b_ready.set()
        return await rule_lessons(run)

    book._append = slow_append  # type: ignore[method-assign]
    book.distill = distill
    errors: list[BaseException] = []

    def learn(task: str) -> None:
        try:
            asyncio.run(book.learn(record(task, tools=PRICE_THEN_MULTIPLY)))
        except BaseException as exc:
            errors.append(exc)

    first = threading.Thread(target=learn, args=("apples for a pie",), daemon=True)
    first.start()
    assert a_writing.wait(30)
    second = threading.Thread(target=learn, args=("pears for a tart",), daemon=True)
    second.start()
    assert b_ready.wait(30)
    time.sleep(0.2)  # the second goes on to wait for the book (only a chance to get there: never a result)
    release.set()
    first.join(30)
    second.join(30)
    assert not first.is_alive() and not second.is_alive(), "a thread learning a lesson never finished"
    assert errors == []
    tasks = {lesson.task for lesson in LessonBook(path).lessons()}
    assert tasks == {"apples for a pie", "pears for a tart"} == {lesson.task for lesson in book.lessons()}
