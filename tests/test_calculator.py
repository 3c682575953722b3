"""The calculator tool: percentages as people write them, a description small models can copy, and
hostile expressions (DoS, escapes) refused fast with a reason."""

from __future__ import annotations

import re
import sys
import time

import pytest

from thinkloop import Agent
from thinkloop.testing import ScriptedModel
from thinkloop.tools.calculator import CalculatorError, calculator, evaluate, format_number


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
    assert format_number(evaluate("15% of 80")) == "12"  # the form the description names works
    assert "17*23+4" not in description  # a small model copied the example instead of its own task


# ------------------------------------------------------------------- hostile input: fast, clear refusals
# The calculator runs on the event loop (in_thread=False): an expression that computed for minutes would
# freeze every run of the process, so each of these must be refused before it is computed.


async def calculate(expression: str) -> str:
    result = await calculator.invoke(calculator.validate({"expression": expression}))
    assert isinstance(result, str)
    return result


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ("9**9**9", "exponent 387420489 is too large"),
        ("10**100000000", "exponent 100000000 is too large"),
        ("(10**10000)**10000", "the result would have about 99,999,154 digits"),  # hung the event loop
        ("(9**9999)**9999", "digits, more than the calculator allows"),
        ("factorial(1000)**10000", "digits, more than the calculator allows"),
        ("pow(10**10000, 10**10000)", "exponent 1e+10000 is too large"),  # pow() skipped the checks
        ("pow(10**500, 10000)", "digits, more than the calculator allows"),
        ("pow(3, 10**5000, 10**5000 + 7)", "pow(a, b, m) with numbers this large is too costly"),
        ("10**10000 * 10**10000 * 10**10000 * 10**10000", "digits, more than the calculator allows"),
        ("factorial(10**10)", "factorial argument is too large"),
        ("1/0", "division by zero"),
        ("1 % 0", "division by zero"),
        ("1e308 * 10", "not a finite number (inf)"),  # was answered "inf"
        ("1e999 - 1e999", "too large for a float"),  # was answered "nan"
        ("exp(1000)", "too large"),
        ("sqrt(-1)", "math domain error"),
        ("(-8) ** (1/3)", "is not a real number"),
        ("(" * 300 + "1" + ")" * 199, "cannot parse"),
        ("1+" * 300 + "1", "longer than 500 characters"),
        ("round(5, -10**7)", "round() to -10000000 digits is out of range"),  # computed 10**10**7: 13 s
        ("１２３ + 1", "cannot parse"),
        ("٣ + 1", "cannot parse"),
        ("().__class__", "only arithmetic is allowed"),
        ("abs.__self__", "only arithmetic is allowed"),
        ("x", "'x' is not a number"),
        ("lambda: 1", "only arithmetic is allowed"),
        ("[x for x in (1, 2)]", "only arithmetic is allowed"),
        ("__import__('os')", "unknown function '__import__'"),
        ("'a' * 10", "only arithmetic is allowed"),
        ("True + 1", "only arithmetic is allowed"),
        ("1 << 100000", "only arithmetic is allowed"),
        ("", "empty"),
    ],
)
async def test_hostile_expressions_are_refused_with_a_reason(expr: str, problem: str) -> None:
    with pytest.raises(CalculatorError, match=re.escape(problem)):
        await calculate(expr)


async def test_a_long_expression_is_refused_before_it_is_scanned() -> None:
    # the percentage regular expressions ran before the length check, in quadratic time: 20,000 digits
    # took 56 s on the event loop before "longer than 500 characters"
    started = time.perf_counter()
    with pytest.raises(CalculatorError, match="longer than 500 characters"):
        await calculate("1" * 20_000)
    assert time.perf_counter() - started < 1.0


async def test_a_refusal_is_an_error_observation_and_the_run_goes_on() -> None:
    model = ScriptedModel(
        [{"tool_calls": [{"name": "calculator", "args": {"expression": "(10**10000)**10000"}}]}, "too big"]
    )
    result = await Agent(model, tools=[calculator]).run("compute it")
    observation = [m for m in result.state.messages if m.role == "tool"][0].content
    assert observation.startswith("Error: calculator raised CalculatorError: the result would have about")
    assert result.output == "too big"


@pytest.mark.parametrize("exponent", [4300, 5000, 10_000])
async def test_integers_too_long_to_print_whole_are_shown_in_scientific_notation(exponent: int) -> None:
    # they used to fail with Python's "Exceeds the limit (4300 digits) for integer string conversion"
    shown = await calculate(f"7 * 10**{exponent} + 123")
    assert shown == f"7e+{exponent} (an integer of {exponent + 1} digits, shown rounded down)"
    assert (
        await calculate(f"-(10**{exponent})")
        == f"-1e+{exponent} (an integer of {exponent + 1} digits, shown rounded down)"
    )


