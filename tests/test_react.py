"""The tolerant ReAct parser and the native → ReAct transcript rendering."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thinkloop import Message, ToolCall
from thinkloop._messages import ToolDefinition
from thinkloop._react import (
    arguments_example,
    call_syntax,
    json_answer,
    may_hold_calls,
    parse_arguments,
    parse_react,
    render_transcript,
    text_calls,
    tools_prompt,
)
from thinkloop._tools import ToolRegistry
from thinkloop.tools.calculator import calculator

TOOLS = ["calculator", "search"]


def parse(text: str):  # type: ignore[no-untyped-def]
    return parse_react(text, TOOLS, call_id="c1")


def test_standard_action() -> None:
    step = parse('Thought: need math\nAction: calculator\nAction Input: {"expression": "2+2"}')
    assert step.thought == "need math"
    assert step.call == ToolCall(id="c1", name="calculator", arguments={"expression": "2+2"})


@pytest.mark.parametrize(
    "text",
    [
        'thought: x\naction: Calculator\naction input: {"expression": "2+2"}',
        'Thought:x\n  ACTION :  calculator  \nAction_Input:\n```json\n{"expression": "2+2"}\n```',
        '**Thought:** x\n**Action:** `calculator`\n**Action Input:** {"expression": "2+2"}',
        "Thought: x\nAction: calculator\nAction Input: {'expression': '2+2',}",
        'Thought: x\nAction: calculator\nAction Input: {"expression": "2+2"',
        'Action: calculator({"expression": "2+2"})',
        'Thought: x\nAction: use the calculator tool\nAction Input: {"expression": "2+2"}',
        '```json\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n```',
        '{"tool": "calculator", "args": "{\\"expression\\": \\"2+2\\"}"}',
    ],
)
def test_tolerant_variants(text: str) -> None:
    step = parse(text)
    assert step.call is not None, text
    assert step.call.name == "calculator"
    assert step.call.arguments == {"expression": "2+2"}


def test_final_answer_variants() -> None:
    assert parse("Thought: done\nFinal Answer: 42").final == "42"
    assert parse("final answer:   the result is 7\nmore lines").final == "the result is 7\nmore lines"
    assert parse("Just a plain reply.").final == "Just a plain reply."


def test_action_before_final_answer_wins_and_invented_observation_is_cut() -> None:
    text = 'Thought: t\nAction: search\nAction Input: {"q": "x"}\nObservation: made up\nFinal Answer: fake'
    step = parse(text)
    assert step.call is not None and step.call.name == "search" and step.final is None


def test_final_answer_before_action_wins_without_the_action_in_it() -> None:
    step = parse('Thought: done\nFinal Answer: 5\nAction: search\nAction Input: {"q": 1}')
    assert (step.final, step.call, step.thought) == ("5", None, "done")


def test_thought_labels_after_a_final_answer_are_dropped_and_their_sentences_kept() -> None:
    # the 1.5B model answered 'Berlin: 5 °C, partly cloudy\nThought: Oslo is colder than Berlin right now.'
    step = parse("Final Answer: Berlin: 5 °C, partly cloudy\nThought: Oslo is colder than Berlin right now.")
    assert step.final == "Berlin: 5 °C, partly cloudy\nOslo is colder than Berlin right now."


def test_an_empty_final_answer_followed_by_an_action_is_the_action() -> None:
    step = parse('Final Answer:\nAction: search\nAction Input: {"q": 1}')
    assert step.call is not None and step.call.arguments == {"q": 1}
    assert (step.final, step.thought) == (None, "")
    assert parse("Final Answer:\n").error is not None


def test_unreadable_arguments_are_kept_raw() -> None:
    step = parse("Action: calculator\nAction Input: [1, 2")
    assert step.call is not None and step.call.malformed and step.call.raw_arguments


def test_empty_thought_is_an_error() -> None:
    assert parse("Thought:   ").error is not None
    assert parse("Action:   \n").error is not None


def test_transcript_rendering_merges_observations() -> None:
    calls = [
        ToolCall(id="a", name="search", arguments={"q": 1}),
        ToolCall(id="b", name="search", arguments={"q": 2}),
    ]
    history = [
        Message.user("task"),
        Message.assistant("looking", calls),
        Message.tool(calls[0], "r1"),
        Message.tool(calls[1], "r2"),
    ]
    out = render_transcript(history)
    assert [m.role for m in out] == ["user", "assistant", "user"]
    assert out[1].content.startswith('Thought: looking\nAction: search\nAction Input: {"q": 1}')
    assert out[2].content == "Observation: r1\nObservation: r2"


def test_tools_prompt_lists_tools_and_format() -> None:
    text = tools_prompt(ToolRegistry([calculator]).definitions())
    assert "- calculator: Evaluate" in text and "Action Input:" in text and "Final Answer:" in text
    assert "Action: <the tool name, one of: calculator>" in text


def test_tools_prompt_shows_a_worked_example_with_tools_that_are_not_the_agents() -> None:
    text = tools_prompt(ToolRegistry([calculator]).definitions())
    example = text[text.index("An example with other tools") :]
    assert 'Action Input: {"name": "Ann Lee"}' in example  # literal braces, not format fields
    steps = [parse(chunk) for chunk in example.split("Observation:")]  # each step parses as a reply
    assert [s.call.name for s in steps[:-1] if s.call] == ["person_info", "route"]
    assert steps[-1].final is not None and "212 km" in steps[-1].final


@pytest.mark.parametrize(
    ("text", "name", "thought"),
    [
        ('Thought: search\nAction Input: {"q": "x"}', "search", ""),
        ('Thought: I will ask the calculator for it.\nAction Input: {"q": "x"}', "calculator", None),
        ('Thought: calculator or search? search.\nAction Input: {"q": "x"}', "search", None),
    ],
)
def test_action_input_without_an_action_line_calls_the_tool_named_before_it(
    text: str, name: str, thought: str | None
) -> None:
    step = parse(text)
    assert step.call is not None and step.call.name == name and step.call.arguments == {"q": "x"}
    if thought is not None:
        assert step.thought == thought


def test_action_input_without_any_tool_name_is_an_error_not_a_final_answer() -> None:
    step = parse('Thought: I need the price.\nAction Input: {"item": "widget"}')
    assert step.call is None and step.final is None
    assert step.error is not None and "Action:" in step.error


def test_an_empty_final_answer_is_an_error() -> None:
    step = parse("Thought: The sentence has 14 words.\nFinal Answer:   ")
    assert step.final is None and step.error is not None and "empty" in step.error


def test_tools_prompt_shows_arguments_as_a_json_object_to_fill_in() -> None:
    from thinkloop import tool

    @tool
    def convert(value: float, unit: str, precise: bool = False) -> str:
        """Convert a value.

        Args:
            unit: the target unit
        """
        return ""

    text = tools_prompt(ToolRegistry([convert]).definitions())
    assert (
        '  Action Input: {"value": <number>, "unit": "<string: the target unit>", '
        '"precise": <true or false, optional, default false>}'
    ) in text
    assert "JSON Schema" not in text and '"properties"' not in text  # small models copied the schema


def test_arguments_example_of_nested_optional_and_enum_schemas() -> None:
    schema = {
        "properties": {
            "mode": {"enum": ["fast", "slow"], "description": "how"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
            "where": {"$ref": "#/$defs/Place"},
        },
        "required": ["mode", "where"],
        "$defs": {
            "Place": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        },
    }
    example, complete = arguments_example(schema)
    assert example == (
        '{"mode": <one of "fast", "slow": how>, "tags": <list of strings, optional>, '
        '"limit": <integer, optional>, "where": {"city": "<string>"}}'
    )
    assert complete
    assert arguments_example({"properties": {}}) == ("{}", True)


def test_a_schema_placeholders_cannot_express_is_also_shown_in_full() -> None:
    schema = {"properties": {"shape": {"oneOf": [{"type": "object"}, {"type": "string"}]}}}
    example, complete = arguments_example(schema)
    assert example == '{"shape": <object or string, optional>}' and not complete
    definition = ToolDefinition(name="draw", description="Draw.", parameters=schema)
    text = tools_prompt([definition])
    assert "Action Input: " in text and 'Arguments (JSON Schema): {"properties": {"shape"' in text


def test_the_default_final_answer_prompt_restates_the_task_after_the_facts_without_the_stop_reason() -> None:
    from thinkloop._prompt import final_answer_prompt

    text = final_answer_prompt(
        None, reason="The run reached the step limit of 8.", goal="Sum it.", facts=["add({}) -> 3"]
    )
    assert "step limit" not in text  # small models answered the reason instead of the task
    assert text.index("add({}) -> 3") < text.index("The task: Sum it.")
    custom = final_answer_prompt("Stopped: {reason} Task: {goal}", reason="R.", goal="G", facts=["f -> 1"])
    assert custom.startswith("Stopped: R. Task: G") and custom.endswith("- f -> 1")


@pytest.mark.parametrize(
    ("answer", "copied"),
    [
        ("How far is Ann Lee's home town from Lyon?", True),  # the example's question
        ("I know the answer, give it directly and stop.", True),  # a rule, reworded a little
        ("Ann Lee's home town, Turin, is 212 km from Lyon.", True),  # the example's answer
        ("The result is 395.", False),
        ("Paris", False),  # too short to tell
        ("The capital of France is Paris.", False),
        ("Reverse the string 'thinkloop' is done: poolkniht", False),  # restates the task
    ],
)
def test_an_answer_made_of_lines_of_the_instructions_is_told_apart(answer: str, copied: bool) -> None:
    from thinkloop._prompt import system_prompt
    from thinkloop._react import copied_answer

    system = system_prompt(tools=tools_prompt(ToolRegistry([calculator]).definitions()))
    assert copied_answer(answer, [system], ["Reverse the string 'thinkloop'."]) is copied


def test_lines_echoing_the_final_answer_prompt_are_dropped_unless_nothing_else_is_left() -> None:
    from thinkloop._prompt import final_answer_prompt
    from thinkloop._react import drop_copied_lines

    prompt = final_answer_prompt(
        None,
        reason="",
        goal="Reverse the string 'thinkloop'.",
        facts=['reverse_text({"text": "thinkloop"}) -> poolkniht'],
    )
    echo = (
        "The tool called that worked, with their results:\n"
        '- reverse_text({"text": "thinkloop"}) -> poolkniht\n\n'
        "The task: Reverse the string 'thinkloop'.\nThe best final answer is: poolkniht"
    )
    assert drop_copied_lines(echo, prompt) == "The best final answer is: poolkniht"
    only_echo = '- reverse_text({"text": "thinkloop"}) -> poolkniht'
    assert drop_copied_lines(only_echo, prompt) == only_echo
    assert drop_copied_lines("It is poolkniht.\n\nDone.", prompt) == "It is poolkniht.\n\nDone."


async def test_a_react_answer_copied_from_the_instructions_is_corrected_once() -> None:
    from thinkloop import Agent
    from thinkloop.testing import ScriptedModel

    copied = "Thought: How far is Ann Lee's home town from Lyon?"
    model = ScriptedModel(
        [
            'Thought: x\nAction: calculator\nAction Input: {"expression": "17*23+4"}',
            copied,
            "Thought: 395 answers it.\nFinal Answer: 395",
        ],
        tools=False,
    )
    result = await Agent(model, tools=[calculator]).run("What is 17*23+4?")
    assert result.output == "395"
    corrections = [m.content for m in result.state.messages if m.kind == "correction"]
    assert len(corrections) == 1 and "repeated a line of your instructions" in corrections[0]
    assert corrections[0].count("The task: What is 17*23+4?") == 1  # restated, so the next reply can answer

    twice = ScriptedModel([copied, copied], tools=False)  # once corrected, the same kind of answer stands
    result = await Agent(twice, tools=[calculator]).run("Where is Ann Lee from?")
    assert result.output == "How far is Ann Lee's home town from Lyon?"
    assert [m.kind for m in result.state.messages].count("correction") == 1


async def test_a_forced_final_answer_loses_the_lines_that_echo_its_prompt() -> None:
    from thinkloop import Agent, Budget
    from thinkloop.testing import FunctionModel

    def reply(request):  # type: ignore[no-untyped-def]
        if request.messages[-1].kind == "final_prompt":
            return "The tool calls that worked, with their results:\nThe best answer is 395."
        return (
            f'Thought: again\nAction: calculator\nAction Input: {{"expression": "17*23+{request.turn - 1}"}}'
        )

    model = FunctionModel(reply, tools=False)
    result = await Agent(model, tools=[calculator], budget=Budget(max_steps=1)).run("What is 17*23+4?")
    assert result.forced_final and result.output == "The best answer is 395."


@pytest.mark.parametrize(
    "text",
    [
        "Thought: To find the cost in USD, we multiply the unit price by the exchange rate.",
        "Thought: The price is 8.40 EUR. I need to convert it to USD.",
        "Thought: Let's compute the total.",
        "Thought: It is 395. I will now round it.",
        "I will try again later.",  # the 0.5B model after a failed call: it ended the run as the answer
        "Thought: The tool failed. Let me try again.",
        "Thought: We will proceed with the next city.",
    ],
)
def test_a_thought_that_only_says_what_comes_next_is_an_error_not_the_answer(text: str) -> None:
    from thinkloop._react import PLAN_ONLY

    step = parse(text)
    assert step.final is None and step.call is None and step.error == PLAN_ONLY


@pytest.mark.parametrize(
    "text",
    [
        "Thought: The capital of France is Paris.",
        "Thought: I need the word. It is 'buenos días'.",  # the plan comes before the answer
        "Thought: I will bring no umbrella: it is sunny.",  # no tool-like step announced
        "The answer is 42. Let me know if you need anything else.",  # a courtesy, not a step
        "I tried the calculator twice and got 5.",
    ],
)
def test_a_thought_that_answers_is_still_the_final_answer(text: str) -> None:
    step = parse(text)
    assert step.error is None and step.final is not None


async def test_a_plan_without_action_is_corrected_once_then_taken_as_the_answer() -> None:
    from thinkloop import Agent
    from thinkloop.testing import ScriptedModel

    plan = "Thought: To find the total, we multiply the price by 4."
    model = ScriptedModel(
        [plan, 'Thought: x\nAction: calculator\nAction Input: {"expression": "8.4*4"}', "Final Answer: 33.6"],
        tools=False,
    )
    result = await Agent(model, tools=[calculator]).run("How much do 4 gadgets at 8.40 cost?")
    assert result.output == "33.6"
    corrections = [m.content for m in result.state.messages if m.kind == "correction"]
    assert len(corrections) == 1 and "neither an Action nor a Final Answer" in corrections[0]
    assert "The task: How much do 4 gadgets at 8.40 cost?" in corrections[0]  # the chain restarted without it

    stubborn = ScriptedModel([plan, plan], tools=False)  # told once, the same kind of reply is the answer
    result = await Agent(stubborn, tools=[calculator]).run("How much?")
    assert result.output == "To find the total, we multiply the price by 4."
    assert [m.kind for m in result.state.messages].count("correction") == 1


async def test_a_native_reply_that_only_announces_a_step_is_asked_once_to_take_it() -> None:
    """A native model that said "I will look up the weather for you." (or "I will try again later.") and
    called nothing ended its run with that as the answer. It is asked once, in words for a native model
    (no ReAct lines, which teach it to write calls as text); a second such reply stands."""
    from thinkloop import Agent, tool
    from thinkloop.testing import ScriptedModel

    @tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"{city}: 18 C, sunny"

    model = ScriptedModel(
        [
            "I will look up the weather in Oslo for you.",
            {"tool_calls": [{"name": "weather", "args": {"city": "Oslo"}}]},
            "18 C, sunny.",
        ]
    )
    result = await Agent(model, tools=[weather]).run("Weather in Oslo?")
    assert result.output == "18 C, sunny." and result.state.mode == "native"
    (correction,) = [m.content for m in result.state.messages if m.kind == "correction"]
    assert (
        "said what to do next but called no tool" in correction and "The task: Weather in Oslo?" in correction
    )
    assert correction.endswith(
        "Either call one of your tools (weather), or reply with the complete final answer."
    )
    assert "Action Input" not in correction

    stubborn = ScriptedModel(["I will try again later.", "I will try again later."])
    result = await Agent(stubborn, tools=[weather]).run("Weather in Oslo?")
    assert result.output == "I will try again later."
    assert [m.kind for m in result.state.messages].count("correction") == 1

    plain = ScriptedModel(["It is sunny. Let me know if you need anything else."])
    result = await Agent(plain, tools=[weather]).run("Weather?")
    assert result.steps == 1 and result.output.startswith("It is sunny.")
    without_tools = ScriptedModel(["I will think about it."])
    assert (await Agent(without_tools).run("Hm?")).steps == 1  # nothing to call: an answer


def test_a_final_answer_label_in_the_middle_of_a_line_still_separates_the_answer() -> None:
    step = parse("Thought: I have found what the task needs. Final Answer: The gizmo costs 16.99 EUR.")
    assert step.final == "The gizmo costs 16.99 EUR." and step.thought == "I have found what the task needs."
    acting = parse(
        'Thought: then the final answer: soon\nAction: calculator\nAction Input: {"expression": "1"}'
    )
    assert acting.call is not None and acting.final is None  # only without an Action


# ============================================================================ calls written as text


def test_text_calls_reads_every_tagged_block_and_keeps_the_text_before() -> None:
    text = (
        "I will compute both.\n"
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17*23"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>'
    )
    before, calls = text_calls(text, TOOLS, "t1")
    assert before == "I will compute both."
    assert [(c.id, c.name, c.arguments) for c in calls] == [
        ("t1", "calculator", {"expression": "17*23"}),
        ("t1_1", "search", {"query": "x"}),
    ]


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "calculator", "arguments": {"expression": "1+1"}}\n{"name": "search", "arguments": {"query": "q"}}',
        '[{"name": "calculator", "arguments": {"expression": "1+1"}}, {"name": "search", "parameters": {"query": "q"}}]',
        '```json\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n```\n'
        '```json\n{"name": "search", "arguments": {"query": "q"}}\n```',
    ],
)
def test_text_calls_reads_several_json_calls_in_a_row(text: str) -> None:
    _, calls = text_calls(text, TOOLS, "t")
    assert [(c.id, c.name, c.arguments) for c in calls] == [
        ("t", "calculator", {"expression": "1+1"}),
        ("t_1", "search", {"query": "q"}),
    ]


@pytest.mark.parametrize(
    ("text", "thought", "arguments"),
    [
        (
            'Thought: compute it\nAction: calculator\nAction Input: {"expression": "2+2"}',
            "compute it",
            {"expression": "2+2"},
        ),
        ('calculator(expression="2+2")', "", {"expression": "2+2"}),
        ("```python\ncalculator(expression='2+2')\n```", "", {"expression": "2+2"}),
        ("Calculator(expression=2+2)", "", {"expression": "2+2"}),  # not a literal: its source text
        ('search(query="x", limit=3)', "", {"query": "x", "limit": 3}),
    ],
)
def test_text_calls_reads_react_lines_and_code_syntax(
    text: str, thought: str, arguments: dict[str, object]
) -> None:
    before, calls = text_calls(text, TOOLS, "t")
    assert before == thought
    assert len(calls) == 1 and calls[0].arguments == arguments and not calls[0].malformed


def test_a_positional_argument_in_code_syntax_is_kept_raw_for_the_executor() -> None:
    _, calls = text_calls('calculator("17*23")', TOOLS, "t")
    assert [(c.name, c.arguments, c.raw_arguments) for c in calls] == [("calculator", {}, '"17*23"')]
    assert call_syntax("calculator(1, 2)", TOOLS, "t") == ToolCall(
        id="t", name="calculator", raw_arguments="[1, 2]"
    )


@pytest.mark.parametrize(
    "text",
    [
        "The answer is 4.",
        "sqrt(16) is 4",  # not a tool
        "print(calculator(expression='1'))",  # code around the call: not only a call
        'calculator(**{"expression": "1"})',
        '{"name": "Ada", "age": 36}',  # JSON that names no tool
        "Use the calculator(expression) tool to do it.",
        "The fix is simple.\nAction: search the archives before you restart.",  # prose, no Action Input
        "",
    ],
)
def test_text_without_a_call_stays_text(text: str) -> None:
    assert text_calls(text, TOOLS, "t") == (text, [])


def test_keyword_arguments_written_as_code_are_read_as_arguments() -> None:
    assert parse_arguments('expression="17*23+4"') == ({"expression": "17*23+4"}, None)
    assert parse_arguments("query='a b', limit=2") == ({"query": "a b", "limit": 2}, None)
    assert parse_arguments("x == 2")[1] == "x == 2"  # a comparison is no keyword argument
    step = parse('Thought: x\nAction: calculator(expression="2*3")')
    assert step.call == ToolCall(id="c1", name="calculator", arguments={"expression": "2*3"})
    step = parse('calculator(expression="2*3")')  # a ReAct reply that is only the call
    assert step.call == ToolCall(id="c1", name="calculator", arguments={"expression": "2*3"})


# ============================================================================ several calls in one


REPEATED = (
    "Thought: I need to find the warehouse with the most free space; warehouse gives this information.\n"
    'Action: warehouse\nAction Input: {"name": "Anvil", "name": "Bolt", "name": "Crate"}'
)  # the 1.5B model, benchmarks/local_tasks_b.py: JSON readers kept "Crate" and dropped the others unsaid


def test_an_action_input_repeating_a_key_with_other_values_is_an_error_naming_them() -> None:
    step = parse_react(REPEATED, ["warehouse"], call_id="c1")
    assert step.error is not None
    assert '"name"' in step.error and '"Anvil", "Bolt", "Crate"' in step.error
    assert "Call warehouse once for each value" in step.error
    unlabelled = parse_react(
        'Thought: warehouse\nAction Input: {"name": "A", "name": "B"}', ["warehouse"], call_id="c"
    )
    assert unlabelled.error is not None and '"A", "B"' in unlabelled.error
    same = parse('Action: calculator\nAction Input: {"expression": "2+2", "expression": "2+2"}')
    assert same.error is None and same.call is not None and same.call.arguments == {"expression": "2+2"}
    nested = parse('Action: search\nAction Input: {"q": {"city": "Oslo"}, "filters": {"city": "Rome"}}')
    assert nested.error is None  # the same key in two different objects is not repeated


def test_repeated_keys_in_calls_written_as_text_still_call_the_tool() -> None:
    _, calls = text_calls(REPEATED, ["warehouse"], "t1")  # a native reply cannot be healed: JSON's reading
    assert [(c.name, c.arguments) for c in calls] == [("warehouse", {"name": "Crate"})]


async def test_a_reply_asking_for_several_calls_in_one_is_corrected_and_no_call_runs() -> None:
    from thinkloop import Agent, tool
    from thinkloop.testing import ScriptedModel

    asked: list[str] = []

    @tool
    def warehouse(name: str) -> str:
        """A warehouse's free space."""
        asked.append(name)
        return f"{name}: 10 pallets free"

    model = ScriptedModel(
        [
            REPEATED,
            'Thought: one by one.\nAction: warehouse\nAction Input: {"name": "Anvil"}',
            "Final Answer: Anvil",
        ],
        tools=False,
    )
    result = await Agent(model, tools=[warehouse]).run("Which warehouse has the most free space?")
    assert result.output == "Anvil" and asked == ["Anvil"]
    corrections = [m.content for m in result.state.messages if m.kind == "correction"]
    assert len(corrections) == 1 and "several values" in corrections[0]


