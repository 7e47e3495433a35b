"""Experiment: a finished one opens on its result (the sweet spot, the tradeoff chart, the summary
table, the verdict per task); one still running opens on its progress and telemetry.  The other
sections (latency, breakdowns, needle heatmap, failed items and one item's KL along its tokens, spec
and environment, exports) are picked with a selector
bound to the URL (``tab``), and only the picked one is built and drawn: its charts come from caches
keyed by the experiment's last update and the viewer's choices."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import plotly.graph_objects as go
import streamlit as st

from kvlab.analysis.noise_floor import floor_lines, noise_floor, under_load_lines
from kvlab.analysis.summary import breakdown, length_group, question_rank
from kvlab.capacity.gpus import GPUS
from kvlab.core.backends import BACKENDS
from kvlab.core.experiment_spec import dump_spec, parse_spec
from kvlab.core.limits import MAX_NOTES_CHARS
from kvlab.core.load_spec import stored_load_target
from kvlab.core.margin_inputs import MARGIN_FORMAT, MARGIN_INPUTS
from kvlab.core.margins import Margins
from kvlab.core.tasks import TASKS
from kvlab.dashboard import (
    capacity_view,
    charts,
    estimate,
    experiment_status,
    experiment_view,
    formatting,
    page_table,
)
from kvlab.dashboard.capacity_view import architecture
from kvlab.dashboard.chart_export import report_html, with_caveat
from kvlab.experiments import eta, load_report, worker_logs
from kvlab.experiments.export import experiment_document, results_csv
from kvlab.experiments.report import budget_notes
from kvlab.paths import log_dir
from kvlab.secrets import redact
from kvlab.store import ExperimentNotFoundError, ExperimentRecord, StoreError
from kvlab.store.records import TelemetrySample, TrialRecord
from pages.common import (
    CANCEL_CONSEQUENCE,
    View,
    address_bar,
    analysed,
    cancel_experiment,
    chart,
    db_url,
    empty_state,
    get_store,
    guard,
    pick_experiment,
    results_of,
    share_box,
    shown_results,
    slug,
    view_of,
    viewer_zone,
)

LIVE_EVERY_S = 2.0
TELEMETRY_LIMIT = 3000
#: Sections that use the config filter and the margin.
ANALYSED = ("Tradeoff", "Latency", "Breakdown", "Needles", "Failed items", "Export")
#: The accuracy margin the page re-decides at (the spec's max_drop, a fraction like accuracy: fmt_margin writes it).
MAX_DROP = MARGIN_INPUTS["max_drop"]
#: Under "Hide configs": what hiding does to the decision (nothing: docs/decisions.md).
HIDE_NOTE = ("Hiding is display only: the sweet spot and every verdict are decided on all configs, Holm-corrected "
             "across all of them, whatever is hidden.")

store = get_store()
if (confirmed := st.session_state.pop("cancel_confirmed", None)) is not None:  # by _confirm_cancel, before the page
    st.session_state["experiment_flash"] = [cancel_experiment(store, confirmed)]  # reads it (here, a fault is one line)
recent = store.list_experiments(limit=200)
if not recent:
    empty_state("No experiments yet: create one (or launch the tiny example) and it shows up here.",
                page_table.NEW, "New experiment")
    st.stop()

experiment = pick_experiment(store, recent, "experiment", key="experiment_pick")

zone, zone_name = viewer_zone()
st.title(formatting.md(experiment.name))
st.caption(f"#{experiment.id} · {experiment_status.kind(experiment)} · {experiment.status} · "
           f"model {formatting.md(experiment.model)} "
           f"({experiment.backend_kind}) · seed {experiment.seed} · created "
           f"{formatting.fmt_time(experiment.created_at, zone)} ({zone_name})"
           + (f" · tags: {formatting.md(', '.join(experiment.tags))}" if experiment.tags else ""))
if experiment.error:
    st.error(formatting.md(experiment.error))
for flash_kind, flash_text in st.session_state.pop("experiment_flash", []):
    (st.success if flash_kind == "ok" else st.error)(formatting.md(flash_text))


def cancel_box(experiment: ExperimentRecord) -> None:
    """While it is queued or running: Cancel, asked again before it is done (as the experiments list asks)."""
    if experiment.is_terminal:
        st.session_state.pop("pending_cancel", None)
        return
    # Each answer is kept by its button's callback, which Streamlit runs before whichever rerun takes the click: a
    # click read in the script body was lost once in a full test-suite run (the experiment stayed running), when
    # the live panel's timed rerun took the click's place.  The store is asked at the top of that rerun, where the
    # page's guard turns a fault into one line (a callback's would reach the page as a traceback).
    if st.session_state.get("pending_cancel") != experiment.id:
        st.button("Cancel", icon=":material/cancel:", key="ask-cancel", on_click=_ask_cancel, args=(experiment.id,),
                  help="Stop its queued and running trials; you are asked again first")
        return
    st.warning(f"Cancel experiment #{experiment.id}? {CANCEL_CONSEQUENCE}")
    yes_col, no_col, _ = st.columns([1, 1, 4])
    yes_col.button("Yes, cancel", type="primary", key="confirm-cancel", on_click=_confirm_cancel,
                   args=(experiment.id,))
    no_col.button("No", key="dismiss-cancel", on_click=_dismiss_cancel)


def _ask_cancel(experiment_id: int) -> None:
    st.session_state["pending_cancel"] = experiment_id


def _confirm_cancel(experiment_id: int) -> None:
    st.session_state["cancel_confirmed"] = experiment_id
    st.session_state.pop("pending_cancel", None)


def _dismiss_cancel() -> None:
    st.session_state.pop("pending_cancel", None)


cancel_box(experiment)
if experiment.spec.get("tune") is not None:
    st.page_link(page_table.TUNE.script, label="A tune: its Pareto front, stopped candidates and recommendation",
                 query_params={"id": str(experiment.id)}, icon=":material/tune:")


def notes_panel(experiment: ExperimentRecord) -> None:
    """The experiment's notes, and a form to edit them (stored redacted: a URL's password is masked).  Notes over
    the limit are refused with what the limit is, nothing saved and the text left in the box to shorten (the box
    has no ``max_chars``: the browser would drop a longer paste without a word)."""
    if experiment.notes:
        st.markdown(f"**Notes:** {formatting.md(experiment.notes)}")
    for message in st.session_state.pop("notes_flash", []):
        st.success(message, icon=":material/check:")
    # Popovers, not expanders, here and for the settings and definitions: the browser draws a popover's body
    # only when it is opened (the three as expanders cost ~0.12 s of each warm load on 2 cores, docs/decisions.md).
    with (st.popover("Edit notes" if experiment.notes else "Add notes", icon=":material/edit_note:"),
          st.form("notes-form", border=False)):
        text = st.text_area("Notes", value=experiment.notes, key=f"notes-{experiment.id}",
                            help=f"Free text kept with the experiment, at most {MAX_NOTES_CHARS:,} characters: shown "
                                 "in the experiments list, found by its search, exported with it (`kvlab notes ID` "
                                 "prints or sets them). A URL's password or a known key is masked before it is "
                                 "stored.")
        save = st.form_submit_button("Save notes", icon=":material/save:")
    if not save:
        return
    if len(text) > MAX_NOTES_CHARS:  # said here, outside the popover: a rerun may close it
        st.error(f"Not saved: the notes are {len(text):,} characters, more than the {MAX_NOTES_CHARS:,} allowed. "
                 "Your text is still in the box: shorten it and save again.", icon=":material/error:")
        return
    try:
        stored = store.set_notes(experiment.id, text)
    except StoreError as error:
        st.error(f"Not saved: {formatting.md(str(error))}", icon=":material/error:")
        return
    st.session_state.pop(f"notes-{experiment.id}", None)  # the box shows what was stored
    st.session_state["notes_flash"] = ["Notes saved" + ("; a secret in them was masked." if stored != text else ".")]
    st.rerun()


notes_panel(experiment)


#: Counts the page's own runs; the live panel notes the one it last drew in, to tell the page's run from its own.
PAGE_RUNS, PANEL_SEEN = "experiment-page-runs", "experiment-panel-seen"
st.session_state[PAGE_RUNS] = st.session_state.get(PAGE_RUNS, 0) + 1


#: The live panel holds still while the page asks whether to cancel, so that the answer's click meets no refresh
#: of the panel in flight (in one full test-suite run, a click on "Yes, cancel" beside a refreshing panel was
#: never seen by the page; not reproduced alone, even under CPU load).
LIVE_REFRESH_S = None if experiment.is_terminal or st.session_state.get("pending_cancel") == experiment.id \
    else LIVE_EVERY_S


@st.fragment(run_every=LIVE_REFRESH_S)
def live_panel(experiment_id: int, shown: tuple[Any, ...], detailed: bool, follow_items: bool) -> None:
    """The progress bar with the time left and, in the Progress section (``detailed``), the trials, where
    the time went, telemetry, the workers' log and events; refreshed every few seconds while the
    experiment runs.  When a trial ends (or the experiment does), and with ``follow_items`` when items
    land (a section drawn from the results so far), the whole page reruns so the results catch up."""
    with guard("Experiment: live panel"):  # its reruns every few seconds run outside app.py's guard
        _live_panel(experiment_id, shown, detailed, follow_items)


def _live_panel(experiment_id: int, shown: tuple[Any, ...], detailed: bool, follow_items: bool) -> None:
    try:
        current = store.get_experiment(experiment_id)
    except ExperimentNotFoundError as error:  # deleted meanwhile
        st.error(str(error))
        return
    # In the panel's own runs only: a page whose items land faster than it draws would otherwise rerun from
    # here for ever, never reaching its results (the panel's next run, seconds later, catches the page up).
    in_page_run = st.session_state.get(PANEL_SEEN) != st.session_state[PAGE_RUNS]
    st.session_state[PANEL_SEEN] = st.session_state[PAGE_RUNS]
    if not in_page_run and live_key(current, follow_items) != shown:
        st.rerun(scope="app")  # before drawing: the rerun draws it (drawn here too, it showed twice meanwhile)
    ended = current.trials_done + current.trials_failed + current.trials_cancelled
    now = datetime.now(UTC)
    trials = store.trials(current.id)
    left = "" if current.is_terminal else " · " + experiment_view.eta_text(time_left(current, trials, now))
    st.progress(experiment_status.progress(current) or 0.0, text=formatting.md(
        f"{current.status}: {current.items_done}/{current.items_total or '?'} items, {ended}/{current.trials_total} "
        f"trials ended · {formatting.fmt_duration(experiment_status.experiment_duration(current, now))} "
        f"since it was queued{left}"))
    if detailed:
        _progress_details(current, trials, now)


def live_key(current: ExperimentRecord, follow_items: bool) -> tuple[Any, ...]:
    """What the page shows depends on: its status and trials ended, and its items done where it draws results."""
    ended = current.trials_done + current.trials_failed + current.trials_cancelled
    return (current.status, ended, current.items_done if follow_items else None)


def time_left(current: ExperimentRecord, trials: Sequence[TrialRecord], now: datetime) -> eta.Eta | None:
    """The estimate of :mod:`kvlab.experiments.eta`, from this model's finished runs on this backend in the store."""
    past = store.list_experiments(status="done", search=current.model, limit=50)
    return eta.estimate(current, trials, past, now, planned_per_config(current.id, db_url()))


