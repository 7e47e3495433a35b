"""The one launch contract: :func:`submit` refuses a spec that cannot run (:func:`refuse`: one line,
nothing stored), stores the experiment (a sweep or a tune alike: :func:`store_experiment`), then
hands it to an :class:`Executor`, and returns its id with whatever the executor returned.

Every front end submits through it: ``kvlab run`` (:class:`InThisProcess`; on Ray
:class:`kvlab.experiments.ray_run.OnRay`), ``kvlab run --background``, ``kvlab rerun`` and the
dashboard's sweeps (:class:`LocalWorkers`; on Ray :class:`kvlab.experiments.ray_driver.RayDriver`),
``kvlab tune`` (:class:`kvlab.tune.session.TuneHere`), ``kvlab tune --background`` and the dashboard's
Tune (:class:`kvlab.tune.session.DetachedTune`).

What can be checked without the model is refused before anything is stored, for every executor.
An executor that loads the model in this process (``kvlab run``, ``kvlab tune``) loads it before the
experiment is stored, so a model that does not load, or a config or item its engine refuses, stores
nothing either.  Work that other processes run (queued for workers, which may be on any host
sharing the store; a detached tune; Ray) leaves what only the model, the server or the endpoint can
tell to the process that runs it, which fails the stored experiment with the reason.

A front end served to others (the dashboard) submits with :class:`PageLimits`: what a page may queue
beyond what every front end may (task files, and where the key its worker reads may go).

Every function opens the store of ``KVLAB_DATABASE_URL`` (else db/kvlab.sqlite), the one the
local workers inherit; they log to :func:`kvlab.paths.log_dir`.
"""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from tqdm import tqdm

from kvlab.core.backends import BACKENDS
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import ExperimentSpec, parse_spec, spec_to_dict
from kvlab.core.results import ItemResult
from kvlab.core.tasks import FileParams
from kvlab.core.tune_spec import TuneSpec, grid_size, rungs
from kvlab.engines.base import Engine
from kvlab.engines.factory import build_engine
from kvlab.engines.host import refuse_spec_here
from kvlab.errlog import debug_enabled
from kvlab.experiments import launcher
from kvlab.experiments.provenance import environment
from kvlab.experiments.runner import ExperimentRun, missing_baseline
from kvlab.experiments.worker import Worker
from kvlab.experiments.worker_settings import WorkerSettings
from kvlab.secrets import BASE_URL_VAR, key_destinations, key_for, read_setting
from kvlab.spec_files import check_on_this_host
from kvlab.store import ExperimentStore, Store, StoreError, require_shared_store
from kvlab.tasks import check_task_files, planned_items

Handle = TypeVar("Handle", covariant=True)
#: How an executor starts the stored experiment (the open store, its id); returns its handle.
Start = Callable[[Store, int], Handle]


class Executor(Protocol[Handle]):
    """Where a submitted experiment runs."""

    def refuse(self, spec: ExperimentSpec) -> None:
        """Raise (ConfigError, StoreError: one line) what this executor cannot take, checked without
        the model before anything is stored: an in-memory store for other processes, a Ray address
        where no cluster answers."""

    def ready(self, spec: ExperimentSpec) -> AbstractContextManager[Start[Handle]]:
        """What it needs before the experiment is stored (an in-process executor loads the model and
        checks the configs here, so that a refusal stores nothing), held until the context closes;
        yields how it starts the stored experiment."""


@dataclass(frozen=True)
class Submitted(Generic[Handle]):
    """A stored experiment and what its executor returned (a run's results, the processes started)."""

    experiment_id: int
    handle: Handle


class RunCancelled(KeyboardInterrupt):
    """Ctrl-C while :class:`InThisProcess` runs it: the experiment was cancelled in the store, its results kept."""

    def __init__(self, experiment_id: int, results_kept: int) -> None:
        super().__init__(f"experiment {experiment_id} cancelled, {results_kept} results kept")
        self.experiment_id, self.results_kept = experiment_id, results_kept


@dataclass(frozen=True)
class PageLimits:
    """What a spec submitted from a web page (the dashboard, which may be served to a team) is held to
    besides what every front end's is.  A page's user chose the spec, not the dashboard's owner, and the
    process that runs it reads the dashboard's settings as ``kvlab run`` would:

    - task files only under ``files_under`` (the data directory): a path typed on a page reaches no other file;
    - a key only where it belongs (:func:`queued_key_problem`): the worker sends the key in ``api_key_env`` to
      the spec's ``base_url``, so a spec aiming it elsewhere is refused, as a page's own request would go
      without it (:func:`kvlab.secrets.key_for`).
    """

    files_under: Path

    def refuse(self, spec: ExperimentSpec) -> None:
        _refuse_files_outside(spec, self.files_under)
        backend = spec.backend
        if problem := queued_key_problem(backend.kind, backend.api_key_env, backend.base_url):
            raise ConfigError(problem)


