"""The experiment page (pages/view_experiment.py) without Streamlit: its sections and its view state (the URL's
query parameters), its tables' rows (summary, verdict per task, one item, failed items, trials) and its texts
(the decision, the sweet spot, the time taken and the time left)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from kvlab.analysis.summary import ConfigSummary, Decision
from kvlab.core.results import ItemResult
from kvlab.core.units import MIB
from kvlab.dashboard.formatting import (
    agreement_text,
    fidelity_text,
    fmt,
    fmt_duration,
    fmt_mib,
    is_missing,
    is_present,
    kl_text,
    md,
    url_number,
)
from kvlab.experiments.eta import Eta, Timeline
from kvlab.experiments.nodes import node_of
from kvlab.store.records import TrialRecord

#: The experiment page's sections (its ``tab`` query parameter), and the one that leads while it runs.
SECTIONS = ("Tradeoff", "Latency", "Load", "Capacity", "Breakdown", "Layers", "Generation", "Needles", "Failed items",
            "Progress", "Spec & environment", "Export")
LIVE_SECTION = "Progress"


def experiment_sections(ended: bool) -> list[str]:
    """The sections in order; the page opens on the first: the result once the experiment has ended,
    its progress and telemetry while it is queued or running."""
    return list(SECTIONS) if ended else [LIVE_SECTION, *(s for s in SECTIONS if s != LIVE_SECTION)]


@dataclass(frozen=True)
class ExperimentViewState:
    """Everything the experiment page's view depends on, as its URL carries it: each field is a query
    parameter, named like the widget bound to it.  The page decides each field once, draws from this
    (the analysis and its verdict included) and builds its share link from :meth:`params`, so the
    link reproduces the view.  A field at its default is None (or empty) and stays out of the link:
    the defaults depend on the experiment (its margin, whether it has ended, its needle configs)."""

    id: int
    tab: str | None = None  # the section; None: the one the page opens on (the result once ended, else Progress)
    x: str | None = None  # the tradeoff chart's x axis; None: X_AXES[0]
    y: str | None = None  # the tradeoff chart's y metric (a key of Y_METRICS); None (older links too): accuracy
    hide: tuple[str, ...] = ()  # configs left out of the charts and tables (the decision stays on every config)
    margin: float | None = None  # the accuracy margin, a fraction as max_drop is; None: the spec's max_drop
    needle: str | None = None  # the needle heatmap's config; None: the first config with needle items
    layout: str | None = None  # the Layers section's config; None: the first config that is not the baseline
    item: str | None = None  # the item whose KL along its tokens is drawn; None: the first item with fidelity
    # the Capacity section's projection: the model (None: the experiment's own where kvlab knows its geometry), the
    # GPU, the tokens per sequence and the sequences wanted at once (None: kvlab.dashboard.capacity_view's defaults)
    cap_model: str | None = None
    gpu: str | None = None
    context: int | None = None
    clients: int | None = None

    def params(self) -> dict[str, str | int | list[str] | None]:
        """The query parameters of this view (None and empty ones are left out of a link)."""
        values: dict[str, str | int | list[str] | None] = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, float):
                value = url_number(value)
            values[field.name] = value
        return values


def timeline_text(line: Timeline) -> str:
    """``5 min 03 s since it was queued: queued 12 s, model load 20 s, evaluating 4 min 31 s``."""
    parts = [f"queued {fmt_duration(line.queued_s)}"]
    if line.load_s is not None:
        parts.append(f"model load {fmt_duration(line.load_s)} (its workers' telemetry)")
    if line.evaluating_s or line.load_s is not None:
        parts.append(f"evaluating {fmt_duration(line.evaluating_s)}")
    return f"{fmt_duration(line.total_s)} since it was queued: {', '.join(parts)}"


def eta_text(left: Eta | None) -> str:
    """The time left as an estimate with its basis, or why there is none."""
    if left is None:
        return ("no estimate of the time left yet: no finished run of this model on this backend, and too few "
                "evaluations of its own")
    basis = f"{left.evaluations_left} evaluations (an estimate from {left.pace.basis})"
    if left.stage == "queued":  # the wait grows; the estimate starts at the first claim
        return (f"queued {fmt_duration(left.stage_s)} (no worker has claimed it yet); then about "
                f"{fmt_duration(left.seconds_left)} for {basis}")
    head = (f"starting: loading the model and its first items ({fmt_duration(left.stage_s)} so far); "
            if left.stage == "starting" else "")
    if left.overdue_s > 0:
        return f"{head}{fmt_duration(left.overdue_s)} past the estimate for {basis}"
    return f"{head}about {fmt_duration(left.seconds_left)} left for {basis}"


def sweet_spot_label(sweet: ConfigSummary | None) -> str:
    """``4.00x (int4)``: the most compressed config acceptable on every task."""
    if sweet is None:
        return "-"
    return f"{fmt(sweet.compression_ratio, '.2f', suffix='x')} ({sweet.config_name})"


def decision_text(decision: Decision) -> str:
    """The sweet spot (or why there is none), the criterion that decided each task and the rule, as
    Markdown (store text escaped): two paragraphs, ``Sweet spot: ...`` (or ``No sweet spot: ...``)
    then ``Rule: ...``."""
    spot = decision.sweet_spot
    rule = f"Rule: the {md(decision.rule)}."
    if spot is None:
        return f"No sweet spot: {md(decision.note)}.\n\n{rule}"
    head = (f"Sweet spot: **{md(spot.config_name)}** at {fmt(spot.compression_ratio, '.2f', suffix='x')} "
            f"({fmt_mib(spot.physical_kv_bytes)}), decided by {md(decision.decided_by)}.")
    if spot.accuracy is not None:
        head += f" Accuracy {spot.accuracy:.2f}"
        if spot.diff_estimate is not None:
            head += (f", {spot.diff_estimate:+.3f} [{spot.diff_ci_low:+.3f}, {spot.diff_ci_high:+.3f}] against the "
                     "baseline on the same items")
        head += " (pooled over tasks: a summary)."
    if spot.mean_kl is not None:
        head += f" Fidelity: {md(fidelity_text(spot))}."
    if decision.bound:
        head += f" {md(decision.bound[0].upper() + decision.bound[1:])}."
    return f"{head}\n\n{rule}"


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


# -- tables -------------------------------------------------------------------------------------

def trial_rows(trials: Sequence[TrialRecord]) -> list[dict[str, Any]]:
    return [{"trial": t.id, "config": t.config_name, "status": t.status,
             "items": f"{t.items_done}/{t.items_total if t.items_total is not None else '?'}",
             "progress": (t.items_done / t.items_total) if t.items_total else 0.0,
             "attempts": t.attempts, "node": node_of(t.worker_id), "worker": t.worker_id or "-",
             "error": t.error or ""} for t in trials]


#: How much of an item's error a table cell quotes.
ERROR_SHOWN = 120


def first_errors(results: Sequence[ItemResult]) -> dict[str, str]:
    """Each config's first item error (one line, cut to :data:`ERROR_SHOWN` characters), for the tables that
    say why a figure is missing."""
    errors: dict[str, str] = {}
    for r in results:
        if r.error and r.config_name not in errors:
            line = " ".join(r.error.split())
            errors[r.config_name] = line[:ERROR_SHOWN] + ("…" if len(line) > ERROR_SHOWN else "")
    return errors


def missing_accuracy(s: ConfigSummary, errors: Mapping[str, str]) -> str:
    """Why a config has no accuracy, where its items' errors say: ``- (3 item errors: <the first>)``; ``-``
    otherwise (perplexity, which scores no answer)."""
    if not s.errors:
        return "-"
    first = errors.get(s.config_name)
    return f"- ({s.errors} item error{'s' if s.errors != 1 else ''}" + (f": {first})" if first else ")")


def summary_rows(summaries: Sequence[ConfigSummary], sweet_name: str | None = None,
                 errors: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The per-config summary with the units in the column names: the decision (acceptable on every
    task, the task that stopped the config, the criterion that judged each task), the fidelity to the
    baseline ("-" where it is not measured), then the accuracy figures pooled over tasks (a summary,
    not the decision; where there is none, why: :func:`missing_accuracy` of ``errors``, each config's first
    item error, :func:`first_errors`), the bytes and the latency."""
    rows = []
    for s in summaries:
        ci = f"[{s.ci_low:.2f}, {s.ci_high:.2f}]" if not is_missing(s.ci_low) else "-"
        about = "≈" if s.kv_bytes_estimated else ""  # a server's estimate, not a measurement
        diff = (f"{s.diff_estimate:+.3f} [{s.diff_ci_low:+.3f}, {s.diff_ci_high:+.3f}]"
                if s.diff_estimate is not None else "-")
        stopped = s.stopped_by
        rows.append({
            "config": s.config_name + ("  ★ sweet spot" if s.config_name == sweet_name else ""),
            "items": s.n_items, "acceptable (every task)": _yes_no(s.non_inferior),
            "stopped by (task)": stopped.task if stopped is not None else "-", "decided by": s.decided_by or "-",
            "mean KL (nats, 95% CI)": kl_text(s) if s.mean_kl is not None else "-",
            "p99 KL (nats)": fmt(s.p99_kl, ".3g"),
            "top-1 agreement (95% CI)": agreement_text(s) if s.agreement is not None else "-",
            "accuracy (pooled)": fmt(s.accuracy, ".3f") if is_present(s.accuracy)
            else missing_accuracy(s, errors or {}),
            "accuracy 95% CI (pooled)": ci,
            "vs baseline (pooled, 95% CI)": diff, "non-inferior (pooled)": _yes_no(s.pooled_non_inferior),
            "Holm p (pooled)": fmt(s.p_adjusted, ".3g"), "p vs baseline (pooled)": fmt(s.p_value, ".3f"),
            "KV (MiB)": about + fmt(s.physical_kv_bytes, ".3f", 1 / MIB),
            "ratio (x)": about + fmt(s.compression_ratio, ".2f"),
            "budget suggests (x)": fmt(s.budget_ratio, ".2f"), "kept": fmt(s.kept_fraction, ".0%"),
            "TTFT (ms)": fmt(s.ttft_s, ".0f", 1000), "TPOT (ms)": fmt(s.tpot_s, ".1f", 1000),
            "perplexity": fmt(s.perplexity, ".2f"), "errors": s.errors,
        })
    return rows


