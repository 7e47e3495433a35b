"""Aggregates over item results: accuracy with intervals, paired tests, bytes, latency, Pareto front.

Accuracy is the mean per-item score in [0, 1] with Wilson's 95% interval (for fractional scores
too: a score bounded in [0, 1] has variance at most p(1 - p), where a bootstrap interval collapses
when nearly every score is equal).  A config is compared with the baseline on the *same items*:
exact McNemar for 0/1 scores, Wilcoxon signed-rank otherwise, and the paired difference with its
interval and the non-inferiority verdict of :mod:`kvlab.analysis.decision`.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kvlab.analysis.decision import ALPHA_ONE_SIDED, PairedScores, holm, items_needed
from kvlab.analysis.fidelity import FidelitySummary
from kvlab.analysis.verdict import UNMEASURED, TaskVerdict, judge_tasks
from kvlab.compress.accounting import budget_ratio, compression_ratio, shortfall_causes
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.margins import DEFAULT_MARGINS, DEFAULT_MAX_DROP, Margins
from kvlab.core.results import ItemResult
from kvlab.core.tasks import TASKS

#: What a summary's bytes are of (:func:`memory_basis`), in words a report shows.
MEMORY_AFTER_PROMPT = "the cache after the prompt was compressed"
MEMORY_REQUEST_PEAK = ("each config's peak over prompt and answer, against the uncompressed cache of the same "
                       "tokens (a config compresses during generation)")

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
    p_noninferior: float | None = None  # pooled over tasks (a summary): one-sided, H0: difference <= -max_drop
    p_adjusted: float | None = None  # the pooled p, Holm across the configs compared
    non_inferior: bool | None = None  # THE decision: acceptable on every task that can judge it (``task_verdicts``)
    max_drop: float = DEFAULT_MAX_DROP  # the margins of the verdicts
    max_kl: float = 0.0
    min_agreement: float = 0.0
    kv_bytes_estimated: bool = False  # a server's estimate (pool bytes per token x tokens), not measured
    memory_basis: str = MEMORY_AFTER_PROMPT  # what the bytes above are of (:func:`memory_basis`)
    budget_ratio: float | None = None  # the ratio its budget and formats alone suggest (accounting.budget_ratio)
    # fidelity against the baseline (None: not measured, or the baseline itself), items as the unit
    fidelity_items: int | None = None
    mean_kl: float | None = None
    kl_ci_low: float | None = None
    kl_ci_high: float | None = None
    median_kl: float | None = None
    p99_kl: float | None = None
    agreement: float | None = None
    agreement_ci_low: float | None = None
    agreement_ci_high: float | None = None
    first_divergence: float | None = None  # median position, over the items that diverge
    task_verdicts: list[TaskVerdict] = field(default_factory=list)

    @property
    def margins(self) -> Margins:
        return Margins(self.max_drop, self.max_kl, self.min_agreement)

    @property
    def pooled_non_inferior(self) -> bool | None:
        """The pooled accuracy verdict: a summary beside the per-task decision, never the decision."""
        return None if self.p_adjusted is None else self.p_adjusted < ALPHA_ONE_SIDED

    @property
    def stopped_by(self) -> TaskVerdict | None:
        """The first task that rejects this config."""
        return next((v for v in self.task_verdicts if v.accepted is False), None)

    @property
    def decided_by(self) -> str:
        """Which criterion judged each task, e.g. ``passkey: fidelity, multikey: accuracy``."""
        return ", ".join(f"{v.task}: {v.criterion}" for v in self.task_verdicts)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["diff_vs_baseline"] = {"estimate": data.pop("diff_estimate"), "ci_low": data.pop("diff_ci_low"),
                                    "ci_high": data.pop("diff_ci_high")}
        data["fidelity"] = {key: data.pop(key) for key in (
            "fidelity_items", "mean_kl", "kl_ci_low", "kl_ci_high", "median_kl", "p99_kl", "agreement",
            "agreement_ci_low", "agreement_ci_high", "first_divergence")}
        data["pooled_non_inferior"] = self.pooled_non_inferior
        return data


def memory_basis(results: Sequence[ItemResult]) -> str:
    """What an experiment's configs are compared on: the cache right after the prompt was compressed,
    or -- once any config compresses during generation (a decode policy) -- every config's peak over
    the whole request, against the uncompressed cache of the same tokens (prompt and answer)."""
    return MEMORY_REQUEST_PEAK if any((r.config or {}).get("decode") for r in results) else MEMORY_AFTER_PROMPT


def _request_bytes(row: ItemResult) -> tuple[int | None, int | None]:
    """(uncompressed bytes of every token the request saw, the cache's measured peak)."""
    generation = (row.extra or {}).get("generation_kv")
    return (generation["final_baseline_bytes"] if generation else None), row.peak_kv_bytes


def summarize(results: Sequence[ItemResult], baseline_name: str = "baseline",
              margins: Margins = DEFAULT_MARGINS, untested: int = 0) -> list[ConfigSummary]:
    """One summary per config, in first-seen order; the baseline pairing is by ``(item_id, task)``.
    The decision (``non_inferior``) is taken task by task at ``margins``
    (:mod:`kvlab.analysis.verdict`), Holm-corrected across these configs and ``untested`` more
    (a tune's early-stopped candidates: examined on these items, so they count in the family, with
    p = 1)."""
    max_drop = margins.max_drop
    by_config: dict[str, list[ItemResult]] = defaultdict(list)
    for result in results:
        by_config[result.config_name].append(result)
    baseline_scores = {(r.item_id, r.task): r.score for r in by_config.get(baseline_name, []) if r.score is not None}
    basis = memory_basis(results)
    summaries = []
    for name, rows in by_config.items():
        ok = [r for r in rows if r.error is None]
        scored = [(r, r.score) for r in ok if r.score is not None]
        scores = [score for _, score in scored]
        accuracy = statistics.fmean(scores) if scores else None
        low, high = accuracy_interval(scores) if scores else (None, None)
        test = p_value = None
        paired = [(baseline_scores[(r.item_id, r.task)], score) for r, score in scored
                  if (r.item_id, r.task) in baseline_scores]
        pair = None
        if name != baseline_name and paired:
            test, p_value = paired_test([b for b, _ in paired], [o for _, o in paired])
            pair = PairedScores.of([b for b, _ in paired], [o for _, o in paired])
        nll_rows = [(r.nll, r.nll_tokens) for r in ok if r.nll is not None and r.nll_tokens]
        perplexity = (math.exp(sum(nll for nll, _ in nll_rows) / sum(tokens for _, tokens in nll_rows))
                      if nll_rows else None)
        def mean(attr: str, rows: list[ItemResult] = ok) -> float:
            """Mean over the rows that know the value; NaN where none does (an endpoint that hides its cache)."""
            values = [v for r in rows if (v := getattr(r, attr)) is not None]
            return statistics.fmean(values) if values else math.nan

        if basis == MEMORY_REQUEST_PEAK:
            pairs = [(b, p) for b, p in map(_request_bytes, ok) if b is not None and p is not None]
            baseline_bytes = statistics.fmean(b for b, _ in pairs) if pairs else math.nan
            physical_bytes = statistics.fmean(p for _, p in pairs) if pairs else math.nan
        else:
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
            max_drop=max_drop, max_kl=margins.max_kl, min_agreement=margins.min_agreement,
            kv_bytes_estimated=any(r.kv_bytes_estimated for r in ok), memory_basis=basis,
            budget_ratio=_budget_ratio(rows[0].config, mean("context_tokens")),
            **_paired_fields(pair, max_drop), **_fidelity_fields([f for r in ok if (f := r.fidelity) is not None]),
        ))
    _adjust(summaries, untested)
    verdicts = judge_tasks(results, baseline_name, margins, untested)
    for summary in summaries:
        if summary.config_name != baseline_name:
            summary.task_verdicts = verdicts.get(summary.config_name, [])
            summary.non_inferior = _combined(summary.task_verdicts)
    return summaries


