"""Tools (SPEC §3.1–3.2): a name, a description, a JSON Schema, and an async invoke.

`@tool` builds a `Tool` from a plain (sync or async) function: the schema comes from the type hints,
the description and per-parameter docs from the docstring. `Tool(...)` builds one by hand.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import decimal
import difflib
import functools
import inspect
import json
import math
import queue
import re
import threading
import typing
import unicodedata
import warnings
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from concurrent.futures import Executor, Future
from copy import copy as shallow_copy
from types import MethodType, UnionType
from typing import Annotated, Any, Generic, TypeVar, get_origin, get_type_hints, overload

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic.fields import FieldInfo
from pydantic.json_schema import PydanticJsonSchemaWarning

from ._errors import ConfigurationError
from ._messages import ToolDefinition
from ._risk import RiskLevel

RiskSpec = RiskLevel | Callable[[dict[str, Any]], RiskLevel]
T = TypeVar("T")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")  # what every model API accepts (OpenAI rejects '.')


def _type_name(value: object) -> str:
    """`an int (3)`, `a str ('x')`, `None`: a value as a message names it."""
    if value is None:
        return "None"
    kind = type(value).__name__
    return f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind} ({value!r:.60})"


def _checked_schema(name: str, parameters: Mapping[str, Any] | None) -> dict[str, Any]:
    """A tool's `parameters`, checked as far as the loop reads them: an object schema, its `properties` a
    mapping of schemas, its `required` a list of names. A malformed one failed at the first call."""
    if parameters is None:
        return {"type": "object", "properties": {}}
    where = f"the parameters of tool {name!r}"
    if not isinstance(parameters, Mapping):
        raise ConfigurationError(
            f"{where} must be a JSON Schema object (a dict), not {_type_name(parameters)}"
        )
    kind = parameters.get("type", "object")
    if kind != "object":
        raise ConfigurationError(
            f"{where} must be an object schema ({{'type': 'object', 'properties': {{...}}}}): the model sends "
            f"its arguments as a JSON object; got 'type': {kind!r}"
        )
    properties = parameters.get("properties", {})
    if not isinstance(properties, Mapping) or not all(isinstance(key, str) for key in properties):
        raise ConfigurationError(
            f"{where}: 'properties' must map each argument's name to its schema "
            f"({{'city': {{'type': 'string'}}}}), not {_type_name(properties)}"
        )
    for key, schema in properties.items():
        if not isinstance(schema, Mapping | bool):
            raise ConfigurationError(
                f"{where}: the schema of {key!r} must be a dict, not {_type_name(schema)}"
            )
    required = parameters.get("required", [])
    if not isinstance(required, list | tuple) or not all(isinstance(key, str) for key in required):
        raise ConfigurationError(
            f"{where}: 'required' must be a list of argument names, not {_type_name(required)}"
        )
    return dict(parameters) if parameters else {"type": "object", "properties": {}}


def _checked_timeout(name: str, timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise ConfigurationError(
            f"the timeout of tool {name!r} must be a positive number of seconds (None: the agent's "
            f"tool_timeout), not {_type_name(timeout)}"
        )
    return timeout


def _checked_length(name: str, length: int | None) -> int | None:
    if length is None:
        return None
    if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
        raise ConfigurationError(
            f"the output_max_length of tool {name!r} must be a positive whole number of characters (None: "
            f"the agent's output_max_length), not {_type_name(length)}"
        )
    return length


_RISK_LEVELS = ", ".join(repr(level.value) for level in RiskLevel)


def risk_level(value: object) -> RiskLevel | None:
    """`value` as a `RiskLevel`: one as it is, its name as text in any case (`"high"`, `"HIGH"`); else None."""
    if isinstance(value, RiskLevel):
        return value
    if isinstance(value, str):
        try:
            return RiskLevel(value.strip().lower())
        except ValueError:
            return None
    return None


def _checked_risk(name: str, risk: object) -> RiskSpec:
    """A tool's `risk`: a `RiskLevel` (or its name as text, converted), or a function of the arguments.
    Anything else was called as a risk function at every call, failed, and rated each call HIGH in silence
    (`risk="low"` too)."""
    level = risk_level(risk)
    if level is not None:
        return level
    if not callable(risk) or isinstance(risk, type):
        raise ConfigurationError(
            f"the risk of tool {name!r} must be a RiskLevel ({_RISK_LEVELS}: RiskLevel.HIGH or its name as "
            f"text) or a function of the arguments returning one, not {_type_name(risk)}"
        )
    if _is_async_callable(risk):  # never awaited where each call is rated: every call would be rated HIGH
        raise ConfigurationError(
            f"the risk function of tool {name!r} is async: it must be a plain (sync) function of the "
            "arguments returning a RiskLevel, called before each call runs — do any slow check in the tool "
            "or in an approval function instead"
        )
    return risk


def _is_async_callable(value: object) -> bool:
    return inspect.iscoroutinefunction(value) or inspect.iscoroutinefunction(
        getattr(value, "__call__", None)  # noqa: B004  # a callable object with an async __call__
    )


def _checked_flag(name: str, flag: str, value: object) -> bool:
    """A yes/no setting of a tool: `True` or `False` only (a text `"false"` is true, `None` false)."""
    if not isinstance(value, bool):
        raise ConfigurationError(f"{flag} of tool {name!r} must be True or False, not {_type_name(value)}")
    return value


def _checked_parts(name: str, function: object, validator: object, context_param: object) -> None:
    """The parts of a hand-made `Tool` the loop calls: each failed only at the tool's first call."""
    if not callable(function):
        raise ConfigurationError(
            f"the function of tool {name!r} must be a function (sync or async) taking the arguments as "
            f"keywords, not {_type_name(function)}"
        )
    if validator is not None and not (isinstance(validator, type) and issubclass(validator, BaseModel)):
        raise ConfigurationError(
            f"the validator of tool {name!r} must be a pydantic model class (or None: the arguments are "
            f"checked against parameters), not {_type_name(validator)}"
        )
    if context_param is not None and not isinstance(context_param, str):
        raise ConfigurationError(
            f"context_param of tool {name!r} must be the name of the function's parameter that receives "
            f"the ToolContext (or None), not {_type_name(context_param)}"
        )


def _bad_name_message(name: object) -> str:
    text = name if isinstance(name, str) else ""
    ascii_name = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    suggestion = re.sub(r"[^A-Za-z0-9_-]+", "_", ascii_name).strip("_-")[:64]
    if suggestion and suggestion[0].isdigit():
        suggestion = f"_{suggestion}"[:64]
    instead = f"use {suggestion!r}" if suggestion else "e.g. 'search_orders'"
    return (
        f"invalid tool name {name!r}: model APIs accept only 1-64 ASCII letters, digits, '_' and '-', "
        f"not starting with a digit (no spaces, dots or other characters); {instead} (tool(name=...))"
    )


def _safe_str(value: object) -> str:
    """`str(value)`, or a description when its `__str__` fails (an untrusted object must not raise here)."""
    try:
        return str(value)
    except Exception as exc:
        return f"<{type(value).__name__} object; str() raised {type(exc).__name__}>"


class ToolArgumentsError(ValueError):
    """Arguments that do not match a tool's schema; the message is written for the model to read."""


D = TypeVar("D")


@dataclasses.dataclass(frozen=True, slots=True)
class ToolContext(Generic[D]):
    """What a tool may know of the run calling it. Declare a parameter of this type — any name,
    `ctx: ToolContext[MyDeps]` — and it is passed in; the model never sees it.

    `deps` is what the run was given (`agent.run(goal, deps=...)`): a database session, the user's
    identity, a client — per run, so one agent serves many users without globals.
    """

    run_id: str
    call_id: str
    step: int
    goal: str
    deps: D
    metadata: dict[str, Any]


