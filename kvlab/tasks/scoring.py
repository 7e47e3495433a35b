"""Scorers: a model's generated text against one item, a score in [0, 1].

Each task's entry in :data:`kvlab.tasks.registry.TASKS` names its scorer:

- :func:`first_number` (passkey, multikey): 1 if the first run of digits in the output is the
  expected number (leading spaces, punctuation or words before it are tolerated; "714321"
  does not match "71432").
- :func:`variable_names` (variable_tracking): F1 of the variable names the output mentions (whole
  words, case-insensitive, among the context's variables) against the expected ones: recall
  alone (RULER's) would give full marks for listing every variable of the context.
- :func:`user_answer` (jsonl): the row's answer scorer (its ``scorer`` key, else the task's, else
  ``prefix``): one of :data:`kvlab.core.tasks.ANSWER_SCORERS`, implemented below.  ``prefix``
  (:func:`answer_prefix`) is 1 if the normalized output starts with the normalized answer at a word
  boundary (exact match is the special case); a prefix rather than an exact match because a
  completion model keeps writing after the answer.  Normalizing lowercases, turns punctuation into
  spaces and collapses whitespace.

Perplexity items have no generated text to score: the engine reports their NLL.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable

import regex

from kvlab.core.items import TaskItem
from kvlab.core.tasks import ANSWER_SCORERS, DEFAULT_ANSWER_SCORER
from kvlab.tasks.registry import resolve

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


# -- a user's answers (jsonl): the answer scorers of kvlab.core.tasks.ANSWER_SCORERS ------------------

#: A number as people and models write it: a sign, thousands separators, decimals, an exponent.
NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+(?:[eE][-+]?\d+)?")
#: Where a choice letter is read, in this order: after "answer" ("The answer is B", "Answer: (C)"), at
#: the output's start ("B", " (B)", "B. because", "C because"), then the first "(X)" anywhere.  "A" and
#: "I" are English words too: at the start they count only before punctuation or the line's end, so
#: "I think ..." and "A good guess ..." are not read as choices.
_CHOICES = (re.compile(r"answer(?:\s+is)?\s*[:\-]?\s*\(?([A-J])\b", re.IGNORECASE),
            re.compile(r"^\s*\(?(?:([B-HJ])(?:[).:,]|\s|$)|([AI])(?:[).:,]|[ \t]*(?:\n|$)))"),
            re.compile(r"\(([A-J])\)"))
DEFAULT_TOLERANCE = 1e-6


def user_answer(item: TaskItem, generated: str) -> float:
    """A jsonl row's score by its answer scorer (``metadata["scorer"]``, set when the items are made)."""
    name = item.metadata.get("scorer") or DEFAULT_ANSWER_SCORER
    return resolve(ANSWER_SCORERS[name].function)(item, generated)


def first_line(text: str) -> str:
    """The first line of ``text`` with something on it ("" for blank text)."""
    return next((line for line in text.splitlines() if line.strip()), "")


def parse_number(text: str) -> float | None:
    """A number as written (``1,234.5``, ``-3e-2``), or None."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def answer_contained(item: TaskItem, generated: str) -> float:
    return float(f" {normalize(item.answer)} " in f" {normalize(generated)} ")


def answer_exact(item: TaskItem, generated: str) -> float:
    return float(normalize(first_line(generated)) == normalize(item.answer))


def answer_numeric(item: TaskItem, generated: str) -> float:
    found = NUMBER.search(generated)
    expected = parse_number(item.answer.strip())
    if found is None or expected is None:
        return 0.0
    got = parse_number(found.group())
    return float(got is not None and _close(got, expected, float(item.metadata.get("tolerance", DEFAULT_TOLERANCE))))


def _close(got: float, expected: float, tolerance: float) -> bool:
    """Equal within ``tolerance`` relative to the expected value (absolute below 1)."""
    return abs(got - expected) <= tolerance * max(1.0, abs(expected))


#: The longest a regex answer may search one output.  The ``regex`` module stops a backtracking search at its
#: timeout and releases the GIL while it runs (``concurrent``), so a pattern such as ``(a|aa)+b`` costs its item
#: one second and an error, never a hung worker whose heartbeats stop (Python's ``re`` has no such bound).
REGEX_TIMEOUT_S = 1.0


class ScoringError(ValueError):
    """An output that its item's scorer could not score within its bounds: that item's error, not the run's."""


def compile_answer_regex(answer: str) -> regex.Pattern[str]:
    """A regex answer compiled as the scorer runs it (raises ``regex.error`` for one that does not compile)."""
    return regex.compile(answer)


def answer_regex(item: TaskItem, generated: str) -> float:
    try:
        found = compile_answer_regex(item.answer).search(generated, timeout=REGEX_TIMEOUT_S, concurrent=True)
    except TimeoutError:
        raise ScoringError(f"the regex answer {item.answer[:60]!r} searched this output for over "
                           f"{REGEX_TIMEOUT_S:g} s (nested repetition backtracks): write it without nested "
                           "quantifiers such as (.*.){6}") from None
    return float(found is not None)


def choice_letter(text: str) -> str | None:
    """The choice letter an output gives (A-J), or None."""
    for pattern in _CHOICES:
        if found := pattern.search(text):
            return next(letter for letter in found.groups() if letter)
    return None


def answer_choice(item: TaskItem, generated: str) -> float:
    return float(choice_letter(generated) == item.answer.strip().strip("()").upper())


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` of ``text``, its nested braces kept; None without one
    (or with one never closed)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for index in range(begin - 1, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return text[begin:index]
    return None


def answer_boxed(item: TaskItem, generated: str) -> float:
    boxed = last_boxed(generated)
    if boxed is None:
        return 0.0
    if normalize(boxed) == normalize(item.answer) or boxed.replace(" ", "") == item.answer.replace(" ", ""):
        return 1.0
    got, expected = parse_number(boxed.strip()), parse_number(item.answer.strip())
    return float(got is not None and expected is not None and _close(got, expected, DEFAULT_TOLERANCE))


def answer_f1(item: TaskItem, generated: str) -> float:
    predicted, expected = normalize(first_line(generated)).split(), normalize(item.answer).split()
    common = sum((Counter(predicted) & Counter(expected)).values())  # linear: a 120,000-word answer takes ms
    if not common:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)
