"""The new-experiment page's Tune mode: the ``[tune]`` table's widgets, the preview (the full grid
against what the tune starts with) and the launch, which stores the tune, starts its driver in the
background (:func:`kvlab.dashboard.launch.launch_tune`) and opens the tune's page.

Widget keys are the form's (``f:tune.quant``, ...): :mod:`kvlab.dashboard.spec_form` turns them into
the table and places kvlab's validation messages next to them.  Not a page: pages/new_experiment.py
draws it (streamlit code lives in pages/, the logic in kvlab/).
"""

from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from kvlab.core.experiment_spec import ExperimentSpec, dump_spec
from kvlab.core.methods import BUDGETS, FRACTION_COUNT_BUDGETS
from kvlab.dashboard import estimate, formatting
from kvlab.dashboard.launch import Refused, launch_tune
from kvlab.dashboard.spec_form import TUNE_LABELS
from kvlab.store import ExperimentStore
from kvlab.tune.progress import plan
from pages.grid_inputs import grid_inputs


def fields(prefix: str, slot: Callable[[str], None]) -> None:
    """The search space, the constraints and the budget (the margins are the form's max_drop, max_kl and
    min_agreement, above)."""
    st.caption("The tune searches this space instead of running all of it: formats x group sizes x residual "
               "lengths x eviction methods x budgets. Clear losers stop after a few items, and its recommendation "
               "is the sweet spot by the rule at the margins above (max_drop, max_kl, min_agreement).")
    grid_inputs("tune", prefix, slot, st.session_state.get("form_base", {}).get("tune") or {})
    budget_col, low_col, high_col, step_col = st.columns(4)
    with budget_col:
        budget = st.selectbox("Budget", list(FRACTION_COUNT_BUDGETS), key=prefix + "tune.budget")
    low_col.number_input("from", min_value=0.01, max_value=0.99, step=0.05, format="%.3f",
                         key=prefix + "tune.budget_low", help=BUDGETS[budget].help if budget in BUDGETS else None)
    high_col.number_input("to", min_value=0.01, max_value=0.99, step=0.05, format="%.3f",
                          key=prefix + "tune.budget_high")
    step_col.number_input("step", min_value=0.005, max_value=0.95, step=0.005, format="%.3f",
                          key=prefix + "tune.budget_step")
    slot("tune.budget_range")
    slot("tune.budget_step")
    # No min_value: a negative limit is refused with a message (spec_form.tune_from_values), not clamped to 0,
    # which would mean no limit at all.
    steps = {"max_ttft_ms": 100.0, "max_tpot_ms": 10.0, "max_trials": 1, "max_minutes": 5.0, "max_item_evals": 50}
    helps = {"max_ttft_ms": "Candidates whose median time to first token is over it stop",
             "max_trials": "How many candidates the search proposes at most"}
    for column, key in zip(st.columns(len(steps)), steps, strict=True):
        with column:
            label = TUNE_LABELS[key]  # "Max TTFT (ms)" -> "Max TTFT (ms; 0: none)"
            label = f"{label[:-1]}; 0: none)" if label.endswith(")") else f"{label} (0: none)"
            st.number_input(label, step=steps[key], key=f"{prefix}tune.{key}", help=helps.get(key))
            slot(f"tune.{key}")
    slot("tune")


def preview(spec: ExperimentSpec) -> None:
    """The full grid against what the tune starts with."""
    n_items = estimate.items_per_config(spec)
    planned = plan(spec, n_items)
    grid_col, evals_col, first_col, rounds_col = st.columns(4)
    grid_col.metric("Full grid (configs)", planned.grid_points)
    evals_col.metric("Full grid (item evaluations)", f"{planned.grid_item_evals:,}",
                     help=f"every config and the baseline on all {n_items} items")
    first_col.metric("First round (item evaluations)", planned.first_item_evals,
                     help=f"{planned.first_candidates} candidates and the baseline on {planned.rounds[0]} items")
    rounds_col.metric("Rounds (items)", " → ".join(map(str, planned.rounds)))
    st.caption(f"The tune starts with {planned.first_candidates} candidates of the {planned.grid_points} on "
               f"{planned.rounds[0]} items; promising ones get more items ({', '.join(map(str, planned.rounds))}). "
               f"It stops proposing after {planned.budget}.")
    for note in planned.notes:
        st.caption(note)
    st.caption(f"Its recommendation: the {formatting.md(spec.margins.rule('its'))}.")


def launch_row(spec: ExperimentSpec, store: ExperimentStore, open_tune: Callable[[int], None]) -> None:
    """Download the spec, or launch the tune (it runs in a background ``kvlab tune`` with its own worker)."""
    download_col, launch_col = st.columns([1.2, 1])
    download_col.download_button("Download spec (TOML)", data=dump_spec(spec), file_name=f"{spec.name}.toml",
                                 mime="application/toml", icon=":material/download:", on_click="ignore")
    if launch_col.button("Launch tune", type="primary", key="launch_tune", icon=":material/play_arrow:",
                         help="Starts `kvlab tune` in the background on this host; `kvlab worker` processes "
                              "with the same store can help"):
        launch(spec, store, open_tune)


def launch(spec: ExperimentSpec, store: ExperimentStore, open_tune: Callable[[int], None]) -> None:
    """Store the tune, start its driver in the background and open its page; a refused spec says why
    in one line, and nothing is stored."""
    try:
        experiment_id = launch_tune(spec, st.session_state.get("form_warnings", []), store)
    except Refused as refused:
        st.error(formatting.md(str(refused)), icon=":material/error:")
        return
    open_tune(experiment_id)
