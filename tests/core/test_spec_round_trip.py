"""What the user asked for survives the store: every spec field round-trips unchanged, and a JSONL
file with more rows than every default runs whole through each way an experiment is started
(`kvlab run`, the dashboard's launch, a `kvlab worker`).

The bug this guards against: "unset" was decided by pydantic's ``model_fields_set``, and the
spec's JSON round trip through the store marks every default as set, so a 25-row file ran 10.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from kvlab.core.experiment_spec import ExperimentSpec, parse_spec, spec_to_dict
from kvlab.core.tasks import DEFAULT_NUM_ITEMS, TASKS, MultikeyParams, TaskSpec
from kvlab.dashboard import page_table
from kvlab.store import Store
from kvlab.tasks import generate_items, planned_items
from tests.tasks.test_tasks import WS
from tests.waiting import SAFETY_S

ROWS = 25  # above every default count (DEFAULT_NUM_ITEMS is 10)
APP = str(Path(__file__).resolve().parents[2] / "app.py")


def write_rows(path: Path, rows: int = ROWS) -> Path:
    lines = [json.dumps({"context": f"The code word of box {n} is {word}.", "question": f"\nBox {n}'s code word:",
                         "answer": word})
             for n, word in enumerate(["apple", "river", "stone", "cloud", "ember"] * (rows // 5 + 1))][:rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def every_field_set(jsonl: Path) -> dict[str, Any]:
    """A spec that gives every field a value other than its default."""
    return {
        "name": "everything", "model": "smollm2-135m", "seed": 7, "max_context_length": 4096, "max_drop": 0.1,
        "max_kl": 0.0, "min_agreement": 0.9,  # 0: the KL margin off, which must survive as 0 (not the default)
        "tags": ["a", "b"], "notes": "all fields", "resources": {"num_cpus": 2.0, "num_gpus": 0.0},
        "backend": {"kind": "embedded", "device": "cpu", "dtype": "float32", "api_key_env": "MY_API_KEY",
                    "max_concurrency": 2, "max_retries": 1, "request_timeout_s": 30.0,
                    "server": {"python": "/usr/bin/python3", "host": "127.0.0.2", "port": 8123,
                               "memory_fraction": 0.5, "max_model_len": 2048, "prefix_cache": False,
                               "enforce_eager": False, "startup_timeout_s": 60.0, "extra_args": ["--x"]}},
        "tasks": [
            {"name": "multikey", "context_lengths": [512, 1024], "depths": [0.25, 0.75], "num_items": 3,
             "num_pairs": 6, "max_new_tokens": 12},
            {"name": "variable_tracking", "context_lengths": [512], "num_items": 1, "num_chains": 2, "num_hops": 3},
            {"name": "jsonl", "path": str(jsonl), "num_items": 20, "scorer": "contains"},
            {"name": "jsonl", "path": str(jsonl)},  # unset: the whole file
        ],
        "configs": [{"name": "kv4", "quant": "int4", "group_size": 64, "residual_length": 16, "key_axis": "token"},
                    {"name": "snap", "evict": "snapkv", "keep_fraction": 0.4, "query_aware": True,
                     "window_size": 16, "n_sink": 2},
                    {"name": "dec", "evict": "knorm", "decode": {"interval": 40, "ratio": 0.3, "buffer": 64}},
                    {"name": "ada", "evict": "keydiff", "keep_tokens": 96, "heads": "critical_adakv",
                     "alpha_safeguard": 0.5},
                    {"name": "k8v4", "quant": "int8", "value_quant": "int4",
                     "skip_layers": {"first": 1, "last": 2, "layers": [7, 3]}},
                    {"name": "zip", "evict": "kvzip", "keep_fraction": 0.3}],
        "sweep": {"quant": ["int8", "none"], "evict": ["streaming_llm", "knorm"], "ratios": [0.25, 0.5],
                  "group_size": 128, "residual_length": 0, "query_aware": False,
                  "decode": [{"interval": 16, "target_tokens": 128}], "heads": ["adakv"],
                  "value_quant": ["int2"], "skip_layers": [{"last": 3}]},
    }


def assert_every_field_equal(before: BaseModel, after: BaseModel, path: str = "spec") -> None:
    """Field by field, so that a failure names the field that changed on the way."""
    assert type(before) is type(after), path
    for name in type(before).model_fields:
        a, b = getattr(before, name), getattr(after, name)
        if isinstance(a, BaseModel):
            assert_every_field_equal(a, b, f"{path}.{name}")
        elif isinstance(a, list) and a and isinstance(a[0], BaseModel):
            assert len(a) == len(b), f"{path}.{name}"
            for index, (x, y) in enumerate(zip(a, b, strict=True)):
                assert_every_field_equal(x, y, f"{path}.{name}.{index}")
        else:
            assert a == b, f"{path}.{name}: {a!r} became {b!r}"


@pytest.mark.parametrize("shape", ["every field set", "defaults only"])
def test_every_spec_field_survives_the_store_and_the_run_is_unchanged(db_url, tmp_path, shape):
    jsonl = write_rows(tmp_path / "rows.jsonl")
    data = every_field_set(jsonl) if shape == "every field set" else {
        "tasks": [{"name": "passkey"}, {"name": "jsonl", "path": str(jsonl)}], "configs": [{"quant": "int8"}]}
    spec = parse_spec(data)
    with Store(db_url) as store:
        stored = parse_spec(store.get_experiment(store.create_experiment(spec, {})).spec)
    twice = parse_spec(spec_to_dict(parse_spec(spec_to_dict(stored))))  # and again, as a rerun does
    for after in (stored, twice):
        assert_every_field_equal(spec, after)
        assert after.all_configs() == spec.all_configs()
        for task_before, task_after in zip(spec.tasks, after.tasks, strict=True):
            items = [i.item_id for i in generate_items(task_before, WS, spec.seed)]
            assert [i.item_id for i in generate_items(task_after, WS, after.seed)] == items
            assert len(items) == planned_items(task_before)
    jsonl_counts = [planned_items(t) for t in stored.tasks if t.name == "jsonl"]
    assert jsonl_counts == ([20, ROWS] if shape == "every field set" else [ROWS])


def test_a_shared_context_survives_the_store(db_url):
    """The fields a query-aware config excludes (so not in the spec above): questions per context, a conversation."""
    spec = parse_spec({"name": "shared", "tasks": [{"name": "multikey", "questions_per_context": 3,
                                                    "multi_turn": True, "num_items": 2}],
                       "configs": [{"evict": "knorm", "ratio": 0.5}]})
    with Store(db_url) as store:
        stored = parse_spec(store.get_experiment(store.create_experiment(spec, {})).spec)
    assert_every_field_equal(spec, stored)
    assert len(generate_items(stored.tasks[0], WS, stored.seed)) == planned_items(stored.tasks[0]) == 6


def every_task_parameter_set(jsonl: Path) -> list[dict[str, Any]]:
    """A table of each registered task with every parameter of its own at a value other than its default."""
    return [
        {"name": "passkey", "context_lengths": [512], "num_items": 2, "depths": [0.3, 0.6], "max_new_tokens": 9},
        {"name": "multikey", "context_lengths": [512], "num_items": 2, "depths": [0.2], "num_pairs": 5,
         "questions_per_context": 3, "multi_turn": True},
        {"name": "variable_tracking", "context_lengths": [512], "num_items": 1, "num_chains": 2, "num_hops": 3},
        {"name": "recall", "context_lengths": [512], "num_items": 1, "depths": [0.4], "passage_words": 20},
        {"name": "story", "context_lengths": [512], "num_items": 1, "max_new_tokens": 20},
        {"name": "perplexity", "context_lengths": [512], "num_items": 1, "continuation_tokens": 32},
        {"name": "jsonl", "context_lengths": [1024], "num_items": 20, "path": str(jsonl), "scorer": "contains",
         "questions_per_context": 2, "multi_turn": True},
    ]


def test_every_tasks_own_parameters_survive_json_and_the_store(db_url, tmp_path):
    """Each task's parameters (its registry entry's model), every one off its default: the spec's JSON, its
    TOML-ready dict and the store give back an equal spec, whose items are the same."""
    tables = every_task_parameter_set(write_rows(tmp_path / "rows.jsonl"))
    assert [t["name"] for t in tables] == list(TASKS)  # a new task adds its table here
    for table in tables:
        for name, field in TASKS[table["name"]].params.model_fields.items():
            assert table[name] != field.default, (table["name"], name)
    spec = parse_spec({"name": "every-parameter", "tasks": tables, "configs": [{"quant": "int4"}]})
    assert spec.tasks[1].params == MultikeyParams(depths=[0.2], num_pairs=5, questions_per_context=3, multi_turn=True)
    assert spec_to_dict(spec)["tasks"] == tables  # dumped flat, as the tables were written
    with Store(db_url) as store:
        stored = parse_spec(store.get_experiment(store.create_experiment(spec, {})).spec, stored=True)
    for after in (ExperimentSpec.model_validate(json.loads(spec.model_dump_json())),
                  parse_spec(json.loads(json.dumps(spec.model_dump(mode="json")))), stored):
        assert after == spec
        assert_every_field_equal(spec, after)
        for task_before, task_after in zip(spec.tasks, after.tasks, strict=True):
            assert type(task_after.params) is TASKS[task_after.name].params
            items = [i.item_id for i in generate_items(task_before, WS, spec.seed)]
            assert [i.item_id for i in generate_items(task_after, WS, after.seed)] == items


def test_unset_counts_stay_unset_through_json():
    task = TaskSpec.model_validate(json.loads(TaskSpec(name="passkey").model_dump_json()))
    assert task.num_items is None and task.items_per_length == DEFAULT_NUM_ITEMS
    assert TaskSpec.model_validate(json.loads(TaskSpec(name="passkey", num_items=3).model_dump_json())).num_items == 3


# --- the main path, on the real model -------------------------------------------------------------


def jsonl_spec_toml(jsonl: Path, name: str) -> str:
    return (f'name = "{name}"\nmodel = "smollm2-135m"\n[[tasks]]\nname = "jsonl"\npath = "{jsonl}"\n'
            'max_new_tokens = 3\n[[configs]]\nname = "int8"\nquant = "int8"\n')


def kvlab_cli(database: str, *args: str, **kwargs: Any) -> subprocess.CompletedProcess:
    env = {**os.environ, "KVLAB_DATABASE_URL": database}
    return subprocess.run([sys.executable, "-m", "kvlab.cli", *args], env=env, text=True, capture_output=True,
                          **kwargs)


def items_run(store: Store, experiment_id: int) -> dict[str, int]:
    """Item results per config of the experiment."""
    counts: dict[str, int] = {}
    for result in store.item_results(experiment_id):
        counts[result.config_name] = counts.get(result.config_name, 0) + 1
    return counts


@pytest.mark.model
def test_a_jsonl_file_runs_whole_through_kvlab_run(tmp_path):
    database = f"sqlite:///{tmp_path / 'kvlab.sqlite'}"
    spec = tmp_path / "rows.toml"
    spec.write_text(jsonl_spec_toml(write_rows(tmp_path / "rows.jsonl"), "via-run"))
    done = kvlab_cli(database, "run", str(spec), "--quiet")
    assert done.returncode == 0, done.stderr
    with Store(database) as store:
        assert items_run(store, 1) == {"baseline": ROWS, "int8": ROWS}
        assert store.get_experiment(1).status == "done"


@pytest.mark.model
def test_a_jsonl_file_runs_whole_from_the_dashboard_through_a_worker(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    database = f"sqlite:///{tmp_path / 'kvlab.sqlite'}"
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    write_rows(data_dir / "rows.jsonl")
    monkeypatch.setenv("KVLAB_DATABASE_URL", database)
    monkeypatch.setenv("KVLAB_DATA_DIR", str(data_dir))
    started: list[tuple[Any, ...]] = []  # the worker runs below, as a process of its own
    monkeypatch.setattr("kvlab.experiments.launcher.start_local_workers", lambda *args, **kw: started.append(args))

    at = AppTest.from_file(APP, default_timeout=SAFETY_S)
    at.run()
    at.switch_page(page_table.NEW.script).run()
    toml = jsonl_spec_toml(Path("rows.jsonl"), "via-dashboard")  # relative: under the data directory
    at.get("file_uploader")[0].upload("rows.toml", toml.encode(), "application/toml")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.number_input(key="f:tasks.0.num_items").value == 0  # unset in the file: the form's "default"
    assert {m.label: m.value for m in at.metric}["Items per config"] == str(ROWS)
    at.button(key="launch").click().run()
    assert not at.exception and started, [e.value for e in at.error]

    done = kvlab_cli(database, "worker", "--exit-when-idle", "--heartbeat-s", "1")
    assert done.returncode == 0, done.stderr
    with Store(database) as store:
        [experiment] = store.list_experiments()
        assert experiment.name == "via-dashboard" and experiment.status == "done"
        assert parse_spec(experiment.spec).tasks[0].num_items is None
        assert items_run(store, experiment.id) == {"baseline": ROWS, "int8": ROWS}
