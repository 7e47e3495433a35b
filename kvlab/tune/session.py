"""A tune's store record, its driver in this process, and the two executors that run one.

A tune is submitted like any experiment (:func:`kvlab.experiments.submit.submit`), which stores it
with the baseline (and any fixed ``[[configs]]``) on the first round's items and
the search recorded, with no driver yet.  Its driver then takes it over and drives it with a worker
in this process that claims only its trials (as ``kvlab run`` does); ``kvlab worker`` processes on
other hosts may serve the same tune.

* :class:`TuneHere` (``kvlab tune SPEC``): this process drives it; the model loads, and the whole
  space is checked, before it is stored, so a refusal stores nothing.
* :class:`DetachedTune` (``kvlab tune --background``, the dashboard's Tune): stored at once, then a
  detached ``kvlab tune --drive ID`` on this host drives it (:func:`drive_stored`); what that process
  refuses before the first round fails the tune, with the reason.

``kvlab tune --resume ID`` (:func:`drive_stored` too) takes over a tune whose driver died.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from kvlab.core.experiment_spec import ExperimentSpec, parse_spec
from kvlab.core.items import TaskItem
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.tune_spec import backend_space, candidate_grid
from kvlab.engines.base import Engine, EngineFailure
from kvlab.engines.factory import build_engine, task_tokenizer
from kvlab.engines.host import refuse_spec_here
from kvlab.errlog import one_line
from kvlab.experiments import launcher
from kvlab.experiments.runner import build_items
from kvlab.experiments.submit import Start
from kvlab.experiments.worker import Worker, new_worker_id
from kvlab.experiments.worker_settings import WorkerSettings
from kvlab.store import ExperimentStore, Store, require_shared_store
from kvlab.tune.driver import Tuner

#: The driver's own worker takes a whole round at once: its trials share each item's prefill.
ROUND_BATCH = 1000


@dataclass
class InProcessWorkers:
    """The driver's executor: a worker in this process that claims only the tune's trials, waiting
    while workers elsewhere finish the ones they hold.  Without a worker (``kvlab tune --workers
    0``) it only waits: ``kvlab worker`` processes on any host run the rounds."""

    store: ExperimentStore
    worker: Worker | None
    say: Callable[[str], None]
    gone: Callable[[], str | None] = lambda: None  # why the workers elsewhere (Ray actors) all ended, if so
    poll_s: float = 0.5
    _waiting_said: bool = False

    def drain(self, experiment_id: int, stopping: Callable[[], bool]) -> None:
        while not stopping():
            if self.worker is not None and self.worker.run_once():
                continue
            why = self.worker.left_behind().get(experiment_id) if self.worker is not None else self.gone()
            if why is not None:
                raise EngineFailure(f"this host cannot run the tune's trials: {why}")
            trials = self.store.trials(experiment_id)
            if not any(t.status in ("queued", "running") for t in trials):
                return
            if self.worker is None and not self._waiting_said and not any(t.status == "running" for t in trials):
                self.say(f"waiting for workers: start `kvlab worker` on any host using this store "
                         f"({self.store.url})")
                self._waiting_said = True
            time.sleep(self.poll_s)


@dataclass
class TuneOutcome:
    experiment_id: int
    answer: dict[str, Any]
    store_url: str


@dataclass(frozen=True)
class Driving:
    """How this process drives a tune.  ``workers``: 1 runs the rounds with a worker in this process
    (the model loads here); 0 only drives, and ``kvlab worker`` processes elsewhere run them (the
    tokenizer alone loads here).  ``on_ray``: the rounds run on one Ray actor per node of the cluster
    at ``ray_address`` (:mod:`kvlab.experiments.ray_executor`), which stop when the tune ends.
    ``say``: one line per step for the terminal; ``announce(id, store URL)``: once it is taken over."""

    workers: int = 1
    on_ray: bool = False
    ray_address: str | None = None
    say: Callable[[str], None] = print
    announce: Callable[[int, str], None] = lambda experiment_id, url: None

    @property
    def local_workers(self) -> int:
        return 0 if self.on_ray else self.workers

    def check_ray(self) -> None:
        """On Ray, refused at once (one line), before the tune is stored or taken over: an address where
        no cluster answers, an in-memory store (the actors are other processes)."""
        if self.on_ray:
            from kvlab.experiments.ray_executor import refuse_ray_run

            refuse_ray_run(self.ray_address)


@dataclass(frozen=True)
class TuneHere(Driving):
    """The executor of ``kvlab tune SPEC``: this process drives the tune to its end; the handle is
    its :class:`TuneOutcome`."""

    def refuse(self, spec: ExperimentSpec) -> None:
        self.check_ray()

    @contextmanager
    def ready(self, spec: ExperimentSpec) -> Iterator[Start[TuneOutcome]]:
        with _prepared(spec, self) as (engine, items):

            def start(store: ExperimentStore, experiment_id: int) -> TuneOutcome:
                driver_id = new_worker_id()
                store.take_over_tune(experiment_id, driver_id)  # stored a moment ago, with no driver yet
                return _drive(store, experiment_id, spec, engine, items, self, driver_id, first=True)

            yield start


@dataclass(frozen=True)
class DetachedTune:
    """The executor of ``kvlab tune --background`` and the dashboard's Tune: a detached ``kvlab tune
    --drive ID`` on this host drives the stored tune (its log in :func:`kvlab.paths.log_dir`); the
    handle is its :class:`~kvlab.experiments.launcher.BackgroundTune`."""

    def refuse(self, spec: ExperimentSpec) -> None:
        require_shared_store()  # the tune's process must see the store this one does
        refuse_tune_here(spec)  # its in-process worker runs here

    @contextmanager
    def ready(self, spec: ExperimentSpec) -> Iterator[Start[launcher.BackgroundTune]]:
        yield lambda store, experiment_id: launcher.start_tune_driver(["--drive", str(experiment_id)])


def drive_stored(experiment_id: int, *, resuming: bool, driving: Driving = Driving()) -> TuneOutcome:
    """Take over the stored tune of ``experiment_id`` and drive it to its end: a tune a
    :class:`DetachedTune` stored (``kvlab tune --drive``; what is refused before its first round fails
    it), or one whose driver stopped (``resuming``: ``kvlab tune --resume``, its orphaned trials requeued)."""
    driving.check_ray()
    driver_id = new_worker_id()
    with Store() as store:
        store.take_over_tune(experiment_id, driver_id)
        if resuming:
            store.requeue_orphans(experiment_id)
        spec = parse_spec(store.get_experiment(experiment_id).spec, stored=True)
        with ExitStack() as stack:
            try:
                engine, items = stack.enter_context(_prepared(spec, driving))
            except Exception as error:
                if not resuming:
                    _fail(store, experiment_id, error)
                raise
            if resuming:
                driving.say(f"resuming the tune of experiment {experiment_id}")
            return _drive(store, experiment_id, spec, engine, items, driving, driver_id, first=not resuming)


def refuse_tune_here(spec: ExperimentSpec) -> None:
    """Refuse a tune whose space holds a setting this host's server cannot run (its worker runs here)."""
    assert spec.tune is not None, "a tune's spec has a [tune] table"
    space, _ = backend_space(spec.tune, spec.backend.kind)
    refuse_spec_here(spec, [*spec.all_configs(), *(KVCacheConfig(**p) for p in candidate_grid(space))])


