"""Structured output: `Agent(output_type=T)` makes the final answer a validated `T`.

The model is told (a rule of the system prompt) to give its final answer as JSON matching T's JSON Schema.
Small models rarely write exactly that, so the answer is read leniently where its intent is unambiguous:
reasoning blocks, code fences and text around the JSON are skipped (of several JSON values the last one
that validates wins: drafts come first), small syntax slips are repaired (quotes, trailing commas,
comments, Python literals), a wrapper is looked through (`{"answer": …}`, the schema's `properties`, a
one-item list), and a value that fails is fixed where it fails when only one reading fits (a number
written as text — "1,234.5", "$12.50", "The answer is 42." —, an enum value in another case, a key in
another case, one item where a list is asked for). A cut-off object is never completed, "12%" is not
guessed. An answer that still does not validate is not the end of the run: like any unreadable reply it
goes back to the model (counted with the other heals) with what was wrong, what it wrote, the schema and
the shape of an answer.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from . import _json
from ._errors import ConfigurationError, RunError
from ._react import first_json_span, without_think_blocks


@dataclass(frozen=True)
class OutputSpec:
    """What the final answer must be: a type pydantic can validate (a model, dataclass, TypedDict, list …)."""

    type: Any
    adapter: TypeAdapter[Any]
    schema: dict[str, Any]
    check: Callable[[Any], Any] | None = None

    @classmethod
    def of(cls, output_type: Any, check: Callable[[Any], Any] | None = None) -> OutputSpec | None:
        """The spec of `output_type` and an extra `check` of the value; None when any text will do."""
        if output_type is None:
            output_type = str
        if output_type is str and check is None:
            return None
        try:
            adapter: TypeAdapter[Any] = TypeAdapter(output_type)
            schema = adapter.json_schema()
        except Exception as exc:  # pydantic's errors say which part of the type it cannot handle
            raise ConfigurationError(
                f"output_type {output_type!r} cannot be used: {exc} — use a pydantic model, a dataclass, a "
                "TypedDict or a type such as list[str] or int"
            ) from None
        return cls(type=output_type, adapter=adapter, schema=schema, check=check)

    @property
    def rule(self) -> str | None:
        """The system-prompt rule that tells the model the answer's format (None for plain text)."""
        if self.type is str:
            return None
        schema = json.dumps(self.schema, ensure_ascii=False, separators=(",", ":"))
        return f"Give your final answer as JSON only (no other text), matching this JSON Schema: {schema}"

    def parse(self, text: str, *, react: bool = False) -> tuple[Any, str | None]:
        """The validated value of a final answer, or `(None, what is wrong)` to tell the model (`react`:
        a text ReAct model, told to write the JSON after 'Final Answer:')."""
        if self.type is str:
            return self._checked(text)
        reading = _read(text)
        if not reading.body:
            return None, f"the final answer was empty. {self._again(react)}"
        first: ValidationError | None = None
        for candidate in _candidates(reading, self._title):
            value, error = self._validate(candidate)
            if error is None:
                return self._checked(value)
            first = first or error
        what = "the final answer cannot be read." if first is None else _diagnosis(reading, first)
        return None, f"{what} {self._again(react)}"

    def _validate(self, candidate: Any) -> tuple[Any, ValidationError | None]:
        """The candidate validated as is, else with the unambiguous fixes its errors allow."""
        try:
            value = self.adapter.validate_python(candidate)
        except ValidationError as exc:
            fixed = _fixed(self.adapter, candidate, exc)
            if fixed is _NOTHING:
                return None, exc
            value = fixed
        if _has_placeholder(value):
            return None, _placeholder_error(value)
        return value, None

    @property
    def _title(self) -> str:
        return str(self.schema.get("title", "")).lower()

    def _again(self, react: bool = False) -> str:
        """How to answer again: the schema (when it is short enough to repeat) and the answer's shape. A
        ReAct model, whose reply starts with 'Thought:', is told where the JSON goes: after 'Final Answer:'
        ("JSON only" made the 0.5B model drop the label and write the JSON as a thought)."""
        schema = json.dumps(self.schema, ensure_ascii=False, separators=(",", ":"))
        told = (
            f"this JSON Schema: {schema}" if len(schema) <= _SCHEMA_ROOM else "the JSON Schema given before"
        )
        form = "as 'Final Answer:' followed by JSON only" if react else "as JSON only"
        return (
            f"Give the final answer again {form} (no other text), matching {told}. Its shape: "
            f"{_shape(self.schema, self.schema.get('$defs', {}))} (put the real values in place of the <…>)."
        )

    def _checked(self, value: Any) -> tuple[Any, str | None]:
        """The value through the agent's `output_validator`: its `ValueError` message goes to the model."""
        if self.check is None:
            return value, None
        try:
            return self.check(value), None
        except ValueError as exc:
            return None, f"{exc} Give the final answer again."
        except Exception as exc:  # a bug in the validator, not a verdict on the answer: the run ends
            raise RunError(
                f"the output_validator raised {type(exc).__name__}: {exc} (a validator rejects an answer by "
                "raising ValueError, whose message goes to the model)"
            ) from exc


