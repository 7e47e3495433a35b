"""The sweet-spot rule, task by task: which configs are acceptable, and which criterion said so.

A config is judged on each task apart and is acceptable only when every task that can judge it
accepts it (intersection-union: each task tested at the full level, so no correction across
tasks; Holm across the configs within each task).  Pooled over tasks, a config that breaks one
task could pass on the strength of another: pooled figures are a summary, never the decision.

On a task, with a fidelity margin set (:class:`~kvlab.analysis.decision.Margins`) and fidelity
measured there, the config is acceptable when its fidelity is *certified* within the margin
(:mod:`kvlab.analysis.fidelity`) and its accuracy is not *shown* to drop by more than
``max_drop`` (its paired 95% interval does not lie wholly below ``-max_drop``).  Without fidelity,
it is acceptable when its accuracy is shown non-inferior (:mod:`kvlab.analysis.decision`).

Accuracy cannot *certify* a config on a task on which the baseline scores at or below the task's
chance floor plus ``max_drop`` (the best of the task's known shortcuts, e.g. "answer with the first
number"): a config that keeps the baseline's score there shows nothing.  Fidelity alone certifies
on such a task; without fidelity it does not enter the decision, and the verdict says so.  On every
task, an accuracy interval wholly below ``-max_drop`` rejects (a config can score below the floor).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvlab.analysis.decision import ALPHA_ONE_SIDED, PairedScores, holm
from kvlab.analysis.fidelity import FidelitySummary
from kvlab.core.margins import Margins
from kvlab.core.results import ItemResult

FIDELITY, ACCURACY, NEITHER = "fidelity", "accuracy", "none"
UNMEASURED = "fidelity was not measured (a backend without it, or results stored before kvlab measured it)"


@dataclass(frozen=True)
class TaskVerdict:
    """One config on one task: ``accepted`` is None when the task cannot judge it."""

    task: str
    accepted: bool | None
    criterion: str  # FIDELITY | ACCURACY | NEITHER
    reason: str
    p_adjusted: float | None = None  # Holm across the task's configs, of the criterion that decided
    # the figures it was judged on (None where not measured / not judged by that criterion)
    mean_kl: float | None = None
    kl_low: float | None = None
    kl_high: float | None = None
    agreement: float | None = None
    agreement_low: float | None = None
    agreement_high: float | None = None
    diff: float | None = None  # paired accuracy difference (config - baseline), where accuracy can judge
    diff_low: float | None = None
    diff_high: float | None = None

    def hopeless(self, margins: Margins) -> str | None:
        """Why more items could not make this task accept the config: a whole 95% interval beyond
        a margin (a tune stops such a candidate early); None while it could."""
        if self.diff_high is not None and self.diff_high < -margins.max_drop:
            return (f"{self.task}: accuracy difference [{self.diff_low:+.3f}, {self.diff_high:+.3f}] lies below "
                    f"-{margins.max_drop:g}")
        if (self.criterion == FIDELITY and margins.max_kl > 0 and self.kl_low is not None
                and self.kl_low > margins.max_kl):
            return f"{self.task}: mean KL [{self.kl_low:.3g}, {self.kl_high:.3g}] lies above {margins.max_kl:g}"
        if (self.criterion == FIDELITY and margins.min_agreement > 0 and self.agreement_high is not None
                and self.agreement_high < margins.min_agreement):
            return (f"{self.task}: agreement [{self.agreement_low:.1%}, {self.agreement_high:.1%}] lies below "
                    f"{margins.min_agreement:.0%}")
        return None

    def slack(self, margins: Margins) -> float | None:
        """How far the verdict's bounds are from accepting (<= 0: accepted, uncorrected): the
        constraint a tune's sampler learns from.  None when the task cannot judge."""
        if self.criterion == FIDELITY:
            gaps = ([self.kl_high - margins.max_kl] if margins.max_kl > 0 and self.kl_high is not None else []) + (
                [margins.min_agreement - self.agreement_low]
                if margins.min_agreement > 0 and self.agreement_low is not None else []) + (
                [-margins.max_drop - self.diff_high] if self.diff_high is not None else [])
            return max(gaps) if gaps else None
        if self.criterion == ACCURACY and self.diff_low is not None:
            return -(self.diff_low + margins.max_drop)
        return None

    def plausible(self, margins: Margins) -> bool:
        """Whether the point estimates lie within the margins (a tune promotes only such candidates)."""
        if self.criterion == FIDELITY:
            return ((margins.max_kl <= 0 or (self.mean_kl is not None and self.mean_kl < margins.max_kl))
                    and (margins.min_agreement <= 0 or (self.agreement or 0.0) > margins.min_agreement)
                    and (self.diff is None or self.diff > -margins.max_drop))
        return self.diff is None or self.diff > -margins.max_drop


