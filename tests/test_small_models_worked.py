"""Aids for small local models in text ReAct (docs/local-model.md, benchmarks/README.md "Eleventh session"):
arithmetic worked out in the reply or in the head, and the form the task asks for. Shown with scripted
models."""

from __future__ import annotations

import pytest

from thinkloop import Agent, Budget, ConfigurationError, GuardConfig, ModelRequest, tool
from thinkloop._react import (
    corrected_arithmetic,
    requested_form,
    unsourced_numbers,
    worked_arithmetic,
)
from thinkloop.testing import FunctionModel, ScriptedModel

PRICES = {"gizmo": "gizmo: 19.99 EUR", "widget": "widget: 12.75 EUR"}


@tool
def unit_price(item: str) -> str:
    """The unit price in EUR of a catalogue item."""
    return PRICES[item]


@tool
def exchange_rate(base: str, quote: str) -> str:
    """How many units of `quote` one unit of `base` buys."""
    return "1 USD = 151.2 JPY"


def price(item: str) -> str:
    return f'Thought: price\nAction: unit_price\nAction Input: {{"item": "{item}"}}'


def corrections(result) -> list[str]:  # type: ignore[no-untyped-def]
    return [m.content for m in result.state.messages if m.kind == "correction"]


# ------------------------------------------------------------------------------- arithmetic in the reply


async def test_arithmetic_done_right_from_looked_up_values_is_not_corrected() -> None:
    answer = "Thought: 19.99 - 12.75 = 7.24 EUR.\nFinal Answer: The widget is cheaper, by 7.24 EUR."
    model = ScriptedModel([price("gizmo"), price("widget"), answer], tools=False)
    result = await Agent(model, tools=[unit_price]).run(
        "Which is cheaper, a gizmo or a widget, and by how much?"
    )
    assert result.output == "The widget is cheaper, by 7.24 EUR."
    assert corrections(result) == [] and result.usage.requests == 3


async def test_a_wrong_computation_of_looked_up_values_is_put_right_in_the_answer() -> None:
    call = 'Thought: rate\nAction: exchange_rate\nAction Input: {"base": "USD", "quote": "JPY"}'
    wrong = "Thought: 250 * 151.2 JPY = 37760 JPY\nFinal Answer: I get 37760 JPY."
    model = ScriptedModel([call, wrong], tools=False)
    result = await Agent(model, tools=[exchange_rate]).run("How many yen do I get for 250 US dollars?")
    assert result.output == "I get 37800 JPY."  # 250 * 151.2, by the calculator
    assert corrections(result) == [] and result.usage.requests == 2


def test_only_a_computation_of_sourced_numbers_is_put_right() -> None:
    sources = ["How many yen for 250 dollars?", "1 USD = 151.2 JPY"]
    assert (
        corrected_arithmetic("37760 JPY, not 377600", "250 * 151.2 = 37760", sources)
        == "37800 JPY, not 377600"
    )
    assert corrected_arithmetic("3000 JPY", "20 * 151 = 3000", sources) == "3000 JPY"  # 151 and 20: no one's
    assert corrected_arithmetic("37800 JPY", "250 * 151.2 = 37800", sources) == "37800 JPY"


@pytest.mark.parametrize(
    ("answer", "work", "missing"),
    [
        ("Madrid is warmer, by 12 °C.", "", []),  # 19 - 7: one operation on two results
        ("The tip is 12.96 EUR.", "", []),  # 15 % (the task's) of 86.40 (a result's)
        ("Made 16 in all.", "", ["16"]),  # 15 + 1: the task's own numbers, no result's
        ("13 °C on average.", "(19 + 7) / 2 = 13", []),  # written out, from sourced operands
        ("13 °C on average.", "", ["13"]),  # not one operation: 86.4 * 15 / 100 = 12.96 is not 13
        ("Together 30.00 EUR.", "3 x 10.00 EUR = 30.00 EUR", ["30.00"]),  # 10.00 comes from nowhere
        ("Together 14 EUR.", "10 + 4 = 14", ["14"]),  # small numbers, but none of them sourced
    ],
)
def test_numbers_worked_out_from_sourced_numbers_are_sourced(
    answer: str, work: str, missing: list[str]
) -> None:
    sources = ["What is a 15% tip on 1 bill?", "bill: 86.40 EUR", "Madrid: 19 °C", "Berlin: 7 °C"]
    assert unsourced_numbers(answer, sources, work) == missing


def test_dates_and_unsourced_operands_are_no_checked_arithmetic() -> None:
    assert worked_arithmetic("2026-03-27 - 2026-03-20 = 7", ["2026-03-27", "2026-03-20"]) == []
    (worked,) = worked_arithmetic("(45 + 19) * 3 - 7 = 185", [])
    assert worked.value == 185 and worked.right and not worked.sourced  # 45 and 19 are no one's


