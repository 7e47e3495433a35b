"""The tune page in a real browser: a real `streamlit run app.py` over a store holding a finished and a
running tune (written through the Store API as the driver and workers write them; no model), Debian's
chromium driven by Playwright.  The page must draw the Pareto front and the hypervolume charts, the
candidates stopped early with their reasons, and the recommendation with its `kvlab serve` command --
with no dialog and no traceback; the running tune shows its current best instead."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from kvlab.dashboard import page_table
from kvlab.store import Store
from tests.e2e.dashboard_server import CHROMIUM, start_dashboard
from tests.tune_data import CANDIDATES, populate_tune
from tests.waiting import SAFETY_S

playwright = pytest.importorskip("playwright.sync_api", reason="playwright not installed: scripts/setup.sh --dev")
expect = playwright.expect

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                                  reason=f"no {CHROMIUM}: `apt-get install chromium`")]


class Served(NamedTuple):
    base: str  # the dashboard's URL
    store_url: str
    done: int  # the finished tune's experiment id
    running: int


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("tune-page")
    url = f"sqlite:///{tmp / 'kvlab.sqlite'}"
    with Store(url) as store:
        done, running = populate_tune(store), populate_tune(store, finish=False)
    process, base = start_dashboard(url, tmp / "streamlit.log")
    try:
        yield Served(base, url, done, running)
    finally:
        process.terminate()
        process.wait(timeout=SAFETY_S)


def _open(browser, url: str):
    context = browser.new_context(viewport={"width": 1400, "height": 2600}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(SAFETY_S * 1000)
    page.goto(url)
    page.locator("[data-testid=stApp][data-test-script-state=notRunning]").wait_for()
    return context, page


def _assert_clean(page) -> None:
    assert page.locator("[role=dialog]").count() == 0, page.locator("[role=dialog]").all_inner_texts()
    assert page.get_by_test_id("stException").count() == 0, page.get_by_test_id("stException").all_inner_texts()
    text = page.get_by_test_id("stMain").inner_text()
    assert "Traceback" not in text and "Something went wrong" not in text


def test_a_finished_tune_shows_its_front_stopped_candidates_and_recommendation(server, browser):
    base, _, done, _ = server
    context, page = _open(browser, f"{base}/{page_table.TUNE.url_path}?id={done}")
    try:
        main = page.get_by_test_id("stMain")
        main.get_by_role("heading", name="Tune: synthetic-tune").wait_for()
        # both charts drawn by plotly.js: the front with its four candidates, the baseline and the front line
        expect(main.locator(".js-plotly-plot .main-svg").first).to_be_visible()
        expect(main.locator(".js-plotly-plot")).to_have_count(2)
        expect(main.locator(".gtitle", has_text="Pareto front so far")).to_have_count(1)
        expect(main.locator(".gtitle", has_text="Hypervolume over trials")).to_have_count(1)
        assert main.locator(".js-plotly-plot").first.locator(".legendtext", has_text="stopped early").count() == 1
        # the stopped candidates, with the judge's reasons, in the candidates table
        table = main.get_by_test_id("stTable")
        int2 = table.locator("tr", has_text=CANDIDATES["int2"][0].label)
        expect(int2).to_contain_text("stopped")
        expect(int2).to_contain_text(re.compile(r"clearly inferior after 4 items: accuracy difference \[-1\.000, "))
        expect(table.locator("tr", has_text="snapkv:r0.5")).to_contain_text("not promoted")
        expect(table.locator("tr", has_text="int4/g64/r64")).to_contain_text("complete")
        # the recommendation: config, bytes, interval, how to deploy it
        expect(main.get_by_test_id("stAlertContentSuccess")).to_contain_text(re.compile(
            r"Recommended: int4/g64/r64: 1\.593 MB KV per item .* "
            r"difference -0\.050 \[-0\.236, \+0\.116\] on 20 items"))
        expect(main.locator("code").filter(has_text="kvlab serve --model smollm2-135m --quant int4 "
                                                    "--group-size 64 --residual-length 64")).to_have_count(1)
        expect(main.get_by_text(re.compile(r"vLLM: vLLM has no equivalent of int4"))).to_be_visible()
        expect(main.get_by_test_id("stText").filter(has_text='quant = "int4"')).to_have_count(1)
        expect(main.get_by_test_id("stMetric").filter(has_text="Item evaluations used")).to_contain_text("68")
        # exports: the front as SVG (rendered by kaleido), the candidates as CSV
        with page.expect_download() as download:
            main.get_by_role("button", name="SVG").first.click()
        svg = Path(download.value.path()).read_text()
        assert svg.startswith("<svg") and "Pareto front so far" in svg and download.value.suggested_filename.endswith(
            "-front.svg")
        with page.expect_download() as download:
            main.get_by_role("button", name="Candidates (CSV)").click()
        lines = Path(download.value.path()).read_text().splitlines()
        assert lines[0].startswith("label,trial,state,rung/items") and len(lines) == 1 + len(CANDIDATES)
        # the share link carries the view
        main.get_by_test_id("stButtonGroup").get_by_role("radio", name="stopped", exact=True).click()
        expect(page.get_by_test_id("stSidebar").locator(".st-key-share-link code")).to_contain_text(
            f"/{page_table.TUNE.url_path}?id={done}&show=stopped")
        expect(main.get_by_test_id("stTable").locator("tbody tr")).to_have_count(2)
        _assert_clean(page)
    finally:
        context.close()


def test_a_running_tune_updates_live_and_its_experiment_links_here(server, browser):
    base, store_url, done, running = server
    context, page = _open(browser, f"{base}/{page_table.TUNE.url_path}?id={running}")
    try:
        main = page.get_by_test_id("stMain")
        expect(main.get_by_test_id("stAlertContentInfo")).to_contain_text(
            "Current best so far (the tune is running): int4/g64/r64")
        snapkv = main.get_by_test_id("stTable").locator("tr", has_text="snapkv:r0.5")
        expect(snapkv).to_contain_text("active")
        _assert_clean(page)
        # the driver's next verdicts reach the open page without a reload
        with Store(store_url) as store:
            [waiting] = [c for c in store.candidates(running) if c.state == "active" and c.number is not None]
            store.judge_candidate(waiting.trial_id, state="stopped", reason="not promoted: the search ended")
            expect(snapkv).to_contain_text("not promoted: the search ended")
            store.finish_tune(running, "done", store.tune(done).recommendation, None)
        expect(main.get_by_test_id("stAlertContentSuccess")).to_contain_text("Recommended: int4/g64/r64")
        _assert_clean(page)
        page.goto(f"{base}/{page_table.EXPERIMENT.url_path}?id={running}")
        page.locator("[data-testid=stApp][data-test-script-state=notRunning]").wait_for()
        page.get_by_test_id("stMain").get_by_role("link", name=re.compile("A tune")).click()
        page.get_by_test_id("stMain").get_by_role("heading", name="Tune: synthetic-tune").wait_for()
        assert f"id={running}" in page.url
        _assert_clean(page)
    finally:
        context.close()
