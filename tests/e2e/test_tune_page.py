"""The tune page in a real browser: a real `streamlit run app.py` over a store holding finished and
running tunes (written through the Store API as the driver and workers write them, with their Optuna
study beside the store; no model), Debian's chromium driven by Playwright.  The page must draw the
Pareto front and the hypervolume charts, the parameters' importance and a slice plot, the candidates
stopped early with their reasons, and the recommendation with its `kvlab serve` command -- with no
dialog and no traceback; a running tune shows its current best, its trials done of max_trials with
an estimate of the time left, gains the trials written meanwhile, and is cancelled by its Cancel."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from kvlab.core.units import MIB
from kvlab.dashboard import page_table
from kvlab.store import Store
from tests.e2e.browsing import downloaded, wait_idle
from tests.e2e.dashboard_server import CHROMIUM, start_dashboard
from tests.tune_data import BASELINE_BYTES, CANDIDATES, FIRST_ROUND, SPEC, populate_tune
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
    to_cancel: int  # running, for the Cancel test
    growing: int  # running, three of its four trials proposed: the test writes the fourth
    single: int  # finished with one candidate


#: The candidates of the tune the test grows by one while its page is open.
FIRST_THREE = ("int8", "int4", "int2")


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("tune-page")
    url = f"sqlite:///{tmp / 'kvlab.sqlite'}"
    with Store(url) as store:
        tunes = (populate_tune(store), populate_tune(store, finish=False), populate_tune(store, finish=False),
                 populate_tune(store, finish=False, names=FIRST_THREE), populate_tune(store, names=("int8",)))
    process, base = start_dashboard(url, tmp / "streamlit.log")
    try:
        yield Served(base, url, *tunes)
    finally:
        process.terminate()
        process.wait(timeout=SAFETY_S)


def _open(browser, url: str):
    context = browser.new_context(viewport={"width": 1400, "height": 2600}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(SAFETY_S * 1000)
    page.goto(url)
    wait_idle(page, after_input=False)
    return context, page


def _assert_clean(page) -> None:
    assert page.locator("[role=dialog]").count() == 0, page.locator("[role=dialog]").all_inner_texts()
    assert page.get_by_test_id("stException").count() == 0, page.get_by_test_id("stException").all_inner_texts()
    text = page.get_by_test_id("stMain").inner_text()
    assert "Traceback" not in text and "Something went wrong" not in text


def test_a_finished_tune_shows_its_front_stopped_candidates_and_recommendation(server, browser):
    base, done = server.base, server.done
    context, page = _open(browser, f"{base}/{page_table.TUNE.url_path}?id={done}")
    try:
        main = page.get_by_test_id("stMain")
        main.get_by_role("heading", name="Tune: synthetic-tune").wait_for()
        # both charts drawn by plotly.js: the front with its four candidates, the baseline and the front line
        expect(main.locator(".js-plotly-plot .main-svg").first).to_be_visible()
        expect(main.locator(".js-plotly-plot")).to_have_count(2)  # front, hypervolume (section Parameters: the others)
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
        int4_mib = BASELINE_BYTES * CANDIDATES["int4"][1] / MIB
        expect(main.get_by_test_id("stAlertContentSuccess")).to_contain_text(re.compile(
            rf"Recommended: int4/g64/r64: {int4_mib:.3f} MiB KV per item .* "
            r"difference -0\.050 \[-0\.236, \+0\.116\] on 20 items"))
        expect(main.locator("code").filter(has_text="kvlab serve --model smollm2-135m --quant int4 "
                                                    "--group-size 64 --residual-length 64")).to_have_count(1)
        expect(main.get_by_text(re.compile(r"vLLM: vLLM has no equivalent of int4"))).to_be_visible()
        expect(main.get_by_test_id("stText").filter(has_text='quant = "int4"')).to_have_count(1)
        expect(main.get_by_test_id("stMetric").filter(has_text="Item evaluations used")).to_contain_text("68")
        # exports: the front as SVG (rendered by kaleido), the candidates as CSV
        download = downloaded(page, main.get_by_role("button", name="SVG").first)
        svg = Path(download.path()).read_text()
        assert svg.startswith("<svg") and "Pareto front so far" in svg and download.suggested_filename.endswith(
            "-front.svg")
        download = downloaded(page, main.get_by_role("button", name="Candidates (CSV)"))
        lines = Path(download.path()).read_text().splitlines()
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
    base, store_url, done, running = server.base, server.store_url, server.done, server.running
    context, page = _open(browser, f"{base}/{page_table.TUNE.url_path}?id={running}")
    try:
        main = page.get_by_test_id("stMain")
        expect(main.get_by_test_id("stAlertContentInfo").filter(has_text="Current best so far")).to_contain_text(
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
        wait_idle(page, after_input=False)
        page.get_by_test_id("stMain").get_by_role("link", name=re.compile("A tune")).click()
        page.get_by_test_id("stMain").get_by_role("heading", name="Tune: synthetic-tune").wait_for()
        assert f"id={running}" in page.url
        _assert_clean(page)
    finally:
        context.close()


def _progress(page):
    return page.get_by_test_id("stMain").get_by_test_id("stProgress")


def test_cancel_asks_first_then_cancels_the_running_tune(server, browser):
    base, store_url, tune_id = server.base, server.store_url, server.to_cancel
    context, page = _open(browser, f"{base}/{page_table.TUNE.url_path}?id={tune_id}")
    try:
        main = page.get_by_test_id("stMain")
        main.get_by_role("button", name="Cancel tune").click()  # opens the confirmation only
        confirm = page.get_by_role("button", name=f"Yes, cancel tune #{tune_id}")
        expect(confirm).to_be_visible()
        with Store(store_url) as store:
            assert store.tune(tune_id).state == "running"
            confirm.click()
            expect(main.get_by_test_id("stAlertContentSuccess")).to_contain_text(f"Tune #{tune_id} cancelled")
            assert store.tune(tune_id).state == "cancelled" and store.get_experiment(tune_id).status == "cancelled"
            assert len(store.candidates(tune_id)) == 1 + len(CANDIDATES)  # the baseline's and every candidate's stay
        expect(main.get_by_test_id("stMetric").filter(has_text="Tune")).to_contain_text("cancelled")
        expect(main.get_by_test_id("stAlertContentWarning")).to_contain_text(
            "No recommendation: the tune was cancelled before its search finished")
        expect(main.get_by_test_id("stAlertContentInfo").filter(has_text="Partial")).to_contain_text(
            "Partial (the tune was cancelled: not its answer): the best of the candidates judged on every item "
            "before it ended: int4/g64/r64")
        expect(_progress(page)).to_contain_text("unfinished")
        expect(_progress(page)).not_to_contain_text("active")
        expect(main.get_by_role("button", name="Cancel tune")).to_have_count(0)
        _assert_clean(page)
    finally:
        context.close()


def test_progress_counts_trials_and_the_page_gains_a_trial_written_meanwhile(server, browser):
    base, store_url, tune_id = server.base, server.store_url, server.growing
    max_trials = SPEC["tune"]["max_trials"]
    context, page = _open(browser, f"{base}/{page_table.TUNE.url_path}?id={tune_id}")
    try:
        main = page.get_by_test_id("stMain")
        progress = _progress(page)
        expect(progress).to_contain_text(f"{len(FIRST_THREE)} of {max_trials} trials done")
        expect(progress).to_contain_text("left (an estimate:")
        assert "%" not in progress.inner_text()
        table = main.get_by_test_id("stTable")
        expect(table.locator("tbody tr")).to_have_count(len(FIRST_THREE))
        snapkv = CANDIDATES["snapkv"][0]
        with Store(store_url) as store:  # the driver's next proposal, while the page is open
            [trial_id] = store.add_candidates(tune_id, [(snapkv, len(FIRST_THREE))], FIRST_ROUND)
            expect(table.locator("tbody tr")).to_have_count(len(FIRST_THREE) + 1)
            expect(table.locator("tr", has_text=snapkv.label)).to_contain_text("active")
            expect(progress).to_contain_text(f"{len(FIRST_THREE)} of {max_trials} trials done · 1 active")
            store.judge_candidate(trial_id, state="stopped", reason="not promoted: the search ended")
            expect(progress).to_contain_text(f"{max_trials} of {max_trials} trials done")
        _assert_clean(page)
    finally:
        context.close()


def test_the_page_speaks_mib_and_never_mb(server, browser):
    context, page = _open(browser, f"{server.base}/{page_table.TUNE.url_path}?id={server.done}")
    try:
        main = page.get_by_test_id("stMain")
        expect(main.get_by_test_id("stTable")).to_contain_text("KV (MiB)")
        main.locator(".js-plotly-plot .xtitle", has_text="MiB per item").wait_for()
        text = main.inner_text()
        assert "MiB KV per item" in text and not re.search(r"\bMB\b", text)
        assert re.search(r"max_drop 0\.25\b", text) and "points" not in text  # margins as fractions, as the spec
        _assert_clean(page)
    finally:
        context.close()


def test_importance_and_slice_plot_follow_the_metric_and_export(server, browser):
    base = server.base
    context, page = _open(browser, f"{base}/{page_table.TUNE.url_path}?id={server.done}")
    try:
        main = page.get_by_test_id("stMain")
        expect(main.locator(".gtitle", has_text="Pareto front so far")).to_have_count(1)
        expect(main.get_by_test_id("stSelectbox").filter(has_text="Metric").locator("input")).to_be_disabled()
        main.get_by_role("radio", name="Parameters", exact=True).click()
        importance = main.locator(".js-plotly-plot", has=page.locator(".gtitle", has_text="Parameter importance"))
        expect(importance.locator(".gtitle")).to_contain_text("compression ratio held")
        expect(importance.locator(".ytick", has_text="quant")).to_have_count(1)
        expect(importance.locator(".ytick", has_text="evict")).to_have_count(1)
        slice_plot = main.locator(".js-plotly-plot", has=page.locator(".gtitle", has_text="Slice plot"))
        expect(slice_plot.locator(".xtitle", has_text="quant")).to_have_count(1)
        expect(slice_plot.locator(".scatterlayer .point")).to_have_count(2 * len(CANDIDATES))  # quant and evict panels
        expect(main.locator(".js-plotly-plot")).to_have_count(2)  # the search's front and hypervolume are not drawn
        main.get_by_test_id("stSelectbox").filter(has_text="Metric").click()
        page.get_by_role("option", name="accuracy diff").click()
        expect(slice_plot.locator(".gtitle")).to_contain_text("accuracy difference vs baseline")
        expect(page.get_by_test_id("stSidebar").locator(".st-key-share-link code")).to_contain_text(
            "section=Parameters&metric=accuracy+diff")
        download = downloaded(page, main.locator(".st-key-tune-slice-html button"))
        html = Path(download.path()).read_text()
        assert "accuracy difference vs baseline" in html and download.suggested_filename.endswith("-slice.html")
        _assert_clean(page)
    finally:
        context.close()


def test_one_trial_says_why_there_is_no_importance_or_slice(server, browser):
    context, page = _open(browser, f"{server.base}/{page_table.TUNE.url_path}?id={server.single}&section=Parameters")
    try:
        main = page.get_by_test_id("stMain")
        expect(main.get_by_test_id("stAlertContentInfo").filter(has_text="Parameter importance: not computed")
               ).to_contain_text("needs at least 2")
        expect(main.get_by_test_id("stAlertContentInfo").filter(has_text="Slice plot")).to_contain_text(
            "no parameter varies among the 1 candidate")
        expect(main.locator(".js-plotly-plot")).to_have_count(0)  # neither chart; the search's are in its section
        _assert_clean(page)
    finally:
        context.close()
