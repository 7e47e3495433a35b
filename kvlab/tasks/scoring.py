"""Per-item scores in [0, 1] for generated text.

- passkey, multikey: 1 if the first run of digits in the output is the expected
  number (leading spaces, punctuation or words before it are tolerated; "714321"
  does not match "71432").
- variable_tracking: F1 of the variable names the output mentions (whole words,
  case-insensitive, among the context's variables) against the expected ones: recall
  alone (RULER's) would give full marks for listing every variable of the context.
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


def names_f1(expected_names: list[str], all_names: list[str], generated: str) -> float:
    """F1 of the names in ``all_names`` that ``generated`` mentions, against ``expected_names``."""
    words = set(re.findall(r"[a-z]+", generated.lower()))
    mentioned = {name.lower() for name in all_names} & words
    hits = len(mentioned & {name.lower() for name in expected_names})
    if not hits:
        return 0.0
    precision, recall = hits / len(mentioned), hits / len(expected_names)
    return 2 * precision * recall / (precision + recall)


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
        expected = item.answer.split()
        return names_f1(expected, item.metadata.get("all_names", expected), generated)
    if item.task == "jsonl":
        return prefix_match(item.answer, generated)
    raise ValueError(f"{item.item_id}: no scorer for task {item.task!r}")
