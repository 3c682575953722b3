"""Structured output: `Agent(output_type=T)` — the schema in the prompt, lenient reading, validation,
healing of answers that do not validate, forced final answers, serialisation."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Literal

import pytest
from pydantic import BaseModel

from thinkloop import Agent, Budget, ConfigurationError, StopReason, tool
from thinkloop._events import Done, Event, RunResult
from thinkloop._output import OutputSpec
from thinkloop.testing import FunctionModel, ScriptedModel


class City(BaseModel):
    name: str
    population: int


@tool
def lookup(city: str) -> str:
    """Look up a city's population."""
    return f"{city}: 709000 people"


def call(name: str, **args: object) -> dict[str, object]:
    return {"tool_calls": [{"name": name, "args": args}]}


async def test_the_answer_is_validated_into_the_type_and_the_schema_is_in_the_prompt() -> None:
    model = ScriptedModel(
        [call("lookup", city="Oslo"), 'Here you go:\n```json\n{"name": "Oslo", "population": "709000"}\n```']
    )
    result = await Agent(model, tools=[lookup], output_type=City).run("How many people live in Oslo?")
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.parsed == City(name="Oslo", population=709000)
    system = model.requests[0].messages[0].content
    assert "JSON only" in system and '"population":{"title":"Population","type":"integer"}' in system


async def test_an_answer_that_does_not_validate_goes_back_to_the_model_with_the_errors() -> None:
    model = ScriptedModel(
        ["Oslo has 709,000 people.", '{"name": "Oslo"}', '{"name": "Oslo", "population": 709000}']
    )
    result = await Agent(model, output_type=City).run("Oslo?")
    assert (
        result.parsed == City(name="Oslo", population=709000)
        and result.stop_reason is StopReason.FINAL_ANSWER
    )
    corrections = [m.content for m in result.state.messages if m.kind == "correction"]
    assert len(corrections) == 2
    assert "Input should be a valid dictionary or instance of City" in corrections[0]
    assert "population: Field required" in corrections[1]
    assert model.requests[2].messages[-1].content == corrections[1]  # the model saw what was wrong


async def test_answers_that_never_validate_end_the_run_with_error_and_keep_the_text() -> None:
    result = await Agent(FunctionModel(lambda r: "about 700k"), output_type=City).run("Oslo?")
    assert result.stop_reason is StopReason.ERROR and result.parsed is None
    assert result.output == "about 700k"
    assert result.error is not None and result.error.startswith(
        "the final answer did not match the output type:"
    )
    assert [m.kind for m in result.state.messages].count("correction") == 3


async def test_a_cut_off_object_is_never_completed_into_a_wrong_value() -> None:
    model = ScriptedModel(['{"name": "Oslo", "population": 7', '{"name": "Oslo", "population": 709000}'])
    result = await Agent(model, output_type=City).run("Oslo?")
    assert result.parsed == City(name="Oslo", population=709000)


async def test_the_forced_final_answer_asks_for_the_format_and_is_parsed_when_it_validates() -> None:
    replies = [
        call("lookup", city="Oslo"),
        call("lookup", city="Oslo "),
        '{"name": "Oslo", "population": 709000}',
    ]
    model = ScriptedModel(replies)
    result = await Agent(model, tools=[lookup], output_type=City, budget=Budget(max_steps=2)).run("Oslo?")
    assert result.stop_reason is StopReason.MAX_STEPS and result.forced_final
    assert result.parsed == City(name="Oslo", population=709000)
    assert "JSON only" in model.requests[-1].messages[-1].content


@dataclass
class Verdict:
    answer: Literal["yes", "no"]
    reason: str


@pytest.mark.parametrize(
    ("output_type", "reply", "expected"),
    [
        (int, "42", 42),
        (list[str], 'The items: ["a", "b"]', ["a", "b"]),
        (Literal["yes", "no"], "yes", "yes"),
        (Verdict, "{'answer': 'no', 'reason': 'closed',}", Verdict("no", "closed")),  # repaired slips
    ],
)
async def test_other_types(output_type: object, reply: str, expected: object) -> None:
    result = await Agent(ScriptedModel([reply]), output_type=output_type).run("?")
    assert result.parsed == expected


