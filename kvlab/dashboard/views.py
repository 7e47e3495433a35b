"""Pure helpers behind the dashboard: URL state (query params <-> view state) and table rows.

Nothing here imports streamlit, so the pages stay thin and these functions are tested directly.
Every view keeps its state in the URL's query parameters (the page itself is the URL path, its row's
in kvlab.dashboard.page_table), so a link opened in another browser shows the same view.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime, tzinfo
from typing import Any, TypeGuard
from urllib.parse import urlencode
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from kvlab.analysis.agreement import EngineAgreement, EngineConfig
from kvlab.analysis.summary import ConfigSummary, Decision, stored_config
from kvlab.core.formats import FORMATS
from kvlab.core.margins import Margins
from kvlab.core.results import ItemResult
from kvlab.core.units import MIB
from kvlab.dashboard import page_table
from kvlab.experiments.eta import Eta, Timeline, timeline
from kvlab.experiments.nodes import node_of
from kvlab.store.records import ExperimentRecord, TrialRecord
from kvlab.tune.progress import Budgets

#: Memory is in MiB (2^20 bytes) on every page, export and CLI table: :func:`fmt_mib`.

#: The accuracy margin (the spec's ``max_drop``) wherever a page asks for it (/new, the experiment page): a
#: fraction of the items, as the spec stores it, ``--max-drop`` takes it and accuracy is shown (0-1), so that
#: the margin reads against the accuracy intervals beside it.  :func:`fmt_margin` writes it.
MARGIN_LABEL = "Margin max_drop (accuracy, 0-1)"
MARGIN_MIN, MARGIN_MAX, MARGIN_STEP = 0.005, 0.5, 0.005
MARGIN_FORMAT = "%.3f"

#: Experiments table: sort choice -> ``Store.list_experiments(order=...)``.
SORTS = {"newest": "-created_at", "oldest": "created_at", "name": "name", "status": "status",
         "recently started": "-started_at", "recently finished": "-finished_at"}
PAGE_SIZE = 50
MAX_ID = 2**63 - 1  # the largest id a database column holds

X_AXES = ("bytes", "ratio")
#: The tradeoff chart's y metrics (its ``y`` query parameter, the first the default), with the words
#: a title uses for each: the accuracy, or the fidelity to the baseline (mean KL, top-1 agreement).
Y_METRICS = {"accuracy": "accuracy", "KL": "mean KL", "agreement": "top-1 agreement"}

#: The experiment page's sections (its ``tab`` query parameter), and the one that leads while it runs.
SECTIONS = ("Tradeoff", "Latency", "Load", "Capacity", "Breakdown", "Layers", "Generation", "Needles", "Failed items",
            "Progress", "Spec & environment", "Export")
LIVE_SECTION = "Progress"
#: The compare page's sections: the overlaid tradeoffs (the default), the knobs and outcomes (parallel
#: coordinates and their table).
COMPARE_SECTIONS = ("Tradeoffs", "Parameters", "Engines")


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


def url_number(value: float) -> str:
    """A number as a bound number widget writes it into the URL (Streamlit's form: 5.0 -> ``5``)."""
    return str(int(value)) if math.isfinite(value) and value == int(value) else repr(value)


#: The experiments table's "best ratio holding baseline" column, in the words of the decision's own
#: rule (:meth:`kvlab.analysis.decision.Margins.rule`) at the default margins: each experiment is
#: judged at its own (its spec's max_drop, max_kl and min_agreement).
BEST_RATIO_HELP = (f"The {Margins().rule('its')}. Each experiment is judged at its own margins (its spec's "
                   "max_drop, max_kl and min_agreement; these words give the defaults). Compression ratio = "
                   "baseline KV bytes / physical KV bytes.")


#: Markdown's inline markup (links, images, emphasis, code, math, ``:colour[...]:`` and shortcodes, raw
#: HTML, autolinked URLs and addresses), and what only means something at the start of a line.
_MD_INLINE = re.compile(r"([\\`*_{}\[\]()<>!|~$:.@])")
_MD_LINE_START = re.compile(r"(?m)^([ \t]*)([-+#=])")


def md(text: str) -> str:
    """Text from the store or a server (names, tags, notes, messages) as literal Markdown: Streamlit
    renders ``[a](url)`` as a link, ``![](url)`` as an image it fetches, ``:red[...]`` as colour,
    ``www.x.org`` as a link, and names may hold any of them.  A dash or a plus inside a line stays
    as it is (``synthetic-sweep``)."""
    return _MD_LINE_START.sub(r"\1\\\2", _MD_INLINE.sub(r"\\\1", text))


def code_span(text: str) -> str:
    """``text`` as Markdown inline code (selectable, copied whole), fenced by more backticks than it
    holds in a row, so that a backtick in a name cannot end the span."""
    fence = "`" * (1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def parse_int(value: str | None) -> int | None:
    """An id from the URL, or None for anything that is not a positive integer a database id can be."""
    try:
        number = int(str(value).strip())
    except (TypeError, ValueError):
        return None
    return number if 0 < number <= MAX_ID else None


def invalid_ids(values: Iterable[str]) -> list[str]:
    """The parts of id params (see :func:`parse_ids`) that are not ids, to tell the user."""
    return [part.strip() for value in values for part in str(value).split(",")
            if part.strip() and parse_int(part) is None]


def parse_ids(values: Iterable[str]) -> list[int]:
    """Experiment ids from repeated (``ids=1&ids=2``) or comma-separated (``ids=1,2``) params,
    in order, without duplicates; anything else is ignored."""
    ids: list[int] = []
    for value in values:
        for part in str(value).split(","):
            number = parse_int(part)
            if number is not None and number not in ids:
                ids.append(number)
    return ids


def trial_key(experiment_id: int, config_name: str) -> str:
    """How a trial (a config of an experiment) is named in the URL and the pickers: ``3/int4``."""
    return f"{experiment_id}/{config_name}"


def query_values(params: Mapping[str, str | int | Sequence[str | int] | None]) -> dict[str, list[str]]:
    """A view's query parameters as a URL carries them: each non-empty one's values as text (None, ``""`` and
    empty lists left out).  The share link (:func:`share_url`) and the address bar (``pages.common.address_bar``)
    both come from this."""
    query: dict[str, list[str]] = {}
    for key, value in params.items():
        if value is None or value == "" or (isinstance(value, (list, tuple)) and not value):
            continue
        query[key] = [str(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
    return query


def share_url(base: str | None, params: Mapping[str, str | int | Sequence[str | int] | None]) -> str:
    """The link that reopens this view: ``base`` (the page's URL, no query) plus the non-empty params."""
    encoded = urlencode(query_values(params), doseq=True)
    return f"{base or ''}?{encoded}" if encoded else (base or "")


# -- formatting ---------------------------------------------------------------------------------

def _missing(value: float | None) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _present(value: float | None) -> TypeGuard[float]:
    """Not :func:`_missing`: a number (the type checker then knows it is one)."""
    return not _missing(value)


def fmt(value: float | None, spec: str, scale: float = 1.0, suffix: str = "") -> str:
    return format(value * scale, spec) + suffix if _present(value) else "-"


def fmt_mib(n_bytes: float | None, spec: str = ".3f") -> str:
    """Bytes as MiB, the one memory unit of the pages: ``12.345 MiB`` ("-" when unknown)."""
    return fmt(n_bytes, spec, 1 / MIB, " MiB")


def fmt_margin(max_drop: float) -> str:
    """The accuracy margin as pages write it: a fraction (``0.05``), as accuracy is (see MARGIN_LABEL)."""
    return f"{max_drop:g}"


def viewer_zone(name: str | None) -> tuple[tzinfo, str]:
    """The zone of the viewer's browser by its IANA name (Streamlit's ``st.context.timezone``) and that
    name; UTC when the browser did not say or named a zone this Python does not know."""
    if name:
        try:
            return ZoneInfo(name), name
        except (ZoneInfoNotFoundError, ValueError):
            pass
    return UTC, "UTC"


def fmt_time(moment: datetime | None, zone: tzinfo = UTC) -> str:
    """``2026-01-31 13:05`` in ``zone`` (a naive datetime is the store's UTC); "-" for none."""
    if moment is None:
        return "-"
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(zone).strftime("%Y-%m-%d %H:%M")


def fmt_duration(seconds: float | None) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 07 min``."""
    if not _present(seconds) or seconds < 0:
        return "-"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def experiment_duration(experiment: ExperimentRecord, now: datetime | None = None) -> float:
    """Seconds from its creation to its end (to now while it runs): the queue and the model's load included
    (:func:`kvlab.experiments.eta.timeline` parts them)."""
    return timeline(experiment, (), now or datetime.now(UTC)).total_s


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


def kind(experiment: ExperimentRecord) -> str:
    """``tune`` for a tune's experiment (its spec has a [tune] table), else ``sweep``."""
    return "tune" if experiment.spec.get("tune") is not None else "sweep"


def page_link(experiment: ExperimentRecord) -> str:
    """The link to the experiment's own page, relative to the dashboard's: a tune's opens on /tune."""
    page = page_table.TUNE if kind(experiment) == "tune" else page_table.EXPERIMENT
    return f"{page.url_path}?id={experiment.id}"


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


def sweet_spot_label(sweet: ConfigSummary | None) -> str:
    """``4.00x (int4)``: the most compressed config acceptable on every task."""
    if sweet is None:
        return "-"
    return f"{fmt(sweet.compression_ratio, '.2f', suffix='x')} ({sweet.config_name})"


def margins_label(spec: Mapping[str, Any]) -> str:
    """A stored spec's margins in a line: ``max_drop 0.05, max_kl 0.05, min_agreement off``."""
    margins = Margins.of(spec)
    kl = f"{margins.max_kl:g}" if margins.max_kl > 0 else "off"
    agreement = f"{margins.min_agreement:g}" if margins.min_agreement > 0 else "off"
    return f"max_drop {margins.max_drop:g}, max_kl {kl}, min_agreement {agreement}"


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


def fidelity_text(s: ConfigSummary) -> str:
    """``mean KL 0.0123 [0.01, 0.015] nats, top-1 agreement 97.0% [95%, 99%]`` ("" when not measured)."""
    if s.mean_kl is None:
        return ""
    return f"mean KL {_kl(s)} nats, top-1 agreement {_agreement(s)}"


def _kl(s: ConfigSummary) -> str:
    return f"{s.mean_kl:.3g} [{s.kl_ci_low:.3g}, {s.kl_ci_high:.3g}]"


def _agreement(s: ConfigSummary) -> str:
    return f"{s.agreement:.1%} [{s.agreement_ci_low:.0%}, {s.agreement_ci_high:.0%}]"


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


# -- tables -------------------------------------------------------------------------------------

#: The experiments table's notes: their first line, cut to this many characters.
NOTES_SHOWN = 60


def notes_excerpt(notes: str, limit: int = NOTES_SHOWN) -> str:
    """The first line of ``notes``, cut at ``limit`` characters with ``…`` where anything is left out."""
    first, _, rest = notes.strip().partition("\n")
    return first[:limit] + ("…" if len(first) > limit or rest.strip() else "")


def started_column(zone_name: str) -> str:
    """The experiments table's start column, naming the zone its times are in."""
    return f"started ({zone_name})"


def experiment_rows(experiments: Sequence[ExperimentRecord], decisions: Mapping[int, Decision],
                    zone: tuple[tzinfo, str] = (UTC, "UTC"), now: datetime | None = None,
                    tunes: Mapping[int, Budgets] | None = None) -> list[dict[str, Any]]:
    """Rows of the experiments table: the link to each one's page (``id``), its kind, where it stands (a
    tune's by its ``tunes`` budgets, as its page counts them) and its sweet spot's figures (``decisions``:
    of the experiments with results), times in ``zone`` (its :func:`viewer_zone`)."""
    rows = []
    tunes = tunes or {}
    for e in experiments:
        spot = decisions[e.id].sweet_spot if e.id in decisions else None
        rows.append({
            "id": page_link(e), "kind": kind(e), "name": e.name, "status": e.status,
            "progress": progress(e, tunes.get(e.id)), "trials": trials_text(e, tunes.get(e.id)),
            "items": f"{e.items_done}/{e.items_total or '?'}",
            "sweet spot": (spot.config_name + (f" ({e.partial})" if e.partial else "")) if spot else "-",
            "best ratio held (x)": round(spot.compression_ratio, 2) if spot and _present(spot.compression_ratio)
            else None,
            "its mean KL (nats)": float(f"{spot.mean_kl:.3g}") if spot and spot.mean_kl is not None else None,
            "model": e.model, started_column(zone[1]): fmt_time(e.started_at, zone[0]),
            "duration": fmt_duration(experiment_duration(e, now)), "tags": ", ".join(e.tags),
            "notes": notes_excerpt(e.notes),
        })
    return rows


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
        ci = f"[{s.ci_low:.2f}, {s.ci_high:.2f}]" if not _missing(s.ci_low) else "-"
        about = "≈" if s.kv_bytes_estimated else ""  # a server's estimate, not a measurement
        diff = (f"{s.diff_estimate:+.3f} [{s.diff_ci_low:+.3f}, {s.diff_ci_high:+.3f}]"
                if s.diff_estimate is not None else "-")
        stopped = s.stopped_by
        rows.append({
            "config": s.config_name + ("  ★ sweet spot" if s.config_name == sweet_name else ""),
            "items": s.n_items, "acceptable (every task)": _yes_no(s.non_inferior),
            "stopped by (task)": stopped.task if stopped is not None else "-", "decided by": s.decided_by or "-",
            "mean KL (nats, 95% CI)": _kl(s) if s.mean_kl is not None else "-",
            "p99 KL (nats)": fmt(s.p99_kl, ".3g"),
            "top-1 agreement (95% CI)": _agreement(s) if s.agreement is not None else "-",
            "accuracy (pooled)": fmt(s.accuracy, ".3f") if _present(s.accuracy) else missing_accuracy(s, errors or {}),
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


@dataclass(frozen=True)
class CompareRow:
    """One config of one experiment, flattened for the parallel-coordinates view."""

    experiment_id: int
    config_name: str
    quant_bits: float
    removed_fraction: float
    accuracy: float
    ratio: float


QUANT_BITS = {name: f.bits_per_value for name, f in FORMATS.items()}


def engine_rows(rows: Sequence[EngineAgreement], a: str, b: str) -> list[dict[str, Any]]:
    """The cross-engine table of two experiments (``a`` and ``b`` name them), as the page shows it."""
    def per_token(value: float | None, estimated: bool) -> str:
        return "-" if value is None else ("≈" if estimated else "") + f"{value:,.0f}"

    def share(value: float | None) -> str:
        return "-" if value is None else f"{value:.0%}"

    return [{"config": row.config_name, "items": row.items,
             f"accuracy {a}": None if row.accuracy_a is None else round(row.accuracy_a, 3),
             f"accuracy {b}": None if row.accuracy_b is None else round(row.accuracy_b, 3),
             "same outcome": share(row.same_outcome), "same text": share(row.same_text),
             f"KV B/token {a}": per_token(row.kv_bytes_a, row.estimated_a),
             f"KV B/token {b}": per_token(row.kv_bytes_b, row.estimated_b),
             f"mean KL {a} [95% CI]": row.fidelity_a.text if row.fidelity_a else "-",
             f"mean KL {b} [95% CI]": row.fidelity_b.text if row.fidelity_b else "-"} for row in rows]


def engines_table_rows(rows: Sequence[EngineConfig]) -> list[dict[str, Any]]:
    """Every engine's configs on the items all compared experiments ran (``kvlab compare A B C``), as the page
    shows them."""
    return [{"experiment": f"#{row.experiment_id}", "engine": row.engine, "config": row.config_name,
             "items": row.items, "accuracy": None if row.accuracy is None else round(row.accuracy, 3),
             "KV B/token": "-" if row.kv_bytes is None else ("≈" if row.estimated else "") + f"{row.kv_bytes:,.0f}",
             "mean KL [95% CI]": row.fidelity.text if row.fidelity else "-",
             "agreement": f"{row.fidelity.agreement:.1%}" if row.fidelity else "-",
             "estimator": row.fidelity.teacher if row.fidelity else "-"} for row in rows]


def compare_rows(summaries_by_experiment: Mapping[int, Sequence[ConfigSummary]],
                 selected: Sequence[str] | None = None) -> list[CompareRow]:
    """Rows of the configs in ``selected`` (trial keys; None: all) that have an accuracy."""
    rows = []
    for experiment_id, summaries in summaries_by_experiment.items():
        for s in summaries:
            if selected is not None and trial_key(experiment_id, s.config_name) not in selected:
                continue
            if not _present(s.accuracy) or _missing(s.compression_ratio):
                continue
            parsed = stored_config(s.config)
            removed = parsed.removed_fraction if parsed is not None else None
            if removed is None:  # no eviction, or a threshold: what was actually dropped
                removed = 1.0 - (s.kept_fraction if not _missing(s.kept_fraction) else 1.0)
            rows.append(CompareRow(experiment_id, s.config_name, QUANT_BITS.get(s.config.get("quant", "none"), 16.0),
                                   float(removed), float(s.accuracy), float(s.compression_ratio)))
    return rows