def queued_key_problem(kind: str, key_var: str, base_url: str | None) -> str | None:
    """Why a run queued from a page may not go to ``base_url`` (blank: ``KVLAB_BASE_URL``'s, as the engine
    fills it) with the key in ``key_var``, in one line naming the variable and the URL it belongs to; None
    when the key would go where it belongs, when ``key_var`` is not set (no key is sent), or when the
    backend sends none (the embedded engine, a server kvlab launches).  Read from this process's environment
    and secrets file, which the local workers it starts inherit."""
    url = (base_url or "").strip() or read_setting(BASE_URL_VAR)[0]
    if "api_key_env" not in BACKENDS[kind].fields or not url:  # no key read, or no endpoint: nothing is sent
        return None
    try:
        choice = key_for(key_var, url)
    except ValueError as error:  # a variable that holds no key (validation refuses it first)
        return f"backend.api_key_env: {error}"
    if not choice.withheld:
        return None
    return (f"backend.base_url: {choice.withheld}, so the dashboard does not queue a run whose worker would send "
            f"it; set {key_destinations(key_var)[0]} to this endpoint in the dashboard's environment or "
            ".streamlit/secrets.toml, name a key variable that belongs to it (or one that is not set, for an "
            "endpoint that needs no key), or run the spec with `kvlab run`")


def submit(spec: ExperimentSpec, executor: Executor[Handle], warnings: Sequence[str] = (), *,
           page: PageLimits | None = None) -> Submitted[Handle]:
    """Refuse (:func:`refuse`), store with ``warnings`` as warning events (:func:`store_experiment`), then
    start on ``executor``.  ``page``: submitted from a web page, held to its limits too."""
    spec = refuse(spec, executor, page)
    return _store_and_start(spec, executor, lambda store: store_experiment(store, spec, warnings))


def rerun(experiment_id: int, workers: int = 1, *, page: PageLimits | None = None) -> int:
    """Queue the experiment's spec again as a new experiment (refused as :func:`submit` refuses a new
    one, from a ``page`` with its limits) and start ``workers`` local workers; returns the new id."""
    executor = LocalWorkers(workers)
    require_shared_store()  # before the store is read: an in-memory one has nothing to rerun
    with Store() as store:
        spec = refuse(parse_spec(store.get_experiment(experiment_id).spec, stored=True), executor, page)
    return _store_and_start(
        spec, executor, lambda store: store.rerun_experiment(experiment_id, environment(torch_facts=False))
    ).experiment_id


def refuse(spec: ExperimentSpec, executor: Executor[object], page: PageLimits | None = None) -> ExperimentSpec:
    """The refusal policy of every launch, checked before anything is stored or loaded: the spec as it
    will be stored must validate (a front end's overrides skip validation), a ``page``'s limits must hold,
    its jsonl task files must be valid, what this host's files tell must fit
    (:func:`kvlab.spec_files.check_on_this_host`), then the executor's own refusals.  Returns the spec
    with its jsonl paths absolute, as a worker started elsewhere needs them."""
    parse_spec(spec_to_dict(spec))
    if page is not None:
        page.refuse(spec)
    spec = check_task_files(spec)
    check_on_this_host(spec)
    executor.refuse(spec)
    return spec


def store_experiment(store: ExperimentStore, spec: ExperimentSpec, warnings: Sequence[str] = ()) -> int:
    """Store a queued experiment with this host's environment (without torch's facts: the worker that
    runs it records its own); a tune with its search recorded, waiting for its driver.  Its warnings
    become warning events.  Refused first if this host's files say it cannot run
    (:func:`kvlab.spec_files.check_on_this_host`): a caller may store without :func:`refuse`."""
    check_on_this_host(spec)
    if spec.tune is not None:
        experiment_id, notes = _store_tune(store, spec, spec.tune), list(warnings)  # a tune's baseline is its own
    else:
        experiment_id = store.create_experiment(spec, environment(torch_facts=False))
        notes = [*warnings, *missing_baseline(spec)]
    for warning in notes:
        store.log_event(experiment_id, warning, level="warning")
    return experiment_id