def test_the_scientific_form_keeps_the_leading_digits_exactly() -> None:
    value = 3**20000  # 9,543 digits
    previous = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        digits = str(value)
    finally:
        sys.set_int_max_str_digits(previous)
    mantissa = f"{digits[0]}.{digits[1:13]}".rstrip("0")
    assert (
        format_number(value)
        == f"{mantissa}e+{len(digits) - 1} (an integer of {len(digits)} digits, shown rounded down)"
    )
    assert format_number(10**3999) == "1" + "0" * 3999  # short enough: shown whole


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("2**10000 // 2**9998", "4"),
        ("10**10000 // 7**10000 % 1000", None),
        ("pow(2, 10000) // pow(2, 9999)", "2"),
        ("pow(3, 10**1000, 7)", "4"),
        ("factorial(1000) // factorial(999)", "1000"),
        ("2**-10000", "0"),
        ("1e308 + 1e307", "1.1e+308"),
    ],
)
async def test_large_but_bounded_computations_still_work(expr: str, expected: str | None) -> None:
    shown = await calculate(expr)
    assert shown == (expected if expected is not None else format_number(evaluate(expr)))


def test_sums_and_means_as_small_models_write_them() -> None:
    """The 1.5B model wrote `sum(18432, 21907, 19655) / 3` three times (benchmarks/local_tasks_b.py) and got
    "unknown function 'sum'" each time."""
    assert evaluate("sum(18432, 21907, 19655) / 3") == 19998
    assert evaluate("mean(3, 4, 8)") == evaluate("avg(3, 4, 8)") == evaluate("average(3, 4, 8)") == 5
    assert evaluate("sum()") == 0
    with pytest.raises(CalculatorError, match=r"mean\(\) needs at least one number"):
        evaluate("mean()")


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # copied from a table in a tool result (benchmarks/local_tasks_b.py, balances_total): a tuple before
        ("1,284,557.32 + 903,118.75 + 2,716,040.08", 4903716.15),
        ("(1,000 + 5) * 2", 2010),
        ("15% of 1,200", 180),
        ("max(1,234)", 234),  # inside a function's parentheses a comma separates arguments
        ("sum(1,284, 2)", 287),
    ],
)
def test_thousands_separators_where_a_comma_cannot_separate_arguments(
    expression: str, expected: float
) -> None:
    assert evaluate(expression) == pytest.approx(expected)


@pytest.mark.parametrize("expression", ["1,2345 + 1", "1, 284", "12,34"])
def test_commas_that_are_not_thousands_separators_are_still_refused(expression: str) -> None:
    with pytest.raises(CalculatorError, match="unsupported element"):
        evaluate(expression)


def test_sums_means_and_extremes_of_one_list_as_python_writes_them() -> None:
    """After `monthly_sales` gave three figures, the 1.5B model sent `sum([18432, 21907, 19655]) / 3` twice
    (benchmarks/local_tasks_b.py, average_sales) and got "unsupported element"."""
    assert evaluate("sum([18432, 21907, 19655]) / 3") == 19998
    assert evaluate("mean((3, 4, 8))") == evaluate("max([1, 5]) ") == 5
    assert evaluate("min([2.5, 1,000])") == 2.5  # the list is not a function's parentheses: 1,000 is a number
    with pytest.raises(CalculatorError, match="unsupported element"):
        evaluate("sqrt([4])")


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("1" + "0" * 400 + " + 1", "1" + "0" * 399 + "1"),  # was refused as "too large": 10**400 + 1 was not
        ("1" * 310, "1" * 310),
        ("-" + "9" * 499, "-" + "9" * 499),
        ("1" + "0" * 400 + " // 10**399", "10"),
    ],
)
async def test_integer_literals_beyond_the_float_range_are_exact_integers(expr: str, expected: str) -> None:
    # the float range check (math.isfinite) ran on every literal and overflowed on an integer of 310 digits
    assert await calculate(expr) == expected


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        (
            "(1" + "0" * 400 + ")**100",
            "the result would have about 39,976 digits, more than the calculator allows",
        ),
        ("1" + "0" * 400 + " * 1.5", "the result is too large"),  # no float holds it
        ("1" + "0" * 400 + ".5", "a number in the expression is too large for a float"),
        ("1" + "0" * 400 + "e1", "a number in the expression is too large for a float"),
    ],
)
async def test_a_huge_integer_literal_is_still_bounded_like_any_integer(expr: str, problem: str) -> None:
    with pytest.raises(CalculatorError, match=re.escape(problem)):
        await calculate(expr)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("42.165 km / 3 hours", 14.055),  # the 1.5B model, for an average speed
        ("$12.50 * 3", 37.5),
        ("€3.5 * 2", 7.0),
        ("3 x 4", 12),
        ("3x4", 12),
        ("(2 + 3) x 4", 20),
        ("3 times 4 plus 1", 13),
        ("10 divided by 4", 2.5),
        ("12 apples + 5 apples", 17),  # one unit throughout: its numbers add up
        ("100 km/h * 2 h", 200),
        ("5 USD * 2", 10),
        ("0x10", 16),  # hexadecimal, not 0 times 10
        ("1e5 + 2", 100002),  # an exponent, not a unit
        ("2 * pi", 2 * 3.141592653589793),
    ],
)
def test_numbers_with_currency_signs_units_and_x_as_small_models_write_them(
    expression: str, expected: float
) -> None:
    assert evaluate(expression) == pytest.approx(expected)


