"""The task registry's functions: an entry of :data:`kvlab.core.tasks.TASKS` names its generator,
scorer, shortcuts and item counter; these resolve the names and call them."""

from __future__ import annotations

import pkgutil
from collections.abc import Callable
from functools import cache
from typing import Any

from kvlab.core.items import TaskItem
from kvlab.core.tasks import TASKS, TaskSpec
from kvlab.tasks.haystack import Tokenizer


@cache
def resolve(reference: str) -> Callable[..., Any]:
    """The function a registry entry names (``"module:function"``), its module imported on first use."""
    return pkgutil.resolve_name(reference)


def generate_items(spec: TaskSpec, tokenizer: Tokenizer, seed: int) -> list[TaskItem]:
    """The items of ``spec``, identical for the same (spec, tokenizer, seed).

    Lengths are measured in ``tokenizer``'s tokens (a Hugging Face tokenizer, or any
    callable returning ``{"input_ids": [...]}``), so items depend on the model's tokenizer.
    """
    return resolve(TASKS[spec.name].generate)(spec, tokenizer, seed)


def planned_items(spec: TaskSpec) -> int | None:
    """How many items ``spec`` will generate, counted without a tokenizer: per context length (times
    the questions asked of each context) for generated tasks; a jsonl file's lines (at most
    ``num_items``), or None when the file cannot be read here (validation reports why, this count
    does not)."""
    counter = TASKS[spec.name].count_items
    if counter is None:
        return spec.items_per_length * len(spec.context_lengths) * spec.questions_per_context
    return resolve(counter)(spec)


def score_item(item: TaskItem, generated: str) -> float | None:
    """Score ``generated`` (the model's output after the prompt) against ``item``; None for a task
    judged by fidelity alone (no reference answer)."""
    if item.kind == "perplexity":
        raise ValueError(
            f"{item.item_id}: perplexity items are not scored from generated text; "
            "use the continuation NLL the engine reports"
        )
    task = TASKS.get(item.task)
    if task is not None and task.fidelity_only:
        return None
    if task is None or task.scorer is None:
        raise ValueError(f"{item.item_id}: no scorer for task {item.task!r}")
    return resolve(task.scorer)(item, generated)


def shortcut_scores(item: TaskItem) -> dict[str, float]:
    """What each known shortcut (e.g. "answer with the first number") would score on ``item``."""
    task = TASKS.get(item.task)
    return resolve(task.shortcuts)(item) if task is not None and task.shortcuts is not None else {}
