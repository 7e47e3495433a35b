"""The sampled KL estimator's variance by hand: one draw's noise per position, the decomposition over items on
synthetic data with a known answer (an enumerated two-step process whose second state depends on the first draw,
and a simulation with known between- and within-item variances), and the items a certification needs."""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch
from scipy import stats

from kvlab.analysis.decision import ALPHA_ONE_SIDED
from kvlab.analysis.fidelity import holm_items_to_certify, items_to_certify
from kvlab.analysis.sampled_kl import SampledItem, VarianceComponents
from kvlab.engines.batched_decode import token_kl_variance


def _kl(p: list[float], q: list[float]) -> float:
    return math.fsum(a * math.log(a / b) for a, b in zip(p, q, strict=True))


def _variance(p: list[float], q: list[float]) -> float:
    """Var over y ~ p of log p(y) - log q(y), by its definition."""
    kl = _kl(p, q)
    return math.fsum(a * (math.log(a / b) - kl) ** 2 for a, b in zip(p, q, strict=True))


def test_one_draws_variance_by_hand():
    # p = (1/2, 1/2), q = (1/4, 3/4): the log-ratios are log 2 and log 2/3, each half the time
    reference = torch.log(torch.tensor([[0.5, 0.5], [0.7, 0.3]], dtype=torch.float64))
    logits = torch.log(torch.tensor([[0.25, 0.75], [0.7, 0.3]], dtype=torch.float64)) + 4.0  # unnormalized
    variance = token_kl_variance(reference, logits).tolist()
    assert variance[0] == pytest.approx(0.25 * math.log(3) ** 2, rel=1e-6)  # (difference / 2)^2
    assert variance[1] == pytest.approx(0.0, abs=1e-9)  # the same distribution: every draw is exactly 0
    p, q = [0.7, 0.2, 0.1], [0.5, 0.3, 0.2]
    assert token_kl_variance(torch.log(torch.tensor(p)), torch.log(torch.tensor(q))).item() == pytest.approx(
        _variance(p, q), rel=1e-5)
    # a token the reference never draws adds nothing, however unlikely the config finds it
    assert token_kl_variance(torch.tensor([0.0, -math.inf]), torch.tensor([0.0, -50.0])).item() == 0.0


def test_one_items_figures():
    item = SampledItem.of([0.3, -0.1], [0.05, 0.15], [0.2, 0.6])
    assert (item.estimate, item.exact, item.noise) == pytest.approx((0.1, 0.1, 0.8 / 4))
    with pytest.raises(ValueError, match="one log-ratio, KL and variance per position"):
        SampledItem.of([0.3], [0.05, 0.15], [0.2, 0.6])
    with pytest.raises(ValueError, match="two items"):
        VarianceComponents.of([item])


# A two-token process over {a, b}: the first state is fixed, the second depends on the first draw (after "a" the
# config is off, after "b" it agrees), so later KL moves with earlier draws: the cross term is not 0.
P1, Q1 = [0.5, 0.5], [0.25, 0.75]
SECOND = {0: ([0.75, 0.25], [0.5, 0.5]), 1: ([0.5, 0.5], [0.5, 0.5])}  # first token -> (p2, q2)


def _trajectories() -> list[tuple[float, SampledItem]]:
    """Every trajectory (y1, y2) with its probability and its :class:`SampledItem`."""
    out = []
    for y1 in (0, 1):
        p2, q2 = SECOND[y1]
        for y2 in (0, 1):
            ratios = [math.log(P1[y1] / Q1[y1]), math.log(p2[y2] / q2[y2])]
            item = SampledItem.of(ratios, [_kl(P1, Q1), _kl(p2, q2)], [_variance(P1, Q1), _variance(p2, q2)])
            out.append((P1[y1] * p2[y2], item))
    return out


def test_the_decomposition_on_an_enumerated_process():
    """Each trajectory repeated in proportion to its probability (3/8, 1/8, 1/4, 1/4 of 8 items): the sample
    figures are the population's, so every part has its known value exactly."""
    items = [item for probability, item in _trajectories() for _ in range(round(8 * probability))]
    n = len(items)
    assert n == 8
    parts = VarianceComponents.of(items)
    # unbiased: the mean estimate is the expected exact KL along the trajectory
    assert parts.mean == pytest.approx(parts.exact_mean, abs=1e-12)
    assert parts.exact_mean == pytest.approx(0.5 * (_kl(P1, Q1) + 0.5 * _kl(*SECOND[0])), abs=1e-12)
    # the draw noise of distinct positions is uncorrelated: E[(m - k)^2] = E[(1/T^2) sum V_t]
    errors = [i.estimate - i.exact for i in items]
    assert statistics.fmean(e * e for e in errors) == pytest.approx(parts.within, rel=1e-12)
    # the cross term by hand: 2 Cov(k, m - k) = 2 * (1/4) * E[KL_2(y1) (d_1 - KL_1)] (the other products vanish)
    by_hand = 2 * 0.25 * math.fsum(P1[y1] * _kl(*SECOND[y1]) * (math.log(P1[y1] / Q1[y1]) - _kl(P1, Q1))
                                   for y1 in (0, 1))
    assert parts.cross == pytest.approx(by_hand * n / (n - 1), rel=1e-12) and abs(parts.cross) > 0.01
    # total = between + within + cross, exactly but for the sample variance's n / (n - 1) on the errors
    assert parts.total == pytest.approx(parts.between + parts.within * n / (n - 1) + parts.cross, rel=1e-12)


