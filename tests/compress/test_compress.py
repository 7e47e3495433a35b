"""Quantized storage and byte accounting, without a model."""

from __future__ import annotations

import itertools

import pytest
import torch

from kvlab.compress.accounting import (
    analytic_kv_bytes,
    analytic_layer_bytes,
    split_tokens,
)
from kvlab.compress.cache import CompressedLayer, build_compressed_cache
from kvlab.compress.quantization import dequantize, hadamard, pack_codes, quantize, unpack_codes
from kvlab.core.formats import KVLAB_QUANT_NAMES
from kvlab.core.geometry import CacheGeometry
from kvlab.core.kv_config import KVCacheConfig


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_pack_unpack_exact(bits):
    codes = torch.randint(0, 1 << bits, (2, 3, 5, 64), dtype=torch.uint8)
    packed = pack_codes(codes, bits)
    assert packed.shape[-1] == 64 * bits // 8 and packed.dtype == torch.uint8
    assert torch.equal(unpack_codes(packed, bits), codes)


@pytest.mark.parametrize("fmt, tolerance", [("int8", 0.01), ("int4", 0.15), ("int2", 0.6),
                                            ("fp8_e4m3", 0.05), ("fp8_e5m2", 0.1)])
@pytest.mark.parametrize("axis", ["channel", "token"])
def test_quantize_round_trip_error_shrinks_with_bits(fmt, tolerance, axis):
    x = torch.randn(1, 3, 128, 64, generator=torch.Generator().manual_seed(0))
    block = quantize(x, fmt, axis, 32)
    assert block.codes.dtype in (torch.uint8, torch.float8_e4m3fn, torch.float8_e5m2)
    error = (dequantize(block, torch.float32) - x).abs().mean().item()
    assert 0 < error < tolerance


def test_int_codes_really_packed():
    x = torch.randn(1, 3, 64, 64)
    assert quantize(x, "int4", "channel", 64).codes.numel() == x.numel() // 2
    assert quantize(x, "int2", "token", 32).codes.numel() == x.numel() // 4


def test_the_hadamard_rotation_is_orthonormal_and_its_own_inverse():
    matrix = hadamard(64, torch.device("cpu"))
    assert torch.allclose(matrix @ matrix, torch.eye(64), atol=1e-6) and torch.equal(matrix, matrix.T)
    assert set((matrix * 8).round().unique().tolist()) == {-1.0, 1.0}
    with pytest.raises(ValueError, match="a power of two, not 80"):
        hadamard(80, torch.device("cpu"))


@pytest.mark.parametrize("fmt", ["int8", "int4", "int2"])  # fp8 keeps relative precision: nothing to spread
def test_a_rotated_block_stores_the_same_bytes_and_spreads_an_outlier_channel(fmt):
    """Keys with one outlier channel (20x the others), grouped per token in blocks of 32 channels as llama.cpp's
    q4_0 groups them: the outlier sets its block's scale and the others lose their bits; rotated, every channel
    carries a share of it, and the round trip is closer."""
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    x[..., 5] *= 20
    plain, rotated = quantize(x, fmt, "token", 32), quantize(x, fmt, "token", 32, rotate=True)
    assert rotated.rotated and not plain.rotated and rotated.nbytes == plain.nbytes
    error = {name: (dequantize(block, torch.float32) - x).pow(2).mean().item()
             for name, block in (("plain", plain), ("rotated", rotated))}
    assert error["rotated"] < error["plain"], error


@pytest.mark.parametrize("quant, group, residual, axis, rotation", [  # the formats kvlab's cache stores
    (q, g, r, a, rot)
    for q, g, r, a, rot in itertools.product(KVLAB_QUANT_NAMES, (32, 64, 128), (0, 16, 64), ("channel", "token"),
                                             (None, True))
    if not (rot and q == "none")  # nothing to rotate
])
def test_physical_bytes_equal_analytic_before_and_after_decode(quant, group, residual, axis, rotation):
    config = KVCacheConfig(quant=quant, group_size=group, residual_length=residual, key_axis=axis, rotation=rotation)
    keys, values = torch.randn(1, 3, 301, 64), torch.randn(1, 3, 301, 64)
    layer = CompressedLayer(config, keys, values)
    assert layer.physical_bytes == analytic_layer_bytes(config, 3, 64, 301)
    for _ in range(25):  # 150 tokens, 6 at a time: crosses several flushes
        layer.update(torch.randn(1, 3, 6, 64), torch.randn(1, 3, 6, 64))
    assert layer.get_seq_length() == 451
    assert layer.physical_bytes == analytic_layer_bytes(config, 3, 64, 451)
    full_keys, _ = layer.update(torch.randn(1, 3, 2, 64), torch.randn(1, 3, 2, 64))
    assert full_keys.shape == (1, 3, 453, 64) and full_keys.dtype == torch.float32


