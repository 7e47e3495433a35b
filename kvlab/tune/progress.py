"""Where a tune stands, as plain data: its candidates, the Pareto front so far, the hypervolume over
trials, and the item evaluations used against the full grid's.

Read from what the store holds (:meth:`Store.candidates`, :meth:`Store.trials`), so the dashboard's
tune page and the CLI show the same numbers.  Pure functions: no streamlit, no optuna.

Which points count (for the front, the hypervolume and the best so far): **feasible** ones only --
candidates judged on every item (state ``complete``) whose paired 95% interval of the accuracy
difference lies above ``-max_drop`` (non-inferior; a complete candidate also passed the latency
limits, else the judge stopped it).  Stopped and still-active candidates are drawn but never count.

A candidate still ``active`` when its tune has ended (cancelled, or failed) never finished: it is shown as
``unfinished`` (:data:`UNFINISHED`), with the reason, never as running or waiting -- the store keeps its
last verdict on its first items, which is not a verdict on the candidate.  Its tune's page, ``kvlab show``
and the experiments list all read it through :func:`points` and :func:`of_tune`.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kvlab.core.experiment_spec import ExperimentSpec
from kvlab.core.margins import DEFAULT_MAX_DROP
from kvlab.core.results import ItemResult
from kvlab.core.tune_spec import TuneSpec, backend_space, grid_points, rungs
from kvlab.core.units import MIB
from kvlab.store.records import CandidateRecord, ExperimentRecord, TrialRecord, TuneRecord, baseline_trial

#: A candidate's state as shown: the store's (active | stopped | complete), or this one for a candidate
#: left active by a tune that has ended -- it was never judged on every item, nor stopped by the judge.
UNFINISHED = "unfinished"
#: States of a candidate that finished: judged on every item, or stopped early by the judge.
FINISHED = ("complete", "stopped")
#: How a tune that ended without finishing its search ended, in words (its TUNE_STATES other than running, done).
ENDED = {"cancelled": "was cancelled", "failed": "failed"}


@dataclass(frozen=True)
class Point:
    """A candidate as the tune page shows it (the baseline is not one)."""

    trial_id: int
    label: str
    number: int | None  # Optuna's trial number; None for a fixed [[configs]] entry
    state: str  # active | stopped | complete
    reason: str | None
    rung: int
    judged_items: int
    accuracy: float | None
    diff: float | None
    diff_low: float | None
    diff_high: float | None
    kv_bytes: float | None
    ttft_ms: float | None
    tpot_ms: float | None
    feasible: bool
    mean_kl: float | None = None  # fidelity against the baseline, where measured

    @property
    def finished(self) -> bool:
        """Judged on every item, or stopped early (not active, not :data:`UNFINISHED`)."""
        return self.state in FINISHED


def baseline_measures(results: Sequence[ItemResult]) -> tuple[float | None, float | None]:
    """The baseline's mean physical KV bytes and accuracy over the items it has done (an item that
    raised scores 0, as the judge counts it); None without results."""
    kv = [r.physical_kv_bytes for r in results if r.physical_kv_bytes is not None]
    scores = [float(r.score) if r.score is not None and r.error is None else 0.0 for r in results]
    return (sum(kv) / len(kv) if kv else None), (sum(scores) / len(scores) if scores else None)


def is_feasible(candidate: CandidateRecord, max_drop: float) -> bool:
    """Complete and accepted by the sweet-spot rule on its items (a tune before fidelity: shown
    non-inferior at ``max_drop``; see the module docstring)."""
    if candidate.state != "complete" or candidate.kv_bytes is None or candidate.accuracy is None:
        return False
    if candidate.acceptable is not None:
        return candidate.acceptable
    return candidate.diff_low is not None and candidate.diff_low > -max_drop


def shown_state(candidate: CandidateRecord, tune_state: str) -> tuple[str, str | None]:
    """A candidate's state and reason as every view shows them: the store's, except that one left
    ``active`` by a tune that is no longer running is :data:`UNFINISHED`, the reason saying how its tune ended."""
    if candidate.state == "active" and tune_state != "running":
        return UNFINISHED, f"the tune {ENDED.get(tune_state, tune_state)} before it was judged on every item"
    return candidate.state, candidate.reason


def points(candidates: Sequence[CandidateRecord], trials: Sequence[TrialRecord], max_drop: float,
           tune_state: str = "running") -> list[Point]:
    """The candidates in trial order (the order the tune proposed them), the baseline left out;
    ``tune_state``: the tune's (:func:`shown_state`)."""
    labels = {t.id: t.config_name for t in trials}
    base = baseline_trial(trials)
    return [Point(trial_id=c.trial_id, label=labels.get(c.trial_id, f"trial {c.trial_id}"), number=c.number,
                  state=state, reason=reason, rung=c.rung, judged_items=c.judged_items, accuracy=c.accuracy,
                  diff=c.diff, diff_low=c.diff_low, diff_high=c.diff_high, kv_bytes=c.kv_bytes, ttft_ms=c.ttft_ms,
                  tpot_ms=c.tpot_ms, feasible=is_feasible(c, max_drop), mean_kl=c.mean_kl)
            for c in sorted(candidates, key=lambda c: c.trial_id) if base is None or c.trial_id != base.id
            for state, reason in [shown_state(c, tune_state)]]


