"""The dashboard's pure helpers: URL state, tables, the spec form, the duration estimate."""

from __future__ import annotations

import ast
import re
from dataclasses import fields, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest

from kvlab.analysis.decision import items_needed
from kvlab.analysis.summary import decide, summarize
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import parse_spec
from kvlab.core.margin_inputs import MARGIN_FORMAT, MARGIN_INPUTS
from kvlab.core.margins import DEFAULT_MAX_DROP, DEFAULT_MAX_KL, Margins
from kvlab.core.tasks import VariableTrackingParams
from kvlab.core.units import MIB
from kvlab.dashboard import (
    compare_view,
    estimate,
    experiment_status,
    experiment_view,
    experiments_list,
    formatting,
    spec_form,
)
from kvlab.dashboard.spec_form import (
    assign_errors,
    build_spec,
    default_form,
    empty_task_values,
    form_from_spec,
    list_examples,
    parse_numbers,
)
from kvlab.experiments import eta
from kvlab.spec_files import load_spec, parse_spec_toml
from kvlab.store import ExperimentRecord
from kvlab.tune.progress import Budgets
from tests.dashboard_data import PROFILE, item_result

ROOT = Path(__file__).resolve().parents[2]


def test_no_streamlit_in_kvlab():
    offenders = [p.name for p in (ROOT / "kvlab").rglob("*.py") if re.search(r"^\s*(import|from) streamlit",
                                                                           p.read_text(), re.MULTILINE)]
    assert offenders == []


def test_url_state():
    assert formatting.parse_int("12") == 12 and formatting.parse_int("x") is None and formatting.parse_int("-3") is None
    assert formatting.parse_int(None) is None
    assert compare_view.parse_ids(["3", "1,2", "3", "junk", "0"]) == [3, 1, 2]
    assert formatting.share_url("http://127.0.0.1:8501/experiment", {"id": 3, "hide": ["int2", "a b"], "x": None,
                                                                 "tab": ""}) == \
        "http://127.0.0.1:8501/experiment?id=3&hide=int2&hide=a+b"
    assert formatting.share_url(None, {"ids": [1, 2]}) == "?ids=1&ids=2"
    assert formatting.share_url("http://h/new", {}) == "http://h/new"
    assert compare_view.trial_key(3, "int4") == "3/int4"


def test_every_piece_of_the_experiment_view_is_in_its_link():
    """Each field of the page's state, away from its default, is a query parameter of the share link
    under its own name (the widget's key), and back at its default leaves the link."""
    changed = {"tab": "Needles", "x": "ratio", "y": "KL", "hide": ("int2", "a b"), "margin": 20.0,
               "needle": "snapkv-50", "layout": "int4", "item": "passkey-256-0", "cap_model": "gemma-3-27b",
               "gpu": "l4", "context": 4096, "clients": 3}
    # a new field: test it
    assert set(changed) == {f.name for f in fields(experiment_view.ExperimentViewState)} - {"id"}
    for name, value in changed.items():
        state = experiment_view.ExperimentViewState(7, **{name: value})
        link = formatting.share_url("http://h/experiment", state.params())
        expected = [(name, str(v)) for v in value] if isinstance(value, tuple) else [(name, "20" if name == "margin"
                                                                                      else str(value))]
        assert parse_qsl(urlsplit(link).query) == [("id", "7"), *expected], name
    assert formatting.share_url("http://h/experiment", experiment_view.ExperimentViewState(7).params()) == \
        "http://h/experiment?id=7"
    assert experiment_view.ExperimentViewState(7, margin=12.5).params()["margin"] == "12.5"
    assert set(formatting.Y_METRICS) == {"accuracy", "KL", "agreement"}
    assert next(iter(formatting.Y_METRICS)) == "accuracy"


def test_store_text_is_literal_in_markdown():
    name = "[click](http://evil.example) ![x](http://evil.example/t.png) :red[big] *b* `code`"
    escaped = formatting.md(name)
    assert not re.findall(r"(?<!\\)[\[\]()`*:!]", escaped)  # every markup character escaped
    assert re.sub(r"\\(.)", r"\1", escaped) == name  # and shown as it is
    assert formatting.code_span("plain") == "`plain`"
    assert formatting.code_span("a`b") == "``a`b``" and formatting.code_span("`x``") == "``` `x`` ```"


