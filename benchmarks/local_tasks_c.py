"""A third suite of small tool tasks, written after the engine was tuned on the first two: does it generalise?

`local_tasks.py` and `local_tasks_b.py` are what the prompt, the parser and the guards were tuned on. These
27 tasks are over domains and tool shapes neither has, with deterministic fake tools defined here: a library
catalogue (search, then details; a bool filter; a member's loans as nested records; opening hours by an enum
day, called twice and compared), a train timetable (a multi-argument tool returning a list of records), a
warehouse's stock as nested JSON (zones holding bins) with an item master, a to-do list whose tools change
state (add, list by an enum status, complete by id: the checks read the list afterwards), a meeting-room
booking whose error says the form a time must have, parcel rates called twice with different arguments and
compared, a recipe scaled by an optional argument, a time-zone converter, a server log and release notes
long enough to search (a few thousand characters), a task that needs no tool, answers that are "not found",
and goals phrased casually, with typos. Most tools return dicts and lists (rendered as JSON by the engine),
not text. Checks are tolerant like the other suites'. Each task runs with the default agent settings and
`Budget(max_steps=8)`.

Run:  .venv/bin/python benchmarks/local_tasks_c.py [--model local|local:0.5b] [--mode auto|react|native]
                                                    [--runs N] [--seed S] [--only NAME[,NAME]] [--kind KIND]
                                                    [--verbose]
"""

from __future__ import annotations

import asyncio
import copy
import difflib
import re
from typing import Any, Literal

from local_tasks import (  # the runner and the answer checks are shared with the first suite
    Check,
    Task,
    any_of,
    count,
    has,
    lacks,
    main,
    named_before,
    num,
    yes_no,
)
from local_tasks_b import NOT_FOUND

from thinkloop import tool
from thinkloop.tools.calculator import calculator

# ================================================================================================ library

BOOKS: list[dict[str, Any]] = [
    {"isbn": "978-3-16-148410-0", "title": "The Glass Harbour", "author": "Ines Marlow", "year": 2019,
     "pages": 384, "publisher": "Larkspur Press", "copies_available": 2},
    {"isbn": "978-0-14-044913-6", "title": "Harbour Lights", "author": "Dana Okafor", "year": 2015,
     "pages": 251, "publisher": "Northgate", "copies_available": 0},
    {"isbn": "978-1-86197-876-9", "title": "Salt and Ember", "author": "Tomas Reyes", "year": 2021,
     "pages": 296, "publisher": "Larkspur Press", "copies_available": 0},
    {"isbn": "978-0-306-40615-7", "title": "A Map of Quiet Rivers", "author": "Tomas Reyes", "year": 2017,
     "pages": 412, "publisher": "Northgate", "copies_available": 3},
    {"isbn": "978-0-7432-7356-5", "title": "Winter at Vell Point", "author": "Tomas Reyes", "year": 2023,
     "pages": 228, "publisher": "Brightwater", "copies_available": 1},
    {"isbn": "978-1-4028-9462-6", "title": "Ember Days", "author": "Ines Marlow", "year": 2022,
     "pages": 317, "publisher": "Brightwater", "copies_available": 5},
]  # fmt: skip
_STOP = {"the", "and", "book", "books", "by", "called", "novel", "title", "author", "copy", "copies", "library"}  # fmt: skip


def _words(text: str) -> list[str]:
    return [w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) > 2 and w not in _STOP]


def _matches(word: str, book: dict[str, Any]) -> bool:
    """A word of the query is in the book's title or author, spelt nearly right ("harbor" finds "Harbour")."""
    return bool(difflib.get_close_matches(word, _words(f"{book['title']} {book['author']}"), n=1, cutoff=0.8))


@tool
def search_catalogue(query: str, available_only: bool = False) -> list[dict[str, Any]]:
    """Search the library catalogue by words of a title or an author's name.

    Args:
        query: words of the title or of the author's name.
        available_only: only books with a copy on the shelf now.
    """
    words = _words(query)
    scored = [(sum(_matches(w, b) for w in words), b) for b in BOOKS]
    best = max((s for s, _ in scored), default=0)
    hits = [b for s, b in scored if best and s == best and s * 2 >= len(words)]
    if available_only:
        hits = [b for b in hits if b["copies_available"] > 0]
    return [{k: b[k] for k in ("isbn", "title", "author", "copies_available")} for b in hits]


