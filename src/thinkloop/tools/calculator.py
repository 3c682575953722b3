"""A safe calculator tool: arithmetic and common math functions, evaluated from a parsed AST.

No `eval` of arbitrary code: only numbers, the operators `+ - * / // % **`, parentheses, the constants
`pi`, `e`, `tau` and a fixed set of math functions are accepted. Every step is bounded, because the tool
runs on the event loop and a model may write `(10**10000)**10000`: an integer that would exceed
`_MAX_BITS` bits (about 30,000 digits), an exponent above 10,000, a factorial above 1,000, `round(x, n)`
with `n` beyond ±10,000 and a costly modular power are refused before they are computed. Infinite and NaN results are refused too, and an
integer too long to print whole is shown in scientific notation.
Percentages as people (and small models) write them are read too: a `%` right after a number and
before no operand means "/100" (`86.4 * 15%` is 12.96, `15% of 86.4` too); `10 % 3` stays the remainder.
Numbers written with a currency sign or a unit (`$12.50 * 3`, `42.165 km / 3 hours`) are read without
them, and `3 x 4` / `3 times 4` as a product; units that differ in a sum (`5 miles + 3 km`) are refused.
So are thousands separators where a comma could not separate arguments: `1,284,557.32 + 903,118.75` (as
tables in tool results write numbers) is 2187676.07, while `max(1,234)` stays 234. A comparison
(`35 < 50`) is `true` or `false`. Words where numbers should be are named in the error, also in an
expression that reads a variable (`site['zones']`).
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .._risk import RiskLevel
from .._tools import Tool

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}  # fmt: skip  # `35 < 50`: small models compare with the calculator; the result is true or false
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt, "cbrt": lambda x: math.copysign(abs(x) ** (1 / 3), x), "abs": abs, "round": round,
    "min": min, "max": max, "floor": math.floor, "ceil": math.ceil, "exp": math.exp, "log": math.log,
    "log10": math.log10, "log2": math.log2, "sin": math.sin, "cos": math.cos, "tan": math.tan,
    "asin": math.asin, "acos": math.acos, "atan": math.atan, "degrees": math.degrees, "radians": math.radians,
    "factorial": math.factorial, "gcd": math.gcd, "hypot": math.hypot, "pow": pow,
    "sum": lambda *xs: sum(xs), "mean": lambda *xs: _mean(xs), "avg": lambda *xs: _mean(xs),
    "average": lambda *xs: _mean(xs),
}  # fmt: skip  # sum/mean of numbers as small models write them: sum(18432, 21907, 19655) / 3
_OF_NUMBERS = frozenset({"sum", "mean", "avg", "average", "min", "max"})  # also given one list of numbers
_CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau}
_MAX_EXPONENT = 10_000
_MAX_FACTORIAL = 1_000
_MAX_LENGTH = 500
_MAX_BITS = 100_000  # 10**10000 fits; a product or power of such numbers costs milliseconds
_MAX_MODPOW_WORK = 1 << 24  # bits of exponent x bits of modulus: pow(a, b, m) under ~0.3 s
_MAX_DIGITS_SHOWN = 4_000  # below Python's int-to-str limit (4,300 digits)


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot evaluate; the message says why."""


def _mean(values: tuple[Any, ...]) -> float:
    if not values:
        raise CalculatorError("mean() needs at least one number, e.g. mean(3, 4, 8)")
    total: float = sum(values)
    return total / len(values)


_PERCENT_OF_RE = re.compile(r"(\d+(?:\.\d+)?|\.\d+)\s*%\s*of\b", re.IGNORECASE)
_PERCENT_RE = re.compile(r"(\d+(?:\.\d+)?|\.\d+)\s*%(?!\s*[\w.(])")
# `200 - 15%` (alone or in parentheses) is 15 % off 200, as on a phone's calculator and in shops: 170
_OFF_RE = re.compile(r"(^|\()\s*(\d+(?:\.\d+)?|\.\d+)\s*([-+])\s*(\d+(?:\.\d+)?|\.\d+)\s*%\s*(?=\)|$)")
# a percentage added to or taken from anything else (`2 * 100 - 15%`): no reading of it is safe
_LOOSE_PERCENT_RE = re.compile(r"(?<![%\s])\s*[-+]\s*(?:\d+(?:\.\d+)?|\.\d+)\s*%(?!\s*[\w.(])")


