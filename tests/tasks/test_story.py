"""The story task: a long generation with no reference answer, judged by fidelity alone."""

from __future__ import annotations

from kvlab.core.tasks import TASKS, TaskSpec
from kvlab.tasks import generate_items
from kvlab.tasks.registry import score_item
from kvlab.tasks.story import DEFAULT_MAX_NEW_TOKENS, QUESTION
from tests.store.test_store import make_result
from tests.tasks.test_tasks import WS


def test_story_items_are_long_generations_with_no_score():
    items = generate_items(TaskSpec(name="story", context_lengths=[300], num_items=3), WS, seed=1)
    assert len(items) == 3 and len({item.context for item in items}) == 3
    assert all(item.question == QUESTION and item.max_new_tokens == DEFAULT_MAX_NEW_TOKENS for item in items)
    assert all(score_item(item, "Anne walked on.") is None for item in items)
    assert TASKS["story"].fidelity_only and TASKS["story"].scorer is None


def test_a_story_config_is_judged_by_its_fidelity():
    from kvlab.analysis.summary import decide, summarize
    from kvlab.core.results import Fidelity

    def row(item: int, name: str, kl: float, config: dict):
        fidelity = (None if name == "baseline"
                    else Fidelity((kl,) * 50, (kl < 0.05,) * 50, "the baseline's greedy output"))
        return make_result(f"story-{item}", name, task="story", score=None, config=config,
                           physical_kv_bytes=368_640_000 // (1 if name == "baseline" else 2),
                           extra={} if fidelity is None else {"fidelity": fidelity.to_dict()})

    rows = [row(i, name, kl, config) for i in range(12) for name, kl, config in (
        ("baseline", 0.0, {"quant": "none"}), ("close", 0.001 + i * 1e-4, {"quant": "int8"}),
        ("far", 0.5 + i * 0.01, {"quant": "int2"}))]
    summaries = summarize(rows)
    verdicts = {s.config_name: s.task_verdicts[0] for s in summaries if s.task_verdicts}
    assert verdicts["close"].criterion == "fidelity" and verdicts["close"].accepted
    assert verdicts["far"].accepted is False
    assert decide(summaries).sweet_spot.config_name == "close"
