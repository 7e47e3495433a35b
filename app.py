"""kvlab dashboard: `streamlit run app.py`.

Each page is one module in app_pages/ and one row of kvlab.dashboard.page_table; the page is the URL
path and its state the query parameters, so any view can be shared as a link.  Pages read and write
through kvlab.store and draw with kvlab.dashboard.charts; errors reach the user as one-line messages,
never as tracebacks (app_pages.common.guard: the details of an unexpected one go to
$KVLAB_HOME/logs/kvlab-dashboard.log).
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from kvlab.secrets import install_log_redaction
from kvlab.dashboard.page_table import PAGES
from app_pages.common import guard

#: The tab's icon ships with the app: a ``:material/...:`` page icon is fetched from a font CDN, offline too.
ICON = Path(__file__).resolve().parent / "static" / "kvlab-icon.png"

install_log_redaction()  # the dashboard's log never shows a URL password or a key
st.set_page_config(page_title="kvlab", page_icon=ICON, layout="wide")

pages = []
for row in PAGES:
    if row.default:
        pages.append(st.Page(row.script, title=row.title, icon=row.icon, default=True))
        # The default page's URL is the root: this hidden twin keeps its own path's links working.
        pages.append(st.Page(row.script, title=row.title, url_path=row.url_path, visibility="hidden"))
    else:
        pages.append(st.Page(row.script, title=row.title, icon=row.icon, url_path=row.url_path))
page = st.navigation(pages)
st.sidebar.caption("kvlab: KV-cache compression, memory vs accuracy")
with guard(page.title):
    page.run()
