"""The store commands of the CLI, on a real SQLite file, with results written as a worker would."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest

from kvlab.cli.main import main
from kvlab.core.experiment_spec import parse_spec
from kvlab.core.results import ItemResult
from kvlab.experiments.provenance import environment
from kvlab.store import Store
from tests.waiting import SAFETY_S

SPEC = {"name": "cli-store", "tags": ["nightly"], "tasks": [{"name": "passkey", "context_lengths": [256]}],
        "configs": [{"name": "baseline"}, {"name": "int4", "quant": "int4"}]}


def _result(config: str, item: str, score: float) -> ItemResult:
    return ItemResult(
        item_id=item, task="passkey", config_name=config, config={"name": config}, seed=0, context_length=256,
        depth=0.5, prompt_tokens=256, context_tokens=250, kept_tokens=250.0, kept_fraction=1.0,
        baseline_kv_bytes=1000, physical_kv_bytes=1000 if config == "baseline" else 300, analytic_kv_bytes=300,
        compression_ratio=1.0, peak_kv_bytes=1000, generated=" 12345.", answer="12345", output_tokens=3,
        ttft_s=0.2, tpot_s=0.05, prefill_s=0.1, compress_s=0.01, decode_s=0.1, peak_memory_bytes=None, score=score)


@pytest.fixture
def populated(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'kvlab.sqlite'}"
    monkeypatch.setenv("KVLAB_DATABASE_URL", url)
    store = Store(url)
    experiment_id = store.create_experiment(parse_spec(SPEC), environment())
    trials = store.claim_trials("w1", max_trials=2)
    for trial in trials:
        store.set_items_total(trial.id, 2)
        for item in ("a", "b"):
            store.add_item_result(trial.id, _result(trial.config_name, item, 1.0))
        store.finish_trial(trial.id, "done", worker_id="w1")
    return store, experiment_id


def test_ls_show_export(populated, capsys):
    store, experiment_id = populated
    assert main(["ls"]) == 0
    listing = capsys.readouterr().out
    assert "cli-store" in listing and "done" in listing and "[nightly]" in listing and "created (UTC)" in listing
    assert main(["show", str(experiment_id)]) == 0
    shown = capsys.readouterr().out
    assert "int4" in shown and "accuracy" in shown and "3.33x" in shown
    assert main(["export", str(experiment_id), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 4 and {r["config_name"] for r in rows} == {"baseline", "int4"}
    assert main(["export", str(experiment_id), "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["experiment"]["name"] == "cli-store" and len(document["results"]) == 4
    assert {s["config_name"] for s in document["summary"]} == {"baseline", "int4"}


def test_cancel_rerun_and_errors(populated, capsys):
    store, experiment_id = populated
    assert main(["cancel", str(experiment_id)]) == 2  # already done: a message, not a traceback
    assert "nothing to cancel" in capsys.readouterr().err
    assert main(["rerun", str(experiment_id), "--workers", "0"]) == 0
    new_id = experiment_id + 1
    assert f"experiment {new_id} queued (a rerun of {experiment_id}); 0 local worker(s)" in capsys.readouterr().out
    assert store.get_experiment(new_id).status == "queued"
    assert main(["cancel", str(new_id)]) == 0
    assert store.get_experiment(new_id).status == "cancelled"
    assert main(["show", "999"]) == 2
    assert "no experiment 999" in capsys.readouterr().err


def test_submit_stores_environment_and_warnings(tmp_path, monkeypatch):
    monkeypatch.setenv("KVLAB_DATABASE_URL", f"sqlite:///{tmp_path / 'kvlab.sqlite'}")
    from kvlab.experiments.submit import LocalWorkers, submit

    spec = parse_spec({**SPEC, "configs": [{"name": "int4", "quant": "int4"}]})
    experiment_id = submit(spec, LocalWorkers(0), ["careful"]).experiment_id
    with Store() as store:
        experiment = store.get_experiment(experiment_id)
        warnings = [e.message for e in store.events(experiment_id) if e.level == "warning"]
    assert experiment.status == "queued" and experiment.trials_total == 2 and experiment.hardware["cpu_count"]
    assert warnings[0] == "careful" and "no baseline config" in warnings[1]


def test_local_workers_use_the_database_and_log_dir_of_the_environment(tmp_path, monkeypatch):
    """A real `kvlab worker` process: on an empty store it creates the schema and exits (idle)."""
    from kvlab.experiments.launcher import start_local_workers

    database = tmp_path / "workers.sqlite"
    monkeypatch.setenv("KVLAB_DATABASE_URL", f"sqlite:///{database}")
    monkeypatch.setenv("KVLAB_LOG_DIR", str(tmp_path / "logs"))
    [process] = start_local_workers(1)
    assert process.wait(timeout=SAFETY_S) == 0
    with Store(f"sqlite:///{database}") as store:
        assert store.list_experiments() == []
    [log] = (tmp_path / "logs").iterdir()
    assert log.name.startswith("worker-")


def test_bad_database_url_is_a_message(monkeypatch, capsys):
    monkeypatch.setenv("KVLAB_DATABASE_URL", "postgresql://kvlab:secret@127.0.0.1:1/none")
    assert main(["ls"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "secret" not in err and "Traceback" not in err


def test_db_status_and_upgrade(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KVLAB_DATABASE_URL", f"sqlite:///{tmp_path / 'new.sqlite'}")
    assert main(["db", "status"]) == 0
    assert "schema empty" in capsys.readouterr().out
    assert main(["db", "upgrade"]) == 0
    assert "-> " in capsys.readouterr().out


def test_show_prints_the_notes_and_a_verdict_on_too_few_items(tmp_path, monkeypatch, capsys):
    """`kvlab show`: the notes as stored (a URL's password masked on the way in), and beside a sweet spot
    decided on 2 items the items its margin needs."""
    from tests.dashboard_data import SPEC as SWEEP
    from tests.dashboard_data import item_result

    url = f"sqlite:///{tmp_path / 'kvlab.sqlite'}"
    monkeypatch.setenv("KVLAB_DATABASE_URL", url)
    store = Store(url)
    experiment_id = store.create_experiment(parse_spec(SWEEP | {"max_drop": 0.05}), environment())
    for trial in store.claim_trials("w1", max_trials=4):
        for index in range(2):
            store.add_item_result(trial.id, item_result(trial.config_name, index, 256, 0.1, fidelity=True))
        store.finish_trial(trial.id, "done", worker_id="w1")
    store.set_notes(experiment_id, "two items only\nsee postgresql://kv:hunter2-secret@db/kv")
    assert main(["show", str(experiment_id)]) == 0
    shown = capsys.readouterr().out
    assert "notes: two items only\n       see postgresql://" in shown and "hunter2" not in shown
    assert re.search(r"sweet spot: int4 at .*\nfew items: the sweet spot rests on 2 items; the margin of 0\.05 "
                     r"needs about \d+ ", shown)


def test_notes_are_printed_set_from_text_or_a_file_masked_and_cleared(populated, capsys, tmp_path):
    store, experiment_id = populated
    assert main(["notes", str(experiment_id)]) == 0
    assert capsys.readouterr().out == f"experiment {experiment_id} has no notes\n"
    assert main(["notes", str(experiment_id), "int4 holds; mirror at postgresql://kv:hunter2@db/kv"]) == 0
    assert capsys.readouterr().out == f"experiment {experiment_id}: notes saved; a secret in them was masked\n"
    assert "hunter2" not in store.get_experiment(experiment_id).notes
    notes = tmp_path / "notes.txt"
    notes.write_text("line one\n\tline two\n")
    assert main(["notes", str(experiment_id), "--file", str(notes)]) == 0
    assert store.get_experiment(experiment_id).notes == "line one\n\tline two"  # its final newline dropped
    capsys.readouterr()
    assert main(["notes", str(experiment_id)]) == 0
    assert capsys.readouterr().out == "line one\n\\tline two\n"  # printed as `kvlab show` does: a tab shown as \t
    assert main(["notes", str(experiment_id), "--clear"]) == 0
    assert capsys.readouterr().out == f"experiment {experiment_id}: notes cleared\n"
    assert store.get_experiment(experiment_id).notes == ""
    # bad input: one line naming the problem, exit 2, the notes as they were
    store.set_notes(experiment_id, "kept")
    for argv, message in ((["notes", str(experiment_id), "x", "--clear"], "TEXT, --file or --clear, one of them"),
                          (["notes", str(experiment_id), "--file", str(tmp_path / "missing.txt")], "cannot read"),
                          (["notes", str(experiment_id), "x" * 10_001], "10,001 characters; at most 10,000"),
                          (["notes", "999", "x"], "no experiment 999")):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and err.count("\n") == 1, err
    assert store.get_experiment(experiment_id).notes == "kept"
