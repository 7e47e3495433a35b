"""Fidelity of a config against the baseline over items: summaries, intervals and certification.

Each item gives a :class:`~kvlab.core.results.Fidelity` (per-token KL(baseline || config) and
top-1 agreement, teacher-forced on the baseline's tokens).  The tokens of one item are not
independent (one wrong kept token shifts every later distribution), so **the item is the unit**:
a config's mean KL is the mean over items of each item's mean KL, and its interval is Student's t
on those item means (n - 1 degrees of freedom).  Agreement likewise, with one more guard: a t
interval collapses when every item agrees on every token, so agreement (a rate in [0, 1] per item)
is certified only when the score test over items also certifies it, with the variance any score
in [0, 1] may have (at most p(1 - p) per item, as accuracy is judged): ten items in full agreement
cannot show 90%.

Certification is one-sided: mean KL *below* ``max_kl`` (H0: mean KL >= max_kl), agreement *above*
``min_agreement`` (H0: agreement <= min_agreement), at 2.5% (the end of the two-sided 95%
interval); the p-values are Holm-corrected across the configs judged, by
:mod:`kvlab.analysis.verdict`.  The t interval assumes item means spread roughly normally: a
config that fails badly on a rare kind of item can pass on a handful of items that lack it.  More
items, and the p99 and max KL shown beside the mean, are the guard a deployment should add.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.analysis.decision import ALPHA_ONE_SIDED, normal_sf
from kvlab.core.results import Fidelity

#: One item cannot show anything: a t interval needs two.
MIN_ITEMS = 2


def _t_sf(t: float, df: int) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom (scipy.special, imported only here:
    a report without fidelity imports no scipy)."""
    from scipy.special import stdtr

    return float(stdtr(df, -t))


def _t_quantile(q: float, df: int) -> float:
    """The t with P(T <= t) = q."""
    from scipy.special import stdtrit

    return float(stdtrit(df, q))


def _percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) by linear interpolation between order statistics."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class FidelitySummary:
    """A config's fidelity over its items: means over items with 95% t intervals, and the spread."""

    items: int
    tokens: int
    item_mean_kl: tuple[float, ...]  # one per item, the unit of the intervals
    item_agreement: tuple[float, ...]
    median_kl: float  # of the item means
    p99_kl: float  # of every token's KL: the tail, as llama.cpp reports it
    max_kl: float
    first_divergence_median: float | None  # over the items that diverge at all

    @classmethod
    def of(cls, fidelities: Sequence[Fidelity]) -> FidelitySummary:
        if not fidelities:
            raise ValueError("a fidelity summary needs at least one item")
        every_kl = [kl for f in fidelities for kl in f.kl]
        divergences = [f.first_divergence for f in fidelities if f.first_divergence is not None]
        return cls(items=len(fidelities), tokens=len(every_kl),
                   item_mean_kl=tuple(f.mean_kl for f in fidelities),
                   item_agreement=tuple(f.agreement for f in fidelities),
                   median_kl=statistics.median(f.mean_kl for f in fidelities), p99_kl=_percentile(every_kl, 0.99),
                   max_kl=max(every_kl),
                   first_divergence_median=statistics.median(divergences) if divergences else None)

    @property
    def mean_kl(self) -> float:
        return statistics.fmean(self.item_mean_kl)

    @property
    def agreement(self) -> float:
        return statistics.fmean(self.item_agreement)

    def _se(self, values: Sequence[float]) -> float:
        return statistics.stdev(values) / math.sqrt(len(values)) if len(values) >= MIN_ITEMS else math.inf

    def _interval(self, values: Sequence[float], low: float, high: float) -> tuple[float, float]:
        mean, se = statistics.fmean(values), self._se(values)
        if math.isinf(se):
            return (low, high)
        half = _t_quantile(1 - ALPHA_ONE_SIDED, len(values) - 1) * se
        return (max(low, mean - half), min(high, mean + half))

    def kl_interval(self) -> tuple[float, float]:
        """95% t interval of the mean KL (items as the unit)."""
        return self._interval(self.item_mean_kl, 0.0, math.inf)

    def agreement_interval(self) -> tuple[float, float]:
        """95% t interval of the agreement rate (items as the unit)."""
        return self._interval(self.item_agreement, 0.0, 1.0)

    def p_kl_below(self, max_kl: float) -> float:
        """One-sided p-value of H0: mean KL >= ``max_kl``."""
        return _one_sided(self.mean_kl - max_kl, self._se(self.item_mean_kl), self.items)

    def p_agreement_above(self, min_agreement: float) -> float:
        """One-sided p-value of H0: agreement <= ``min_agreement``: the larger of the t test over items
        and the score test over items with the largest variance a rate in [0, 1] may have (which
        does not collapse when all of them agree)."""
        p_items = _one_sided(min_agreement - self.agreement, self._se(self.item_agreement), self.items)
        if min_agreement >= 1.0 or p_items == 1.0:
            return 1.0
        z = (self.agreement - min_agreement) / math.sqrt(min_agreement * (1 - min_agreement) / self.items)
        return max(p_items, normal_sf(z))


