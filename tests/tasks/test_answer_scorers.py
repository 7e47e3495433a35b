"""Answer scorers for a user's JSONL rows (kvlab.core.tasks.ANSWER_SCORERS): each rule on hand-written
outputs, a file whose rows name their own scorers, and the refusals at validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import parse_spec
from kvlab.core.items import TaskItem
from kvlab.core.tasks import ANSWER_SCORERS, TaskSpec
from kvlab.tasks import JsonlTaskError, generate_items, score_item
from kvlab.tasks.jsonl import validate_file
from kvlab.tasks.registry import resolve
from kvlab.tasks.scoring import last_boxed
from tests.tasks.test_tasks import WS


def item(answer: str, scorer: str, **metadata) -> TaskItem:
    return TaskItem(task="jsonl", item_id="jsonl/x", context="c", question="q", answer=answer, context_length=128,
                    depth=None, max_new_tokens=32, metadata={"scorer": scorer, **metadata})


@pytest.mark.parametrize(("scorer", "answer", "output", "score"), [
    ("prefix", "Paris", " Paris, the capital.", 1.0),
    ("prefix", "Paris", " It is Paris.", 0.0),
    ("contains", "Paris", " It is Paris.", 1.0),
    ("contains", "Paris", " Parisian food", 0.0),  # at word boundaries
    ("exact", "Paris", " paris.\nThe capital of France is Paris.", 1.0),  # the first line, normalised
    ("exact", "Paris", " Paris is the capital", 0.0),
    ("numeric", "1234.5", " The total is 1,234.50 dollars", 1.0),
    ("numeric", "0.5", " 0.5000001", 1.0),  # within the default relative tolerance (1e-6, absolute below 1)
    ("numeric", "0.5", " 0.51", 0.0),
    ("numeric", "-3", " x = -3e0", 1.0),
    ("numeric", "42", " no number here", 0.0),
    ("regex", r"^\s*(?:yes|true)\b", " Yes, it is", 0.0),  # a regex is case-sensitive unless it says otherwise
    ("regex", r"(?i)^\s*(?:yes|true)\b", " Yes, it is", 1.0),
    ("choice", "B", " B. Because the others are wrong", 1.0),
    ("choice", "(C)", " The answer is C.", 1.0),
    ("choice", "A", " I think it is (A)", 1.0),  # "I" at the start is a word, not a choice
    ("choice", "A", " B", 0.0),
    ("boxed", "\\frac{1}{2}", " so we get \\boxed{\\frac{1}{2}}.", 1.0),  # nested braces kept
    ("boxed", "0.5", " first \\boxed{3}, finally \\boxed{0.50}", 1.0),  # the last box, equal as numbers
    ("boxed", "3", " first \\boxed{3}, finally \\boxed{4}", 0.0),
    ("boxed", "42", " the answer is 42", 0.0),  # no box: 0, whatever the text says
    ("boxed", "x^2", " \\boxed{x^{2}", 0.0),  # a box never closed holds no answer
    ("f1", "the Eiffel tower", " Eiffel tower in Paris\nmore text",
     pytest.approx(2 * (2 / 4) * (2 / 3) / (2 / 4 + 2 / 3))),
    ("f1", "Eiffel tower", " Louvre", 0.0),
])
def test_each_scorer_on_hand_written_outputs(scorer, answer, output, score):
    assert score_item(item(answer, scorer), output) == score


def test_every_scorer_names_a_function_that_exists():
    assert all(callable(resolve(scorer.function)) for scorer in ANSWER_SCORERS.values())


def test_numeric_tolerance_is_the_rows():
    assert score_item(item("100", "numeric", tolerance=0.05), " 104") == 1.0
    assert score_item(item("100", "numeric", tolerance=0.01), " 104") == 0.0


def test_last_boxed_finds_the_last_closed_box_with_its_braces():
    assert last_boxed("\\boxed{a} then \\boxed{\\sqrt{x^{2}+1}} end") == "\\sqrt{x^{2}+1}"
    assert last_boxed("\\boxed{}") == "" and last_boxed("no box") is None and last_boxed("\\boxed{a{b}") is None


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_rows_name_their_own_scorers_over_the_tasks(tmp_path):
    rows = write_rows(tmp_path / "rows.jsonl", [
        {"context": "Sum: 2 and 3.", "question": "\nTotal:", "answer": "5", "scorer": "numeric"},
        {"context": "Pick.", "question": "\nChoice:", "answer": "c", "scorer": "choice"},  # any case
        {"context": "Math.", "question": "\nSolve:", "answer": "\\frac{1}{2}", "scorer": "boxed"},
        {"context": "City.", "question": "\nIt is", "answer": "Paris"},  # the task's scorer
    ])
    spec = TaskSpec(name="jsonl", path=str(rows), scorer="contains")
    items = generate_items(spec, WS, 0)
    assert [i.metadata["scorer"] for i in items] == ["numeric", "choice", "boxed", "contains"]
    outputs = [" 5.0 in all", " (C)", " \\boxed{\\frac{1}{2}}", " I would say Paris"]
    assert [score_item(i, out) for i, out in zip(items, outputs, strict=True)] == [1.0, 1.0, 1.0, 1.0]
    unset = generate_items(TaskSpec(name="jsonl", path=str(rows)), WS, 0)
    assert unset[3].metadata["scorer"] == "prefix" and score_item(unset[3], " I would say Paris") == 0.0


@pytest.mark.parametrize(("row", "message"), [
    ({"scorer": "fuzzy"}, "unknown scorer 'fuzzy'; known: " + ", ".join(ANSWER_SCORERS)),
    ({"scorer": "numeric", "answer": "five"}, "scorer 'numeric' needs a number as the answer, got 'five'"),
    ({"scorer": "choice", "answer": "maybe"}, "scorer 'choice' needs one letter A-J as the answer"),
    ({"scorer": "regex", "answer": "(unclosed"}, "the answer is not a regular expression"),
    ({"tolerance": 0.1}, "'tolerance' is for the numeric scorer, a number >= 0; got 0.1 with scorer 'prefix'"),
    ({"scorer": "numeric", "answer": "3", "tolerance": -1}, "'tolerance' is for the numeric scorer"),
])
def test_a_row_a_scorer_cannot_read_is_refused_naming_its_line(tmp_path, row, message):
    path = write_rows(tmp_path / "bad.jsonl", [{"context": "c", "question": "q", "answer": "4"},
                                               {"context": "c", "question": "q", "answer": "4"} | row])
    with pytest.raises(JsonlTaskError) as refused:
        validate_file(path)
    assert message in str(refused.value) and ":2:" in str(refused.value)


def test_the_tasks_scorer_is_checked_against_every_row_without_one(tmp_path):
    path = write_rows(tmp_path / "rows.jsonl", [{"context": "c", "question": "q", "answer": "Paris"}])
    with pytest.raises(JsonlTaskError, match="scorer 'numeric' needs a number as the answer, got 'Paris'"):
        validate_file(path, scorer="numeric")


def test_an_unknown_or_misplaced_task_scorer_is_one_line_at_validation(tmp_path):
    path = write_rows(tmp_path / "rows.jsonl", [{"context": "c", "question": "q", "answer": "4"}])
    with pytest.raises(ConfigError) as refused:
        parse_spec({"tasks": [{"name": "jsonl", "path": str(path), "scorer": "fuzzy"}], "configs": [{}]})
    assert str(refused.value) == f"tasks.0.scorer: unknown scorer 'fuzzy'; known: {', '.join(ANSWER_SCORERS)}"
    with pytest.raises(ConfigError, match=r"tasks.0.scorer: the passkey task has no parameter 'scorer' .*; scorer "
                                          r"is a parameter of jsonl"):
        parse_spec({"tasks": [{"name": "passkey", "scorer": "exact"}], "configs": [{}]})
