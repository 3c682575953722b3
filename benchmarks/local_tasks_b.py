"""A second suite of small tool tasks, unlike `local_tasks.py`: how general is what we tuned?

`local_tasks.py` has one-string-argument lookups that answer in one line. These 26 tasks use other
shapes, over deterministic fake tools defined here and the real calculator: tools taking several typed
arguments (an enum, an optional parameter, a list, a nested object), tools answering with JSON, a
table or a page of text to pick one value from, search-then-fetch, chains of three or four calls, tools
with near-identical names, a tool that fails once with a temporary error and then works, arithmetic on
numbers too big to do in one's head, answers that are "not found", tasks whose answer is in the goal,
and instructions about the answer's format ("answer with just the number"). Checks are tolerant like
`local_tasks.py`'s, except the format tasks, which check the format asked for. Each task runs with the
default agent settings and `Budget(max_steps=8)`.

Run:  .venv/bin/python benchmarks/local_tasks_b.py [--model local|local:0.5b] [--mode auto|react|native]
                                                    [--runs N] [--seed S] [--only NAME[,NAME]] [--kind KIND]
                                                    [--verbose]
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
from typing import Literal

from local_tasks import (  # the runner and the answer checks are shared with the first suite
    Check,
    Task,
    has,
    lacks,
    main,
    num,
    numbers,
    yes_no,
)
from pydantic import BaseModel

from thinkloop import tool
from thinkloop.tools.calculator import calculator

# ============================================================================================ fake tools

FLIGHTS = [
    {"flight": "LH 1120", "from": "FRA", "to": "MAD", "date": "2026-05-04", "cabin": "economy", "stops": 0,
     "price_eur": 189},
    {"flight": "LH 1120", "from": "FRA", "to": "MAD", "date": "2026-05-04", "cabin": "business", "stops": 0,
     "price_eur": 642},
    {"flight": "IB 3401", "from": "FRA", "to": "MAD", "date": "2026-05-04", "cabin": "economy", "stops": 1,
     "price_eur": 121},
    {"flight": "IB 3401", "from": "FRA", "to": "MAD", "date": "2026-05-04", "cabin": "business", "stops": 1,
     "price_eur": 498},
    {"flight": "UX 1502", "from": "FRA", "to": "MAD", "date": "2026-05-05", "cabin": "economy", "stops": 0,
     "price_eur": 98},
]  # fmt: skip


@tool
def search_flights(
    origin: str,
    destination: str,
    date: str,
    cabin: Literal["economy", "business"] = "economy",
    max_stops: int | None = None,
) -> str:
    """Flights between two airports (IATA codes like FRA) on a date (YYYY-MM-DD), as JSON.

    Args:
        origin: the departure airport code.
        destination: the arrival airport code.
        date: the day of departure, YYYY-MM-DD.
        cabin: the travel class.
        max_stops: the most stops allowed (omit for any).
    """
    found = [
        {k: v for k, v in f.items() if k not in ("from", "to", "date", "cabin")}
        for f in FLIGHTS
        if f["from"] == origin.strip().upper()
        and f["to"] == destination.strip().upper()
        and f["date"] == date.strip()
        and f["cabin"] == cabin
        and (max_stops is None or int(f["stops"]) <= max_stops)  # type: ignore[call-overload]
    ]
    return json.dumps({"cabin": cabin, "date": date, "flights": found})


PRODUCTS = {
    "P-1042": {"name": "Aurora X2 headphones", "price_eur": 149.0, "battery_hours": 38, "weight_g": 254,
               "colors": ["black", "sand"]},
    "P-1043": {"name": "Aurora X2 Lite headphones", "price_eur": 89.0, "battery_hours": 24, "weight_g": 198,
               "colors": ["black", "blue", "white"]},
    "P-2210": {"name": "Borealis desk lamp", "price_eur": 59.5, "battery_hours": None, "weight_g": 1320,
               "colors": ["white"]},
    "P-3307": {"name": "Cirrus travel kettle", "price_eur": 34.9, "battery_hours": None, "weight_g": 640,
               "colors": ["steel", "red"]},
}  # fmt: skip


@tool
def search_products(query: str) -> str:
    """Search the product catalogue by words of a product's name: the matching product ids and names."""
    words = [w for w in re.findall(r"\w+", query.lower()) if w not in ("the", "a", "headphone", "product")]
    hits = [
        f"{pid}: {p['name']}"
        for pid, p in PRODUCTS.items()
        if words and all(w in str(p["name"]).lower() for w in words)
    ]
    if not hits:
        hits = [
            f"{pid}: {p['name']}"
            for pid, p in PRODUCTS.items()
            if any(w in str(p["name"]).lower() for w in words)
        ]
    return "\n".join(hits) if hits else f"no products match {query!r}"


