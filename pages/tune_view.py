"""The tune page's body: a ``kvlab tune`` search as it runs -- its trials done of the most it will run,
with an estimate of the time left, the Pareto front so far, the hypervolume over trials, the
parameters' importance and a slice plot for a metric, the candidates stopped early and why, the
item evaluations used against the full grid's, and the current recommendation (the best complete
candidate while it runs, the tune's deployable answer once done); and its Cancel.

Streamlit drawing only (not a page: pages/view_tune.py is): the numbers come from
:mod:`kvlab.tune.progress`, the figures from :mod:`kvlab.dashboard.tune_charts`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import streamlit as st

from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.units import MIB
from kvlab.dashboard import formatting, tune_charts
from kvlab.store import ExperimentRecord, ExperimentStore, StoreError
from kvlab.store.records import TuneRecord
from kvlab.tune import importance, progress
from kvlab.tune.recommend import engine_title, serve_command, serving_lines
from pages.common import chart

LIVE_EVERY_S = 2.0
#: The page's ``show`` choice (in the URL): which candidates the chart and the table show.
SHOWS = ("all", "complete", "stopped", "active", progress.UNFINISHED)
#: The page's ``section`` choice (in the URL): the search (its front, hypervolume and candidates, which
#: ``show`` filters) or the parameters (their importance and slice plot for ``metric``).  Apart, so that a
#: page opens with two charts, not four (~0.2 s of each load on 2 cores, docs/decisions.md).
SECTIONS = ("Search", "Parameters")


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
    budgets: progress.Budgets


def read_state(store: ExperimentStore, experiment: ExperimentRecord, tune: TuneRecord) -> TuneState:
    trials = store.trials(experiment.id)
    shown, budgets = progress.of_tune(experiment, tune, store.candidates(experiment.id), trials)
    base = progress.baseline_trial(trials)
    baseline = progress.baseline_measures(store.item_results(experiment.id, trial_id=base.id)) if base else (None, None)
    answer = tune.recommendation or {}
    if answer.get("baseline_kv_bytes"):  # the decision's own figure, on every item
        baseline = (float(answer["baseline_kv_bytes"]), answer.get("baseline_accuracy", baseline[1]))
    history = progress.hypervolume_history(shown, baseline[0]) if baseline[0] else []
    return TuneState(tune=tune, shown=shown, front=progress.pareto_front(shown), history=history, baseline=baseline,
                     used=budgets.item_evals, model=experiment.model, configs={t.id: t.config for t in trials},
                     budgets=budgets)


def live(store: ExperimentStore, experiment: ExperimentRecord, seen: str, section: str, show: str, metric: str,
         stem: str) -> None:
    """The whole tune view, its ``section`` of :data:`SECTIONS` under the header and the recommendation;
    rerun every few seconds while the tune runs (the page wraps it in a
    fragment).  When the tune's state is no longer ``seen`` (the one the page was drawn for), the
    whole page reruns before anything is drawn (drawing the ended view here too would show it twice
    while the page redraws), which stops the refresh once the tune has ended.  ``metric``: the target of
    the parameters' importance and the slice plot's y axis (a key of :data:`kvlab.tune.importance.METRICS`)."""
    tune = store.tune(experiment.id)
    if tune is None:  # deleted meanwhile
        st.error(f"experiment {experiment.id} has no tune any more")
        return
    if tune.state != seen:
        st.rerun(scope="app")
    state = read_state(store, experiment, tune)
    _header(state)
    _recommendation(state)
    if section == "Parameters":
        _parameters(store, state, importance.METRICS[metric], stem)
        return
    visible = [p for p in state.shown if show == "all" or p.state == show]
    recommended = ((tune.recommendation or {}).get("label") if tune.state != "running"
                   else getattr(progress.best_so_far(state.shown), "label", None))
    chart(tune_charts.front_figure(visible, state.front if show in ("all", "complete") else [], state.baseline,
                                   recommended, title=f"{experiment.name}: {tune_charts.FRONT_TITLE}",
                                   final=tune.state != "running"),
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


def _header(state: TuneState) -> None:
    tally = progress.counts(state.shown)
    grid = state.tune.grid_item_evals
    budgets = state.budgets
    state_col, trials_col, evals_col, grid_col = st.columns(4)
    state_col.metric("Tune", state.tune.state)
    trials_col.metric("Trials done", f"{budgets.done} of {budgets.most}" if budgets.most is not None
                      else f"{budgets.done}", help=_trials_help(budgets, tally))
    evals_col.metric("Item evaluations used", f"{state.used:,}",
                     delta=f"{state.used / grid:.0%} of the full grid" if grid else None, delta_color="off")
    grid_col.metric("Full grid", f"{grid:,}", help=f"{state.tune.grid_points} configs and the baseline on every item")
    st.progress(budgets.fraction, text=progress_text(budgets, state.tune.state == "running"))
    if state.tune.note:
        st.caption(formatting.md(state.tune.note))


def _trials_help(budgets: progress.Budgets, tally: Mapping[str, int]) -> str:
    limit = ("no max_trials: the search stops on its other budget" if budgets.max_trials is None else
             f"max_trials = {budgets.max_trials}" + (f"; the space holds {budgets.most} configs"
                                                     if budgets.most != budgets.max_trials else ""))
    return (f"A trial is a candidate the sampler proposed; done: judged on every item or stopped early ({limit}). "
            f"All candidates: {tally['complete']} complete, {tally['stopped']} stopped early, {tally['active']} "
            f"active, {tally[progress.UNFINISHED]} unfinished (left so by a tune that ended: never judged on every "
            "item).")


def progress_text(budgets: progress.Budgets, running: bool) -> str:
    """``3 of 4 trials done · 1 active · 2 min 05 s of 30 min (max_minutes) · about 40 s left (an
    estimate: ...)``: counts and durations, never a percentage."""
    parts = [f"{budgets.done} of {budgets.most} trials done" if budgets.most is not None
             else f"{budgets.done} trials done (no max_trials)"]
    if budgets.active:
        parts.append(f"{budgets.active} active")
    if budgets.unfinished:
        parts.append(f"{budgets.unfinished} unfinished")
    time_spent = formatting.fmt_duration(budgets.elapsed_s)
    parts.append(f"{time_spent} of {budgets.max_minutes:g} min (max_minutes)" if budgets.max_minutes is not None
                 else f"{time_spent} so far" if running else f"ran {time_spent}")
    if budgets.max_item_evals is not None:
        parts.append(f"{budgets.item_evals:,} of {budgets.max_item_evals:,} item evaluations (max_item_evals)")
    if running:
        parts.append(eta_text(budgets))
    return " · ".join(parts)


def eta_text(budgets: progress.Budgets) -> str:
    """The time left, labelled an estimate, with what it rests on: this tune's own pace (its trials
    ended so far), or its time budget; before either, that it is not known yet."""
    estimate = progress.eta(budgets)
    if estimate is None:
        return ("time left: not known yet (no trial has ended; the estimate is this tune's own pace, trials left × "
                "time per trial ended)")
    left = formatting.fmt_duration(estimate.seconds)
    pace = formatting.fmt_duration(budgets.pace_s)
    if estimate.basis == "trials":
        assert budgets.most is not None
        trials_left = budgets.most - budgets.done
        return (f"about {left} left (an estimate: {trials_left} trial{'s' if trials_left != 1 else ''} left × "
                f"{pace} per trial, this tune's pace over its {budgets.done} ended)")
    if estimate.basis == "minutes":
        return f"at most {left} left (its time budget, max_minutes; the trials left could end it sooner)"
    return f"about {left} left (an estimate: the item evaluations left of max_item_evals at this tune's pace so far)"


def _recommendation(state: TuneState) -> None:
    st.subheader("Recommendation")
    answer = state.tune.recommendation
    if state.tune.state == "running" or answer is None:
        best = progress.best_so_far(state.shown)
        ending = progress.ending_text(state.tune.state, state.budgets)
        if ending is not None:  # ended without an answer: say what finished and what did not, first
            st.warning(f"No recommendation: the tune {ending}."
                       + (f" {formatting.md(state.tune.note)}."
                          if state.tune.note and state.tune.note != state.tune.state else ""))
        if best is None:
            if ending is None:
                st.info("No candidate is complete and non-inferior yet: the current best appears here as soon as "
                        "one is judged on every item." if state.tune.state == "running" else
                        f"The tune is {state.tune.state}: {formatting.md(state.tune.note or 'no recommendation')}.")
            return
        what = (f"Current best so far (the tune is {state.tune.state})" if ending is None else
                f"Partial (the tune was {state.tune.state}: not its answer): the best of the candidates judged on "
                "every item before it ended")
        kv = "unmeasured" if best.kv_bytes is None else f"{best.kv_bytes / MIB:.3f} MiB"
        st.info(f"{what}: **{formatting.md(best.label)}**, {kv} KV per item, accuracy {best.accuracy:.3f}, difference "
                f"{progress.interval_text(best)} on {best.judged_items} items. The final choice also corrects for "
                "the number of candidates (Holm).")
        if best.trial_id in state.configs:
            command(serve_command(state.model, KVCacheConfig(**state.configs[best.trial_id])))
        return
    serving = serving_lines(answer)
    if answer.get("config") is None:
        st.warning("No config shown non-inferior: "
                   + formatting.md(answer.get("note") or "none of the candidates passed the rule"))
        if serving:
            st.text("\n".join(serving))
        return
    low, high = answer["diff_ci"]
    latency = ", ".join(f"{name} {answer[key]:.0f} ms" for name, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"))
                        if answer.get(key) is not None)
    st.success(f"Recommended: **{formatting.md(answer['label'])}**: {answer['kv_bytes'] / MIB:.3f} MiB KV per item "
               f"(measured, {answer['compression_ratio']:.2f}x smaller than the 16-bit baseline), accuracy "
               f"{answer['accuracy']:.3f} vs {answer['baseline_accuracy']:.3f}, difference {answer['diff']:+.3f} "
               f"[{low:+.3f}, {high:+.3f}] on {answer['n_items']} items" + (f"; {latency} (median)" if latency else ""))
    if serving:
        st.text("\n".join(serving))
    if answer.get("kvlab_serve"):  # None for an engine's own format, which kvlab's cache does not store
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


def _parameters(store: ExperimentStore, state: TuneState, metric: importance.Metric, stem: str) -> None:
    """Optuna's importance of each parameter for ``metric`` and its slice plot, over every candidate
    the sampler proposed that has a value of it (whatever the Show choice)."""
    st.subheader("Parameters")
    try:
        proposals = importance.read_proposals(store.study_storage_url(), state.tune.study_name)
    except (importance.StudyUnavailable, ValueError) as error:
        st.info(f"Parameter importance and the slice plot read the tune's Optuna study, which cannot be read: "
                f"{formatting.md(str(error))}.", icon=":material/info:")
        return
    found = importance.samples(state.shown, proposals, metric, state.baseline[0])
    st.caption(f"Metric: **{metric.label}**, {metric.meaning}; each candidate at its latest verdict (one stopped "
               "early on its first items only). Change it with **Metric** above.")
    result = importance.importance(found, metric)
    if result.why_not is not None:
        st.info(f"Parameter importance: not computed: {formatting.md(result.why_not)}.", icon=":material/info:")
    else:
        chart(tune_charts.importance_figure(result, metric), "tune-importance", f"{stem}-importance")
        st.caption(f"Optuna's PED-ANOVA importance ({'higher' if metric.higher_is_better else 'lower'} is better): "
                   f"how differently each parameter is set among the best {result.quantile:.0%} of the "
                   f"{result.candidates} candidates than among all of them. Optuna's default evaluator (fANOVA) "
                   "needs scikit-learn, which kvlab does not install; PED-ANOVA also handles the parameters asked "
                   "of some candidates only (a budget, of an eviction method)."
                   + "".join(f" Optuna: {formatting.md(note)}" for note in result.notes))
    if not found:
        st.info(f"Slice plot: no candidate has a {formatting.md(metric.label)} yet.", icon=":material/info:")
    elif not importance.varying(found):
        st.info(f"Slice plot: no parameter varies among the {len(found)} candidate{'s' if len(found) != 1 else ''} "
                "with this metric so far.", icon=":material/info:")
    else:
        chart(tune_charts.slice_figure(found, metric), "tune-slice", f"{stem}-slice")
        st.caption("A slice plot as Optuna draws one: one panel per parameter that varies, one point per candidate, "
                   "coloured by its state as in the front above (hover: the candidate, its Optuna trial number and "
                   "the items it was judged on).")


def cancel_control(store: ExperimentStore, experiment: ExperimentRecord) -> None:
    """Cancel behind a confirmation (a popover), so that one misclick does not end a long tune.

    The store's cancel, as the experiments list and ``kvlab cancel`` do it: the queued and running
    trials are cancelled, which the workers learn at their next heartbeat (the trial in flight is
    abandoned there, its item results so far kept), and the tune ends as cancelled; its driver stops
    proposing at its next check and marks its open proposals failed in the study.  The candidates
    judged so far and the best so far stay."""
    with st.popover("Cancel tune", icon=":material/cancel:"):
        st.markdown(f"Stop tune #{experiment.id}? No more candidates are proposed; the trial running now is "
                    "abandoned at its worker's next heartbeat (its item results so far are kept). The candidates "
                    "judged so far, the best so far and the study's trials stay.")
        if st.button(f"Yes, cancel tune #{experiment.id}", type="primary", key="tune-cancel-confirm"):
            try:
                stopped = store.cancel_experiment(experiment.id)
            except StoreError as error:  # it ended meanwhile
                st.session_state["tune-flash"] = ("warning", str(error))
            else:
                st.session_state["tune-flash"] = ("success", f"Tune #{experiment.id} cancelled: {stopped} trial"
                                                  f"{'s' if stopped != 1 else ''} stopped.")
            st.rerun(scope="app")


def flash() -> None:
    """The outcome of a Cancel, once, after the page redraws."""
    kind, message = st.session_state.pop("tune-flash", (None, None))
    if kind == "success":
        st.success(formatting.md(message), icon=":material/check_circle:")
    elif kind == "warning":
        st.warning(formatting.md(message))


def command(text: str) -> None:
    """A command as inline code: selectable and copyable, without ``st.code``'s 1.5 MB highlighter
    (0.6 s of browser time per tab, measured for the share box)."""
    st.markdown(formatting.code_span(text))


def _candidates_table(visible: Sequence[progress.Point], stem: str) -> None:
    st.subheader("Candidates")
    rows = progress.candidate_rows(visible)
    if not rows:
        st.caption("No candidate in this view yet.")
        return
    st.caption("In the order the tune proposed them. **reason**: why a candidate stopped early, or where it stands; "
               "**rung/items**: its round and the items it was judged on.")
    shown = [{key: formatting.md(value) if isinstance(value, str) else value for key, value in row.items()}
             for row in rows]  # st.table renders its cells as Markdown: labels and reasons are the store's text
    st.table(shown, hide_index=True, border="horizontal")  # a table, not a grid: the reasons wrap and read whole
    st.download_button("Candidates (CSV)", data=progress.rows_csv(rows), file_name=f"{stem}-candidates.csv",
                       mime="text/csv", on_click="ignore", icon=":material/download:", key="tune-csv")
