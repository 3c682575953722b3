"""`Data`: the base of thinkloop's messages and run state — plain slotted dataclasses, checked at the edges.

A run creates and updates these objects at every step, so they are plain dataclasses (creating one costs
a fraction of a microsecond, and so does setting a field). They are validated where data comes in from
outside — `model_validate()` / `model_validate_json()` (stores, files, the network) — by a pydantic
`TypeAdapter` built on first use, and serialised by the same adapter, so they round-trip through JSON
exactly. The method names follow pydantic's, so code written against pydantic models reads the same.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self

from pydantic import ConfigDict

if TYPE_CHECKING:
    from pydantic import TypeAdapter

_adapters: dict[type, TypeAdapter[Any]] = {}


def adapter(cls: type[Any]) -> TypeAdapter[Any]:
    """The pydantic adapter of a `Data` class (built once, on first use)."""
    found = _adapters.get(cls)
    if found is None:
        from pydantic import TypeAdapter

        found = _adapters[cls] = TypeAdapter(cls)
    return found


class Data:
    """Mixin of the JSON helpers; subclasses are `@dataclass(slots=True, kw_only=True)`."""

    __slots__ = ()
    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(extra="forbid")

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy, with the fields in `update` replaced (`deep`: nested objects copied too)."""
        obj = copy.deepcopy(self) if deep else copy.copy(self)
        for name, value in (update or {}).items():
            setattr(obj, name, value)
        return obj

    def model_dump(self, *, mode: Literal["json", "python"] = "python", **kwargs: Any) -> dict[str, Any]:
        out: dict[str, Any] = adapter(type(self)).dump_python(self, mode=mode, **kwargs)
        return out

    def model_dump_json(self, **kwargs: Any) -> str:
        return adapter(type(self)).dump_json(self, **kwargs).decode()

    @classmethod
    def model_validate(cls, data: Any) -> Self:
        """Validate a dict (or an instance) into this class; raises `pydantic.ValidationError`."""
        out: Self = adapter(cls).validate_python(data)
        return out

    @classmethod
    def model_validate_json(cls, data: str | bytes) -> Self:
        out: Self = adapter(cls).validate_json(data)
        return out

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
