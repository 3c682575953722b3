"""The calculator tool: percentages as people write them, and a description small models can copy."""

from __future__ import annotations

import pytest

from thinkloop.tools.calculator import calculator, evaluate, format_number


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("86.4 * 15%", "12.96"),
        ("15% of 86.4", "12.96"),
        ("15 % OF 86.4", "12.96"),
        ("19.99 * (1 - 15%)", "16.9915"),
        ("50%", "0.5"),
        ("(12.5%) * 8", "1"),
        ("10 % 3", "1"),  # a remainder, not a percentage: an operand follows
        ("10 %3", "1"),
        ("10 % (4)", "2"),
    ],
)
def test_a_percent_sign_after_a_number_with_no_operand_after_it_means_hundredths(
    expr: str, expected: str
) -> None:
    assert format_number(evaluate(expr)) == expected


def test_the_description_shows_parentheses_and_a_percentage_but_no_task_like_expression() -> None:
    description = calculator.description
    assert "keeping its parentheses" in description and "'(2 + 3) * 4'" in description
    assert format_number(evaluate("15% of 80")) == "12"  # the example in the description works
    assert "17*23+4" not in description  # a small model copied the example instead of its own task