def chance_floor(baseline_rows: Sequence[ItemResult]) -> float:
    """The best mean score a known shortcut reaches on these items (0 when the task has none)."""
    shortcuts: dict[str, list[float]] = defaultdict(list)
    for row in baseline_rows:
        for name, value in row.extra.get("shortcuts", {}).items():
            shortcuts[name].append(float(value))
    return max((statistics.fmean(values) for values in shortcuts.values()), default=0.0)


@dataclass
class _Case:
    """What one task knows about one config."""

    config: str
    paired: PairedScores | None
    fidelity: FidelitySummary | None
    p_fidelity: float | None = None
    p_accuracy: float | None = None


def judge_tasks(results: Sequence[ItemResult], baseline_name: str, margins: Margins,
                untested: int = 0) -> dict[str, list[TaskVerdict]]:
    """Each compared config's verdict on every task, by config name (``untested``: more configs of
    the family, at p = 1, as in :func:`kvlab.analysis.summary.summarize`)."""
    by_task: dict[str, list[ItemResult]] = defaultdict(list)
    for result in results:
        if result.error is None:
            by_task[result.task].append(result)
    verdicts: dict[str, list[TaskVerdict]] = defaultdict(list)
    for task, rows in by_task.items():
        for verdict in _judge_task(task, rows, baseline_name, margins, untested):
            verdicts[verdict[0]].append(verdict[1])
    return dict(verdicts)


def _judge_task(task: str, rows: list[ItemResult], baseline_name: str, margins: Margins,
                untested: int) -> list[tuple[str, TaskVerdict]]:
    baseline_rows = [r for r in rows if r.config_name == baseline_name]
    base_scores = {r.item_id: r.score for r in baseline_rows if r.score is not None}
    baseline_accuracy = statistics.fmean(base_scores.values()) if base_scores else None
    floor = chance_floor(baseline_rows)
    accuracy_can_judge = baseline_accuracy is not None and baseline_accuracy - floor > margins.max_drop
    by_config: dict[str, list[ItemResult]] = defaultdict(list)
    for row in rows:
        if row.config_name != baseline_name:
            by_config[row.config_name].append(row)
    cases = []
    for name, mine in by_config.items():
        pairs = [(base_scores[r.item_id], r.score) for r in mine if r.score is not None and r.item_id in base_scores]
        fidelities = [f for r in mine if (f := r.fidelity) is not None]
        case = _Case(name, PairedScores.of(*zip(*pairs, strict=True)) if pairs else None,
                     FidelitySummary.of(fidelities) if fidelities else None)
        if margins.fidelity and case.fidelity is not None:
            case.p_fidelity = max(([case.fidelity.p_kl_below(margins.max_kl)] if margins.max_kl > 0 else [])
                                  + ([case.fidelity.p_agreement_above(margins.min_agreement)]
                                     if margins.min_agreement > 0 else []))
        if accuracy_can_judge and case.paired is not None:
            case.p_accuracy = case.paired.p_noninferior(margins.max_drop)
        cases.append(case)
    _holm(cases, "p_fidelity", untested)
    _holm(cases, "p_accuracy", untested)
    why_not_accuracy = _why_accuracy_cannot(baseline_accuracy, floor, margins.max_drop)
    return [(case.config, _verdict(task, case, margins, why_not_accuracy)) for case in cases]


def _holm(cases: list[_Case], attribute: str, untested: int) -> None:
    """Replace each case's p-value by its Holm-adjusted one, across the cases that have one."""
    having = [c for c in cases if getattr(c, attribute) is not None]
    adjusted = holm([getattr(c, attribute) for c in having] + [1.0] * untested)
    for case, p in zip(having, adjusted, strict=False):
        setattr(case, attribute, p)


