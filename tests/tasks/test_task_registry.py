"""The task registry (kvlab.tasks.registry): its entries are consistent, and an entry is all a new task needs.

The end-to-end test registers a task that exists nowhere in kvlab ("echo": random words, the answer is
the last one, its functions in this module) with nothing but an entry in ``TASKS``, and runs it through
the embedded engine on the default model: spec validation, item generation and counting, the engine,
scoring, shortcuts and the report all take it from the entry.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import parse_spec
from kvlab.core.items import TaskItem
from kvlab.core.tasks import COMMON_FIELDS, TASKS, Task, TaskParams, TaskSpec
from kvlab.experiments.report import render
from kvlab.experiments.runner import run_experiment
from kvlab.tasks import generate_items, planned_items, score_item
from kvlab.tasks.haystack import fit_to_length, item_slots
from kvlab.tasks.registry import resolve
from tests.tasks.test_tasks import WS

WORDS = ("apple", "river", "stone", "cloud", "garden", "violin", "lantern", "meadow")
QUESTION = "\nThe last word of the text above is"


def echo_items(spec: TaskSpec, tokenizer, seed: int) -> list[TaskItem]:
    """Random words fitted to each context length; the answer is the last of them."""
    items = []
    for slot in item_slots("echo", spec.context_lengths, spec.items_per_length, seed):
        words = [slot.rng.choice(WORDS) for _ in range(slot.length)]
        fitted = fit_to_length(tokenizer, slot.length, QUESTION, lambda n, words=words: " ".join(words[:n + 1]))
        items.append(TaskItem(
            task="echo", item_id=slot.item_id, context=fitted.context, question=QUESTION,
            answer=words[fitted.n_words], context_length=slot.length, depth=None,
            max_new_tokens=spec.max_new_tokens or 4, metadata={"prompt_tokens": fitted.prompt_tokens},
        ))
    return items


def mentions_answer(item: TaskItem, generated: str) -> float:
    return float(item.answer in generated.lower())


def first_word(item: TaskItem) -> dict[str, float]:
    return {"first word": float(item.context.split()[0] == item.answer)}


HERE = __name__  # the entry names this module's functions, as kvlab's own entries name theirs
ECHO = Task("echo", f"{HERE}:echo_items", scorer=f"{HERE}:mentions_answer",
            chance_floor=f"1/{len(WORDS)} (any word of the vocabulary)", shortcuts=f"{HERE}:first_word")


@pytest.fixture
def echo(monkeypatch) -> Task:
    monkeypatch.setitem(TASKS, "echo", ECHO)
    return ECHO


# --- the entries ----------------------------------------------------------------------------


def test_the_spec_schema_lists_the_registry():
    assert tuple(TASKS) == ("passkey", "multikey", "variable_tracking", "recall", "story", "perplexity", "jsonl")
    assert TaskSpec.model_json_schema()["properties"]["name"]["enum"] == list(TASKS)


@pytest.mark.parametrize("name", [n for n, t in TASKS.items() if not t.reads_file])
def test_every_generated_task_makes_items_of_its_kind_and_counts_them(name):
    task = TASKS[name]
    spec = TaskSpec(name=name, context_lengths=[1024], num_items=2)
    items = generate_items(spec, WS, 0)
    assert len(items) == planned_items(spec) == 2
    assert {item.kind for item in items} == {task.kind} and {item.task for item in items} == {name}
    assert not COMMON_FIELDS & set(task.params.model_fields)


def test_an_entry_that_contradicts_itself_is_refused_at_once():
    class Clashing(TaskParams):
        num_items: int = 3

    with pytest.raises(ValueError, match=r"task 'x': \['num_items'\] are every task's fields, not parameters"):
        Task("x", ECHO.generate, scorer=ECHO.scorer, chance_floor="0", params=Clashing)
    with pytest.raises(ValueError, match="task 'x': params must be a TaskParams model"):
        Task("x", ECHO.generate, scorer=ECHO.scorer, chance_floor="0", params=dict)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="perplexity items and fidelity-only tasks, and only they, have no scorer"):
        Task("x", ECHO.generate, scorer=None, chance_floor="0")
    with pytest.raises(ValueError, match="perplexity items and fidelity-only tasks, and only they, have no scorer"):
        Task("x", ECHO.generate, scorer=ECHO.scorer, chance_floor="0", kind="perplexity")
    with pytest.raises(ValueError, match=r"task 'x': \['echo_items'\] are not 'module:function' references"):
        Task("x", "echo_items", scorer=ECHO.scorer, chance_floor="0")


def test_every_entry_names_functions_that_exist():
    for task in TASKS.values():
        for reference in (task.generate, task.scorer, task.shortcuts, task.count_items):
            assert reference is None or callable(resolve(reference)), (task.name, reference)


def test_an_unknown_name_is_one_line_naming_every_registered_task(echo):
    with pytest.raises(ConfigError) as refused:
        parse_spec({"name": "e", "tasks": [{"name": "passkey"}, {"name": "echoo"}],
                    "configs": [{"name": "int4", "quant": "int4"}]})
    assert str(refused.value) == ("tasks.1.name: unknown task 'echoo'; known: passkey, multikey, variable_tracking, "
                                  "recall, story, perplexity, jsonl, echo")


def test_only_a_task_that_reads_a_file_takes_a_path(echo):
    with pytest.raises(ValidationError, match=r"the echo task has no parameter 'path' \(its own: none; every task's: "
                                              r"context_lengths, num_items, max_new_tokens\); path is a parameter of "
                                              r"jsonl: remove it, or set name = 'jsonl'"):
        TaskSpec(name="echo", path="items.jsonl")


def test_scoring_an_item_of_an_unregistered_task_is_an_error():
    item = TaskItem(task="echo", item_id="echo/x", context="", question="", answer="a", context_length=128,
                    depth=None, max_new_tokens=4)
    with pytest.raises(ValueError, match="echo/x: no scorer for task 'echo'"):
        score_item(item, "a")


# --- a new task is one entry ---------------------------------------------------------------


@pytest.mark.model
def test_a_task_added_by_one_entry_runs_end_to_end(echo, engine):
    spec = parse_spec({
        "name": "echo-e2e", "seed": 3,
        "tasks": [{"name": "echo", "context_lengths": [256], "num_items": 2}],
        "configs": [{"name": "baseline"}, {"name": "int4", "quant": "int4"}],
    })
    assert planned_items(spec.tasks[0]) == 2
    items = generate_items(spec.tasks[0], engine.tokenizer, spec.seed)
    assert [i.item_id for i in items] == ["echo/L256/i0", "echo/L256/i1"]
    assert all(i.metadata["prompt_tokens"] <= 256 and i.answer in WORDS for i in items)

    run = run_experiment(spec, engine=engine)
    assert [(r.task, r.config_name) for r in run.results] == \
        [("echo", "baseline"), ("echo", "int4"), ("echo", "baseline"), ("echo", "int4")]
    by_id = {i.item_id: i for i in items}
    for result in run.results:
        assert result.error is None and result.output_tokens > 0
        assert result.score == mentions_answer(by_id[result.item_id], result.generated)  # the entry's scorer
        assert result.extra["shortcuts"] == first_word(by_id[result.item_id])  # the entry's shortcuts
    report = render(run.summaries(), run.results, run.baseline_name)
    assert "echo@256" in report and "1/8 (any word of the vocabulary)" in report  # the entry's chance floor