def verdict_rows(summaries: Sequence[ConfigSummary]) -> list[dict[str, Any]]:
    """Each compared config's verdict on each task: accepted (``-``: the task cannot judge it), the
    criterion that judged it (fidelity, accuracy or none) and why, with the Holm-adjusted p-value
    of that criterion."""
    return [{"config": s.config_name, "task": v.task, "accepted": _yes_no(v.accepted), "criterion": v.criterion,
             "reason": v.reason, "Holm p": fmt(v.p_adjusted, ".3g")}
            for s in summaries for v in s.task_verdicts]


def fidelity_items(results: Sequence[ItemResult]) -> list[str]:
    """The items (ids) on which some config's fidelity to the baseline was measured, in first-seen order."""
    return list(dict.fromkeys(r.item_id for r in results if r.fidelity is not None))


def item_rows(results: Sequence[ItemResult], item_id: str) -> list[dict[str, Any]]:
    """One item under every config: what it generated, its score, and its fidelity to the baseline."""
    rows = []
    for r in results:
        if r.item_id != item_id:
            continue
        row = {"config": r.config_name, "generated": r.generated, "score": fmt(r.score, ".2f"),
               "tokens compared": "-", "mean KL (nats)": "-", "max KL (nats)": "-", "top-1 agreement": "-",
               "first divergence (token)": "-"}
        if (f := r.fidelity) is not None:  # text columns throughout: "-" where the baseline has none
            row |= {"tokens compared": str(f.tokens), "mean KL (nats)": f"{f.mean_kl:.3g}",
                    "max KL (nats)": f"{f.max_kl:.3g}", "top-1 agreement": f"{f.agreement:.0%}",
                    "first divergence (token)": "none" if f.first_divergence is None else str(f.first_divergence)}
        rows.append(row | {"error": r.error or ""})
    return rows


def failed_rows(results: Sequence[ItemResult], limit: int = 500) -> list[dict[str, Any]]:
    """Items a config got wrong (score < 1) or that raised, with what the model generated."""
    rows = []
    for r in results:
        if r.error is None and (r.score is None or r.score >= 1.0):
            continue
        rows.append({"config": r.config_name, "task": r.task, "item": r.item_id, "context (tokens)": r.context_length,
                     "depth": fmt(r.depth, ".2f"), "expected": r.answer, "generated": r.generated,
                     "score": fmt(r.score, ".2f"), "error": r.error or ""})
        if len(rows) >= limit:
            break
    return rows
