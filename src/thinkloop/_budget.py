"""Budgets (SPEC §5) and the per-model price table (SPEC §5.2)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ._errors import ConfigurationError
from ._messages import Usage
from ._state import StopReason

DEFAULT_MAX_STEPS = 16


@dataclass(frozen=True, slots=True)
class Budget:
    """Limits of one run. `None` means unlimited; `timeout` is in seconds of run time.

    `check()` returns the stop reason a run has reached, or None. It is called before every model call.
    """

    max_steps: int = DEFAULT_MAX_STEPS
    max_tokens: int | None = None
    max_cost: float | None = None
    timeout: float | None = None

    def __post_init__(self) -> None:
        steps = self.max_steps
        if type(steps) is not int or steps < 1:  # bool and 2.5 are not step counts
            raise ConfigurationError(f"Budget.max_steps must be an integer of at least 1, got {steps!r}")
        if self.max_tokens is not None and (type(self.max_tokens) is not int or self.max_tokens < 1):
            raise ConfigurationError(
                f"Budget.max_tokens must be a positive integer or None, got {self.max_tokens!r}"
            )
        for name in ("max_cost", "timeout"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not (0 < value < math.inf):
                raise ConfigurationError(
                    f"Budget.{name} must be a positive, finite number of "
                    f"{'dollars' if name == 'max_cost' else 'seconds'} or None (no limit), got {value!r}"
                )

    def as_dict(self) -> dict[str, float | int | None]:
        """The limits as a JSON object (kept in the run state, so a resumed run keeps them)."""
        return {
            "max_steps": self.max_steps, "max_tokens": self.max_tokens, "max_cost": self.max_cost,
            "timeout": self.timeout,
        }  # fmt: skip

    def check(self, *, steps: int, usage: Usage, elapsed: float) -> StopReason | None:
        """The first limit reached, in order of precedence: timeout, cost, tokens, steps."""
        if self.timeout is not None and elapsed >= self.timeout:
            return StopReason.TIMEOUT
        if self.max_cost is not None and usage.cost >= self.max_cost:
            return StopReason.MAX_COST
        if self.max_tokens is not None and usage.total_tokens >= self.max_tokens:
            return StopReason.MAX_TOKENS
        if steps >= self.max_steps:
            return StopReason.MAX_STEPS
        return None

    def describe(self, reason: StopReason) -> str:
        """A sentence naming the limit that stopped the run."""
        limits = {
            StopReason.TIMEOUT: f"the time limit of {self.timeout} s",
            StopReason.MAX_COST: f"the cost limit of {self.max_cost}",
            StopReason.MAX_TOKENS: f"the token limit of {self.max_tokens}",
            StopReason.MAX_STEPS: f"the step limit of {self.max_steps}",
        }
        return f"The run reached {limits.get(reason, reason.value)}."


@dataclass(frozen=True, slots=True)
class Price:
    """US dollars per million input and output tokens."""

    input_per_million: float
    output_per_million: float

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input_per_million + output_tokens * self.output_per_million) / 1e6


class _Prices(dict[str, Price]):
    """A price table's prices: a dict that counts its changes, so looked-up prices are never stale."""

    version = 0

    def _changed(self) -> None:
        self.version += 1

    def __setitem__(self, key: str, value: Price) -> None:
        super().__setitem__(key, value)
        self._changed()

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self._changed()

    def __ior__(self, other: Any) -> _Prices:  # type: ignore[override,misc]
        super().__ior__(other)
        self._changed()
        return self

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        self._changed()

    def pop(self, *args: Any) -> Any:
        self._changed()
        return super().pop(*args)

    def popitem(self) -> tuple[str, Price]:
        self._changed()
        return super().popitem()

    def setdefault(self, key: str, default: Any = None) -> Any:
        self._changed()
        return super().setdefault(key, default)

    def clear(self) -> None:
        super().clear()
        self._changed()


@dataclass
class PriceTable:
    """Prices by model name; a name matches its longest known prefix (`gpt-4o-mini-2024…` → `gpt-4o-mini`).
    `prices` may be changed at any time (`table.prices["my-model"] = Price(1, 2)`, or a new dict)."""

    prices: dict[str, Price] = field(default_factory=lambda: dict(DEFAULT_PRICES))
    _found: dict[str, tuple[int, Price | None]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "prices":  # a dict of its own, whose changes are seen: the caller's is not changed
            value = _Prices(value)
            object.__setattr__(self, "_found", {})
        object.__setattr__(self, name, value)

    def price(self, model_name: str) -> Price | None:
        """The price of a model (looked up once per name while the prices do not change)."""
        found = self._found.get(model_name)
        version = self.prices.version  # type: ignore[attr-defined]  # a `_Prices`: set by __setattr__
        if found is None or found[0] != version:
            if len(self._found) > 1024:
                self._found.clear()
            found = self._found[model_name] = (version, self._lookup(model_name))
        return found[1]

    def _lookup(self, model_name: str) -> Price | None:
        name = model_name.split(":", 1)[-1]
        best: str | None = None
        for known in self.prices:
            if name.startswith(known) and (best is None or len(known) > len(best)):
                best = known
        return self.prices[best] if best is not None else None

    def cost(self, model_name: str, input_tokens: int, output_tokens: int) -> float:
        found = self._found.get(model_name)  # `price()`, its common case written out: a call every step
        version = self.prices.version  # type: ignore[attr-defined]
        price = found[1] if found is not None and found[0] == version else self.price(model_name)
        return price.cost(input_tokens, output_tokens) if price else 0.0


DEFAULT_PRICES: dict[str, Price] = {
    "gpt-4o-mini": Price(0.15, 0.60),
    "gpt-4o": Price(2.50, 10.00),
    "gpt-4.1-nano": Price(0.10, 0.40),
    "gpt-4.1-mini": Price(0.40, 1.60),
    "gpt-4.1": Price(2.00, 8.00),
    "gpt-5-nano": Price(0.05, 0.40),
    "gpt-5-mini": Price(0.25, 2.00),
    "gpt-5": Price(1.25, 10.00),
    "o4-mini": Price(1.10, 4.40),
    "o3": Price(2.00, 8.00),
    "deepseek-chat": Price(0.27, 1.10),
    "deepseek-reasoner": Price(0.55, 2.19),
    "local": Price(0.0, 0.0),
    "script": Price(0.0, 0.0),
}
