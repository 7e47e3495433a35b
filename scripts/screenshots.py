"""The README's and the tutorial's screenshots, made from a real run: ``docs/images/tradeoff.png`` (an
experiment page's tradeoff chart) and ``docs/images/playground.png`` (a playground Run).

It runs ``kvlab run SPEC --limit N`` into a scratch store, starts the dashboard over it (as the browser tests
do), and photographs the experiment's chart and the playground after one Run of its default configs, in
Debian's chromium through Playwright.  About 4 minutes on 2 CPU cores with the defaults.

Usage: python scripts/screenshots.py [--spec examples/quick.toml] [--limit 4] [--out docs/images]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the dashboard is started as the browser tests start it

from playwright.sync_api import Page, sync_playwright  # noqa: E402

from kvlab.dashboard import page_table  # noqa: E402
from tests.e2e.dashboard_server import CHROMIUM, CHROMIUM_ARGS, start_dashboard  # noqa: E402

#: Long enough for a Run that starts `kvlab serve` and loads the model on a busy machine.
WAIT_MS = 600_000
VIEWPORT = {"width": 1280, "height": 1000}


def run_experiment(spec: Path, limit: int, store_url: str) -> None:
    """``kvlab run`` of ``spec``'s first ``limit`` items, stored in ``store_url`` (experiment 1)."""
    env = dict(os.environ, KVLAB_DATABASE_URL=store_url)
    subprocess.run([sys.executable, "-m", "kvlab.cli", "run", str(spec), "--limit", str(limit), "--quiet"],
                   cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)


def idle(page: Page) -> None:
    """Wait until the page's script has run to its end."""
    page.locator("[data-testid=stApp][data-test-script-state=notRunning]").wait_for(timeout=WAIT_MS)


def tradeoff(page: Page, base: str, out: Path) -> None:
    page.goto(f"{base}/{page_table.EXPERIMENT.url_path}?id=1")
    chart = page.locator(".js-plotly-plot").first
    chart.locator(".main-svg").first.wait_for(state="visible", timeout=WAIT_MS)
    idle(page)
    chart.screenshot(path=out / "tradeoff.png")


def playground(page: Page, base: str, out: Path) -> None:
    page.goto(f"{base}/{page_table.PLAYGROUND.url_path}?length=1024")
    page.get_by_role("heading", name="Playground").wait_for(timeout=WAIT_MS)
    idle(page)
    page.get_by_role("button", name="Run").click()
    page.locator("[data-testid=stApp][data-test-script-state=running]").wait_for(timeout=WAIT_MS)
    idle(page)
    page.locator("div[style*='white-space:pre-wrap']").last.wait_for(state="visible", timeout=WAIT_MS)
    # the answers and token maps, under the Run button: scroll it to the top of the view
    page.get_by_role("button", name="Run").evaluate("button => button.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(500)
    page.screenshot(path=out / "playground.png")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "examples" / "quick.toml", help="the spec to run")
    parser.add_argument("--limit", type=int, default=4, help="its first N items (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images", help="where the PNGs go")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kvlab-screenshots-") as scratch:
        store_url = f"sqlite:///{Path(scratch) / 'kvlab.sqlite'}"
        run_experiment(args.spec.resolve(), args.limit, store_url)
        process, base = start_dashboard(store_url, Path(scratch) / "streamlit.log",
                                        {"KVLAB_LOG_DIR": scratch})
        try:
            with sync_playwright() as driver:
                browser = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_context(viewport=VIEWPORT).new_page()
                tradeoff(page, base, args.out)
                playground(page, base, args.out)
                browser.close()
        finally:
            process.terminate()
            process.wait(timeout=60)
    print(f"wrote {args.out / 'tradeoff.png'} and {args.out / 'playground.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