def test_a_sum_of_numbers_in_different_units_is_refused_naming_them() -> None:
    with pytest.raises(CalculatorError, match="the units miles, km differ: convert the numbers to one unit"):
        evaluate("5 miles + 3 km")


def test_the_description_gives_no_percentage_a_model_could_copy() -> None:
    """The 0.5B model sent the description's example ('15% of 80') for a tip on another bill: the only
    numbers left are the parentheses example's."""
    assert re.findall(r"\d+", calculator.description) == ["2", "3", "4"]
    assert "'N% of M'" in calculator.description


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        (
            "count(orders) - count(shipped) - count(processing)",
            "'orders', 'shipped', 'processing' are not numbers",
        ),
        ("price * quantity", "'price', 'quantity' are not numbers"),
        ("total / 3", "'total' is not a number"),
    ],
)
def test_words_where_numbers_should_be_are_named(expression: str, words: str) -> None:
    """The 1.5B model filtered a list of orders with `count(orders) - count(shipped) …` and was told only
    "unknown function 'count'", three times (benchmarks/local_tasks.py, unshipped_orders)."""
    with pytest.raises(CalculatorError) as raised:
        evaluate(expression)
    assert str(raised.value).startswith(words)
    assert "read the result and answer without the calculator" in str(raised.value)


def test_constants_and_functions_are_no_words() -> None:
    assert evaluate("round(pi * e, 2)") == 8.54
    with pytest.raises(CalculatorError, match="unknown function 'count'"):
        evaluate("count(1, 2)")  # numbers, but no such function


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("200 - 15%", "170"),  # 15 % off, as on a phone's calculator
        ("200 + 15%", "230"),
        ("$1,200 - 10%", "1080"),
        ("(200 - 15%) * 2", "340"),
        ("19.99 * (1 - 15%)", "16.9915"),
        ("50% + 25%", "0.75"),  # percentages added to each other
        ("100 - 15% of 20", "97"),
    ],
)
def test_a_percentage_taken_from_or_added_to_a_number_is_a_percentage_of_it(
    expression: str, value: str
) -> None:
    assert format_number(evaluate(expression)) == value


@pytest.mark.parametrize("expression", ["2 * 100 - 15%", "(1 + 2) + 5%", "10 / 4 - 1%"])
def test_a_percentage_taken_from_a_longer_expression_is_refused_as_ambiguous(expression: str) -> None:
    with pytest.raises(CalculatorError, match="ambiguous: write 'X \\* \\(1 - 15/100\\)'"):
        evaluate(expression)


@pytest.mark.parametrize(
    ("expression", "value"),
    [("0xFF", 255), ("0x1F + 1", 32), ("255 - 0xFF", 0), ("0xa * 2", 20), ("0b101", 5), ("0o17", 15)],
)
def test_hexadecimal_binary_and_octal_letters_are_digits_not_units(expression: str, value: int) -> None:
    """`0xFF` was 0: its letters were taken for a unit after the 0, as `km` is after `42.165`."""
    assert evaluate(expression) == value


def test_comparisons_are_true_or_false() -> None:
    """Suite C's below_reorder, seed 0: the 1.5B model wanted to compare a stock of 35 with a reorder level
    of 50 with the calculator."""
    assert calculator.function("35 < 50") == "true"
    assert calculator.function("50 <= 35") == "false"
    assert calculator.function("1 < 2 < 3") == "true"
    assert calculator.function("2 * 3 == 6") == "true"


@pytest.mark.parametrize(
    ("expression", "named"),
    [
        ("HINGE-H40 < 1000", "'HINGE', 'H40' are not numbers"),  # suite C's below_reorder, after
        (  # suite C's bolts_total, seed 0, three times: told only "only arithmetic is allowed"
            "sum([bin['qty'] for bin in site['zones'][0]['bins'] if bin['sku'] == 'BOLT-M6'])",
            "'bin', 'site' are not numbers",
        ),
    ],
)
def test_words_in_comparisons_and_variables_are_named_too(expression: str, named: str) -> None:
    with pytest.raises(CalculatorError) as raised:
        evaluate(expression)
    assert f"{named}: the calculator computes with numbers only." in str(raised.value)


def test_an_expression_that_cannot_be_parsed_is_told_only_that() -> None:
    """Naming its words ("… is not a number: … read the result and answer without the calculator") after
    "translate 'good morning' into Spanish" sent the 1.5B model on to other tools (suite A's translate)."""
    with pytest.raises(CalculatorError) as raised:
        evaluate("translate 'good morning' into Spanish")
    assert str(raised.value) == (
        "cannot parse \"translate 'good morning' into Spanish\": use numbers, + - * / ** ( ) and functions like sqrt(x)"
    )
