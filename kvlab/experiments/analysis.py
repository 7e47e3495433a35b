"""Aggregates over item results: accuracy with intervals, paired tests, bytes, latency, Pareto front.

Accuracy is the mean per-item score in [0, 1] with Wilson's 95% interval (for fractional scores
too: a score bounded in [0, 1] has variance at most p(1 - p), where a bootstrap interval collapses
when nearly every score is equal).  A config is compared with the baseline on the *same items*:
exact McNemar for 0/1 scores, Wilcoxon signed-rank otherwise, and the paired difference with its
interval and the non-inferiority verdict of :mod:`kvlab.experiments.decision`.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kvlab.compress.accounting import compression_ratio
from kvlab.experiments.decision import ALPHA_ONE_SIDED, DEFAULT_MAX_DROP, RULE, PairedScores, holm, items_needed
from kvlab.experiments.results import ItemResult

Z95 = 1.959963984540054


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    if n == 0:
        return (math.nan, math.nan)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def accuracy_interval(scores: Sequence[float]) -> tuple[float, float]:
    """Wilson's 95% interval of the mean score (0/1 or fractional in [0, 1])."""
    return wilson_interval(sum(scores), len(scores))


def paired_test(baseline: Sequence[float], other: Sequence[float]) -> tuple[str, float]:
    """(test name, two-sided p-value) for paired scores of the same items."""
    if all(s in (0.0, 1.0) for s in [*baseline, *other]):
        lost = sum(1 for b, o in zip(baseline, other, strict=True) if b == 1 and o == 0)
        gained = sum(1 for b, o in zip(baseline, other, strict=True) if b == 0 and o == 1)
        if lost + gained == 0:
            return ("mcnemar-exact", 1.0)
        return ("mcnemar-exact", binomial_two_sided_half(lost, lost + gained))
    diffs = [o - b for b, o in zip(baseline, other, strict=True)]
    if all(d == 0 for d in diffs):
        return ("wilcoxon", 1.0)
    from scipy import stats  # only for fractional scores: `kvlab show` of 0/1 scores needs no scipy

    return ("wilcoxon", float(stats.wilcoxon(diffs, zero_method="zsplit").pvalue))


def binomial_two_sided_half(k: int, n: int) -> float:
    """Exact two-sided p-value of ``k`` successes in ``n`` trials at p = 1/2 (scipy's ``binomtest``):
    the distribution is symmetric, so it is twice the smaller tail, in exact integers."""
    tail = sum(math.comb(n, i) for i in range(min(k, n - k) + 1))
    return min(1.0, 2 * tail / 2**n)


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
    diff_estimate: float | None = None  # config - baseline on the items both scored
    diff_ci_low: float | None = None
    diff_ci_high: float | None = None
    p_noninferior: float | None = None  # one-sided, H0: difference <= -max_drop
    p_adjusted: float | None = None  # Holm across the configs compared
    non_inferior: bool | None = None
    max_drop: float = DEFAULT_MAX_DROP  # the margin of the verdict above
    kv_bytes_estimated: bool = False  # a server's estimate (pool bytes per token x tokens), not measured

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["diff_vs_baseline"] = {"estimate": data.pop("diff_estimate"), "ci_low": data.pop("diff_ci_low"),
                                    "ci_high": data.pop("diff_ci_high")}
        return data


def summarize(results: Sequence[ItemResult], baseline_name: str = "baseline",
              max_drop: float = DEFAULT_MAX_DROP, untested: int = 0) -> list[ConfigSummary]:
    """One summary per config, in first-seen order; the baseline pairing is by ``(item_id, task)``
    and the non-inferiority verdicts at ``max_drop`` are Holm-corrected across these configs and
    ``untested`` more (a tune's early-stopped candidates: examined on these items, so they count
    in the family, with p = 1)."""
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
        pair = None
        if name != baseline_name and paired:
            test, p_value = paired_test([b for b, _ in paired], [o for _, o in paired])
            pair = PairedScores.of([b for b, _ in paired], [o for _, o in paired])
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
            max_drop=max_drop, kv_bytes_estimated=any(r.kv_bytes_estimated for r in ok),
            **_paired_fields(pair, max_drop),
        ))
    _adjust(summaries, untested)
    return summaries


def _paired_fields(pair: PairedScores | None, max_drop: float) -> dict[str, Any]:
    if pair is None:
        return {}
    low, high = pair.interval()
    return {"diff_estimate": pair.difference, "diff_ci_low": low, "diff_ci_high": high,
            "p_noninferior": pair.p_noninferior(max_drop)}


