"""Aids for small local models in text ReAct (docs/local-model.md), shown with scripted models."""

from __future__ import annotations

import json

from thinkloop import Agent, ModelRequest, tool
from thinkloop._react import list_orders
from thinkloop.testing import FunctionModel

FLIGHTS = {
    "cabin": "business",
    "flights": [
        {"flight": "LH 1120", "stops": 0, "price_eur": 642},
        {"flight": "IB 3401", "stops": 1, "price_eur": 498},
    ],
}


@tool
def search_flights(origin: str, destination: str) -> str:
    """Flights between two airports, as JSON."""
    return json.dumps(FLIGHTS)


async def test_a_list_of_records_is_shown_to_a_react_model_in_the_order_of_each_number() -> None:
    def reply(request: ModelRequest) -> str:
        if request.turn == 0:
            return 'Thought: search\nAction: search_flights\nAction Input: {"origin": "FRA", "destination": "MAD"}'
        seen = request.messages[-1].content  # the observation, as the model reads it
        cheapest = seen.split("price_eur, from lowest to highest: ", 1)[1].split(" (", 1)[0]
        return f"Final Answer: {cheapest}"

    model = FunctionModel(reply, tools=False)
    result = await Agent(model, tools=[search_flights]).run("Which business flight is the cheapest?")
    assert result.output == "IB 3401"  # not the first one listed
    observation = model.requests[1].messages[-1].content
    assert observation.endswith(
        "\n(flights by stops, from lowest to highest: LH 1120 (0), IB 3401 (1))"
        "\n(flights by price_eur, from lowest to highest: IB 3401 (498), LH 1120 (642))"
    )
    stored = [m.content for m in result.state.messages if m.role == "tool"]
    assert stored == [json.dumps(FLIGHTS)]  # the result itself is unchanged


def test_records_are_named_by_a_field_that_tells_them_apart_or_by_position() -> None:
    offices = [{"city": "Dublin", "staff": 131}, {"city": "Austin", "staff": 88}]
    assert (
        list_orders(json.dumps(offices))
        == "\n(items by staff, from lowest to highest: Austin (88), Dublin (131))"
    )
    same = [{"kind": "a", "n": 2}, {"kind": "a", "n": 1}, {"kind": "b", "n": None}]
    assert list_orders(json.dumps({"rows": same})) == "\n(rows by n, from lowest to highest: #2 (1), #1 (2))"


def test_no_order_line_for_what_is_not_a_list_of_records_with_different_numbers() -> None:
    assert list_orders('{"warehouse": "Bolt", "capacity_pallets": 8000}') == ""  # one record
    assert list_orders('{"rows": [{"n": 1}]}') == ""  # one item
    assert list_orders('{"rows": [{"n": 1}, {"n": 1}]}') == ""  # nothing to order
    assert list_orders('{"rows": [1, 2, 3]}') == ""  # not records
    assert list_orders('{"rows": [{"ok": true}, {"ok": false}]}') == ""  # booleans are not numbers
    assert list_orders("3 items, total 6.65 kg") == ""
    assert list_orders("[not json") == ""
    assert list_orders(json.dumps([{"n": i} for i in range(13)])) == ""  # too long to list


async def test_order_lines_only_when_the_task_ranks_and_records_named_by_their_title() -> None:
    """Suite C's borrowable_now, seed 0: after `search_catalogue` listed two books, the line ordering them
    by copies (labelled by ISBN) made the 1.5B model answer with one, "the highest number of copies", for
    a task that asked which books can be borrowed. The lines are for tasks that rank or compare."""
    books = [
        {"isbn": "978-0-306-40615-7", "title": "A Map of Quiet Rivers", "copies_available": 3},
        {"isbn": "978-0-7432-7356-5", "title": "Winter at Vell Point", "copies_available": 1},
    ]

    @tool
    def search_catalogue(query: str) -> list[dict[str, object]]:
        """Search the library catalogue."""
        return books

    def reply(request: ModelRequest) -> str:
        if request.turn == 0:
            return 'Thought: search\nAction: search_catalogue\nAction Input: {"query": "Tomas Reyes"}'
        return "Final Answer: A Map of Quiet Rivers and Winter at Vell Point."

    seen = []
    for goal in (
        "Which books by Tomas Reyes can I borrow right now?",
        "Which Tomas Reyes book has the most copies?",
    ):
        model = FunctionModel(reply, tools=False)
        await Agent(model, tools=[search_catalogue]).run(goal)
        seen.append(model.requests[1].messages[-1].content)
    assert seen[0] == f"Observation: {json.dumps(books)}"
    assert seen[1].endswith(
        "\n(items by copies_available, from lowest to highest: Winter at Vell Point (1), A Map of Quiet Rivers (3))"
    )


SITE = {
    "site": "Hamburg",
    "zones": [
        {
            "zone": "A",
            "bins": [
                {"bin": "A-01", "sku": "BOLT-M6", "qty": 1200},
                {"bin": "A-02", "sku": "NUT-M6", "qty": 3400},
            ],
        },
        {
            "zone": "B",
            "bins": [
                {"bin": "B-07", "sku": "BOLT-M6", "qty": 850},
                {"bin": "B-09", "sku": "HINGE-H40", "qty": 35},
            ],
        },
    ],
}


async def test_records_inside_records_are_shown_one_a_line_after_the_records_they_are_in() -> None:
    """Suite C's bolts_total, seed 0: reading the nested JSON, the 1.5B model added up every quantity of
    the site (`1200 + 3400 + 850 + 35 + 5000`) for "how many M6 bolts across all bins"."""

    @tool
    def site_stock(site: str) -> dict[str, object]:
        """Stock by zone and bin."""
        return SITE

    def reply(request: ModelRequest) -> str:
        if request.turn == 0:
            return 'Thought: stock\nAction: site_stock\nAction Input: {"site": "Hamburg"}'
        return "Final Answer: 2050"

    model = FunctionModel(reply, tools=False)
    result = await Agent(model, tools=[site_stock]).run("How many M6 bolts are there across all bins?")
    assert model.requests[1].messages[-1].content == (
        f"Observation: {json.dumps(SITE)}\n(the bins, one a line:\nzone A: bin A-01, sku BOLT-M6, qty 1200\n"
        "zone A: bin A-02, sku NUT-M6, qty 3400\nzone B: bin B-07, sku BOLT-M6, qty 850\n"
        "zone B: bin B-09, sku HINGE-H40, qty 35)"
    )
    assert [m.content for m in result.state.messages if m.role == "tool"] == [json.dumps(SITE)]  # unchanged


def test_no_rows_for_records_that_hold_no_records() -> None:
    from thinkloop._react import nested_rows

    assert nested_rows(json.dumps({"loans": [{"title": "a", "due": "2026-12-03"}, {"title": "b"}]})) == ""
    assert nested_rows(json.dumps({"offices": [{"city": "Dublin", "address": {"street": "x"}}]})) == ""
    assert nested_rows("[not json") == nested_rows("3 items") == ""
