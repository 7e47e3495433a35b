"""Experiments: every experiment with its kind, status, progress, sweet spot and notes; each row links to its
page; filter, sort, act on them.

Reads one page of experiments (``list_experiments`` counts their trials in one query) and computes
the sweet spot only for the experiments on that page, cached until their results change.
"""

from __future__ import annotations

import streamlit as st

from kvlab.core.errors import ConfigError
from kvlab.dashboard import experiment_status, experiments_list, page_table
from kvlab.dashboard.launch import rerun_from_page
from kvlab.store import STATUSES, StoreError
from pages.common import (
    CANCEL_CONSEQUENCE,
    cancel_experiment,
    decision_of,
    empty_state,
    experiment_label,
    get_store,
    share_box,
    viewer_zone,
)
from pages.tune_view import read_state

ACTIONS = {"cancel": "Cancel", "rerun": "Rerun", "delete": "Delete"}

st.title("Experiments")
store = get_store()

for kind, text in st.session_state.pop("experiments_flash", []):
    (st.success if kind == "ok" else st.error)(text)

search_col, status_col, tag_col, sort_col, page_col = st.columns([3, 1.2, 1.2, 1.4, 0.8])
search = search_col.text_input("Search", key="q", bind="query-params", placeholder="name, notes or model")
status = status_col.selectbox("Status", ["all", *STATUSES], key="status", bind="query-params")
tag = tag_col.text_input("Tag", key="tag", bind="query-params")
sort = sort_col.selectbox("Sort by", list(experiments_list.SORTS), key="sort", bind="query-params")
page = int(page_col.number_input("Page", min_value=1, step=1, key="page", bind="query-params"))

experiments = store.list_experiments(status=None if status == "all" else status, search=search.strip() or None,
                                     tag=tag.strip() or None, limit=experiments_list.PAGE_SIZE + 1,
                                     offset=(page - 1) * experiments_list.PAGE_SIZE, order=experiments_list.SORTS[sort])
has_next = len(experiments) > experiments_list.PAGE_SIZE
experiments = experiments[:experiments_list.PAGE_SIZE]
share_box({"q": search, "status": None if status == "all" else status, "tag": tag,
           "sort": None if sort == "newest" else sort, "page": None if page == 1 else page})

if not experiments:
    filtered = search or tag or status != "all" or page > 1
    if filtered:
        st.info("No experiment matches these filters: clear the search, tag or status, or go back to page 1.")
    else:
        empty_state("No experiments yet. Create one, or launch the ready-made tiny example sweep in one click.",
                    page_table.NEW, "New experiment")
    st.stop()

zone = viewer_zone()
tunes = {e.id: read_state(store, e, tune).budgets for e in experiments  # counted as the tune page counts them
         if experiment_status.kind(e) == "tune" and (tune := store.tune(e.id)) is not None}
st.dataframe(
    experiments_list.experiment_rows(experiments,
                                     {e.id: d for e in experiments if (d := decision_of(e)) is not None}, zone,
                                     tunes=tunes),
    hide_index=True, key="experiments_table", placeholder="-",  # a missing figure: "-", not Streamlit's "None"
    column_config={
        "id": st.column_config.LinkColumn("id", width="small", display_text=r"id=(\d+)$",
                                          help="Opens the experiment's page (a tune's: the tune page)"),
        "kind": st.column_config.TextColumn("kind", width="small", help="sweep: a grid of configs; tune: a search"),
        "progress": st.column_config.ProgressColumn(
            "progress", min_value=0.0, max_value=1.0, format="percent",
            help="A sweep: its items done; a tune: as its page's bar, its trials done of the most it runs "
                 "(max_trials), else its time budget spent, else its item evaluations'"),
        "best ratio held (x)": st.column_config.NumberColumn("best ratio held (x)", format="%.2fx",
                                                             help=experiments_list.BEST_RATIO_HELP),
        "its mean KL (nats)": st.column_config.NumberColumn(
            "its mean KL (nats)", format="%.3g",
            help="The sweet spot's mean KL(baseline || config) per token, where fidelity was measured"),
        experiments_list.started_column(zone[1]): st.column_config.TextColumn(
            help=f"When its first trial was claimed, in your browser's time zone ({zone[1]})"),
        "duration": st.column_config.TextColumn(help="From its creation to its end: the queue and the model's "
                                                     "load included"),
    })
st.caption(f"Page {page}: {len(experiments)} experiments" + ("; more on the next page." if has_next else "."))

labels = {e.id: experiment_label(e) for e in experiments}
chosen = st.multiselect("Select experiments to act on", list(labels), format_func=labels.__getitem__, key="selected")
open_col, compare_col, *action_cols = st.columns(5)
if open_col.button("Open", disabled=len(chosen) != 1, icon=":material/open_in_new:"):
    opened = next(e for e in experiments if e.id == chosen[0])
    st.switch_page((page_table.TUNE if experiment_status.kind(opened) == "tune" else page_table.EXPERIMENT).script,
                   query_params={"id": str(opened.id)})
if compare_col.button("Compare", disabled=len(chosen) < 2, icon=":material/compare_arrows:"):
    st.switch_page(page_table.COMPARE.script, query_params={"ids": [str(i) for i in chosen]})
for column, (action, label) in zip(action_cols, ACTIONS.items(), strict=True):
    if column.button(label, disabled=not chosen, key=f"ask-{action}"):
        st.session_state["pending_action"] = (action, list(chosen))


def _perform(action: str, ids: list[int]) -> list[tuple[str, str]]:
    messages = []
    workers = 1  # one local worker runs all the reruns in turn
    for experiment_id in ids:
        try:
            if action == "cancel":
                messages.append(cancel_experiment(store, experiment_id))
            elif action == "rerun":
                new_id = rerun_from_page(experiment_id, workers)
                workers = 0
                messages.append(("ok", f"Experiment {new_id} queued: a rerun of {experiment_id}."))
            else:
                store.delete_experiment(experiment_id)
                messages.append(("ok", f"Experiment {experiment_id} deleted."))
        except (StoreError, ConfigError) as error:  # a rerun is refused as a new launch is
            messages.append(("error", str(error)))
    return messages


pending = st.session_state.get("pending_action")
if pending:
    action, ids = pending
    consequence = {"cancel": CANCEL_CONSEQUENCE,
                   "rerun": "Each is queued again as a new experiment with the same spec, and a local worker starts.",
                   "delete": "Their trials, results, telemetry and events are deleted too. This cannot be undone."}
    st.warning(f"{ACTIONS[action]} experiment(s) {', '.join(f'#{i}' for i in ids)}? {consequence[action]}")
    yes_col, no_col, _ = st.columns([1, 1, 4])
    if yes_col.button(f"Yes, {action}", type="primary", key="confirm-action"):
        st.session_state["experiments_flash"] = _perform(action, ids)
        del st.session_state["pending_action"]
        st.rerun()
    if no_col.button("No", key="dismiss-action"):
        del st.session_state["pending_action"]
        st.rerun()
