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
    """A `Model` from a model string (`provider:name`); None means `$THINKLOOP_MODEL` or `local`.

    Known providers: `openai:MODEL` (any OpenAI-compatible API; `OPENAI_BASE_URL`/`OPENAI_API_KEY`),
    `local` / `local:0.5b` (the embedded model), `script:FILE` (a scripted model from a JSON file),
    `router:SPEC,SPEC,...` (a `RouterModel` over those models). A list of models or strings also
    makes a `RouterModel`.
    """
    if isinstance(spec, Model):
        return spec
    if spec is not None and not isinstance(spec, str):
        from ._router import RouterModel

        return RouterModel(list(spec))
    text = (spec or os.environ.get("THINKLOOP_MODEL") or DEFAULT_MODEL).strip()
    provider, _, name = text.partition(":")
    provider = provider.lower()
    if provider == "openai":
        if not name:
            raise ConfigurationError("'openai:' needs a model name, e.g. 'openai:gpt-4o-mini'")
        from ._openai import OpenAIModel

        return OpenAIModel(name)
    if provider == "local":
        from ._local import LocalModel

        return LocalModel(name or None)
    if provider == "router":
        from ._router import RouterModel

        return RouterModel([part.strip() for part in name.split(",") if part.strip()])
    if provider == "script":
        from ..testing import load_script

        return load_script(name)
    raise ConfigurationError(
        f"unknown model {text!r}: use 'local', 'local:0.5b', 'openai:MODEL', 'script:FILE' or 'router:SPEC,SPEC', or pass a Model"
    )
