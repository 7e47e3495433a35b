"""The sweet-spot decision: paired non-inferiority against the baseline with Holm correction.

A config is compared with the baseline on the *same items*.  The accuracy difference
(config - baseline) gets a 95% interval by MOVER (Zou & Donner, 2008): Wilson intervals for the
two mean scores, recombined with the (continuity-adjusted) correlation of the paired scores.  For
0/1 scores this is exactly Newcombe's (1998) square-and-add interval for paired proportions (his
method 10); it
also covers fractional scores in [0, 1] (a bounded score's variance is at most p(1 - p), so the
Wilson interval of its mean stays honest where a bootstrap collapses).

A config is **non-inferior** at margin ``max_drop`` when the one-sided test of
``H0: difference <= -max_drop`` rejects at 2.5% after Holm's correction across the configs
compared; its p-value is the level at which the interval's lower end touches ``-max_drop``.
The **sweet spot** is the most compressed non-inferior config.  Overlapping intervals are not
a test, and the maximum over many configs needs the multiplicity control.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

ALPHA_ONE_SIDED = 0.025  # the lower end of a two-sided 95% interval
_Z_MAX = 12.0  # p below 1e-32 is zero for every purpose here
_NORMAL = NormalDist()  # the standard library's, not scipy's: `kvlab show` must not import scipy


def normal_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z, through ``erfc`` so that it stays exact far in the tail
    (``1 - cdf(z)`` is 0 beyond z = 8.3)."""
    return 0.5 * math.erfc(z / math.sqrt(2))


def normal_isf(q: float) -> float:
    """The z with P(Z > z) = q."""
    return -_NORMAL.inv_cdf(q)


def wilson_bounds(mean: float, n: float, z: float) -> tuple[float, float]:
    """Wilson's score interval for a mean in [0, 1] over ``n`` items, at normal quantile ``z``."""
    denom = 1 + z * z / n
    centre = (mean + z * z / (2 * n)) / denom
    half = z * math.sqrt(max(mean * (1 - mean), 0.0) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _correlation(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Newcombe's continuity-adjusted correlation of paired scores: Pearson's r with the covariance
    moved ``1 / (2n)`` towards zero when positive (for 0/1 scores, his ``max(AD - BC - n/2, 0)``
    over the root of the margins' product).  0 when either side is constant."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    cov = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / n
    sx = math.sqrt(sum((x - mx) ** 2 for x in xs) / n)
    sy = math.sqrt(sum((y - my) ** 2 for y in ys) / n)
    if sx == 0 or sy == 0:
        return 0.0
    if cov > 0:
        cov = max(cov - 1 / (2 * n), 0.0)
    return cov / (sx * sy)


@dataclass(frozen=True)
class PairedScores:
    """Means, count and correlation of paired scores: everything the interval needs."""

    config_mean: float
    baseline_mean: float
    n: float
    correlation: float

    @classmethod
    def of(cls, baseline: Sequence[float], config: Sequence[float]) -> PairedScores:
        return cls(sum(config) / len(config), sum(baseline) / len(baseline), len(config),
                   _correlation(config, baseline))

    @property
    def difference(self) -> float:
        return self.config_mean - self.baseline_mean

    def interval(self, z: float = normal_isf(ALPHA_ONE_SIDED)) -> tuple[float, float]:
        """Two-sided interval of config - baseline at normal quantile ``z`` (1.96 for 95%)."""
        p1, p2, r = self.config_mean, self.baseline_mean, self.correlation
        l1, u1 = wilson_bounds(p1, self.n, z)
        l2, u2 = wilson_bounds(p2, self.n, z)
        below = (p1 - l1) ** 2 - 2 * r * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2
        above = (u1 - p1) ** 2 - 2 * r * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2
        d = self.difference
        return max(-1.0, d - math.sqrt(max(below, 0.0))), min(1.0, d + math.sqrt(max(above, 0.0)))

    def p_noninferior(self, max_drop: float) -> float:
        """One-sided p-value of ``H0: difference <= -max_drop``: the level whose lower bound is -max_drop."""
        if self.difference <= -max_drop:
            return 1.0
        if self.interval(_Z_MAX)[0] > -max_drop:
            return normal_sf(_Z_MAX)
        low, high = 0.0, _Z_MAX  # lower bound(z) falls as z grows: bisect for the crossing
        for _ in range(60):
            mid = (low + high) / 2
            low, high = (mid, high) if self.interval(mid)[0] > -max_drop else (low, mid)
        return normal_sf(low)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def items_needed(baseline_accuracy: float, max_drop: float, n_configs: int, limit: int = 100_000) -> int | None:
    """Items at which a config exactly as accurate as the baseline, with its errors independent of
    the baseline's (a cautious assumption), would be shown non-inferior: the expected paired table
    run through the same test, at the Holm threshold of the first step (alpha / configs)."""
    p = baseline_accuracy
    z = normal_isf(ALPHA_ONE_SIDED / max(n_configs, 1))
    correlation = 0.0  # independent errors

    def shown(n: int) -> bool:
        return PairedScores(p, p, n, correlation).interval(z)[0] > -max_drop

    if not shown(limit):
        return None
    low, high = 1, limit  # shown(n) is monotone in n: bisect
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if shown(mid) else (mid + 1, high)
    return low
