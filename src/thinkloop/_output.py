"""Structured output: `Agent(output_type=T)` makes the final answer a validated `T`.

The model is told (a rule of the system prompt) to give its final answer as JSON matching T's JSON Schema.
Its final answer is then read leniently — code fences, text around the JSON, small syntax slips — and
validated by pydantic. An answer that does not validate is not the end of the run: like any unreadable
reply it goes back to the model with the validation errors (self-healing, counted with the other heals).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from ._errors import ConfigurationError
from ._react import first_json_span

_FENCE_RE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class OutputSpec:
    """What the final answer must be: a type pydantic can validate (a model, dataclass, TypedDict, list …)."""

    type: Any
    adapter: TypeAdapter[Any]
    schema: dict[str, Any]
    check: Callable[[Any], Any] | None = None

    @classmethod
    def of(cls, output_type: Any, check: Callable[[Any], Any] | None = None) -> OutputSpec | None:
        """The spec of `output_type` and an extra `check` of the value; None when any text will do."""
        if output_type is None:
            output_type = str
        if output_type is str and check is None:
            return None
        try:
            adapter: TypeAdapter[Any] = TypeAdapter(output_type)
            schema = adapter.json_schema()
        except Exception as exc:  # pydantic's errors say which part of the type it cannot handle
            raise ConfigurationError(
                f"output_type {output_type!r} cannot be used: {exc} — use a pydantic model, a dataclass, a "
                "TypedDict or a type such as list[str] or int"
            ) from None
        return cls(type=output_type, adapter=adapter, schema=schema, check=check)

    @property
    def rule(self) -> str | None:
        """The system-prompt rule that tells the model the answer's format (None for plain text)."""
        if self.type is str:
            return None
        schema = json.dumps(self.schema, ensure_ascii=False, separators=(",", ":"))
        return f"Give your final answer as JSON only (no other text), matching this JSON Schema: {schema}"

    def parse(self, text: str) -> tuple[Any, str | None]:
        """The validated value of a final answer, or `(None, what is wrong)` to tell the model."""
        if self.type is str:
            return self._checked(text)
        candidates = _json_candidates(text)
        if not candidates:
            return None, "the final answer was empty: give it as JSON matching the schema."
        errors: list[str] = []
        for candidate in candidates:
            try:
                value = self.adapter.validate_python(candidate)
            except ValidationError as exc:
                errors.append(_explain(exc))
            else:
                return self._checked(value)
        return None, (
            f"the final answer does not match the required format: {errors[0]}. "
            "Give the final answer again as JSON only, matching the schema."
        )

    def _checked(self, value: Any) -> tuple[Any, str | None]:
        """The value through the agent's `output_validator`: its `ValueError` message goes to the model."""
        if self.check is None:
            return value, None
        try:
            return self.check(value), None
        except ValueError as exc:
            return None, f"{exc} Give the final answer again."


def _json_candidates(text: str) -> list[Any]:
    """The values the answer may mean, most likely first: the whole text (or a fenced block) as JSON,
    the first JSON object or array inside it, the same repaired, and the bare text itself."""
    body = text.strip()
    fence = _FENCE_RE.search(body)
    if fence:
        body = fence.group(1).strip()
    if not body:
        return []
    found: list[Any] = []
    for piece in (body, _first_bracketed(body)):
        if piece is None:
            continue
        try:
            found.append(json.loads(piece))
        except ValueError:
            repaired = _repaired(piece)
            if repaired is not None:
                found.append(repaired)
    found.append(body)  # e.g. a bare word for an enum or a string type
    unique: list[Any] = []
    for value in found:
        if not any(value == seen and type(value) is type(seen) for seen in unique):
            unique.append(value)
    return unique


def _first_bracketed(text: str) -> str | None:
    """The first complete `{…}` or `[…]` in the text; None for a cut-off one (closing it could make a
    wrong answer look valid)."""
    span = first_json_span(text, "{[")
    return span[0] if span is not None and span[1] else None


def _repaired(text: str) -> Any:
    """Small slips (quotes, trailing commas) in complete JSON; never a cut-off object."""
    text = text.strip()
    if not text.startswith(("{", "[")) or _first_bracketed(text) != text:
        return None
    try:
        import json_repair  # only for broken JSON (keeps `import thinkloop` fast)

        value = json_repair.loads(text)
    except Exception:
        return None
    return value if isinstance(value, dict | list) and value else None


def _explain(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False)[:6]:
        where = ".".join(str(p) for p in err["loc"]) or "the answer"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)
