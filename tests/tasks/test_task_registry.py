"""The task registry (kvlab.tasks.registry): its entries are consistent, and an entry is all a new task needs.

The end-to-end test registers a task that exists nowhere in kvlab ("echo": random words, the answer is
the last one, its functions in this module) with nothing but an entry in ``TASKS``, and runs it through
the embedded engine on the default model: spec validation, item generation and counting, the engine,
scoring, shortcuts and the report all take it from the entry.  A task with parameters of its own
("lastwords", its module ``tests/tasks/lastwords.py``: its parameter model and its generator) is one module
and one entry too: its spec tables are validated against its model, and it runs through ``kvlab run``, the
new-experiment form and the playground, each drawing its parameters' widgets from the model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
import tomli_w
from pydantic import ValidationError

from kvlab.cli.main import main
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import parse_spec
from kvlab.core.items import TaskItem
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.results import ItemResult
from kvlab.core.tasks import COMMON_FIELDS, TASKS, MultikeyParams, Task, TaskParams, TaskSpec, generated_tasks
from kvlab.dashboard import page_table
from kvlab.dashboard.playground import PlaygroundView, spec_for
from kvlab.dashboard.spec_form import build_spec, default_form, form_from_spec
from kvlab.dashboard.task_params import item_param_widgets, param_widgets, params_text
from kvlab.engines.base import Engine
from kvlab.experiments.report import render
from kvlab.experiments.runner import run_experiment
from kvlab.serve.errors import APIError
from kvlab.serve.playground import PlaygroundRequest, build_item
from kvlab.store import Store
from kvlab.tasks import generate_items, planned_items, score_item
from kvlab.tasks.haystack import fit_to_length, item_slots
from kvlab.tasks.registry import resolve
from tests.dashboard.test_dashboard import NEW, assert_clean, open_page, texts
from tests.tasks.lastwords import VOCABULARIES, LastWordsParams
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


# --- a new task with parameters of its own is one module and one entry ----------------------------------------

LASTWORDS = Task("lastwords", "tests.tasks.lastwords:generate", scorer="kvlab.tasks.scoring:answer_prefix",
                 params=LastWordsParams, chance_floor="about 1/6 a word asked (any word of the vocabulary)")


@pytest.fixture
def lastwords(monkeypatch) -> Task:
    monkeypatch.setitem(TASKS, "lastwords", LASTWORDS)
    return LASTWORDS


@pytest.fixture
def database(tmp_path, monkeypatch) -> str:
    """The dashboard's store: a new SQLite file."""
    url = f"sqlite:///{tmp_path / 'kvlab.sqlite'}"
    monkeypatch.setenv("KVLAB_DATABASE_URL", url)
    return url


def one_task_spec(**table: Any) -> dict[str, Any]:
    return {"name": "lastwords-spec", "seed": 3, "tasks": [{"name": "lastwords"} | table],
            "configs": [{"name": "int4", "quant": "int4"}]}


def test_a_tasks_table_is_validated_against_its_own_model(lastwords):
    spec = TaskSpec(name="lastwords", context_lengths=[256], asked=3, vocabulary="nature", capitals=True)
    assert spec.params == LastWordsParams(asked=3, vocabulary="nature", capitals=True)
    assert spec.model_dump() == {"name": "lastwords", "context_lengths": [256], "num_items": None,
                                 "max_new_tokens": None, "asked": 3, "vocabulary": "nature", "capitals": True}
    assert TaskSpec.model_validate(json.loads(spec.model_dump_json())) == spec
    for table, message in (
        ({"asked": 9}, "tasks.0.asked: Input should be less than or equal to 4"),
        ({"vocabulary": "birds"}, "tasks.0.vocabulary: Input should be 'fruit' or 'nature'"),
        ({"num_pairs": 6}, "tasks.0.num_pairs: the lastwords task has no parameter 'num_pairs' (its own: asked, "
                           "vocabulary, capitals; every task's: context_lengths, num_items, max_new_tokens); "
                           "num_pairs is a parameter of multikey: remove it, or set name = 'multikey'"),
        ({"captals": True}, "tasks.0.captals: the lastwords task has no parameter 'captals' (its own: asked, "
                            "vocabulary, capitals; every task's: context_lengths, num_items, max_new_tokens); "
                            "did you mean 'capitals'?"),
    ):
        with pytest.raises(ConfigError) as refused:
            parse_spec(one_task_spec(**table))
        assert str(refused.value) == message
    with pytest.raises(ConfigError, match="tasks.0.asked: .*asked is a parameter of lastwords: remove it, or set "
                                          "name = 'lastwords'"):
        parse_spec(one_task_spec(asked=2) | {"tasks": [{"name": "passkey", "asked": 2}]})


