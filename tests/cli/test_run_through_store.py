"""`kvlab run` as a user runs it (a real process on the real model): the run is stored, listed by
`kvlab ls` with the numbers of its JSON; `--no-store` stores nothing; Ctrl-C cancels it, results kept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.experiments.export import experiment_document
from kvlab.store import Store
from tests.waiting import SAFETY_S, wait_until

pytestmark = pytest.mark.model

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny.toml"


@pytest.fixture
def database(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'kvlab.sqlite'}"


def kvlab(database: str, *args: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "KVLAB_DATABASE_URL": database}
    return subprocess.Popen([sys.executable, "-m", "kvlab.cli", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


def finish(process: subprocess.Popen) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=SAFETY_S)
    return process.returncode, out, err


def test_run_is_stored_with_the_numbers_of_its_json(database, tmp_path):
    out = tmp_path / "out.json"
    status, printed, err = finish(kvlab(database, "run", str(TINY), "--json", str(out), "--limit", "1"))
    assert status == 0, err
    assert "baseline" in printed and "95% CI" in printed  # the same table as ever
    assert "experiment 1 in sqlite:" in err and "kvlab show 1" in err and "Traceback" not in err
    status, listing, _ = finish(kvlab(database, "ls"))
    assert status == 0 and "tiny" in listing and "done" in listing and "3/3" in listing
    document = json.loads(out.read_text())
    with Store(database) as store:
        stored = experiment_document(store, 1)
        assert store.get_experiment(1).status == "done"
    assert [s["config_name"] for s in document["summary"]] == ["baseline", "int4", "streaming-50"]
    per_config = {s["config_name"]: (s["accuracy"], s["physical_kv_bytes"]) for s in document["summary"]}
    assert per_config == {s["config_name"]: (s["accuracy"], s["physical_kv_bytes"]) for s in stored["summary"]}
    assert document["summary"] == stored["summary"] and document["sweet_spot"] == stored["sweet_spot"]
    assert len(document["results"]) == 3 and per_config["int4"][1] < per_config["baseline"][1]


def test_no_store_leaves_the_database_alone(database, tmp_path):
    status, printed, err = finish(kvlab(database, "run", str(TINY), "--no-store", "--limit", "1", "--quiet"))
    assert status == 0, err
    assert "streaming-50" in printed and "experiment" not in err
    assert not (tmp_path / "kvlab.sqlite").exists()


def test_ctrl_c_cancels_the_experiment_and_keeps_its_results(database, tmp_path):
    spec = tmp_path / "longer.toml"
    spec.write_text(TINY.read_text().replace("num_items = 2", "num_items = 12"))
    process = kvlab(database, "run", str(spec), "--quiet")

    def an_item_stored() -> bool:
        if not (tmp_path / "kvlab.sqlite").exists():
            return False
        with Store(database) as store:
            return any(e.items_done for e in store.list_experiments())

    wait_until(an_item_stored, "an item result in the store", process=process, poll_s=0.5)
    process.send_signal(signal.SIGINT)
    status, _, err = finish(process)
    assert status == 130, err
    assert "interrupted: experiment 1 cancelled" in err and "Traceback" not in err
    with Store(database) as store:
        experiment = store.get_experiment(1)
        results = store.item_results(1)
    assert experiment.status == "cancelled" and experiment.items_done == len(results) >= 1
    assert experiment.items_done < 36  # stopped before the end