_SCHEMA_ROOM = 2000  # a longer schema is not repeated in a correction (it is in the system prompt)
_MAX_SPANS = 8  # JSON values read from an answer's text: the last ones (the final version comes last)
_NOTHING: Any = object()  # no fix applies
_MAX_FIXES = 64  # errors in one answer that are fixed (more: the model is told)
_FENCE_RE = re.compile(r"```(?>[ \t]*(?:[\w+-]*[ \t]*\n)?)(.*?)```", re.DOTALL)
"""A fenced block. Its opening line is matched atomically: the blank space after an opening fence that no
closing one follows could go to the opening or to the block, and a regex trying every split took time
growing with the square of it (20 kB of newlines after a fence: 10 s, the event loop blocked)."""
_WRAPPERS = frozenset(
    {"answer", "final_answer", "finalanswer", "output", "result", "response", "data", "value", "json",
     "content", "properties", "arguments", "args", "parameters", "input", "action_input", "item", "object"}
)  # fmt: skip
_PLACEHOLDER_RE = re.compile(
    r"<?(?:string|integer|number|boolean|value)>|<(?:string|integer|number|boolean|value)"
)


@dataclass
class _Reading:
    """What an answer holds: its text (reasoning blocks removed), the JSON values written as the whole
    answer (or a whole fenced block), those found inside its text, and whether one is cut off."""

    body: str
    whole: list[Any]
    inner: list[Any]
    cut_off: bool


def _read(text: str) -> _Reading:
    body = without_think_blocks(text).strip() or text.strip()
    fenced = [m.group(1).strip() for m in _FENCE_RE.finditer(body)]
    pieces = [p for p in fenced if p] or [body]
    if len(pieces) == 1:
        body = pieces[0]
    reading = _Reading(body=body, whole=[], inner=[], cut_off=False)
    for piece in pieces:
        try:
            reading.whole.append(_json.loads(piece))  # strict: no NaN, at most 64 levels, valid Unicode
            continue
        except ValueError:  # not JSON (or absurdly deep)
            pass
        spans, cut_off = _spans(piece)
        reading.cut_off = reading.cut_off or cut_off
        reading.inner.extend(v for v in map(_loads, spans) if v is not _NOTHING)
    if len(reading.whole) > 1:  # several fenced blocks: a draft and the final version, most likely
        reading.inner, reading.whole = reading.whole + reading.inner, []
    return reading


def _loads(text: str) -> Any:
    try:
        return _json.loads(text)
    except ValueError:
        repaired = _repaired(text)
        return _NOTHING if repaired is None else repaired


def _spans(text: str) -> tuple[list[str], bool]:
    """The complete top-level `{…}` and `[…]` in the text (the last `_MAX_SPANS`), and whether the text
    ends inside one — a cut-off answer, never completed (closing it could make a wrong answer look valid)."""
    spans: list[str] = []
    depth, start, in_string, escaped = 0, 0, False, False
    for i, ch in enumerate(text):
        if in_string:
            escaped = ch == "\\" and not escaped
            in_string = ch != '"' or escaped
        elif ch == '"' and depth:
            in_string = True
        elif ch in "{[":
            start = i if depth == 0 else start
            depth += 1
        elif ch in "}]" and depth:
            depth -= 1
            if depth == 0:
                spans.append(text[start : i + 1])
    return spans[-_MAX_SPANS:], depth > 0


def _candidates(reading: _Reading, title: str) -> Iterator[Any]:
    """The values the answer may mean, most likely first: the whole answer as JSON (and what it wraps),
    the JSON inside its text (the last first), the text itself, then what that inner JSON wraps."""
    seen: list[Any] = []
    for value in (*_forms_all(reading.whole, title), *reversed(reading.inner), reading.body):
        if not any(value == s and type(value) is type(s) for s in seen):
            seen.append(value)
            yield value
    for value in _forms_all(reversed(reading.inner), title):
        if not any(value == s and type(value) is type(s) for s in seen):
            seen.append(value)
            yield value


def _forms_all(values: Iterable[Any], title: str) -> Iterator[Any]:
    for value in values:
        yield from _forms(value, title, depth=0)


