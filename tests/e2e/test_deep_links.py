"""Every page URL, with its query parameters, opened as a shared link: a freshly started
`streamlit run app.py` (so the first request of the process is the link itself), a fresh browser
context each, and the page must show its own content with no dialog ("Page not found" was one).

With a pages/ folder next to app.py, Streamlit serves a process's first request with its folder-based
navigation, by file name: the stubs named like the URL paths (kvlab.dashboard.page_table.stub_text) send
that request through app.py, and this test keeps them honest; the sidebar must then list the table's
pages, not the files in pages/.

The browser's console must stay free of errors and no request may fail: Streamlit's frontend used to probe
``/<page>/_stcore/health`` and ``host-config`` first, two 404s per link (kvlab.dashboard.deep_links).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from kvlab.dashboard import page_table
from kvlab.store import Store
from tests.dashboard_data import populate
from tests.e2e.browsing import wait_idle
from tests.e2e.dashboard_server import CHROMIUM, start_dashboard
from tests.tune_data import populate_tune
from tests.waiting import SAFETY_S

playwright = pytest.importorskip("playwright.sync_api", reason="playwright not installed: scripts/setup.sh --dev")

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                                  reason=f"no {CHROMIUM}: `apt-get install chromium`")]

#: URL -> text that only that page shows once it has run.
LINKS = {
    "/": "Experiments",
    f"/{page_table.EXPERIMENTS.url_path}?sort=oldest": "Experiments",
    f"/{page_table.NEW.url_path}": "New experiment",
    f"/{page_table.EXPERIMENT.url_path}?id=1": "synthetic-sweep",
    f"/{page_table.EXPERIMENT.url_path}?id=1&tab=Needles&needle=int4": "synthetic-sweep",
    f"/{page_table.COMPARE.url_path}?ids=1": "Compare experiments",
    f"/{page_table.DOCTOR.url_path}": "Endpoint doctor",
    f"/{page_table.PLAYGROUND.url_path}?task=multikey&length=512": "Playground",
    f"/{page_table.TUNE.url_path}?id=2&show=stopped": "Tune: synthetic-tune",
}


@pytest.fixture(scope="module")
def store_url(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('links') / 'kvlab.sqlite'}"
    with Store(url) as store:
        populate(store)
        populate_tune(store)  # experiment 2
    return url


def test_every_page_has_a_link_here():
    assert {link.partition("?")[0].strip("/") for link in LINKS} == {"", *(p.url_path for p in page_table.PAGES)}


@pytest.mark.parametrize("link", list(LINKS))
def test_a_shared_link_on_a_fresh_server_opens_its_page_without_a_dialog(link, store_url, browser, tmp_path):
    process, base = start_dashboard(store_url, tmp_path / "streamlit.log")
    context = browser.new_context(viewport={"width": 1400, "height": 1200})
    try:
        page = context.new_page()
        page.set_default_timeout(SAFETY_S * 1000)
        console_errors: list[str] = []
        failed: list[tuple[int, str]] = []
        page.on("console", lambda message: console_errors.append(message.text) if message.type == "error" else None)
        page.on("response", lambda response: failed.append((response.status, response.url))
                if response.status >= 400 else None)
        page.goto(base + link)
        wait_idle(page, after_input=False)
        main = page.get_by_test_id("stMain")
        main.get_by_role("heading", name=LINKS[link]).first.wait_for()
        page.wait_for_timeout(1000)  # a dialog arrives with the first script run: give it time to show
        assert page.locator("[role=dialog]").count() == 0, page.locator("[role=dialog]").all_inner_texts()
        assert "Page not found" not in page.content()
        assert failed == []
        assert console_errors == []
        assert main.is_visible()
        # The sidebar is the table's (st.navigation's), not the first request's folder navigation of pages/*.py.
        links = page.get_by_test_id("stSidebarNav").get_by_test_id("stSidebarNavLink").all()
        shown = [(urlsplit(link.get_attribute("href")).path, link.inner_text().splitlines()[-1]) for link in links]
        assert shown == [("/" if p.default else f"/{p.url_path}", p.title) for p in page_table.PAGES]
    finally:
        context.close()
        process.terminate()
        process.wait(timeout=SAFETY_S)