def test_the_best_ratio_help_states_the_decision_rule():
    """The decision's own words (Margins.rule) at the default margins, fidelity included, not the old
    accuracy-only rule."""
    help_text = experiments_list.BEST_RATIO_HELP
    assert help_text.startswith(f"The {Margins().rule('its')}.")
    assert "fidelity to the baseline certified" in help_text and "on every task" in help_text
    assert "Holm" in help_text and "max_kl and min_agreement" in help_text
    assert "overlap" not in help_text and "10 points" not in help_text


def test_the_margins_label_says_each_margin_and_which_are_off():
    assert formatting.margins_label({}) == "max_drop 0.05, max_kl 0.05, min_agreement off"  # an older spec: defaults
    assert formatting.margins_label({"max_drop": 0.1, "max_kl": 0.0, "min_agreement": 0.9}) == \
        "max_drop 0.1, max_kl off, min_agreement 0.9"


def test_durations_count_from_the_queue():
    assert [formatting.fmt_duration(s) for s in (None, 42, 185, 7620)] == ["-", "42 s", "3 min 05 s", "2 h 07 min"]
    created = datetime(2026, 1, 1, tzinfo=UTC)
    record = _record(created_at=created.replace(tzinfo=None), started_at=(created + timedelta(seconds=30))
                     .replace(tzinfo=None), finished_at=None)  # SQLite: naive UTC
    # the 30 s queued too
    assert experiment_status.experiment_duration(record, now=created + timedelta(seconds=90)) == 90
    line = eta.timeline(record, [], created + timedelta(seconds=90))
    assert experiment_view.timeline_text(line) == "1 min 30 s since it was queued: queued 30 s, evaluating 1 min 00 s"


def test_one_unit_for_memory_and_for_the_margin():
    """Memory in MiB and the accuracy margin as a fraction (as accuracy is) wherever the pages write them."""
    assert formatting.fmt_mib(3 * MIB) == "3.000 MiB" and formatting.fmt_mib(None) == "-"
    margin = MARGIN_INPUTS["max_drop"]
    assert formatting.fmt_margin(0.05) == "0.05" and MARGIN_FORMAT % DEFAULT_MAX_DROP == "0.050"
    assert margin.form_low <= DEFAULT_MAX_DROP <= margin.form_high < 1  # a fraction, never points
    assert "0-1" in margin.label and "points" not in margin.label
    summaries = summarize(_fidelity_results(), "baseline", Margins(max_drop=0.5))
    text = experiment_view.decision_text(decide(summaries))
    assert " MiB)" in text and " MB" not in text
    assert all(column.endswith("(MiB)") for column in experiment_view.summary_rows(summaries)[0] if "KV" in column)


def test_the_pages_write_no_other_unit():
    """No text of the experiment pages, the list, the forms' margin or their charts speaks of MB or of accuracy
    points (memory is MiB, the margin a fraction); "zero points" are a quantizer's, not a unit."""
    sources = [ROOT / "pages" / f"{name}.py" for name in ("list_experiments", "view_experiment", "new_experiment",
                                                          "compare_experiments", "common")]
    sources += [ROOT / "kvlab" / "dashboard" / f"{name}.py" for name in (
        "formatting", "experiment_status", "experiment_view", "experiments_list", "compare_view", "charts")]
    other = re.compile(r"\bMB\b|\d\s*points\b|accuracy points|-point margin|\bpp\b")
    for source in sources:
        tree = ast.parse(source.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)  # the code's own notes, not the pages'
                      if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef) and node.body
                      and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
        texts = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
                 and isinstance(node.value, str) and id(node) not in docstrings]
        assert not [text for text in texts if other.search(text)], source


def test_times_are_in_the_viewers_zone_and_say_which():
    moment = datetime(2026, 1, 1, 23, 30)  # naive: the store's UTC
    assert formatting.viewer_zone(None)[1] == "UTC" and formatting.viewer_zone("Not/AZone")[1] == "UTC"
    tokyo = formatting.viewer_zone("Asia/Tokyo")
    assert formatting.fmt_time(moment, tokyo[0]) == "2026-01-02 08:30"
    assert formatting.fmt_time(moment) == "2026-01-01 23:30"
    rows = experiments_list.experiment_rows([_record(started_at=moment)], {}, tokyo)
    assert rows[0][experiments_list.started_column("Asia/Tokyo")] == "2026-01-02 08:30"


