"""Every dashboard page through Streamlit's AppTest, on a temporary SQLite store filled through the
Store API.  AppTest never fires ``run_every`` and shows plotly charts as UnknownElement, so the
live panel and the browser side are covered by tests/e2e/test_browser.py."""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import fields, replace
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from streamlit.testing.v1 import AppTest

from kvlab.core.experiment_spec import parse_spec
from kvlab.dashboard import experiment_view, page_table
from kvlab.store import Store
from tests.dashboard_data import item_result, populate
from tests.waiting import SAFETY_S

APP = str(Path(__file__).resolve().parents[2] / "app.py")
LIST, NEW, VIEW, COMPARE = (page_table.EXPERIMENTS.script, page_table.NEW.script, page_table.EXPERIMENT.script,
                            page_table.COMPARE.script)


@pytest.fixture
def store(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'kvlab.sqlite'}"
    monkeypatch.setenv("KVLAB_DATABASE_URL", url)
    with Store(url) as opened:
        yield opened


@pytest.fixture
def filled(store):
    """Experiment 1 done, experiment 2 running with half its items."""
    return store, populate(store), populate(store, "running-one", finish=False)


@pytest.fixture
def workers(monkeypatch):
    """Record worker starts instead of starting processes."""
    calls = []
    monkeypatch.setattr("kvlab.experiments.launcher.start_local_workers", lambda *args, **kwargs: calls.append(args))
    return calls


def open_page(page: str | None = None, **params: str | list[str]) -> AppTest:
    """The app on ``page`` with these query params, as a link opens it.  The first run goes through
    app.py on the default page, as a browser's first request does, so that st.navigation knows the
    pages before the switch; widgets bound to the URL take their values on their first run."""
    at = AppTest.from_file(APP, default_timeout=SAFETY_S)
    for key, value in params.items():
        at.query_params[key] = value
    at.run()
    if page is not None and page != LIST:
        at.switch_page(page).run()
    return at


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


def assert_clean(at: AppTest) -> None:
    """No traceback, and no unexpected-error message from app.py's guard."""
    assert not at.exception, texts(at.exception)
    assert "Something went wrong" not in texts(at.error)


def share_link(at: AppTest) -> str:
    """The share box's link (pages.common.share_box: inline code; AppTest has no URL, so it starts at ``?``)."""
    return next(m.value.strip("`") for m in at.markdown if m.value.startswith("`?"))


def plotly_charts(at: AppTest) -> int:
    """Charts drawn by st.plotly_chart or by kvlab's plotly component (pages/plotly_view.py)."""
    return len(at.get("plotly_chart")) + len(at.get("bidi_component"))


@pytest.mark.parametrize("page", [LIST, NEW, VIEW, COMPARE])
def test_empty_store_says_what_to_do(store, page):
    at = open_page(page)
    assert_clean(at)
    if page != NEW:
        assert "New experiment" in texts(at.info) or at.get("page_link"), texts(at.info)
        assert any(word in texts(at.info) for word in ("No experiments yet", "Nothing to compare"))


def test_unreachable_database_is_a_message(monkeypatch):
    monkeypatch.setenv("KVLAB_DATABASE_URL", "postgresql://kvlab:hunter2@127.0.0.1:1/none")
    at = open_page()
    assert not at.exception
    assert "cannot be opened" in texts(at.error) and "hunter2" not in texts(at.error)


def test_experiments_table_filters_and_best_ratio(filled):
    _, done_id, running_id = filled
    at = open_page()
    assert_clean(at)
    table = at.dataframe[0].value
    assert list(table["id"]) == [f"experiment?id={running_id}", f"experiment?id={done_id}"]  # links to their pages
    # the running one has 4 items per config: too few to show any config non-inferior, even at 0.5
    assert list(table["sweet spot"]) == ["-", "int4"] and list(table["best ratio held (x)"])[1] == 3.7
    assert list(table["status"]) == ["running", "done"] and list(table["progress"]) == [0.5, 1.0]
    assert list(table["kind"]) == ["sweep", "sweep"]
    assert set(table.columns) >= {"started (UTC)", "duration", "tags", "trials", "notes"}  # no browser: UTC

    at = open_page(LIST, status="done")
    assert list(at.dataframe[0].value["id"]) == [f"experiment?id={done_id}"]
    assert at.selectbox(key="status").value == "done"
    at = open_page(LIST, q="running", sort="oldest")
    assert list(at.dataframe[0].value["id"]) == [f"experiment?id={running_id}"]
    at = open_page(LIST, tag="nope")
    assert "No experiment matches" in texts(at.info) and not at.dataframe


def test_experiments_actions_ask_first(filled, workers):
    store, done_id, running_id = filled
    at = open_page()
    at.multiselect(key="selected").set_value([running_id]).run()
    at.button(key="ask-cancel").click().run()
    assert "Cancel experiment(s) #2?" in texts(at.warning)
    assert store.get_experiment(running_id).status == "running"  # nothing happens before the confirmation
    at.button(key="confirm-action").click().run()
    assert_clean(at)
    assert store.get_experiment(running_id).status == "cancelled"
    assert f"Experiment {running_id}: 4 trial(s) cancelled." in texts(at.success)

    at.multiselect(key="selected").set_value([done_id]).run()
    at.button(key="ask-cancel").click().run()
    at.button(key="confirm-action").click().run()
    assert "already done; nothing to cancel" in texts(at.error)

    at.multiselect(key="selected").set_value([done_id]).run()
    at.button(key="ask-rerun").click().run()
    at.button(key="confirm-action").click().run()
    assert store.get_experiment(3).status == "queued" and len(workers) == 1

    at.multiselect(key="selected").set_value([done_id]).run()
    at.button(key="ask-delete").click().run()
    at.button(key="dismiss-action").click().run()
    assert store.get_experiment(done_id).status == "done"
    at.multiselect(key="selected").set_value([done_id]).run()
    at.button(key="ask-delete").click().run()
    assert "cannot be undone" in texts(at.warning)
    at.button(key="confirm-action").click().run()
    assert_clean(at)
    assert done_id not in list(at.dataframe[0].value["id"])
    assert [e.id for e in store.list_experiments()] == [3, running_id]


