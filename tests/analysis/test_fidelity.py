"""Fidelity figures by hand: the per-token KL, one item's Fidelity, and the summary over items
(t intervals on item means, one-sided p-values) against scipy.stats computed here."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch
from scipy import stats

from kvlab.analysis.fidelity import MIN_ITEMS, FidelitySummary
from kvlab.core.results import TEACHER_CONTINUATION, Fidelity
from kvlab.engines.batched_decode import token_kl

P = [0.7, 0.2, 0.1]  # the reference (baseline)
Q = [0.5, 0.3, 0.2]  # the config


def _hand_kl(p: list[float], q: list[float]) -> float:
    return math.fsum(a * math.log(a / b) for a, b in zip(p, q, strict=True))


def test_token_kl_is_kl_of_reference_against_config():
    reference = torch.log(torch.tensor([P, Q], dtype=torch.float64))
    # the config's logits are unnormalized: shifted log-probabilities, a different shift per row
    logits = torch.log(torch.tensor([Q, P], dtype=torch.float64)) + torch.tensor([[3.0], [-1.5]], dtype=torch.float64)
    kl = token_kl(reference, logits).tolist()
    # the config's logits go through float32: agreement to 1e-6 of the value
    assert kl == pytest.approx([_hand_kl(P, Q), _hand_kl(Q, P)], rel=1e-6)
    # the direction matters on this pair (0.0851 against 0.0920 nats), so the check above tells
    # KL(reference || config) from KL(config || reference)
    assert abs(_hand_kl(P, Q) - _hand_kl(Q, P)) > 5e-3


def test_token_kl_of_identical_distributions_is_zero():
    reference = torch.log(torch.tensor(P))
    assert token_kl(reference, reference + 7.0).item() == pytest.approx(0.0, abs=1e-6)
    assert token_kl(reference, reference + 7.0).item() >= 0.0


def test_one_item_fidelity():
    fidelity = Fidelity(kl=(0.1, 0.3, 0.2, 0.0), agree=(True, False, True, False), teacher=TEACHER_CONTINUATION)
    assert fidelity.tokens == 4
    assert fidelity.mean_kl == pytest.approx(0.15)
    assert fidelity.max_kl == 0.3
    assert fidelity.agreement == 0.5
    assert fidelity.first_divergence == 1
    assert Fidelity(kl=(0.0, 0.1), agree=(True, True)).first_divergence is None
    assert Fidelity(kl=(0.2,), agree=(False,)).first_divergence == 0


def test_fidelity_round_trip_and_summary_fields():
    fidelity = Fidelity(kl=(0.25, 0.5), agree=(False, True), teacher=TEACHER_CONTINUATION)
    data = fidelity.to_dict()
    assert data["mean_kl"] == pytest.approx(0.375) and data["max_kl"] == 0.5 and data["agreement"] == 0.5
    assert data["first_divergence"] == 0 and data["tokens"] == 2
    assert Fidelity.from_dict(data) == fidelity
    assert Fidelity.from_dict({"kl": [0.1], "agree": [1]}).agree == (True,)  # teacher defaults to the baseline's


@pytest.mark.parametrize(("kl", "agree"), [((0.1, 0.2), (True,)), ((0.1,), (True, False)), ((), ())])
def test_fidelity_refuses_mismatched_or_empty(kl, agree):
    with pytest.raises(ValueError, match="one KL and one agreement per token"):
        Fidelity(kl=kl, agree=agree)


def _item(mean: float, tokens: int, spread: float = 0.0, agreeing: int | None = None) -> Fidelity:
    """An item whose tokens' KL average ``mean`` (``spread`` either side), ``agreeing`` of them agreeing."""
    kl = tuple(mean + (spread if i % 2 else -spread) for i in range(tokens - tokens % 2)) + (
        (mean,) if tokens % 2 else ())
    agreeing = tokens if agreeing is None else agreeing
    return Fidelity(kl=kl, agree=tuple(i < agreeing for i in range(tokens)))


ITEM_MEANS = [0.010, 0.030, 0.020, 0.050, 0.015]
TOKENS = [4, 10, 3, 7, 6]  # unequal, so a mean over tokens differs from the mean over items
AGREEING = [4, 8, 3, 5, 6]


@pytest.fixture
def summary() -> FidelitySummary:
    return FidelitySummary.of([_item(m, n, 0.004, a) for m, n, a in zip(ITEM_MEANS, TOKENS, AGREEING, strict=True)])


def test_summary_figures(summary):
    fidelities = [_item(m, n, 0.004, a) for m, n, a in zip(ITEM_MEANS, TOKENS, AGREEING, strict=True)]
    every_kl = [kl for f in fidelities for kl in f.kl]
    assert summary.items == 5 and summary.tokens == sum(TOKENS) == len(every_kl)
    assert summary.mean_kl == pytest.approx(statistics.fmean(ITEM_MEANS))  # items as the unit...
    assert abs(summary.mean_kl - statistics.fmean(every_kl)) > 1e-4  # ...not tokens
    assert summary.median_kl == pytest.approx(0.020)
    assert summary.max_kl == pytest.approx(0.054)
    assert summary.p99_kl == pytest.approx(float(np.percentile(every_kl, 99)))
    assert summary.agreement == pytest.approx(statistics.fmean(a / n for a, n in zip(AGREEING, TOKENS, strict=True)))
    # items 2 and 4 diverge, at their first disagreeing token (8 and 5)
    assert summary.first_divergence_median == pytest.approx(6.5)


