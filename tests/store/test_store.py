"""The experiment store, on SQLite and on PostgreSQL.

Store tests run on both backends: a fresh SQLite file, and a fresh schema of the PostgreSQL that
``scripts/postgres.sh`` starts (``KVLAB_TEST_POSTGRES_URL``; CI sets it, elsewhere those cases skip).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import re
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import event, text, update

from kvlab.core.experiment_spec import ExperimentSpec, parse_spec, spec_to_dict
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.results import ItemResult
from kvlab.core.tasks import TaskSpec
from kvlab.store import (
    ExperimentNotFoundError,
    SchemaOutdatedError,
    Store,
    StoreError,
    StoreLost,
    StoreReadOnlyError,
    TelemetrySample,
    TrialNotFoundError,
    head_revision,
)
from kvlab.store.database import DEFAULT_SQLITE_PATH, require_shared_store, resolve_url
from kvlab.store.tables import Base, TrialRow
from tests.waiting import SAFETY_S

ENV = {"versions": {"kvlab": "0.1.0"}, "git_commit": "abc123", "hardware": {"cpu": "test"}}


# -- fixtures and builders --------------------------------------------------------------------------

@pytest.fixture
def store(db_url) -> Iterator[Store]:
    with Store(db_url) as opened:
        yield opened


def make_spec(n_configs: int = 3, name: str = "sweep", tags: list[str] | None = None,
              notes: str = "") -> ExperimentSpec:
    configs = [KVCacheConfig(name=f"int4-r{i}", quant="int4", residual_length=i) for i in range(n_configs - 1)]
    return ExperimentSpec(name=name, tags=tags or [], notes=notes, tasks=[TaskSpec(name="passkey")], configs=configs)


def make_result(item_id: str = "passkey-0", config_name: str = "baseline", **changes) -> ItemResult:
    values = dict(
        item_id=item_id, task="passkey", config_name=config_name, config={"name": config_name, "quant": "none"},
        seed=0, context_length=1024, depth=0.5, prompt_tokens=1030, context_tokens=1000, kept_tokens=1000.0,
        kept_fraction=1.0, baseline_kv_bytes=368_640_000, physical_kv_bytes=368_640_000,
        analytic_kv_bytes=368_640_000, compression_ratio=1.0, peak_kv_bytes=370_000_000, generated="12345",
        answer="12345", output_tokens=6, ttft_s=1.25, tpot_s=0.1, prefill_s=1.0, compress_s=0.05, decode_s=0.5,
        peak_memory_bytes=1_000_000_000, score=1.0, extra={"note": "ünïcode", "list": [1, 2]},
    )
    return ItemResult(**(values | changes))


def age_heartbeats(store: Store, trial_ids: list[int], seconds: float) -> None:
    """Pretend the trials' worker last heartbeat ``seconds`` ago."""
    with store.engine.begin() as connection:
        connection.execute(update(TrialRow).where(TrialRow.id.in_(trial_ids))
                           .values(heartbeat_at=datetime.now(UTC) - timedelta(seconds=seconds)))


class StatementCounter:
    """Counts the SQL statements an engine sends (BEGIN/COMMIT excluded)."""

    def __init__(self, engine) -> None:
        self.statements: list[str] = []
        self.engine = engine

    def __enter__(self) -> StatementCounter:
        event.listen(self.engine, "before_cursor_execute", self._record)
        return self

    def __exit__(self, *_exc) -> None:
        event.remove(self.engine, "before_cursor_execute", self._record)

    def _record(self, _conn, _cursor, statement, *_args) -> None:
        if not statement.lstrip().upper().startswith(("BEGIN", "COMMIT", "ROLLBACK")):
            self.statements.append(statement)


# -- experiments and results ------------------------------------------------------------------------