def test_new_experiment_preview_and_launch(store, workers):
    at = open_page(NEW)
    assert_clean(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Trials (configs)"] == "3" and metrics["Items per config"] == "5"
    assert metrics["Evaluations"] == "15" and metrics["Estimated duration"] != "-"
    at.text_input(key="f:name").set_value("from-the-form").run()
    at.button(key="launch").click().run()
    assert_clean(at)
    [experiment] = store.list_experiments()
    assert experiment.name == "from-the-form" and experiment.trials_total == 3
    assert len(workers) == 1 and workers[0][0] == 1
    assert at.title[0].value == "from-the-form"


def test_new_experiment_validation_next_to_fields(store):
    at = open_page(NEW)
    at.text_input(key="f:tasks.0.context_lengths").set_value("64, abc").run()
    assert_clean(at)
    assert "'abc' is not a whole number" in texts(at.error)
    assert "Fix the fields marked above" in texts(at.error) and not at.metric
    assert "launch" not in [b.key for b in at.button]
    at.text_input(key="f:tasks.0.context_lengths").set_value("64").run()
    assert "each context length must be in 128..131072 tokens, got [64]" in texts(at.error)
    at.text_input(key="f:tasks.0.context_lengths").set_value("256").run()
    at.toggle(key="f:sweep.on").set_value(True).run()
    at.text_input(key="f:sweep.ratios").set_value("0.5, 1.5").run()
    assert "value 2: Input should be less than 1" in texts(at.error)
    at.text_input(key="f:sweep.ratios").set_value("0.5").run()
    assert not at.error
    # baseline, int4, streaming-50, then the grid's 5 others: none/int4/int2 x none/snapkv less the baseline
    assert {m.label: m.value for m in at.metric}["Trials (configs)"] == "8"


def test_new_experiment_on_an_endpoint_shows_the_key_masked_and_stores_no_key(store, workers, monkeypatch):
    monkeypatch.setenv("KVLAB_TEST_ENDPOINT_API_KEY", "sk-dashboard-secret-9876")
    monkeypatch.setenv("KVLAB_TEST_ENDPOINT_BASE_URL", "http://127.0.0.1:8000/v1")  # where that key belongs
    at = open_page(NEW)
    at.selectbox(key="f:backend.kind").set_value("openai_compat").run()
    at.text_input(key="f:backend.base_url").set_value("http://127.0.0.1:8000/v1").run()
    at.text_input(key="f:backend.api_key_env").set_value("KVLAB_TEST_ENDPOINT_API_KEY").run()
    assert_clean(at)
    page_text = texts(at.caption) + texts(at.markdown)
    assert "****9876" in page_text and "sk-dashboard-secret" not in page_text
    at.button(key="launch").click().run()
    assert_clean(at)
    [experiment] = store.list_experiments()
    backend = store.get_experiment(experiment.id).spec["backend"]
    assert backend["kind"] == "openai_compat" and backend["base_url"] == "http://127.0.0.1:8000/v1"
    assert backend["api_key_env"] == "KVLAB_TEST_ENDPOINT_API_KEY" and "sk-dashboard" not in str(backend)


def test_new_experiment_on_vllm_refuses_what_vllm_lacks_before_launch(store):
    at = open_page(NEW)
    at.selectbox(key="f:backend.kind").set_value("vllm").run()
    assert_clean(at)
    errors = texts(at.error)
    assert "int4" in errors and "fp8_e4m3" in errors  # the default form's int4 config
    assert "streaming" in errors and "prefix" in errors  # and its eviction config
    assert not [b for b in at.button if b.key == "launch"]


@pytest.mark.parametrize("kind", ["vllm", "sglang", "llamacpp"])
def test_new_experiment_labels_the_server_settings_with_the_engines_own_flags(store, kind):
    """Each server setting's help is the chosen engine's flag for it; one the engine does not take is disabled."""
    from kvlab.engines.servers import SERVERS

    at = open_page(NEW)
    at.selectbox(key="f:backend.kind").set_value(kind).run()
    assert_clean(at)
    flags = SERVERS[kind].setting_flags
    fraction = at.number_input(key="f:backend.server.memory_fraction")
    assert fraction.disabled == ("memory_fraction" not in flags)
    assert fraction.help == flags.get("memory_fraction", f"{SERVERS[kind].title} sizes its pool in tokens: the max "
                                                         "model length")
    assert at.number_input(key="f:backend.server.max_model_len").help == flags["max_model_len"]


def test_new_experiment_examples_and_uploads(store):
    at = open_page(NEW)
    at.selectbox(key="example_pick").set_value("tiny").run()
    at.button(key="load_example").click().run()
    assert_clean(at)
    assert at.text_input(key="f:name").value == "tiny"
    assert at.text_input(key="f:tasks.0.context_lengths").value == "256"
    assert {m.label: m.value for m in at.metric}["Evaluations"] == "6"

    mine = (b'name = "uploaded"\nseed = 7\nmodel = "/models/my-llama"\n[[tasks]]\nname = "multikey"\n'
            b'context_lengths = [512]\n[sweep]\nquant = ["int8"]\n')
    at.get("file_uploader")[0].upload("mine.toml", mine, "application/toml")
    at.run()
    assert_clean(at)
    assert "Loaded mine.toml" in texts(at.success)
    assert at.text_input(key="f:name").value == "uploaded" and at.number_input(key="f:seed").value == 7
    assert at.selectbox(key="f:model").value == "/models/my-llama"
    assert at.toggle(key="f:sweep.on").value and at.number_input(key="f:tasks.0.num_pairs").value == 4

    at.get("file_uploader")[0].upload("bad.toml", b'name = "x"\n[[tasks]]\nname = "passkey"\n[[configs]]\n'
                                                  b'quant = "int3"\n', "application/toml")
    at.run()
    assert_clean(at)
    assert "Not loaded: bad.toml: configs.0.quant" in texts(at.error)
    assert at.text_input(key="f:name").value == "uploaded"


def test_new_experiment_tiny_example_in_one_click(store, workers):
    at = open_page(NEW)
    at.button(key="launch_example").click().run()
    assert_clean(at)
    [experiment] = store.list_experiments()
    assert experiment.name == "tiny" and experiment.trials_total == 3 and len(workers) == 1


def test_new_experiment_tasks_can_be_added_and_removed(store):
    at = open_page(NEW)
    at.button[[b.label for b in at.button].index("Add a task")].click().run()
    at.selectbox(key="f:tasks.1.name").set_value("multikey").run()
    assert {m.label: m.value for m in at.metric}["Items per config"] == "10"
    at.button(key="remove-task-0").click().run()
    assert_clean(at)
    assert at.selectbox(key="f:tasks.0.name").value == "multikey"
    assert not [s for s in at.selectbox if s.key == "f:tasks.1.name"]


def test_a_finished_experiment_opens_on_its_result_and_draws_only_that(filled):
    _, done_id, _ = filled
    at = open_page(VIEW, id=str(done_id))
    assert_clean(at)
    assert at.title[0].value == "synthetic-sweep"
    assert at.segmented_control(key="tab").value == "Tradeoff"
    assert "Sweet spot: **int4** at 3.70x" in texts(at.success)
    assert plotly_charts(at) == 1  # the tradeoff chart only: no telemetry, no other section's charts
    summary = next(df.value for df in at.dataframe if "KV (MiB)" in df.value.columns)
    assert list(summary["config"]) == ["baseline", "int4  ★ sweet spot", "int2", "snapkv-50"]
    assert not [df for df in at.dataframe if "generated" in df.value.columns]
    assert share_link(at) == f"?id={done_id}"
    assert {"PNG", "SVG", "PDF", "HTML"} <= {b.proto.label for b in at.get("download_button")}


@pytest.mark.parametrize(("section", "charts"), [("Progress", 1), ("Latency", 1), ("Load", 0), ("Capacity", 1),
                                                 ("Breakdown", 2),
                                                 ("Layers", 1),
                                                 ("Generation", 0),
                                                 ("Needles", 1), ("Failed items", 0), ("Spec & environment", 0),
                                                 ("Export", 0)])
def test_each_section_draws_its_own_content(filled, section, charts):
    _, done_id, _ = filled
    at = open_page(VIEW, id=str(done_id), tab=section)
    assert_clean(at)
    assert at.segmented_control(key="tab").value == section
    assert plotly_charts(at) == charts
    assert "Sweet spot" not in texts(at.success)
    if section == "Progress":
        assert at.get("progress") and any("trial" in df.value.columns for df in at.dataframe)
    if section == "Failed items":
        failed = next(df.value for df in at.dataframe if "generated" in df.value.columns)
        assert set(failed["config"]) == {"int2", "snapkv-50"}
    if section == "Spec & environment":
        assert 'name = "synthetic-sweep"' in texts(at.code)
    if section == "Export":
        assert {"Results (CSV)", "Everything (JSON)", "HTML report"} <= {b.proto.label
                                                                        for b in at.get("download_button")}


def test_the_load_section_shows_both_halves_and_the_gain_over_the_baseline(store):
    """An experiment whose servers ran a load phase: the load curves, cost against what it buys, the table of both
    halves with every level of every config, and each config's gain over the baseline in words."""
    done_id = populate(store, fidelity=True, load=True)
    at = open_page(VIEW, id=str(done_id), tab="Load")
    assert_clean(at)
    assert plotly_charts(at) == 2
    table = next(df.value for df in at.dataframe if "out tok/s" in df.value.columns)
    assert len(table) == 4 * 3 and set(table["config"]) == {"baseline", "int4", "int2", "snapkv-50"}
    at_four = table[table["level"] == "4 clients"].set_index("config")
    assert at_four.loc["int2", "max running"] == 4 and at_four.loc["baseline", "max running"] == 2
    assert at_four.loc["baseline", "pool tokens"] == 1_408 and at_four.loc["int4", "pool tokens"] > 1_408
    gains = texts(at.markdown).replace("\\", "")
    assert "int4: 3.70x the pool tokens, 2.00x the output tokens/s at 4 clients" in gains, gains
    assert "Both halves (CSV)" in {b.proto.label for b in at.get("download_button")}


def test_the_load_section_says_why_an_experiment_has_none(filled):
    _, done_id, _ = filled
    at = open_page(VIEW, id=str(done_id), tab="Load")
    assert_clean(at)
    assert "kvlab's own engine runs one request at a time" in texts(at.info)


def test_the_form_projects_what_each_config_of_the_spec_would_fit_before_it_runs(store):
    """The new-experiment form's capacity preview: the spec's configs on a GPU, labelled as a projection, with no
    measured column (nothing ran); a bigger GPU fits more of every config."""
    from kvlab.dashboard.capacity_view import LABEL

    at = open_page(NEW)
    at.selectbox(key="form-cap-model").set_value("llama-3.1-8b").run()
    assert_clean(at)
    assert LABEL in texts(at.caption).replace("\\", "")
    table = next(df.value for df in at.dataframe if "sequences that fit (projected)" in df.value.columns)
    assert len(table) == 3 and "measured ratio (this experiment)" not in table.columns
    on_h100 = dict(zip(table["config"], table["sequences that fit (projected)"], strict=True))
    assert on_h100["baseline"] >= 1 and all(fit >= on_h100["baseline"] for fit in on_h100.values()), on_h100
    at.selectbox(key="form-cap-gpu").set_value("l4").run()
    table = next(df.value for df in at.dataframe if "sequences that fit (projected)" in df.value.columns)
    on_l4 = dict(zip(table["config"], table["sequences that fit (projected)"], strict=True))
    assert all(on_l4[name] < on_h100[name] for name in on_h100), (on_l4, on_h100)


def test_a_projection_that_fails_says_so_in_one_line_and_leaves_the_form(store, monkeypatch):
    """What fails in the capacity preview stays in it: the cost, the preview and Launch are still there."""
    import pages.capacity_preview

    def half_imported(name: str):
        raise ImportError("cannot import name 'AutoConfig' from 'transformers'")

    monkeypatch.setattr(pages.capacity_preview, "architecture", half_imported)
    at = open_page(NEW)
    assert_clean(at)
    assert any("No projection now: cannot import name" in w.value for w in at.warning)
    assert {m.label for m in at.metric} >= {"Evaluations", "Estimated duration"}
    assert at.button(key="launch") is not None


def test_the_capacity_section_projects_every_config_and_its_link_keeps_the_deployment(filled):
    """The Capacity section: every config of the experiment projected on the linked GPU, model and context, labelled
    as a projection, its CSV said to be one; the share link reproduces the choice."""
    from kvlab.dashboard.capacity_view import LABEL

    _, done_id, _ = filled
    at = open_page(VIEW, id=str(done_id), tab="Capacity", cap_model="llama-3.1-8b", gpu="l4", context="16384",
                   clients="3")
    assert_clean(at)
    assert (at.selectbox(key="cap_model").value, at.selectbox(key="gpu").value) == ("llama-3.1-8b", "l4")
    assert (at.number_input(key="context").value, at.number_input(key="clients").value) == (16384, 3)
    assert share_link(at) == f"?id={done_id}&tab=Capacity&cap_model=llama-3.1-8b&gpu=l4&context=16384&clients=3"
    caption = texts(at.caption).replace("\\", "")  # Markdown-escaped
    assert LABEL in caption and "NVIDIA L4" in caption and "estimate" in caption
    table = next(df.value for df in at.dataframe if "sequences that fit (projected)" in df.value.columns)
    assert list(table["config"]) == ["baseline", "int4", "int2", "snapkv-50"]
    fits = dict(zip(table["config"], table["sequences that fit (projected)"], strict=True))
    assert fits["int2"] > fits["int4"] > fits["baseline"] > 0 and fits["snapkv-50"] > fits["baseline"]
    assert "Projection (CSV)" in {b.proto.label for b in at.get("download_button")}
    at.number_input(key="clients").set_value(8).run()
    assert_clean(at)
    assert share_link(at) == f"?id={done_id}&tab=Capacity&cap_model=llama-3.1-8b&gpu=l4&context=16384"


def test_experiment_view_state_comes_from_the_url(filled):
    _, done_id, _ = filled
    at = open_page(VIEW, id=str(done_id), x="ratio", tab="Needles", hide="int2", needle="snapkv-50")
    assert_clean(at)
    assert at.selectbox(key="needle").value == "snapkv-50" and at.multiselect(key="hide").value == ["int2"]
    assert share_link(at) == f"?id={done_id}&tab=Needles&x=ratio&hide=int2&needle=snapkv-50"
    at = open_page(VIEW, id=str(done_id), x="ratio", hide="int2")
    assert at.radio(key="x").value == "ratio"
    summary = next(df.value for df in at.dataframe if "KV (MiB)" in df.value.columns)
    assert "int2" not in list(summary["config"])


def _verdict(at: AppTest) -> str:
    """The Tradeoff section's verdict: the sweet spot (or why none), its rule, and the summary table."""
    summary = next(df.value for df in at.dataframe if "KV (MiB)" in df.value.columns)
    return "\n".join([texts(at.success), texts(at.info), texts(at.caption), summary.to_csv()])


def test_the_share_link_carries_every_piece_of_the_view_and_reproduces_its_verdict(store):
    """Each piece of the page's state set from its widget (section, axes, hidden configs, margin,
    needle config, item); the link, opened as a new session, shows the same view and the same verdict."""
    done_id = populate(store, fidelity=True)  # fidelity measured: an item to pick
    at = open_page(VIEW, id=str(done_id))
    default_verdict = _verdict(at)
    at.number_input(key="margin").set_value(0.2).run()
    at.multiselect(key="hide").set_value(["snapkv-50"]).run()
    at.radio(key="x").set_value("ratio").run()
    at.radio(key="y").set_value("KL").run()
    verdict = _verdict(at)
    assert verdict != default_verdict and r"by more than 0\.2 \(" in verdict  # the rule at the margin (as Markdown)
    at.segmented_control(key="tab").set_value("Failed items").run()
    at.selectbox(key="item").set_value("passkey-256-1").run()
    at.segmented_control(key="tab").set_value("Layers").run()
    at.selectbox(key="layout").set_value("int2").run()
    at.segmented_control(key="tab").set_value("Capacity").run()
    at.selectbox(key="cap_model").set_value("qwen2.5-7b").run()
    at.selectbox(key="gpu").set_value("a100-40gb").run()
    at.number_input(key="context").set_value(8192).run()
    at.number_input(key="clients").set_value(4).run()
    projection = next(df.value for df in at.dataframe if "sequences that fit (projected)" in df.value.columns)
    at.segmented_control(key="tab").set_value("Needles").run()
    at.selectbox(key="needle").set_value("int2").run()
    assert_clean(at)
    link = share_link(at)
    params = parse_qs(urlsplit(link).query)
    # every piece, by its name
    assert set(params) == {f.name for f in fields(experiment_view.ExperimentViewState)}, link
    assert params == {"id": [str(done_id)], "tab": ["Needles"], "x": ["ratio"], "y": ["KL"], "hide": ["snapkv-50"],
                      "margin": ["0.2"], "needle": ["int2"], "layout": ["int2"], "item": ["passkey-256-1"],
                      "cap_model": ["qwen2.5-7b"], "gpu": ["a100-40gb"], "context": ["8192"], "clients": ["4"]}

    opened = open_page(VIEW, **{key: values if len(values) > 1 else values[0] for key, values in params.items()})
    assert_clean(opened)
    assert opened.selectbox(key="needle").value == "int2" and opened.multiselect(key="hide").value == ["snapkv-50"]
    assert opened.number_input(key="margin").value == 0.2 and share_link(opened) == link
    opened.segmented_control(key="tab").set_value("Failed items").run()
    assert opened.selectbox(key="item").value == "passkey-256-1"
    opened.segmented_control(key="tab").set_value("Layers").run()
    assert opened.selectbox(key="layout").value == "int2"
    opened.segmented_control(key="tab").set_value("Capacity").run()
    assert next(df.value for df in opened.dataframe if "sequences that fit (projected)" in df.value.columns
                ).equals(projection)  # the same projection, from the link alone
    opened.segmented_control(key="tab").set_value("Tradeoff").run()
    assert opened.radio(key="x").value == "ratio" and opened.radio(key="y").value == "KL"
    assert _verdict(opened) == verdict


def _address_bar(at: AppTest) -> str:
    """The query the page last wrote into the browser's address bar, as a link (``?a=1&b=2``)."""
    return "?" + urlencode(at.query_params, doseq=True)


def test_the_address_bar_is_the_share_link_in_every_section(filled):
    """Issue 47 row 5: a section that does not draw the chart's axes dropped ``y=`` from the address bar (the
    share link kept it); one state, one writer: the address bar is the link, section after section."""
    _, done_id, _ = filled
    at = open_page(VIEW, id=str(done_id))
    at.radio(key="y").set_value("agreement").run()
    at.number_input(key="margin").set_value(0.2).run()
    assert _address_bar(at) == share_link(at) == f"?id={done_id}&y=agreement&margin=0.2"
    for section in ("Latency", "Spec & environment", "Tradeoff"):
        at.segmented_control(key="tab").set_value(section).run()
        assert_clean(at)
        tab = "" if section == "Tradeoff" else "&" + urlencode({"tab": section})
        assert _address_bar(at) == share_link(at) == f"?id={done_id}{tab}&y=agreement&margin=0.2", section
    assert at.radio(key="y").value == "agreement" and at.number_input(key="margin").value == 0.2


def test_a_link_margin_in_hundredths_or_out_of_range_is_read_or_left_at_the_spec(filled):
    _, done_id, _ = filled
    at = open_page(VIEW, id=str(done_id), margin="5")  # a link from when the page took hundredths: 0.05
    assert_clean(at)
    assert at.number_input(key="margin").value == 0.05 and _address_bar(at) == share_link(at) == \
        f"?id={done_id}&margin=0.05"
    for raw in ("7000", "abc", "0"):
        at = open_page(VIEW, id=str(done_id), margin=raw)
        assert_clean(at)
        assert f"The link's margin '{raw}' is not a fraction from 0.001 to 0.5: left at the spec's, 0.5." in \
            texts(at.warning).replace("\\", "")
        assert at.number_input(key="margin").value == 0.5 and _address_bar(at) == f"?id={done_id}"


def test_an_older_link_without_y_shows_accuracy_and_a_bad_y_is_dropped(filled):
    _, done_id, _ = filled
    for link_y in ({}, {"y": "perplexity"}):
        at = open_page(VIEW, id=str(done_id), x="ratio", **link_y)
        assert_clean(at)
        assert at.radio(key="y").value == "accuracy" and share_link(at) == f"?id={done_id}&x=ratio"


def test_the_experiment_page_shows_fidelity_and_the_verdict_per_task(store):
    """Stored fidelity results: the sweet spot's line says which criterion decided and the rule, the
    summary has the fidelity columns, and the verdict table each config's verdict on each task."""
    done_id = populate(store, "fidelity-sweep", fidelity=True)
    at = open_page(VIEW, id=str(done_id))
    assert_clean(at)
    spot = texts(at.success)
    assert spot.startswith("Sweet spot: **int4** at 3.70x") and r"decided by passkey\: fidelity" in spot
    assert "\n\nRule: the most compressed config that, on every task, has its fidelity to the baseline" in spot
    summary = next(df.value for df in at.dataframe if "KV (MiB)" in df.value.columns)
    assert list(summary["acceptable (every task)"]) == ["-", "yes", "no", "no"]
    assert list(summary["decided by"])[1:] == ["passkey: fidelity"] * 3
    assert list(summary["stopped by (task)"]) == ["-", "-", "passkey", "passkey"]
    kl = list(summary["mean KL (nats, 95% CI)"])
    assert kl[0] == "-" and all(re.fullmatch(r"[\d.e-]+ \[[\d.e-]+, [\d.e-]+\]", cell) for cell in kl[1:]), kl
    verdicts = next(df.value for df in at.dataframe if "criterion" in df.value.columns)
    assert [tuple(row) for row in verdicts[["config", "task", "accepted", "criterion"]].values] == [
        ("int4", "passkey", "yes", "fidelity"), ("int2", "passkey", "no", "fidelity"),
        ("snapkv-50", "passkey", "no", "fidelity")]
    assert verdicts["reason"][1].startswith("fidelity not certified within mean KL below 0.05 nats per token")
    at.radio(key="y").set_value("agreement").run()
    assert_clean(at)
    assert share_link(at) == f"?id={done_id}&y=agreement" and plotly_charts(at) == 1

    at = open_page(VIEW, id=str(done_id), tab="Failed items")
    assert_clean(at)
    assert at.selectbox(key="item").value == "passkey-256-0" and plotly_charts(at) == 1  # the item's KL chart
    item = next(df.value for df in at.dataframe if "first divergence (token)" in df.value.columns)
    assert list(item["config"]) == ["baseline", "int4", "int2", "snapkv-50"]
    assert list(item["first divergence (token)"]) == ["-", "none", "1", "3"]  # tests/dashboard_data.py's FIDELITY
    assert share_link(at) == f"?id={done_id}&tab=Failed+items"


def test_the_exports_carry_every_per_token_figure_and_the_fidelity_summaries(store):
    from kvlab.experiments.export import experiment_document, results_csv

    done_id = populate(store, "fidelity-sweep", fidelity=True)
    results = store.item_results(done_id)
    measured = [r for r in results if r.fidelity is not None]
    assert len(measured) == 24  # 3 configs x 8 items: every one but the baseline's
    rows = list(csv.DictReader(io.StringIO(results_csv(results))))
    stored = {(row["config_name"], row["item_id"]): json.loads(row["extra"]).get("fidelity") for row in rows}
    for result in measured:
        assert stored[(result.config_name, result.item_id)] == result.fidelity.to_dict()
    document = json.loads(json.dumps(experiment_document(store, done_id)))
    by_key = {(r["config_name"], r["item_id"]): r["extra"].get("fidelity") for r in document["results"]}
    assert all(by_key[(r.config_name, r.item_id)]["kl"] == list(r.fidelity.kl) for r in measured)
    summary = {s["config_name"]: s for s in document["summary"]}
    assert summary["int4"]["fidelity"]["mean_kl"] is not None and summary["baseline"]["fidelity"]["mean_kl"] is None
    assert summary["int2"]["task_verdicts"][0]["criterion"] == "fidelity"
    assert document["sweet_spot"]["decided_by"] == {"passkey": "fidelity"}


def _finish(store: Store, experiment_id: int) -> None:
    """The rest of a running ``populate(..., finish=False)`` experiment's items, as its worker writes them."""
    for trial in store.trials(experiment_id):
        for index, (length, depth) in enumerate((n, d) for n in (256, 512) for d in (0.1, 0.9) for _ in range(2)):
            if index >= 4:
                store.add_item_result(trial.id, item_result(trial.config_name, index, length, depth))
        store.finish_trial(trial.id, "done", worker_id="test-host:w0")


def test_a_sweep_that_ends_leaves_progress_for_its_result(filled):
    """Opened while it ran (with results: the section selector shows, on Progress), the page opens
    the result once the sweep is done, and ``tab`` stays out of the link; a section the viewer
    picked stays picked."""
    store, _, running_id = filled
    at = open_page(VIEW, id=str(running_id))
    assert at.segmented_control(key="tab").value == "Progress" and share_link(at) == f"?id={running_id}"
    _finish(store, running_id)
    at.run()  # the live panel reruns the page when the experiment ends
    assert_clean(at)
    assert store.get_experiment(running_id).status == "done"
    assert at.segmented_control(key="tab").value == "Tradeoff" and share_link(at) == f"?id={running_id}"
    assert "Sweet spot" in texts(at.success) + texts(at.info)

    picked = populate(store, "picked-one", finish=False)
    at = open_page(VIEW, id=str(picked))
    at.segmented_control(key="tab").set_value("Latency").run()
    _finish(store, picked)
    at.run()
    assert at.segmented_control(key="tab").value == "Latency" and share_link(at) == f"?id={picked}&tab=Latency"


def test_a_page_whose_items_land_faster_than_it_draws_still_draws_its_results(filled, monkeypatch):
    """Items landing between the page's read and its live panel's (every read here sees more) used to make the
    panel rerun the page before its results, for ever: the panel reruns the page in its own runs only."""
    store, _, running_id = filled
    read = Store.get_experiment
    reads = []

    def landing(self, experiment_id):
        record = read(self, experiment_id)
        if experiment_id != running_id:
            return record
        reads.append(experiment_id)
        return replace(record, items_done=record.items_done + len(reads))

    monkeypatch.setattr(Store, "get_experiment", landing)
    at = open_page(VIEW, id=str(running_id), tab="Tradeoff")
    assert_clean(at)
    assert "Still running: these are the results so far" in texts(at.info) and plotly_charts(at) == 1
    assert at.get("progress")  # the panel drew too


def test_experiment_page_while_running_and_unknown(filled):
    store, done_id, running_id = filled
    at = open_page(VIEW, id=str(running_id))
    assert_clean(at)
    assert at.title[0].value == "running-one" and at.get("progress")
    assert at.segmented_control(key="tab").value == "Progress" and plotly_charts(at) == 1  # telemetry leads
    queued = store.create_experiment(parse_spec(store.get_experiment(done_id).spec), {})
    at = open_page(VIEW, id=str(queued))
    assert_clean(at)
    assert "No results yet" in texts(at.info) and "Queued" in texts(at.info)
    at = open_page(VIEW, id="999")
    assert_clean(at)
    assert "no experiment 999" in texts(at.error)


def test_compare_page(filled):
    _, done_id, running_id = filled
    at = open_page(COMPARE, ids=[str(done_id), str(running_id)])
    assert_clean(at)
    assert at.multiselect(key="compare_pick").value == [done_id, running_id]
    assert at.segmented_control(key="tab").value == "Tradeoffs"
    assert plotly_charts(at) == 1 and not at.dataframe  # the tradeoffs only: the parameters are a section
    at = open_page(COMPARE, ids=[str(done_id), str(running_id)], tab="Parameters")
    assert_clean(at)
    assert plotly_charts(at) == 1
    table = at.dataframe[0].value
    assert len(table) == 8 and set(table["KV bits"]) == {16.0, 4.0, 2.0}
    at = open_page(COMPARE, ids=[str(done_id), "77"], hide=[f"{done_id}/int2"], x="ratio", tab="Parameters")
    assert_clean(at)
    assert "#77" in texts(at.warning)
    assert "int2" not in list(at.dataframe[0].value["config"])
    assert share_link(at) == f"?ids={done_id}&hide={done_id}%2Fint2&tab=Parameters&x=ratio"
    at = open_page(COMPARE)
    assert "Pick one or more experiments" in texts(at.info)


def test_compare_page_pairs_two_engines_runs_config_by_config(filled):
    """The running experiment has half the done one's items: the table pairs the items both have."""
    _, done_id, running_id = filled
    at = open_page(COMPARE, ids=[str(done_id), str(running_id)], tab="Engines")
    assert_clean(at)
    table = at.dataframe[0].value
    assert list(table["config"]) == ["baseline", "int4", "int2", "snapkv-50"] and set(table["items"]) == {4}
    assert set(table["same outcome"]) == set(table["same text"]) == {"100%"}  # the same synthetic answers
    assert {f"accuracy #{done_id}", f"KV B/token #{running_id}"} <= set(table.columns)
    engines = at.dataframe[1].value  # every experiment's configs side by side, on the items both ran
    assert list(engines["experiment"]) == [f"#{done_id}"] * 4 + [f"#{running_id}"] * 4
    assert list(engines["config"]) == ["baseline", "int4", "int2", "snapkv-50"] * 2 and set(engines["items"]) == {4}
    at = open_page(COMPARE, ids=[str(done_id)], tab="Engines")
    assert "Pick two or more experiments" in texts(at.info)


def test_the_engines_noise_floor_shows_beside_the_fidelity_on_both_pages(store):
    """A server experiment's baseline carries the engine's noise floor: the Tradeoff section states it (and the
    configs inside it, and the floor under its load), and the compare page's Engines section lists each
    experiment's."""
    one, two = populate(store, fidelity=True, floor=True, load=True), populate(store, "second", fidelity=True,
                                                                               floor=True)
    at = open_page(VIEW, id=str(one), tab="Tradeoff")
    assert_clean(at)
    (floor,) = [str(e.value) for e in at.info if str(e.value).startswith("Engine noise floor")]  # as Markdown
    assert "over 8 items" in floor
    assert "- under load, engine noise floor" in floor and "while 4 clients kept the server busy" in floor
    at = open_page(COMPARE, ids=[str(one), str(two)], tab="Engines")
    assert_clean(at)
    lines = [line for line in texts(at.markdown).splitlines() if "engine noise floor" in line]
    shown = [line.replace("\\", "").split(":", 1)[0] for line in lines]  # Markdown escapes dropped
    assert shown == [f"- #{one} (embedded)", f"- #{two} (embedded)"]


def test_new_experiment_form_survives_a_visit_elsewhere(store):
    at = open_page(NEW)
    at.text_input(key="f:name").set_value("keep-me").run()
    at.switch_page(LIST).run()
    at.switch_page(NEW).run()
    assert_clean(at)
    assert at.text_input(key="f:name").value == "keep-me"
    assert {m.label: m.value for m in at.metric}["Trials (configs)"] == "3"


def test_the_dashboard_runs_without_a_file_watcher():
    """Streamlit's watcher follows every file under the app's folder (db/ included) and filled the
    server log with "Inotify queue overflowed"; a user's dashboard does not reload on edits."""
    import tomllib

    config = tomllib.loads((Path(APP).parent / ".streamlit" / "config.toml").read_text())
    assert config["server"]["fileWatcherType"] == "none" and config["server"]["runOnSave"] is False


def _generation_experiment(store) -> int:
    """A finished experiment of the baseline and a decode policy on multikey, two questions per
    context, with the cache measured over each answer, as the embedded engine stores it."""
    from kvlab.core.experiment_spec import parse_spec
    from kvlab.core.results import GenerationKV
    from tests.store.test_store import make_result

    spec = parse_spec({"name": "decoding", "tasks": [{"name": "multikey", "questions_per_context": 2, "num_items": 2}],
                       "configs": [{"evict": "knorm", "decode": {"interval": 8, "target_tokens": 100}}]})
    experiment_id = store.create_experiment(spec, {"versions": {"kvlab": "test"}})
    for trial in store.claim_trials("test-host:w0", max_trials=2, experiment_id=experiment_id):
        cut = trial.config_name != "baseline"
        for item in range(4):
            trace = [(1000 + t, (100 + t % 8 if cut else 1000 + t) * 23_040) for t in range(40)]
            store.add_item_result(trial.id, make_result(
                f"multikey/i{item // 2}/q{item % 2}", trial.config_name, task="multikey", config=trial.config,
                score=float(item % 2 == 0 or not cut), peak_kv_bytes=max(b for _, b in trace),
                extra={"generation_kv": GenerationKV.from_trace(trace, 1039 * 23_040).to_dict(),
                       "shared_context": {"context_id": f"multikey/i{item // 2}", "rank": item % 2, "questions": 2,
                                          "multi_turn": False, "prefill_charged": item % 2 == 0}}))
        store.finish_trial(trial.id, "done", worker_id="test-host:w0")
    return experiment_id


def test_the_cache_over_the_generation_and_accuracy_per_question_are_drawn(store):
    experiment_id = _generation_experiment(store)
    at = open_page(VIEW, id=str(experiment_id), tab="Generation")
    assert_clean(at)
    assert plotly_charts(at) == 1
    assert "peak over prompt and answer" in texts(at.caption)
    at = open_page(VIEW, id=str(experiment_id), tab="Breakdown")
    assert_clean(at)
    assert plotly_charts(at) == 3  # by task, by context length, by question rank
    assert "Question rank" in texts(at.caption)


def test_the_layers_section_draws_kept_tokens_per_head_and_bytes_per_layer(store):
    """A head-wise config's cache layout, as the embedded engine stores it: the chosen config in the URL."""
    from kvlab.core.experiment_spec import parse_spec
    from kvlab.core.results import CacheLayout
    from tests.store.test_store import make_result

    spec = parse_spec({"name": "layers", "tasks": [{"name": "passkey", "num_items": 2}],
                       "configs": [{"evict": "knorm", "ratio": 0.5, "heads": "adakv"},
                                   {"quant": "int4", "skip_layers": {"first": 1}}]})
    experiment_id = store.create_experiment(spec, {"versions": {"kvlab": "test"}})
    for trial in store.claim_trials("test-host:w0", max_trials=3, experiment_id=experiment_id):
        for item in range(2):
            kept = [(100 + layer, 40 - layer, 60) for layer in range(4)]
            layout = CacheLayout(tuple(kept), tuple(sum(heads) * 256 for heads in kept))
            store.add_item_result(trial.id, make_result(f"passkey/{item}", trial.config_name, config=trial.config,
                                                        extra={"cache_layout": layout.to_dict()}))
        store.finish_trial(trial.id, "done", worker_id="test-host:w0")
    at = open_page(VIEW, id=str(experiment_id), tab="Layers")
    assert_clean(at)
    assert plotly_charts(at) == 1
    choices = at.selectbox(key="layout").options
    assert choices[-1] == "baseline" and "knorm:r0.5/ada" in choices
    assert "head-wise budget" in texts(at.caption)
    second = choices[1]
    at = open_page(VIEW, id=str(experiment_id), tab="Layers", layout=second)
    assert_clean(at)
    assert at.selectbox(key="layout").value == second
    assert parse_qs(urlsplit(share_link(at)).query) == {"id": [str(experiment_id)], "tab": ["Layers"],
                                                        "layout": [second]}


def test_notes_over_the_limit_are_refused_kept_in_the_box_and_never_called_saved(filled):
    """Issue 47 row 11 (the page's side: the browser test pastes them): 12,000 characters, Save."""
    store, done_id, _ = filled
    store.set_notes(done_id, "the notes before")
    at = open_page(VIEW, id=str(done_id))
    pasted = "x" * 12_000
    at.text_area(key=f"notes-{done_id}").set_value(pasted)
    next(b for b in at.button if b.label == "Save notes").click().run()
    assert_clean(at)
    assert "Not saved: the notes are 12,000 characters, more than the 10,000 allowed." in texts(at.error)
    assert "Notes saved" not in texts(at.success) and store.get_experiment(done_id).notes == "the notes before"
    assert at.text_area(key=f"notes-{done_id}").value == pasted
    at.text_area(key=f"notes-{done_id}").set_value("x" * 10_000)
    next(b for b in at.button if b.label == "Save notes").click().run()
    assert "Notes saved." in texts(at.success) and store.get_experiment(done_id).notes == "x" * 10_000


def test_the_list_shows_a_missing_figure_as_a_dash_not_none(filled):
    """Issue 47 row 15: the list's metric columns showed Streamlit's literal "None" where there is no figure."""
    _, _, running_id = filled
    at = open_page(LIST)
    assert_clean(at)
    table = next(frame for frame in at.dataframe if "best ratio held (x)" in frame.value.columns)
    assert table.proto.placeholder == "-"


def test_a_running_experiment_is_cancelled_from_its_page_after_asking(filled):
    """Issue 47 row 7: Cancel on the running experiment's own page, asked first as the list asks."""
    store, done_id, running_id = filled
    assert not [b for b in open_page(VIEW, id=str(done_id)).button if b.label == "Cancel"]  # ended: none
    at = open_page(VIEW, id=str(running_id))
    next(b for b in at.button if b.label == "Cancel").click().run()
    assert f"Cancel experiment #{running_id}? Their queued and running trials stop" in texts(at.warning)
    assert store.get_experiment(running_id).status == "running"
    next(b for b in at.button if b.label == "No").click().run()
    assert store.get_experiment(running_id).status == "running" and "Cancel experiment" not in texts(at.warning)
    next(b for b in at.button if b.label == "Cancel").click().run()
    next(b for b in at.button if b.label == "Yes, cancel").click().run()
    assert_clean(at)
    assert re.search(rf"Experiment {running_id}\\: \d+ trial\\\(s\\\) cancelled", texts(at.success))
    assert store.get_experiment(running_id).status == "cancelled"


def test_a_store_fault_on_cancel_is_one_line_not_a_traceback(filled, monkeypatch):
    """The confirmation is kept by the button's callback and acted on at the top of the next run, inside the
    page's guard: a store that fails there (here, an unexpected error) is one line pointing at the log."""
    from kvlab.store import Store

    _, _, running_id = filled

    def broken(self, experiment_id):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(Store, "cancel_experiment", broken)
    at = open_page(VIEW, id=str(running_id))
    next(b for b in at.button if b.label == "Cancel").click().run()
    next(b for b in at.button if b.label == "Yes, cancel").click().run()
    assert not at.exception, texts(at.exception)
    (line,) = [text for text in texts(at.error).splitlines() if "Something went wrong" in text]
    assert "RuntimeError: the database went away" in line and "The details are in" in line
