"""Embedded engine benchmark: batched decode, shared prefill, kvpress parity, byte accounting.

Prints, measured side by side in one run on the same model and items (the machine's load first and last):
  (a) wall time of examples/quick.toml's sweep per item: configs decoded as one batch / each config
      decoded alone after the shared prefill / each config run on its own (its own prefill);
      target <= 0.2 of the separate runs;
  (b) our per-item time / kvpress's own pipeline, for the same press and items, kvpress running on a
      freshly loaded copy of the model whose attention kvlab never touched; then the batched sweep's time
      per item-config / kvpress's (target <= 0.2);
  (c) physical / analytic KV bytes for every config;
  (d) per config of examples/quick.toml: its TTFT in the sweep / its TTFT run alone (target <= 1.1:
      a sweep must not charge a config for other configs' scorers, nor for the batch);
  (e) one decode step for a batch of K configs / K single steps, K = 1, 2, 4, 8, 16;
  (f) examples/quick.toml's batched sweep per item beside its floor: the model's own forwards for the same work on
      a fresh copy of the model (no kvlab attention, no compression, no scorer): one prefill of the item's prompt,
      then as many decode steps as the sweep's longest answer, one row per config in one batch; per phase (kvlab's
      prefill is the shared context's, the rest everything after it: compression, the question, decoding,
      fidelity); target <= 1.5x the floor.

Usage: python benchmarks/engine_bench.py [--items 1] [--lengths 1024 2048] [--sections a b c d e f]
(run it under `flock /tmp/kvlab-bench.lock`: benchmarks must not overlap)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from batch_timing import decode_step_timings

from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.tasks import TaskSpec
from kvlab.engines.embedded import EmbeddedEngine
from kvlab.models import DEFAULT_MODEL, load_model
from kvlab.spec_files import load_spec
from kvlab.tasks import generate_items

ALL_COMBINATIONS = [
    KVCacheConfig(quant=q, evict=e, ratio=None if e == "none" else 0.5)
    for q in ("none", "int8", "int4", "int2", "fp8_e4m3", "fp8_e5m2")
    for e in ("none", "streaming_llm", "snapkv", "tova", "knorm", "observed_attention", "expected_attention",
              "random", "keydiff", "pyramidkv")
] + [KVCacheConfig(quant="int4", evict="knorm", threshold=0.5),
     KVCacheConfig(quant="int2", evict="snapkv", keep_fraction=0.25, query_aware=True)]


def clocked(fn, repeats: int = 1):
    """``fn()``, its wall seconds and this process's CPU seconds, each the least of ``repeats`` runs
    (on a shared machine other processes only ever add time)."""
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        value = fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return value, min(walls), min(cpus)


def quick_configs() -> list[KVCacheConfig]:
    spec, _ = load_spec("examples/quick.toml")
    return spec.all_configs()


def bench_sweep(engine: EmbeddedEngine, items, repeats: int) -> tuple[float, float]:
    """(a): returns the batched sweep's wall and CPU seconds per item-config."""
    configs = quick_configs()
    alone = EmbeddedEngine(engine.loaded, seed=0, max_batch=1)
    times: dict[int, list[float]] = {}  # by length: wall, then CPU, seconds of batched, decoded alone, separate
    same = 0
    for item in items:
        batched, *t_batched = clocked(lambda item=item: list(engine.evaluate(item, configs)), repeats)
        one_by_one, *t_alone = clocked(lambda item=item: list(alone.evaluate(item, configs)), repeats)
        separate = [clocked(lambda c=c, item=item: list(engine.evaluate(item, [c])), repeats)[1:] for c in configs]
        t_separate = [sum(wall for wall, _ in separate), sum(cpu for _, cpu in separate)]
        same += [r.generated for r in batched] == [r.generated for r in one_by_one]
        row = times.setdefault(item.context_length, [0.0] * 6)
        for index, seconds in enumerate((t_batched[0], t_alone[0], t_separate[0],
                                         t_batched[1], t_alone[1], t_separate[1])):
            row[index] += seconds
    print(f"(a) examples/quick.toml's {len(configs)} configs x {len(items)} items, wall (CPU) seconds, least of "
          f"{repeats} runs: batched decode"
          f" / decoded alone after the shared prefill / separate runs (target <= 0.2); identical answers on "
          f"{same}/{len(items)} items")
    for length, (batched, alone_s, separate, batched_cpu, alone_cpu, separate_cpu) in sorted(times.items()):
        print(f"    {length:5} tokens: batched {batched:6.1f} ({batched_cpu:6.1f}), alone {alone_s:6.1f} "
              f"({alone_cpu:6.1f}), separate {separate:6.1f} ({separate_cpu:6.1f}) -> {batched / alone_s:.3f} "
              f"({batched_cpu / alone_cpu:.3f}) of alone, {batched / separate:.3f} ({batched_cpu / separate_cpu:.3f})"
              " of separate")
    count = len(items) * len(configs)
    return sum(row[0] for row in times.values()) / count, sum(row[3] for row in times.values()) / count


