"""The dashboard's Launch (:mod:`kvlab.dashboard.launch`) goes through the one launch contract: a spec
that cannot run is refused in one line before anything is stored or started, and a tune is stored
first, so its id comes back at once and the detached ``kvlab tune`` works on that experiment."""

from __future__ import annotations

import json
import threading

import pytest

from kvlab.core.experiment_spec import parse_spec
from kvlab.dashboard.executor_form import Executor
from kvlab.dashboard.launch import Refused, launch_sweep, launch_tune
from kvlab.dashboard.tune_launch import launched_here
from kvlab.experiments import launcher
from kvlab.store import Store
from tests.waiting import SAFETY_S

#: A small Llama whose weights are garbage: its config.json says its context; loading it fails.
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
         "max_position_embeddings": 512}
ROW = {"context": "The code is 7.", "question": "What is the code?", "answer": "7"}


@pytest.fixture
def store(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'kvlab.sqlite'}"
    monkeypatch.setenv("KVLAB_DATABASE_URL", url)
    monkeypatch.setenv("KVLAB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("KVLAB_LOG_DIR", str(tmp_path / "logs"))
    (tmp_path / "data").mkdir()
    with Store(url) as opened:
        yield opened


@pytest.fixture
def started(monkeypatch):
    """What would have been started (local workers, a tune's driver), recorded instead."""
    calls: list[tuple] = []
    monkeypatch.setattr("kvlab.experiments.launcher.start_local_workers", lambda *args: calls.append(args) or [])
    monkeypatch.setattr("kvlab.experiments.launcher.start_tune_driver", lambda *args: calls.append(args))
    return calls


def broken_model(folder) -> str:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA))
    (folder / "model.safetensors").write_bytes(b"\xff" * 4096)
    return str(folder)


def jsonl(path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(ROW) + "\n")
    return str(path)


def test_a_jsonl_file_outside_the_data_directory_is_refused_before_anything_is_stored(store, started, tmp_path):
    outside = jsonl(tmp_path / "elsewhere" / "rows.jsonl")
    spec = parse_spec({"name": "outside", "tasks": [{"name": "jsonl", "path": outside}], "configs": [{}]})
    with pytest.raises(Refused) as refused:
        launch_sweep(spec, [], Executor(), 1)
    assert str(refused.value).startswith(f"tasks.0.path: {outside}: only files under the data directory")
    assert "\n" not in str(refused.value)
    assert store.list_experiments() == [] and started == []
    rows = jsonl(tmp_path / "data" / "rows.jsonl")
    inside = parse_spec({"name": "inside", "tasks": [{"name": "jsonl", "path": rows}], "configs": [{}]})
    experiment_id = launch_sweep(inside, [], Executor(), 1)
    assert [e.id for e in store.list_experiments()] == [experiment_id] and started == [(1,)]


@pytest.mark.parametrize("mode", ["sweep", "tune"])
def test_a_context_longer_than_the_models_is_refused_before_anything_is_stored(store, started, tmp_path, mode):
    """Validation knows only the registry's models; the launch reads a local model directory's
    config.json, as ``kvlab run`` does, and refuses in one line."""
    data = {"name": "too-long", "model": broken_model(tmp_path / "model"),
            "tasks": [{"name": "passkey", "context_lengths": [256, 1024]}]}
    data |= {"tune": {"quant": ["int8", "int4"]}} if mode == "tune" else {"configs": [{}]}
    spec = parse_spec(data)
    with pytest.raises(Refused, match=r"^tasks.0.context_lengths: \[1024\] exceed .*maximum context of 512"):
        launch_tune(spec, [], store) if mode == "tune" else launch_sweep(spec, [], Executor(), 1)
    assert store.list_experiments() == [] and started == []


def test_a_background_tune_is_stored_first_and_its_process_drives_that_experiment(store, tmp_path, monkeypatch):
    """The id comes back from the launch, before any model loads; the detached ``kvlab tune --drive ID``
    takes that tune over, and what it refuses (a model that does not load) fails the tune with the
    reason, which the tune page shows, instead of a tune left running with nobody driving it."""
    spec = parse_spec({"name": "background", "model": broken_model(tmp_path / "model"),
                       "tasks": [{"name": "passkey", "context_lengths": [256], "num_items": 2}],
                       "tune": {"quant": ["int8", "int4"]}})
    drivers: list[launcher.BackgroundTune] = []
    start = launcher.start_tune_driver
    monkeypatch.setattr("kvlab.experiments.launcher.start_tune_driver", lambda args: drivers.append(start(args))
                        or drivers[-1])
    experiment_id = launch_tune(spec, [], store)
    [driver] = drivers
    assert driver.process.args[-2:] == ["--drive", str(experiment_id)]
    [experiment] = store.list_experiments()
    assert experiment.id == experiment_id and store.tune(experiment_id) is not None
    assert launched_here(store, experiment_id)
    [launch] = [e.message for e in store.events(experiment_id) if e.message.startswith("launched from the dashboard")]
    log = driver.log
    assert launch.endswith(f"the process's log: {log}") and log.parent == tmp_path / "logs"
    [reaper] = [t for t in threading.enumerate() if t.name == f"kvlab-{driver.process.pid}-reaper"]
    reaper.join(timeout=SAFETY_S)  # the detached driver has ended
    assert driver.process.returncode == 2, log.read_text()
    tune = store.tune(experiment_id)
    assert tune.state == "failed" and "transformers cannot load this model directory" in tune.note, log.read_text()
    assert f"-{driver.process.pid}-" in (tune.driver_id or "")  # that process took it over
    assert store.get_experiment(experiment_id).status == "failed"
    assert log.read_text().splitlines()[-1].startswith("error: "), log.read_text()