@st.cache_data(show_spinner=False, max_entries=64, ttl=3600)
def planned_per_config(experiment_id: int, db: str | None) -> int | None:
    """The items each config of the experiment's spec runs (``db`` only keys the cache)."""
    try:
        return estimate.items_per_config(parse_spec(store.get_experiment(experiment_id).spec, stored=True))
    except (ExperimentNotFoundError, ValueError):  # deleted, or a spec this kvlab no longer reads: no plan
        return None


def _progress_details(current: ExperimentRecord, trials: Sequence[TrialRecord], now: datetime) -> None:
    with st.expander("Trials", expanded=not current.is_terminal):
        st.dataframe(experiment_view.trial_rows(trials), hide_index=True, column_config={
            "progress": st.column_config.ProgressColumn("progress", min_value=0.0, max_value=1.0, format="percent")})
    samples = store.telemetry(current.id, limit=TELEMETRY_LIMIT)
    st.caption("Time: " + experiment_view.timeline_text(eta.timeline(current, samples, now)) + ".")
    if current.is_terminal:  # the samples no longer change: build their charts once
        figures = telemetry_figures(current.id, (current.status, current.finished_at), db_url())
    else:
        figures = build_telemetry_figures(samples)
    for name, built in figures.items():
        chart(built, name, f"{slug(current.name)}-{'memory' if name == 'telemetry' else name}")
    if not figures and current.status == "queued":
        st.info("Queued: no worker has claimed it yet. Workers started from this dashboard pick it up within "
                "seconds; elsewhere run `kvlab worker` with the same KVLAB_DATABASE_URL.")
    elif not figures:
        st.caption("No telemetry for this experiment (its workers sample memory once a second while they run).")
    log_tail(current, trials)
    with st.expander("Recent events"):
        for event in store.events(current.id)[-8:]:
            st.text(f"{event.level:7} {event.message}")