@tool
def get_product(product_id: str) -> str:
    """The full record of a product by its id (like P-0000), as JSON."""
    key = product_id.strip().upper()
    if key not in PRODUCTS:
        raise LookupError(
            f"no product with id {product_id!r}; ids look like P-0000 (search_products gives them)"
        )
    return json.dumps({"id": key, **PRODUCTS[key]})


REVENUE_TABLE = """| region | Q1 | Q2 | Q3 | Q4 |
|---|---|---|---|---|
| North America | 4,120,300 | 4,388,910 | 4,502,775 | 5,010,020 |
| Europe | 3,305,118 | 3,150,402 | 3,498,260 | 3,902,114 |
| Nordics | 812,440 | 790,215 | 861,903 | 944,870 |
| Asia Pacific | 2,774,002 | 2,901,583 | 3,120,449 | 3,377,361 |
| Latin America | 604,318 | 655,020 | 701,992 | 730,118 |"""


@tool
def revenue_report(year: int) -> str:
    """Revenue in EUR by region and quarter for a year, as a table."""
    if int(year) != 2025:
        raise LookupError(f"no revenue report for {year}; reports exist for 2025 only")
    return f"Revenue 2025 (EUR)\n{REVENUE_TABLE}"


@tool
def headcount_report(year: int) -> str:
    """Employees by region for a year, as a table."""
    return "| region | employees |\n|---|---|\n| North America | 412 |\n| Europe | 388 |\n| Nordics | 61 |"


POLICY = (
    "Employee Handbook, section 7: Leave.\n"
    "7.1 Annual leave. Full-time employees receive 27 days of paid annual leave per calendar year; part-time "
    "employees receive a pro-rated share. Up to 5 unused days may be carried over to the next year and must be "
    "taken by 31 March.\n"
    "7.2 Sick leave. Employees must report an absence before 10:00 on the first day. A doctor's certificate is "
    "required from the fourth consecutive day of absence. Pay continues for up to 6 weeks per illness.\n"
    "7.3 Parental leave. Each parent is entitled to 16 weeks of fully paid parental leave, to be taken within "
    "the first 18 months after the birth or adoption. It may be split into at most three blocks.\n"
    "7.4 Sabbatical. After 5 years of service employees may request an unpaid sabbatical of up to 6 months; "
    "requests must be made 3 months in advance.\n"
    "7.5 Public holidays follow the calendar of the office's country."
)
ARTICLES = {
    "KB-17": ("Resetting your password", "To reset a password, open Settings > Security and choose 'Reset'. "
              "The reset link is valid for 45 minutes. After 5 failed attempts an account is locked for 30 "
              "minutes."),
    "KB-23": ("Exporting invoices", "Invoices can be exported as PDF or CSV from Billing > History. Exports "
              "cover at most 24 months. Large exports are e-mailed within 2 hours."),
    "KB-31": ("Two-factor authentication", "Two-factor authentication supports authenticator apps and "
              "hardware keys. Backup codes: 10 codes are issued, each usable once."),
}  # fmt: skip


@tool
def handbook_section(section: int) -> str:
    """The full text of a section of the employee handbook (section 7 is about leave)."""
    if int(section) != 7:
        raise LookupError(f"section {section} is not available; available: 7 (Leave)")
    return POLICY


@tool
def search_help(query: str) -> str:
    """Search the help centre: the ids and titles of matching articles (read one with read_article)."""
    words = set(re.findall(r"\w+", query.lower())) - {"the", "a", "how", "to", "is", "of", "for", "long"}
    hits = [f"{aid}: {title}" for aid, (title, body) in ARTICLES.items()
            if words & set(re.findall(r"\w+", (title + " " + body).lower()))]  # fmt: skip
    return "\n".join(hits) if hits else f"no articles match {query!r}"


