"""What a config's budget and formats suggest against what it measured: the summary names the configs that free
less memory than they seem to, and what in each keeps the bytes."""

from __future__ import annotations

import pytest

from kvlab.analysis.summary import summarize
from kvlab.compress.accounting import budget_ratio
from kvlab.core.kv_config import KVCacheConfig
from kvlab.experiments.report import budget_notes, render
from tests.store.test_store import make_result

BASELINE_BYTES = 368_640_000


def test_a_budget_suggests_its_kept_share_times_its_formats_bytes():
    assert budget_ratio(KVCacheConfig(evict="knorm", ratio=0.75), 1000) == pytest.approx(4.0)
    assert budget_ratio(KVCacheConfig(evict="knorm", keep_tokens=250, heads="adakv"), 1000) == pytest.approx(4.0)
    assert budget_ratio(KVCacheConfig(evict="knorm", keep_tokens=5000), 1000) == pytest.approx(1.0)
    # int8 codes and their scales, over 16-bit: a little under 2x; K8V4 lies between int8 and int4
    int8, int4 = (budget_ratio(KVCacheConfig(quant=q), 1000) for q in ("int8", "int4"))
    assert 1.8 < int8 < 2.0 and int8 < budget_ratio(KVCacheConfig(quant="int8", value_quant="int4"), 1000) < int4
    assert budget_ratio(KVCacheConfig(evict="knorm", threshold=0.5), 1000) is None  # the scores decide


def _result(config: KVCacheConfig, item: int, physical: int):
    return make_result(f"passkey-{item}", config.label, config=config.model_dump(mode="json"),
                       physical_kv_bytes=physical, compression_ratio=BASELINE_BYTES / physical)


def test_configs_that_keep_more_than_their_budget_are_named_with_the_cause():
    full = KVCacheConfig(evict="knorm", ratio=0.75)  # measured as it suggests
    skipped = KVCacheConfig(evict="knorm", ratio=0.75, quant="int4", skip_layers={"first": 4, "last": 4})
    results = [r for item in range(3) for r in (
        _result(KVCacheConfig(), item, BASELINE_BYTES), _result(full, item, BASELINE_BYTES // 4),
        _result(skipped, item, BASELINE_BYTES // 6))]
    summaries = summarize(results)
    by_name = {s.config_name: s for s in summaries}
    assert by_name[skipped.label].budget_ratio > 12 and by_name[full.label].budget_ratio == pytest.approx(4.0)
    notes = budget_notes(summaries)
    assert len(notes) == 1 and notes[0].startswith(f"{skipped.label}: 6.00x measured")
    assert "16-bit layers (16b:f4l4)" in notes[0] and "residual window" in notes[0]
    assert "freeing less memory than the budget suggests" in render(summaries, results, "baseline")