def bench_kvpress_parity(engine: EmbeddedEngine, items, model_name: str,
                         batched_per_config: tuple[float, float] | None, repeats: int) -> None:
    """kvpress's pipeline forward (its press hooks, its DynamicCache, its greedy decoding) on the
    same token ids kvlab feeds, so answers must agree and times compare like with like.  kvpress
    gets its own freshly loaded model: kvlab's engine installs its attention on the one it uses."""
    from kvpress import KVPressTextGenerationPipeline, SnapKVPress, StreamingLLMPress

    fresh = load_model(model_name)
    pipe = KVPressTextGenerationPipeline(model=fresh.model, tokenizer=fresh.tokenizer)
    kvpress_s: list[tuple[float, float]] = []  # wall, CPU
    for name, press, config in [
        ("snapkv-50", SnapKVPress(compression_ratio=0.5), KVCacheConfig(evict="snapkv", ratio=0.5)),
        ("streaming-50", StreamingLLMPress(compression_ratio=0.5), KVCacheConfig(evict="streaming_llm", ratio=0.5)),
    ]:
        ours, theirs, agree = [], [], 0
        for item in items:
            context = torch.tensor([engine.tokenizer(item.context)["input_ids"]])
            question = torch.tensor([engine.tokenizer(item.question, add_special_tokens=False)["input_ids"]])
            results, t_ours, _ = clocked(lambda item=item, config=config: list(engine.evaluate(item, [config])),
                                         repeats)
            answers, t_theirs, cpu_theirs = clocked(
                lambda context=context, question=question, results=results, press=press: pipe._forward(
                    {"context_ids": context, "questions_ids": [question]}, max_new_tokens=results[0].output_tokens,
                    press=press), repeats)
            ours.append(t_ours)
            theirs.append(t_theirs)
            kvpress_s.append((t_theirs, cpu_theirs))
            agree += results[0].generated == answers[0]
        print(f"(b) {name}: kvlab {statistics.fmean(ours):.2f} s/item, kvpress pipeline "
              f"{statistics.fmean(theirs):.2f} s/item -> ratio {statistics.fmean(ours) / statistics.fmean(theirs):.3f}"
              f" (target <= 1.0); identical answers on {agree}/{len(items)} items")
    if batched_per_config is not None:
        (ours_wall, ours_cpu), theirs_wall, theirs_cpu = (batched_per_config, statistics.fmean(w for w, _ in kvpress_s),
                                                          statistics.fmean(c for _, c in kvpress_s))
        print(f"    batched quick.toml sweep {ours_wall:.2f} s ({ours_cpu:.2f} s CPU) per item-config / kvpress "
              f"pipeline {theirs_wall:.2f} s ({theirs_cpu:.2f} s CPU) per item-config -> {ours_wall / theirs_wall:.3f}"
              f" ({ours_cpu / theirs_cpu:.3f} CPU) (target <= 0.2)")


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
    configs = quick_configs()
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


def bench_decode_steps(engine: EmbeddedEngine, lengths: list[int]) -> None:
    print("(e) one decode step for a batch of K int4 caches / K single steps:")
    for length in lengths:
        for timing in decode_step_timings(engine, length):
            print(f"    {length:5} tokens, K = {timing.members:2}: batch {timing.batched_s * 1000:6.0f} ms, "
                  f"{timing.members} single steps {timing.singles_s * 1000:6.0f} ms -> {timing.ratio:.3f}")


