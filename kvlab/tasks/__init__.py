"""Offline, deterministic task generators and scorers.

``generate_items(spec, tokenizer, seed)`` builds the items of one TaskSpec;
``score_item(item, generated)`` scores a model's output for one of them.
"""

from __future__ import annotations

from collections.abc import Callable

from kvlab.tasks import jsonl, multikey, passkey, perplexity, variable_tracking
from kvlab.tasks.haystack import ContextTooShortError, Tokenizer, count_tokens
from kvlab.tasks.items import TaskItem
from kvlab.tasks.jsonl import JsonlTaskError
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


def generate_items(spec: TaskSpec, tokenizer: Tokenizer, seed: int) -> list[TaskItem]:
    """The items of ``spec``, identical for the same (spec, tokenizer, seed).

    Lengths are measured in ``tokenizer``'s tokens (a Hugging Face tokenizer, or any
    callable returning ``{"input_ids": [...]}``), so items depend on the model's tokenizer.
    """
    return GENERATORS[spec.name](spec, tokenizer, seed)


__all__ = [
    "ContextTooShortError",
    "GENERATORS",
    "JsonlTaskError",
    "TaskItem",
    "TaskName",
    "TaskSpec",
    "Tokenizer",
    "count_tokens",
    "generate_items",
    "score_item",
]