@tool
def book_details(isbn: str) -> dict[str, Any]:
    """The catalogue record of a book by its ISBN: title, author, year, pages, publisher, copies available."""
    key = isbn.strip().replace(" ", "")
    for book in BOOKS:
        if book["isbn"] == key or book["isbn"].replace("-", "") == key.replace("-", ""):
            return dict(book)
    raise LookupError(f"no book with ISBN {isbn!r}; search_catalogue gives the ISBNs")


LOANS = {
    "M-2207": {"member": "M-2207", "name": "Jonas Feld", "loans": [
        {"title": "Salt and Ember", "isbn": "978-1-86197-876-9", "due": "2026-12-03", "overdue": True},
        {"title": "Ember Days", "isbn": "978-1-4028-9462-6", "due": "2026-12-18", "overdue": False},
        {"title": "Harbour Lights", "isbn": "978-0-14-044913-6", "due": "2026-11-29", "overdue": True},
    ]},
}  # fmt: skip


@tool
def member_loans(member_id: str) -> dict[str, Any]:
    """The books a library member has on loan, with their due dates."""
    key = member_id.strip().upper()
    if key not in LOANS:
        raise LookupError(f"no member {member_id!r}; member ids look like M-0000")
    return LOANS[key]


HOURS = {
    "old town": {"saturday": ("09:00", "18:00"), "sunday": ("10:00", "16:00")},
    "riverside": {"saturday": ("10:00", "20:00"), "sunday": ("12:00", "17:00")},
    "hillcrest": {"saturday": ("09:30", "13:00"), "sunday": ("closed", "closed")},
}
Day = Literal["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]


@tool
def branch_hours(branch: str, day: Day) -> dict[str, str]:
    """The opening hours of a library branch on a day of the week."""
    key = branch.strip().lower().removesuffix(" branch").removesuffix(" library").strip()
    if key not in HOURS:
        raise LookupError(f"no branch named {branch!r}; branches: Old Town, Riverside, Hillcrest")
    opens, closes = HOURS[key].get(day, ("08:00", "20:00"))
    return {"branch": key.title(), "day": day, "opens": opens, "closes": closes}


# ================================================================================================ trains

TRAINS = {
    ("lindau", "bregenz"): [
        ("RE 3310", "13:48", "14:11", 0, "1"), ("RE 3312", "14:18", "14:41", 0, "4"),
        ("S 7", "14:52", "15:30", 1, "2"), ("RE 3314", "15:18", "15:41", 0, "4"),
        ("RE 3316", "16:18", "16:41", 0, "4"),
    ],
    ("lindau", "kempten"): [
        ("RB 57", "08:05", "09:40", 1, "3"), ("RE 7", "08:40", "09:52", 0, "2"),
        ("IC 2012", "09:05", "10:17", 0, "1"), ("RB 59", "09:35", "11:02", 1, "3"),
        ("RE 17", "10:40", "11:52", 0, "2"),
    ],
}  # fmt: skip


@tool
def train_times(
    origin: str, destination: str, date: str, after: str = "00:00", direct_only: bool = False
) -> list[dict[str, Any]]:
    """Trains from one station to another on a date (YYYY-MM-DD), leaving at or after a time.

    Args:
        origin: the departure station.
        destination: the arrival station.
        date: the day of travel, YYYY-MM-DD.
        after: the earliest departure, HH:MM (24-hour).
        direct_only: only trains without a change.
    """
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date.strip()):
        raise ValueError(f"date {date!r} is not YYYY-MM-DD (like 2027-03-24)")
    if not re.fullmatch(r"\d{1,2}:\d{2}", after.strip()):
        raise ValueError(f"after {after!r} is not a 24-hour time HH:MM (like 07:45 or 19:00)")
    pair = (origin.strip().lower().split(",")[0], destination.strip().lower().split(",")[0])
    if pair not in TRAINS:
        raise LookupError(f"no connections from {origin!r} to {destination!r}")
    earliest = after.strip().zfill(5)
    return [
        {"train": t, "departs": dep, "arrives": arr, "changes": ch, "platform": pl}
        for t, dep, arr, ch, pl in TRAINS[pair]
        if dep >= earliest and (ch == 0 or not direct_only)
    ]


