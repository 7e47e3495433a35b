"""Offline, deterministic task generators and scorers.

``generate_items(spec, tokenizer, seed)`` builds the items of one TaskSpec;
``score_item(item, generated)`` scores a model's output for one of them.  Each task is one
entry of the registry (:data:`kvlab.tasks.registry.TASKS`).
"""

from __future__ import annotations

from kvlab.tasks.haystack import ContextTooShortError, Tokenizer, count_tokens
from kvlab.tasks.items import TaskItem
from kvlab.tasks.jsonl import JsonlFileMissingError, JsonlTaskError, check_task_files
from kvlab.tasks.registry import (
    TASKS,
    Task,
    TaskName,
    chance_floor_text,
    generate_items,
    planned_items,
    score_item,
    shortcut_scores,
)
from kvlab.tasks.spec import TaskSpec

__all__ = [
    "ContextTooShortError",
    "JsonlFileMissingError",
    "JsonlTaskError",
    "TASKS",
    "Task",
    "TaskItem",
    "TaskName",
    "TaskSpec",
    "Tokenizer",
    "chance_floor_text",
    "check_task_files",
    "count_tokens",
    "generate_items",
    "planned_items",
    "score_item",
    "shortcut_scores",
]
