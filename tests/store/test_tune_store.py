"""The store's side of a tune, on SQLite and PostgreSQL, and Optuna's study beside kvlab's tables."""

from __future__ import annotations

import subprocess
import sys

import optuna
import pytest
from sqlalchemy import create_engine, inspect, make_url, text

from kvlab.core.experiment_spec import parse_spec
from kvlab.core.kv_config import KVCacheConfig
from kvlab.store import Store, StoreError
from kvlab.store.tunes import TuneBusyError
from kvlab.tune.study import open_study
from tests.conftest import PG_URL
from tests.store.test_store import ENV, make_result

SPEC = parse_spec({"name": "tune", "tasks": [{"name": "passkey", "context_lengths": [512], "num_items": 4}],
                   "tune": {"quant": ["none", "int8", "int4"]}})


@pytest.fixture
def store(db_url):
    with Store(db_url) as opened:
        yield opened


def test_rounds_keep_the_experiment_open_until_the_driver_closes_it(store):
    experiment_id = store.create_experiment(SPEC, ENV, item_limit=2)
    store.start_tune(experiment_id, grid_points=2, grid_item_evals=12, driver_id="host-1-aaaaaa")
    (baseline,) = store.trials(experiment_id)
    assert baseline.item_limit == 2
    (int8,) = store.add_candidates(experiment_id, [(KVCacheConfig(quant="int8"), 0)], item_limit=2)
    for trial in store.claim_trials("w", 10, experiment_id):
        store.add_item_result(trial.id, make_result("passkey-0", trial.config_name))
        assert store.finish_trial(trial.id, "done", worker_id="w")
    assert store.get_experiment(experiment_id).status == "running"  # every trial ended, the tune did not
    # a promotion: the trial goes back to the queue with its result kept, now on 4 items
    assert store.extend_trials([int8], 4, rung=1) == [int8]
    trial = store.get_trial(int8)
    assert (trial.status, trial.item_limit, trial.items_done) == ("queued", 4, 1)
    assert store.candidates(experiment_id)[-1].rung == 1
    store.judge_candidate(int8, state="stopped", reason="clearly inferior", judged_items=1, accuracy=0.0)
    (claimed,) = store.claim_trials("w", 10, experiment_id)
    store.finish_trial(claimed.id, "done", worker_id="w")
    store.finish_tune(experiment_id, "done", {"config": None}, "12 item evaluations")
    assert store.get_experiment(experiment_id).status == "done"
    record = store.tune(experiment_id)
    assert (record.state, record.recommendation, record.grid_item_evals) == ("done", {"config": None}, 12)
    reasons = {c.trial_id: c.reason for c in store.candidates(experiment_id)}
    assert reasons[int8] == "clearly inferior"
    with pytest.raises(StoreError, match="is done: no new trials"):
        store.add_candidates(experiment_id, [(KVCacheConfig(quant="int4"), 1)], item_limit=2)


def test_a_live_driver_keeps_its_tune_and_a_dead_one_is_replaced(store):
    import os
    import socket

    host = socket.gethostname()
    alive, taken = store.create_experiment(SPEC, ENV, item_limit=2), store.create_experiment(SPEC, ENV, item_limit=2)
    store.start_tune(alive, 2, 12, driver_id=f"{host}-{os.getpid()}-abcdef")  # this very process
    with pytest.raises(TuneBusyError, match="its tune is driven by"):
        store.take_over_tune(alive, f"{host}-1-bbbbbb")
    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                            text=True, check=True).stdout.strip()
    store.start_tune(taken, 2, 12, driver_id=f"{host}-{exited}-cccccc")  # heartbeat fresh, process gone
    assert store.take_over_tune(taken, f"{host}-2-dddddd") == f"{host}-{exited}-cccccc"
    assert store.tune_heartbeat(taken, f"{host}-2-dddddd")
    assert not store.tune_heartbeat(taken, f"{host}-{exited}-cccccc")


def test_cancel_ends_the_tune_too(store):
    experiment_id = store.create_experiment(SPEC, ENV, item_limit=2)
    store.start_tune(experiment_id, 2, 12, driver_id="host-1-aaaaaa")
    store.cancel_experiment(experiment_id)
    assert store.tune(experiment_id).state == "cancelled"
    assert store.tune(store.create_experiment(SPEC, ENV)) is None  # a plain experiment has no tune


