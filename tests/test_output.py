"""Structured output: `Agent(output_type=T)` — the schema in the prompt, lenient reading, validation,
healing of answers that do not validate, forced final answers, serialisation."""

from __future__ import annotations

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
    model = ScriptedModel([call("lookup", city="Oslo"), 'Here you go:\n```json\n{"name": "Oslo", "population": "709000"}\n```'])
    result = await Agent(model, tools=[lookup], output_type=City).run("How many people live in Oslo?")
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.parsed == City(name="Oslo", population=709000)
    system = model.requests[0].messages[0].content
    assert "JSON only" in system and '"population":{"title":"Population","type":"integer"}' in system


async def test_an_answer_that_does_not_validate_goes_back_to_the_model_with_the_errors() -> None:
    model = ScriptedModel(["Oslo has 709,000 people.", '{"name": "Oslo"}', '{"name": "Oslo", "population": 709000}'])
    result = await Agent(model, output_type=City).run("Oslo?")
    assert result.parsed == City(name="Oslo", population=709000) and result.stop_reason is StopReason.FINAL_ANSWER
    corrections = [m.content for m in result.state.messages if m.kind == "correction"]
    assert len(corrections) == 2
    assert "Input should be a valid dictionary or instance of City" in corrections[0]
    assert "population: Field required" in corrections[1]
    assert model.requests[2].messages[-1].content == corrections[1]  # the model saw what was wrong


async def test_answers_that_never_validate_end_the_run_with_error_and_keep_the_text() -> None:
    result = await Agent(FunctionModel(lambda r: "about 700k"), output_type=City).run("Oslo?")
    assert result.stop_reason is StopReason.ERROR and result.parsed is None
    assert result.output == "about 700k"
    assert result.error is not None and result.error.startswith("the final answer did not match the output type:")
    assert [m.kind for m in result.state.messages].count("correction") == 3


async def test_a_cut_off_object_is_never_completed_into_a_wrong_value() -> None:
    model = ScriptedModel(['{"name": "Oslo", "population": 7', '{"name": "Oslo", "population": 709000}'])
    result = await Agent(model, output_type=City).run("Oslo?")
    assert result.parsed == City(name="Oslo", population=709000)


async def test_the_forced_final_answer_asks_for_the_format_and_is_parsed_when_it_validates() -> None:
    replies = [call("lookup", city="Oslo"), call("lookup", city="Oslo "), '{"name": "Oslo", "population": 709000}']
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
    model = ScriptedModel(['Thought: I know it.\nFinal Answer: {"name": "Oslo", "population": 709000}'], tools=False)
    events: list[Event] = []
    result = await Agent(model, output_type=City).run("Oslo?", on_event=events.append)
    assert result.parsed == City(name="Oslo", population=709000)
    done = events[-1]
    assert isinstance(done, Done)
    data = json.loads(done.model_dump_json())
    assert data["result"]["parsed"] == {"name": "Oslo", "population": 709000}
    assert RunResult.model_validate_json(json.dumps(data["result"])).parsed == {"name": "Oslo", "population": 709000}


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
