"""Getting an experiment run: stored with its environment and warnings, then run by local worker
processes (:func:`submit`, :func:`rerun`: ``kvlab run --background``, ``kvlab rerun``, the dashboard)
or by a worker in this process that takes only its trials (:func:`run_here`: ``kvlab run``).

Every function opens the store of ``KVLAB_DATABASE_URL`` (else db/kvlab.sqlite), the one the
local workers inherit; they log to :func:`kvlab.paths.log_dir`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime

from tqdm import tqdm

from kvlab.experiments import launcher
from kvlab.config import ExperimentSpec, check_on_this_host
from kvlab.engines.base import Engine
from kvlab.engines.factory import build_engine
from kvlab.errlog import debug_enabled
from kvlab.experiments.provenance import environment
from kvlab.experiments.results import ItemResult
from kvlab.experiments.runner import ExperimentRun, missing_baseline
from kvlab.experiments.worker import Worker
from kvlab.experiments.worker_settings import WorkerSettings
from kvlab.store import Store, StoreError, require_shared_store


class RunCancelled(KeyboardInterrupt):
    """Ctrl-C during :func:`run_here`: the experiment was cancelled in the store, its results kept."""

    def __init__(self, experiment_id: int, results_kept: int) -> None:
        super().__init__(f"experiment {experiment_id} cancelled, {results_kept} results kept")
        self.experiment_id, self.results_kept = experiment_id, results_kept


def store_experiment(store: Store, spec: ExperimentSpec, warnings: Sequence[str] = ()) -> int:
    """Store a queued experiment with this host's environment (without torch's facts: the worker that
    runs it records its own); its warnings become warning events.  Refused first if this host's
    files say it cannot run (:func:`kvlab.config.check_on_this_host`)."""
    check_on_this_host(spec)
    experiment_id = store.create_experiment(spec, environment(torch_facts=False))
    for warning in [*warnings, *missing_baseline(spec)]:
        store.log_event(experiment_id, warning, level="warning")
    return experiment_id


def submit(spec: ExperimentSpec, warnings: Sequence[str] = (), workers: int = 1) -> int:
    """Queue the experiment and start ``workers`` local worker processes (0: none); returns its id."""
    require_shared_store()
    with Store() as store:
        experiment_id = store_experiment(store, spec, warnings)
    if workers:
        launcher.start_local_workers(workers)
    return experiment_id


def rerun(experiment_id: int, workers: int = 1) -> int:
    """Queue the experiment's spec again as a new experiment and start ``workers`` local workers."""
    require_shared_store()
    with Store() as store:
        new_id = store.rerun_experiment(experiment_id, environment(torch_facts=False))
    if workers:
        launcher.start_local_workers(workers)
    return new_id


def run_here(spec: ExperimentSpec, warnings: Sequence[str] = (), *, limit: int | None = None, progress: bool = False,
             announce: Callable[[int, str], None] = lambda experiment_id, url: None) -> ExperimentRun:
    """Store the experiment and run it with a worker in this process that claims only its trials;
    return once it has ended, with its results as stored.  ``announce(id, store URL)`` is called
    once it is stored.  A failure is ``failure`` of the returned run (the experiment then failed).

    The engine is built and the configs checked first, so a model that is not pulled or a config
    the engine refuses stores nothing.  Raises :class:`RunCancelled` on Ctrl-C.
    """
    started, started_at = time.perf_counter(), datetime.now(UTC).isoformat(timespec="seconds")
    check_on_this_host(spec)  # before the model loads
    engine = build_engine(spec)
    try:
        engine.check_configs(spec.all_configs())  # refusals (a server not installed...) store nothing
        described = engine.describe()  # an endpoint is probed here, before anything is stored
        with Store() as store:
            experiment_id = store_experiment(store, spec, warnings)
            if limit:
                store.log_event(experiment_id, f"kvlab run --limit {limit}: only the first {limit} items of the spec")
            announce(experiment_id, store.url)
            failure = _work(store, experiment_id, spec, engine, limit, progress)
            record = store.get_experiment(experiment_id)
            return ExperimentRun(
                spec=spec, configs=spec.all_configs(), results=store.item_results(experiment_id), engine=described,
                environment={"versions": record.versions, "git_commit": record.git_commit, "hardware": record.hardware},
                started_at=started_at, wall_s=time.perf_counter() - started, warnings=missing_baseline(spec),
                failure=failure)
    finally:
        engine.close()


def _work(store: Store, experiment_id: int, spec: ExperimentSpec, engine: Engine, limit: int | None,
          progress: bool) -> str | None:
    """Run the experiment's trials here until it has ended; returns why it did not end done, if so."""
    settings = WorkerSettings(max_trials=min(len(spec.all_configs()), 1000), exit_when_idle=True)
    with tqdm(total=None, disable=not progress, unit="eval", desc=spec.name) as bar:

        def advance(_result: ItemResult) -> None:
            if bar.total is None:  # the worker has set each trial's item count by now
                bar.total = sum(t.items_total or 0 for t in store.trials(experiment_id))
            bar.update(1)

        worker = Worker(store, settings, engine_factory=lambda _spec: engine, experiment_id=experiment_id,
                        item_limit=limit, on_stored=advance)
        with cancelled_on_ctrl_c(store, experiment_id), _worker_log_quiet():
            worker.run()
    why = worker.left_behind().get(experiment_id)
    if why is not None:  # this host could not go on (its trials went back to the queue): the run ends here
        for trial in store.trials(experiment_id):
            store.finish_trial(trial.id, "failed", why)
        return why
    record = store.get_experiment(experiment_id)
    if record.status == "failed":
        return next((t.error for t in store.trials(experiment_id) if t.error), record.error)
    if record.status == "cancelled":
        return f"experiment {experiment_id} was cancelled while it ran (`kvlab cancel` or the dashboard)"
    return None


@contextmanager
def cancelled_on_ctrl_c(store: Store, experiment_id: int) -> Iterator[None]:
    """Ctrl-C while the experiment runs here: cancel it in the store (its results kept) and raise
    :class:`RunCancelled`."""
    try:
        yield
    except KeyboardInterrupt:
        kept = store.get_experiment(experiment_id).items_done
        try:
            store.cancel_experiment(experiment_id)
        except StoreError:
            pass  # it ended meanwhile
        raise RunCancelled(experiment_id, kept) from None


@contextmanager
def _worker_log_quiet() -> Iterator[None]:
    """The in-process worker's log lines would repeat what :func:`run_here` reports (except with KVLAB_DEBUG)."""
    logger = logging.getLogger("kvlab.experiments.worker")
    level = logger.level
    if not debug_enabled():
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)
