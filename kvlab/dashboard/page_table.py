"""The dashboard's pages, one row each: app.py builds ``st.navigation`` from :data:`PAGES`, links name a
page by its row.  Adding a page is one module in app_pages/ and one row here.

Nothing here imports streamlit, so the link helpers and the tests read the table without page code.
The page modules live in app_pages/, not pages/: a ``pages`` folder beside app.py, whatever it holds,
makes Streamlit serve each server process's first request by file name (its v1 folder navigation,
``_mpa_v1`` in streamlit/runtime/scriptrunner/script_runner.py), which shows "Page not found" over a
deep link to an ``st.navigation`` page.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The folder of the page modules, beside app.py (paths in it are relative to app.py, as Streamlit wants).
PAGES_FOLDER = "app_pages"


@dataclass(frozen=True)
class DashboardPage:
    """A page: its URL path (the state is in the query parameters), its sidebar entry and its module."""

    url_path: str
    title: str
    icon: str
    module: str  # the module in PAGES_FOLDER that draws it
    default: bool = False  # the page of the root URL (its url_path keeps working too)

    @property
    def script(self) -> str:
        """Its file relative to app.py: what ``st.Page``, ``st.page_link`` and ``st.switch_page`` take."""
        return f"{PAGES_FOLDER}/{self.module}.py"


EXPERIMENTS = DashboardPage("experiments", "Experiments", ":material/table_rows:", "list_experiments", default=True)
NEW = DashboardPage("new", "New experiment", ":material/add_circle:", "new_experiment")
EXPERIMENT = DashboardPage("experiment", "Experiment", ":material/monitoring:", "view_experiment")
TUNE = DashboardPage("tune", "Tune", ":material/tune:", "view_tune")
COMPARE = DashboardPage("compare", "Compare", ":material/compare_arrows:", "compare_experiments")
DOCTOR = DashboardPage("doctor", "Endpoint doctor", ":material/stethoscope:", "endpoint_doctor")

#: Every page, in the sidebar's order.
PAGES = (EXPERIMENTS, NEW, EXPERIMENT, TUNE, COMPARE, DOCTOR)
