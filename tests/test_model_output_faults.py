"""Model output is untrusted: a degenerate reply must neither crash the loop nor stall it (nor, with it, the
event loop every other run shares)."""

from __future__ import annotations

import time

from pydantic import BaseModel

from thinkloop import Agent, Budget
from thinkloop.testing import ScriptedModel
from thinkloop.tools.calculator import calculator

GARBAGE = "{]" * 6_000  # a small model stuck repeating two tokens; json_repair's time grows with its square


async def test_a_reply_of_broken_json_brackets_is_not_mended_for_a_minute() -> None:
    # json_repair took 10 s on these 12 kB (73 s on 32 kB), with the event loop blocked: the run's own time
    # limit could not stop it
    react = [f"Thought: add\nAction: calculator\nAction Input: {GARBAGE}", "Final Answer: 2"]
    started = time.monotonic()
    result = await Agent(ScriptedModel(react, tools=False), tools=[calculator]).run("1+1?")
    assert time.monotonic() - started < 5
    assert result.output == "2"
    observation = next(m.content for m in result.state.messages if m.role == "tool")
    assert observation.startswith("Error: ")  # the model is asked for valid JSON
    started = time.monotonic()
    result = await Agent(ScriptedModel([GARBAGE]), tools=[calculator]).run("1+1?")  # read for a JSON call
    assert time.monotonic() - started < 5
    assert result.stop_reason == "final_answer"


class Point(BaseModel):
    x: int


async def test_a_structured_answer_of_broken_json_brackets_is_not_mended_for_a_minute() -> None:
    answer = "[" + GARBAGE + "]"  # balanced, so it was given to json_repair: 7 s
    model = ScriptedModel([answer, '{"x": 1}'])
    started = time.monotonic()
    result = await Agent(model, output_type=Point, budget=Budget(max_steps=4)).run("a point")
    assert time.monotonic() - started < 5
    assert result.output == '{"x": 1}'


async def test_a_long_run_of_operands_in_an_answer_is_checked_at_once() -> None:
    # the answer check looked for worked arithmetic (`2 + 3 = 5`) from every position of the answer: on
    # `1-1-1-…` (no `=`) its time grew with the square of the length, 12 s for these 12 kB
    replies = [
        'Thought: add\nAction: calculator\nAction Input: {"expression": "1+1"}',
        "Final Answer: " + "1-" * 6_000,
    ]
    started = time.monotonic()
    result = await Agent(ScriptedModel(replies, tools=False), tools=[calculator]).run("1+1?")
    assert time.monotonic() - started < 5
    assert result.stop_reason == "final_answer"


async def test_a_reply_of_reasoning_blocks_never_closed_is_read_at_once() -> None:
    # `<think>.*?</think>`, tried at each opening tag, took time growing with the square of the reply
    reply = "<think>," * 8_000
    started = time.monotonic()
    result = await Agent(ScriptedModel([reply]), tools=[calculator]).run("1+1?")
    assert time.monotonic() - started < 2
    assert result.stop_reason == "final_answer"


async def test_an_answer_after_reasoning_that_holds_a_dotted_capital_i_is_kept_whole() -> None:
    # the closing tag was found in text.lower(), where `İ` is two characters, and the answer was cut there:
    # 'he answer is Ankara.'
    reply = "İstanbul is the largest city, not the capital.</think>The answer is Ankara."
    result = await Agent(ScriptedModel([reply]), tools=[calculator]).run("Capital of Türkiye?")
    assert result.output == "The answer is Ankara."
    react = ["İİİ reasoning</think>Final Answer: Ankara"]
    result = await Agent(ScriptedModel(react, tools=False), tools=[calculator]).run("Capital of Türkiye?")
    assert result.output == "Ankara"


