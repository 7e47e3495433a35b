"""The middleware that tells a deep link's page where the server is (kvlab.dashboard.deep_links): a page's
path gets Streamlit's own index.html with the base URL set before the bundle; every other request passes."""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient
from streamlit.file_util import get_static_dir

from kvlab.dashboard.deep_links import BASE_URL_SCRIPT, DeepLinkPages, page_html
from kvlab.dashboard.page_table import PAGES

#: Streamlit's own page, as app.py passes it.
INDEX_HTML = Path(get_static_dir()) / "index.html"


def client(base_url_path: str = "") -> TestClient:
    inner = Starlette(routes=[Route("/{path:path}", lambda request: PlainTextResponse(f"streamlit {request.url.path}"),
                                     methods=["GET", "POST"])])
    return TestClient(DeepLinkPages(inner, INDEX_HTML, [page.url_path for page in PAGES], base_url_path))


def test_a_page_path_gets_streamlits_page_with_the_base_url_before_its_bundle():
    html = client().get(f"/{PAGES[1].url_path}?id=3").text
    assert html == page_html(INDEX_HTML)
    assert html.index(BASE_URL_SCRIPT) < html.index('<script type="module"')  # read as the bundle loads
    assert html.count("<script") == page_html(INDEX_HTML).count("<script")


def test_everything_else_reaches_streamlit():
    http = client()
    for path in ("/", "/_stcore/health", f"/{PAGES[1].url_path}/_stcore/health", "/static/js/x.js", "/unknown"):
        assert http.get(path).text == f"streamlit {path}"
    assert http.post(f"/{PAGES[1].url_path}").text == f"streamlit /{PAGES[1].url_path}"


def test_under_a_base_url_path_the_pages_are_under_it():
    http = client("/kvlab/")
    assert http.get(f"/kvlab/{PAGES[1].url_path}").text == page_html(INDEX_HTML)
    assert http.get(f"/{PAGES[1].url_path}").text == f"streamlit /{PAGES[1].url_path}"
