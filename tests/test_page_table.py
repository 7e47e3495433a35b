"""The table of dashboard pages (kvlab.dashboard.page_table): every row names a module that exists, one
URL path per page, one default page."""

from __future__ import annotations

from pathlib import Path

from kvlab.dashboard.page_table import PAGES

ROOT = Path(__file__).resolve().parent.parent


def test_every_row_names_an_existing_module():
    assert [p.script for p in PAGES if not (ROOT / p.script).is_file()] == []


def test_url_paths_are_distinct_and_one_page_is_the_default():
    assert len({p.url_path for p in PAGES}) == len(PAGES)
    assert sum(p.default for p in PAGES) == 1
