"""The dashboard in a real browser: a real `streamlit run app.py`, real local workers on the default
model, Debian's headless chromium driven by Playwright (which never downloads a browser here).

One story, in order: create a tiny sweep in the form, launch it, watch the live panel follow it to
the end, read the tradeoff chart, open the share link in a fresh browser context and get the same
view, download exports and check they are real files.  Screenshots of every page go to
artifacts/dashboard/ (git-ignored).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from kvlab.core.backends import BACKENDS
from kvlab.secrets import mask
from tests.e2e.browsing import downloaded, wait_idle
from tests.e2e.dashboard_server import CHROMIUM, ROOT, start_dashboard
from tests.serving import API_KEY, API_KEY_VAR
from tests.waiting import SAFETY_S

playwright = pytest.importorskip("playwright.sync_api", reason="playwright not installed: scripts/setup.sh --dev")

expect = playwright.expect
ARTIFACTS = ROOT / "artifacts" / "dashboard"

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                                  reason=f"no {CHROMIUM}: `apt-get install chromium`")]


def secrets_file(tmp_path_factory) -> Path:
    """The dashboard's secrets file (KVLAB_SECRETS_FILE): a test writes into it what the dashboard reads then."""
    return tmp_path_factory.getbasetemp() / "dashboard-secrets.toml"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    """`streamlit run app.py` on a free port and an empty SQLite store; its workers are stopped with it."""
    tmp = tmp_path_factory.mktemp("dashboard")
    process, url = start_dashboard(f"sqlite:///{tmp / 'kvlab.sqlite'}", tmp / "streamlit.log",
                                   {API_KEY_VAR: API_KEY,  # the key of kvlab_server, for the workers it starts
                                    # where that key belongs, written by the test that checks kvlab_server
                                    "KVLAB_SECRETS_FILE": str(secrets_file(tmp_path_factory))})
    try:
        yield url
    finally:
        children = psutil.Process(process.pid).children(recursive=True) if process.poll() is None else []
        workers = [c for c in children if "worker" in _cmdline(c)]  # not kaleido's chromium: streamlit closes it
        for worker in workers:
            worker.terminate()
        psutil.wait_procs(workers, timeout=SAFETY_S)
        process.terminate()
        process.wait(timeout=SAFETY_S)


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def _page(browser, url: str):
    context = browser.new_context(viewport={"width": 1400, "height": 2200}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(SAFETY_S * 1000)
    page.goto(url)
    page.get_by_test_id("stApp").wait_for()
    return page


def _shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def _fill(page, label: str, value: str) -> None:
    field = page.get_by_label(label, exact=True)
    field.fill(value)
    field.press("Enter")
    wait_idle(page)


def _section(page, name: str):
    """A button of a page's section selector (the experiment and compare pages')."""
    return page.get_by_test_id("stButtonGroup").get_by_role("radio", name=name, exact=True)


def _metric(page, label: str):
    return page.get_by_test_id("stMetric").filter(has_text=label).get_by_test_id("stMetricValue")


def _download(page, button, tmp_path: Path) -> bytes:
    info = downloaded(page, button)
    target = tmp_path / info.suggested_filename
    info.save_as(target)
    return target.read_bytes()


def test_create_launch_watch_share_export(server, browser, tmp_path):
    page = _page(browser, server)
    page.get_by_text("No experiments yet").wait_for()
    _shot(page, "1-experiments-empty")

    # -- the form: a tiny sweep (baseline + the default int4 and streaming-50 configs) ---------------
    page.get_by_test_id("stSidebarNav").get_by_text("New experiment").click()
    page.get_by_text("Preview and launch").wait_for()
    _fill(page, "Name", "e2e-tiny")
    _fill(page, "Context lengths (tokens)", "256")
    _fill(page, "Needle depths (fraction of context)", "0.5")
    _fill(page, "Items per length", "2")
    _fill(page, "Max new tokens (0: task default)", "8")
    expect(_metric(page, "Trials (configs)")).to_have_text("3")
    expect(_metric(page, "Evaluations")).to_have_text("6")
    _shot(page, "2-new-experiment")

    # -- launch, and the live panel follows the run ------------------------------------------------
    page.get_by_role("button", name="Launch", exact=True).click()
    page.wait_for_url(re.compile(r"/experiment\?id=1"))
    page.get_by_role("heading", name="e2e-tiny").wait_for()
    progress = page.get_by_test_id("stProgress").first
    seen = []
    deadline = time.monotonic() + SAFETY_S
    while time.monotonic() < deadline:
        text = progress.inner_text()
        if not seen or seen[-1] != text:
            seen.append(text)
        if text.startswith("running") and page.get_by_text("Memory over time, by phase").count():
            _shot(page, "3-experiment-running")
        if text.startswith(("done", "failed", "cancelled")):
            break
        page.wait_for_timeout(1000)
    assert seen[-1].startswith("done: 6/6 items, 3/3 trials ended"), seen
    assert len(seen) >= 2, f"the live panel never changed: {seen}"  # it updated without a reload

    # -- the results -----------------------------------------------------------------------------------
    page.get_by_text("e2e-tiny: memory vs accuracy").wait_for()
    # the first run reaches a decision: 2 items cannot show a 5-point accuracy margin, fidelity can
    spot = page.get_by_text(re.compile(r"^(Sweet spot|No sweet spot): ")).first
    spot.wait_for()
    verdict = spot.inner_text()
    assert verdict.startswith("Sweet spot: int4") and "decided by passkey: fidelity" in verdict, verdict
    assert page.get_by_text("physical KV cache (MiB)").count()
    _shot(page, "4-experiment-done")
    page.get_by_test_id("stRadio").get_by_text("ratio", exact=True).click()
    wait_idle(page)
    page.get_by_text("compression ratio (x, baseline bytes / physical bytes)").wait_for()
    _section(page, "Needles").click()
    wait_idle(page)
    share = page.get_by_test_id("stSidebar").locator(".st-key-share-link code")
    expect(share).to_contain_text("tab=Needles")
    link = share.inner_text().strip()
    assert link == f"{server}/experiment?id=1&tab=Needles&x=ratio", link
    expect(page).to_have_url(re.compile(r"/experiment\?.*tab=Needles"))

    # -- the share link in another browser (fresh context: no cookies, no session) -----------------------
    shared = _page(browser, link)
    shared.get_by_role("heading", name="e2e-tiny").wait_for()
    expect(shared.get_by_text("Needle retrieval: baseline")).to_be_visible()
    expect(_section(shared, "Needles")).to_have_attribute("aria-checked", "true")
    assert not shared.get_by_text("e2e-tiny: memory vs accuracy").count()  # only the chosen section is drawn
    _section(shared, "Tradeoff").click()
    expect(shared.get_by_test_id("stRadioOption").filter(has_text="ratio").locator("input")).to_be_checked()
    _shot(shared, "5-shared-link")
    shared.context.close()

    # -- exports ---------------------------------------------------------------------------------------
    _section(page, "Tradeoff").click()
    expect(page).not_to_have_url(re.compile("tab="))
    wait_idle(page)

    def button(key: str):
        return page.locator(f".st-key-{key} button")  # Streamlit marks a keyed element with st-key-<key>

    started = time.monotonic()
    assert _download(page, button("tradeoff-png"), tmp_path).startswith(b"\x89PNG\r\n\x1a\n")
    # the server's first export: its renderer was started when the first chart was drawn (~2 s idle;
    # the bound leaves room for a busy machine, an unwarmed renderer takes 15 s)
    assert time.monotonic() - started < 6, f"first PNG export took {time.monotonic() - started:.1f} s"
    svg = _download(page, button("tradeoff-svg"), tmp_path)
    assert svg.lstrip().startswith(b"<svg") and b"compression ratio" in svg
    chart_html = _download(page, button("tradeoff-html"), tmp_path)
    assert chart_html.lower().startswith(b"<!doctype html>") and b"Plotly.newPlot" in chart_html
    _section(page, "Export").click()
    expect(page).to_have_url(re.compile("tab=Export"))
    wait_idle(page)
    report = _download(page, page.get_by_role("button", name="HTML report"), tmp_path)
    assert b"kvlab: e2e-tiny" in report and b"Plotly.newPlot" in report and b"name = &quot;e2e-tiny&quot;" in report
    csv = _download(page, page.get_by_role("button", name="Results (CSV)"), tmp_path)
    assert csv.startswith(b"item_id,task,config_name") and csv.count(b"\n") == 7

    # -- the other pages ---------------------------------------------------------------------------------
    page.goto(f"{server}/compare?ids=1")
    page.get_by_text("Tradeoffs compared").wait_for()
    _shot(page, "6-compare")
    _section(page, "Parameters").click()  # the parallel coordinates (st.plotly_chart: plotly.js' full bundle)
    page.get_by_text("Parameters and outcomes").wait_for()
    page.get_by_test_id("stDataFrame").wait_for()
    expect(page).to_have_url(re.compile(r"/compare\?.*tab=Parameters"))
    page.goto(server)
    page.get_by_test_id("stDataFrame").wait_for()
    _shot(page, "7-experiments")
    page.context.close()


def _wait_done(page) -> str:
    progress = page.get_by_test_id("stProgress").first
    deadline = time.monotonic() + SAFETY_S
    while not (text := progress.inner_text()).startswith(("done", "failed", "cancelled")):
        assert time.monotonic() < deadline, text
        page.wait_for_timeout(1000)
    return text


def test_check_an_endpoint_then_sweep_it(server, browser, kvlab_server, tmp_path_factory):
    """The doctor passes `kvlab serve`; a sweep launched from the form runs against it through the
    openai_compat backend; the key is shown masked and never in a page."""
    base_url = kvlab_server[1]
    # the dashboard sends a key only to the URL it belongs to (kvlab.secrets.key_for): <NAME>_BASE_URL's
    secrets_file(tmp_path_factory).write_text(f'{API_KEY_VAR.removesuffix("API_KEY")}BASE_URL = "{base_url}"\n')
    page = _page(browser, server)
    page.get_by_role("heading", name="Experiments").wait_for()  # app.py has run: its navigation is in place
    page.get_by_test_id("stSidebarNav").get_by_text("Endpoint doctor", exact=True).click()
    page.get_by_role("button", name="Check endpoint").wait_for()
    _fill(page, "Base URL", base_url)
    _fill(page, "Key variable", API_KEY_VAR)
    page.get_by_role("button", name="Check endpoint").click()
    wait_idle(page)
    _shot(page, "8-endpoint-doctor")
    page.get_by_text("All checks passed.").wait_for()
    assert API_KEY not in page.content()

    page.get_by_test_id("stSidebarNav").get_by_text("New experiment", exact=True).click()
    page.get_by_text("Preview and launch").wait_for()
    page.get_by_test_id("stSelectbox").filter(has_text="Backend").click()
    page.get_by_role("option", name=BACKENDS["openai_compat"].title).click()
    wait_idle(page)
    _fill(page, "Base URL", base_url)
    _fill(page, "API key variable", API_KEY_VAR)
    expect(page.get_by_text(f"Key: {mask(API_KEY)}")).to_be_visible()
    _fill(page, "Name", "e2e-served")
    _fill(page, "Context lengths (tokens)", "256")
    _fill(page, "Needle depths (fraction of context)", "0.5")
    _fill(page, "Items per length", "2")
    _fill(page, "Max new tokens (0: task default)", "8")
    page.get_by_role("button", name="Launch", exact=True).click()
    page.wait_for_url(re.compile(r"/experiment\?id=\d+"))
    page.get_by_role("heading", name="e2e-served").wait_for()
    assert _wait_done(page).startswith("done: 6/6 items, 3/3 trials ended")
    page.get_by_text("e2e-served: memory vs accuracy").first.wait_for()  # (a rerun may briefly draw it twice)
    assert page.get_by_text("physical KV cache (MiB)").count()  # kvlab serve measures its cache
    _shot(page, "9-served-experiment")
    assert API_KEY not in page.content()
    page.context.close()