# ============================================================================ JSON results, readable


def test_json_results_are_shown_with_their_characters_not_their_escapes() -> None:
    from thinkloop._react import readable_json

    profile = '{"username": "mkovac", "name": "Marta Kova\\u010d", "mood": "\\ud83d\\ude00"}'  # json.dumps'
    assert readable_json(profile) == '{"username": "mkovac", "name": "Marta Kovač", "mood": "😀"}'
    assert readable_json('[\n  "K\\u00f6ln"\n]') == '[\n  "Köln"\n]'  # the layout is kept
    kept = [
        '{"path": "C:\\\\u00e9"}',  # an escaped backslash, then the letters u00e9
        '{"quote": "\\u0022", "bell": "\\u0007", "half": "\\ud83d"}',  # escapes JSON needs, a lone surrogate
        "Name: Kova\\u010d",  # not JSON: not ours to read
        '{"name": "Kova\\u010d", broken',
    ]
    for text in kept:
        assert readable_json(text) == text, text


async def test_a_react_model_reads_a_json_result_with_its_characters() -> None:
    from thinkloop import Agent, tool
    from thinkloop.models._local import render_chatml
    from thinkloop.testing import ScriptedModel

    @tool
    def user_profile(username: str) -> str:
        """A user's profile, as JSON."""
        return '{"name": "Marta Kova\\u010d", "joined": "2023-09-14"}'

    model = ScriptedModel(
        ['Action: user_profile\nAction Input: {"username": "mkovac"}', "Final Answer: Marta Kovač"],
        tools=False,
    )
    result = await Agent(model, tools=[user_profile]).run("What is mkovac's name?")
    assert result.output == "Marta Kovač"
    seen = "\n".join(m.content for m in model.requests[1].messages)
    assert 'Observation: {"name": "Marta Kovač", "joined": "2023-09-14"}' in seen
    assert (
        "Kova\\u010d" in [m for m in result.state.messages if m.role == "tool"][0].content
    )  # stored as given
    native = render_chatml(result.state.messages[:-1], [user_profile.definition])
    assert '"Marta Kovač"' in "".join(s.text for s in native)  # <tool_response> of a native local model too