# ============================================================================================= inventory

SITES: dict[str, dict[str, Any]] = {
    "hamburg": {"site": "Hamburg", "zones": [
        {"zone": "A", "bins": [{"bin": "A-01", "sku": "BOLT-M6", "qty": 1200},
                               {"bin": "A-02", "sku": "NUT-M6", "qty": 3400}]},
        {"zone": "B", "bins": [{"bin": "B-07", "sku": "BOLT-M6", "qty": 850},
                               {"bin": "B-09", "sku": "HINGE-H40", "qty": 35}]},
        {"zone": "C", "bins": [{"bin": "C-02", "sku": "WASHER-W10", "qty": 5000}]},
    ]},
}  # fmt: skip
SKU_INFO = {
    "BOLT-M6": {"sku": "BOLT-M6", "name": "hex bolt M6 x 30", "unit_cost_eur": 0.12, "reorder_level": 1500},
    "NUT-M6": {"sku": "NUT-M6", "name": "hex nut M6", "unit_cost_eur": 0.04, "reorder_level": 2000},
    "HINGE-H40": {"sku": "HINGE-H40", "name": "steel hinge 40 mm", "unit_cost_eur": 4.2, "reorder_level": 50},
    "WASHER-W10": {"sku": "WASHER-W10", "name": "washer 10 mm", "unit_cost_eur": 0.02, "reorder_level": 4000},
}


@tool
def site_stock(site: str) -> dict[str, Any]:
    """Everything in stock at a warehouse site, by zone and bin (SKU and quantity in each bin)."""
    key = site.strip().lower().removesuffix(" site").strip()
    if key not in SITES:
        raise LookupError(f"no site named {site!r}; sites: Hamburg")
    return SITES[key]


@tool
def sku_details(sku: str) -> dict[str, Any]:
    """An item's master data by SKU: name, unit cost in EUR, reorder level."""
    key = sku.strip().upper()
    if key not in SKU_INFO:
        raise LookupError(f"no SKU {sku!r}; SKUs look like BOLT-M6")
    return SKU_INFO[key]


# ============================================================================================ to-do list

_TODOS_START: list[dict[str, Any]] = [
    {"id": 1, "title": "book dentist appointment", "priority": "normal", "due": "2026-12-10", "done": False},
    {"id": 2, "title": "pay electricity bill", "priority": "high", "due": "2026-12-08", "done": False},
    {"id": 3, "title": "call grandma", "priority": "low", "due": None, "done": True},
    {"id": 4, "title": "submit expense report", "priority": "high", "due": "2026-12-11", "done": False},
    {"id": 5, "title": "return library books", "priority": "normal", "due": None, "done": True},
    {"id": 6, "title": "fix bike light", "priority": "low", "due": None, "done": False},
]
TODOS: list[dict[str, Any]] = []
Priority = Literal["low", "normal", "high"]


@tool
def list_todos(
    status: Literal["open", "done", "all"] = "open", priority: Priority | None = None
) -> list[dict[str, Any]]:
    """The items of my to-do list.

    Args:
        status: which items: open ones, done ones, or all.
        priority: only items of this priority (omit for all).
    """
    return [
        dict(t)
        for t in TODOS
        if (status == "all" or t["done"] == (status == "done"))
        and (priority is None or t["priority"] == priority)
    ]


@tool
def add_todo(title: str, priority: Priority = "normal", due: str | None = None) -> dict[str, Any]:
    """Add an item to my to-do list; returns the new item.

    Args:
        title: what is to be done.
        priority: how urgent it is.
        due: the date it is due, YYYY-MM-DD (omit if none).
    """
    item = {"id": max(t["id"] for t in TODOS) + 1, "title": title.strip(), "priority": priority, "due": due,
            "done": False}  # fmt: skip
    TODOS.append(item)
    return dict(item)


@tool
def complete_todo(todo_id: int) -> dict[str, Any]:
    """Mark an item of my to-do list as done, by its id."""
    for t in TODOS:
        if t["id"] == int(todo_id):
            t["done"] = True
            return {"completed": dict(t)}
    raise LookupError(f"no to-do item with id {todo_id}; list_todos gives the ids")


# ========================================================================================== meeting rooms

BOOKINGS: list[dict[str, Any]] = []
ROOMS = ("fjord", "delta", "summit")