def test_the_decomposition_recovers_known_variances_by_simulation():
    """Items with true mean KL spread N(0.02, 0.01^2), T = 10 positions each, every draw's log-ratio the item's
    KL plus noise of variance 0.09 (V_t = 0.09): within is 0.09 / 10 exactly, between 1e-4, the cross term 0."""
    rng = random.Random(35)
    tokens, draw_variance, between = 10, 0.09, 1e-4
    items = []
    for _ in range(20_000):
        kl = rng.gauss(0.02, math.sqrt(between))
        ratios = [kl + rng.gauss(0.0, math.sqrt(draw_variance)) for _ in range(tokens)]
        items.append(SampledItem.of(ratios, [kl] * tokens, [draw_variance] * tokens))
    parts = VarianceComponents.of(items)
    assert parts.within == pytest.approx(draw_variance / tokens, rel=1e-12)
    assert parts.between == pytest.approx(between, rel=0.05)
    assert parts.total == pytest.approx(between + draw_variance / tokens, rel=0.05)
    assert parts.predicted == pytest.approx(parts.total, rel=0.05)
    assert abs(parts.cross) < 0.05 * parts.total
    assert parts.mean == pytest.approx(0.02, abs=4 * parts.sd / math.sqrt(len(items)))


def test_items_to_certify_is_the_smallest_n_whose_t_bound_is_below_the_margin():
    # int4-like: mean 0.014, sd 0.02, margin 0.05: t(0.975, 2) * 0.02 / sqrt(3) = 0.0497 > 0.036; at 4 items 0.0318
    assert items_to_certify(0.014, 0.02, 0.05) == 4
    for mean, sd in ((0.0, 0.05), (0.03, 0.1), (0.049, 0.01), (-0.01, 0.3)):
        n = items_to_certify(mean, sd, 0.05)
        assert n is not None and n >= 2

        def bound(items: int, mean: float = mean, sd: float = sd) -> float:
            return mean + stats.t.ppf(1 - ALPHA_ONE_SIDED, items - 1) * sd / math.sqrt(items)

        assert bound(n) < 0.05 and (n == 2 or bound(n - 1) >= 0.05)
        # and about (z * sd / gap)^2 once n is large
        if n > 200:
            assert n == pytest.approx((stats.norm.ppf(0.975) * sd / (0.05 - mean)) ** 2, rel=0.05)
    assert items_to_certify(0.0, 0.0, 0.05) == 2  # no spread: the fewest items a t interval takes
    assert items_to_certify(0.05, 0.01, 0.05) is None and items_to_certify(0.2, 0.0, 0.05) is None
    assert items_to_certify(0.049999, 1.0, 0.05, limit=1000) is None


def test_holm_tests_the_clearest_config_at_alpha_over_m_and_steps_down():
    figures = {"int8": (0.0, 0.0), "int4": (0.014, 0.02), "fp8": (0.02, 0.05), "int2": (0.4, 0.3)}
    needed = holm_items_to_certify(figures, 0.05)
    assert needed["int8"] == 2 and needed["int2"] is None
    # ranks: int8 (no spread) at alpha / 4, int4 (margin 1.8 sd) at alpha / 3, fp8 (0.6 sd) at alpha / 2
    assert needed["int4"] == max(2, items_to_certify(0.014, 0.02, 0.05, ALPHA_ONE_SIDED / 3))
    fp8 = items_to_certify(0.02, 0.05, 0.05, ALPHA_ONE_SIDED / 2)
    assert fp8 is not None and needed["fp8"] == max(needed["int4"], fp8) and fp8 > items_to_certify(0.02, 0.05, 0.05)
    # a config that needs more than the limit blocks every config after it (Holm stops at the first it keeps)
    stuck = holm_items_to_certify({"a": (0.0, 0.01), "b": (0.0499, 1.0), "c": (0.04999, 1.0)}, 0.05, limit=10_000)
    assert stuck["a"] == items_to_certify(0.0, 0.01, 0.05, ALPHA_ONE_SIDED / 3) and stuck["b"] is stuck["c"] is None