# ============================================================================ a call inside a call


def test_a_tools_call_written_as_the_only_argument_of_another_tool_is_that_tools_call() -> None:
    seen = (  # the 1.5B model, benchmarks/local_tasks_b.py: the calculator answered "unknown function 'fx_rate'"
        "Thought: I need to calculate the exchange rate from GBP to USD today.\nAction: calculator\n"
        "Action Input: {\"expression\": \"fx_rate(base='GBP', quote='USD', date='today')\"}"
    )
    step = parse_react(seen, ["calculator", "fx_rate"], call_id="c1")
    assert step.call == ToolCall(
        id="c1", name="fx_rate", arguments={"base": "GBP", "quote": "USD", "date": "today"}
    )
    for text in (
        'Action: calculator\nAction Input: {"expression": "sqrt(2) * 3"}',  # a function, not a tool
        'Action: calculator\nAction Input: {"expression": "calculator(expression=\'2+2\')"}',  # itself
        'Action: search\nAction Input: {"query": "calculator(1)", "limit": 3}',  # not its only argument
    ):
        step = parse_react(text, ["calculator", "search", "fx_rate"], call_id="c1")
        assert step.call is not None and step.call.name == text.split("\n")[0].removeprefix("Action: "), text


# ============================================================================ a reply stuck on one line