@tool
def read_article(article_id: str) -> str:
    """The text of a help-centre article by its id (like KB-00)."""
    key = article_id.strip().upper()
    if key not in ARTICLES:
        raise LookupError(f"no article {article_id!r}; ids look like KB-00 (search_help gives them)")
    title, body = ARTICLES[key]
    return f"{title}\n{body}"


INVOICES = {
    "INV-204": {"status": "paid on 2026-02-11", "lines": ["3 x consulting day @ 1,150.00", "1 x travel @ 386.40"],
                "total": "3,836.40 EUR"},
    "INV-311": {"status": "unpaid, due 2026-04-30", "lines": ["12 x licence @ 249.00", "1 x setup @ 900.00"],
                "total": "3,888.00 EUR"},
}  # fmt: skip


def _invoice(invoice_id: str) -> dict[str, object]:
    key = invoice_id.strip().upper().replace(" ", "-")
    if key not in INVOICES:
        raise LookupError(f"no invoice {invoice_id!r}")
    return INVOICES[key]


@tool
def invoice_status(invoice_id: str) -> str:
    """Whether an invoice is paid, and when (or when it is due)."""
    return f"{invoice_id.strip().upper()}: {_invoice(invoice_id)['status']}"


@tool
def invoice_lines(invoice_id: str) -> str:
    """The line items of an invoice."""
    return "\n".join(_invoice(invoice_id)["lines"])  # type: ignore[arg-type]


@tool
def invoice_total(invoice_id: str) -> str:
    """The total amount of an invoice."""
    return f"{invoice_id.strip().upper()} total: {_invoice(invoice_id)['total']}"


_FLAKY = {"calls": 0}
RATES_BY_DATE = {
    ("USD", "EUR"): {"2026-01-15": 0.9187, "2026-03-02": 0.9302},
    ("GBP", "USD"): {"2026-03-02": 1.2655},
}


@tool
def fx_rate(base: str, quote: str, date: str | None = None) -> str:
    """The exchange rate from `base` to `quote` (ISO codes), on a date (YYYY-MM-DD) or today if omitted."""
    _FLAKY["calls"] += 1
    if _FLAKY["calls"] == 1:
        raise TimeoutError("the rates service did not answer in time (temporary); try the same call again")
    pair = (base.strip().upper(), quote.strip().upper())
    day = (date or "2026-03-02").strip()
    if pair not in RATES_BY_DATE or day not in RATES_BY_DATE[pair]:
        raise LookupError(f"no rate for {pair[0]}->{pair[1]} on {day}")
    return f"1 {pair[0]} = {RATES_BY_DATE[pair][day]} {pair[1]} on {day}"


TICKETS = {
    "T-88": "ticket T-88: 'Checkout button unresponsive', priority high, project: Falcon, opened 2026-02-20"
}
PROJECTS = {
    "falcon": "project Falcon: payments front-end, owner: Priya Nair, budget 240,000 EUR, status active"
}
CONTACTS = {
    "priya nair": {"name": "Priya Nair", "phone": "+44 20 7946 0321", "email": "priya.nair@corp.example"},
    "jon ebert": {"name": "Jon Ebert", "phone": "+49 30 5550 1187", "email": "jon.ebert@corp.example"},
}


@tool
def get_ticket(ticket_id: str) -> str:
    """A support ticket by id (like T-00): title, priority, project, date opened."""
    key = ticket_id.strip().upper()
    if key not in TICKETS:
        raise LookupError(f"no ticket {ticket_id!r}")
    return TICKETS[key]


@tool
def get_project(name: str) -> str:
    """A project by name: what it is, its owner, budget and status."""
    key = name.strip().lower().removeprefix("project ").strip()
    if key not in PROJECTS:
        raise LookupError(f"no project named {name!r}")
    return PROJECTS[key]


@tool
def get_contact(name: str) -> str:
    """A person's contact card by full name, as JSON: phone, email."""
    key = " ".join(name.lower().split())
    if key not in CONTACTS:
        raise LookupError(f"no contact named {name!r}")
    return json.dumps(CONTACTS[key])


