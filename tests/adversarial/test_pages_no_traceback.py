"""Issue 9: no dashboard page shows a Python traceback.  Links with ids that are not ids say so;
an unexpected error is one line on the page whose traceback is in the dashboard's log;
``KVLAB_DEBUG=1`` re-raises it to Streamlit instead.  Streamlit's AppTest runs the real app.py."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kvlab.dashboard import formatting, page_table
from kvlab.store import Store
from tests.dashboard_data import populate
from tests.tune_data import populate_tune
from tests.waiting import SAFETY_S

APP = str(Path(__file__).resolve().parents[2] / "app.py")
LIST, NEW, VIEW, COMPARE, DOCTOR, TUNE = (page.script for page in (
    page_table.EXPERIMENTS, page_table.NEW, page_table.EXPERIMENT, page_table.COMPARE, page_table.DOCTOR,
    page_table.TUNE))
HUGE = "9" * 30  # beyond any database integer


@pytest.fixture
def db(tmp_path, monkeypatch) -> Path:
    """A store with one finished experiment; KVLAB_HOME (where logs go) in tmp_path; no KVLAB_DEBUG."""
    path = tmp_path / "kvlab.sqlite"
    monkeypatch.setenv("KVLAB_DATABASE_URL", f"sqlite:///{path}")
    monkeypatch.setenv("KVLAB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KVLAB_DEBUG", raising=False)
    with Store(f"sqlite:///{path}") as store:
        populate(store)
    return path


def open_page(page: str, params: dict[str, str | list[str]] | None = None) -> AppTest:
    """As a shared link opens it: app.py first (st.navigation), then the page with the link's params."""
    at = AppTest.from_file(APP, default_timeout=SAFETY_S)
    for key, value in (params or {}).items():
        at.query_params[key] = value
    at.run()
    if page != LIST:
        at.switch_page(page).run()
    return at


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


@pytest.mark.parametrize("page, params, warning", [
    (VIEW, {"id": "abc"}, "The link's id 'abc' is not an experiment id"),
    (VIEW, {"id": HUGE}, f"The link's id '{HUGE}' is not an experiment id"),
    (VIEW, {"id": "1", "tab": "nope", "x": "nope", "hide": "nope", "needle": "nope"}, None),
    (COMPARE, {"ids": "x"}, "Ignored in the link's ids: 'x'"),
    (COMPARE, {"ids": ["1", HUGE, "-2"]}, f"Ignored in the link's ids: '{HUGE}', '-2'"),
    (LIST, {"page": "abc", "status": "nope", "sort": "nope"}, None),
    (LIST, {"page": "-3"}, None),
    (LIST, {"page": HUGE}, None),
    (NEW, {"model": "nope", "spec": "../../etc/passwd"}, None),
    (DOCTOR, {"base_url": "nope"}, None),
])
def test_odd_links_never_show_a_traceback(db, page, params, warning):
    at = open_page(page, params)
    assert not at.exception, texts(at.exception)
    assert "Something went wrong" not in texts(at.error), texts(at.error)
    if warning:
        assert warning in texts(at.warning), texts(at.warning)


def test_an_experiment_that_does_not_exist(db):
    at = open_page(VIEW, {"id": "99999"})
    assert not at.exception
    assert "no experiment 99999" in texts(at.error) and "Something went wrong" not in texts(at.error)


def test_an_unexpected_error_is_one_line_and_logged(db, tmp_path, monkeypatch):
    """A damaged stored value (invalid JSON) is an error no message anticipates."""
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE experiments SET tags = '{not json'")
    at = open_page(LIST)
    assert not at.exception, texts(at.exception)
    log = tmp_path / "home" / "logs" / "kvlab-dashboard.log"
    [message] = [e.value for e in at.error]
    assert message.startswith("Something went wrong on this page (JSONDecodeError: ")
    assert message.endswith(f"The details are in {log}.") and "\n" not in message
    assert "Traceback (most recent call last)" in log.read_text()

    monkeypatch.setenv("KVLAB_DEBUG", "1")  # re-raised to Streamlit, which logs it (and shows it with
    at = open_page(LIST)                    # client.showErrorDetails = "full")
    assert at.exception and not at.error


#: A name as anyone who can queue into a shared store may write it: a Markdown link and colour, an HTML link.
MARKUP = '[x](http://e.x) <a href="http://e.x">a</a> :red[b]'
_LIVE_MARKUP = re.compile(r"(?<!\\)(\]\(|:red\[|<a href)")  # a link, colour or HTML that would render


def test_names_with_markup_are_shown_as_text_on_every_page(db):
    """Experiment, tag and config names from the store are literal text on the pages: no link, no
    image, no colour (the figures' text is tests/dashboard/test_charts.py's)."""
    with Store(f"sqlite:///{db}") as store:
        populate(store, name=MARKUP)  # experiment 2
        populate_tune(store)  # experiment 3
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE experiments SET tags = ? WHERE id = 2", (json.dumps([MARKUP]),))
        for table in ("trials", "item_results"):
            connection.execute(f"UPDATE {table} SET config_name = ? "  # noqa: S608
                               "WHERE config_name IN ('int4', 'int4/g64/r64')", (MARKUP,))  # the tune's int4 too
    pages = [(VIEW, {"id": "2", "tab": section}) for section in ("Tradeoff", "Needles", "Failed items", "Export")]
    pages += [(LIST, {}), (COMPARE, {"ids": ["1", "2"]}), (TUNE, {"id": "3"})]
    for page, params in pages:
        at = open_page(page, params)
        assert not at.exception, texts(at.exception)
        shown = "\n".join(texts(at.get(kind)) for kind in ("title", "caption", "markdown", "success", "info",
                                                           "warning", "error", "subheader", "header"))
        shown += "".join(table.value.to_csv() for table in at.table)  # st.table's cells are Markdown too
        assert not _LIVE_MARKUP.search(shown), (page, params, shown)
        if page == TUNE:
            assert formatting.md(MARKUP) in list(at.table[0].value["label"])
        if page == VIEW:
            assert at.title[0].value == formatting.md(MARKUP)
            assert formatting.md(MARKUP) in texts(at.caption)  # its tags
    at = open_page(VIEW, {"id": "2"})
    assert f"Sweet spot: **{formatting.md(MARKUP)}**" in texts(at.success)  # the renamed int4 is the sweet spot