class _Stutter:
    """Stands in for llama.cpp's completion stream: the 0.5B model's reply, one line per piece, forever."""

    def __init__(self, head: list[str], line: str) -> None:
        self.head, self.line, self.sent, self.closed = head, line, 0, False

    def create_completion(self, prompt: list[int], **kwargs: object):  # type: ignore[no-untyped-def]
        def stream():  # type: ignore[no-untyped-def]
            try:
                for piece in self.head:
                    self.sent += 1
                    yield {"choices": [{"text": piece, "finish_reason": None}]}
                while self.sent < 1000:
                    self.sent += 1
                    yield {"choices": [{"text": self.line, "finish_reason": None}]}
            finally:
                self.closed = True

        return stream()


def _job(streamed: list[str]):  # type: ignore[no-untyped-def]
    import threading

    from thinkloop.models._local import _Job

    return _Job(segments=[], stop=[], max_tokens=1024, temperature=0.3, seed=0, on_text=streamed.append,
                cancel=threading.Event())  # fmt: skip


def test_a_local_reply_repeating_one_line_stops_with_one_copy_kept() -> None:
    from thinkloop.models._local import _complete

    head = [" 500 US dollars = 500 * 0.9187 EUR = 479.19 EUR\n"]
    llm = _Stutter(head, "Thought: 479.19 EUR = 479.19 EUR\n")  # seen: to the 1,024-token limit, 98 s
    streamed: list[str] = []
    text, finish = _complete(llm, [1, 2], _job(streamed))
    assert text == " 500 US dollars = 500 * 0.9187 EUR = 479.19 EUR\nThought: 479.19 EUR = 479.19 EUR"
    assert finish == "stop" and llm.sent == 5 and llm.closed and len(streamed) == 5
    assert parse_react("Thought:" + text, ["fx_rate"], call_id="c").final is not None