def log_tail(current: ExperimentRecord, trials: Sequence[TrialRecord]) -> None:
    """The last lines its local workers logged (:mod:`kvlab.experiments.worker_logs`), or where to look."""
    workers = {t.worker_id for t in trials if t.worker_id}
    tail = worker_logs.worker_log_tail(workers, current.created_at.timestamp())
    with st.expander(f"Worker log (last {worker_logs.TAIL_LINES} lines)", expanded=not current.is_terminal):
        if tail.lines:
            st.caption("From " + ", ".join(formatting.code_span(str(path)) for path in tail.files)
                       + (" (follows the run)." if not current.is_terminal else "."))
            st.text("\n".join(tail.lines))
        elif workers:
            st.caption(f"No log of its workers ({formatting.md(', '.join(sorted(workers)))}) in "
                       f"{formatting.code_span(str(log_dir()))}: workers on another host, on Ray or `kvlab run` in a "
                       "terminal log where they run.")
        else:
            st.caption("No worker has claimed a trial yet.")


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
def figure(kind: str, view: View, option: str = "", title: str = "", metric: str = "accuracy") -> go.Figure:
    """One chart of the results, built once per (experiment, last update, the viewer's choices)."""
    summaries, decision = analysed(view)
    results, baseline = shown_results(view)
    if kind == "tradeoff":
        return charts.tradeoff_figure(summaries, option, baseline, title=title, metric=metric, decision=decision)
    if kind == "latency":
        return charts.latency_figure(summaries)
    if kind == "breakdown":
        key = {"task": lambda r: r.task, "context length": length_group, "question rank": question_rank}[option]
        grouped = [r for r in results if key(r) is not None]  # question rank: the items that shared a context
        return charts.breakdown_figure(breakdown(grouped, key, baseline, view.margins), option)
    if kind == "needle":
        return charts.needle_heatmap(results, option)
    if kind == "item":
        return charts.item_kl_figure(results, option)
    if kind == "generation":
        return charts.generation_figure(results)
    if kind == "layout":
        return charts.cache_layout_figure(results, option)
    raise ValueError(f"no chart {kind!r}")


