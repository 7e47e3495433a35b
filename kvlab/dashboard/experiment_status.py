"""Where an experiment stands, in the same words on the experiments list and on its own page: its kind (a sweep
or a tune), its progress and trials (a tune's as the tune page counts them), how long it has taken."""

from __future__ import annotations

from datetime import UTC, datetime

from kvlab.experiments.eta import timeline
from kvlab.store.records import ExperimentRecord
from kvlab.tune.progress import Budgets


def experiment_duration(experiment: ExperimentRecord, now: datetime | None = None) -> float:
    """Seconds from its creation to its end (to now while it runs): the queue and the model's load included
    (:func:`kvlab.experiments.eta.timeline` parts them)."""
    return timeline(experiment, (), now or datetime.now(UTC)).total_s


def kind(experiment: ExperimentRecord) -> str:
    """``tune`` for a tune's experiment (its spec has a [tune] table), else ``sweep``."""
    return "tune" if experiment.spec.get("tune") is not None else "sweep"


def _tune_trials(experiment: ExperimentRecord, budgets: Budgets | None) -> tuple[int, int | None, str]:
    """(a tune's trials, the most it runs or None, what the count is of): its trials done as the tune page
    counts them (:class:`kvlab.tune.progress.Budgets`: judged on every item or stopped early) where
    ``budgets`` are given, else the candidates it proposed (every trial but the baseline's) of its max_trials."""
    if budgets is not None:
        return budgets.done, budgets.most, "done"
    return max(0, experiment.trials_total - 1), (experiment.spec.get("tune") or {}).get("max_trials"), "proposed"


def progress(experiment: ExperimentRecord, budgets: Budgets | None = None) -> float | None:
    """Fraction done in [0, 1]: a sweep's items where their totals are known, else its trials; a tune's as
    its page's bar (:attr:`kvlab.tune.progress.Budgets.fraction`) where its ``budgets`` are read, else the
    candidates it proposed of its max_trials (None without max_trials: its budget is time or evaluations)."""
    if kind(experiment) == "tune":
        if experiment.status == "done":
            return 1.0
        if budgets is not None:
            return budgets.fraction
        count, most, _ = _tune_trials(experiment, None)
        return min(1.0, count / most) if most else None
    if experiment.items_total:
        return min(1.0, experiment.items_done / experiment.items_total)
    if experiment.trials_total:
        ended = experiment.trials_done + experiment.trials_failed + experiment.trials_cancelled
        return ended / experiment.trials_total
    return 0.0


def trials_text(experiment: ExperimentRecord, budgets: Budgets | None = None) -> str:
    """A sweep's trials ended of its trials (``3/4``); a tune's trials of the most it runs, in the tune
    page's words (``3 of 4 trials done``), never a percentage of items."""
    if kind(experiment) == "tune":
        count, most, what = _tune_trials(experiment, budgets)
        return f"{count} of {most} trials {what}" if most else f"{count} trials {what} (no max_trials)"
    return f"{experiment.trials_done}/{experiment.trials_total}"
