"""The table of dashboard pages (kvlab.dashboard.page_table): every row names a module that exists, one
URL path per page, one default page, and the first-request stubs in pages/ are exactly the table's."""

from __future__ import annotations

import ast
from pathlib import Path

from kvlab.dashboard.page_table import PAGES, PAGES_FOLDER, stub_text

ROOT = Path(__file__).resolve().parents[2]


def _imports_app(source: str) -> bool:
    return any(isinstance(node, ast.ImportFrom) and node.module == "app"
               or isinstance(node, ast.Import) and any(alias.name == "app" for alias in node.names)
               for node in ast.walk(ast.parse(source)))


def test_every_row_names_an_existing_module():
    assert [p.script for p in PAGES if not (ROOT / p.script).is_file()] == []


def test_url_paths_are_distinct_and_one_page_is_the_default():
    assert len({p.url_path for p in PAGES}) == len(PAGES)
    assert sum(p.default for p in PAGES) == 1


def test_the_stubs_in_pages_are_the_tables():
    """Every row's URL path has its stub, with exactly stub_text's text (a module named like a URL path
    would be served bare, without app.py, on a first request), and nothing else in pages/ runs app.py:
    a stub whose row is gone goes too.  A missing stub: write page_table.stub_text(url_path) to it."""
    expected = {p.stub: stub_text(p.url_path) for p in PAGES}
    sources = {f"{PAGES_FOLDER}/{f.name}": f.read_text() for f in (ROOT / PAGES_FOLDER).glob("*.py")}
    running_the_app = {path: source for path, source in sources.items() if _imports_app(source)}
    assert running_the_app == expected