def _forms(value: Any, title: str, depth: int) -> Iterator[Any]:
    """The value and what it may wrap: `{"answer": {…}}`, `{"properties": {…}}` (the schema echoed),
    a one-item list, a JSON string holding JSON; and the value as a one-item list."""
    yield value
    if depth >= 3:
        return
    inner: list[Any] = []
    if isinstance(value, dict):
        wrappers = _WRAPPERS | {title} if title else _WRAPPERS
        sole = len(value) == 1  # {"city": {…}}: a lone key wrapping an object or a list
        inner = [
            v for k, v in value.items() if str(k).lower() in wrappers or sole and isinstance(v, dict | list)
        ]
    elif isinstance(value, list) and len(value) == 1:
        inner = [value[0]]
    elif isinstance(value, str) and value.strip().startswith(("{", "[")):
        loaded = _loads(value.strip())
        inner = [] if loaded is _NOTHING else [loaded]
    for item in inner:
        yield from _forms(item, title, depth + 1)
    if not isinstance(value, list):
        yield [value]


def _first_bracketed(text: str) -> str | None:
    """The first complete `{…}` or `[…]` in the text; None for a cut-off one."""
    span = first_json_span(text, "{[")
    return span[0] if span is not None and span[1] else None


def _repaired(text: str) -> Any:
    """Small slips (quotes, trailing commas, comments, Python literals) in complete JSON; never a cut-off
    object."""
    text = text.strip()
    if not text.startswith(("{", "[")) or _first_bracketed(text) != text or not _json.repairable(text):
        return None  # not one bracketed value, or too large to mend at once
    try:
        import json_repair  # only for broken JSON (keeps `import thinkloop` fast)

        value = json_repair.loads(text)
    except Exception:  # json_repair's own failures (deep nesting …): not JSON
        return None
    if not isinstance(value, dict | list) or not value or _json.non_finite(value) or _json.too_deep(value):
        return None  # what JSON (and a saved run) cannot hold is not mended into an answer
    return _json.valid_unicode(value)


# ------------------------------------------------------------------------------ fixes of single values


def _fixed(adapter: TypeAdapter[Any], candidate: Any, exc: ValidationError) -> Any:
    """The candidate validated after fixing what each error points at, when the intent is unambiguous:
    a number written as text ("1,234.5", "$12.50", "The answer is 42."), an enum value in another case,
    a key in another case, one item where a list was asked for (and vice versa); `_NOTHING` otherwise."""
    value = copy.deepcopy(candidate)
    for _ in range(3):  # a fix can uncover another error: {"Population": "709,000"}
        errors = exc.errors(include_url=False)
        if len(errors) > _MAX_FIXES:  # each fix is checked by validating the whole value again
            return _NOTHING
        changed = False
        for error in errors:
            fix = _fix(adapter, value, error)
            if fix is not _NOTHING:
                value, changed = fix, True
        if not changed:
            return _NOTHING
        try:
            return adapter.validate_python(value)
        except ValidationError as again:
            exc = again
    return _NOTHING


def _fix(adapter: TypeAdapter[Any], value: Any, error: Any) -> Any:
    """The value with the part one error points at fixed, or `_NOTHING`."""
    kind, loc, given = error["type"], tuple(error["loc"]), error["input"]
    if kind == "missing":
        return _renamed_key(value, loc)
    options: list[Any] = []
    if isinstance(given, str) and kind in ("int_parsing", "float_parsing"):
        options = [n for n in [_number(given)] if n is not None]
    elif isinstance(given, str) and kind in ("literal_error", "enum", "bool_parsing"):
        options = _word_variants(given)
    elif kind == "string_type" and isinstance(given, int | float) and not isinstance(given, bool):
        options = [json.dumps(given)]
    elif kind == "list_type" and _one_item(given):
        options = [[given]]
    elif kind in _OBJECT_ERRORS and isinstance(given, list) and len(given) == 1:
        options = [given[0]]
    fits = [(o, v) for o in options if _fits_at(adapter, v := _replaced(value, loc, o), loc)]
    readings = {o.lower() if isinstance(o, str) else json.dumps(o, default=str) for o, _ in fits}
    return fits[0][1] if len(readings) == 1 else _NOTHING  # "yes", "Yes": one reading; "no" and "yes": two


def _one_item(value: Any) -> bool:
    """Whether a value given for a list is one item of it (not "a, b", which may be one or two)."""
    if isinstance(value, str):
        return bool(value.strip()) and not re.search(r"[,;\n]", value)
    return isinstance(value, dict | int | float) and not isinstance(value, bool)


