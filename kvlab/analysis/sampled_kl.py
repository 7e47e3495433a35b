"""The sampled KL estimator's variance: one draw per position on top of the spread across items.

The sampled estimator (:mod:`kvlab.engines.server_fidelity`) scores, per item, a continuation ``y_1 .. y_T`` the
baseline sampled at temperature 1.  At position t (its state: the prompt and ``y_<t``) let ``p_t``, ``q_t`` be
the baseline's and the config's next-token distributions and

    d_t  = log p_t(y_t) - log q_t(y_t)                      (what a server's log-probabilities give)
    KL_t = E_{y ~ p_t}[log p_t(y) - log q_t(y)]             (the exact KL at that state)
    V_t  = Var_{y ~ p_t}[log p_t(y) - log q_t(y)]           (one draw's noise at that state)

The item's estimate is ``m = (1/T) sum_t d_t``; with the full rows at the same states, ``k = (1/T) sum_t KL_t``
is the exact mean KL along the same trajectory.  ``m - k = (1/T) sum_t (d_t - KL_t)`` is a sum of martingale
differences (given ``y_<t``, ``d_t - KL_t`` has mean 0, and every earlier term is fixed by ``y_<t``), so the
draw noise of different positions is uncorrelated and

    E[(m - k)^2] = (1/T^2) sum_t E[V_t]          estimated per item, unbiased, by  w = (1/T^2) sum_t V_t.

The covariances across positions of one trajectory live in ``k``: a later state depends on earlier draws, so
``KL_s`` (s > t) moves with ``y_t``, and ``Cov(k, m - k)`` need not vanish.  Hence, per item,

    Var(m) = Var(k) + E[w] + 2 Cov(k, m - k),

and over items -- the unit of the t interval (:mod:`kvlab.analysis.fidelity`), each item one trajectory -- the
sample variance of the estimates ``s_m^2`` splits alike into the spread of the exact trajectory means ``s_k^2``
(between items; one trajectory per item cannot part the spread of items from that of trajectories), the mean
within-item noise ``mean(w)`` and twice the sample covariance of ``k`` and ``m - k`` (:class:`VarianceComponents`;
their sum is ``s_m^2`` up to the noise of estimating ``E[w]`` by ``mean(w)``).  A config is certified on n items
when ``mean + t(1 - alpha, n - 1) * s_m / sqrt(n) < max_kl``: n ~ (t * s_m / (max_kl - mean))^2
(:func:`kvlab.analysis.fidelity.items_to_certify`).  The exact estimator on the greedy tokens has no ``w``
term at all.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SampledItem:
    """One item under one config: the sampled estimate ``m``, the exact mean KL ``k`` at the same states and the
    estimate's draw-noise variance ``w`` given those states (module docstring)."""

    estimate: float
    exact: float
    noise: float

    @classmethod
    def of(cls, log_ratios: Sequence[float], kls: Sequence[float], variances: Sequence[float]) -> SampledItem:
        """From each position's ``d_t``, ``KL_t`` and ``V_t``."""
        tokens = len(log_ratios)
        if not tokens or len(kls) != tokens or len(variances) != tokens:
            raise ValueError(f"one log-ratio, KL and variance per position (got {len(log_ratios)}, {len(kls)} and "
                             f"{len(variances)})")
        return cls(math.fsum(log_ratios) / tokens, math.fsum(kls) / tokens, math.fsum(variances) / tokens**2)


@dataclass(frozen=True)
class VarianceComponents:
    """Over items: the estimates' mean and sample variance (``total``, what the t interval uses) and its parts:
    ``between`` (sample variance of the exact trajectory means), ``within`` (mean draw noise) and ``cross``
    (twice the sample covariance of the exact means and the estimates' errors)."""

    items: int
    mean: float
    exact_mean: float
    total: float
    between: float
    within: float
    cross: float

    @classmethod
    def of(cls, items: Sequence[SampledItem]) -> VarianceComponents:
        if len(items) < 2:
            raise ValueError("a sample variance needs at least two items")
        estimates = [i.estimate for i in items]
        exact = [i.exact for i in items]
        errors = [i.estimate - i.exact for i in items]
        return cls(items=len(items), mean=statistics.fmean(estimates), exact_mean=statistics.fmean(exact),
                   total=statistics.variance(estimates), between=statistics.variance(exact),
                   within=statistics.fmean(i.noise for i in items),
                   cross=2 * statistics.covariance(exact, errors))

    @property
    def predicted(self) -> float:
        """``between + within + cross``: the total the parts predict (``within`` stands for the errors' measured
        variance, which it estimates without bias)."""
        return self.between + self.within + self.cross

    @property
    def sd(self) -> float:
        """The estimates' standard deviation over items (the t interval's)."""
        return math.sqrt(self.total)