WAREHOUSES = {"anvil": (12_400, 9_870), "bolt": (8_000, 5_120), "crate": (15_000, 13_990)}


@tool
def warehouse(name: str) -> str:
    """A warehouse's capacity and the space in use, in pallets."""
    key = name.strip().lower().removesuffix(" warehouse").strip()
    if key not in WAREHOUSES:
        raise LookupError(f"no warehouse named {name!r}; warehouses: Anvil, Bolt, Crate")
    cap, used = WAREHOUSES[key]
    return json.dumps({"warehouse": key.title(), "capacity_pallets": cap, "used_pallets": used})


OFFICES = {
    "offices": [
        {"city": "Singapore", "address": {"street": "8 Marina View", "postcode": "018960"},
         "timezone": "Asia/Singapore", "staff": 46},
        {"city": "Dublin", "address": {"street": "2 Grand Canal Square", "postcode": "D02 A342"},
         "timezone": "Europe/Dublin", "staff": 131},
        {"city": "Austin", "address": {"street": "500 W 2nd St", "postcode": "78701"},
         "timezone": "America/Chicago", "staff": 88},
    ]
}  # fmt: skip


@tool
def list_offices() -> str:
    """Every office of the company, as JSON: city, address, timezone, staff."""
    return json.dumps(OFFICES)


POPULATION = {"lagos": 15_388_000, "cairo": 22_183_200, "kinshasa": 17_032_322, "nairobi": 5_325_160}


@tool
def city_population(city: str) -> str:
    """The population of a city (metropolitan area)."""
    key = city.strip().lower().split(",")[0]
    if key not in POPULATION:
        raise LookupError(f"no population figure for {city!r}")
    return f"{city.strip().title()}: population {POPULATION[key]:,}"


ACCOUNTS = {"ACC-1": 1_284_557.32, "ACC-2": 903_118.75, "ACC-3": 2_716_040.08}


@tool
def account_balances(customer: str) -> str:
    """The accounts of a customer with their balances in EUR, as a table."""
    if "northwind" not in customer.lower():
        raise LookupError(f"no customer named {customer!r}")
    rows = "\n".join(f"| {k} | {v:,.2f} |" for k, v in ACCOUNTS.items())
    return f"Northwind Ltd accounts\n| account | balance EUR |\n|---|---|\n{rows}"


WEIGHTS = {"kettle": 1.2, "toaster": 2.35, "blender": 3.1, "mixer": 4.4}


@tool
def shipping_weight(items: list[str]) -> str:
    """The total shipping weight in kg of a list of items (each item once)."""
    names = [i.strip().lower().removeprefix("a ").removeprefix("an ").rstrip("s") for i in items]
    unknown = [n for n in names if n not in WEIGHTS]
    if unknown:
        raise LookupError(f"unknown items: {', '.join(unknown)}; known: {', '.join(WEIGHTS)}")
    return f"{len(names)} items, total {round(sum(WEIGHTS[n] for n in names), 2)} kg"


class Address(BaseModel):
    street: str
    city: str
    postcode: str


@tool
def shipping_quote(address: Address, weight_kg: float, express: bool = False) -> str:
    """The price in EUR of shipping a parcel to an address."""
    zone = 1 if address.city.strip().lower() in ("lyon", "paris", "marseille") else 2
    price = 6.9 + 1.5 * float(weight_kg) * zone + (9.0 if express else 0.0)
    return f"parcel of {weight_kg} kg to {address.city} ({address.postcode}): {price:.2f} EUR" + (
        " (express)" if express else " (standard)"
    )


STOCK_PRICES = {"ACME": {"open": 118.20, "close": 121.45, "high": 122.10, "low": 117.05}}


@tool
def stock_price(symbol: str, field: Literal["open", "close", "high", "low"]) -> str:
    """One of yesterday's prices of a share, by ticker symbol."""
    key = symbol.strip().upper()
    if key not in STOCK_PRICES:
        raise LookupError(f"no share with symbol {symbol!r}")
    return f"{key} {field} {STOCK_PRICES[key][field]:.2f} USD"


MONTHLY = {"kiosk 4": [18_432, 21_907, 19_655]}


