"""Recognising a provider's "the prompt is longer than the context window" error (`ContextOverflowError`).

Providers say it in many ways; the shapes recognised here come from the servers themselves:

- OpenAI (and DeepSeek, Groq, Together…): HTTP 400, `code: "context_length_exceeded"`, "This model's
  maximum context length is 8192 tokens. However, your messages resulted in 8227 tokens." — or, when the
  reply room is counted, "… you requested 4120 tokens (3120 in the messages, 1000 in the completion)".
- vLLM: the same sentences (older versions), "'max_tokens' or 'max_completion_tokens' is too large: 4000.
  This model's maximum context length is 4096 tokens and your request has 1000 input tokens", or "The
  prompt (total length 25938) is too long to fit into the model (context length 4096)".
- llama.cpp server: `type: "exceed_context_size_error"` with `n_prompt_tokens` and `n_ctx` (HTTP 400, or
  500 in the versions that introduced it); llama-cpp-python's server: "Requested tokens (2285) exceed
  context window of 2048".
- Ollama: "the input length exceeds the context length"; Anthropic-style proxies: "prompt is too long:
  208000 tokens > 200000 maximum"; Gemini's OpenAI endpoint: "The input token count (N) exceeds the maximum
  number of tokens allowed (M)"; Mistral: "Prompt contains N tokens … too large for model with M maximum
  context length"; Hugging Face TGI: "`inputs` tokens + `max_new_tokens` must be <= 4097. Given: 4000
  `inputs` tokens and 1000 `max_new_tokens`"; DashScope (Qwen): "Range of input length should be [1, 30720]".

A 429 is never an overflow (its "Request too large … tokens per min" is a rate limit).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .._errors import ContextOverflowError

__all__ = ["overflow_error", "reply_room_after_overflow"]

_CODES = frozenset(
    {
        "context_length_exceeded",
        "exceed_context_size_error",
        "context_window_exceeded",
        "model_context_window_exceeded",
    }
)
_N = r"(\d[\d,_]*)"
_DETECT = re.compile(
    r"maximum context length|context[ _]length[ _]exceeded|context[ _]window[ _]exceeded"
    r"|(?:exceeds?|more than|longer than|larger than) (?:the |its |your )?(?:available |model's |maximum )?"
    r"context (?:size|length|window)"
    r"|(?:prompt|input) is too long|too long to fit into the model|reduce the length of the (?:messages|prompt|input)"
    r"|input token count .{0,40}exceeds the maximum number of tokens"
    r"|`inputs` tokens \+ `max_new_tokens` must be|range of input length should be",
    re.IGNORECASE,
)
_LIMIT = [
    re.compile(p, re.IGNORECASE)
    for p in (
        rf"maximum context length is {_N}",
        rf"context window of {_N}",
        rf"\(context length {_N}\)",
        rf"{_N} maximum context length",
        rf"> {_N} maximum",
        rf"maximum number of tokens allowed \({_N}\)",
        rf"must be <= {_N}",
        rf"range of input length should be \[\d+, ?{_N}\]",
        rf"context (?:size|length|window) (?:is |of )?{_N}",
    )
]
_PROMPT = [
    re.compile(p, re.IGNORECASE)
    for p in (
        rf"your messages resulted in {_N}",
        rf"{_N} in the messages",
        rf"(?:request|prompt) has {_N} (?:input )?tokens",
        rf"requested {_N} tokens in the (?:messages|input)",
        rf"requested tokens \({_N}\)",
        rf"prompt contains {_N} tokens",
        rf"prompt is too long: {_N}",
        rf"input token count \({_N}\)",
        rf"total length {_N}",
        rf"given: {_N} `inputs` tokens",
    )
]
_COMPLETION = [
    re.compile(p, re.IGNORECASE)
    for p in (
        rf"{_N} in the completion",
        rf"'max_(?:completion_)?tokens'.{{0,40}} is too large: {_N}",
        rf"and {_N} `max_new_tokens`",
    )
]


def overflow_error(
    message: str,
    *,
    provider: str,
    scope: str,
    status_code: int | None = None,
    code: object = None,
    body: object = None,
) -> ContextOverflowError | None:
    """A `ContextOverflowError` when the provider's error (`message`, its `code`/`type`, its JSON `body`)
    says the prompt does not fit the context window; None for any other error."""
    if status_code == 429:
        return None
    fields = body if isinstance(body, Mapping) else {}
    codes = {str(v).lower() for v in (code, fields.get("code"), fields.get("type")) if v is not None}
    if not (codes & _CODES or _DETECT.search(message)):
        return None
    limit = _int(fields.get("n_ctx")) or _first(_LIMIT, message)
    prompt = _int(fields.get("n_prompt_tokens")) or _first(_PROMPT, message)
    completion = _first(_COMPLETION, message)
    if limit is not None and prompt == limit:
        prompt = None  # a pattern read the limit twice: the prompt's size is unknown
    return ContextOverflowError(
        f"the prompt is longer than the model's context window: {message}",
        provider=provider,
        scope=scope,
        status_code=status_code,
        limit=limit,
        prompt_tokens=prompt,
        completion_tokens=completion,
    )


def reply_room_after_overflow(
    error: ContextOverflowError, requested: int, *, minimum: int = 256
) -> int | None:
    """The smaller `max_tokens` that makes a rejected request fit, when only the reply room was too big.

    Servers such as vLLM count the requested reply against the window: a 1,000-token prompt asking for
    4,096 tokens of reply overflows a 4,096-token window. Then the prompt is fine and the request can be
    sent again with `limit - prompt` tokens of reply room — if that leaves at least `minimum` (and less
    than was asked). None when the error does not say so.
    """
    if error.limit is None or error.prompt_tokens is None:
        return None
    room = error.limit - error.prompt_tokens
    if room < min(minimum, requested) or room >= requested:
        return None
    return room


def _first(patterns: list[re.Pattern[str]], text: str) -> int | None:
    for pattern in patterns:
        match = pattern.search(text)
        if match is not None:
            return _int(match.group(1))
    return None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, str):
        digits = value.replace(",", "").replace("_", "")
        return int(digits) if digits.isdigit() and int(digits) > 0 else None
    return None
