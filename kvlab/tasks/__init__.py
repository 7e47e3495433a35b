"""Offline, deterministic task generators and scorers.

``generate_items(spec, tokenizer, seed)`` builds the items of one TaskSpec;
``score_item(item, generated)`` scores a model's output for one of them (a
:class:`kvlab.core.items.TaskItem`).  Each task is one
entry of the registry (:data:`kvlab.core.tasks.TASKS`).
"""

from __future__ import annotations

from kvlab.tasks.haystack import ContextTooShortError, Tokenizer, count_tokens
from kvlab.tasks.jsonl import JsonlFileMissingError, JsonlTaskError, check_task_files
from kvlab.tasks.registry import generate_items, planned_items, score_item, shortcut_scores

__all__ = [
    "ContextTooShortError",
    "JsonlFileMissingError",
    "JsonlTaskError",
    "Tokenizer",
    "check_task_files",
    "count_tokens",
    "generate_items",
    "planned_items",
    "score_item",
    "shortcut_scores",
]