async def test_react_mode_and_serialisation_of_the_result() -> None:
    model = ScriptedModel(
        ['Thought: I know it.\nFinal Answer: {"name": "Oslo", "population": 709000}'], tools=False
    )
    events: list[Event] = []
    result = await Agent(model, output_type=City).run("Oslo?", on_event=events.append)
    assert result.parsed == City(name="Oslo", population=709000)
    done = events[-1]
    assert isinstance(done, Done)
    data = json.loads(done.model_dump_json())
    assert data["result"]["parsed"] == {"name": "Oslo", "population": 709000}
    assert RunResult.model_validate_json(json.dumps(data["result"])).parsed == {
        "name": "Oslo",
        "population": 709000,
    }


async def test_without_an_output_type_nothing_changes() -> None:
    model = ScriptedModel(["plain text"])
    result = await Agent(model).run("?")
    assert result.parsed is None and result.output == "plain text"
    assert "JSON Schema" not in model.requests[0].messages[0].content
    assert OutputSpec.of(str) is None


def test_a_type_pydantic_cannot_handle_is_a_configuration_error() -> None:
    class Opaque:
        pass

    with pytest.raises(ConfigurationError, match="output_type .* cannot be used"):
        Agent(ScriptedModel(["x"]), output_type=Opaque)


class Invoice(BaseModel):
    items: list[int]
    total: int


def total_matches(invoice: Invoice) -> Invoice:
    if sum(invoice.items) != invoice.total:
        raise ValueError(f"the total {invoice.total} is not the sum of the items ({sum(invoice.items)}).")
    return invoice


async def test_an_output_validator_checks_what_a_schema_cannot_and_its_message_goes_to_the_model() -> None:
    model = ScriptedModel(['{"items": [2, 3], "total": 6}', '{"items": [2, 3], "total": 5}'])
    result = await Agent(model, output_type=Invoice, output_validator=total_matches).run("Bill 2 and 3.")
    assert result.parsed == Invoice(items=[2, 3], total=5)
    (correction,) = [m.content for m in result.state.messages if m.kind == "correction"]
    assert "the total 6 is not the sum of the items (5). Give the final answer again." in correction


async def test_an_output_validator_on_plain_text_answers_can_also_change_them() -> None:
    def no_shouting(text: str) -> str:
        if not text.strip():
            raise ValueError("the answer is empty.")
        return text.strip().lower()

    model = ScriptedModel(["   ", "  YES  "])
    agent = Agent(model, output_validator=no_shouting)
    result = await agent.run("?")
    assert result.parsed == "yes" and result.output == "  YES  "
    assert "JSON Schema" not in model.requests[0].messages[0].content  # no format rule for text


@pytest.mark.parametrize("error", [RuntimeError("validator bug"), TimeoutError("its own timeout")])
async def test_an_output_validator_that_crashes_ends_the_run_with_error_and_keeps_its_state(
    error: Exception,
) -> None:
    # a RuntimeError escaped run() with no result and no `done`; a TimeoutError ended the run as
    # `timeout` ("the time limit of None s") though no time limit was set
    def validator(text: str) -> str:
        raise error

    events: list[Event] = []
    result = await Agent(ScriptedModel(["answer"]), output_validator=validator).run(
        "?", on_event=events.append
    )
    assert result.stop_reason is StopReason.ERROR
    assert result.error is not None and result.error.startswith(
        f"the output_validator raised {type(error).__name__}: {error} (a validator rejects an answer by raising"
    )
    assert result.state.messages[-1].content == "answer" and events[-1].type == "done"


# ------------------------------------------------------------ what small models write (Qwen2.5-Coder 0.5B/1.5B)


class Price(BaseModel):
    item: str
    price: float


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Shipment(BaseModel):
    zip_code: str
    tags: list[str]
    color: Color


OSLO = City(name="Oslo", population=709000)


