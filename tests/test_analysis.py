"""Statistics: intervals, paired tests, Pareto front and sweet spot, on hand-made results."""

from __future__ import annotations

import pytest

from kvlab.analysis import (
    accuracy_interval,
    breakdown,
    paired_test,
    pareto_front,
    summarize,
    sweet_spot,
    wilson_interval,
)
from kvlab.results import ItemResult


def _result(config: str, item: int, score: float, physical: int, baseline: int = 1000) -> ItemResult:
    return ItemResult(
        item_id=f"i{item}", task="passkey", config_name=config, config={}, seed=0, context_length=512 * (1 + item % 2),
        depth=0.5, prompt_tokens=512, context_tokens=500, kept_tokens=500, kept_fraction=1.0,
        baseline_kv_bytes=baseline, physical_kv_bytes=physical, analytic_kv_bytes=physical,
        compression_ratio=baseline / physical, peak_kv_bytes=physical, generated="", answer="",
        output_tokens=2, ttft_s=0.1, tpot_s=0.01, prefill_s=0.05, compress_s=0.01, decode_s=0.01,
        peak_memory_bytes=None, score=score)


def test_wilson_interval_known_values():
    low, high = wilson_interval(10, 10)
    assert low == pytest.approx(0.7225, abs=1e-3) and high == pytest.approx(1.0)
    low, high = wilson_interval(5, 10)
    assert (low, high) == (pytest.approx(0.2366, abs=1e-3), pytest.approx(0.7634, abs=1e-3))


def test_interval_for_fractional_scores_is_bootstrap():
    low, high = accuracy_interval([0.5, 0.75, 1.0, 0.25])
    assert 0.25 <= low < 0.625 < high <= 1.0


def test_mcnemar_exact():
    assert paired_test([1] * 10, [1] * 10) == ("mcnemar-exact", 1.0)
    name, p = paired_test([1] * 10, [0] * 10)
    assert name == "mcnemar-exact" and p == pytest.approx(2 / 1024)
    name, p = paired_test([0.5, 1, 1], [0.5, 0, 0.5])
    assert name == "wilcoxon" and 0 < p <= 1


def test_summaries_front_and_sweet_spot():
    rows = []
    for i in range(10):
        rows += [_result("baseline", i, 1.0, 1000), _result("int4", i, 1.0 if i else 0.0, 300),
                 _result("int2", i, float(i < 3), 200), _result("bad", i, 0.0, 900)]
    summaries = {s.config_name: s for s in summarize(rows)}
    assert summaries["int4"].accuracy == 0.9 and summaries["int4"].compression_ratio == pytest.approx(1000 / 300)
    assert summaries["int2"].p_value < 0.05 and summaries["int4"].p_value == 1.0
    front = [s.config_name for s in pareto_front(list(summaries.values()))]
    assert front == ["int2", "int4", "baseline"]
    assert sweet_spot(list(summaries.values())).config_name == "int4"
    assert sweet_spot(list(summaries.values()), tolerance=0.0).config_name == "baseline"
    by_length = breakdown(rows, lambda r: r.context_length)
    assert sorted(by_length) == [512, 1024] and all(len(v) == 4 for v in by_length.values())
