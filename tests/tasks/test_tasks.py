"""Task generators, scorers and TaskSpec validation (kvlab.tasks)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from kvlab.core.items import TaskItem
from kvlab.core.tasks import STORED, MultikeyParams, NeedleParams, RecallParams, TaskSpec, VariableTrackingParams
from kvlab.models.checkpoints import model_dir
from kvlab.tasks import ContextTooShortError, JsonlTaskError, count_tokens, generate_items, score_item
from kvlab.tasks.haystack import HAYSTACK_FILE, load_haystack
from kvlab.tasks.multikey import needle_text as multikey_needle
from kvlab.tasks.passkey import needle_text as passkey_needle

SMOLLM2_DIR = model_dir("smollm2-135m")  # honours KVLAB_HOME
SYNTHETIC = ["passkey", "multikey", "variable_tracking", "perplexity"]


class WhitespaceTokenizer:
    """One token per whitespace-separated word: enough to test the fitting logic."""

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[str]]:
        return {"input_ids": text.split()}


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    assert (SMOLLM2_DIR / "tokenizer_config.json").exists(), \
        f"SmolLM2 is not pulled at {SMOLLM2_DIR}: run `kvlab models pull smollm2-135m`"
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(SMOLLM2_DIR)


@pytest.fixture(params=["whitespace", "smollm2"])
def tokenizer(request):
    if request.param == "whitespace":
        return WhitespaceTokenizer()
    return request.getfixturevalue("smollm2_tokenizer")


WS = WhitespaceTokenizer()


# --- determinism -------------------------------------------------------------------


@pytest.mark.parametrize("name", SYNTHETIC)
def test_same_seed_same_items_different_seed_different_items(name):
    spec = TaskSpec(name=name, context_lengths=[256], num_items=3)
    first = generate_items(spec, WS, seed=7)
    assert first == generate_items(spec, WS, seed=7)
    other = generate_items(spec, WS, seed=8)
    assert [i.item_id for i in first] == [i.item_id for i in other]
    assert all(a.context != b.context for a, b in zip(first, other, strict=True))


def test_an_item_does_not_depend_on_how_many_items_are_asked_for():
    few = generate_items(TaskSpec(name="passkey", num_items=2, context_lengths=[256]), WS, 1)
    many = generate_items(TaskSpec(name="passkey", num_items=6, context_lengths=[256]), WS, 1)
    assert few == many[:2]


def test_item_ids_are_unique_and_depths_round_robin():
    spec = TaskSpec(
        name="passkey", context_lengths=[256, 512], depths=[0.0, 0.25, 1.0], num_items=4
    )
    items = generate_items(spec, WS, 0)
    assert len({i.item_id for i in items}) == len(items) == 8
    assert [i.depth for i in items[:4]] == [0.0, 0.25, 1.0, 0.0]
    assert items[1].item_id == "passkey/L256/d0.25/i1"


# --- lengths -------------------------------------------------------------------------


@pytest.mark.parametrize("name", SYNTHETIC)
@pytest.mark.parametrize("length", [1024, 4096])
def test_prompt_length_within_two_percent_of_target(tokenizer, name, length):
    spec = TaskSpec(name=name, context_lengths=[length], num_items=2)
    for item in generate_items(spec, tokenizer, 3):
        measured = count_tokens(tokenizer, item.context) + count_tokens(tokenizer, item.question)
        assert measured == item.metadata["prompt_tokens"]
        assert 0.98 * length <= measured <= length
        assert item.context_length == length


def test_shortest_length_is_within_a_word_of_target(tokenizer):
    for item in generate_items(
        TaskSpec(name="passkey", context_lengths=[128], num_items=3), tokenizer, 0
    ):
        assert 124 <= item.metadata["prompt_tokens"] <= 128


def test_too_short_context_for_the_fixed_parts_is_a_clear_error():
    spec = TaskSpec(name="multikey", context_lengths=[128], num_pairs=20, num_items=1)
    with pytest.raises(ContextTooShortError, match="128 tokens is too short"):
        generate_items(spec, WS, 0)


# --- needles ---------------------------------------------------------------------


def test_passkey_needle_once_at_its_depth(tokenizer):
    spec = TaskSpec(name="passkey", context_lengths=[2048], num_items=3)
    for item in generate_items(spec, tokenizer, 5):
        assert re.fullmatch(r"\d{5}", item.answer)
        assert item.context.count(passkey_needle(item.answer)) == 1
        assert item.context.count(item.answer) == 2  # twice inside the needle, nowhere else
        assert abs(item.metadata["needle_token_depth"] - item.depth) < 0.05
        assert item.question == "\nWhat is the pass key? The pass key is"
        assert item.context.startswith("There is an important info hidden")
        assert item.kind == "generate" and item.max_new_tokens == 10


def test_multikey_pairs_once_each_and_query_matches_answer():
    spec = TaskSpec(name="multikey", context_lengths=[1024], num_pairs=6, num_items=3)
    for item in generate_items(spec, WS, 2):
        pairs = re.findall(
            r"The special magic number for ([a-z]+-[a-z]+) is: (\d{7})\.", item.context
        )
        assert len(pairs) == 6 and len(dict(pairs)) == 6
        assert len({value for _, value in pairs}) == 6
        key = item.metadata["key"]
        assert dict(pairs)[key] == item.answer
        assert item.context.count(multikey_needle(key, item.answer)) == 1
        assert key in item.question and item.question.endswith("mentioned in the provided text is")
        # depth is a fraction of the haystack's words: each distractor placed before the target
        # (about 17 tokens of 1024) pushes its token depth a little further
        assert abs(item.metadata["needle_token_depth"] - item.depth) < 0.03 + 0.02 * item.metadata["target_rank"]


def test_variable_tracking_chain_in_order_and_answer_is_all_names():
    spec = TaskSpec(name="variable_tracking", context_lengths=[1024], num_chains=2, num_hops=3)
    for item in generate_items(spec, WS, 4):
        names = item.answer.split()
        value = item.metadata["value"]
        assert len(names) == 4
        assert item.context.count(value) == 1
        statements = [f"VAR {names[0]} = {value}."] + [
            f"VAR {b} = VAR {a}." for a, b in zip(names, names[1:], strict=False)
        ]
        positions = [item.context.index(s) for s in statements]
        assert positions == sorted(positions)
        assert len(re.findall(r"VAR [A-Z]{5} =", item.context)) == 8  # two chains
        assert f"4 variables are assigned the value {value}" in item.question


def test_perplexity_continuation_follows_the_context_and_is_held_out(tokenizer):
    spec = TaskSpec(name="perplexity", context_lengths=[512], continuation_tokens=32, num_items=3)
    text = " ".join(load_haystack().words)
    for item in generate_items(spec, tokenizer, 9):
        assert item.kind == "perplexity" and item.question == "" and item.max_new_tokens == 0
        assert item.continuation.startswith(" ")
        assert item.continuation.strip() not in item.context
        assert (item.context + item.continuation) in text
        assert 28 <= count_tokens(tokenizer, item.continuation) <= 32


def test_haystack_is_long_public_prose_without_digits():
    text = HAYSTACK_FILE.read_text(encoding="utf-8")
    assert len(text) > 40_000
    assert not re.search(r"\d", text)  # numeric answers must come only from needles


# --- jsonl -------------------------------------------------------------------------


def _write(tmp_path: Path, lines: list[str]) -> str:
    path = tmp_path / "items.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_jsonl_items_in_file_order_with_measured_length(tmp_path):
    rows = [
        {
            "context": "Paris is the capital of France.",
            "question": "\nQ: capital? A:",
            "answer": "Paris",
            "id": "a",
        },
        {"context": "Two plus two is four.", "question": "\nSum:", "answer": "four", "source": "x"},
    ]
    path = _write(tmp_path, [json.dumps(r) for r in rows] + [""])
    items = generate_items(TaskSpec(name="jsonl", path=path), WS, 0)
    assert [i.item_id for i in items] == ["jsonl/a", "jsonl/line2"]
    assert items[0].context_length == 6 + 3 and items[0].metadata["prompt_tokens"] == 9
    assert items[1].metadata["source"] == "x" and items[1].metadata["line"] == 2
    capped = generate_items(TaskSpec(name="jsonl", path=path, num_items=1), WS, 0)
    assert len(capped) == 1


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            ['{"context": "c", "question": "q", "answer": "a"}', "{oops"],
            r"items\.jsonl:2: not valid JSON",
        ),
        (['{"context": "c", "answer": "a"}'], r":1: missing key\(s\) \['question'\]"),
        (
            ['{"context": "c", "question": "q", "answer": 3}'],
            r":1: 'answer' must be a non-empty string",
        ),
        (["[1, 2]"], r":1: expected a JSON object, got an array"),
        (
            ['{"context": "c", "question": "q", "answer": "a", "id": 1}'] * 2,
            r":2: duplicate id '1' \(first on line 1\)",
        ),
        (['{"context": "c", "question": "q", "answer": "..."}'], r":1: 'answer' has no letters"),
        ([""], r"no items"),
    ],
)
def test_jsonl_errors_name_the_line(tmp_path, lines, message):
    path = _write(tmp_path, lines)
    with pytest.raises(JsonlTaskError, match=message):
        generate_items(TaskSpec(name="jsonl", path=path), WS, 0)


def test_jsonl_missing_file(tmp_path):
    with pytest.raises(JsonlTaskError, match="no such file"):
        generate_items(TaskSpec(name="jsonl", path=str(tmp_path / "nope.jsonl")), WS, 0)


# --- spec validation --------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"name": "passkey", "context_length": [1024]},
            r"the passkey task has no parameter 'context_length' \(its own: depths; every task's: context_lengths, "
            r"num_items, max_new_tokens\); did you mean 'context_lengths'\?",
        ),
        (
            {"name": "needle"},
            r"name\n\s+Value error, unknown task 'needle'; known: passkey, multikey, variable_tracking, recall, "
            r"story, perplexity, jsonl",
        ),
        (
            {"name": "passkey", "context_lengths": [64]},
            r"context_lengths\n.*128\.\.131072 tokens, got \[64\]",
        ),
        ({"name": "passkey", "context_lengths": []}, r"context_lengths\n.*at least 1 item"),
        ({"name": "passkey", "depths": [0.5, 1.5]}, r"depths\n.*\[0, 1\], got \[1\.5\]"),
        ({"name": "multikey", "num_pairs": 1}, r"num_pairs\n.*greater than or equal to 2"),
        ({"name": "passkey", "num_items": 0}, r"num_items\n.*greater than or equal to 1"),
        ({"name": "jsonl"}, r"the jsonl task needs `path`: A JSONL file with one"),
        ({"name": "passkey", "path": "x.jsonl"}, r"path is a parameter of jsonl: remove it, or set name = 'jsonl'"),
        ({"name": "passkey", "num_pairs": 8}, r"the passkey task has no parameter 'num_pairs'"),
        ({"name": "variable_tracking", "depths": [0.5]}, r"depths is a parameter of passkey and multikey and recall"),
    ],
)
def test_spec_errors_name_the_field_and_allowed_values(fields, message):
    with pytest.raises(ValidationError, match=message):
        TaskSpec(**fields)


def test_spec_defaults():
    spec = TaskSpec(name="multikey")
    assert spec.context_lengths == [1024] and spec.params_as(MultikeyParams).depths == [0.1, 0.5, 0.9]
    assert (spec.items_per_length, spec.params_as(MultikeyParams).num_pairs) == (10, 4)
    assert spec.params_as(NeedleParams) is spec.params  # a base of its model: what code outside the task reads
    tracking = TaskSpec(name="variable_tracking").params_as(VariableTrackingParams)
    assert (tracking.num_chains, tracking.num_hops) == (4, 4)
    assert spec.num_items is None  # unset stays unset through a JSON round trip (test_spec_round_trip)
    with pytest.raises(TypeError, match="the multikey task's parameters are MultikeyParams, not RecallParams"):
        spec.params_as(RecallParams)


def test_a_spec_an_older_kvlab_wrote_reads_as_it_did():
    """Every task's table held every task's parameters: at their old defaults they are dropped; from the store
    (kvlab wrote it, and the task ignored them) at any value."""
    old = {"name": "variable_tracking", "context_lengths": [512], "depths": [0.1, 0.5, 0.9], "num_items": 2,
           "num_pairs": 4, "num_chains": 3, "num_hops": 2, "continuation_tokens": 64, "passage_words": 48,
           "questions_per_context": 1, "multi_turn": False, "path": None, "max_new_tokens": None, "scorer": None}
    assert TaskSpec.model_validate(old) == TaskSpec(name="variable_tracking", context_lengths=[512], num_items=2,
                                                    num_chains=3, num_hops=2)
    edited = old | {"depths": [0.5], "num_pairs": 12}  # the old form sent its depths and pairs to every task
    with pytest.raises(ValidationError, match="the variable_tracking task has no parameter 'depths'"):
        TaskSpec.model_validate(edited)
    assert TaskSpec.model_validate(edited, context={STORED: True}) == TaskSpec.model_validate(old)


# --- scoring --------------------------------------------------------------------------


def _item(task: str, answer: str, kind: str = "generate") -> TaskItem:
    return TaskItem(
        task=task,
        item_id=f"{task}/x",
        context="",
        question="",
        answer=answer,
        context_length=128,
        depth=None,
        max_new_tokens=8,
        kind=kind,
    )


@pytest.mark.parametrize(
    ("generated", "score"),
    [
        (" 71432.", 1.0),
        ("71432", 1.0),
        (": 71432 is the key", 1.0),
        (" **71432**", 1.0),
        (" the key: 71432", 1.0),
        (" 714321", 0.0),
        (" 7143", 0.0),
        (" 12345 or 71432", 0.0),
        ("", 0.0),
    ],
)
def test_number_scoring_takes_the_first_number(generated, score):
    assert score_item(_item("passkey", "71432"), generated) == score
    assert score_item(_item("multikey", "71432"), generated) == score


def test_variable_tracking_scores_f1_of_whole_names():
    item = _item("variable_tracking", "ABCDE FGHIJ KLMNO PQRST")
    item.metadata["all_names"] = ["ABCDE", "FGHIJ", "KLMNO", "PQRST", "XYZAB", "QQQQQ", "WWWWW", "EEEEE"]
    assert score_item(item, " VAR ABCDE, VAR FGHIJ, VAR KLMNO, VAR PQRST") == 1.0
    # 2 of 4 expected and 1 extra: precision 2/3, recall 1/2, F1 = 2 (1/3) / (7/6) = 4/7
    assert score_item(item, " abcde, FGHIJ and XYZAB") == pytest.approx(4 / 7)
    assert score_item(item, " ABCDEF") == 0.0
    # every variable of the context: precision 4/8, recall 1, F1 = 2/3 (recall alone gave 1.0)
    assert score_item(item, " ".join(item.metadata["all_names"])) == pytest.approx(2 / 3)


def test_multikey_shortcuts_are_independent_of_depth(tokenizer):
    from kvlab.tasks.multikey import shortcut_scores

    spec = TaskSpec(name="multikey", context_lengths=[256], depths=[0.0, 1.0], num_pairs=4, num_items=40)
    items = generate_items(spec, tokenizer, 3)
    for item in items:
        assert re.findall(r"is: (\d{7})\.", item.context) == item.metadata["numbers_in_order"]
    for depth in (0.0, 1.0):
        at = [shortcut_scores(i) for i in items if i.depth == depth]
        # before: the target was first at depth 0 and last at depth 1 on nearly every item
        assert sum(s["first number"] for s in at) < 12 and sum(s["last number"] for s in at) < 12


@pytest.mark.parametrize(
    ("answer", "generated", "score"),
    [
        ("Paris", " paris", 1.0),
        ("Paris", " Paris. It is in France", 1.0),
        ("New  York", "new york!", 1.0),
        ("Paris", " Parisian", 0.0),
        ("Paris", " It is Paris", 0.0),
        ("U.S.A.", " u s a", 1.0),
    ],
)
def test_jsonl_scoring_is_normalized_prefix_match(answer, generated, score):
    assert score_item(_item("jsonl", answer), generated) == score


def test_scoring_a_perplexity_item_is_an_error():
    with pytest.raises(ValueError, match="perplexity items are not scored"):
        score_item(_item("perplexity", "", kind="perplexity"), "anything")
