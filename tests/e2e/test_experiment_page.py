"""The experiments list and the experiment page in a real browser (issue #38): a real `streamlit run app.py`
over a real SQLite store written through the Store API as workers write it (no model), Debian's chromium
through Playwright, in a browser whose time zone is Tokyo's.

* units: /new and the experiment page ask for the accuracy margin with one label, as one fraction;
* a sweet spot on 2 items says how few they are, and the items its margin needs;
* hiding a config leaves the verdict (and the Holm family) as it was, and says so;
* the list's rows link to their page (a tune's to /tune), say their kind, a tune's progress in trials, and
  the start times in the viewer's zone, named;
* a running experiment's tradeoff gains a config's point when its items land, with an estimate of the
  time left, and the tail of its worker's log follows the lines the worker writes;
* notes edited on the page are stored (a URL's password masked), shown after a reload, found by the list's
  search and exported;
* issue 47: a running experiment's page that flips to done logs no Streamlit warning (row 6); a running
  experiment is cancelled from its own page, asked first (row 7); an exported chart carries the page's
  few-items caveat (row 7).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvlab.core.experiment_spec import parse_spec
from kvlab.core.margin_inputs import MARGIN_FORMAT, MARGIN_INPUTS
from kvlab.dashboard import experiments_list, formatting, page_table
from kvlab.store import Store
from tests.dashboard_data import SPEC, item_result, populate
from tests.e2e.browsing import downloaded, wait_idle
from tests.e2e.dashboard_server import CHROMIUM, start_dashboard
from tests.tune_data import populate_tune
from tests.waiting import SAFETY_S

playwright = pytest.importorskip("playwright.sync_api", reason="playwright not installed: scripts/setup.sh --dev")
expect = playwright.expect

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                                  reason=f"no {CHROMIUM}: `apt-get install chromium`")]

ZONE = "Asia/Tokyo"
WORKER = "test-host:w0"  # the worker id tests.dashboard_data writes as
ENV = {"versions": {"kvlab": "test"}, "git_commit": "abc123", "hardware": {"cpu_count": 2}}
SECRET = "hunter2-secret"


@dataclass(frozen=True)
class Served:
    base: str
    store_url: str
    logs: Path
    sweep: int  # synthetic-sweep, done: 4 configs x 8 items, fidelity measured, max_drop 0.5
    two: int  # the same on 2 items at max_drop 0.05: a sweet spot by fidelity on too few items
    tune: int  # a running tune: 2 candidates proposed (and complete) of max_trials 4
    running: int  # a running sweep: the baseline and int4 have items, int2 and snapkv-50 none yet
    log: Path  # the dashboard's output (Streamlit logs its warnings there)


def _two_items(store: Store) -> int:
    experiment_id = store.create_experiment(parse_spec(SPEC | {"name": "two-items", "max_drop": 0.05}), ENV)
    for trial in store.claim_trials(WORKER, max_trials=4, experiment_id=experiment_id):
        store.set_items_total(trial.id, 2)
        for index in range(2):
            store.add_item_result(trial.id, item_result(trial.config_name, index, 256, 0.1, fidelity=True))
        store.finish_trial(trial.id, "done", worker_id=WORKER)
    return experiment_id


def _running(store: Store) -> int:
    experiment_id = store.create_experiment(parse_spec(SPEC | {"name": "running-sweep"}), ENV)
    for trial in store.claim_trials(WORKER, max_trials=4, experiment_id=experiment_id):
        store.set_items_total(trial.id, 8)
        if trial.config_name in ("baseline", "int4"):
            for index in range(4):
                store.add_item_result(trial.id, item_result(trial.config_name, index, 256, 0.1, fidelity=True))
    return experiment_id


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("experiment-page")
    url = f"sqlite:///{tmp / 'kvlab.sqlite'}"
    logs = tmp / "logs"
    logs.mkdir()
    with Store(url) as store:
        sweep = populate(store, fidelity=True)
        two = _two_items(store)
        tune = populate_tune(store, finish=False, names=("int8", "int4"))
        running = _running(store)
    (logs / "worker-1-0.log").write_text(
        f"2026-03-01 11:00:00,000 kvlab.experiments.worker INFO worker {WORKER} on {url}\n"
        "2026-03-01 11:00:01,000 kvlab.experiments.worker INFO the first line of the worker's own\n")
    process, base = start_dashboard(url, tmp / "streamlit.log", {"KVLAB_LOG_DIR": str(logs)})
    try:
        yield Served(base, url, logs, sweep, two, tune, running, tmp / "streamlit.log")
    finally:
        process.terminate()
        process.wait(timeout=SAFETY_S)


def _open(browser, url: str, width: int = 1400, downloads: bool = False):
    context = browser.new_context(viewport={"width": width, "height": 2400}, timezone_id=ZONE,
                                  accept_downloads=downloads)
    page = context.new_page()
    page.set_default_timeout(SAFETY_S * 1000)
    page.goto(url)
    wait_idle(page)
    return page


def _assert_clean(page) -> None:
    assert page.get_by_test_id("stException").count() == 0, page.get_by_test_id("stException").all_inner_texts()
    text = page.get_by_test_id("stMain").inner_text()
    assert "Traceback" not in text and "Something went wrong" not in text


def _experiment(server: Served, experiment_id: int, **params: str) -> str:
    query = "&".join(f"{key}={value}" for key, value in {"id": str(experiment_id), **params}.items())
    return f"{server.base}/{page_table.EXPERIMENT.url_path}?{query}"


def _verdict(page) -> str:
    main = page.get_by_test_id("stMain")
    spot = main.get_by_text(re.compile(r"^(Sweet spot|No sweet spot): ")).first
    spot.wait_for()
    return spot.inner_text().strip() + "\n" + main.get_by_text(re.compile(r"^Rule: ")).first.inner_text().strip()


def test_the_margin_reads_alike_on_the_form_and_the_experiment_page(server, browser):
    """The spec's default max_drop (0.05) on /new and an experiment at 0.05: the same label, the same number."""
    new = _open(browser, f"{server.base}/{page_table.NEW.url_path}")
    on_form = new.get_by_label(MARGIN_INPUTS["max_drop"].label, exact=True)
    expect(on_form).to_have_value(MARGIN_FORMAT % 0.05)
    page = _open(browser, _experiment(server, server.two))
    page.get_by_role("button", name="Configs and margin").click()  # a popover: drawn when opened
    expect(page.get_by_label(MARGIN_INPUTS["max_drop"].label, exact=True)).to_have_value(MARGIN_FORMAT % 0.05)
    assert "MB" not in re.findall(r"\bMB\b", page.get_by_test_id("stMain").inner_text())
    expect(page.get_by_test_id("stMain").get_by_text(re.compile(r"^Sweet spot: .* MiB\), decided by"))).to_be_visible()
    _assert_clean(page)
    new.context.close()
    page.context.close()


