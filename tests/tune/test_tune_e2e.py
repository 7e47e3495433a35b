"""`kvlab tune` as a whole process on the real model: a small study, SIGKILLed mid-round and resumed;
and a study whose rounds two `kvlab worker` processes share on PostgreSQL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import optuna
import pytest
from sqlalchemy import make_url

from kvlab.core.kv_config import KVCacheConfig
from kvlab.store import Store
from tests.conftest import PG_URL
from tests.waiting import SAFETY_S, wait_until

pytestmark = pytest.mark.model

SPEC = """
name = "tune-e2e"
model = "smollm2-135m"
max_drop = 0.5            # 4 items can show a 50-point margin, not a 5-point one

[[tasks]]
name = "passkey"
context_lengths = [400]
depths = [0.2, 0.5, 0.8]
num_items = 4

[tune]
quant = ["none", "int8", "int2"]
evict = ["none"]
min_items = 2
eta = 2
candidates_per_round = 2
max_trials = 2
"""


def kvlab(*args: str, env: dict[str, str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kvlab.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs)


def environment(tmp_path: Path, url: str) -> dict[str, str]:
    return {**os.environ, "KVLAB_DATABASE_URL": url, "KVLAB_LOG_DIR": str(tmp_path / "logs"),
            "OMP_NUM_THREADS": "1"}


def check_study(store: Store, experiment_id: int) -> None:
    """Every finished Optuna trial is one kvlab trial of the experiment, with the same config; every
    (item, config) was evaluated once, within its trial's item limit."""
    study = optuna.load_study(study_name=f"kvlab-experiment-{experiment_id}", storage=store.study_storage_url())
    trials = {t.id: t for t in store.trials(experiment_id)}
    verdicts = {c.number: c for c in store.candidates(experiment_id) if c.number is not None and c.state != "active"}
    linked = [t for t in study.trials if "kvlab_trial_id" in t.user_attrs]
    assert linked, "no Optuna trial names its kvlab trial"
    told = [f for f in linked if f.state == optuna.trial.TrialState.COMPLETE and f.number in verdicts]
    assert told, "no candidate's verdict reached the study"
    for frozen in linked:
        trial = trials[frozen.user_attrs["kvlab_trial_id"]]
        assert trial.config["quant"] == frozen.params["quant"]
        if frozen.state == optuna.trial.TrialState.COMPLETE and frozen.number in verdicts:
            verdict = verdicts[frozen.number]
            assert frozen.values == [verdict.kv_bytes, verdict.accuracy]  # (KV bytes, accuracy) as judged
            # the rule's slack (kvlab.tune.judge), feasible at <= 0: on this one task, with fidelity measured,
            # how far the mean KL's upper bound lies above max_kl (0.05, the default) or the accuracy
            # interval's upper end below -max_drop (0.5 here), whichever is worse
            slack = max(verdict.kl_high - 0.05, -0.5 - verdict.diff_high)
            assert frozen.constraints["rule"] == pytest.approx(slack)
            assert (slack <= 0) == verdict.acceptable
    results = store.item_results(experiment_id)
    counts = Counter((r.config_name, r.item_id) for r in results)
    assert set(counts.values()) == {1}
    for trial in trials.values():
        assert trial.items_done <= (trial.item_limit or 4)


def test_tune_survives_sigkill_and_resumes(tmp_path):
    spec = tmp_path / "tune.toml"
    spec.write_text(SPEC)
    url = f"sqlite:///{tmp_path / 'kvlab.sqlite'}"
    env = environment(tmp_path, url)
    first = kvlab("tune", str(spec), env=env)
    with Store(url) as store:
        def results() -> int:
            try:
                return len(store.item_results(1))
            except Exception:  # noqa: BLE001 -- not created yet
                return 0

        wait_until(lambda: results() >= 3 or first.poll() is not None, "the first results", poll_s=0.3)
        assert first.poll() is None, first.communicate()
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        kept = results()
        assert store.tune(1).state == "running"
        out = tmp_path / "answer.json"
        resumed = kvlab("tune", "--resume", "1", "--json", str(out), env=env)
        stdout, stderr = resumed.communicate(timeout=SAFETY_S)
        assert resumed.returncode == 0, stderr
        assert "resuming the tune of experiment 1" in stderr
        assert "kvlab tune --resume" not in stdout
        answer = json.loads(out.read_text())
        record = store.tune(1)
        assert record.state == "done" and store.get_experiment(1).status == "done"
        assert answer["item_evals"] == sum(t.items_done for t in store.trials(1)) >= kept
        assert answer["item_evals"] < answer["grid_item_evals"] == 3 * 4  # 2 candidates + the baseline, 4 items
        if answer["config"] is not None:  # int8 (4/4 like the baseline) is non-inferior at 50 points on 4 items
            config = KVCacheConfig(**answer["config"])
            assert f"deploy: kvlab serve --model smollm2-135m --quant {config.quant}" in stdout
            assert answer["engines"]["vllm"]["statement"].startswith("vLLM has no equivalent of int")
        else:
            assert "no config passes the rule" in stdout
        states = {c.trial_id: c.state for c in store.candidates(1)}
        assert set(states.values()) <= {"complete", "stopped"} | {"active"}  # the baseline stays active
        check_study(store, 1)
        assert any("requeued" in e.message or "resum" in e.message or "claimed" in e.message
                   for e in store.events(1))


@pytest.fixture
def pg_url(pg_admin):
    """A new PostgreSQL schema (first on the search path) for one test."""
    schema = f"test_{uuid.uuid4().hex[:12]}"
    with pg_admin.connect() as connection:
        connection.exec_driver_sql(f"CREATE SCHEMA {schema}")
    yield make_url(PG_URL).update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(False)
    with pg_admin.connect() as connection:
        connection.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
        connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema}_optuna CASCADE")


def test_two_workers_share_one_study_on_postgresql(tmp_path, pg_url):
    spec = tmp_path / "tune.toml"
    spec.write_text(SPEC)
    db_url = pg_url
    env = environment(tmp_path, db_url)
    workers = [kvlab("worker", "--max-trials", "1", "--threads", "1", env=env) for _ in range(2)]
    try:
        driver = kvlab("tune", str(spec), "--workers", "0", env=env)
        stdout, stderr = driver.communicate(timeout=SAFETY_S)
        assert driver.returncode == 0, stderr
        with Store(db_url) as store:
            (experiment,) = store.list_experiments()
            claims = {e.message.split("claimed by worker ")[1].split(" ")[0] for e in store.events(experiment.id)
                      if "claimed by worker" in e.message}
            assert len(claims) == 2, claims  # both workers ran trials of the one study
            assert store.tune(experiment.id).state == "done"
            check_study(store, experiment.id)
    finally:
        for worker in workers:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=SAFETY_S)
