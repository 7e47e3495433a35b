"""Embedded engine benchmark: shared prefill, kvpress parity, byte accounting.

Prints, measured side by side in one run on the same model and items:
  (a) wall time of one sweep (prefill shared across configs) / each config run on its own;
  (b) our per-item time / kvpress's own pipeline, for the same press and items, kvpress running on a
      freshly loaded copy of the model whose attention kvlab never touched;
  (c) physical / analytic KV bytes for every config;
  (d) per config of examples/quick.toml: its TTFT in the sweep / its TTFT run alone (target <= 1.1:
      a sweep must not charge a config for other configs' scorers).

Usage: python benchmarks/engine_bench.py [--items 2] [--lengths 1024 2048]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from kvlab.config import KVCacheConfig
from kvlab.engines.embedded import EmbeddedEngine
from kvlab.models import DEFAULT_MODEL, load_model
from kvlab.tasks import generate_items
from kvlab.tasks.spec import TaskSpec

SWEEP = [
    KVCacheConfig(name="baseline"),
    KVCacheConfig(name="int8", quant="int8"),
    KVCacheConfig(name="int4", quant="int4"),
    KVCacheConfig(name="int2", quant="int2"),
    KVCacheConfig(name="streaming-50", evict="streaming_llm", ratio=0.5),
    KVCacheConfig(name="snapkv-50", evict="snapkv", ratio=0.5),
    KVCacheConfig(name="h2o-50", evict="observed_attention", ratio=0.5),
    KVCacheConfig(name="int4+snapkv-75", quant="int4", evict="snapkv", ratio=0.75),
]
ALL_COMBINATIONS = [
    KVCacheConfig(quant=q, evict=e, ratio=None if e == "none" else 0.5)
    for q in ("none", "int8", "int4", "int2", "fp8_e4m3", "fp8_e5m2")
    for e in ("none", "streaming_llm", "snapkv", "tova", "knorm", "observed_attention", "expected_attention",
              "random", "keydiff", "pyramidkv")
] + [KVCacheConfig(quant="int4", evict="knorm", threshold=0.5),
     KVCacheConfig(quant="int2", evict="snapkv", keep_fraction=0.25, query_aware=True)]


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def bench_shared_prefill(engine: EmbeddedEngine, items) -> None:
    shared_by_length: dict[int, float] = {}
    separate_by_length: dict[int, float] = {}
    for item in items:
        _, shared = timed(lambda: list(engine.evaluate(item, SWEEP)))
        separate = sum(timed(lambda c=c: list(engine.evaluate(item, [c])))[1] for c in SWEEP)
        shared_by_length[item.context_length] = shared_by_length.get(item.context_length, 0.0) + shared
        separate_by_length[item.context_length] = separate_by_length.get(item.context_length, 0.0) + separate
    shared, separate = sum(shared_by_length.values()), sum(separate_by_length.values())
    per_length = ", ".join(f"{length} tokens {shared_by_length[length] / separate_by_length[length]:.3f}"
                           for length in sorted(shared_by_length))
    print(f"(a) sweep of {len(SWEEP)} configs x {len(items)} items: one shared prefill per item {shared:.1f} s, "
          f"each config alone {separate:.1f} s -> ratio {shared / separate:.3f} (target <= 0.35); "
          f"by length: {per_length}")


def bench_kvpress_parity(engine: EmbeddedEngine, items, model_name: str) -> None:
    """kvpress's pipeline forward (its press hooks, its DynamicCache, its greedy decoding) on the
    same token ids kvlab feeds, so answers must agree and times compare like with like.  kvpress
    gets its own freshly loaded model: kvlab's engine installs its attention on the one it uses."""
    from kvpress import KVPressTextGenerationPipeline, SnapKVPress, StreamingLLMPress

    fresh = load_model(model_name)
    pipe = KVPressTextGenerationPipeline(model=fresh.model, tokenizer=fresh.tokenizer)
    for name, press, config in [
        ("snapkv-50", SnapKVPress(compression_ratio=0.5), KVCacheConfig(evict="snapkv", ratio=0.5)),
        ("streaming-50", StreamingLLMPress(compression_ratio=0.5), KVCacheConfig(evict="streaming_llm", ratio=0.5)),
    ]:
        ours, theirs, agree = [], [], 0
        for item in items:
            context = torch.tensor([engine.tokenizer(item.context)["input_ids"]])
            question = torch.tensor([engine.tokenizer(item.question, add_special_tokens=False)["input_ids"]])
            results, t_ours = timed(lambda: list(engine.evaluate(item, [config])))
            answers, t_theirs = timed(lambda: pipe._forward({"context_ids": context, "questions_ids": [question]},
                                                            max_new_tokens=results[0].output_tokens, press=press))
            ours.append(t_ours)
            theirs.append(t_theirs)
            agree += results[0].generated == answers[0]
        print(f"(b) {name}: kvlab {statistics.fmean(ours):.2f} s/item, kvpress pipeline "
              f"{statistics.fmean(theirs):.2f} s/item -> ratio {statistics.fmean(ours) / statistics.fmean(theirs):.3f}"
              f" (target <= 1.0); identical answers on {agree}/{len(items)} items")