def test_create_and_get_experiment(store):
    spec = make_spec(3, name="my sweep", tags=["cpu", "smoke"], notes="first try")
    before = datetime.now(UTC)
    experiment_id = store.create_experiment(spec, ENV)
    record = store.get_experiment(experiment_id)
    assert (record.name, record.tags, record.notes, record.seed, record.model) == (
        "my sweep", ["cpu", "smoke"], "first try", 0, "smollm2-135m")
    assert record.backend_kind == "embedded"
    assert (record.versions, record.git_commit, record.hardware) == (ENV["versions"], "abc123", ENV["hardware"])
    assert record.spec == spec_to_dict(spec) and parse_spec(record.spec) == spec
    assert record.status == "queued" and record.started_at is None and record.finished_at is None
    assert record.created_at.tzinfo is not None and before - timedelta(seconds=1) <= record.created_at
    assert (record.trials_total, record.trials_queued, record.trials_done) == (3, 3, 0)

    trials = store.trials(experiment_id)
    assert [t.position for t in trials] == [0, 1, 2]
    assert [t.config_name for t in trials] == ["baseline", "int4-r0", "int4-r1"]
    assert KVCacheConfig.model_validate(trials[1].config) == spec.all_configs()[1]
    assert all(t.status == "queued" and t.attempts == 0 and t.items_done == 0 for t in trials)
    assert store.get_trial(trials[2].id) == trials[2]
    assert "created with 3 configs" in store.events(experiment_id)[0].message


def test_item_result_round_trip_and_duplicates(store):
    experiment_id = store.create_experiment(make_spec(2), ENV)
    baseline, int4 = store.trials(experiment_id)
    store.set_items_total(baseline.id, 2)
    first = make_result("passkey-0")
    second = make_result("passkey-1", tpot_s=None, score=None, depth=None, compression_ratio=math.nan,
                         nll=2.5, nll_tokens=64, error="decode failed", extra={})
    assert store.add_item_result(baseline.id, first) is True
    assert store.add_item_result(baseline.id, second) is True
    assert store.add_item_result(baseline.id, make_result("passkey-0", generated="different")) is False
    assert store.add_item_result(int4.id, make_result("passkey-0", config_name="int4-r0")) is True

    results = store.item_results(experiment_id, trial_id=baseline.id)
    assert results[0] == first
    assert math.isnan(results[1].compression_ratio)
    results[1].compression_ratio = second.compression_ratio = 0.0
    assert results[1] == second
    assert [r.config_name for r in store.item_results(experiment_id)] == ["baseline", "baseline", "int4-r0"]
    assert store.done_item_keys(baseline.id) == {("passkey-0", "passkey"), ("passkey-1", "passkey")}
    trial = store.get_trial(baseline.id)
    assert (trial.items_total, trial.items_done) == (2, 2)
    assert (store.get_experiment(experiment_id).items_total, store.get_experiment(experiment_id).items_done) == (2, 3)


def test_not_found(store):
    with pytest.raises(ExperimentNotFoundError, match=r"no experiment 999; `kvlab ls` lists them"):
        store.get_experiment(999)
    with pytest.raises(ExperimentNotFoundError):
        store.trials(999)
    with pytest.raises(TrialNotFoundError, match="no trial 999"):
        store.get_trial(999)
    with pytest.raises(TrialNotFoundError):
        store.add_item_result(999, make_result())


def test_list_experiments_filters_and_order(store):
    ids = [store.create_experiment(make_spec(2, name=name, tags=tags, notes=notes), ENV)
           for name, tags, notes in [("Alpha int4", ["cpu"], ""), ("beta", ["gpu", "long"], "uses 100% of it"),
                                     ("gamma", [], "alpha notes"), ("cpu-ish", ["cpuish"], "")]]
    store.cancel_experiment(ids[3])

    assert [e.id for e in store.list_experiments()] == ids[::-1]
    assert [e.id for e in store.list_experiments(order="created_at")] == ids
    assert [e.name for e in store.list_experiments(order="name")] == ["Alpha int4", "beta", "cpu-ish", "gamma"]
    assert [e.id for e in store.list_experiments(status="cancelled")] == [ids[3]]
    assert {e.id for e in store.list_experiments(search="ALPHA")} == {ids[0], ids[2]}
    assert [e.id for e in store.list_experiments(search="100%")] == [ids[1]]
    assert [e.id for e in store.list_experiments(search="0%")] == [ids[1]]
    assert [e.id for e in store.list_experiments(search="_")] == []
    assert [e.id for e in store.list_experiments(tag="cpu")] == [ids[0]]
    assert [e.id for e in store.list_experiments(tag="long", search="beta")] == [ids[1]]
    assert [e.id for e in store.list_experiments(limit=2, offset=1)] == [ids[2], ids[1]]
    with pytest.raises(ValueError, match="order"):
        store.list_experiments(order="-bogus")
    with pytest.raises(ValueError, match="status"):
        store.list_experiments(status="finished")