results, baseline = results_of(experiment)
if not results:
    live_panel(experiment.id, live_key(experiment, True), detailed=True, follow_items=True)
    empty_state("No results yet: they appear here as trials finish (the page follows along)."
                if not experiment.is_terminal else "This experiment stored no results.")
    share_box({"id": experiment.id})
    st.stop()


def _section_picked() -> None:
    st.session_state["tab_picked"] = True


def follow_default_section(sections: Sequence[str]) -> None:
    """Until the viewer picks a section (in the selector, or with a link's ``tab``), the selector
    follows the section the page opens on (``sections[0]``): Progress while the experiment runs, the
    result once it has ended (the live panel reruns the page then), and ``tab`` stays out of the URL."""
    if "tab_picked" not in st.session_state:
        st.session_state["tab_picked"] = st.query_params.get("tab") in sections
    seed("tab", kept("tab", sections) or sections[0])
    if not st.session_state["tab_picked"] and st.session_state["tab"] != sections[0]:
        st.session_state["tab"] = sections[0]


def kept(key: str, options: Sequence[str] | None = None) -> Any:
    """A widget's value, also in a run that does not draw it: what it kept (``persist_state``), else the
    link's (None when ``options`` are given and the link's is not one: the widget would refuse it)."""
    if key in st.session_state:
        return st.session_state[key]
    values = st.query_params.get_all(key)
    if key == "hide":
        return values
    value = values[-1] if values else None
    return None if options is not None and value not in options else value


def seed(key: str, value: Any, options: Sequence[Any] | None = None) -> None:
    """Give the widget of ``key`` its value before it is drawn (where it has none, or one no longer among
    ``options``).  The page's widgets take their values only this way, never also a default of their own
    (Streamlit logs a warning with a stack trace for a widget given both), and none binds itself to the URL:
    :func:`pages.common.address_bar` writes the URL from the view's one state."""
    if key not in st.session_state or (options is not None and st.session_state[key] not in options):
        st.session_state[key] = value


def kept_margin(default: float) -> float:
    """The margin (a fraction, as max_drop): the kept one, else the link's, else the spec's (``default``).  A
    link made while the page took the margin in hundredths (``margin=5``) means 0.05: no fraction of the items
    exceeds 1.  A link's margin that is not a number in the widget's range is left at the spec's, said in a line."""
    if "margin" in st.session_state:
        return float(st.session_state["margin"])
    raw = st.query_params.get("margin")
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    value = value / 100 if value > 1 else value
    if not MAX_DROP.form_low <= value <= MAX_DROP.form_high:
        st.warning(f"The link's margin {formatting.md(repr(raw[:40]))} is not a fraction from "
                   f"{MAX_DROP.form_low:g} to {MAX_DROP.form_high:g}: left at the spec's, "
                   f"{formatting.fmt_margin(default)}.")
        return default
    return value


def _whole(raw: Any, low: int, high: int) -> int | None:
    """A link's whole number within [low, high], else None (the default then applies)."""
    try:
        value = int(str(raw))
    except ValueError:
        return None
    return value if low <= value <= high else None


cap_models = capacity_view.model_choices(experiment.model)


def capacity_choice(section: str) -> capacity_view.CapacityChoice:
    """The Capacity section's inputs: from its widgets where it is drawn, else as kept or linked."""
    model = kept("cap_model", cap_models) or cap_models[0]
    gpu = kept("gpu", list(GPUS)) or capacity_view.DEFAULT_GPU
    default_context = capacity_view.default_context(architecture(model))
    context = _whole(kept("context"), 1, capacity_view.MAX_CONTEXT) or default_context
    clients = _whole(kept("clients"), 1, 100_000) or capacity_view.DEFAULT_CONCURRENCY
    if section == "Capacity":
        model_col, gpu_col, context_col, clients_col = st.columns(4)
        seed("cap_model", model, cap_models)
        model = model_col.selectbox("Model", cap_models, key="cap_model", persist_state="page",
                                    help="The experiment's own model, or a well-known architecture (its real "
                                         "geometry, sliding layers included): `kvlab capacity --help`.")
        seed("gpu", gpu, list(GPUS))
        gpu = gpu_col.selectbox("GPU", list(GPUS), key="gpu", persist_state="page",
                                format_func=lambda name: GPUS[name].title)
        seed("context", context)
        context = int(context_col.number_input("Tokens per sequence", 1, capacity_view.MAX_CONTEXT, step=1024,
                                               key="context", persist_state="page"))
        seed("clients", clients)
        clients = int(clients_col.number_input("Sequences at once", 1, 100_000, step=1, key="clients",
                                               persist_state="page"))
    return capacity_view.CapacityChoice(model, gpu, context, clients)


