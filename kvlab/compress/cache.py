"""A transformers ``Cache`` that really holds the compressed form.

Each full-attention layer keeps only the tokens eviction kept; of those, all but a
16-bit residual tail are quantized into packed codes (:mod:`kvlab.compress.quantization`).
Attention gets floats rebuilt on the fly.  New tokens are appended to the tail and moved
into codes a block at a time (KIVI).  Sliding-window layers (Gemma 3) keep their window
at 16-bit, uncompressed, as kvpress does.  Under a head-wise budget (AdaKV) each KV head of a
layer keeps its own number of tokens and holds those alone (:class:`HeadwiseLayer`).

``physical_bytes`` sums ``nbytes`` of every tensor held: this is the measured size.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicSlidingWindowLayer

from kvlab.compress.accounting import STORAGE_BYTES_PER_ELEMENT, flush_block, key_group, split_tokens, value_group
from kvlab.compress.quantization import QuantizedBlock, dequantize, quantize
from kvlab.core.kv_config import KVCacheConfig

STORAGE_DTYPE = torch.float16 if STORAGE_BYTES_PER_ELEMENT == 2 else torch.float32


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class _FullAttentionLayer(CacheLayerMixin):
    """A full-attention layer built from a filled prefill cache (never lazily), of no fixed size."""

    is_sliding = False

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Never lazy: a compressed layer is built from a filled prefill cache."""

    def get_mask_sizes(self, cache_position: torch.Tensor) -> tuple[int, int]:
        return self.get_seq_length() + cache_position.shape[0], 0

    def get_max_cache_shape(self) -> int:
        return -1


