"""A choice between options the task names, checked against what separate tool calls gave each option.

"Is it cheaper to send a 4 kg parcel with Swiftpost or with Parcelo?" is answered by calling one tool once
per option (`parcel_rate` with `carrier` "swiftpost", then "parcelo"). The 1.5B model read both prices
right (9.09 and 9.39 EUR), wrote them in its thought, and answered "Parcelo"; it answered "Riverside opens
earlier" beside Riverside's `"opens": "12:00"` and Old Town's `"10:00"`. `choice_check` finds such answers:

1. the options are the values one argument of one tool took in successful calls — each written in the task,
   at least two, and the task asks for a choice ("… or …");
2. the task's comparative word ("cheaper", "earlier", "the most" …) says whether the lower or the higher
   value wins;
3. each option's value is the field its results give, the one field (a number, a time, a date) whose value
   differs between the options — or, of several, the one the task or the answer names ("opens" of "opens
   earlier") — or the one number of a short text result;
4. the answer picks an option: the only one it names, or the one named last before its comparative word.

Anything unsure gives None: the check only speaks when every step is certain.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_LOWER = (
    "less expensive", "cheaper", "cheapest", "earlier", "earliest", "sooner", "soonest", "colder", "coldest",
    "cooler", "coolest", "lower", "lowest", "smaller", "smallest", "lighter", "lightest", "shorter", "shortest",
    "fewer", "fewest", "less", "least", "closer", "closest", "nearer", "nearest",
)  # fmt: skip
_HIGHER = (
    "more expensive", "pricier", "priciest", "costlier", "dearer", "later", "latest", "warmer", "warmest",
    "hotter", "hottest", "higher", "highest", "larger", "largest", "bigger", "biggest", "heavier", "heaviest",
    "longer", "longest", "more", "most", "greater", "greatest", "farther", "further", "furthest",
)  # fmt: skip
_WORD_RE = re.compile(
    r"\b("
    + "|".join(w.replace(" ", r"\s+") for w in sorted(_LOWER + _HIGHER, key=len, reverse=True))
    + r")\b",
    re.IGNORECASE,
)
_RANKING_RE = re.compile(
    r"\b(faster|fastest|slower|slowest|newer|newest|older|oldest|younger|youngest|best|worst|maximum|minimum)\b",
    re.IGNORECASE,
)  # rank, with no one direction: "the oldest" may be the lowest year or the highest age
_NEGATED_RE = re.compile(r"\b(not|isn't|aren't|no)\b", re.IGNORECASE)
_TIME_RE = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)(?::([0-5]\d))?$")
_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_NUMBER_RE = re.compile(r"(?<![\w.])-?\d+(?:[.,]\d+)*(?![\w])")
CHOSEN = "the observations give each option"  # in the correction: told once a run


@dataclass(frozen=True, slots=True)
class Call:
    """A successful tool call: its tool, its arguments and its result's text."""

    name: str
    arguments: dict[str, Any]
    result: str


def choice_check(answer: str, goal: str, calls: Sequence[Call]) -> str | None:
    """The correction for an answer that picks the wrong one of the options the task names, by the values
    the options' tool results give (see the module's docstring); None when it picks the right one, or
    anything is unsure."""
    checked = _checked(answer, goal, calls)
    return None if checked is None else checked[0]


def righted_choice(answer: str, goal: str, calls: Sequence[Call]) -> str:
    """The answer with its wrong pick replaced by the right option, where the pick is written as the subject
    of the comparison ("Therefore, Parcelo is cheaper" → "Therefore, Swiftpost is cheaper"): for an answer
    given again after the correction, or forced (the 1.5B model, told the values, looked both prices up
    again and its forced answer picked Parcelo again). `answer` itself otherwise."""
    checked = _checked(answer, goal, calls)
    if checked is None or checked[1] is None:
        return answer
    start, end, best = checked[1]
    pick = answer[start:end]
    after = _where(best, answer[end:])  # "Riverside opens earlier than Old Town": the two sides swap
    rest = (
        answer[end:] if after is None else answer[end:][: after.start()] + pick + answer[end:][after.end() :]
    )
    return answer[:start] + best + rest


def _checked(answer: str, goal: str, calls: Sequence[Call]) -> tuple[str, tuple[int, int, str] | None] | None:
    word = _WORD_RE.search(goal)
    if word is None or not re.search(r"\bor\b", goal, re.IGNORECASE) or len(answer) > 600:
        return None
    lower = _direction(word.group(1))
    options = _options(goal, calls)
    values = _values(options, goal + " " + answer) if options else None
    if values is None:
        return None
    field, value = values
    picked = _pick(answer, list(value), lower)
    if picked is None:
        return None
    pick, span = picked
    best = (min if lower else max)(value, key=lambda o: value[o][0])
    if best == pick or sum(v[0] == value[best][0] for v in value.values()) > 1:
        return None
    listed = ", ".join(f"{o} {value[o][1]}" for o in value)
    what = f" ({field})" if field else ""
    correction = (
        f"The Final Answer picks {pick}, but {CHOSEN}{what}: {listed}. So {best} is the "
        f"{' '.join(word.group(1).lower().split())} one. Correct the answer."
    )
    return correction, None if span is None else (*span, best)


def comparative(text: str) -> str | None:
    """The first comparative or superlative word of a text ("cheaper", "the most", "earliest"), or None."""
    found = _WORD_RE.search(text) or _RANKING_RE.search(text)
    return None if found is None else " ".join(found.group(1).lower().split())


def _direction(word: str) -> bool:
    """Whether the lower value wins for this comparative word."""
    return " ".join(word.lower().split()) in _LOWER


