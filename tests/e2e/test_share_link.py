"""The experiment page's share link in a real browser: every piece of the page's state set through its
widget (section, x and y axes, hidden configs, margin, needle config, item), then the sidebar's "Share
this view" link opened in a fresh browser context (no cookies, no session) shows the same view and the
same verdict; the address bar holds that link in every section.  The margin (a fraction, as max_drop)
changes the verdict: a link without it states another rule; hiding a config does not (the decision is on
every config)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from kvlab.core.margin_inputs import MARGIN_INPUTS
from kvlab.dashboard import experiment_view, page_table
from kvlab.store import Store
from tests.dashboard_data import populate
from tests.e2e.browsing import wait_idle
from tests.e2e.dashboard_server import CHROMIUM, start_dashboard
from tests.waiting import SAFETY_S

playwright = pytest.importorskip("playwright.sync_api", reason="playwright not installed: scripts/setup.sh --dev")
expect = playwright.expect

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                                  reason=f"no {CHROMIUM}: `apt-get install chromium`")]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("share")
    url = f"sqlite:///{tmp / 'kvlab.sqlite'}"
    with Store(url) as store:
        populate(store, fidelity=True, load=True)  # experiment 1: 4 configs x 8 passkey items, max_drop 0.5, fidelity,
        # and a load phase
    process, base = start_dashboard(url, tmp / "streamlit.log")
    try:
        yield base
    finally:
        process.terminate()
        process.wait(timeout=SAFETY_S)


def _page(browser, url: str, requests: list[str] | None = None):
    """``url`` in a fresh context; the URL of every request it makes goes to ``requests``."""
    context = browser.new_context(viewport={"width": 1400, "height": 1800})
    if requests is not None:
        context.on("request", lambda request: requests.append(request.url))
    page = context.new_page()
    page.set_default_timeout(SAFETY_S * 1000)
    page.goto(url)
    page.get_by_role("heading", name="synthetic-sweep").wait_for()
    wait_idle(page)
    return page


def _section(page, name: str):
    return page.get_by_test_id("stButtonGroup").get_by_role("radio", name=name, exact=True)


def _verdict(page) -> str:
    """The Tradeoff section's verdict: the sweet spot (or why there is none) and the rule that chose it."""
    main = page.get_by_test_id("stMain")
    spot = main.get_by_text(re.compile(r"^(Sweet spot|No sweet spot): ")).first
    spot.wait_for()
    return spot.inner_text().strip() + "\n" + main.get_by_text(re.compile(r"^Rule: ")).first.inner_text().strip()


def _pick(page, widget: str, label: str, option: str) -> None:
    """Choose ``option`` in the select or multiselect labelled ``label``."""
    page.get_by_test_id(widget).filter(has=page.get_by_text(label, exact=True)).click()
    page.get_by_role("option", name=option, exact=True).click()
    page.keyboard.press("Escape")
    wait_idle(page)


