"""Whole process: ``kvlab run`` against kvpress's own pipeline on the same items and eviction configs.

Each side is a fresh process, timed from start to exit with its CPU seconds (the children's rusage), so
imports, the model load and every forward count:
  kvlab    ``kvlab run SPEC --no-store --quiet``: its item loop (each item prefilled once, the configs
           compressed from it and decoded in one batch, the fidelity forwards beside them);
  kvpress  this file's ``--kvpress`` child: kvpress's ``KVPressTextGenerationPipeline`` called on each
           item's context and question with the config's press (none for the baseline), as its README does;
alternating (kvlab, kvpress, kvpress, kvlab, ...) so that the machine's load hits both alike.  Prints each
pair, the medians and kvlab's share of kvpress's wall and CPU time (target <= 0.25 idle).

The spec (benchmarks/pipeline.toml by default) may hold eviction configs only: kvpress has no KV
quantization in its pipeline.

Usage: python benchmarks/pipeline_bench.py [--spec benchmarks/pipeline.toml] [--pairs 3]
(run it under `flock /tmp/kvlab-bench.lock`: benchmarks must not overlap)
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KVLAB = str(Path(sys.executable).with_name("kvlab"))
#: kvlab's eviction methods by the name of kvpress's press that implements them.
PRESSES = {"snapkv": "SnapKVPress", "streaming_llm": "StreamingLLMPress", "knorm": "KnormPress"}


def kvpress_child(spec_path: str) -> None:
    """Every (item, config) of the spec through kvpress's pipeline, as a user of kvpress would run it."""
    import kvpress
    from transformers import pipeline

    from kvlab.experiments.runner import build_items
    from kvlab.models import resolve_model
    from kvlab.spec_files import load_spec

    spec, _ = load_spec(spec_path)
    pipe = pipeline("kv-press-text-generation", model=str(resolve_model(spec.model)), device="cpu")
    items = build_items(spec, pipe.tokenizer)
    presses = []
    for config in spec.all_configs():
        if config.quant != "none" or (config.evict != "none" and config.evict not in PRESSES):
            raise SystemExit(f"{config.name}: kvpress's pipeline has no such config (eviction by {list(PRESSES)})")
        presses.append(None if config.evict == "none"
                       else getattr(kvpress, PRESSES[config.evict])(compression_ratio=config.ratio))
    answers = 0
    for item in items:
        for press in presses:
            out = pipe(item.context, question=item.question, press=press, max_new_tokens=item.max_new_tokens)
            answers += bool(out["answer"])
    print(f"kvpress: {answers} answers for {len(items)} items x {len(presses)} configs", file=sys.stderr)


def timed(argv: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of running ARGV to its end (it must succeed: else its output's tail and exit 1)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(ROOT / "benchmarks" / "pipeline.toml"))
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--kvpress", action="store_true", help=argparse.SUPPRESS)  # the child
    args = parser.parse_args()
    if args.kvpress:
        kvpress_child(args.spec)
        return 0
    sides = {"kvlab": [KVLAB, "run", args.spec, "--no-store", "--quiet"],
             "kvpress": [sys.executable, __file__, "--kvpress", "--spec", args.spec]}
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; spec {args.spec}")
    times: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
    for pair in range(args.pairs):
        order = list(sides) if pair % 2 == 0 else list(reversed(sides))
        for side in order:
            times[side].append(timed(sides[side]))
        (kw, kc), (pw, pc) = times["kvlab"][-1], times["kvpress"][-1]
        print(f"pair {pair + 1}: kvlab {kw:.1f} s ({kc:.1f} s CPU), kvpress {pw:.1f} s ({pc:.1f} s CPU)"
              f" -> {kw / pw:.3f} wall, {kc / pc:.3f} CPU", flush=True)
    median = {side: (statistics.median(w for w, _ in rows), statistics.median(c for _, c in rows))
              for side, rows in times.items()}
    (kw, kc), (pw, pc) = median["kvlab"], median["kvpress"]
    print(f"median of {args.pairs}: kvlab {kw:.1f} s ({kc:.1f} s CPU, {kc / kw:.2f} cores busy), kvpress {pw:.1f} s"
          f" ({pc:.1f} s CPU, {pc / pw:.2f} cores busy) -> kvlab/kvpress {kw / pw:.3f} wall, {kc / pc:.3f} CPU"
          " (target <= 0.25 wall, idle)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