class Tool:
    """A tool an agent can call.

    Args:
        name: what the model calls it (letters, digits, `_`, `-`; at most 64 characters, not starting
            with a digit: what every provider accepts).
        description: what it does, for the model.
        parameters: JSON Schema of its arguments (an object schema).
        function: sync or async callable receiving the validated arguments as keyword arguments.
        risk: a static `RiskLevel`, or a function of the arguments returning one (dynamic risk).
        timeout: seconds before a call is abandoned (None: the agent's default, 120 s).
        idempotent: True if running a call twice has the same effect as once (safe to re-run on resume).
        output_max_length: characters kept of the output (None: the agent's default, 10,000).
        validator: a pydantic model validating and coercing the arguments (built by `@tool`); without
            one, required properties and basic JSON types are checked against `parameters` (a number or
            boolean sent as text, `"100"`, is converted as pydantic would).
        in_thread: run a sync function in a worker thread (the default, so a blocking function never
            stalls other runs); `False` calls it directly — only for quick, non-blocking functions.
        context_param: the function's parameter that receives the call's `ToolContext` (set by `@tool`
            for a parameter annotated `ToolContext`); it is not part of `parameters`.
    """

    def __init__(
        self,
        name: str,
        description: str,
        parameters: Mapping[str, Any] | None,
        function: Callable[..., Any],
        *,
        risk: RiskSpec = RiskLevel.LOW,
        timeout: float | None = None,
        idempotent: bool = False,
        output_max_length: int | None = None,
        validator: type[BaseModel] | None = None,
        in_thread: bool = True,
        context_param: str | None = None,
    ) -> None:
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise ConfigurationError(_bad_name_message(name))
        if not isinstance(description, str):
            raise ConfigurationError(
                f"the description of tool {name!r} must be text, not {_type_name(description)}"
            )
        _checked_parts(name, function, validator, context_param)
        self.name = name
        self.description = description.strip()
        self.parameters: dict[str, Any] = _checked_schema(name, parameters)
        self.function = function
        self.risk = _checked_risk(name, risk)
        self.timeout = _checked_timeout(name, timeout)
        self.idempotent = _checked_flag(name, "idempotent", idempotent)
        self.output_max_length = _checked_length(name, output_max_length)
        self.validator = validator
        self._renamed = _renamed_fields(validator)  # field -> parameter, for parameters pydantic reserves
        self._plain = _plain_fields(validator)  # a type check does what pydantic would (scalars, no rules)
        self.in_thread = _checked_flag(name, "in_thread", in_thread)
        self.context_param = context_param  # the parameter that receives the `ToolContext`, if any
        self._is_async = _is_async_callable(function)
        self._collects = inspect.isasyncgenfunction(function)  # an async generator: its items are the output
        self._positional = _positional_only(function)  # passed by position: `def f(a, /)` takes no a=
        self.definition = ToolDefinition(name=name, description=self.description, parameters=self.parameters)
        self._binds: str | None = None  # "instance" / "class": `@tool` on a method, bound on access
        self._attribute: str | None = None  # the name it has in a class

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"

    def __set_name__(self, owner: type, name: str) -> None:
        self._attribute = name

    def __get__(self, instance: object, owner: type | None = None) -> Tool:
        """`@tool` on a method: the tool of the instance (`catalog.search`, with its own `self`), or of
        the class for a classmethod. Any other tool kept in a class is itself."""
        binds = self._binds
        if binds is None or (binds == "instance" and instance is None):
            return self
        bound = shallow_copy(self)
        bound._binds = None
        bound.function = MethodType(self.function, owner if binds == "class" else instance)
        bound._positional = _positional_only(bound.function)
        return bound

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Return the validated (and coerced) arguments, or raise `ToolArgumentsError`."""
        if self._plain is not None:  # arguments of exactly the declared scalar types: valid as they are
            plain = _plainly_valid(self._plain, arguments)
            if plain is not None:
                return plain
        for value in arguments.values():
            if type(value) in _CONTAINERS:
                arguments = _detached(arguments)
                break  # (only scalars, most calls: nothing to copy)
        validator = self.validator
        if validator is not None:
            try:
                model = validator.__pydantic_validator__.validate_python(arguments)
            except ValidationError as exc:
                model = _revalidated(validator, arguments, exc)
            values: dict[str, Any] = dict(model.__dict__)  # the validated fields, by name (extras aside)
            if self._renamed:
                return {self._renamed.get(key, key): value for key, value in values.items()}
            return values
        return _check_against_schema(arguments, self.parameters)

    def risk_for(self, arguments: dict[str, Any]) -> RiskLevel:
        """The risk of a call with these arguments; a failing risk function rates the call HIGH."""
        if isinstance(self.risk, RiskLevel):
            return self.risk
        try:
            rated = self.risk(arguments)
            if inspect.iscoroutine(rated):  # an async risk function: never awaited here, so never run
                rated.close()
                return RiskLevel.HIGH
            return risk_level(rated) or RiskLevel.HIGH  # "LOW" as well as RiskLevel.LOW; anything else HIGH
        except (Exception, SystemExit):  # sys.exit() in a risk function does not end the process
            return RiskLevel.HIGH

    def invoke(self, arguments: dict[str, Any]) -> Awaitable[Any]:
        """Call the function with validated arguments (await the result). Sync functions run in a worker
        thread unless `in_thread=False`; an awaitable a sync function returns is awaited too."""
        function = self.function
        if self._positional:
            function, arguments = _by_position(function, self._positional, arguments)
        if self._is_async:
            return function(**arguments)  # type: ignore[no-any-return]  # its coroutine, not started
        if self._collects:
            return collect_items(function(**arguments))
        return self._invoke_sync(function, arguments)

    async def _invoke_sync(self, function: Callable[..., Any], arguments: dict[str, Any]) -> Any:
        if self.in_thread:
            stop = threading.Event()
            call = functools.partial(
                contextvars.copy_context().run, _call_and_drain, function, arguments, True, stop
            )
            try:
                result = await asyncio.get_running_loop().run_in_executor(tool_threads(), call)
            finally:
                stop.set()  # given up on (its timeout, a cancelled run): a generator stops at its next item
        else:
            result = _call_and_drain(function, arguments, False)
        if inspect.isawaitable(result):
            result = await result
        if inspect.isgenerator(result):  # `in_thread=False`: drained in a thread all the same
            result = await drain_in_thread(result)
        if inspect.isasyncgen(result):
            result = await collect_items(result)
        return result


def _call_and_drain(
    function: Callable[..., Any],
    arguments: dict[str, Any],
    in_thread: bool,
    stop: threading.Event | None = None,
) -> Any:
    """Call a sync tool function; a generator it returns is run to its end (its items are the output) in
    a worker thread (`stop` given): on the event loop's, one yielding for ever would hang every run, its
    time limit never firing — it is returned as it is, for `drain_in_thread`.

    An exception the event loop would misread is raised as a stand-in of the same name (see
    `ToolRaisedError`). A `KeyboardInterrupt` on the event loop's thread may be the user's Ctrl-C and
    passes through; in a worker thread (no signal reaches one) it is the tool's own.
    """
    try:
        result = function(**arguments)
        return _drained(result, stop) if stop is not None and inspect.isgenerator(result) else result
    except KeyboardInterrupt as exc:
        if not in_thread:
            raise
        raise _stand_in(exc) from exc
    except _MISREAD as exc:
        raise _stand_in(exc) from exc


class ToolRaisedError(RuntimeError):
    """A stand-in for an exception a sync tool raised that asyncio would misread, named like it.

    `StopIteration` cannot cross into a future (the call never ended), `TimeoutError` read as the call's
    own time limit, and a cancellation error, `GeneratorExit` or (from a worker thread)
    `KeyboardInterrupt` cancelled or ended the whole run. The stand-in is an ordinary failure of the
    call — its class is named like the original (`raised StopIteration: ...`), which is its `__cause__`.
    """


_MISREAD = (
    StopIteration,
    TimeoutError,
    concurrent.futures.CancelledError,
    asyncio.CancelledError,
    GeneratorExit,
)


def _stand_in(exc: BaseException) -> ToolRaisedError:
    kind = type(exc)
    stand_in = _STAND_INS.get(kind)
    if stand_in is None:
        names = {"__module__": __name__, "__qualname__": kind.__name__}
        stand_in = _STAND_INS.setdefault(kind, type(kind.__name__, (ToolRaisedError,), names))
    return stand_in(_safe_str(exc))


_STAND_INS: dict[type[BaseException], type[ToolRaisedError]] = {}


def _revalidated(validator: type[BaseModel], arguments: dict[str, Any], exc: ValidationError) -> BaseModel:
    """After a failed validation: once more with what small models get wrong put right (see `_repaired`),
    else `ToolArgumentsError` explaining the first failure."""
    repaired = _repaired(validator, arguments, exc)
    if repaired is None:
        raise ToolArgumentsError(_explain(exc, arguments)) from None
    try:
        return validator.__pydantic_validator__.validate_python(repaired)  # type: ignore[no-any-return]
    except ValidationError as again:
        raise ToolArgumentsError(_explain(again, repaired)) from None


_STRUCTURED = frozenset(
    {"list_type", "tuple_type", "set_type", "frozen_set_type", "dict_type", "iterable_type",
     "model_type", "model_attributes_type", "dataclass_type", "dataclass_args_type"}
)  # fmt: skip


def _repaired(
    validator: type[BaseModel], arguments: dict[str, Any], exc: ValidationError
) -> dict[str, Any] | None:
    """The arguments with three slips of small models put right, where the intent is plain: a list or
    an object sent as JSON text (`"[1, 2]"` for a `list[int]`) is decoded, null for a parameter that
    has a default is dropped (the default applies), and the fields of the one object parameter missing
    sent as arguments themselves (`{"city": …}` for `forecast(place: Place)`) are put in it. None when
    none happened."""
    optional = {f.alias or n for n, f in validator.model_fields.items() if not f.is_required()}
    errors = exc.errors(include_url=False)
    fixed = _nested(validator, arguments, errors) or dict(arguments)
    for error in errors:
        key = error["loc"][0] if error["loc"] else None
        if not isinstance(key, str) or key not in fixed:
            continue
        value = fixed[key]
        if value is None and key in optional:
            del fixed[key]
        elif isinstance(value, str) and error["type"] in _STRUCTURED:
            decoded = _json_container(value)
            if decoded is not None:
                fixed[key] = decoded
    return fixed if fixed != arguments else None


def _nested(
    validator: type[BaseModel], arguments: dict[str, Any], errors: list[Any]
) -> dict[str, Any] | None:
    """The arguments that are fields of the one required object parameter missing, moved into it."""
    missing = [e["loc"][0] for e in errors if e["type"] == "missing" and len(e["loc"]) == 1]
    fields = {f.alias or n: f for n, f in validator.model_fields.items()}
    objects = {name: _object_fields(fields[name].annotation) for name in missing if name in fields}
    found = [(name, keys) for name, keys in objects.items() if keys]
    if len(found) != 1:
        return None
    name, keys = found[0]
    flat = {key: value for key, value in arguments.items() if key not in fields}
    if not flat or not flat.keys() <= keys:
        return None
    return {**{k: v for k, v in arguments.items() if k in fields}, name: flat}


def _object_fields(annotation: Any) -> set[str] | None:
    """The field names of a model, dataclass or TypedDict (`X | None` too), else None."""
    options = [a for a in typing.get_args(annotation) if a is not type(None)]
    if get_origin(annotation) in (typing.Union, UnionType) and len(options) == 1:
        annotation = options[0]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {f.alias or n for n, f in annotation.model_fields.items()}
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        return {f.name for f in dataclasses.fields(annotation)}
    if isinstance(annotation, type) and issubclass(annotation, dict) and hasattr(annotation, "__total__"):
        return set(annotation.__annotations__)  # a TypedDict
    return None


def _json_container(text: str) -> list[Any] | dict[str, Any] | None:
    text = text.strip()
    if not text.startswith(("[", "{")):
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, list | dict) else None


_CONTAINERS = frozenset({list, dict})


def _detached(arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments with the lists and dicts inside them copied, so a tool that changes its arguments
    does not rewrite the call the run recorded (the model's message, events, the saved state). Iterative:
    arguments nest as deep as JSON allows; a list or dict met twice is copied once."""
    for value in arguments.values():
        if type(value) in _CONTAINERS:
            break
    else:
        return arguments  # only scalars (most calls): nothing to copy
    copies: dict[int, Any] = {}
    top = dict(arguments)
    stack: list[Any] = [top]
    while stack:
        node = stack.pop()
        for key in range(len(node)) if type(node) is list else list(node):
            value = node[key]
            if type(value) is list or type(value) is dict:
                if id(value) not in copies:
                    copies[id(value)] = value.copy()
                    stack.append(copies[id(value)])
                node[key] = copies[id(value)]
    return top


