"""One context, many questions: the items (multikey, jsonl rows sharing a ``context_id``), what a spec
refuses, the report's table per question rank; on the real model, that a shared context answers every
question as evaluating each alone would, and charges the prefill once."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from kvlab.core.experiment_spec import ExperimentSpec
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.tasks import TaskSpec
from kvlab.tasks import generate_items
from kvlab.tasks.jsonl import JsonlTaskError
from kvlab.tasks.registry import planned_items
from tests.store.test_store import make_result
from tests.tasks.test_tasks import WS


def test_multikey_asks_each_context_for_several_keys():
    tokenizer = WS
    one = generate_items(TaskSpec(name="multikey", context_lengths=[256], num_items=2), tokenizer, seed=5)
    spec = TaskSpec(name="multikey", context_lengths=[256], num_items=2, questions_per_context=3)
    shared = generate_items(spec, tokenizer, seed=5)
    assert len(shared) == planned_items(spec) == 6
    for first, group in zip(one, (shared[:3], shared[3:]), strict=True):
        assert {item.context_id for item in group} == {first.item_id}
        assert [item.question_rank for item in group] == [0, 1, 2]
        assert len({item.context for item in group}) == 1 and group[0].context == first.context
        # the first question is the one-question item's; the others ask for other keys of the context
        assert (group[0].question, group[0].answer, group[0].depth) == (first.question, first.answer, first.depth)
        assert len({item.answer for item in group}) == 3
        assert all(item.answer in item.context and item.depth is None for item in group[1:])
    assert one[0].context_id is None  # one question: items as before


def test_a_spec_refuses_shared_contexts_it_cannot_honour():
    with pytest.raises(ValidationError, match="the passkey task has no parameter 'questions_per_context' .*; "
                                              "questions_per_context is a parameter of multikey and jsonl"):
        TaskSpec(name="passkey", questions_per_context=2)
    with pytest.raises(ValidationError, match="need as many keys"):
        TaskSpec(name="multikey", questions_per_context=5, num_pairs=4)
    with pytest.raises(ValidationError, match="needs questions_per_context above 1"):
        TaskSpec(name="multikey", multi_turn=True)
    with pytest.raises(ValidationError, match="a conversation .* runs on the embedded engine"):
        ExperimentSpec(name="x", tasks=[{"name": "multikey", "questions_per_context": 2, "multi_turn": True}],
                       backend={"kind": "openai_compat", "base_url": "http://127.0.0.1:8000/v1", "model_id": "m"},
                       configs=[KVCacheConfig()])
    with pytest.raises(ValidationError, match="compressed once, before any of them"):
        ExperimentSpec(name="x", tasks=[{"name": "multikey", "questions_per_context": 2}],
                       configs=[KVCacheConfig(evict="snapkv", ratio=0.5, query_aware=True)])


def _rows(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_jsonl_rows_that_share_a_context_id_share_their_context(tmp_path):
    tokenizer = WS
    context = "The vault code is 4417. The gate code is 9921. "
    path = _rows(tmp_path / "shared.jsonl", [
        {"context": context, "question": "Vault code:", "answer": "4417", "context_id": "doc"},
        {"context": "Alone here. ", "question": "Word:", "answer": "alone"},
        {"context": context, "question": "Gate code:", "answer": "9921", "context_id": "doc"},
    ])
    items = generate_items(TaskSpec(name="jsonl", path=path, questions_per_context=2), tokenizer, seed=0)
    assert [(i.context_id, i.question_rank) for i in items] == [("jsonl/doc", 0), (None, 0), ("jsonl/doc", 1)]
    # one question per context: the rows stand alone, the id stays in the metadata
    alone = generate_items(TaskSpec(name="jsonl", path=path), tokenizer, seed=0)
    assert {i.context_id for i in alone} == {None} and alone[0].metadata["context_id"] == "doc"
    other = _rows(tmp_path / "other.jsonl", [
        {"context": context, "question": "Vault code:", "answer": "4417", "context_id": "doc"},
        {"context": context + "More.", "question": "Gate code:", "answer": "9921", "context_id": "doc"},
    ])
    with pytest.raises(JsonlTaskError, match=r"other\.jsonl:2: context_id 'doc' has another context than on "
                                             r"line 1"):
        generate_items(TaskSpec(name="jsonl", path=other, questions_per_context=2), tokenizer, seed=0)
    crowded = _rows(tmp_path / "crowded.jsonl", [
        {"context": context, "question": f"Q{i}:", "answer": "4417", "context_id": 7} for i in range(3)])
    with pytest.raises(JsonlTaskError, match=r"crowded\.jsonl:3: context_id '7' has more than "
                                             r"questions_per_context = 2 rows \(from line 1\)"):
        generate_items(TaskSpec(name="jsonl", path=crowded, questions_per_context=2), tokenizer, seed=0)


def test_the_report_gives_accuracy_per_question_rank():
    from kvlab.experiments.report import rank_table

    def shared(rank: int, name: str, score: float):
        return make_result(f"multikey-0/q{rank}", name, task="multikey", score=score, extra={
            "shared_context": {"context_id": "multikey-0", "rank": rank, "questions": 2, "multi_turn": False,
                               "prefill_charged": rank == 0}})

    table = rank_table([shared(0, "baseline", 1.0), shared(1, "baseline", 1.0), shared(0, "snapkv", 1.0),
                        shared(1, "snapkv", 0.0)], "baseline")
    header, _, baseline, snapkv = table.splitlines()
    assert "question 1" in header and "question 2" in header
    assert snapkv.split()[0] == "snapkv" and "1.00 /" in snapkv and "0.00 /" in snapkv
    assert rank_table([make_result()], "baseline") == ""


@pytest.mark.model
@pytest.mark.parametrize("multi_turn", [False, True])
def test_a_shared_context_is_prefilled_once_and_answers_as_alone(engine, multi_turn):
    spec = TaskSpec(name="multikey", context_lengths=[384], num_items=1, questions_per_context=3,
                    multi_turn=multi_turn)
    items = generate_items(spec, engine.tokenizer, seed=2)
    configs = [KVCacheConfig(), KVCacheConfig(evict="knorm", ratio=0.5), KVCacheConfig(quant="int4")]
    shared = list(engine.evaluate_many([(item, configs) for item in items]))
    assert len(shared) == 9
    for item, result in shared:
        context = result.extra["shared_context"]
        assert context["rank"] == item.question_rank and context["prefill_charged"] == (item.question_rank == 0)
        if item.question_rank > 0:  # charged to the first question
            assert result.prefill_s == result.compress_s == 0.0 and result.ttft_s == result.first_token_s
    first = {r.config_name: r for item, r in shared if item.question_rank == 0}
    assert all(r.prefill_s > 0 for r in first.values())
    if not multi_turn:
        # each question starts from the compressed context: as if it were evaluated alone
        alone = {(item.item_id, r.config_name): r.generated for item in items for r in engine.evaluate(item, configs)}
        assert {(item.item_id, r.config_name): r.generated for item, r in shared} == alone
        assert all(r.fidelity is not None for _, r in shared if r.config_name != "baseline")
    else:
        # a conversation: the cache holds every earlier question and answer
        last = {r.config_name: r for item, r in shared if item.question_rank == 2}
        for _name, result in last.items():
            before = sum(len(engine._encode(i.question, special=False)) for i in items)
            assert result.extra["generation_kv"]["final_tokens"] >= 384 - 10 + before
