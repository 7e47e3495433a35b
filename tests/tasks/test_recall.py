"""Passage recall (kvlab.tasks.recall): the items, the in-order score and its shortcuts."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kvlab.core.tasks import TaskSpec
from kvlab.tasks import generate_items, score_item, shortcut_scores
from kvlab.tasks.recall import in_order, recall_score
from tests.tasks.test_tasks import WS


def test_in_order_is_the_longest_common_subsequence():
    assert in_order("a b c d".split(), "a b c d".split()) == 4
    assert in_order("a b c d".split(), "a x c d".split()) == 3
    assert in_order("a b c d".split(), "d c b a".split()) == 1  # the right words in the wrong order
    assert in_order("a b c d".split(), []) == 0
    assert in_order("a b".split(), "a b a b a b a b".split()) == 2  # repeating earns nothing


def test_the_score_is_the_share_of_the_answer_reproduced_in_order():
    answer = "brave anchor, calm badger, cold apple."
    assert recall_score(answer, " Brave anchor, calm badger, cold apple.\nMore") == 1.0  # case and punctuation aside
    assert recall_score(answer, " brave anchor, cold apple") == pytest.approx(4 / 6)  # a pair lost
    assert recall_score(answer, " apple cold, badger calm") == pytest.approx(1 / 6)


@pytest.fixture(scope="module")
def items():
    return generate_items(TaskSpec(name="recall", context_lengths=[512, 1024], depths=[0.2, 0.8], num_items=2), WS, 3)


def test_items_hide_the_passage_and_give_its_opening(items):
    assert [i.item_id for i in items][:2] == ["recall/L512/d0.20/i0", "recall/L512/d0.80/i1"]
    for item in items:
        opening, answer = item.metadata["opening"], item.answer
        assert f"The secret list: {opening}, {answer}" in item.context  # the passage, whole, in the context
        assert item.question.endswith(f"The secret list: {opening},") and answer not in item.question
        assert len(answer.split()) == 48 - 4 and item.stop == ("\n",)
        assert item.metadata["prompt_tokens"] <= item.context_length
        assert score_item(item, " " + answer) == 1.0 and score_item(item, " " + opening) < 0.1
    assert generate_items(TaskSpec(name="recall", context_lengths=[512, 1024], depths=[0.2, 0.8], num_items=2),
                          WS, 3) == items  # the same seed, the same items
    assert len({i.answer for i in items}) == len(items)


def test_a_long_passage_asks_for_hundreds_of_new_tokens():
    item = generate_items(TaskSpec(name="recall", context_lengths=[2048], depths=[0.5], num_items=1,
                                   passage_words=256), WS, 0)[0]
    assert item.max_new_tokens >= 300  # 252 words to write, half as many again in budget
    with pytest.raises(ValidationError, match="multiple of 2"):
        TaskSpec(name="recall", passage_words=47)


def test_shortcuts_score_what_a_list_read_from_nowhere_would(items):
    for item in items:
        shortcuts = shortcut_scores(item)
        assert set(shortcuts) == {"the opening repeated", "the vocabulary in order"}
        assert all(0.0 <= value < 0.35 for value in shortcuts.values()), shortcuts