def view_state(section: str, default_section: str, spec_margin: float) -> experiment_view.ExperimentViewState:
    """The viewer's choices, each from its widget where this section draws it (else as it was kept):
    the one state that the analysis, the charts, the share link and the address bar all come from."""
    names = list(dict.fromkeys(r.config_name for r in results))
    hidden, margin = [name for name in kept("hide") or [] if name in names], kept_margin(spec_margin)
    if section in ANALYSED:
        with st.popover("Configs and margin", icon=":material/tune:"):
            seed("hide", hidden)
            hidden = st.multiselect("Hide configs", names, key="hide", persist_state="page",
                                    help="Leave configs out of the charts and tables. Display only: the decision "
                                         "stays on every config.")
            st.caption(HIDE_NOTE)
            seed("margin", margin)
            margin = st.number_input(
                MAX_DROP.label, min_value=MAX_DROP.form_low, max_value=MAX_DROP.form_high, step=MAX_DROP.step,
                format=MARGIN_FORMAT, key="margin", persist_state="page", help=MAX_DROP.help)
    axis, metric = kept("x", formatting.X_AXES), kept("y", list(formatting.Y_METRICS))
    if section == "Tradeoff":
        x_col, y_col = st.columns(2)
        seed("x", axis or formatting.X_AXES[0])
        axis = x_col.radio("x axis", formatting.X_AXES, key="x", horizontal=True, persist_state="page",
                           help="bytes: physical KV cache in MiB; ratio: baseline bytes / physical bytes")
        seed("y", metric or next(iter(formatting.Y_METRICS)))
        metric = y_col.radio("y axis", list(formatting.Y_METRICS), key="y", horizontal=True, persist_state="page",
                             help="accuracy: fraction correct (pooled over tasks); KL: mean KL(baseline || config) "
                                  "per token in nats, teacher-forced on the baseline's output (lower is better); "
                                  "agreement: mean over items of each item's share of tokens with the baseline's "
                                  "top-1 token. 95% intervals, the item as the unit.")
    shown = [r for r in results if r.config_name not in hidden]
    needle = kept("needle")
    needles = charts.needle_configs(shown)
    if section == "Needles" and needles:
        seed("needle", needle if needle in needles else needles[0], needles)
        needle = st.selectbox("Config", needles, key="needle", persist_state="page")
    layout = kept("layout")
    layouts = charts.layout_configs(shown) if section == "Layers" or layout is not None else []
    if section == "Layers" and layouts:
        seed("layout", layout if layout in layouts else layouts[0], layouts)
        layout = st.selectbox("Config", layouts, key="layout", persist_state="page")
    item = kept("item")
    # reads every result
    items = experiment_view.fidelity_items(shown) if section == "Failed items" or item is not None else []
    if section == "Failed items" and items:
        seed("item", item if item in items else items[0], items)
        item = st.selectbox("Item: KL along its tokens", items, key="item", persist_state="page",
                            help="Any item on which fidelity to the baseline was measured, not only failed ones.")
    cap = capacity_choice(section)
    return experiment_view.ExperimentViewState(
        experiment.id, tab=None if section == default_section else section,
        cap_model=None if cap.model == cap_models[0] else cap.model,
        gpu=None if cap.gpu == capacity_view.DEFAULT_GPU else cap.gpu,
        context=None if cap.context == capacity_view.default_context(architecture(cap.model)) else cap.context,
        clients=None if cap.concurrency == capacity_view.DEFAULT_CONCURRENCY else cap.concurrency,
        x=None if axis in (None, formatting.X_AXES[0]) else axis,
        y=None if metric in (None, next(iter(formatting.Y_METRICS))) else metric, hide=tuple(hidden),
        margin=None if margin == spec_margin else margin, needle=None if needle in (None, *needles[:1]) else needle,
        layout=None if layout in (None, *layouts[:1]) else layout, item=None if item in (None, *items[:1]) else item)


sections = experiment_view.experiment_sections(experiment.is_terminal)
follow_default_section(sections)
section = st.segmented_control("Section", sections, required=True, key="tab", label_visibility="collapsed",
                               on_change=_section_picked)
live_panel(experiment.id, live_key(experiment, section in ANALYSED), detailed=section == experiment_view.LIVE_SECTION,
           follow_items=section in ANALYSED)

