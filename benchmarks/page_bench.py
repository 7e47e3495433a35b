"""Page benchmark: in Debian chromium, the time from navigation until a page's main chart or table
is drawn, on a real `streamlit run app.py`.

For each page: the first load after the server starts (a fresh server per page, so that this load is
the process's first request, in a browser with an empty cache), then warm loads (the same server and
browser, a new tab each: a new session), median of ``--runs``.  Two stores: the tiny example's results
(synthesised as tests/dashboard_data.py writes them) and the dashboard benchmark's big store
(benchmarks/dashboard_bench.py: ~10k trials, 1M telemetry samples; ``--big-experiments`` and
``--big-telemetry`` shrink it).  Goals on 2 CPU cores: under 2 s warm, under 5 s on the first load.

With the times, a breakdown of the warm loads (medians): when the page's websocket opened (the HTML
and the frontend's scripts are loaded then; the session starts and the page's script runs after it),
and the renderer's main-thread CPU time until the chart was drawn (Chromium's ThreadTime: the scripts'
evaluation, layout and drawing, which a busy machine does not inflate as it does the wall times).

The playground (``--playground``, on by default): from clicking Run until the last config's answer and
token map are drawn, for its 4 default configs on a 1K-token passkey item; the first Run (which starts
`kvlab serve` and loads the model) apart from the warm ones (the same item again: median of ``--runs``)
and from Runs of a new item each (another seed, opened by its link: its own prefill, which the page asks the
warm server for as it opens; Run is clicked as soon as the page is drawn, the least head start a user gives it).
Goal: under 5 s warm.  ``--no-pages`` times the playground alone.

Under the dashboard's own load (``--worker``, on by default): every page and the playground are timed while a
real ``kvlab worker`` runs examples/quick.toml on the embedded model in the benchmark's store (started as
the dashboard's launches start it, kvlab.experiments.launcher; cancelled at the end).  ``--no-worker``
times an otherwise idle machine.

A CPU without AVX-512 or AMX is stood in for by capping torch's kernels: ``ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/page_bench.py`` (the caps are printed with the CPU's flags).

Usage: python benchmarks/page_bench.py [--stores tiny,big] [--runs 3] [--big-experiments 60]
       [--big-telemetry 1000000] [--no-playground] [--no-pages] [--no-worker]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the synthetic stores are built by the tests' and the other benchmark's helpers

from playwright.sync_api import Browser, BrowserContext, sync_playwright  # noqa: E402

from benchmarks.dashboard_bench import fill  # noqa: E402
from kvlab.dashboard import page_table  # noqa: E402
from kvlab.dashboard.playground import PlaygroundView  # noqa: E402
from kvlab.store import Store  # noqa: E402
from tests.dashboard_data import populate  # noqa: E402
from tests.e2e.dashboard_server import CHROMIUM, CHROMIUM_ARGS, start_dashboard  # noqa: E402
from tests.tune_data import populate_tune  # noqa: E402

#: page URL -> the element that means its main chart or table is drawn
PAGES = {
    f"/{page_table.EXPERIMENTS.url_path}": "[data-testid=stDataFrame] canvas",
    f"/{page_table.EXPERIMENT.url_path}?id=1": ".js-plotly-plot .main-svg",
    f"/{page_table.NEW.url_path}": "[data-testid=stMetric]",  # the form's preview: trials, items, evaluations, duration
    f"/{page_table.COMPARE.url_path}?ids=1": ".js-plotly-plot .main-svg",
    # No id: the newest tune (tests/tune_data.py's, added last).
    f"/{page_table.TUNE.url_path}": ".js-plotly-plot .main-svg",
}
WARM_GOAL_S, FIRST_GOAL_S = 2.0, 5.0
PLAYGROUND_GOAL_S = 5.0
#: The playground's benchmark: its default configs (and the baseline) on one 1K-token passkey item.
PLAYGROUND_URL = f"/{page_table.PLAYGROUND.url_path}?length=1024"


@contextmanager
def server(store_url: str, log: Path) -> Iterator[str]:
    """`streamlit run app.py` on a free port over ``store_url``, until the block ends."""
    process, url = start_dashboard(store_url, log)
    try:
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


class Load(NamedTuple):
    """One page load, in seconds from navigation."""

    drawn: float  # the main chart or table is visible
    socket: float  # the websocket opened: the HTML and the frontend's scripts are loaded
    cpu: float  # the renderer's main-thread CPU time until drawn


class Figures(NamedTuple):
    first: float
    warm: float  # the medians of the warm loads
    warm_socket: float
    warm_cpu: float


def load(context: BrowserContext, url: str, selector: str) -> Load:
    """Navigate a new tab (a new session) to ``url`` and wait until ``selector`` is visible."""
    page = context.new_page()
    try:
        cdp = context.new_cdp_session(page)
        cdp.send("Performance.enable", {"timeDomain": "threadTicks"})
        socket: list[float] = []
        page.on("websocket", lambda _: socket.append(time.perf_counter()))
        start = time.perf_counter()
        page.goto(url, wait_until="commit")
        page.locator(selector).first.wait_for(state="visible", timeout=120_000)
        drawn = time.perf_counter() - start
        metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
        return Load(drawn, (socket[0] - start) if socket else float("nan"), metrics.get("ThreadTime", float("nan")))
    finally:
        page.close()


def bench_store(browser: Browser, store_url: str, runs: int, log: Path) -> dict[str, Figures]:
    """page -> its figures.  The first load is a fresh browser's (no cache) on a fresh server; the warm
    ones reopen the page in new tabs of that browser (its HTTP cache holds the frontend's scripts, as a
    returning user's does; each tab is a new session)."""
    figures = {}
    for path, selector in PAGES.items():
        with server(store_url, log) as base:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            try:
                first = load(context, base + path, selector)
                warm = [load(context, base + path, selector) for _ in range(runs)]
            finally:
                context.close()
        figures[path] = Figures(first.drawn, *(statistics.median(getattr(w, field) for w in warm)
                                                for field in Load._fields))
    return figures


def run_playground(page) -> float:
    """Click Run and wait until every config's token map is drawn: seconds.  The Run goes on in a thread of the
    dashboard while the page shows its progress, with Run disabled; Run is enabled again by the script run that
    draws the answer, whose maps follow it (the earlier Run's are gone by then)."""
    main = page.get_by_test_id("stMain")
    start = time.perf_counter()
    main.get_by_role("button", name="Run").click()
    main.get_by_role("button", name="Run", disabled=True).wait_for(timeout=600_000)
    main.get_by_role("button", name="Run", disabled=False).wait_for(timeout=600_000)
    # the baseline's map, then each config's: the last one drawn
    page.locator("[data-kvlab-map]").nth(len(PlaygroundView().config)).wait_for(state="visible", timeout=600_000)
    return time.perf_counter() - start


def open_playground(page, url: str) -> None:
    page.goto(url)
    page.get_by_role("heading", name="Playground").wait_for(timeout=120_000)
    page.locator("[data-testid=stApp][data-test-script-state=notRunning]").wait_for(timeout=120_000)


class PlaygroundFigures(NamedTuple):
    first: float  # starts kvlab serve, loads the model
    warm: float  # the same item again (its prefill reused), median
    new_item: float  # another item (another seed: its own prefill) on the warm server, median


def bench_playground(browser: Browser, store_url: str, runs: int, log: Path) -> PlaygroundFigures:
    """The playground's Runs in seconds, on a fresh dashboard that starts its own `kvlab serve`."""
    with server(store_url, log) as base:
        context = browser.new_context(viewport={"width": 1400, "height": 2000})
        try:
            page = context.new_page()
            open_playground(page, base + PLAYGROUND_URL)
            first = run_playground(page)
            warm = [run_playground(page) for _ in range(runs)]
            new_items = []
            for seed in range(1, runs + 1):
                open_playground(page, f"{base}{PLAYGROUND_URL}&seed={seed}")
                new_items.append(run_playground(page))
        finally:
            context.close()
    return PlaygroundFigures(first, statistics.median(warm), statistics.median(new_items))


@contextmanager
def worker_load(store_url: str, enabled: bool) -> Iterator[None]:
    """A real worker running examples/quick.toml in ``store_url``, as the dashboard's launches run one
    (``kvlab run --background``: detached, kvlab.experiments.launcher), until the block ends; then its
    experiment is cancelled and the worker, idle, exits."""
    if not enabled:
        yield
        return
    env = dict(os.environ, KVLAB_DATABASE_URL=store_url)
    kvlab = [sys.executable, "-m", "kvlab.cli"]
    subprocess.run([*kvlab, "run", str(ROOT / "examples" / "quick.toml"), "--background", "--workers", "1"],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    with Store(store_url) as store:
        experiment = max(store.list_experiments(limit=100_000), key=lambda e: e.id)
        deadline = time.monotonic() + 600
        while store.get_experiment(experiment.id).status == "queued":  # the worker has loaded the model
            if time.monotonic() > deadline:
                raise RuntimeError("the benchmark's worker did not start its experiment in 10 minutes")
            time.sleep(1)
    print(f"worker running experiment #{experiment.id} ({experiment.name}) beside the dashboard")
    try:
        yield
    finally:
        subprocess.run([*kvlab, "cancel", str(experiment.id)], env=env, check=True, stdout=subprocess.DEVNULL)


def build(kind: str, folder: Path, experiments: int, telemetry: int) -> str:
    url = f"sqlite:///{folder / f'{kind}.sqlite'}"
    start = time.perf_counter()
    with Store(url) as store:
        if kind == "tiny":
            populate(store, "tiny")
            print("tiny store: 1 experiment of 4 configs x 8 items, with telemetry")
        else:
            fill(store, experiments, telemetry)
            trials = sum(e.trials_total for e in store.list_experiments(limit=100_000))
            print(f"big store: {trials:,} trials, {telemetry:,} telemetry samples "
                  f"(built in {time.perf_counter() - start:.0f} s)")
        populate_tune(store)
    return url


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return "unknown CPU"


def cpu_flags() -> str:
    """The CPU flags the engines' kernels depend on (AVX2, AVX-512, AMX), as /proc/cpuinfo lists them."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            return " ".join(sorted(f for f in flags if f in {"avx2", "avx512f", "avx512_bf16", "amx_tile"})) or "none"
    return "unknown"


#: What caps torch's kernels below the CPU's own ISA: set, they stand in for a CPU without AVX-512 or AMX
#: (the dashboard, its worker and `kvlab serve` inherit them).
ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")


def isa_caps() -> str:
    caps = [f"{name}={os.environ[name]}" for name in ISA_CAPS if os.environ.get(name)]
    return f"; torch's ISA capped: {', '.join(caps)}" if caps else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stores", default="tiny,big", help="comma-separated: tiny, big")
    parser.add_argument("--runs", type=int, default=3, help="warm loads per page (median)")
    parser.add_argument("--big-experiments", type=int, default=60)
    parser.add_argument("--big-telemetry", type=int, default=1_000_000)
    parser.add_argument("--no-playground", dest="playground", action="store_false", help="skip the playground")
    parser.add_argument("--no-pages", dest="pages", action="store_false", help="the playground alone")
    parser.add_argument("--no-worker", dest="worker", action="store_false",
                        help="no worker running beside the dashboard (an idle machine)")
    args = parser.parse_args()
    rows = []
    playground = None
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as driver:
        folder = Path(tmp)
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for kind in args.stores.split(","):
            url = build(kind, folder, args.big_experiments, args.big_telemetry)
            with worker_load(url, args.worker):
                if args.pages:
                    for path, figures in bench_store(browser, url, args.runs, folder / "streamlit.log").items():
                        rows.append((kind, path, figures))
                if args.playground and playground is None:
                    playground = bench_playground(browser, url, args.runs, folder / "streamlit.log")
        browser.close()
    print(f"\nCPU: {cpu_model()}, {os.cpu_count()} cores, flags {cpu_flags()}{isa_caps()}; "
          + ("a worker running quick.toml beside the dashboard" if args.worker else "no worker running"))
    print(f"\n{'store':6} {'page':18} {'first load':>11} {'warm':>7} {'warm: socket':>13} {'warm: CPU':>10}   "
          f"goals: < {FIRST_GOAL_S:g} s first, < {WARM_GOAL_S:g} s warm")
    for kind, path, f in rows:
        flag = "" if f.first < FIRST_GOAL_S and f.warm < WARM_GOAL_S else "  (over goal)"
        print(f"{kind:6} {path:18} {f.first:10.2f}s {f.warm:6.2f}s {f.warm_socket:12.2f}s {f.warm_cpu:9.2f}s{flag}")
    if playground is not None:
        flag = "" if playground.warm < PLAYGROUND_GOAL_S else "  (over goal)"
        print(f"\nplayground, Run to the last token map drawn ({len(PlaygroundView().config)} configs and the "
              f"baseline, 1K-token passkey): first Run (starts kvlab serve, loads the model) {playground.first:.2f} s, "
              f"warm {playground.warm:.2f} s (the same item again; median of {args.runs}; goal < "
              f"{PLAYGROUND_GOAL_S:g} s){flag}; a new item on the warm server {playground.new_item:.2f} s (its own "
              f"prefill; median of {args.runs})")


if __name__ == "__main__":
    main()