@pytest.mark.parametrize(
    "pieces",
    [
        ["Thought: a\n", "b\n", "a\n", "a\n", "a\n", "Final Answer: a"],  # three in a row is not stuck
        ["Final Answer:\n", "\n", "\n", "\n", "\n", "--\n", "--\n", "--\n", "--\n", "x"],  # blank or short
    ],
)
def test_repeated_lines_short_of_a_stutter_are_kept(pieces: list[str]) -> None:
    from thinkloop.models._local import _complete

    llm = _Stutter(pieces, "")
    llm.sent = 1000 - len(pieces)  # nothing after the pieces
    text, _ = _complete(llm, [1], _job([]))
    assert text == "".join(pieces)


@pytest.mark.parametrize(
    ("answer", "missing"),
    [
        ("The total is 3.75 kg.", ["3.75"]),  # worked out in the head beside "total 6.65 kg"
        ("The total is 6.65 kg, for 3 items.", []),
        ("About 6.7 kg.", []),  # rounded
        ("It costs $2000.", ["2000"]),
        ("4,903,716.15 EUR, about 4.9 million", []),  # thousands separators, a scale word
        ("About 12 million euros.", ["12 million"]),  # quoted with its scale word (it said "12")
        ("Joined on September 14, 2023; phone +44 20 7946 0321.", []),  # parts of a date, a phone number
    ],
)
def test_the_numbers_of_an_answer_that_no_result_gives_are_found(answer: str, missing: list[str]) -> None:
    from thinkloop._react import unsourced_numbers

    sources = [
        "What is the total weight of 3 items?",
        "3 items, total 6.65 kg",
        '{"joined": "2023-09-14", "phone": "+44 20 7946 0321", "sum": 4903716.15}',
    ]
    assert unsourced_numbers(answer, sources) == missing


async def test_a_react_answer_with_a_number_no_result_gives_is_corrected_once() -> None:
    from thinkloop import Agent, tool
    from thinkloop.testing import ScriptedModel

    @tool
    def shipping_weight(items: list[str]) -> str:
        """The total shipping weight of a list of items."""
        return f"{len(items)} items, total 6.65 kg"

    call = 'Thought: x\nAction: shipping_weight\nAction Input: {"items": ["kettle", "toaster", "blender"]}'
    head = "Thought: 1.0 + 1.2 + 1.5 kg.\nFinal Answer: 3.75 kg"
    model = ScriptedModel(
        [call, head, "Thought: The observation says 6.65 kg.\nFinal Answer: 6.65 kg"], tools=False
    )
    result = await Agent(model, tools=[shipping_weight]).run(
        "What do a kettle, a toaster and a blender weigh?"
    )
    assert result.output == "6.65 kg"
    corrections = [m.content for m in result.state.messages if m.kind == "correction"]
    assert len(corrections) == 1 and "3.75, which none of the observations" in corrections[0]
    assert "The task: What do a kettle, a toaster and a blender weigh?" in corrections[0]

    stubborn = ScriptedModel([call, head, head], tools=False)  # told once, the same kind of answer stands
    result = await Agent(stubborn, tools=[shipping_weight]).run("What do they weigh?")
    assert result.output == "3.75 kg"
    assert [m.kind for m in result.state.messages].count("correction") == 1

    no_tools = ScriptedModel(["Final Answer: 42 is the answer."], tools=False)  # no result to check against
    assert (await Agent(no_tools, tools=[shipping_weight]).run("Say a number.")).output == "42 is the answer."