def test_notes_are_edited_redacted_and_searched(store):
    """Notes are replaced, found by the list's search, and a URL's password in them is masked before it is
    stored (so no page or export can show it); control characters and unknown ids are refused."""
    experiment_id = store.create_experiment(make_spec(2, notes="first draft"), ENV)
    other = store.create_experiment(make_spec(2, name="other"), ENV)
    stored = store.set_notes(experiment_id, "int4 holds\nmirror: postgresql://kv:hunter2-secret@db.example/kv")
    assert stored == store.get_experiment(experiment_id).notes
    assert "hunter2" not in stored and "int4 holds\nmirror: postgresql://" in stored
    assert [e.id for e in store.list_experiments(search="INT4 HOLDS")] == [experiment_id]
    assert store.get_experiment(other).notes == ""
    with pytest.raises(StoreError, match="control character"):
        store.set_notes(experiment_id, "bell\x07")
    with pytest.raises(ExperimentNotFoundError):
        store.set_notes(other + 1, "nobody")
    assert store.set_notes(experiment_id, "") == "" == store.get_experiment(experiment_id).notes


def test_list_experiments_many_trials_is_two_queries(store):
    """200 experiments x 50 trials: one page query and one GROUP BY for all the counts."""
    spec = make_spec(50)
    ids = [store.create_experiment(spec, ENV) for _ in range(200)]
    store.claim_trials("w", max_trials=3)
    with StatementCounter(store.engine) as counter:
        page = store.list_experiments(limit=200)
    assert len(counter.statements) == 2, counter.statements
    assert len(page) == 200 and page[-1].id == ids[0]
    assert (page[-1].trials_total, page[-1].trials_running, page[-1].trials_queued) == (50, 3, 47)
    assert all(e.trials_total == 50 for e in page)


def test_rerun_and_delete(store):
    experiment_id = store.create_experiment(make_spec(2, name="orig", tags=["x"]), ENV)
    (trial, _other) = store.claim_trials("w1", max_trials=2)
    store.add_item_result(trial.id, make_result())
    store.add_telemetry([TelemetrySample(experiment_id, "w1", time.time(), "decode", "cpu", trial_id=trial.id)])

    rerun_id = store.rerun_experiment(experiment_id)
    rerun = store.get_experiment(rerun_id)
    assert rerun_id != experiment_id and rerun.spec == store.get_experiment(experiment_id).spec
    assert (rerun.status, rerun.trials_queued, rerun.items_done, rerun.tags) == ("queued", 2, 0, ["x"])
    assert "rerun of experiment" in store.events(rerun_id)[-1].message

    store.delete_experiment(experiment_id)
    with pytest.raises(ExperimentNotFoundError):
        store.get_experiment(experiment_id)
    assert store.item_results(experiment_id) == [] and store.telemetry(experiment_id) == []
    assert store.events(experiment_id) == []
    assert store.heartbeat("w1", [trial.id]) == {trial.id}  # the worker learns its trial is gone
    with pytest.raises(ExperimentNotFoundError):
        store.delete_experiment(experiment_id)
    assert store.get_experiment(rerun_id).trials_total == 2


# -- the queue: claims, heartbeats, cancellation, stale workers, roll-up ----------------------------

def test_claim_order_and_experiment_status(store):
    first = store.create_experiment(make_spec(5), ENV)
    second = store.create_experiment(make_spec(2), ENV)

    claimed = store.claim_trials("w1", max_trials=2)
    assert [(t.experiment_id, t.position) for t in claimed] == [(first, 0), (first, 1)]
    assert all(t.status == "running" and t.worker_id == "w1" and t.attempts == 1 for t in claimed)
    assert all(t.claimed_at and t.heartbeat_at and t.started_at for t in claimed)
    experiment = store.get_experiment(first)
    assert experiment.status == "running" and experiment.started_at is not None
    assert store.get_experiment(second).status == "queued"

    assert [t.position for t in store.claim_trials("w2", max_trials=10)] == [2, 3, 4]
    assert [(t.experiment_id, t.position) for t in store.claim_trials("w3")] == [(second, 0), (second, 1)]
    assert store.claim_trials("w4") == []


def test_claim_one_experiment(store):
    first = store.create_experiment(make_spec(2), ENV)
    second = store.create_experiment(make_spec(2), ENV, status="running")
    assert store.get_experiment(second).started_at is not None
    assert {t.experiment_id for t in store.claim_trials("cli", max_trials=5, experiment_id=second)} == {second}
    assert store.claim_trials("cli", experiment_id=second) == []
    assert {t.experiment_id for t in store.claim_trials("w")} == {first}
    with pytest.raises(ValueError):
        store.claim_trials("w", max_trials=0)


