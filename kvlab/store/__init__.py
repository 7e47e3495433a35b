"""The experiment store: experiments, their trials, item results, telemetry and events, in SQLite
(one machine, ``db/kvlab.sqlite``) or PostgreSQL (several hosts, ``KVLAB_DATABASE_URL``).

Usage::

    store = Store()                       # a new, empty database gets the schema (the SQLAlchemy store,
                                          # which follows kvlab.store.protocol.ExperimentStore)
    experiment_id = store.create_experiment(spec, kvlab.experiments.provenance.environment())
    trials = store.claim_trials("host-1:worker-0")   # a worker takes configs of the oldest experiment
"""

from kvlab.store.database import require_shared_store
from kvlab.store.errors import (
    ExperimentNotFoundError,
    SchemaOutdatedError,
    StoreError,
    StoreLost,
    StoreReadOnlyError,
    TrialNotFoundError,
)
from kvlab.store.migrate import head_revision
from kvlab.store.protocol import (
    EventLog,
    Experiments,
    ExperimentStore,
    Integrity,
    Results,
    TelemetrySink,
    Tunes,
    WorkQueue,
)
from kvlab.store.records import (
    LEVELS,
    PHASES,
    SOURCES,
    STATUSES,
    TERMINAL_STATUSES,
    EventRecord,
    ExperimentRecord,
    LoadLevelRecord,
    TelemetrySample,
    TrialRecord,
)
from kvlab.store.repository import Store

__all__ = [
    "LEVELS", "PHASES", "SOURCES", "STATUSES", "TERMINAL_STATUSES",
    "EventLog", "EventRecord", "ExperimentNotFoundError", "ExperimentRecord", "ExperimentStore", "Experiments",
    "Integrity", "LoadLevelRecord", "Results", "SchemaOutdatedError", "Store", "TelemetrySink", "Tunes", "WorkQueue",
    "StoreError", "StoreLost", "StoreReadOnlyError", "TelemetrySample", "TrialNotFoundError", "TrialRecord",
    "head_revision", "require_shared_store",
]
