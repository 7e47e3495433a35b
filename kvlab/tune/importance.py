"""Which parameters of a tune's space matter for a metric: Optuna's own importance evaluator, and the
data of the slice plot (:func:`kvlab.dashboard.tune_charts.slice_figure`), over the tune's candidates so far.

Two sources, joined by Optuna's trial number (:attr:`kvlab.tune.progress.Point.number`):

* the **parameters** are the tune's Optuna study's -- each proposal's values and distributions as
  the sampler asked them (:meth:`kvlab.core.space.ConfigSpace.suggest`), read from the study storage
  beside the store (:meth:`kvlab.store.protocol.Tunes.study_storage_url`), never re-derived from a
  config;
* the **metrics** are the store's latest verdict on each candidate (:mod:`kvlab.tune.progress`):
  the study itself only holds the two objectives (KV bytes, accuracy) of the candidates that ended,
  while the store also has the KL, the latency and the verdicts of candidates still running.

Importance is :class:`optuna.importance.PedAnovaImportanceEvaluator`: Optuna's default evaluator
(fANOVA) needs scikit-learn, which kvlab does not depend on, and PED-ANOVA handles the conditional
parameters of a tune's space (a budget is asked only of an eviction method) by design.  It measures
how much each parameter's distribution among the best candidates (the ``quantile`` of
:func:`importance`) differs from its distribution among all of them.

Optuna is imported where it is used: the tune page imports this module for its Metric control, and
its first chart is drawn before the section that needs Optuna (its import is ~0.3 s on 2 busy cores).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import make_url

from kvlab.tune.progress import Point

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution


@dataclass(frozen=True)
class Metric:
    """A candidate's figure that importance and the slice plot can take as their target."""

    key: str  # its name on the page's Metric control and in the URL
    label: str  # the axis title: name and unit
    higher_is_better: bool
    meaning: str  # a sentence for the page


METRICS: dict[str, Metric] = {metric.key: metric for metric in (
    Metric("ratio held", "compression ratio held (x; 0: did not hold)", True,
           "the tune's own goal under its constraint: the compression ratio (baseline KV bytes / the candidate's) "
           "of a candidate judged on every item and accepted by the sweet-spot rule, 0 for one that ended "
           "otherwise (stopped early, or rejected); candidates still running are left out"),
    Metric("ratio", "compression ratio (x, baseline bytes / physical bytes)", True,
           "the compression ratio measured, whatever the accuracy"),
    Metric("accuracy diff", "accuracy difference vs baseline (paired)", True,
           "the candidate's accuracy minus the baseline's on the same items (0: no loss)"),
    Metric("accuracy", "accuracy (fraction correct)", True, "the fraction of its items answered correctly"),
    Metric("KL", "mean KL vs baseline (nats per token)", False,
           "the mean KL divergence of the candidate's next-token distribution from the baseline's"),
    Metric("TTFT", "TTFT (ms, median)", False, "the median time to the first token"),
    Metric("TPOT", "TPOT (ms, median)", False, "the median time per output token after the first"),
)}
DEFAULT_METRIC = "ratio held"
#: PED-ANOVA's ``target_quantile`` by default (Optuna's: the best 10%) ...
TOP_QUANTILE = 0.1
#: ... but at least this many candidates among "the best" (the best one alone says little).
MIN_TOP = 2


def metric_value(metric: Metric, point: Point, baseline_kv_bytes: float | None) -> float | None:
    """``point``'s value of ``metric`` at its latest verdict; None where it has none (not measured,
    or -- for the ratio held -- still running)."""
    ratio = (baseline_kv_bytes / point.kv_bytes if baseline_kv_bytes and point.kv_bytes
             else None)
    value: float | None
    if metric.key == "ratio held":
        if not point.finished:  # active, or left unfinished by its ended tune
            return None
        value = ratio if point.feasible else 0.0
    else:
        value = {"ratio": ratio, "accuracy diff": point.diff, "accuracy": point.accuracy, "KL": point.mean_kl,
                 "TTFT": point.ttft_ms, "TPOT": point.tpot_ms}[metric.key]
    return None if value is None or math.isnan(value) else float(value)


@dataclass(frozen=True)
class Proposal:
    """An Optuna trial's parameters, as its sampler asked them."""

    number: int
    params: dict[str, Any]
    distributions: dict[str, BaseDistribution]


class StudyUnavailable(Exception):
    """The tune's Optuna study cannot be read (its message says why, for the page)."""


def read_proposals(storage_url: str, study_name: str) -> list[Proposal]:
    """The study's trials' parameters, read without creating anything (a SQLite study file that is
    not there is :class:`StudyUnavailable`, not a new empty file)."""
    import optuna

    url = make_url(storage_url)
    if url.get_backend_name() == "sqlite" and not Path(url.database or "").is_file():
        raise StudyUnavailable(f"no Optuna study file beside the store ({Path(url.database or '').name})")
    storage = optuna.storages.RDBStorage(storage_url, skip_compatibility_check=True, skip_table_creation=True)
    try:
        study_id = storage.get_study_id_from_name(study_name)
        trials = storage.get_all_trials(study_id, deepcopy=False)
    except KeyError:
        raise StudyUnavailable(f"the study storage holds no study {study_name!r}") from None
    finally:
        storage.engine.dispose()  # a page reads it every few seconds: no pool left behind each time
    return [Proposal(t.number, dict(t.params), dict(t.distributions)) for t in trials]