_SCALARS = frozenset({int, float, str, bool})
_PLAIN_DEFAULTS = (int, float, str, bool, type(None))
_TOOL_CONFIG = ConfigDict(extra="forbid", arbitrary_types_allowed=False, allow_inf_nan=False)

PlainFields = tuple[dict[str, type], dict[str, Any]]


def _plain_fields(validator: type[BaseModel] | None) -> PlainFields | None:
    """`(types, defaults)` when every argument is a plain `int`, `float`, `str` or `bool` — no constraint,
    alias or validator, a scalar default if any, the configuration `@tool` gives — so that pydantic
    would return a value of exactly that type as it is; None otherwise (pydantic validates every call)."""
    if validator is None or dict(validator.model_config) != dict(_TOOL_CONFIG):
        return None
    decorators = validator.__pydantic_decorators__
    if any(
        (decorators.validators, decorators.field_validators, decorators.root_validators,
         decorators.model_validators)
    ):  # fmt: skip
        return None
    types: dict[str, type] = {}
    defaults: dict[str, Any] = {}
    for name, info in validator.model_fields.items():
        plain = info.annotation in _SCALARS and not info.metadata and info.alias is None
        if not plain or info.validation_alias is not None or info.default_factory is not None:
            return None
        if not info.is_required():
            if type(info.default) not in _PLAIN_DEFAULTS:
                return None
            defaults[name] = info.default
        types[name] = info.annotation  # type: ignore[assignment]
    return types, defaults


def _plainly_valid(fields: PlainFields, arguments: dict[str, Any]) -> dict[str, Any] | None:
    """The validated arguments when each is exactly of its declared type and none is missing; None when
    pydantic must decide (a coercion like "3" → 3 or 3 → 3.0, an unknown or missing argument, an error)."""
    types, defaults = fields
    for key, value in arguments.items():
        kind = types.get(key)
        if kind is not type(value) or (kind is float and not math.isfinite(value)):  # type: ignore[arg-type]  # NaN: pydantic refuses
            return None
    if len(arguments) == len(types):
        return dict(arguments)
    if any(key not in arguments and key not in defaults for key in types):
        return None
    return {**defaults, **arguments}


def _renamed_fields(validator: type[BaseModel] | None) -> dict[str, str]:
    if validator is None:
        return {}
    fields = validator.model_fields
    return {n: f.alias for n, f in fields.items() if n.startswith(_RENAMED) and f.alias is not None}


