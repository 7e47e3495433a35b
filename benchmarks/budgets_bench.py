"""Where the bits go: the same total budget shared out three ways, keys and values in different formats,
and 16-bit first and last layers, side by side on the same items in one run.

On a spec's items (examples/quick.toml by default: 20 passkey items of 1K and 2K tokens) through the
embedded engine, every config of each group against the baseline:
  budget    SnapKV keeping 25% of the context per head (uniform), PyramidKV's per-layer schedule of the
            same total, AdaKV and CriticalAdaKV sharing each layer's total out across its heads, and
            KVzip sharing the model's total out across every layer and head (scored by a replay);
  formats   K8V4, K4V4, K4V8 (keys and values in different integer formats);
  layers    int2 in every layer, and with the first and last 2 layers kept 16-bit.
For each: accuracy, mean KL against the baseline (teacher-forced, nats per token), top-1 agreement and
the measured bytes of the prompt cache (mean over items).  For the head-wise configs it also runs
kvpress's own press on the same token ids: its answers (the same as kvlab's?) and the bytes its cache
holds, which keeps every token of the context and masks the evicted ones (measured from its tensors'
shapes, counted at 16-bit as kvlab's are).

Usage: python benchmarks/budgets_bench.py [--spec examples/quick.toml] [--items N] [--json OUT]
(run it under `flock /tmp/kvlab-bench.lock`: benchmarks must not overlap)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from kvlab.threads import share_cores

share_cores()  # before torch loads (kvlab/threads.py): the machine is shared

import torch  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from kvlab.compress.accounting import BASELINE_BYTES_PER_ELEMENT  # noqa: E402
from kvlab.core.kv_config import BASELINE, KVCacheConfig  # noqa: E402
from kvlab.engines.embedded import EmbeddedEngine  # noqa: E402
from kvlab.experiments.runner import build_items  # noqa: E402
from kvlab.models import load_model  # noqa: E402
from kvlab.spec_files import load_spec  # noqa: E402
from kvlab.tasks import score_item  # noqa: E402

GROUPS: dict[str, list[KVCacheConfig]] = {
    "budget": [KVCacheConfig(evict="snapkv", ratio=0.75), KVCacheConfig(evict="pyramidkv", ratio=0.75),
               KVCacheConfig(evict="snapkv", ratio=0.75, heads="adakv"),
               KVCacheConfig(evict="snapkv", ratio=0.75, heads="critical_adakv"),
               KVCacheConfig(evict="kvzip", ratio=0.75)],
    "formats": [KVCacheConfig(quant="int8", value_quant="int4"), KVCacheConfig(quant="int4"),
                KVCacheConfig(quant="int4", value_quant="int8")],
    "layers": [KVCacheConfig(quant="int2"), KVCacheConfig(quant="int2", skip_layers={"first": 2, "last": 2})],
}


def kvpress_run(pipeline, tokenizer, item, config: KVCacheConfig, max_new_tokens: int) -> tuple[str, int]:
    """kvpress's answer with its own head-wise press, and the bytes its cache holds at 16-bit."""
    import kvpress

    from kvlab.compress.eviction import press_class
    from kvlab.core.methods import HEAD_BUDGETS, METHODS

    press = getattr(kvpress, HEAD_BUDGETS[config.heads].press)(press=press_class(METHODS[config.evict])(),
                                                                alpha_safeguard=config.alpha_safeguard)
    press.compression_ratio = config.ratio
    cache = DynamicCache()
    context = torch.tensor([tokenizer(item.context)["input_ids"]])
    question = torch.tensor([tokenizer(item.question, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        answer = pipeline._forward({"context_ids": context, "questions_ids": [question]},
                                   max_new_tokens=max_new_tokens, press=press, cache=cache)[0]
    entries = sum(layer.keys.numel() + layer.values.numel() for layer in cache.layers)
    return answer, entries * BASELINE_BYTES_PER_ELEMENT


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="examples/quick.toml")
    parser.add_argument("--items", type=int, help="the first N items only (default: all)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from kvpress import KVPressTextGenerationPipeline

    spec, _ = load_spec(args.spec)
    engine = EmbeddedEngine(load_model(spec.model), seed=spec.seed)
    theirs = load_model(spec.model)  # kvpress's own copy, never touched by kvlab
    pipeline = KVPressTextGenerationPipeline(model=theirs.model, tokenizer=theirs.tokenizer)
    items = build_items(spec, engine.tokenizer)[:args.items]
    configs = [BASELINE] + [c for group in GROUPS.values() for c in group]
    print(f"load average {os.getloadavg()[0]:.2f}; {len(items)} items x {len(configs)} configs")
    rows: dict[str, dict[str, list[float]]] = {c.label: {} for c in configs}
    for index, item in enumerate(items):
        for result in engine.evaluate(item, configs):
            row = rows[result.config_name]
            fidelity = result.fidelity
            values = {"score": score_item(item, result.generated), "bytes": result.physical_kv_bytes,
                      "ttft": result.ttft_s,
                      "kl": fidelity.mean_kl if fidelity else None, "agree": fidelity.agreement if fidelity else None}
            for key, value in values.items():
                if value is not None:
                    row.setdefault(key, []).append(value)
            config = next(c for c in configs if c.label == result.config_name)
            if config.heads != "uniform":
                answer, masked = kvpress_run(pipeline, engine.tokenizer, item, config, result.output_tokens)
                row.setdefault("kvpress_bytes", []).append(masked)
                row.setdefault("kvpress_same", []).append(float(answer == result.generated))
        print(f"item {index + 1}/{len(items)} done", flush=True)
    baseline_bytes = statistics.fmean(rows[BASELINE.label]["bytes"])
    summary = {}
    for label, row in rows.items():
        mean = {key: statistics.fmean(values) for key, values in row.items() if values}
        summary[label] = mean
    print(f"\n{'config':34} {'accuracy':>8} {'mean KL':>8} {'agree':>6} {'KV MiB':>8} {'ratio':>6} {'TTFT s':>6} "
          f"{'kvpress MiB':>11} {'same as kvpress':>15}")
    for group, members in [("", [BASELINE]), *GROUPS.items()]:
        if group:
            print(f"-- {group}")
        for config in members:
            m = summary[config.label]
            kvpress_mib = f"{m['kvpress_bytes'] / 2**20:11.2f}" if "kvpress_bytes" in m else f"{'-':>11}"
            same = f"{m['kvpress_same']:15.0%}" if "kvpress_same" in m else f"{'-':>15}"
            print(f"{config.label:34} {m['score']:8.2f} {m.get('kl', 0.0):8.3f} {m.get('agree', 1.0):6.1%} "
                  f"{m['bytes'] / 2**20:8.2f} {baseline_bytes / m['bytes']:6.2f} {m['ttft']:6.2f} {kvpress_mib} {same}")
    print(f"load average {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
