"""The tune page through Streamlit's AppTest (the real app.py on a temporary store): what it reads from
a stored tune, and links that name no tune say so in one line, with no traceback.  The browser side
(charts drawn, exports, the live refresh) is tests/e2e/test_tune_page.py."""

from __future__ import annotations

import pytest

from tests.dashboard_data import populate
from tests.test_dashboard import assert_clean, open_page, store, texts  # noqa: F401 -- store: the fixture
from tests.tune_data import populate_tune

TUNE = "pages/view_tune.py"


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
    ({"id": "1"}, "Experiment #1 (synthetic-sweep) is not a tune"),
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