def _record(**changes) -> ExperimentRecord:
    fields = {"id": 1, "name": "e", "tags": ["a", "b"], "notes": "", "spec": {}, "seed": 0, "model": "m",
              "backend_kind": "embedded", "versions": {}, "git_commit": None, "hardware": {}, "status": "running",
              "error": None, "created_at": datetime(2026, 1, 1), "started_at": None, "finished_at": None,
              "trials_total": 4, "trials_done": 1, "items_total": 40, "items_done": 10}
    return ExperimentRecord(**fields | changes)


def test_experiment_rows_link_their_page_and_show_the_sweet_spots_figures():
    decision = decide(summarize(_fidelity_results(), "baseline", Margins(max_drop=0.5)))
    spot = decision.sweet_spot
    tune = {"tune": {"max_trials": 20}}
    records = [_record(notes="int4 holds\nsecond line"), _record(id=2, items_total=0, items_done=0, trials_done=2),
               _record(id=3, spec=tune, trials_total=6, items_total=50, items_done=48),
               _record(id=4, spec={"tune": {"max_minutes": 30}}, trials_total=3)]
    rows = experiments_list.experiment_rows(records, {1: decision}, now=datetime(2026, 1, 1, 0, 1, 30))
    assert [r["id"] for r in rows] == ["experiment?id=1", "experiment?id=2", "tune?id=3", "tune?id=4"]
    assert [r["kind"] for r in rows] == ["sweep", "sweep", "tune", "tune"]
    assert rows[0]["progress"] == 0.25 and rows[0]["trials"] == "1/4" and rows[1]["progress"] == 0.5
    assert rows[0]["sweet spot"] == spot.config_name and rows[0]["best ratio held (x)"] == round(
        spot.compression_ratio, 2) and rows[0]["its mean KL (nats)"] == pytest.approx(spot.mean_kl, rel=1e-2)
    assert rows[1]["sweet spot"] == "-" and rows[1]["best ratio held (x)"] is None
    assert rows[0]["tags"] == "a, b" and rows[0]["duration"] == "1 min 30 s" and rows[0]["notes"] == "int4 holds…"
    # a tune: its trials of the most it runs, not its items' 96%: done as the tune page counts them where its
    # budgets are read, else the candidates proposed (every trial but the baseline's) of its max_trials
    assert rows[2]["trials"] == "5 of 20 trials proposed" and rows[2]["progress"] == 0.25
    assert rows[3]["trials"] == "2 trials proposed (no max_trials)" and rows[3]["progress"] is None  # a time budget
    budgets = Budgets(done=3, active=1, most=4, max_trials=20, elapsed_s=60, max_minutes=None, item_evals=80,
                      max_item_evals=None)
    counted = experiments_list.experiment_rows(records[2:3], {}, tunes={3: budgets})[0]
    assert counted["trials"] == "3 of 4 trials done" and counted["progress"] == 0.75 == budgets.fraction
    timed = replace(budgets, most=None, max_trials=None, max_minutes=4.0)  # a time budget: the tune page's bar
    assert experiments_list.experiment_rows(records[2:3], {}, tunes={3: timed})[0]["progress"] == timed.fraction == 0.25
    assert experiment_status.progress(replace(records[2], status="done")) == 1.0


def test_a_verdict_on_fewer_items_than_its_margin_needs_says_so():
    """Two items (as the tiny example) make a sweet spot by fidelity; the accuracy margin needs far more."""
    two = [r for r in _fidelity_results() if r.item_id in ("passkey-256-0", "passkey-256-1")]
    decision = decide(summarize(two, "baseline", Margins(max_drop=0.05)))
    assert decision.sweet_spot is not None and decision.rests_on == 2 and decision.few_items
    assert decision.items_needed == items_needed(1.0, 0.05, 3)  # the baseline right on both, 3 configs compared
    assert decision.few_items_note().startswith(f"rests on 2 items; the margin of 0.05 needs about "
                                                f"{decision.items_needed} ")
    assert decision.to_dict()["few_items"] is True
    many = decide(summarize(_fidelity_results(), "baseline", Margins(max_drop=0.5)))
    assert many.sweet_spot is not None and not many.few_items and many.few_items_note() == ""


