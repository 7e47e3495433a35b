"""What keeping a layer's dequantized blocks for the item's decode saves (issue 50).

A compressed layer used to rebuild its whole quantized prefix from the codes at every decode step (unpack, scale,
shift, rotate back); it now keeps the blocks' floats as they are added (:class:`kvlab.compress.cache.
CompressedLayer`) and rebuilds nothing.  This runs the same item x configs both ways in one process, alternating
(the old way is the same class with its ``materialize`` dequantizing every block again), and prints the wall time
of each and their ratio, and checks the answers are the same.

Usage: python benchmarks/dequant_bench.py [--length 2048] [--new-tokens 32] [--rounds 3]
(run it under `flock /tmp/kvlab-bench.lock`: benchmarks must not overlap)
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from kvlab.compress.cache import CompressedLayer
from kvlab.compress.quantization import dequantize
from kvlab.core.items import TaskItem
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.tasks import TaskSpec
from kvlab.engines.embedded import EmbeddedEngine
from kvlab.models import DEFAULT_MODEL, load_model
from kvlab.tasks import generate_items

CONFIGS = [KVCacheConfig(name="baseline"), KVCacheConfig(quant="int8"), KVCacheConfig(quant="int4"),
           KVCacheConfig(quant="int2"), KVCacheConfig(quant="fp8_e4m3"), KVCacheConfig(quant="int4", rotation=True)]


def _every_step(self: CompressedLayer) -> tuple[torch.Tensor, torch.Tensor]:
    """The old ``materialize``: every block dequantized again at each call."""
    keys = [dequantize(b, self.compute_dtype) for b in self.key_blocks] + [self.key_tail.to(self.compute_dtype)]
    values = [dequantize(b, self.compute_dtype) for b in self.value_blocks] + [self.value_tail.to(self.compute_dtype)]
    return torch.cat(keys, dim=-2), torch.cat(values, dim=-2)


@contextmanager
def dequantizing_every_step() -> Iterator[None]:
    kept = CompressedLayer.materialize
    CompressedLayer.materialize = _every_step  # type: ignore[method-assign]
    try:
        yield
    finally:
        CompressedLayer.materialize = kept  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    engine = EmbeddedEngine(load_model(DEFAULT_MODEL), seed=0)
    item = generate_items(TaskSpec(name="passkey", context_lengths=[args.length], depths=[0.5], num_items=1),
                          engine.tokenizer, seed=0)[0]
    item = TaskItem(**{**item.__dict__, "max_new_tokens": args.new_tokens})
    list(engine.evaluate(item, CONFIGS))  # warm up
    times: dict[str, list[float]] = {"kept floats": [], "every step": []}
    answers: dict[str, list[str]] = {}
    for _ in range(args.rounds):
        for name in times:
            started = time.perf_counter()
            if name == "every step":
                with dequantizing_every_step():
                    results = list(engine.evaluate(item, CONFIGS))
            else:
                results = list(engine.evaluate(item, CONFIGS))
            times[name].append(time.perf_counter() - started)
            answers[name] = [r.generated for r in results]
    assert answers["kept floats"] == answers["every step"], answers
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"{len(CONFIGS)} configs x 1 item of {args.length} tokens, {args.new_tokens} new tokens, "
          f"{torch.get_num_threads()} threads, median of {args.rounds} alternating rounds:")
    for name, value in medians.items():
        print(f"  {name:12} {value:7.2f} s")
    print(f"  kept floats / every step: {medians['kept floats'] / medians['every step']:.2f} (the same answers)")


if __name__ == "__main__":
    main()
