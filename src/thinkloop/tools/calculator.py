"""A safe calculator tool: arithmetic and common math functions, evaluated from a parsed AST.

No `eval` of arbitrary code: only numbers, the operators `+ - * / // % **`, parentheses, the constants
`pi`, `e`, `tau` and a fixed set of math functions are accepted; huge powers and factorials are refused.
Percentages as people (and small models) write them are read too: a `%` right after a number and
before no operand means "/100" (`86.4 * 15%` is 12.96, `15% of 86.4` too); `10 % 3` stays the remainder.
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
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt, "cbrt": lambda x: math.copysign(abs(x) ** (1 / 3), x), "abs": abs, "round": round,
    "min": min, "max": max, "floor": math.floor, "ceil": math.ceil, "exp": math.exp, "log": math.log,
    "log10": math.log10, "log2": math.log2, "sin": math.sin, "cos": math.cos, "tan": math.tan,
    "asin": math.asin, "acos": math.acos, "atan": math.atan, "degrees": math.degrees, "radians": math.radians,
    "factorial": math.factorial, "gcd": math.gcd, "hypot": math.hypot, "pow": pow,
}  # fmt: skip
_CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau}
_MAX_EXPONENT = 10_000
_MAX_FACTORIAL = 1_000
_MAX_LENGTH = 500


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot evaluate; the message says why."""


_PERCENT_OF_RE = re.compile(r"(\d+(?:\.\d+)?|\.\d+)\s*%\s*of\b", re.IGNORECASE)
_PERCENT_RE = re.compile(r"(\d+(?:\.\d+)?|\.\d+)\s*%(?!\s*[\w.(])")


def evaluate(expression: str) -> int | float:
    """Evaluate an arithmetic expression safely. Raises `CalculatorError` with a clear message."""
    text = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/")
    text = _PERCENT_RE.sub(r"(\1/100)", _PERCENT_OF_RE.sub(r"(\1/100)*", text))
    if not text:
        raise CalculatorError("the expression is empty")
    if len(text) > _MAX_LENGTH:
        raise CalculatorError(f"the expression is longer than {_MAX_LENGTH} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise CalculatorError(
            f"cannot parse {expression!r}: use numbers, + - * / ** ( ) and functions like sqrt(x)"
        ) from None
    try:
        value = _eval(tree.body)
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except (OverflowError, MemoryError):
        raise CalculatorError("the result is too large") from None
    except (TypeError, ValueError) as exc:
        if isinstance(exc, CalculatorError):
            raise
        raise CalculatorError(f"math error: {exc}") from None
    if isinstance(value, complex) or not isinstance(value, int | float):
        raise CalculatorError(f"the result {value!r} is not a real number")
    return value


def _eval(node: ast.expr) -> Any:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} is too large (limit {_MAX_EXPONENT})")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Call):
        return _call(node)
    raise CalculatorError(f"unsupported element {ast.unparse(node)!r}: only arithmetic is allowed")


def _call(node: ast.Call) -> Any:
    if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS or node.keywords:
        allowed = ", ".join(sorted(_FUNCTIONS))
        raise CalculatorError(f"unknown function {ast.unparse(node.func)!r}; allowed: {allowed}")
    args = [_eval(a) for a in node.args]
    if node.func.id == "factorial" and args and abs(args[0]) > _MAX_FACTORIAL:
        raise CalculatorError(f"factorial argument is too large (limit {_MAX_FACTORIAL})")
    return _FUNCTIONS[node.func.id](*args)


def format_number(value: int | float) -> str:
    """Integers as integers; floats without float noise (12 significant digits), whole floats as ints."""
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.12g}"
    return str(value)


def _calculate(expression: str) -> str:
    return format_number(evaluate(expression))


class _Arguments(BaseModel):
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)

    expression: str = Field(description="the expression to evaluate")


calculator = Tool(
    name="calculator",
    description=(
        "Evaluate an arithmetic expression exactly, keeping its parentheses, e.g. '(2 + 3) * 4', '15% of 80' "
        "or 'sqrt(2) / 7'. Supports + - * / // % **, parentheses, pi, e and functions such as sqrt, log, "
        "sin, round, min, max, factorial."
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
