"""A deep link's page tells Streamlit's frontend where the server is, so the browser asks it once.

Opened at ``/<page>``, Streamlit 1.67's frontend does not know whether the app is served at ``/`` or at
``/<page>`` (a proxy's prefix): it probes ``/<page>/_stcore/health`` and ``/<page>/_stcore/host-config``
first, gets two 404s (each a console error in the browser), waits its 100 ms retry period and then tries
``/`` (``getPossibleBaseUris`` in its connection code; streamlit/streamlit#7074, open).  The frontend reads
one setting that removes the guess: ``window.__streamlit.BACKEND_BASE_URL``, read once as its bundle
loads.  :class:`DeepLinkPages` serves Streamlit's own ``index.html`` for each page's path with a script
setting it to the app's root (``./`` from ``/<page>``, under any ``server.baseUrlPath`` too), placed before
the bundle's script.  app.py installs it through ``st.App`` (the middleware hook Streamlit offers;
``streamlit run app.py`` finds the ``st.App`` and serves it).  Everything else passes through unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from starlette.responses import HTMLResponse
from starlette.types import ASGIApp, Receive, Scope, Send

#: Runs before the frontend's bundle (a module script, so it runs after every classic script before it).
BASE_URL_SCRIPT = '<script>window.__streamlit={BACKEND_BASE_URL:new URL("./",window.location.href).href}</script>'


def page_html(index_html: Path) -> str:
    """Streamlit's ``index.html`` (its static folder's) with :data:`BASE_URL_SCRIPT` before its first script."""
    index = index_html.read_text(encoding="utf-8")
    if "<script" not in index:  # a Streamlit whose page has no script: nothing to place it before
        raise RuntimeError("Streamlit's index.html has no <script>: kvlab.dashboard.deep_links needs updating")
    return index.replace("<script", BASE_URL_SCRIPT + "<script", 1)


class DeepLinkPages:
    """ASGI middleware: a GET of a page's path (``/<base>/<page>``, query string aside) is answered with
    :func:`page_html` of Streamlit's ``index_html``; every other request goes to Streamlit."""

    def __init__(self, app: ASGIApp, index_html: Path, url_paths: Iterable[str], base_url_path: str = "") -> None:
        self.app = app
        self.html = page_html(index_html)
        base = base_url_path.strip("/")
        self.paths = frozenset(f"/{base}/{path}" if base else f"/{path}" for path in url_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"] in self.paths:
            response = HTMLResponse(self.html, headers={"Cache-Control": "no-cache"})  # as Streamlit's own
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
