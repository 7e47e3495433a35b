"""A worker meeting a spec this kvlab cannot run fails the trials with the reason, and goes on."""

from __future__ import annotations

from sqlalchemy import update

from kvlab.config import parse_spec
from kvlab.store import Store
from kvlab.store.models import ExperimentRow
from kvlab.worker import Worker, WorkerSettings

SPEC = {"name": "stale-spec", "tasks": [{"name": "passkey", "context_lengths": [256]}],
        "configs": [{"name": "baseline"}, {"name": "int4", "quant": "int4"}]}


def test_unrunnable_stored_spec_fails_trials_with_a_message(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'kvlab.sqlite'}")
    experiment_id = store.create_experiment(parse_spec(SPEC), {})
    broken = dict(store.get_experiment(experiment_id).spec)
    broken["configs"] = [{"name": "int3", "quant": "int3"}]  # e.g. written by a newer kvlab
    with store.engine.begin() as connection:
        connection.execute(update(ExperimentRow).where(ExperimentRow.id == experiment_id).values(spec=broken))

    def no_engine(spec):
        raise AssertionError("the model must not load for a spec that does not validate")

    worker = Worker(store, WorkerSettings(exit_when_idle=True, heartbeat_s=0.2), engine_factory=no_engine)
    worker.run()
    trials = store.trials(experiment_id)
    assert {t.status for t in trials} == {"failed"}
    assert all("ConfigError" in t.error and "configs.0.quant" in t.error for t in trials)
    assert store.get_experiment(experiment_id).status == "failed"
    assert any(e.level == "error" for e in store.events(experiment_id))