def _positional_only(function: Callable[..., Any]) -> tuple[tuple[str, Any], ...]:
    """The positional-only parameters of `function` with their defaults (none when it has no signature)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple((p.name, p.default) for p in parameters if p.kind is p.POSITIONAL_ONLY)


def _by_position(
    function: Callable[..., Any], positional: tuple[tuple[str, Any], ...], arguments: dict[str, Any]
) -> tuple[Callable[..., Any], dict[str, Any]]:
    """`function` with its positional-only arguments bound in order (a default fills a gap), and the rest."""
    rest = dict(arguments)
    values = []
    for name, default in positional:
        if name in rest:
            values.append(rest.pop(name))
        elif default is not inspect.Parameter.empty:
            values.append(default)
        else:
            break  # missing: the call raises TypeError naming it
    return functools.partial(function, *values), rest


def _drained(items: Iterator[Any], stop: threading.Event) -> list[Any]:
    """The items of a generator, until its end, its `MAX_ITEMS`-th item or until `stop` is set (the call
    was given up on: the generator is closed, its thread freed — it would yield for ever, filling the memory)."""
    collected: list[Any] = []
    try:
        for item in items:
            if stop.is_set() or _capped(collected):
                break
            collected.append(item)
    finally:
        if (stop.is_set() or len(collected) > MAX_ITEMS) and inspect.isgenerator(items):
            items.close()
    return collected


MAX_ITEMS = (
    100_000  # items of a generator tool kept: one yielding for ever filled the memory before its time limit
)


def _capped(collected: list[Any]) -> bool:
    """Whether `collected` holds `MAX_ITEMS` items: then the note saying the rest was not taken ends it."""
    if len(collected) < MAX_ITEMS:
        return False
    if len(collected) == MAX_ITEMS:
        collected.append(f"(stopped after {MAX_ITEMS:,} items: the tool yields more; ask it for fewer)")
    return True


async def drain_in_thread(items: Iterator[Any]) -> list[Any]:
    """The items of a sync generator, drained in a tool thread: on the event loop one yielding for ever
    hung every run (no timer can fire). Given up on (a timeout, a cancelled run), it stops at its next item."""
    stop = threading.Event()
    call = functools.partial(
        contextvars.copy_context().run, _call_and_drain, _drained, {"items": items, "stop": stop}, True
    )
    try:
        return await asyncio.get_running_loop().run_in_executor(tool_threads(), call)
    finally:
        stop.set()


COLLECT_PAUSE = 64  # items of an async generator collected between two chances for the event loop to run


async def collect_items(items: Any) -> list[Any]:
    """The items of an async generator, as a list (at most `MAX_ITEMS`). Every `COLLECT_PAUSE` items the event loop gets to run,
    so that one which never awaits — yielding for ever — is still stopped at the call's time limit; it is
    closed however the collecting ends."""
    collected: list[Any] = []
    try:
        async for item in items:
            if _capped(collected):
                break
            collected.append(item)
            if len(collected) % COLLECT_PAUSE == 0:
                await asyncio.sleep(0)
    finally:
        _close_now(items)
    return collected


def _close_now(items: Any) -> None:
    """Close an async generator at once, without waiting on it: one stopped at its time limit whose
    `finally` awaits something is closed where it waits (a generator that ended needs nothing)."""
    aclose = getattr(items, "aclose", None)
    if aclose is None:
        return
    closing = aclose()
    try:
        closing.send(None)
    except StopIteration:
        return
    except Exception:  # its `finally` raised: the call is over, its result or failure told already
        return
    with contextlib.suppress(RuntimeError):  # "async generator ignored GeneratorExit": left where it waits
        closing.close()


TOOL_THREADS = 64
ABANDONED_THREADS = 256  # threads started beyond TOOL_THREADS, one for each abandoned call still running


class _Job(Future[Any]):
    """The future of one job. Cancelled once it runs (its caller gave up on it: a timeout, a cancelled
    run), it cannot stop; it tells the pool, which may start a thread in its place."""

    def __init__(self, pool: _ToolThreads) -> None:
        super().__init__()
        self.pool = pool
        self.abandoned = False

    def cancel(self) -> bool:
        if super().cancel():
            return True
        self.pool.abandoned(self)
        return False


class _ToolThreads(Executor):
    """The worker threads of sync tools: daemon threads, started on demand up to `max_workers` and reused.

    Not the event loop's default executor (5-36 threads, joined when `asyncio.run` ends) nor a
    `ThreadPoolExecutor` (joined at interpreter exit): a tool abandoned after its timeout keeps its
    thread — a thread cannot be stopped — and must neither starve other work nor keep the process from
    exiting once the run is over. Each abandoned job still running lets one more thread start (up to
    `max_abandoned` of them), so tools that hang for ever do not leave the calls after them queued behind
    them; when it ends at last, its thread ends too if the pool is over its size.
    """

    def __init__(self, max_workers: int, max_abandoned: int = ABANDONED_THREADS) -> None:
        self._jobs: queue.SimpleQueue[tuple[_Job, Callable[[], Any]]] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads = 0
        self._max = max_workers
        self._abandoned = 0
        self._max_abandoned = max_abandoned

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future = _Job(self)
        self._jobs.put((future, functools.partial(fn, *args, **kwargs)))
        with self._lock:
            if not self._idle.acquire(blocking=False) and self._threads < self._max + self._abandoned:
                self._start()
        return future

    def abandoned(self, job: _Job) -> None:
        """`job`, running, was given up on: one more thread may start, at once if work is waiting."""
        with self._lock:
            if job.abandoned or not job.running() or self._abandoned >= self._max_abandoned:
                return
            job.abandoned = True
            self._abandoned += 1
            if not self._jobs.empty() and self._threads < self._max + self._abandoned:
                self._start()

    def _start(self) -> None:
        self._threads += 1
        name = f"thinkloop-tool-{self._threads}"
        threading.Thread(target=self._work, name=name, daemon=True).start()

    def _work(self) -> None:
        while True:
            future, job = self._jobs.get()
            if future.set_running_or_notify_cancel():
                try:
                    result = job()
                except BaseException as exc:  # handed to the awaiting coroutine, like any executor
                    future.set_exception(exc)
                else:
                    future.set_result(result)
                if self._ends_after(future):
                    return
            del future, job
            self._idle.release()

    def _ends_after(self, job: _Job) -> bool:
        """Whether the thread that ran `job` ends now: the job was abandoned, and the pool is over its size."""
        with self._lock:  # read under the lock: `abandoned()` may be marking it right now
            if not job.abandoned:
                return False
            self._abandoned -= 1
            if self._threads <= self._max + self._abandoned:
                return False
            self._threads -= 1
            return True


_tool_threads = _ToolThreads(TOOL_THREADS)


def tool_threads() -> Executor:
    """The executor sync tools run in (see `_ToolThreads`)."""
    return _tool_threads


_MISSING = frozenset(
    {"missing", "missing_argument", "missing_keyword_only_argument", "missing_positional_only_argument"}
)
_EXTRA = frozenset({"extra_forbidden", "unexpected_keyword_argument", "unexpected_positional_argument"})
_OBJECT_TYPES = frozenset({"model_type", "model_attributes_type", "dataclass_type", "dict_type"})
_MAX_PROBLEMS = 5  # told one by one; the rest counted
_ORDINALS = ("first", "second", "third", "fourth", "fifth")

Located = tuple[str, str | None, str, str, str]  # where, union member, where in it, problem, value given


def _explain(exc: ValidationError, arguments: dict[str, Any]) -> str:
    """What is wrong with the arguments, for the model: each problem where it is (`place.city`,
    `values[1]`), what is wrong and the value given (`Input should be a valid integer (got "three")`),
    an argument the tool does not take with the one it may have meant, and for a value matching none of
    a union's forms, why it fails each (a union's members, Python names, are not shown)."""
    return explain_errors(exc.errors(include_url=False), arguments)


def explain_errors(errors: Iterable[Any], arguments: dict[str, Any]) -> str:
    """`_explain` for some of a `ValidationError`'s `errors()`."""
    errors = list(errors)
    located = [_located(err, arguments) for err in errors]
    top = [(err["type"], str(err["loc"][0])) for err in errors if len(err["loc"]) == 1]
    missing = [name for kind, name in top if kind in _MISSING]
    unknown = sum(kind in _EXTRA for kind, _ in top)
    groups: dict[str, list[Located]] = {}
    for item in located:
        groups.setdefault(item[0], []).append(item)
    parts = [_described(where, items, (missing, unknown)) for where, items in groups.items()]
    more = len(parts) - _MAX_PROBLEMS
    shown = "; ".join(parts[:_MAX_PROBLEMS])
    return f"{shown}; and {more} more problem{'s' * (more > 1)}" if more > 0 else shown


_REQUIRED = "required, not given"


def _located(err: Any, arguments: dict[str, Any]) -> Located:
    """`(where, union member, where inside the member, problem, value)` of one pydantic error. pydantic's
    location names a union's member (`("guests", "int")`); it is told apart as no key of the input."""
    kind, loc = err["type"], err["loc"]
    before: list[str | int] = []
    after: list[str | int] = []
    tag: str | None = None
    node: Any = arguments
    for index, part in enumerate(loc):
        present = (isinstance(node, dict) and part in node) or (
            isinstance(node, list | tuple) and isinstance(part, int) and -len(node) <= part < len(node)
        )
        if present or (index == len(loc) - 1 and kind in _MISSING | _EXTRA):
            (before if tag is None else after).append(part)
            node = node[part] if present else None
        elif tag is None:
            tag = str(part)
    where = _path(before) or "arguments"
    if kind in _MISSING:
        return where, tag, _path(after), _REQUIRED, ""
    if kind in _EXTRA:
        return where, tag, _path(after), "no such argument" if len(loc) == 1 else "no such field", ""
    problem = "Input should be an object" if kind in _OBJECT_TYPES else str(err["msg"])
    return where, tag, _path(after), problem, _shown(err.get("input"))


