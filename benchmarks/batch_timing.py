"""Time one decode step for a batch of K configs against K single steps (``benchmarks/engine_bench.py``,
``scripts/gpu_check.py``): what batching saves once the weights are read once per step.  Benchmark
code, imported by path (``python benchmarks/engine_bench.py`` puts this folder first on ``sys.path``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from kvlab.compress.cache import KVLabCache, build_compressed_cache
from kvlab.core.kv_config import KVCacheConfig
from kvlab.engines.batched_decode import BatchedCache, MemberClock, wall_clock
from kvlab.engines.embedded import EmbeddedEngine


@dataclass
class StepTiming:
    members: int
    batched_s: float  # one step of the batch of ``members``
    singles_s: float  # ``members`` single steps, one member at a time

    @property
    def ratio(self) -> float:
        return self.batched_s / self.singles_s


@torch.no_grad()
def decode_step_timings(engine: EmbeddedEngine, context_tokens: int, sizes: Sequence[int] = (1, 2, 4, 8, 16),
                        config: KVCacheConfig | None = None, repeats: int = 3) -> list[StepTiming]:
    """For each K in ``sizes``: K caches of ``config`` (default int4) over a ``context_tokens``-token
    prefill; the fastest of ``repeats`` of one batched step and of K single steps."""
    config = config or KVCacheConfig(quant="int4")
    device, model = engine.device, engine.model
    ids = torch.randint(100, 1000, (1, context_tokens), generator=torch.Generator().manual_seed(0)).to(device)
    prefill = DynamicCache(config=model.config)
    model.model(input_ids=ids, past_key_values=prefill, use_cache=True)
    layer_kv = [(layer.keys, layer.values) for layer in prefill.layers]

    def caches(count: int) -> list[KVLabCache]:
        return [build_compressed_cache(config, layer_kv, engine.geometry.layer_windows, context_tokens)
                for _ in range(count)]

    timings = []
    for count in sizes:
        batched, singles = float("inf"), float("inf")
        for _ in range(repeats):  # each step appends one token: a fresh set of caches per repeat
            members = caches(count)
            position = torch.tensor([[context_tokens]], device=device)
            start = wall_clock(device)
            for cache in members:
                model(input_ids=ids[:, -1:], past_key_values=cache, position_ids=position)
            singles = min(singles, wall_clock(device) - start)
            members = caches(count)
            start = wall_clock(device)
            model(input_ids=ids[:, -1:].expand(count, 1),
                  past_key_values=BatchedCache(members, MemberClock(count, device)),
                  position_ids=position.expand(count, 1))
            batched = min(batched, wall_clock(device) - start)
            del members
        timings.append(StepTiming(count, batched, singles))
    return timings