def test_a_sweet_spot_on_two_items_says_how_few_they_are(server, browser):
    page = _open(browser, _experiment(server, server.two))
    assert _verdict(page).startswith("Sweet spot: int4")
    warning = page.get_by_test_id("stAlertContentWarning").filter(has_text="Few items")
    expect(warning).to_contain_text(re.compile(r"rests on 2 items; the margin of 0\.05 needs about \d+"))
    needed = int(re.search(r"needs about (\d+)", warning.inner_text())[1])
    assert needed > 2
    page.context.close()


def test_hiding_a_config_leaves_the_verdict(server, browser):
    page = _open(browser, _experiment(server, server.sweep))
    before = _verdict(page)
    page.get_by_role("button", name="Configs and margin").click()  # a popover: drawn when opened
    expect(page.get_by_text("Hiding is display only")).to_be_visible()
    page.get_by_test_id("stMultiSelect").filter(has=page.get_by_text("Hide configs", exact=True)).click()
    page.get_by_role("option", name="int2", exact=True).click()
    page.keyboard.press("Escape")
    wait_idle(page)
    expect(page.get_by_test_id("stSidebar").locator(".st-key-share-link code")).to_contain_text("hide=int2")
    assert _verdict(page) == before and "across 3 configs" in before  # the family is every config still
    page.context.close()


def _cells(page) -> list[list[str]]:
    """The experiments table's rows, its header first, as its grid tells assistive technology (the grid
    draws on a canvas; this table beside it holds the cells in view, so the page is made wide enough)."""
    grid = page.get_by_test_id("stDataFrame").locator("table[role=grid]")
    grid.locator("td").first.wait_for(state="attached")
    return [[cell.text_content() or "" for cell in row.locator("th, td").all()] for row in grid.locator("tr").all()]