@pytest.mark.parametrize(
    ("output_type", "reply", "expected"),
    [
        # a draft, then the final version: the last one wins (the first one used to)
        (
            City,
            'Draft: {"name": "Osl", "population": 1}\nFinal: {"name": "Oslo", "population": 709000}',
            OSLO,
        ),
        (
            City,
            '```json\n{"name": "Oslo"}\n```\nFixed:\n```json\n{"name": "Oslo", "population": 709000}\n```',
            OSLO,
        ),
        # the answer wrapped, or the schema echoed around it
        (City, '{"answer": {"name": "Oslo", "population": 709000}}', OSLO),
        (City, '{"output": {"name": "Oslo", "population": 709000}}', OSLO),
        (City, '{"City": {"name": "Oslo", "population": 709000}}', OSLO),
        (
            City,
            '{"type": "object", "properties": {"name": "Oslo", "population": 709000}, "required": ["name"]}',
            OSLO,
        ),
        (
            City,
            '{"name": "final_answer", "arguments": {"answer": {"name": "Oslo", "population": 709000}}}',
            OSLO,
        ),
        (City, '[{"name": "Oslo", "population": 709000}]', OSLO),
        (list[City], '{"name": "Oslo", "population": 709000}', [OSLO]),
        (list[int], 'Result: {"result": [1, 2]}', [1, 2]),
        # numbers written as text
        (City, '{"name": "Oslo", "population": "709,000"}', OSLO),
        (City, '{"Name": "Oslo", "Population": "709 000"}', OSLO),
        (Price, '{"item": "tea", "price": "$12.50"}', Price(item="tea", price=12.5)),
        (Price, "{'item': 'tea', 'price': '1,234.5 USD'}", Price(item="tea", price=1234.5)),
        (int, "The answer is 42.", 42),
        (int, "**42**", 42),
        (float, "€3.5", 3.5),
        # a minus sign as models write it: U+2212, a dash, a word (it was dropped: −5 read as 5)
        (int, "−5", -5),
        (int, "The temperature is −5 degrees.", -5),
        (int, "**–5**", -5),
        (int, "minus 5", -5),
        (float, "Negative 2.5 °C", -2.5),
        (City, '{"name": "Oslo", "population": "−12"}', City(name="Oslo", population=-12)),
        # enum values and booleans as words
        (Color, "RED", Color.RED),
        (Color, '"Green"', Color.GREEN),
        (Literal["yes", "no"], "Yes.", "yes"),
        (Literal["yes", "no"], 'The answer is "no".', "no"),
        (bool, "Yes!", True),
        # one field at a time: a number for a string, one tag for a list, an enum value in capitals
        (
            Shipment,
            '{"zip_code": 10115, "tags": "fragile", "color": "RED"}',
            Shipment(zip_code="10115", tags=["fragile"], color=Color.RED),
        ),
    ],
)
def test_what_small_models_write_is_read_when_its_intent_is_unambiguous(
    output_type: object, reply: str, expected: object
) -> None:
    spec = OutputSpec.of(output_type)
    assert spec is not None
    assert spec.parse(reply) == (expected, None)


@pytest.mark.parametrize(
    ("output_type", "reply", "got"),
    [
        (float, "12%", '"12%"'),  # 12 or 0.12?
        (int, "about 700k", '"about 700k"'),
        (int, "1.2 million", '"1.2 million"'),
        (int, "3 and a half", '"3 and a half"'),  # not 3
        (int, "from 2–5", '"from 2–5"'),  # a range's dash is no minus sign
        (int, "10 minus 5", '"10 minus 5"'),
        (int, "Oslo had 709,000 people in 2023.", "Oslo had 709,000 people in 2023."),  # two numbers
        (Literal["yes", "no"], "No, the answer is yes.", '"No, the answer is yes."'),
        (Literal["yes", "no"], "Not yes.", '"Not yes."'),
        (City, '[{"name": "Oslo", "population": 1}, {"name": "Bergen", "population": 2}]', "[{"),
    ],
)
def test_what_is_ambiguous_is_not_guessed_and_the_model_is_shown_what_it_wrote(
    output_type: object, reply: str, got: str
) -> None:
    spec = OutputSpec.of(output_type)
    assert spec is not None
    value, problem = spec.parse(reply)
    assert value is None and problem is not None
    assert f"(got {got}" in problem or got in problem


def test_a_correction_says_what_was_wrong_and_shows_the_schema_and_the_shape_of_an_answer() -> None:
    spec = OutputSpec.of(City)
    assert spec is not None
    _, problem = spec.parse('{"name": "Oslo", "population": "lots"}')
    assert problem == (
        "the final answer does not match the required format: population: Input should be a valid integer, "
        'unable to parse string as an integer (got "lots"). Give the final answer again as JSON only (no other '
        "text), matching this JSON Schema: "
        + json.dumps(spec.schema, separators=(",", ":"))
        + '. Its shape: {"name": <string>, "population": <integer>} (put the real values in place of the <…>).'
    )
    _, problem = OutputSpec.of(Color).parse("blue")  # type: ignore[union-attr]
    assert 'Its shape: "red" or "green"' in (problem or "")


def test_a_cut_off_answer_and_an_echoed_schema_are_named_as_such() -> None:
    spec = OutputSpec.of(City)
    assert spec is not None
    _, cut = spec.parse('```json\n{"name": "Oslo", "population": 7')
    assert cut is not None and cut.startswith("the JSON in the final answer is cut off")
    schema = (
        '{"type": "object", "properties": {"name": {"type": "string"}, "population": {"type": "integer"}}}'
    )
    _, echoed = spec.parse(schema)
    assert (
        echoed is not None and "It repeats the JSON Schema instead of giving values that match it." in echoed
    )


