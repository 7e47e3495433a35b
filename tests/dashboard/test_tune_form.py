"""The new-experiment page's Tune mode through Streamlit's AppTest (the real app.py on a temporary
store): the [tune] widgets validate through kvlab.core.experiment_spec.parse_spec with one-line messages, and the
preview shows the full grid against what the tune starts with, counted by hand."""

from __future__ import annotations

import threading

import psutil
import pytest

from kvlab.dashboard import spec_form
from kvlab.experiments.launcher import start_tune_driver
from tests.dashboard import test_dashboard
from tests.dashboard.test_dashboard import NEW, assert_clean, open_page, texts
from tests.waiting import SAFETY_S

store = test_dashboard.store  # the fixture: a temporary SQLite store the pages open


def metrics(at) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_tune_mode_previews_the_grid_and_what_the_tune_starts_with(store):
    at = open_page(NEW)
    at.segmented_control(key="f:mode").set_value("Tune").run()
    assert_clean(at)
    # the default space: quant none/int8/int4/int2 x group 64 x residual 64, evict none/snapkv with ratios
    # 0.25..0.875 step 0.125 (6 budgets): 3 quantized + 6 snapkv + 3 x 6 both = 27 configs; the form's task
    # has 5 items: (27 + 1) x 5 = 140 evaluations as a full grid; rounds of 4 then 5 items (min_items 4, eta 3);
    # the first round: 4 candidates and the baseline on 4 items = 20
    assert metrics(at) == {"Full grid (configs)": "27", "Full grid (item evaluations)": "140",
                           "First round (item evaluations)": "20", "Rounds (items)": "4 → 5"}
    assert "launch_tune" in [b.key for b in at.button] and "launch" not in [b.key for b in at.button]
    at.multiselect(key="f:tune.evict").set_value(["none"]).run()
    at.multiselect(key="f:tune.group_sizes").set_value([32, 128]).run()
    # 2 group sizes x 1 residual x 3 integer formats = 6 configs, (6 + 1) x 5 = 35
    assert metrics(at)["Full grid (configs)"] == "6" and metrics(at)["Full grid (item evaluations)"] == "35"


def test_tune_mode_says_what_is_wrong_in_one_line(store):
    at = open_page(NEW)
    at.segmented_control(key="f:mode").set_value("Tune").run()
    at.number_input(key="f:tune.budget_low").set_value(0.9).run()
    assert_clean(at)
    assert "budget_range = [0.9, 0.875]: need 0 < low <= high < 1" in texts(at.error)
    assert not at.metric and "launch_tune" not in [b.key for b in at.button]
    at.number_input(key="f:tune.budget_low").set_value(0.25).run()
    at.text_input(key="f:tune.residual_lengths").set_value("64, abc").run()
    assert "'abc' is not a whole number" in texts(at.error)
    at.text_input(key="f:tune.residual_lengths").set_value("64").run()
    at.multiselect(key="f:tune.quant").set_value(["none"]).run()
    at.multiselect(key="f:tune.evict").set_value(["none"]).run()
    assert "the search space holds only the baseline" in texts(at.error)
    at.multiselect(key="f:tune.evict").set_value(["snapkv"]).run()
    at.number_input(key="f:tune.max_trials").set_value(0).run()
    assert "give the search a budget" in texts(at.error)
    at.number_input(key="f:tune.max_item_evals").set_value(60).run()
    assert_clean(at)
    assert not at.error and metrics(at)["Full grid (configs)"] == "6"  # snapkv x 6 ratios


def test_the_tune_uses_the_forms_margins_fidelity_included(store):
    """The margins above the modes are the tune's too: its recommendation's rule says them, and 0
    turns the KL margin off (not back to its default)."""
    at = open_page(NEW)
    at.segmented_control(key="f:mode").set_value("Tune").run()
    rule = next(c.value for c in at.caption if c.value.startswith("Its recommendation: "))
    assert r"mean KL below 0\.05 nats" in rule  # the spec's default max_kl
    at.number_input(key="f:max_kl").set_value(0.0).run()
    at.number_input(key="f:min_agreement").set_value(0.9).run()
    assert_clean(at)
    rule = next(c.value for c in at.caption if c.value.startswith("Its recommendation: "))
    assert "top-1 agreement above 90%" in rule and "mean KL" not in rule
    state = at.session_state  # what the page validated: its mirror of the widgets
    spec = spec_form.build_spec(state["form_values"], state["form_n_tasks"], [], state["form_base"]).spec
    assert spec.tune is not None and (spec.max_kl, spec.min_agreement) == (0.0, 0.9)