def test_study_lives_beside_the_sqlite_store(tmp_path):
    with Store(f"sqlite:///{tmp_path / 'kvlab.sqlite'}") as store:
        assert store.study_storage_url() == f"sqlite:///{tmp_path / 'kvlab.optuna.sqlite'}"
        study = open_study(store.study_storage_url(), "s", SPEC.tune, seed=0)
        study.enqueue_trial({"quant": "int8"})
    tables = set(inspect(create_engine(f"sqlite:///{tmp_path / 'kvlab.optuna.sqlite'}")).get_table_names())
    assert {"trials", "studies", "alembic_version"} <= tables  # Optuna's own, in its own file


def test_kvlab_and_optuna_schemas_share_one_postgresql_server(pg_admin):
    """Both have a `trials` and an `alembic_version` table: each lives in its own schema, and each
    upgrades its own (kvlab's alembic, then Optuna's `RDBStorage.upgrade`)."""
    import uuid

    schema = f"test_{uuid.uuid4().hex[:10]}"
    with pg_admin.connect() as connection:
        connection.exec_driver_sql(f"CREATE SCHEMA {schema}")
    url = make_url(PG_URL).update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(False)
    try:
        with Store(url) as store:
            assert store.upgrade() == (store.schema_revision(), store.schema_revision())  # already at head
            open_study(store.study_storage_url(), "shared", SPEC.tune, seed=0)
            storage = optuna.storages.RDBStorage(store.study_storage_url())
            storage.upgrade()
            assert storage.get_current_version() == storage.get_head_version()
            experiment_id = store.create_experiment(SPEC, ENV)
        inspector = inspect(pg_admin)
        kvlab_tables = set(inspector.get_table_names(schema=schema))
        optuna_tables = set(inspector.get_table_names(schema=f"{schema}_optuna"))
        assert {"experiments", "trials", "tunes", "alembic_version"} <= kvlab_tables
        assert {"studies", "trials", "trial_values", "alembic_version"} <= optuna_tables
        with pg_admin.connect() as connection:
            kvlab_rev = connection.execute(text(f"SELECT version_num FROM {schema}.alembic_version")).scalar()
            optuna_rev = connection.execute(text(f"SELECT version_num FROM {schema}_optuna.alembic_version")).scalar()
            assert kvlab_rev != optuna_rev
            assert connection.execute(text(f"SELECT count(*) FROM {schema}.trials WHERE experiment_id = :e"),
                                      {"e": experiment_id}).scalar() == 1
    finally:
        with pg_admin.connect() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema}_optuna CASCADE")



def test_a_tune_is_not_rerun_as_a_sweep_and_exports_its_verdicts(store):
    from kvlab.experiments.export import experiment_document

    experiment_id = store.create_experiment(SPEC, ENV, item_limit=2)
    store.start_tune(experiment_id, 2, 12, driver_id="host-1-aaaaaa")
    (trial_id,) = store.add_candidates(experiment_id, [(KVCacheConfig(quant="int8"), 0)], item_limit=2)
    store.judge_candidate(trial_id, state="stopped", reason="clearly inferior after 2 items", judged_items=2)
    with pytest.raises(StoreError, match=f"is a tune: .*kvlab tune --resume {experiment_id}"):
        store.rerun_experiment(experiment_id)
    document = experiment_document(store, experiment_id)
    assert document["tune"]["state"] == "running"
    assert [c["reason"] for c in document["tune"]["candidates"]] == ["clearly inferior after 2 items"]


