"""Whose problem is it: a spec this kvlab cannot run fails its trials; a problem of the worker's host
(bad options, a model it lacks, an engine that crashes) gives them back to the queue; a deleted
or cancelled experiment is dropped and the worker goes on."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import parse_spec
from kvlab.engines.base import Engine, EngineFailure
from kvlab.experiments.worker import Worker, WorkerGaveUp
from kvlab.experiments.worker_settings import WorkerSettings
from kvlab.models import ModelNotAvailableError
from kvlab.store import Store
from kvlab.store.tables import ExperimentRow

SPEC = {"name": "stale-spec", "tasks": [{"name": "passkey", "context_lengths": [256]}],
        "configs": [{"name": "baseline"}, {"name": "int4", "quant": "int4"}]}
SMALL = {"name": "small", "seed": 1,
         "tasks": [{"name": "passkey", "context_lengths": [256], "depths": [0.5], "num_items": 1, "max_new_tokens": 2}],
         "configs": [{"name": "baseline"}, {"name": "int8", "quant": "int8"}]}
FAST = {"heartbeat_s": 0.2, "poll_s": 0.1, "exit_when_idle": True}


@pytest.fixture
def store(tmp_path):
    with Store(f"sqlite:///{tmp_path / 'kvlab.sqlite'}") as store:
        yield store


def _missing_model(spec):
    raise ModelNotAvailableError(f"Model {spec.model!r} is not pulled yet. Get it with:  "
                                 f"kvlab models pull {spec.model}")


class _Faulty:
    """The real embedded engine, with ``actions[n]`` run (a fault raised, an experiment deleted...)
    just before its ``n``-th result (counted from 0 across batches)."""

    def __init__(self, engine, actions):
        self._engine, self._actions = engine, actions
        self.results = 0

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def evaluate_many(self, work):  # one result at a time, through evaluate (where the faults are)
        return Engine.evaluate_many(self, work)

    def evaluate(self, item, configs):
        for result in self._engine.evaluate(item, configs):
            if self.results in self._actions:
                self._actions.pop(self.results)()
            self.results += 1
            yield result

    def close(self):
        pass  # the session's engine stays loaded


def _raise(error):
    def action():
        raise error
    return action


@pytest.mark.parametrize(("options", "named"), [
    ({"telemetry_hz": 1000}, "--telemetry-hz 1000: allowed a number in 0.1..20"),
    ({"telemetry_hz": 0}, "--telemetry-hz 0"),
    ({"max_trials": 0}, "--max-trials 0: allowed a whole number in 1..1000"),
    ({"max_trials": 2.5}, "--max-trials 2.5"),
    ({"heartbeat_s": 0}, "--heartbeat-s 0"),
    ({"heartbeat_s": float("nan")}, "--heartbeat-s nan"),
    ({"heartbeat_s": 10, "stale_after_s": 10},
     "--stale-after-s 10: allowed a number in 20..604800 seconds (at least twice"),
    ({"stale_after_s": float("inf")}, "--stale-after-s inf"),
    ({"threads": 0}, "--threads 0"),
    ({"on_stale": "ignore"}, "--on-stale 'ignore': one of requeue, fail"),
    ({"backoff_s": -1}, "--backoff-s -1"),
    ({"max_failures": 0}, "--max-failures 0"),
])
def test_bad_settings_are_refused_naming_the_flag(options, named):
    with pytest.raises(ConfigError) as refused:
        WorkerSettings(**options)
    assert str(refused.value).startswith(named) and "\n" not in str(refused.value)


def test_unrunnable_stored_spec_fails_trials_with_a_message(store):
    experiment_id = store.create_experiment(parse_spec(SPEC), {})
    broken = dict(store.get_experiment(experiment_id).spec)
    broken["configs"] = [{"name": "int3", "quant": "int3"}]  # e.g. written by a newer kvlab
    with store.engine.begin() as connection:
        connection.execute(update(ExperimentRow).where(ExperimentRow.id == experiment_id).values(spec=broken))

    def no_engine(spec):
        raise AssertionError("the model must not load for a spec that does not validate")

    worker = Worker(store, WorkerSettings(**FAST), engine_factory=no_engine)
    worker.run()
    trials = store.trials(experiment_id)
    assert {t.status for t in trials} == {"failed"}
    assert all(t.error.startswith("configs.0.quant") for t in trials)  # the message alone, as the CLI shows it
    assert store.get_experiment(experiment_id).status == "failed"
    assert any(e.level == "error" for e in store.events(experiment_id))
    assert worker.left_behind() == {}


def test_release_trials_gives_back_only_what_the_worker_still_runs(store):
    experiment_id = store.create_experiment(parse_spec(SMALL), {})
    first, second = store.claim_trials("w1", max_trials=2)
    assert store.release_trials("w2", [first.id, second.id], "not mine") == []
    store.finish_trial(second.id, "done", worker_id="w1")
    assert store.release_trials("w1", [first.id, second.id], "model not pulled here") == [first.id]
    trial = store.get_trial(first.id)
    assert (trial.status, trial.worker_id, trial.attempts) == ("queued", None, 1)
    warning = store.events(experiment_id)[-1]
    assert warning.level == "warning" and "worker w1" in warning.message and "model not pulled here" in warning.message
    assert [t.id for t in store.claim_trials("w3")] == [first.id]
    store.cancel_experiment(experiment_id)
    assert store.release_trials("w3", [first.id], "too late") == []


def test_a_host_without_the_model_gives_the_trials_back_and_backs_off(store):
    experiment_id = store.create_experiment(parse_spec(SMALL), {})
    worker = Worker(store, WorkerSettings(**FAST), worker_id="host-b-1", engine_factory=_missing_model)
    worker.run()  # exit_when_idle: the only experiment left is the one it backed off from
    assert {t.status for t in store.trials(experiment_id)} == {"queued"}
    assert store.get_experiment(experiment_id).status != "failed"
    warnings = [e.message for e in store.events(experiment_id) if e.level == "warning"]
    assert len(warnings) == 1 and "host-b-1" in warnings[0] and "not pulled yet" in warnings[0]
    assert "ModelNotAvailableError" in worker.left_behind()[experiment_id]


def test_a_worker_failing_on_every_batch_gives_up(store):
    ids = [store.create_experiment(parse_spec(SMALL), {}) for _ in range(3)]
    worker = Worker(store, WorkerSettings(**FAST, max_failures=2), engine_factory=_missing_model)
    with pytest.raises(WorkerGaveUp, match="after 2 failures in a row"):
        worker.run()
    assert all(t.status == "queued" for i in ids for t in store.trials(i))
    # one try at each of the first two (it backs off from an experiment it failed on), none at the third
    assert [{t.attempts for t in store.trials(i)} for i in ids] == [{1}, {1}, {0}]


@pytest.mark.model
def test_an_engine_crash_keeps_results_and_another_worker_finishes(store, engine):
    experiment_id = store.create_experiment(parse_spec(SMALL), {})
    crashing = _Faulty(engine, {1: _raise(EngineFailure("CUDA error: an illegal memory access"))})  # 2 results
    Worker(store, WorkerSettings(**FAST), worker_id="crashy", engine_factory=lambda spec: crashing).run()
    assert {t.status for t in store.trials(experiment_id)} == {"queued"}
    assert len(store.item_results(experiment_id)) == 1  # the result before the crash is kept
    assert any("crashy" in e.message and "illegal memory access" in e.message for e in store.events(experiment_id))

    Worker(store, WorkerSettings(**FAST), engine_factory=lambda spec: engine).run()
    assert [t.status for t in store.trials(experiment_id)] == ["done", "done"]
    keys = [(r.config_name, r.item_id) for r in store.item_results(experiment_id)]
    assert len(keys) == len(set(keys)) == 2


@pytest.mark.model
def test_deleted_and_cancelled_experiments_are_dropped_and_the_next_one_runs(store, engine):
    deleted, cancelled, survivor = (store.create_experiment(parse_spec(SMALL), {}) for _ in range(3))
    meddling = _Faulty(engine, {0: lambda: store.delete_experiment(deleted),  # 2 results per experiment
                                2: lambda: store.cancel_experiment(cancelled)})
    Worker(store, WorkerSettings(**FAST), engine_factory=lambda spec: meddling).run()
    assert [e.id for e in store.list_experiments()] == [survivor, cancelled]
    assert store.get_experiment(cancelled).status == "cancelled"
    assert {t.status for t in store.trials(cancelled)} == {"cancelled"}
    assert store.get_experiment(survivor).status == "done" and len(store.item_results(survivor)) == 2


class _LaunchingServers(_Faulty):
    """The real engine, posing as one that launches a server (vLLM, SGLang): records when it is closed
    (its server stopped) against the results stored so far."""

    launches_servers = True

    def __init__(self, engine, store, experiment_id):
        super().__init__(engine, {})
        self._store, self._experiment_id = store, experiment_id
        self.closed_after: list[int] = []

    def close(self):
        self.closed_after.append(len(self._store.item_results(self._experiment_id)))


@pytest.mark.model
def test_a_launched_server_outlives_its_batch_and_stops_when_the_worker_is_idle(store, engine):
    """A server start takes a minute: the next batch of the same experiment keeps the one that is up."""
    experiment_id = store.create_experiment(parse_spec(SMALL), {})
    serving = _LaunchingServers(engine, store, experiment_id)
    Worker(store, WorkerSettings(**FAST, max_trials=1), engine_factory=lambda spec: serving).run()
    assert [t.status for t in store.trials(experiment_id)] == ["done", "done"]  # two batches of one trial
    assert serving.closed_after[0] == 2  # not after the first batch: once nothing was left to claim
