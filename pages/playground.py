"""Serves /playground on a server process's first request: while a pages/ folder is beside app.py,
Streamlit routes that request by file name (_mpa_v1 in streamlit/runtime/scriptrunner/script_runner.py),
so this file runs app.py, whose st.navigation takes over.  Text: kvlab.dashboard.page_table.stub_text."""

from app import main

main()