def test_residual_window_kept_exact_and_old_tokens_quantized():
    config = KVCacheConfig(quant="int2", group_size=32, residual_length=32)
    keys = torch.randn(1, 3, 100, 64, generator=torch.Generator().manual_seed(1))
    layer = CompressedLayer(config, keys, keys.clone())
    quantized, tail = split_tokens(config, 100)
    assert (quantized, tail) == (64, 36)
    rebuilt, _ = layer.update(torch.zeros(1, 3, 0, 64), torch.zeros(1, 3, 0, 64))
    assert torch.allclose(rebuilt[:, :, quantized:], keys[:, :, quantized:], rtol=1e-3, atol=1e-3)  # 16-bit tail
    assert (rebuilt[:, :, :quantized] - keys[:, :, :quantized]).abs().mean() > 0.1  # 2-bit codes


def test_baseline_is_16bit_and_sliding_layers_capped():
    geometry = CacheGeometry(num_layers=3, num_kv_heads=2, head_dim=8, layer_windows=(None, 4, None))
    assert geometry.baseline_bytes(10) == 2 * 2 * 8 * 2 * (10 + 4 + 10)
    cache = build_compressed_cache(KVCacheConfig(), [(torch.randn(1, 2, n, 8),) * 2 for n in (10, 3, 10)],
                                   geometry.layer_windows, seen_tokens=10)
    assert cache.physical_bytes == analytic_kv_bytes(KVCacheConfig(), geometry, cache.kept_per_head())
    assert cache.kept_per_head() == [(10, 10), (3, 3), (10, 10)]


def test_uncompressed_cache_ratio_is_one():
    geometry = CacheGeometry(num_layers=2, num_kv_heads=3, head_dim=64, layer_windows=(None, None))
    cache = build_compressed_cache(KVCacheConfig(), [(torch.randn(1, 3, 50, 64),) * 2] * 2,
                                   geometry.layer_windows, seen_tokens=50)
    assert cache.physical_bytes == geometry.baseline_bytes(50)


def test_group_must_divide_head_dim_and_skipped_layers_must_exist():
    from kvlab.compress.accounting import check_fits

    def geometry(head_dim: int) -> CacheGeometry:
        return CacheGeometry(num_layers=4, num_kv_heads=2, head_dim=head_dim, layer_windows=(None,) * 4)

    assert check_fits(KVCacheConfig(quant="int4", group_size=128), geometry(64)) is None  # capped at the head dim
    assert "does not divide head_dim 80" in check_fits(KVCacheConfig(quant="int4", group_size=32), geometry(80))
    assert check_fits(KVCacheConfig(quant="fp8_e4m3", group_size=32), geometry(80)) is None
    # kvlab's Hadamard rotation needs a power-of-two head dimension: refused in one line, not a traceback later
    assert "needs a head dimension that is a power of two; this model's is 80" in check_fits(
        KVCacheConfig(quant="fp8_e4m3", rotation=True), geometry(80))
    assert check_fits(KVCacheConfig(quant="int4", rotation=True), geometry(64)) is None
    # values in an integer format are grouped along the head dimension, whatever the keys' format
    assert "does not divide" in check_fits(KVCacheConfig(quant="fp8_e4m3", value_quant="int4", group_size=32),
                                           geometry(80))
    assert check_fits(KVCacheConfig(quant="int4", skip_layers={"layers": [3]}), geometry(64)) is None
    assert "names layer 4, but the model has 4" in check_fits(
        KVCacheConfig(quant="int4", skip_layers={"layers": [4]}), geometry(64))
