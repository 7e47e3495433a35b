"""How long a running experiment has left, and where its time went so far: an estimate, with its basis.

The unit of work is an **evaluation**: one item under one config (one stored item result).  The pace
is wall-clock seconds per evaluation, so it holds whatever the run shares (a prefill shared by the
configs a worker claims together, several workers in parallel, the model's load):

* once the run has done :data:`MIN_OWN_EVALUATIONS`, its own pace since it started;
* before that, the median pace of this model's latest finished runs on the same backend (at most
  :data:`PAST_RUNS`), each from its start to its end;
* with neither, no estimate.

The estimate moves with the clock, never standing still while nothing lands: a past runs' pace is their
whole wall time per evaluation, the model's load included, so their estimate of this run is a span from
its first claim (``planned x pace``), counted down from there -- and once it is spent, how far past it the
run is; the run's own pace is its time so far per evaluation, which grows while an evaluation takes long.
Its :attr:`Eta.stage` says where the run is: ``queued`` (no worker has claimed it: the wait so far, then the
estimate), ``starting`` (claimed, no evaluation yet: the model's load and its first items) or ``evaluating``.

The time so far is split at the experiment's own marks: queued (created -> the first claim), the
model's load (the workers' telemetry samples in the ``load`` phase) and evaluating (the rest).
Pure functions over store records: the experiment page and its tests call them alike.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from kvlab.store.records import ExperimentRecord, TelemetrySample, TrialRecord

#: Evaluations of its own after which a run's pace replaces its past runs' (before, a model load
#: and the first prefill weigh too much in it).
MIN_OWN_EVALUATIONS = 4
#: The latest finished runs of the same model and backend whose pace is pooled.
PAST_RUNS = 5


@dataclass(frozen=True)
class Pace:
    """Wall-clock seconds per evaluation, and what they were measured on (words for a page)."""

    seconds_per_evaluation: float
    basis: str


#: Where a run stands, for its estimate (:attr:`Eta.stage`).
STAGES = ("queued", "starting", "evaluating")


@dataclass(frozen=True)
class Eta:
    """An estimate of the time left: the evaluations left at a pace.  ``span_s``: where the pace includes
    the model's load (a past run's), the whole run's estimate from its first claim, of which ``spent_s`` has
    passed; None: the evaluations left times the pace.  ``stage`` (:data:`STAGES`) and ``stage_s``: where
    the run stands and for how long so far (queued: since it was created; starting: since its first claim)."""

    evaluations_left: int
    pace: Pace
    span_s: float | None = None
    spent_s: float = 0.0
    stage: str = "evaluating"
    stage_s: float = 0.0

    @property
    def seconds_left(self) -> float:
        if self.span_s is None:
            return self.evaluations_left * self.pace.seconds_per_evaluation
        return max(0.0, self.span_s - self.spent_s)

    @property
    def overdue_s(self) -> float:
        """How far past its estimate the run is (0 while within it)."""
        return 0.0 if self.span_s is None else max(0.0, self.spent_s - self.span_s)


@dataclass(frozen=True)
class Timeline:
    """Seconds from the experiment's creation to now (or its end), in parts; ``load_s`` is None when no
    telemetry recorded a load (a run without samples, or one that has not been claimed yet)."""

    total_s: float
    queued_s: float
    load_s: float | None
    evaluating_s: float


def _utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _seconds(start: datetime, end: datetime) -> float:
    return max(0.0, (_utc(end) - _utc(start)).total_seconds())


def evaluations_planned(trials: Sequence[TrialRecord], per_config: int | None) -> int | None:
    """Evaluations the trials will make in all: each trial's item total once a worker has counted it,
    else its item limit, else ``per_config`` (the spec's planned items per config); None when a trial's
    count is unknown and no ``per_config`` is given."""
    total = 0
    for trial in trials:
        known = trial.items_total if trial.items_total is not None else per_config
        if known is None:
            return None
        total += min(known, trial.item_limit) if trial.item_limit is not None else known
    return total


def own_pace(experiment: ExperimentRecord, now: datetime) -> Pace | None:
    """The run's own pace since its first claim, once it has :data:`MIN_OWN_EVALUATIONS`."""
    if experiment.started_at is None or experiment.items_done < MIN_OWN_EVALUATIONS:
        return None
    elapsed = _seconds(experiment.started_at, experiment.finished_at or now)
    per = elapsed / experiment.items_done
    return Pace(per, f"this run's own pace: {per:.2g} s per evaluation over its {experiment.items_done} "
                     "evaluations so far (the model's load included)")


def past_pace(experiment: ExperimentRecord, past: Sequence[ExperimentRecord]) -> Pace | None:
    """The median pace of the latest :data:`PAST_RUNS` finished (done) runs of the same model on the
    same backend in ``past`` (the experiment itself and runs without a start, an end or a result left
    out), each its wall time from start to end over its evaluations."""
    runs = sorted((e for e in past if e.id != experiment.id and e.status == "done" and e.model == experiment.model
                   and e.backend_kind == experiment.backend_kind and e.started_at is not None
                   and e.finished_at is not None and e.items_done > 0),
                  key=lambda e: _utc(e.finished_at or e.created_at), reverse=True)[:PAST_RUNS]
    if not runs:
        return None
    per = statistics.median(_seconds(e.started_at, e.finished_at) / e.items_done  # type: ignore[arg-type]
                            for e in runs)
    which = "run" if len(runs) == 1 else f"{len(runs)} runs"
    return Pace(per, f"the pace of {experiment.model}'s last finished {which} on {experiment.backend_kind} "
                     f"({', '.join(f'#{e.id}' for e in runs)}): {per:.2g} s per evaluation, the model's load "
                     "included")


def estimate(experiment: ExperimentRecord, trials: Sequence[TrialRecord], past: Sequence[ExperimentRecord],
             now: datetime, per_config: int | None = None) -> Eta | None:
    """The time left of a queued or running experiment at ``now``: its evaluations left at its own pace,
    else its past runs' span counted from its first claim (module docstring); None once it has ended, or
    without a pace or a count."""
    if experiment.is_terminal:
        return None
    planned = evaluations_planned(trials, per_config)
    if planned is None:
        return None
    left = max(0, planned - experiment.items_done)
    if (own := own_pace(experiment, now)) is not None:
        return Eta(left, own)
    pace = past_pace(experiment, past)
    if pace is None:
        return None
    span = planned * pace.seconds_per_evaluation
    if experiment.started_at is None:
        return Eta(left, pace, span, 0.0, "queued", _seconds(experiment.created_at, now))
    spent = _seconds(experiment.started_at, now)
    return Eta(left, pace, span, spent, "starting" if experiment.items_done == 0 else "evaluating", spent)


def load_seconds(samples: Sequence[TelemetrySample]) -> float | None:
    """Seconds the workers spent loading the model: per worker, each run of ``load`` samples up to the
    next sample in another phase (or its last load sample), summed; the longest worker's (workers load
    in parallel).  None without a load sample."""
    by_worker: dict[str, list[TelemetrySample]] = defaultdict(list)
    for sample in samples:
        by_worker[sample.worker_id].append(sample)
    spans = []
    for rows in by_worker.values():
        rows.sort(key=lambda s: s.ts)
        spent, start = 0.0, None
        for sample in rows:
            if sample.phase == "load" and start is None:
                start = sample.ts
            elif sample.phase != "load" and start is not None:
                spent, start = spent + sample.ts - start, None
        if start is not None:
            spent += rows[-1].ts - start
        if any(s.phase == "load" for s in rows):
            spans.append(spent)
    return max(spans) if spans else None


def timeline(experiment: ExperimentRecord, samples: Sequence[TelemetrySample], now: datetime) -> Timeline:
    """Where the experiment's time went: from its creation to its end (to ``now`` while it runs)."""
    end = experiment.finished_at or now
    total = _seconds(experiment.created_at, end)
    if experiment.started_at is None:
        return Timeline(total, total, None, 0.0)
    queued = _seconds(experiment.created_at, experiment.started_at)
    load = load_seconds(samples)
    running = max(0.0, total - queued)
    load = min(load, running) if load is not None else None
    return Timeline(total, queued, load, running - (load or 0.0))