#: A measured ratio below this share of what the budget suggests is called out (a few percent are scales).
BUDGET_SHORTFALL = 0.9


def stored_config(config: dict[str, Any]) -> KVCacheConfig | None:
    """A stored config (a summary's ``config``) as kvlab reads it; None for one this kvlab no longer reads."""
    try:
        return KVCacheConfig(**{k: v for k, v in config.items() if k != "name"})
    except ValueError:
        return None


def _budget_ratio(config: dict[str, Any], context_tokens: float) -> float | None:
    """:func:`budget_ratio` of a stored config (None for one this kvlab no longer reads, or no context)."""
    parsed = stored_config(config)
    return None if parsed is None or math.isnan(context_tokens) else budget_ratio(parsed, context_tokens)


def short_of_budget(summaries: Sequence[ConfigSummary]) -> list[tuple[ConfigSummary, list[str]]]:
    """Configs whose measured prompt-cache ratio is under :data:`BUDGET_SHORTFALL` of what their budget and
    formats suggest, with what in each keeps the bytes (measured bytes only: never a server's estimate)."""
    short = []
    for s in summaries:
        if (s.budget_ratio is not None and not s.kv_bytes_estimated and s.memory_basis == MEMORY_AFTER_PROMPT
                and not math.isnan(s.compression_ratio) and s.compression_ratio < BUDGET_SHORTFALL * s.budget_ratio):
            parsed = stored_config(s.config)
            if parsed is not None:  # it is: its budget_ratio was read from it
                short.append((s, shortfall_causes(parsed)))
    return short