class CompressedLayer(_FullAttentionLayer):
    """One full-attention layer: quantized blocks of K and V plus a 16-bit tail."""

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
        # the blocks' floats at the compute dtype, rebuilt as blocks are added (not stored: physical_bytes counts
        # the codes); a decode step then reads them instead of dequantizing the whole prefix again
        self._floats: tuple[torch.Tensor, torch.Tensor] | None = None
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
        rotate = bool(cfg.rotation)
        key_block = quantize(keys, cfg.quant, cfg.key_axis, key_group(cfg, self.head_dim), rotate)
        value_block = quantize(values, cfg.value_format, "token", value_group(cfg, self.head_dim), rotate)
        self.key_blocks.append(key_block)
        self.value_blocks.append(value_block)
        new = (dequantize(key_block, self.compute_dtype), dequantize(value_block, self.compute_dtype))
        self._floats = new if self._floats is None else (torch.cat([self._floats[0], new[0]], dim=-2),
                                                         torch.cat([self._floats[1], new[1]], dim=-2))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor,
               cache_kwargs: dict[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        self.key_tail = torch.cat([self.key_tail, key_states.to(STORAGE_DTYPE)], dim=-2)
        self.value_tail = torch.cat([self.value_tail, value_states.to(STORAGE_DTYPE)], dim=-2)
        self.bytes_before_flush = self.physical_bytes  # the tail is largest just before a flush
        self.peak_bytes = max(self.peak_bytes, self.bytes_before_flush)
        self._flush()
        return self.materialize()

    def tokens_before_flush(self) -> int | None:
        """How many tokens may be appended at once and be attended as if appended one at a time: as
        many as leave the tail short of a flush (which, appended at once, every one of them would see);
        the token that flushes goes alone, as it does in a decode (None: this layer never flushes)."""
        if not self.config.quantizes:
            return None
        return max(1, self.config.residual_length + flush_block(self.config) - self.key_tail.shape[-2] - 1)

    def _flush(self) -> None:
        """Move whole blocks from the tail into codes once the tail exceeds the residual window."""
        cfg = self.config
        if not cfg.quantizes:
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
        keys, values = self.key_tail.to(self.compute_dtype), self.value_tail.to(self.compute_dtype)
        if self._floats is None:
            return keys, values
        return torch.cat([self._floats[0], keys], dim=-2), torch.cat([self._floats[1], values], dim=-2)

    def get_seq_length(self) -> int:
        return sum(b.tokens for b in self.key_blocks) + self.key_tail.shape[-2]

    def kept_per_head(self) -> tuple[int, ...]:
        return (self.get_seq_length(),) * self.key_tail.shape[1]

    @property
    def physical_bytes(self) -> int:
        return sum(b.nbytes for b in self.key_blocks + self.value_blocks) + \
            _nbytes(self.key_tail) + _nbytes(self.value_tail)


#: The attribute of the keys a :class:`HeadwiseLayer` returns: per KV head, how many leading
#: positions are padding (``kvlab.engines.attention`` masks them).
HEAD_PADDING = "kvlab_head_padding"


def _left_padded(parts: list[torch.Tensor]) -> torch.Tensor:
    """``[B, 1, n_h, D]`` per head, zero-padded on the left to the longest and stacked on the head axis."""
    longest = max(part.shape[-2] for part in parts)
    return torch.cat([torch.nn.functional.pad(part, (0, 0, longest - part.shape[-2], 0)) for part in parts], dim=1)


class HeadwiseLayer(_FullAttentionLayer):
    """A full-attention layer whose KV heads keep different numbers of tokens (a head-wise budget).

    Each head is its own :class:`CompressedLayer` holding only its kept entries, so the measured
    bytes are theirs (kvpress's head-wise presses keep the full tensors and mask evicted keys with
    fake ones).  Attention sees the heads left-padded to the longest, new tokens last in every head,
    with the padding's length per head on the keys (:data:`HEAD_PADDING`), which attention masks.
    """

    def __init__(self, config: KVCacheConfig, keys: tuple[torch.Tensor, ...], values: tuple[torch.Tensor, ...]):
        super().__init__()
        self.heads = [CompressedLayer(config, k, v) for k, v in zip(keys, values, strict=True)]
        self.dtype, self.device = keys[0].dtype, keys[0].device
        self.is_initialized = True
        self.peak_bytes = self.physical_bytes

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor,
               cache_kwargs: dict[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [head.update(key_states[:, index:index + 1], value_states[:, index:index + 1])
                 for index, head in enumerate(self.heads)]
        self.peak_bytes = max(self.peak_bytes, sum(head.bytes_before_flush for head in self.heads))
        keys = _left_padded([k for k, _ in parts])
        setattr(keys, HEAD_PADDING, torch.tensor([keys.shape[-2] - k.shape[-2] for k, _ in parts]))
        return keys, _left_padded([v for _, v in parts])

    def tokens_before_flush(self) -> int | None:
        limits = [n for head in self.heads if (n := head.tokens_before_flush()) is not None]
        return min(limits, default=None)

    def kept_per_head(self) -> tuple[int, ...]:
        return tuple(head.get_seq_length() for head in self.heads)

    def get_seq_length(self) -> int:
        """The longest head's length: the key length attention sees before the new tokens."""
        return max(self.kept_per_head())

    @property
    def physical_bytes(self) -> int:
        return sum(head.physical_bytes for head in self.heads)


class SlidingLayer16(DynamicSlidingWindowLayer):
    """A sliding-window layer stored at 16-bit, returned at the compute dtype."""

    keys: torch.Tensor  # set in __init__, never None (the base class's are until its lazy initialization)
    values: torch.Tensor

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

    def kept_per_head(self) -> tuple[int, ...]:
        return (self.keys.shape[-2],) * self.keys.shape[1]

    @property
    def physical_bytes(self) -> int:
        return _nbytes(self.keys) + _nbytes(self.values)


#: A layer of a :class:`KVLabCache`.
KVLabLayer = CompressedLayer | HeadwiseLayer | SlidingLayer16
#: A layer's kept keys and values: one tensor each, or one per KV head (a head-wise budget).
LayerKV = tuple[torch.Tensor, torch.Tensor] | tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]


class KVLabCache(Cache):
    """A cache of compressed layers; build it with :func:`build_compressed_cache`."""

    def __init__(self, layers: list[CacheLayerMixin]):
        super().__init__(layers=layers)

    @property
    def kv_layers(self) -> list[KVLabLayer]:
        """``layers`` as the type checker should see them: kvlab's own, each measured."""
        return cast("list[KVLabLayer]", self.layers)  # built by build_compressed_cache alone

    @property
    def physical_bytes(self) -> int:
        """Measured: the sum of ``nbytes`` of every tensor the cache holds."""
        return sum(layer.physical_bytes for layer in self.kv_layers)

    @property
    def peak_bytes(self) -> int:
        """The sum over layers of each layer's largest measured size since it was built."""
        return sum(layer.peak_bytes for layer in self.kv_layers)

    def tokens_before_flush(self) -> int | None:
        """The fewest of any layer (:meth:`CompressedLayer.tokens_before_flush`); None when none flushes."""
        limits = [n for layer in self.kv_layers if isinstance(layer, _FullAttentionLayer)
                  and (n := layer.tokens_before_flush()) is not None]
        return min(limits, default=None)

    def kept_per_head(self) -> list[tuple[int, ...]]:
        """Tokens each KV head of each layer holds (a sliding layer: at most its window - 1)."""
        return [layer.kept_per_head() for layer in self.kv_layers]


def build_compressed_cache(config: KVCacheConfig, layer_kv: list[LayerKV],
                           layer_windows: tuple[int | None, ...], seen_tokens: int) -> KVLabCache:
    """Build a cache from per-layer (already evicted) K/V, per head where a head-wise budget gave each
    head its own tokens, each layer in its config's format for it; the inputs are not modified."""
    layers: list[CacheLayerMixin] = []
    for index, (kv, window) in enumerate(zip(layer_kv, layer_windows, strict=True)):
        layer_config = config.for_layer(index, len(layer_kv))  # a skipped layer is stored 16-bit
        if window is not None:
            # never evicted (eviction.select_tokens skips sliding layers): the prefill's tensors
            keys, values = cast(tuple[torch.Tensor, torch.Tensor], kv)
            layers.append(SlidingLayer16(window, keys, values, seen_tokens))
        elif isinstance(kv[0], tuple):
            layers.append(HeadwiseLayer(layer_config, *kv))
        else:
            layers.append(CompressedLayer(layer_config, *kv))
    return KVLabCache(layers)