def test_the_list_links_each_row_to_its_page_with_kind_progress_and_zone(server, browser):
    page = _open(browser, f"{server.base}/{page_table.EXPERIMENTS.url_path}", width=3200)
    header, *rows = _cells(page)
    by_id = {int(re.search(r"id=(\d+)$", row[0])[1]): dict(zip(header, row, strict=True)) for row in rows}
    assert by_id[server.tune]["id"] == f"{page_table.TUNE.url_path}?id={server.tune}"
    assert by_id[server.two]["id"] == f"{page_table.EXPERIMENT.url_path}?id={server.two}"
    assert by_id[server.tune]["kind"] == "tune" and by_id[server.sweep]["kind"] == "sweep"
    assert by_id[server.tune]["trials"] == "2 of 4 trials done"  # int8 and int4 complete; as the tune page counts
    assert by_id[server.sweep]["sweet spot"] == "int4" and float(by_id[server.sweep]["best ratio held (x)"]) == 3.7
    started = experiments_list.started_column(ZONE)
    assert started in header
    with Store(server.store_url) as store:
        first_claim = store.get_experiment(server.sweep).started_at
    assert by_id[server.sweep][started] == formatting.fmt_time(first_claim, formatting.viewer_zone(ZONE)[0])
    assert (formatting.fmt_time(first_claim, formatting.viewer_zone(ZONE)[0])
            != formatting.fmt_time(first_claim))  # not UTC's
    # a click on a row's id opens its page in a new tab: the tune's on /tune
    order = [int(re.search(r"id=(\d+)$", row[0])[1]) for row in rows]
    box = page.get_by_test_id("stDataFrame").bounding_box()
    row_height = 35  # Streamlit's dataframe rows, the header's too
    for experiment_id, heading in ((server.tune, "Tune: synthetic-tune"), (server.two, "two-items")):
        y = box["y"] + row_height * (1 + order.index(experiment_id)) + row_height / 2
        page.mouse.move(box["x"] + 11, y)  # the grid finds the link under the pointer on hover
        with page.context.expect_page() as opened:
            page.mouse.click(box["x"] + 11, y)
        tab = opened.value
        tab.get_by_test_id("stMain").get_by_role("heading", name=heading).wait_for()
        tab.close()
    page.context.close()


def test_a_running_experiment_draws_what_lands_with_its_eta_and_log(server, browser):
    page = _open(browser, _experiment(server, server.running, tab="Tradeoff"))
    main = page.get_by_test_id("stMain")
    expect(main.get_by_text(re.compile(r"^Still running: these are the results so far"))).to_be_visible()
    chart = main.locator(".js-plotly-plot").first
    expect(chart.locator("text", has_text="int4").first).to_be_attached()
    assert chart.locator("text", has_text="int2").count() == 0
    progress = main.get_by_test_id("stProgress")
    expect(progress).to_contain_text(re.compile(r"since it was queued · about .* left for 24 evaluations "
                                                r"\(an estimate from this run's own pace"))
    with Store(server.store_url) as store:  # int2's first items land, as its worker writes them
        int2 = next(t for t in store.trials(server.running) if t.config_name == "int2")
        for index in range(4):
            store.add_item_result(int2.id, item_result("int2", index, 256, 0.1, fidelity=True))
    expect(chart.locator("text", has_text="int2").first).to_be_attached()  # the page reran when they landed
    expect(progress).to_contain_text("left for 20 evaluations")

    page.get_by_test_id("stButtonGroup").get_by_role("radio", name="Progress", exact=True).click()
    wait_idle(page)
    expect(main.get_by_text("the first line of the worker's own")).to_be_visible()
    with (server.logs / "worker-1-0.log").open("a") as log:  # the worker goes on writing
        log.write(f"2026-03-01 11:00:02,000 kvlab.experiments.worker INFO a line from postgresql://kv:{SECRET}@db\n")
    expect(main.get_by_text(re.compile("a line from postgresql://"))).to_be_visible()
    assert SECRET not in main.inner_text()
    expect(main.get_by_text(re.compile(r"^Time: .* since it was queued: queued"))).to_be_visible()
    _assert_clean(page)
    page.context.close()