def test_the_eta_says_it_is_an_estimate_and_its_basis():
    assert experiment_view.eta_text(None).startswith("no estimate")
    left = eta.Eta(12, eta.Pace(5.0, "this run's own pace"))
    assert experiment_view.eta_text(left) == \
        "about 1 min 00 s left for 12 evaluations (an estimate from this run's own pace)"


def test_summary_and_failed_rows():
    results = [item_result(c, i, 256, 0.5) for c in PROFILE for i in range(4)]
    summaries = summarize(results)
    rows = experiment_view.summary_rows(summaries, sweet_name="int4")
    assert [r["config"] for r in rows] == ["baseline", "int4  ★ sweet spot", "int2", "snapkv-50"]
    assert rows[1]["ratio (x)"] == "3.70" and rows[0]["TTFT (ms)"] == "100"
    assert rows[0]["p vs baseline (pooled)"] == "-"
    # no fidelity measured (a backend that does not): "-" in its columns, and accuracy judged each task
    fidelity_columns = ("mean KL (nats, 95% CI)", "p99 KL (nats)", "top-1 agreement (95% CI)")
    assert {row[c] for row in rows for c in fidelity_columns} == {"-"}
    assert [r["decided by"] for r in rows] == ["-", "passkey: accuracy", "passkey: accuracy", "passkey: accuracy"]
    assert experiment_view.fidelity_items(results) == []
    assert experiment_view.item_rows(results, "passkey-256-0")[1]["mean KL (nats)"] == "-"
    failed = experiment_view.failed_rows(results)
    assert {(r["config"], r["generated"]) for r in failed} == {("int2", " 99999."), ("snapkv-50", " 99999.")}
    assert len(failed) == 3


def _fidelity_results():
    return [item_result(c, i, n, d, fidelity=True) for c in PROFILE
            for i, (n, d) in enumerate((n, d) for n in (256, 512) for d in (0.1, 0.9) for _ in range(2))]


def test_summary_rows_with_fidelity_say_the_decision_and_what_decided_it():
    summaries = summarize(_fidelity_results(), "baseline", Margins(max_drop=0.5))
    by_name = {s.config_name: s for s in summaries}
    rows = {r["config"]: r for r in experiment_view.summary_rows(summaries)}
    assert rows["baseline"]["mean KL (nats, 95% CI)"] == "-" and rows["baseline"]["decided by"] == "-"
    int4, int2 = by_name["int4"], by_name["int2"]
    assert rows["int4"]["mean KL (nats, 95% CI)"] == f"{int4.mean_kl:.3g} [{int4.kl_ci_low:.3g}, {int4.kl_ci_high:.3g}]"
    assert rows["int4"]["p99 KL (nats)"] == f"{int4.p99_kl:.3g}"
    assert rows["int2"]["top-1 agreement (95% CI)"].startswith(f"{int2.agreement:.1%} [")
    # the decision (per task) and the pooled summary are two columns: they can disagree
    assert [rows[c]["acceptable (every task)"] for c in ("int4", "int2", "snapkv-50")] == ["yes", "no", "no"]
    assert rows["int2"]["stopped by (task)"] == "passkey" and rows["int4"]["stopped by (task)"] == "-"
    assert rows["int2"]["decided by"] == "passkey: fidelity"
    assert rows["int4"]["non-inferior (pooled)"] == ("yes" if int4.pooled_non_inferior else "no")
    verdicts = experiment_view.verdict_rows(summaries)
    assert [(v["config"], v["task"], v["accepted"], v["criterion"]) for v in verdicts] == [
        ("int4", "passkey", "yes", "fidelity"), ("int2", "passkey", "no", "fidelity"),
        ("snapkv-50", "passkey", "no", "fidelity")]
    assert verdicts[1]["reason"] == int2.task_verdicts[0].reason and "not certified" in verdicts[1]["reason"]


def test_the_decision_text_says_the_criterion_and_the_rule_and_escapes_names():
    results = [replace(r, config_name="*int4*") if r.config_name == "int4" else r for r in _fidelity_results()]
    decision = decide(summarize(results, "baseline", Margins(max_drop=0.5)))
    head, rule = experiment_view.decision_text(decision).split("\n\n")
    assert head.startswith(r"Sweet spot: **\*int4\*** at 3.70x") and r"decided by passkey\: fidelity" in head
    assert rule == f"Rule: the {formatting.md(decision.rule)}."
    assert "fidelity to the baseline certified" in decision.rule
    none = decide(summarize(results, "baseline", Margins(max_drop=0.5, max_kl=0.001)))
    assert experiment_view.decision_text(none).startswith(f"No sweet spot: {formatting.md(none.note)}.\n\nRule: ")


