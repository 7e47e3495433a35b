"""The task registry: one declarative entry per task, in the style of :mod:`kvlab.compress.methods`.

An entry names the task's generator, its scorer, its known shortcuts, its chance floor, the
``TaskSpec`` fields it reads and the kind of its items (which fixes their prompt layout).  TaskSpec
validation and its messages, item generation and counting, the scorer dispatch, the report's chance
floors, the length buckets of a file's items and the needle heatmap read from here.  Adding a task
is one module (its generator, and its scorer if none of :mod:`kvlab.tasks.scoring` fits) plus one
entry in :data:`TASKS`; ``tests/tasks/test_task_registry.py`` shows that nothing else is needed.

The task modules import :mod:`kvlab.tasks.spec`, so that module reads this one only when it
validates (``_tasks`` there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from kvlab.tasks import jsonl, multikey, passkey, perplexity, scoring, variable_tracking
from kvlab.tasks.haystack import Tokenizer
from kvlab.tasks.items import ItemKind, TaskItem
from kvlab.tasks.scoring import Scorer
from kvlab.tasks.spec import TaskSpec

Generator = Callable[[TaskSpec, Tokenizer, int], list[TaskItem]]
#: Shortcut name (e.g. "first number") -> what answering that way scores on one item.
Shortcuts = Callable[[TaskItem], dict[str, float]]

#: The ``TaskSpec`` fields every task may read (``name`` aside).
SPEC_FIELDS = frozenset(TaskSpec.model_fields) - {"name"}


def per_length_count(spec: TaskSpec) -> int:
    """Items of a generated task: ``num_items`` (or the default) per context length."""
    return spec.items_per_length * len(spec.context_lengths)


@dataclass(frozen=True)
class Task:
    """One task.

    ``generate(spec, tokenizer, seed)`` makes its items, the same for the same arguments.
    ``scorer(item, generated)`` scores a generated answer in [0, 1]; None for a task whose items
    are of kind ``"perplexity"`` (their NLL is the measure).  ``kind`` is the kind of its items, and
    so their prompt layout (:class:`~kvlab.tasks.items.TaskItem`): ``"generate"`` is a context then
    a question ending in the answer prefix, in two layouts (query-agnostic: the question is fed
    after the context is compressed; query-aware: all but its last token are prefilled with the
    context); ``"perplexity"`` is a context then a continuation whose likelihood is measured, one
    layout (no question: query-aware configs run query-agnostic).  ``fields``: the ``TaskSpec``
    fields it reads (the form shows only these; ``path`` marks a task whose items come from the
    user's file).  ``chance_floor``: what answering without doing the task scores (the task
    module's docstring says why); ``shortcuts`` measures the known ways of doing so on each item.
    ``count_items(spec)``: how many items ``spec`` makes, counted without a tokenizer (None when
    that cannot be told here).
    """

    name: str
    generate: Generator
    scorer: Scorer | None
    chance_floor: str
    fields: frozenset[str]
    kind: ItemKind = "generate"
    shortcuts: Shortcuts | None = None
    count_items: Callable[[TaskSpec], int | None] = per_length_count

    def __post_init__(self) -> None:
        unknown = sorted(self.fields - SPEC_FIELDS)
        if unknown:
            raise ValueError(f"task {self.name!r}: {unknown} are not TaskSpec fields")
        if (self.scorer is None) != (self.kind == "perplexity"):
            raise ValueError(f"task {self.name!r}: perplexity items, and only they, have no scorer")

    @property
    def reads_file(self) -> bool:
        """Its items come from the file at ``path``, not from a generator's prose."""
        return "path" in self.fields

    @property
    def target_lengths(self) -> bool:
        """Its items are made to the spec's ``context_lengths`` (else their lengths are measured)."""
        return "context_lengths" in self.fields

    @property
    def needle_depths(self) -> bool:
        """Its items hide what they ask for at one of the spec's ``depths`` (``item.depth``)."""
        return "depths" in self.fields


#: What a task reads whose items are made to the spec's context lengths and answered in new tokens.
_GENERATED = frozenset({"context_lengths", "num_items", "max_new_tokens"})

TASKS: dict[str, Task] = {t.name: t for t in (
    Task("passkey", passkey.generate, scorer=scoring.first_number, fields=_GENERATED | {"depths"},
         chance_floor="about 0 (a random 5-digit key)"),
    Task("multikey", multikey.generate, scorer=scoring.first_number, fields=_GENERATED | {"depths", "num_pairs"},
         chance_floor="1/num_pairs (any one number of the context)", shortcuts=multikey.shortcut_scores),
    Task("variable_tracking", variable_tracking.generate, scorer=scoring.variable_names,
         fields=_GENERATED | {"num_chains", "num_hops"},
         chance_floor="2/(num_chains+1) F1 (every variable of the context)",
         shortcuts=variable_tracking.shortcut_scores),
    Task("perplexity", perplexity.generate, scorer=None, kind="perplexity",
         fields=frozenset({"context_lengths", "num_items", "continuation_tokens"}),
         chance_floor="none (not a 0-1 score)"),
    Task("jsonl", jsonl.generate, scorer=scoring.answer_prefix, fields=frozenset({"path", "num_items", "max_new_tokens"}),
         chance_floor="depends on the file", count_items=jsonl.planned_items),
)}

#: The registry's names as a type, for annotations and the form's choices.  TaskSpec validates a
#: name against :data:`TASKS` itself, so that an entry added after import (a test's) is accepted.
TaskName = Literal[tuple(TASKS)]  # type: ignore[valid-type]


def generate_items(spec: TaskSpec, tokenizer: Tokenizer, seed: int) -> list[TaskItem]:
    """The items of ``spec``, identical for the same (spec, tokenizer, seed).

    Lengths are measured in ``tokenizer``'s tokens (a Hugging Face tokenizer, or any
    callable returning ``{"input_ids": [...]}``), so items depend on the model's tokenizer.
    """
    return TASKS[spec.name].generate(spec, tokenizer, seed)


def planned_items(spec: TaskSpec) -> int | None:
    """How many items ``spec`` will generate, counted without a tokenizer: per context length for
    generated tasks; a jsonl file's lines (at most ``num_items``), or None when the file cannot be
    read here (validation reports why, this count does not)."""
    return TASKS[spec.name].count_items(spec)


def score_item(item: TaskItem, generated: str) -> float:
    """Score ``generated`` (the model's output after the prompt) against ``item``."""
    if item.kind == "perplexity":
        raise ValueError(
            f"{item.item_id}: perplexity items are not scored from generated text; "
            "use the continuation NLL the engine reports"
        )
    task = TASKS.get(item.task)
    if task is None or task.scorer is None:
        raise ValueError(f"{item.item_id}: no scorer for task {item.task!r}")
    return task.scorer(item, generated)


def shortcut_scores(item: TaskItem) -> dict[str, float]:
    """What each known shortcut (e.g. "answer with the first number") would score on ``item``."""
    task = TASKS.get(item.task)
    return task.shortcuts(item) if task is not None and task.shortcuts is not None else {}


def chance_floor_text(task: str) -> str:
    """What answering ``task`` without doing it scores, in words ("-" for a task not registered,
    e.g. one of stored results that this version no longer has)."""
    entry = TASKS.get(task)
    return entry.chance_floor if entry is not None else "-"