spec_margin = Margins.of(experiment.spec).max_drop
state = view_state(section or sections[0], sections[0], spec_margin)  # required=True: never None
address_bar(state.params())  # the share link's parameters, written before any section can stop the page
view = view_of(experiment, state.hide, spec_margin if state.margin is None else state.margin)
axis = state.x or formatting.X_AXES[0]
metric = state.y or next(iter(formatting.Y_METRICS))
stem = slug(f"{experiment.id}-{experiment.name}")

def load_section(experiment: ExperimentRecord, view: View, stem: str) -> None:
    """What each config buys under load beside what it costs: the load curves, the both-halves chart and table,
    the gains over the baseline (a spec's ``[load]`` table; its levels appear as each config's end)."""
    records = store.load_levels(experiment.id)
    if not records:
        why = BACKENDS[experiment.backend_kind].no_load if experiment.backend_kind in BACKENDS else None
        if why:
            st.info(formatting.md(f"No load phase on this backend: {why}."))
        elif experiment.spec.get("load") and not experiment.is_terminal:
            st.info("The load phase runs on each config's server after its items: its levels appear here as each "
                    "config ends.", icon=":material/hourglass_top:")
        else:
            st.info("No load phase: a [load] table in the spec measures each config's server under load, every "
                    "config in the same KV budget (kv_budget_mib, concurrency, request_rates; docs: the spec "
                    "reference).")
        return
    summaries = analysed(view)[0]
    baseline = shown_results(view)[1]
    shown_names = {s.config_name for s in summaries}
    records = [r for r in records if r.config_name in shown_names]
    st.caption("Every config's server in the same KV budget, measured with the task's own prompts by vllm bench "
               "serve's definitions: output tokens/s over the level's duration; TTFT to the first token; TPOT per "
               "output token after it; the most requests running and waiting as the server's /metrics said.")
    chart(charts.load_curves_figure(load_report.levels_by_config(records)), "load-curves", f"{stem}-load-curves")
    points = load_report.halves_points(summaries, baseline, records)
    if points:
        chart(charts.halves_figure(points, load_report.halves_front(points),
                                   f"{experiment.name}: what each config costs vs what it buys"),
              "halves", f"{stem}-both-halves")
        if unmeasured := [p.config for p in points if p.mean_kl is None]:
            st.caption(formatting.md(f"Not on the chart (no mean KL measured): {', '.join(unmeasured)}."))
    rows = load_report.both_halves_rows(summaries, records)
    st.dataframe(rows, hide_index=True, key="load-table")
    gains = [text for s in summaries if (text := load_report.gain_text(s, baseline, records))]
    if gains:
        st.markdown("\n".join(f"- {formatting.md(text)}" for text in gains))
    if (target := stored_load_target(experiment.spec)) is not None:
        head, *missed = load_report.target_lines(summaries, baseline, records, target)
        st.info(formatting.md(head[0].upper() + head[1:])
                + "".join(f"\n- {formatting.md(line.strip())}" for line in missed),
                icon=":material/speed:")
    st.download_button("Both halves (CSV)", data=lambda: capacity_view.rows_csv(rows, None), mime="text/csv",
                       file_name=f"{stem}-load.csv", on_click="ignore", icon=":material/download:")