_CURRENCY_RE = re.compile(r"[$€£¥₹]\s*(?=\d|\.\d)")  # $12.50 is 12.50
_TIMES_RE = re.compile(  # 3 x 4, 3x4, (2+3) x 4 — not the hexadecimal 0x1F
    r"(?<=[\d)])(?<!(?<![\w.])0)\s*[x×]\s*(?=[\d(.])|(?<=[\d)])\s+[xX]\s+"
)
_WORD_OPERATORS = {"times": "*", "plus": "+", "minus": "-", "divided by": "/", "multiplied by": "*"}
_WORD_OPERATOR_RE = re.compile(
    r"(?<=[\d)])\s+(times|plus|minus|divided\s+by|multiplied\s+by)\s+(?=[\d(.$€£¥₹-])", re.IGNORECASE
)
# a word right after a number: a unit (`42.165 km / 3 hours`), not a function, a constant or a percentage
_UNIT_RE = re.compile(r"(?<=[\d.])[ \t]*([A-Za-z]+(?:/[A-Za-z]+)?)\b(?![ \t]*\()")
_NOT_UNITS = frozenset({*_FUNCTIONS, *_CONSTANTS, "of", "x", "X"})


# hexadecimal, binary and octal literals, in decimal before units are read: `0x1F`'s F is no unit
_BASED_RE = re.compile(r"(?<![\w.])0(?:[xX][0-9A-Fa-f]+|[bB][01]+|[oO][0-7]+)\b")


def _without_units(text: str) -> str:
    """Numbers without their currency signs and units (`$12.50 * 3`, `42.165 km / 3 hours`), and `x` or
    `times` as multiplication: small models copy them from the task. Units that differ in a sum or
    difference (`5 miles + 3 km`) are refused: adding their numbers would be wrong."""
    text = _BASED_RE.sub(lambda m: str(int(m[0], 0)), _CURRENCY_RE.sub("", text))
    text = _WORD_OPERATOR_RE.sub(lambda m: f" {_WORD_OPERATORS[' '.join(m[1].lower().split())]} ", text)
    text = _TIMES_RE.sub("*", text)
    units = [m[1] for m in _UNIT_RE.finditer(text) if m[1] not in _NOT_UNITS]
    if not units:
        return text
    bare = _UNIT_RE.sub(lambda m: m[0] if m[1] in _NOT_UNITS else "", text)
    distinct = list(dict.fromkeys(u.lower() for u in units))
    if len(distinct) > 1 and re.search(r"[\d)][ \t]*[-+][ \t]*[\d(.]", bare):
        raise CalculatorError(
            f"the units {', '.join(distinct)} differ: convert the numbers to one unit first, then add or "
            "subtract them (the calculator computes with plain numbers)"
        )
    return bare


_THOUSANDS_RE = re.compile(r"(?<![\w.,])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w.,])")


def _without_thousands_separators(text: str) -> str:
    """`1,284,557.32` as 1284557.32 where its commas could only make a tuple, which is refused anyway:
    not inside a function's parentheses, where they separate arguments (`max(1,234)`)."""
    if "," not in text or not _THOUSANDS_RE.search(text):
        return text
    in_call: list[bool] = []  # per character: is the innermost open bracket a function call's?
    stack: list[bool] = []
    for i, char in enumerate(text):
        in_call.append(bool(stack) and stack[-1])
        if char in "([":
            before = text[:i].rstrip()
            stack.append(char == "(" and bool(before) and (before[-1].isalnum() or before[-1] == "_"))
        elif char in ")]" and stack:
            stack.pop()
    return _THOUSANDS_RE.sub(lambda m: m[0] if in_call[m.start()] else m[0].replace(",", ""), text)


def _percentages(text: str) -> str:
    """Percentages as people write them: `15% of 80` and `80 * 15%` are 15 hundredths of 80, `200 - 15%`
    and `(200 + 15%)` are 200 less or more 15 % of it; a percentage added to or taken from a longer
    expression is refused, as the two readings differ (`2 * 100 - 15%`: 199.85 or 170)."""
    if "%" not in text:
        return text
    text = _OFF_RE.sub(r"\1\2*(1\3\4/100)", _PERCENT_OF_RE.sub(r"(\1/100)*", text))
    loose = _LOOSE_PERCENT_RE.search(text)
    if loose is not None:
        raise CalculatorError(
            f"'{loose[0].strip()}' after an expression is ambiguous: write 'X * (1 - 15/100)' for X less 15 %, "
            "or 'X - 15/100 * Y' for 15 % of Y taken from X"
        )
    return _PERCENT_RE.sub(r"(\1/100)", text)