async def test_made_up_numbers_put_through_the_calculator_are_still_made_up() -> None:
    """The 1.5B model (benchmarks/local_tasks_b.py, missing_product), told that no product matched, sent
    `1000 * 2` to the calculator and answered "The Zephyr Z9 drone costs $2000."."""
    from thinkloop import Agent, tool
    from thinkloop.testing import ScriptedModel
    from thinkloop.tools.calculator import calculator

    @tool
    def search_products(query: str) -> str:
        """Search the product catalogue."""
        return f"no products match {query!r}" if "Zephyr" in query else "Aurora X2: 149.00 EUR"

    def run(query: str, expression: str, answer: str) -> ScriptedModel:
        return ScriptedModel(
            [
                f'Thought: x\nAction: search_products\nAction Input: {{"query": "{query}"}}',
                f'Thought: x\nAction: calculator\nAction Input: {{"expression": "{expression}"}}',
                f"Thought: x\nFinal Answer: {answer}",
                "Thought: x\nFinal Answer: Could not be found.",
            ],
            tools=False,
        )

    made_up = run("Zephyr Z9 drone", "1000 * 2", "The Zephyr Z9 drone costs $2000.")
    result = await Agent(made_up, tools=[search_products, calculator]).run(
        "What does the Zephyr Z9 drone cost?"
    )
    corrections = [m.content for m in result.state.messages if m.kind == "correction"]
    assert len(corrections) == 1
    assert (  # the call that made the number up is named
        'Your last reply needs a correction: The Final Answer gives 2000: the calculator computed 2000 from "1000 * 2", but no observation or the '
        "task gives 1000, 2: a number made up and put through the calculator is still made up."
    ) in corrections[0]
    assert result.output == "Could not be found."
    calculated = [m.content for m in result.state.messages if m.name == "calculator"]
    assert calculated == [  # the result is told to be made up, and how to get the values
        "2000\n\nNote: none of 1000, 2 is in the task or an observation. If the task needs values looked up "
        "(prices, rates, counts …), look them up with a tool first (search_products) and compute with those; "
        "a result computed from made-up values is no answer."
    ]

    # Told so, the 1.5B model sent the same call and answer again: told once more, as any unsourced
    # answer; a third such answer stands.
    again = [
        'Thought: x\nAction: search_products\nAction Input: {"query": "Zephyr Z9 drone"}',
        *[
            'Thought: x\nAction: calculator\nAction Input: {"expression": "1000 * 2"}',
            "Thought: x\nFinal Answer: The Zephyr Z9 drone costs $2000.",
        ]
        * 3,
    ]
    result = await Agent(ScriptedModel(again, tools=False), tools=[search_products, calculator]).run(
        "What does the Zephyr Z9 drone cost?"
    )
    corrections = [m.content for m in result.state.messages if m.kind == "correction"]
    assert len(corrections) == 2 and "still made up" in corrections[0]
    assert "The Final Answer gives 2000, which none of the observations" in corrections[1]
    assert result.output == "The Zephyr Z9 drone costs $2000."

    # Made-up prices sent to the calculator before anything was looked up (price_difference): told to
    # look them up first, with the tools that can.
    unlooked = [
        'Thought: x\nAction: calculator\nAction Input: {"expression": "(100 - 90) * 100"}',
        "Thought: x\nFinal Answer: It costs 1000 more.",
        'Thought: x\nAction: search_products\nAction Input: {"query": "Aurora X2"}',
        "Thought: x\nFinal Answer: 149.00 EUR.",
    ]
    result = await Agent(ScriptedModel(unlooked, tools=False), tools=[search_products, calculator]).run(
        "How much more does the Aurora X2 cost than the Aurora X2 Lite?"
    )
    (correction,) = [m.content for m in result.state.messages if m.kind == "correction"]
    assert 'computed 1000 from "(100 - 90) * 100", but no observation or the task gives 100, 90' in correction
    assert (
        "No tool has looked anything up yet: call the one that gives the values the task needs (one of: "
        in correction
    )
    assert "search_products" in correction and result.output == "149.00 EUR."

    sourced = run("Aurora X2", "149.00 * 2", "Two cost 298 EUR.")  # a result's number: the product is sourced
    result = await Agent(sourced, tools=[search_products, calculator]).run("What do two Aurora X2 cost?")
    assert result.output == "Two cost 298 EUR."
    assert not [m for m in result.state.messages if m.kind == "correction"]
    assert [m.content for m in result.state.messages if m.name == "calculator"] == ["298"]  # no note

    # Only the calculator to hand: nothing could have been looked up, no note.
    alone = ScriptedModel(
        ['Thought: x\nAction: calculator\nAction Input: {"expression": "13 + 17"}', "Final Answer: 30"],
        tools=False,
    )
    result = await Agent(alone, tools=[calculator]).run("Add two primes above 12.")
    assert [m.content for m in result.state.messages if m.name == "calculator"] == ["30"]


@pytest.mark.parametrize(
    ("expression", "sources", "made_up"),
    [
        ("1000 * 2", ["What does the Zephyr Z9 drone cost?", "no products match 'Zephyr Z9'"], ["1000", "2"]),
        ("(100 - 90) * 100", ["How much more does the X2 cost than the X2 Lite?"], ["100", "90"]),
        ("149.00 - 90", ["Aurora X2: 149.00 EUR"], []),  # one number given: the other may be a constant
        ("149.00 * 2", ["Aurora X2: 149.00 EUR"], []),
        ("24 * 60 * 60", ["How many seconds are in a day?"], []),  # constants need no source
        ("3.5 * 60", ["How many minutes are in 3.5 hours?"], []),
        ("26.2 * 1.609", ["A marathon is 26.2 miles. How many km?"], []),  # a unit's factor
        ("31 * 9 / 5 + 32", ["Cairo: 31 °C"], []),
        ("19.99 - 12.75", ["widget: 12.75 EUR", "gizmo: 19.99 EUR"], []),
        ("86.40 * 1.15", ["What is the bill with a 15% tip?", "bill: 86.40 EUR"], []),  # a rate as a factor
        ("86.40 * 0.15", ["What is a 15% tip?", "bill: 86.40 EUR"], []),
        ("80 * 0.8", ["What does it cost after a 20% discount?", "price: 80 EUR"], []),
        ("86.40 * 1.17", ["What is the bill with a 15% tip?", "bill: 86.40 EUR"], []),
        ("12.5 * 40", ["What do 40 cost?"], []),
        ("12.5 * 41", ["What do 40 cost?"], ["12.5", "41"]),
    ],
)
def test_a_computation_from_nowhere_is_one_none_of_whose_numbers_a_source_gives(
    expression: str, sources: list[str], made_up: list[str]
) -> None:
    """Seconds in a day (`24 * 60 * 60`) or miles in km are computed from constants, which no result gives
    and need none; prices put through the calculator with no result giving them are made up. With one
    number given, the others may be constants no list holds: not made up (a tip's `* 0.15` was)."""
    from thinkloop._react import computed_from_nowhere

    assert computed_from_nowhere(expression, sources) == made_up