if section == "Tradeoff":
    summaries, decision = analysed(view)
    sweet = decision.sweet_spot
    if not experiment.is_terminal:
        st.info(f"Still {experiment.status}: these are the results so far ({experiment.items_done} of "
                f"{experiment.items_total or '?'} items); the chart, the table and the verdict follow as items land, "
                "and may change.", icon=":material/hourglass_top:")
    (st.success if sweet is not None and not decision.few_items else st.info)(experiment_view.decision_text(decision))
    caveat = f"Few items: this sweet spot {decision.few_items_note()}." if decision.few_items else None
    if caveat:
        st.warning(formatting.md(caveat), icon=":material/warning:")
    if sweet is not None and sweet.config_name in state.hide:
        st.caption(f"The sweet spot ({formatting.md(sweet.config_name)}) is hidden from the chart and the table below.")
    chart(figure("tradeoff", view, axis, f"{experiment.name}: memory vs {formatting.Y_METRICS[metric]}", metric),
          "tradeoff", f"{stem}-tradeoff" + ("" if metric == "accuracy" else f"-{slug(metric)}"), caveat)
    st.dataframe(experiment_view.summary_rows(summaries, sweet.config_name if sweet else None,
                                    experiment_view.first_errors(shown_results(view)[0])), hide_index=True)
    shown_rows, shown_baseline = shown_results(view)
    if (floor := noise_floor(shown_rows, shown_baseline)) is not None:
        head, *rest = floor_lines(floor, summaries, shown_baseline, view.margins)
        rest += under_load_lines(store.load_levels(experiment.id), shown_baseline)
        st.info(formatting.md(head[0].upper() + head[1:]) + "".join(f"\n- {formatting.md(line)}" for line in rest),
                icon=":material/graphic_eq:")
    if notes := budget_notes(summaries):
        st.warning("Freeing less memory than the budget suggests (measured prompt cache):\n\n"
                   + "\n".join(f"- {formatting.md(note)}" for note in notes), icon=":material/memory:")
    verdicts = experiment_view.verdict_rows(summaries)
    if verdicts:
        st.subheader("Verdict per task")
        st.caption("A config is acceptable only when every task that can judge it accepts it; each task is judged "
                   "by fidelity where it is measured and a fidelity margin is set, else by accuracy.")
        st.dataframe(verdicts, hide_index=True, key="verdicts",
                     column_config={"reason": st.column_config.TextColumn("reason", width="large")})
    with st.popover("Definitions", icon=":material/menu_book:"):
        st.markdown(
            "- **Physical KV bytes**: the sum of `nbytes` of every tensor the compressed cache holds (codes, scales, "
            "zero points, 16-bit residual window, kept tokens), measured.\n"
            "- **Compression ratio (x)**: baseline bytes (the same tokens uncompressed at 16-bit) / physical bytes.\n"
            "- **Acceptable (every task)**: the decision. Each task judges each config apart (the verdict table): "
            "by **fidelity** where it is measured and a fidelity margin is set (certified within max_kl / "
            "min_agreement, Holm-corrected across configs, and accuracy not shown to drop by more than the margin), "
            "else by **accuracy** (shown non-inferior within the margin: Holm p < 0.025). A task the baseline "
            "cannot do (at its chance floor) judges by fidelity alone.\n"
            "- **Mean KL**: KL(baseline || config) in nats per token, teacher-forced on the baseline's output, mean "
            "over items with a 95% t interval (the item is the unit); **p99 KL**: over every token; **top-1 "
            "agreement**: share of tokens where both put their highest probability on the same token.\n"
            "- **Pooled** figures are over every task together, a summary beside the decision: **accuracy**, the "
            "mean per-item score in [0, 1] with a 95% Wilson interval; **vs baseline**, the paired accuracy "
            "difference (config - baseline) on the same items with its 95% interval (Newcombe's square-and-add; "
            "MOVER for fractional scores) and its Holm-corrected non-inferiority test; **p vs baseline**, the exact "
            "McNemar test.\n"
            "- **≈**: bytes estimated from a server's KV pool (bytes per token x prompt tokens), not measured.\n"
            "- **Pareto front**: configs no other config beats on both bytes (lower) and accuracy (higher).\n"
            "- **TTFT**: prefill (without eviction scorers) + this config's own scorer + compression + first token, "
            "as if it ran alone; **TPOT**: decode time after the first token per token.")
elif section == "Latency":
    chart(figure("latency", view), "latency", f"{stem}-latency")
elif section == "Load":
    load_section(experiment, view, stem)
elif section == "Capacity":
    summaries = analysed(view)[0]
    model = state.cap_model or cap_models[0]
    choice = capacity_view.CapacityChoice(model, state.gpu or capacity_view.DEFAULT_GPU,
                                          state.context or capacity_view.default_context(architecture(model)),
                                          state.clients or capacity_view.DEFAULT_CONCURRENCY)
    pool, _, rows = capacity_view.capacity_rows(summaries, experiment.backend_kind, choice)
    st.caption(formatting.md(capacity_view.pool_text(pool, architecture(choice.model).title, choice)))
    if experiment.backend_kind == "openai_compat":
        st.info("This endpoint chose its own KV cache: the configs below are projected as kvlab's cache lays them "
                "out, not as the server stores them.")
    chart(charts.capacity_figure(rows, choice.concurrency, f"{experiment.name}: sequences of {choice.context:,} "
                                 f"tokens that fit (projection)"), "capacity", f"{stem}-capacity",
          capacity_view.LABEL)
    st.dataframe(rows, hide_index=True, key="capacity-table")
    st.caption("Measured ratio: this experiment's baseline bytes / physical bytes at its own lengths. Throughput "
               "and latency under load are measured on a serving engine (vLLM, SGLang, llama.cpp), never projected.")
    st.download_button("Projection (CSV)", data=lambda: capacity_view.rows_csv(rows), mime="text/csv",
                       file_name=f"{stem}-capacity.csv", on_click="ignore", icon=":material/download:")
elif section == "Breakdown":
    shared = any(question_rank(r) is not None for r in shown_results(view)[0])
    for dimension in ("task", "context length", *(("question rank",) if shared else ())):
        chart(figure("breakdown", view, dimension), f"breakdown-{dimension}", f"{stem}-by-{slug(dimension)}")
    if shared:
        st.caption("Question rank: the questions that shared one context, in the order asked; the context was "
                   "prefilled and compressed once, before any of them, and charged to the first.")