def _store_tune(store: ExperimentStore, spec: ExperimentSpec, tune: TuneSpec) -> int:
    """Store a new tune: the experiment with its baseline (and any fixed ``[[configs]]``) on the first
    round's items, and its search, which the driver that takes it over runs (``kvlab.tune``)."""
    n_items = 0
    for index, task in enumerate(spec.tasks):
        count = planned_items(task)
        if count is None:
            if isinstance(task.params, FileParams):
                raise ConfigError(f"tasks.{index}.path: {task.params.path} cannot be read here")
            raise ConfigError(f"tasks.{index}: the {task.name} task's items cannot be counted here")
        n_items += count
    rounds = rungs(n_items, tune.min_items, tune.eta)
    experiment_id = store.create_experiment(spec, environment(torch_facts=False), item_limit=rounds[0])
    points, evals = grid_size(tune, spec.backend.kind, n_items)
    store.start_tune(experiment_id, points, evals, driver_id=None)
    store.log_event(experiment_id, f"tune: {points} configs in the search space ({evals} item evaluations as a "
                    f"full grid); rounds of {', '.join(map(str, rounds))} items")
    return experiment_id


def _store_and_start(spec: ExperimentSpec, executor: Executor[Handle],
                     store_it: Callable[[Store], int]) -> Submitted[Handle]:
    with executor.ready(spec) as start, Store() as store:
        experiment_id = store_it(store)
        return Submitted(experiment_id, start(store, experiment_id))


def _refuse_files_outside(spec: ExperimentSpec, root: Path) -> None:
    from kvlab.tasks.data_dir import resolve_data_path

    for index, task in enumerate(spec.tasks):
        if isinstance(task.params, FileParams):
            try:
                resolve_data_path(task.params.path, root)
            except ConfigError as error:
                raise ConfigError(f"tasks.{index}.path: {error}") from None


# -- executors -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalWorkers:
    """Queue the experiment for ``kvlab worker`` processes and start ``count`` of them here (0: none;
    workers on any host sharing the store may claim it too)."""

    count: int = 1

    def refuse(self, spec: ExperimentSpec) -> None:
        require_shared_store()
        if self.count:  # the workers started here must be able to run it
            refuse_spec_here(spec)

    @contextmanager
    def ready(self, spec: ExperimentSpec) -> Iterator[Start[list[subprocess.Popen[bytes]]]]:
        yield lambda store, experiment_id: launcher.start_local_workers(self.count) if self.count else []


@dataclass(frozen=True)
class InThisProcess:
    """Run the experiment with a worker in this process that claims only its trials (``kvlab run``);
    the handle is its :class:`ExperimentRun`, as stored, once it has ended (a failure is its
    ``failure``; the experiment then failed).  Raises :class:`RunCancelled` on Ctrl-C.

    The engine is built and the configs checked before the experiment is stored (``starting()`` is
    called first), so a model that is not pulled or a config the engine refuses stores nothing;
    ``announce(id, store URL)`` is called once it is stored.  ``limit``: only the first items."""

    limit: int | None = None
    progress: bool = False
    starting: Callable[[], None] = lambda: None
    announce: Callable[[int, str], None] = lambda experiment_id, url: None

    def refuse(self, spec: ExperimentSpec) -> None:
        """What this host cannot run (the store may be in memory: this process runs it)."""
        refuse_spec_here(spec)

    @contextmanager
    def ready(self, spec: ExperimentSpec) -> Iterator[Start[ExperimentRun]]:
        started, started_at = time.perf_counter(), datetime.now(UTC).isoformat(timespec="seconds")
        self.starting()
        engine = build_engine(spec)
        try:
            engine.check_configs(spec.all_configs())  # refusals (a server not installed...) store nothing
            described = engine.describe()  # an endpoint is probed here, before anything is stored

            def start(store: ExperimentStore, experiment_id: int) -> ExperimentRun:
                if self.limit:
                    store.log_event(experiment_id, f"kvlab run --limit {self.limit}: only the first {self.limit} "
                                                   "items of the spec")
                self.announce(experiment_id, store.url)
                failure = _work(store, experiment_id, spec, engine, self.limit, self.progress)
                record = store.get_experiment(experiment_id)
                return ExperimentRun(
                    spec=spec, configs=spec.all_configs(), results=store.item_results(experiment_id),
                    engine=described, environment={"versions": record.versions, "git_commit": record.git_commit,
                                                   "hardware": record.hardware},
                    started_at=started_at, wall_s=time.perf_counter() - started, warnings=missing_baseline(spec),
                    failure=failure, load=store.load_levels(experiment_id))

            yield start
        finally:
            engine.close()


def _work(store: ExperimentStore, experiment_id: int, spec: ExperimentSpec, engine: Engine, limit: int | None,
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
def cancelled_on_ctrl_c(store: ExperimentStore, experiment_id: int) -> Iterator[None]:
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
    """The in-process worker's log lines would repeat what ``kvlab run`` reports (except with KVLAB_DEBUG)."""
    logger = logging.getLogger("kvlab.experiments.worker")
    level = logger.level
    if not debug_enabled():
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)
