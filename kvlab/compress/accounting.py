"""KV-cache byte accounting: the one place where baseline and analytic bytes are defined.

* **Baseline bytes**: the uncompressed cache of the same tokens at 16-bit,
  ``2 (K and V) x kv_heads x head_dim x tokens x 2 bytes`` per layer; a sliding-window
  layer holds at most its window (:class:`kvlab.core.geometry.CacheGeometry`, every engine's formula).
* **Physical bytes**: the sum of ``nbytes`` of every tensor a compressed cache holds
  (``KVLabCache.physical_bytes``), measured, never computed here.
* **Analytic bytes**: what the layout of a config *should* take (``analytic_layer_bytes``);
  tests and benchmarks check physical == analytic within 1%.
* **Compression ratio**: baseline / physical.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvlab.core.axis import choice_key
from kvlab.core.backends import BACKENDS, rotating_kinds
from kvlab.core.formats import FORMATS, FP8_MAX, INT_BITS, KVLAB_QUANT_NAMES
from kvlab.core.geometry import BASELINE_BITS, CacheGeometry
from kvlab.core.kv_config import KVCacheConfig, also_axes

BASELINE_BYTES_PER_ELEMENT = BASELINE_BITS // 8  # the 16-bit reference
STORAGE_BYTES_PER_ELEMENT = 2  # unquantized parts (residual window, sliding layers) are kept 16-bit
SCALE_BYTES = 2  # int scales and zero points are float16
FP8_SCALE_BYTES = 4  # one float32 scale per head and block


def kv_bits(config: KVCacheConfig) -> float:
    """Bits per stored element of a serving engine's cache in ``config``'s dtypes, keys and values together (a ggml
    format's scales included: q8_0 is 8.5); "none" is the model's 16-bit dtype.  A server's pool is laid out so."""
    return (FORMATS[config.quant].bits_per_value + FORMATS[config.value_format].bits_per_value) / 2


def compression_ratio(baseline_bytes: float, physical_bytes: float) -> float:
    return baseline_bytes / physical_bytes if physical_bytes else float("inf")


def flush_block(config: KVCacheConfig) -> int:
    """Tokens quantized together: full-precision tokens are moved into codes in blocks of this size."""
    return config.group_size


def split_tokens(config: KVCacheConfig, tokens: int) -> tuple[int, int]:
    """(quantized, full-precision) token counts of a layer holding ``tokens`` tokens.

    The last ``residual_length`` tokens stay 16-bit, plus whatever does not fill a whole
    block (KIVI's residual); everything before is quantized.
    """
    if not config.quantizes or tokens <= config.residual_length:
        return 0, tokens
    block = flush_block(config)
    tail = config.residual_length + (tokens - config.residual_length) % block
    return tokens - tail, tail


def value_group_size(config: KVCacheConfig, head_dim: int) -> int:
    """Channels per integer value group: ``group_size``, capped at the head dimension."""
    return min(config.group_size, head_dim)


def value_group(config: KVCacheConfig, head_dim: int) -> int:
    """The group of the values' format: fp8 scales blocks of ``group_size`` tokens, integer codes groups of
    channels (:func:`value_group_size`)."""
    return config.group_size if config.value_format in FP8_MAX else value_group_size(config, head_dim)


def key_group(config: KVCacheConfig, head_dim: int) -> int:
    """The group of the keys' format: fp8 and per-channel integer keys group ``group_size`` tokens, per-token
    integer keys group channels as values do."""
    if config.quant in FP8_MAX or config.key_axis == "channel":
        return config.group_size
    return value_group_size(config, head_dim)


#: The axes each quantizing config may also be run with that kvlab's cache stores (:func:`also_axes`): the 16-bit
#: layers (:meth:`KVCacheConfig.for_layer`) and its own Hadamard rotation (``rotation = true``).  An axis declared
#: later is refused until its storage lands here.
STORED_ALSO = frozenset({"skip_layers", "rotation"})


def check_fits(config: KVCacheConfig, geometry: CacheGeometry) -> str | None:
    """Why ``config`` cannot be stored in ``geometry``'s layers by kvlab's cache, or None if it can."""
    for axis in also_axes():
        if (value := getattr(config, axis.field)) is not None and axis.field not in STORED_ALSO:
            return (f"{axis.field} = {choice_key(value)}: kvlab's engine does not store it (the axis is declared, its "
                    f"storage is not): drop it")
    if config.rotation is False:
        return (f"rotation = false: kvlab's engine stores its formats unrotated unless rotation = true; false turns "
                f"a serving engine's own rotation off: run it with backend kind {rotating_kinds()}")
    if config.rotation and geometry.head_dim & (geometry.head_dim - 1):
        return (f"rotation = true: kvlab's Hadamard rotation needs a head dimension that is a power of two; this "
                f"model's is {geometry.head_dim}")
    for name in (config.quant, config.value_format):
        if not FORMATS[name].kvlab_stores:
            owners = [backend for backend in BACKENDS.values() if name in backend.kv_dtypes]
            return (f"{name} is {' / '.join(b.title for b in owners)}'s own KV cache format "
                    f"({FORMATS[name].description}); kvlab's engine stores {', '.join(KVLAB_QUANT_NAMES)}: run {name} "
                    f"with backend kind {' or '.join(repr(b.name) for b in owners)}")
    head_dim = geometry.head_dim
    if {config.quant, config.value_format} & set(INT_BITS) and head_dim % value_group_size(config, head_dim):
        return (f"group_size {config.group_size} does not divide head_dim {head_dim} "
                f"(values are grouped along the head dimension); choose a group size that divides {head_dim}")
    if config.skip_layers is not None:
        return config.skip_layers.check(geometry.num_layers)
    return None


def _stream_bytes(config: KVCacheConfig, fmt: str, groups: int, heads: int, head_dim: int, tokens: int) -> int:
    """Bytes of ``tokens`` tokens of K or V of one layer stored in ``fmt``, with ``groups`` integer scale groups."""
    elements = heads * tokens * head_dim
    if fmt == "none":
        return elements * STORAGE_BYTES_PER_ELEMENT
    if fmt in FP8_MAX:
        return elements + (tokens // flush_block(config)) * heads * FP8_SCALE_BYTES
    if block := FORMATS[fmt].block:  # llama.cpp's: the scales are inside the blocks (a server's pool, by its layout)
        return elements * block[1] // block[0]
    return elements * INT_BITS[fmt] // 8 + 2 * SCALE_BYTES * groups  # codes, a scale and a zero point per group


def quantized_bytes(config: KVCacheConfig, heads: int, head_dim: int, tokens: int) -> int:
    """Bytes of ``tokens`` quantized tokens for K and V of one layer (codes + scales), each in its format."""
    if tokens == 0 or not config.quantizes:
        return 0
    per_token_groups = heads * tokens * (head_dim // value_group_size(config, head_dim))
    per_channel_groups = heads * (tokens // config.group_size) * head_dim
    key_groups = per_channel_groups if config.key_axis == "channel" else per_token_groups
    return (_stream_bytes(config, config.quant, key_groups, heads, head_dim, tokens)
            + _stream_bytes(config, config.value_format, per_token_groups, heads, head_dim, tokens))


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


def analytic_kv_bytes(config: KVCacheConfig, geometry: CacheGeometry,
                      kept_tokens: Sequence[int | Sequence[int]]) -> int:
    """Analytic bytes of a whole cache, given the tokens each layer keeps: one count for all its heads,
    or one per head (a head-wise budget: each head is laid out on its own).  Each layer in its own
    config (:meth:`KVCacheConfig.for_layer`: a skipped layer is 16-bit)."""
    total = 0
    for index, (tokens, window) in enumerate(zip(kept_tokens, geometry.layer_windows, strict=True)):
        layer = config.for_layer(index, geometry.num_layers)
        if isinstance(tokens, int):
            total += analytic_layer_bytes(layer, geometry.num_kv_heads, geometry.head_dim, tokens, window)
        else:
            total += sum(analytic_layer_bytes(layer, 1, geometry.head_dim, n, window) for n in tokens)
    return total


def bytes_per_element(config: KVCacheConfig, head_dim: int = 128) -> float:
    """Average stored bytes per K/V element of the quantized part (codes + scales), ignoring the residual."""
    tokens = 1024 * config.group_size
    return quantized_bytes(config, 1, head_dim, tokens) / (2 * tokens * head_dim) if config.quantizes \
        else float(STORAGE_BYTES_PER_ELEMENT)


def budget_ratio(config: KVCacheConfig, context_tokens: float) -> float | None:
    """The compression ratio a config's settings alone suggest on a context of ``context_tokens`` tokens: the share
    of the context its budget keeps times its formats' bytes per element (codes and scales) over 16-bit.  None
    where scores decide the count (a threshold, a decode policy).  What it leaves out -- residual windows, the
    question's tokens, 16-bit layers, sliding-window layers -- is why a measured ratio falls short of it."""
    if config.threshold is not None or config.decode is not None or context_tokens <= 0:
        return None
    if config.keep_tokens is not None:
        kept = min(1.0, config.keep_tokens / context_tokens)
    else:
        kept = 1.0 - (config.removed_fraction or 0.0)
    return BASELINE_BYTES_PER_ELEMENT / (kept * bytes_per_element(config))


def shortfall_causes(config: KVCacheConfig) -> list[str]:
    """What in ``config`` keeps more bytes than its budget and formats suggest (:func:`budget_ratio`)."""
    causes = []
    if config.residual_length and any(s.field == "residual_length" for s in config.settings):
        causes.append(f"its 16-bit residual window ({config.residual_length} tokens and a partial block per layer)")
    if config.skip_layers is not None:
        causes.append(f"its 16-bit layers ({config.skip_layers.label})")
    if config.query_aware:
        causes.append("the question's tokens, always kept")
    return causes or ["the model's uncompressed layers (sliding windows) or a short context"]