def evaluate(expression: str) -> int | float:
    """Evaluate an arithmetic expression safely. Raises `CalculatorError` with a clear message."""
    tree = _parse(_normalise(expression), expression)
    words = _words(tree.body)
    if words:
        raise CalculatorError(_not_numbers(words))
    try:
        value = _eval(tree.body)
    except CalculatorError as exc:
        names = _names(tree.body)
        if not names or not str(exc).startswith("unsupported element"):
            raise
        raise CalculatorError(f"{exc}; {_not_numbers(names)}") from None
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except (OverflowError, MemoryError):
        raise CalculatorError("the result is too large") from None
    except RecursionError:
        raise CalculatorError("the expression is nested too deeply: simplify it") from None
    except (TypeError, ValueError) as exc:
        if isinstance(exc, CalculatorError):
            raise
        raise CalculatorError(f"math error: {exc}") from None
    if isinstance(value, complex) or not isinstance(value, int | float):
        raise CalculatorError(f"the result {value!r} is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError(
            f"the result is not a finite number ({value}): a value overflowed the float range (about 1.8e308)"
        )
    return value


def _parse(text: str, expression: str) -> ast.Expression:
    try:
        return ast.parse(text, mode="eval")
    except (RecursionError, MemoryError):
        raise CalculatorError("the expression is nested too deeply: simplify it") from None
    except (SyntaxError, ValueError):  # words are not named here: told so after "translate 'good morning'
        # into Spanish", the 1.5B model went on calling tools (suite A's translate), where it answered before
        raise CalculatorError(
            f"cannot parse {expression!r}: use numbers, + - * / ** ( ) and functions like sqrt(x)"
        ) from None


def _normalise(expression: str) -> str:
    """The expression in Python's syntax (`^`, `×`, `÷`, percentages); refused if empty or too long."""
    text = expression.strip()
    if len(text) > _MAX_LENGTH:  # before the regular expressions: they take quadratic time in the length
        raise CalculatorError(f"the expression is longer than {_MAX_LENGTH} characters")
    text = text.replace("^", "**").replace("×", "*").replace("÷", "/")
    text = _without_thousands_separators(_without_units(text))
    text = _percentages(text)
    if not text:
        raise CalculatorError("the expression is empty")
    if len(text) > _MAX_LENGTH:
        raise CalculatorError(f"the expression is longer than {_MAX_LENGTH} characters")
    return text


_PLAIN = (
    ast.BinOp,
    ast.UnaryOp,
    ast.Call,
    ast.Constant,
    ast.Name,
    ast.List,
    ast.Tuple,
    ast.Load,
    ast.Compare,
)
_PLAIN_OPERATORS = (ast.operator, ast.unaryop, ast.cmpop)


def _words(tree: ast.expr) -> list[str]:
    """The names in an expression of plain arithmetic that are neither constants nor called functions:
    words where numbers should be (`count(orders) - count(shipped)`, the 1.5B model filtering a list of
    orders; it was told only "unknown function 'count'", three times). [] for anything else (attributes,
    comprehensions …), which `_eval` refuses as it is."""
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    words: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, _PLAIN + _PLAIN_OPERATORS):
            return []
        if isinstance(node, ast.Name) and id(node) not in called and not _known(node.id):
            words.append((node.col_offset, node.id))
    return list(dict.fromkeys(name for _, name in sorted(words)))


def _not_numbers(words: list[str]) -> str:
    return (
        f"{', '.join(map(repr, words))} {'is not a number' if len(words) == 1 else 'are not numbers'}: the "
        "calculator computes with numbers only. Put the numbers themselves in the expression; to pick, count "
        "or compare the items of a result, read the result and answer without the calculator"
    )


def _names(tree: ast.expr) -> list[str]:
    """Every name of an expression that is no constant or called function (`bin`, `site` of a
    comprehension over a tool's result: the calculator cannot read variables)."""
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    found = [(n.col_offset, n.id) for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in called]
    return list(dict.fromkeys(name for _, name in sorted(found) if not _known(name)))[:4]


def _known(name: str) -> bool:
    return name in _CONSTANTS or name in _FUNCTIONS


def _eval(node: ast.expr) -> Any:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        if isinstance(node.value, float) and not math.isfinite(node.value):  # an int may be any length
            raise CalculatorError(
                "a number in the expression is too large for a float (the limit is about 1.8e308)"
            )
        return node.value
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        if isinstance(node.op, ast.Mult):
            _check_bits(_bits(left) + _bits(right))
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Call):
        return _call(node)
    if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        values = [_eval(node.left), *(_eval(c) for c in node.comparators)]
        pairs = zip(node.ops, values, values[1:], strict=False)
        return all(_COMPARE[type(op)](a, b) for op, a, b in pairs)
    raise CalculatorError(f"unsupported element {ast.unparse(node)!r}: only arithmetic is allowed")