def test_the_share_link_reproduces_the_view_and_its_verdict(server, browser):
    requests: list[str] = []
    page = _page(browser, f"{server}/{page_table.EXPERIMENT.url_path}?id=1", requests)
    at_the_spec_margin = _verdict(page)
    assert "Sweet spot: int4" in at_the_spec_margin and "decided by passkey: fidelity" in at_the_spec_margin

    page.get_by_role("button", name="Configs and margin").click()  # a popover: drawn when opened
    margin = page.get_by_label(MARGIN_INPUTS["max_drop"].label, exact=True)
    margin.fill("0.2")
    margin.press("Enter")
    wait_idle(page)
    _pick(page, "stMultiSelect", "Hide configs", "snapkv-50")
    page.keyboard.press("Escape")  # closes the popover, which lies over the axes' radios
    page.get_by_test_id("stRadio").get_by_text("ratio", exact=True).click()
    wait_idle(page)
    page.get_by_test_id("stRadio").get_by_text("KL", exact=True).click()
    wait_idle(page)
    page.get_by_text("synthetic-sweep: memory vs mean KL").wait_for()
    verdict = _verdict(page)
    assert verdict != at_the_spec_margin and "by more than 0.2 (" in verdict
    _section(page, "Failed items").click()
    wait_idle(page)
    _pick(page, "stSelectbox", "Item: KL along its tokens", "passkey-256-1")
    page.get_by_text("KL along the tokens of passkey-256-1").wait_for()
    _section(page, "Layers").click()
    wait_idle(page)
    _pick(page, "stSelectbox", "Config", "int2")
    page.get_by_text("int2: where the prompt's cache is").wait_for()
    _section(page, "Capacity").click()
    wait_idle(page)
    _pick(page, "stSelectbox", "Model", "qwen2.5-7b")
    _pick(page, "stSelectbox", "GPU", "NVIDIA A100 40GB")
    for label, value in (("Tokens per sequence", "8192"), ("Sequences at once", "4")):
        box = page.get_by_label(label, exact=True)
        box.fill(value)
        box.press("Enter")
        wait_idle(page)
    page.get_by_text("synthetic-sweep: sequences of 8,192 tokens that fit (projection)").wait_for()
    _section(page, "Needles").click()
    wait_idle(page)
    _pick(page, "stSelectbox", "Config", "int2")
    page.get_by_text("Needle retrieval: int2").wait_for()

    share = page.get_by_test_id("stSidebar").locator(".st-key-share-link code")
    expect(share).to_contain_text("needle=int2")
    link = share.inner_text().strip()
    query = parse_qs(urlsplit(link).query)
    assert set(query) == {f.name for f in fields(experiment_view.ExperimentViewState)}, link  # every piece of the state
    assert query == {"id": ["1"], "tab": ["Needles"], "x": ["ratio"], "y": ["KL"], "hide": ["snapkv-50"],
                     "margin": ["0.2"], "needle": ["int2"], "layout": ["int2"], "item": ["passkey-256-1"],
                     "cap_model": ["qwen2.5-7b"], "gpu": ["a100-40gb"], "context": ["8192"], "clients": ["4"]}, link
    # the address bar is the same link (issue 47 row 5: it dropped x and y, which only the Tradeoff section draws)
    assert parse_qs(urlsplit(page.url).query) == query, page.url
    _section(page, "Latency").click()
    wait_idle(page)
    expect(share).to_contain_text("tab=Latency")
    assert parse_qs(urlsplit(page.url).query) == query | {"tab": ["Latency"]}, page.url

    shared = _page(browser, link)  # a fresh context: what someone else who opens the link sees
    expect(_section(shared, "Needles")).to_have_attribute("aria-checked", "true")
    shared.get_by_text("Needle retrieval: int2").wait_for()
    _section(shared, "Failed items").click()
    wait_idle(shared)
    shared.get_by_text("KL along the tokens of passkey-256-1").wait_for()
    _section(shared, "Layers").click()
    wait_idle(shared)
    shared.get_by_text("int2: where the prompt's cache is").wait_for()
    _section(shared, "Load").click()
    wait_idle(shared)
    shared.get_by_text("Under load: throughput and latency per config").wait_for()
    shared.get_by_text("synthetic-sweep: what each config costs vs what it buys").wait_for()
    _section(shared, "Capacity").click()
    wait_idle(shared)
    shared.get_by_text("synthetic-sweep: sequences of 8,192 tokens that fit (projection)").wait_for()
    shared.get_by_text(re.compile(r"Projection.*NVIDIA A100 40GB")).first.wait_for()  # the link's GPU
    _section(shared, "Tradeoff").click()
    wait_idle(shared)
    expect(shared.get_by_test_id("stRadioOption").filter(has_text="ratio").locator("input")).to_be_checked()
    expect(shared.get_by_test_id("stRadioOption").filter(has_text="KL").locator("input")).to_be_checked()
    shared.get_by_text("synthetic-sweep: memory vs mean KL").wait_for()
    assert _verdict(shared) == verdict
    shared.context.close()
    page.context.close()
    # everything the pages draw with ships with the app (the tab's icon was a font CDN's, offline too)
    assert {urlsplit(url).netloc for url in requests if url.startswith("http")} == {urlsplit(server).netloc}