def test_the_example_tune_loads_in_tune_mode_with_its_documented_grid(store):
    at = open_page(NEW)
    at.selectbox(key="example_pick").set_value("tune").run()
    at.button(key="load_example").click().run()
    assert_clean(at)
    assert at.segmented_control(key="f:mode").value == "Tune"
    # examples/tune.toml's own comment: 129 configs, 6,760 item evaluations with the baseline (52 items)
    assert metrics(at)["Full grid (configs)"] == "129" and metrics(at)["Full grid (item evaluations)"] == "6,760"
    at.segmented_control(key="f:mode").set_value("Sweep").run()
    assert_clean(at)
    assert "Fix the fields marked above" in texts(at.error)  # a sweep needs configs: the tune's space is not one


def test_form_values_round_trip_the_tune_table():
    spec = {"name": "t", "tasks": [{"name": "passkey"}],
            "tune": {"quant": ["int4"], "evict": ["none", "snapkv"], "budget_range": [0.5, 0.75], "budget_step": 0.25,
                     "eta": 2, "max_trials": None, "max_item_evals": 300, "max_ttft_ms": 900.0, "max_minutes": 30}}
    form = spec_form.form_from_spec(spec)
    assert form.values["mode"] == "Tune" and form.values["tune.max_trials"] == 0  # 0: no limit
    assert isinstance(form.values["tune.max_minutes"], float)  # the widget's type: minutes may be fractional
    result = spec_form.build_spec(form.values, form.n_tasks, form.configs, form.base)
    assert result.errors == {}
    tune = result.spec.tune
    assert (tune.quant, tune.evict, tune.budgets(), tune.eta) == (["int4"], ["none", "snapkv"], [0.5, 0.75], 2)
    assert (tune.max_trials, tune.max_item_evals, tune.max_ttft_ms, tune.max_tpot_ms) == (None, 300, 900.0, None)
    assert tune.max_minutes == 30
    assert result.spec.configs == [] and result.spec.sweep is None
    swept = spec_form.build_spec(form.values | {"mode": "Sweep", "sweep.on": True}, form.n_tasks, form.configs,
                                 form.base)
    assert swept.spec is not None and swept.spec.tune is None


def test_a_background_tune_is_reaped_when_it_ends(store, tmp_path, monkeypatch):
    """The dashboard's server outlives the ``kvlab tune`` it starts: a thread waits for the process, so
    that it does not stay a zombie (``<defunct>``) under the server once it ends."""
    monkeypatch.setenv("KVLAB_LOG_DIR", str(tmp_path / "logs"))
    started = start_tune_driver(["--drive", "999"])  # refused at once: there is no experiment 999
    pid = started.process.pid
    [reaper] = [t for t in threading.enumerate() if t.name == f"kvlab-{pid}-reaper"]
    reaper.join()  # returns when the process has ended and been waited for
    assert started.process.returncode == 2
    with pytest.raises(psutil.NoSuchProcess):  # gone, not a zombie
        psutil.Process(pid).status()
    assert "no experiment 999" in started.log.read_text()


@pytest.mark.model
def test_launch_starts_kvlab_tune_and_opens_its_page(store, tmp_path, monkeypatch):
    """A real launch: the tune is stored, `kvlab tune --drive ID` drives it in the background on the real
    model, and the page opens the tune's page at once; cancelling it ends the process."""
    monkeypatch.setenv("KVLAB_LOG_DIR", str(tmp_path / "logs"))
    at = open_page(NEW)
    at.segmented_control(key="f:mode").set_value("Tune").run()
    at.text_input(key="f:name").set_value("form-tune").run()
    at.text_input(key="f:tasks.0.context_lengths").set_value("128").run()
    at.text_input(key="f:tasks.0.depths").set_value("0.5").run()
    at.number_input(key="f:tasks.0.num_items").set_value(2).run()
    at.multiselect(key="f:tune.quant").set_value(["int4"]).run()
    at.multiselect(key="f:tune.evict").set_value(["none"]).run()
    assert metrics(at)["Full grid (item evaluations)"] == "4"  # int4 and the baseline on 2 items
    at.button(key="launch_tune").click().run(timeout=SAFETY_S)
    assert_clean(at)
    assert at.title[0].value == "Tune: form-tune" and "launched from the dashboard" in texts(at.caption)
    [experiment] = store.list_experiments()
    assert store.tune(experiment.id) is not None and experiment.spec["tune"]["quant"] == ["int4"]
    store.cancel_experiment(experiment.id)
    driving = ["--drive", str(experiment.id)]
    # this test's log directory tells its tune from another test's driving the same id in another store
    tuning = [p for p in psutil.process_iter(["cmdline", "environ"]) if (p.info["cmdline"] or [])[-2:] == driving
              and (p.info["environ"] or {}).get("KVLAB_LOG_DIR") == str(tmp_path / "logs")]
    assert len(tuning) == 1
    gone, alive = psutil.wait_procs(tuning, timeout=SAFETY_S)
    for process in alive:  # a tune that did not notice the cancellation fails the test, and is stopped
        process.kill()
    assert not alive
    [log] = (tmp_path / "logs").glob("tune-*.log")
    assert "cancelled" in log.read_text().splitlines()[-1]  # it says so, and ends
