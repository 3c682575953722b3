"""The 300-tool catalogue of the discovery tests and of `benchmarks/discovery.py` (one scenario, one copy)."""

from __future__ import annotations

from typing import Any

from thinkloop import Tool, tool

VERBS = {
    "get": "Get one {obj} by its id from the {system} system.",
    "list": "List the {obj}s of the {system} system, newest first, filtered by status.",
    "create": "Create a new {obj} in the {system} system from the given name and details.",
    "update": "Update fields of an existing {obj} in the {system} system.",
    "delete": "Delete a {obj} from the {system} system permanently.",
    "search": "Full-text search over the {obj}s of the {system} system.",
    "export": "Export the {obj}s of the {system} system as a CSV or JSON file.",
    "archive": "Archive an old {obj} of the {system} system so it no longer shows in lists.",
    "validate": "Check that a {obj} of the {system} system is complete and consistent.",
    "summarize": "Write a short summary of the recent {obj} activity of the {system} system.",
}
OBJECTS = {
    "invoice": "billing", "customer": "CRM", "order": "shop", "ticket": "helpdesk", "shipment": "logistics",
    "product": "catalogue", "payment": "billing", "refund": "billing", "subscription": "billing",
    "employee": "HR", "meeting": "calendar", "document": "document store", "email": "mail",
    "report": "analytics", "dashboard": "analytics", "user_account": "identity", "server": "infrastructure",
    "database_backup": "infrastructure", "dns_record": "network", "certificate": "security",
    "container": "cluster", "deployment": "cluster", "alert": "monitoring", "log_stream": "logging",
    "metric": "monitoring", "budget": "finance", "contract": "legal", "vendor": "procurement",
    "warehouse_item": "inventory", "weather_station": "facilities",
}  # fmt: skip


def _generated(verb: str, obj: str, system: str) -> Tool:
    params: dict[str, Any] = {f"{obj}_id": {"type": "string", "description": f"The id of the {obj}."}}
    if verb in ("list", "search", "export", "summarize"):
        params = {
            "query": {"type": "string", "description": "Words to look for."},
            "limit": {"type": "integer", "description": "At most this many results."},
        }
    return Tool(
        f"{verb}_{obj}",
        VERBS[verb].format(obj=obj.replace("_", " "), system=system),
        {"type": "object", "properties": params, "required": list(params)[:1]},
        lambda **kwargs: f"{verb} {obj}: ok",
    )


@tool
def get_weather_forecast(city: str, days: int = 1) -> str:
    """Get the weather forecast (temperature, rain, wind) for a city for the next days.

    Args:
        city: the city, e.g. "Paris".
        days: how many days ahead.
    """
    return f"{city}: 18°C, light rain, for {days} day(s)"


@tool
def convert_currency(amount: float, from_currency: str, to_currency: str) -> str:
    """Convert an amount of money from one currency to another at today's exchange rate.

    Args:
        amount: the amount to convert.
        from_currency: ISO code of the currency to convert from, e.g. USD.
        to_currency: ISO code of the currency to convert to, e.g. EUR.
    """
    return f"{amount} {from_currency} = {amount * 0.92:.2f} {to_currency}"


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return expression


def catalogue() -> list[Tool]:
    """300 tools: the calculator, the two the task needs, and 297 generated ones."""
    generated = [_generated(v, o, s) for o, s in OBJECTS.items() for v in VERBS][:297]
    return [calculator, *generated[:150], get_weather_forecast, *generated[150:], convert_currency]
