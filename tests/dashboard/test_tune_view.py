"""The tune page through Streamlit's AppTest (the real app.py on a temporary store): what it reads from
a stored tune, and links that name no tune say so in one line, with no traceback.  The browser side
(charts drawn, exports, the live refresh) is tests/e2e/test_tune_page.py."""

from __future__ import annotations

import pytest

from kvlab.core.experiment_spec import parse_spec
from kvlab.dashboard import page_table
from kvlab.dashboard.tune_launch import record_launch
from tests.dashboard.test_dashboard import assert_clean, open_page, store, texts  # noqa: F401 -- store: the fixture
from tests.dashboard_data import populate
from tests.tune_data import SPEC, populate_tune

TUNE = page_table.TUNE.script


def test_the_tune_page_reads_the_stored_tune(store):
    populate_tune(store)
    at = open_page(TUNE, id="1")
    assert_clean(at)
    assert at.title[0].value == "Tune: synthetic-tune"
    metrics = {m.label: m.value for m in at.metric}
    # 5 trials: baseline 20 + int8 20 + int4 20 + int2 4 + snapkv 4 = 68 of (11 + 1) x 20 = 240
    assert metrics["Item evaluations used"] == "68" and metrics["Full grid"] == "240"
    assert metrics["Candidates"] == "4"
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
    row = at.dataframe[0].value.set_index("id").loc[tune_id]
    assert row["started"] != "-" and row["duration"] != "-"