def test_item_rows_show_one_items_fidelity_under_every_config():
    results = _fidelity_results()
    items = experiment_view.fidelity_items(results)
    assert items == list(dict.fromkeys(r.item_id for r in results))  # every item: every config but the baseline
    rows = {r["config"]: r for r in experiment_view.item_rows(results, items[0])}
    int2 = next(r.fidelity for r in results if r.item_id == items[0] and r.config_name == "int2")
    assert rows["baseline"]["mean KL (nats)"] == "-"
    assert rows["int2"]["first divergence (token)"] == str(int2.first_divergence)
    assert rows["int2"]["tokens compared"] == str(int2.tokens) and rows["int4"]["first divergence (token)"] == "none"


def test_the_form_round_trips_the_fidelity_margins_zero_included():
    spec = parse_spec({"name": "m", "tasks": [{"name": "passkey"}], "configs": [{"quant": "int4"}], "max_kl": 0.0,
                       "min_agreement": 0.9})
    form = form_from_spec(spec)
    assert (form.values["max_kl"], form.values["min_agreement"]) == (0.0, 0.9)
    result = build_spec(form.values, form.n_tasks, form.configs, form.base)
    assert result.errors == {} and (result.spec.max_kl, result.spec.min_agreement) == (0.0, 0.9)
    assert result.spec == spec and form_from_spec(result.spec).values == form.values
    defaults = default_form().values  # a spec that sets neither: the spec's defaults
    assert (defaults["max_kl"], defaults["min_agreement"]) == (DEFAULT_MAX_KL, 0.0)
    changed = build_spec(defaults | {"max_kl": 0.2, "min_agreement": 0.0}, 1, default_form().configs).spec
    assert changed.margins == Margins(DEFAULT_MAX_DROP, 0.2, 0.0)


def test_form_round_trips_every_example():
    for name, path in list_examples().items():
        spec, _ = load_spec(path)
        form = form_from_spec(spec)
        result = build_spec(form.values, form.n_tasks, form.configs, form.base)
        assert result.errors == {} and result.spec == spec, name
    assert next(iter(list_examples())) == "tiny"


def test_default_form_is_valid():
    form = default_form()
    result = build_spec(form.values, form.n_tasks, form.configs, form.base)
    assert [c.label for c in result.spec.all_configs()] == ["baseline", "int4", "streaming-50"]


def test_form_backend_fields_become_the_backend_table():
    form = default_form()
    fp8 = [{"name": "fp8", "quant": "fp8_e4m3"}]
    values = form.values | {"backend.kind": "sglang", "backend.model_id": "qwen", "backend.server.python": "/opt/py",
                            "backend.server.memory_fraction": 0.4, "backend.server.max_model_len": 0,
                            "backend.server.prefix_cache": False}
    backend = build_spec(values, 1, fp8).spec.backend
    assert (backend.kind, backend.model_id, backend.server.python) == ("sglang", "qwen", "/opt/py")
    assert backend.server.memory_fraction == 0.4 and backend.server.max_model_len is None
    assert backend.server.prefix_cache is False and backend.base_url is None
    values |= {"backend.kind": "openai_compat", "backend.base_url": " http://127.0.0.1:8000/v1 "}
    backend = build_spec(values, 1, fp8).spec.backend
    assert backend.base_url == "http://127.0.0.1:8000/v1" and backend.model_id == "qwen"
    values["backend.kind"] = "embedded"  # endpoint fields are dropped, not refused
    assert build_spec(values, 1, fp8).spec.backend.base_url is None
    form_again = form_from_spec(build_spec(values | {"backend.kind": "sglang"}, 1, fp8).spec)
    assert form_again.values["backend.server.memory_fraction"] == 0.4