@pytest.mark.parametrize("finished_first", [False, True])
def test_a_failed_tune_takes_its_queued_trials_and_the_experiment_with_it(store, finished_first):
    """A driver that could not go on fails its tune: no worker may claim the round it had queued, and the
    experiment says failed with the reason -- also when every trial had finished before the failure."""
    experiment_id = store.create_experiment(SPEC, ENV, item_limit=2)
    store.start_tune(experiment_id, grid_points=2, grid_item_evals=12, driver_id="host-1-aaaaaa")
    store.add_candidates(experiment_id, [(KVCacheConfig(quant="int8"), 0)], item_limit=2)
    if finished_first:
        for trial in store.claim_trials("w", 10, experiment_id):
            assert store.finish_trial(trial.id, "done", worker_id="w")
    store.finish_tune(experiment_id, "failed", None, "the driver could not start Ray")
    assert store.claim_trials("w", 10, experiment_id) == []
    expected = {"done"} if finished_first else {"cancelled"}
    assert {trial.status for trial in store.trials(experiment_id)} == expected
    experiment = store.get_experiment(experiment_id)
    assert (experiment.status, experiment.error) == ("failed", "the driver could not start Ray")
    assert store.tune(experiment_id).state == "failed"


def test_the_tune_queries_refuse_what_would_corrupt_a_tune_and_write_nothing(store):
    """Each refusal is a StoreError that says why (never a database error), and the rows stay as they were."""
    sweep_id = store.create_experiment(SPEC, ENV)
    (sweep_trial,) = store.trials(sweep_id)
    with pytest.raises(StoreError, match=f"trial {sweep_trial.id} is not in a running tune \\(no tune\\)"):
        store.extend_trials([sweep_trial.id], 4)
    experiment_id = store.create_experiment(SPEC, ENV, item_limit=2)
    store.start_tune(experiment_id, grid_points=2, grid_item_evals=12, driver_id="host-1-aaaaaa")
    with pytest.raises(StoreError, match=f"already has a tune \\(running\\).*--resume {experiment_id}"):
        store.start_tune(experiment_id, grid_points=2, grid_item_evals=12, driver_id="host-2-bbbbbb")
    assert store.tune(experiment_id).driver_id == "host-1-aaaaaa"
    with pytest.raises(StoreError, match=f"experiment {experiment_id} has no trial {sweep_trial.id}"):
        store.track_trial(experiment_id, sweep_trial.id)
    (trial_id,) = store.add_candidates(experiment_id, [(KVCacheConfig(quant="int8"), 0)], item_limit=2)
    with pytest.raises(StoreError, match="no trial 999999"):
        store.extend_trials([trial_id, 999999], 4)
    with pytest.raises(StoreError, match="candidate state 'maybe'"):
        store.judge_candidate(trial_id, state="maybe")
    with pytest.raises(StoreError, match="no field judged_at, verdict"):
        store.judge_candidate(trial_id, verdict="good", judged_at=0.0)
    (candidate,) = [c for c in store.candidates(experiment_id) if c.trial_id == trial_id]
    assert (candidate.state, candidate.judged_at, store.get_trial(trial_id).item_limit) == ("active", None, 2)
    for trial in store.claim_trials("w", 10, experiment_id):
        store.finish_trial(trial.id, "done", worker_id="w")
    store.cancel_experiment(experiment_id)
    # a promotion after the cancel would put a trial of the ended search back in the queue
    with pytest.raises(StoreError, match=f"trial {trial_id} is not in a running tune \\(its tune is cancelled\\)"):
        store.extend_trials([trial_id], 4)
    assert store.claim_trials("w", 10, experiment_id) == []


def test_the_study_storage_keeps_the_stores_other_connection_options(pg_admin):
    """Only the search path changes for Optuna: a statement timeout set in the store's URL holds for its studies."""
    import uuid

    schema = f"test_{uuid.uuid4().hex[:10]}"
    with pg_admin.connect() as connection:
        connection.exec_driver_sql(f"CREATE SCHEMA {schema}")
    options = f"-cstatement_timeout=4321 -csearch_path={schema} -capplication_name=kvlab-test"
    url = make_url(PG_URL).update_query_dict({"options": options}).render_as_string(False)
    try:
        with Store(url) as store:
            store.upgrade()
            study_url = store.study_storage_url()
        assert make_url(study_url).query["options"].split() == [
            "-cstatement_timeout=4321", "-capplication_name=kvlab-test", f"-csearch_path={schema}_optuna"]
        with create_engine(study_url).connect() as connection:
            shown = [connection.exec_driver_sql(f"SHOW {name}").scalar()
                     for name in ("statement_timeout", "application_name", "search_path")]
        assert shown == ["4321ms", "kvlab-test", f"{schema}_optuna"]
    finally:
        with pg_admin.connect() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema}_optuna CASCADE")
