"""Spec files on this host: reading a TOML spec (native or seed-blog shaped) and checking what this
host's files tell (a local model's context, a jsonl file's rows) before anything is stored or loaded.

The spec types and what the spec alone tells are in :mod:`kvlab.core.experiment_spec`.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import (
    MAX_SPEC_BYTES,
    ExperimentSpec,
    check_context_lengths,
    check_item_evals,
    parse_spec,
    spec_text,
)
from kvlab.core.limits import FieldProblem
from kvlab.core.model_registry import context_limit
from kvlab.seed_format import is_seed_style, translate_seed_spec
from kvlab.tasks import planned_items
from kvlab.tasks.jsonl import check_task_files


def check_on_this_host(spec: ExperimentSpec) -> None:
    """What validation cannot tell from the spec alone, checked before anything is stored or loaded
    (:func:`load_spec`, and the submit path of every front end): context lengths against a local
    model directory's limit (validation knows the registry's), and the item evaluations with each
    jsonl file's records counted."""
    try:
        check_context_lengths(spec, context_limit(spec.model, read_files=True))
        check_item_evals(spec, planned_items)
    except FieldProblem as problem:
        raise ConfigError(f"{problem.path}: {problem}") from None


def parse_spec_toml(text: str, source: str = "spec") -> tuple[ExperimentSpec, list[str]]:
    """A spec from TOML text (native or seed-blog shaped) and any warnings.  Every error message
    starts with ``source`` (the file's name) and names the line and column or the field."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{source}: not valid TOML: {error}") from None
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise ConfigError(f"{source}: not valid TOML: arrays or tables nested too deeply") from None
    try:
        if is_seed_style(data):
            data, warnings = translate_seed_spec(data)
            return parse_spec(data), warnings
        return parse_spec(data), []
    except ConfigError as error:
        raise ConfigError(f"{source}: {error}") from None


def load_spec(path: str | Path) -> tuple[ExperimentSpec, list[str]]:
    """Read a TOML spec file (native or seed-blog shaped) and return it with any warnings; jsonl
    task files are validated too, and their paths made absolute (:func:`check_task_files`), and
    what this host's files tell checked (:func:`check_on_this_host`)."""
    path = Path(path)
    try:
        if path.is_dir():
            raise ConfigError(f"{path}: is a directory; give a spec TOML file (examples/ has some)")
        if path.exists() and not path.is_file():
            raise ConfigError(f"{path}: not a regular file; give a spec TOML file")
        size = path.stat().st_size
        if size > MAX_SPEC_BYTES:  # before reading: the path may name a huge file
            raise ConfigError(f"{path}: {size:,} bytes; a spec file is at most {MAX_SPEC_BYTES:,} bytes")
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: spec file not found") from None
    except PermissionError:
        raise ConfigError(f"{path}: not readable by this user (permission denied)") from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot be read ({error.strerror or error})") from None
    spec, warnings = parse_spec_toml(spec_text(data, str(path)), str(path))
    spec = check_task_files(spec)  # a bad task file is refused before any model loads
    try:
        check_on_this_host(spec)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
    return spec, warnings


