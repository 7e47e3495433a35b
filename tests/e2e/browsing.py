"""What the browser tests wait on: the end of a script run, and a download that only a current button gives."""

from __future__ import annotations

from playwright.sync_api import Download, Locator, Page

#: Milliseconds for an input's rerun to begin before the script state is read (the state reads "notRunning"
#: until the server answers the input).
SETTLE_MS = 300


def wait_idle(page: Page, *, after_input: bool = True) -> None:
    """Until the script run in progress (with ``after_input``, the one an input just started) has finished."""
    if after_input:
        page.wait_for_timeout(SETTLE_MS)
    page.locator("[data-testid=stApp][data-test-script-state=notRunning]").wait_for()


def downloaded(page: Page, button: Locator) -> Download:
    """Click a download button once the page's run has finished, and the download it gives.  A rerun gives each
    deferred download button a new file id and drops the old one, so a button clicked before the browser has
    drawn the new run asks for a file that is gone and nothing downloads (Streamlit logs "Deferred file ... not
    found"); a user sees the same if they click while the page reruns."""
    wait_idle(page)
    with page.expect_download() as info:
        button.click()
    return info.value