def dominates(a: Point, b: Point) -> bool:
    """``a`` is no bigger and no less accurate than ``b``, and better on one of the two."""
    assert a.kv_bytes is not None and a.accuracy is not None and b.kv_bytes is not None and b.accuracy is not None
    return (a.kv_bytes <= b.kv_bytes and a.accuracy >= b.accuracy
            and (a.kv_bytes < b.kv_bytes or a.accuracy > b.accuracy))


def pareto_front(shown: Sequence[Point]) -> list[Point]:
    """The feasible points no other feasible point dominates, from the smallest to the biggest."""
    feasible = [p for p in shown if p.feasible]
    front = [p for p in feasible if not any(dominates(q, p) for q in feasible)]
    return sorted(front, key=lambda p: (p.kv_bytes, -(p.accuracy or 0.0)))


def hypervolume(values: Sequence[tuple[float, float]], reference: tuple[float, float]) -> float:
    """The 2-D hypervolume of ``(kv_bytes, accuracy)`` points, bytes minimised and accuracy maximised:
    the area between ``reference`` (worst bytes, worst accuracy) and the union of the rectangles each
    point dominates.  A point no better than the reference on both counts adds nothing."""
    ref_bytes, ref_accuracy = reference
    inside = sorted((b, a) for b, a in values if b < ref_bytes and a > ref_accuracy)
    area, best = 0.0, ref_accuracy
    for index, (kv, accuracy) in enumerate(inside):  # ascending bytes: each strip up to the next point
        best = max(best, accuracy)
        right = inside[index + 1][0] if index + 1 < len(inside) else ref_bytes
        area += (right - kv) * (best - ref_accuracy)
    return area


def hypervolume_history(shown: Sequence[Point], baseline_kv_bytes: float) -> list[float]:
    """After each candidate (trial order), the hypervolume of the feasible ones so far, reference
    (baseline bytes, accuracy 0), as a fraction of the box [0, baseline bytes] x [0, 1]: 1.0 would be
    a config of no bytes at full accuracy."""
    if baseline_kv_bytes <= 0:
        return [0.0 for _ in shown]
    history: list[float] = []
    counted: list[tuple[float, float]] = []
    for point in shown:
        if point.feasible:
            assert point.kv_bytes is not None and point.accuracy is not None  # feasible: measured (is_feasible)
            counted.append((point.kv_bytes, point.accuracy))
        history.append(hypervolume(counted, (baseline_kv_bytes, 0.0)) / baseline_kv_bytes)
    return history


def best_so_far(shown: Sequence[Point]) -> Point | None:
    """The current answer while the tune runs: the most compressed feasible candidate (the sweet-spot
    rule's choice among those judged on every item; the final one also applies Holm's correction)."""
    return min((p for p in shown if p.feasible), key=lambda p: (p.kv_bytes, -(p.accuracy or 0.0)), default=None)