@tool
def monthly_sales(store: str, months: int = 3) -> str:
    """Unit sales of a store for each of the last `months` months, oldest first."""
    key = " ".join(store.lower().split())
    if key not in MONTHLY:
        raise LookupError(f"no store named {store!r}; stores: Kiosk 4")
    values = MONTHLY[key][-int(months) :]
    return ", ".join(
        f"{m}: {v:,}" for m, v in zip(["January", "February", "March"][-len(values) :], values, strict=False)
    )


@tool
def weekday(date: str) -> str:
    """The day of the week of a date (YYYY-MM-DD)."""
    return dt.date.fromisoformat(date.strip()).strftime("%A")


@tool
def user_profile(username: str) -> str:
    """A user's profile, as JSON."""
    if username.strip().lower().lstrip("@") != "mkovac":
        raise LookupError(f"no user {username!r}")
    return json.dumps({"username": "mkovac", "name": "Marta Kovač", "joined": "2023-09-14", "plan": "team",
                       "country": "Croatia", "email": "marta@kovac.example"})  # fmt: skip


# ================================================================================================ checks


def only_number(expected: float, tol: float = 1e-9) -> Check:
    """The answer is just the number asked for (a trailing full stop, a unit or markdown bold allowed)."""

    def check(text: str) -> bool:
        body = text.strip().strip("*`").strip().rstrip(".").strip()
        body = re.sub(r"\s*(?:EUR|USD|kg|days|weeks|€|\$)$", "", body, flags=re.IGNORECASE)
        values = numbers(body)
        return len(values) == 1 and abs(values[0] - expected) <= tol and len(body) <= 20

    return check


def only_word(*words: str) -> Check:
    """The answer is just one of `words` (case, a full stop and markdown aside)."""
    return lambda text: text.strip().strip("*`'\"").strip().rstrip(".!").strip().lower() in words


NOT_FOUND = has(
    "not found", "not be found", "no product", "no such", "not exist", "n't exist", "no match", "unable to find",
    "could not find", "couldn't find", "cannot find", "can't find", "not available", "no information",
    "not listed", "none", "no record", "not in", "doesn't have", "does not have", "not provided", "not include",
    "no ",
)  # fmt: skip