def _combined(verdicts: Sequence[TaskVerdict]) -> bool | None:
    """Acceptable when every task that can judge accepts (None when no task can)."""
    judged = [v.accepted for v in verdicts if v.accepted is not None]
    return all(judged) if judged else None


def _fidelity_fields(fidelities: list) -> dict[str, Any]:
    if not fidelities:
        return {}
    summary = FidelitySummary.of(fidelities)
    kl_low, kl_high = summary.kl_interval()
    agree_low, agree_high = summary.agreement_interval()
    return {"fidelity_items": summary.items, "mean_kl": summary.mean_kl, "kl_ci_low": kl_low, "kl_ci_high": kl_high,
            "median_kl": summary.median_kl, "p99_kl": summary.p99_kl, "agreement": summary.agreement,
            "agreement_ci_low": agree_low, "agreement_ci_high": agree_high,
            "first_divergence": summary.first_divergence_median}


def _paired_fields(pair: PairedScores | None, max_drop: float) -> dict[str, Any]:
    if pair is None:
        return {}
    low, high = pair.interval()
    return {"diff_estimate": pair.difference, "diff_ci_low": low, "diff_ci_high": high,
            "p_noninferior": pair.p_noninferior(max_drop)}


def _adjust(summaries: list[ConfigSummary], untested: int = 0) -> None:
    """The pooled p-values, Holm across every config compared with the baseline (and ``untested``
    more at p = 1): a summary, not the decision."""
    pooled = [(s, s.p_noninferior) for s in summaries if s.p_noninferior is not None]
    adjusted_all = holm([p for _, p in pooled] + [1.0] * untested)
    for (summary, _), adjusted in zip(pooled, adjusted_all[:len(pooled)], strict=True):
        summary.p_adjusted = adjusted


JSONL_LENGTH_BUCKET = 512  # tokens: a JSONL task's prompts all differ in length, so they are bucketed


def length_group(result: ItemResult) -> str:
    """Context length as a breakdown label: the target length of a generated task, a
    ``JSONL_LENGTH_BUCKET``-token range (e.g. ``512-1023``) for the measured lengths of a task
    without target lengths (JSONL)."""
    task = TASKS.get(result.task)
    if task is not None and not task.target_lengths:
        low = result.context_length // JSONL_LENGTH_BUCKET * JSONL_LENGTH_BUCKET
        return f"{low}-{low + JSONL_LENGTH_BUCKET - 1}"
    return str(result.context_length)