async def test_a_calculator_result_of_constants_is_a_source_for_the_answer() -> None:
    from thinkloop import Agent, tool
    from thinkloop.testing import ScriptedModel

    model = ScriptedModel(
        [
            'Thought: x\nAction: calculator\nAction Input: {"expression": "24 * 60 * 60"}',
            "Thought: x\nFinal Answer: A day has 86400 seconds.",
        ],
        tools=False,
    )
    result = await Agent(model, tools=[calculator]).run("How many seconds are in a day?")
    assert result.output == "A day has 86400 seconds."
    assert not [m for m in result.state.messages if m.kind == "correction"]

    @tool
    def exchange_rate(base: str, quote: str) -> str:
        """An exchange rate."""
        return "1 EUR = 1.08 USD"

    # One number of the task's and one of no list (a tip of 15 % as `* 0.15` was taken for made up, and
    # the 1.5B model's right answer ended as "Could not be found."): a source, no note, no correction.
    for expression, answer in [("86.40 * 0.15", "12.96"), ("86.40 * 0.5", "43.2")]:
        model = ScriptedModel(
            [
                f'Thought: x\nAction: calculator\nAction Input: {{"expression": "{expression}"}}',
                f"Thought: x\nFinal Answer: {answer} EUR",
            ],
            tools=False,
        )
        result = await Agent(model, tools=[calculator, exchange_rate]).run(
            "A restaurant bill is 86.40 EUR. How much is a 15% tip? And half the bill?"
        )
        assert result.output == f"{answer} EUR", expression
        assert [m.content for m in result.state.messages if m.role == "tool"] == [answer]


# ============================================================================ strict JSON in Action Input

NON_FINITE_INPUTS = ['{"x": NaN}', '{"x": Infinity}', '{"x": -Infinity}', '{"x": 1e999}', '{"x": [1, NaN]}']


@pytest.mark.parametrize("text", NON_FINITE_INPUTS)
def test_arguments_holding_nan_or_infinity_are_kept_raw(text: str) -> None:
    """json.loads (and json_repair after it) read `NaN`, `Infinity` and `1e999` as floats, which JSON does
    not have: the model is asked to send valid JSON instead of the tool getting {'x': nan}."""
    assert parse_arguments(text) == ({}, text)
    step = parse(f"Thought: t\nAction: calculator\nAction Input: {text}")
    assert step.call is not None and step.call.arguments == {} and step.call.raw_arguments == text


def test_calls_written_as_json_or_code_holding_nan_are_not_read_as_numbers() -> None:
    malformed = ToolCall(id="c1", name="calculator", raw_arguments='{"x": NaN}')
    bare = '{"name": "calculator", "arguments": {"x": NaN}}'
    assert parse(bare).call == malformed  # still a call, not the final answer
    for text in [bare, f"<tool_call>{bare}</tool_call>"]:
        assert text_calls(text, TOOLS, "c1") == ("", [malformed])
    assert parse_arguments("x=1e999") == ({"x": "1e999"}, None)  # code: kept as its text, like `17*23+4`
    assert call_syntax("calculator(x=1e999)", TOOLS, "c") == ToolCall(
        id="c", name="calculator", arguments={"x": "1e999"}
    )


def test_arguments_nested_too_deeply_are_kept_raw_not_a_recursion_error() -> None:
    deep = '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    assert parse_arguments(deep) == ({}, deep)
    step = parse(f"Action: calculator\nAction Input: {deep}")
    assert step.call is not None and step.call.raw_arguments == deep


async def test_a_react_model_writing_nan_is_asked_for_valid_json() -> None:
    from thinkloop import Agent, tool
    from thinkloop.testing import ScriptedModel

    seen: list[float] = []

    @tool
    def square(x: float) -> float:
        """The square of x."""
        seen.append(x)
        return x * x

    model = ScriptedModel(
        [
            'Thought: t\nAction: square\nAction Input: {"x": NaN}',
            'Thought: t\nAction: square\nAction Input: {"x": 3}',
            "Final Answer: 9",
        ],
        tools=False,
    )
    result = await Agent(model, tools=[square]).run("Square 3.")
    assert result.output == "9" and seen == [3.0]
    observations = [m.content for m in model.requests[1].messages if m.content.startswith("Observation")]
    assert len(observations) == 1 and "not a JSON object" in observations[0] and "NaN" in observations[0]


def test_records_are_ordered_without_the_numbers_json_does_not_have() -> None:
    """Before: `a (nan)` came first, 'from lowest to highest', where NaN has no order at all."""
    from thinkloop._react import list_orders

    records = '[{"name": "a", "price": NaN}, {"name": "b", "price": 3}, {"name": "c", "price": 1}, {"name": "d", "price": Infinity}]'
    assert list_orders(records) == "\n(items by price, from lowest to highest: c (1), b (3))"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "Thought: I need it.\nAction: one of [calculator, lookup]\nAction Input: {JSON arguments}",
            "several tools",
        ),
        (
            "Thought: x\nAction: <the tool name, one of: calculator, lookup>\nAction Input: {}",
            "several tools",
        ),
        ("Thought: x\nAction: calculator\nAction Input: {JSON arguments}", "was a placeholder"),
        (
            "Thought: x\nAction: calculator\nAction Input: <the tool's arguments as a JSON object>",
            "was a placeholder",
        ),
    ],
)
def test_the_formats_placeholders_copied_are_corrected_not_called(text: str, error: str) -> None:
    """The 0.5B model copied the correction's template: its first tool was called with no arguments."""
    step = parse_react(text, ["calculator", "lookup"], call_id="c1")
    assert step.call is None and step.final is None and error in (step.error or "")


def test_real_arguments_and_one_tool_name_are_still_a_call() -> None:
    for text, name, args in [
        (
            'Thought: x\nAction: calculator\nAction Input: {"expression": "2+2"}',
            "calculator",
            {"expression": "2+2"},
        ),
        ('Thought: x\nAction: lookup\nAction Input: {"input": "a"}', "lookup", {"input": "a"}),
        ("Thought: x\nAction: use the lookup tool\nAction Input: {}", "lookup", {}),
    ]:
        step = parse_react(text, ["calculator", "lookup"], call_id="c1")
        assert (
            step.error is None
            and step.call is not None
            and (step.call.name, step.call.arguments) == (name, args)
        )


async def test_the_correction_of_an_unreadable_reply_uses_the_formats_placeholders() -> None:
    from thinkloop import Agent
    from thinkloop.testing import ScriptedModel

    model = ScriptedModel(
        ["Thought: x\nAction: calculator\nAction Input: {JSON arguments}", "Final Answer: 4"], tools=False
    )
    result = await Agent(model, tools=[calculator]).run("2+2?")
    assert result.output == "4"
    correction = model.requests[1].messages[-1].content
    assert (
        "Action: <the tool name, one of: calculator>\nAction Input: <the tool's arguments as a JSON object>"
        in correction
    )


