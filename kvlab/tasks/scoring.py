"""Scorers: a model's generated text against one item, a score in [0, 1].

Each task's entry in :data:`kvlab.tasks.registry.TASKS` names its scorer:

- :func:`first_number` (passkey, multikey): 1 if the first run of digits in the output is the
  expected number (leading spaces, punctuation or words before it are tolerated; "714321"
  does not match "71432").
- :func:`variable_names` (variable_tracking): F1 of the variable names the output mentions (whole
  words, case-insensitive, among the context's variables) against the expected ones: recall
  alone (RULER's) would give full marks for listing every variable of the context.
- :func:`answer_prefix` (jsonl): 1 if the normalized output starts with the normalized answer at a
  word boundary (exact match is the special case). Normalizing lowercases, turns punctuation into
  spaces and collapses whitespace. A prefix rather than an exact match because a completion model
  keeps writing after the answer.

Perplexity items have no generated text to score: the engine reports their NLL.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable

from kvlab.tasks.items import TaskItem

#: How a task scores the text generated for one of its items.
Scorer = Callable[[TaskItem, str], float]

_DIGITS = re.compile(r"\d+")
_PUNCTUATION = re.compile(f"[{re.escape(string.punctuation)}]")


def normalize(text: str) -> str:
    """Lowercase, punctuation to spaces, whitespace collapsed."""
    return " ".join(_PUNCTUATION.sub(" ", text.lower()).split())


def first_number(item: TaskItem, generated: str) -> float:
    found = _DIGITS.search(generated)
    return float(found is not None and found.group() == item.answer)


def variable_names(item: TaskItem, generated: str) -> float:
    """F1 of the context's variable names (``metadata["all_names"]``) that ``generated`` mentions,
    against the answer's names."""
    expected = item.answer.split()
    all_names = item.metadata.get("all_names", expected)
    words = set(re.findall(r"[a-z]+", generated.lower()))
    mentioned = {name.lower() for name in all_names} & words
    hits = len(mentioned & {name.lower() for name in expected})
    if not hits:
        return 0.0
    precision, recall = hits / len(mentioned), hits / len(expected)
    return 2 * precision * recall / (precision + recall)


def answer_prefix(item: TaskItem, generated: str) -> float:
    answer, output = normalize(item.answer), normalize(generated)
    return float(output == answer or output.startswith(answer + " "))
