"""Starting or resuming a tune in this process: the store, the driver, and the workers that run it.

``kvlab tune SPEC`` stores a new experiment with the baseline (and any fixed ``[[configs]]``) on the
first rung's items, records the tune, and drives it with an in-process worker that claims only
its trials (as ``kvlab run`` does); ``kvlab worker`` processes on other hosts may serve the same
tune.  ``kvlab tune --resume ID`` takes over a tune whose driver died.  The dashboard's Tune mode
starts ``kvlab tune`` as a background process.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from kvlab.config import ConfigError, ExperimentSpec, KVCacheConfig, parse_spec
from kvlab.engines.base import EngineFailure
from kvlab.engines.factory import build_engine, task_tokenizer
from kvlab.experiments.provenance import environment
from kvlab.experiments.runner import build_items
from kvlab.experiments.worker import Worker, new_worker_id
from kvlab.experiments.worker_settings import WorkerSettings
from kvlab.store import Store
from kvlab.tune.driver import Tuner, grid_size, study_name
from kvlab.tune.judge import rungs
from kvlab.tune.spec import backend_space, candidate_grid

#: The driver's own worker takes a whole round at once: its trials share each item's prefill.
ROUND_BATCH = 1000


@dataclass
class InProcessWorkers:
    """The driver's executor: a worker in this process that claims only the tune's trials, waiting
    while workers elsewhere finish the ones they hold.  Without a worker (``kvlab tune --workers
    0``) it only waits: ``kvlab worker`` processes on any host run the rounds."""

    store: Store
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


def tune_here(spec: ExperimentSpec | None, warnings: Sequence[str] = (), *, resume: int | None = None,
              workers: int = 1, ray_address: str | None = None, on_ray: bool = False,
              say: Callable[[str], None] = print,
              announce: Callable[[int, str], None] = lambda experiment_id, url: None) -> TuneOutcome:
    """Run a new tune of ``spec`` (or resume experiment ``resume``) to its end in this process.

    ``workers``: 1 runs the rounds with a worker in this process (the model loads here); 0 only
    drives, and ``kvlab worker`` processes elsewhere run them (the tokenizer alone loads here).
    ``on_ray``: the rounds run on one Ray actor per node of the cluster at ``ray_address``
    (:mod:`kvlab.experiments.ray_executor`), which stop when the tune ends.
    """
    driver_id = new_worker_id()
    workers = 0 if on_ray else workers
    with Store() as store:
        if resume is not None:
            store.take_over_tune(resume, driver_id)
            store.requeue_orphans(resume)
            spec = parse_spec(store.get_experiment(resume).spec)
        assert spec is not None and spec.tune is not None, "the CLI checks for a [tune] table"
        if workers:
            say(f"loading {spec.model} (its first load takes a while)")
        engine = build_engine(spec) if workers else None
        try:
            if engine is not None:  # the whole space, so that no candidate is refused halfway
                space, _ = backend_space(spec.tune, spec.backend.kind)
                engine.check_configs([*spec.all_configs(), *(KVCacheConfig(**p) for p in candidate_grid(space))])
            tokenizer = engine.tokenizer if engine is not None else task_tokenizer(spec.model)[0]
            items = build_items(spec, tokenizer)
            if engine is not None:
                engine.check_items(items)
            if resume is None:
                experiment_id = _create(store, spec, warnings, len(items), driver_id)
            else:
                experiment_id = resume
                say(f"resuming the tune of experiment {resume}")
            announce(experiment_id, store.url)
            worker = None if engine is None else Worker(
                store, WorkerSettings(max_trials=ROUND_BATCH), engine_factory=lambda _spec: engine,
                experiment_id=experiment_id)
            with ExitStack() as stack:
                executor = InProcessWorkers(store, worker, say)
                if on_ray:
                    executor.gone = _ray_rounds(stack, experiment_id, spec, ray_address)
                tuner = Tuner(store, experiment_id, spec, items, executor, driver_id, say=say)
                return TuneOutcome(experiment_id, tuner.run(), store.url)
        finally:
            if engine is not None:
                engine.close()


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


def _create(store: Store, spec: ExperimentSpec, warnings: Sequence[str], n_items: int, driver_id: str) -> int:
    tune = spec.tune
    if tune is None:
        raise ConfigError("the spec has no [tune] table")
    first = rungs(n_items, tune.min_items, tune.eta)[0]
    experiment_id = store.create_experiment(spec, environment(torch_facts=False), item_limit=first)
    points, evals = grid_size(spec, n_items)
    store.start_tune(experiment_id, study_name(experiment_id), points, evals, driver_id)
    for warning in warnings:
        store.log_event(experiment_id, warning, level="warning")
    store.log_event(experiment_id, f"tune: {points} configs in the search space ({evals} item evaluations as a "
                    f"full grid); rounds of {', '.join(map(str, rungs(n_items, tune.min_items, tune.eta)))} items")
    return experiment_id