def _claim_until_empty(args: tuple[str, str]) -> list[list[int]]:
    """A worker process: claim, finish, repeat until the queue is empty; returns each claim's ids."""
    url, worker_id = args
    claims = []
    with Store(url) as store:
        while trials := store.claim_trials(worker_id, max_trials=2):
            assert len({t.experiment_id for t in trials}) == 1
            claims.append([t.id for t in trials])
            for trial in trials:
                assert store.finish_trial(trial.id, "done", worker_id=worker_id)
    return claims


def test_concurrent_claims_processes(store, db_url):
    """4 processes claim concurrently: every trial is claimed exactly once, every experiment ends done."""
    experiment_ids = [store.create_experiment(make_spec(6), ENV) for _ in range(20)]
    all_ids = sorted(t.id for e in experiment_ids for t in store.trials(e))
    store.engine.dispose()  # the children open their own connections
    with multiprocessing.get_context("fork").Pool(4) as pool:
        per_worker = pool.map(_claim_until_empty, [(db_url, f"worker-{i}") for i in range(4)])
    claimed = [tid for claims in per_worker for claim in claims for tid in claim]
    assert sorted(claimed) == all_ids
    assert all(store.get_experiment(e).status == "done" for e in experiment_ids)
    assert all(t.attempts == 1 for e in experiment_ids for t in store.trials(e))