TASKS = [
    # ---- several typed arguments: an enum, an optional parameter, a list, a nested object
    Task(
        "cheapest_business", "typed_args",
        "What is the cheapest business class flight from FRA to MAD on 2026-05-04, and its price?",
        [search_flights, calculator, weekday], [has("ib 3401", "ib3401"), num(498)],
    ),
    Task(
        "nonstop_economy", "typed_args",
        "Which nonstop economy flight goes from FRA to MAD on 2026-05-04?",
        [search_flights, weekday], [has("lh 1120", "lh1120"), lacks("ib 3401", "ux 1502")],
    ),
    Task(
        "shipping_list", "typed_args", "What is the total shipping weight of a kettle, a toaster and a blender?",
        [shipping_weight, calculator, stock_price], [num(6.65)],
    ),
    Task(
        "ship_to_lyon", "typed_args",
        "How much does it cost to ship a 3 kg parcel by standard shipping to 12 Rue Verte, 69001 Lyon?",
        [shipping_quote, shipping_weight, calculator], [num(11.4)],
    ),
    Task(
        "acme_close", "typed_args", "What was ACME's closing share price yesterday?",
        [stock_price, fx_rate, calculator], [num(121.45)],
    ),
    Task(
        "fx_on_date", "typed_args", "How many euros were 500 US dollars worth on 2026-01-15?",
        [fx_rate, calculator, stock_price], [num(459.35, 0.05)],
    ),
    # ---- JSON, tables, long text: pick one value
    Task(
        "office_timezone", "pick", "What is the timezone of the Singapore office?",
        [list_offices, weekday, user_profile], [has("asia/singapore", "sgt", "utc+8", "gmt+8", "utc +8")],
    ),
    Task(
        "q3_nordics", "pick", "What was the Nordics region's revenue in Q3 2025?",
        [revenue_report, headcount_report, calculator], [num(861903)],
    ),
    Task(
        "parental_leave", "pick", "How many weeks of paid parental leave does the employee handbook give?",
        [handbook_section, search_help, calculator], [num(16)],
    ),
    Task(
        "user_joined", "pick", "When did the user mkovac join?",
        [user_profile, weekday, list_offices], [has("2023-09-14", "september 14, 2023", "14 september 2023")],
    ),
    # ---- search, then fetch
    Task(
        "battery_life", "search_fetch", "What is the battery life of the Aurora X2 Lite headphones?",
        [search_products, get_product, calculator], [num(24), lacks("38")],
    ),
    Task(
        "reset_link", "search_fetch", "According to the help centre, how long is a password reset link valid?",
        [search_help, read_article, handbook_section], [num(45)],
    ),
    # ---- three or four calls
    Task(
        "ticket_owner_phone", "chain3",
        "What is the phone number of the owner of the project that ticket T-88 belongs to?",
        [get_ticket, get_project, get_contact, user_profile], [has("7946 0321", "79460321")],
    ),
    Task(
        "most_free_space", "chain3", "Which warehouse has the most free space: Anvil, Bolt or Crate?",
        [warehouse, calculator, list_offices], [has("bolt"), lacks("crate has the most", "anvil has the most")],
    ),
    Task(
        "price_difference", "chain3",
        "How much more does the Aurora X2 headphones cost than the Aurora X2 Lite headphones?",
        [search_products, get_product, calculator], [num(60)],
    ),
    # ---- tools with near-identical names
    Task(
        "invoice_paid", "similar_names", "Has invoice INV-204 been paid?",
        [invoice_lines, invoice_total, invoice_status], [yes_no(True)],
    ),
    Task(
        "invoice_amount", "similar_names", "What is the total amount of invoice INV-311?",
        [invoice_status, invoice_lines, invoice_total], [num(3888)],
    ),
    # ---- a tool that fails once with a temporary error
    Task(
        "flaky_rate", "transient", "What is today's exchange rate from GBP to USD?",
        [fx_rate, calculator, stock_price], [num(1.2655, 0.0001)],
    ),
    # ---- big numbers: the calculator, not the head
    Task(
        "big_product", "big_numbers", "What is 48713 multiplied by 9287?",
        [calculator, weekday], [num(452397631)],
    ),
    Task(
        "population_gap", "big_numbers", "How many more people live in Cairo than in Lagos?",
        [city_population, calculator, weekday], [num(6795200)],
    ),
    Task(
        "balances_total", "big_numbers", "What is the total balance of all of Northwind Ltd's accounts?",
        [account_balances, calculator, user_profile], [num(4903716.15, 0.01)],
    ),
    # ---- the answer is "not found"
    Task(
        "missing_product", "not_found", "What does the Zephyr Z9 drone cost?",
        [search_products, get_product, calculator], [NOT_FOUND, lacks("149", "89", "59.5", "34.9")],
    ),
    Task(
        "missing_field", "not_found", "What is the phone number of the user mkovac?",
        [user_profile, get_contact], [NOT_FOUND, lacks("+44", "+49", "+385")],
    ),
    # ---- the answer is in the goal
    Task(
        "given_in_goal", "no_tool",
        "My booking reference is QX7-4410 and my flight is on 2026-05-04. What is my booking reference?",
        [search_flights, weekday, calculator], [has("QX7-4410")],
    ),
    # ---- format instructions
    Task(
        "just_number", "format", "How many staff work in the Dublin office? Answer with just the number.",
        [list_offices, calculator], [only_number(131)],
    ),
    Task(
        "yes_or_no_only", "format", "Is 2026-07-04 a Saturday? Answer only yes or no.",
        [weekday, calculator], [only_word("yes")],
    ),
    Task(
        "average_sales", "format",
        "What were Kiosk 4's average monthly unit sales over the last 3 months? Give just the number, rounded "
        "to a whole unit.",
        [monthly_sales, calculator], [only_number(19998, 0.5)],
    ),
]  # fmt: skip

assert len({t.name for t in TASKS}) == len(TASKS)


def reset() -> None:
    """The state of the fake tools at the start of a task (the flaky tool fails its first call again)."""
    _FLAKY["calls"] = 0


if __name__ == "__main__":
    asyncio.run(main(TASKS, name="suite B, ", description=__doc__ or "", before=reset))
