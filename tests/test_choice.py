"""The choice between options a task names, checked against what separate tool calls gave each option
(`thinkloop._choice`), replaying the 1.5B model's wrong picks of benchmarks/local_tasks_c.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from thinkloop import Agent, Budget, tool
from thinkloop._choice import Call, choice_check, righted_choice
from thinkloop.testing import ScriptedModel

PARCELS = [
    Call("parcel_rate", {"carrier": "swiftpost", "weight_kg": 4}, '{"carrier": "swiftpost", "weight_kg": 4.0, '
         '"service": "standard", "price_eur": 9.09}'),
    Call("parcel_rate", {"carrier": "parcelo", "weight_kg": 4}, '{"carrier": "parcelo", "weight_kg": 4.0, '
         '"service": "standard", "price_eur": 9.39}'),
]  # fmt: skip
PARCEL_GOAL = "Is it cheaper to send a 4 kg parcel with Swiftpost or with Parcelo, and by how much?"
HOURS = [
    Call("branch_hours", {"branch": "Riverside", "day": "sunday"},
         '{"branch": "Riverside", "day": "sunday", "opens": "12:00", "closes": "17:00"}'),
    Call("branch_hours", {"branch": "Old Town", "day": "sunday"},
         '{"branch": "Old Town", "day": "sunday", "opens": "10:00", "closes": "16:00"}'),
]  # fmt: skip
HOURS_GOAL = "Which library branch opens earlier on Sunday, Riverside or Old Town?"


def test_the_wrong_option_of_two_json_results_is_named_with_both_values() -> None:
    wrong = "It is cheaper to send a 4 kg parcel with Parcelo, and by 0.30 euros."
    assert choice_check(wrong, PARCEL_GOAL, PARCELS) == (
        "The Final Answer picks Parcelo, but the observations give each option (price_eur): Swiftpost 9.09, "
        "Parcelo 9.39. So Swiftpost is the cheaper one. Correct the answer."
    )
    assert choice_check("Swiftpost is cheaper, by 0.30 EUR.", PARCEL_GOAL, PARCELS) is None
    assert choice_check("Parcelo is more expensive than Swiftpost by 0.30.", PARCEL_GOAL, PARCELS) is None
    assert choice_check("Swiftpost is more expensive than Parcelo.", PARCEL_GOAL, PARCELS) is not None


def test_the_pick_is_put_right_where_it_is_the_subject_of_the_comparison() -> None:
    assert (
        righted_choice("Parcelo is cheaper, by 0.30.", PARCEL_GOAL, PARCELS)
        == "Swiftpost is cheaper, by 0.30."
    )
    both = "Riverside opens earlier on Sunday than Old Town."
    assert righted_choice(both, HOURS_GOAL, HOURS) == "Old Town opens earlier on Sunday than Riverside."
    twice = "Parcelo: 9.39. Parcelo is cheaper."  # named twice, alone: where is the pick? left as it is
    assert righted_choice(twice, PARCEL_GOAL, PARCELS) == twice
    bare = '{"carrier": "parcelo", "price_eur": 9.39}'  # no comparison written: nothing to put right
    assert righted_choice(bare, PARCEL_GOAL, PARCELS) == bare


def test_times_are_compared_and_the_field_is_the_one_the_task_names() -> None:
    """Two fields differ (opens, closes): "opens earlier" names the one."""
    wrong = "Riverside opens earlier on Sunday than Old Town. Therefore, the answer is Riverside."
    correction = choice_check(wrong, HOURS_GOAL, HOURS)
    assert (
        correction is not None
        and "(opens): Riverside 12:00, Old Town 10:00. So Old Town is the earlier" in correction
    )
    assert choice_check("Old Town opens earlier (10:00) than Riverside (12:00).", HOURS_GOAL, HOURS) is None
    assert choice_check("Which closes earlier, Riverside or Old Town?", HOURS_GOAL, HOURS) is None  # no pick
    closes = "Which branch closes later on Sunday, Riverside or Old Town?"
    assert choice_check("Old Town closes later.", closes, HOURS) is not None
    assert choice_check("Riverside closes later.", closes, HOURS) is None


@pytest.mark.parametrize(
    ("answer", "goal", "calls"),
    [
        ("Parcelo.", "What does a parcel cost with Swiftpost and with Parcelo?", PARCELS),  # no comparative
        ("Parcelo is not cheaper.", PARCEL_GOAL, PARCELS),  # negated
        ("Parcelo.", "Which is cheaper, Swiftpost or Boxline?", PARCELS),  # an option never called
        ("Riverside.", "Which branch opens earlier, Riverside or Old Town?", HOURS[:1]),  # one option called
        ("Riverside.", "Which is earlier, Riverside or Old Town?", HOURS),  # opens or closes?
        ("Parcelo.", PARCEL_GOAL, [PARCELS[0], Call("parcel_rate", {"carrier": "parcelo"}, "9.09 EUR")]),
    ],
)
def test_anything_unsure_is_no_correction(answer: str, goal: str, calls: list[Call]) -> None:
    assert choice_check(answer, goal, calls) is None


def test_text_results_with_one_number_each() -> None:
    prices = [Call("unit_price", {"item": "gizmo"}, "gizmo: 19.99 EUR"),
              Call("unit_price", {"item": "widget"}, "widget: 12.75 EUR")]  # fmt: skip
    goal = "Which is cheaper, a gizmo or a widget?"
    assert choice_check("The gizmo is the cheaper item.", goal, prices) is not None
    assert choice_check("The widget.", goal, prices) is None
    weather = [Call("weather", {"city": "Madrid"}, "Madrid: 19 °C, sunny, wind 8 km/h"),
               Call("weather", {"city": "Berlin"}, "Berlin: 7 °C, overcast, wind 15 km/h")]  # fmt: skip
    assert choice_check("Berlin.", "Which city is warmer, Madrid or Berlin?", weather) is None  # two numbers


@tool
def parcel_rate(carrier: str, weight_kg: float) -> dict[str, Any]:
    """The price of sending one parcel with a carrier."""
    price = {"swiftpost": 5.49 + 0.9 * weight_kg, "parcelo": 4.99 + 1.1 * weight_kg}[carrier]
    return {"carrier": carrier, "weight_kg": weight_kg, "service": "standard", "price_eur": round(price, 2)}


def _lookup(carrier: str) -> str:
    args = json.dumps({"carrier": carrier, "weight_kg": 4})
    return f"Thought: I need the price with {carrier}.\nAction: parcel_rate\nAction Input: {args}"


async def test_the_run_sends_the_wrong_pick_back_once_with_the_values() -> None:
    """The 1.5B model's replies of suite C's parcel_compare, seed 0: both prices read right, the dearer
    carrier picked. Told the values once, it answers again; a second wrong pick stands."""
    wrong = (
        "Thought: Swiftpost costs 9.09 euros, and Parcelo costs 9.39 euros. The difference is 9.39 - 9.09 = 0.30 "
        "euros.\nFinal Answer: It is cheaper to send a 4 kg parcel with Parcelo, and by 0.30 euros."
    )
    right = "Thought: Swiftpost is cheaper.\nFinal Answer: Swiftpost is cheaper, by 0.30 euros."
    model = ScriptedModel([_lookup("swiftpost"), _lookup("parcelo"), wrong, right])
    result = await Agent(model, tools=[parcel_rate]).run(PARCEL_GOAL)
    assert result.output == "Swiftpost is cheaper, by 0.30 euros."
    (correction,) = [m.content for m in result.state.messages if m.kind == "correction"]
    assert correction.startswith("The Final Answer picks Parcelo, but the observations give each option")
    assert correction.endswith(f"The task: {PARCEL_GOAL}")

    stubborn = ScriptedModel([_lookup("swiftpost"), _lookup("parcelo"), wrong, wrong])
    result = await Agent(stubborn, tools=[parcel_rate]).run(PARCEL_GOAL)
    assert (
        result.output == "It is cheaper to send a 4 kg parcel with Swiftpost, and by 0.30 euros."
    )  # put right
    # the after-run of the same task: told, the model looked both prices up again until the step limit, and
    # the forced answer picked Parcelo again, after listing both prices
    forced = (
        "The price of sending a 4 kg parcel with Swiftpost is 9.09 euros, and the price of sending the same "
        "parcel with Parcelo is 9.39 euros. Therefore, Parcelo is cheaper by 0.30 euros."
    )
    again = [_lookup("swiftpost"), _lookup("parcelo")]
    looping = ScriptedModel([*again, wrong, *again, forced])
    result = await Agent(looping, tools=[parcel_rate], budget=Budget(max_steps=5)).run(PARCEL_GOAL)
    assert result.forced_final
    assert result.output.endswith("9.39 euros. Therefore, Swiftpost is cheaper by 0.30 euros.")
    native = ScriptedModel(
        [
            {"tool_calls": [{"name": "parcel_rate", "args": {"carrier": c, "weight_kg": 4}}]}
            for c in ("swiftpost", "parcelo")
        ]
        + ["Parcelo is cheaper."],
        tools=True,
    )
    result = await Agent(native, tools=[parcel_rate]).run(PARCEL_GOAL)  # answer checks are off in native mode
    assert result.output == "Parcelo is cheaper."