def _path(parts: list[str | int]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text


def _shown(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, default=_safe_str)
    except (TypeError, ValueError, RecursionError):
        text = _safe_str(value)
    return text if len(text) <= 80 else text[:79] + "…"


def _described(where: str, items: list[Located], missing: tuple[list[str], int]) -> str:
    """One location's problems: one problem as it is; a union's, member by member."""
    members = list(dict.fromkeys(tag for _, tag, _, _, _ in items))
    if len(members) <= 1:
        texts = [_problem(_path_join(where, inner), problem, given) for _, _, inner, problem, given in items]
        if items[0][3] == "no such argument":
            texts[0] += _meant(where, *missing)
        return "; ".join(texts)
    problems = [problem for _, _, inner, problem, _ in items if not inner]
    if len(problems) == len(items) and all(p.startswith("Input should be ") for p in problems):
        merged = " or ".join(dict.fromkeys(p.removeprefix("Input should be ") for p in problems))
        return _problem(where, f"Input should be {merged}", items[0][4])
    forms = []
    for number, member in enumerate(members):
        inside = [_problem(inner, p, given) for _, tag, inner, p, given in items if tag == member]
        ordinal = _ORDINALS[number] if number < len(_ORDINALS) else f"number {number + 1}"
        forms.append(f"{ordinal} form: {', '.join(inside)}")
    return f"{where}: matches none of the forms it accepts ({' / '.join(forms)})"


def _path_join(where: str, inner: str) -> str:
    return where if not inner else f"{where}{inner}" if inner.startswith("[") else f"{where}.{inner}"


def _problem(where: str, problem: str, given: str) -> str:
    text = f"{where}: {problem}" if where else problem
    return f"{text} (got {given})" if given else text


def _meant(extra: str, missing: list[str], unknown: int) -> str:
    """For an argument the tool does not take: the required one not given that it may stand for — the
    only one missing for the only one unknown, else the one spelled most like it."""
    if len(missing) == 1 and unknown == 1:
        return f" (did you mean {missing[0]}?)"
    close = difflib.get_close_matches(extra, missing, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def _check_against_schema(arguments: dict[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    """A light check for hand-written tools: required properties, unknown ones, and top-level types, told
    as `@tool`'s errors are. A number or boolean sent as text (`"100"`, `"true"`) is taken as pydantic's
    lax mode takes it; the arguments returned are those (the same dict when nothing was converted)."""
    properties: Mapping[str, Any] = schema.get("properties", {})
    problems = [f"{name}: {_REQUIRED}" for name in schema.get("required", []) if name not in arguments]
    closed = schema.get("additionalProperties") is False
    unknown = [name for name in arguments if closed and name not in properties]
    checked = arguments
    for name, value in arguments.items():
        if name in unknown:
            meant = _meant(name, [p.partition(":")[0] for p in problems], len(unknown))
            problems.append(f"{name}: no such argument{meant}")
            continue
        prop = properties.get(name)
        expected = prop.get("type") if isinstance(prop, dict) else None
        if not isinstance(expected, str) or expected not in _JSON_TYPES or _is_json_type(value, expected):
            continue
        converted = _lax(value, expected)
        if converted is _NOT_CONVERTED:
            problems.append(f"{name}: Input should be {_JSON_TYPE_TEXT[expected]} (got {_shown(value)})")
        else:
            checked = {**checked, name: converted}
    if problems:
        raise ToolArgumentsError("; ".join(problems))
    return checked


_JSON_TYPE_TEXT = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "array": "a list",
    "object": "an object",
    "null": "null",
}
_NOT_CONVERTED = object()


def _is_json_type(value: Any, expected: str) -> bool:
    if isinstance(value, bool):
        return expected == "boolean"
    return isinstance(value, _JSON_TYPES[expected])


def _lax(value: Any, expected: str) -> Any:
    """`value` as the JSON type `expected`, where pydantic's lax mode converts it (`"100"` → 100, 2.0 → 2,
    `"true"` → True), else `_NOT_CONVERTED`."""
    if isinstance(value, bool):
        return _NOT_CONVERTED
    if expected == "boolean" and isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if expected in ("integer", "number") and isinstance(value, str):
        try:
            value = (
                float(value)
                if expected == "number" or not value.strip().lstrip("+-").isdigit()
                else int(value)
            )
        except ValueError:
            return _NOT_CONVERTED
    if expected == "number" and isinstance(value, int | float) and math.isfinite(value):
        return value
    if expected == "integer" and isinstance(value, int):
        return value
    if expected == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    return _NOT_CONVERTED


# ---------------------------------------------------------------------------------------------- @tool


@overload
def tool(function: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    risk: RiskSpec = RiskLevel.LOW,
    timeout: float | None = None,
    idempotent: bool = False,
    output_max_length: int | None = None,
    in_thread: bool = True,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    function: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    risk: RiskSpec = RiskLevel.LOW,
    timeout: float | None = None,
    idempotent: bool = False,
    output_max_length: int | None = None,
    in_thread: bool = True,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a `Tool` from a function: `@tool` or `@tool(risk=RiskLevel.HIGH, timeout=10)`.

    The parameters' type hints become the JSON Schema; the docstring's first paragraph becomes the
    description and an `Args:` section documents the parameters.
    """

    _check_tool_options(function, name, description)

    def build(fn: Callable[..., Any]) -> Tool:
        if isinstance(fn, Tool):
            raise ConfigurationError(
                f"{fn!r} is a tool already: use it as it is (tool() makes one from a function, once)"
            )
        if not callable(fn) and not isinstance(fn, classmethod):
            raise ConfigurationError(f"tool() makes a tool from a function, not from {_type_name(fn)}")
        fn, binds, self_param = _method_parts(fn)
        label = name or _function_name(fn)
        summary, param_docs = _parse_docstring(_function_doc(fn))
        described = (description or summary or label.replace("_", " ")).strip()
        if len(described) > MAX_DESCRIPTION:
            raise ConfigurationError(
                f"the description of tool {label!r} has {len(described):,} characters, more than the "
                f"{MAX_DESCRIPTION:,} model APIs accept (OpenAI refuses the request): shorten the docstring "
                "before its first section (Args:), move details into the parameters' docs, or pass "
                "tool(description=...)"
            )
        hints = _type_hints(fn, label)
        context_param = _context_param(hints, label)
        validator = _validator_for(fn, hints, param_docs, skip={context_param, self_param}, label=label)
        made = Tool(
            name=label,
            description=described,
            parameters=_schema_of(validator),
            function=fn,
            risk=risk,
            timeout=timeout,
            idempotent=idempotent,
            output_max_length=output_max_length,
            validator=validator,
            in_thread=in_thread,
            context_param=context_param,
        )
        made._binds = binds
        return made

    return build(function) if function is not None else build


def _check_tool_options(function: object, name: object, description: object) -> None:
    """`tool()`'s own arguments: `@tool("search")` gave the name where the function goes (and failed
    far from it), `description=3` raised AttributeError."""
    if isinstance(function, str):
        raise ConfigurationError(
            f"tool() takes the function, not its name {function!r}: to name the tool, write "
            f"@tool(name={function!r})"
        )
    if name is not None and (not isinstance(name, str) or not _NAME_RE.fullmatch(name)):
        raise ConfigurationError(_bad_name_message(name))
    if description is not None and not isinstance(description, str):
        raise ConfigurationError(
            f"the description of a tool must be text (None: the docstring's), not {_type_name(description)}"
        )


def _method_parts(fn: Any) -> tuple[Callable[..., Any], str | None, str | None]:
    """`(function, binds, self parameter)`: a `staticmethod` unwrapped; a `classmethod` bound to its
    class on access; a function defined in a class body whose first parameter is `self` (or `cls`)
    bound to the instance — `@tool` in the class body; anywhere else such a function (`tool(Catalog.
    search)`, the class's) has no instance to run on, and is refused."""
    if isinstance(fn, staticmethod):
        return fn.__func__, None, None
    if isinstance(fn, classmethod):
        func = fn.__func__
        return func, "class", _first_parameter(func)
    first = _first_parameter(fn) if inspect.isfunction(fn) else None
    owner = fn.__qualname__.split(".")[-2] if "." in getattr(fn, "__qualname__", "") else "<locals>"
    if first not in ("self", "cls") or owner == "<locals>":
        return fn, None, None
    if not _in_class_body(fn.__qualname__.rpartition(".")[0]):
        raise ConfigurationError(
            f"{fn.__name__!r} is a method of {owner}: it has no {first} to run with; make the tool from "
            f"an instance's method ({owner}(...).{fn.__name__}), or decorate the method with @tool"
        )
    return fn, "instance", first


def _first_parameter(fn: Callable[..., Any]) -> str | None:
    try:
        first = next(iter(inspect.signature(fn).parameters.values()), None)
    except (TypeError, ValueError):
        return None
    return first.name if first is not None and first.kind in _BY_POSITION else None


_BY_POSITION = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _in_class_body(qualname: str) -> bool:
    """Whether the class body named `qualname` is running (a method decorated in it, not after)."""
    frame = inspect.currentframe()
    try:
        for _ in range(_MAX_FRAMES):
            frame = frame.f_back if frame is not None else None
            if frame is None:
                return False
            if frame.f_locals.get("__qualname__") == qualname and "__module__" in frame.f_locals:
                return True
        return False
    finally:
        del frame


MAX_DESCRIPTION = 1024  # OpenAI's limit on a tool's description ("string_above_max_length")


def _bound_keywords(fn: Callable[..., Any]) -> set[str]:
    """The keyword arguments a (nested) `functools.partial` binds: fixed by the application (an API key,
    a connection), so the model neither sees their values nor replaces them."""
    bound: set[str] = set()
    while isinstance(fn, functools.partial):
        bound.update(fn.keywords)
        fn = fn.func
    return bound


def _unwrapped(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The callable a (nested) `functools.partial` wraps, else `fn`."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def _hinted(fn: Callable[..., Any]) -> Any:
    """What holds the type hints of `fn`: the function a `functools.partial` wraps, a callable object's
    `__call__`, a class's fields (a dataclass, a pydantic model, a named tuple) or else its `__init__`,
    else `fn` itself."""
    fn = _unwrapped(fn)
    if isinstance(fn, type):  # not `type.__call__`, which has no hints (every parameter was untyped)
        fielded = dataclasses.is_dataclass(fn) or issubclass(fn, BaseModel | tuple)
        init = next((vars(base)["__init__"] for base in fn.__mro__ if "__init__" in vars(base)), None)
        return fn if fielded or not inspect.isfunction(init) else init
    if not (inspect.isfunction(fn) or inspect.ismethod(fn) or inspect.isbuiltin(fn)) and callable(fn):
        return type(fn).__call__
    return fn


def _function_name(fn: Callable[..., Any]) -> str:
    target = _unwrapped(fn)
    found = getattr(target, "__name__", None) or type(target).__name__
    if found == "<lambda>":
        raise ConfigurationError("a lambda has no name to give the model: use tool(name='...')(the_lambda)")
    return str(found)


def _function_doc(fn: Callable[..., Any]) -> str:
    hinted = _hinted(fn)
    target = _unwrapped(fn)
    if hinted is target or isinstance(target, type):  # a function or method (maybe in a partial), a class
        return inspect.getdoc(target) or ""
    # a callable object: its `__call__`'s own doc or a base class's, else its class's. Not getdoc(__call__),
    # which inherits `object`'s slot wrapper doc, "Call self as a function."
    for base in type(target).__mro__[:-1]:
        doc = getattr(vars(base).get("__call__"), "__doc__", None)
        if isinstance(doc, str) and doc.strip():
            return inspect.cleandoc(doc)
    return inspect.getdoc(type(target)) or ""


def _type_hints(fn: Callable[..., Any], label: str) -> dict[str, Any]:
    """The type hints of `fn`, `Annotated` kept. Under `from __future__ import annotations` a hint is
    text, and a type defined in the function that makes the tool (a model, a dataclass) is in no
    namespace `get_type_hints` reads: it is looked up in the calling frames' locals."""
    hinted = _hinted(fn)
    try:
        return get_type_hints(hinted, include_extras=True)  # keeps Annotated[int, Field(ge=0)]
    except NameError as exc:
        frame, problem = inspect.currentframe(), exc
        for _ in range(_MAX_FRAMES):
            frame = frame.f_back if frame is not None else None
            if frame is None:
                break
            try:
                return get_type_hints(hinted, localns=frame.f_locals, include_extras=True)
            except NameError:
                continue
            except Exception:
                break
        del frame
        raise ConfigurationError(
            f"cannot read the type hints of tool function {label!r}: {problem}: a type a parameter is "
            "annotated with must be defined at module level, or before the function in the function "
            "that makes the tool"
        ) from problem
    except Exception as exc:
        raise ConfigurationError(f"cannot read the type hints of tool function {label!r}: {exc}") from exc


_MAX_FRAMES = 20  # frames searched for a local type: the tool is made there or a few calls below


def _context_param(hints: dict[str, Any], label: str) -> str | None:
    """The parameter annotated `ToolContext` (or `ToolContext[...]`), if the function has one."""
    found = [
        n for n, h in hints.items() if n != "return" and (h is ToolContext or get_origin(h) is ToolContext)
    ]
    if len(found) > 1:
        raise ConfigurationError(
            f"tool function {label!r} has {len(found)} ToolContext parameters; one is enough"
        )
    return found[0] if found else None


def _validator_for(
    fn: Callable[..., Any],
    hints: dict[str, Any],
    docs: dict[str, str],
    *,
    skip: Iterable[str | None] = (),
    label: str | None = None,
) -> type[BaseModel]:
    label = label or _function_name(fn)
    fields: dict[str, Any] = {}
    skip = {*skip, *_bound_keywords(fn)}
    for index, param in enumerate(_signature(fn, label).parameters.values()):
        if param.name in skip:
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            stars = "*" if param.kind is param.VAR_POSITIONAL else "**"
            raise ConfigurationError(
                f"tool function {label!r} takes {stars}{param.name}: tools need named parameters only"
            )
        hint: Any = hints.get(param.name, Any)
        options: dict[str, Any] = {}
        if isinstance(param.default, FieldInfo):  # `limit: int = Field(5, ge=1)`: its default, rules, doc
            hint = Annotated[hint, param.default]
        else:
            options["default"] = ... if param.default is param.empty else param.default
        described = docs.get(param.name) or _annotated_text(hint)
        if described:  # unset otherwise: an Annotated[..., Field(description=...)] stays
            options["description"] = described
        field_name = param.name
        if _reserved(param.name):  # `json`, `model_config`, `_id`: a pydantic name, the model's key
            field_name, options["alias"] = f"{_RENAMED}{index}", param.name
        fields[field_name] = (hint, Field(**options))
    try:
        return create_model(f"{label}_arguments", __config__=_TOOL_CONFIG, **fields)
    except Exception as exc:
        problem = _unschematic_parameter(label, fields)
        raise ConfigurationError(
            problem or f"cannot build a schema for tool function {label!r}: {exc}"
        ) from exc


def _signature(fn: Callable[..., Any], label: str) -> inspect.Signature:
    """The signature of a tool function. Some builtins and C functions (`print`, `max`) have none to read:
    their parameters cannot be told to the model."""
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"cannot read the parameters of {label!r} ({_type_name(fn)}): {exc}. Builtins and C functions "
            "often have no signature: make the tool from a function with named, typed parameters that "
            f"calls it (def {label}_tool(a: float, b: float) -> float: return {label}(a, b))"
        ) from exc


def _unschematic_parameter(label: str, fields: dict[str, Any]) -> str | None:
    """Which parameter's type has no schema, and what to do: pydantic's own message names a class and
    suggests `arbitrary_types_allowed`, which a tool cannot use (the model must be told what to send)."""
    for field_name, (hint, info) in fields.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", PydanticJsonSchemaWarning)
                probe: dict[str, Any] = {field_name: (hint, info)}
                create_model("probe", __config__=_TOOL_CONFIG, **probe).model_json_schema()
        except Exception as exc:
            parameter = info.alias or field_name
            if "typing_extensions.TypedDict" in str(exc):  # pydantic's code typed-dict-version
                return (
                    f"parameter {parameter!r} of tool function {label!r} is annotated {_hint_text(hint)}, a "
                    "typing.TypedDict, which pydantic reads on Python 3.12 and later only: define it with "
                    "typing_extensions.TypedDict (from typing_extensions import TypedDict)"
                )
            return (
                f"parameter {parameter!r} of tool function {label!r} is annotated {_hint_text(hint)}, which has "
                "no JSON schema to show the model: annotate it with a JSON type (str, int, float, bool, a list "
                "or dict of them, a Literal, an Enum, a pydantic model, a dataclass or a TypedDict) and build "
                "the object in the tool; an object the tool needs but the model does not send comes from "
                "the run: a ToolContext parameter (ctx.deps) or functools.partial"
            )
    return None


def _hint_text(hint: Any) -> str:
    if isinstance(hint, type):
        return hint.__qualname__
    return re.sub(r"\b(typing|collections\.abc|builtins)\.", "", repr(hint))


def _annotated_text(hint: Any) -> str | None:
    """The text in `Annotated[float, "the amount to convert"]`, which documents the parameter."""
    if get_origin(hint) is not Annotated:
        return None
    return next((item.strip() for item in hint.__metadata__ if isinstance(item, str) and item.strip()), None)


_RENAMED = "thinkloop_param_"  # the field of a parameter whose name pydantic reserves (its alias is the name)


def _reserved(name: str) -> bool:
    """Whether a parameter's name cannot be a pydantic field's (private, `model_*`, a BaseModel member)."""
    return name.startswith(("_", "model_")) or hasattr(BaseModel, name)


def _schema_of(validator: type[BaseModel]) -> dict[str, Any]:
    try:
        with warnings.catch_warnings():  # a default that is not JSON (an object) is left out, silently
            warnings.simplefilter("ignore", PydanticJsonSchemaWarning)
            schema = validator.model_json_schema()
    except Exception as exc:
        name = validator.__name__.removesuffix("_arguments")
        fields = {key: (info.annotation, info) for key, info in validator.model_fields.items()}
        problem = _unschematic_parameter(name, fields)
        raise ConfigurationError(problem or f"cannot build a JSON schema for tool {name!r}: {exc}") from exc
    schema.setdefault("properties", {})
    return _self_contained(schema)


_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
_MAX_INLINED_NODES = 2_000  # past this, shared definitions stay `$ref`s (a deep diamond of models)


def _self_contained(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with its definitions written where they are used and without pydantic's titles
    (`"title": "City"` beside every property): what a model reads, in the tool list and in the error
    answering a wrong call — which shows `properties` alone, so a `$ref` there would point nowhere.
    A recursive model keeps its definition in `$defs`; so do all, should inlining grow too large."""
    defs: dict[str, Any] = schema.get("$defs") or {}
    recursive = {name for name in defs if name in _refs_reached(defs[name], defs)}
    body = {k: v for k, v in schema.items() if k != "$defs"}
    inliner = _Inliner(defs, recursive)
    try:
        tidied: dict[str, Any] = inliner.node(body)
    except _TooLarge:
        inliner = _Inliner(defs, set(defs))
        tidied = inliner.node(body)
    kept = {name: inliner.node(defs[name]) for name in defs if name in inliner.referenced}
    if kept:
        tidied["$defs"] = kept
    return tidied


def _ref_name(ref: Any) -> str | None:
    return ref.removeprefix("#/$defs/") if isinstance(ref, str) and ref.startswith("#/$defs/") else None


def _refs_reached(node: Any, defs: dict[str, Any]) -> set[str]:
    """The definitions `node` refers to, directly or through others."""
    reached: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            name = _ref_name(item.get("$ref"))
            if name is not None and name in defs and name not in reached:
                reached.add(name)
                stack.append(defs[name])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return reached


class _TooLarge(Exception):
    pass


class _Inliner:
    def __init__(self, defs: dict[str, Any], kept: set[str]) -> None:
        self.defs, self.kept = defs, kept
        self.referenced: set[str] = set()  # the kept definitions a `$ref` points to
        self.nodes = 0

    def node(self, schema: Any) -> Any:
        if isinstance(schema, list):
            return [self.node(item) for item in schema]
        if not isinstance(schema, dict):
            return schema
        self.nodes += 1
        if self.nodes > _MAX_INLINED_NODES and len(self.kept) < len(self.defs):
            raise _TooLarge
        name = _ref_name(schema.get("$ref"))
        if name in self.defs and name not in self.kept:  # its definition, the sibling keywords winning
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            return self.node({**self.defs[name], **rest})
        if name is not None:
            self._keep(name)
        tidied = {}
        for key, value in schema.items():
            if key in _SCHEMA_MAPS and isinstance(value, dict):  # names: a property may be called `title`
                tidied[key] = {name: self.node(sub) for name, sub in value.items()}
            elif key != "title":
                tidied[key] = self.node(value)
        return {"type": tidied.pop("type"), **tidied} if "type" in tidied else tidied

    def _keep(self, name: str) -> None:
        if name not in self.referenced:
            self.referenced.add(name)
            self.node(self.defs[name])  # the definitions it refers to are kept too


_SECTION_RE = re.compile(r"^(Args|Arguments|Parameters|Params):\s*$", re.IGNORECASE)
_PARAM_RE = re.compile(r"^\s*(\*{0,2}\w+)\s*(?:\((?:[^()]|\([^()]*\))*\))?\s*:\s*(.*)$")  # `b (list(str)):`
_OTHER_SECTION_RE = re.compile(
    r"^(Returns?|Raises|Yields?|Examples?|Notes?|Warnings?|Warns|See Also|References|Todo|Attributes"
    r"|Methods|Keyword Arg(ument)?s|Other Parameters):\s*$",
    re.IGNORECASE,
)
_RULE_RE = re.compile(r"^\s*-{3,}\s*$")  # the line under a NumPy-style section header
_NUMPY_PARAM_SECTIONS = {"parameters", "params", "arguments", "args", "other parameters", "keyword arguments"}
_NUMPY_PARAM_RE = re.compile(r"^(\*{0,2}\w+(?:\s*,\s*\*{0,2}\w+)*)\s*(?::.*)?$")
_SPHINX_PARAM_RE = re.compile(
    r"^\s*:(?:param|parameter|arg|argument|key|keyword)\s+(?:[^:]*\s)?(\*{0,2}\w+)\s*:\s*(.*)$"
)
_SPHINX_FIELD_RE = re.compile(r"^\s*:\w+[^:]*:")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a docstring into its description (what precedes the first section) and per-parameter docs,
    from a Google (`Args:`), NumPy (`Parameters` over `----------`) or Sphinx (`:param x:`) style."""
    lines = doc.splitlines()
    end = next((i for i in range(len(lines)) if _starts_section(lines, i)), len(lines))
    params = {**_sphinx_params(lines), **_numpy_params(lines), **_google_params(lines)}
    return "\n".join(lines[:end]).strip(), {name: text for name, text in params.items() if text}


def _starts_section(lines: list[str], i: int) -> bool:
    line = lines[i].strip()
    return bool(
        _SECTION_RE.match(line) or _OTHER_SECTION_RE.match(line) or _SPHINX_FIELD_RE.match(line)
    ) or _numpy_header(lines, i)


def _numpy_header(lines: list[str], i: int) -> bool:
    return bool(lines[i].strip()) and i + 1 < len(lines) and bool(_RULE_RE.match(lines[i + 1]))


def _google_params(lines: list[str]) -> dict[str, str]:
    params: dict[str, str] = {}
    in_args, current, margin = False, None, 0
    for line in lines:
        if _SECTION_RE.match(line.strip()):
            in_args, current = True, None
        elif _OTHER_SECTION_RE.match(line.strip()) or _RULE_RE.match(line):
            in_args = False
        elif in_args:
            if current is None and line.strip():  # the first parameter's indent is the section's margin
                margin = len(line) - len(line.lstrip())
            current = _add_param_line(line, params, current, margin)
    return params


def _add_param_line(line: str, params: dict[str, str], current: str | None, margin: int) -> str | None:
    """A parameter at the section's margin starts; a deeper line continues the one before."""
    match = _PARAM_RE.match(line)
    indent = len(line) - len(line.lstrip())
    if match and (current is None or indent <= margin):
        current = match.group(1).lstrip("*")
        params[current] = match.group(2).strip()
    elif current is not None and line.strip():
        params[current] = f"{params[current]} {line.strip()}".strip()
    return current


def _numpy_params(lines: list[str]) -> dict[str, str]:
    """`name : type` at the margin, its description indented below, under `Parameters` / `----------`."""
    params: dict[str, str] = {}
    in_params = False
    current: list[str] = []
    for i, line in enumerate(lines):
        if _numpy_header(lines, i):
            in_params, current = line.strip().lower() in _NUMPY_PARAM_SECTIONS, []
        elif not in_params or _RULE_RE.match(line) or not line.strip():
            continue
        elif not line[0].isspace():
            match = _NUMPY_PARAM_RE.match(line.strip())
            current = [n.strip().lstrip("*") for n in match.group(1).split(",")] if match else []
            params.update(dict.fromkeys(current, ""))
        else:
            for name in current:
                params[name] = f"{params[name]} {line.strip()}".strip()
    return params


def _sphinx_params(lines: list[str]) -> dict[str, str]:
    """`:param name: text` (also `:param int name:`, `:arg`, `:keyword`), continued on indented lines."""
    params: dict[str, str] = {}
    current = None
    for line in lines:
        match = _SPHINX_PARAM_RE.match(line)
        if match:
            current = match.group(1).lstrip("*")
            params[current] = match.group(2).strip()
        elif _SPHINX_FIELD_RE.match(line) or (line.strip() and not line[0].isspace()):
            current = None
        elif current is not None and line.strip():
            params[current] = f"{params[current]} {line.strip()}".strip()
    return params


# ------------------------------------------------------------------------------------------ registry


class ToolRegistry:
    """Tools by name. Adding two tools of one name is an error."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] | Tool | None = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._key: tuple[str, ...] = ()
        self._key_of: dict[str, Tool] | None = None
        if tools is None:
            return
        if isinstance(tools, Tool) or callable(tools):  # one tool, not in a list: taken as it is meant
            tools = (tools,)
        if isinstance(tools, str | bytes) or not isinstance(tools, Iterable):
            raise ConfigurationError(f"tools must be a list of Tools or functions, not {tools!r}")
        for item in tools:
            self.add(item)

    def add(self, item: Tool | Callable[..., Any]) -> Tool:
        new = as_tool(item)
        if new._binds == "instance":
            owner = new.function.__qualname__.rpartition(".")[0].rpartition(".")[2]
            raise ConfigurationError(
                f"{new.name!r} is a method of {owner}: give the tool of an instance "
                f"({owner}(...).{new._attribute or new.function.__name__}), which has its self"
            )
        if new.name in self._tools:
            raise ConfigurationError(_clash_message(self._tools[new.name], new))
        self._tools[new.name] = new
        return new

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def resolve(self, name: str) -> Tool | None:
        """The tool a model meant by `name`: the exact name, else the one it matches ignoring case,
        surrounding spaces and quotes, `-` for `_`, and a namespace prefix (`functions.add`, `tools:add`)."""
        found = self._tools.get(name)
        if found is not None or not name:
            return found
        wanted = plain_tool_name(name)
        matches = [t for n, t in self._tools.items() if plain_tool_name(n) == wanted]
        return matches[0] if len(matches) == 1 else None

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    @property
    def key(self) -> tuple[str, ...]:
        """The names as a tuple (a cache key for what the model is shown), rebuilt only when they change."""
        tools = self._tools
        if tools is not self._key_of or len(tools) != len(self._key):
            self._key_of, self._key = tools, tuple(tools)
        return self._key

    def definitions(self, names: Iterable[str] | None = None) -> list[ToolDefinition]:
        if names is None:
            return [t.definition for t in self._tools.values()]
        return [self._tools[n].definition for n in names if n in self._tools]


def _clash_message(taken: Tool, new: Tool) -> str:
    if taken is new or taken.function is new.function:
        return f"two tools are named {new.name!r} (the same tool, given twice): tool names must be unique"
    return (
        f"two tools are named {new.name!r} ({_origin(taken)} and {_origin(new)}): tool names must be "
        "unique; give one another name (tool(name=...))"
    )


def _origin(t: Tool) -> str:
    """Where a tool's function comes from (`billing.tools.refund`), to tell two tools apart."""
    fn = _unwrapped(t.function)
    fn = getattr(fn, "__func__", fn)  # a bound method: its function
    named = fn if hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(named, '__module__', None) or '?'}.{getattr(named, '__qualname__', '?')}"


def plain_tool_name(name: str) -> str:
    """A tool name as `resolve` compares it: lower case, without quotes or angle brackets, a call's
    parentheses (`get_weather()`, `get_weather(city)`), a namespace prefix (`functions.`, `tool:`) or
    separators (`_`, `-`, spaces) — so `GetWeather`, `get-weather` and `get weather` are `get_weather`."""
    name = _without_call_parentheses(name.strip().strip("`'\"<>").strip())
    return _SEPARATORS_RE.sub("", re.split(r"[.:/]", name.lower())[-1])


def _without_call_parentheses(name: str) -> str:
    """`name` without the parentheses of a call closing it (`get_weather(city)`) and the blank space before
    them, found from its end: a regex matching both tried each position of a long run of blank space in a
    model's tool name, in time growing with its square."""
    opened = name.rfind("(", 0, len(name) - 1) if name.endswith(")") else -1
    if opened < 0 or ")" in name[opened + 1 : -1]:
        return name
    return name[:opened].rstrip()


_SEPARATORS_RE = re.compile(r"[\s_-]+")


def as_tool(item: Tool | Callable[..., Any]) -> Tool:
    """A `Tool` as is; a plain function through `@tool`."""
    if isinstance(item, Tool):
        return item
    if callable(item):
        return tool(item)
    raise ConfigurationError(f"not a tool: {item!r}; pass a Tool or a function")


# ------------------------------------------------------------------------------------ output → text


NO_OUTPUT = "(no output)"  # what a tool that returned nothing, an empty or a blank text, is shown as


def render_output(value: Any) -> str:
    """Turn what a tool returned into observation text: text as it is (empty or blank: `(no output)`, as for
    None — an empty tool message left small models guessing, and some providers refuse one); bytes decoded (invalid UTF-8
    replaced; binary data — a NUL in its first 8 KiB — described, not shown); the items of a generator
    tool one per line when they are text; anything else as JSON, with pydantic models, dataclasses,
    enums, dates, sets … inside it serialised as pydantic would. Never raises: a value that cannot be
    shown (its `__str__` raises, an integer too long to print) is described instead."""
    kind = type(value)
    if kind is str:  # the common results first, without the layers below
        return value if value and not value.isspace() else NO_OUTPUT
    if kind is int and value.bit_length() < 14_000:  # fewer digits than Python's 4,300-digit print limit
        return str(value)
    try:
        return _render(value)
    except Exception as exc:
        return (
            f"(the tool returned a {type(value).__name__} that cannot be shown as text: "
            f"{type(exc).__name__}: {_safe_str(exc)[:300]})"
        )


def _render(value: Any) -> str:
    if isinstance(value, str):  # a subclass of str
        return value if value and not value.isspace() else NO_OUTPUT
    if type(value) is int:
        return _int_text(value)
    if value is None:
        return NO_OUTPUT
    if isinstance(value, bytes | bytearray | memoryview):
        return _bytes_text(bytes(value))
    if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        joined = "\n".join(value)
        return joined if joined and not joined.isspace() else NO_OUTPUT
    if isinstance(value, BaseModel) or (dataclasses.is_dataclass(value) and not isinstance(value, type)):
        return pydantic_core.to_json(value, fallback=str).decode()
    try:
        return json.dumps(value, ensure_ascii=False, default=_jsonable)
    except (TypeError, ValueError):  # keys json cannot write (an Enum, a date, a tuple), a cycle
        pass
    try:
        return pydantic_core.to_json(value, fallback=str).decode()
    except (TypeError, ValueError):
        return str(value)


def _int_text(value: int) -> str:
    """The digits; over Python's 4,300-digit limit for printing, the value rounded, with its length."""
    try:
        return str(value)
    except ValueError:
        exact = decimal.Decimal(
            value
        )  # not limited like str(); .adjusted() is the leading digit's power of 10
        return f"{exact:.15e} (an integer of {exact.adjusted() + 1:,} digits)"


def _bytes_text(data: bytes) -> str:
    if b"\x00" in data[:8192]:
        return f"({len(data):,} bytes of binary data, not shown; they begin {data[:16].hex(' ')})"
    return data.decode("utf-8", errors="replace")


def _jsonable(value: Any) -> Any:
    return pydantic_core.to_jsonable_python(value, fallback=str)


def truncate_output(text: str, limit: int) -> tuple[str, bool]:
    """Keep the head and tail of `text` within `limit` characters, saying how many were cut (the count
    is what is missing, the marker's own length included)."""
    if len(text) <= limit:
        return text, False
    marker = ""
    for _ in range(3):  # the count's digits change the marker's length: settle it
        keep = max(limit - len(marker), 0)
        marker = f"\n… [{len(text) - keep} characters truncated of {len(text)}] …\n"
    keep = max(limit - len(marker), 0)
    head = keep * 2 // 3
    tail = keep - head
    return text[:head] + marker + (text[-tail:] if tail else ""), True


AsyncToolFunction = Callable[..., Awaitable[Any]]