def item_evals(trials: Sequence[TrialRecord]) -> int:
    """Item x config evaluations done so far, the baseline's included (what the budget counts)."""
    return sum(t.items_done for t in trials)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def interval_text(point: Point) -> str:
    if point.diff is None:
        return "-"
    return f"{point.diff:+.3f} [{_fmt(point.diff_low, '+.3f')}, {_fmt(point.diff_high, '+.3f')}]"


def candidate_rows(shown: Sequence[Point]) -> list[dict[str, Any]]:
    """The candidates table (and its CSV): one row per candidate, in trial order."""
    return [{"label": p.label, "trial": p.number if p.number is not None else "-", "state": p.state,
             "rung/items": f"{p.rung}/{p.judged_items}", "accuracy": _fmt(p.accuracy, ".3f"),
             "diff [low, high]": interval_text(p),
             "KV (MiB)": _fmt(None if p.kv_bytes is None else p.kv_bytes / MIB, ".3f"),
             "feasible": "yes" if p.feasible else "no",
             "reason": p.reason or ("judged on every item" if p.state == "complete" else
                                    "running or waiting for its next round" if p.state == "active" else "")}
            for p in shown]


def rows_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """The candidates table as CSV (the tune page's export)."""
    out = io.StringIO()
    if rows:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return out.getvalue()


def counts(shown: Sequence[Point]) -> Mapping[str, int]:
    """How many candidates are in each state."""
    tally = {"active": 0, "stopped": 0, "complete": 0, UNFINISHED: 0}
    for point in shown:
        tally[point.state] = tally.get(point.state, 0) + 1
    return tally


@dataclass(frozen=True)
class Budgets:
    """How far a tune is in its own terms: the sampler's trials (candidates it proposed) that ended,
    of the most it will propose, and its time and evaluation budgets -- never a percentage of items,
    which a tune does not know in advance (its rounds give each candidate more items or none)."""

    done: int  # trials ended: judged on every item, or stopped early
    active: int  # trials still running or waiting for their next round
    most: int | None  # max_trials, or the space's size where that is smaller; None without max_trials
    max_trials: int | None
    elapsed_s: float  # since the search started (to its end once ended)
    max_minutes: float | None
    item_evals: int
    max_item_evals: int | None
    unfinished: int = 0  # trials its ended tune left unjudged (cancelled or failed mid-way): :data:`UNFINISHED`

    @property
    def pace_s(self) -> float | None:
        """Seconds of the tune per trial ended so far (its rounds run trials side by side: the
        throughput, not one trial's duration); None before the first ends."""
        return self.elapsed_s / self.done if self.done else None

    @property
    def fraction(self) -> float:
        """How far along, in [0, 1] (the tune page's bar, the experiments list's progress): trials done of
        the most it runs, else its time budget spent, else its evaluations'; 0 with none of them."""
        if self.most:
            return min(1.0, self.done / self.most)
        if self.max_minutes:
            return min(1.0, self.elapsed_s / (self.max_minutes * 60))
        return min(1.0, self.item_evals / self.max_item_evals) if self.max_item_evals else 0.0


@dataclass(frozen=True)
class Estimate:
    """Seconds left, and which budget gives them: ``trials`` (trials left x :attr:`Budgets.pace_s`),
    ``minutes`` (max_minutes left) or ``item_evals`` (evaluations left at the pace so far)."""

    seconds: float
    basis: str


def budgets(shown: Sequence[Point], tune: TuneSpec, grid_points: int, elapsed_s: float, used: int) -> Budgets:
    """The :class:`Budgets` of a tune whose candidates are ``shown`` (a fixed ``[[configs]]`` entry is
    no trial of the sampler's), its effective ``[tune]`` table (:func:`kvlab.core.tune_spec.backend_space`)
    and its space's ``grid_points``."""
    proposed = [p for p in shown if p.number is not None]
    most = min(tune.max_trials, grid_points) if tune.max_trials is not None else None
    return Budgets(done=sum(1 for p in proposed if p.finished),
                   active=sum(1 for p in proposed if p.state == "active"), most=most, max_trials=tune.max_trials,
                   elapsed_s=elapsed_s, max_minutes=tune.max_minutes, item_evals=used,
                   max_item_evals=tune.max_item_evals, unfinished=sum(1 for p in proposed if p.state == UNFINISHED))