def test_notes_are_edited_stored_shown_searched_and_exported(server, browser):
    page = _open(browser, _experiment(server, server.two, tab="Export"), downloads=True)
    main = page.get_by_test_id("stMain")
    main.get_by_role("button", name="Add notes").click()  # a popover: its body is drawn outside the main block
    note = f"int4 holds on two items only; mirror at postgresql://kv:{SECRET}@db.example/kv"
    page.get_by_label("Notes", exact=True).fill(note)
    page.get_by_role("button", name="Save notes").click()
    wait_idle(page)
    expect(main.get_by_text("Notes saved; a secret in them was masked.")).to_be_visible()
    with Store(server.store_url) as store:
        stored = store.get_experiment(server.two).notes
    assert stored.startswith("int4 holds on two items only") and SECRET not in stored

    page.reload()
    wait_idle(page)
    expect(main.get_by_text(re.compile(r"^Notes: int4 holds on two items only"))).to_be_visible()
    download = downloaded(page, main.get_by_role("button", name="Everything (JSON)"))
    document = json.loads(Path(download.path()).read_text())
    assert document["experiment"]["notes"] == stored
    download = downloaded(page, main.get_by_role("button", name="HTML report"))
    report = Path(download.path()).read_text()
    assert "int4 holds on two items only" in report and SECRET not in report
    page.context.close()

    listed = _open(browser, f"{server.base}/{page_table.EXPERIMENTS.url_path}?q=two+items+only", width=3200)
    header, *rows = _cells(listed)
    assert [dict(zip(header, row, strict=True))["name"] for row in rows] == ["two-items"]
    assert dict(zip(header, rows[0], strict=True))["notes"].startswith("int4 holds on two items only")
    listed.context.close()


#: Streamlit's warning (with a stack trace) for a widget given a default and a Session State value (issue 47 row 6).
STATE_WARNING = "was created with a default value but also had its value set via the Session State API"


def _finish(store_url: str, experiment_id: int) -> None:
    """Every trial's items land and the trials end, as its worker finishes them."""
    with Store(store_url) as store:
        for trial in store.trials(experiment_id):
            for index in range(trial.items_done, 8):
                store.add_item_result(trial.id, item_result(trial.config_name, index, 256, 0.1, fidelity=True))
            store.finish_trial(trial.id, "done", worker_id=WORKER)


def test_a_running_page_that_flips_to_done_logs_no_widget_warning(server, browser):
    with Store(server.store_url) as store:
        experiment_id = _running(store)
    page = _open(browser, _experiment(server, experiment_id))
    main = page.get_by_test_id("stMain")
    expect(page.get_by_test_id("stButtonGroup").get_by_role("radio", name="Progress", exact=True)).to_have_attribute(
        "aria-checked", "true")
    _finish(server.store_url, experiment_id)
    expect(main.get_by_text(re.compile(r"^(Sweet spot|No sweet spot): ")).first).to_be_visible()  # flipped
    expect(page.get_by_test_id("stButtonGroup").get_by_role("radio", name="Tradeoff", exact=True)).to_have_attribute(
        "aria-checked", "true")
    wait_idle(page)
    _assert_clean(page)
    assert STATE_WARNING not in server.log.read_text(errors="replace")
    page.context.close()


def test_a_running_experiment_is_cancelled_from_its_own_page_after_asking(server, browser):
    with Store(server.store_url) as store:
        experiment_id = _running(store)
    page = _open(browser, _experiment(server, experiment_id))
    main = page.get_by_test_id("stMain")
    main.get_by_role("button", name="Cancel").click()
    wait_idle(page)
    expect(main.get_by_text(f"Cancel experiment #{experiment_id}? Their queued and running trials stop; results "
                            "already stored are kept.")).to_be_visible()
    with Store(server.store_url) as store:
        assert store.get_experiment(experiment_id).status == "running"  # asked, not done yet
    main.get_by_role("button", name="Yes, cancel").click()
    expect(main.get_by_text(f"Experiment {experiment_id}: 4 trial(s) cancelled.")).to_be_visible()
    with Store(server.store_url) as store:
        assert store.get_experiment(experiment_id).status == "cancelled"
    expect(main.get_by_role("button", name="Cancel")).to_have_count(0)  # nothing left to cancel
    _assert_clean(page)
    page.context.close()


def test_an_exported_chart_carries_the_few_items_caveat(server, browser):
    page = _open(browser, _experiment(server, server.two), downloads=True)
    main = page.get_by_test_id("stMain")
    expect(main.get_by_test_id("stAlertContentWarning").filter(has_text="Few items")).to_contain_text(
        "Few items: this sweet spot rests on 2 items")  # the page's caveat
    download = downloaded(page, main.get_by_role("button", name="SVG").first)
    svg = Path(download.path()).read_text()
    assert "Few items: this sweet spot rests on 2 items" in svg
    download = downloaded(page, main.get_by_role("button", name="HTML", exact=True).first)
    assert "Few items: this sweet spot rests on 2 items" in Path(download.path()).read_text()
    page.context.close()