class Oracle(Engine):
    """Answers every item right at once (the whitespace tokenizer): `kvlab run` down to item generation and
    scoring, without a model."""

    name = "oracle"

    @property
    def tokenizer(self) -> Any:
        return WS

    def evaluate(self, item: TaskItem, configs: Sequence[KVCacheConfig]) -> Iterator[ItemResult]:
        for config in configs:
            yield ItemResult(
                item_id=item.item_id, task=item.task, config_name=config.label, config=config.model_dump(mode="json"),
                seed=0, context_length=item.context_length, depth=item.depth, prompt_tokens=item.context_length,
                context_tokens=item.context_length, kept_tokens=None, kept_fraction=None, baseline_kv_bytes=None,
                physical_kv_bytes=None, analytic_kv_bytes=None, compression_ratio=None, peak_kv_bytes=None,
                generated=f" {item.answer}.", answer=item.answer, output_tokens=len(item.answer.split()),
                ttft_s=0.01, tpot_s=0.01, prefill_s=0.01, compress_s=0.0, decode_s=0.01, peak_memory_bytes=None)


@pytest.mark.parametrize("stored", [False, True])
def test_a_task_with_parameters_runs_through_kvlab_run(lastwords, tmp_path, monkeypatch, capsys, stored):
    spec_file = tmp_path / "lastwords.toml"
    spec_file.write_text(tomli_w.dumps(one_task_spec(context_lengths=[256], num_items=2, asked=2,
                                                     vocabulary="nature", capitals=True)))
    monkeypatch.setenv("KVLAB_DATABASE_URL", f"sqlite:///{tmp_path / 'kvlab.sqlite'}")
    monkeypatch.setattr("kvlab.experiments.submit.build_engine" if stored else "kvlab.experiments.runner.build_engine",
                        lambda spec: Oracle())
    out = tmp_path / "run.json"
    assert main(["run", str(spec_file), "--quiet", "--json", str(out), *([] if stored else ["--no-store"])]) == 0
    assert "lastwords@256" in capsys.readouterr().out
    run = json.loads(out.read_text())
    assert run["spec"]["tasks"][0] == {"name": "lastwords", "context_lengths": [256], "num_items": 2,
                                       "asked": 2, "vocabulary": "nature", "capitals": True}
    answers = [r["answer"] for r in run["results"]]
    assert len(answers) == 4 and all(len(a.split()) == 2 and a.isupper() for a in answers)  # its parameters
    assert {a.lower() for a in " ".join(answers).split()} <= set(VOCABULARIES["nature"])
    assert {r["score"] for r in run["results"]} == {1.0}  # the entry's scorer, kvlab's answer_prefix
    if stored:
        with Store(os.environ["KVLAB_DATABASE_URL"]) as store:
            [experiment] = store.list_experiments()
            assert parse_spec(experiment.spec, stored=True) == parse_spec(run["spec"])


