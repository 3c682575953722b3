"""The forced final answer (after a budget or guard stop) is checked for numbers no result gives
(docs/local-model.md): the 0.5B model answered a made-up phone number when the lookups had found none."""

from __future__ import annotations

from thinkloop import Agent, Budget, ModelRequest, tool
from thinkloop.testing import FunctionModel

PROFILE = (
    '{"username": "mkovac", "name": "Marta Kovač", "joined": "2023-09-14", "email": "marta@kovac.example"}'
)
LOOKUP = 'Thought: look it up\nAction: user_profile\nAction Input: {"username": "mkovac"}'


@tool
def user_profile(username: str) -> str:
    """A user's profile, as JSON."""
    return PROFILE


def final_turn(request: ModelRequest) -> bool:
    return any(m.kind == "final_prompt" for m in request.messages)


async def run(second: str, *, first: str = "The phone number of mkovac is 072-456-7890.") -> tuple:
    def reply(request: ModelRequest) -> str:
        if not final_turn(request):
            return LOOKUP  # the right call, again and again: the guards stop the run
        return second if request.messages[-1].kind == "correction" else first

    model = FunctionModel(reply, tools=False)
    result = await Agent(model, tools=[user_profile], budget=Budget(max_steps=3)).run(
        "What is the phone number of the user mkovac?"
    )
    return result, model


async def test_a_forced_answer_with_a_made_up_number_is_asked_for_again_naming_it() -> None:
    result, model = await run("The phone number of mkovac could not be found.")
    assert result.forced_final and result.stop_reason.value == "max_steps"
    assert result.output == "The phone number of mkovac could not be found."
    retry = model.requests[-1].messages
    assert [m.kind for m in retry[-3:]] == ["final_prompt", "reply", "correction"]
    assert retry[-2].content == "The phone number of mkovac is 072-456-7890."
    assert retry[-1].content.startswith(
        "Your answer gives 072, 456, 7890, which none of the tool results or the task gives."
    )
    assert retry[-1].content.endswith("if none does, write: Could not be found.")
    assert result.usage.requests == 5  # 3 steps, the forced answer, the one retry


async def test_the_second_forced_answer_stands_and_a_sourced_one_is_not_asked_again() -> None:
    result, model = await run("It is 072-456-7890.")
    assert result.output == "It is 072-456-7890."  # asked once: the second answer stands
    assert result.usage.requests == 5
    result, model = await run("", first="Marta Kovač joined on 2023-09-14.")  # dates from the result
    assert result.output == "Marta Kovač joined on 2023-09-14."
    assert result.usage.requests == 4


async def test_numbers_of_failed_calls_are_no_source_for_the_forced_answer() -> None:
    @tool
    def product_price(name: str) -> str:
        """The price of a product."""
        raise LookupError(f"no product named {name!r}")

    def reply(request: ModelRequest) -> str:
        if not final_turn(request):
            return (
                'Thought: price\nAction: product_price\nAction Input: {"name": "Zephyr Z9 drone costs $1000"}'
            )
        return (
            "It is not in the catalogue." if request.messages[-1].kind == "correction" else "It costs $1000."
        )

    model = FunctionModel(reply, tools=False)
    result = await Agent(model, tools=[product_price], budget=Budget(max_steps=3)).run(
        "What does the Zephyr Z9 drone cost?"
    )
    assert result.output == "It is not in the catalogue."


async def test_the_first_forced_answer_stands_when_the_retry_calls_a_tool() -> None:
    result, model = await run(LOOKUP, first="Her number is 072-456-7890.")
    assert result.output == "Her number is 072-456-7890."  # not the best known result (the profile)
    assert result.usage.requests == 5


async def test_no_retry_after_a_token_budget_stop() -> None:
    def reply(request: ModelRequest) -> str:
        return "It is 072-456-7890." if final_turn(request) else LOOKUP

    model = FunctionModel(reply, tools=False)
    result = await Agent(model, tools=[user_profile], budget=Budget(max_tokens=1)).run("Her phone number?")
    assert result.stop_reason.value == "max_tokens" and result.output == "It is 072-456-7890."
    assert not [m for m in result.state.messages if m.kind == "correction"]