def natural_key(value: Any) -> list[tuple[int, int | str]]:
    """Sorts labels with numbers in them by value: ``512`` before ``1024``, ``0-511`` before ``512-1023``."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", str(value)) if part]


def breakdown(results: Sequence[ItemResult], by: Callable[[ItemResult], Any],
              baseline_name: str = "baseline", margins: Margins = DEFAULT_MARGINS) -> dict[Any, list[ConfigSummary]]:
    """Summaries per group, e.g. ``by=lambda r: r.task`` or ``by=length_group``."""
    groups: dict[Any, list[ItemResult]] = defaultdict(list)
    for result in results:
        groups[by(result)].append(result)
    return {group: summarize(rows, baseline_name, margins)
            for group, rows in sorted(groups.items(), key=lambda g: natural_key(g[0]))}


def question_rank(result: ItemResult) -> int | None:
    """A shared context's question rank (0: the first question asked of it); None for an item alone."""
    shared = (result.extra or {}).get("shared_context")
    return shared["rank"] if shared else None


#: What a Pareto front can trade bytes against: the summary field, and whether higher is better.
FRONT_METRICS = {"accuracy": ("accuracy", True), "KL": ("mean_kl", False), "agreement": ("agreement", True)}


def pareto_front(summaries: Sequence[ConfigSummary], metric: str = "accuracy") -> list[ConfigSummary]:
    """Configs not dominated on (physical KV bytes: lower is better, ``metric`` of
    :data:`FRONT_METRICS`: accuracy, or fidelity's mean KL or agreement), by bytes."""
    field_name, higher = FRONT_METRICS[metric]

    def value(s: ConfigSummary) -> float:
        v = getattr(s, field_name)
        return v if higher else -v

    candidates = [s for s in summaries if getattr(s, field_name) is not None and not math.isnan(s.physical_kv_bytes)]
    front = []
    for s in candidates:
        dominated = any(
            o.physical_kv_bytes <= s.physical_kv_bytes and value(o) >= value(s)
            and (o.physical_kv_bytes < s.physical_kv_bytes or value(o) > value(s))
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
    #: The items the accuracy margin needs (:func:`~kvlab.analysis.decision.items_needed`): those on which a
    #: config exactly as accurate as the baseline would be shown within ``max_drop``; None where the baseline
    #: has no accuracy (or no count up to the limit would do).
    items_needed: int | None = None
    margins: Margins = Margins()
    rests_on: int | None = None  # the items the sweet spot was judged on (None without one)
    #: which task kept the sweet spot from being more compressed (:func:`bound_by`; "" where none did)
    bound: str = ""

    @property
    def decided_by(self) -> str:
        """For the sweet spot: which criterion judged each task ("" without a sweet spot)."""
        return self.sweet_spot.decided_by if self.sweet_spot else ""

    @property
    def few_items(self) -> bool:
        """Whether the sweet spot rests on fewer items than its accuracy margin needs: its accuracy
        interval is then wider than the margin, so the verdict says little about a drop of ``max_drop``
        (a fidelity verdict included: it also requires the accuracy not to be shown to drop)."""
        return (self.sweet_spot is not None and self.items_needed is not None and self.rests_on is not None
                and self.rests_on < self.items_needed)

    def few_items_note(self) -> str:
        """What :attr:`few_items` means, in words a page or the terminal prints beside the verdict ("" unless
        it rests on too few items)."""
        if not self.few_items:
            return ""
        return (f"rests on {self.rests_on} items; the margin of {self.max_drop:g} needs about {self.items_needed} "
                "(the items on which a config exactly as accurate as the baseline would be shown within it): "
                "more items could overturn it")

    def to_dict(self) -> dict[str, Any]:
        spot = self.sweet_spot
        return {"config": spot.config_name if spot else None, "rule": self.rule, "max_drop": self.max_drop,
                "max_kl": self.margins.max_kl, "min_agreement": self.margins.min_agreement,
                "decided_by": {v.task: v.criterion for v in spot.task_verdicts} if spot else {},
                "note": self.note, "items_needed": self.items_needed, "rests_on_items": self.rests_on,
                "few_items": self.few_items, "bound_by": self.bound}


def decide(summaries: Sequence[ConfigSummary], baseline_name: str = "baseline", untested: int = 0) -> Decision:
    """The most compressed config acceptable on every task (see :mod:`kvlab.analysis.verdict`),
    at the margins :func:`summarize` judged the summaries with (``untested``: as given to it)."""
    margins = summaries[0].margins if summaries else Margins()
    max_drop = margins.max_drop
    compared = [s for s in summaries if s.config_name != baseline_name and s.task_verdicts]
    family = len(compared) + untested
    measured = any(s.mean_kl is not None for s in compared)
    if margins.fidelity and not measured:  # the rule that applied: accuracy alone
        rule = Margins(max_drop, 0.0, 0.0).rule(family) + f" ({UNMEASURED})"
    else:
        rule = margins.rule(family)
    baseline = next((s for s in summaries if s.config_name == baseline_name), None)
    if baseline is None or (baseline.accuracy is None and not measured):
        return Decision(None, max_drop, rule, "no scored baseline to compare with", margins=margins)
    needed = items_needed(baseline.accuracy, max_drop, family) if baseline.accuracy is not None else None
    holding = [s for s in compared if s.non_inferior and _ok(s.compression_ratio)]
    if holding:
        spot = max(holding, key=lambda s: s.compression_ratio)
        return Decision(spot, max_drop, rule, "", needed, margins=margins,
                        rests_on=spot.n_scored or spot.fidelity_items, bound=bound_by(compared, spot))
    if not compared:
        return Decision(None, max_drop, rule, "no config was compared with the baseline on the same items",
                        margins=margins)
    if all(s.non_inferior is None for s in compared):
        return Decision(None, max_drop, rule, "no task can judge any config: " + compared[0].task_verdicts[0].reason,
                        margins=margins)
    stops = sorted({v.task for s in compared if (v := s.stopped_by) is not None})
    tasks = {v.task for s in compared for v in s.task_verdicts}
    stopped = f" ({', '.join(stops)} stopped them)" if len(tasks) > 1 and stops else ""
    if margins.fidelity and measured:
        return Decision(None, max_drop, rule, f"no config is acceptable on every task{stopped}", margins=margins)
    n = max(s.n_scored for s in compared)
    note = f"no config is shown non-inferior within {max_drop:g} on {n} items{stopped}"
    if needed is not None and needed > n:
        note += (f"; at the baseline's accuracy ({baseline.accuracy:.2f}) a config exactly as accurate, with "
                 f"independent errors, would need about {needed} items to be shown so")
    return Decision(None, max_drop, rule, note, needed, margins=margins)


def bound_by(compared: Sequence[ConfigSummary], spot: ConfigSummary) -> str:
    """Which task kept the sweet spot from being more compressed, in words: per task, the more compressed configs
    it refused, and the tasks that accepted some of them (retrieval often hides what a long answer shows):
    ``bound by recall: it refused int2, int4 (while passkey accepted int4)``.  "" where no more compressed config was
    refused by a task (they failed as a whole, or there is none)."""
    smaller = [s for s in compared if _ok(s.compression_ratio) and s.compression_ratio > spot.compression_ratio]
    refused: dict[str, list[str]] = {}
    accepted: dict[str, list[str]] = {}
    for summary in sorted(smaller, key=lambda s: s.compression_ratio):
        for verdict in summary.task_verdicts:
            if verdict.accepted is not None:
                (accepted if verdict.accepted else refused).setdefault(verdict.task, []).append(summary.config_name)
    if not refused:
        return ""
    if len(refused) == 1:
        text = f"it refused {', '.join(next(iter(refused.values())))}"
    else:
        text = "; ".join(f"{task} refused {', '.join(names)}" for task, names in refused.items())
    if passed := "; ".join(f"{task} accepted {', '.join(names)}" for task, names in accepted.items()):
        text += f" (while {passed})"
    return f"bound by {', '.join(refused)}: {text}"


def _ok(value: float | None) -> bool:
    return value is not None and not math.isnan(value)


def sweet_spot(summaries: Sequence[ConfigSummary], baseline_name: str = "baseline") -> ConfigSummary | None:
    """:func:`decide`'s config (None when no config is shown non-inferior)."""
    return decide(summaries, baseline_name).sweet_spot