def elapsed_s(tune: TuneRecord, now: datetime | None = None) -> float:
    """Seconds since the search started, to its end once it has ended (SQLite hands back naive UTC)."""
    start, end = tune.started_at, tune.finished_at or now or datetime.now(UTC)
    return (end.replace(tzinfo=end.tzinfo or UTC) - start.replace(tzinfo=start.tzinfo or UTC)).total_seconds()


def of_tune(experiment: ExperimentRecord, tune: TuneRecord, candidates: Sequence[CandidateRecord],
            trials: Sequence[TrialRecord], now: datetime | None = None) -> tuple[list[Point], Budgets]:
    """A stored tune's candidates as shown and its budgets, as the tune page, the experiments list and
    ``kvlab show`` all count them."""
    shown = points(candidates, trials, float(experiment.spec.get("max_drop", DEFAULT_MAX_DROP)), tune.state)
    space, _ = backend_space(TuneSpec.model_validate(experiment.spec["tune"]), experiment.backend_kind)
    return shown, budgets(shown, space, tune.grid_points, elapsed_s(tune, now), item_evals(trials))


def ending_text(tune_state: str, state: Budgets) -> str | None:
    """What an ended tune that gave no recommendation finished and what it did not, in one line
    (``was cancelled before its search finished: 0 of 11 trials done, 3 unfinished``); None while it runs or
    once it is done.  Its own words and numbers only (the state is one of the store's TUNE_STATES): no escaping."""
    if tune_state in ("running", "done"):
        return None
    done = f"{state.done} of {state.most} trials done" if state.most is not None else f"{state.done} trials done"
    return (f"{ENDED.get(tune_state, tune_state)} before its search finished: {done}"
            + (f", {state.unfinished} unfinished" if state.unfinished else ""))


def eta(state: Budgets) -> Estimate | None:
    """An estimate of the time left from the tune's own pace: the first budget to run out (the search
    stops at whichever comes first); None before anything gives a pace and without a time budget."""
    estimates = []
    if state.most is not None and state.pace_s is not None:
        estimates.append(Estimate(max(0, state.most - state.done) * state.pace_s, "trials"))
    if state.max_minutes is not None:
        estimates.append(Estimate(max(0.0, state.max_minutes * 60 - state.elapsed_s), "minutes"))
    if state.max_item_evals is not None and state.item_evals:
        per_eval = state.elapsed_s / state.item_evals
        estimates.append(Estimate(max(0, state.max_item_evals - state.item_evals) * per_eval, "item_evals"))
    return min(estimates, key=lambda e: e.seconds, default=None)


@dataclass(frozen=True)
class Plan:
    """What a tune of a spec will search and how it starts, before it runs (the form's preview)."""

    grid_points: int  # configs of the space on the spec's backend, the baseline excluded
    grid_item_evals: int  # the equivalent full grid: every point and the baseline on every item
    rounds: list[int]  # items per rung
    first_candidates: int  # candidates of the first round
    first_item_evals: int  # the first round's evaluations, the baseline's included
    budget: str  # the stopping rule, in words
    notes: list[str]  # what the backend leaves out of the space


def plan(spec: ExperimentSpec, n_items: int) -> Plan:
    """The tune ``spec`` describes, on ``n_items`` items (``spec.tune`` must be set)."""
    assert spec.tune is not None
    tune, notes = backend_space(spec.tune, spec.backend.kind)
    points = grid_points(tune)
    sizes = rungs(n_items, tune.min_items, tune.eta) if n_items else [0]
    first = min(tune.candidates_per_round, points, tune.max_trials or points)
    limits = [f"{tune.max_trials} candidates" if tune.max_trials is not None else "",
              f"{tune.max_minutes:g} minutes" if tune.max_minutes is not None else "",
              f"{tune.max_item_evals:,} item evaluations" if tune.max_item_evals is not None else ""]
    return Plan(grid_points=points, grid_item_evals=(points + 1) * n_items, rounds=sizes, first_candidates=first,
                first_item_evals=(first + 1) * sizes[0], budget=_either([x for x in limits if x]), notes=notes)


def _either(limits: list[str]) -> str:
    return limits[0] if len(limits) == 1 else " or ".join(limits) + ", whichever comes first"