async def test_a_forced_answer_with_a_wrong_computation_is_put_right() -> None:
    call = 'Thought: rate\nAction: exchange_rate\nAction Input: {"base": "USD", "quote": "EUR"}'

    def reply(request: ModelRequest) -> str:
        if any(m.kind == "final_prompt" for m in request.messages):
            return "250 * 151.2 = 37760, so 37760 yen."
        return call  # again and again: the guards stop the run

    model = FunctionModel(reply, tools=False)
    result = await Agent(model, tools=[exchange_rate], budget=Budget(max_steps=3)).run("Yen for 250 dollars?")
    assert result.forced_final and result.output == "250 * 151.2 = 37800, so 37800 yen."
    assert result.usage.requests == 4  # the right result is sourced: not asked again


# ------------------------------------------------------------------------------ the form the task asks for


@pytest.mark.parametrize(
    ("answer", "goal", "formed"),
    [
        ("The Dublin office has 131 staff.", "How many staff? Answer with just the number.", "131"),
        ("Over the last 3 months: 19,998.", "The mean of the last 3 months? Give just the number.", "19,998"),
        (
            "131 staff, 46 in Singapore.",
            "How many staff? Answer with just the number.",
            "131 staff, 46 in Singapore.",
        ),
        ("Yes, it is a Saturday.", "Is it a Saturday? Answer only yes or no.", "Yes"),
        ("It is not a Saturday: no.", "Is it a Saturday? Answer only yes or no.", "No"),
        ("Yes and no.", "Is it a Saturday? Answer only yes or no.", "Yes and no."),
        (
            "The Dublin office has 131 staff.",
            "How many staff work in Dublin?",
            "The Dublin office has 131 staff.",
        ),
    ],
)
def test_an_answer_is_given_in_the_form_the_task_asks_for_when_that_is_unambiguous(
    answer: str, goal: str, formed: str
) -> None:
    assert requested_form(answer, goal) == formed


@pytest.mark.parametrize(
    ("answer", "kept"),
    [
        ("Turin is 212 km from Lyon: that answers the task.", "Turin is 212 km from Lyon."),
        ("The total is 42. That answers the task.", "The total is 42."),
        ("Paris is the capital, which answers the question", "Paris is the capital."),
        ("That answers the task.", "That answers the task."),  # nothing else to keep
        ("The final answer is: gizmo costs 19.99 EUR.", "gizmo costs 19.99 EUR."),  # the lead of a Thought
        ("This answers the task partially: 3 of 5 found.", "This answers the task partially: 3 of 5 found."),
    ],
)
def test_the_format_examples_closing_words_copied_into_an_answer_are_left_out(answer: str, kept: str) -> None:
    """The 1.5B model ended answers with the worked example's "that answers the task."."""
    assert requested_form(answer, "How far is it?") == kept


async def test_a_react_answer_is_reduced_to_the_number_the_task_asks_for() -> None:
    model = ScriptedModel(["Final Answer: The Dublin office has 131 staff."], tools=False)
    result = await Agent(model, tools=[unit_price]).run("How many staff? Answer with just the number.")
    assert result.output == "131"


@pytest.mark.parametrize(
    ("answer", "missing"),
    [
        ("The temperature in Cairo is 87.8 °F.", []),  # 31 °C, converted right in the head
        ("It is about 88 degrees Fahrenheit.", []),  # rounded
        ("It is 304.15 K in Cairo.", []),
        ("It is 90 °F.", ["90"]),  # converted wrong
        ("It is 87.8 km.", ["87.8"]),  # the number of a conversion, but not in its unit
        ("26.2 miles is 42.16 kilometres.", []),
        ("That is 42.18 km.", []),  # 26.2 * 1.61: a factor rounded to three figures
        ("That is 41.9 km.", ["41.9"]),  # 26.2 * 1.6: too far off
        ("The parcel weighs 11.0 lbs.", []),  # 5 kg
        ("The parcel weighs 5,000 grams.", []),
        ("Wind of 2.78 m/s.", []),  # 10 km/h
    ],
)
def test_a_quantity_of_a_result_converted_in_the_head_is_sourced(answer: str, missing: list[str]) -> None:
    sources = [
        "What is the temperature in Cairo?",
        "Cairo: 31 °C, clear, wind 10 km/h",
        "A marathon is 26.2 miles; the parcel weighs 5 kg",
    ]
    assert unsourced_numbers(answer, sources) == missing


# ------------------------------------------------------------------- switching the answer checks on and off


def native_price(item: str) -> dict[str, object]:
    return {"tool_calls": [{"name": "unit_price", "args": {"item": item}}]}