def items_to_certify(mean: float, sd: float, max_kl: float, alpha: float = ALPHA_ONE_SIDED,
                     limit: int = 100_000) -> int | None:
    """The fewest items on which a config whose item means have this ``mean`` and standard deviation ``sd`` gets
    its mean KL certified below ``max_kl`` at one-sided level ``alpha`` (:meth:`FidelitySummary.p_kl_below`
    inverted): the smallest n (at least :data:`MIN_ITEMS`) with ``t(1 - alpha, n - 1) * sd / sqrt(n) <
    max_kl - mean``, i.e. n ~ (t * sd / (max_kl - mean))^2.  None when ``mean >= max_kl`` or beyond ``limit``."""
    gap = max_kl - mean
    if gap <= 0:
        return None

    def certified(n: int) -> bool:
        return sd == 0 or _t_quantile(1 - alpha, n - 1) * sd / math.sqrt(n) < gap

    if not certified(limit):
        return None
    low, high = MIN_ITEMS, limit  # certified(n) is monotone in n (the quantile and sd / sqrt(n) both fall): bisect
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if certified(mid) else (mid + 1, high)
    return low


def holm_items_to_certify(figures: dict[str, tuple[float, float]], max_kl: float, alpha: float = ALPHA_ONE_SIDED,
                          limit: int = 100_000) -> dict[str, int | None]:
    """:func:`items_to_certify` for each config of ``figures`` (its item means' mean and standard deviation) with
    Holm's correction across them all: on equal items the p-values rank as the margins in standard deviations,
    ``(max_kl - mean) / sd``, so the j-th best (from 0) is tested at ``alpha / (m - j)`` and certified only once
    every better one is too (Holm steps down): its count is the largest of theirs and its own."""
    def margin(name: str) -> float:
        mean, sd = figures[name]
        return (max_kl - mean) / sd if sd > 0 else math.copysign(math.inf, max_kl - mean)

    needed: dict[str, int | None] = {}
    so_far: int | None = 0
    for rank, name in enumerate(sorted(figures, key=margin, reverse=True)):
        mean, sd = figures[name]
        own = items_to_certify(mean, sd, max_kl, alpha / (len(figures) - rank), limit)
        so_far = None if so_far is None or own is None else max(so_far, own)
        needed[name] = so_far
    return needed


def _one_sided(gap: float, se: float, n: int) -> float:
    """p-value for H0 ``mean - bound >= 0`` given ``gap = mean - bound`` < 0 supports the alternative."""
    if n < MIN_ITEMS or gap >= 0:
        return 1.0
    if se == 0:
        return 0.0
    return _t_sf(-gap / se, n - 1)