_OBJECT_ERRORS = frozenset({"model_type", "dict_type", "dataclass_type", "model_attributes_type"})


def _fits_at(adapter: TypeAdapter[Any], value: Any, loc: tuple[Any, ...]) -> bool:
    """Whether the value has no validation error at `loc` (or inside it)."""
    if value is _NOTHING:
        return False
    try:
        adapter.validate_python(value)
    except ValidationError as exc:
        return not any(tuple(e["loc"])[: len(loc)] == loc for e in exc.errors(include_url=False))
    return True


def _replaced(value: Any, loc: tuple[Any, ...], new: Any) -> Any:
    """A copy of the value with the part at `loc` replaced; `_NOTHING` when `loc` is not in it."""
    if not loc:
        return new
    value = copy.deepcopy(value)
    parent = _at(value, loc[:-1])
    key = loc[-1]
    if isinstance(parent, dict) and key in parent or isinstance(parent, list) and isinstance(key, int):
        try:
            parent[key] = new
        except IndexError:
            return _NOTHING
        return value
    return _NOTHING


def _at(value: Any, loc: tuple[Any, ...]) -> Any:
    for key in loc:
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            return _NOTHING
    return value


def _renamed_key(value: Any, loc: tuple[Any, ...]) -> Any:
    """A required field written with other case or separators (`"Population"`, `"first-name"`)."""
    if not loc or not isinstance(loc[-1], str):
        return _NOTHING
    parent = _at(value, loc[:-1])
    if not isinstance(parent, dict):
        return _NOTHING
    field = _key_form(loc[-1])
    matches = [k for k in parent if isinstance(k, str) and _key_form(k) == field]
    if len(matches) != 1:
        return _NOTHING
    parent[loc[-1]] = parent.pop(matches[0])  # `value` is already a copy (`_fixed`)
    return value


def _key_form(key: str) -> str:
    return re.sub(r"[\s_\-]", "", key).lower()


_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_NUMBER_RE = re.compile(_NUMBER)
_GROUPED_RE = re.compile(r"[-+]?\d{1,3}(?:([, \u00a0\u202f])\d{3})(?:\1\d{3})*(?:\.\d+)?")
_CURRENCY_LEAD_RE = re.compile(r"^[$€£¥₹]\s*")
_CURRENCY_TAIL_RE = re.compile(r"(?:[$€£¥₹]|USD|EUR|GBP|JPY|CHF)$", re.IGNORECASE)


def _without_currency(text: str) -> str:
    """`text` without a currency sign before it or a currency after it (with the blank space between).
    The blank space is taken off once the currency is found: one regex matching both tried every position
    of a run of blank space, in time growing with its square (16 s for a 20 kB value)."""
    text = _CURRENCY_LEAD_RE.sub("", text, count=1)
    tail = _CURRENCY_TAIL_RE.search(text)
    return text if tail is None else text[: tail.start()].rstrip() + text[tail.end() :]


_IN_PROSE_RE = re.compile(
    r"(?<![\w.,])[-+]?\d[\d,]*(?:\.\d+)?(?![\w%]|[.,]\d|\s*(?:%|percent|per cent|thousand|million|billion|"
    r"trillion|hundred|dozen|k\b|m\b|bn\b))",
    re.IGNORECASE,
)


# a minus sign written as U+2212 or a dash (not a range's dash, "2–5"), or as a word: "−5", "minus 5"
_MINUS_SIGN_RE = re.compile(r"(?<![\w.,])[\u2212\u2013\u2014\ufe63\uff0d][ \t]?(?=\.?\d)")
_MINUS_WORD_RE = re.compile(r"\b(?:minus|negative)[ \t]+(?=\.?\d)", re.IGNORECASE)
# "3 and a half", "2 and three quarters": a number its digits alone do not give
_FRACTION_WORD_RE = re.compile(
    r"\d[ \t]+and[ \t]+(?:an?|one|two|three)[ \t]+(?:half|halves|thirds?|quarters?|fifths?|eighths?)\b",
    re.IGNORECASE,
)


def _number(text: str) -> str | None:
    """A number written as text, as JSON would write it: "1,234.5" → "1234.5", "$12.50" → "12.50",
    "**42**" → "42", "The answer is 42." → "42"; None when it is not one number (several, "12%" — 12 or
    0.12? —, "1.2 million", "about 700k")."""
    text = _MINUS_WORD_RE.sub("-", _MINUS_SIGN_RE.sub("-", text))
    if _FRACTION_WORD_RE.search(text):
        return None
    plain = _without_currency(_undecorated(text))
    if _NUMBER_RE.fullmatch(plain):
        return plain
    if _GROUPED_RE.fullmatch(plain):
        return re.sub(r"[, \u00a0\u202f]", "", plain)
    found = {m.group().replace(",", "") for m in _IN_PROSE_RE.finditer(text) if _grouping_ok(m.group())}
    return found.pop() if len(found) == 1 else None


