"""Experiments: every experiment with its status, progress and sweet spot; filter, sort, act on them.

Reads one page of experiments (``list_experiments`` counts their trials in one query) and computes
the sweet spot only for the experiments on that page, cached until their results change.
"""

from __future__ import annotations

import streamlit as st

from kvlab.core.errors import ConfigError
from kvlab.dashboard import page_table, views
from kvlab.experiments.submit import rerun
from kvlab.store import STATUSES, StoreError
from pages.common import best_label, empty_state, experiment_label, get_store, share_box

ACTIONS = {"cancel": "Cancel", "rerun": "Rerun", "delete": "Delete"}

st.title("Experiments")
store = get_store()

for kind, text in st.session_state.pop("experiments_flash", []):
    (st.success if kind == "ok" else st.error)(text)

search_col, status_col, tag_col, sort_col, page_col = st.columns([3, 1.2, 1.2, 1.4, 0.8])
search = search_col.text_input("Search", key="q", bind="query-params", placeholder="name, notes or model")
status = status_col.selectbox("Status", ["all", *STATUSES], key="status", bind="query-params")
tag = tag_col.text_input("Tag", key="tag", bind="query-params")
sort = sort_col.selectbox("Sort by", list(views.SORTS), key="sort", bind="query-params")
page = int(page_col.number_input("Page", min_value=1, step=1, key="page", bind="query-params"))

experiments = store.list_experiments(status=None if status == "all" else status, search=search.strip() or None,
                                     tag=tag.strip() or None, limit=views.PAGE_SIZE + 1,
                                     offset=(page - 1) * views.PAGE_SIZE, order=views.SORTS[sort])
has_next = len(experiments) > views.PAGE_SIZE
experiments = experiments[:views.PAGE_SIZE]
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

st.dataframe(
    views.experiment_rows(experiments, {e.id: best_label(e) for e in experiments}),
    hide_index=True, key="experiments_table",
    column_config={
        "id": st.column_config.NumberColumn("id", width="small"),
        "progress": st.column_config.ProgressColumn("progress", min_value=0.0, max_value=1.0, format="percent"),
        "best ratio holding baseline": st.column_config.TextColumn("best ratio holding baseline",
                                                                   help=views.BEST_RATIO_HELP),
    })
st.caption(f"Page {page}: {len(experiments)} experiments" + ("; more on the next page." if has_next else "."))

labels = {e.id: experiment_label(e) for e in experiments}
chosen = st.multiselect("Select experiments to act on", list(labels), format_func=labels.get, key="selected")
open_col, compare_col, *action_cols = st.columns(5)
if open_col.button("Open", disabled=len(chosen) != 1, icon=":material/open_in_new:"):
    st.switch_page(page_table.EXPERIMENT.script, query_params={"id": str(chosen[0])})
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
                count = store.cancel_experiment(experiment_id)
                messages.append(("ok", f"Experiment {experiment_id}: {count} trial(s) cancelled."))
            elif action == "rerun":
                new_id = rerun(experiment_id, workers)
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
    consequence = {"cancel": "Their queued and running trials stop; results already stored are kept.",
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