elif section == "Layers":
    layouts = charts.layout_configs(shown_results(view)[0])
    if layouts:
        layout = state.layout or layouts[0]
        st.caption("The prompt's cache right after compression, layer by layer: how many tokens each KV head kept "
                   "and the bytes each layer's tensors hold (measured), each the mean over this config's items. "
                   "A head-wise budget (adakv) shares a layer's tokens out unevenly across heads; 16-bit layers "
                   "(skip_layers) and PyramidKV's schedule show as taller bars.")
        chart(figure("layout", view, layout), "layout-chart", f"{stem}-layers-{slug(layout)}")
    else:
        st.info("No per-layer layout: these results come from an engine that does not report where its cache's "
                "memory is (only the embedded engine does).")
elif section == "Generation":
    if charts.has_generation_trace(shown_results(view)[0]):
        summaries = analysed(view)[0]
        basis = f" The summary's bytes are {summaries[0].memory_basis}." if summaries else ""
        st.caption("The KV cache measured after every forward pass of each answer (its tensors' bytes). A config "
                   "with a decode policy is cut back while it generates; the others grow by each token they keep."
                   + basis)
        chart(figure("generation", view), "generation-chart", f"{stem}-generation")
    else:
        st.info("No cache over the generation: these results come from an engine that does not measure its "
                "cache while it generates (only the embedded engine does), or they scored fed text (perplexity).")
elif section == "Needles":
    needles = charts.needle_configs(shown_results(view)[0])
    if needles:
        needle = state.needle or needles[0]
        chart(figure("needle", view, needle), "needle-chart", f"{stem}-needle-{slug(needle)}")
    else:
        needle_tasks = ", ".join(name for name, task in TASKS.items() if task.needle_depths)
        st.info(f"No needle heatmap: this experiment has no retrieval items ({needle_tasks}) with needle depths.")
elif section == "Failed items":
    shown = shown_results(view)[0]
    failed = experiment_view.failed_rows(shown)
    if failed:
        st.caption("Items scored below 1 or that raised, with what the model generated.")
        st.dataframe(failed, hide_index=True)
    else:
        st.success("Every scored item was answered correctly.")
    items = experiment_view.fidelity_items(shown)
    if items:
        item = state.item or items[0]
        st.subheader("One item, token by token")
        chart(figure("item", view, item), "item-chart", f"{stem}-kl-{slug(item)}")
        st.dataframe(experiment_view.item_rows(shown, item), hide_index=True, key="item-table")
elif section == "Spec & environment":
    st.code(dump_spec(parse_spec(experiment.spec, stored=True)), language="toml")
    st.json({"git_commit": experiment.git_commit, "versions": experiment.versions, "hardware": experiment.hardware},
            expanded=False)


def _report(experiment: ExperimentRecord, view: View) -> str:
    summaries, decided = analysed(view)
    results, baseline = shown_results(view)
    caveat = f"Few items: this sweet spot {decided.few_items_note()}." if decided.few_items else None
    figures = {"Memory vs accuracy": charts.tradeoff_figure(summaries, "bytes", baseline, decision=decided),
               "Compression ratio vs accuracy": charts.tradeoff_figure(summaries, "ratio", baseline,
                                                                       decision=decided)}
    if any(s.mean_kl is not None for s in summaries):
        figures |= {f"Memory vs {words}": charts.tradeoff_figure(summaries, "bytes", baseline, f"Memory vs {words}",
                                                                 metric, decided)
                    for metric, words in formatting.Y_METRICS.items() if metric != "accuracy"}
    figures = {title: with_caveat(fig, caveat) for title, fig in figures.items()}  # the tradeoffs, as exported
    figures |= {"Latency": charts.latency_figure(summaries),
                "Accuracy by context length": charts.breakdown_figure(
                    breakdown(results, length_group, baseline, view.margins), "context length")}
    if any((r.config or {}).get("decode") for r in results):
        figures["KV cache over the generation"] = charts.generation_figure(results)
    figures |= {f"Needles: {name}": charts.needle_heatmap(results, name) for name in charts.needle_configs(results)}
    best = decided.sweet_spot
    meta = {"experiment": experiment.id, "status": experiment.status, "model": experiment.model,
            "backend": experiment.backend_kind, "seed": experiment.seed,
            "created": f"{formatting.fmt_time(experiment.created_at)} (UTC)",
            "sweet spot": (f"{experiment_view.sweet_spot_label(best)}, decided by {decided.decided_by}" if best
                           else f"none ({decided.note})") + (f"; {decided.few_items_note()}" if decided.few_items
                                                             else ""),
            "sweet spot rule": f"the {decided.rule}",
            "accuracy margin (max_drop)": formatting.fmt_margin(decided.max_drop),
            "notes": redact(experiment.notes) or "-"}
    return report_html(f"kvlab: {experiment.name}", meta,
                       {"Summary": experiment_view.summary_rows(summaries, best.config_name if best else None,
                                                      experiment_view.first_errors(results)),
                        "Verdict per task": experiment_view.verdict_rows(summaries),
                        "Failed items": experiment_view.failed_rows(results, limit=100)},
                       figures, dump_spec(parse_spec(experiment.spec, stored=True)),
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
