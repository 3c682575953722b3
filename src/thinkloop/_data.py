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
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal, ParamSpec, Self, TypeVar

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


_P = ParamSpec("_P")
_T = TypeVar("_T")


def fast_constructor(cls: Callable[_P, _T]) -> Callable[_P, _T]:
    """A function building instances of the slotted dataclass `cls` exactly as `cls(...)` does, taking the
    same arguments — minus the cost of calling a class: CPython 3.11 turns the keywords of a class call
    into a dict and back (`type_call`, `slot_tp_init`), which doubles what a small object costs to make.
    For the loop's hot path (a message, a ledger entry, a request a step); the generated code is what
    `dataclasses` writes for `__init__` (fields, then `init=False` fields, then `__post_init__`), on an
    instance made by `object.__new__`. Tests check both agree.
    """
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls) and "__slots__" in vars(cls)):
        raise TypeError(
            f"{getattr(cls, '__name__', cls)!r} is not a slotted dataclass: build it by calling it"
        )
    names: dict[str, Any] = {"_new": object.__new__, "_cls": cls, "_MISSING": dataclasses.MISSING}
    positional: list[str] = []
    keywords: list[str] = []
    body: list[str] = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            names[f"_d_{f.name}"] = f.default
            param, value = f"{f.name}=_d_{f.name}", f.name
        elif f.default_factory is not dataclasses.MISSING:
            names[f"_f_{f.name}"] = f.default_factory
            param, value = f"{f.name}=_MISSING", f"_f_{f.name}() if {f.name} is _MISSING else {f.name}"
        elif f.init:
            param, value = f.name, f.name
        else:
            continue  # `init=False` without a default: left unset, as by the class
        if not f.init:  # set to its default, not an argument
            param, value = "", f"_d_{f.name}" if f.default is not dataclasses.MISSING else f"_f_{f.name}()"
        else:
            (keywords if f.kw_only else positional).append(param)
        body.append(f"    o.{f.name} = {value}\n")
    if hasattr(cls, "__post_init__"):
        body.append("    o.__post_init__()\n")
    signature = ", ".join([*positional, *(["*", *keywords] if keywords else [])])
    source = f"def new_{cls.__name__}({signature}):\n    o = _new(_cls)\n{''.join(body)}    return o\n"
    exec(source, names)
    function: Callable[_P, _T] = names[f"new_{cls.__name__}"]
    if _parameters(function) != _parameters(cls):  # e.g. an `InitVar`, which is no field
        raise TypeError(
            f"{cls.__name__}(...) takes arguments that are not its fields: build it by calling it"
        )
    function.__qualname__ = f"fast_constructor.<{cls.__name__}>"
    return function


def _parameters(function: Callable[..., Any]) -> list[tuple[str, Any]]:
    return [(p.name, p.kind) for p in inspect.signature(function).parameters.values()]