def bench_bytes(engine: EmbeddedEngine, item) -> None:
    print(f"(c) physical / analytic KV bytes, {len(ALL_COMBINATIONS)} configs on one {item.context_length}-token item:")
    worst = 0.0
    for result in engine.evaluate(item, ALL_COMBINATIONS):
        ratio = result.physical_kv_bytes / result.analytic_kv_bytes
        worst = max(worst, abs(ratio - 1))
        print(f"    {result.config_name:45} physical {result.physical_kv_bytes:>10,d} B  analytic "
              f"{result.analytic_kv_bytes:>10,d} B  -> {ratio:.4f}   compression {result.compression_ratio:5.2f}x")
    print(f"    worst deviation {worst:.4%} (target <= 1%)")


def bench_ttft_attribution(engine: EmbeddedEngine, items) -> None:
    """Each config's median TTFT inside the whole quick.toml sweep over its TTFT run alone."""
    from kvlab.config import load_spec

    spec, _ = load_spec("examples/quick.toml")
    configs = spec.all_configs()
    in_sweep: dict[str, list[float]] = {c.label: [] for c in configs}
    alone: dict[str, list[float]] = {c.label: [] for c in configs}
    for item in items:
        for result in engine.evaluate(item, configs):
            in_sweep[result.config_name].append(result.ttft_s)
        for config in configs:
            alone[config.label] += [r.ttft_s for r in engine.evaluate(item, [config])]
    print(f"(d) TTFT in the {len(configs)}-config sweep / TTFT alone, median over {len(items)} items "
          "(target <= 1.1):")
    for label in in_sweep:
        ratio = statistics.median(in_sweep[label]) / statistics.median(alone[label])
        print(f"    {label:16} sweep {statistics.median(in_sweep[label]) * 1000:7.0f} ms  alone "
              f"{statistics.median(alone[label]) * 1000:7.0f} ms  -> {ratio:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=2, help="passkey items per length")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048], help="context lengths (tokens)")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    args = parser.parse_args()
    torch.manual_seed(0)
    engine = EmbeddedEngine(load_model(args.model), seed=0)
    spec = TaskSpec(name="passkey", context_lengths=args.lengths, num_items=args.items)
    items = generate_items(spec, engine.tokenizer, seed=0)
    print(f"model {args.model}, {len(items)} passkey items at {args.lengths} tokens, torch threads "
          f"{torch.get_num_threads()}")
    list(engine.evaluate(items[0], SWEEP[:1]))  # warm-up
    bench_shared_prefill(engine, items)
    bench_kvpress_parity(engine, items, args.model)
    bench_bytes(engine, items[0])
    bench_ttft_attribution(engine, items)


if __name__ == "__main__":
    main()
