"""Aggregates over item results: accuracy with intervals, paired tests, bytes, latency, Pareto front.

Accuracy is the mean per-item score in [0, 1].  Its 95% interval is Wilson's when scores are
0/1 and a percentile bootstrap otherwise.  A config is compared with the baseline on the
*same items*: exact McNemar for 0/1 scores, Wilcoxon signed-rank otherwise.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from scipy import stats

from kvlab.compress.accounting import compression_ratio
from kvlab.results import ItemResult

Z95 = 1.959963984540054


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    if n == 0:
        return (math.nan, math.nan)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def bootstrap_interval(values: Sequence[float], seed: int = 0, rounds: int = 2000) -> tuple[float, float]:
    if not values:
        return (math.nan, math.nan)
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(rounds))
    return (means[int(0.025 * rounds)], means[int(0.975 * rounds) - 1])


def accuracy_interval(scores: Sequence[float]) -> tuple[float, float]:
    if all(s in (0.0, 1.0) for s in scores):
        return wilson_interval(sum(scores), len(scores))
    return bootstrap_interval(scores)


def paired_test(baseline: Sequence[float], other: Sequence[float]) -> tuple[str, float]:
    """(test name, two-sided p-value) for paired scores of the same items."""
    if all(s in (0.0, 1.0) for s in [*baseline, *other]):
        lost = sum(1 for b, o in zip(baseline, other, strict=True) if b == 1 and o == 0)
        gained = sum(1 for b, o in zip(baseline, other, strict=True) if b == 0 and o == 1)
        if lost + gained == 0:
            return ("mcnemar-exact", 1.0)
        return ("mcnemar-exact", float(stats.binomtest(lost, lost + gained, 0.5).pvalue))
    diffs = [o - b for b, o in zip(baseline, other, strict=True)]
    if all(d == 0 for d in diffs):
        return ("wilcoxon", 1.0)
    return ("wilcoxon", float(stats.wilcoxon(diffs, zero_method="zsplit").pvalue))


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


@dataclass
class ConfigSummary:
    config_name: str
    config: dict[str, Any]
    n_items: int
    n_scored: int
    accuracy: float | None
    ci_low: float | None
    ci_high: float | None
    test: str | None
    p_value: float | None
    baseline_kv_bytes: float
    physical_kv_bytes: float
    analytic_kv_bytes: float
    compression_ratio: float
    kept_fraction: float
    ttft_s: float | None
    tpot_s: float | None
    perplexity: float | None
    errors: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(results: Sequence[ItemResult], baseline_name: str = "baseline",
              key: Callable[[ItemResult], Any] | None = None) -> list[ConfigSummary]:
    """One summary per config, in first-seen order.  ``key`` optionally restricts to a subgroup
    (used by :func:`breakdown`); the baseline pairing is by ``(item_id, task)``.
    """
    by_config: dict[str, list[ItemResult]] = defaultdict(list)
    for result in results:
        by_config[result.config_name].append(result)
    baseline_scores = {(r.item_id, r.task): r.score for r in by_config.get(baseline_name, []) if r.score is not None}
    summaries = []
    for name, rows in by_config.items():
        ok = [r for r in rows if r.error is None]
        scored = [r for r in ok if r.score is not None]
        scores = [r.score for r in scored]
        accuracy = statistics.fmean(scores) if scores else None
        low, high = accuracy_interval(scores) if scores else (None, None)
        test = p_value = None
        paired = [(baseline_scores[(r.item_id, r.task)], r.score) for r in scored
                  if (r.item_id, r.task) in baseline_scores]
        if name != baseline_name and paired:
            test, p_value = paired_test([b for b, _ in paired], [o for _, o in paired])
        nll_rows = [r for r in ok if r.nll is not None and r.nll_tokens]
        perplexity = (math.exp(sum(r.nll for r in nll_rows) / sum(r.nll_tokens for r in nll_rows))
                      if nll_rows else None)
        def mean(attr: str, rows: list[ItemResult] = ok) -> float:
            """Mean over the rows that know the value; NaN where none does (an endpoint that hides its cache)."""
            values = [v for r in rows if (v := getattr(r, attr)) is not None]
            return statistics.fmean(values) if values else math.nan

        baseline_bytes, physical_bytes = mean("baseline_kv_bytes"), mean("physical_kv_bytes")
        summaries.append(ConfigSummary(
            config_name=name, config=rows[0].config, n_items=len(rows), n_scored=len(scores),
            accuracy=accuracy, ci_low=low, ci_high=high, test=test, p_value=p_value,
            baseline_kv_bytes=baseline_bytes, physical_kv_bytes=physical_bytes,
            analytic_kv_bytes=mean("analytic_kv_bytes"),
            compression_ratio=(compression_ratio(baseline_bytes, physical_bytes)
                               if not math.isnan(baseline_bytes + physical_bytes) else math.nan),
            kept_fraction=mean("kept_fraction"), ttft_s=_median(r.ttft_s for r in ok),
            tpot_s=_median(r.tpot_s for r in ok), perplexity=perplexity, errors=len(rows) - len(ok),
        ))
    return summaries


def breakdown(results: Sequence[ItemResult], by: Callable[[ItemResult], Any],
              baseline_name: str = "baseline") -> dict[Any, list[ConfigSummary]]:
    """Summaries per group, e.g. ``by=lambda r: r.task`` or ``by=lambda r: r.context_length``."""
    groups: dict[Any, list[ItemResult]] = defaultdict(list)
    for result in results:
        groups[by(result)].append(result)
    return {group: summarize(rows, baseline_name) for group, rows in sorted(groups.items(), key=lambda g: str(g[0]))}


def pareto_front(summaries: Sequence[ConfigSummary]) -> list[ConfigSummary]:
    """Configs not dominated on (physical KV bytes: lower is better, accuracy: higher is better)."""
    candidates = [s for s in summaries if s.accuracy is not None and not math.isnan(s.physical_kv_bytes)]
    front = []
    for s in candidates:
        dominated = any(
            o.physical_kv_bytes <= s.physical_kv_bytes and o.accuracy >= s.accuracy
            and (o.physical_kv_bytes < s.physical_kv_bytes or o.accuracy > s.accuracy)
            for o in candidates
        )
        if not dominated:
            front.append(s)
    return sorted(front, key=lambda s: s.physical_kv_bytes)


DEFAULT_TOLERANCE = 0.1


def sweet_spot(summaries: Sequence[ConfigSummary], baseline_name: str = "baseline",
               tolerance: float = DEFAULT_TOLERANCE) -> ConfigSummary | None:
    """The most compressed config that holds the baseline's accuracy.

    Holding means both: its 95% interval overlaps the baseline's (no evidence it is worse), and
    its accuracy is within ``tolerance`` of the baseline's (with few items every interval is wide,
    so overlap alone would crown a config that failed every item).
    """
    baseline = next((s for s in summaries if s.config_name == baseline_name), None)
    if baseline is None or baseline.accuracy is None:
        return None

    def holds(s: ConfigSummary) -> bool:
        return s.accuracy is not None and s.ci_high >= baseline.ci_low and \
            s.accuracy >= baseline.accuracy - tolerance

    holding = [s for s in summaries if holds(s)]
    return max(holding, key=lambda s: s.compression_ratio, default=None)
