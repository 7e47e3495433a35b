"""Compare: several experiments' tradeoff curves overlaid, and a parallel-coordinates view of the
knobs (KV bits, evicted fraction) against the outcomes (ratio achieved, accuracy) with their table.
The third section sets the same spec on several engines side by side, each config against its own engine's
baseline, and pairs two of them config by config and item by item, an item known by its content, not its id alone
(the tables of ``kvlab compare``).  The sections are picked
with a selector bound to the URL (``tab``): only the picked one is drawn (the parallel coordinates need
plotly.js' full bundle, which the tradeoffs do not)."""

from __future__ import annotations

import streamlit as st

from kvlab.analysis.agreement import different_items, engine_agreement, engines_table
from kvlab.analysis.noise_floor import noise_floor
from kvlab.dashboard import charts, compare_view, formatting, page_table
from kvlab.store import ExperimentNotFoundError
from pages.common import chart, empty_state, experiment_label, get_store, results_of, share_box, summaries_of

st.title("Compare experiments")
store = get_store()
recent = store.list_experiments(limit=200)
if not recent:
    empty_state("Nothing to compare yet: run two experiments (say, the same sweep on two models), then pick them "
                "here.", page_table.NEW, "New experiment")
    st.stop()

records = {e.id: e for e in recent}
missing = []
for wanted_id in compare_view.parse_ids(st.query_params.get_all("ids")):
    if wanted_id not in records:
        try:
            records[wanted_id] = store.get_experiment(wanted_id)
        except ExperimentNotFoundError:
            missing.append(wanted_id)
if missing:
    st.warning(f"Experiment(s) {', '.join(f'#{i}' for i in missing)} no longer exist(s).")
invalid = compare_view.invalid_ids(st.query_params.get_all("ids"))
if invalid:
    st.warning(f"Ignored in the link's ids: {formatting.md(', '.join(repr(v[:40]) for v in invalid[:5]))}"
               f"{' ...' if len(invalid) > 5 else ''}: an experiment id is a whole number from 1.")
wanted = [i for i in compare_view.parse_ids(st.query_params.get_all("ids")) if i in records]
chosen = st.multiselect("Experiments", list(records), default=wanted, key="compare_pick",
                        format_func=lambda i: experiment_label(records[i]))
if compare_view.parse_ids(st.query_params.get_all("ids")) != chosen:
    st.query_params["ids"] = [str(i) for i in chosen]

summaries = {i: summaries_of(records[i])[0] for i in chosen}
trial_keys = [compare_view.trial_key(i, s.config_name) for i, rows in summaries.items() for s in rows]
hidden = st.multiselect("Hide configs", trial_keys, key="hide", bind="query-params",
                        help="experiment/config: leave these out of the charts")
section = st.segmented_control("Section", compare_view.COMPARE_SECTIONS, default=compare_view.COMPARE_SECTIONS[0],
                               required=True, key="tab", bind="query-params", label_visibility="collapsed")
axis = st.radio("x axis", formatting.X_AXES, key="x", bind="query-params", horizontal=True,
                help="bytes: physical KV cache in MiB; ratio: baseline bytes / physical bytes")
share_box({"ids": chosen, "hide": hidden, "tab": section if section != compare_view.COMPARE_SECTIONS[0] else None,
           "x": axis if axis != formatting.X_AXES[0] else None})

if not chosen:
    st.info("Pick one or more experiments above (or select them on the Experiments page and press Compare).")
    st.stop()
if not trial_keys:
    st.info("The chosen experiments have no results yet.")
    st.stop()

if section == compare_view.COMPARE_SECTIONS[0]:
    curves = {experiment_label(records[i]): [s for s in rows if compare_view.trial_key(i, s.config_name) not in hidden]
              for i, rows in summaries.items()}
    chart(charts.compare_figure(curves, axis), "compare", "kvlab-compare")
elif section == compare_view.COMPARE_SECTIONS[2]:
    if len(chosen) < 2:
        st.info("Pick two or more experiments: the same spec on several engines (say `kvlab run SPEC`, `kvlab run "
                "SPEC --backend embedded`, `--backend llamacpp`). Two are paired config by config and item by item; "
                "any number are set side by side on the items all of them ran.")
        st.stop()
    runs = [(i, records[i].backend_kind, results_of(records[i])[0]) for i in chosen]
    if note := different_items([(i, results) for i, _, results in runs]):
        st.warning(formatting.md(note) + ".", icon=":material/warning:")
    if len(chosen) == 2:
        if rows := engine_agreement(runs[0][2], runs[1][2]):
            a, b = (f"#{i}" for i in chosen)
            st.dataframe(compare_view.engine_rows(rows, a, b), hide_index=True, placeholder="-")
            st.caption("same outcome: items with equal scores; same text: the answer up to the item's stop sequence")
        else:
            st.info("These two experiments share no config (by name) and item (the same prompt and answer) without "
                    "an error to pair.")
    if table := engines_table(runs):
        st.dataframe(compare_view.engines_table_rows(table), hide_index=True, placeholder="-")
        st.caption("every engine's configs on the items all of the chosen experiments ran; KV B/token: measured from "
                   "tensors, or ≈ as a server states its pool; mean KL: each engine's config against that engine's "
                   "own baseline (the embedded engine's exact KL on the greedy output, a server's estimate from a "
                   "sampled continuation: different quantities); `kvlab compare` adds each server's baseline against "
                   "the embedded engine's")
    else:
        st.info("The chosen experiments share no item (the same prompt and answer) without an error.")
    floors = [f"#{i} ({records[i].backend_kind}): {floor.words()}" for i in chosen
              if (floor := noise_floor(*results_of(records[i]))) is not None]
    if floors:  # the KL below which each server cannot tell a config from its own baseline
        st.markdown("\n".join(f"- {formatting.md(line)}" for line in floors))
elif parameters := compare_view.compare_rows(summaries, [k for k in trial_keys if k not in hidden]):
    chart(charts.parallel_figure(parameters), "parallel", "kvlab-parameters")
    st.dataframe([{"experiment": r.experiment_id, "config": r.config_name, "KV bits": r.quant_bits,
                   "evicted (fraction)": round(r.removed_fraction, 3), "ratio (x)": round(r.ratio, 2),
                   "accuracy": round(r.accuracy, 3)} for r in parameters], hide_index=True)