def _adjust(summaries: list[ConfigSummary], untested: int = 0) -> None:
    """Holm across every config compared with the baseline (and ``untested`` more at p = 1);
    non-inferior when adjusted p < 2.5%."""
    compared = [s for s in summaries if s.p_noninferior is not None]
    adjusted_all = holm([s.p_noninferior for s in compared] + [1.0] * untested)
    for summary, adjusted in zip(compared, adjusted_all[:len(compared)], strict=True):
        summary.p_adjusted = adjusted
        summary.non_inferior = adjusted < ALPHA_ONE_SIDED


JSONL_LENGTH_BUCKET = 512  # tokens: a JSONL task's prompts all differ in length, so they are bucketed


def length_group(result: ItemResult) -> str:
    """Context length as a breakdown label: the target length of a generated task, a
    ``JSONL_LENGTH_BUCKET``-token range (e.g. ``512-1023``) for a JSONL task's measured lengths."""
    if result.task == "jsonl":
        low = result.context_length // JSONL_LENGTH_BUCKET * JSONL_LENGTH_BUCKET
        return f"{low}-{low + JSONL_LENGTH_BUCKET - 1}"
    return str(result.context_length)


def natural_key(value: Any) -> list[tuple[int, int | str]]:
    """Sorts labels with numbers in them by value: ``512`` before ``1024``, ``0-511`` before ``512-1023``."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", str(value)) if part]


def breakdown(results: Sequence[ItemResult], by: Callable[[ItemResult], Any],
              baseline_name: str = "baseline", max_drop: float = DEFAULT_MAX_DROP) -> dict[Any, list[ConfigSummary]]:
    """Summaries per group, e.g. ``by=lambda r: r.task`` or ``by=length_group``."""
    groups: dict[Any, list[ItemResult]] = defaultdict(list)
    for result in results:
        groups[by(result)].append(result)
    return {group: summarize(rows, baseline_name, max_drop) for group, rows in sorted(groups.items(), key=lambda g: natural_key(g[0]))}


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


@dataclass(frozen=True)
class Decision:
    """The sweet spot and the rule that chose it, in words a report can print."""

    sweet_spot: ConfigSummary | None
    max_drop: float
    rule: str
    note: str  # why there is no sweet spot, or how many items would show one; "" otherwise
    items_needed: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.sweet_spot.config_name if self.sweet_spot else None, "rule": self.rule,
                "max_drop": self.max_drop, "note": self.note, "items_needed": self.items_needed}


def decide(summaries: Sequence[ConfigSummary], baseline_name: str = "baseline", untested: int = 0) -> Decision:
    """The most compressed config shown non-inferior to the baseline (see :mod:`kvlab.experiments.decision`),
    at the margin :func:`summarize` judged the summaries with (``untested``: as given to it)."""
    max_drop = summaries[0].max_drop if summaries else DEFAULT_MAX_DROP
    compared = [s for s in summaries if s.non_inferior is not None]
    family = len(compared) + untested
    rule = RULE.format(margin=f"{max_drop * 100:g}", m=family)
    baseline = next((s for s in summaries if s.config_name == baseline_name), None)
    if baseline is None or baseline.accuracy is None:
        return Decision(None, max_drop, rule, "no scored baseline to compare with")
    holding = [s for s in compared if s.non_inferior and _ok(s.compression_ratio)]
    if holding:
        return Decision(max(holding, key=lambda s: s.compression_ratio), max_drop, rule, "")
    if not compared:
        return Decision(None, max_drop, rule, "no config was compared with the baseline on the same items")
    needed = items_needed(baseline.accuracy, max_drop, family)
    n = max(s.n_scored for s in compared)
    note = f"no config is shown non-inferior within {max_drop * 100:g} points on {n} items"
    if needed is not None and needed > n:
        note += (f"; at the baseline's accuracy ({baseline.accuracy:.2f}) a config exactly as accurate, with "
                 f"independent errors, would need about {needed} items to be shown so")
    return Decision(None, max_drop, rule, note, needed)


def _ok(value: float | None) -> bool:
    return value is not None and not math.isnan(value)


def sweet_spot(summaries: Sequence[ConfigSummary], baseline_name: str = "baseline") -> ConfigSummary | None:
    """:func:`decide`'s config (None when no config is shown non-inferior)."""
    return decide(summaries, baseline_name).sweet_spot
