"""Serving benchmark: what going through ``kvlab serve`` over HTTP costs, against the engine in process.

Prints, measured side by side in one run on the same items and configs:
  (a) median TTFT and TPOT of the embedded engine in this process vs the openai_compat backend on a
      ``kvlab serve`` subprocess with the same thread count, one request at a time -> the ratios
      (the HTTP, JSON and streaming overhead);
  (b) the wall time of the served run with 1 and with 2 requests in flight (the server runs one
      request at a time, so concurrency shows up as queueing in TTFT, not as throughput).
Both backends must give the same answers; the script says so.

Usage: python benchmarks/serve_bench.py [--items 4] [--length 1024] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from kvlab.core.experiment_spec import parse_spec
from kvlab.engines.embedded import EmbeddedEngine
from kvlab.engines.managed_server import ManagedServer, free_port
from kvlab.experiments.runner import ExperimentRun, run_experiment
from kvlab.models import DEFAULT_MODEL, load_model

CONFIGS = [{"name": "baseline"}, {"name": "int4", "quant": "int4"},
           {"name": "snapkv-50", "evict": "snapkv", "ratio": 0.5}]


def spec(items: int, length: int, backend: dict) -> dict:
    return {"name": "serve-bench", "model": DEFAULT_MODEL, "configs": CONFIGS, "backend": backend,
            "tasks": [{"name": "passkey", "context_lengths": [length], "depths": [0.5], "num_items": items,
                       "max_new_tokens": 12}]}


def medians(run: ExperimentRun) -> tuple[float, float]:
    return (statistics.median(r.ttft_s for r in run.results),
            statistics.median(r.tpot_s for r in run.results if r.tpot_s))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=4)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    embedded = run_experiment(parse_spec(spec(args.items, args.length, {"kind": "embedded"})),
                              engine=EmbeddedEngine(load_model(DEFAULT_MODEL)))
    port = free_port()
    command = [sys.executable, "-m", "kvlab.cli", "serve", "--port", str(port), "--threads", str(args.threads)]
    with tempfile.TemporaryDirectory() as tmp, \
            ManagedServer(command, f"http://127.0.0.1:{port}/health", Path(tmp) / "serve.log", startup_timeout_s=120):
        backend = {"kind": "openai_compat", "base_url": f"http://127.0.0.1:{port}/v1"}
        served = {n: run_experiment(parse_spec(spec(args.items, args.length, backend | {"max_concurrency": n})))
                  for n in (1, 2)}
    answers = {(r.item_id, r.config_name): r.score for r in embedded.results}
    same = all(answers[(r.item_id, r.config_name)] == r.score for run in served.values() for r in run.results)
    (e_ttft, e_tpot), (s_ttft, s_tpot) = medians(embedded), medians(served[1])
    n = len(embedded.results)
    print(f"{n} evaluations per run ({args.items} passkey items x {len(CONFIGS)} configs, {args.length} tokens, "
          f"{args.threads} threads); same scores on both backends: {same}")
    print(f"(a) TTFT median: embedded {e_ttft * 1000:.0f} ms, served {s_ttft * 1000:.0f} ms -> "
          f"{s_ttft / e_ttft:.2f}x;  TPOT median: embedded {e_tpot * 1000:.1f} ms, served {s_tpot * 1000:.1f} ms -> "
          f"{s_tpot / e_tpot:.2f}x")
    print(f"(b) served wall time: 1 in flight {served[1].wall_s:.1f} s, 2 in flight {served[2].wall_s:.1f} s -> "
          f"{served[2].wall_s / served[1].wall_s:.2f}x; TTFT median at 2 in flight "
          f"{medians(served[2])[0] * 1000:.0f} ms (queueing)")


if __name__ == "__main__":
    main()