async def test_a_long_goal_is_searched_for_the_options_it_lists_at_once() -> None:
    # the options a task lists (`…: Anvil, Bolt or Crate?`) were searched for with a regex whose time grew
    # with the square of a run of spaces or of `of`s: 4 s for a 40 kB goal, which the server accepts
    replies = ['Thought: x\nAction: calculator\nAction Input: {"expression": "1+1"}', "Final Answer: 2"]
    for goal in (
        "Which has the most: a" + " " * 40_000 + "b",
        "of " * 13_000,
        "Which: a" + " " * 20_000 + "b?",
    ):
        started = time.monotonic()
        result = await Agent(ScriptedModel(replies, tools=False), tools=[calculator]).run(goal)
        assert time.monotonic() - started < 2
        assert result.output == "2"


async def test_a_code_fence_followed_by_blank_lines_without_end_is_read_at_once() -> None:
    # the blank space after an opening fence could go to the fence's line or to the block: the regex tried
    # every split, 10 s for 20 kB of newlines (a small model stuck on line breaks), event loop blocked
    reply = "```json\n" + "\n" * 20_000
    started = time.monotonic()
    result = await Agent(ScriptedModel([reply]), tools=[calculator], output_type=Point).run("a point")
    assert time.monotonic() - started < 2
    assert result.stop_reason is not None
    started = time.monotonic()
    react = ["Thought: x\nAction: calculator\nAction Input: ```" + " " * 20_000, "Final Answer: 2"]
    result = await Agent(ScriptedModel(react, tools=False), tools=[calculator]).run("1+1?")
    assert time.monotonic() - started < 2
    assert result.output == "2"


async def test_a_structured_answer_with_a_long_blank_run_in_a_number_is_read_at_once() -> None:
    # a number given as text ("12.50 USD") lost its currency through a regex matching the blank space
    # before it, tried at every position of a run of it: 16 s for a 20 kB value
    answer = '{"x": "1' + " " * 20_000 + '2"}'
    started = time.monotonic()
    result = await Agent(ScriptedModel([answer, '{"x": 1}']), output_type=Point).run("a point")
    assert time.monotonic() - started < 2
    assert result.output == '{"x": 1}'


async def test_an_answer_with_a_long_run_of_punctuation_before_answers_the_is_read_at_once() -> None:
    # the example's closing words ("…, that answers the task.") were cut off by a regex that also matched
    # the punctuation before them, tried at each position of a long run of it: 9 s for 20 kB
    replies = [
        'Thought: x\nAction: calculator\nAction Input: {"expression": "1+1"}',
        "Final Answer: " + "; " * 10_000 + "x answers the",
    ]
    started = time.monotonic()
    result = await Agent(ScriptedModel(replies, tools=False), tools=[calculator]).run("1+1?")
    assert time.monotonic() - started < 2
    assert result.stop_reason == "final_answer"


def test_worked_arithmetic_is_found_after_a_long_blank_run_but_not_cut_out_of_a_longer_one() -> None:
    from thinkloop._react import worked_arithmetic

    assert [w.expression for w in worked_arithmetic(" " * 400 + "1 + 2 = 4", [])] == ["1 + 2"]
    assert worked_arithmetic("1+" * 200 + "1 = 201", []) == []  # longer than is read: not half of it


async def test_a_tool_call_block_with_a_long_blank_run_is_read_at_once() -> None:
    # the blank space before `</tool_call>` was matched at each step of the block's lazy body: 9 s for 30 kB
    reply = '<tool_call>{"name": "calculator",' + " " * 30_000 + '"arguments": {"expression": "1+1"}}'
    started = time.monotonic()
    result = await Agent(ScriptedModel([reply, "2"]), tools=[calculator]).run("1+1?")
    assert time.monotonic() - started < 2
    assert result.output == "2"
    assert [m.content for m in result.state.messages if m.role == "tool"] == ["2"]


async def test_a_tool_name_with_a_long_blank_run_is_looked_up_at_once() -> None:
    # a call's parentheses (`get_weather()`) were taken off the name by a regex matching the blank space
    # before them too, tried at each position of a run of it: seconds for a 40 kB name
    name = "calculator" + " " * 40_000 + "((x)"
    replies = [{"tool_calls": [{"name": name, "args": {"expression": "1+1"}}]}, "2"]
    started = time.monotonic()
    result = await Agent(ScriptedModel(replies), tools=[calculator]).run("1+1?")
    assert time.monotonic() - started < 2
    assert result.output == "2"
