"""kvlab dashboard: `streamlit run app.py`.

Each page is one module in pages/ and one row of kvlab.dashboard.page_table; the page is the URL
path and its state the query parameters, so any view can be shared as a link.  Pages read and write
through kvlab.store and draw with kvlab.dashboard.charts; errors reach the user as one-line messages,
never as tracebacks (pages.common.guard: the details of an unexpected one go to kvlab-dashboard.log
in kvlab.paths.log_dir(), by default ~/.cache/kvlab/logs).  Served as an ``st.App``, whose one addition
is kvlab.dashboard.deep_links: a deep link's page asks the server once, with no 404s.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import streamlit as st
from starlette.middleware import Middleware
from streamlit.file_util import get_static_dir

from kvlab.dashboard.deep_links import DeepLinkPages
from kvlab.dashboard.page_table import PAGES
from kvlab.dashboard.process_exit import stop_all
from kvlab.paths import STATIC_DIR
from kvlab.secrets import install_log_redaction

#: The tab's icon ships with the app: a ``:material/...:`` page icon is fetched from a font CDN, offline too.
ICON = STATIC_DIR / "kvlab-icon.png"


def navigation_pages() -> list[st.Page]:
    """The table's pages as ``st.navigation`` takes them."""
    pages = []
    for row in PAGES:
        if row.default:
            pages.append(st.Page(row.script, title=row.title, icon=row.icon, default=True))
            # The default page's URL is the root: this hidden twin keeps its own path's links working.
            pages.append(st.Page(row.script, title=row.title, url_path=row.url_path, visibility="hidden"))
        else:
            pages.append(st.Page(row.script, title=row.title, icon=row.icon, url_path=row.url_path))
    return pages


def main() -> None:
    """One run of the dashboard: Streamlit runs this file as ``__main__`` on every request, and the
    first-request stubs in pages/ (kvlab.dashboard.page_table) call this."""
    from pages.common import guard  # here, not at the top: its caches are made inside Streamlit's runtime

    install_log_redaction()  # the dashboard's log never shows a URL password or a key
    st.set_page_config(page_title="kvlab", page_icon=ICON, layout="wide")
    page = st.navigation(navigation_pages())
    st.sidebar.caption("kvlab: KV-cache compression, memory vs accuracy")
    with guard(page.title):
        page.run()


@asynccontextmanager
async def lifespan(_: st.App) -> AsyncIterator[None]:
    """After the server's shutdown, stop what the dashboard started (kvlab.dashboard.process_exit): on SIGTERM
    the process then ends by the signal, without ``atexit``."""
    yield
    await asyncio.to_thread(stop_all)


if __name__ == "__main__":  # Streamlit runs this file as the script of every request
    main()
else:  # `streamlit run app.py` imports it as a module, finds this app and serves it
    deep_links = Middleware(DeepLinkPages, index_html=Path(get_static_dir()) / "index.html",
                            url_paths=[row.url_path for row in PAGES],
                            base_url_path=st.get_option("server.baseUrlPath"))
    app = st.App(__file__, lifespan=lifespan, middleware=[deep_links])
