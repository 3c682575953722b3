"""Tools (SPEC §3.1–3.2): a name, a description, a JSON Schema, and an async invoke.

`@tool` builds a `Tool` from a plain (sync or async) function: the schema comes from the type hints,
the description and per-parameter docs from the docstring. `Tool(...)` builds one by hand.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import inspect
import json
import queue
import re
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from concurrent.futures import Executor, Future
from typing import Any, Generic, TypeVar, get_origin, get_type_hints, overload

import pydantic_core
from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic.fields import FieldInfo

from ._errors import ConfigurationError
from ._messages import ToolDefinition
from ._risk import RiskLevel

RiskSpec = RiskLevel | Callable[[dict[str, Any]], RiskLevel]
T = TypeVar("T")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")


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
        name: what the model calls it (letters, digits, `_`, `-`, `.`; at most 64 characters).
        description: what it does, for the model.
        parameters: JSON Schema of its arguments (an object schema).
        function: sync or async callable receiving the validated arguments as keyword arguments.
        risk: a static `RiskLevel`, or a function of the arguments returning one (dynamic risk).
        timeout: seconds before a call is abandoned (None: the agent's default, 120 s).
        idempotent: True if running a call twice has the same effect as once (safe to re-run on resume).
        output_max_length: characters kept of the output (None: the agent's default, 10,000).
        validator: a pydantic model validating and coercing the arguments (built by `@tool`); without
            one, required properties and basic JSON types are checked against `parameters`.
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
        if not _NAME_RE.match(name):
            raise ConfigurationError(
                f"invalid tool name {name!r}: use 1-64 letters, digits, '_', '-' or '.', not starting with a digit"
            )
        self.name = name
        self.description = description.strip()
        self.parameters: dict[str, Any] = dict(parameters or {"type": "object", "properties": {}})
        self.function = function
        self.risk = risk
        self.timeout = timeout
        self.idempotent = idempotent
        self.output_max_length = output_max_length
        self.validator = validator
        self.in_thread = in_thread
        self.context_param = context_param  # the parameter that receives the `ToolContext`, if any
        self._is_async = inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
            getattr(function, "__call__", None)  # noqa: B004  # a callable object with an async __call__
        )
        self._collects = inspect.isasyncgenfunction(function)  # an async generator: its items are the output
        self.definition = ToolDefinition(name=name, description=self.description, parameters=self.parameters)

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Return the validated (and coerced) arguments, or raise `ToolArgumentsError`."""
        if self.validator is not None:
            try:
                model = self.validator.__pydantic_validator__.validate_python(arguments)
            except ValidationError as exc:
                raise ToolArgumentsError(_explain(exc)) from None
            return dict(model.__dict__)  # the validated fields, by name (extras and private attributes aside)
        _check_against_schema(arguments, self.parameters)
        return arguments

    def risk_for(self, arguments: dict[str, Any]) -> RiskLevel:
        """The risk of a call with these arguments; a failing risk function rates the call HIGH."""
        if isinstance(self.risk, RiskLevel):
            return self.risk
        try:
            return RiskLevel(self.risk(arguments))
        except Exception:
            return RiskLevel.HIGH

    def invoke(self, arguments: dict[str, Any]) -> Awaitable[Any]:
        """Call the function with validated arguments (await the result). Sync functions run in a worker
        thread unless `in_thread=False`; an awaitable a sync function returns is awaited too."""
        if self._is_async:
            return self.function(**arguments)  # type: ignore[no-any-return]  # its coroutine, not started
        if self._collects:
            return _collect(self.function(**arguments))
        return self._invoke_sync(arguments)

    async def _invoke_sync(self, arguments: dict[str, Any]) -> Any:
        if self.in_thread:
            call = functools.partial(
                contextvars.copy_context().run, _call_and_drain, self.function, arguments
            )
            result = await asyncio.get_running_loop().run_in_executor(tool_threads(), call)
        else:
            result = _call_and_drain(self.function, arguments)
        if inspect.isawaitable(result):
            result = await result
        if inspect.isasyncgen(result):
            result = await _collect(result)
        return result


def _call_and_drain(function: Callable[..., Any], arguments: dict[str, Any]) -> Any:
    """Call a sync tool function; a generator it returns is run to its end (its items are the output)."""
    result = function(**arguments)
    return list(result) if inspect.isgenerator(result) else result


