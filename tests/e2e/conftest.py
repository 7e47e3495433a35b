"""The browser the e2e tests drive: Debian's chromium through Playwright, one per test module."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.dashboard_server import CHROMIUM, CHROMIUM_ARGS
from tests.waiting import SAFETY_S


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright not installed: scripts/setup.sh --dev")
    playwright.expect.set_options(timeout=SAFETY_S * 1000)  # each waits for its event; only a hang reaches this
    with playwright.sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()
