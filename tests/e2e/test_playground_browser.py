"""The playground in a real browser, on a fresh dashboard that starts its own `kvlab serve` on the first Run:
a share link opened, Run, the answers marked, the token maps with the needle boxed (StreamingLLM at 75% keeps
none of it), then Save as experiment and Launch."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest

from kvlab.dashboard import page_table
from kvlab.dashboard.playground import config_text
from kvlab.store import Store
from tests.e2e.dashboard_server import CHROMIUM, start_dashboard
from tests.waiting import SAFETY_S

playwright = pytest.importorskip("playwright.sync_api", reason="playwright not installed: scripts/setup.sh --dev")
expect = playwright.expect

pytestmark = [pytest.mark.e2e, pytest.mark.model,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no {CHROMIUM}: `apt-get install chromium`")]

CONFIGS = [{"evict": "streaming_llm", "ratio": 0.75}, {"evict": "snapkv", "ratio": 0.75, "query_aware": True}]


@pytest.fixture
def dashboard(tmp_path, monkeypatch) -> Iterator[tuple[str, str]]:
    monkeypatch.delenv("KVLAB_PLAYGROUND_URL", raising=False)
    url = f"sqlite:///{tmp_path / 'kvlab.sqlite'}"
    with Store(url):
        pass  # the store's tables, as a first visit finds them
    process, base = start_dashboard(url, tmp_path / "streamlit.log", extra_env={"KVLAB_LOG_DIR": str(tmp_path)})
    try:
        yield base, url
    finally:
        process.terminate()  # its playground server goes with it (ManagedServer stops on exit)
        process.wait(timeout=SAFETY_S)


def _wait_idle(page) -> None:
    """Until the script run in progress has finished: only after an event that the run itself shows."""
    page.locator("[data-testid=stApp][data-test-script-state=notRunning]").wait_for()


def _metric(page, label: str):
    return page.get_by_test_id("stMetric").filter(has_text=label).get_by_test_id("stMetricValue")


def test_a_playground_link_runs_maps_the_needle_and_becomes_an_experiment(dashboard, browser):
    base, store_url = dashboard
    query = urlencode([("length", "512"), ("seed", "3"), *(("config", config_text(c)) for c in CONFIGS)])
    context = browser.new_context(viewport={"width": 1400, "height": 2400})
    page = context.new_page()
    page.set_default_timeout(SAFETY_S * 1000)
    try:
        page.goto(f"{base}/{page_table.PLAYGROUND.url_path}?{query}")
        main = page.get_by_test_id("stMain")
        main.get_by_role("button", name="Run").wait_for()
        _wait_idle(page)
        main.get_by_role("button", name="Run").click()
        page.get_by_text("The server is ready.").wait_for()  # the first Run started kvlab serve
        # the last config's token-map heading (the results table's cells, drawn on a canvas, hold the same
        # label in hidden cells: a heading is what the reader sees)
        main.locator("strong").filter(has_text="snapkv:r0.75/qa").wait_for()
        _wait_idle(page)
        verdicts = main.locator("p").filter(has_text="(right)").count(), main.locator("p").filter(
            has_text="(wrong)").count()
        assert verdicts[0] >= 1 and verdicts[1] >= 1  # the baseline right, StreamingLLM wrong
        maps = main.locator("div[style*='white-space:pre-wrap']")
        expect(maps).to_have_count(3)
        streaming = maps.nth(1)
        needle = streaming.locator("span[style*='outline']")
        assert needle.count() >= 1
        for index in range(needle.count()):  # the needle's tokens, evicted by every head of every layer
            assert "rgba(31,119,180,0.00)" in needle.nth(index).get_attribute("style")
        assert maps.nth(0).locator("span[style*='outline']").count() == needle.count()

        page.get_by_role("button", name="Save as experiment").click()
        page.get_by_role("heading", name="New experiment").wait_for()
        page.get_by_text("Loaded the playground's configs").wait_for()
        # the whole task: 10 items (spread over 5 depths), under the baseline and the 2 configs
        expect(_metric(page, "Evaluations")).to_have_text("30")
        items = page.get_by_label("Items per length", exact=True)
        items.fill("1")
        items.press("Enter")
        expect(_metric(page, "Evaluations")).to_have_text("3")
        _wait_idle(page)
        page.get_by_test_id("stMain").get_by_role("button", name="Launch", exact=True).click()
        # the experiment's page, or the form's refusal (which fails here with its text, not a wait)
        page.get_by_role("heading", name="playground-passkey").or_(
            page.get_by_test_id("stAlertContentError")).first.wait_for()
        errors = page.get_by_test_id("stAlertContentError")
        assert errors.count() == 0, errors.first.inner_text()
        assert f"/{page_table.EXPERIMENT.url_path}?id=1" in page.url
    finally:
        context.close()
    with Store(store_url) as store:
        experiment = store.get_experiment(1)
        store.cancel_experiment(1)  # its workers stop: the test is about the hand-over, not the run
    assert experiment.name == "playground-passkey"
    assert [c["evict"] for c in experiment.spec["configs"]] == [c["evict"] for c in CONFIGS]
    assert experiment.spec["tasks"][0]["context_lengths"] == [512]
