"""Experiment: a finished one opens on its result (the sweet spot, the tradeoff chart, the summary
table); one still running opens on its progress and telemetry.  The other sections (latency,
breakdowns, needle heatmap, failed items, spec and environment, exports) are picked with a selector
bound to the URL (``tab``), and only the picked one is built and drawn: its charts come from caches
keyed by the experiment's last update and the viewer's choices."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
import streamlit as st

from kvlab.dashboard import charts, views
from kvlab.experiments.analysis import breakdown, length_group
from kvlab.experiments.decision import DEFAULT_MAX_DROP
from kvlab.dashboard.chart_export import report_html
from kvlab.config import dump_spec, parse_spec
from kvlab.experiments.export import experiment_document, results_csv
from kvlab.store import ExperimentNotFoundError, ExperimentRecord
from kvlab.store.records import TelemetrySample
from pages.common import (PAGE_FILES, View, analysed, chart, db_url, empty_state, get_store, guard, pick_experiment,
                          results_of, share_box, shown_results, slug, view_of)

LIVE_EVERY_S = 2.0
TELEMETRY_LIMIT = 3000
#: Sections that use the config filter and the margin.
ANALYSED = ("Tradeoff", "Latency", "Breakdown", "Needles", "Failed items", "Export")

store = get_store()
recent = store.list_experiments(limit=200)
if not recent:
    empty_state("No experiments yet: create one (or launch the tiny example) and it shows up here.",
                views.PAGE_NEW, "New experiment")
    st.stop()

experiment = pick_experiment(store, recent, "experiment", key="experiment_pick")

st.title(views.md(experiment.name))
st.caption(f"#{experiment.id} · {experiment.status} · model {views.md(experiment.model)} ({experiment.backend_kind}) "
           f"· seed {experiment.seed} · created {experiment.created_at:%Y-%m-%d %H:%M} UTC"
           + (f" · tags: {views.md(', '.join(experiment.tags))}" if experiment.tags else ""))
if experiment.error:
    st.error(views.md(experiment.error))
if experiment.spec.get("tune") is not None:
    st.page_link(PAGE_FILES[views.PAGE_TUNE], label="A tune: its Pareto front, stopped candidates and recommendation",
                 query_params={"id": str(experiment.id)}, icon=":material/tune:")


@st.fragment(run_every=None if experiment.is_terminal else LIVE_EVERY_S)
def live_panel(experiment_id: int, shown: tuple[str, int], detailed: bool) -> None:
    """The progress bar and, in the Progress section (``detailed``), the trials, telemetry and events;
    refreshed every few seconds while the experiment runs.  When a trial ends (or the experiment does)
    the whole page reruns so the results catch up."""
    with guard("Experiment: live panel"):  # its reruns every few seconds run outside app.py's guard
        _live_panel(experiment_id, shown, detailed)


def _live_panel(experiment_id: int, shown: tuple[str, int], detailed: bool) -> None:
    try:
        current = store.get_experiment(experiment_id)
    except ExperimentNotFoundError as error:  # deleted meanwhile
        st.error(str(error))
        return
    ended = current.trials_done + current.trials_failed + current.trials_cancelled
    st.progress(views.progress(current), text=(
        f"{current.status}: {current.items_done}/{current.items_total or '?'} items, {ended}/{current.trials_total} "
        f"trials ended · {views.fmt_duration(views.experiment_duration(current))}"))
    if detailed:
        _progress_details(current)
    if (current.status, ended) != shown:
        st.rerun(scope="app")


def _progress_details(current: ExperimentRecord) -> None:
    with st.expander("Trials", expanded=not current.is_terminal):
        st.dataframe(views.trial_rows(store.trials(current.id)), hide_index=True, column_config={
            "progress": st.column_config.ProgressColumn("progress", min_value=0.0, max_value=1.0, format="percent")})
    if current.is_terminal:  # the samples no longer change: build their charts once
        figures = telemetry_figures(current.id, (current.status, current.finished_at), db_url())
    else:
        figures = build_telemetry_figures(store.telemetry(current.id, limit=TELEMETRY_LIMIT))
    for name, built in figures.items():
        chart(built, name, f"{slug(current.name)}-{'memory' if name == 'telemetry' else name}")
    if not figures and current.status == "queued":
        st.info("Queued: no worker has claimed it yet. Workers started from this dashboard pick it up within "
                "seconds; elsewhere run `kvlab worker` with the same KVLAB_DATABASE_URL.")
    elif not figures:
        st.caption("No telemetry for this experiment (its workers sample memory once a second while they run).")
    with st.expander("Recent events"):
        for event in store.events(current.id)[-8:]:
            st.text(f"{event.level:7} {event.message}")


def build_telemetry_figures(samples: Sequence[TelemetrySample]) -> dict[str, go.Figure]:
    """The memory chart, and the GPU one when there are GPU samples (none without samples)."""
    if not samples:
        return {}
    figures = {"telemetry": charts.telemetry_figure(samples)}
    if charts.has_gpu(samples):
        figures["gpu"] = charts.gpu_figure(samples)
    return figures


@st.cache_data(show_spinner=False, max_entries=64, ttl=3600)
def telemetry_figures(experiment_id: int, version: tuple[Any, ...], db: str | None) -> dict[str, go.Figure]:
    """:func:`build_telemetry_figures` of an ended experiment; ``version`` and ``db`` only key the cache."""
    return build_telemetry_figures(store.telemetry(experiment_id, limit=TELEMETRY_LIMIT))


@st.cache_data(show_spinner=False, max_entries=256, ttl=3600)
def figure(kind: str, view: View, option: str = "", title: str = "") -> go.Figure:
    """One chart of the results, built once per (experiment, last update, the viewer's choices)."""
    summaries, _ = analysed(view)
    results, baseline = shown_results(view)
    if kind == "tradeoff":
        return charts.tradeoff_figure(summaries, option, baseline, title=title)
    if kind == "latency":
        return charts.latency_figure(summaries)
    if kind == "breakdown":
        key = (lambda r: r.task) if option == "task" else length_group
        return charts.breakdown_figure(breakdown(results, key, baseline, view.max_drop), option)
    if kind == "needle":
        return charts.needle_heatmap(results, option)
    raise ValueError(f"no chart {kind!r}")


ended_now = experiment.trials_done + experiment.trials_failed + experiment.trials_cancelled
results, baseline = results_of(experiment)
if not results:
    live_panel(experiment.id, (experiment.status, ended_now), detailed=True)
    empty_state("No results yet: they appear here as trials finish (the page follows along)."
                if not experiment.is_terminal else "This experiment stored no results.")
    share_box({"id": experiment.id})
    st.stop()


def _section_picked() -> None:
    st.session_state["tab_picked"] = True


def follow_default_section(default: str) -> None:
    """Until the viewer picks a section (in the selector, or with a link's ``tab``), the selector
    follows the section the page opens on: Progress while the experiment runs, the result once it
    has ended (the live panel reruns the page then), and ``tab`` stays out of the URL."""
    if "tab_picked" not in st.session_state:
        st.session_state["tab_picked"] = st.query_params.get("tab") in views.SECTIONS
    if not st.session_state["tab_picked"] and st.session_state.get("tab", default) != default:
        st.session_state["tab"] = default


def kept(key: str) -> Any:
    """A bound widget's value in a run that does not draw it: what it kept (``persist_state``), else the link's."""
    if key in st.session_state:
        return st.session_state[key]
    values = st.query_params.get_all(key)
    return values if key == "hide" else (values[-1] if values else None)


def kept_margin(default: float) -> float:
    """The margin (accuracy points) while its widget is not drawn: the kept or linked one, else the spec's."""
    try:
        return float(kept("margin") or default)
    except ValueError:  # not a number: the widget says so once it is drawn
        return default


def view_state(section: str, default_section: str, spec_margin: float) -> views.ExperimentViewState:
    """The viewer's choices, each from its widget where this section draws it (else as it was kept):
    the one state that the analysis, the charts and the share link all come from."""
    hidden, margin = list(kept("hide") or []), kept_margin(spec_margin)
    if section in ANALYSED:
        with st.expander("Configs and margin", expanded=False):
            hidden = st.multiselect("Hide configs", list(dict.fromkeys(r.config_name for r in results)), key="hide",
                                    bind="query-params", persist_state="page",
                                    help="Leave configs out of every chart and table.")
            margin = st.number_input(
                "Non-inferiority margin (accuracy points)", min_value=0.5, max_value=50.0, step=0.5, key="margin",
                value=spec_margin, bind="query-params", persist_state="page",
                help="How much accuracy a config may lose against the baseline and still count as holding it (the "
                     "spec's max_drop); decided by a paired test on the same items, Holm-corrected across configs.")
    axis = kept("x")
    if section == "Tradeoff":
        axis = st.radio("x axis", views.X_AXES, key="x", bind="query-params", horizontal=True, persist_state="page",
                        help="bytes: physical KV cache in MiB; ratio: baseline bytes / physical bytes")
    needle = kept("needle")
    needles = charts.needle_configs([r for r in results if r.config_name not in hidden])
    if section == "Needles" and needles:
        needle = st.selectbox("Config", needles, key="needle", bind="query-params", persist_state="page")
    return views.ExperimentViewState(
        experiment.id, tab=None if section == default_section else section,
        x=None if axis in (None, views.X_AXES[0]) else axis, hide=tuple(hidden),
        margin=None if margin == spec_margin else margin, needle=None if needle in (None, *needles[:1]) else needle)


sections = views.experiment_sections(experiment.is_terminal)
follow_default_section(sections[0])
section = st.segmented_control("Section", sections, default=sections[0], required=True, key="tab",
                               bind="query-params", label_visibility="collapsed", on_change=_section_picked)
live_panel(experiment.id, (experiment.status, ended_now), detailed=section == views.LIVE_SECTION)

spec_margin = 100 * float(experiment.spec.get("max_drop", DEFAULT_MAX_DROP))
state = view_state(section, sections[0], spec_margin)
view = view_of(experiment, state.hide, (spec_margin if state.margin is None else state.margin) / 100)
axis = state.x or views.X_AXES[0]
stem = slug(f"{experiment.id}-{experiment.name}")

if section == "Tradeoff":
    summaries, decision = analysed(view)
    sweet = decision.sweet_spot
    if sweet is not None:
        st.success(f"Sweet spot: **{views.md(sweet.config_name)}** at {sweet.compression_ratio:.2f}x "
                   f"({sweet.physical_kv_bytes / views.MIB:.3f} MiB), accuracy {sweet.accuracy:.2f}, "
                   f"{sweet.diff_estimate:+.3f} [{sweet.diff_ci_low:+.3f}, {sweet.diff_ci_high:+.3f}] against the "
                   f"baseline on the same items.")
    else:
        st.info(f"No sweet spot: {views.md(decision.note)}.")
    st.caption(f"Rule: the {decision.rule}.")
    chart(figure("tradeoff", view, axis, f"{experiment.name}: memory vs accuracy"), "tradeoff", f"{stem}-tradeoff")
    st.dataframe(views.summary_rows(summaries, sweet.config_name if sweet else None), hide_index=True)
    with st.expander("Definitions"):
        st.markdown(
            "- **Physical KV bytes**: the sum of `nbytes` of every tensor the compressed cache holds (codes, scales, "
            "zero points, 16-bit residual window, kept tokens), measured.\n"
            "- **Compression ratio (x)**: baseline bytes (the same tokens uncompressed at 16-bit) / physical bytes.\n"
            "- **Accuracy**: mean per-item score in [0, 1], with a 95% Wilson interval; **p vs baseline**: exact "
            "McNemar test on the same items.\n"
            "- **vs baseline**: the paired accuracy difference (config - baseline) on the same items with its 95% "
            "interval (Newcombe's square-and-add; MOVER for fractional scores); **non-inferior** when its one-sided "
            "test against the margin rejects after Holm's correction across the configs (Holm p < 0.025).\n"
            "- **≈**: bytes estimated from a server's KV pool (bytes per token x prompt tokens), not measured.\n"
            "- **Pareto front**: configs no other config beats on both bytes (lower) and accuracy (higher).\n"
            "- **TTFT**: prefill (without eviction scorers) + this config's own scorer + compression + first token, "
            "as if it ran alone; **TPOT**: decode time after the first token per token.")
elif section == "Latency":
    chart(figure("latency", view), "latency", f"{stem}-latency")
elif section == "Breakdown":
    for dimension in ("task", "context length"):
        chart(figure("breakdown", view, dimension), f"breakdown-{dimension}", f"{stem}-by-{slug(dimension)}")
elif section == "Needles":
    needles = charts.needle_configs(shown_results(view)[0])
    if needles:
        needle = state.needle or needles[0]
        chart(figure("needle", view, needle), "needle-chart", f"{stem}-needle-{slug(needle)}")
    else:
        st.info("No needle heatmap: this experiment has no retrieval items (passkey, multikey) with needle depths.")
elif section == "Failed items":
    failed = views.failed_rows(shown_results(view)[0])
    if failed:
        st.caption("Items scored below 1 or that raised, with what the model generated.")
        st.dataframe(failed, hide_index=True)
    else:
        st.success("Every scored item was answered correctly.")
elif section == "Spec & environment":
    st.code(dump_spec(parse_spec(experiment.spec)), language="toml")
    st.json({"git_commit": experiment.git_commit, "versions": experiment.versions, "hardware": experiment.hardware},
            expanded=False)


def _report(experiment: ExperimentRecord, view: View) -> str:
    summaries, decided = analysed(view)
    results, baseline = shown_results(view)
    figures = {"Memory vs accuracy": charts.tradeoff_figure(summaries, "bytes", baseline),
               "Compression ratio vs accuracy": charts.tradeoff_figure(summaries, "ratio", baseline),
               "Latency": charts.latency_figure(summaries),
               "Accuracy by context length": charts.breakdown_figure(
                   breakdown(results, length_group, baseline), "context length")}
    figures |= {f"Needles: {name}": charts.needle_heatmap(results, name) for name in charts.needle_configs(results)}
    best = decided.sweet_spot
    meta = {"experiment": experiment.id, "status": experiment.status, "model": experiment.model,
            "backend": experiment.backend_kind, "seed": experiment.seed,
            "created": f"{experiment.created_at:%Y-%m-%d %H:%M} UTC",
            "sweet spot": views.sweet_spot_label(best) if best else f"none ({decided.note})",
            "sweet spot rule": f"the {decided.rule}"}
    return report_html(f"kvlab: {experiment.name}", meta,
                       {"Summary": views.summary_rows(summaries, best.config_name if best else None),
                        "Failed items": views.failed_rows(results, limit=100)},
                       figures, dump_spec(parse_spec(experiment.spec)),
                       {"git_commit": experiment.git_commit, "versions": experiment.versions,
                        "hardware": experiment.hardware})


if section == "Export":
    st.caption("Each chart has its own PNG / SVG / PDF / HTML buttons under it. Here: the data and a report.")
    csv_col, json_col, report_col = st.columns(3)
    csv_col.download_button("Results (CSV)", data=lambda: results_csv(results), file_name=f"{stem}.csv",
                            mime="text/csv", on_click="ignore", icon=":material/download:")
    json_col.download_button("Everything (JSON)", file_name=f"{stem}.json", mime="application/json",
                             data=lambda: json.dumps(experiment_document(store, experiment.id), indent=1),
                             on_click="ignore", icon=":material/download:")
    report_col.download_button("HTML report", data=lambda: _report(experiment, view), file_name=f"{stem}-report.html",
                               mime="text/html", on_click="ignore", type="primary", icon=":material/description:")

share_box(state.params())
