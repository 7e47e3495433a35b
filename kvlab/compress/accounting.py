"""KV-cache byte accounting: the one place where baseline and analytic bytes are defined.

* **Baseline bytes**: the uncompressed cache of the same tokens at 16-bit,
  ``2 (K and V) x kv_heads x head_dim x tokens x 2 bytes`` per layer; a sliding-window
  layer holds at most its window.
* **Physical bytes**: the sum of ``nbytes`` of every tensor a compressed cache holds
  (``KVLabCache.physical_bytes``), measured, never computed here.
* **Analytic bytes**: what the layout of a config *should* take (``analytic_layer_bytes``);
  tests and benchmarks check physical == analytic within 1%.
* **Compression ratio**: baseline / physical.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvlab.core.formats import FP8_MAX, INT_BITS

if TYPE_CHECKING:  # annotations only
    from kvlab.core.kv_config import KVCacheConfig

BASELINE_BYTES_PER_ELEMENT = 2  # the 16-bit reference
STORAGE_BYTES_PER_ELEMENT = 2  # unquantized parts (residual window, sliding layers) are kept 16-bit
SCALE_BYTES = 2  # int scales and zero points are float16
FP8_SCALE_BYTES = 4  # one float32 scale per head and block


@dataclass(frozen=True)
class CacheGeometry:
    """The shape of a model's KV cache: what the byte formulas need to know."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    layer_windows: tuple[int | None, ...]  # sliding window per layer, None for full attention

    @property
    def sliding_layers(self) -> tuple[bool, ...]:
        return tuple(w is not None for w in self.layer_windows)


def baseline_kv_bytes(geometry: CacheGeometry, tokens: int) -> int:
    """16-bit bytes of an uncompressed cache holding ``tokens`` tokens (batch 1)."""
    per_token = 2 * geometry.num_kv_heads * geometry.head_dim * BASELINE_BYTES_PER_ELEMENT
    return sum(per_token * (tokens if w is None else min(tokens, w)) for w in geometry.layer_windows)


def compression_ratio(baseline_bytes: int, physical_bytes: int) -> float:
    return baseline_bytes / physical_bytes if physical_bytes else float("inf")


def flush_block(config: KVCacheConfig) -> int:
    """Tokens quantized together: full-precision tokens are moved into codes in blocks of this size."""
    return config.group_size


def split_tokens(config: KVCacheConfig, tokens: int) -> tuple[int, int]:
    """(quantized, full-precision) token counts of a layer holding ``tokens`` tokens.

    The last ``residual_length`` tokens stay 16-bit, plus whatever does not fill a whole
    block (KIVI's residual); everything before is quantized.
    """
    if config.quant == "none" or tokens <= config.residual_length:
        return 0, tokens
    block = flush_block(config)
    tail = config.residual_length + (tokens - config.residual_length) % block
    return tokens - tail, tail


def value_group_size(config: KVCacheConfig, head_dim: int) -> int:
    """Channels per value group: ``group_size``, capped at the head dimension."""
    return min(config.group_size, head_dim)


def check_fits(config: KVCacheConfig, head_dim: int) -> str | None:
    """Why ``config`` cannot quantize heads of ``head_dim`` channels, or None if it can."""
    if config.quant in INT_BITS and head_dim % value_group_size(config, head_dim):
        return (f"group_size {config.group_size} does not divide head_dim {head_dim} "
                f"(values are grouped along the head dimension); choose a group size that divides {head_dim}")
    return None


def quantized_bytes(config: KVCacheConfig, heads: int, head_dim: int, tokens: int) -> int:
    """Bytes of ``tokens`` quantized tokens for K and V of one layer (codes + scales)."""
    if tokens == 0 or config.quant == "none":
        return 0
    elements = heads * tokens * head_dim
    if config.quant in FP8_MAX:
        blocks = tokens // flush_block(config)
        return 2 * (elements + blocks * heads * FP8_SCALE_BYTES)
    bits = INT_BITS[config.quant]
    codes = elements * bits // 8
    per_token_groups = heads * tokens * (head_dim // value_group_size(config, head_dim))
    per_channel_groups = heads * (tokens // config.group_size) * head_dim
    key_groups = per_channel_groups if config.key_axis == "channel" else per_token_groups
    scales = 2 * SCALE_BYTES * (key_groups + per_token_groups)  # scale + zero point per group
    return 2 * codes + scales


def analytic_layer_bytes(config: KVCacheConfig, heads: int, head_dim: int, tokens: int,
                         sliding_window: int | None = None) -> int:
    """What one layer of a ``config`` cache holding ``tokens`` tokens must take, by its layout.

    Sliding-window layers are never compressed (as in kvpress) and keep the last
    ``window - 1`` tokens at 16-bit, like transformers' sliding layers.
    """
    if sliding_window is not None:
        return 2 * heads * min(tokens, sliding_window - 1) * head_dim * STORAGE_BYTES_PER_ELEMENT
    quantized, full = split_tokens(config, tokens)
    return quantized_bytes(config, heads, head_dim, quantized) + 2 * heads * full * head_dim * STORAGE_BYTES_PER_ELEMENT


def analytic_kv_bytes(config: KVCacheConfig, geometry: CacheGeometry, kept_tokens: list[int]) -> int:
    """Analytic bytes of a whole cache, given the tokens each layer keeps."""
    return sum(
        analytic_layer_bytes(config, geometry.num_kv_heads, geometry.head_dim, tokens, window)
        for tokens, window in zip(kept_tokens, geometry.layer_windows, strict=True)
    )


def bytes_per_element(config: KVCacheConfig, head_dim: int = 128) -> float:
    """Average stored bytes per K/V element of the quantized part (codes + scales), ignoring the residual."""
    tokens = 1024 * config.group_size
    return quantized_bytes(config, 1, head_dim, tokens) / (2 * tokens * head_dim) if config.quant != "none" \
        else float(STORAGE_BYTES_PER_ELEMENT)
