"""/tune when it is a server process's first request: through app.py (see pages.common.run_app)."""

from pages.common import run_app

run_app()
