"""How many sequences of a context length each KV-cache config fits in a memory budget: a projection, computed from
the config's layout, never measured.

One sequence's cache is, layer by layer, the tokens the layer holds (the context, at most its window, at most what
the config's eviction keeps) in the config's layout:

* on kvlab's engine, :func:`kvlab.compress.accounting.analytic_kv_bytes` -- codes and scales of the format, the
  16-bit residual window, 16-bit layers; the bytes the engine measures equal it within 1% (tests/compress);
* on a serving engine, the pool's layout: every held token at the engine's bits per element
  (:func:`kvlab.compress.accounting.kv_bits`), in whole blocks of ``pool_block_tokens`` per layer; the pools the
  servers state equal it within 1% (tests/engines).

The pool is what the GPU leaves for the cache, ``memory x utilization - weights - overhead`` (an estimate: a
serving engine measures its own activations at start-up), or a size the user gives (the engine's own start-up
line).  :func:`project` returns one :class:`ConfigCapacity` per config, with its problem where it has none.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.capacity.architectures import Architecture
from kvlab.compress.accounting import analytic_kv_bytes, kv_bits
from kvlab.core.geometry import CacheGeometry
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.units import GIB

#: Bytes per weight of each weight dtype a projection offers (int4: the codes alone, its scales left out).
WEIGHT_BYTES: dict[str, float] = {"bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "int4": 0.5}
#: vLLM's default ``--gpu-memory-utilization``: the share of the GPU a projection lets the engine take.
DEFAULT_UTILIZATION = 0.9
#: What a projection keeps back for activations, CUDA graphs and the CUDA context (vLLM measures its own at
#: start-up; an 8B model at the default batch takes 1-3 GiB).
DEFAULT_OVERHEAD_GIB = 2.0


@dataclass(frozen=True)
class Pool:
    """The bytes a deployment leaves for the KV cache, and how they were arrived at (in words)."""

    bytes: int
    how: str

    @classmethod
    def on_gpu(cls, memory_bytes: int, arch: Architecture, weight_dtype: str = "bfloat16",
               utilization: float = DEFAULT_UTILIZATION, overhead_gib: float = DEFAULT_OVERHEAD_GIB) -> Pool:
        """``memory x utilization - weights - overhead`` (an estimate), never below 0."""
        weights = arch.params * WEIGHT_BYTES[weight_dtype]
        pool = memory_bytes * utilization - weights - overhead_gib * GIB
        how = (f"estimate: {memory_bytes / GIB:.1f} GiB x {utilization:g} - weights {weights / GIB:.1f} GiB "
               f"({arch.params / 1e9:.2f}B x {WEIGHT_BYTES[weight_dtype]:g} B, {weight_dtype}) - "
               f"{overhead_gib:g} GiB for activations and the runtime")
        if pool <= 0:
            how += f": nothing left for the cache (the weights alone take {weights / GIB:.1f} GiB); add GPUs"
        return cls(max(0, int(pool)), how)


@dataclass(frozen=True)
class ConfigCapacity:
    """One config's projection; ``problem`` says why the figures are None."""

    label: str
    sequence_bytes: int | None = None  # one sequence of the context length, whole blocks
    pool_tokens: int | None = None  # tokens the pool holds, where every layer holds every token
    concurrency: float | None = None  # sequences of the context length the pool holds (vLLM's "Maximum concurrency")
    layout: str = ""  # which layout the bytes follow, in words
    problem: str | None = None

    @property
    def sequences(self) -> int | None:
        """Whole sequences that fit at once."""
        return None if self.concurrency is None else math.floor(self.concurrency + 1e-9)

    def bytes_per_token(self, context_tokens: int) -> float | None:
        return None if self.sequence_bytes is None else self.sequence_bytes / context_tokens


def _held_tokens(config: KVCacheConfig, context_tokens: int) -> int | None:
    """The tokens a full-attention layer keeps of a ``context_tokens`` context (None: scores decide how many)."""
    if config.threshold is not None or config.decode is not None:
        return None
    if config.keep_tokens is not None:
        return min(context_tokens, config.keep_tokens)
    return round(context_tokens * (1 - (config.removed_fraction or 0.0)))


def _server_sequence(config: KVCacheConfig, geometry: CacheGeometry, context_tokens: int, block: int) -> int:
    """A serving engine's pool layout: every layer holds the context (at most its window) in whole blocks, each
    token at :func:`kv_bits` (a 16-bit layer at 16)."""
    total = 0
    for index, window in enumerate(geometry.layer_windows):
        layer = config.for_layer(index, geometry.num_layers)
        tokens = context_tokens if window is None else min(context_tokens, window)
        total += math.ceil(tokens / block) * block * round(geometry.layer_bytes_per_token(kv_bits(layer)))
    return total


def project_config(config: KVCacheConfig, arch: Architecture, context_tokens: int, pool: Pool, *,
                   server_block: int | None = None, pool_granule: int = 1) -> ConfigCapacity:
    """One config in ``pool`` at ``context_tokens`` per sequence: in a serving engine's layout when
    ``server_block`` (its pool's block tokens) is given, else in kvlab's cache's.  ``pool_granule``: the engine
    sizes its whole pool in multiples of these tokens (llama.cpp's 256 cells), so the pool holds the multiples that
    fit."""
    geometry = arch.geometry
    if server_block is not None:
        if config.removed_fraction or config.keep_tokens or config.threshold is not None or config.decode:
            return ConfigCapacity(config.label, problem="a serving engine evicts no tokens from a sequence")
        sequence = _server_sequence(config, geometry, context_tokens, server_block)
        layout = f"a serving engine's pool: each held token at the config's bits per element, in blocks of " \
                 f"{server_block} tokens per layer"
        every_layer_full = all(w is None for w in geometry.layer_windows)
        # vLLM: the pool is whole blocks of every layer; its tokens are those blocks' tokens
        layers = geometry.num_layers
        block_bytes = server_block * sum(round(geometry.layer_bytes_per_token(kv_bits(config.for_layer(i, layers))))
                                         for i in range(layers))
        blocks = pool.bytes // block_bytes
        if pool_granule > server_block:
            per_granule = pool_granule // server_block
            blocks = blocks // per_granule * per_granule
        pool_tokens = blocks * server_block if every_layer_full else None
        usable = blocks * block_bytes
    else:
        held = _held_tokens(config, context_tokens)
        if held is None:
            return ConfigCapacity(config.label, problem="its kept tokens are decided by scores (a threshold or a "
                                  "decode policy): no fixed size to project")
        sequence = analytic_kv_bytes(config, geometry, [held] * geometry.num_layers)
        layout = "kvlab's cache: the format's codes and scales, the 16-bit residual window, the kept fraction"
        pool_tokens, usable = None, pool.bytes
    if sequence <= 0:
        return ConfigCapacity(config.label, problem="a sequence of no bytes")
    return ConfigCapacity(config.label, sequence, pool_tokens, usable / sequence, layout)


def project(configs: Sequence[KVCacheConfig], arch: Architecture, context_tokens: int, pool: Pool, *,
            server_block: int | None = None, pool_granule: int = 1) -> list[ConfigCapacity]:
    """:func:`project_config` for each config, in order (none left out: a config that cannot be projected carries
    its problem)."""
    if context_tokens < 1:
        raise ValueError(f"context_tokens must be at least 1, got {context_tokens}")
    return [project_config(config, arch, context_tokens, pool, server_block=server_block, pool_granule=pool_granule)
            for config in configs]