def _call(node: ast.Call) -> Any:
    if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS or node.keywords:
        allowed = ", ".join(sorted(_FUNCTIONS))
        raise CalculatorError(f"unknown function {ast.unparse(node.func)!r}; allowed: {allowed}")
    listed = node.args[0] if len(node.args) == 1 else None
    if isinstance(listed, ast.List | ast.Tuple) and node.func.id in _OF_NUMBERS:
        args = [_eval(a) for a in listed.elts]  # sum([1, 2, 3]), as Python writes it
    else:
        args = [_eval(a) for a in node.args]
    if node.func.id == "factorial" and args and abs(args[0]) > _MAX_FACTORIAL:
        raise CalculatorError(f"factorial argument is too large (limit {_MAX_FACTORIAL})")
    if node.func.id == "pow" and len(args) == 2:
        _check_power(*args)
    if (
        node.func.id == "round"
        and len(args) == 2
        and isinstance(args[1], int)
        and abs(args[1]) > _MAX_EXPONENT
    ):
        # round(5, -10**7) computes 10**10000000 first: 13 s on the event loop
        raise CalculatorError(f"round() to {_short(args[1])} digits is out of range (limit ±{_MAX_EXPONENT})")
    if node.func.id == "pow" and len(args) == 3 and _bits(args[1]) * _bits(args[2]) > _MAX_MODPOW_WORK:
        raise CalculatorError(
            "pow(a, b, m) with numbers this large is too costly: use a smaller exponent or modulus"
        )
    return _FUNCTIONS[node.func.id](*args)


def _bits(value: Any) -> int:
    """The size in bits of an integer operand (0 for floats: their range is bounded by themselves)."""
    return abs(value).bit_length() if isinstance(value, int) else 0


def _check_bits(bits: int) -> None:
    if bits > _MAX_BITS:
        raise CalculatorError(
            f"the result would have about {int(bits * math.log10(2)):,} digits, more than the calculator "
            f"allows ({int(_MAX_BITS * math.log10(2)):,}): use smaller numbers or floats (e.g. 1e300)"
        )


def _short(value: int | float) -> str:
    text = format_number(value).split(" (")[0]
    return text if len(text) <= 40 else f"{text[:40]}…"


def _check_power(base: Any, exponent: Any) -> None:
    """Refuse a power whose exponent or integer result is too large, before computing it."""
    if isinstance(exponent, int | float) and abs(exponent) > _MAX_EXPONENT:
        raise CalculatorError(f"exponent {_short(exponent)} is too large (limit {_MAX_EXPONENT})")
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        _check_bits((abs(base).bit_length() - 1) * exponent)


def format_number(value: int | float) -> str:
    """Integers as integers; floats without float noise (12 significant digits), whole floats as ints.

    An integer of more than `_MAX_DIGITS_SHOWN` digits is shown as `d.ddd…e+N (an integer of M digits)`.
    """
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.12g}"
    digits = _digit_count(value)
    return _scientific(value, digits) if digits > _MAX_DIGITS_SHOWN else str(value)


def _digit_count(value: int) -> int:
    """The number of decimal digits of `value`, without converting it to a string."""
    digits = max(int(abs(value).bit_length() * math.log10(2)), 1)  # the true count is this or one more
    return digits + 1 if abs(value) >= 10**digits else digits


def _scientific(value: int, digits: int) -> str:
    """A long integer as `1.23456789012e+4300 (an integer of 4301 digits)`, without converting it whole."""
    lead = abs(value) // 10 ** (digits - 13)  # the first 13 digits
    mantissa = f"{lead // 10**12}.{lead % 10**12:012d}".rstrip("0").rstrip(".")
    sign = "-" if value < 0 else ""
    return f"{sign}{mantissa}e+{digits - 1} (an integer of {digits} digits, shown rounded down)"


def _calculate(expression: str) -> str:
    value = evaluate(expression)
    return ("true" if value else "false") if isinstance(value, bool) else format_number(value)


class _Arguments(BaseModel):
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)

    expression: str = Field(description="the expression to evaluate")


calculator = Tool(
    name="calculator",
    description=(
        "Evaluate an arithmetic expression written with the task's own numbers, exactly, keeping its "
        "parentheses, e.g. '(2 + 3) * 4'. Supports + - * / // % **, 'N% of M', pi, e and functions such "
        "as sqrt, log, sin, round, min, max, factorial."
    ),
    parameters={
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "the expression to evaluate"}},
        "required": ["expression"],
        "additionalProperties": False,
    },
    function=_calculate,
    validator=_Arguments,
    risk=RiskLevel.LOW,
    idempotent=True,
    in_thread=False,  # pure and bounded: no need for a worker thread
)
