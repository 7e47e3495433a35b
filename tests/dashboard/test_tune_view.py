"""The tune page through Streamlit's AppTest (the real app.py on a temporary store): what it reads from
a stored tune, its progress in trials and its Cancel, the parameters' importance and slice plot (and
their helpers, kvlab.tune.importance and kvlab.dashboard.tune_charts, on the synthetic tune's real
Optuna study), and links that name no tune say so in one line, with no traceback.  The browser side
(charts drawn, exports, the live refresh) is tests/e2e/test_tune_page.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from kvlab.analysis.summary import decide, summarize
from kvlab.core.experiment_spec import parse_spec
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.margins import Margins
from kvlab.dashboard import charts, page_table, tune_charts
from kvlab.dashboard.tune_launch import record_launch
from kvlab.store.tunes import study_name
from kvlab.tune import importance, progress
from tests.dashboard.test_dashboard import assert_clean, open_page, store, texts  # noqa: F401 -- store: the fixture
from tests.dashboard_data import populate
from tests.tune_data import BASELINE_BYTES, CANDIDATES, MAX_DROP, SPEC, populate_tune

TUNE = page_table.TUNE.script


def test_the_tune_page_reads_the_stored_tune(store):
    populate_tune(store)
    at = open_page(TUNE, id="1")
    assert_clean(at)
    assert at.title[0].value == "Tune: synthetic-tune"
    metrics = {m.label: m.value for m in at.metric}
    # 5 trials: baseline 20 + int8 20 + int4 20 + int2 4 + snapkv 4 = 68 of (11 + 1) x 20 = 240
    assert metrics["Item evaluations used"] == "68" and metrics["Full grid"] == "240"
    assert metrics["Trials done"] == f"{len(CANDIDATES)} of {SPEC['tune']['max_trials']}"
    table = at.table[0].value
    assert list(table["state"]) == ["complete", "complete", "stopped", "stopped"]
    assert "`kvlab serve --model smollm2-135m --quant int4 --group-size 64 --residual-length 64`" in texts(at.markdown)
    assert 'quant = "int4"' in texts(at.text)  # the TOML entry


@pytest.mark.parametrize("params, message", [
    ({"id": "abc"}, "The link's id 'abc' is not an experiment id"),
    ({"id": "1"}, "Experiment #1 (synthetic-sweep) is a sweep of fixed configs, not a tune"),
    ({"id": "99"}, "No experiment 99"),
    ({"id": "2", "show": "nope"}, None),
])
def test_links_that_name_no_tune_say_so(store, params, message):
    populate(store)
    populate_tune(store)
    at = open_page(TUNE, **params)
    assert_clean(at)
    if message:
        assert message.lower() in (texts(at.warning) + texts(at.error)).lower()
    if params.get("show") == "nope":
        assert at.title[0].value == "Tune: synthetic-tune"


def test_no_tunes_yet_says_where_to_start_one(store):
    populate(store)
    at = open_page(TUNE)
    assert_clean(at)
    assert "No tunes yet" in texts(at.info)


def test_a_tune_whose_search_is_not_stored_yet_is_starting(store):
    """``kvlab tune`` stores its experiment, then its search: in between, the page says the tune is
    starting (and follows along), not that something else made it."""
    spec = parse_spec(SPEC)
    experiment_id = store.create_experiment(spec, {}, item_limit=4)
    at = open_page(TUNE, id=str(experiment_id))
    assert_clean(at)
    assert at.title[0].value == "Tune: synthetic-tune"
    assert f"Tune #{experiment_id} is starting" in texts(at.info)
    assert "sweep" not in texts(at.error) and "kvlab run" not in texts(at.error) + texts(at.info)
    store.start_tune(experiment_id, 11, 240, "test-host-1-driver")
    at.run()
    assert_clean(at)
    assert "is starting" not in texts(at.info) and at.metric  # the tune's view


def test_the_tune_page_says_who_launched_it(store, tmp_path):
    tune_id = populate_tune(store)
    at = open_page(TUNE, id=str(tune_id))
    assert "launched by `kvlab tune`" in texts(at.caption)
    record_launch(store, tune_id, tmp_path / "tune.log")
    at = open_page(TUNE, id=str(tune_id))
    assert_clean(at)
    assert "launched from the dashboard" in texts(at.caption) and "kvlab tune`" not in texts(at.caption)


def test_a_tune_shows_when_it_started_and_how_long_it_ran(store):
    """Its first round is queued before any trial is claimed (the experiment is running then): the
    first claim still starts it, so the experiments table has its start and duration."""
    tune_id = populate_tune(store)
    tune = store.get_experiment(tune_id)
    assert tune.started_at is not None and tune.finished_at is not None
    at = open_page()
    assert_clean(at)
    table = at.dataframe[0].value
    row = table[table["id"].astype(str).str.fullmatch(rf"(.*id=)?{tune_id}")].iloc[0]  # an id, or a link to it
    started = next(column for column in table.columns if column.startswith("started"))  # with its zone
    assert row[started] != "-" and row["duration"] != "-"


def _all_text(at) -> str:
    return "\n".join(texts(elements) for elements in (at.markdown, at.caption, at.info, at.success, at.warning,
                                                       at.error, at.metric)) + "\n".join(
        str(t.value) for t in at.table)


def test_the_tune_page_speaks_mib_and_fractions(store):
    populate_tune(store)
    at = open_page(TUNE, id="1")
    assert_clean(at)
    shown = _all_text(at)
    assert "MiB KV per item" in shown and "KV (MiB)" in at.table[0].value.columns
    assert " MB" not in shown and "MB " not in shown and "points" not in shown
    assert f"max_drop {MAX_DROP:g}" in texts(at.caption)  # the margin as a fraction, as in the spec


def _progress_text(at) -> str:
    return next(e.proto.text for e in at.get("progress"))


def test_a_running_tune_says_its_trials_done_of_max_trials_and_its_eta(store):
    tune_id = populate_tune(store, finish=False)
    at = open_page(TUNE, id=str(tune_id))
    assert_clean(at)
    shown = progress.points(store.candidates(tune_id), store.trials(tune_id), MAX_DROP)
    done = sum(1 for p in shown if p.state != "active")
    text = _progress_text(at)
    assert text.startswith(f"{done} of {SPEC['tune']['max_trials']} trials done · 1 active")
    assert "%" not in text and "left (an estimate:" in text and f"its {done} ended" in text


def test_before_any_trial_ends_the_eta_is_not_known_yet(store):
    spec = parse_spec(SPEC)
    experiment_id = store.create_experiment(spec, {}, item_limit=4)
    store.start_tune(experiment_id, 11, 240, "test-host-1-driver")
    at = open_page(TUNE, id=str(experiment_id))
    assert_clean(at)
    assert "time left: not known yet" in _progress_text(at)


def test_cancel_asks_first_then_cancels_the_tune_and_keeps_its_best_so_far(store):
    tune_id = populate_tune(store, finish=False)
    before = store.candidates(tune_id)
    at = open_page(TUNE, id=str(tune_id))
    confirm = at.button(key="tune-cancel-confirm")
    assert store.tune(tune_id).state == "running"  # drawing the popover cancels nothing
    confirm.click().run()
    assert_clean(at)
    assert store.tune(tune_id).state == "cancelled" and store.get_experiment(tune_id).status == "cancelled"
    assert store.candidates(tune_id) == before  # the judged candidates stay
    assert f"Tune #{tune_id} cancelled" in texts(at.success)
    # what finished and what did not; the best complete candidate only as a partial result, never the answer
    assert "No recommendation: the tune was cancelled before its search finished: 3 of 4 trials done, 1 unfinished" \
        in texts(at.warning)  # int8 and int4 complete, int2 stopped; snapkv was waiting for its next round
    assert ("Partial (the tune was cancelled: not its answer): the best of the candidates judged on every item "
            "before it ended: **int4/g64/r64**") in texts(at.info)
    assert "active" not in _progress_text(at) and "1 unfinished" in _progress_text(at)
    assert not [b for b in at.button if b.key == "tune-cancel-confirm"]  # no Cancel once it has ended


def _samples(store, tune_id: int, metric: importance.Metric) -> list[importance.Sample]:
    shown = progress.points(store.candidates(tune_id), store.trials(tune_id), MAX_DROP)
    proposals = importance.read_proposals(store.study_storage_url(), study_name(tune_id))
    return importance.samples(shown, proposals, metric, BASELINE_BYTES)


def test_samples_join_the_studys_parameters_to_the_stores_verdicts(store):
    tune_id = populate_tune(store)
    held = _samples(store, tune_id, importance.METRICS["ratio held"])
    assert [s.label for s in held] == [config.label for config, _, _ in CANDIDATES.values()]
    for sample in held:  # the study's parameters name the candidate's config
        config, fraction, _ = next(c for c in CANDIDATES.values() if c[0].label == sample.label)
        assert KVCacheConfig(**{k: v for k, v in sample.params.items() if k in KVCacheConfig.model_fields}
                             | ({"ratio": sample.params["budget"]} if "budget" in sample.params else {})) == config
        feasible = next(p for p in progress.points(store.candidates(tune_id), store.trials(tune_id), MAX_DROP)
                        if p.label == sample.label).feasible
        assert sample.value == pytest.approx(1 / fraction if feasible else 0.0)
    assert importance.varying(held) == ["quant", "evict"]  # group and residual have one value; budget one method
    assert _samples(store, tune_id, importance.METRICS["KL"]) == []  # the synthetic tune measured no KL


def test_importance_ranks_the_varying_parameters(store):
    tune_id = populate_tune(store)
    metric = importance.METRICS["ratio held"]
    found = _samples(store, tune_id, metric)
    result = importance.importance(found, metric)
    assert result.why_not is None and result.candidates == len(found)
    assert set(result.values) == set(importance.varying(found))
    assert math.isclose(sum(result.values.values()), 1.0) and all(0 <= v <= 1 for v in result.values.values())
    assert importance.importance(found, metric) == result  # PED-ANOVA has no randomness: a refresh redraws the same
    figure = tune_charts.importance_figure(result, metric)
    assert list(figure.data[0].y) == sorted(result.values, key=result.values.get)  # the most important on top
    assert metric.label in figure.layout.title.text


@pytest.mark.parametrize("names, metric, why", [
    (("int8",), "ratio", "needs at least 2 with a compression ratio"),
    (("int8", "int4"), "ratio", "only one parameter varies among the 2 candidates so far (quant)"),
    (tuple(CANDIDATES), "TTFT", "have the same TTFT"),
    (tuple(CANDIDATES), "KL", "0 have one so far"),
])
def test_importance_says_why_it_cannot_rank(store, names, metric, why):
    tune_id = populate_tune(store, names=names)
    result = importance.importance(_samples(store, tune_id, importance.METRICS[metric]), importance.METRICS[metric])
    assert not result.values and why in (result.why_not or "")


def test_the_slice_plot_draws_each_varying_parameter_against_the_metric(store):
    tune_id = populate_tune(store)
    metric = importance.METRICS["accuracy diff"]
    found = _samples(store, tune_id, metric)
    figure = tune_charts.slice_figure(found, metric)
    titles = [figure.layout[axis].title.text for axis in figure.layout if axis.startswith("xaxis")]
    assert sorted(titles) == sorted(importance.varying(found))  # one panel each, in Optuna's order
    first = [trace for trace in figure.data if trace.xaxis in (None, "x")]
    assert sorted(y for trace in first for y in trace.y) == sorted(s.value for s in found)
    hover = " ".join(text for trace in figure.data for text in trace.hovertext)
    assert all(s.label in hover for s in found) and metric.label in figure.layout.title.text


def test_the_tune_page_draws_importance_and_slice_or_says_why_not(store):
    tune_id = populate_tune(store)
    at = open_page(TUNE, id=str(tune_id))
    assert_clean(at)
    assert "Parameters" not in [h.value for h in at.subheader]  # its own section
    at = open_page(TUNE, id=str(tune_id), section="Parameters")
    assert_clean(at)
    assert "Parameters" in [h.value for h in at.subheader]
    assert "Metric: **compression ratio held" in texts(at.caption) and "PED-ANOVA" in texts(at.caption)
    one = populate_tune(store, names=("int8",))
    at = open_page(TUNE, id=str(one), section="Parameters")
    assert_clean(at)
    assert "Parameter importance: not computed: importance compares candidates" in texts(at.info)
    assert "Slice plot: no parameter varies among the 1 candidate" in texts(at.info)
    at = open_page(TUNE, id=str(tune_id), section="Parameters", metric="KL")
    assert_clean(at)
    assert "Slice plot: no candidate has a mean KL" in texts(at.info)


def test_a_tune_without_its_study_says_so(store):
    tune_id = populate_tune(store)
    Path(make_url(store.study_storage_url()).database).unlink()
    at = open_page(TUNE, id=str(tune_id), section="Parameters")
    assert_clean(at)
    assert "cannot be read: no Optuna study file beside the store" in texts(at.info)
    assert not Path(make_url(store.study_storage_url()).database).exists()  # reading created nothing


def test_the_star_marks_the_chosen_config_on_every_chart_and_never_the_baseline(store):
    """Issue 47 row 7: "on the tune chart the star marks the baseline, elsewhere the sweet spot".  One
    vocabulary (kvlab.dashboard.charts.MARKERS): the star is the chosen config, the diamond the baseline."""
    tune_id = populate_tune(store)
    shown, _ = progress.of_tune(store.get_experiment(tune_id), store.tune(tune_id), store.candidates(tune_id),
                                store.trials(tune_id))
    label = store.tune(tune_id).recommendation["label"]
    tune_fig = tune_charts.front_figure(shown, progress.pareto_front(shown), (BASELINE_BYTES, 1.0), label)
    running_fig = tune_charts.front_figure(shown, [], (BASELINE_BYTES, 1.0), label, final=False)
    results = store.item_results(tune_id)
    summaries = summarize(results, "baseline", Margins(max_drop=MAX_DROP))
    sweep_fig = charts.tradeoff_figure(summaries, decision=decide(summaries, "baseline"))

    def symbols(fig) -> dict[str, str]:
        return {trace.name: trace.marker.symbol for trace in fig.data if trace.marker.symbol is not None}

    assert [n for n, s in symbols(tune_fig).items() if s == "star"] == [f"recommended: {label}"]
    assert [n for n, s in symbols(running_fig).items() if s == "star"] == [f"best so far: {label}"]
    assert [n for n, s in symbols(sweep_fig).items() if s == "star"] == ["sweet spot"]
    assert symbols(tune_fig)["baseline (16-bit)"] == charts.MARKERS["baseline"]["symbol"] != "star"
    assert {tune_charts.STYLES[state]["marker"]["symbol"] for state in tune_charts.STYLES}.isdisjoint(
        {charts.MARKERS[m]["symbol"] for m in ("chosen", "baseline", "front")})  # no state reads as another meaning
