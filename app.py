"""kvlab dashboard: `streamlit run app.py`.

Each page is one file in pages/; the page is the URL path and its state the query parameters, so
any view can be shared as a link.  Pages read and write through kvlab.store and draw with
kvlab.dashboard.charts; errors reach the user as one-line messages, never as tracebacks (pages.common.guard:
the details of an unexpected one go to $KVLAB_HOME/logs/kvlab-dashboard.log).
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from kvlab.secrets import install_log_redaction
from kvlab.dashboard.views import PAGE_COMPARE, PAGE_DOCTOR, PAGE_EXPERIMENT, PAGE_EXPERIMENTS, PAGE_NEW, PAGE_TUNE
from pages.common import PAGE_FILES, guard

#: The tab's icon ships with the app: a ``:material/...:`` page icon is fetched from a font CDN, offline too.
ICON = Path(__file__).resolve().parent / "static" / "kvlab-icon.png"

install_log_redaction()  # the dashboard's log never shows a URL password or a key
st.set_page_config(page_title="kvlab", page_icon=ICON, layout="wide")

pages = [
    st.Page(PAGE_FILES[PAGE_EXPERIMENTS], title="Experiments", icon=":material/table_rows:", default=True),
    # The default page's URL is the root: this hidden twin keeps /experiments links working.
    st.Page(PAGE_FILES[PAGE_EXPERIMENTS], title="Experiments", url_path=PAGE_EXPERIMENTS, visibility="hidden"),
    st.Page(PAGE_FILES[PAGE_NEW], title="New experiment", icon=":material/add_circle:", url_path=PAGE_NEW),
    st.Page(PAGE_FILES[PAGE_EXPERIMENT], title="Experiment", icon=":material/monitoring:", url_path=PAGE_EXPERIMENT),
    st.Page(PAGE_FILES[PAGE_TUNE], title="Tune", icon=":material/tune:", url_path=PAGE_TUNE),
    st.Page(PAGE_FILES[PAGE_COMPARE], title="Compare", icon=":material/compare_arrows:", url_path=PAGE_COMPARE),
    st.Page(PAGE_FILES[PAGE_DOCTOR], title="Endpoint doctor", icon=":material/stethoscope:", url_path=PAGE_DOCTOR),
]
page = st.navigation(pages)
st.sidebar.caption("kvlab: KV-cache compression, memory vs accuracy")
with guard(page.title):
    page.run()