@tool
def book_room(room: str, date: str, start: str, hours: int = 1) -> dict[str, Any]:
    """Book a meeting room.

    Args:
        room: the room's name.
        date: the day, YYYY-MM-DD.
        start: when the booking starts.
        hours: how long it lasts.
    """
    key = room.strip().lower().removesuffix(" room").removesuffix(" meeting").strip()
    if key not in ROOMS:
        raise LookupError(f"no room named {room!r}; rooms: Fjord, Delta, Summit")
    if not re.fullmatch(r"([01]\d|2[0-3]):[0-5]\d", start.strip()):
        raise ValueError(f"start must be a 24-hour time written HH:MM, like 08:30 or 17:00, not {start!r}")
    booking = {"booking": f"BK-{1042 + len(BOOKINGS)}", "room": key.title(), "date": date.strip(),
               "start": start.strip(), "hours": int(hours)}  # fmt: skip
    BOOKINGS.append(booking)
    return booking


@tool
def room_capacity(room: str) -> dict[str, Any]:
    """How many people a meeting room seats, and its equipment."""
    seats = {"fjord": 8, "delta": 4, "summit": 14}
    key = room.strip().lower().removesuffix(" room").strip()
    if key not in seats:
        raise LookupError(f"no room named {room!r}; rooms: Fjord, Delta, Summit")
    return {"room": key.title(), "seats": seats[key], "equipment": ["screen", "whiteboard"]}


# ========================================================================================= other tools

PARCEL = {"swiftpost": (5.49, 0.90), "parcelo": (4.99, 1.10), "boxline": (7.20, 0.55)}


@tool
def parcel_rate(
    carrier: Literal["swiftpost", "parcelo", "boxline"], weight_kg: float, express: bool = False
) -> dict[str, Any]:
    """The price of sending one parcel with a carrier.

    Args:
        carrier: the carrier.
        weight_kg: the parcel's weight in kg.
        express: next-day delivery instead of standard.
    """
    base, per_kg = PARCEL[carrier]
    price = base + per_kg * float(weight_kg) + (6.0 if express else 0.0)
    return {"carrier": carrier, "weight_kg": weight_kg, "service": "express" if express else "standard",
            "price_eur": round(price, 2)}  # fmt: skip


RECIPES = {
    "pancakes": [("flour", 200, "g"), ("milk", 500, "ml"), ("eggs", 2, ""), ("butter", 30, "g")],
    "tomato soup": [("tomatoes", 800, "g"), ("onion", 1, ""), ("stock", 600, "ml"), ("cream", 100, "ml")],
}


@tool
def recipe(dish: str, servings: int = 4) -> dict[str, Any]:
    """A recipe's ingredients, scaled to a number of servings.

    Args:
        dish: the dish's name.
        servings: how many people it is for.
    """
    key = dish.strip().lower()
    if key not in RECIPES:
        raise LookupError(f"no recipe for {dish!r}; recipes: {', '.join(RECIPES)}")
    factor = int(servings) / 4
    return {"dish": key, "servings": int(servings), "ingredients": [
        {"item": i, "amount": round(a * factor, 1) if a * factor % 1 else int(a * factor), "unit": u}
        for i, a, u in RECIPES[key]
    ]}  # fmt: skip


OFFSETS = {"london": 0, "tokyo": 9, "new york": -5, "berlin": 1, "sydney": 11, "sao paulo": -3}


