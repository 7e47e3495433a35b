"""An experiment's notes travel with its exports, never with a secret in them."""

from __future__ import annotations

import json

from sqlalchemy import update

from kvlab.experiments.export import experiment_document
from kvlab.store import Store
from kvlab.store.tables import ExperimentRow
from tests.dashboard_data import populate

SECRET = "hunter2-secret"


def test_the_notes_are_exported_with_a_urls_password_masked(tmp_path):
    with Store(f"sqlite:///{tmp_path / 'kvlab.sqlite'}") as store:
        experiment_id = populate(store)
        store.set_notes(experiment_id, f"int4 holds; data at postgresql://kv:{SECRET}@db/kv")
        document = experiment_document(store, experiment_id)
        assert document["experiment"]["notes"].startswith("int4 holds; data at postgresql://")
        assert SECRET not in json.dumps(document)
        # a store an older kvlab wrote, without redacting notes: the export still masks them
        with store.engine.begin() as connection:
            connection.execute(update(ExperimentRow).values(notes=f"postgresql://kv:{SECRET}@db/kv"))
        assert SECRET not in json.dumps(experiment_document(store, experiment_id))
