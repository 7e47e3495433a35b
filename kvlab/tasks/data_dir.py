"""The only files the dashboard reads as tasks: those under the data directory.

The dashboard is a web page, so a path typed into it must not reach any file on the host: a
jsonl task's path must lie under ``KVLAB_DATA_DIR`` (default ``db/data`` in the checkout,
git-ignored), after following symlinks; ``..`` is refused outright. Uploaded files are saved
there under ``uploads/``. The CLI reads any path its user names (the user owns the terminal).
"""

from __future__ import annotations

import hashlib
import os
import re
from functools import lru_cache
from pathlib import Path

from kvlab.core.errors import ConfigError
from kvlab.paths import DATA_DIR_VAR, data_dir
from kvlab.tasks.jsonl import JsonlTaskError, Limits, show_path, validate_file

UPLOADS = "uploads"


def resolve_data_path(text: str, root: Path | None = None) -> Path:
    """``text`` (relative to the data directory, or absolute inside it) as an absolute path that
    stays inside the data directory once symlinks are followed; :class:`ConfigError` otherwise."""
    root = (root or data_dir()).resolve()
    text = text.strip()
    where = f"the data directory {show_path(root)} ({DATA_DIR_VAR})"
    if not text:
        raise ConfigError(f"give a file under {where}, or upload one")
    if not text.isprintable():
        raise ConfigError(f"{show_path(text)}: a path has no control characters (newline, tab, NUL)")
    candidate = Path(text)
    if ".." in candidate.parts:
        raise ConfigError(f"{text}: '..' is not allowed; give a path under {where}")
    try:
        resolved = (candidate if candidate.is_absolute() else root / candidate).resolve()
    except (OSError, RuntimeError) as error:  # RuntimeError: a symlink loop (Python < 3.13)
        raise ConfigError(f"{text}: cannot be resolved ({error})") from None
    if not resolved.is_relative_to(root):
        raise ConfigError(f"{text}: only files under {where} can be used here; put the file there or upload it")
    return resolved


def data_files(root: Path | None = None, limit: int = 500) -> list[str]:
    """The JSONL files under the data directory (``limit`` at most), as paths relative to it, sorted."""
    root = (root or data_dir()).resolve()
    if not root.is_dir():
        return []
    found: list[str] = []
    for path in sorted(root.rglob("*.jsonl")):
        if len(found) >= limit:
            break
        if path.is_file() and path.resolve().is_relative_to(root):
            found.append(str(path.relative_to(root)))
    return found


def checked_data_file(text: str, root: Path | None = None) -> str:
    """The absolute path of a valid JSONL task file under the data directory, for a spec;
    :class:`ConfigError` naming the file (as typed) and the problem otherwise.

    A file is read once per (size, modification time): the form is re-validated on every click.
    """
    path = resolve_data_path(text, root)
    try:
        info = path.stat()
        version = (info.st_size, info.st_mtime_ns)
    except OSError:
        version = (-1, -1)
    problem = _problem(str(path), text.strip(), version, Limits.from_env())
    if problem:
        raise JsonlTaskError(problem)
    return str(path)


@lru_cache(maxsize=32)
def _problem(path: str, label: str, version: tuple[int, int], limits: Limits) -> str | None:
    try:
        validate_file(path, label, limits)
    except JsonlTaskError as error:
        return str(error)
    return None


def save_upload(name: str, data: bytes, root: Path | None = None) -> str:
    """Validate an uploaded JSONL file and save it under ``uploads/`` in the data directory;
    return its path relative to the data directory. Same content, same file.

    :class:`ConfigError` (naming the upload) if it is too large or not a valid task file.
    """
    root = (root or data_dir()).resolve()
    limits = Limits.from_env()
    label = f"upload {show_path(Path(name).name)}"
    if len(data) > limits.file_bytes:
        raise JsonlTaskError(f"{label}: the file is {len(data) / (1 << 20):.3g} MiB, over the limit of "
                             f"{limits.file_bytes / (1 << 20):.3g} MiB")
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name).name).lstrip(".")[:80] or "upload.jsonl"
    relative = Path(UPLOADS) / f"{hashlib.sha256(data).hexdigest()[:16]}-{safe}"
    target = root / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.part")
    partial.write_bytes(data)
    try:
        validate_file(partial, label, limits)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return str(relative)