def _why_accuracy_cannot(baseline_accuracy: float | None, floor: float, max_drop: float) -> str | None:
    if baseline_accuracy is None:
        return "the baseline has no accuracy score on this task (perplexity, or no scored item)"
    if baseline_accuracy - floor <= max_drop:
        return (f"the baseline scores {baseline_accuracy:.2f} here, at or below the chance floor ({floor:.2f}) "
                f"plus the margin of {max_drop:g}: the model cannot do this task, accuracy cannot judge it")
    return None


def _verdict(task: str, case: _Case, margins: Margins, why_not_accuracy: str | None) -> TaskVerdict:
    """The verdict, with the figures it was judged on."""
    verdict = _decide(task, case, margins, why_not_accuracy)
    figures: dict[str, Any] = {}
    if case.fidelity is not None:
        fid = case.fidelity
        (kl_low, kl_high), (agree_low, agree_high) = fid.kl_interval(), fid.agreement_interval()
        figures |= {"mean_kl": fid.mean_kl, "kl_low": kl_low, "kl_high": kl_high, "agreement": fid.agreement,
                    "agreement_low": agree_low, "agreement_high": agree_high}
    if case.paired is not None:
        low, high = case.paired.interval()
        figures |= {"diff": case.paired.difference, "diff_low": low, "diff_high": high}
    return replace(verdict, **figures)


def _decide(task: str, case: _Case, margins: Margins, why_not_accuracy: str | None) -> TaskVerdict:
    margin = f"{margins.max_drop:g}"  # a fraction, as the intervals beside it
    # Accuracy shown to drop by more than the margin rejects on every path, at the chance floor too
    # (a config can score below the floor): only *certifying* by accuracy needs a baseline above it.
    shown_worse = None
    if case.paired is not None:
        low, high = case.paired.interval()
        if high < -margins.max_drop:
            shown_worse = f"accuracy is shown to drop by more than {margin}: [{low:+.3f}, {high:+.3f}]"
    if case.p_fidelity is not None:
        fid = case.fidelity
        assert fid is not None  # p_fidelity is its p-value (_judge_task)
        certified = case.p_fidelity < ALPHA_ONE_SIDED
        figures = (f"mean KL {fid.mean_kl:.3g} (95% [{fid.kl_interval()[0]:.3g}, {fid.kl_interval()[1]:.3g}]), "
                   f"agreement {fid.agreement:.1%} over {fid.items} items, Holm p {case.p_fidelity:.2g}")
        if not certified:
            return TaskVerdict(task, False, FIDELITY, f"fidelity not certified within {margins.fidelity_words()}: "
                               f"{figures}", case.p_fidelity)
        if shown_worse:
            return TaskVerdict(task, False, ACCURACY, f"fidelity certified ({figures}), but {shown_worse}",
                               case.p_fidelity)
        if case.paired is not None:
            low, high = case.paired.interval()
            accuracy = f"accuracy not shown to drop by more than {margin} ([{low:+.3f}, {high:+.3f}])"
            accuracy += f"; {why_not_accuracy}" if why_not_accuracy else ""
        else:
            accuracy = why_not_accuracy or "no accuracy paired with the baseline"
        return TaskVerdict(task, True, FIDELITY, f"fidelity certified within {margins.fidelity_words()} ({figures}); "
                           f"{accuracy}", case.p_fidelity)
    # here no fidelity p-value: either no margin is set, or no fidelity was measured
    fidelity_note = f"; {UNMEASURED}" if margins.fidelity else ""
    if case.p_accuracy is not None:
        assert case.paired is not None  # p_accuracy is its p-value (_judge_task)
        low, high = case.paired.interval()
        shown = case.p_accuracy < ALPHA_ONE_SIDED
        return TaskVerdict(task, shown, ACCURACY, (
            f"accuracy {'shown' if shown else 'not shown'} non-inferior within {margin}: paired 95% interval "
            f"[{low:+.3f}, {high:+.3f}], Holm p {case.p_accuracy:.2g}{fidelity_note}"), case.p_accuracy)
    if shown_worse:
        return TaskVerdict(task, False, ACCURACY, f"{shown_worse} ({why_not_accuracy}){fidelity_note}")
    missing = why_not_accuracy or "no item paired with the baseline"
    fidelity = UNMEASURED if margins.fidelity else "no fidelity margin is set (--max-kl / --min-agreement)"
    return TaskVerdict(task, None, NEITHER, f"{missing}, and {fidelity}: this task does not enter the decision")