@tool
def time_in(time: str, from_city: str, to_city: str) -> str:
    """What a clock time (HH:MM) in one city is in another city's time zone (December 2026)."""
    a, b = from_city.strip().lower(), to_city.strip().lower()
    for city in (a, b):
        if city not in OFFSETS:
            raise LookupError(f"no time zone for {city!r}; cities: {', '.join(c.title() for c in OFFSETS)}")
    match = re.fullmatch(r"(\d{1,2}):(\d{2})", time.strip())
    if not match:
        raise ValueError(f"time must be HH:MM, not {time!r}")
    minutes = int(match[1]) * 60 + int(match[2]) + (OFFSETS[b] - OFFSETS[a]) * 60
    day = {-1: " (the day before)", 0: "", 1: " (the next day)"}[minutes // 1440]
    return (
        f"{time.strip()} in {a.title()} is {minutes % 1440 // 60:02d}:{minutes % 60:02d} in {b.title()}{day}"
    )


def _log() -> str:
    lines = []
    for minute in range(0, 360, 4):
        stamp = f"2026-12-06 {minute // 60 + 1:02d}:{minute % 60:02d}:{(minute * 7) % 60:02d}"
        lines.append(f"{stamp} INFO  http: GET /api/health 200 in {3 + minute % 5} ms")
        if minute % 40 == 0:
            lines.append(f"{stamp} INFO  cron: rotated /var/log/app.log ({120 + minute} kB)")
        if minute == 60:
            lines.append("2026-12-06 02:00:01 INFO  backup: nightly backup of /var/lib/pg started")
        if minute == 76:
            lines.append("2026-12-06 02:16:55 WARN  backup: backup volume 91% full")
        if minute == 136:
            lines.append(
                "2026-12-06 03:17:42 ERROR backup: nightly backup of /var/lib/pg failed: disk quota exceeded"
            )
        if minute == 200:
            lines.append("2026-12-06 04:20:09 WARN  http: slow request GET /api/report took 2350 ms")
    return "\n".join(lines)


@tool
def server_log(host: str, level: Literal["all", "warn", "error"] = "all") -> str:
    """Last night's log of a server.

    Args:
        host: the server's name.
        level: all lines, or only warnings and errors, or only errors.
    """
    if host.strip().lower() != "db-2":
        raise LookupError(f"no log for host {host!r}; hosts: db-2")
    keep = {"all": ("INFO", "WARN", "ERROR"), "warn": ("WARN", "ERROR"), "error": ("ERROR",)}[level]
    return "\n".join(line for line in _log().splitlines() if line.split()[2] in keep)


RELEASES = [
    ("3.1.0", "2026-10-02", ["Tables can be sorted by any column.", "Faster start-up on large vaults.",
                             "Fixed: the word count ignored footnotes."]),
    ("3.0.0", "2026-06-15", ["New plugin system.", "Dropped support for the 1.x file format.",
                             "Dark mode follows the system setting."]),
    ("2.5.1", "2026-03-30", ["Fixed: a crash when closing an empty tab.", "Fixed: PDF export lost page margins."]),
    ("2.5.0", "2026-02-11", ["Spell checking in 14 languages.", "Export to EPUB.",
                             "Fixed: footnotes numbered twice in exports."]),
    ("2.4.2", "2025-12-01", ["Fixed: PDF export failed for documents with images.", "Faster search."]),
    ("2.4.0", "2025-10-20", ["Export to PDF.", "Word count in the status bar.", "Dark mode."]),
    ("2.3.0", "2025-07-07", ["Tabs.", "Export to HTML.", "Fixed: the cursor jumped after an undo."]),
    ("2.2.0", "2025-04-14", ["Footnotes.", "Templates for new documents.", "Autosave every 30 seconds."]),
    ("2.1.0", "2025-01-09", ["Outline view.", "Keyboard shortcuts can be changed.",
                             "Fixed: images lost on copy and paste."]),
    ("2.0.0", "2024-09-23", ["Complete rewrite; documents are stored as Markdown.", "Export to DOCX."]),
] + [
    (f"1.{minor}.{patch}", f"20{22 + minor // 4}-{minor % 4 * 3 + patch + 1:02d}-{10 + minor:02d}",
     [f"Fixed: {bug}." for bug in (f"issue #{400 + minor * 10 + patch} in the {area} view",
                                   "a typo in the settings dialog", f"slow opening of files over {minor + 1} MB")])
    for minor, area in zip(range(9, -1, -1), ["outline", "editor", "sidebar", "preview", "search"] * 2, strict=True)
    for patch in (1, 0)
]  # fmt: skip


@tool
def release_notes(product: str) -> str:
    """The release notes of one of our products, newest release first."""
    if product.strip().lower() != "quill":
        raise LookupError(f"no release notes for {product!r}; products: Quill")
    parts = [f"Quill release notes ({len(RELEASES)} releases)"]
    for version, date, notes in RELEASES:
        parts.append(f"\n## {version} ({date})\n" + "\n".join(f"- {n}" for n in notes))
    return "\n".join(parts)


# ================================================================================================ checks


def matches(pattern: str) -> Check:
    """The regular expression matches somewhere (case-insensitive)."""
    return lambda text: bool(re.search(pattern, text, re.IGNORECASE))


def absent_or_negated(word: str) -> Check:
    """`word` is not named, or only in a sentence that says it is not (available, open …)."""

    def check(text: str) -> bool:
        sentences = [s for s in re.split(r"(?<=[.;!?\n])\s*", text) if word.lower() in s.lower()]
        return all(
            re.search(r"\bnot\b|n't\b|\bno\b|\bunavailable\b|\b0\b|\bzero\b|\bnone\b", s, re.I)
            for s in sentences
        )

    return check


def todo_state(predicate: Any) -> Check:
    """The to-do list, after the run, satisfies `predicate` (the answer's text is not looked at)."""
    return lambda _text: bool(predicate(TODOS))


def booked(room: str, date: str, start: str, hours: int) -> Check:
    """Exactly one booking was made, and it is this one."""
    want = {"room": room, "date": date, "start": start, "hours": hours}
    return lambda _text: len(BOOKINGS) == 1 and {k: BOOKINGS[0][k] for k in want} == want


def _added_passport(todos: list[dict[str, Any]]) -> bool:
    new = [t for t in todos if t["id"] > 6]
    return len(new) == 1 and "passport" in new[0]["title"].lower() and new[0]["priority"] == "high"


def _dentist_done(todos: list[dict[str, Any]]) -> bool:
    return [t["id"] for t in todos if t["done"]] == [1, 3, 5] and len(todos) == 6


TASKS = [
    # ---- library: search returns records (a list of dicts), details by ISBN, a bool filter, nested loans
    Task(
        "book_author", "single", "Who wrote the novel 'The Glass Harbour'?",
        [search_catalogue, book_details, branch_hours], [has("ines marlow"), lacks("okafor")],
    ),
    Task(
        "book_pages", "chain2", "How many pages does 'A Map of Quiet Rivers' have?",
        [search_catalogue, book_details, calculator], [num(412)],
    ),
    Task(
        "borrowable_now", "bool_arg", "Which books by Tomas Reyes can I borrow right now?",
        [search_catalogue, book_details, member_loans],
        [has("quiet rivers"), has("vell point"), absent_or_negated("salt and ember")],
    ),
    Task(
        "copies_typo", "casual", "hey can u check how many copys of the glass harbor the libary has on the shelf rn?",
        [search_catalogue, book_details, calculator], [count(2)],
    ),
    Task(
        "missing_book", "not_found", "Does the library have a book called 'The Silent Orchard'?",
        [search_catalogue, book_details, branch_hours],
        [any_of(yes_no(False), NOT_FOUND), lacks("glass harbour", "ember")],
    ),
    Task(
        "loan_due", "nested", "When is member M-2207's copy of 'Ember Days' due back?",
        [member_loans, search_catalogue, calculator], [has("2026-12-18", "december 18", "18 december", "dec 18")],
    ),
    Task(
        "overdue_count", "count", "How many of member M-2207's loans are overdue?",
        [member_loans, book_details, calculator], [count(2)],
    ),
    Task(
        "opens_earlier", "compare", "Which library branch opens earlier on Sunday, Riverside or Old Town?",
        [branch_hours, search_catalogue, calculator],
        [named_before(r"earlier|first|sooner|before", "old town", "riverside")],
    ),
    # ---- trains: a multi-argument tool returning a list of records
    Task(
        "first_train", "multi_arg", "What is the first train from Lindau to Bregenz after 2 pm on 2026-12-12?",
        [train_times, time_in, calculator], [has("3312", "14:18")],
    ),
    Task(
        "direct_train", "bool_arg",
        "I need a direct train from Lindau to Kempten leaving after 08:00 on 2026-12-12. Which is the first one?",
        [train_times, time_in, calculator], [has("RE 7", "RE7", "08:40", "8:40"), lacks("RB 57")],
    ),
    Task(
        "journey_time", "compute", "How long does the 09:05 train from Lindau to Kempten take on 2026-12-12?",
        [train_times, calculator, time_in],
        [any_of(num(72), matches(r"1\s*(?:h|hours?|hr)\.?\s*(?:and\s*)?12|1:12\b"))],
    ),
    Task(
        "platform_casual", "casual", "which platform does the 14:18 train to bregenz leave from?? its from lindau on dec 12 2026",
        [train_times, time_in, branch_hours], [num(4)],
    ),
    Task(
        "no_route", "not_found", "Is there a train from Lindau to Zurich on 2026-12-12 after 10:00?",
        [train_times, time_in], [any_of(yes_no(False), NOT_FOUND), lacks("RE 3312", "IC 2012")],
    ),
    # ---- nested JSON: zones holding bins
    Task(
        "bolts_total", "nested", "How many M6 bolts are in stock at the Hamburg site, across all its bins?",
        [site_stock, sku_details, calculator], [num(2050)],
    ),
    Task(
        "below_reorder", "yes_no", "Is the Hamburg stock of HINGE-H40 below its reorder level?",
        [site_stock, sku_details, calculator],
        [any_of(yes_no(True), lambda t: has("is below", "are below")(t) and lacks("not", "n't", "no ")(t))],
    ),
    Task(
        "hinge_value", "chain3", "What is the total value in EUR of the HINGE-H40 hinges in stock at Hamburg?",
        [site_stock, sku_details, calculator, parcel_rate], [num(147)],
    ),
    # ---- a to-do list: tools that change state (checked on the list afterwards)
    Task(
        "add_todo", "mutate", "Add 'renew passport' to my to-do list with high priority.",
        [add_todo, list_todos, complete_todo], [todo_state(_added_passport)],
    ),
    Task(
        "complete_todo", "mutate", "Mark 'book dentist appointment' on my to-do list as done.",
        [list_todos, complete_todo, add_todo], [todo_state(_dentist_done)],
    ),
    Task(
        "high_open", "enum_arg", "How many open high-priority items are on my to-do list?",
        [list_todos, add_todo, calculator], [count(2), todo_state(lambda ts: len(ts) == 6)],
    ),
    Task(
        "done_typo", "casual", "wat have i allready finished on my todo list?",
        [list_todos, complete_todo, add_todo],
        [has("grandma"), has("library books"), absent_or_negated("dentist"), todo_state(lambda ts: ts == _TODOS_START)],
    ),
    # ---- an error that tells the right form
    Task(
        "book_room", "error", "Book the Fjord meeting room on 2026-12-09 from 3pm for 2 hours.",
        [book_room, room_capacity, time_in], [booked("Fjord", "2026-12-09", "15:00", 2)],
    ),
    # ---- one tool called twice with different arguments, then compared
    Task(
        "parcel_compare", "compare", "Is it cheaper to send a 4 kg parcel with Swiftpost or with Parcelo, and by how much?",
        [parcel_rate, calculator, time_in],
        [named_before(r"cheaper|less|lower", "swiftpost", "parcelo"), num(0.3, 0.005)],
    ),
    # ---- an optional argument, a converter, long outputs, no tool
    Task(
        "pancake_flour", "optional_arg", "How much flour do I need for pancakes for 6 people?",
        [recipe, calculator, parcel_rate], [num(300)],
    ),
    Task(
        "tokyo_time", "multi_arg", "A call is at 09:30 London time on 2026-12-09. What time is that in Tokyo?",
        [time_in, calculator, train_times], [has("18:30", "6:30 pm", "6:30pm", "6:30 p.m.")],
    ),
    Task(
        "backup_failed", "long_output", "At what time did last night's backup fail on the server db-2?",
        [server_log, calculator, time_in], [has("03:17", "3:17")],
    ),
    Task(
        "pdf_version", "long_output", "In which version of Quill was export to PDF added?",
        [release_notes, search_catalogue, calculator], [matches(r"\b2\.4(?:\.0)?\b(?!\.\d)"), lacks("2.4.2", "2.5.1")],
    ),
    Task(
        "red_planet", "no_tool", "Which planet is known as the Red Planet?",
        [search_catalogue, calculator, time_in], [has("mars")],
    ),
]  # fmt: skip

assert len({t.name for t in TASKS}) == len(TASKS)


def reset() -> None:
    """The fake tools' state at the start of a task: the to-do list as it was, no room booked."""
    TODOS[:] = copy.deepcopy(_TODOS_START)
    BOOKINGS.clear()


reset()

if __name__ == "__main__":
    asyncio.run(main(TASKS, name="suite C, ", description=__doc__ or "", before=reset))