async def _collect(items: Any) -> list[Any]:
    return [item async for item in items]


TOOL_THREADS = 64


class _ToolThreads(Executor):
    """The worker threads of sync tools: daemon threads, started on demand up to `max_workers` and reused.

    Not the event loop's default executor (5-36 threads, joined when `asyncio.run` ends) nor a
    `ThreadPoolExecutor` (joined at interpreter exit): a tool abandoned after its timeout keeps its
    thread — a thread cannot be stopped — and must neither starve other work nor keep the process from
    exiting once the run is over.
    """

    def __init__(self, max_workers: int) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads = 0
        self._max = max_workers

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        self._jobs.put((future, functools.partial(fn, *args, **kwargs)))
        with self._lock:
            if not self._idle.acquire(blocking=False) and self._threads < self._max:
                self._threads += 1
                name = f"thinkloop-tool-{self._threads}"
                threading.Thread(target=self._work, name=name, daemon=True).start()
        return future

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
            del future, job
            self._idle.release()


_tool_threads = _ToolThreads(TOOL_THREADS)


def tool_threads() -> Executor:
    """The executor sync tools run in (see `_ToolThreads`)."""
    return _tool_threads


def _explain(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def _check_against_schema(arguments: dict[str, Any], schema: Mapping[str, Any]) -> None:
    """A light check for hand-written tools: required properties, unknown ones, and top-level types."""
    properties: Mapping[str, Any] = schema.get("properties", {})
    missing = [name for name in schema.get("required", []) if name not in arguments]
    if missing:
        raise ToolArgumentsError(f"missing required argument(s): {', '.join(missing)}")
    if schema.get("additionalProperties") is False:
        unknown = [name for name in arguments if name not in properties]
        if unknown:
            raise ToolArgumentsError(f"unknown argument(s): {', '.join(unknown)}")
    for name, value in arguments.items():
        expected = properties.get(name, {}).get("type")
        if not isinstance(expected, str) or expected not in _JSON_TYPES:
            continue
        ok = isinstance(value, _JSON_TYPES[expected]) and not (
            expected in ("integer", "number") and isinstance(value, bool)
        )
        if not ok:
            raise ToolArgumentsError(f"{name}: expected {expected}, got {type(value).__name__} {value!r}")


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

    def build(fn: Callable[..., Any]) -> Tool:
        label = name or _function_name(fn)
        summary, param_docs = _parse_docstring(_function_doc(fn))
        context_param = _context_param(fn)
        validator = _validator_for(fn, param_docs, skip=context_param, label=label)
        return Tool(
            name=label,
            description=description or summary or label.replace("_", " "),
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

    return build(function) if function is not None else build


def _unwrapped(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The callable a (nested) `functools.partial` wraps, else `fn`."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def _hinted(fn: Callable[..., Any]) -> Any:
    """What holds the type hints of `fn`: the function a `functools.partial` wraps, a callable object's
    `__call__`, else `fn` itself."""
    fn = _unwrapped(fn)
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
    doc = inspect.getdoc(hinted) or ""
    if not doc and hinted is not fn and not isinstance(fn, functools.partial):  # a callable object's class
        doc = inspect.getdoc(type(fn)) or ""
    return doc


def _context_param(fn: Callable[..., Any]) -> str | None:
    """The parameter annotated `ToolContext` (or `ToolContext[...]`), if the function has one."""
    try:
        hints = get_type_hints(_hinted(fn))
    except Exception:
        return None  # reported by `_validator_for`
    found = [
        n for n, h in hints.items() if n != "return" and (h is ToolContext or get_origin(h) is ToolContext)
    ]
    if len(found) > 1:
        raise ConfigurationError(
            f"tool function {getattr(_hinted(fn), '__name__', fn)!r} has {len(found)} ToolContext parameters; one is enough"
        )
    return found[0] if found else None


def _validator_for(
    fn: Callable[..., Any], docs: dict[str, str], *, skip: str | None = None, label: str | None = None
) -> type[BaseModel]:
    label = label or _function_name(fn)
    try:
        hints = get_type_hints(_hinted(fn))
    except Exception as exc:
        raise ConfigurationError(f"cannot read the type hints of tool function {label!r}: {exc}") from exc
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.name == skip:
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            stars = "*" if param.kind is param.VAR_POSITIONAL else "**"
            raise ConfigurationError(
                f"tool function {label!r} takes {stars}{param.name}: tools need named parameters only"
            )
        annotation = hints.get(param.name, Any)
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, FieldInfo(default=default, description=docs.get(param.name)))
    config = ConfigDict(extra="forbid", arbitrary_types_allowed=False)
    try:
        return create_model(f"{label}_arguments", __config__=config, **fields)
    except Exception as exc:
        raise ConfigurationError(f"cannot build a schema for tool function {label!r}: {exc}") from exc


def _schema_of(validator: type[BaseModel]) -> dict[str, Any]:
    schema = validator.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    schema.setdefault("properties", {})
    return schema


_SECTION_RE = re.compile(r"^(Args|Arguments|Parameters|Params):\s*$", re.IGNORECASE)
_PARAM_RE = re.compile(r"^\s*(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_OTHER_SECTION_RE = re.compile(r"^(Returns?|Raises|Yields|Examples?|Notes?):\s*$", re.IGNORECASE)


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its description and per-parameter docs."""
    lines = doc.splitlines()
    summary: list[str] = []
    params: dict[str, str] = {}
    section = "summary"
    current: str | None = None
    for line in lines:
        if _SECTION_RE.match(line.strip()):
            section, current = "args", None
        elif _OTHER_SECTION_RE.match(line.strip()):
            section = "other"
        elif section == "summary":
            summary.append(line)
        elif section == "args":
            current = _add_param_line(line, params, current)
    return "\n".join(summary).strip(), params


def _add_param_line(line: str, params: dict[str, str], current: str | None) -> str | None:
    match = _PARAM_RE.match(line)
    indent = len(line) - len(line.lstrip())
    if match and (current is None or indent <= 4):
        current = match.group(1).lstrip("*")
        params[current] = match.group(2).strip()
    elif current is not None and line.strip():
        params[current] = f"{params[current]} {line.strip()}".strip()
    return current


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
        if new.name in self._tools:
            raise ConfigurationError(f"two tools are named {new.name!r}: tool names must be unique")
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
        wanted = _plain_name(name)
        matches = [t for n, t in self._tools.items() if _plain_name(n) == wanted]
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


def _plain_name(name: str) -> str:
    name = name.strip().strip("`'\"").strip().lower().replace("-", "_")
    return re.split(r"[.:/]", name)[-1].strip()


def as_tool(item: Tool | Callable[..., Any]) -> Tool:
    """A `Tool` as is; a plain function through `@tool`."""
    if isinstance(item, Tool):
        return item
    if callable(item):
        return tool(item)
    raise ConfigurationError(f"not a tool: {item!r}; pass a Tool or a function")


# ------------------------------------------------------------------------------------ output → text


def render_output(value: Any) -> str:
    """Turn what a tool returned into observation text: text as it is; bytes decoded (invalid UTF-8
    replaced); the items of a generator tool one per line when they are text; anything else as JSON, with
    pydantic models, dataclasses, enums, dates, sets … inside it serialised as pydantic would."""
    if isinstance(value, str):
        return value
    if type(value) is int:
        return str(value)
    if value is None:
        return "(no output)"
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        return "\n".join(value)
    if isinstance(value, BaseModel) or (dataclasses.is_dataclass(value) and not isinstance(value, type)):
        return pydantic_core.to_json(value, fallback=str).decode()
    try:
        return json.dumps(value, ensure_ascii=False, default=_jsonable)
    except (TypeError, ValueError):
        return str(value)


def _jsonable(value: Any) -> Any:
    return pydantic_core.to_jsonable_python(value, fallback=str)


def truncate_output(text: str, limit: int) -> tuple[str, bool]:
    """Keep the head and tail of `text` within `limit` characters, saying how much was cut."""
    if len(text) <= limit:
        return text, False
    cut = len(text) - limit
    marker = f"\n… [{cut} characters truncated of {len(text)}] …\n"
    keep = max(limit - len(marker), 0)
    head = keep * 2 // 3
    tail = keep - head
    return text[:head] + marker + (text[-tail:] if tail else ""), True


AsyncToolFunction = Callable[..., Awaitable[Any]]
