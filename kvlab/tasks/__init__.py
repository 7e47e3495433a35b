"""Offline, deterministic task generators and scorers.

``generate_items(spec, tokenizer, seed)`` builds the items of one TaskSpec;
``score_item(item, generated)`` scores a model's output for one of them.
"""

from __future__ import annotations

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
    "score_item",
    "shortcut_scores",
]
