"""Telemetry benchmark: ingest rate of batched writes, and what sampling costs a running trial.

Prints, measured side by side in one run:
  (a) telemetry rows/s written one row per insert vs in batches of 1000 (SQLite file; PostgreSQL too
      when KVLAB_TEST_POSTGRES_URL is set);
  (b) the wall time of the same trial with no sampler, a 1 Hz and a 20 Hz sampler writing to SQLite,
      interleaved over several rounds -> overhead in % (target < 2%).

Usage: python benchmarks/telemetry_bench.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from kvlab.core.experiment_spec import parse_spec
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.tasks import TaskSpec
from kvlab.engines.embedded import EmbeddedEngine
from kvlab.experiments.telemetry import SampleContext, TelemetrySampler, detect_sources
from kvlab.models import DEFAULT_MODEL, load_model
from kvlab.store import Store, TelemetrySample
from kvlab.tasks import generate_items

SPEC = parse_spec({"name": "telemetry-bench", "tasks": [{"name": "passkey"}], "configs": [{"name": "baseline"}]})


def _rows(experiment_id: int, n: int) -> list[TelemetrySample]:
    now = time.time()
    return [TelemetrySample(experiment_id=experiment_id, worker_id="bench", ts=now + i * 0.05, phase="decode",
                            source="cpu", rss_bytes=1_000_000_000 + i, cpu_percent=99.0, kv_bytes=23_000_000)
            for i in range(n)]


def bench_ingest(url: str, label: str) -> None:
    store = Store(url)
    experiment_id = store.create_experiment(SPEC, {})
    single = _rows(experiment_id, 500)
    start = time.perf_counter()
    for row in single:
        store.add_telemetry([row])
    single_rate = len(single) / (time.perf_counter() - start)
    batched = _rows(experiment_id, 50_000)
    start = time.perf_counter()
    for i in range(0, len(batched), 1000):
        store.add_telemetry(batched[i:i + 1000])
    batch_rate = len(batched) / (time.perf_counter() - start)
    print(f"(a) {label}: one row per insert {single_rate:,.0f} rows/s, batches of 1000 {batch_rate:,.0f} rows/s "
          f"-> {batch_rate / single_rate:.0f}x")
    store.close()


def bench_overhead(url: str, rounds: int) -> None:
    store = Store(url)
    experiment_id = store.create_experiment(SPEC, {})
    engine = EmbeddedEngine(load_model(DEFAULT_MODEL))
    item = generate_items(TaskSpec(name="passkey", context_lengths=[1024], num_items=1), engine.tokenizer, 0)[0]
    configs = [KVCacheConfig(), KVCacheConfig(quant="int4"), KVCacheConfig(evict="snapkv", ratio=0.5),
               KVCacheConfig(quant="int2", evict="knorm", ratio=0.5)]
    list(engine.evaluate(item, configs))  # warm-up
    times: dict[str, list[float]] = {"none": [], "1 Hz": [], "20 Hz": []}
    samples: dict[str, int] = {"1 Hz": 0, "20 Hz": 0}
    for _ in range(rounds):
        for label, hz in (("none", None), ("1 Hz", 1.0), ("20 Hz", 20.0)):
            written: list[int] = []

            def write(batch: list[TelemetrySample], written: list[int] = written) -> None:
                store.add_telemetry(batch)
                written.append(len(batch))

            sampler = None
            if hz is not None:
                sampler = TelemetrySampler(detect_sources(engine.current_kv_bytes),
                                           SampleContext(experiment_id, "bench"), write, rate_hz=hz,
                                           phase_of=lambda: (engine.phase, None)).start()
            start = time.perf_counter()
            list(engine.evaluate(item, configs))
            times[label].append(time.perf_counter() - start)
            if sampler is not None:
                sampler.stop()
                samples[label] += sum(written)
    base = statistics.median(times["none"])
    for label in ("1 Hz", "20 Hz"):
        trial = statistics.median(times[label])
        print(f"(b) {label}: trial {trial:.2f} s vs {base:.2f} s without sampling -> overhead "
              f"{(trial - base) / base:+.1%} (target < 2%), {samples[label] / rounds:.0f} samples per trial")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        bench_ingest(f"sqlite:///{Path(folder) / 'ingest.sqlite'}", "SQLite")
        if os.environ.get("KVLAB_TEST_POSTGRES_URL"):
            bench_ingest(os.environ["KVLAB_TEST_POSTGRES_URL"], "PostgreSQL")
        bench_overhead(f"sqlite:///{Path(folder) / 'overhead.sqlite'}", args.rounds)


if __name__ == "__main__":
    main()