@pytest.mark.parametrize(
    ("answer", "results", "wrong"),
    [
        ("gizmo is cheaper than widget.", ["gizmo: 19.99 EUR", "widget: 12.75 EUR"], True),
        (
            "The widget is cheaper than the gizmo by 7.24 EUR.",
            ["gizmo: 19.99 EUR", "widget: 12.75 EUR"],
            False,
        ),
        ("So the gizmo is more expensive than a widget.", ["gizmo: 19.99 EUR", "widget: 12.75 EUR"], False),
        ("Berlin is warmer than Madrid.", ["Madrid: 19 °C, sunny", "Berlin: 7 °C, cloudy"], True),
        ("Oslo is colder than Berlin.", ["Oslo: -5 °C", "Berlin: -3 °C"], False),  # negative values
        (
            "Berlin is colder than Oslo.",
            ['{"city": "Oslo", "temp": -5}', '{"city": "Berlin", "temp": -3}'],
            True,
        ),
        ("Oslo is colder than Berlin.", ["Oslo: -3 °C", "Berlin: -3.0 °C"], False),  # equal: not judged
        (
            "gizmo is cheaper than widget.",
            ["gizmo: 19.99 EUR, or 17.50 EUR on sale", "gizmo: 17.50 EUR"],
            False,
        ),
        ("It is cheaper than a widget.", ["gizmo: 19.99 EUR", "widget: 12.75 EUR"], False),  # no name found
        ("Paris is larger than Rome.", ["Paris has 2.1 million people"], False),  # one side only
    ],
)
def test_a_comparison_the_observations_contradict_is_found(
    answer: str, results: list[str], wrong: bool
) -> None:
    from thinkloop._react import wrong_comparison

    assert (wrong_comparison(answer, results) is not None) is wrong


def test_a_contradicted_comparison_is_put_right_by_swapping_its_sides() -> None:
    from thinkloop._react import righted_comparison

    prices = ["gizmo: 19.99 EUR", "widget: 12.75 EUR"]
    assert righted_comparison("The gizmo is cheaper than the widget by 7.24 EUR.", prices) == (
        "The widget is cheaper than the gizmo by 7.24 EUR."
    )
    assert (
        righted_comparison("The widget is cheaper than the gizmo.", prices)
        == "The widget is cheaper than the gizmo."
    )
    weather = ["Madrid: 19 °C", "Berlin: 7 °C"]
    assert (
        righted_comparison("Berlin is warmer than Madrid today.", weather)
        == "Madrid is warmer than Berlin today."
    )
    assert righted_comparison("No comparison here.", weather) == "No comparison here."


async def test_an_answer_naming_the_wrong_option_as_the_most_is_corrected_by_the_models_own_sums() -> None:
    """The 1.5B model (local_tasks_b.py, most_free_space) worked out 2530, 2880 and 1010 pallets right and
    answered "Anvil has the most free space."."""
    import json

    from thinkloop import Agent, tool
    from thinkloop.testing import ScriptedModel

    stock = {"Anvil": (12400, 9870), "Bolt": (8000, 5120), "Crate": (15000, 13990)}

    @tool
    def warehouse(name: str) -> str:
        """A warehouse's capacity and the space in use, in pallets."""
        cap, used = stock[name]
        return json.dumps({"warehouse": name, "capacity_pallets": cap, "used_pallets": used})

    def look(name: str, before: str = "") -> str:
        return f'Thought: {before}\nAction: warehouse\nAction Input: {{"name": "{name}"}}'

    sums = [
        look("Anvil", "I need each one."),
        look("Bolt", "Anvil has 12400 pallets, 9870 used. The free space is 12400 - 9870 = 2530 pallets."),
        look("Crate", "Bolt has 8000 pallets, 5120 used. The free space is 8000 - 5120 = 2880 pallets."),
        "Thought: Crate has 15000 pallets, 13990 used. The free space is 15000 - 13990 = 1010 pallets.\n"
        "Final Answer: Anvil has the most free space.",
    ]
    goal = "Which warehouse has the most free space: Anvil, Bolt or Crate?"
    result = await Agent(
        ScriptedModel([*sums, "Final Answer: Bolt has the most free space."], tools=False), tools=[warehouse]
    ).run(goal)
    (correction,) = [m.content for m in result.state.messages if m.kind == "correction"]
    assert (
        "The Final Answer says Anvil has the most, but by your own computations (Anvil 2530, Bolt 2880, "
        "Crate 1010) Bolt has the most. Correct the answer."
    ) in correction
    assert result.output == "Bolt has the most free space."

    stubborn = ScriptedModel([*sums, "Final Answer: Anvil has the most free space."], tools=False)
    result = await Agent(stubborn, tools=[warehouse]).run(goal)
    assert result.output == "Bolt has the most free space."  # told once: put right

    right = ScriptedModel(
        [*sums[:-1], sums[-1].replace("Anvil has the most", "Bolt has the most")], tools=False
    )
    result = await Agent(right, tools=[warehouse]).run(goal)
    assert result.output == "Bolt has the most free space."
    assert not [m for m in result.state.messages if m.kind == "correction"]

    # Crate's value not worked out: unsure, the answer stands.
    unsure = ScriptedModel(
        [*sums[:-1], "Thought: done.\nFinal Answer: Anvil has the most free space."], tools=False
    )
    result = await Agent(unsure, tools=[warehouse]).run(goal)
    assert result.output == "Anvil has the most free space."
    assert not [m for m in result.state.messages if m.kind == "correction"]


# Texts built from the characters the call forms are written with, and the tools' names and labels, so that
# the generated texts come close to calls; a text without `{`, `(`, a colon or `<tool_call>` never is one.
_PIECES = st.sampled_from(
    ["calculator", "search", "final_answer", "Action", "Action Input", "Final Answer", "<tool_call>",
     "</tool_call>", "```", "```json", '"name"', "{", "}", "(", ")", ":", "：", "=", "\n", " ", "2+2", "x"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(_PIECES, max_size=12).map("".join))
def test_a_text_that_may_hold_no_call_is_parsed_as_none(text: str) -> None:
    names = [*TOOLS, "final_answer"]
    if not may_hold_calls(text):
        assert text_calls(text, names, "t") == (text, [])
        assert json_answer(text, names) is None


def test_call_forms_are_seen_by_may_hold_calls() -> None:
    for text in (
        '{"name": "search", "arguments": {"q": "x"}}',
        "calculator(expression='2+2')",
        "Action: search",
        "Action： search",
        "<tool_call>search</tool_call>",
    ):
        assert may_hold_calls(text), text
        assert text_calls(text, TOOLS, "t")[1], text
    assert not may_hold_calls("It is 42 degrees in Paris.")
