"""Strict JSON reading, for what models, servers and tools send: JSON as the standard writes it.

Python's `json` reads `NaN`, `Infinity`, `-Infinity` and numbers too large for a float (`1e999`) as
non-finite floats, which JSON does not have: strict parsers (llama.cpp's and vLLM's servers, PostgreSQL,
`JSON.parse`) refuse them when they are sent on, and a run state holding one does not round-trip. It also
raises `RecursionError`, not `ValueError`, on nesting deeper than the interpreter's recursion limit
(`[[[[…]]]]`, a few hundred kilobytes). `loads` and `raw_decode` raise a `ValueError` saying which for all
of these, so a caller's `except ValueError` treats them as the malformed input they are.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["loads", "non_finite", "raw_decode"]


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (it has no NaN or infinities: write a number, or null)")


def _finite(number: str) -> float:
    value = float(number)
    if not math.isfinite(value):
        raise ValueError(f"{number} is out of range for a JSON number")
    return value


_DECODER = json.JSONDecoder(parse_constant=_constant, parse_float=_finite)


def loads(text: str) -> Any:
    """`json.loads(text)`, refusing NaN, infinities and nesting too deep to read (a `ValueError`)."""
    try:
        return _DECODER.decode(text)
    except RecursionError:
        raise ValueError("the JSON is nested too deeply to read") from None


def raw_decode(text: str, start: int = 0) -> tuple[Any, int]:
    """The JSON value at `text[start:]` and the index where it ends, strictly as `loads` reads it."""
    try:
        return _DECODER.raw_decode(text, start)
    except RecursionError:
        raise ValueError("the JSON is nested too deeply to read") from None


def non_finite(value: Any) -> bool:
    """Whether a NaN or an infinity is anywhere in `value` (dicts and lists, however deep)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return False
