"""Models: the `Model` interface, the OpenAI-compatible adapter, the embedded local model, the router."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError
from ._base import Model as Model
from ._base import ModelCapabilities as ModelCapabilities
from ._base import estimate_tokens as estimate_tokens

DEFAULT_MODEL = "local"

__all__ = [
    "DEFAULT_MODEL",
    "LocalModel",
    "Model",
    "ModelCapabilities",
    "OpenAIModel",
    "RouterModel",
    "estimate_tokens",
    "resolve_model",
]

if TYPE_CHECKING:
    from ._local import LocalModel as LocalModel
    from ._openai import OpenAIModel as OpenAIModel
    from ._router import RouterModel as RouterModel

_LAZY = {
    "OpenAIModel": "._openai",
    "RouterModel": "._router",
    "LocalModel": "._local",
}  # imported on first use, so `import thinkloop` stays fast


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def resolve_model(spec: str | Model | Sequence[str | Model] | None) -> Model:
    """A `Model` from a model string (`provider:name`); None (or a blank string) means `$THINKLOOP_MODEL`
    or `local`.

    Known providers: `openai:MODEL` (any OpenAI-compatible API; `OPENAI_BASE_URL`/`OPENAI_API_KEY`),
    `local` / `local:0.5b` (the embedded model) / `local:FILE.gguf` (another GGUF file), `script:FILE` (a scripted model from a JSON file),
    `router:SPEC,SPEC,...` (a `RouterModel` over those models). A list of models or strings also
    makes a `RouterModel`. A wrong string is a `ConfigurationError` saying what was probably meant and what
    is valid; one from `$THINKLOOP_MODEL` names the variable.
    """
    if isinstance(spec, Model):
        return spec
    if spec is not None and not isinstance(spec, str):
        if not isinstance(spec, Sequence):
            raise ConfigurationError(
                f"a model must be a model string, a Model or a list of them, not {spec!r}; "
                "e.g. Agent('local') or Agent(['openai:gpt-4o-mini', 'local'])"
            )
        from ._router import RouterModel

        return RouterModel(list(spec))
    text = (spec or "").strip()
    if text:
        return _from_string(text)
    variable = os.environ.get(MODEL_VARIABLE, "").strip()
    if not variable:
        return _from_string(DEFAULT_MODEL)
    try:
        return _from_string(variable)
    except ConfigurationError as exc:  # the caller named no model: say where this one came from
        raise variable_error(variable, exc) from exc


def variable_error(variable: str, exc: ConfigurationError) -> ConfigurationError:
    """What a wrong `$THINKLOOP_MODEL` (`variable`, its value) says: where the model string came from."""
    return ConfigurationError(
        f"${MODEL_VARIABLE} is {variable!r}: {exc} — set ${MODEL_VARIABLE} to a valid model string, "
        f"or unset it for {DEFAULT_MODEL!r}"
    )


MODEL_VARIABLE = "THINKLOOP_MODEL"
PROVIDERS = ("local", "openai", "router", "script")
VALID = "use 'local', 'local:0.5b', 'openai:MODEL', 'script:FILE' or 'router:SPEC,SPEC', or pass a Model"


def _from_string(text: str) -> Model:
    provider, colon, name = text.partition(":")
    provider, name = provider.strip().lower(), name.strip()
    if provider == "openai":
        if not name:
            raise ConfigurationError("'openai:' needs a model name, e.g. 'openai:gpt-4o-mini'")
        from ._openai import OpenAIModel

        return OpenAIModel(name)
    if provider == "local":
        from ._local import LocalModel

        if name.endswith(".gguf") or "/" in name or os.sep in name:  # a model file: `LocalModel(path=...)`
            return LocalModel(path=name)
        return LocalModel(name or None)
    if provider == "router":
        parts = [part.strip() for part in name.split(",") if part.strip()]
        if not parts:
            raise ConfigurationError(
                "'router:' needs at least one model string, e.g. 'router:openai:gpt-4o-mini,local'"
            )
        from ._router import RouterModel

        return RouterModel(parts)
    if provider == "script":
        return _script(name)
    raise ConfigurationError(_unknown(text, provider, name if colon else None))


def _script(name: str) -> Model:
    if not name:
        raise ConfigurationError("'script:' needs a JSON file of replies, e.g. 'script:replies.json'")
    if os.path.isdir(name):
        raise ConfigurationError(f"script file {name!r} is a directory, not a JSON file of replies")
    from ..testing import load_script

    return load_script(name)


def _unknown(text: str, provider: str, name: str | None) -> str:
    """What an unknown model string says: the provider it probably meant, then what is valid."""
    import difflib

    close = difflib.get_close_matches(provider, PROVIDERS, n=1, cutoff=0.6)
    if close:  # a misspelt provider
        meant = close[0] if name is None else f"{close[0]}:{name}"
        return f"unknown model {text!r} (did you mean {meant!r}?): {VALID}"
    if name is None:  # a bare model name
        return f"unknown model {text!r} (did you mean {f'openai:{text}'!r}?): {VALID}"
    return (
        f"unknown model {text!r}: there is no provider {provider!r}; {VALID}. An OpenAI-compatible server "
        f"(Ollama, vLLM, DeepSeek …) is {f'openai:{name}'!r} with OPENAI_BASE_URL set to its /v1 URL, or "
        f"OpenAIModel({name!r}, base_url=..., provider={provider!r})"
    )