def test_form_vllm_pool_and_interpreter_default_to_kvlabs_install():
    """A blank interpreter is kvlab's own vLLM install (scripts/install_vllm.sh), not `python`; the KV pool
    in GiB becomes --kv-cache-memory-bytes and survives the way back into the form."""
    fp8 = [{"name": "fp8", "quant": "fp8_e4m3"}]
    values = default_form().values | {"backend.kind": "vllm", "backend.server.python": " ",
                                      "backend.server.kv_cache_gib": 2.0}
    spec = build_spec(values, 1, fp8).spec
    assert spec.backend.server.python is None and spec.backend.server.kv_cache_gib == 2.0
    again = form_from_spec(spec).values
    assert again["backend.server.python"] == "" and again["backend.server.kv_cache_gib"] == 2.0
    both = build_spec(values | {"backend.server.memory_fraction": 0.5}, 1, fp8)
    assert both.spec is None and any("memory_fraction or kv_cache_gib, not both" in message
                                     for messages in both.errors.values() for message in messages)


def test_form_errors_land_on_their_fields():
    form = default_form()
    values = form.values | {"tasks.0.context_lengths": "64, abc"}
    assert build_spec(values, 1, form.configs).errors == {
        "tasks.0.context_lengths": ["'abc' is not a whole number; separate values with commas"]}
    values = form.values | {"tasks.0.context_lengths": "64", "sweep.on": True, "sweep.ratios": "0.5, 1.5",
                            "sweep.evict": []}
    errors = build_spec(values, 1, form.configs).errors
    assert errors == {"sweep.evict": ["pick at least one"]}
    values["sweep.evict"] = ["snapkv"]
    configs = [*form.configs, {"name": "bad", "evict": "snapkv"}, {"name": None, "quant": None}]
    errors = build_spec(values, 1, configs).errors
    assert "128..131072" in errors["tasks.0.context_lengths"][0]
    assert "exactly one budget" in errors["configs.2"][0]
    assert errors["sweep.ratios.1"] == ["Input should be less than 1"]
    placed, rest = assign_errors(errors | {"spec": ["duplicate config names"], "seed": ["bad"]},
                                 ["tasks.0.context_lengths", "configs", "sweep.ratios", "tasks.0"])
    assert placed["sweep.ratios"] == ["value 2: Input should be less than 1"]  # "0.5, 1.5": its second value
    assert placed["configs"][0].startswith("row 3: evict = 'snapkv'")  # rows from 1, as the table shows them
    assert rest == ["duplicate config names", "seed: bad"]


def test_a_configs_table_error_names_its_row_and_column():
    """The table's rows from 1, empty rows counted (they are not configs, but the user sees them), and
    the column by its label: not ``1: Input should be less than 1``."""
    form = default_form()
    empty = {"name": None, "quant": None, "evict": None}
    rows = [empty, *form.configs[:1], {"name": "too-far", "evict": "snapkv", "ratio": 1.5}]
    placed, rest = assign_errors(build_spec(form.values, 1, rows).errors, ["configs"])
    assert placed == {"configs": ["row 3: ratio (removed): Input should be less than 1"]} and rest == []


def test_the_tune_form_says_its_own_labels_and_refuses_negative_limits():
    form = default_form()
    tune = form.values | {"mode": "Tune"}
    unbounded = tune | {"tune.max_trials": 0, "tune.max_minutes": 0.0, "tune.max_item_evals": 0}
    message = " ".join(build_spec(unbounded, 1, []).errors["tune"])
    assert "Max candidates, Max minutes or Max item evaluations" in message
    assert not re.search(r"max_trials|max_minutes|max_item_evals", message)
    for key, value in (("max_trials", -3), ("max_item_evals", -50), ("max_minutes", -1.5), ("max_ttft_ms", -1.0)):
        result = build_spec(tune | {f"tune.{key}": value}, 1, [])
        assert result.spec is None, key
        assert result.errors[f"tune.{key}"][0].startswith(f"{spec_form.TUNE_LABELS[key]} is {value:g}: give"), key
    assert build_spec(tune | {"tune.max_trials": 3}, 1, []).spec.tune.max_trials == 3