@dataclass(frozen=True)
class Sample:
    """A candidate with its parameters and its value of the metric."""

    label: str
    number: int
    state: str  # active | stopped | complete
    judged_items: int
    params: dict[str, Any]
    distributions: dict[str, BaseDistribution]
    value: float


def samples(points: Sequence[Point], proposals: Sequence[Proposal], metric: Metric,
            baseline_kv_bytes: float | None) -> list[Sample]:
    """The candidates the sampler proposed (a fixed ``[[configs]]`` entry has no parameters) that have
    a value of ``metric``, in the order proposed.  A proposal that repeated a config already tried is
    no candidate of its own (its original counts once)."""
    by_number = {p.number: p for p in proposals}
    found = []
    for point in points:
        proposal = by_number.get(point.number) if point.number is not None else None
        value = metric_value(metric, point, baseline_kv_bytes)
        if proposal is not None and value is not None:
            found.append(Sample(point.label, proposal.number, point.state, point.judged_items, proposal.params,
                                proposal.distributions, value))
    return found


def categorical(sample: Sample, name: str) -> bool:
    """Whether the parameter ``name`` of ``sample`` is a choice among values (else a number on a range)."""
    from optuna.distributions import CategoricalDistribution

    return isinstance(sample.distributions[name], CategoricalDistribution)


def varying(found: Sequence[Sample]) -> list[str]:
    """The parameters that take two values or more among ``found``, in the order first asked."""
    seen: dict[str, set[str]] = {}
    for sample in found:
        for name, value in sample.params.items():
            seen.setdefault(name, set()).add(repr(value))
    return [name for name, values in seen.items() if len(values) > 1]


def metric_study(found: Sequence[Sample], metric: Metric) -> optuna.Study:
    """An in-memory Optuna study of ``found`` with ``metric`` as its single objective, in its direction
    (what the importance evaluator reads: "better" is the metric's own sense)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize" if metric.higher_is_better else "minimize")
    study.add_trials([optuna.trial.create_trial(params=s.params, distributions=s.distributions, value=s.value)
                      for s in found])
    return study


@dataclass(frozen=True)
class Importance:
    """Each varying parameter's share of the importance (summing to 1), or why there is none."""

    values: dict[str, float] = field(default_factory=dict)
    why_not: str | None = None
    candidates: int = 0
    quantile: float = TOP_QUANTILE
    notes: tuple[str, ...] = ()  # Optuna's own warnings about this evaluation


def top_quantile(n: int) -> float:
    """PED-ANOVA's ``target_quantile`` for ``n`` candidates: the best 10%, and at least :data:`MIN_TOP`
    of them (below 1: the best must be fewer than all)."""
    return min(0.5, max(TOP_QUANTILE, MIN_TOP / n)) if n else TOP_QUANTILE


def importance(found: Sequence[Sample], metric: Metric) -> Importance:
    """Optuna's PED-ANOVA importance of the varying parameters for ``metric`` (see the module docstring);
    where it cannot say anything, why (too few candidates, no variation, a single parameter)."""
    n = len(found)
    if n < 2:
        return Importance(why_not=f"importance compares candidates: it needs at least 2 with a {metric.label}, "
                          f"and {n} {'has' if n == 1 else 'have'} one so far", candidates=n)
    names = varying(found)
    if not names:
        return Importance(why_not=f"the {n} candidates so far share every parameter value: nothing to compare",
                          candidates=n)
    if len(names) == 1:
        return Importance(why_not=f"only one parameter varies among the {n} candidates so far ({names[0]}): all "
                          "of the variation is its; importance ranks two or more", candidates=n)
    values = {s.value for s in found}
    if len(values) == 1:
        return Importance(why_not=f"all {n} candidates have the same {metric.label} ({found[0].value:g}): "
                          "no parameter makes a difference to it", candidates=n)
    import optuna

    quantile = top_quantile(n)
    evaluator = optuna.importance.PedAnovaImportanceEvaluator(target_quantile=quantile)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = optuna.importance.get_param_importances(metric_study(found, metric), evaluator=evaluator,
                                                         params=names)
    notes = tuple(dict.fromkeys(str(w.message) for w in caught))
    equal = next((note for note in notes if "will be equal" in note), None)
    if equal is not None or not any(result.values()):
        return Importance(why_not=f"Optuna cannot tell the parameters apart on these {n} candidates"
                          + (f" ({equal.rstrip('.')})" if equal else ""), candidates=n, quantile=quantile,
                          notes=notes)
    return Importance(values=dict(result), candidates=n, quantile=quantile, notes=notes)