def _t_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    n = len(values)
    half = stats.t.ppf(1 - (1 - level) / 2, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return statistics.fmean(values) - half, statistics.fmean(values) + half


def test_kl_interval_is_t_on_item_means(summary):
    low, high = _t_interval(ITEM_MEANS)
    assert low > 0 and summary.kl_interval() == (pytest.approx(low), pytest.approx(high))
    wide = [0.001, 0.1, 0.002]
    low, high = _t_interval(wide)
    assert low < 0  # a KL is never negative: the low end is clipped at 0
    assert FidelitySummary.of([_item(m, 3) for m in wide]).kl_interval() == (0.0, pytest.approx(high))


def test_p_kl_below_is_one_sided_t(summary):
    n, mean = len(ITEM_MEANS), statistics.fmean(ITEM_MEANS)
    se = statistics.stdev(ITEM_MEANS) / math.sqrt(n)
    for max_kl in (0.04, 0.05, 0.08):
        # H0: mean KL >= max_kl; small t = (mean - max_kl) / se supports KL below max_kl
        assert summary.p_kl_below(max_kl) == pytest.approx(stats.t.cdf((mean - max_kl) / se, n - 1), rel=1e-9)
    assert summary.p_kl_below(0.08) < 0.025 < summary.p_kl_below(0.04)
    # the upper end of the 95% interval is where the one-sided p crosses 2.5%
    assert summary.p_kl_below(summary.kl_interval()[1]) == pytest.approx(0.025, rel=1e-6)
    # a mean at or above the margin is never certified
    assert summary.p_kl_below(mean) == 1.0 and summary.p_kl_below(0.01) == 1.0


def test_agreement_interval_and_p(summary):
    rates = [a / n for a, n in zip(AGREEING, TOKENS, strict=True)]
    low, high = _t_interval(rates)
    assert summary.agreement_interval() == (pytest.approx(low), pytest.approx(min(high, 1.0)))
    n, mean = len(rates), statistics.fmean(rates)
    se = statistics.stdev(rates) / math.sqrt(n)
    for bound in (0.5, 0.6, 0.7):
        p_items = stats.t.sf((mean - bound) / se, n - 1)
        p_bounded = stats.norm.sf((mean - bound) / math.sqrt(bound * (1 - bound) / n))
        assert summary.p_agreement_above(bound) == pytest.approx(max(p_items, p_bounded), rel=1e-9)
    assert summary.p_agreement_above(mean) == 1.0
    assert summary.p_agreement_above(1.0) == 1.0


def test_agreement_larger_of_the_t_test_and_the_bounded_score_test():
    # items agree alike (the t test is sure): the score test with a rate's largest variance decides
    alike = FidelitySummary.of([_item(0.01, 20, agreeing=19)] * 30)
    p_bounded = stats.norm.sf((0.95 - 0.9) / math.sqrt(0.9 * 0.1 / 30))
    assert alike.p_agreement_above(0.9) == pytest.approx(p_bounded, rel=1e-9)
    # items spread wider than the largest variance allowed at the bound (all or nothing): the t test decides
    spread = FidelitySummary.of([_item(0.01, 10, agreeing=10), _item(0.01, 10, agreeing=0)] * 10)
    rates = [1.0, 0.0] * 10
    p_items = stats.t.sf((0.5 - 0.3) / (statistics.stdev(rates) / math.sqrt(20)), 19)
    assert spread.p_agreement_above(0.3) == pytest.approx(p_items, rel=1e-9)
    assert p_items > stats.norm.sf((0.5 - 0.3) / math.sqrt(0.3 * 0.7 / 20))


def test_items_in_full_agreement_certify_only_what_their_number_allows():
    ten = FidelitySummary.of([_item(0.001, 400)] * 10)
    assert ten.agreement_interval() == (1.0, 1.0)  # the t interval collapses...
    p = ten.p_agreement_above(0.9)
    assert p == pytest.approx(stats.norm.sf(0.1 / math.sqrt(0.9 * 0.1 / 10)), rel=1e-9)
    assert p > 0.025  # ...but 10 items cannot show 90%, however many tokens each holds
    forty = FidelitySummary.of([_item(0.001, 5)] * 40)
    assert forty.p_agreement_above(0.9) < 0.025  # 40 can


def test_one_item_never_certifies():
    assert MIN_ITEMS == 2
    one = FidelitySummary.of([_item(1e-6, 500)])
    assert one.p_kl_below(0.05) == 1.0
    assert one.p_agreement_above(0.5) == 1.0
    assert one.kl_interval() == (0.0, math.inf)
    assert one.agreement_interval() == (0.0, 1.0)
    two = FidelitySummary.of([_item(1e-6, 500), _item(2e-6, 500)])
    assert two.p_kl_below(0.05) < 0.025  # two items can


def test_summary_of_nothing_is_refused():
    with pytest.raises(ValueError, match="at least one item"):
        FidelitySummary.of([])
