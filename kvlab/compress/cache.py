"""A transformers ``Cache`` that really holds the compressed form.

Each full-attention layer keeps only the tokens eviction kept; of those, all but a
16-bit residual tail are quantized into packed codes (:mod:`kvlab.compress.quantization`).
Attention gets floats rebuilt on the fly.  New tokens are appended to the tail and moved
into codes a block at a time (KIVI).  Sliding-window layers (Gemma 3) keep their window
at 16-bit, uncompressed, as kvpress does.

``physical_bytes`` sums ``nbytes`` of every tensor held: this is the measured size.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicSlidingWindowLayer

from kvlab.compress.accounting import STORAGE_BYTES_PER_ELEMENT, flush_block, split_tokens, value_group_size
from kvlab.compress.quantization import FP8_DTYPES, QuantizedBlock, dequantize, quantize
from kvlab.core.kv_config import KVCacheConfig

STORAGE_DTYPE = torch.float16 if STORAGE_BYTES_PER_ELEMENT == 2 else torch.float32


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class CompressedLayer(CacheLayerMixin):
    """One full-attention layer: quantized blocks of K and V plus a 16-bit tail."""

    is_sliding = False

    def __init__(self, config: KVCacheConfig, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.config = config
        self.compute_dtype = keys.dtype
        self.head_dim = keys.shape[-1]
        self._store(keys, values)
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self.peak_bytes = self.physical_bytes

    def _store(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Hold ``keys``/``values``: all but the residual tail quantized into codes."""
        self.key_blocks: list[QuantizedBlock] = []
        self.value_blocks: list[QuantizedBlock] = []
        quantized, _ = split_tokens(self.config, keys.shape[-2])
        self._append_blocks(keys[:, :, :quantized], values[:, :, :quantized])
        self.key_tail = keys[:, :, quantized:].to(STORAGE_DTYPE)
        self.value_tail = values[:, :, quantized:].to(STORAGE_DTYPE)

    def replace_tokens(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Hold these tokens instead (decode-time eviction): stored as a new layer would store them
        (codes quantized again from their dequantized values); the peak so far is kept."""
        self._store(keys, values)

    def _append_blocks(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        if keys.shape[-2] == 0:
            return
        cfg = self.config
        if cfg.quant in FP8_DTYPES:  # one scale per head and block of group_size tokens
            key_group = value_group = cfg.group_size
        else:
            value_group = value_group_size(cfg, self.head_dim)
            key_group = cfg.group_size if cfg.key_axis == "channel" else value_group
        self.key_blocks.append(quantize(keys, cfg.quant, cfg.key_axis, key_group))
        self.value_blocks.append(quantize(values, cfg.quant, "token", value_group))

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Never lazy: a compressed layer is built from a filled prefill cache."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor,
               cache_kwargs: dict[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        self.key_tail = torch.cat([self.key_tail, key_states.to(STORAGE_DTYPE)], dim=-2)
        self.value_tail = torch.cat([self.value_tail, value_states.to(STORAGE_DTYPE)], dim=-2)
        self.peak_bytes = max(self.peak_bytes, self.physical_bytes)  # the tail is largest just before a flush
        self._flush()
        return self.materialize()

    def tokens_before_flush(self) -> int | None:
        """How many tokens may be appended at once and be attended as if appended one at a time: as
        many as leave the tail short of a flush (which, appended at once, every one of them would see);
        the token that flushes goes alone, as it does in a decode (None: this layer never flushes)."""
        if self.config.quant == "none":
            return None
        return max(1, self.config.residual_length + flush_block(self.config) - self.key_tail.shape[-2] - 1)

    def _flush(self) -> None:
        """Move whole blocks from the tail into codes once the tail exceeds the residual window."""
        cfg = self.config
        if cfg.quant == "none":
            return
        block = flush_block(cfg)
        excess = self.key_tail.shape[-2] - cfg.residual_length
        n_flush = (excess // block) * block
        if n_flush <= 0:
            return
        self._append_blocks(self.key_tail[:, :, :n_flush].to(self.compute_dtype),
                            self.value_tail[:, :, :n_flush].to(self.compute_dtype))
        self.key_tail = self.key_tail[:, :, n_flush:].contiguous()
        self.value_tail = self.value_tail[:, :, n_flush:].contiguous()

    def materialize(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values attention sees, at the compute dtype."""
        keys = [dequantize(b, self.compute_dtype) for b in self.key_blocks] + [self.key_tail.to(self.compute_dtype)]
        values = [dequantize(b, self.compute_dtype) for b in self.value_blocks] + \
            [self.value_tail.to(self.compute_dtype)]
        return torch.cat(keys, dim=-2), torch.cat(values, dim=-2)

    def get_seq_length(self) -> int:
        return sum(b.tokens for b in self.key_blocks) + self.key_tail.shape[-2]

    def get_mask_sizes(self, cache_position: torch.Tensor) -> tuple[int, int]:
        return self.get_seq_length() + cache_position.shape[0], 0

    def get_max_cache_shape(self) -> int:
        return -1

    @property
    def physical_bytes(self) -> int:
        return sum(b.nbytes for b in self.key_blocks + self.value_blocks) + \
            _nbytes(self.key_tail) + _nbytes(self.value_tail)


class SlidingLayer16(DynamicSlidingWindowLayer):
    """A sliding-window layer stored at 16-bit, returned at the compute dtype."""

    def __init__(self, sliding_window: int, keys: torch.Tensor, values: torch.Tensor, seen_tokens: int):
        super().__init__(sliding_window)
        self.compute_dtype = keys.dtype
        self.lazy_initialization(keys, values)
        self.keys = keys[:, :, -sliding_window + 1:].to(STORAGE_DTYPE)
        self.values = values[:, :, -sliding_window + 1:].to(STORAGE_DTYPE)
        self.cumulative_length = seen_tokens
        self.peak_bytes = self.physical_bytes

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor,
               cache_kwargs: dict[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        self.cumulative_length += key_states.shape[-2]
        full_keys = torch.cat([self.keys.to(self.compute_dtype), key_states], dim=-2)
        full_values = torch.cat([self.values.to(self.compute_dtype), value_states], dim=-2)
        self.keys = full_keys[:, :, -self.sliding_window + 1:].to(STORAGE_DTYPE)
        self.values = full_values[:, :, -self.sliding_window + 1:].to(STORAGE_DTYPE)
        self.peak_bytes = max(self.peak_bytes, self.physical_bytes)
        return full_keys, full_values

    @property
    def physical_bytes(self) -> int:
        return _nbytes(self.keys) + _nbytes(self.values)


class KVLabCache(Cache):
    """A cache of compressed layers; build it with :func:`build_compressed_cache`."""

    def __init__(self, layers: list[CacheLayerMixin]):
        super().__init__(layers=layers)

    @property
    def physical_bytes(self) -> int:
        """Measured: the sum of ``nbytes`` of every tensor the cache holds."""
        return sum(layer.physical_bytes for layer in self.layers)

    @property
    def peak_bytes(self) -> int:
        """The sum over layers of each layer's largest measured size since it was built."""
        return sum(layer.peak_bytes for layer in self.layers)

    def tokens_before_flush(self) -> int | None:
        """The fewest of any layer (:meth:`CompressedLayer.tokens_before_flush`); None when none flushes."""
        limits = [n for layer in self.layers if isinstance(layer, CompressedLayer)
                  and (n := layer.tokens_before_flush()) is not None]
        return min(limits, default=None)

    def kept_tokens(self) -> list[int]:
        """Tokens each layer holds (a sliding layer: at most its window - 1)."""
        return [layer.keys.shape[-2] if isinstance(layer, SlidingLayer16) else layer.get_seq_length()
                for layer in self.layers]


def build_compressed_cache(config: KVCacheConfig, layer_kv: list[tuple[torch.Tensor, torch.Tensor]],
                           layer_windows: tuple[int | None, ...], seen_tokens: int) -> KVLabCache:
    """Build a cache from per-layer (already evicted) K/V; the inputs are not modified."""
    layers: list[CacheLayerMixin] = []
    for (keys, values), window in zip(layer_kv, layer_windows, strict=True):
        if window is not None:
            layers.append(SlidingLayer16(window, keys, values, seen_tokens))
        else:
            layers.append(CompressedLayer(config, keys, values))
    return KVLabCache(layers)
