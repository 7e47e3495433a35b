"""The engine an experiment spec asks for: the backend registry's engine module builds it."""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any

from kvlab.core.backends import BACKENDS
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import ExperimentSpec
from kvlab.engines.base import Engine
from kvlab.engines.endpoint_rules import BaseURLError, key_problem, parse_base_url, sendable
from kvlab.secrets import Endpoint, resolve_endpoint

log = logging.getLogger(__name__)


def build_engine(spec: ExperimentSpec) -> Engine:
    """Load the model (embedded) or connect to / launch the server (the others): the ``build(spec)``
    of the engine module that :data:`kvlab.core.backends.BACKENDS` names for the spec's backend kind."""
    return importlib.import_module(BACKENDS[spec.backend.kind].engine).build(spec)


def openai_endpoint(base_url: str | None, model_id: str | None, api_key_env: str) -> Endpoint:
    """The endpoint a spec names, held to the rules ``kvlab doctor`` checks (:mod:`endpoint_rules`):
    a base URL kvlab would correct, or a key no HTTP header can carry, is refused with the fix."""
    try:
        endpoint = resolve_endpoint(base_url, model_id, api_key_env)
        base = parse_base_url(endpoint.base_url)
    except BaseURLError as error:
        raise ConfigError(f"base URL: {error}") from None
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if base.mistakes:
        raise ConfigError(f"base URL {base.shown}: {'; '.join(base.mistakes)}; use {base.url} as the base URL "
                          f"(`kvlab doctor --base-url {base.url}` checks the endpoint)")
    key = (endpoint.api_key or "").strip()
    if key and not sendable(key):
        raise ConfigError(f"the API key {endpoint.masked_key} ({endpoint.key_source}) {key_problem(key)}; set "
                          f"{api_key_env} to the key exactly as issued")
    return endpoint


def task_tokenizer(model: str) -> tuple[Any, str]:
    """The tokenizer that sizes task prompts for a served model, and a note saying which it is.

    The served model's own tokenizer when kvlab can load it here (a pulled kvlab model, a local
    directory, or a hub id in the local Hugging Face cache); otherwise the default model's, so
    context lengths are approximate -- the tokens the server really saw are recorded per item.
    """
    from transformers import AutoTokenizer

    from kvlab.models import DEFAULT_MODEL, KNOWN_MODELS, ModelNotAvailableError, load_tokenizer

    if model in KNOWN_MODELS or Path(model).expanduser().exists():
        return load_tokenizer(model), f"{model}'s own tokenizer"
    try:
        return AutoTokenizer.from_pretrained(model, local_files_only=True), f"{model}'s own tokenizer"
    except (OSError, ValueError) as error:
        log.info("no local tokenizer for %s (%s): sizing prompts with %s's", model, error, DEFAULT_MODEL)
    try:
        return load_tokenizer(DEFAULT_MODEL), (f"{DEFAULT_MODEL}'s tokenizer (that of {model} is not available "
                                               "here): context lengths are approximate")
    except ModelNotAvailableError as error:
        raise ConfigError(f"no tokenizer to size the task prompts for {model}: {error}") from None
