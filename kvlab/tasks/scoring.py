"""Per-item scores in [0, 1] for generated text.

- passkey, multikey: 1 if the first run of digits in the output is the expected
  number (leading spaces, punctuation or words before it are tolerated; "714321"
  does not match "71432").
- variable_tracking: the fraction of expected variable names found in the output
  as whole words, case-insensitive (recall, as in RULER; extra names cost nothing).
- jsonl: 1 if the normalized output starts with the normalized answer at a word
  boundary (exact match is the special case). Normalizing lowercases, turns
  punctuation into spaces and collapses whitespace. A prefix rather than an exact
  match because a completion model keeps writing after the answer.

Perplexity items have no generated text to score: the engine reports their NLL.
"""

from __future__ import annotations

import re
import string

from kvlab.tasks.items import TaskItem

_DIGITS = re.compile(r"\d+")
_PUNCTUATION = re.compile(f"[{re.escape(string.punctuation)}]")


def normalize(text: str) -> str:
    """Lowercase, punctuation to spaces, whitespace collapsed."""
    return " ".join(_PUNCTUATION.sub(" ", text.lower()).split())


def first_number_match(expected: str, generated: str) -> float:
    found = _DIGITS.search(generated)
    return float(found is not None and found.group() == expected)


def names_recalled(expected_names: list[str], generated: str) -> float:
    words = set(re.findall(r"[a-z]+", generated.lower()))
    return sum(name.lower() in words for name in expected_names) / len(expected_names)


def prefix_match(expected: str, generated: str) -> float:
    answer, output = normalize(expected), normalize(generated)
    return float(output == answer or output.startswith(answer + " "))


def score_item(item: TaskItem, generated: str) -> float:
    """Score ``generated`` (the model's output after the prompt) against ``item``."""
    if item.kind == "perplexity":
        raise ValueError(
            f"{item.item_id}: perplexity items are not scored from generated text; "
            "use the continuation NLL the engine reports"
        )
    if item.task in ("passkey", "multikey"):
        return first_number_match(item.answer, generated)
    if item.task == "variable_tracking":
        return names_recalled(item.answer.split(), generated)
    if item.task == "jsonl":
        return prefix_match(item.answer, generated)
    raise ValueError(f"{item.item_id}: no scorer for task {item.task!r}")
