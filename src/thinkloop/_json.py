"""Strict JSON reading, for what models, servers and tools send: JSON as the standard writes it.

Python's `json` reads `NaN`, `Infinity`, `-Infinity` and numbers too large for a float (`1e999`) as
non-finite floats, which JSON does not have: strict parsers (llama.cpp's and vLLM's servers, PostgreSQL,
`JSON.parse`) refuse them when they are sent on, and a run state holding one does not round-trip. It also
raises `RecursionError`, not `ValueError`, on nesting deeper than the interpreter's recursion limit
(`[[[[…]]]]`, a few hundred kilobytes), and reads nesting that a run state holding it could not be saved
with (pydantic refuses a few hundred levels). `loads` and `raw_decode` raise a `ValueError` saying which for
all of these — nesting past `MAX_DEPTH` included — so a caller's `except ValueError` treats them as the
malformed input they are.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pydantic_core

__all__ = [
    "MAX_DEPTH",
    "REPAIR_BUDGET",
    "TOO_DEEP",
    "loads",
    "non_finite",
    "raw_decode",
    "repairable",
    "text_too_deep",
    "too_deep",
    "valid_text",
    "valid_unicode",
]

MAX_DEPTH = 64  # levels of objects and lists a value read from a model may have; no tool needs more
TOO_DEEP = f"the JSON is nested more than {MAX_DEPTH} levels deep"


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
        value = _DECODER.decode(text)
    except RecursionError:
        raise ValueError(TOO_DEEP) from None
    if too_deep(value, text):
        raise ValueError(TOO_DEEP)
    return valid_unicode(value) if _SURROGATE_ESCAPE.search(text) else value


def raw_decode(text: str, start: int = 0) -> tuple[Any, int]:
    """The JSON value at `text[start:]` and the index where it ends, strictly as `loads` reads it."""
    try:
        value, end = _DECODER.raw_decode(text, start)
    except RecursionError:
        raise ValueError(TOO_DEEP) from None
    if too_deep(value, text):
        raise ValueError(TOO_DEEP)
    return (valid_unicode(value) if _SURROGATE_ESCAPE.search(text, start, end) else value), end


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


def too_deep(value: Any, text: str | None = None) -> bool:
    """Whether `value` nests objects and lists more than `MAX_DEPTH` levels deep. `text`, the JSON it was
    read from, when given, settles the common case at once: text of fewer brackets cannot nest that deep."""
    if text is not None and text.count("{") + text.count("[") <= MAX_DEPTH:
        return False
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth == MAX_DEPTH:
            return True
        pending.extend((child, depth + 1) for child in children if isinstance(child, dict | list | tuple))
    return False


_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[{]|[\]}]')  # a string (perhaps not ended), or a bracket


def text_too_deep(text: str) -> bool:
    """Whether JSON (or JSON-like) text opens objects and lists more than `MAX_DEPTH` levels deep, brackets
    inside strings not counted — read or not (the text may be cut off or not JSON at all)."""
    if text.count("{") + text.count("[") <= MAX_DEPTH:
        return False
    depth = 0
    for match in _TOKENS.finditer(text):
        token = match[0]
        if token in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return True
        elif token in "]}":
            depth = max(depth - 1, 0)
    return False


REPAIR_BUDGET = 300_000
"""The most brackets times characters of broken JSON that is given to json_repair to mend (see `repairable`)."""


def repairable(text: str) -> bool:
    """Whether broken JSON `text` is small enough for json_repair to mend at once: its brackets (those
    outside strings) times its length at most `REPAIR_BUDGET`. json_repair's time grows with that product
    — about 1-2 µs a unit at worst: a 32 kB model reply of `{]{]{]…` took 73 s, during which the event
    loop, and every other run on it, stood still. Past it the text is not mended (about half a second at
    most) and the model is asked for valid JSON; the broken JSON models write is far smaller."""
    length = len(text)
    if length * (text.count("{") + text.count("[")) <= REPAIR_BUDGET:
        return True
    openers = sum(1 for match in _TOKENS.finditer(text) if match[0] in "[{")
    return openers * length <= REPAIR_BUDGET


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # `\ud83d`: JSON's escape of half a character
_SURROGATES = re.compile("[\ud800-\udfff]")


def saveable(value: Any) -> bool:
    """Whether a run's state can hold `value` (pydantic writes it as JSON: an arbitrary object it cannot)."""
    try:
        pydantic_core.to_json(value)
    except (ValueError, TypeError, RecursionError):  # PydanticSerializationError is a ValueError
        return False
    return True


def valid_text(text: str) -> str:
    """`text` with its lone surrogates replaced by U+FFFD (see `valid_unicode`); ASCII at once."""
    return text if text.isascii() else _SURROGATES.sub("\ufffd", text)


def valid_unicode(value: Any) -> Any:
    """`value` with lone surrogates in its texts (keys too) replaced by U+FFFD: JSON's `\\ud83d` escape
    of half an emoji (a reply cut in the middle of one) reads as one, which UTF-8 — a run's state, an
    event, a provider's request — cannot hold. A pair of escapes (a whole emoji) reads as the character."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, dict):
        return {valid_unicode(key): valid_unicode(item) for key, item in value.items()}
    if isinstance(value, list):
        return [valid_unicode(item) for item in value]
    return value