def test_the_form_draws_and_reads_a_new_tasks_parameters(lastwords, database):
    widgets = param_widgets(LastWordsParams)
    assert [(w.name, w.kind, w.label) for w in widgets] == [
        ("asked", "int", "Words asked"), ("vocabulary", "choice", "Vocabulary"), ("capitals", "bool", "Capitals")]
    assert (widgets[0].bounds, widgets[0].step, widgets[1].choices) == ((1, 4), 1, ("fruit", "nature"))
    form = form_from_spec(one_task_spec(asked=2, vocabulary="nature"))
    assert {k: v for k, v in form.values.items() if k.startswith("tasks.0.")} == {
        "tasks.0.name": "lastwords", "tasks.0.context_lengths": "1024", "tasks.0.num_items": 0,
        "tasks.0.max_new_tokens": 0, "tasks.0.asked": 2, "tasks.0.vocabulary": "nature", "tasks.0.capitals": False}
    built = build_spec(form.values | {"tasks.0.capitals": True}, form.n_tasks, form.configs, form.base)
    assert built.spec is not None and built.spec.tasks[0].params == LastWordsParams(asked=2, vocabulary="nature",
                                                                                     capitals=True)
    picked = default_form()  # a passkey: picking the new task leaves its depths behind, the new one at its defaults
    built = build_spec(picked.values | {"tasks.0.name": "lastwords"}, picked.n_tasks, picked.configs, picked.base)
    assert built.spec is not None and built.spec.tasks[0].params == LastWordsParams()
    refused = build_spec(form.values | {"tasks.0.asked": 9}, form.n_tasks, form.configs, form.base)
    assert refused.errors == {"tasks.0.asked": ["Input should be less than or equal to 4"]}

    at = open_page(NEW)  # the page: the task is listed, and its parameters drawn from its model
    assert "lastwords" in at.selectbox(key="f:tasks.0.name").options
    at.selectbox(key="f:tasks.0.name").set_value("lastwords").run()
    assert_clean(at)
    asked = at.number_input(key="f:tasks.0.asked")
    assert (asked.label, asked.value, asked.min, asked.max) == ("Words asked", 1, 1, 4)
    assert at.selectbox(key="f:tasks.0.vocabulary").options == ["fruit", "nature"]
    assert at.checkbox(key="f:tasks.0.capitals").label == "Capitals"
    assert "f:tasks.0.depths" not in [w.key for w in at.text_input]  # the passkey's parameter is not the new task's
    asked.set_value(3).run()
    at.checkbox(key="f:tasks.0.capitals").check().run()
    assert_clean(at)
    assert at.number_input(key="f:tasks.0.asked").value == 3 and not at.error, texts(at.error)


def test_the_playground_lists_a_new_task_and_draws_its_parameters(lastwords, database):
    assert "lastwords" in generated_tasks()
    widgets = item_param_widgets(LastWordsParams)
    assert [w.name for w in widgets] == ["asked", "vocabulary", "capitals"]
    assert [w.name for w in item_param_widgets(MultikeyParams)] == ["num_pairs"]  # one item: one depth, one question
    view = PlaygroundView(task="lastwords", length=256,
                          task_params=params_text(widgets, {"asked": 2, "vocabulary": "fruit", "capitals": True}))
    assert view.task_params == '{"asked":2,"capitals":true}'  # off their defaults
    assert PlaygroundView.from_params(view.params()) == (view, [])  # its link
    item = build_item(SimpleNamespace(tokenizer=WS),  # what kvlab serve makes of the request
                      PlaygroundRequest.model_validate({"model": "m", "item": view.item()}))
    assert item.task == "lastwords" and len(item.answer.split()) == 2 and item.answer.isupper()
    bad = PlaygroundView(task="lastwords", length=256, task_params='{"asked":9}').item()
    with pytest.raises(APIError, match="item: asked: Input should be less than or equal to 4"):
        build_item(SimpleNamespace(tokenizer=WS), PlaygroundRequest.model_validate({"model": "m", "item": bad}))
    saved = parse_spec(spec_for(view))  # "Save as experiment": the sweep of the whole task, with its parameters
    assert saved.tasks[0].params == LastWordsParams(asked=2, capitals=True)

    at = open_page(page_table.PLAYGROUND.script, task="lastwords", length="256", task_params=view.task_params)
    assert_clean(at)
    assert at.number_input(key="playground-lastwords-asked").value == 2
    assert at.checkbox(key="playground-lastwords-capitals").value
    assert at.selectbox(key="playground-lastwords-vocabulary").value == "fruit"
    at.button(key="save").click().run()  # into the new-experiment form, parameters and all
    assert_clean(at)
    assert at.number_input(key="f:tasks.0.asked").value == 2 and at.checkbox(key="f:tasks.0.capitals").value