def test_form_keeps_fields_it_has_no_widget_for():
    spec, _ = parse_spec_toml('name = "x"\n[[tasks]]\nname = "variable_tracking"\nnum_hops = 7\n'
                             '[[configs]]\nquant = "int4"\nkey_axis = "token"\n')
    form = form_from_spec(spec)
    assert (form.values["tasks.0.num_hops"], form.values["tasks.0.num_chains"]) == (7, 4)  # its own widgets
    assert "tasks.0.depths" not in form.values  # another task's parameter
    form.values["tasks.0.num_items"] = 3
    rebuilt = build_spec(form.values, form.n_tasks, form.configs, form.base).spec
    assert rebuilt.tasks[0].params_as(VariableTrackingParams).num_hops == 7 and rebuilt.tasks[0].num_items == 3
    assert rebuilt.configs[0].key_axis == "token"
    assert empty_task_values(2)["tasks.2.name"] == "passkey"


def test_numbers_and_toml():
    assert parse_numbers("1024, 2048;4096", int) == [1024, 2048, 4096]
    with pytest.raises(ValueError, match="at least one"):
        parse_numbers(" , ")
    with pytest.raises(ConfigError, match="not valid TOML"):
        parse_spec_toml("name = ")
    spec, warnings = parse_spec_toml((ROOT / "examples" / "seed_blog.toml").read_text())
    assert spec.all_configs() and isinstance(warnings, list)


def test_estimate():
    tiny, _ = load_spec(ROOT / "examples" / "tiny.toml")
    quick, _ = load_spec(ROOT / "examples" / "quick.toml")
    assert estimate.items_per_config(tiny) == 2 and estimate.items_per_config(quick) == 20
    assert estimate.DEFAULT_RATES.prefill_s(1024) == pytest.approx(1.2)
    assert estimate.DEFAULT_RATES.prefill_s(2048) == pytest.approx(2.6)
    # quick: 11 configs in 3 claims; 10 items at 1K and 10 at 2K
    expected = 20 + 10 * (1.2 * 3 + 1.2 * 11) + 10 * (2.6 * 3 + 1.2 * 11)
    assert estimate.estimate_seconds(quick) == pytest.approx(expected)
    # tiny: 3 configs, 2 items at 256 tokens; `kvlab run examples/tiny.toml` measured 27.7 s on 2 idle cores
    assert estimate.estimate_seconds(tiny) == pytest.approx(27.7, rel=0.1)
    results = [item_result(c, i, 1024 + 20, 0.5) for c in PROFILE for i in range(4)]
    rates = estimate.rates_from_results(results, "past")
    assert rates.source == "past" and rates.per_config_item == pytest.approx(0.155)
    assert rates.prefill_s(1024) == pytest.approx(0.09 * 1044 / 256)  # what those items measured at 1024 tokens
    assert estimate.rates_from_results([], "none") is None


def test_a_missing_accuracy_says_its_item_errors():
    """Issue 47 row 15: the run's table showed "-" for accuracy without saying why (the errors were only in an
    export)."""
    results = [item_result(config, i, 256, 0.1) for config in ("baseline", "int4") for i in range(4)]
    error = "engine: Requested tokens (256) exceed context window of 128\n  (the server's words)"
    results = [replace(r, score=None, error=error) if r.config_name == "int4" else r for r in results]
    summaries = summarize(results, "baseline", Margins())
    errors = experiment_view.first_errors(results)
    rows = {r["config"]: r for r in experiment_view.summary_rows(summaries, None, errors)}
    assert rows["baseline"]["accuracy (pooled)"] == "1.000"
    assert rows["int4"]["accuracy (pooled)"] == ("- (4 item errors: engine: Requested tokens (256) exceed context "
                                                 "window of 128 (the server's words))")
    pooled = {r["config"]: r["accuracy (pooled)"] for r in experiment_view.summary_rows(summaries)}
    assert pooled["int4"] == "- (4 item errors)"
    long = experiment_view.first_errors([replace(results[-1], error="x" * 500)])["int4"]
    assert len(long) == experiment_view.ERROR_SHOWN + 1 and long.endswith("…")


def test_the_address_bar_and_the_share_link_carry_the_same_values():
    params = experiment_view.ExperimentViewState(3, tab="Latency", y="KL", hide=("a b", "int2"), margin=0.2).params()
    assert formatting.query_values(params) == {"id": ["3"], "tab": ["Latency"], "y": ["KL"], "hide": ["a b", "int2"],
                                          "margin": ["0.2"]}
    assert formatting.share_url("http://h/experiment", params) == \
        "http://h/experiment?id=3&tab=Latency&y=KL&hide=a+b&hide=int2&margin=0.2"