def test_concurrent_claims_threads(store):
    """Threads sharing one Store (a worker and its telemetry thread share one): disjoint claims."""
    experiment_ids = [store.create_experiment(make_spec(4), ENV) for _ in range(5)]
    claimed: list[int] = []
    lock = threading.Lock()

    def work(worker_id: str) -> None:
        while trials := store.claim_trials(worker_id, max_trials=2):
            with lock:
                claimed.extend(t.id for t in trials)

    threads = [threading.Thread(target=work, args=(f"t{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(claimed) == sorted(t.id for e in experiment_ids for t in store.trials(e))


def test_concurrent_first_open_creates_schema_once(db_url, tmp_path):
    """Workers started at once on a new database: one migrates, the others wait and find it done.

    On SQLite, ten new files: switching a new file to WAL raced in about 1 round in 7 before
    kvlab retried it (SQLite does not call its busy handler there).
    """
    urls = [db_url] if db_url.startswith("postgresql") else [
        f"sqlite:///{tmp_path / f'round{i}.sqlite'}" for i in range(10)]
    with multiprocessing.get_context("fork").Pool(4) as pool:
        for url in urls:
            revisions = pool.map(_open_and_report_revision, [url] * 4)
            assert revisions == [head_revision()] * 4


def _open_and_report_revision(url: str) -> str | None:
    with Store(url) as store:
        return store.schema_revision()


def test_heartbeat_and_cancel(store):
    experiment_id = store.create_experiment(make_spec(3), ENV)
    trials = store.claim_trials("w1", max_trials=2)
    ids = [t.id for t in trials]
    age_heartbeats(store, ids, 30)
    assert store.heartbeat("w1", ids) == set()
    assert all(datetime.now(UTC) - store.get_trial(i).heartbeat_at < timedelta(seconds=5) for i in ids)
    assert store.heartbeat("w2", ids) == set(ids)  # not its trials
    assert store.heartbeat("w1", []) == set()

    assert store.cancel_experiment(experiment_id) == 3  # 2 running + 1 queued
    assert store.heartbeat("w1", ids) == set(ids)
    experiment = store.get_experiment(experiment_id)
    assert (experiment.status, experiment.trials_cancelled) == ("cancelled", 3) and experiment.finished_at
    assert store.finish_trial(ids[0], "done") is False  # a late finish does not undo the cancel
    with pytest.raises(StoreError, match=f"experiment {experiment_id} is already cancelled; nothing to cancel"):
        store.cancel_experiment(experiment_id)
    assert store.claim_trials("w3") == []


def test_requeue_stale_requeues_and_keeps_results(store):
    experiment_id = store.create_experiment(make_spec(3), ENV)
    stale, fresh = store.claim_trials("w1", max_trials=2)
    store.add_item_result(stale.id, make_result())
    age_heartbeats(store, [stale.id], 120)

    assert store.requeue_stale(stale_after_s=60) == [stale.id]
    trial = store.get_trial(stale.id)
    assert (trial.status, trial.worker_id, trial.items_done) == ("queued", None, 1)
    assert store.get_trial(fresh.id).status == "running"
    assert store.done_item_keys(stale.id) == {("passkey-0", "passkey")}
    assert store.heartbeat("w1", [stale.id, fresh.id]) == {stale.id}
    event = [e for e in store.events(experiment_id) if e.trial_id == stale.id][-1]
    assert event.level == "warning" and "stopped heartbeating" in event.message and "requeued" in event.message

    again = store.claim_trials("w2", max_trials=1)
    assert [(t.id, t.attempts, t.worker_id) for t in again] == [(stale.id, 2, "w2")]
    assert store.requeue_stale(stale_after_s=60) == []


def test_requeue_stale_fail_mode_rolls_up(store):
    experiment_id = store.create_experiment(make_spec(2), ENV)
    done, stale = store.claim_trials("w1", max_trials=2)
    store.finish_trial(done.id, "done")
    age_heartbeats(store, [stale.id], 600)
    assert store.requeue_stale(stale_after_s=60, on_stale="fail") == [stale.id]
    trial = store.get_trial(stale.id)
    assert (trial.status, trial.error) == ("failed", "worker stopped heartbeating")
    experiment = store.get_experiment(experiment_id)
    assert (experiment.status, experiment.trials_failed, experiment.trials_done) == ("failed", 1, 1)
    assert experiment.error == "1 of 2 trials failed"
    with pytest.raises(ValueError):
        store.requeue_stale(on_stale="ignore")


@pytest.mark.parametrize(("outcomes", "expected"), [
    (["done", "done", "done"], "done"),
    (["done", "failed", "cancelled"], "failed"),
    (["done", "cancelled", "done"], "cancelled"),
])
def test_experiment_status_roll_up(store, outcomes, expected):
    experiment_id = store.create_experiment(make_spec(3), ENV)
    trials = store.claim_trials("w1", max_trials=3)
    for trial, outcome in zip(trials[:-1], outcomes[:-1], strict=True):
        assert store.finish_trial(trial.id, outcome, error="boom" if outcome == "failed" else None)
        assert store.get_experiment(experiment_id).status == "running"
    assert store.finish_trial(trials[-1].id, outcomes[-1], worker_id="someone else") is False
    assert store.finish_trial(trials[-1].id, outcomes[-1], worker_id="w1") is True
    experiment = store.get_experiment(experiment_id)
    assert experiment.status == expected and experiment.finished_at is not None
    assert store.events(experiment_id)[-1].message.startswith(f"experiment {expected}")
    with pytest.raises(ValueError):
        store.finish_trial(trials[0].id, "running")


# -- telemetry and events ---------------------------------------------------------------------------

def test_telemetry_batch_insert_and_reads(store):
    experiment_id = store.create_experiment(make_spec(2), ENV)
    baseline, other = store.trials(experiment_id)
    t0 = 1_700_000_000.0
    samples = [TelemetrySample(experiment_id, "w1", t0 + i * 0.5, "decode", "cpu",
                               trial_id=baseline.id if i < 600 else other.id, rss_bytes=10**9 + i,
                               cpu_percent=50.0, kv_bytes=i * 1000,
                               gpu_memory_used_bytes=2**33 if i % 2 else None)
               for i in range(1000)]
    with StatementCounter(store.engine) as counter:
        store.add_telemetry(samples)
    assert len([s for s in counter.statements if s.lstrip().upper().startswith("INSERT")]) <= 2

    assert store.telemetry(experiment_id) == samples
    assert len(store.telemetry(experiment_id, trial_id=other.id)) == 400
    assert store.telemetry(experiment_id, since_ts=t0 + 498.0) == samples[-3:]
    assert store.telemetry(experiment_id, limit=5) == samples[-5:]
    assert store.telemetry(experiment_id, trial_id=baseline.id, limit=2) == samples[598:600]
    store.add_telemetry([])
    with pytest.raises(ValueError, match="phase"):
        store.add_telemetry([TelemetrySample(experiment_id, "w1", t0, "warmup", "cpu")])
    with pytest.raises(ValueError, match="source"):
        store.add_telemetry([TelemetrySample(experiment_id, "w1", t0, "idle", "psutil")])


def test_events(store):
    experiment_id = store.create_experiment(make_spec(2), ENV)
    trial = store.trials(experiment_id)[1]
    store.log_event(experiment_id, "model loaded in 1.2 s")
    store.log_event(experiment_id, "out of memory", level="error", trial_id=trial.id)
    events = store.events(experiment_id)
    assert [(e.level, e.message, e.trial_id) for e in events[-2:]] == [
        ("info", "model loaded in 1.2 s", None), ("error", "out of memory", trial.id)]
    assert events[-1].ts >= events[-2].ts
    with pytest.raises(ValueError, match="level"):
        store.log_event(experiment_id, "x", level="debug")
    # A worker whose experiment was deleted under it gets a clear error, not a foreign key violation.
    store.delete_experiment(experiment_id)
    with pytest.raises(ExperimentNotFoundError, match="no such experiment or trial"):
        store.log_event(experiment_id, "late")
    with pytest.raises(ExperimentNotFoundError, match=r"telemetry for experiment\(s\) \[\d+\]"):
        store.add_telemetry([TelemetrySample(experiment_id, "w1", time.time(), "idle", "cpu", trial_id=trial.id)])


# -- schema and migrations --------------------------------------------------------------------------

def test_migrations_match_models(store):
    with store.engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection, opts={"compare_type": True}),
                                Base.metadata) == []
    assert store.integrity_check() == "ok"


def test_empty_database_detected_then_created(db_url):
    with pytest.raises(SchemaOutdatedError, match=r"^database has no kvlab schema: run `kvlab db upgrade`$"):
        Store(db_url, create=False)
    with Store(db_url) as store:
        assert store.schema_revision() == head_revision()
    with Store(db_url, create=False) as store:  # now current: opens without creating anything
        assert store.list_experiments() == []


def test_older_schema_is_reported_not_migrated(db_url):
    """A database at revision 0001 (before telemetry): opening it never migrates it implicitly."""
    with Store(db_url, create=False, check=False) as store:
        assert store.upgrade("0001") == (None, "0001")
    expected = (f"database schema is at revision 0001, this kvlab needs {head_revision()}: "
                "run `kvlab db upgrade`")
    for create in (True, False):
        with pytest.raises(SchemaOutdatedError) as raised:
            Store(db_url, create=create)
        assert str(raised.value) == expected
    with Store(db_url, check=False) as store:
        assert store.schema_revision() == "0001"
        assert store.upgrade() == ("0001", head_revision())
    with Store(db_url) as store:
        store.create_experiment(make_spec(2), ENV)


def test_unknown_revision_and_foreign_tables(db_url):
    with Store(db_url) as store, store.engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    with pytest.raises(StoreError, match=r"made by a newer kvlab \(revision 9999; .*\); upgrade kvlab"):
        Store(db_url)
    with Store(db_url, check=False) as store, store.engine.begin() as connection:
        connection.execute(text("DROP TABLE alembic_version"))
    with pytest.raises(StoreError, match="not a kvlab database .*no kvlab schema revision"):
        Store(db_url)


# -- URLs and broken databases ----------------------------------------------------------------------

def test_default_and_env_urls(monkeypatch):
    monkeypatch.delenv("KVLAB_DATABASE_URL", raising=False)
    assert resolve_url().database == str(DEFAULT_SQLITE_PATH)
    assert DEFAULT_SQLITE_PATH.parent == Path(__file__).resolve().parents[2] / "db"
    monkeypatch.setenv("KVLAB_DATABASE_URL", "postgresql://u:p@db.example/kvlab")
    assert resolve_url().drivername == "postgresql+psycopg"
    assert resolve_url("sqlite:///x.sqlite").database == "x.sqlite"


@pytest.mark.parametrize("url", [
    "not a url", "postgresql://kvlab:s3cret@host:port/db", "sqlite//missing-colon.sqlite",
])
def test_malformed_url(url):
    with pytest.raises(StoreError, match="malformed database URL") as raised:
        Store(url)
    assert "s3cret" not in str(raised.value)


def test_unsupported_dialect_masks_password():
    with pytest.raises(StoreError, match="runs on SQLite or PostgreSQL, not 'mysql'") as raised:
        Store("mysql://root:s3cret@localhost/kvlab")
    assert "s3cret" not in str(raised.value) and "***" in str(raised.value)


def test_unreachable_postgres():
    with pytest.raises(StoreError) as raised:
        Store("postgresql://kvlab:s3cret@127.0.0.1:1/kvlab")
    message = str(raised.value)
    assert message.startswith("cannot reach the database at postgresql://kvlab:***@127.0.0.1:1/kvlab: ")
    assert "Connection refused" in message and "s3cret" not in message and "\n" not in message


def test_corrupt_sqlite_file(tmp_path):
    path = tmp_path / "kvlab.sqlite"
    path.write_bytes(b"this is not a database " * 200)
    with pytest.raises(StoreError, match=f"{path} is not a SQLite database"):
        Store(f"sqlite:///{path}")


def test_missing_sqlite_directory(tmp_path):
    with pytest.raises(StoreError, match="cannot open the SQLite database"):
        Store(f"sqlite:///{tmp_path / 'no' / 'such' / 'kvlab.sqlite'}")


READ_ONLY_PROBE = """
import sys
from kvlab.store import Store, StoreError
for url in sys.argv[1:]:
    try:
        with Store(url) as store:
            print("read", [e.id for e in store.list_experiments()])
            store.log_event(1, "a write")
            print("wrote")
    except StoreError as error:
        print("error", error)
"""


def _without_root_powers(*urls: str) -> list[str]:
    """Open each URL, read, then write, in a process that file permissions apply to.

    Tests run as root, whom chmod does not stop; dropping the capabilities that let root ignore
    permissions (CAP_DAC_OVERRIDE and friends, with setpriv) makes the child see them like any user.
    """
    command = [sys.executable, "-c", READ_ONLY_PROBE, *urls]
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: chmod cannot make a file read-only for root")
        command = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=SAFETY_S)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_read_only_sqlite(tmp_path):
    """A read-only database file can be read, and the first write says it is read-only.

    Three real ways: chmod 0444 on the file (seen by a process without root's powers, see
    _without_root_powers); the same with the directory read-only too, where SQLite cannot create the
    WAL index and so cannot read either, and the error says how to read it anyway (immutable=1);
    and ``mode=ro`` in a URI, which holds for root as well.
    """
    folder = tmp_path / "archive"
    folder.mkdir()
    path = folder / "kvlab.sqlite"
    with Store(f"sqlite:///{path}") as store:
        experiment_id = store.create_experiment(make_spec(2), ENV)
    read_only = (stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH, stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP
                 | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    try:
        path.chmod(read_only[0])
        assert _without_root_powers(f"sqlite:///{path}") == [
            f"read [{experiment_id}]",
            f"error the database {path} is read-only (file permissions, or mode=ro / immutable in the URL): "
            "kvlab can read it but not write to it"]
        for leftover in folder.glob("kvlab.sqlite-*"):
            leftover.unlink()
        folder.chmod(read_only[1])
        immutable_url = f"sqlite:///file:{path}?immutable=1&uri=true"
        plain, immutable_read, immutable_write = _without_root_powers(f"sqlite:///{path}", immutable_url)
        assert plain.startswith(f"error the database {path} and its directory are read-only")
        assert plain.endswith(f"or read it as an immutable snapshot: {immutable_url}")
        assert immutable_read == f"read [{experiment_id}]"
        assert immutable_write.startswith(f"error the database {path} is read-only")
    finally:
        folder.chmod(0o755)
        path.chmod(0o644)

    with Store(f"sqlite:///file:{path}?mode=ro&uri=true") as store:
        assert [e.id for e in store.list_experiments()] == [experiment_id]
        with pytest.raises(StoreError, match="is read-only"):
            store.create_experiment(make_spec(2), ENV)
        with pytest.raises(StoreError, match="is read-only"):
            store.claim_trials("w1")


# -- a store lost under the process that opened it (issue 18, item 11) ------------------------------

LOSS_PROBE = """
import sys
from pathlib import Path
from kvlab.core.experiment_spec import ExperimentSpec
from kvlab.core.kv_config import KVCacheConfig
from kvlab.store import Store, StoreLost
from kvlab.core.tasks import TaskSpec
path = Path(sys.argv[1])
with Store(f"sqlite:///{path}") as store:
    spec = ExperimentSpec(name="probe", tasks=[TaskSpec(name="passkey")],
                          configs=[KVCacheConfig(name="int4", quant="int4")])
    store.create_experiment(spec, {})
    for file in (path, path.with_name(path.name + "-wal")):
        file.chmod(0o444)
    for step in (store.check_intact, lambda: (store.engine.dispose(), store.log_event(1, "a write"))):
        try:
            step()
            print("no error")
        except StoreLost as error:
            print("lost", error)
"""


def test_a_sqlite_file_deleted_or_replaced_under_a_store_is_lost(tmp_path):
    path = tmp_path / "kvlab.sqlite"
    with Store(f"sqlite:///{path}") as store, Store(f"sqlite:///{path}") as second:
        store.check_intact()
        for file in tmp_path.glob("kvlab.sqlite*"):
            file.unlink()
        with pytest.raises(StoreLost, match=rf"is gone: its file was deleted or replaced .* \({path}\)"):
            store.check_intact()
        with Store(f"sqlite:///{path}") as new:  # a new database at the same path: the old one is still gone
            new.check_intact()
            with pytest.raises(StoreLost, match="was deleted or replaced"):
                second.check_intact()


def test_a_sqlite_file_made_read_only_under_a_store_is_lost_but_one_opened_read_only_is_not(tmp_path):
    """The check sees the permissions change, and a write that SQLite then refuses is StoreLost too
    (a process without root's powers, see _without_root_powers); a file read-only from the start is
    a read-only store (test_read_only_sqlite), not a lost one."""
    path = tmp_path / "kvlab.sqlite"
    command = [sys.executable, "-c", LOSS_PROBE, str(path)]
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: chmod cannot make a file read-only for root")
        command = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"lost the store sqlite:///{path} can no longer be written: the permissions of {path} (or its -wal file) "
        "changed while this process used it",
        f"lost the store sqlite:///{path} became read-only while this process used it (the database {path} is "
        "read-only (file permissions, or mode=ro / immutable in the URL): kvlab can read it but not write to it): "
        "nothing it writes is kept any more"]
    with Store(f"sqlite:///file:{path}?mode=ro&uri=true") as read_only:
        read_only.check_intact()
        with pytest.raises(StoreReadOnlyError):
            read_only.log_event(1, "a write")


