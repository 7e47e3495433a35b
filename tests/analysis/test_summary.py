"""Statistics: intervals, paired tests, Pareto front and sweet spot, on hand-made results."""

from __future__ import annotations

import pytest

from kvlab.analysis.decision import PairedScores, holm, items_needed
from kvlab.analysis.summary import (
    accuracy_interval,
    breakdown,
    decide,
    length_group,
    paired_test,
    pareto_front,
    summarize,
    sweet_spot,
    wilson_interval,
)
from kvlab.core.margins import Margins
from kvlab.core.results import ItemResult


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


def test_interval_for_fractional_scores_does_not_collapse():
    # Wilson at p = 19.5/20, z = 1.96: centre (0.975 + 3.8415/40) / (1 + 3.8415/20) = 0.89847,
    # half 1.96 * sqrt(0.975*0.025/20 + 3.8415/1600) / 1.19207 = 0.09892 -> [0.7996, 0.9974],
    # wider than twenty 1.0 scores' [0.8389, 1.0] (a bootstrap gave [0.925, 1.0]).
    low, high = accuracy_interval([1.0] * 19 + [0.5])
    assert (low, high) == (pytest.approx(0.7996, abs=2e-4), pytest.approx(0.9974, abs=2e-4))
    assert low < wilson_interval(20, 20)[0] == pytest.approx(0.8389, abs=1e-4)


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
    # 10 items are too few to show anything non-inferior within 0.05: with 3 configs compared,
    # z = z(0.025 / 3) = 2.394 and a perfect config needs n >= 19 z^2 = 108.9 items.
    decision = decide(list(summaries.values()))
    assert decision.sweet_spot is None and "109 items" in decision.note
    assert sweet_spot(summarize(rows, margins=Margins(max_drop=0.5))).config_name == "int4"
    by_length = breakdown(rows, lambda r: r.context_length)
    assert sorted(by_length) == [512, 1024] and all(len(v) == 4 for v in by_length.values())


def _paired(both: int, config_only: int, baseline_only: int, neither: int) -> PairedScores:
    config = [1] * both + [1] * config_only + [0] * baseline_only + [0] * neither
    baseline = [1] * both + [0] * config_only + [1] * baseline_only + [0] * neither
    return PairedScores.of(baseline, config)


def test_paired_interval_matches_newcombe_published_example():
    # Fagerland, Lydersen & Laake, "Statistical Analysis of Contingency Tables", ch. 8: the paired
    # table (59, 6 / 16, 80) has estimate -0.0621 and Newcombe square-and-add 95% CI -0.1186 to -0.0046.
    pair = _paired(59, 6, 16, 80)
    assert pair.difference == pytest.approx(-0.0621, abs=1e-4)
    low, high = pair.interval()
    assert (low, high) == (pytest.approx(-0.1186, abs=1e-4), pytest.approx(-0.0046, abs=1e-4))


def test_holm_adjustment_by_hand():
    # sorted 0.01, 0.03, 0.04 -> 3 x 0.01 = 0.03, 2 x 0.03 = 0.06, max(0.06, 1 x 0.04) = 0.06
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])


def test_items_needed_when_every_item_is_right():
    # Both all correct: the lower end is -(1 - n / (n + z^2)); above -0.05 from n >= 19 z^2 = 72.99.
    assert items_needed(1.0, 0.05, 1) == 73
    assert _paired(73, 0, 0, 0).p_noninferior(0.05) < 0.025 < _paired(72, 0, 0, 0).p_noninferior(0.05)


def test_sweet_spot_is_most_compressed_non_inferior_config_after_holm():
    rows = []
    for i in range(400):
        rows += [_result("baseline", i, 1.0, 1000), _result("int8", i, 1.0, 500),
                 _result("int4", i, 0.0 if i < 4 else 1.0, 300), _result("int2", i, 0.0 if i < 80 else 1.0, 200)]
    summaries = {s.config_name: s for s in summarize(rows)}
    assert summaries["int2"].non_inferior is False and summaries["int2"].diff_estimate == pytest.approx(-0.2)
    assert summaries["int4"].non_inferior is True and summaries["int8"].non_inferior is True
    assert summaries["int4"].p_adjusted >= summaries["int4"].p_noninferior
    decision = decide(list(summaries.values()))
    assert decision.sweet_spot.config_name == "int4" and "Holm" in decision.rule and decision.note == ""
    data = summaries["int4"].to_dict()
    assert data["diff_vs_baseline"]["estimate"] == pytest.approx(-0.01) and data["non_inferior"] is True


def test_jsonl_lengths_are_bucketed():
    row = _result("baseline", 0, 1.0, 1000)
    row.task, row.context_length = "jsonl", 700
    assert length_group(row) == "512-1023"
    row.task = "passkey"
    assert length_group(row) == "700"
