"""Offline, deterministic task generators and scorers.

``generate_items(spec, tokenizer, seed)`` builds the items of one TaskSpec;
``score_item(item, generated)`` scores a model's output for one of them.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

from kvlab.tasks import jsonl, multikey, passkey, perplexity, variable_tracking
from kvlab.tasks.haystack import ContextTooShortError, Tokenizer, count_tokens
from kvlab.tasks.items import TaskItem
from kvlab.tasks.jsonl import JsonlFileMissingError, JsonlTaskError, check_task_files
from kvlab.tasks.scoring import score_item
from kvlab.tasks.spec import TaskName, TaskSpec

Generator = Callable[[TaskSpec, Tokenizer, int], list[TaskItem]]

GENERATORS: dict[str, Generator] = {
    "passkey": passkey.generate,
    "multikey": multikey.generate,
    "variable_tracking": variable_tracking.generate,
    "perplexity": perplexity.generate,
    "jsonl": jsonl.generate,
}


SHORTCUTS: dict[str, Callable[[TaskItem], dict[str, float]]] = {
    "multikey": multikey.shortcut_scores,
    "variable_tracking": variable_tracking.shortcut_scores,
}

#: What answering without doing the task scores (each task module's docstring says why).
CHANCE_FLOORS: dict[str, str] = {
    "passkey": "about 0 (a random 5-digit key)",
    "multikey": "1/num_pairs (any one number of the context)",
    "variable_tracking": "2/(num_chains+1) F1 (every variable of the context)",
    "perplexity": "none (not a 0-1 score)",
    "jsonl": "depends on the file",
}


def shortcut_scores(item: TaskItem) -> dict[str, float]:
    """What each known shortcut (e.g. "answer with the first number") would score on ``item``."""
    shortcut = SHORTCUTS.get(item.task)
    return shortcut(item) if shortcut else {}


def planned_items(spec: TaskSpec) -> int | None:
    """How many items ``spec`` will generate, counted without a tokenizer: per context length for
    generated tasks; a jsonl file's lines (at most ``num_items``), or None when the file cannot be
    read here (validation reports why, this count does not)."""
    if spec.name != "jsonl":
        return spec.items_per_length * len(spec.context_lengths)
    assert spec.path is not None  # TaskSpec guarantees it for jsonl
    try:
        status = os.stat(spec.path)
        lines = _count_records(spec.path, status.st_mtime_ns, status.st_size)
    except (OSError, JsonlTaskError):
        return None
    return lines if spec.num_items is None else min(lines, spec.num_items)


@functools.lru_cache(maxsize=64)
def _count_records(path: str, mtime_ns: int, size: int) -> int:
    """Records of a jsonl file, cached per version of it (the dashboard asks on every rerun)."""
    return jsonl.validate_file(path)


def generate_items(spec: TaskSpec, tokenizer: Tokenizer, seed: int) -> list[TaskItem]:
    """The items of ``spec``, identical for the same (spec, tokenizer, seed).

    Lengths are measured in ``tokenizer``'s tokens (a Hugging Face tokenizer, or any
    callable returning ``{"input_ids": [...]}``), so items depend on the model's tokenizer.
    """
    return GENERATORS[spec.name](spec, tokenizer, seed)


__all__ = [
    "ContextTooShortError",
    "GENERATORS",
    "JsonlFileMissingError",
    "JsonlTaskError",
    "TaskItem",
    "TaskName",
    "TaskSpec",
    "Tokenizer",
    "CHANCE_FLOORS",
    "check_task_files",
    "count_tokens",
    "generate_items",
    "planned_items",
    "score_item",
    "shortcut_scores",
]