def bench_floor(engine: EmbeddedEngine, items, model_name: str) -> None:
    """(f): kvlab's batched sweep of quick.toml per item beside the same prefill and decode steps as plain forwards."""
    configs = quick_configs()
    fresh = load_model(model_name).model  # kvlab installs its attention on the engine's copy
    with torch.inference_mode():  # warm, as the engine is: its first forward pays for one-time set-up
        warm = fresh(torch.tensor([engine.tokenizer(items[0].context)["input_ids"][:256]]), use_cache=True)
        fresh(warm.logits[:, -1:].argmax(-1), past_key_values=warm.past_key_values, use_cache=True)
    print(f"(f) examples/quick.toml's {len(configs)} configs, kvlab's batched sweep / its floor (the model's own "
          "prefill, then one batched decode step per token of the longest answer, a row per config), seconds:")
    for item in items:
        started = time.perf_counter()
        results = list(engine.evaluate(item, configs))
        wall = time.perf_counter() - started
        prefill = max(r.prefill_s for r in results)  # the shared prefill, charged once
        steps = max(r.output_tokens for r in results)
        prompt = engine.tokenizer(item.context)["input_ids"] + engine.tokenizer(
            item.question, add_special_tokens=False)["input_ids"]
        with torch.inference_mode():
            started = time.perf_counter()
            out = fresh(torch.tensor([prompt]), use_cache=True)
            floor_prefill = time.perf_counter() - started
            cache = out.past_key_values
            cache.batch_repeat_interleave(len(configs))
            token = out.logits[:, -1:].argmax(-1).repeat(len(configs), 1)
            started = time.perf_counter()
            for _ in range(steps - 1):  # the first token came with the prefill
                token = fresh(token, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
            floor_decode = time.perf_counter() - started
        floor = floor_prefill + floor_decode
        print(f"    {item.context_length:5} tokens: kvlab {wall:6.2f} (prefill {prefill:5.2f}, the rest "
              f"{wall - prefill:6.2f}) / floor {floor:6.2f} (prefill {floor_prefill:5.2f}, {steps - 1} decode steps "
              f"{floor_decode:5.2f}) -> {wall / floor:.2f}x (prefill {prefill / floor_prefill:.2f}x, the rest "
              f"{(wall - prefill) / floor_decode:.2f}x)")


def load() -> str:
    return "load average " + " ".join(f"{value:.2f}" for value in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=1, help="passkey items per length")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048], help="context lengths (tokens)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each timed sweep; the least counts")
    parser.add_argument("--sections", nargs="+", default=list("abcdef"), choices=list("abcdef"))
    parser.add_argument("--model", default=DEFAULT_MODEL)
    args = parser.parse_args()
    torch.manual_seed(0)
    engine = EmbeddedEngine(load_model(args.model), seed=0)
    spec = TaskSpec(name="passkey", context_lengths=args.lengths, num_items=args.items)
    items = generate_items(spec, engine.tokenizer, seed=0)
    print(f"model {args.model}, {len(items)} passkey items at {args.lengths} tokens, torch threads "
          f"{torch.get_num_threads()}; {load()}")
    # warm-up: every code path (scorers, quantizers, batched and one-config decoding) once, on a short item
    warm = generate_items(TaskSpec(name="passkey", context_lengths=[256], num_items=1), engine.tokenizer, seed=1)[0]
    list(engine.evaluate(warm, quick_configs()))
    list(EmbeddedEngine(engine.loaded, seed=0, max_batch=1).evaluate(warm, quick_configs()))
    batched_per_config = bench_sweep(engine, items, args.repeats) if "a" in args.sections else None
    if "b" in args.sections:
        bench_kvpress_parity(engine, items, args.model, batched_per_config, args.repeats)
    if "c" in args.sections:
        bench_bytes(engine, items[0])
    if "d" in args.sections:
        bench_ttft_attribution(engine, items)
    if "e" in args.sections:
        bench_decode_steps(engine, args.lengths)
    if "f" in args.sections:
        bench_floor(engine, items, args.model)
    print(f"done; {load()}")


if __name__ == "__main__":
    main()
