"""Recognising a server's "I do not take that part of the request" errors, so that the request can be
adapted instead of the run failing.

Two kinds, in the wording of the servers themselves:

- **No tools at all** (`ToolsUnsupportedError`: the loop goes on in text ReAct): Ollama, HTTP 400
  "registry.ollama.ai/library/gemma:2b does not support tools"; vLLM started without a tool parser,
  HTTP 400 '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set';
  llama.cpp's server without `--jinja`, "tools param requires --jinja flag"; OpenAI-style
  "Unsupported parameter: 'tools' is not supported with this model."; Azure's older "Unrecognized request
  argument supplied: tools"; servers validating with pydantic, "Extra inputs are not permitted" at
  `body.tools`; "function calling is not supported/enabled".
- **An optional parameter** the adapter can drop or rename (the request is sent again without it):
  OpenAI's "Unsupported parameter: 'max_tokens' is not supported with this model. Use
  'max_completion_tokens' instead.", "Unsupported value: 'temperature' does not support 0.3 with this
  model. Only the default (1) value is supported.", "Unsupported parameter: 'stop' …", and
  "Unrecognized request argument supplied: parallel_tool_calls" or "parallel_tool_calls is not supported".
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

__all__ = ["OPTIONAL_PARAMS", "tools_mishandled", "tools_unsupported", "unsupported_param"]

_TOOLS = re.compile(
    r"does(?: not|n't) support (?:tools|tool[ _]?call(?:s|ing)?|function[ _]?call(?:s|ing)?|functions)\b"
    r"|\b(?:tools|tool[ _]?call(?:s|ing)?|function[ _]?call(?:s|ing)?|functions)\b['\"]? (?:param(?:eter)?s? )?"
    r"(?:is |are )?(?:not|un)(?:supported| supported| enabled| available)"
    r"|tool choice requires --enable-auto-tool-choice|tools param requires --jinja"
    r"|(?:unsupported|unrecognized|unknown) (?:request )?(?:parameter|argument|field)s?(?: supplied)?: ['\"]?tools\b"
    r"|tool use is not supported",
    re.IGNORECASE,
)

OPTIONAL_PARAMS = ("parallel_tool_calls", "temperature", "stop", "max_tokens", "max_completion_tokens")
"""Parameters the adapter sends that a request can do without (or, for the token limit, name otherwise)."""

_REFUSED = (
    r"(?:unsupported|unrecognized|unknown|invalid|not (?:supported|allowed|permitted)|does(?: not|n't) support"
    r"|extra (?:inputs|fields|forbidden)|not (?:a )?valid|is not available)"
)


_EXTRA = re.compile(r"extra|not permitted|forbidden|unrecognized|unsupported|unknown", re.IGNORECASE)


def tools_unsupported(text: str, body: Any = None) -> bool:
    """Whether an error says the model or its server takes no tool definitions."""
    return _TOOLS.search(text) is not None or (
        _names_field(body, "tools") and _EXTRA.search(text) is not None
    )


def tools_mishandled(owners: Collection[Any]) -> str | None:
    """The server behind a model listing (the `owned_by` of each model of `GET /models`) when it is one known
    to take tool definitions and mishandle them, else None.

    llama-cpp-python's server (`python -m llama_cpp.server`, every model `owned_by: "me"`) puts the tools in
    the chat template but hands the model's calls back as `<tool_call>` text, and with the 1.5B model behind
    it 9 of 34 local tasks passed natively against 22-27 of 34 in text ReAct (`benchmarks/local_tasks.py`).
    """
    if owners and set(owners) == {"me"}:
        return "llama-cpp-python's server"
    return None


def unsupported_param(text: str, params: Mapping[str, Any], body: Any = None) -> str | None:
    """The optional parameter of `params` an error refuses, or None (the error is about something else)."""
    for name in OPTIONAL_PARAMS:
        if name not in params:
            continue
        quoted = rf"['\"`]?{name}['\"`]?"
        near = rf"(?:{_REFUSED}[^.\n]{{0,40}}?\b{quoted}|\b{quoted}[^.\n]{{0,40}}?{_REFUSED})"
        if re.search(near, text, re.IGNORECASE) or (_names_field(body, name) and _EXTRA.search(text)):
            return name
    return None


def _names_field(body: Any, name: str) -> bool:
    """Whether an error body points at the field `name` itself: OpenAI's `{"param": name}`, or a pydantic
    server's `{"detail": [{"loc": ["body", name], ...}]}`."""
    if not isinstance(body, Mapping):
        return False
    detail = body.get("detail")
    if isinstance(detail, list):
        return any(isinstance(d, Mapping) and list(d.get("loc") or ()) == ["body", name] for d in detail)
    return body.get("param") == name