async def test_answer_checks_apply_to_native_tool_calling_when_asked_for() -> None:
    """A small model behind an OpenAI-compatible server calls tools natively: `answer_checks=True` gives
    its final answers the checks text ReAct has (here: a number no result gives, asked about once)."""
    replies = [native_price("gizmo"), "A gizmo costs 21.99 EUR.", "A gizmo costs 19.99 EUR."]
    checked = await Agent(
        ScriptedModel(replies), tools=[unit_price], guards=GuardConfig(answer_checks=True)
    ).run("What does a gizmo cost?")
    assert checked.output == "A gizmo costs 19.99 EUR." and checked.usage.requests == 3
    (correction,) = corrections(checked)
    assert "21.99" in correction and "What does a gizmo cost?" in correction
    assert "Action Input" not in correction  # native: no ReAct lines
    default = await Agent(ScriptedModel(replies), tools=[unit_price]).run("What does a gizmo cost?")
    assert default.output == "A gizmo costs 21.99 EUR." and default.usage.requests == 2  # native: unchecked


async def test_answer_checks_put_native_arithmetic_right_and_form_the_answer() -> None:
    replies = [
        native_price("gizmo"),
        native_price("widget"),
        "19.99 - 12.75 = 7.34, so the widget is cheaper by 7.34 EUR.",
    ]
    result = await Agent(
        ScriptedModel(replies), tools=[unit_price], guards=GuardConfig(answer_checks=True)
    ).run("Which is cheaper, a gizmo or a widget, and by how much?")
    assert result.output == "19.99 - 12.75 = 7.24, so the widget is cheaper by 7.24 EUR."
    assert corrections(result) == []
    formed = await Agent(
        ScriptedModel([native_price("gizmo"), "The gizmo costs 19.99 EUR."]),
        tools=[unit_price],
        guards=GuardConfig(answer_checks=True),
    ).run("What does a gizmo cost? Answer with just the number.")
    assert formed.output == "19.99"


async def test_answer_checks_can_be_turned_off_in_react() -> None:
    replies = [price("gizmo"), "Final Answer: A gizmo costs 21.99 EUR."]
    result = await Agent(
        ScriptedModel(replies, tools=False), tools=[unit_price], guards=GuardConfig(answer_checks=False)
    ).run("What does a gizmo cost? Answer with just the number.")
    assert result.output == "A gizmo costs 21.99 EUR." and corrections(result) == []


async def test_a_forced_native_answer_is_rechecked_only_when_answer_checks_are_on() -> None:
    def reply(request: ModelRequest) -> object:
        if any(m.kind == "final_prompt" for m in request.messages):
            corrected = any(m.kind == "correction" for m in request.messages)
            return "A gizmo costs 19.99 EUR." if corrected else "A gizmo costs 23.50 EUR."
        return native_price("gizmo")  # again and again: the guards stop the run

    for checks, output, requests in (
        (True, "A gizmo costs 19.99 EUR.", 4),
        (None, "A gizmo costs 23.50 EUR.", 3),
    ):
        result = await Agent(
            FunctionModel(reply),
            tools=[unit_price],
            budget=Budget(max_steps=2),
            guards=GuardConfig(answer_checks=checks),
        ).run("What does a gizmo cost?")
        assert result.forced_final and result.output == output
        assert result.usage.requests == requests


@pytest.mark.parametrize("bad", [1, 0, "yes", "react"])
def test_answer_checks_must_be_none_true_or_false(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="answer_checks must be None, True or False"):
        GuardConfig(answer_checks=bad)  # type: ignore[arg-type]


def test_a_percentage_off_or_on_is_checked_as_a_shop_reads_it() -> None:
    """`200 - 15% = 170` is right (15 % off 200); it was "corrected" to 199.85, a right answer made wrong."""
    sources = ["What does the jacket cost after the discount?", "price: $200, discount: 15%"]
    assert corrected_arithmetic("It costs $170.", "200 - 15% = 170", sources) == "It costs $170."
    assert corrected_arithmetic("With tax: 230.", "200 + 15% = 230", sources) == "With tax: 230."
    assert corrected_arithmetic("It costs $180.", "200 - 15% = 180", sources) == "It costs $170."


def test_a_wrong_result_that_a_source_gives_too_is_left_alone() -> None:
    """Replacing it would change the answer's copy of that source's value (an order number) too."""
    sources = ["What does order 160 cost?", "order 160: 100 units at 1.5 EUR"]
    answer = "Order 160 costs 160 EUR."
    assert corrected_arithmetic(answer, "100 * 1.5 = 160", sources) == answer
    assert corrected_arithmetic("It costs 155 EUR.", "100 * 1.5 = 155", sources) == "It costs 150 EUR."
