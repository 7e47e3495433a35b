"""The tune page's body: a ``kvlab tune`` search as it runs -- the Pareto front so far, the hypervolume
over trials, the candidates stopped early and why, the item evaluations used against the full
grid's, and the current recommendation (the best complete candidate while it runs, the tune's
deployable answer once done).

Streamlit drawing only (not a page: pages/view_tune.py is): the numbers come from
:mod:`kvlab.tune.progress`, the figures from :mod:`kvlab.dashboard.tune_charts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import streamlit as st

from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.margins import DEFAULT_MAX_DROP
from kvlab.dashboard import tune_charts, views
from kvlab.store import ExperimentRecord, ExperimentStore
from kvlab.store.records import TuneRecord
from kvlab.tune import progress
from kvlab.tune.recommend import engine_title, serve_command
from pages.common import chart

LIVE_EVERY_S = 2.0
#: The page's ``show`` choice (in the URL): which candidates the chart and the table show.
SHOWS = ("all", "complete", "stopped", "active")


@dataclass
class TuneState:
    """Everything the page draws, read from the store at once."""

    tune: TuneRecord
    shown: list[progress.Point]
    front: list[progress.Point]
    history: list[float]
    baseline: tuple[float | None, float | None]  # bytes, accuracy
    used: int
    model: str
    configs: dict[int, dict[str, Any]]  # trial id -> KVCacheConfig fields


def read_state(store: ExperimentStore, experiment: ExperimentRecord, tune: TuneRecord) -> TuneState:
    trials = store.trials(experiment.id)
    max_drop = float(experiment.spec.get("max_drop", DEFAULT_MAX_DROP))
    shown = progress.points(store.candidates(experiment.id), trials, max_drop)
    base = progress.baseline_trial(trials)
    baseline = progress.baseline_measures(store.item_results(experiment.id, trial_id=base.id)) if base else (None, None)
    answer = tune.recommendation or {}
    if answer.get("baseline_kv_bytes"):  # the decision's own figure, on every item
        baseline = (float(answer["baseline_kv_bytes"]), answer.get("baseline_accuracy", baseline[1]))
    history = progress.hypervolume_history(shown, baseline[0]) if baseline[0] else []
    return TuneState(tune=tune, shown=shown, front=progress.pareto_front(shown), history=history, baseline=baseline,
                     used=progress.item_evals(trials), model=experiment.model,
                     configs={t.id: t.config for t in trials})


def live(store: ExperimentStore, experiment: ExperimentRecord, seen: str, show: str, stem: str) -> None:
    """The whole tune view; rerun every few seconds while the tune runs (the page wraps it in a
    fragment).  When the tune's state is no longer ``seen`` (the one the page was drawn for), the
    whole page reruns, which stops the refresh once the tune has ended."""
    tune = store.tune(experiment.id)
    if tune is None:  # deleted meanwhile
        st.error(f"experiment {experiment.id} has no tune any more")
        return
    state = read_state(store, experiment, tune)
    _header(state)
    _recommendation(state)
    visible = [p for p in state.shown if show == "all" or p.state == show]
    recommended = ((tune.recommendation or {}).get("label") if tune.state != "running"
                   else getattr(progress.best_so_far(state.shown), "label", None))
    chart(tune_charts.front_figure(visible, state.front if show in ("all", "complete") else [], state.baseline,
                                   recommended, title=f"{experiment.name}: {tune_charts.FRONT_TITLE}"),
          "tune-front", f"{stem}-front")
    st.caption("Feasible (counted in the front, the hypervolume and the recommendation): judged on every item and "
               "acceptable by the sweet-spot rule on every task, at the margins above (fidelity certified within "
               "max_kl / min_agreement where it is measured, else accuracy within max_drop; a tune stored before "
               "fidelity: the paired 95% interval of the accuracy difference above -max_drop). Stopped candidates "
               "are greyed.")
    if state.history:
        chart(tune_charts.hypervolume_figure(state.shown, state.history), "tune-hypervolume", f"{stem}-hypervolume")
        st.caption("Hypervolume of the feasible candidates so far in (KV bytes minimised, accuracy maximised), "
                   "reference point (the baseline's bytes, accuracy 0), as a fraction of that box.")
    _candidates_table(visible, stem)
    if tune.state != seen:
        st.rerun(scope="app")


def _header(state: TuneState) -> None:
    tally = progress.counts(state.shown)
    grid = state.tune.grid_item_evals
    state_col, candidates_col, evals_col, grid_col = st.columns(4)
    state_col.metric("Tune", state.tune.state)
    candidates_col.metric("Candidates", len(state.shown),
                          help=f"{tally['complete']} complete, {tally['stopped']} stopped early, "
                               f"{tally['active']} active")
    evals_col.metric("Item evaluations used", f"{state.used:,}",
                     delta=f"{state.used / grid:.0%} of the full grid" if grid else None, delta_color="off")
    grid_col.metric("Full grid", f"{grid:,}", help=f"{state.tune.grid_points} configs and the baseline on every item")
    if grid:
        st.progress(min(1.0, state.used / grid), text=f"{state.used:,} of the full grid's {grid:,} item evaluations "
                    f"({state.tune.grid_points} configs) · {tally['complete']} complete, {tally['stopped']} stopped "
                    f"early, {tally['active']} active")
    if state.tune.note:
        st.caption(views.md(state.tune.note))


def _recommendation(state: TuneState) -> None:
    st.subheader("Recommendation")
    answer = state.tune.recommendation
    if state.tune.state == "running" or answer is None:
        best = progress.best_so_far(state.shown)
        if best is None:
            st.info("No candidate is complete and non-inferior yet: the current best appears here as soon as one is "
                    "judged on every item." if state.tune.state == "running" else
                    f"The tune is {state.tune.state}: {views.md(state.tune.note or 'no recommendation')}.")
            return
        st.info(f"Current best so far (the tune is {state.tune.state}): **{views.md(best.label)}**, "
                f"{best.kv_bytes / progress.MB:.3f} MB KV per item, accuracy {best.accuracy:.3f}, difference "
                f"{progress.interval_text(best)} on {best.judged_items} items. The final choice also corrects for "
                "the number of candidates (Holm).")
        if best.trial_id in state.configs:
            command(serve_command(state.model, KVCacheConfig(**state.configs[best.trial_id])))
        return
    if answer.get("config") is None:
        st.warning("No config shown non-inferior: "
                   + views.md(answer.get("note") or "none of the candidates passed the rule"))
        return
    low, high = answer["diff_ci"]
    latency = ", ".join(f"{name} {answer[key]:.0f} ms" for name, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"))
                        if answer.get(key) is not None)
    st.success(f"Recommended: **{views.md(answer['label'])}**: {answer['kv_bytes'] / progress.MB:.3f} MB KV per item "
               f"(measured, {answer['compression_ratio']:.2f}x smaller than the 16-bit baseline), accuracy "
               f"{answer['accuracy']:.3f} vs {answer['baseline_accuracy']:.3f}, difference {answer['diff']:+.3f} "
               f"[{low:+.3f}, {high:+.3f}] on {answer['n_items']} items" + (f"; {latency} (median)" if latency else ""))
    st.markdown("**Deploy with kvlab serve**")
    command(answer["kvlab_serve"])
    for kind, engine in answer["engines"].items():  # the engines known when the tune ended
        st.markdown(f"**{engine_title(kind)}**: {engine['statement']}")
        if engine.get("flag"):
            command(engine["flag"])
    st.markdown("**As a spec entry (TOML)**")
    st.text(answer["toml"].rstrip())
    used, grid = answer.get("item_evals"), answer.get("grid_item_evals")
    if used is not None and grid:
        st.caption(f"{used:,} item evaluations, {used / grid:.0%} of the full grid's {grid:,}; proposals stopped "
                   f"because {answer.get('stopped_because') or 'the space was covered'}.")


def command(text: str) -> None:
    """A command as inline code: selectable and copyable, without ``st.code``'s 1.5 MB highlighter
    (0.6 s of browser time per tab, measured for the share box)."""
    st.markdown(views.code_span(text))


def _candidates_table(visible: Sequence[progress.Point], stem: str) -> None:
    st.subheader("Candidates")
    rows = progress.candidate_rows(visible)
    if not rows:
        st.caption("No candidate in this view yet.")
        return
    st.caption("In the order the tune proposed them. **reason**: why a candidate stopped early, or where it stands; "
               "**rung/items**: its round and the items it was judged on.")
    shown = [{key: views.md(value) if isinstance(value, str) else value for key, value in row.items()}
             for row in rows]  # st.table renders its cells as Markdown: labels and reasons are the store's text
    st.table(shown, hide_index=True, border="horizontal")  # a table, not a grid: the reasons wrap and read whole
    st.download_button("Candidates (CSV)", data=progress.rows_csv(rows), file_name=f"{stem}-candidates.csv",
                       mime="text/csv", on_click="ignore", icon=":material/download:", key="tune-csv")