def test_a_copied_placeholder_of_the_shape_is_not_an_answer() -> None:
    spec = OutputSpec.of(City)
    assert spec is not None
    value, problem = spec.parse('{"name": <string>, "population": 709000}')  # repaired into "string>"
    assert value is None and problem is not None and "placeholder" in problem


@pytest.mark.parametrize("reply", ["[" * 100_000 + "]" * 100_000, '{"a": ' * 50_000, "{" * 1000 + "'a'"])
def test_absurdly_nested_json_is_a_correction_not_a_crash(reply: str) -> None:
    spec = OutputSpec.of(City)
    assert spec is not None
    value, problem = spec.parse(reply)
    assert value is None and problem is not None and "Give the final answer again" in problem


async def test_a_react_model_is_told_to_put_the_json_after_final_answer_and_sees_its_label() -> None:
    """'JSON only' made the 0.5B model, whose reply starts with 'Thought:', drop the label: in ReAct the
    correction says where the JSON goes, and the rejected answer is shown as it was written, labelled."""
    model = ScriptedModel(
        [
            'Thought: I know it.\nFinal Answer: {"name": "Oslo"}',
            'Thought: Fixed.\nFinal Answer: {"name": "Oslo", "population": 709000}',
        ],
        tools=False,
    )
    result = await Agent(model, output_type=City).run("Oslo?")
    assert result.parsed == City(name="Oslo", population=709000)
    second = model.requests[1].messages
    assert second[-2].role == "assistant" and second[-2].content == 'Final Answer: {"name": "Oslo"}'
    assert "Give the final answer again as 'Final Answer:' followed by JSON only (no other text)" in (
        second[-1].content
    )
    native = ScriptedModel(['{"name": "Oslo"}', '{"name": "Oslo", "population": 709000}'])
    await Agent(native, output_type=City).run("Oslo?")
    again = native.requests[1].messages
    assert again[-2].content == '{"name": "Oslo"}'
    assert "Give the final answer again as JSON only (no other text)" in again[-1].content


async def test_json_inside_a_react_reasoning_block_is_not_the_answer() -> None:
    reply = '<think>The format is {"name": "x"}</think>\n{"name": "Oslo", "population": 709000}'
    model = ScriptedModel([reply, '{"name": "Z", "population": 1}'], tools=False)
    result = await Agent(model, output_type=City).run("Oslo?")
    assert result.parsed == OSLO and result.steps == 1


async def test_answers_that_never_validate_end_with_the_last_correction_and_the_raw_text() -> None:
    replies = ["about 700k", '{"name": "Oslo", "population": "about 700k"}', "Oslo: 700k", "Oslo!"]
    result = await Agent(ScriptedModel(replies), output_type=City).run("Oslo?")
    assert result.stop_reason is StopReason.ERROR and result.parsed is None and result.output == "Oslo!"
    assert result.error is not None and '(got "Oslo!")' in result.error
    assert "Its shape:" not in result.error and "Give the final answer again" not in result.error
    corrections = [m.content for m in result.state.messages if m.kind == "correction"]
    assert '(got "about 700k")' in corrections[1]  # each correction shows what that answer held


async def test_an_answer_with_half_an_emoji_escaped_is_read_as_valid_unicode() -> None:
    # `\ud83d` (a reply cut in the middle of an emoji's escape) read as a lone surrogate: the result and
    # the `done` event could not be written as JSON (the web page and the CLI send them).
    events: list[Event] = []
    model = ScriptedModel(['{"name": "Caf\\ud83d", "population": 2}'])
    result = await Agent(model, output_type=City).run("x", on_event=events.append)
    assert result.parsed == City(name="Caf\ufffd", population=2)
    result.model_dump_json()
    for event in events:
        event.model_dump_json()


async def test_answers_json_cannot_hold_are_asked_again_not_taken() -> None:
    class Data(BaseModel):
        data: object

    deep = '{"data": ' + "[" * 900 + "]" * 900 + "}"  # raised RecursionError out of run()
    script = [deep, '{"data": NaN}', '{"data": [1, 2]}']
    result = await Agent(ScriptedModel(script), output_type=Data).run("x")
    assert result.stop_reason is StopReason.FINAL_ANSWER and result.parsed == Data(data=[1, 2])
    corrections = [m.content for m in result.state.messages if m.kind == "correction"]
    assert len(corrections) == 2
