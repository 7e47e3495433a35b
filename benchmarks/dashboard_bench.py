"""Dashboard benchmark: server time to render pages over a big store.

Fills a temporary SQLite store with ~10k trials (60 sweeps of 168 configs, every one finished with
item results, so the experiments page computes a sweet spot for each visible row) and 1M telemetry
samples on the first sweep, then times Streamlit's script run (AppTest, server side) of
the experiments page and of that experiment's page: the first run (cold caches) and the median of
the next ones.  Target: < 1.5 s each.

Usage: python benchmarks/dashboard_bench.py [--telemetry 1000000] [--experiments 60]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the synthetic results builder lives with the tests

from streamlit.testing.v1 import AppTest  # noqa: E402

from kvlab.core.experiment_spec import parse_spec  # noqa: E402
from kvlab.dashboard import page_table  # noqa: E402
from kvlab.store import Store, TelemetrySample  # noqa: E402
from tests.dashboard_data import item_result  # noqa: E402

APP = str(ROOT / "app.py")
SWEEP = {"name": "big-sweep", "tasks": [{"name": "passkey", "context_lengths": [256]}],
         "sweep": {"quant": ["none", "int8", "int4", "int2", "fp8_e4m3", "fp8_e5m2"],
                   "evict": ["none", "streaming_llm", "snapkv", "tova", "knorm", "observed_attention",
                             "expected_attention", "random", "keydiff", "pyramidkv"],
                   "ratios": [0.25, 0.5, 0.75]}}
PROFILES = ("baseline", "int4", "int2", "snapkv-50")


def _finish(store: Store, experiment_id: int, configs: int, items: int) -> list:
    trials = store.claim_trials("bench", max_trials=configs, experiment_id=experiment_id)
    for trial in trials:
        for item in range(items):
            result = item_result(PROFILES[trial.position % len(PROFILES)], item, 256, 0.5)
            result.config_name = trial.config_name
            store.add_item_result(trial.id, result)
        store.finish_trial(trial.id, "done", worker_id="bench")
    return trials


def fill(store: Store, experiments: int, telemetry: int) -> int:
    spec = parse_spec(SWEEP)
    configs = len(spec.all_configs())
    first = store.create_experiment(spec, {})
    trials = _finish(store, first, configs, items=10)
    for index in range(1, experiments):
        _finish(store, store.create_experiment(parse_spec(SWEEP | {"name": f"big-sweep-{index}"}), {}), configs, 2)
    now = time.time() - telemetry * 0.05
    for start in range(0, telemetry, 20_000):
        store.add_telemetry([TelemetrySample(experiment_id=first, worker_id="bench", ts=now + i * 0.05,
                                             phase=("prefill", "compress", "decode")[i % 3], source="cpu",
                                             trial_id=trials[i % len(trials)].id, rss_bytes=10**9 + i,
                                             cpu_percent=150.0, kv_bytes=2 * 10**7)
                             for i in range(start, min(start + 20_000, telemetry))])
    return first


def render_times(runs: int, page: str | None = None, **params: str) -> list[float]:
    """Script-run times of ``page`` (a page's script, kvlab.dashboard.page_table; None: the default experiments
    page)."""
    at = AppTest.from_file(APP, default_timeout=120)
    for key, value in params.items():
        at.query_params[key] = value
    if page is not None:
        at.run()  # the first request goes through app.py's default page, as in a browser
        at.switch_page(page)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        at.run()
        times.append(time.perf_counter() - start)
        assert not at.exception, at.exception
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--telemetry", type=int, default=1_000_000)
    parser.add_argument("--experiments", type=int, default=60)
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'big.sqlite'}"
        os.environ["KVLAB_DATABASE_URL"] = url
        store = Store(url)
        start = time.perf_counter()
        experiment_id = fill(store, args.experiments, args.telemetry)
        trials = sum(e.trials_total for e in store.list_experiments(limit=100_000))
        print(f"store: {trials:,} trials, {args.telemetry:,} telemetry samples, "
              f"results for every trial (filled in {time.perf_counter() - start:.0f} s)")
        render_times(1)  # imports and the app's one-time setup, not a page's cost
        for label, page, params in (("experiments page", None, {}),
                                    ("experiment page", page_table.EXPERIMENT.script, {"id": str(experiment_id)})):
            times = render_times(args.runs, page, **params)
            print(f"{label}: first render {times[0]:.2f} s, then median {statistics.median(times[1:]):.2f} s "
                  f"(target < 1.5 s)")


if __name__ == "__main__":
    main()
