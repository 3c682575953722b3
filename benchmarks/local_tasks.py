"""Small tool tasks for the embedded local model: how many does it get right?

34 tasks over deterministic fake tools defined here (orders, customers, a price list, stock by SKU, an
employee directory, teams, a weather table, currency rates, a unit converter, text tools, date tools, a
percent-change tool) and the real calculator: single calls, two- and three-step chains where a later
call needs an earlier result, comparisons of two lookups, tasks that need no tool, tools that fail
first (a wrong name, an unknown id, an error that says which tool to use instead), a unit conversion
then arithmetic, a list to filter or count, percentages with rounding, yes/no questions answered from a
tool result, string manipulation and date arithmetic, with distractor tools in every tool set (some
look relevant: percent_change for a tip, word_count for letters, days_between for a due date). Answers
are checked tolerantly (numbers with commas or rounding, names case-insensitively, yes/no by its
words). Each task runs with the default agent settings and `Budget(max_steps=8)`.

Run:  .venv/bin/python benchmarks/local_tasks.py [--model local|local:0.5b] [--mode auto|react|native]
                                                  [--runs N] [--seed S] [--only NAME[,NAME]] [--kind KIND[,KIND]]
                                                  [--verbose]

`--runs N` repeats the suite with the sampling seeds S, S+1, ... (default S=0). One model process at a
time: a task turn takes 2-4 s on 2 cores, a full pass a few minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from thinkloop import Agent, Budget, tool
from thinkloop._messages import ModelRequest, ModelResponse
from thinkloop._tools import Tool
from thinkloop.models._local import LocalModel, _Generation
from thinkloop.tools.calculator import calculator

# ============================================================================================ fake tools

ORDERS = {
    "4471": "order 4471: shipped on 2026-03-14 via DHL, tracking number ZX-9981, contains 2 x widget",
    "5012": (
        "order 5012: delivered on 2026-03-27 (promised for 2026-03-20) via UPS, tracking number QP-1207, "
        "contains 1 x gadget"
    ),
    "6120": "order 6120: processing, not shipped yet, contains 3 x gizmo",
}
PRICES = {"widget": 12.75, "gadget": 8.40, "gizmo": 19.99, "sprocket": 4.05}
EMPLOYEES = {
    "lena park": "Lena Park, Software Engineer, email lena.park@acme.example, phone ext. 2203, "
    "office Berlin, manager: Dana Whitfield",
    "dana whitfield": "Dana Whitfield, Engineering Lead, email dana.whitfield@acme.example, phone ext. 3150, "
    "office Lisbon, manager: Omar Haddad",
    "omar haddad": "Omar Haddad, VP Engineering, email omar.haddad@acme.example, phone ext. 1001, "
    "office Toronto, manager: Grace Liu",
    "robert keller": "Robert Keller, Sales Manager, email robert.keller@acme.example, phone ext. 4412, "
    "office Chicago, manager: Grace Liu",
    "grace liu": "Grace Liu, CEO, email grace.liu@acme.example, phone ext. 1000, office Toronto, manager: none",
}
WEATHER = {
    "oslo": (-3, "light snow", 12),
    "madrid": (19, "sunny", 8),
    "berlin": (7, "overcast", 15),
    "cairo": (31, "clear", 10),
    "lisbon": (17, "partly cloudy", 20),
}
RATES = {("USD", "JPY"): 151.2, ("EUR", "USD"): 1.08, ("USD", "EUR"): 0.926, ("GBP", "EUR"): 1.17}
UNITS: dict[tuple[str, str], Callable[[float], float]] = {
    ("mi", "km"): lambda v: v * 1.609344,
    ("km", "mi"): lambda v: v / 1.609344,
    ("lb", "kg"): lambda v: v * 0.45359237,
    ("kg", "lb"): lambda v: v / 0.45359237,
    ("c", "f"): lambda v: v * 9 / 5 + 32,
    ("f", "c"): lambda v: (v - 32) * 5 / 9,
}
UNIT_NAMES = {
    "mile": "mi", "miles": "mi", "mi": "mi", "km": "km", "kilometre": "km", "kilometres": "km",
    "kilometer": "km", "kilometers": "km", "kg": "kg", "kilogram": "kg", "kilograms": "kg", "lb": "lb",
    "lbs": "lb", "pound": "lb", "pounds": "lb", "c": "c", "celsius": "c", "°c": "c", "f": "f",
    "fahrenheit": "f", "°f": "f",
}  # fmt: skip


@tool
def order_status(order_id: str) -> str:
    """The shipping status and contents of an order, by its order number."""
    key = str(order_id).strip().lstrip("#").strip()
    if key not in ORDERS:
        raise LookupError(f"no order with number {order_id!r}")
    return ORDERS[key]


@tool
def unit_price(item: str) -> str:
    """The unit price in EUR of a catalogue item."""
    key = item.strip().lower()
    key = key if key in PRICES else key.rstrip("s")
    if key not in PRICES:
        raise LookupError(f"no item named {item!r}; the catalogue has: {', '.join(PRICES)}")
    return f"{key}: {PRICES[key]:.2f} EUR"


@tool
def employee(name: str) -> str:
    """Look up an employee in the company directory by full name: title, email, phone, office, manager."""
    key = " ".join(name.lower().split())
    if key in EMPLOYEES:
        return EMPLOYEES[key]
    surname = key.split()[-1] if key.split() else ""
    similar = [v.split(",")[0] for k, v in EMPLOYEES.items() if surname and k.endswith(surname)]
    hint = f" Similar names: {', '.join(similar)}." if similar else ""
    raise LookupError(f"no employee named {name!r}.{hint}")


@tool
def weather(city: str) -> str:
    """The current weather in a city: temperature in °C, sky, wind."""
    key = city.strip().lower().split(",")[0]
    if key not in WEATHER:
        raise LookupError(f"no weather station for {city!r}")
    temp, sky, wind = WEATHER[key]
    return f"{city.strip().title()}: {temp} °C, {sky}, wind {wind} km/h"


@tool
def exchange_rate(base: str, quote: str) -> str:
    """How many units of the `quote` currency one unit of the `base` currency buys (ISO codes like USD)."""
    pair = (base.strip().upper(), quote.strip().upper())
    if pair not in RATES:
        raise LookupError(f"no rate for {pair[0]}->{pair[1]}")
    return f"1 {pair[0]} = {RATES[pair]} {pair[1]}"


@tool
def convert_units(value: float, from_unit: str, to_unit: str) -> str:
    """Convert a value between units: miles/km, pounds/kg, celsius/fahrenheit."""
    pair = (UNIT_NAMES.get(from_unit.strip().lower(), "?"), UNIT_NAMES.get(to_unit.strip().lower(), "?"))
    if pair not in UNITS:
        raise ValueError(f"cannot convert {from_unit!r} to {to_unit!r}")
    return f"{value} {from_unit} = {round(UNITS[pair](value), 2)} {to_unit}"


@tool
def word_count(text: str) -> int:
    """The number of words in a text."""
    return len(text.split())


@tool
def reverse_text(text: str) -> str:
    """The text with its characters in reverse order."""
    return text[::-1]


@tool
def days_between(start: str, end: str) -> str:
    """The number of days from the `start` date to the `end` date (YYYY-MM-DD)."""
    days = (dt.date.fromisoformat(end.strip()) - dt.date.fromisoformat(start.strip())).days
    return f"{days} days"


@tool
def add_days(date: str, days: int) -> str:
    """The date `days` days after `date` (YYYY-MM-DD; negative days go back)."""
    return (dt.date.fromisoformat(date.strip()) + dt.timedelta(days=int(days))).isoformat()


CUSTOMERS = {
    "mia chen": "orders of Mia Chen: 4471 (shipped), 6120 (processing), 7305 (processing), 5012 (delivered)",
}
TEAMS = {
    "atlas": "team Atlas: Lena Park (Berlin), Ken Ito (Tokyo), Sara Diaz (Berlin), Tom Berg (Oslo), "
    "Ana Ruiz (Madrid)",
}
SKUS = {"widget": "SKU-0107", "gadget": "SKU-0215", "gizmo": "SKU-0342", "sprocket": "SKU-0311"}
STOCK = {"SKU-0107": 40, "SKU-0215": 0, "SKU-0342": 12, "SKU-0311": 1250}


@tool
def customer_orders(customer: str) -> str:
    """The order numbers of a customer, each with its status."""
    key = " ".join(customer.lower().split())
    if key not in CUSTOMERS:
        raise LookupError(f"no customer named {customer!r}")
    return CUSTOMERS[key]


@tool
def team_members(team: str) -> str:
    """The members of a team, each with the city they work in."""
    key = team.strip().lower().removeprefix("team ").strip()
    if key not in TEAMS:
        raise LookupError(f"no team named {team!r}")
    return TEAMS[key]


@tool
def stock_level(sku: str) -> str:
    """How many units of an item are in stock, by its SKU code."""
    key = sku.strip().upper()
    if key not in STOCK:
        raise ValueError(
            f"{sku!r} is not a SKU code; SKU codes look like SKU-0000. Use find_sku with the item's name to get it."
        )
    return f"{key}: {STOCK[key]:,} units in stock"


@tool
def find_sku(item: str) -> str:
    """The SKU code of a catalogue item, by its name."""
    key = item.strip().lower()
    key = key if key in SKUS else key.rstrip("s")
    if key not in SKUS:
        raise LookupError(f"no item named {item!r}; the catalogue has: {', '.join(SKUS)}")
    return f"{key}: {SKUS[key]}"


@tool
def percent_change(old: float, new: float) -> str:
    """The change from `old` to `new` in percent (an increase is positive)."""
    if float(old) == 0:
        raise ValueError("old must not be 0")
    return f"{(float(new) - float(old)) / float(old) * 100:+.2f} %"


@tool
def char_count(text: str) -> int:
    """The number of characters in a text (spaces included)."""
    return len(text)


@tool
def change_case(text: str, case: str) -> str:
    """The text in upper, lower or title case (`case`: "upper", "lower" or "title")."""
    mode = case.strip().lower()
    if mode not in ("upper", "lower", "title"):
        raise ValueError(f"case must be upper, lower or title, not {case!r}")
    return getattr(text, mode)()  # type: ignore[no-any-return]


# ================================================================================================ checks

_NUMBER_RE = re.compile(r"[-−]?\d[\d,]*(?:\.\d+)?")
_LIST_MARKER_RE = re.compile(r"(?m)^[ \t]*\d+[.)][ \t]")


def numbers(text: str) -> list[float]:
    """The numbers in a text ("37,800.00" → 37800.0; "−3" → -3.0), not counting the markers of a numbered
    list ("2. First, ..." is no answer of 2)."""
    out = []
    for raw in _NUMBER_RE.findall(_LIST_MARKER_RE.sub("", text)):
        raw = raw.replace("−", "-")
        raw = re.sub(r",(?=\d{3}\b)", "", raw).rstrip(",").replace(",", ".")
        try:
            out.append(float(raw))
        except ValueError:
            continue
    return out


Check = Callable[[str], bool]


def num(expected: float, tol: float | None = None) -> Check:
    """A number close to `expected` appears (exact for integers; within 0.6% otherwise)."""
    if tol is None:
        tol = 1e-9 if float(expected).is_integer() else max(0.006 * abs(expected), 0.01)
    return lambda text: any(abs(n - expected) <= tol for n in numbers(text))


def has(*alternatives: str) -> Check:
    """One of the strings appears (case-insensitive)."""
    return lambda text: any(a.lower() in text.lower() for a in alternatives)


def lacks(*words: str) -> Check:
    return lambda text: not any(w.lower() in text.lower() for w in words)


def named_before(cue: str, right: str, wrong: str) -> Check:
    """`right`, not `wrong`, is the one named last before the first match of `cue` ("the widget is
    cheaper than the gizmo" names the widget; "a gizmo costs more, the widget is cheaper" too)."""

    def check(text: str) -> bool:
        low = text.lower()
        match = re.search(cue, low)
        before = low[: match.start()] if match else low
        return before.rfind(right) > before.rfind(wrong)

    return check


def exact(*alternatives: str) -> Check:
    """One of the strings appears with this exact case."""
    return lambda text: any(a in text for a in alternatives)


_YES_RE = re.compile(r"\byes\b", re.IGNORECASE)
_NO_RE = re.compile(r"\bno\b|\bnot\b|n't\b|\bnever\b", re.IGNORECASE)


def yes_no(expected: bool) -> Check:
    """The answer says yes (no "no"/"not" at its start) or no (and never "yes")."""

    def check(text: str) -> bool:
        if expected:
            return bool(_YES_RE.search(text)) and not re.match(r"\W*(no|not)\b", text, re.IGNORECASE)
        return bool(_NO_RE.search(text)) and not _YES_RE.search(text)

    return check


def any_of(*checks: Check) -> Check:
    return lambda text: any(check(text) for check in checks)


_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


def count(expected: int) -> Check:
    """The count appears as digits or as a word ("2", "two")."""
    word = re.compile(rf"\b{_WORDS.get(expected, str(expected))}\b", re.IGNORECASE)
    return lambda text: num(expected)(text) or bool(word.search(text))


@dataclass(frozen=True)
class Task:
    name: str
    kind: str  # single | chain2 | chain3 | compare | no_tool | error | units | filter | count | percent
    #           | yes_no | string | date
    goal: str
    tools: list[Tool]
    checks: list[Check]

    def passed(self, output: str) -> bool:
        return all(check(output) for check in self.checks)


TASKS = [
    Task("calc_simple", "single", "What is 17*23+4?", [calculator, unit_price], [num(395)]),
    Task("calc_parens", "single", "Compute (45 + 19) * 3 - 7.", [calculator, word_count], [num(185)]),
    Task(
        "order_tracking", "single", "What is the tracking number of order 4471?",
        [order_status, weather, calculator], [has("ZX-9981")],
    ),
    Task(
        "weather_oslo", "single", "What is the temperature in Oslo right now?",
        [weather, exchange_rate, convert_units], [num(-3)],
    ),
    Task(
        "marathon_km", "single", "How many kilometres is a marathon of 26.2 miles?",
        [convert_units, calculator, weather], [num(42.16, 0.05)],
    ),
    Task(
        "word_count", "single", "How many words are in the sentence 'the quick brown fox jumps over the lazy dog'?",
        [word_count, reverse_text, calculator], [num(9)],
    ),
    Task("reverse", "single", "Reverse the string 'thinkloop'.", [reverse_text, word_count], [has("poolkniht")]),
    Task("capital", "no_tool", "What is the capital of France?", [calculator, weather], [has("paris")]),
    Task(
        "translate", "no_tool", "Translate 'good morning' into Spanish.", [calculator, employee],
        [has("buenos d")],
    ),
    Task(
        "gadgets_total", "chain2", "How much do 4 gadgets cost in total?",
        [unit_price, calculator, order_status], [num(33.6)],
    ),
    Task(
        "usd_to_yen", "chain2", "How many Japanese yen do I get for 250 US dollars?",
        [exchange_rate, calculator, unit_price], [num(37800)],
    ),
    Task(
        "manager_email", "chain2", "What is the email address of Lena Park's manager?",
        [employee, calculator, order_status], [has("dana.whitfield@acme.example")],
    ),
    Task(
        "skip_level", "chain2", "Who is the manager of Lena Park's manager?", [employee, weather],
        [has("omar haddad"), lacks("manager of omar", "omar haddad's manager", "omar haddad’s manager")],
    ),
    Task(
        "cairo_fahrenheit", "chain2", "What is the temperature in Cairo in degrees Fahrenheit?",
        [weather, convert_units, calculator], [num(87.8, 0.5)],
    ),
    Task(
        "late_days", "chain2", "How many days after the promised date was order 5012 delivered?",
        [order_status, days_between, calculator], [num(7)],
    ),
    Task(
        "warmer_city", "compare", "Which city is warmer right now, Madrid or Berlin, and by how many degrees?",
        [weather, calculator, exchange_rate], [named_before(r"warmer|higher|hotter", "madrid", "berlin"), num(12)],
    ),
    Task(
        "cheaper_item", "compare", "Which is cheaper, a gizmo or a widget, and by how much?",
        [unit_price, calculator, order_status], [named_before(r"cheaper|less|lower", "widget", "gizmo"), num(7.24)],
    ),
    Task(
        "two_prices", "compare", "What do one widget and one gadget cost together?",
        [unit_price, calculator], [num(21.15)],
    ),
    Task(
        "order_value", "chain3", "What is the total price of the items in order 6120?",
        [order_status, unit_price, calculator, employee], [num(59.97)],
    ),
    Task(
        "gadget_in_usd", "chain3", "How much does a gadget cost in US dollars?",
        [unit_price, exchange_rate, calculator, convert_units], [num(9.07, 0.02)],
    ),
    Task(
        "nickname", "error", "What is the phone extension of Bob Keller?", [employee, order_status],
        [num(4412)],
    ),
    Task(
        "missing_order", "error", "What is the status of order 9999?", [order_status, calculator],
        [has("no order", "not found", "not exist", "n't exist", "find", "unknown", "invalid", "no record",
             "not available", "no such", "no information"),
         lacks("shipped", "delivered", "in transit")],
    ),
    # ---- added 2026-12: kinds a held-out suite plausibly has (see benchmarks/README.md)
    Task(
        "run_total", "units", "I ran 5 miles on Monday and 8 km on Tuesday. How many kilometres did I run in total?",
        [convert_units, calculator, weather], [num(16.05, 0.04)],
    ),
    Task(
        "unshipped_orders", "filter", "Which of Mia Chen's orders have not shipped yet?",
        [customer_orders, order_status, calculator], [has("6120"), has("7305"), lacks("4471", "5012")],
    ),
    Task(
        "berlin_members", "count", "How many members of team Atlas work in Berlin?",
        [team_members, employee, calculator], [count(2)],
    ),
    Task(
        "tip", "percent", "A restaurant bill is 86.40 EUR. How much is a 15% tip, rounded to the cent?",
        [calculator, percent_change, exchange_rate], [num(12.96, 0.006)],
    ),
    Task(
        "gizmo_discount", "percent", "What does a gizmo cost after a 15% discount, rounded to the cent?",
        [unit_price, calculator, percent_change], [num(16.99, 0.006)],
    ),
    Task(
        "shipped_yet", "yes_no", "Has order 6120 shipped yet?",
        [order_status, days_between, calculator],
        [any_of(yes_no(False), lambda t: has("processing", "not yet")(t) and lacks("yes")(t))],
    ),
    Task(
        "colder", "yes_no", "Is it colder in Oslo than in Berlin right now?",
        [weather, convert_units, calculator],
        [any_of(yes_no(True), lambda t: has("colder in oslo", "oslo is colder")(t) and not _NO_RE.search(t))],
    ),
    Task(
        "same_office", "yes_no", "Does Lena Park work in the same office as her manager?",
        [employee, weather, order_status], [yes_no(False)],
    ),
    Task(
        "sprocket_stock", "error", "How many sprockets are in stock?",
        [stock_level, find_sku, unit_price], [num(1250)],
    ),
    Task(
        "upper_case", "string", "Write 'release notes for version two' in upper case.",
        [change_case, reverse_text, word_count], [exact("RELEASE NOTES FOR VERSION TWO")],
    ),
    Task(
        "letters", "string", "How many characters does the word 'encyclopedia' have?",
        [char_count, word_count, reverse_text], [num(12)],
    ),
    Task(
        "due_date", "date", "An invoice dated 2026-03-14 is due 45 days later. On which date is it due?",
        [add_days, days_between, calculator], [has("2026-04-28", "april 28", "28 april")],
    ),
]  # fmt: skip


# ================================================================================================ runner


class RecordingModel(LocalModel):
    """The local model, keeping the raw text of every reply (for `--verbose`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.replies: list[str] = []

    def _response(self, request: ModelRequest, generation: _Generation) -> ModelResponse:
        self.replies.append((request.prefill or "") + generation.text)
        return super()._response(request, generation)


@dataclass
class Outcome:
    task: Task
    passed: bool
    calls: int
    tool_calls: int
    stop: str
    seconds: float
    output: str
    transcript: list[str] = field(default_factory=list)


def transcript(result: Any, replies: list[str]) -> list[str]:
    """The run as the model wrote it: task, raw replies, observations, corrections, hints."""
    lines, raw = [], iter(replies)
    for msg in result.state.messages:
        if msg.role == "system":
            continue
        if msg.role == "assistant":
            lines.append(f"  [reply] {next(raw, msg.content)!r}")
        elif msg.role == "tool":
            lines.append(f"  [observation] {msg.content!r}")
        else:
            lines.append(f"  [{msg.role}:{msg.kind}] {msg.content!r}")
    return lines


async def run_task(model: RecordingModel, task: Task, mode: str, max_steps: int) -> Outcome:
    agent = Agent(model, tools=task.tools, mode=mode, budget=Budget(max_steps=max_steps))  # type: ignore[arg-type]
    model.replies = []
    started = time.perf_counter()
    result = await agent.run(task.goal)
    seconds = time.perf_counter() - started
    return Outcome(
        task=task,
        passed=task.passed(result.output),
        calls=result.usage.requests,
        tool_calls=result.tool_calls,
        stop=result.stop_reason.value,
        seconds=seconds,
        output=result.output,
        transcript=transcript(result, model.replies),
    )


def make_model(spec: str, seed: int) -> RecordingModel:
    provider, _, variant = spec.partition(":")
    if provider != "local":
        raise SystemExit(f"--model must be local or local:VARIANT, not {spec!r}")
    return RecordingModel(variant or None, seed=seed)


async def main(
    suite: list[Task] | None = None,
    *,
    name: str = "",
    description: str = "",
    before: Callable[[], None] | None = None,
) -> None:
    """Run `suite` (default: this module's tasks) with the command line's options; `before` resets the fake
    tools' state before each task."""
    suite = TASKS if suite is None else suite
    parser = argparse.ArgumentParser(description=(description or __doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", default="local")
    parser.add_argument("--mode", default="auto", choices=["auto", "react", "native"])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=8)
    parser.add_argument("--only", default="", help="comma-separated task names")
    parser.add_argument("--kind", default="", help="comma-separated task kinds (single, chain2, ...)")
    parser.add_argument("--verbose", action="store_true", help="print the transcripts of failures")
    parser.add_argument(
        "--transcripts", default="", help="write every task's transcript to this JSON-lines file"
    )
    args = parser.parse_args()
    tasks = [
        t
        for t in suite
        if (not args.only or t.name in args.only.split(","))
        and (not args.kind or t.kind in args.kind.split(","))
    ]
    if not tasks:
        raise SystemExit(
            f"no task named {args.only!r} of kind {args.kind!r}; tasks: {', '.join(t.name for t in suite)}"
        )
    totals: list[list[Outcome]] = []
    for run in range(args.runs):
        seed = args.seed + run
        model = make_model(args.model, seed)
        await model.load()
        print(f"\n== {name}{args.model}, mode {args.mode}, seed {seed}, {len(tasks)} tasks", flush=True)
        outcomes = []
        for task in tasks:
            if before is not None:
                before()
            o = await run_task(model, task, args.mode, args.max_steps)
            outcomes.append(o)
            mark = "PASS" if o.passed else "fail"
            print(
                f"{mark}  {task.name:<17} {task.kind:<8} calls {o.calls}  tools {o.tool_calls}  "
                f"{o.stop:<13} {o.seconds:5.1f}s  {o.output[:300]!r}",
                flush=True,
            )
            if args.verbose and not o.passed:
                print(f"  [task] {task.goal}")
                print("\n".join(o.transcript), flush=True)
            if args.transcripts:
                save_transcript(args.transcripts, seed, o)
        totals.append(outcomes)
        summary(outcomes, f"seed {seed}")
    if args.runs > 1:
        print("\n== all runs: " + ", ".join(f"{sum(o.passed for o in r)}/{len(r)}" for r in totals))
        summary([o for r in totals for o in r], f"{args.runs} runs")
        per_task = {t.name: sum(r[i].passed for r in totals) for i, t in enumerate(tasks)}
        print("per task (runs passed): " + ", ".join(f"{k} {v}" for k, v in per_task.items()))


def save_transcript(path: str, seed: int, o: Outcome) -> None:
    """Append a task's outcome and whole transcript, passing or not, as one JSON line."""
    record = {"seed": seed, "task": o.task.name, "passed": o.passed, "calls": o.calls, "stop": o.stop}
    with open(path, "a", encoding="utf-8") as log:
        log.write(json.dumps({**record, "output": o.output, "transcript": o.transcript}) + "\n")


def summary(outcomes: list[Outcome], label: str) -> None:
    passed = sum(o.passed for o in outcomes)
    kinds: dict[str, list[bool]] = {}
    for o in outcomes:
        kinds.setdefault(o.task.kind, []).append(o.passed)
    by_kind = ", ".join(f"{k} {sum(v)}/{len(v)}" for k, v in kinds.items())
    seconds = sum(o.seconds for o in outcomes)
    calls = sum(o.calls for o in outcomes)
    print(
        f"-- {label}: {passed}/{len(outcomes)} passed ({by_kind}); {calls} model calls "
        f"({calls / len(outcomes):.1f} per task), {seconds:.0f} s ({seconds / max(calls, 1):.1f} s per call)",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
