"""``kvlab run SPEC --executor ray``: the experiment, once stored, runs in :class:`RayWorkers`; this
process waits for it and returns its results (:class:`OnRay`).

The same contract as :class:`kvlab.experiments.submit.InThisProcess` (an :class:`ExperimentRun` as
stored, :class:`RunCancelled` on Ctrl-C) but the trials run in Ray actors, one per node, and nothing is
loaded in this process: the model loads on the nodes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from tqdm import tqdm

from kvlab.core.experiment_spec import ExperimentSpec
from kvlab.experiments.ray_executor import RayWorkers, WorkerOutcome, refuse_ray_run
from kvlab.experiments.runner import ExperimentRun, missing_baseline
from kvlab.experiments.submit import Start, cancelled_on_ctrl_c
from kvlab.store import ExperimentStore


@dataclass(frozen=True)
class OnRay:
    """Run the stored experiment on the Ray cluster at ``address`` and return once it has ended.  A
    cluster that cannot take it (no Ray, an address where no cluster answers, an in-memory store,
    SQLite on several nodes, no node big enough) leaves nothing stored.  ``starting()`` is called
    once it is refused nothing; ``announce``, ``limit`` and ``progress`` as for ``InThisProcess``."""

    address: str | None = None
    limit: int | None = None
    progress: bool = False
    starting: Callable[[], None] = lambda: None
    announce: Callable[[int, str], None] = lambda experiment_id, url: None

    def refuse(self, spec: ExperimentSpec) -> None:
        refuse_ray_run(self.address)

    @contextmanager
    def ready(self, spec: ExperimentSpec) -> Iterator[Start[ExperimentRun]]:
        self.starting()
        yield lambda store, experiment_id: self._run(store, experiment_id, spec)

    def _run(self, store: ExperimentStore, experiment_id: int, spec: ExperimentSpec) -> ExperimentRun:
        started, started_at = time.perf_counter(), datetime.now(UTC).isoformat(timespec="seconds")
        if self.limit:
            store.log_event(experiment_id, f"kvlab run --limit {self.limit}: only the first {self.limit} items of "
                                           "the spec")
        try:
            workers = RayWorkers(None, experiment_id, spec, self.address, item_limit=self.limit)
        except BaseException:
            store.delete_experiment(experiment_id)
            raise
        with workers:
            self.announce(experiment_id, store.url)
            outcomes = _wait(store, experiment_id, workers, spec.name, self.progress)
        failure = settle(store, experiment_id, outcomes)
        record = store.get_experiment(experiment_id)
        return ExperimentRun(
            spec=spec, configs=spec.all_configs(), results=store.item_results(experiment_id),
            engine={"kind": spec.backend.kind, "model": spec.model, "executor": "ray",
                    "workers": sorted(o.worker_id for o in outcomes)},
            environment={"versions": record.versions, "git_commit": record.git_commit, "hardware": record.hardware},
            started_at=started_at, wall_s=time.perf_counter() - started, warnings=missing_baseline(spec),
            failure=failure)


def _wait(store: ExperimentStore, experiment_id: int, workers: RayWorkers, name: str,
          progress: bool) -> list[WorkerOutcome]:
    """Until the workers return, with a progress bar read from the store; Ctrl-C cancels the experiment."""
    with tqdm(total=None, disable=not progress, unit="eval", desc=name) as bar:

        def advance() -> bool:
            record = store.get_experiment(experiment_id)
            if record.items_total and bar.total != record.items_total:
                bar.total = record.items_total
                bar.refresh()
            if record.items_done > bar.n:
                bar.update(record.items_done - bar.n)
            return False

        with cancelled_on_ctrl_c(store, experiment_id):
            return workers.wait(stop_when=advance if progress else None)


def settle(store: ExperimentStore, experiment_id: int, outcomes: list[WorkerOutcome]) -> str | None:
    """Why the experiment did not end done, if so; one the workers all left unfinished is failed here
    (nothing else would run it) with their reason."""
    record = store.get_experiment(experiment_id)
    if record.status == "done":
        return None
    if record.status == "failed":
        return next((t.error for t in store.trials(experiment_id) if t.error), record.error)
    if record.status == "cancelled":
        return f"experiment {experiment_id} was cancelled while it ran (`kvlab cancel` or the dashboard)"
    # (an outcome without an error has experiments left behind: `or {}` only tells the type checker)
    why = next((o.error or next(iter((o.left_behind or {}).values())) for o in outcomes if o.error or o.left_behind),
               "the Ray workers ended before the experiment did")
    for trial in store.trials(experiment_id):
        store.finish_trial(trial.id, "failed", why)
    return why
