"""The dashboard's pages, one row each: app.py builds ``st.navigation`` from :data:`PAGES`, links name a
page by its row.  Adding a page is one module in pages/, one row here and its first-request stub.

A ``pages`` folder beside app.py makes Streamlit serve each server process's first request by file
name (its v1 folder routing: ``PagesManager.__init__`` in streamlit/runtime/pages_manager.py turns it
on, ``_mpa_v1`` in streamlit/runtime/scriptrunner/script_runner.py runs ``pages/<url path>.py``), and
show "Page not found" over a deep link that no file is named like.  So every row's URL path has a stub,
``pages/<url path>.py`` of :func:`stub_text`, that runs app.py's ``main``; its ``st.navigation`` then
serves that request and every later one.  tests/dashboard/test_page_table.py checks the stubs against the table.

Nothing here imports streamlit, so the link helpers and the tests read the table without page code.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The folder of the page modules and their stubs, beside app.py (paths are relative to app.py, as
#: Streamlit wants).
PAGES_FOLDER = "pages"


@dataclass(frozen=True)
class DashboardPage:
    """A page: its URL path (the state is in the query parameters), its sidebar entry and its module."""

    url_path: str
    title: str
    icon: str
    module: str  # the module in PAGES_FOLDER that draws it (named unlike any URL path: that file is a stub)
    default: bool = False  # the page of the root URL (its url_path keeps working too)

    @property
    def script(self) -> str:
        """Its file relative to app.py: what ``st.Page``, ``st.page_link`` and ``st.switch_page`` take."""
        return f"{PAGES_FOLDER}/{self.module}.py"

    @property
    def stub(self) -> str:
        """Its first-request stub relative to app.py, named like its URL path (text: :func:`stub_text`)."""
        return f"{PAGES_FOLDER}/{self.url_path}.py"


def stub_text(url_path: str) -> str:
    """The whole text of the stub that serves ``/<url_path>`` as a server process's first request."""
    return f'''"""Serves /{url_path} on a server process's first request: while a pages/ folder is beside app.py,
Streamlit routes that request by file name (_mpa_v1 in streamlit/runtime/scriptrunner/script_runner.py),
so this file runs app.py, whose st.navigation takes over.  Text: kvlab.dashboard.page_table.stub_text."""

from app import main

main()
'''


EXPERIMENTS = DashboardPage("experiments", "Experiments", ":material/table_rows:", "list_experiments", default=True)
NEW = DashboardPage("new", "New experiment", ":material/add_circle:", "new_experiment")
EXPERIMENT = DashboardPage("experiment", "Experiment", ":material/monitoring:", "view_experiment")
TUNE = DashboardPage("tune", "Tune", ":material/tune:", "view_tune")
COMPARE = DashboardPage("compare", "Compare", ":material/compare_arrows:", "compare_experiments")
DOCTOR = DashboardPage("doctor", "Endpoint doctor", ":material/stethoscope:", "endpoint_doctor")
PLAYGROUND = DashboardPage("playground", "Playground", ":material/science:", "playground_page")

#: Every page, in the sidebar's order.
PAGES = (EXPERIMENTS, NEW, PLAYGROUND, EXPERIMENT, TUNE, COMPARE, DOCTOR)
