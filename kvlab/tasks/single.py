"""One item on its own, as the playground runs it: a task's, generated as an experiment would generate it (the
same seed gives the same item), or the caller's text scored as a JSONL row's would be.  Torch-free: the
dashboard builds items here for an OpenAI-compatible endpoint, ``kvlab serve`` for its own engine."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import format_validation_error
from kvlab.core.items import TaskItem
from kvlab.core.limits import FieldProblem
from kvlab.core.tasks import ANSWER_SCORERS, DEFAULT_ANSWER_SCORER, TASKS, TaskSpec, generated_tasks
from kvlab.tasks.haystack import Tokenizer
from kvlab.tasks.jsonl import DEFAULT_MAX_NEW_TOKENS
from kvlab.tasks.registry import generate_items, resolve, score_item

#: The task name of the caller's own text.
OWN_TEXT = "playground"


def generated_item(task: str, context_length: int, depth: float | None, seed: int, tokenizer: Tokenizer,
                   max_new_tokens: int | None = None, params: Mapping[str, Any] | None = None) -> TaskItem:
    """A task's item of ``context_length`` tokens (``depth``: its needle's, for a task that has one; ``params``:
    its own parameters, its entry's defaults for those not given); :class:`ConfigError` in one line for a task,
    a parameter or a size that cannot be generated."""
    if task not in (generated := generated_tasks()):
        raise ConfigError(f"task {task!r} cannot be generated here; one of {', '.join(generated)}")
    try:
        needle: dict[str, Any] = {"depths": [depth]} if depth is not None and TASKS[task].needle_depths else {}
        own = TASKS[task].parse_params({**(params or {}), **needle})
        spec = TaskSpec(name=task, context_lengths=[context_length], num_items=1, params=own)
        item = generate_items(spec, tokenizer, seed)[0]
    except FieldProblem as problem:
        raise ConfigError(f"{problem.path}: {problem}") from None
    except ValidationError as error:
        raise ConfigError("; ".join(format_validation_error(error).splitlines())) from None
    except ValueError as error:
        raise ConfigError(str(error).splitlines()[0]) from None
    return replace(item, max_new_tokens=max_new_tokens) if max_new_tokens else item


def own_item(context: str, question: str, answer: str = "", scorer: str = DEFAULT_ANSWER_SCORER,
             tolerance: float | None = None, max_new_tokens: int | None = None) -> TaskItem:
    """The caller's text (or a JSONL row's fields): the context is compressed, the question fed after it."""
    return TaskItem(task=OWN_TEXT, item_id=OWN_TEXT, context=context, question=question, answer=answer,
                    context_length=0, depth=None, max_new_tokens=max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
                    metadata={"scorer": scorer, **({} if tolerance is None else {"tolerance": tolerance})})


def score(item: TaskItem, generated: str) -> float | None:
    """A task's own score; the caller's text by its answer scorer (None without an answer)."""
    if item.task != OWN_TEXT:
        return score_item(item, generated)
    if not item.answer:
        return None
    return resolve(ANSWER_SCORERS[item.metadata["scorer"]].function)(item, generated)
