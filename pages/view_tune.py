"""Tune: a ``kvlab tune`` search, live while it runs, with its Cancel (pages/tune_view.py draws it).
The URL carries the experiment (``id``), the section (``section``: the search or the parameters), which
candidates the search shows (``show``) and the metric of the parameters' importance and slice plot (``metric``)."""

from __future__ import annotations

import streamlit as st

from kvlab.dashboard import formatting, page_table
from kvlab.dashboard.tune_launch import launched_here
from kvlab.tune.importance import DEFAULT_METRIC, METRICS
from pages import tune_view
from pages.common import empty_state, get_store, guard, pick_experiment, share_box, slug

store = get_store()
tunes = [e for e in store.list_experiments(limit=200) if e.spec.get("tune") is not None]
if formatting.parse_int(st.query_params.get("id")) is None and not tunes:
    empty_state("No tunes yet: start one on the New experiment page (mode Tune) or with `kvlab tune SPEC.toml`.",
                page_table.NEW, "New experiment")
    st.stop()
experiment = pick_experiment(store, tunes, "tune", key="tune_pick")
if experiment.spec.get("tune") is None:  # what made it is in its spec: a [tune] table, or a list of configs
    st.error(f"Experiment #{experiment.id} ({formatting.md(experiment.name)}) is a sweep of fixed configs, not a tune.")
    st.page_link(page_table.EXPERIMENT.script, label="Open it on the experiment page",
                 query_params={"id": str(experiment.id)}, icon=":material/arrow_forward:")
    st.stop()


@st.fragment(run_every=tune_view.LIVE_EVERY_S)
def starting(experiment_id: int) -> None:
    """``kvlab tune`` stores its experiment, then its search: between the two, wait for the search."""
    with guard("Tune: starting"):
        if store.tune(experiment_id) is not None:
            st.rerun(scope="app")
        st.info(f"Tune #{experiment_id} is starting: `kvlab tune` has stored its experiment and not yet its search "
                "(this page follows along). If this lasts, that process stopped first: the experiment page shows "
                "its events.", icon=":material/hourglass_top:")


tune = store.tune(experiment.id)
if tune is None:
    st.title(f"Tune: {formatting.md(experiment.name)}")
    starting(experiment.id)
    st.stop()


origin = "launched from the dashboard" if launched_here(store, experiment.id) else "launched by `kvlab tune`"
st.title(f"Tune: {formatting.md(experiment.name)}")
st.caption(f"#{experiment.id} · tune {tune.state} · {origin} · model "
           f"{formatting.md(experiment.model)} ({experiment.backend_kind}) · "
           f"{formatting.margins_label(experiment.spec)} · "
           f"started {tune.started_at:%Y-%m-%d %H:%M} UTC")
st.page_link(page_table.EXPERIMENT.script, label="Its trials, telemetry and results on the experiment page",
             query_params={"id": str(experiment.id)}, icon=":material/monitoring:")
tune_view.flash()
if tune.state == "running":
    tune_view.cancel_control(store, experiment)
section_col, show_col, metric_col = st.columns([2, 3, 2], vertical_alignment="bottom")
section = section_col.segmented_control("Section", tune_view.SECTIONS, default=tune_view.SECTIONS[0], required=True,
                                        key="section", bind="query-params",
                                        help="Search: the front, the hypervolume and the candidates. Parameters: "
                                        "their importance and the slice plot")
with show_col:
    show = st.segmented_control("Show", tune_view.SHOWS, default=tune_view.SHOWS[0], required=True, key="show",
                                bind="query-params", disabled=section != "Search",
                                help="Which candidates the chart and the table show (section Search)")
metric = metric_col.selectbox("Metric", list(METRICS), index=list(METRICS).index(DEFAULT_METRIC), key="metric",
                              bind="query-params", disabled=section != "Parameters",
                              help="The target of the parameters' importance and the slice plot's y axis (section "
                              "Parameters, which says what each is)")
share_box({"id": experiment.id, "section": section if section != tune_view.SECTIONS[0] else None,
           "show": show if show != tune_view.SHOWS[0] else None,
           "metric": metric if metric != DEFAULT_METRIC else None})


@st.fragment(run_every=tune_view.LIVE_EVERY_S if tune.state == "running" else None)
def live_view(seen: str, part: str, shown: str, target: str) -> None:
    with guard("Tune: live view"):  # its reruns every few seconds run outside app.py's guard
        tune_view.live(store, experiment, seen, part, shown, target, slug(f"{experiment.id}-{experiment.name}"))


live_view(tune.state, section, show, metric)