@contextmanager
def _prepared(spec: ExperimentSpec, driving: Driving) -> Iterator[tuple[Engine | None, list[TaskItem]]]:
    """What the driver needs before its first round, held while it drives: the engine of its
    in-process worker (None: the rounds run elsewhere), which has checked the whole space (so that
    no candidate is refused halfway) and every item, and the spec's items in the workers' order."""
    assert spec.tune is not None, "the CLI checks for a [tune] table"
    if driving.local_workers:
        refuse_tune_here(spec)  # before the model loads
        driving.say(f"loading {spec.model} (its first load takes a while)")
    engine = build_engine(spec) if driving.local_workers else None
    try:
        if engine is not None:
            space, _ = backend_space(spec.tune, spec.backend.kind)
            engine.check_configs([*spec.all_configs(), *(KVCacheConfig(**p) for p in candidate_grid(space))])
        tokenizer = engine.tokenizer if engine is not None else task_tokenizer(spec.model)[0]
        items = build_items(spec, tokenizer)
        if engine is not None:
            engine.check_items(items)
        yield engine, items
    finally:
        if engine is not None:
            engine.close()


def _drive(store: ExperimentStore, experiment_id: int, spec: ExperimentSpec, engine: Engine | None,
           items: list[TaskItem], driving: Driving, driver_id: str, first: bool) -> TuneOutcome:
    """Drive the tune this process has taken over as ``driver_id``; on its ``first`` drive, what fails
    before the first round fails the tune."""
    driving.announce(experiment_id, store.url)
    worker = None if engine is None else Worker(
        store, WorkerSettings(max_trials=ROUND_BATCH), engine_factory=lambda _spec: engine,
        experiment_id=experiment_id)
    with ExitStack() as stack:
        executor = InProcessWorkers(store, worker, driving.say)
        try:
            if driving.on_ray:
                executor.gone = _ray_rounds(stack, experiment_id, spec, driving.ray_address)
            tuner = Tuner(store, experiment_id, spec, items, executor, driver_id, say=driving.say)
        except Exception as error:
            if first:
                _fail(store, experiment_id, error)
            raise
        return TuneOutcome(experiment_id, tuner.run(), store.url)


def _fail(store: ExperimentStore, experiment_id: int, error: Exception) -> None:
    """End a tune whose driver could not start it, with the reason (the tune page and `kvlab show` say it)."""
    store.finish_tune(experiment_id, "failed", None, one_line(str(error)))


def _ray_rounds(stack: ExitStack, experiment_id: int, spec: ExperimentSpec,
                address: str | None) -> Callable[[], str | None]:
    """Start the tune's Ray workers (stopped when ``stack`` closes); returns the executor's ``gone``."""
    from kvlab.experiments.ray_executor import RayWorkers

    assert spec.tune is not None
    # half a round each: on two nodes both take part, and each still shares its items' prefill
    settings = WorkerSettings(max_trials=max(1, math.ceil(spec.tune.candidates_per_round / 2)))
    actors = stack.enter_context(RayWorkers(None, experiment_id, spec, address, exit_when_idle=False,
                                            settings=settings))

    def gone() -> str | None:
        ended = actors.outcomes()
        if len(ended) < len(actors.actors):
            return None
        return "every Ray worker ended: " + "; ".join(f"{o.worker_id}: {o.error or 'returned'}" for o in ended)

    return gone