def test_postgres_and_memory_stores_have_no_file_to_lose(db_url):
    for url in (db_url, "sqlite://"):
        with Store(url) as store:
            store.check_intact()


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite:///file::memory:?uri=true",
                                 "sqlite:///file:shared?mode=memory&cache=shared&uri=true"])
def test_an_in_memory_store_is_refused_for_work_other_processes_run(url, tmp_path):
    with pytest.raises(StoreError, match=f"^{re.escape(url)} is an in-memory SQLite database, which only this process"):
        require_shared_store(url)
    require_shared_store(f"sqlite:///{tmp_path / 'kvlab.sqlite'}")
    require_shared_store("postgresql://kvlab:secret@db.example:5432/kvlab")  # never connected to here


def test_the_head_read_from_the_migration_files_is_alembics():
    """``head_revision`` reads the files (alembic's import costs every ``kvlab ls`` 0.2 s): it must name the
    head alembic's own script directory names, and one only."""
    from kvlab.store.migrate import _script, head_revision

    assert [head_revision()] == _script().get_heads()


def test_load_levels_are_stored_once_per_trial_and_level_and_none_after_a_cancel(store, monkeypatch):
    """A [load] table's levels: each (trial, mode, level) once (a resumed trial skips what it has), in trial
    position then level, a first error redacted, nothing after the trial was cancelled."""
    monkeypatch.setenv("TEST_API_KEY", "sk-load-secret-123456")
    experiment_id = store.create_experiment(make_spec(2), ENV)
    first, second = store.claim_trials("w1", max_trials=2)
    result = {"mode": "closed", "level": 4.0, "first_error": "HTTP 401: bad key sk-load-secret-123456"}
    assert store.add_load_level(second.id, "closed", 4.0, result)
    assert store.add_load_level(first.id, "closed", 4.0, result) and store.add_load_level(first.id, "closed", 1.0, {})
    assert not store.add_load_level(first.id, "closed", 4.0, result)  # already there
    levels = store.load_levels(experiment_id)
    assert [(level.trial_id, level.level) for level in levels] == [(first.id, 1.0), (first.id, 4.0), (second.id, 4.0)]
    assert levels[0].config_name == first.config_name and "sk-load-secret" not in str(levels[1].result)
    assert [level.level for level in store.load_levels(experiment_id, second.id)] == [4.0]
    store.cancel_experiment(experiment_id)
    assert not store.add_load_level(first.id, "open", 2.0, {})