def _grouping_ok(number: str) -> bool:
    whole = number.split(".")[0].lstrip("+-")
    return "," not in whole or bool(re.fullmatch(r"\d{1,3}(?:,\d{3})+", whole))


def _undecorated(text: str) -> str:
    """The text without markdown emphasis, quotes, code marks and a closing full stop."""
    return text.strip().strip("*_`'\"“”‘’ \t\n").rstrip(".!").strip()


def _word_variants(text: str) -> list[str]:
    """An enum value or a boolean as the model may have written it: in another case, quoted, bold, with
    a full stop, or as a word of a short sentence ("The answer is yes." — not "No, the answer is yes",
    where two values fit, nor "not yes")."""
    plain = _undecorated(text)
    words = re.findall(r"[\w-]+", plain)
    bases = [plain]
    if 1 < len(words) <= _SENTENCE_WORDS and not _NEGATION.intersection(w.lower() for w in words):
        bases += words
    return [form for base in bases for form in (base, base.lower(), base.upper(), base.capitalize())]


_SENTENCE_WORDS = 12
_NEGATION = frozenset(
    {"not", "never", "isn't", "isnt", "cannot", "can't", "don't", "doesn't", "neither", "nor"}
)


# ------------------------------------------------------------------------------- telling the model


def _has_placeholder(value: Any) -> bool:
    """Whether a value still holds a `<string>`-style placeholder of the shape a correction shows."""
    if isinstance(value, str):
        return bool(_PLACEHOLDER_RE.fullmatch(value.strip()))
    if isinstance(value, BaseModel):
        value = value.model_dump()
    elif is_dataclass(value) and not isinstance(value, type):
        value = asdict(value)
    if isinstance(value, dict):
        return any(_has_placeholder(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_placeholder(v) for v in value)
    return False


def _placeholder_error(value: Any) -> ValidationError:
    return ValidationError.from_exception_data(
        "placeholder",
        [
            {
                "type": "value_error",
                "loc": (),
                "input": value,
                "ctx": {"error": ValueError("it still holds a <…> placeholder instead of a real value")},
            }
        ],
    )


def _diagnosis(reading: _Reading, error: ValidationError) -> str:
    """What is wrong with the answer, in words the model can act on."""
    found = reading.whole or reading.inner
    if reading.cut_off and not found:
        return (
            "the JSON in the final answer is cut off (it opens but never closes — was it too long?); "
            "write it complete."
        )
    what = f"the final answer does not match the required format: {_explain(error)}."
    echoed = next((v for v in found if isinstance(v, dict) and _is_schema(v)), None)
    if echoed is not None:
        return f"{what} It repeats the JSON Schema instead of giving values that match it."
    return what


def _is_schema(value: dict[str, Any]) -> bool:
    return "properties" in value and ("type" in value or "required" in value or "$schema" in value)


def _explain(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False)[:6]:
        where = ".".join(str(p) for p in err["loc"]) or "the answer"
        given = "" if err["type"] == "missing" else f" (got {_short(err['input'])})"
        parts.append(f"{where}: {err['msg']}{given}")
    return "; ".join(parts)


def _short(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}… ({len(text):,} characters)"


def _shape(schema: dict[str, Any], defs: dict[str, Any], depth: int = 0) -> str:
    """The answer's shape, for a correction: `{"name": <string>, "population": <integer>}`."""
    if depth > 4:
        return "<…>"
    ref = schema.get("$ref")
    if isinstance(ref, str):
        schema = defs.get(ref.rsplit("/", 1)[-1], {})
    if "const" in schema or "enum" in schema:
        options = [schema["const"]] if "const" in schema else schema["enum"]
        return " or ".join(json.dumps(o, ensure_ascii=False) for o in options[:8])
    for key in ("anyOf", "oneOf"):
        options = [o for o in schema.get(key, []) if o.get("type") != "null"]
        if options:
            return _shape(options[0], defs, depth + 1)
    kind = schema.get("type")
    if kind == "object" and isinstance(schema.get("properties"), dict):
        fields = (f"{json.dumps(k)}: {_shape(v, defs, depth + 1)}" for k, v in schema["properties"].items())
        return "{" + ", ".join(fields) + "}"
    if kind == "array":
        return f"[{_shape(schema.get('items', {}), defs, depth + 1)}, …]"
    return f"<{kind}>" if isinstance(kind, str) else "<value>"