def _options(goal: str, calls: Sequence[Call]) -> dict[str, list[Call]] | None:
    """The options: the values of the one (tool, argument) whose string values differ between calls and are
    all written in the task, each with its calls; None unless exactly one such argument has 2 to 6."""
    found: list[dict[str, list[Call]]] = []
    keys = {(c.name, k) for c in calls for k, v in c.arguments.items() if isinstance(v, str)}
    for name, key in sorted(keys):
        groups: dict[str, list[Call]] = {}
        for c in calls:
            value = c.arguments.get(key)
            if c.name == name and isinstance(value, str) and value.strip():
                groups.setdefault(" ".join(value.split()).lower(), []).append(c)
        if 2 <= len(groups) <= 6 and all(_written(v, goal) for v in groups):
            found.append({_as_written(v, goal): group for v, group in groups.items()})
    return found[0] if len(found) == 1 else None


def _written(value: str, text: str) -> bool:
    return _where(value, text) is not None


def _where(value: str, text: str) -> re.Match[str] | None:
    return re.search(rf"(?<!\w){re.escape(value)}(?!\w)", text, re.IGNORECASE)


def _as_written(value: str, text: str) -> str:
    """`value` as `text` writes it ("swiftpost" → "Swiftpost")."""
    found = _where(value, text)
    return value if found is None else found.group(0)


def _values(options: dict[str, list[Call]], words: str) -> tuple[str, dict[str, tuple[float, str]]] | None:
    """The field compared and each option's (value, value as written); None when unsure."""
    records = {o: _record(calls) for o, calls in options.items()}
    if all(r is not None for r in records.values()):
        return _field_values(records, words)  # type: ignore[arg-type]
    single = {o: _single_number(calls) for o, calls in options.items()}
    if any(v is None for v in single.values()):
        return None
    return "", {o: v for o, v in single.items() if v is not None}


def _record(calls: list[Call]) -> dict[str, tuple[float, str]] | None:
    """The comparable fields (numbers, times, dates) of an option's JSON object result; None when its
    results are no JSON object or disagree."""
    seen: dict[str, tuple[float, str]] | None = None
    for c in calls:
        try:
            value = json.loads(c.result)
        except (ValueError, RecursionError):
            return None
        if not isinstance(value, dict):
            return None
        fields = {str(k): v for k, v in ((k, _comparable(v)) for k, v in value.items()) if v is not None}
        if seen is not None and fields != seen:
            return None
        seen = fields
    return seen


def _comparable(value: Any) -> tuple[float, str] | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value), f"{value:g}" if isinstance(value, float) else str(value)
    if not isinstance(value, str):
        return None
    text = value.strip()
    time = _TIME_RE.match(text)
    if time:
        return int(time[1]) * 3600 + int(time[2]) * 60 + int(time[3] or 0), text
    if _DATE_RE.match(text):
        try:
            return float(dt.date.fromisoformat(text).toordinal()), text
        except ValueError:
            return None
    return None


def _field_values(
    records: dict[str, dict[str, tuple[float, str]]], words: str
) -> tuple[str, dict[str, tuple[float, str]]] | None:
    """The one field whose values differ between the options (of several, the one whose name the task or
    the answer writes: `opens` of "opens earlier"), with each option's value."""
    shared = set.intersection(*(set(r) for r in records.values()))
    differ = sorted(k for k in shared if len({r[k][0] for r in records.values()}) > 1)
    if len(differ) > 1:
        written = {w[:5] for w in re.findall(r"[a-z]{4,}", words.lower())}
        differ = [
            k for k in differ if any(part[:5] in written for part in re.findall(r"[a-z]{4,}", k.lower()))
        ]
    if len(differ) != 1:
        return None
    (field,) = differ
    return field, {o: r[field] for o, r in records.items()}


def _single_number(calls: list[Call]) -> tuple[float, str] | None:
    """The one number of an option's short text results (`gizmo: 19.99 EUR`), the same in each; None
    otherwise."""
    found = set()
    for c in calls:
        if len(c.result) > 200:
            return None
        numbers = _NUMBER_RE.findall(c.result)
        if len(numbers) != 1:
            return None
        found.add(numbers[0])
    if len(found) != 1:
        return None
    (written,) = found
    try:
        return float(written.replace(",", "")), written
    except ValueError:
        return None


Picked = tuple[str, tuple[int, int] | None]  # the option, and where the answer names it as the one picked


def _pick(answer: str, options: list[str], lower: bool) -> Picked | None:
    """The option the answer picks: the only one it names, or the one named last before its first
    comparative word (the other one, of two, when that word points the other way: "Parcelo is more
    expensive than Swiftpost" picks Swiftpost for "cheaper"). None when unsure or negated."""
    first = _WORD_RE.search(answer)
    if first is not None and _NEGATED_RE.search(answer[max(0, first.start() - 30) : first.end()]):
        return None
    named = [o for o in options if _written(o, answer)]
    if len(named) == 1:
        found = list(re.finditer(rf"(?<!\w){re.escape(named[0])}(?!\w)", answer, re.IGNORECASE))
        span = found[0].span() if len(found) == 1 and first is not None else None  # not a bare name
        if first is None or _direction(first.group(1)) == lower:
            return named[0], span
        return (next(o for o in options if o != named[0]), None) if len(options) == 2 else None
    if first is None or len(named) < 2:
        return None
    before = answer[: first.start()].lower()
    positions = {o: before.rfind(o.lower()) for o in named}
    subject = max(positions, key=lambda o: positions[o])
    if positions[subject] < 0:
        return None
    if _direction(first.group(1)) == lower:
        return subject, (positions[subject], positions[subject] + len(subject))
    others = [o for o in options if o != subject]
    return (others[0], None) if len(options) == 2 else None
