"""`_data.fast_constructor`: the hot path's constructors build exactly what the classes build."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
from dataclasses import dataclass, field
from typing import Any

import pytest

from thinkloop import _events, _execute, _loop, _messages, _state
from thinkloop._data import fast_constructor

# (class, the fast constructor the loop uses for it)
USED = [
    (_messages.Message, _messages.new_message),
    (_messages.ModelRequest, _messages.new_request),
    (_messages.Usage, _messages._new_usage),
    (_state.LedgerEntry, _state.new_ledger_entry),
    (_state.RunState, _state.new_run_state),
    (_events.RunResult, _events._new_result),
    (_loop.Reply, _loop._new_reply),
    (_execute._Prepared, _execute._new_prepared),
    (_execute.ToolOutcome, _execute._new_outcome),
    (_loop.RunContext, _loop.new_run_context),
]


def _sample(f: dataclasses.Field[Any], n: int) -> Any:
    """A value for field `f`, distinct per `n` (the types are not checked by either constructor)."""
    return f"{f.name}-{n}"


@pytest.mark.parametrize(("cls", "fast"), USED, ids=[c.__name__ for c, _ in USED])
def test_same_signature_as_the_class(cls: type, fast: Any) -> None:
    ours = inspect.signature(fast)
    theirs = inspect.signature(cls)
    assert [(p.name, p.kind) for p in ours.parameters.values()] == [
        (p.name, p.kind) for p in theirs.parameters.values()
    ]


@pytest.mark.parametrize(("cls", "fast"), USED, ids=[c.__name__ for c, _ in USED])
def test_builds_what_the_class_builds(cls: type, fast: Any) -> None:
    fields = dataclasses.fields(cls)
    arguments = [f for f in fields if f.init]
    required = [
        f for f in arguments if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    optional = [f for f in arguments if f not in required]
    # every required field, and each subset of up to 3 optional fields given (the rest defaulted)
    subsets = [c for k in range(min(len(optional), 3) + 1) for c in itertools.combinations(optional, k)]
    for n, given in enumerate(subsets):
        kwargs = {f.name: _sample(f, n) for f in [*required, *given]}
        made, expected = fast(**kwargs), cls(**kwargs)
        assert type(made) is cls
        for f in fields:  # every slot is set, to the same value (a fresh id or time: of the same type)
            ours, theirs = getattr(made, f.name), getattr(expected, f.name)
            if f.name in kwargs or _deterministic(f):
                assert _same(ours, theirs), f.name
            else:
                assert type(ours) is type(theirs) and ours != _MISSING, f.name


_MISSING = object()


def _same(ours: Any, theirs: Any) -> bool:
    """Equal — or, for objects compared by identity (a fresh `Deadlines`), of the same type."""
    return bool(ours == theirs) or (type(ours) is type(theirs) and type(ours).__eq__ is object.__eq__)


def _deterministic(f: dataclasses.Field[Any]) -> bool:
    """Whether a defaulted field is the same in two new objects (not a random id or the time)."""
    factory = f.default_factory
    return factory is dataclasses.MISSING or isinstance(factory, type)


@pytest.mark.parametrize(("cls", "fast"), USED, ids=[c.__name__ for c, _ in USED])
def test_default_factories_give_fresh_objects(cls: type, fast: Any) -> None:
    required = {
        f.name: _sample(f, 0)
        for f in dataclasses.fields(cls)
        if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    one, two = fast(**required), fast(**required)
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING and isinstance(getattr(one, f.name), list | dict):
            assert getattr(one, f.name) is not getattr(two, f.name), f.name


def test_wrong_arguments_fail_as_for_the_class() -> None:
    new = _messages.new_message
    with pytest.raises(TypeError):
        new(content="no role")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        new(role="user", colour="blue")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        new("user")  # type: ignore[misc]  # keyword-only, as the class


def test_positional_dataclasses_take_positional_arguments() -> None:
    @dataclass(slots=True)
    class Point:
        x: int
        y: int = 0
        tags: list[str] = field(default_factory=list)

    new = fast_constructor(Point)
    assert new(1, 2) == Point(1, 2)
    assert new(1, tags=["a"]) == Point(1, tags=["a"])

    @dataclass(slots=True)
    class Mixed:  # keyword-only fields come after the positional ones, as in the class's __init__
        a: int
        b: int = field(default=0, kw_only=True)
        c: int = 1

    made = fast_constructor(Mixed)
    assert [(p.name, p.kind) for p in inspect.signature(made).parameters.values()] == [
        (p.name, p.kind) for p in inspect.signature(Mixed).parameters.values()
    ]
    assert made(1, 2, b=3) == Mixed(1, 2, b=3)


def test_post_init_and_fields_outside_init_as_in_the_class() -> None:
    @dataclass(slots=True)
    class Derived:
        x: int
        doubled: int = field(init=False, default=0)
        seen: list[int] = field(init=False, default_factory=list)

        def __post_init__(self) -> None:
            self.doubled = 2 * self.x
            self.seen.append(self.x)

    new = fast_constructor(Derived)
    assert new(3) == Derived(3) and new(3).doubled == 6 and new(3).seen == [3]
    assert new(3).seen is not new(3).seen


def test_refuses_what_it_cannot_build_the_same() -> None:
    @dataclass(slots=True)
    class WithInitVar:
        x: int
        scale: dataclasses.InitVar[int] = 1

        def __post_init__(self, scale: int) -> None:
            self.x *= scale

    with pytest.raises(TypeError, match="not its fields"):
        fast_constructor(WithInitVar)

    @dataclass
    class NoSlots:
        x: int

    with pytest.raises(TypeError, match="not a slotted dataclass"):
        fast_constructor(NoSlots)
