"""Physical KV bytes of the real model's compressed caches against numbers worked out by hand.

SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64.  The prefix is exactly T = 600 tokens, so per
layer K (and V) hold 3 x T x 64 elements.  The layout (KIVI) being checked:
- 16-bit storage for anything unquantized (2 bytes an element);
- int codes packed (8 / bits per byte); keys grouped per channel over `group_size` tokens, values
  per token over min(group_size, 64) channels; each group has a float16 scale and zero point (4 B);
- fp8: 1 byte an element plus one float32 scale per head and `group_size`-token block (K and V);
- the last `residual_length` tokens, plus what does not fill a whole group, stay 16-bit.
None of the formulas in kvlab.compress.accounting are used here: a wrong split or group count there
or in the cache must show up as a mismatch.
"""

from __future__ import annotations

import pytest

from kvlab.core.kv_config import KVCacheConfig
from kvlab.tasks.haystack import load_haystack

pytestmark = pytest.mark.model

TOKENS = 600
EXPECTED = {
    # 2 (K, V) x 3 heads x 600 tokens x 64 x 2 B = 460,800 B a layer; x 30 layers
    "baseline": (KVCacheConfig(), 13_824_000),
    # g64 r64: 16-bit tail = 64 + (600 - 64) % 64 = 88 tokens, 512 quantized.
    # codes 2 x 3*512*64 / 2 = 98,304; groups: K 3*(512/64)*64 = 1,536, V 3*512*1 = 1,536 -> 3,072 x 4 = 12,288;
    # tail 2 x 3*88*64 x 2 = 67,584.  Layer 178,176; x 30
    "int4/g64/r64": (KVCacheConfig(quant="int4", group_size=64, residual_length=64), 5_345_280),
    # the same rotated (a Hadamard transform of each head's vector before it is quantized): the matrix is fixed,
    # nothing more is stored
    "int4/g64/r64/rot": (KVCacheConfig(quant="int4", group_size=64, residual_length=64, rotation=True), 5_345_280),
    # g32 r0: tail 600 % 32 = 24, 576 quantized.  codes 2 x 3*576*64 = 221,184;
    # groups K 3*18*64 = 3,456, V 3*576*2 = 3,456 -> 6,912 x 4 = 27,648; tail 2 x 3*24*64 x 2 = 18,432.
    # Layer 267,264; x 30
    "int8/g32/r0": (KVCacheConfig(quant="int8", group_size=32, residual_length=0), 8_017_920),
    # g128 r64 (value groups capped at 64 channels): tail 64 + 536 % 128 = 88, 512 quantized.
    # codes 2 x 3*512*64 / 4 = 49,152; groups K 3*4*64 = 768, V 3*512*1 = 1,536 -> 2,304 x 4 = 9,216;
    # tail 67,584.  Layer 125,952; x 30
    "int2/g128/r64": (KVCacheConfig(quant="int2", group_size=128, residual_length=64), 3_778_560),
    # fp8 g64 r64: 512 quantized, 1 B each: 2 x 98,304 = 196,608; scales 2 x 3 heads x 8 blocks x 4 B = 192;
    # tail 67,584.  Layer 264,384; x 30
    "fp8_e4m3": (KVCacheConfig(quant="fp8_e4m3", group_size=64, residual_length=64), 7_931_520),
    # keep 300 of 600 tokens per head, 16-bit: 2 x 3*300*64 x 2 = 230,400; x 30
    "streaming-50": (KVCacheConfig(evict="streaming_llm", ratio=0.5), 6_912_000),
    "knorm-50": (KVCacheConfig(evict="knorm", ratio=0.5), 6_912_000),
    # 300 kept, int4 g64 r64: tail 64 + 236 % 64 = 108, 192 quantized.  codes 2 x 3*192*64 / 2 = 36,864;
    # groups K 3*3*64 = 576, V 3*192 = 576 -> 1,152 x 4 = 4,608; tail 2 x 3*108*64 x 2 = 82,944.
    # Layer 124,416; x 30
    "int4+knorm-50": (KVCacheConfig(quant="int4", group_size=64, residual_length=64, evict="knorm", ratio=0.5),
                      3_732_480),
    # K int8 / V int4, g64 r64: 512 quantized, 88 in the tail.  K: codes 3*512*64 = 98,304 + 1,536 channel
    # groups x 4 = 6,144; V: codes 3*512*64 / 2 = 49,152 + 1,536 token groups x 4 = 6,144; tail 67,584.
    # Layer 227,328; x 30
    "k:int8/v:int4": (KVCacheConfig(quant="int8", value_quant="int4"), 6_819_840),
    # K int4 / V 16-bit: K 49,152 + 6,144; V 3*512*64 x 2 = 196,608 (no groups); tail 67,584.  Layer 319,488
    "k:int4/v:none": (KVCacheConfig(quant="int4", value_quant="none"), 9_584_640),
    # int4 g64 r64 with the first and last 2 layers 16-bit: 26 x 178,176 + 4 x 460,800
    "int4/16b:f2l2": (KVCacheConfig(quant="int4", skip_layers={"first": 2, "last": 2}), 6_475_776),
    # int4 + knorm-50 with layers 0 and 5 16-bit: 2 x 230,400 + 28 x 124,416
    "int4+knorm-50/16b:0,5": (KVCacheConfig(quant="int4", evict="knorm", ratio=0.5, skip_layers={"layers": [0, 5]}),
                              3_944_448),
    # AdaKV: 300 tokens per head on average, so 900 entries a layer, 16-bit: as knorm-50 however they are shared
    "knorm:n300/ada": (KVCacheConfig(evict="knorm", keep_tokens=300, heads="adakv"), 6_912_000),
}


@pytest.fixture(scope="module")
def prefix(engine) -> list[int]:
    ids = engine.tokenizer(" ".join(load_haystack().words[:2000]))["input_ids"]
    assert len(ids) >= TOKENS
    return ids[:TOKENS]


@pytest.mark.parametrize("name", list(EXPECTED))
def test_physical_bytes_equal_the_hand_calculation(engine, prefix, name):
    config, expected = EXPECTED[name]
    prefill = engine._prefill(prefix, {None} | ({_scorer(config)} - {None}))
    compressed = engine._compress(config, prefill.scores_for(config), prefill.keys, prefill.values, TOKENS, TOKENS)
    assert compressed.kv.physical_bytes == expected
    assert compressed.kv.baseline_bytes == 13_824_000


def _scorer(config: KVCacheConfig):
    from kvlab.compress.eviction import scorer_key

    return scorer_key(config)
